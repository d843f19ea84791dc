"""``privasr bench device``: the quick run on the synthetic corpus with a fresh model (slow: three processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from privasr.bench import BENCHMARKS, get  # noqa: E402


def test_device_is_registered() -> None:
    assert BENCHMARKS["device"] == "privasr.bench.device:run"


@pytest.mark.slow
def test_device_quick_on_synthetic_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path / "absent"))  # the synthetic corpus
    monkeypatch.chdir(tmp_path)  # no runs/cache/nnlm.pt: a fresh model
    m = get("device")(tmp_path / "b", quick=True, seed=0)
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["config"]["model_source"].startswith("freshly initialised")
    assert res["config"]["data"].startswith("synthetic")
    assert set(m["latency_ms"]) == {"pytorch_fp32", "onnx_fp32", "onnx_int8", "onnx_int8_per_tensor",
                                    "torchscript_int8"}
    assert all(v["p50"] > 0 and v["p95"] >= v["p50"] for v in m["latency_ms"].values())
    assert m["agreement"]["onnx_fp32"]["max_abs_diff_nats"] < 1e-4
    assert m["size_bytes"]["onnx_int8"] < m["size_bytes"]["onnx_fp32"]
    assert m["memory_fmp_client_maxrss_bytes"] > 0 and m["memory_fedlm_round_maxrss_bytes"] > 0
    assert m["fmp_cache_bias_peak_bytes"] > 0 and m["fedlm_round"]["upload_bytes"] > 0
    report = (tmp_path / "b" / "report.md").read_text()
    assert "onnx_int8" in report and "privasr bench device" in report
    assert m["device_round"]["bytes_up_ratio"] == 1.0 and "A device round against" in report


def test_device_round_against_the_simulation_client() -> None:
    """The device-round part of ``privasr bench device`` on the tiny corpus: both ways end in the same server
    sums (measure asserts it); the same messages cross (bytes ratios 1); the device does its own preparation."""
    pytest.importorskip("flwr")
    from privasr.bench.device_round import measure

    m = measure(quick=True)
    assert m["bytes_up_ratio"] == 1.0 and m["bytes_down_ratio"] == 1.0
    assert m["device"]["rounds"] == m["simulation"]["rounds"] == m["devices"] * m["rounds"]
    assert m["round_ratio"] > 0 and 0 < m["prepare_share"] <= 1 and m["bundle_bytes"] > 0
    assert m["peak_bytes"]["device"] > 0 and m["peak_bytes"]["simulation"] > 0
