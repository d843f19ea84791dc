"""The tts-nbest benchmark runs, checks 1 vs 2 processes give the same lists, and reports its ratios."""

from __future__ import annotations

import json
import shutil

import pytest

from privasr.bench import BENCHMARKS, get


def test_registered():
    assert BENCHMARKS["tts-nbest"] == "privasr.bench.tts_nbest:run"


@pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("sox") is None,
                    reason="espeak-ng and sox not installed")
def test_quick_run(tmp_path, monkeypatch):
    pytest.importorskip("pocketsphinx")
    monkeypatch.setattr("privasr.bench.tts_nbest.QUICK_UTTERANCES", 3)
    m = get("tts-nbest")(tmp_path, quick=True, seed=0)
    assert m["utterances"] == 3 and m["same_output_1_vs_2"] is True
    assert 0 < m["decode_s_per_audio_s"] < m["cpu_s_per_audio_s"]
    assert abs(sum(v for k, v in m.items() if k.startswith("stage_share_")) - 1) < 1e-9
    assert m["speedup_2_vs_1"] > 0 and m["utterances_per_s_2"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["metrics"]["utterances"] == 3
