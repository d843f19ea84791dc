"""``privasr headlines --config configs/headlines.yaml --out DIR``: rerun the headline commands of
docs/results.md and fail (exit status 1) on drift beyond the file's tolerances (:mod:`privasr.experiments.headlines`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["headlines"]


def headlines(
    config: Path = typer.Option(Path("configs/headlines.yaml"), "--config", help="The headlines file: commands, "
                                "recorded metrics, tolerances."),
    out: Path = typer.Option(..., "--out", help="Output folder: one run per headline, results.json, report.md."),
    cache: Path | None = typer.Option(None, "--cache", help="The LM cache the commands use (default: a fresh "
                                      "OUT/cache, so every NNLM is trained again by this code)."),
    only: list[str] = typer.Option([], "--only", help="Rerun only this headline (repeatable)."),
) -> None:
    """Rerun the headline figures' commands and compare them with the recorded values; exit status 1 on drift."""
    from privasr.cli.rescore import _command_line
    from privasr.config import read_config
    from privasr.experiments.headlines import load_headlines, run_headlines
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    try:
        cfg = load_headlines(read_config(config))
    except InputError as e:
        raise e.at(config) from None
    con = make_console()

    def done(name: str, run: dict[str, Any]) -> None:
        status = "ok" if run["ok"] else ("FAILED" if run["exit_status"] else "DRIFT")
        con.print(escape(f"{name}: {status} ({run['seconds']:.0f} s)"))

    with output_dir(out):
        m = run_headlines(cfg, out, cache=cache, only=only, argv=_command_line(), on_done=done)
    con.print(escape(f"{m['headlines']} headlines, {m['drifted']} drifted"))
    con.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
    if m["drifted"]:
        raise typer.Exit(1)
