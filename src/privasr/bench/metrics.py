"""Throughput of privasr's WER and of the sclite-compatible alignment + MAPSSWE, against jiwer.

Data: the 2,939 LibriSpeech test-other sentences of ``../shared/golden/sctk-mapsswe`` (ref, sys1, sys2)
when present, else generated sentences of the same size (seeded). Each timing is the best of several runs.
Ratios in ``results.json`` (``metrics``):

* ``wer_overhead_ratio``: ``privasr.metrics.wer`` time / ``jiwer.process_words`` time on the same text
  (validation, empty-sentence handling and per-utterance counts on top of jiwer);
* ``sclite_align_vs_jiwer_time_ratio``: ``align_many`` (sclite's weighted DP, numpy-batched) / jiwer
  (rapidfuzz C++ Levenshtein); above 1 means the sclite alignment is slower;
* ``mapsswe_vs_jiwer_time_ratio``: the whole MAPSSWE test (two alignments, segmentation, Z) / one jiwer call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jiwer
import numpy as np

from privasr.bench import best_of
from privasr.metrics.align import align_many
from privasr.metrics.mapsswe import mapsswe
from privasr.metrics.wer import wer
from privasr.paths import golden_dir
from privasr.results import write_results

__all__ = ["run", "load_sentences"]


def load_sentences(seed: int) -> tuple[str, list[list[str]], list[list[str]], list[list[str]], list[str]]:
    """(description, refs, hyps A, hyps B, ids): the golden LibriSpeech trn files or generated ones."""
    from privasr.corpus.formats.trn import read_trn

    g = golden_dir()
    if g is not None and (g / "sctk-mapsswe" / "ref.trn").is_file():
        d = g / "sctk-mapsswe"
        ref, a, b = ({t.utt_id: list(t.words) for t in read_trn(d / f"{n}.trn")} for n in ("ref", "sys1", "sys2"))
        ids = list(ref)
        return "librispeech test-other (golden sctk-mapsswe trn)", [ref[i] for i in ids], \
            [a[i] for i in ids], [b[i] for i in ids], ids
    rng = np.random.default_rng(seed)
    vocab = [f"w{k}" for k in range(3000)]

    def corrupt(ws: list[str], p: float) -> list[str]:
        out = []
        for w in ws:
            u = rng.random()
            if u < p / 3:
                continue
            out.append(vocab[rng.integers(len(vocab))] if u < 2 * p / 3 else w)
            if u > 1 - p / 3:
                out.append(vocab[rng.integers(len(vocab))])
        return out

    refs = [[vocab[k] for k in rng.integers(0, len(vocab), rng.integers(3, 35))] for _ in range(2939)]
    ids = [f"spk{k % 33}-utt{k:05d}" for k in range(len(refs))]
    return "generated (2,939 sentences)", refs, [corrupt(r, 0.04) for r in refs], \
        [corrupt(r, 0.08) for r in refs], ids


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    repeats = 2 if quick else 5
    data, refs, hyps_a, hyps_b, ids = load_sentences(seed)
    nonempty = [k for k in range(len(refs)) if refs[k] and hyps_a[k]]
    ref_s = [" ".join(refs[k]) for k in nonempty]
    hyp_s = [" ".join(hyps_a[k]) for k in nonempty]
    n_words = sum(map(len, refs))

    t_jiwer, _ = best_of(lambda: jiwer.process_words(ref_s, hyp_s), repeats)
    t_wer, _ = best_of(lambda: wer(refs, hyps_a), repeats)
    t_align, _ = best_of(lambda: align_many(refs, hyps_a), repeats)
    t_map, r = best_of(lambda: mapsswe(refs, hyps_a, hyps_b, ids=ids), repeats)
    metrics = {
        "sentences": len(refs), "ref_words": n_words,
        "jiwer_process_words_s": t_jiwer, "privasr_wer_s": t_wer, "sclite_align_s": t_align, "mapsswe_s": t_map,
        "privasr_wer_words_per_s": n_words / t_wer, "sclite_align_words_per_s": n_words / t_align,
        "wer_overhead_ratio": t_wer / t_jiwer,
        "sclite_align_vs_jiwer_time_ratio": t_align / t_jiwer,
        "mapsswe_vs_jiwer_time_ratio": t_map / t_jiwer,
        "mapsswe_z": r.z, "mapsswe_segments": r.n,
    }
    write_results(out, config={"benchmark": "metrics", "data": data, "repeats": repeats}, seed=seed, metrics=metrics)
    return metrics
