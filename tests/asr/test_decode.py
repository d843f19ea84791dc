"""Tests of privasr.asr.decode: audio reading, token stripping, the digits LM and decoding FSDD files."""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pocketsphinx")
pytest.importorskip("soundfile")

from privasr.asr.decode import (  # noqa: E402
    SAMPLE_RATE,
    Decoder,
    DecodeStats,
    decode_files,
    digits_lm,
    fsdd_reference,
    read_audio,
    strip_tokens,
)
from privasr.corpus.formats.fsdd import DIGITS  # noqa: E402
from privasr.errors import InputError  # noqa: E402


def _test_split(recordings: Path, limit: int | None = None) -> list[Path]:
    files = sorted(recordings.glob("*_[0-4].wav"))
    return files if limit is None else files[:: max(1, len(files) // limit)][:limit]


def _write_wav(path: Path, x: np.ndarray, rate: int, channels: int = 1) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(x.astype("<i2").tobytes())


def test_strip_tokens():
    assert strip_tokens(["<s>", "<sil>", "hello(3)", "[NOISE]", "++UH++", "world", "</s>"]) == ("hello", "world")
    assert strip_tokens([]) == ()


def test_fsdd_reference():
    assert fsdd_reference("/x/9_yweweler_12.wav") == ("nine",)
    with pytest.raises(InputError, match="FSDD"):
        fsdd_reference("hello.wav")


def test_read_audio_resamples_and_mixes(tmp_path):
    t = np.arange(8000) / 8000
    tone = (0.5 * 32767 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    p = tmp_path / "a.wav"
    _write_wav(p, np.stack([tone, tone], axis=1).reshape(-1), 8000, channels=2)
    y = read_audio(p)
    assert y.dtype == np.int16 and len(y) == SAMPLE_RATE  # 1 s at 16 kHz
    assert 0.4 * 32767 < np.abs(y.astype(float)).max() < 0.6 * 32767


def test_read_audio_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_audio(tmp_path / "missing.wav")
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio")
    with pytest.raises(InputError, match="bad.wav: cannot read audio"):
        read_audio(bad)
    empty = tmp_path / "empty.wav"
    _write_wav(empty, np.zeros(0, dtype=np.int16), 16000)
    with pytest.raises(InputError, match="empty"):
        read_audio(empty)


def test_digits_lm(tmp_path):
    arpa, dic = digits_lm(tmp_path)
    from privasr.lm.ngram.arpa import read_arpa

    m = read_arpa(arpa)
    assert m.order == 1
    assert math.isclose(10 ** m.logprob("seven", ["<s>"]), 1 / 11, rel_tol=1e-6)
    heads = {line.split()[0] for line in dic.read_text().splitlines()}
    assert {"zero", "zero(2)", "nine"} <= heads


def test_decoder_rejects_missing_lm(tmp_path):
    with pytest.raises(InputError, match="no such LM"):
        Decoder(lm=tmp_path / "nope.arpa")
    with pytest.raises(InputError, match="nbest"):
        Decoder(nbest=0)


def _check(nbs, files):
    assert [nb.utt_id for nb in nbs] == [f.stem for f in files]
    for nb in nbs:
        assert len(nb) >= 1
        assert nb.ref == fsdd_reference(nb.utt_id + ".wav")
        # hyps[0] is the decoder's 1-best (bestpath); the others follow by their A* score
        assert nb.hyps[0].text == nb.meta["decoder_1best"] and nb.hyps[0].meta["score_src"] == "hyp"
        assert all(h.meta["score_src"] == "nbest" for h in nb.hyps[1:])
        totals = [h.scores["total"] for h in nb.hyps[1:]]
        assert totals == sorted(totals, reverse=True)
        assert all(h.scores["nbest"] == h.scores["total"] for h in nb.hyps[1:])
        texts = [h.text for h in nb.hyps]
        assert len(set(texts)) == len(texts)  # duplicates merged
        assert nb.meta["n_nbest_unique"] >= len(nb) - 1 and nb.meta["n_nbest_paths"] >= nb.meta["n_nbest_unique"]
        assert nb.meta["audio_sec"] > 0
        for h in nb.hyps:
            assert h.scores["lm"] <= 0.0
            assert h.scores["am"] < 0.0  # every string of the list is a path of the lattice
            assert all("(" not in w and not w.startswith("<") for w in h.words)
        # the 1-best carries its lattice word posteriors; the other hypotheses carry none
        best = nb.hyps[0]
        assert nb.meta["confidence"] == "lattice C_max" and len(best.confidences) == len(best)
        assert all(0.0 <= c <= 1.0 for c in best.confidences)
        assert all(h.confidences is None for h in nb.hyps[1:])


def test_decode_fsdd_digits_lm(tmp_path, fsdd_recordings):
    from privasr.metrics.oracle import onebest_wer, oracle_wer

    files = _test_split(fsdd_recordings, 10)
    arpa, dic = digits_lm(tmp_path)
    refs = {f.stem: fsdd_reference(f) for f in files}
    stats: list[DecodeStats] = []
    nbs = decode_files(files, lm=arpa, dict=dic, nbest=5, refs=refs, stats=stats)
    _check(nbs, files)
    for nb in nbs:
        assert len(nb) <= 5
        assert all(set(h.words) <= set(DIGITS) for h in nb.hyps)
        # unigram LM: ln P = (n + 1) * ln(1/11)
        for h in nb.hyps:
            assert math.isclose(h.scores["lm"], (len(h) + 1) * math.log(1 / 11), abs_tol=1e-6)  # exact ARPA query
    w1, wo = onebest_wer(nbs), oracle_wer(nbs)
    assert 0.0 <= wo.wer <= w1.wer <= 1.0
    assert stats[0].utterances == 10 and stats[0].audio_s > 0 and stats[0].rtf > 0


def test_decode_fsdd_bundled_lm_deterministic(fsdd_recordings):
    files = _test_split(fsdd_recordings, 3)
    a = decode_files(files, nbest=4, refs={f.stem: fsdd_reference(f) for f in files})
    _check(a, files)
    b = decode_files(files[:1], nbest=4, refs={files[0].stem: fsdd_reference(files[0])})
    assert a[0] == b[0]
    # a list does not depend on what the decoder saw before (the front end is reset per utterance)
    c = decode_files(files[::-1], nbest=4, refs={f.stem: fsdd_reference(f) for f in files})
    assert c[::-1] == a


def test_lattice_am_scores_rank_like_the_decoder(fsdd_recordings, tmp_path):
    """The lattice acoustic score plus the weighted LM score and word penalty reproduce the A* order."""
    files = _test_split(fsdd_recordings, 4)
    arpa, dic = digits_lm(tmp_path)
    dec = Decoder(lm=arpa, dict=dic, nbest=5)
    for nb in decode_files(files, decoder=dec):
        for h in nb.hyps:
            assert h.scores["am"] <= 0.0 and math.isfinite(h.scores["am"])
        if len(nb) > 2:
            # the A* score is the best path's am + lw * lm + wip per word: differences track am + lw * lm
            lwf = dec.bestpath_lw
            recon = [h.scores["am"] + lwf * h.scores["lm"] + (len(h) + 1) * math.log(dec.wip) * lwf / dec.lw
                     for h in nb.hyps[1:]]
            totals = [h.scores["total"] for h in nb.hyps[1:]]
            assert np.corrcoef(recon, totals)[0, 1] > 0.9


def test_word_confidences_hold_at_least_pocketsphinx_node_posterior(fsdd_recordings):
    """C_max sums every copy of a word through a frame, so it is never below the posterior pocketsphinx gives
    the 1-best's own node (``Decoder.seg()``'s ``prob``): this pins the lattice's time and word conventions."""
    dec = Decoder(nbest=3)
    for f in _test_split(fsdd_recordings, 4):
        nb = dec.decode_file(f)
        node = [s.prob for s in dec._ps.seg() if not s.word.startswith(("<", "[", "+"))]
        assert len(node) == len(nb.best) and nb.best.confidences is not None
        for c, p in zip(nb.best.confidences, node, strict=True):
            assert c >= min(p, 1.0) - 1e-3


@pytest.mark.slow
def test_decode_fsdd_test_split_digits_lm(tmp_path, fsdd_recordings):
    from privasr.metrics.oracle import onebest_wer, oracle_wer

    files = _test_split(fsdd_recordings)
    assert len(files) == 300
    arpa, dic = digits_lm(tmp_path)
    nbs = decode_files(files, lm=arpa, dict=dic, refs={f.stem: fsdd_reference(f) for f in files})
    _check(nbs, files)
    w1, wo = onebest_wer(nbs), oracle_wer(nbs)
    assert wo.wer < w1.wer < 0.5  # measured: WER 30.3%, oracle 18.0%
    # the lattice word posteriors tell right words from wrong ones
    from privasr.confidence.calibration import roc_auc
    from privasr.confidence.features import labels_many

    kept = [nb for nb in nbs if nb.best.words]
    auc = roc_auc(np.concatenate([nb.best.confidences for nb in kept]), np.concatenate(labels_many(kept)))
    assert auc > 0.7
