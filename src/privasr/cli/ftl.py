"""``privasr ftl``: federated transfer learning of acoustic models (paper 002) experiments.

``privasr ftl run --config configs/ftl-an4.yaml [--set key=value ...] --out DIR`` runs
:mod:`privasr.experiments.ftl` and writes ``DIR/results.json`` and ``DIR/report.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from privasr.errors import InputError

__all__ = ["app", "run"]

app = typer.Typer(help="Federated transfer learning of acoustic models (client pool, client/server optimisers, "
                       "softmax weighting, server replay).", no_args_is_help=True)


@app.command("run")
def run(
    config: Path = typer.Option(..., "--config", help="YAML config (see configs/ftl-an4.yaml)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, cache/, checkpoint/."),
    overrides: list[str] = typer.Option([], "--set", help="Override a config value: --set rounds=5 "
                                                          "(dotted keys, YAML values; repeatable)."),
) -> None:
    """Run an FTL experiment: seed model, federated runs (system and FedAvg baseline), WER/CER, rounds to target."""
    from privasr.cli.data import parse_overrides
    from privasr.cli.rescore import _command_line
    from privasr.experiments.ftl import load_ftl_config, run_ftl
    from privasr.rescore.run import apply_overrides, read_config

    raw: dict[str, Any] = apply_overrides(read_config(config), parse_overrides(overrides))
    try:
        cfg = load_ftl_config(raw)
    except InputError as e:
        raise e.at(config) from None
    with Console(stderr=True).status(f"FTL ({cfg.name})"):
        m = run_ftl(cfg, out, argv=_command_line())
    Console().print(
        f"test WER {100 * m['wer']:.2f}% CER {100 * m['cer']:.2f}% (baseline {100 * m['wer_baseline']:.2f}% / "
        f"{100 * m['cer_baseline']:.2f}%); rounds to target loss {m['target_loss']:.4f}: {m['rounds_to_target']} "
        f"vs {m['rounds_to_target_baseline']}")
    Console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
