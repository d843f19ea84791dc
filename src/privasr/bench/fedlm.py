"""Federated NNLM fine-tuning (:mod:`privasr.federated.algorithms.fedlm`): round throughput on the local and Ray
backends, server memory against the number of clients, and the cost of differential privacy.

**Setup.** The ``tiny-transformer`` preset (:meth:`NeuralLMConfig.preset
<privasr.lm.neural.models.NeuralLMConfig.preset>`) over a :class:`~privasr.lm.neural.vocab.Vocabulary` of 2,000
synthetic word types (2,003 with the specials; 70,579 float32 parameters, 0.27 MB). A population of 32
:class:`~privasr.federated.algorithms.fedlm.FedLmClient` (:func:`make_clients`), each with 20 sentences of 10-15
uniformly random word ids and a uniform random confidence in ``[0, 1]`` per word; ``FedLmConfig(loss="token",
server={"name": "adam", "lr": 0.001})`` (FedAdam; one local epoch, batch 8, ``weighting="words"``).
:func:`~privasr.federated.loop.run_federated` samples ``K`` clients per round with
:class:`~privasr.federated.sampling.UniformWithoutReplacement`. torch runs on one thread in this process for the
whole benchmark (restored afterwards; ``torch_threads`` = 1), so that "local" means one core; each Ray worker is
one actor with one CPU. A round's time is :attr:`RoundLog.seconds <privasr.federated.loop.RoundLog>` (broadcast,
sampling, the clients, accumulation, noise and accounting, server step); a figure "per K" is the mean over the
timed rounds of one run of ``1 + rounds`` rounds whose first round is not timed.

1. **Throughput against K** (``K`` in 2, 4, 8, 16; ``--quick``: 2, 4; 10 timed rounds, ``--quick``: 3):

   * ``round_s_local_K``: mean round time on the ``local`` backend; ``client_updates_per_s_local_K`` = ``K /
     round_s_local_K``.
   * ``local_train_s``: the physical limit, the pure compute of one client: ``FedLmAlgorithm.local_train``
     called directly (no loop, no parameter checks, no delta), best of 3 calls, averaged over 8 clients.
     ``loop_overhead_fraction_local_K`` = ``(round_s_local_K - K * local_train_s) / round_s_local_K``: the
     share of a local round not spent training (checking and copying the broadcast, the delta, accumulation,
     the server's Adam step), and ``loop_overhead_fraction_local`` that at the largest K.
   * ``round_s_ray_K``, ``client_updates_per_s_ray_K``: the same on ``RayBackend(num_workers=2)``, after an
     untimed warm-up round over all 32 clients (starts Ray and the actors, ships the algorithm, puts every
     client in the object store; ``ray_warmup_s`` is its wall time, Ray start-up included);
     ``ray_speedup_vs_local_K`` = ``round_s_local_K / round_s_ray_K`` (2 is the limit with two workers on two
     free cores), ``ray_speedup_vs_local`` that at the largest K. ``ray_overhead_s_per_client`` = at the
     largest K, ``(round_s_ray_K - K * c / 2) / K`` with ``c`` a client's mean compute on the workers in those
     rounds: the time per client that neither worker spends computing (shipping the payload and the update,
     scheduling, the driver's accumulation).
   * ``client_seconds_local`` / ``client_seconds_ray``: a client's mean ``client_update`` time as its backend
     measured it (``RoundLog.client_seconds`` per reported client in the timed rounds, averaged over the K),
     and ``ray_client_slowdown`` their ratio (above 1 when the workers compete for cores: with each other, the
     driver, or other processes on the machine). ``client_update_overhead_fraction`` =
     ``(client_seconds_local - local_train_s) / client_seconds_local``: the share of ``client_update`` spent
     outside training (checking and casting the broadcast parameters, the delta).
   * Equality. ``local_train_deterministic``: two ``local_train`` calls with the same seed give identical
     parameters; ``ray_client_updates_identical``: four clients' updates computed on the Ray workers and in
     this process (same broadcast, same seeds) are bit-identical. Ray accumulates in arrival order, so the
     aggregate may differ in the last bits and a parameter by about one float32 ulp after the cast:
     ``ray_max_rel_diff_round1`` is, over all K, ``max |theta_ray - theta_local| / max |theta_local|`` over
     every parameter after the first round (same seed), and ``ray_same_result_as_local`` = that ``<= 1e-6``.
     Later rounds train from those slightly different parameters (local SGD at learning rate 1 amplifies
     them): ``ray_max_rel_diff_final`` is the same after all ``1 + rounds`` rounds, reported, not checked.
   * Without Ray installed the Ray figures are replaced by ``ray_skipped`` (the reason).

2. **Server memory against the number of clients** N in 10, 100, 1000 (``--quick``: 10, 100): N updates of the
   model's shapes (float32 normal deltas, std 0.01, weight 200 words) are generated without training, one at a
   time (:func:`random_updates`), and folded in by ``FedLmAlgorithm.accumulate``, then ``server_update``.
   ``server_peak_mb_N``: the peak memory traced by :mod:`tracemalloc` (numpy and Python allocations) during
   generation, accumulation and the server step, above what was allocated before;
   ``server_memory_ratio_max_vs_min`` = ``server_peak_mb`` at the largest N / at the smallest (about 1: memory
   does not grow with N). The naive baseline first keeps all N updates in a list, then accumulates them
   (smallest and middle N only): ``naive_peak_mb_N`` and ``naive_to_streaming_memory_ratio_N`` =
   ``naive_peak_mb_N / server_peak_mb_N``. Both end in bit-identical parameters
   (``streaming_equals_naive``, same order of summation). ``update_mb`` is one update's float32 size;
   ``server_accumulate_updates_per_s``: updates folded in per second (a pool of 16 pre-generated updates
   cycled 20 times, not traced).

3. **Cost of differential privacy** (local backend, K = 8; ``--quick``: 4): the same timed rounds with
   ``FedLmConfig(clip_norm=0.5, weighting="uniform")`` and ``PrivacySettings(GaussianMechanism(0.5, 1.0),
   PrivacyAccountant("rdp", neighboring="replace_one"))`` (noise multiplier 1.0 added once per round to the
   sum, the RDP accountant stepped and asked for epsilon every round) against ``FedLmConfig(weighting=
   "uniform")`` without clipping or noise: ``dp_round_cost_ratio`` = DP round time / non-private round time
   (both mean over the timed rounds). Per operation, measured directly (best of 5):
   ``dp_clip_s`` clipping one client's delta to norm 0.5 and casting it to float32 (what ``client_update``
   does), ``dp_noise_s`` adding Gaussian noise to one float64 sum of the model's size, ``dp_accounting_s`` one
   round's accounting as the loop does it (one ``step`` of the round's sampled-Gaussian event on an accountant
   that already holds earlier rounds, plus ``epsilon()``); ``dp_overhead_fraction`` = ``(dp_clip_s +
   dp_noise_s) / local_train_s`` (clipping and noise of one update against one client's training);
   ``dp_accounting_fraction_of_dp_round`` = ``dp_accounting_s / dp_round_s`` and
   ``dp_round_cost_ratio_excl_accounting`` = ``(dp_round_s - dp_accounting_s) / nonprivate_round_s``.
   ``dp_epsilon`` is epsilon at delta 1e-5 after the DP run's rounds (32 clients, K sampled without
   replacement); ``delta_norm_before_clip`` the L2 norm of one client's unclipped delta (above 0.5: clipping
   binds).

Also reported: ``cpu_count``, ``load_avg_1m`` (``os.getloadavg()`` at the start: other processes on the machine
slow every figure and lower the Ray speed-up), ``n_params`` and the sizes used.
"""

from __future__ import annotations

import importlib.util
import os
import time
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privasr.federated.core import Update
from privasr.results import write_results

__all__ = ["run", "make_vocab", "make_clients", "random_updates", "round_throughput", "server_memory"]

VOCAB_WORDS = 2000
POPULATION = 32
SENTENCES = 20
SENT_LEN = (10, 15)
RAY_WORKERS = 2
CLIP_NORM = 0.5
NOISE_MULTIPLIER = 1.0
REL_TOL = 1e-6
SERVER = {"name": "adam", "lr": 0.001}


def make_vocab(n_words: int = VOCAB_WORDS) -> Any:
    """A :class:`~privasr.lm.neural.vocab.Vocabulary` of ``n_words`` synthetic words ``w0 .. w{n-1}`` (+ specials)."""
    from privasr.lm.neural.vocab import Vocabulary

    return Vocabulary.build([[f"w{i}" for i in range(n_words)]])


def make_clients(n: int, vocab_size: int, seed: int, sentences: int = SENTENCES,
                 lengths: tuple[int, int] = SENT_LEN) -> list[Any]:
    """``n`` :class:`~privasr.federated.algorithms.fedlm.FedLmClient`: random word ids (not the 3 specials) with
    a uniform random confidence per word."""
    from privasr.federated.algorithms.fedlm import FedLmClient

    rng = np.random.default_rng([seed, 11])
    out = []
    for i in range(n):
        sents = tuple(tuple(int(w) for w in rng.integers(3, vocab_size, size=int(rng.integers(lengths[0],
                                                                                           lengths[1] + 1))))
                      for _ in range(sentences))
        out.append(FedLmClient(f"bench{i}", sents, tuple(rng.random(len(s)) for s in sents)))
    return out


def random_updates(shapes: Mapping[str, tuple[int, ...]], n: int, seed: int, std: float = 0.01,
                   weight: float = 200.0) -> Iterator[Update]:
    """``n`` updates of float32 normal deltas of ``shapes``, generated one at a time (nothing is kept here).

    >>> ups = list(random_updates({"a": (2, 3), "b": (4,)}, 2, seed=0))
    >>> len(ups), ups[0].arrays["a"].shape, ups[1].arrays["b"].dtype, ups[0].weight
    (2, (2, 3), dtype('float32'), 200.0)
    """
    rng = np.random.default_rng([seed, 13])
    for _ in range(n):
        arrays = {}
        for k, shape in shapes.items():
            a = rng.standard_normal(shape, dtype=np.float32)
            a *= std
            arrays[k] = a
        yield Update(arrays, weight=weight, metrics={"loss": 1.0, "tokens": 100.0})


def _rel_diff(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> float:
    num = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in b)
    den = max(float(np.max(np.abs(b[k]))) for k in b)
    return num / max(den, 1e-300)


def _timed_rounds(res: Any) -> list[Any]:
    return res.history[1:]  # the first round warms up (caches, the model, the server optimiser's state)


def _round_s(res: Any) -> float:
    return float(np.mean([h.seconds for h in _timed_rounds(res)]))


def _stamped_round_s(run: Any) -> float:
    """The mean seconds of a run's rounds after the first, from the times ``on_round`` was called: ``run(cb)``
    starts the run with ``on_round=cb``."""
    stamps: list[float] = []
    run(lambda entry, state: stamps.append(time.perf_counter()))
    return float(np.mean(np.diff(stamps)))


def _best(fn: Any, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def round_throughput(alg: Any, clients: list[Any], ks: list[int], rounds: int, seed: int, backend: Any = None,
                     sampler: Any = None
                     ) -> tuple[dict[int, float], dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]],
                                dict[int, float]]:
    """Per K: the mean round seconds, the parameters after the first and the last round, and a client's mean
    compute as the backend measured it (timed rounds). ``sampler``: a sampler class taking ``n`` (default
    uniform without replacement). Shared with the FTL benchmark."""
    from privasr.federated.loop import run_federated
    from privasr.federated.sampling import UniformWithoutReplacement

    secs, params, client_s = {}, {}, {}
    for k in ks:
        first: list[dict[str, np.ndarray]] = []

        def keep_first(entry: Any, state: Any, first: list[dict[str, np.ndarray]] = first) -> None:
            if entry.round == 0:
                first.append(dict(state["params"]))

        res = run_federated(alg, clients, rounds=1 + rounds, sampler=(sampler or UniformWithoutReplacement)(k),
                            seed=seed,
                            backend=backend, on_round=keep_first)
        secs[k] = _round_s(res)
        params[k] = (first[0], res.state["params"])
        client_s[k] = sum(h.client_seconds for h in _timed_rounds(res)) / sum(h.reported for h in _timed_rounds(res))
    return secs, params, client_s


def server_memory(alg: Any, shapes: Mapping[str, tuple[int, ...]], n: int, seed: int,
                   naive: bool) -> tuple[float, dict[str, np.ndarray]]:
    """(peak MB traced while generating, accumulating and stepping; the new parameters). Shared with the FTL
    benchmark."""
    state = alg.init(np.random.default_rng([seed, 5]))
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    acc = None
    if naive:
        kept = list(random_updates(shapes, n, seed))
        for u in kept:
            acc = alg.accumulate(acc, u)
    else:
        for u in random_updates(shapes, n, seed):
            acc = alg.accumulate(acc, u)
    new, _ = alg.server_update(state, acc, 0, np.random.default_rng(1))
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak / 2**20, new["params"]


def _local_train_limit(alg: Any, params: dict[str, np.ndarray], clients: list[Any], seed: int,
                       metrics: dict[str, Any]) -> float:
    """The physical limit: one client's pure training compute (``local_train_s``), and its determinism."""
    alg.local_train(params, clients[0], np.random.default_rng(0))  # warm-up
    lt = [_best(lambda c=c: alg.local_train(params, c, np.random.default_rng([seed, 1])), 3) for c in clients[:8]]
    local_train_s = float(np.mean(lt))
    a, _ = alg.local_train(params, clients[0], np.random.default_rng([seed, 2]))
    b, _ = alg.local_train(params, clients[0], np.random.default_rng([seed, 2]))
    metrics.update(local_train_s=local_train_s,
                   local_train_deterministic=all(np.array_equal(a[k], b[k]) for k in a))
    return local_train_s


def _local_throughput(alg: Any, clients: list[Any], ks: list[int], rounds: int, seed: int, local_train_s: float,
                      metrics: dict[str, Any]) -> tuple[dict[int, float], dict[int, Any]]:
    """1. Throughput against K on the local backend; returns the round seconds and parameters per K."""
    local_s, local_params, client_local = round_throughput(alg, clients, ks, rounds, seed)
    for k in ks:
        metrics[f"round_s_local_{k}"] = local_s[k]
        metrics[f"client_updates_per_s_local_{k}"] = k / local_s[k]
        metrics[f"loop_overhead_fraction_local_{k}"] = (local_s[k] - k * local_train_s) / local_s[k]
    metrics["loop_overhead_fraction_local"] = metrics[f"loop_overhead_fraction_local_{ks[-1]}"]
    metrics["client_seconds_local"] = float(np.mean(list(client_local.values())))
    metrics["client_update_overhead_fraction"] = (metrics["client_seconds_local"] - local_train_s) / \
        metrics["client_seconds_local"]
    return local_s, local_params


def _ray_throughput(alg: Any, state: Any, clients: list[Any], ks: list[int], rounds: int, seed: int,
                    local_s: dict[int, float], local_params: dict[int, Any], metrics: dict[str, Any]) -> None:
    """1. The same on Ray (after a warm-up round), and whether Ray's client updates and results equal local's."""
    from privasr.federated.backends import make_backend
    from privasr.federated.backends.ray import RayBackend
    from privasr.federated.core import ClientTask, client_seed
    from privasr.federated.loop import run_federated
    from privasr.federated.sampling import AllClients

    backend = RayBackend(num_workers=RAY_WORKERS)
    try:
        t0 = time.perf_counter()
        run_federated(alg, clients, rounds=1, sampler=AllClients(), seed=seed, backend=backend)
        metrics["ray_warmup_s"] = time.perf_counter() - t0
        ray_s, ray_params, client_ray = round_throughput(alg, clients, ks, rounds, seed, backend=backend)
        # every client's update is the same bits on a Ray worker as in this process
        payload = alg.broadcast(state, 0)
        tasks = [ClientTask(i, i, clients[i], None, client_seed(seed, 0, i, i)) for i in range(4)]
        here = {o.index: o.update for o in make_backend("local").run(alg, payload, tasks, None)}
        there = {o.index: o.update for o in backend.run(alg, payload, tasks, None)}
    finally:
        backend.close()
    for k in ks:
        metrics[f"round_s_ray_{k}"] = ray_s[k]
        metrics[f"client_updates_per_s_ray_{k}"] = k / ray_s[k]
        metrics[f"ray_speedup_vs_local_{k}"] = local_s[k] / ray_s[k]
    big = ks[-1]
    metrics["ray_speedup_vs_local"] = metrics[f"ray_speedup_vs_local_{big}"]
    metrics["ray_overhead_s_per_client"] = (ray_s[big] - big * client_ray[big] / RAY_WORKERS) / big
    metrics["client_seconds_ray"] = float(np.mean(list(client_ray.values())))
    metrics["ray_client_slowdown"] = metrics["client_seconds_ray"] / metrics["client_seconds_local"]
    metrics["ray_workers"] = RAY_WORKERS
    metrics["ray_client_updates_identical"] = sorted(there) == sorted(here) and all(
        np.array_equal(there[i].arrays[n], here[i].arrays[n]) for i in here for n in here[i].arrays)
    diff = max(_rel_diff(ray_params[k][0], local_params[k][0]) for k in ks)
    metrics["ray_max_rel_diff_round1"] = diff
    metrics["ray_same_result_as_local"] = bool(diff <= REL_TOL)
    metrics["ray_max_rel_diff_final"] = max(_rel_diff(ray_params[k][1], local_params[k][1]) for k in ks)


def _server_memory_figures(alg: Any, shapes: Mapping[str, tuple[int, ...]], mem_ns: list[int], seed: int,
                           metrics: dict[str, Any]) -> None:
    """2. Server memory against N, streaming and naive, and the accumulation rate."""
    server_memory(alg, shapes, 2, seed, naive=False)  # warm-up
    streamed = {}
    for n in mem_ns:
        peak, p = server_memory(alg, shapes, n, seed, naive=False)
        metrics[f"server_peak_mb_{n}"] = peak
        streamed[n] = p
    metrics["server_memory_ratio_max_vs_min"] = metrics[f"server_peak_mb_{mem_ns[-1]}"] / \
        metrics[f"server_peak_mb_{mem_ns[0]}"]
    same = True
    for n in mem_ns[:2]:
        peak, p = server_memory(alg, shapes, n, seed, naive=True)
        metrics[f"naive_peak_mb_{n}"] = peak
        metrics[f"naive_to_streaming_memory_ratio_{n}"] = peak / metrics[f"server_peak_mb_{n}"]
        same = same and all(np.array_equal(p[k], streamed[n][k]) for k in p)
    metrics["streaming_equals_naive"] = same
    pool = list(random_updates(shapes, 16, seed + 1))
    reps = 20

    def fold() -> None:
        acc = None
        for _ in range(reps):
            for u in pool:
                acc = alg.accumulate(acc, u)

    metrics["server_accumulate_updates_per_s"] = reps * len(pool) / _best(fold, 2)


def _dp_cost(model_cfg: Any, vocab: Any, params: dict[str, np.ndarray], clients: list[Any], rounds: int,
             dp_k: int, seed: int, local_train_s: float, metrics: dict[str, Any]) -> None:
    """3. The cost of differential privacy: DP rounds against plain ones, and clipping, noise and accounting
    measured one at a time."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig, _clip32
    from privasr.federated.loop import PrivacySettings, run_federated
    from privasr.federated.sampling import UniformWithoutReplacement
    from privasr.privacy.dp.accounting import PrivacyAccountant, round_event
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    plain = FedLmAlgorithm(FedLmConfig(loss="token", server=SERVER, weighting="uniform"), model_cfg, vocab)
    dp_alg = FedLmAlgorithm(FedLmConfig(loss="token", server=SERVER, weighting="uniform", clip_norm=CLIP_NORM),
                            model_cfg, vocab)
    mech = GaussianMechanism(clip_norm=CLIP_NORM, noise_multiplier=NOISE_MULTIPLIER)
    sampler = UniformWithoutReplacement(dp_k)
    # a DP run publishes no round seconds (they grow with the clients' data): both runs are timed alike, from
    # the end of one round to the end of the next (on_round)
    plain_s = _stamped_round_s(lambda cb: run_federated(plain, clients, rounds=1 + rounds, sampler=sampler, seed=seed,
                                                        on_round=cb))
    privacy = PrivacySettings(mech, PrivacyAccountant("rdp", target_delta=1e-5, neighboring="replace_one"))
    dp_res: list[Any] = []
    dp_s = _stamped_round_s(lambda cb: dp_res.append(run_federated(dp_alg, clients, rounds=1 + rounds,
                                                                   sampler=sampler, seed=seed, privacy=privacy,
                                                                   on_round=cb)))
    metrics["dp_round_s"] = dp_s
    metrics["nonprivate_round_s"] = plain_s
    metrics["dp_round_cost_ratio"] = metrics["dp_round_s"] / metrics["nonprivate_round_s"]
    metrics["dp_epsilon"] = float(dp_res[0].history[-1].metrics["epsilon"])
    trained, _ = plain.local_train(params, clients[0], np.random.default_rng([seed, 3]))
    delta = {k: trained[k] - params[k] for k in params}
    total = {k: v.astype(np.float64) for k, v in delta.items()}
    noise_rng = np.random.default_rng([seed, 4])
    metrics["dp_clip_s"] = _best(lambda: _clip32(delta, CLIP_NORM), 5)
    metrics["dp_noise_s"] = _best(lambda: mech.add_noise(total, noise_rng), 5)
    event = round_event(mech.dp_event(), "without_replacement", sample_size=dp_k, population=POPULATION)

    acct = PrivacyAccountant("rdp", target_delta=1e-5, neighboring="replace_one")

    def account() -> None:
        acct.step(event)
        acct.epsilon()

    metrics["dp_accounting_s"] = _best(account, 5)
    metrics["dp_overhead_fraction"] = (metrics["dp_clip_s"] + metrics["dp_noise_s"]) / local_train_s
    metrics["dp_accounting_fraction_of_dp_round"] = metrics["dp_accounting_s"] / metrics["dp_round_s"]
    metrics["dp_round_cost_ratio_excl_accounting"] = (metrics["dp_round_s"] - metrics["dp_accounting_s"]) / \
        metrics["nonprivate_round_s"]
    metrics["delta_norm_before_clip"] = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2))
                                                          for v in delta.values())))


def _measure(quick: bool, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The figures (see the module doc) and the benchmark's config."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
    from privasr.lm.neural.models import NeuralLMConfig

    ks = [2, 4] if quick else [2, 4, 8, 16]
    rounds = 3 if quick else 10
    mem_ns = [10, 100] if quick else [10, 100, 1000]
    dp_k = 4 if quick else 8
    metrics: dict[str, Any] = {"cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0], "torch_threads": 1}

    vocab = make_vocab()
    model_cfg = NeuralLMConfig.preset("tiny-transformer")
    alg = FedLmAlgorithm(FedLmConfig(loss="token", server=SERVER), model_cfg, vocab)
    clients = make_clients(POPULATION, len(vocab), seed)
    state = alg.init(np.random.default_rng([seed, 0, 3]))
    params = state["params"]
    shapes = {k: v.shape for k, v in params.items()}
    n_params = int(sum(v.size for v in params.values()))
    metrics.update(n_params=n_params, update_mb=n_params * 4 / 2**20, vocab_size=len(vocab))

    local_train_s = _local_train_limit(alg, params, clients, seed, metrics)
    local_s, local_params = _local_throughput(alg, clients, ks, rounds, seed, local_train_s, metrics)
    if importlib.util.find_spec("ray") is None:
        metrics["ray_skipped"] = "ray is not installed"
    else:
        _ray_throughput(alg, state, clients, ks, rounds, seed, local_s, local_params, metrics)
    _server_memory_figures(alg, shapes, mem_ns, seed, metrics)
    _dp_cost(model_cfg, vocab, params, clients, rounds, dp_k, seed, local_train_s, metrics)

    config = {"benchmark": "fedlm", "quick": quick, "model": "tiny-transformer", "vocab_words": VOCAB_WORDS,
              "population": POPULATION, "sentences_per_client": SENTENCES, "sentence_lengths": list(SENT_LEN),
              "loss": "token", "server": SERVER, "ks": ks, "timed_rounds": rounds, "memory_ns": mem_ns,
              "ray_workers": RAY_WORKERS, "dp_clients_per_round": dp_k, "clip_norm": CLIP_NORM,
              "noise_multiplier": NOISE_MULTIPLIER, "rel_tol": REL_TOL}
    return metrics, config


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        metrics, config = _measure(quick, seed)
    finally:
        torch.set_num_threads(threads)
    write_results(out, config=config, seed=seed, metrics=metrics)
    return metrics
