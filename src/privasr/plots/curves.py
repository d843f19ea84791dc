"""Learning curves per round: the federated loop's round history (``history``: FedLM's training loss, update
norm and evaluation perplexity, FMP's per-round masses, the privacy spent so far) and FTL's validation and
training loss of every system against the FedAvg baseline (``runs``).

>>> history = [{"round": r, "metrics": {"clients": 4.0, "loss": 5.0 - r, "eval_ppl": 200.0 - 10 * r}}
...            for r in range(3)]
>>> [(p.name, p.title) for p in round_curves([("", {"history": history})])]
[('rounds', 'Per-round metrics of the federated run (round history)')]
>>> round_curves([("", {"metrics": {}})])
[]
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from privasr.plots._figure import Plot, Run, figure, legend, number, rows_of, series_label

__all__ = ["round_curves", "ftl_convergence"]

# bookkeeping of the round history that is not a learning curve
_SKIP = frozenset({"clients", "has_qbar", "delta", "skipped"})
# drawn first, in this order, when present
_FIRST = ("eval_ppl", "valid_loss", "loss", "train_loss", "wer", "epsilon", "update_norm")


def _history_series(history: Any) -> dict[str, tuple[list[int], list[float]]]:
    """``{metric: (rounds (1-based), values)}`` of a round history's finite numeric metrics."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for entry in rows_of(history):
        metrics = entry.get("metrics")
        r = entry.get("round")
        if not isinstance(metrics, Mapping) or not isinstance(r, int):
            continue
        for k, v in metrics.items():
            x = number(v)
            if k in _SKIP or x is None or not math.isfinite(x):
                continue
            xs, ys = out.setdefault(str(k), ([], []))
            xs.append(r + 1)
            ys.append(x)
    return out


def _integer_rounds(ax: Any) -> None:
    """Whole-number ticks on a round axis."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


_METRIC_LABELS = {"loss": "training loss (the clients' objective)", "eval_ppl": "perplexity", "ppl": "perplexity",
                  "update_norm": "update L2 norm", "clients": "clients reporting", "qbar_mass": "counts in q-bar",
                  "changed": "1-best changes", "has_qbar": "clients with q-bar"}
"""The y-axis label of a round-history metric (its name, spaced, when not listed)."""


def round_curves(runs: Sequence[Run]) -> list[Plot]:
    """One panel per metric of the round history (``history``), every run a line; metrics that stay
    constant in every run are left out. ``[]`` when no run has a history."""
    per_run = [(label, _history_series(res.get("history"))) for label, res in runs]
    names = {m for _, s in per_run for m in s if len(set(s[m][1])) > 1}
    if not names:
        return []
    ordered = [m for m in _FIRST if m in names] + sorted(names - set(_FIRST))
    fig, axes = figure(len(ordered), width=4.5, height=3.2)
    for ax, m in zip(axes, ordered, strict=True):
        for label, series in per_run:
            if m in series:
                xs, ys = series[m]
                ax.plot(xs, ys, marker="o", markersize=3, label=label or None)
        ax.set_title(m.replace("_", " "))
        ax.set_xlabel("round")
        _integer_rounds(ax)
        ax.grid(alpha=0.3)
        ax.set_ylabel(_METRIC_LABELS.get(m, m.replace("_", " ")))
        legend(ax)
    fig.suptitle("Federated run, per round")
    return [Plot("rounds", "Per-round metrics of the federated run (round history)", fig)]


def ftl_convergence(runs: Sequence[Run]) -> list[Plot]:
    """FTL's validation loss and training loss per round of every system (``runs``: the FTL system, the FedAvg
    baseline, the table rows), with the target validation loss (``metrics.target_loss``); and each system's
    final test WER and CER beside the seed model's. ``[]`` without FTL runs.

    >>> res = {"metrics": {"target_loss": 0.5, "wer_seed": 0.9, "cer_seed": 0.3},
    ...        "runs": {"ftl": {"valid_loss": [0.7, 0.5], "train_loss": [0.8, 0.6], "wer": 0.8, "cer": 0.2},
    ...                 "baseline": {"valid_loss": [0.7, 0.6], "train_loss": [0.8, 0.7], "wer": 0.85, "cer": 0.25}}}
    >>> [p.name for p in ftl_convergence([("", res)])]
    ['ftl_convergence', 'ftl_wer']
    """
    systems = [(label, name, r) for label, res in runs if isinstance(res.get("runs"), Mapping)
               for name, r in res["runs"].items()
               if isinstance(r, Mapping) and isinstance(r.get("valid_loss"), list)]
    if not systems:
        return []
    fig, axes = figure(2, width=5.0, height=3.6)
    for ax, key, title in ((axes[0], "valid_loss", "validation loss"), (axes[1], "train_loss", "training loss")):
        for label, name, r in systems:
            ys = [number(v) for v in r.get(key) or []]
            if any(y is not None for y in ys):
                ax.plot(range(1, len(ys) + 1), [math.nan if y is None else y for y in ys], marker="o",
                        markersize=3, label=series_label(label, _run_label(name, r)),
                        linestyle="--" if name == "baseline" else "-")
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{title} (the model's objective)")
        _integer_rounds(ax)
        ax.grid(alpha=0.3)
    for label, res in runs:
        target = number((res.get("metrics") or {}).get("target_loss"))
        if target is not None and math.isfinite(target):
            axes[0].axhline(target, color="grey", linewidth=0.8, linestyle=":",
                            label=series_label(label, "target loss"))
    for ax in axes:
        legend(ax)
    fig.suptitle("FTL against the FedAvg baseline")
    plots = [Plot("ftl_convergence", "FTL convergence against the FedAvg baseline (validation and training "
                  "loss per round)", fig)]
    bars: list[tuple[str, float | None, float | None]] = []
    for label, res in runs:
        m = res.get("metrics") or {}
        if isinstance(res.get("runs"), Mapping) and number(m.get("wer_seed")) is not None:
            bars.append((series_label(label, "seed model"), number(m.get("wer_seed")), number(m.get("cer_seed"))))
    bars += [(series_label(label, _run_label(name, r)), number(r.get("wer")), number(r.get("cer")))
             for label, name, r in systems]
    if any(w is not None for _, w, _ in bars):
        plots.append(_wer_cer_bars(bars))
    return plots


def _run_label(name: str, run: Mapping[str, Any]) -> str:
    """A federated run's human name (``label`` in results.json's ``runs``), else its key."""
    label = run.get("label")
    return label if isinstance(label, str) and label else name


def _wer_cer_bars(bars: Sequence[tuple[str, float | None, float | None]]) -> Plot:
    fig, (ax,) = figure(1, width=max(5.0, 0.9 * len(bars)), height=3.6)
    xs = range(len(bars))
    w = 0.4
    ax.bar([x - w / 2 for x in xs], [100 * (b[1] or 0.0) for b in bars], w, label="WER")
    ax.bar([x + w / 2 for x in xs], [100 * (b[2] or 0.0) for b in bars], w, label="CER")
    ax.set_xticks(list(xs), [textwrap.fill(b[0], 32) for b in bars], rotation=30, ha="right", fontsize="small")
    ax.set_xlabel("system")
    ax.set_ylabel("test error rate (%)")
    ax.grid(axis="y", alpha=0.3)
    legend(ax)
    return Plot("ftl_wer", "FTL: test WER and CER of every system after the last round", fig)
