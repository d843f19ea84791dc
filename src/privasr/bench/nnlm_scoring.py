"""Throughput of N-best scoring with a Transformer LM: prefix-shared, batched scoring against one forward
pass per hypothesis, and against the machine's matmul rate.

Model: the paper-000 Transformer (embeddings 256, FFN 1024, 3 blocks, 4 heads) with random weights (speed
does not depend on the weights) over a ~10k-word vocabulary. Data: the first 400 (``--quick``: 60) 10-best
lists of ``ami-tts-nbest`` test, vocabulary from the AMI train transcripts (at most 10,000 words: 8,726 with
the specials), when ``../shared/data`` is present; else the synthetic corpus (:mod:`privasr.synth`)
with its background-text vocabulary (then smaller than 10k). Runs in fp32 on the CPU with
``torch.set_num_threads(os.cpu_count())`` (the scorer's default batch sizes), or on a CUDA device with ``--device
cuda`` (then forward calls of 4k, 16k and 64k positions and groups of 16k and 64k tokens are tried, output
blocks of 4,096 states, and the fastest is reported; the matmul reference is 8192 x 8192 fp32 at torch's default
precision, no TF32).

* **engine**: :meth:`~privasr.lm.neural.scorer.NeuralLM.score_ids` over all hypotheses at once, their word ids
  encoded beforehand (a prefix trie, tree-attention rows, an output log-sum-exp per distinct prefix; log10
  scores back as one array);
* **words**: :meth:`~privasr.lm.neural.scorer.NeuralLM.score_batch` on the same hypotheses as words: the engine
  plus encoding the words and building one :class:`~privasr.lm.base.SentenceScore` per hypothesis (Python
  objects, which on a GPU cost more than the network);
* **naive**: :meth:`~privasr.lm.neural.scorer.NeuralLM.score_naive`, one full forward pass per hypothesis
  (no prefix sharing, no batching; duplicates are scored again), on the first 100 (``--quick``: 20) lists
  only (it is slow); ``speedup_vs_naive`` compares it with the engine on those same lists;
* **matmul rate**: ``torch.matmul`` of two 2048 x 2048 fp32 matrices, best of several, in the same run.

FLOPs (a multiply-add is 2) of one distinct prefix (trie node) at depth ``t`` (``c = t + 1`` positions
attended), per block: QKV ``6 d^2``, attention output ``2 d^2``, FFN ``4 d f``, attention scores and weighted
sum ``4 d c``; plus the output projection ``2 d V``. For d=256, f=1024, 3 blocks, V=10k that is about 9.84
MFLOP per node, half of it the output projection (9.2 MFLOP on average with the AMI vocabulary). Embeddings,
layer norms, softmaxes and the log-sum-exp are not counted; neither are the repeated ancestors and padding of
the packed rows nor the masked-out attention entries (work the engine does but the count does not credit).

Metrics: ``speedup_vs_naive`` (naive time / engine time on the same lists; target >= 5), ``roofline_fraction``
(engine FLOP/s over the matmul rate; target >= 0.4 on the CPU, 0.3 on a GPU), ``words_roofline_fraction`` (the
same for the words path), ``max_abs_diff_vs_naive`` (log10, every token; must be <= 1e-5, else the benchmark
fails; the words path must give the engine's scores), ``*_tokens_per_s`` and ``*_hyps_per_s`` (scored tokens,
``</s>`` included, and hypotheses per second) for the three paths, ``distinct_prefix_fraction`` (trie nodes / scored tokens),
``flops_per_node``, ``matmul_gflops`` and ``engine_gflops``. On CUDA also, from one profiled run of the engine
(``torch.profiler``): ``gpu_kernel_s`` (the summed time of its CUDA kernels), ``gpu_busy_fraction`` (that over
the run's wall time: well below 1 when the host, not the GPU, sets the pace) and ``kernel_roofline_fraction``
(the FLOPs over the kernel time, against the matmul rate: how fast the kernels themselves are).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of, device_name, matmul_flops, sync
from privasr.errors import ConfigError
from privasr.results import write_results

__all__ = ["run", "flops_per_node", "matmul_rate", "load_task"]


def flops_per_node(depth: np.ndarray, *, d: int, ffn: int, layers: int, vocab: int) -> np.ndarray:
    """FLOPs of computing one trie node's log-probabilities (see the module docstring), per node depth.

    >>> int(flops_per_node(np.array([0]), d=256, ffn=1024, layers=3, vocab=10000)[0])
    9841664
    """
    c = np.asarray(depth, dtype=np.int64) + 1
    return layers * (8 * d * d + 4 * d * ffn + 4 * d * c) + 2 * d * vocab


def matmul_rate(n: int = 2048, repeats: int = 5, device: str = "cpu") -> float:
    """fp32 FLOP/s of ``torch.matmul`` on two ``n x n`` matrices (best of ``repeats``, after a warm-up)."""
    return matmul_flops(n, repeats, device=device)


def _gpu_busy(fn: Any) -> tuple[float, float] | None:
    """(seconds of CUDA kernels and copies, wall seconds) of one call of ``fn`` under torch's profiler; ``None``
    if the profiler cannot trace the device here."""
    import time

    import torch

    try:
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
        kernels = sum(e.device_time_total for e in prof.events()
                      if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    except Exception:  # noqa: BLE001 - profiling is a diagnostic; CUPTI may be missing
        return None
    return kernels / 1e6, wall


def load_task(seed: int, quick: bool, lists: int) -> tuple[str, list[list[tuple[str, ...]]], list[tuple[str, ...]]]:
    """(description, hypotheses per list, vocabulary sentences): AMI test lists + AMI train text, or synthetic."""
    from privasr.paths import data_dir

    d = data_dir()
    if d is not None and (d / "ami-tts-nbest" / "test.jsonl.xz").is_file() and (d / "ami-transcripts").is_dir():
        from privasr.corpus.formats.ami_tts import read_ami_tts
        from privasr.corpus.sources import ami_sentences

        recs = read_ami_tts(d / "ami-tts-nbest" / "test.jsonl.xz")[:lists]
        return ("ami-tts-nbest test, AMI-train vocabulary", [[h.words for h in nb.hyps[:10]] for nb in recs],
                ami_sentences("train", d))
    from privasr.synth import SynthConfig, generate

    corpus = generate(SynthConfig.preset("tiny" if quick else "small", seed=seed))
    recs = [*corpus.dev, *corpus.test][:lists]
    return ("synthetic corpus, background-text vocabulary", [[h.words for h in nb.hyps[:10]] for nb in recs],
            [tuple(s.split()) for s in corpus.background])


def run(out: Path, quick: bool = False, seed: int = 0, device: str = "cpu") -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    import torch

    from privasr.lm.neural.models import NeuralLMConfig, build_model
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.neural.trie import PrefixTrie
    from privasr.lm.neural.vocab import Vocabulary

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but torch sees no CUDA device", expected="cpu, or a machine with CUDA")
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    n_lists, n_naive = (60, 20) if quick else (400, 100)
    repeats = 1 if quick else 3
    data, lists, text = load_task(seed, quick, n_lists)
    vocab = Vocabulary.build(text, max_size=10_000)
    cfg = NeuralLMConfig.preset("paper000-transformer")
    model = build_model(cfg, vocab)
    # CPU: the scorer's defaults. CUDA: bigger forward calls and output blocks (the GPU needs the parallelism), and
    # groups small enough that the host builds one group's trie while the device runs the last one
    combos = [(4096, 1 << 16)] if not cuda else [(b, g) for b in (4096, 16384, 65536) for g in (16384, 65536)]
    out_rows = 128 if not cuda else 4096
    hyps = [h for nb in lists for h in nb]
    sub = [h for nb in lists[:n_naive] for h in nb]
    ids, off = vocab.encode_flat(hyps)
    sub_ids, sub_off = vocab.encode_flat(sub)
    n_tokens = sum(len(h) + 1 for h in hyps)
    n_sub_tokens = sum(len(h) + 1 for h in sub)

    mm_n = 2048 if not cuda else 8192
    peak = matmul_rate(mm_n, device=device)
    per_combo: dict[str, float] = {}
    best: tuple[float, tuple[int, int]] | None = None
    for bt, gt in combos:
        lm = NeuralLM(model, vocab, device=device, batch_tokens=bt, out_rows=out_rows, group_tokens=gt)
        lm.score_ids(*vocab.encode_flat(hyps[:50]))  # warm-up
        sync(device)
        t, _ = best_of(lambda lm=lm: lm.score_ids(ids, off), repeats)
        per_combo[f"{bt}/{gt}"] = n_tokens / t
        if best is None or t < best[0]:
            best = (t, (bt, gt))
    assert best is not None
    t_engine, (batch_tokens, group_tokens) = best
    lm = NeuralLM(model, vocab, device=device, batch_tokens=batch_tokens, out_rows=out_rows, group_tokens=group_tokens)
    t_words, by_words = best_of(lambda: lm.score_batch(hyps), repeats)
    t_sub, fast = best_of(lambda: lm.score_ids(sub_ids, sub_off), repeats)
    t_naive, slow = best_of(lambda: lm.score_naive(sub), 1)
    naive = np.concatenate([s.logprobs for s in slow])
    diff = float(np.max(np.abs(fast - naive)))
    if not diff <= 1e-5:
        raise RuntimeError(f"fast and naive scores differ by {diff} (log10)")
    words_diff = float(np.max(np.abs(np.concatenate([s.logprobs for s in by_words]) - lm.score_ids(ids, off))))
    if not words_diff <= 1e-6:
        raise RuntimeError(f"score_batch and score_ids differ by {words_diff} (log10)")
    peak = max(peak, matmul_rate(mm_n, device=device))

    gpu = _gpu_busy(lambda: lm.score_ids(ids, off)) if cuda else None
    trie = PrefixTrie.from_flat(ids, off)
    flops_nodes = flops_per_node(trie.depth, d=cfg.embed_dim, ffn=cfg.ffn_dim, layers=cfg.layers,
                                 vocab=len(vocab))
    engine_rate = float(flops_nodes.sum()) / t_engine
    metrics = {
        "lists": len(lists), "hypotheses": len(hyps), "scored_tokens": n_tokens, "trie_nodes": len(trie),
        "distinct_prefix_fraction": len(trie) / n_tokens, "vocab_size": len(vocab), "threads": threads,
        "engine_s": t_engine, "engine_tokens_per_s": n_tokens / t_engine, "engine_hyps_per_s": len(hyps) / t_engine,
        "words_s": t_words, "words_tokens_per_s": n_tokens / t_words, "words_hyps_per_s": len(hyps) / t_words,
        "naive_lists": min(n_naive, len(lists)), "naive_hypotheses": len(sub),
        "naive_s": t_naive, "engine_on_naive_lists_s": t_sub,
        "naive_tokens_per_s": n_sub_tokens / t_naive, "naive_hyps_per_s": len(sub) / t_naive,
        "speedup_vs_naive": t_naive / t_sub,
        "flops_per_node": float(flops_nodes.mean()),
        "flops_per_node_formula": "layers*(8*d^2 + 4*d*ffn + 4*d*(depth+1)) + 2*d*V",
        "engine_gflops": engine_rate / 1e9, "matmul_gflops": peak / 1e9,
        "roofline_fraction": engine_rate / peak,
        "words_roofline_fraction": float(flops_nodes.sum()) / t_words / peak,
        "max_abs_diff_vs_naive": diff,
        "engine_tokens_per_s_by_batch_and_group_tokens": per_combo,
    }
    if gpu is not None:
        kernel_s, wall_s = gpu
        metrics.update({"gpu_kernel_s": kernel_s, "gpu_profiled_wall_s": wall_s,
                        "gpu_busy_fraction": kernel_s / wall_s,
                        "kernel_roofline_fraction": float(flops_nodes.sum()) / kernel_s / peak if kernel_s else None})
    write_results(out, config={"benchmark": "nnlm-scoring", "data": data, "model": cfg.to_dict(),
                               "batch_tokens": batch_tokens, "group_tokens": group_tokens,
                               "batch_and_group_tokens_tried": [list(c) for c in combos], "row_len": lm.row_len,
                               "out_rows": lm.out_rows, "repeats": repeats, "device": device,
                               "device_name": device_name(device), "dtype": "float32",
                               "float32_matmul_precision": torch.get_float32_matmul_precision(),
                               "matmul_n": mm_n},
                  seed=seed, metrics=metrics)
    return metrics

