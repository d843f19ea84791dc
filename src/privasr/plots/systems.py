"""Test WER by system (``systems`` rows of results.json, else the ``wer*`` metrics) and the spread of WER
over clients (``per_client`` rows: one ``wer_<system>`` per system).

>>> res = {"systems": [{"system": "1-best", "wer": 0.3}, {"system": "rescored", "wer": 0.25}],
...        "per_client": [{"client": "a", "wer_1best": 0.2, "wer_rescored": 0.1},
...                       {"client": "b", "wer_1best": 0.4, "wer_rescored": 0.3}]}
>>> [p.name for p in system_wers([("", res)]) + client_spread([("", res)])]
['systems', 'clients']
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from privasr.plots._figure import Plot, Run, figure, legend, number, rows_of

__all__ = ["system_wers", "client_spread", "seed_pairs"]

_WER_KEY = re.compile(r"^wer(_[a-z0-9_]+)?$")
_NOT_A_SYSTEM = ("rel_change", "lost", "counts", "range")


def _systems(res: Mapping[str, Any]) -> dict[str, float]:
    """``{system: test WER}`` of one run."""
    s = res.get("systems")
    if isinstance(s, Mapping):
        return {str(k): w for k, v in s.items() if isinstance(v, Mapping) and (w := number(v.get("wer"))) is not None}
    if rows_of(s):
        return {str(r.get("system")): w for r in rows_of(s) if (w := number(r.get("wer"))) is not None}
    if isinstance(res.get("runs"), Mapping):  # FTL: ftl_convergence draws its systems
        return {}
    m = res.get("metrics") or {}
    out = {}
    for k, v in m.items():
        w = number(v)
        if _WER_KEY.match(k) and not any(t in k for t in _NOT_A_SYSTEM) and w is not None and 0 <= w <= 2:
            out["system" if k == "wer" else k[4:].replace("_", " ")] = w
    return out if len(out) >= 2 else {}


def system_wers(runs: Sequence[Run]) -> list[Plot]:
    """Horizontal bars of every system's test WER, the runs side by side. ``[]`` when no run names systems."""
    per_run = [(label, _systems(res)) for label, res in runs]
    names: list[str] = []
    for _, s in per_run:
        names += [n for n in s if n not in names]
    if not names:
        return []
    n = len(per_run)
    height = 0.8 / n
    fig, (ax,) = figure(1, width=8.0, height=max(2.5, 0.35 * len(names) * max(1, n) + 1))
    for i, (label, s) in enumerate(per_run):
        ys = [k + i * height for k in range(len(names))]
        ax.barh(ys, [100 * s.get(nm, 0.0) for nm in names], height, label=label or None)
        if n == 1:
            for y, nm in zip(ys, names, strict=True):
                if nm in s:
                    ax.text(100 * s[nm], y, f" {100 * s[nm]:.2f}", va="center", fontsize="small")
    ax.set_yticks([k + 0.4 - height / 2 for k in range(len(names))],
                  [nm if len(nm) <= 60 else nm[:57] + "..." for nm in names])
    ax.invert_yaxis()
    ax.set_xlabel("test WER (%)")
    ax.set_ylabel("system")
    ax.grid(axis="x", alpha=0.3)
    legend(ax)
    return [Plot("systems", "Test WER by system", fig)]


def client_spread(runs: Sequence[Run]) -> list[Plot]:
    """Per system, each client's WER (a box over clients and the clients as points), the runs side by side.
    ``[]`` without ``per_client`` rows."""
    per_run = []
    for label, res in runs:
        rows = rows_of(res.get("per_client"))
        cols: dict[str, list[float]] = {}
        for r in rows:
            for k, v in r.items():
                w = number(v)
                if k.startswith("wer_") and w is not None:
                    cols.setdefault(k[4:], []).append(100 * w)
        if cols:
            per_run.append((label, cols))
    if not per_run:
        return []
    systems: list[str] = []
    for _, cols in per_run:
        systems += [s for s in cols if s not in systems]
    n = len(per_run)
    width = 0.8 / n
    fig, (ax,) = figure(1, width=max(6.0, 1.3 * len(systems) * n), height=4.0)
    for i, (label, cols) in enumerate(per_run):
        pos = [k + i * width for k, s in enumerate(systems) if s in cols]
        data = [cols[s] for s in systems if s in cols]
        box = ax.boxplot(data, positions=pos, widths=0.8 * width, patch_artist=True, manage_ticks=False)
        color = f"C{i}"
        for patch in box["boxes"]:
            patch.set(facecolor=color, alpha=0.3)
        for p, d in zip(pos, data, strict=True):
            ax.scatter([p] * len(d), d, s=10, color=color, zorder=3, label=label if p == pos[0] and label else None)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(systems))], [s.replace("_", " ") for s in systems],
                  rotation=20, ha="right")
    ax.set_xlabel("system")
    ax.set_ylabel("WER per client (%)")
    ax.set_title(f"WER over clients ({max(len(v) for _, c in per_run for v in c.values())} clients)")
    ax.grid(axis="y", alpha=0.3)
    legend(ax)
    return [Plot("clients", "Per-client WER spread", fig)]


def seed_pairs(runs: Sequence[Run]) -> list[Plot]:
    """A comparison of two systems over several runs (``privasr ftl compare``: ``metrics.per_run`` with
    ``wer_a``/``wer_b``, the pooled ``difference`` and its interval): each run's two WERs joined by a line, and
    the seed-averaged difference with its bootstrap interval. ``[]`` without such metrics.

    >>> res = {"config": {"a": "ftl", "b": "baseline"}, "metrics": {"difference": -0.01, "ci_low": -0.02,
    ...        "ci_high": 0.0, "per_run": [{"run": "s1", "wer_a": 0.2, "wer_b": 0.21}]}}
    >>> [p.name for p in seed_pairs([("", res)])]
    ['compare']
    """
    found = [(label, res) for label, res in runs
             if rows_of((res.get("metrics") or {}).get("per_run"))
             and all(number(r.get("wer_a")) is not None for r in rows_of(res["metrics"]["per_run"]))]
    if not found:
        return []
    fig, (ax, diff) = figure(2, width=5.0, height=3.8)
    for i, (label, res) in enumerate(found):
        cfg, m = res.get("config") or {}, res["metrics"]
        a, b = str(cfg.get("a", "A")), str(cfg.get("b", "B"))
        for j, r in enumerate(rows_of(m["per_run"])):
            ax.plot([0, 1], [100 * number(r["wer_a"]), 100 * (number(r.get("wer_b")) or 0.0)], marker="o",
                    color=f"C{i}", alpha=0.7, label=(label or f"{a} vs {b}") if j == 0 else None)
        ax.set_xticks([0, 1], [a, b])
        d, lo, hi = (number(m.get(k)) for k in ("difference", "ci_low", "ci_high"))
        if d is not None and lo is not None and hi is not None:
            diff.errorbar([i], [100 * d], yerr=[[100 * (d - lo)], [100 * (hi - d)]], fmt="o", capsize=5,
                          color=f"C{i}")
    diff.axhline(0, color="grey", linestyle=":", linewidth=0.9)
    diff.set_xticks(range(len(found)), [label or "pooled" for label, _ in found])
    diff.set_ylabel("WER(A) - WER(B), points")
    diff.set_title("seed-averaged difference, bootstrap interval")
    ax.set_ylabel("test WER %")
    ax.set_title("each run's two systems")
    for x in (ax, diff):
        x.grid(axis="y", alpha=0.3)
    legend(ax)
    return [Plot("compare", "Two systems over several runs (seeds)", fig)]
