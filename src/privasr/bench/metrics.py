"""Throughput of privasr's WER and of the sclite-compatible alignment + MAPSSWE, against jiwer.

Data: the 2,939 LibriSpeech test-other sentences of ``../shared/golden/sctk-mapsswe`` (ref, sys1, sys2)
when present, else generated sentences of the same size (seeded). Each timing is the best of several runs.
Ratios in ``results.json`` (``metrics``):

* ``wer_overhead_ratio``: ``privasr.metrics.wer`` time (its default, sclite's alignment) /
  ``jiwer.process_words`` time on the same text (validation, empty-sentence handling and per-utterance counts
  on top of the alignment);
* ``sclite_align_vs_jiwer_time_ratio``: ``align_many`` (sclite's weighted DP, numpy-batched) / jiwer
  (rapidfuzz C++ Levenshtein); above 1 means the sclite alignment is slower;
* ``mapsswe_vs_jiwer_time_ratio``: the whole MAPSSWE test (two alignments, segmentation, Z) / one jiwer call;
* ``alternations_vs_plain_time_ratio``: scoring the same sentences after one in five references got an sclite
  alternation (``{ word / @ }`` or ``{ word / other }``; :mod:`privasr.metrics.sclite`'s network alignment for
  those, the batched DP for the rest) / scoring them without;
* ``privasr_vs_sclite_binary_time_ratio`` (when NIST sclite is installed, Debian ``sctk``): reading both trn files
  and scoring them with the alternations, privasr (in process) / the ``sclite`` binary (``-o sum``), with the
  counts checked equal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jiwer
import numpy as np

from privasr.bench import best_of
from privasr.metrics.align import align_many
from privasr.metrics.mapsswe import mapsswe
from privasr.metrics.sclite import align_sclite
from privasr.metrics.wer import wer
from privasr.paths import golden_dir
from privasr.results import write_results

__all__ = ["run", "load_sentences", "sclite_binary"]


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
    alt = _alternations(refs, seed)
    t_plain, _ = best_of(lambda: align_sclite(refs, hyps_a), repeats)
    t_alt, alis = best_of(lambda: align_sclite(alt, hyps_a), repeats)
    binary = _against_sclite(out, alt, hyps_a, ids, alis, repeats)
    metrics = {
        "sentences": len(refs), "ref_words": n_words,
        "sentences_with_alternations": sum(1 for r in alt if "{" in r), "alternations_s": t_alt,
        "plain_sclite_conventions_s": t_plain, "alternations_vs_plain_time_ratio": t_alt / t_plain, **binary,
        "jiwer_process_words_s": t_jiwer, "privasr_wer_s": t_wer, "sclite_align_s": t_align, "mapsswe_s": t_map,
        "privasr_wer_words_per_s": n_words / t_wer, "sclite_align_words_per_s": n_words / t_align,
        "wer_overhead_ratio": t_wer / t_jiwer,
        "sclite_align_vs_jiwer_time_ratio": t_align / t_jiwer,
        "mapsswe_vs_jiwer_time_ratio": t_map / t_jiwer,
        "mapsswe_z": r.z, "mapsswe_segments": r.n,
    }
    write_results(out, config={"benchmark": "metrics", "data": data, "repeats": repeats}, seed=seed, metrics=metrics)
    return metrics


def _alternations(refs: list[list[str]], seed: int) -> list[list[str]]:
    """The references with an sclite alternation around one word of every fifth sentence (seeded)."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for k, r in enumerate(refs):
        if k % 5 or not r:
            out.append(list(r))
            continue
        i = int(rng.integers(len(r)))
        other = "@" if rng.random() < 0.5 else r[(i + 1) % len(r)]
        out.append([*r[:i], "{", r[i], "/", other, "}", *r[i + 1:]])
    return out


def sclite_binary() -> str | None:
    """NIST sclite's binary: ``$PRIVASR_SCLITE``, ``sclite`` on the PATH, or Debian's ``/usr/lib/sctk/bin/sclite``;
    ``None`` when none is installed (the benchmark's and the tests' oracle)."""
    env = os.environ.get("PRIVASR_SCLITE")
    if env and os.access(env, os.X_OK):
        return env
    return shutil.which("sclite") or next((c for c in ("/usr/lib/sctk/bin/sclite",) if os.access(c, os.X_OK)), None)


def _against_sclite(out: Path, refs: list[list[str]], hyps: list[list[str]], ids: list[str], alis: Any,
                    repeats: int) -> dict[str, Any]:
    """Files in, counts out: privasr (read + align in process) against the sclite binary on the same trn files."""
    exe = sclite_binary()
    if exe is None:
        return {"sclite_binary": None}
    from privasr.corpus.formats.trn import read_trn, reading_markup
    from privasr.metrics.wer import wer_from_alignments

    d = out / "sclite-bench"
    d.mkdir(parents=True, exist_ok=True)
    (d / "ref.trn").write_text("".join(f"{' '.join(r)} ({u})\n" for r, u in zip(refs, ids, strict=True)))
    (d / "hyp.trn").write_text("".join(f"{' '.join(h)} ({u})\n" for h, u in zip(hyps, ids, strict=True)))

    def ours() -> Any:
        with reading_markup():
            r, h = read_trn(d / "ref.trn"), read_trn(d / "hyp.trn")
        return wer_from_alignments(align_sclite([t.words for t in r], [t.words for t in h]))

    def theirs() -> str:
        subprocess.run([exe, "-r", str(d / "ref.trn"), "trn", "-h", str(d / "hyp.trn"), "trn", "-i", "spu_id",
                        "-o", "sum", "-O", str(d), "-n", "sc", "-f", "0"], check=True, capture_output=True)
        return (d / "sc.sys").read_text(errors="replace")

    t_ours, res = best_of(ours, repeats)
    t_theirs, report = best_of(theirs, repeats)
    total = next(line for line in report.splitlines() if "Sum/Avg" in line)
    agree = f"{res.sentences} {res.ref_words}" in " ".join(total.replace("|", " ").split())
    shutil.rmtree(d)
    return {"sclite_binary": exe, "privasr_files_to_counts_s": t_ours, "sclite_binary_s": t_theirs,
            "privasr_vs_sclite_binary_time_ratio": t_ours / t_theirs, "sclite_binary_agrees": agree,
            "errors_with_alternations": res.errors, "errors_with_alternations_in_process": wer_from_alignments(alis).errors}
