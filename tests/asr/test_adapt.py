"""Tests of privasr.asr.adapt: the model files SphinxTrain needs and the adaptation's bad-input behaviour.

The end-to-end adaptation (its WER below the stock model's on held-out speech) is in test_tts_nbest.py.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("pocketsphinx")

from privasr.asr.adapt import (  # noqa: E402
    AdaptedModel,
    adapt_model,
    dictionary_words,
    read_feat_params,
    read_s3_mixw,
    read_sendump,
    sendump_probabilities,
    sphinxtrain_program,
    write_s3_mixw,
)
from privasr.asr.decode import default_model  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402


def test_bundled_sendump_reads_as_mixture_weights():
    w = read_sendump(f"{default_model()['hmm']}/sendump")
    assert w.shape == (5126, 3, 128) and w.dtype == np.float32
    sums = w.sum(axis=2)
    # 8-bit quantisation keeps each (senone, stream) distribution close to normalised
    assert np.all((sums > 0.9) & (sums < 1.1))


def test_sendump_probabilities_scale():
    q = np.array([0, 1, 255], dtype=np.uint8)
    assert sendump_probabilities(q).tolist() == pytest.approx([1.0, 1.0001 ** -1024, 1.0001 ** (-255 * 1024)])


def test_s3_round_trip(tmp_path):
    w = np.random.default_rng(0).random((7, 3, 5)).astype(np.float32)
    write_s3_mixw(tmp_path / "mixw", w)
    assert np.array_equal(read_s3_mixw(tmp_path / "mixw"), w)
    (tmp_path / "bad").write_bytes(b"not s3")
    with pytest.raises(InputError, match="no s3 header"):
        read_s3_mixw(tmp_path / "bad")


def test_corrupt_sendump(tmp_path):
    good = (default_model_path() / "sendump").read_bytes()
    (tmp_path / "cut").write_bytes(good[: len(good) // 2])
    with pytest.raises(InputError, match="complete pocketsphinx sendump"):
        read_sendump(tmp_path / "cut")
    (tmp_path / "junk").write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="sendump"):
        read_sendump(tmp_path / "junk")


def default_model_path():
    from pathlib import Path

    return Path(default_model()["hmm"])


def test_feat_params_and_dictionary():
    fp = read_feat_params(default_model_path())
    assert fp["-feat"] == "1s_c_d_dd" and fp["-model"] == "ptm"
    words = dictionary_words(default_model()["dict"])
    assert {"hello", "meeting"} <= words and not any("(" in w for w in list(words)[:1000])


def test_missing_program_is_a_config_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("privasr.asr.adapt._SPHINXTRAIN_DIRS", ())
    monkeypatch.delenv("PRIVASR_SPHINXTRAIN", raising=False)
    with pytest.raises(ConfigError, match="apt-get install sphinxtrain"):
        sphinxtrain_program("bw")


def test_adapt_model_bad_input(tmp_path):
    pcm = np.zeros(16000, dtype=np.int16)
    with pytest.raises(ConfigError, match="method"):
        adapt_model({"a": pcm}, {"a": ["hello"]}, tmp_path / "m", method="vtln")
    with pytest.raises(InputError, match="no transcript"):
        adapt_model({"a": pcm}, {}, tmp_path / "m")
    with pytest.raises(InputError, match="no adaptation audio"):
        adapt_model({}, {}, tmp_path / "m")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(InputError, match="not an empty folder"):
        adapt_model({"a": pcm}, {"a": ["hello"]}, tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me"


def test_adapt_model_refuses_text_outside_the_dictionary(tmp_path, sphinx_tools):
    pytest.importorskip("soundfile")
    pcm = np.zeros(16000, dtype=np.int16)
    with pytest.raises(InputError, match="none of the 1 utterances has every word in the dictionary"):
        adapt_model({"a": pcm}, {"a": ["qwzxv"]}, tmp_path / "m")
    assert not (tmp_path / "m").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".adapt-work")]  # the work folder is gone


def test_adapted_model_load_errors(tmp_path):
    with pytest.raises(InputError, match="privasr-model.json"):
        AdaptedModel.load(tmp_path)
    (tmp_path / "privasr-model.json").write_text("{}")
    with pytest.raises(InputError, match="unreadable manifest"):
        AdaptedModel.load(tmp_path)


def test_utterances_bw_cannot_align_are_counted(tmp_path, sphinx_tools):
    from privasr.asr.tts import Voice, synthesize

    v = Voice("en-us+klatt", 150, 0.01)
    good = "the weather will be cold and wet for most of the week".split()
    audio = {"u1": synthesize("hello there", v), "u2": synthesize(" ".join(good), v)}
    texts = {"u1": "the children played in the garden until it was dark and then went home".split(), "u2": good}
    m = adapt_model(audio, texts, tmp_path / "m")
    assert m.left_out == {"oov": 0, "not_aligned": 1} and m.utterances == 1
    with pytest.raises(InputError, match="could not align any of the 1 utterances"):
        adapt_model({"u1": audio["u1"]}, {"u1": texts["u1"]}, tmp_path / "m2")
    assert not (tmp_path / "m2").exists()
