"""Compare two systems of several FTL runs (seeds) on the same test set: per-run WERs and the seed-averaged WER
difference with a paired bootstrap over test utterances.

One seed's MAPSSWE says whether *that* run's two systems differ; federated training is noisy, so a claim such
as "no worse final WER" is better judged over seeds. :func:`compare_runs` reads finished runs' ``results.json``
(written by :func:`~privasr.experiments.ftl.run_ftl`, which keeps every system's test 1-best), checks that they
evaluate on the same test utterances, and pools them **by utterance**: for each test utterance the word errors
of system A summed over the runs, likewise B, and its reference words times the number of runs. The paired
bootstrap (:func:`~privasr.metrics.bootstrap.paired_bootstrap`) resamples utterances with their runs kept
together, so the interval covers the test set's sampling while the runs' training noise is averaged, and
utterances stay the independent unit (pooling the runs as extra segments in MAPSSWE would count the same
utterance several times as if independent).

>>> from privasr.experiments.ftl_compare import pooled_difference
>>> r = pooled_difference([[1, 0], [2, 0]], [[1, 1], [1, 1]], [4, 4], resamples=200, seed=0)
>>> round(r["wer_a"], 4), round(r["wer_b"], 4), r["runs"]
(0.1875, 0.25, 2)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import InputError

__all__ = ["compare_runs", "pooled_difference", "write_comparison"]


def pooled_difference(errors_a: Sequence[Sequence[int]], errors_b: Sequence[Sequence[int]],
                      ref_words: Sequence[int], *, resamples: int = 1000, confidence: float = 0.95,
                      seed: int = 0) -> dict[str, Any]:
    """Seed-averaged WERs of A and B from per-run, per-utterance error counts (``errors_a[run][utt]``) and the
    paired bootstrap interval of ``WER(A) - WER(B)`` over utterances (each run's counts stay with its
    utterance)."""
    from privasr.metrics.bootstrap import paired_bootstrap

    ea, eb = np.asarray(errors_a, dtype=np.int64), np.asarray(errors_b, dtype=np.int64)
    rw = np.asarray(ref_words, dtype=np.int64)
    if ea.ndim != 2 or ea.shape != eb.shape or ea.shape[1] != rw.size or ea.shape[0] == 0:
        raise InputError(f"error counts of shape {ea.shape} and {eb.shape} for {rw.size} utterances",
                         expected="one count per run and utterance for each system")
    n = ea.shape[0]
    sa, sb, words = ea.sum(axis=0), eb.sum(axis=0), rw * n
    bs = paired_bootstrap(sa, sb, words, resamples=resamples, confidence=confidence, seed=seed)
    total = int(words.sum())
    return {"runs": n, "utterances": int(rw.size), "wer_a": float(sa.sum() / total), "wer_b": float(sb.sum() / total),
            "difference": float((sa.sum() - sb.sum()) / total), "ci_low": bs.ci_low, "ci_high": bs.ci_high,
            "confidence": confidence, "prob_a_better": bs.prob_a_better, "resamples": resamples}


def _read(run: Path) -> dict[str, Any]:
    path = run / "results.json" if run.is_dir() else run
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no such file", path=path, expected="the results.json of a finished privasr ftl run") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read it: {e}", path=path, expected="a results.json written by privasr ftl run") from None
    if not isinstance(res, dict) or not isinstance(res.get("runs"), dict) or not isinstance(res.get("config"), dict):
        raise InputError("it has no 'runs' or 'config'", path=path, expected="a results.json written by privasr ftl")
    res["_path"] = str(path)
    return res


def _test_set(config: Mapping[str, Any], path: str) -> list[Any]:
    from privasr.errors import ConfigError
    from privasr.experiments.ftl import load_ftl_config, load_utterances

    try:
        cfg = load_ftl_config(config)
    except ConfigError as e:
        raise InputError(f"its config no longer validates: {e.message}", path=path,
                         expected="a run of this privasr version's FTL config") from None
    return load_utterances(cfg)[1]


def compare_runs(runs: Sequence[str | Path], a: str = "ftl", b: str = "baseline", *, resamples: int = 1000,
                 confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Compare systems ``a`` and ``b`` (names in each run's ``runs``: ``ftl``, ``baseline`` or a table row)
    over finished FTL runs that share a test set: each run's WERs and MAPSSWE, and :func:`pooled_difference`.

    Raises :class:`InputError` naming the file for a missing or foreign results.json, an unknown system, or runs
    whose test utterances differ.
    """
    from privasr.metrics import wer
    from privasr.metrics.mapsswe import mapsswe

    if not runs:
        raise InputError("no runs to compare", expected="one or more FTL output folders")
    cache: dict[str, list[Any]] = {}
    refs: list[tuple[str, ...]] | None = None
    first = ""
    per_run, errs_a, errs_b = [], [], []
    words: list[int] = []
    for run in runs:
        res = _read(Path(run))
        path = res["_path"]
        key = json.dumps(res["config"].get("data"), sort_keys=True) + (
            f"/seed {res['config'].get('seed')}" if (res["config"].get("data") or {}).get("kind") == "synthetic"
            else "")
        if key not in cache:
            cache[key] = _test_set(res["config"], path)
        test = cache[key]
        these = [tuple(e.words) for e in test]
        if refs is None:
            refs, first = these, path
        elif these != refs:
            raise InputError(f"its test utterances differ from those of {first}", path=path,
                             expected="runs evaluated on the same test set (same data config)")
        hyps = {}
        for name in (a, b):
            sysrun = res["runs"].get(name)
            if not isinstance(sysrun, dict) or not isinstance(sysrun.get("hypotheses"), list):
                raise InputError(f"it has no system {name!r} with test hypotheses (systems: {sorted(res['runs'])})",
                                 path=path, expected="--a/--b naming systems of every run")
            if len(sysrun["hypotheses"]) != len(test):
                raise InputError(f"system {name!r} has {len(sysrun['hypotheses'])} hypotheses for {len(test)} test "
                                 "utterances", path=path, expected="one test hypothesis per utterance")
            hyps[name] = [str(h).split() for h in sysrun["hypotheses"]]
        wa, wb = wer(refs, hyps[a]), wer(refs, hyps[b])
        sig = mapsswe(list(refs), hyps[a], hyps[b], ids=[f"{e.speaker}-{e.utt_id}" for e in test])
        per_run.append({"run": path, "seed": res.get("seed"), "wer_a": wa.wer, "wer_b": wb.wer,
                        "mapsswe_p": sig.p, "mapsswe_better": {"A": a, "B": b}.get(sig.better, sig.better)})
        errs_a.append(list(wa.utt_errors))
        errs_b.append(list(wb.utt_errors))
        words = list(wa.utt_ref_words)
    pooled = pooled_difference(errs_a, errs_b, words, resamples=resamples, confidence=confidence, seed=seed)
    return {"a": a, "b": b, "per_run": per_run, "pooled": pooled}


def write_comparison(out: str | Path, result: Mapping[str, Any], config: Mapping[str, Any], seed: int) -> Path:
    """Write :func:`compare_runs`' ``result`` as ``out/results.json`` (``config``, ``seed``, the pooled metrics
    and ``per_run``), its plot (``out/plots/compare.png``) and ``out/report.md``; return the results path."""
    from privasr.plots import plots_section
    from privasr.results import write_results

    p, a, b = result["pooled"], result["a"], result["b"]
    path = write_results(out, runner="ftl-compare", config=config, seed=seed, metrics={**p, "per_run": result["per_run"]})
    lines = [f"# FTL runs compared: {a} against {b}", "", f"| run | seed | {a} WER | {b} WER | MAPSSWE p |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['run']} | {r['seed']} | {100 * r['wer_a']:.2f}% | {100 * r['wer_b']:.2f}% | {r['mapsswe_p']:.3g} |"
              for r in result["per_run"]]
    lines += ["", f"Over {p['runs']} runs: {a} {100 * p['wer_a']:.2f}%, {b} {100 * p['wer_b']:.2f}%, difference "
              f"{100 * p['difference']:+.2f} points, {100 * p['confidence']:g}% paired bootstrap interval "
              f"[{100 * p['ci_low']:+.2f}, {100 * p['ci_high']:+.2f}] over test utterances."]
    (Path(out) / "report.md").write_text("\n".join(lines) + "\n" + plots_section(out), encoding="utf-8")
    return path
