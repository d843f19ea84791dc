"""``privasr bench nnlm-scoring`` / ``nnlm-train``: the quick runs, the device option and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.bench import get, matmul_flops, sync  # noqa: E402
from privasr.cli.bench import run as run_cli  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402

CUDA = torch.cuda.is_available()


def test_matmul_flops_is_positive_and_sync_is_a_noop_on_cpu() -> None:
    assert matmul_flops(128, repeats=2) > 0
    sync("cpu")


def test_nnlm_scoring_quick_on_synthetic_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path / "absent"))  # force the synthetic corpus
    m = get("nnlm-scoring")(tmp_path / "b", quick=True, seed=0)
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["config"]["device"] == "cpu" and res["config"]["data"].startswith("synthetic")
    assert m["max_abs_diff_vs_naive"] <= 1e-5
    assert m["speedup_vs_naive"] > 0 and 0 < m["roofline_fraction"]
    assert 0 < m["words_roofline_fraction"] and m["words_tokens_per_s"] > 0
    assert set(m["engine_tokens_per_s_by_batch_and_group_tokens"]) == {"4096/65536"}


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda0"])
def test_bench_rejects_a_malformed_device(tmp_path: Path, device: str) -> None:
    with pytest.raises(ConfigError, match="cpu, cuda or cuda:N"):
        run_cli("nnlm-scoring", tmp_path, True, 0, device)


def test_bench_without_a_gpu_path_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="runs on the CPU only"):
        run_cli("readers", tmp_path, True, 0, "cuda")


@pytest.mark.skipif(CUDA, reason="checks the no-CUDA error")
@pytest.mark.parametrize("name", ["nnlm-scoring", "nnlm-train"])
def test_cuda_benchmark_without_cuda_is_a_config_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="no CUDA device"):
        get(name)(tmp_path, quick=True, seed=0, device="cuda")


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_nnlm_scoring_quick_on_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path / "absent"))
    m = get("nnlm-scoring")(tmp_path / "b", quick=True, seed=0, device="cuda")
    cfg = json.loads((tmp_path / "b" / "results.json").read_text())["config"]
    assert cfg["device"] == "cuda" and cfg["device_name"]
    assert m["max_abs_diff_vs_naive"] <= 1e-5
    assert set(m["engine_tokens_per_s_by_batch_and_group_tokens"]) == {
        f"{b}/{g}" for b in (4096, 16384, 65536) for g in (16384, 65536)}
    assert m.get("gpu_busy_fraction", 0.5) > 0 and m["words_roofline_fraction"] > 0


def test_nnlm_train_quick_on_synthetic_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import privasr.bench.nnlm_train as bench

    monkeypatch.setattr("privasr.paths.golden_dir", lambda: None)
    m = bench.run(tmp_path, quick=True, seed=0)
    assert m["text"].startswith("synthetic")
    for name in ("transformer", "lstm", "lstm_class"):
        assert m[f"{name}_tokens_per_s"] > 0 and 0 < m[f"{name}_fraction_of_matmul"]
    assert m["class_softmax_speedup_vs_full"] > 0
    # each model's fraction is the median of its rounds, each against the matmul rate measured just before it
    for name in ("transformer", "lstm"):
        rounds = m[f"{name}_fraction_of_matmul_rounds"]
        assert len(rounds) == len(m[f"{name}_matmul_gflop_per_s_rounds"]) == 2  # --quick
        assert m[f"{name}_fraction_of_matmul"] == pytest.approx(float(np.median(rounds)))
    assert m["dropout_speedup_vs_torch"] > 0 and m["dropout_ns_per_element"] > 0
    assert m["output_rows_speedup_vs_torch"] > 0 and m["output_layer_ms"] > 0 and m["output_layer_torch_rows_ms"] > 0
    from privasr.lm.neural.train import compiled_output_rows

    assert m["output_rows_compiled"] is compiled_output_rows()
    # the class softmax's output layer is counted as C + V/C rows, not V
    assert m["lstm_class_flops_per_token"] < m["lstm_flops_per_token"]
