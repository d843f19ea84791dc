"""Federated acoustic training (:mod:`privasr.federated.algorithms.ftl`): client updates per second on the local
and Ray backends, and server memory against the number of clients folded into a round.

**Setup.** A CTC model of the ``tiny`` preset widened to 128 units per direction (``AcousticConfig.preset("tiny",
arch="ctc", enc_hidden=128)``; its parameter count is ``parameters``) over character units, and a pool of 16
clients of the synthetic AN4-like corpus (:func:`~privasr.asr.synth_an4.synthetic_corpus`: one client per
speaker, 12 utterances each); ``FtlConfig`` with client SGD (2 local epochs), server Adam and softmax weighting. torch runs on one
thread in this process; each Ray worker is one actor with one CPU.

1. **Throughput**: ``K`` = 8 clients per round (``--quick``: 4) sampled with replacement, 1 untimed and 3 timed
   rounds (``--quick``: 1) on ``local`` and on ``RayBackend(num_workers=2)`` (after an untimed warm-up round
   that starts Ray): ``client_updates_per_s_local`` / ``_ray`` and ``ray_speedup_vs_local`` (the limit is 2,
   the workers; clients of about 0.1-0.2 s each are compute-bound). Without Ray: ``ray_skipped``.
2. **Server memory**: 10 and 100 updates of the ``small`` AN4 CTC model's shapes (3 x 256 BiLSTM, 39-dim input,
   the 32 units of AN4's characters; ``update_mb``), generated one at a time and folded in with softmax weights (streaming
   :class:`~privasr.federated.weighting.WeightedMean`), then the server's Adam step:
   ``server_memory_mb_10_clients`` / ``server_memory_mb_100_clients`` (tracemalloc peak) and their ratio
   ``server_memory_ratio_100_vs_10`` (about 1: one running copy whatever the number of clients).

``--device cuda`` measures instead the GPU scaling curve of client updates per second against the clients per
round (:func:`_run_cuda`).
"""

from __future__ import annotations

import importlib.util
import string
import time
from pathlib import Path
from typing import Any

import numpy as np

from privasr.results import write_results

__all__ = ["run"]

RAY_WORKERS = 2


def _setup(seed: int) -> tuple[Any, list[Any], Any]:
    """(tokenizer, the 16 synthetic one-speaker clients, the FTL config) of both measurements."""
    from privasr.asr.synth_an4 import synthetic_corpus
    from privasr.asr.train import an4_examples
    from privasr.asr.units import CharTokenizer
    from privasr.federated.algorithms.ftl import FtlClient, FtlConfig

    train_utts, _ = synthetic_corpus(speakers=16, utterances=12, test_speakers=2, seed=seed)
    tok = CharTokenizer.train([u.words for u in train_utts])
    examples = an4_examples(train_utts, tok)
    clients = [FtlClient(s, tuple(e for e in examples if e.speaker == s)) for s in sorted({e.speaker for e in examples})]
    cfg = FtlConfig(client_optimizer={"name": "sgd", "lr": 0.1}, server={"name": "adam", "lr": 0.001},
                    weighting="softmax", local_epochs=2)
    return tok, clients, cfg


def run(out: Path, quick: bool = False, seed: int = 0, device: str = "cpu") -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    import torch

    if device != "cpu":
        return _run_cuda(out, quick, seed, device)

    from privasr.asr.models import AcousticConfig
    from privasr.asr.units import CharTokenizer
    from privasr.bench.fedlm import round_throughput, server_memory
    from privasr.federated.algorithms.ftl import FtlAlgorithm
    from privasr.federated.loop import run_federated
    from privasr.federated.sampling import AllClients, UniformWithReplacement

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tok, clients, cfg = _setup(seed)
        model = AcousticConfig.preset("tiny", arch="ctc", enc_hidden=128, input_dim=39)
        alg = FtlAlgorithm(cfg, model, tok)
        k = 4 if quick else 8
        rounds = 1 if quick else 3
        n_params = sum(int(v.size) for v in alg.init(np.random.default_rng(0))["params"].values())
        metrics: dict[str, Any] = {"clients_per_round": k, "timed_rounds": rounds, "parameters": n_params,
                                   "pool": len(clients)}

        # 1. throughput: local, then Ray with two workers (same sampler: with replacement, as the platform)
        sampler_k = [k]
        local_s, _, client_local = round_throughput(alg, clients, sampler_k, rounds, seed,
                                                    sampler=UniformWithReplacement)
        metrics["round_s_local"] = local_s[k]
        metrics["client_updates_per_s_local"] = k / local_s[k]
        metrics["client_seconds_local"] = client_local[k]
        if importlib.util.find_spec("ray") is None:
            metrics["ray_skipped"] = "ray is not installed"
        else:
            from privasr.federated.backends.ray import RayBackend

            backend = RayBackend(num_workers=RAY_WORKERS)
            try:
                t0 = time.perf_counter()
                run_federated(alg, clients, rounds=1, sampler=AllClients(), seed=seed, backend=backend)
                metrics["ray_warmup_s"] = time.perf_counter() - t0
                ray_s, _, client_ray = round_throughput(alg, clients, sampler_k, rounds, seed, backend=backend,
                                                        sampler=UniformWithReplacement)
            finally:
                backend.close()
            metrics["round_s_ray"] = ray_s[k]
            metrics["client_updates_per_s_ray"] = k / ray_s[k]
            metrics["client_seconds_ray"] = client_ray[k]
            metrics["ray_speedup_vs_local"] = local_s[k] / ray_s[k]
            metrics["ray_workers"] = RAY_WORKERS

        # 2. server memory: updates of the AN4 `small` CTC model, softmax-weighted streaming aggregation
        an4_units = CharTokenizer.train([(string.ascii_uppercase + "'",)])  # AN4's characters
        big = FtlAlgorithm(cfg, AcousticConfig.preset("small", arch="ctc", input_dim=39), an4_units)
        shapes = {name: v.shape for name, v in big.init(np.random.default_rng(0))["params"].items()}
        metrics["update_mb"] = sum(int(np.prod(s)) for s in shapes.values()) * 4 / 2**20
        server_memory(big, shapes, 2, seed, naive=False)  # warm-up
        for n in (10, 100):
            peak, _ = server_memory(big, shapes, n, seed, naive=False)
            metrics[f"server_memory_mb_{n}_clients"] = peak
        metrics["server_memory_ratio_100_vs_10"] = (metrics["server_memory_mb_100_clients"]
                                                    / metrics["server_memory_mb_10_clients"])
    finally:
        torch.set_num_threads(threads)
    write_results(out, config={"benchmark": "ftl", "quick": quick, "model": model.to_dict(), "ftl": cfg.to_dict(),
                               "torch_threads": 1}, seed=seed, metrics=metrics)
    return metrics



def _run_cuda(out: Path, quick: bool, seed: int, device: str) -> dict[str, Any]:
    """``--device cuda``: the scaling curve of client updates per second against the clients per round
    (``K`` in 1, 2, 4, 8, 16) with every client training on the GPU (one process: clients run one after the
    other, as a single-GPU worker would), for the ``tiny``-derived model above and the AN4 ``small`` CTC model,
    next to the same on the CPU (one thread) for ``K`` = 4."""
    import torch

    from privasr.asr.models import AcousticConfig
    from privasr.bench import device_name
    from privasr.bench.fedlm import round_throughput
    from privasr.errors import ConfigError
    from privasr.federated.algorithms.ftl import FtlAlgorithm
    from privasr.federated.sampling import UniformWithReplacement

    if not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but torch sees no CUDA device", expected="cpu, or a machine with CUDA")
    tok, clients, cfg = _setup(seed)
    models = {"tiny128": AcousticConfig.preset("tiny", arch="ctc", enc_hidden=128, input_dim=39),
              "small": AcousticConfig.preset("small", arch="ctc", input_dim=39)}
    ks = [1, 2, 4] if quick else [1, 2, 4, 8, 16]
    rounds = 1 if quick else 2
    metrics: dict[str, Any] = {"device": device, "device_name": device_name(device), "timed_rounds": rounds}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, model in models.items():
            gpu = FtlAlgorithm(cfg, model, tok, device=device)
            secs, _, _ = round_throughput(gpu, clients, ks, rounds, seed, sampler=UniformWithReplacement)
            for k in ks:
                metrics[f"{name}_client_updates_per_s_cuda_{k}"] = k / secs[k]
            cpu = FtlAlgorithm(cfg, model, tok)
            c_secs, _, _ = round_throughput(cpu, clients, [4], rounds, seed, sampler=UniformWithReplacement)
            metrics[f"{name}_client_updates_per_s_cpu_4"] = 4 / c_secs[4]
            metrics[f"{name}_cuda_speedup_vs_cpu_4"] = c_secs[4] / secs[4]
    finally:
        torch.set_num_threads(threads)
    write_results(out, config={"benchmark": "ftl", "quick": quick, "device": device, "ks": ks,
                               "models": {k: v.to_dict() for k, v in models.items()}, "ftl": cfg.to_dict()},
                  seed=seed, metrics=metrics)
    return metrics
