"""The privacy audit's plots (``sections`` of ``privasr audit``'s results.json): the membership attacks' ROC
curves (the ``roc`` points the audit stores, at most 100 per curve), the canaries' exposure against their
repetitions per privacy setting, and the empirical epsilon lower bounds of the FMP games beside the
accountant's epsilon.

>>> sec = {"fmp_checkpoint": {"auc": 0.75, "roc": {"fpr": [0, 0.5, 1], "tpr": [0, 1, 1]}},
...        "fmp": {"games": {"aggregate": {"eps_lb": 2.6, "eps_lb_max": 2.6},
...                          "dp_aggregate": {"eps_lb": 0.0, "eps_lb_max": 2.6, "epsilon_accountant": 1.0}}},
...        "fedlm": {"exposure": {"repetitions": [1, 4], "rows": [
...            {"setting": "no DP", "noise_multiplier": None, "epsilon": None, "exposure": {"1": 1.3, "4": 3.1}}]}}}
>>> [p.name for p in roc_curves([("", {"sections": sec})]) + exposure_curves([("", {"sections": sec})])
...  + epsilon_bounds([("", {"sections": sec})])]
['audit_roc', 'audit_exposure', 'audit_epsilon']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from privasr.plots._figure import Plot, Run, figure, legend, number, rows_of, series_label

__all__ = ["roc_curves", "exposure_curves", "epsilon_bounds", "name_survival"]


def _sections(res: Mapping[str, Any]) -> Mapping[str, Any]:
    s = res.get("sections")
    return s if isinstance(s, Mapping) else {}


def _rocs(sections: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(attack, section holding roc and auc)`` of every attack with a stored ROC curve."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    fc = sections.get("fmp_checkpoint")
    if isinstance(fc, Mapping) and isinstance(fc.get("roc"), Mapping):
        out.append(("FMP checkpoint", fc))
    lc = sections.get("fedlm_checkpoint")
    if isinstance(lc, Mapping) and isinstance(lc.get("attacks"), Mapping):
        out += [(f"FedLM checkpoint, {name.replace('_', '-')} attack", a) for name, a in lc["attacks"].items()
                if isinstance(a, Mapping) and isinstance(a.get("roc"), Mapping)]
    fmp = sections.get("fmp")
    if isinstance(fmp, Mapping) and isinstance(fmp.get("games"), Mapping):
        out += [(f"FMP game {name.replace('_', ' ')}", g) for name, g in fmp["games"].items()
                if isinstance(g, Mapping) and isinstance(g.get("roc"), Mapping)]
    return out


def roc_curves(runs: Sequence[Run]) -> list[Plot]:
    """Every attack's ROC curve (true against false positive rate, linear and log-log), AUC in the legend.
    ``[]`` when no section stores a ``roc``."""
    curves = [(series_label(label, attack), s) for label, res in runs for attack, s in _rocs(_sections(res))]
    if not curves:
        return []
    fig, axes = figure(2, width=5.0, height=4.2)
    for ax in axes:
        ax.plot([1e-4, 1], [1e-4, 1], color="grey", linestyle=":", linewidth=0.9, label="chance")
    for name, s in curves:
        fpr = [number(v) for v in s["roc"].get("fpr") or []]
        tpr = [number(v) for v in s["roc"].get("tpr") or []]
        pts = [(x, y) for x, y in zip(fpr, tpr, strict=False) if x is not None and y is not None]
        auc = number(s.get("auc"))
        lab = f"{name} (AUC {auc:.3f})" if auc is not None else name
        line = axes[0].plot([x for x, _ in pts], [y for _, y in pts], label=lab, drawstyle="steps-post")
        positive = [(x, y) for x, y in pts if x > 0 and y > 0]
        axes[1].plot([x for x, _ in positive], [y for _, y in positive], color=line[0].get_color(),
                     drawstyle="steps-post")
    axes[0].set_title("ROC of the membership attacks")
    axes[1].set_title("the same, log-log (low false positive rates)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.grid(alpha=0.3)
    legend(axes[0])
    return [Plot("audit_roc", "ROC curves of the membership attacks", fig)]


def _setting(row: Mapping[str, Any]) -> str:
    parts = [str(row.get("setting", ""))]
    z = number(row.get("noise_multiplier"))
    if z:
        parts.append(f"z={z:g}")
    eps = number(row.get("epsilon"))
    if eps is not None:
        parts.append(f"epsilon={eps:.3g}")
    return ", ".join(p for p in parts if p)


def exposure_curves(runs: Sequence[Run]) -> list[Plot]:
    """Canary exposure (bits) against how often the canary was repeated, one line per privacy setting; the
    exposure of never-inserted canaries of the same format (``baseline``) dotted and the largest measurable
    exposure (``max_exposure``) as a grey line. ``[]`` without an exposure audit."""
    rows = []
    maxima = []
    for label, res in runs:
        e = (_sections(res).get("fedlm") or {}).get("exposure")
        if not isinstance(e, Mapping):
            continue
        rows += [(label, r) for r in rows_of(e.get("rows")) if isinstance(r.get("exposure"), Mapping)]
        if number(e.get("max_exposure")) is not None:
            maxima.append((label, number(e.get("max_exposure"))))
    if not rows:
        return []
    fig, (ax,) = figure(1, width=6.5, height=4.2)
    for label, r in rows:
        pts = sorted((float(k), number(v)) for k, v in r["exposure"].items() if number(v) is not None)
        line = ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=series_label(label, _setting(r)))
        b = number(r.get("baseline"))
        if b is not None and math.isfinite(b):
            ax.axhline(b, color=line[0].get_color(), linestyle=":", linewidth=0.8)
    for label, m in maxima:
        ax.axhline(m, color="grey", linewidth=0.8, label=series_label(label, "largest measurable exposure"))
    ax.set_xscale("log", base=2)
    reps = sorted({float(k) for _, r in rows for k in r["exposure"]})
    ax.set_xticks(reps, [f"{x:g}" for x in reps])
    ax.set_xlabel("repetitions of the canary in its client's data")
    ax.set_ylabel("exposure (bits)")
    ax.set_title("Canary exposure against repetitions (dotted: canaries never inserted)")
    ax.grid(alpha=0.3)
    legend(ax)
    return [Plot("audit_exposure", "Canary exposure against repetitions per privacy setting", fig)]


def _dp_games(res: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The ``dp_games`` section's releases and controls as ``(name, game)`` with ``epsilon_accountant``."""
    out = []
    for name, g in ((_sections(res).get("dp_games") or {}).get("games") or {}).items():
        if not isinstance(g, Mapping):
            continue
        for run, suffix in (("release", ""), ("control", " (planted leak)")):
            r = g.get(run)
            if isinstance(r, Mapping):
                out.append((name.replace("_", " ") + suffix, {**r, "epsilon_accountant": r.get("epsilon")}))
    return out


def epsilon_bounds(runs: Sequence[Run]) -> list[Plot]:
    """Per membership game (FMP's, and the ``dp_games`` section's releases and planted controls), the empirical
    epsilon lower bound (bar), the largest bound its trials could show (``eps_lb_max``, a tick) and the
    accountant's epsilon where the game ran with DP (a star). ``[]`` without games."""
    games = [(series_label(label, name.replace("_", " ")), g) for label, res in runs
             for name, g in [*((_sections(res).get("fmp") or {}).get("games") or {}).items(), *_dp_games(res)]
             if isinstance(g, Mapping) and number(g.get("eps_lb")) is not None]
    if not games:
        return []
    fig, (ax,) = figure(1, width=max(5.0, 1.4 * len(games)), height=4.0)
    xs = list(range(len(games)))
    ax.bar(xs, [number(g["eps_lb"]) for _, g in games], 0.6, label="empirical lower bound")
    tops = [(x, number(g.get("eps_lb_max"))) for x, (_, g) in zip(xs, games, strict=True)
            if number(g.get("eps_lb_max")) is not None]
    if tops:
        ax.scatter([x for x, _ in tops], [y for _, y in tops], marker="_", s=600, color="black",
                   label="largest bound the trials can show")
    acc = [(x, number(g.get("epsilon_accountant"))) for x, (_, g) in zip(xs, games, strict=True)
           if number(g.get("epsilon_accountant")) is not None]
    if acc:
        ax.scatter([x for x, _ in acc], [y for _, y in acc], marker="*", s=150, color="C3", zorder=3,
                   label="accountant's epsilon")
    ax.set_xticks(xs, [n for n, _ in games], rotation=20, ha="right")
    ax.set_xlabel("membership game")
    ax.set_ylabel("epsilon")
    ax.set_title("Membership games: empirical epsilon lower bound and the accountant's epsilon")
    ax.grid(axis="y", alpha=0.3)
    legend(ax)
    return [Plot("audit_epsilon", "Empirical epsilon lower bounds beside the accountant's epsilon", fig)]


def name_survival(runs: Sequence[Run]) -> list[Plot]:
    """Planted names surviving anonymisation per name shape (``metrics.by_shape`` of ``privasr anon
    eval-names``), one bar per shape and run, with the target (``metrics.target``) as a line. ``[]`` without.

    >>> res = {"metrics": {"target": 0.02, "by_shape": {"first_last": {"survival": 0.01, "names": 300},
    ...                                                 "initials": {"survival": 0.03, "names": 300}}}}
    >>> [p.name for p in name_survival([("", res)])]
    ['name_survival']
    """
    runs_with = [(label, (res.get("metrics") or {})) for label, res in runs
                 if isinstance((res.get("metrics") or {}).get("by_shape"), Mapping)]
    if not runs_with:
        return []
    shapes: list[str] = []
    for _, m in runs_with:
        shapes += [s for s in m["by_shape"] if s not in shapes]
    fig, (ax,) = figure(1, width=max(6.0, 0.7 * len(shapes)), height=3.8)
    width = 0.8 / len(runs_with)
    for k, (label, m) in enumerate(runs_with):
        ys = [100 * (number((m["by_shape"].get(s) or {}).get("survival")) or 0.0) for s in shapes]
        ax.bar([i + k * width for i in range(len(shapes))], ys, width, label=label or None)
    target = next((number(m.get("target")) for _, m in runs_with if number(m.get("target")) is not None), None)
    if target is not None:
        ax.axhline(100 * target, color="grey", linestyle=":", linewidth=0.9, label=f"target {100 * target:g}%")
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))], [s.replace("_", " ") for s in shapes],
                  rotation=30, ha="right")
    ax.set_xlabel("name shape")
    ax.set_ylabel("names with a word left unchanged (%)")
    ax.grid(axis="y", alpha=0.3)
    legend(ax)
    title = "Planted names surviving anonymisation, by shape"
    fig.suptitle(title)
    return [Plot("name_survival", title, fig)]
