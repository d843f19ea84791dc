"""Tests of privasr.asr.tts_nbest and ``privasr data tts-nbest``: a tiny testbed built end to end.

The adaptation test is the issue's contract: a model MAP-adapted on a few generic sentences recognises
held-out synthetic speech (other sentences, other speakers' voices) better than the stock model.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pocketsphinx")
pytest.importorskip("soundfile")

from privasr.asr.tts_nbest import (  # noqa: E402
    AdaptationSpec,
    TtsSettings,
    adaptation_voices,
    build_adapted_model,
    build_tts_nbest,
    overlapping_sentences,
    select_adaptation_sentences,
)
from privasr.corpus.formats.kaldi_text import read_kaldi_text  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402


def _generic(test_data: Path) -> list[tuple[str, ...]]:
    return [tuple(line.split()) for line in (test_data / "tts" / "generic.txt").read_text().splitlines() if line]


def test_select_adaptation_sentences_follows_the_recipe():
    import random

    text = [tuple(f"w{i} x y z".split()) for i in range(50)] + [("too", "short"), ("oov", "qq", "r", "s")]
    spec = AdaptationSpec(sentences=5, pool=20, min_words=3, max_words=6)
    got = select_adaptation_sentences(text, {f"w{i}" for i in range(50)} | {"x", "y", "z"}, spec, seed=4)
    ok = [tuple(f"w{i} x y z".split()) for i in range(50)]
    random.Random(4).shuffle(ok)
    assert got == random.Random(6).sample(ok[:20], 5)
    with pytest.raises(InputError, match="only 51 sentences"):
        select_adaptation_sentences(text, None, AdaptationSpec(sentences=60, pool=60, min_words=3), seed=0)
    with pytest.raises(ConfigError, match="sentences <= pool"):
        AdaptationSpec(sentences=10, pool=5)


def test_adaptation_voices_take_turns():
    vs = adaptation_voices(8, TtsSettings(seed=3))
    assert [v.voice for v in vs[:4]] == list(TtsSettings().voices)
    assert vs == adaptation_voices(8, TtsSettings(seed=3)) != adaptation_voices(8, TtsSettings(seed=4))


def test_overlap_is_refused_before_any_work(tmp_path):
    adapt = [("the", "cat", "sat"), ("so", "it", "goes")]
    assert overlapping_sentences(adapt, [("so", "it", "goes")]) == ["so it goes"]
    with pytest.raises(InputError, match="1 adaptation sentences are evaluation sentences"):
        build_adapted_model(adapt, tmp_path / "m", evaluation=[("x",), ("so", "it", "goes")])
    assert not (tmp_path / "m").exists()


def test_settings_validation():
    with pytest.raises(ConfigError, match="noise mode"):
        TtsSettings(noise_mode="fresh")
    with pytest.raises(ConfigError, match="ranges"):
        TtsSettings(rate=(170, 140))


@pytest.fixture(scope="module")
def adapted(tmp_path_factory, test_data, sphinx_tools) -> Path:
    out = tmp_path_factory.mktemp("adapted") / "model"
    sents = select_adaptation_sentences(_generic(test_data), None, AdaptationSpec(sentences=40, pool=50), seed=0)
    evaluation = [t.words for t in read_kaldi_text(test_data / "tts" / "eval.txt")]
    build_adapted_model(sents, out, evaluation=evaluation)
    return out


def test_adapted_model_beats_the_stock_model_on_held_out_speech(adapted, test_data, tmp_path):
    from privasr.metrics.oracle import onebest_wer

    evaluation = read_kaldi_text(test_data / "tts" / "eval.txt")
    manifest = json.loads((adapted / "privasr-model.json").read_text())
    assert manifest["method"] == "map" and manifest["utterances"] == 40 and manifest["audio_s"] > 60
    assert (adapted / "adaptation-sentences.txt").read_text().count("\n") == 40
    stock = build_tts_nbest(evaluation, tmp_path / "stock")
    mine = build_tts_nbest(evaluation, tmp_path / "adapted", hmm=adapted)
    w_stock, w_adapted = onebest_wer(stock.records).wer, onebest_wer(mine.records).wer
    # measured: 41.7% -> 8.3% (8 held-out utterances, 40 adaptation sentences, pocketsphinx's en-us trigram)
    assert w_adapted < 0.75 * w_stock
    # the lists carry the shared set's fields
    nb = mine.records[0]
    assert nb.hyps[0].meta["score_src"] == "hyp" and {"am", "lm", "total"} <= set(nb.hyps[0].scores)
    assert {"tts", "audio_sec", "onebest_in_nbest", "n_nbest_paths", "n_nbest_unique"} <= set(nb.meta)
    assert nb.meta["confidence"] == "lattice C_max" and len(nb.hyps[0].confidences) == len(nb.hyps[0])
    # the same build reuses its model and its cache
    again = build_tts_nbest(evaluation, tmp_path / "adapted", hmm=adapted)
    assert again.resumed == len(evaluation) and again.records == mine.records
    assert build_adapted_model(
        select_adaptation_sentences(_generic(test_data), None, AdaptationSpec(sentences=40, pool=50), seed=0),
        adapted).path == adapted
    with pytest.raises(InputError, match="other sentences or settings"):
        build_adapted_model(_generic(test_data)[:3], adapted)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "privasr", "data", "tts-nbest", *args]


def test_resume_after_kill_gives_identical_output(test_data, tmp_path, sphinx_tools):
    from privasr.asr.decode import digits_lm

    # a uniform unigram LM over the evaluation words keeps the decoding fast; resuming is what is tested
    words = sorted({w for t in read_kaldi_text(test_data / "tts" / "eval.txt") for w in t.words})
    lm, dic = digits_lm(tmp_path / "lm", words)
    args = [str(test_data / "tts" / "eval.txt"), "--noise", "seeded", "--lm", str(lm), "--dict", str(dic), "--seed", "3"]
    full = tmp_path / "full"
    subprocess.run(_cli(*args, "--out", str(full), "--jobs", "1"), check=True, capture_output=True, timeout=600)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cli(*args, "--out", str(killed), "--jobs", "2"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((killed / "cache").glob("*.json"))) < 4 and proc.poll() is None:
        time.sleep(0.05)
    import os

    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list((killed / "cache").glob("*.json"))) - 1  # minus settings.json
    assert 0 < done < 8 and not (killed / "nbest.jsonl").exists()
    r = subprocess.run(_cli(*args, "--out", str(killed), "--jobs", "2"), check=True, capture_output=True,
                       timeout=600, text=True)
    assert (killed / "nbest.jsonl").read_bytes() == (full / "nbest.jsonl").read_bytes()
    res = json.loads((killed / "results.json").read_text())
    assert res["metrics"]["resumed"] == done and res["metrics"]["utterances"] == 8, r.stderr
    # the 1-best words carry the decoder's lattice posteriors, summarised in results.json and report.md
    assert res["metrics"]["confidence_coverage"] == 1.0 and 0.0 <= res["metrics"]["confidence_auc"] <= 1.0
    assert "Decoder word confidences" in (killed / "report.md").read_text()
    assert f"{done} of them from the cache" in r.stderr
    # other settings in the same folder are refused, not mixed in
    bad = subprocess.run(_cli(*args[:-1], "5", "--out", str(killed)), capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "other settings" in bad.stderr
    # seeded noise: another seed gives other audio, so other acoustic scores
    subprocess.run(_cli(*args[:-1], "4", "--out", str(tmp_path / "seed4")), check=True, capture_output=True,
                   timeout=600)
    a = [json.loads(x) for x in (full / "nbest.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (tmp_path / "seed4" / "nbest.jsonl").read_text().splitlines()]
    assert [x["meta"]["tts"] for x in a] == [x["meta"]["tts"] for x in b]  # same voices
    assert [x["hyps"][0]["scores"]["am"] for x in a] != [x["hyps"][0]["scores"]["am"] for x in b]


def test_cli_refuses_a_model_adapted_on_evaluation_sentences(adapted, test_data, tmp_path):
    ev = tmp_path / "eval.txt"
    first = (adapted / "adaptation-sentences.txt").read_text().splitlines()[0]
    ev.write_text(f"u1 {first}\n")
    r = subprocess.run(_cli(str(ev), "--hmm", str(adapted), "--out", str(tmp_path / "o")), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2 and "adapted on 1 evaluation sentences" in r.stderr


@pytest.mark.parametrize("extra, message", [
    (["--adapt-text", "x.txt", "--hmm", "m"], "--adapt-text and --hmm both given"),
    (["--min-words", "3", "--max-words", "2"], "min-words"),
    (["--clients", "nope"], "clients not in the transcripts"),
    (["--noise", "loud"], "noise mode 'loud'"),
    (["--jobs", "0"], "--jobs is 0"),
])
def test_cli_bad_options(test_data, tmp_path, extra, message):
    r = subprocess.run(_cli(str(test_data / "tts" / "eval.txt"), "--out", str(tmp_path / "o"), *extra),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_cli_output_is_a_file(test_data, tmp_path):
    (tmp_path / "f").write_text("x")
    r = subprocess.run(_cli(str(test_data / "tts" / "eval.txt"), "--out", str(tmp_path / "f")),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "not a folder" in r.stderr
    assert (tmp_path / "f").read_text() == "x"


def test_an_nbest_set_s_references_and_speakers_are_spoken_again(tmp_path):
    from privasr.cli.data_tts import load_eval_transcripts
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.corpus.records import Hypothesis, NBest

    nb = tmp_path / "set.jsonl"
    write_nbest(nb, [NBest("m1_a_0", (Hypothesis(("hi",)),), client="m1", speaker="m1_a", order=0, ref=("hi", "there")),
                     NBest("m1_b_1", (Hypothesis(("yes",)),), client="m1", speaker="m1_b", order=1, ref=("yes",))])
    recs = load_eval_transcripts(nb, fmt=None, clients=None, normalize=None, min_words=1, max_words=None,
                                 limit=None, dictionary=None)
    assert [(t.utt_id, t.words, t.client, t.speaker, t.order) for t in recs] == [
        ("m1_a_0", ("hi", "there"), "m1", "m1_a", 0), ("m1_b_1", ("yes",), "m1", "m1_b", 1)]
    assert TtsSettings().voice_of("m1_a") == TtsSettings().voice_of(recs[0].speaker)  # the same voice again
    write_nbest(nb, [NBest("u", (Hypothesis(("hi",)),))])
    with pytest.raises(InputError, match="1 N-best records have no reference"):
        load_eval_transcripts(nb, fmt=None, clients=None, normalize=None, min_words=1, max_words=None, limit=None,
                              dictionary=None)
