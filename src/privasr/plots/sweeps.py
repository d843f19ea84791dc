"""WER (and perplexity) against what a runner's tables sweep: FMP's rounds T, kernel width sigma (per alpha and
beta), personal-bigram rounds and DP epsilon; FedLM's noise multiplier (drawn against the accountant's epsilon),
confidence threshold, loss and initialisation; the anonymisation experiment's adaptation-set size. Each drawn
from ``tables`` in results.json, with the run's baseline (``metrics.wer_baseline``, ``metrics.ppl_baseline``)
as a dotted line, named by ``metrics.wer_baseline_system``. Rows with a paired-bootstrap interval against the
baseline (``ci_low``, ``ci_high``) get it as an error bar on their WER, drawn around the baseline's WER.

>>> res = {"metrics": {"wer_baseline": 0.2},
...        "tables": {"rounds": [{"T": 1, "wer": 0.19}, {"T": 2, "wer": 0.18}],
...                   "epsilon": [{"epsilon": 0.5, "wer": 0.2}, {"epsilon": 1.0, "wer": 0.19}]}}
>>> [p.name for p in table_sweeps([("", res)])]
['table_rounds', 'table_epsilon']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from privasr.plots._figure import Plot, Run, figure, legend, number, rows_of, series_label

__all__ = ["table_sweeps", "stability_curves"]


@dataclass(frozen=True)
class _Sweep:
    x: str  # the column on the x axis
    title: str
    group: tuple[str, ...] = ()  # columns whose values make separate lines
    log: bool = False
    xlabel: str = ""


# the tables of the runners, by their name in results.json
SWEEPS: dict[str, _Sweep] = {
    "rounds": _Sweep("T", "FMP: WER against the number of rounds T", xlabel="rounds T"),
    "bigram": _Sweep("T", "FMP with personal bigrams: WER against T", group=("lam2",), xlabel="rounds T"),
    "hyper": _Sweep("sigma", "FMP: WER against the kernel width sigma", group=("alpha", "beta"), log=True,
                    xlabel="sigma"),
    "epsilon": _Sweep("epsilon", "FMP with DP: WER against epsilon", log=True, xlabel="epsilon (accountant)"),
    "noise": _Sweep("epsilon", "FedLM with DP: WER and perplexity against epsilon (noise multiplier per point)",
                    log=True, xlabel="epsilon (accountant)"),
    "threshold": _Sweep("threshold", "FedLM: WER and perplexity against the confidence threshold",
                        xlabel="confidence threshold"),
}
# tables of one categorical column: bars
CATEGORIES = {"loss": "FedLM: WER and perplexity by training loss",
              "init": "FedLM: WER and perplexity by initialisation"}
_CATEGORY_AXES = {"loss": "training loss of the clients", "init": "initialisation of the NNLM"}
_Y = (("wer", "test WER (%)", 100.0), ("ppl", "test perplexity", 1.0))


def table_sweeps(runs: Sequence[Run]) -> list[Plot]:
    """One plot per table that any run has (``table_<name>.png``), every run's rows overlaid."""
    names: list[str] = []
    for _, res in runs:
        tables = res.get("tables")
        if isinstance(tables, Mapping):
            names += [n for n in tables if n not in names]
    plots = []
    for name in names:
        tables = [(label, rows_of((res.get("tables") or {}).get(name)), res.get("metrics") or {})
                  for label, res in runs if isinstance(res.get("tables"), Mapping)]
        if name in SWEEPS:
            p = _sweep(name, SWEEPS[name], tables)
        elif name in CATEGORIES:
            p = _categories(name, CATEGORIES[name], tables)
        elif name == "table3":
            p = _sizes(tables)
        else:
            p = None
        if p is not None:
            plots.append(p)
    return plots


def _panels(tables: Sequence[tuple[str, list[Mapping[str, Any]], Mapping[str, Any]]]) -> list[tuple[str, str, float]]:
    return [y for y in _Y if any(number(r.get(y[0])) is not None for _, rows, _ in tables for r in rows)]


def _baselines(ax: Any, y: str, scale: float, tables: Sequence[tuple[str, Any, Mapping[str, Any]]]) -> None:
    for label, _, metrics in tables:
        b = number(metrics.get(f"{y}_baseline"))
        if b is not None and math.isfinite(b):
            name = metrics.get("wer_baseline_system")
            ax.axhline(scale * b, color="grey", linestyle=":", linewidth=0.9,
                       label=series_label(label, f"baseline: {name}" if isinstance(name, str) else "baseline"))


def _error_bars(ax: Any, pts: Sequence[tuple[float, float, Mapping[str, Any]]], y: str, scale: float,
                metrics: Mapping[str, Any], color: Any, *, bars: bool = False) -> bool:
    """Draw each WER point's 95% paired-bootstrap interval (``ci_low``, ``ci_high`` of the row: row minus
    baseline) around the baseline's WER, so a bar that crosses the baseline line is not a significant change.
    Returns whether any was drawn."""
    b = number(metrics.get("wer_baseline"))
    if y != "wer" or b is None or not math.isfinite(b):
        return False
    xs, lo, hi, ys = [], [], [], []
    for x, v, r in pts:
        cl, ch = number(r.get("ci_low")), number(r.get("ci_high"))
        if cl is None or ch is None:
            continue
        xs.append(x)
        ys.append(scale * v)
        lo.append(max(0.0, scale * (v - (b + cl))))
        hi.append(max(0.0, scale * (b + ch - v)))
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="none", ecolor=color, elinewidth=0.9, capsize=3 if not bars else 4,
                    alpha=0.8)
    return bool(xs)


_CI_NOTE = "bars: 95% paired-bootstrap interval of the change from the baseline"


def _sweep(name: str, spec: _Sweep, tables: Sequence[tuple[str, list[Mapping[str, Any]], Mapping[str, Any]]]
           ) -> Plot | None:
    panels = _panels(tables)
    if not panels or not any(number(r.get(spec.x)) is not None for _, rows, _ in tables for r in rows):
        return None
    fig, axes = figure(len(panels), width=5.0, height=3.6)
    ci = False
    for ax, (y, ylabel, scale) in zip(axes, panels, strict=True):
        for label, rows, metrics in tables:
            groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
            for r in rows:
                groups.setdefault(tuple(r.get(g) for g in spec.group), []).append(r)
            for key, members in groups.items():
                pts = sorted((number(r.get(spec.x)), number(r.get(y)), r) for r in members
                             if number(r.get(spec.x)) is not None and number(r.get(y)) is not None)
                glabel = ", ".join(f"{g} {v:g}" if isinstance(v, int | float) else f"{g} {v}"
                                   for g, v in zip(spec.group, key, strict=True))
                finite = [(x, v, r) for x, v, r in pts if math.isfinite(x)]
                infinite = [(x, v, r) for x, v, r in pts if not math.isfinite(x)]
                if finite:
                    line = ax.plot([x for x, _, _ in finite], [scale * v for _, v, _ in finite], marker="o",
                                   markersize=4, label=series_label(label, glabel) or None)
                    ci |= _error_bars(ax, finite, y, scale, metrics, line[0].get_color())
                    if name == "noise":
                        for x, v, r in finite:
                            ax.annotate(f"z={r.get('noise_multiplier'):g}", (x, scale * v), fontsize="x-small",
                                        textcoords="offset points", xytext=(3, 3))
                    color = line[0].get_color()
                else:
                    color = None
                for _, v, _ in infinite:  # epsilon infinite: no noise, a level line
                    ax.axhline(scale * v, color=color, linestyle="--", linewidth=0.9,
                               label=series_label(label, "no noise (epsilon inf)"))
        _baselines(ax, y, scale, tables)
        if spec.log:
            ax.set_xscale("log")
        ax.set_xlabel(spec.xlabel or spec.x)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        legend(ax)
    fig.suptitle(spec.title)
    _note(fig, ci)
    return Plot(f"table_{name}", spec.title, fig)


def _note(fig: Any, ci: bool) -> None:
    if ci:
        fig.text(0.5, -0.01, _CI_NOTE, ha="center", va="top", fontsize="x-small", color="0.3")


def _categories(name: str, title: str, tables: Sequence[tuple[str, list[Mapping[str, Any]], Mapping[str, Any]]]
                ) -> Plot | None:
    panels = _panels(tables)
    cats: list[str] = []
    for _, rows, _ in tables:
        cats += [str(r.get(name)) for r in rows if str(r.get(name)) not in cats]
    if not panels or not cats:
        return None
    fig, axes = figure(len(panels), width=max(5.0, 1.2 * len(cats)), height=3.8)
    width = 0.8 / max(1, len(tables))
    ci = False
    for ax, (y, ylabel, scale) in zip(axes, panels, strict=True):
        for i, (label, rows, metrics) in enumerate(tables):
            by = {str(r.get(name)): number(r.get(y)) for r in rows}
            xs = [c + i * width for c in range(len(cats))]
            ax.bar(xs, [scale * (by.get(c) or 0.0) for c in cats], width, label=label or None)
            row = {str(r.get(name)): r for r in rows}
            pts = [(x, v, row[c]) for x, c in zip(xs, cats, strict=True) if (v := by.get(c)) is not None]
            ci |= _error_bars(ax, pts, y, scale, metrics, "0.2", bars=True)
        ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cats))], cats, rotation=20, ha="right")
        ax.set_xlabel(_CATEGORY_AXES.get(name, name.replace("_", " ")))
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
        lo = min((scale * v for _, rows, _ in tables for r in rows if (v := number(r.get(y))) is not None),
                 default=0.0)
        ax.set_ylim(bottom=0.9 * lo)
        _baselines(ax, y, scale, tables)
        legend(ax)
    fig.suptitle(title)
    _note(fig, ci)
    return Plot(f"table_{name}", title, fig)


def _sizes(tables: Sequence[tuple[str, list[Mapping[str, Any]], Mapping[str, Any]]]) -> Plot | None:
    """The anonymisation experiment's table 3: each model's WER and perplexity per adaptation-set size (%)."""
    lines = []
    for label, rows, _ in tables:
        for r in rows:
            pts = sorted((float(k), v) for k, v in r.items() if _is_number(k) and isinstance(v, Mapping))
            if pts:
                lines.append((series_label(label, str(r.get("name", r.get("model", "")))), pts))
    if not lines:
        return None
    fig, axes = figure(2, width=5.0, height=3.6)
    for ax, (y, ylabel, scale) in zip(axes, _Y, strict=True):
        for lab, pts in lines:
            xs = [x for x, v in pts if number(v.get(y)) is not None]
            ys = [scale * number(v.get(y)) for _, v in pts if number(v.get(y)) is not None]  # type: ignore[operator]
            if xs:
                ax.plot(xs, ys, marker="o", markersize=4, label=lab or None)
        ax.set_xlabel("adaptation set (% of the pool)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        legend(ax)
    title = "Anonymised adaptation: WER and perplexity against the adaptation-set size"
    fig.suptitle(title)
    return Plot("table_sizes", title, fig)


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def stability_curves(runs: Sequence[Run]) -> list[Plot]:
    """Local training's stability against the client learning rate (``privasr fedlm stability``:
    ``metrics.cells`` rows with ``client_lr``, ``grad_clip``, ``start``, ``non_finite``, ``trainings`` and
    ``mean_loss``): the share of trained client models that hold NaN or infinity, and the mean training loss (log
    scale), one line per gradient bound and start. ``[]`` without such rows.

    >>> cells = [{"client_lr": lr, "grad_clip": None, "start": "pretrained", "non_finite": n, "trainings": 10,
    ...           "mean_loss": 5.0} for lr, n in ((1.0, 0), (2.0, 4))]
    >>> [p.name for p in stability_curves([("", {"metrics": {"cells": cells}})])]
    ['stability']
    """
    found = [(label, rows_of((res.get("metrics") or {}).get("cells"))) for label, res in runs]
    found = [(label, rows) for label, rows in found
             if rows and all(number(r.get("client_lr")) is not None and number(r.get("trainings")) for r in rows)]
    if not found:
        return []
    fig, (frac, loss) = figure(2, width=5.0, height=3.6)
    for label, rows in found:
        groups: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
        for r in rows:
            groups.setdefault((r.get("grad_clip"), r.get("start")), []).append(r)
        for (clip, start), members in groups.items():
            members = sorted(members, key=lambda r: float(r["client_lr"]))
            xs = [float(r["client_lr"]) for r in members]
            name = series_label(label, f"grad_clip {'none' if clip is None else clip}, from {start}")
            frac.plot(xs, [100 * (number(r.get("non_finite")) or 0.0) / float(r["trainings"]) for r in members],
                      "o-", label=name)
            pts = [(x, number(r.get("mean_loss"))) for x, r in zip(xs, members, strict=True)]
            pts = [(x, y) for x, y in pts if y is not None and y > 0]
            if pts:
                loss.plot([x for x, _ in pts], [y for _, y in pts], "o-", label=name)
    for ax in (frac, loss):
        ax.set_xscale("log")
        ax.set_xlabel("client learning rate (local SGD)")
        ax.grid(alpha=0.3)
    frac.set_ylabel("client models with NaN or inf (%)")
    frac.set_title("non-finite after one local round")
    loss.set_yscale("log")
    loss.set_ylabel("mean training loss (nats/token)")
    loss.set_title("loss of the finite models")
    legend(frac)
    return [Plot("stability", "Local training against the client learning rate", fig)]
