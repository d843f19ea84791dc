"""CTM word-confidence features and a classifier trained on them (privasr.confidence.ctm)."""

from __future__ import annotations

import numpy as np
import pytest

from privasr.confidence.ctm import (
    CTM_FEATURE_NAMES,
    BackgroundFrequencies,
    ctm_features_many,
    ctm_word_features,
)
from privasr.corpus.records import Transcript
from privasr.errors import InputError

BG = BackgroundFrequencies.from_sentences([("the", "revenue", "grew"), ("the", "margin")])


def _utt(words, conf, times, uid="c-1"):
    return Transcript(uid, tuple(words), client="c", confidences=tuple(conf), times=tuple(times))


def test_every_feature_column():
    u = _utt(["the", "revenue", "zorp"], [0.9, 0.6, 0.3], [(1.0, 1.2), (1.5, 2.3), (2.3, 2.5)])
    x = ctm_word_features(u, BG)
    col = {n: x[:, i] for i, n in enumerate(CTM_FEATURE_NAMES)}
    assert x.shape == (3, len(CTM_FEATURE_NAMES))
    assert col["confidence"].tolist() == [0.9, 0.6, 0.3]
    assert col["prev_confidence"].tolist() == [1.0, 0.9, 0.6]
    assert col["next_confidence"].tolist() == [0.6, 0.3, 1.0]
    assert col["utt_mean_confidence"] == pytest.approx([0.6] * 3)
    assert col["utt_min_confidence"].tolist() == [0.3] * 3 and col["utt_words"].tolist() == [3] * 3
    assert col["relative_position"].tolist() == [0.0, 0.5, 1.0]
    assert col["duration"] == pytest.approx([0.2, 0.8, 0.2])
    assert col["duration_per_char"] == pytest.approx([0.2 / 3, 0.8 / 7, 0.2 / 4])
    assert col["chars"].tolist() == [3, 7, 4]
    assert col["pause_before"] == pytest.approx([1.0, 0.3, 0.0])
    assert col["pause_after"] == pytest.approx([0.3, 0.0, 1.0])
    total = 5
    assert col["background_log_freq"] == pytest.approx([np.log(2.5 / total), np.log(1.5 / total), np.log(0.5 / total)])
    assert col["background_unseen"].tolist() == [0.0, 0.0, 1.0]


def test_a_one_word_utterance_and_an_empty_one():
    x = ctm_word_features(_utt(["the"], [0.5], [(0.0, 0.1)]), BG)
    assert x[0, CTM_FEATURE_NAMES.index("relative_position")] == 0.0
    assert ctm_word_features(_utt([], [], []), BG).shape == (0, len(CTM_FEATURE_NAMES))
    assert [f.shape[0] for f in ctm_features_many([_utt(["a"], [1.0], [(0, 1)]), _utt([], [], [])], BG)] == [1, 0]


def test_missing_confidences_or_times_and_empty_background_are_errors():
    with pytest.raises(InputError, match="no confidence per word"):
        ctm_word_features(Transcript("u", ("a",), times=((0.0, 1.0),)), BG)
    with pytest.raises(InputError, match="no time per word"):
        ctm_word_features(Transcript("u", ("a",), confidences=(0.5,)), BG)
    with pytest.raises(InputError, match="no words"):
        BackgroundFrequencies.from_sentences([(), ()])


def test_a_classifier_on_ctm_features_saves_loads_and_refuses_nbest_input(tmp_path):
    pytest.importorskip("sklearn")
    from privasr.confidence.model import ConfidenceModel
    from privasr.corpus.records import Hypothesis, NBest

    g = np.random.default_rng(0)
    utts, labels = [], []
    for i in range(80):
        ok = g.uniform(size=5) < 0.6
        words = ["the" if k else "zorp" for k in ok]
        utts.append(_utt(words, g.uniform(0.5, 1.0, size=5), [(j, j + 0.3) for j in range(5)], uid=f"c-{i}"))
        labels.append(ok)
    feats = ctm_features_many(utts, BG)
    m = ConfidenceModel.fit_features(feats, labels, feature_names=CTM_FEATURE_NAMES, seed=0)
    test = np.concatenate(feats[:10])
    p = m.predict_features(test)
    assert np.corrcoef(p, np.concatenate(labels[:10]))[0, 1] > 0.9  # the unseen word gives it away
    again = ConfidenceModel.load(m.save(tmp_path / "ctm.npz"))
    assert again.feature_names == CTM_FEATURE_NAMES and np.array_equal(again.predict_features(test), p)
    with pytest.raises(InputError, match="other features"):
        m.predict(NBest("u", (Hypothesis.from_text("the"),)))
    with pytest.raises(InputError, match="feature matrix"):
        m.predict_features(np.zeros((2, 3)))
    with pytest.raises(InputError, match="utterance 1: feature matrix"):
        ConfidenceModel.fit_features([feats[0], np.zeros((5, 3))], labels[:2], feature_names=CTM_FEATURE_NAMES)
    with pytest.raises(InputError, match="one label per word"):
        ConfidenceModel.fit_features(feats[:2], labels[:1], feature_names=CTM_FEATURE_NAMES)
