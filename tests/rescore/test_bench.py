"""``privasr bench rescore`` on the synthetic fallback (quick)."""

from __future__ import annotations

import json

from privasr.bench import BENCHMARKS, get


def test_rescore_benchmark_quick_on_synthetic_data(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path / "absent"))  # force the synthetic corpus
    assert "rescore" in BENCHMARKS
    m = get("rescore")(tmp_path / "b", quick=True, seed=0)
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert res["metrics"]["speedup_vs_per_hypothesis"] == m["speedup_vs_per_hypothesis"] > 0
    assert m["max_abs_score_diff"] <= 1e-6 and m["hypotheses"] > 0
    assert res["config"]["data"].startswith("synthetic")
