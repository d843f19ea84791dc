"""Server-side aggregation of FMP's sparse unigram updates: clients per second and memory vs number of clients.

Each simulated client sends what an FMP client sends (:class:`~privasr.federated.core.Update` with sorted unique
word ids and kernel-weighted counts): ``words`` distinct ids drawn from a Zipf(1.1) law over a ``vocab``-word
vocabulary (a pool of 1,000 such updates, cycled, so that generating them is not timed). The server folds them
as they arrive with :meth:`FmpAlgorithm.accumulate_many
<privasr.federated.algorithms.fmp.FmpAlgorithm.accumulate_many>` (blocks of ``ACCUMULATE_BLOCK`` updates, each
folded into the dense count vector by one ``np.bincount``; what the federated loop does) and finishes with
``server_update``. ``per_update_clients_per_second`` is the same with :meth:`FmpAlgorithm.accumulate` on each
update (the per-client path, for comparison).

* ``clients_per_second``: streaming aggregation rate (folding ``4 * BLOCK`` arriving updates, best of 100);
* ``batch_limit_clients_per_second``: the same counts summed in one vectorised ``np.bincount`` over all the
  pool's ids at once (no per-client work at all: the floor a server could reach by batching; best of 100,
  measured in turn with the streaming windows), and the ratio ``fraction_of_batch_limit``;
* ``peak_memory_mb_1k_clients`` and ``peak_memory_mb_1m_clients``: peak memory allocated during aggregation
  (tracemalloc: numpy and Python allocations) for 1,000 and 1,000,000 clients (100,000 with ``--quick``);
  ``memory_ratio_1m_vs_1k`` must stay near 1: memory does not grow with the number of clients.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from privasr.results import write_results

__all__ = ["run"]

BLOCK = 1000
"""Updates folded per block: small enough that 1,000 clients already fill blocks (memory is then the same for any
number of clients), large enough that the per-block cost is spread."""


def _pool(vocab: int, words: int, n: int, seed: int) -> list[Any]:
    from privasr.federated.core import Update

    rng = np.random.default_rng(seed)
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    p = ranks ** -1.1
    p /= p.sum()
    pool = []
    for _ in range(n):
        ids = np.unique(rng.choice(vocab, size=words, p=p))
        counts = rng.gamma(1.0, 1.0, size=ids.size)
        pool.append(Update({"ids": ids.astype(np.int64), "counts": counts}, weight=float(counts.sum()),
                           metrics={"utterances": 1.0}))
    return pool


def _aggregate(alg: Any, pool: list[Any], clients: int, *, trace: bool) -> tuple[float, float, Any]:
    """(seconds, peak MB during aggregation, new server state); the peak is measured (``trace``) in a separate
    run from the time, since tracemalloc slows every allocation down."""
    state = alg.init(np.random.default_rng(0))
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    m = len(pool)
    acc = alg.accumulate_many(None, (pool[i % m] for i in range(clients)), block=BLOCK)  # arriving, in blocks
    state, _ = alg.server_update(state, acc, 0, np.random.default_rng(1))
    dt = time.perf_counter() - t0
    peak = 0.0
    if trace:
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
    return dt, peak / 2**20, state


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig

    vocab, words = 50_000, 200
    big = 100_000 if quick else 1_000_000
    pool = _pool(vocab, words, 1000, seed)
    u = np.full(vocab, 1.0 / vocab)
    alg = FmpAlgorithm(FmpConfig(), u)
    _aggregate(alg, pool, 200, trace=False)  # warm-up
    _, mem_small, _ = _aggregate(alg, pool, 1000, trace=True)
    _, mem_big, _ = _aggregate(alg, pool, big, trace=True)
    t_small, _, _ = _aggregate(alg, pool, 1000, trace=False)
    t_big, _, state = _aggregate(alg, pool, big, trace=False)
    # rates as best of many short windows, streaming and batch in turn and of similar length (about a
    # millisecond each): the machine is noisy, and a burst of load in one long window would decide the ratio
    all_ids = np.concatenate([p.arrays["ids"] for p in pool])
    all_counts = np.concatenate([p.arrays["counts"] for p in pool])
    n_rate = 4 * BLOCK
    t_rate, t_batch = math.inf, math.inf
    for _ in range(100):
        t0 = time.perf_counter()
        alg.accumulate_many(None, (pool[i % len(pool)] for i in range(n_rate)), block=BLOCK)
        t_rate = min(t_rate, time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref = np.bincount(all_ids, weights=all_counts, minlength=vocab)
        t_batch = min(t_batch, time.perf_counter() - t0)
    n_one = 20_000 if quick else 100_000
    acc = None
    t0 = time.perf_counter()
    for i in range(n_one):
        acc = alg.accumulate(acc, pool[i % len(pool)])
    per_update_cps = n_one / (time.perf_counter() - t0)
    # the streamed sum equals the batch sum (the pool cycled big/1000 times)
    expect = ref * (big // len(pool)) / (ref.sum() * (big // len(pool)))
    max_diff = float(np.max(np.abs(state["qbar"] - expect)))
    if max_diff > 1e-9:
        raise AssertionError(f"streamed aggregation differs from the batch sum by {max_diff}")
    cps = n_rate / t_rate
    batch_cps = len(pool) / t_batch
    metrics = {
        "clients_per_second": cps,
        "batch_limit_clients_per_second": batch_cps,
        "fraction_of_batch_limit": cps / batch_cps,
        "per_update_clients_per_second": per_update_cps,
        "speedup_vs_per_update": cps / per_update_cps,
        "peak_memory_mb_1k_clients": mem_small,
        "peak_memory_mb_1m_clients": mem_big,
        "memory_ratio_1m_vs_1k": mem_big / mem_small if mem_small else float("nan"),
        "clients_large_run": big,
        "vocab": vocab,
        "ids_per_update": float(np.mean([p.arrays["ids"].size for p in pool])),
        "dense_vector_mb": vocab * 8 / 2**20,
        "max_abs_diff_vs_batch": max_diff,
        "seconds_large_run": t_big,
        "seconds_1k": t_small,
    }
    write_results(out, config={"benchmark": "fmp-aggregation", "quick": quick, "vocab": vocab, "words": words},
                  seed=seed, metrics=metrics)
    return metrics
