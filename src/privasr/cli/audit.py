"""``privasr audit``: the empirical privacy audit (:mod:`privasr.experiments.audit`).

``privasr audit --config configs/audit-demo.yaml [--set key=value ...] --out DIR`` writes ``DIR/results.json``
and ``DIR/report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["audit"]


def audit(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/audit-demo.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set anon.canaries=50 "
                                                          "(dotted keys, YAML values; repeatable)."),
) -> None:
    """Measure what leaks: anonymisation's misses and name canaries, FMP and fedlm membership games, word sets and
    canary exposure, finished runs' releases, and every DP configuration's membership game (configs/audit-*.yaml)."""
    from privasr.cli.rescore import _command_line
    from privasr.config import apply_overrides, parse_overrides, read_config
    from privasr.experiments.audit import load_audit_config, run_audit
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = load_audit_config(raw)
    except InputError as e:
        raise e.at(config) from None
    with output_dir(out), make_console(stderr=True).status(f"audit ({cfg.name})"):
        m = run_audit(cfg, out, argv=_command_line())
    con = make_console()
    con.print(", ".join(f"{k} {v:.3f}" for k, v in m.items() if isinstance(v, float)))
    failed = [k.removesuffix("_release_holds") for k, v in m.items() if k.endswith("_release_holds") and not v]
    if failed:
        con.print(f"[bold red]empirical epsilon above the accountant's:[/] {', '.join(failed)}")
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
