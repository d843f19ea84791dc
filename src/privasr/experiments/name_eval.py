"""Planted names of every shape through a detector, behind ``privasr anon eval-names``.

Stages: draw the planted sentences (:func:`privasr.anon.name_shapes.plant`: every shape and casing, ``n`` names
each, seeded), load the detector (:func:`~privasr.anon.ner_model.load_detector`), anonymise and count
(:func:`~privasr.anon.name_shapes.survival`), then write ``results.json`` (``survival``, ``collateral``,
``by_shape``, ``by_casing``, ``target``, ``target_met``, ``examples``), ``report.md`` and the survival plot.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.anon.name_shapes import CASINGS, SHAPES, plant, survival

__all__ = ["run_eval_names", "TARGET"]

TARGET = 0.02
"""The most planted names of one shape that may survive (issue 40's acceptance)."""


def run_eval_names(out: str | Path, *, model: str = "finetuned", n: int = 100, seed: int = 0,
                   shapes: Sequence[str] = SHAPES, casings: Sequence[str] = CASINGS,
                   argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Plant ``n`` names per shape and casing, anonymise them with ``model``'s spans and write the run; return
    the metrics."""
    from privasr.anon.ner_model import load_detector
    from privasr.plots import plots_section
    from privasr.results import write_results

    t0 = time.perf_counter()
    plants = plant(shapes, casings, n, seed=seed)
    det = load_detector(model)
    r = survival(det, plants, seed=seed)
    worst = max(v["survival"] for v in r["by_shape"].values())
    metrics = {**r, "target": TARGET, "target_met": worst <= TARGET, "worst_shape_survival": worst,
               "seconds": time.perf_counter() - t0}
    out = Path(out)
    write_results(out, runner="name-eval", seed=seed,
                  config={"model": model, "n": n, "shapes": list(shapes), "casings": list(casings),
                          "command": list(argv) if argv else None}, metrics=metrics)
    (out / "report.md").write_text(report(metrics, model, n, seed, argv) + plots_section(out), encoding="utf-8")
    return metrics


def report(m: Mapping[str, Any], model: str, n: int, seed: int, argv: Sequence[str] | None) -> str:
    """The run in words and tables: survival and collateral per shape and casing, the examples that survived."""
    lines = [f"# Planted names through the {model} detector", "",
             f"privasr {__version__}, seed {seed}: {n} names per shape and casing, {m['names']:,} sentences."
             + (f" Command: `{' '.join(argv)}`." if argv else ""), "",
             f"A name survives when any of its words is unchanged after surrogate anonymisation. Overall "
             f"{100 * m['survival']:.2f}% survive; the worst shape {100 * m['worst_shape_survival']:.2f}% (target at "
             f"most {100 * m['target']:g}% per shape: {'met' if m['target_met'] else 'not met'}). "
             f"{100 * m['collateral']:.2f}% of the other words were rewritten.", "",
             "| shape | names | survival | other words rewritten |", "|---|---:|---:|---:|"]
    lines += [f"| {s.replace('_', ' ')} | {v['names']} | {100 * v['survival']:.2f}% | {100 * v['collateral']:.2f}% |"
              for s, v in m["by_shape"].items()]
    lines += ["", "| casing | names | survival | other words rewritten |", "|---|---:|---:|---:|"]
    lines += [f"| {c} | {v['names']} | {100 * v['survival']:.2f}% | {100 * v['collateral']:.2f}% |"
              for c, v in m["by_casing"].items()]
    if m["examples"]:
        lines += ["", "Names that survived (original -> anonymised):", ""]
        lines += [f"- {s.replace('_', ' ')}: `{e}`" for s, ex in m["examples"].items() for e in ex]
    return "\n".join(lines) + "\n"
