"""The ngram benchmark's query part on a small model: every path timed, both engines, KenLM when importable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from privasr.bench.ngram import _query
from privasr.lm.ngram import model as model_mod
from privasr.lm.ngram.arpa import write_arpa
from privasr.lm.ngram.mkn import train_mkn


def test_query_part_times_every_path(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(50)]
    text = [[str(w) for w in rng.choice(words, size=int(rng.integers(1, 15)))] for _ in range(300)]
    arpa = tmp_path / "m.arpa"
    write_arpa(train_mkn(text, 3, discount_fallback=(0.5, 1.0, 1.5)), arpa)
    metrics: dict = {}
    skipped: dict = {}
    _query(metrics, skipped, arpa, [*text[:100], ["oov", "w1"]])
    assert metrics["query_engine"] == model_mod.QUERY_ENGINE
    assert metrics["query_words"] == sum(len(s) + 1 for s in text[:100]) + 3
    for key in ("query_words_per_s", "query_nbest10_words_per_s", "query_stateful_words_per_s",
                "query_score_batch_words_per_s"):
        assert metrics[key] > 0
    try:
        import kenlm  # noqa: F401
    except ImportError:
        assert "query_speed_vs_kenlm" in skipped
        return
    assert metrics["query_speed_vs_kenlm"] > 0 and metrics["query_speed_nbest10_vs_kenlm"] > 0
    assert metrics["query_max_abs_sentence_diff_vs_kenlm_module"] < 1e-4  # kenlm sums in float32
    if model_mod._Engine is not None:
        assert metrics["query_speed_numpy_vs_kenlm"] > 0 and metrics["query_speed_nbest10_numpy_vs_kenlm"] > 0
    else:
        pytest.skip("no compiled engine: the numpy path is the only one")
