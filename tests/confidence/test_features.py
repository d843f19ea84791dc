"""Word features of hand-built N-best lists, whose posteriors and agreements are known exactly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privasr.confidence.features import (
    FEATURE_NAMES,
    hypothesis_weights,
    labels,
    labels_many,
    stack,
    word_features,
    word_features_many,
)
from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import InputError
from privasr.lm.base import SentenceScore


def H(text: str, **scores: float) -> Hypothesis:
    return Hypothesis.from_text(text, scores=scores)


LN2 = math.log(2)
# totals 0, -ln 2, -ln 4: softmax weights 4/7, 2/7, 1/7
SCORED = NBest("u1", (H("we ate rice", am=-6.0, lm=-3.0, total=0.0),
                      H("we ant rice", total=-LN2),       # substitution of "ate"
                      H("ate rice", total=-2 * LN2)),     # deletion of "we"
               ref=("we", "ate", "rice"))


def test_posterior_and_agreement_exact():
    f = word_features(SCORED)
    assert f.words == ("we", "ate", "rice") and f.values.shape == (3, len(FEATURE_NAMES))
    np.testing.assert_allclose(f.column("posterior"), [6 / 7, 5 / 7, 1.0])
    np.testing.assert_allclose(f.column("agreement"), [2 / 3, 2 / 3, 1.0])


def test_scores_lengths_positions_gap():
    f = word_features(SCORED)
    assert f.column("am_per_word").tolist() == [-2.0] * 3
    assert f.column("lm_per_word").tolist() == [-1.0] * 3
    assert f.column("total_per_word").tolist() == [0.0] * 3
    assert f.column("word_length").tolist() == [2.0, 3.0, 4.0]
    assert f.column("position").tolist() == [0.0, 0.5, 1.0]
    assert f.column("utt_length").tolist() == [3.0] * 3
    assert f.column("nbest_size").tolist() == [3.0] * 3
    np.testing.assert_allclose(f.column("score_gap"), LN2)
    assert np.isnan(f.column("lm_logprob")).all()  # no LM given


def test_insertion_in_other_hypothesis_keeps_the_words_aligned():
    nb = NBest("u", (H("a b c", total=0.0), H("a b q c", total=0.0), H("x a b c", total=0.0)))
    f = word_features(nb)
    assert f.column("agreement").tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_allclose(f.column("posterior"), 1.0)


def test_posterior_scale_flattens_the_weights():
    f0 = word_features(SCORED, posterior_scale=0.0)  # uniform weights: posterior = agreement
    np.testing.assert_allclose(f0.column("posterior"), f0.column("agreement"))
    with pytest.raises(InputError):
        word_features(SCORED, posterior_scale=-1.0)


def test_rank_prior_without_complete_scores():
    # one hypothesis lacks a total: weights 1/1, 1/2, 1/3 normalised = 6/11, 3/11, 2/11
    nb = NBest("u", (H("a b", total=-1.0), H("a c"), H("d b", total=-2.0)))
    np.testing.assert_allclose(hypothesis_weights(nb), [6 / 11, 3 / 11, 2 / 11])
    f = word_features(nb)
    np.testing.assert_allclose(f.column("posterior"), [9 / 11, 8 / 11])
    assert np.isnan(f.column("am_per_word")).all()
    assert np.isnan(f.column("score_gap")).all()  # the runner-up has no total


def test_minus_inf_total_weighs_nothing():
    nb = NBest("u", (H("a b", total=-1.0), H("a c", total=float("-inf"))))
    np.testing.assert_allclose(hypothesis_weights(nb), [1.0, 0.0])
    np.testing.assert_allclose(word_features(nb).column("posterior"), [1.0, 1.0])
    assert np.isnan(word_features(nb).column("score_gap")).all()


def test_single_word_and_single_hypothesis():
    f = word_features(NBest("u", (H("hello", total=-3.0),)))
    assert f.column("position").tolist() == [0.0]
    assert f.column("posterior").tolist() == [1.0] and f.column("nbest_size").tolist() == [1.0]
    assert np.isnan(f.column("score_gap")).all()


def test_empty_one_best_gives_zero_rows():
    for nb in (NBest("u", ()), NBest("u", (Hypothesis(()), H("a b")), ref=("a",))):
        f = word_features(nb)
        assert f.values.shape == (0, len(FEATURE_NAMES)) and len(f) == 0
    assert labels(NBest("u", (Hypothesis(()),), ref=("a",))).shape == (0,)
    # empty lists between others do not shift the alignments of the others
    fs = word_features_many([SCORED, NBest("e", ()), SCORED])
    np.testing.assert_array_equal(fs[0].values, fs[2].values)
    assert stack(fs).shape == (6, len(FEATURE_NAMES))


class _FakeLM:
    """log10 P(w | history) = -(len(history) + 1) / 10, 'zz' out of vocabulary with -inf."""

    order = 3

    def __init__(self) -> None:
        self.calls: list[tuple[list[tuple[str, ...]], bool, bool]] = []

    def __contains__(self, w: object) -> bool:
        return w != "zz"

    def score(self, words, *, bos=True, eos=True):
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def score_batch(self, sentences, *, bos=True, eos=True):
        self.calls.append(([tuple(s) for s in sentences], bos, eos))
        out = []
        for s in sentences:
            toks = tuple(s) + (("</s>",) if eos else ())
            lp = np.array([-math.inf if t == "zz" else -(i + 1) / 10 for i, t in enumerate(toks)])
            out.append(SentenceScore(toks, lp, np.array([t == "zz" for t in toks])))
        return out


def test_lm_logprob_in_context():
    lm = _FakeLM()
    fs = word_features_many([NBest("a", (H("x zz y"),)), NBest("b", ()), NBest("c", (H("p"),))], lm)
    np.testing.assert_allclose(fs[0].column("lm_logprob"), [-0.1, np.nan, -0.3])
    np.testing.assert_allclose(fs[2].column("lm_logprob"), [-0.1])
    # one batch, only the non-empty 1-bests, scored after <s> and without </s>
    assert lm.calls == [([("x", "zz", "y"), ("p",)], True, False)]


def test_labels_substitution_insertion_deletion():
    assert labels(NBest("u", (H("the bat sat down"),), ref=("the", "cat", "sat"))).tolist() == [True, False, True,
                                                                                                 False]
    assert labels(NBest("u", (H("a c"),), ref=("a", "b", "c"))).tolist() == [True, True]  # a deletion
    assert labels(NBest("u", (H("a b"),), ref=())).tolist() == [False, False]
    assert [x.tolist() for x in labels_many([SCORED, NBest("v", (H("we rice"),), ref=("we", "ate", "rice"))])] == [
        [True, True, True], [True, True]]


def test_labels_need_a_reference():
    with pytest.raises(InputError, match="utterance u7 has no reference"):
        labels_many([SCORED, NBest("u7", (H("a"),))])


def test_unknown_column():
    with pytest.raises(InputError, match="unknown confidence feature"):
        word_features(SCORED).column("colour")


def test_values_are_read_only():
    f = word_features(SCORED)
    with pytest.raises(ValueError):
        f.values[0, 0] = 0.0


def test_lists_without_a_first_pass_lm_use_the_am_total_as_the_decoder_total():
    """Whisper's lists carry ``am`` (its total log-probability) and no ``lm`` or ``total``: the posterior and
    the score gap use ``am``; a list with ``am`` and ``lm`` but no ``total`` falls back to the rank prior."""
    e2e = NBest("u", (H("we ate rice", am=0.0), H("we ant rice", am=-LN2), H("ate rice", am=-2 * LN2)),
                ref=("we", "ate", "rice"))
    f = word_features(e2e)
    np.testing.assert_allclose(f.column("posterior"), [6 / 7, 5 / 7, 1.0])
    np.testing.assert_allclose(f.column("score_gap"), [LN2] * 3)
    np.testing.assert_allclose(hypothesis_weights(e2e), [4 / 7, 2 / 7, 1 / 7])
    split = NBest("u", (H("a", am=0.0, lm=0.0), H("b", am=-1.0, lm=0.0)))
    np.testing.assert_allclose(hypothesis_weights(split), [2 / 3, 1 / 3])
    assert math.isnan(word_features(split).column("score_gap")[0])


def test_decoder_confidence_is_the_one_bests_own():
    own = NBest("u", (Hypothesis.from_text("a b", confidences=(0.9, 0.25)), Hypothesis.from_text("a c",
                                                                                                 confidences=(0.1, 0.1))))
    assert word_features(own).column("decoder_confidence").tolist() == [0.9, 0.25]  # the 1-best's, not others'
    assert np.isnan(word_features(NBest("u", (H("a b"),))).column("decoder_confidence")).all()
    assert FEATURE_NAMES[-1] == "decoder_confidence"  # appended: the older columns keep their indices
