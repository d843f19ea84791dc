"""``privasr report RUN_DIR... [--out DIR]``: redraw the plots of finished runs from their results.json, several
runs overlaid (seeds, systems).

One run without ``--out`` redraws ``RUN_DIR/plots/`` (the plots its report.md links). Several runs need
``--out DIR``: their plots, each run a labelled series, go to ``DIR/plots/`` and ``DIR/report.md`` links them.
Without matplotlib it exits with status 2 and one ``error:`` line naming the ``plots`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError


def _labels(runs: list[Path], results: list[dict[str, Any]] | None = None) -> list[str]:
    """Each run's legend label: its config's name (else its folder's) and its seed; the path as given when two
    labels are the same.

    >>> _labels([Path("a/run1"), Path("b/run2")], [{"config": {"name": "fmp-ami"}, "seed": 0}, {"seed": 1}])
    ['fmp-ami, seed 0', 'run2, seed 1']
    """
    out = []
    for k, p in enumerate(runs):
        res = results[k] if results is not None else {}
        cfg = res.get("config") if isinstance(res.get("config"), dict) else {}
        name = str(cfg.get("name") or (p.parent if p.suffix == ".json" else p).name or p)
        seed = res.get("seed")
        out.append(f"{name}, seed {seed}" if isinstance(seed, int) and not isinstance(seed, bool) else name)
    return out if len(set(out)) == len(out) else [str(p) for p in runs]


def _runner(res: dict[str, Any]) -> str:
    """The runner that wrote a results.json (``unknown`` for runs written before results.json named it)."""
    return str(res.get("runner") or "unknown")


def report(
    runs: list[Path] = typer.Argument(..., help="Finished runs' output folders (or their results.json)."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write DIR/plots/*.png and DIR/report.md (needed "
                                                              "for several runs; one run: RUN_DIR/plots/)."),
    mixed: bool = typer.Option(False, "--mixed", help="Overlay runs written by different runners (e.g. fedlm and "
                                                      "ftl); by default only runs of one runner are overlaid."),
) -> None:
    """Redraw the plots of finished runs from their results.json; several runs of one runner (seeds, settings) are
    overlaid, each a series labelled by its name and seed."""
    from privasr.plots import draw, markdown, read_results
    from privasr.plots._figure import pyplot

    pyplot()  # PlotsUnavailable (exit 2, one line) before any work
    if len(runs) > 1 and out is None:
        raise InputError(f"{len(runs)} runs and no --out", expected="--out DIR for the overlaid plots")
    results = [read_results(p) for p in runs]
    kinds = [_runner(r) for r in results]
    if len(set(kinds)) > 1 and not mixed:
        shown = ", ".join(f"{p} ({k})" for p, k in zip(runs, kinds, strict=True))
        raise InputError(f"runs of different runners: {shown}",
                         expected="runs of one runner (seeds or settings of one experiment), or --mixed to overlay "
                                  "them anyway")
    labels = _labels(runs, results) if len(runs) > 1 else [""]
    folder = (out if out is not None else (runs[0].parent if runs[0].suffix == ".json" else runs[0])) / "plots"
    drawn = draw(list(zip(labels, results, strict=True)), folder)
    if not drawn:
        raise InputError(f"nothing to draw in {', '.join(map(str, runs))}",
                         expected="results.json with a round history, tables, per-client or per-system WERs, a "
                                  "reliability curve or audit sections")
    con = make_console()
    if out is not None:
        lines = ["# privasr report", "", "Runs (each a series of the plots):", "",
                 *[f"- {lab} ({k}): `{p}`" for lab, k, p in zip(labels, kinds, runs, strict=True)], "",
                 f"Redraw with `privasr report {' '.join(map(str, runs))} --out {out}`."]
        (out / "report.md").write_text("\n".join(lines) + "\n" + markdown(drawn, out), encoding="utf-8")
    for _, path in drawn:
        con.print(str(path), highlight=False, soft_wrap=True)
    if out is not None:
        con.print(f"[bold]report:[/] {out / 'report.md'}", highlight=False, soft_wrap=True)
