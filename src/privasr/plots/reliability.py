"""The reliability diagram of a confidence model (``reliability`` in results.json: per bin its edges, words,
mean confidence and accuracy, as :meth:`privasr.confidence.calibration.ReliabilityCurve.as_dict` writes them),
with the ECE (``confidence.ece``) in the legend and the words per bin below.

>>> rel = {"bin_lower": [0.0, 0.5], "bin_upper": [0.5, 1.0], "count": [10, 30],
...        "mean_confidence": [0.3, 0.8], "accuracy": [0.2, 0.85]}
>>> [p.name for p in reliability_diagram([("", {"reliability": rel, "confidence": {"ece": 0.04}})])]
['reliability']
>>> reliability_diagram([("", {"metrics": {}})])
[]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from privasr.plots._figure import Plot, Run, legend, number, pyplot, series_label

__all__ = ["reliability_diagram"]


def reliability_diagram(runs: Sequence[Run]) -> list[Plot]:
    """Accuracy against mean confidence per bin (the diagonal is perfect calibration), every run a line; a
    second panel with the words per bin. ``[]`` when no run has a ``reliability`` curve."""
    curves = [(label, res["reliability"], res.get("confidence")) for label, res in runs
              if isinstance(res.get("reliability"), Mapping)]
    if not curves:
        return []
    plt = pyplot()
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(5.5, 6.0), sharex=True, gridspec_kw={"height_ratios": [3, 1]},
                                   layout="constrained")
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=0.9, label="perfect calibration")
    width = 0.9 / len(curves)
    for i, (label, rel, conf) in enumerate(curves):
        conf_x = [number(v) for v in rel.get("mean_confidence") or []]
        acc = [number(v) for v in rel.get("accuracy") or []]
        pts = [(x, y) for x, y in zip(conf_x, acc, strict=False) if x is not None and y is not None]
        ece = number((conf or {}).get("ece")) if isinstance(conf, Mapping) else None
        name = series_label(label, f"ECE {ece:.3f}" if ece is not None else "")
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", markersize=4, label=name or None)
        lo = [number(v) or 0.0 for v in rel.get("bin_lower") or []]
        hi = [number(v) or 0.0 for v in rel.get("bin_upper") or []]
        counts = [number(v) or 0.0 for v in rel.get("count") or []]
        if lo and len(lo) == len(hi) == len(counts):
            w = [(b - a) * width for a, b in zip(lo, hi, strict=True)]
            hist.bar([a + i * wi for a, wi in zip(lo, w, strict=True)], counts, w, align="edge", alpha=0.6,
                     label=label or None)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy (fraction of correct words)")
    ax.set_xlabel("mean confidence of the bin")
    ax.xaxis.set_tick_params(labelbottom=True)
    ax.set_title("Reliability diagram of the word confidences")
    ax.grid(alpha=0.3)
    legend(ax)
    hist.set_xlabel("confidence")
    hist.set_ylabel("words")
    hist.grid(axis="y", alpha=0.3)
    return [Plot("reliability", "Reliability diagram of the confidence model", fig)]
