"""Speed of the synthetic-corpus generator and of its phonetic neighbour search.

Ratios in ``results.json`` (``metrics``):

* ``confusions_speedup_vs_exhaustive``: time per word of an exhaustive nearest-neighbour search (exact
  weighted phone distance from the word to every vocabulary word, :func:`phone_distance` in a loop) over
  the time per word of :class:`~privasr.corpus.phonetics.Confusions` (length buckets, numpy pre-filter,
  exact distances for the survivors), on the same vocabulary; ``confusions_top5_recall`` says how many of
  the exact top-5 neighbours the fast search keeps (its price);
* ``generate_vs_serialise_ratio``: generating the corpus over serialising it to canonical JSON Lines
  (how many times the cost of merely writing the data the generation costs);
* ``utterances_per_s`` of the generator (absolute, for scale).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of
from privasr.corpus.phonetics import Confusions, load_cmudict, phone_distance
from privasr.results import write_results
from privasr.synth import SynthConfig, general_english_unigrams, generate

__all__ = ["run"]


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    n_vocab = 2000 if quick else 5000
    n_probe = 10 if quick else 40
    lex = load_cmudict()
    vocab = [w for w, _ in general_english_unigrams(n_vocab)]
    t_fast, conf = best_of(lambda: Confusions(vocab, k=5), 1 if quick else 2)
    per_word_fast = t_fast / len(vocab)

    rng = np.random.default_rng(seed)
    probes = [vocab[i] for i in rng.choice(len(vocab), size=n_probe, replace=False)]
    words = conf.words
    prons = {w: conf.pronunciations(w)[:2] for w in words}
    t0 = time.perf_counter()
    recall = []
    for p in probes:
        dist = []
        for w in words:
            if w == p:
                continue
            dist.append((min(phone_distance(a, b) for a in prons[p] for b in prons[w]), w))
        dist.sort()
        exact = {w for _, w in dist[:5]}
        recall.append(len(exact & {n.word for n in conf.neighbours(p, 5)}) / 5)
    per_word_exhaustive = (time.perf_counter() - t0) / n_probe

    preset = "tiny" if quick else "small"
    t0 = time.perf_counter()
    corpus = generate(SynthConfig.preset(preset, seed=seed))
    t_gen = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t_write, _ = best_of(lambda: corpus.write(Path(tmp) / "c"), 1 if quick else 3)
    n_utts = len(corpus.dev) + len(corpus.test)
    metrics = {
        "vocabulary": len(vocab),
        "dictionary_words": len(lex),
        "confusions_s_per_word": per_word_fast,
        "exhaustive_s_per_word": per_word_exhaustive,
        "confusions_speedup_vs_exhaustive": per_word_exhaustive / per_word_fast,
        "confusions_top5_recall": float(np.mean(recall)),
        "generate_s": t_gen,
        "write_s": t_write,
        "generate_vs_serialise_ratio": t_gen / t_write,
        "utterances": n_utts,
        "utterances_per_s": n_utts / t_gen,
    }
    write_results(out, config={"benchmark": "synth", "preset": preset, "vocabulary": n_vocab, "probes": n_probe},
                  seed=seed, metrics=metrics)
    return metrics
