"""Benchmarks behind ``privasr bench NAME --out DIR``.

Every benchmark measures the thing and a baseline (or a physical limit) in the same run and reports
ratios, because the machine is noisy: compare ratios, not seconds. Each writes ``DIR/results.json`` with
``config``, ``seed``, ``version`` and the ratios under ``metrics``.

Register a benchmark by adding ``NAME: "module:function"`` to :data:`BENCHMARKS`; the function takes
``(out: Path, quick: bool, seed: int)`` and returns the metrics dict it wrote.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["BENCHMARKS", "get", "best_of", "best_of_interleaved", "matmul_flops", "sync", "device_name"]

BENCHMARKS: dict[str, str] = {
    "readers": "privasr.bench.readers:run",
    "metrics": "privasr.bench.metrics:run",
    "synth": "privasr.bench.synth:run",
    "ngram": "privasr.bench.ngram:run",
    "rescore": "privasr.bench.rescore:run",
    "nnlm-scoring": "privasr.bench.nnlm_scoring:run",
    "nnlm-train": "privasr.bench.nnlm_train:run",
    "fmp-aggregation": "privasr.bench.fmp_aggregation:run",
    "backends": "privasr.bench.backends:run",
    "secagg": "privasr.bench.secagg:run",
    "fedlm": "privasr.bench.fedlm:run",
    "ftl": "privasr.bench.ftl:run",
    "ner": "privasr.bench.ner:run",
    "tts-nbest": "privasr.bench.tts_nbest:run",
    "decode": "privasr.bench.decode:run",
    "device": "privasr.bench.device:run",
    "deployment": "privasr.bench.deployment:run",
}


def get(name: str) -> Callable[..., dict[str, Any]]:
    """The run function of benchmark ``name``."""
    module, func = BENCHMARKS[name].split(":")
    return getattr(importlib.import_module(module), func)


def best_of(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """Run ``fn`` ``repeats`` times; return the smallest wall time in seconds and the last result.

    >>> t, r = best_of(lambda: sum(range(1000)), repeats=2)
    >>> r, t >= 0
    (499500, True)
    """
    best = float("inf")
    result = None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def best_of_interleaved(fns: Mapping[str, Callable[[], Any]], rounds: int = 7
                        ) -> tuple[dict[str, float], dict[str, Any]]:
    """Run every function of ``fns`` once per round, in turn, for ``rounds`` rounds (so that a slow or fast
    moment of a shared machine falls on all of them); return each one's smallest wall time in seconds and its
    last result, by name.

    >>> best, out = best_of_interleaved({"a": lambda: 1, "b": lambda: 2}, rounds=2)
    >>> sorted(best), out
    (['a', 'b'], {'a': 1, 'b': 2})
    """
    best = dict.fromkeys(fns, float("inf"))
    out: dict[str, Any] = {}
    for _ in range(max(1, rounds)):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            out[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best, out


def sync(device: str) -> None:
    """Wait for the queued work of a CUDA ``device`` (no-op on CPU), so wall-clock timings are complete."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def matmul_flops(n: int = 2048, repeats: int = 5, device: str = "cpu", dtype: str = "float32") -> float:
    """FLOP/s of ``torch.matmul`` on two ``n x n`` matrices: best of ``repeats`` after a warm-up.

    fp32 runs at torch's float32 matmul precision (``torch.get_float32_matmul_precision()``; the default,
    "highest", uses no TF32 on CUDA), the same setting the scorers run under; pass ``dtype="bfloat16"`` for
    the roofline of mixed-precision work.

    >>> matmul_flops(64, repeats=1) > 0
    True
    """
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
    b = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
    torch.matmul(a, b)
    sync(device)
    t, _ = best_of(lambda: (torch.matmul(a, b), sync(device)), repeats)
    return 2.0 * n ** 3 / t


def device_name(device: str) -> str:
    """What ``device`` is, in words: the CUDA device's name, else the CPU's model name (when Linux says it).

    >>> isinstance(device_name("cpu"), str)
    True
    """
    import platform

    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"
