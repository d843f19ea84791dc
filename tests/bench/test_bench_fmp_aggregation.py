"""``privasr bench fmp-aggregation --quick``: the blocked streaming sum is exact and its memory flat."""

from __future__ import annotations

import json

from privasr.bench.fmp_aggregation import run


def test_quick_run_is_exact_flat_and_faster_than_one_at_a_time(tmp_path):
    m = run(tmp_path, quick=True)
    assert m["max_abs_diff_vs_batch"] < 1e-12
    assert m["memory_ratio_1m_vs_1k"] < 1.05
    # folding blocks beats folding clients one at a time on any machine (ratios, not timings)
    assert m["speedup_vs_per_update"] > 1.5
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["clients_large_run"] == 100_000
