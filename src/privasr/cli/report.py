"""``privasr report RUN_DIR... [--out DIR]``: redraw the plots of finished runs from their results.json, several
runs overlaid (seeds, systems).

One run without ``--out`` redraws ``RUN_DIR/plots/`` (the plots its report.md links). Several runs need
``--out DIR``: their plots, each run a labelled series, go to ``DIR/plots/`` and ``DIR/report.md`` links them.
Without matplotlib it exits with status 2 and one ``error:`` line naming the ``plots`` extra.
"""

from __future__ import annotations

from pathlib import Path

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError


def _labels(runs: list[Path]) -> list[str]:
    """Each run's legend label: its folder's name, or the path as given when two names are the same."""
    names = [(p.parent if p.suffix == ".json" else p).name or str(p) for p in runs]
    return names if len(set(names)) == len(names) else [str(p) for p in runs]


def report(
    runs: list[Path] = typer.Argument(..., help="Finished runs' output folders (or their results.json)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write DIR/plots/*.png and DIR/report.md (needed "
                                                              "for several runs; one run: RUN_DIR/plots/)."),
) -> None:
    """Redraw the plots of finished runs from their results.json; several runs are overlaid, each a series."""
    from privasr.plots import draw, markdown, read_results
    from privasr.plots._figure import pyplot

    pyplot()  # PlotsUnavailable (exit 2, one line) before any work
    if len(runs) > 1 and out is None:
        raise InputError(f"{len(runs)} runs and no --out", expected="--out DIR for the overlaid plots")
    results = [read_results(p) for p in runs]
    labels = _labels(runs) if len(runs) > 1 else [""]
    folder = (out if out is not None else (runs[0].parent if runs[0].suffix == ".json" else runs[0])) / "plots"
    drawn = draw(list(zip(labels, results, strict=True)), folder)
    if not drawn:
        raise InputError(f"nothing to draw in {', '.join(map(str, runs))}",
                         expected="results.json with a round history, tables, per-client or per-system WERs, a "
                                  "reliability curve or audit sections")
    con = make_console()
    if out is not None:
        lines = ["# privasr report", "", "Runs (each a series of the plots):", "",
                 *[f"- {lab}: `{p}`" for lab, p in zip(_labels(runs), runs, strict=True)], "",
                 f"Redraw with `privasr report {' '.join(map(str, runs))} --out {out}`."]
        (out / "report.md").write_text("\n".join(lines) + "\n" + markdown(drawn, out), encoding="utf-8")
    for _, path in drawn:
        con.print(str(path), highlight=False, soft_wrap=True)
    if out is not None:
        con.print(f"[bold]report:[/] {out / 'report.md'}", highlight=False, soft_wrap=True)
