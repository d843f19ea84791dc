"""``privasr bench ftl`` (quick, Ray left out): local throughput and flat server memory."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")


def test_ftl_bench_quick_without_ray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import privasr.bench.ftl as bench

    real = importlib.util.find_spec
    monkeypatch.setattr(bench.importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    m = bench.run(tmp_path, quick=True, seed=0)
    assert m["ray_skipped"] == "ray is not installed"
    assert m["client_updates_per_s_local"] > 0 and m["parameters"] > 0
    # streaming aggregation: 100 clients cost what 10 cost (one running copy), a few copies of one update
    assert m["server_memory_ratio_100_vs_10"] == pytest.approx(1.0, abs=0.01)
    assert m["server_memory_mb_10_clients"] < 20 * m["update_mb"]
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["update_mb"] == m["update_mb"]


def test_ftl_bench_on_cuda_without_cuda_is_a_config_error(tmp_path: Path) -> None:
    import torch

    import privasr.bench.ftl as bench
    from privasr.errors import ConfigError

    if torch.cuda.is_available():
        pytest.skip("checks the no-CUDA error")
    with pytest.raises(ConfigError, match="no CUDA device"):
        bench.run(tmp_path, quick=True, device="cuda")
