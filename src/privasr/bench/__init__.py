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
from collections.abc import Callable
from typing import Any

__all__ = ["BENCHMARKS", "get", "best_of"]

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
    "fedlm": "privasr.bench.fedlm:run",
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
