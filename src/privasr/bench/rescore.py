"""Throughput of N-best rescoring with a 4-gram, against scoring every hypothesis on its own.

Data: the ``ami-tts-nbest`` test set (1,954 10-best lists) with a 4-gram trained (modified Kneser-Ney) on the
AMI train transcripts, when ``../shared/data`` is present; else the synthetic corpus
(:mod:`privasr.synth`, ``small`` preset, dev + test lists) with a 4-gram on its background text.
Both timings cover getting one natural-log LM score for every hypothesis and picking each list's best
hypothesis under fixed weights (am + LM + word penalty); LM training is not timed.

* **engine**: :func:`~privasr.rescore.combine.score_table` with an :class:`~privasr.rescore.combine.LMScoreCache`
  (each distinct word sequence scored once, through ``score_batch``), vectorised totals and selection;
* **baseline**: ``NgramModel.score`` called once per hypothesis (no cache, no batching), totals and the best
  hypothesis computed in a Python loop.

Metrics (``results.json``): ``engine_hyps_per_s``, ``baseline_hyps_per_s`` and their ratio
``speedup_vs_per_hypothesis`` (above 1: the engine is faster), plus ``distinct_fraction`` (distinct word
sequences / hypotheses: how much the cache alone can save) and ``max_abs_score_diff`` (both paths must give
the same scores; the benchmark fails otherwise).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of
from privasr.corpus.records import NBest
from privasr.results import write_results

__all__ = ["run", "load_task"]


def load_task(seed: int, quick: bool) -> tuple[str, list[NBest], list[tuple[str, ...]]]:
    """(description, N-best lists, LM training sentences): AMI test + AMI train, or the synthetic corpus."""
    from privasr.paths import data_dir

    d = data_dir()
    if d is not None and (d / "ami-tts-nbest" / "test.jsonl.xz").is_file() and (d / "ami-transcripts").is_dir():
        from privasr.corpus.formats.ami_tts import read_ami_tts
        from privasr.corpus.sources import ami_sentences

        recs = read_ami_tts(d / "ami-tts-nbest" / "test.jsonl.xz")
        if quick:
            recs = recs[:300]
        return "ami-tts-nbest test, AMI-train 4-gram", recs, ami_sentences("train", d)
    from privasr.synth import SynthConfig, generate

    corpus = generate(SynthConfig.preset("tiny" if quick else "small", seed=seed))
    recs = [nb for nb in (*corpus.dev, *corpus.test) if all("am" in h.scores for h in nb.hyps)]
    return "synthetic corpus, background-text 4-gram", recs, [tuple(s.split()) for s in corpus.background]


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    from privasr.lm.ngram.mkn import train_mkn
    from privasr.rescore.combine import Combination, LMScoreCache, score_table, select

    repeats = 1 if quick else 3
    data, recs, text = load_task(seed, quick)
    lm = train_mkn(text, 4)
    comb = Combination(prior="am", lms=("lm4",))
    weights = {"lm4": 10.0, "word_penalty": -1.0}
    n_hyps = sum(len(nb.hyps) for nb in recs)

    def engine() -> tuple[np.ndarray, np.ndarray]:
        table = score_table(recs, {"lm4": LMScoreCache(lm)})
        return select(table, comb.totals(table, weights)), table.features["lm4"]

    def baseline() -> tuple[list[int], list[float]]:
        chosen, scores = [], []
        for nb in recs:
            best, best_tot = -1, -math.inf
            for j, h in enumerate(nb.hyps):
                s = lm.score(h.words).ln_total
                scores.append(s)
                tot = h.scores["am"] + weights["lm4"] * s + weights["word_penalty"] * len(h.words)
                if tot > best_tot:
                    best, best_tot = j, tot
            chosen.append(best)
        return chosen, scores

    t_engine, (ch_e, sc_e) = best_of(engine, repeats)
    t_base, (ch_b, sc_b) = best_of(baseline, repeats)
    diff = float(np.max(np.abs(np.asarray(sc_b) - sc_e))) if n_hyps else 0.0
    if diff > 1e-6 or list(ch_e) != list(ch_b):
        raise RuntimeError(f"engine and baseline disagree (max score difference {diff})")
    distinct = len({h.words for nb in recs for h in nb.hyps})
    metrics = {
        "lists": len(recs), "hypotheses": n_hyps, "distinct_fraction": distinct / n_hyps if n_hyps else 0.0,
        "lm_ngrams": [int(lm.num_ngrams(n)) for n in range(1, lm.order + 1)],
        "engine_s": t_engine, "baseline_s": t_base,
        "engine_hyps_per_s": n_hyps / t_engine, "baseline_hyps_per_s": n_hyps / t_base,
        "speedup_vs_per_hypothesis": t_base / t_engine, "max_abs_score_diff": diff,
    }
    write_results(out, config={"benchmark": "rescore", "data": data, "order": 4, "repeats": repeats,
                               "weights": weights}, seed=seed, metrics=metrics)
    return metrics
