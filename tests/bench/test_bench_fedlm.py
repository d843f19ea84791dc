"""``privasr bench fedlm --quick``: FedLM round throughput (local, Ray), server memory vs clients, DP cost."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from privasr.bench import BENCHMARKS, get
from privasr.bench.fedlm import random_updates


def test_random_updates_are_generated_lazily_and_reproducibly():
    gen = random_updates({"w": (3, 2)}, 2, seed=4)
    assert not isinstance(gen, list | tuple)
    a = [u.arrays["w"] for u in gen]
    b = [u.arrays["w"] for u in random_updates({"w": (3, 2)}, 2, seed=4)]
    assert all(x.dtype == np.float32 and np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], a[1])


def test_make_clients_are_valid_fedlm_clients():
    pytest.importorskip("torch")
    from privasr.bench.fedlm import make_clients

    clients = make_clients(3, vocab_size=50, seed=0)
    assert len(clients) == 3 and all(len(c.sentences) == 20 for c in clients)
    assert all(10 <= len(s) <= 15 and min(s) >= 3 and max(s) < 50 for c in clients for s in c.sentences)
    assert [c.sentences for c in make_clients(3, vocab_size=50, seed=0)] == [c.sentences for c in clients]


def test_fedlm_benchmark_quick(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("dp_accounting")
    assert BENCHMARKS["fedlm"] == "privasr.bench.fedlm:run"
    m = get("fedlm")(tmp_path, quick=True, seed=0)
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["metrics"] == m and res["seed"] == 0 and res["version"]
    assert res["config"]["benchmark"] == "fedlm" and res["config"]["quick"] is True and res["config"]["ks"] == [2, 4]
    for key, v in m.items():
        if isinstance(v, float):
            assert math.isfinite(v), key
    # throughput: a round is never shorter than its clients' pure compute (up to timer noise)
    assert m["local_train_s"] > 0 and m["local_train_deterministic"] is True
    for k in (2, 4):
        assert m[f"round_s_local_{k}"] > 0 and m[f"client_updates_per_s_local_{k}"] > 0
        assert -0.5 < m[f"loop_overhead_fraction_local_{k}"] < 1
    assert m["loop_overhead_fraction_local"] == m["loop_overhead_fraction_local_4"]
    # server memory does not grow with the number of clients; keeping every update does
    assert m["server_peak_mb_10"] > 0 and m["server_memory_ratio_max_vs_min"] < 1.5
    assert m["naive_to_streaming_memory_ratio_10"] > 1 and m["naive_to_streaming_memory_ratio_100"] > 3
    assert m["streaming_equals_naive"] is True and m["server_accumulate_updates_per_s"] > 0
    # differential privacy
    assert m["dp_round_cost_ratio"] > 0 and m["dp_overhead_fraction"] > 0 and m["dp_epsilon"] > 0
    assert m["dp_clip_s"] > 0 and m["dp_noise_s"] > 0 and m["dp_accounting_s"] > 0
    # Ray, or the reason it was skipped
    if importlib.util.find_spec("ray") is None:
        assert m["ray_skipped"]
    else:
        assert "ray_skipped" not in m
        for k in (2, 4):
            assert m[f"round_s_ray_{k}"] > 0 and 0 < m[f"ray_speedup_vs_local_{k}"] < 10
        assert m["ray_warmup_s"] > 0 and m["client_seconds_ray"] > 0
        # the clients compute the same bits on Ray; only the server's summation order may differ
        assert m["ray_client_updates_identical"] is True
        assert m["ray_max_rel_diff_round1"] <= 1e-6 and m["ray_same_result_as_local"] is True
        assert 0 <= m["ray_max_rel_diff_final"] < 0.1
