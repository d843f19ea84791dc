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

from privasr.plots._figure import Plot, Run, figure, legend, number, rows_of, series_label

__all__ = ["system_wers", "client_spread", "seed_pairs", "fold_spread"]

_WER_KEY = re.compile(r"^wer(_[a-z0-9_]+)?$")
_NOT_A_SYSTEM = ("rel_change", "lost", "counts", "range")


_FIRST_PASS = re.compile(r"1-best|first[- ]pass", re.I)
_ORACLE = re.compile(r"oracle", re.I)


def _systems(res: Mapping[str, Any]) -> dict[str, float]:
    """``{system: test WER}`` of one run, by the systems' human names: the ``systems`` rows, else the shared
    metrics (``wer`` named by ``wer_system``, the config's name or ``system``; ``wer_baseline`` by ``baseline``,
    left out when it is the first pass; ``wer_first_pass`` / ``wer_1best`` and ``wer_oracle``)."""
    s = res.get("systems")
    if isinstance(s, Mapping):
        return {str(k): w for k, v in s.items() if isinstance(v, Mapping) and (w := number(v.get("wer"))) is not None}
    if rows_of(s):
        return {str(r.get("system")): w for r in rows_of(s) if (w := number(r.get("wer"))) is not None}
    if isinstance(res.get("runs"), Mapping):  # FTL: ftl_convergence draws its systems
        return {}
    m = res.get("metrics") or {}
    cfg = res.get("config") if isinstance(res.get("config"), Mapping) else {}
    out: dict[str, float] = {}
    first = next((w for k in ("wer_first_pass", "wer_1best") if (w := number(m.get(k))) is not None), None)
    if first is not None:
        out["first-pass 1-best"] = first
    base = number(m.get("wer_baseline"))
    if base is not None and (m.get("baseline") or first is None) and base != first:
        out[f"baseline: {m['baseline']}" if isinstance(m.get("baseline"), str) else "baseline"] = base
    for k, v in m.items():
        w = number(v)
        if (_WER_KEY.match(k) and k not in ("wer", "wer_baseline", "wer_first_pass", "wer_1best", "wer_oracle", "wer_dev")
                and not any(t in k for t in _NOT_A_SYSTEM) and w is not None and 0 <= w <= 2):
            out[k[4:].replace("_", " ")] = w
    if (w := number(m.get("wer"))) is not None:
        out[str(m.get("wer_system") or cfg.get("name") or "system")] = w
    if (w := number(m.get("wer_oracle"))) is not None:
        out["N-best oracle"] = w
    return out if len(out) >= 2 else {}


def _interval(res: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """The system's WER interval implied by the bootstrap interval of its difference to the baseline:
    ``(system name, low, high)`` (WER fractions), or ``None``."""
    m = res.get("metrics") or {}
    base, lo, hi = (number(m.get(k)) for k in ("wer_baseline", "bootstrap_ci_low", "bootstrap_ci_high"))
    if base is None or lo is None or hi is None or res.get("systems"):
        return None
    cfg = res.get("config") if isinstance(res.get("config"), Mapping) else {}
    return str(m.get("wer_system") or cfg.get("name") or "system"), base + lo, base + hi


def system_wers(runs: Sequence[Run]) -> list[Plot]:
    """Horizontal bars of every system's test WER by its human name, the runs side by side; the first pass and
    the N-best oracle as reference lines; the system's bootstrap interval (of its difference to the baseline,
    added to the baseline's WER) as a segment across its bar; the WER axis zoomed to the data. ``[]`` when no run names
    systems.

    >>> res = {"config": {"name": "AMI trigram"}, "metrics": {"wer": 0.155, "wer_baseline": 0.21,
    ...        "wer_first_pass": 0.21, "wer_oracle": 0.12, "bootstrap_ci_low": -0.06, "bootstrap_ci_high": -0.05}}
    >>> p = system_wers([("", res)])[0]
    >>> [t.get_text() for t in p.figure.axes[0].get_yticklabels()]
    ['AMI trigram']
    """
    per_run = [(label, _systems(res), _interval(res)) for label, res in runs]
    refs: dict[str, list[float]] = {"first-pass 1-best": [], "N-best oracle": []}
    bars_by_run = []
    for label, s, ci in per_run:
        bars = {}
        for name, w in s.items():
            if _ORACLE.search(name):
                refs["N-best oracle"].append(w)
            elif _FIRST_PASS.search(name) and not name.startswith("baseline"):
                refs["first-pass 1-best"].append(w)
            else:
                bars[name] = w
        bars_by_run.append((label, bars, ci))
    names: list[str] = []
    for _, b, _ in bars_by_run:
        names += [n for n in b if n not in names]
    if not names and not any(refs.values()):
        return []
    n = len(bars_by_run)
    height = 0.8 / n
    fig, (ax,) = figure(1, width=8.0, height=max(2.5, 0.35 * max(1, len(names)) * max(1, n) + 1.2))
    values: list[float] = []
    for i, (label, b, ci) in enumerate(bars_by_run):
        ys = [k + i * height for k in range(len(names))]
        ax.barh(ys, [100 * b.get(nm, 0.0) for nm in names], height, label=label or None, color=f"C{i}")
        values += [100 * w for w in b.values()]
        if ci is not None and ci[0] in b:
            y = ys[names.index(ci[0])]
            ax.plot([100 * ci[1], 100 * ci[2]], [y, y], color="black", marker="|", markersize=12, linewidth=1.5,
                    label="bootstrap interval (baseline + the difference's interval)" if i == 0 else None)
            values += [100 * ci[1], 100 * ci[2]]
        if n == 1:
            for y, nm in zip(ys, names, strict=True):
                if nm in b:
                    ax.text(100 * b[nm], y, f" {100 * b[nm]:.2f}", va="center", fontsize="small")
    for (name, ws), style in zip(refs.items(), ("--", ":"), strict=True):
        for j, w in enumerate(sorted(set(ws))):
            ax.axvline(100 * w, color="black", linestyle=style, linewidth=1.0,
                       label=f"{name} ({100 * w:.2f}%)" if j == 0 or len(set(ws)) > 1 else None)
            values.append(100 * w)
    if values:
        lo, hi = min(values), max(values)
        pad = max(0.5, 0.15 * (hi - lo))
        ax.set_xlim(max(0.0, lo - pad), hi + 3 * pad)  # room for the values written beside the bars
    ax.set_yticks([k + 0.4 - height / 2 for k in range(len(names))],
                  [nm if len(nm) <= 60 else nm[:57] + "..." for nm in names])
    ax.invert_yaxis()
    ax.set_xlabel("test WER (%)")
    ax.set_ylabel("system")
    ax.grid(axis="x", alpha=0.3)
    legend(ax)
    return [Plot("systems", "Test WER by system, with the first pass and the N-best oracle as reference lines", fig)]


_CLIENT_NAMES = {"1best": "first-pass 1-best", "oracle": "N-best oracle", "fmp": "FMP",
                 "ngram_rescoring": "n-gram rescoring"}


def _client_name(key: str) -> str:
    return _CLIENT_NAMES.get(key, key.replace("_", " "))


def client_spread(runs: Sequence[Run]) -> list[Plot]:
    """Client by client against the baseline (``per_client`` rows, one ``wer_<system>`` per system; the baseline
    is the first pass, ``wer_1best``, else the first column): each client's WER under every system joined by a
    line, and each system's per-client difference to the baseline (a box without outlier markers, every client a
    point, so none is drawn twice). ``[]`` without ``per_client`` rows or with one system."""
    per_run = []
    for label, res in runs:
        rows = [r for r in rows_of(res.get("per_client")) if any(k.startswith("wer_") for k in r)]
        keys: list[str] = []
        for r in rows:
            keys += [k[4:] for k in r if k.startswith("wer_") and k[4:] not in keys]
        if rows and len(keys) >= 2:
            per_run.append((label, rows, keys))
    if not per_run:
        return []
    systems: list[str] = []
    for _, _, keys in per_run:
        systems += [k for k in keys if k not in systems]
    base = "1best" if "1best" in systems else systems[0]
    others = [k for k in systems if k != base]
    n = len(per_run)
    fig, (ax, diff) = figure(2, width=max(5.0, 1.2 * len(systems) + 1), height=4.2)
    width = 0.8 / n
    clients = 0
    for i, (label, rows, _keys) in enumerate(per_run):
        color = f"C{i}"
        for r in rows:
            ys = [number(r.get(f"wer_{k}")) for k in systems]
            ax.plot(range(len(systems)), [float("nan") if y is None else 100 * y for y in ys], color=color,
                    alpha=0.35, linewidth=0.8, marker="o", markersize=2.5)
        ax.plot([], [], color=color, label=label or f"a client ({len(rows)} clients)")
        clients = max(clients, len(rows))
        pos, data = [], []
        for k, s in enumerate(others):
            d = [100 * (a - b) for r in rows if (a := number(r.get(f"wer_{s}"))) is not None
                 and (b := number(r.get(f"wer_{base}"))) is not None]
            if d:
                pos.append(k + i * width)
                data.append(d)
        if data:
            box = diff.boxplot(data, positions=pos, widths=0.8 * width, patch_artist=True, manage_ticks=False,
                               showfliers=False)
            for patch in box["boxes"]:
                patch.set(facecolor=color, alpha=0.3)
            for p_, d in zip(pos, data, strict=True):
                diff.scatter([p_] * len(d), d, s=10, color=color, zorder=3,
                             label=(label or "a client") if p_ == pos[0] else None)
    ax.set_xticks(range(len(systems)), [_client_name(k) for k in systems], rotation=20, ha="right")
    ax.set_xlabel("system")
    ax.set_ylabel("WER of the client (%)")
    ax.set_title(f"each client across the systems ({clients} clients)")
    diff.axhline(0, color="black", linestyle=":", linewidth=0.9)
    diff.set_xticks([k + 0.4 - width / 2 for k in range(len(others))], [_client_name(k) for k in others],
                    rotation=20, ha="right")
    diff.set_xlabel("system")
    diff.set_ylabel(f"WER(system) - WER({_client_name(base)}), points")
    diff.set_title(f"per-client difference to the {_client_name(base)}")
    for a in (ax, diff):
        a.grid(axis="y", alpha=0.3)
        legend(a)
    return [Plot("clients", f"Per-client WER against the {_client_name(base)}, client by client", fig)]


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
    diff.set_xlabel("comparison")
    ax.set_xlabel("system")
    diff.set_title("seed-averaged difference, bootstrap interval")
    ax.set_ylabel("test WER %")
    ax.set_title("each run's two systems")
    for x in (ax, diff):
        x.grid(axis="y", alpha=0.3)
    legend(ax)
    return [Plot("compare", "Two systems over several runs (seeds)", fig)]


def fold_spread(runs: Sequence[Run]) -> list[Plot]:
    """Cross-validation folds (``folds`` rows with ``wer``, ``wer_baseline`` and ``wer_rel_change``, as
    ``privasr rescore run --folds K`` writes): each fold's baseline and system WER, and each fold's relative
    change beside the pooled one with its bootstrap interval over meetings. ``[]`` without such rows.

    >>> res = {"metrics": {"wer_rel_change": -0.1, "wer_baseline": 0.2, "meeting_bootstrap_ci_low": -0.03,
    ...                    "meeting_bootstrap_ci_high": -0.01},
    ...        "folds": [{"fold": 0, "wer": 0.18, "wer_baseline": 0.2, "wer_rel_change": -0.1}]}
    >>> [p.name for p in fold_spread([("", res)])]
    ['folds']
    """
    found = [(label, res) for label, res in runs
             if rows_of(res.get("folds")) and all(number(r.get("wer_rel_change")) is not None
                                                  for r in rows_of(res["folds"]))]
    if not found:
        return []
    fig, (ax, rel) = figure(2, width=6.0, height=3.8)
    for i, (label, res) in enumerate(found):
        rows = rows_of(res["folds"])
        xs = [int(number(r.get("fold")) or k) for k, r in enumerate(rows)]
        off = 0.15 * i
        names = res.get("metrics") or {}
        base_name = str(names.get("wer_baseline_system") or "baseline")
        sys_name = str(names.get("wer_system") or "system")
        ax.plot([x + off for x in xs], [100 * (number(r.get("wer_baseline")) or 0.0) for r in rows], "s--",
                color=f"C{i}", alpha=0.6, label=series_label(label, base_name))
        ax.plot([x + off for x in xs], [100 * (number(r.get("wer")) or 0.0) for r in rows], "o-", color=f"C{i}",
                label=series_label(label, sys_name))
        rel.bar([x + off for x in xs], [100 * (number(r["wer_rel_change"]) or 0.0) for r in rows], width=0.3,
                color=f"C{i}", alpha=0.6, label=series_label(label, "fold"))
        m = res.get("metrics") or {}
        pooled, base = number(m.get("wer_rel_change")), number(m.get("wer_baseline"))
        if pooled is not None:
            rel.axhline(100 * pooled, color=f"C{i}", linestyle="-", linewidth=1.2,
                        label=series_label(label, "pooled"))
            lo, hi = number(m.get("meeting_bootstrap_ci_low")), number(m.get("meeting_bootstrap_ci_high"))
            if lo is not None and hi is not None and base:
                rel.axhspan(100 * lo / base, 100 * hi / base, color=f"C{i}", alpha=0.12,
                            label=series_label(label, "95% interval over meetings"))
    ticks = sorted({int(number(r.get("fold")) or k) for _, res in found for k, r in enumerate(rows_of(res["folds"]))})
    for a in (ax, rel):
        a.set_xticks(ticks)
    ax.set_xlabel("fold")
    ax.set_ylabel("test WER of the fold's meetings (%)")
    ax.set_title("baseline and system per fold")
    rel.axhline(0, color="black", linestyle=":", linewidth=0.9)
    rel.set_xlabel("fold")
    rel.set_ylabel("relative WER change (%)")
    rel.set_title("relative change per fold and pooled")
    for a in (ax, rel):
        a.grid(axis="y", alpha=0.3)
        legend(a)
    return [Plot("folds", "Cross-validation over meetings: each fold and the pooled change", fig)]
