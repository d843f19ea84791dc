"""Score combination: features, weights, ties, rank-only lists, empty hypotheses, the LM cache, purity."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError
from privasr.rescore.combine import (
    Combination,
    LMScoreCache,
    rerank,
    rescore,
    score_table,
    select,
    select_many,
    unique_words,
)


def _nb(utt, items, ref=None):
    return NBest(utt, tuple(Hypothesis.from_text(t, scores=s) for t, s in items), ref=ref)


def test_loglinear_weights_are_applied_exactly(toy_lm):
    nb = _nb("u", [("the cat", {"am": -10.0, "lm": -4.0}), ("tha cap sat", {"am": -9.0, "lm": -7.5})])
    table = score_table([nb], {"toy": toy_lm})
    comb = Combination(prior="am", lms=("lm", "toy"), prior_weight=0.5)
    w = {"lm": 2.0, "toy": 3.0, "word_penalty": -1.5}
    got = comb.totals(table, w)
    for k, (h, n) in enumerate(zip(nb.hyps, (2, 3), strict=True)):
        want = 0.5 * h.scores["am"] + 2.0 * h.scores["lm"] + 3.0 * toy_lm.ln(h.words) - 1.5 * n
        assert got[k] == pytest.approx(want, abs=1e-12)


def test_new_lm_score_is_natural_log_with_end_of_sentence(toy_lm):
    table = score_table([_nb("u", [("the zz", {})])], {"toy": toy_lm})
    # the (-1) + zz as <unk> (-3) + </s> (-0.5), log10 -> ln
    assert table.features["toy"][0] == pytest.approx(-4.5 * math.log(10))


def test_linear_interpolation_in_probability(toy_lm):
    nb = _nb("u", [("the cat", {"am": 0.0, "lm": math.log(1e-3)}), ("a", {"am": 0.0, "lm": math.log(0.2)})])
    table = score_table([nb], {"toy": toy_lm})
    comb = Combination(prior="am", lms=("lm", "toy"), mode="linear")
    got = comb.totals(table, {"lm_scale": 2.0, "lambda": {"lm": 0.25, "toy": 0.75}, "word_penalty": 0.5})
    for k, h in enumerate(nb.hyps):
        p = 0.25 * math.exp(h.scores["lm"]) + 0.75 * math.exp(toy_lm.ln(h.words))
        assert got[k] == pytest.approx(2.0 * math.log(p) + 0.5 * len(h.words), rel=1e-12)
    # lambda = (1, 0) is the first-pass LM alone
    only = comb.totals(table, {"lm_scale": 1.0, "lambda": {"lm": 1.0, "toy": 0.0}, "word_penalty": 0.0})
    assert only.tolist() == pytest.approx([h.scores["lm"] for h in nb.hyps])


def test_lambda_must_lie_on_the_simplex():
    comb = Combination(lms=("lm", "x"), mode="linear")
    with pytest.raises(ConfigError, match="sums to"):
        comb.check_weights({"lm_scale": 1, "lambda": {"lm": 0.5, "x": 0.6}, "word_penalty": 0})
    with pytest.raises(ConfigError, match="lambda"):
        comb.check_weights({"lm_scale": 1, "lambda": {"lm": 1.0}, "word_penalty": 0})


def test_ties_go_to_the_better_first_pass_rank():
    nb = _nb("u", [("a", {}), ("b", {}), ("c", {})])
    table = score_table([nb])
    assert select(table, np.array([1.0, 3.0, 3.0])).tolist() == [1]
    assert select(table, np.zeros(3)).tolist() == [0]
    out = rerank([nb], table, np.array([1.0, 3.0, 3.0]))[0]
    assert [h.text for h in out] == ["b", "c", "a"]


def test_nan_totals_never_win():
    table = score_table([_nb("u", [("a", {}), ("b", {})])])
    assert select(table, np.array([math.nan, -1e300])).tolist() == [1]


def test_select_many_handles_empty_lists_anywhere():
    recs = [NBest("e0", ()), _nb("u", [("a", {}), ("b", {})]), NBest("e1", ()), _nb("v", [("c", {})])]
    table = score_table(recs)
    got = select_many(table, np.array([[0.0, 1.0, 5.0], [2.0, 1.0, 0.0]]))
    assert got.tolist() == [[-1, 1, -1, 0], [-1, 0, -1, 0]]


def test_rank_only_lists_use_the_rank_prior():
    nb = _nb("u", [("a b c", {}), ("a b", {}), ("a", {})])
    table = score_table([nb])
    assert table.features["rank"].tolist() == [0.0, -1.0, -2.0]
    comb = Combination(prior="rank")
    assert select(table, comb.totals(table, {"word_penalty": 0.0})).tolist() == [0]
    # a word penalty larger than one rank step per word moves to the shortest hypothesis
    assert select(table, comb.totals(table, {"word_penalty": -1.5})).tolist() == [2]
    with pytest.raises(InputError, match="utterance u has a hypothesis without a 'am' score"):
        Combination(prior="am").totals(table, {"word_penalty": 0.0})


def test_uniform_prior_lets_the_lm_decide(toy_lm):
    nb = _nb("u", [("tha cat", {}), ("the cat", {})])
    table = score_table([nb], {"toy": toy_lm})
    comb = Combination(prior="uniform", lms=("toy",))
    assert select(table, comb.totals(table, {"toy": 1.0, "word_penalty": 0.0})).tolist() == [1]
    assert select(table, comb.totals(table, {"toy": 0.0, "word_penalty": 0.0})).tolist() == [0]


def test_empty_hypotheses_and_empty_lists(toy_lm):
    recs = [_nb("u", [("", {"am": -1.0}), ("the", {"am": -2.0})], ref=("the",)), NBest("e", (), ref=("x",))]
    table = score_table(recs, {"toy": toy_lm})
    assert table.features["n_words"].tolist() == [0.0, 1.0]
    assert table.features["toy"][0] == pytest.approx(-0.5 * math.log(10))  # just </s>
    comb = Combination(prior="am", lms=("toy",))
    out = rerank(recs, table, comb.totals(table, {"toy": 1.0, "word_penalty": 0.0}))
    assert out[0].hyps[0].words == () and out[1].hyps == ()
    assert select(table, comb.totals(table, {"toy": 0.0, "word_penalty": 5.0})).tolist() == [1, -1]


def test_each_distinct_hypothesis_is_scored_once_and_in_batches(toy_lm):
    recs = [_nb("u", [("a b", {}), ("a b", {}), ("c", {})]), _nb("v", [("c", {}), ("a b", {})])]
    cache = LMScoreCache(toy_lm, batch_size=1)
    score_table(recs, {"toy": cache})
    assert sorted(toy_lm.sentences_scored) == [("a", "b"), ("c",)]
    assert toy_lm.batch_calls == 2  # batch_size=1: one call per distinct sentence
    score_table(recs, {"toy": cache})  # a second set through the same cache costs nothing
    assert len(toy_lm.sentences_scored) == 2 and cache.requests == 10 and cache.scored == 2
    assert unique_words(recs) == [("a", "b"), ("c",)]


def test_an_ngram_model_is_scored_through_its_totals(monkeypatch):
    from privasr.lm.ngram.mkn import train_mkn

    lm = train_mkn([["a", "b", "c"], ["b", "c"], ["c", "a"]], 3, discount_fallback=(0.5, 1.0, 1.5))
    sents = [("a", "b"), ("c",), (), ("zz", "a")]
    want = [lm.score(s).ln_total for s in sents]
    monkeypatch.setattr(type(lm), "score_batch", lambda *a, **k: pytest.fail("score_batch was called"))
    got = LMScoreCache(lm, batch_size=3).ln_probs(sents)
    assert got.tolist() == pytest.approx(want, abs=1e-12, rel=0)


def test_rescoring_is_pure_and_annotates_the_output(toy_lm):
    recs = [_nb("u", [("tha cat", {"am": -1.0}), ("the cat", {"am": -2.0})], ref=("the", "cat"))]
    before = [(nb.utt_id, [(h.words, dict(h.scores), dict(h.meta)) for h in nb.hyps]) for nb in recs]
    out = rescore(recs, Combination(prior="am", lms=("toy",)), {"toy": 1.0, "word_penalty": 0.0}, {"toy": toy_lm})
    after = [(nb.utt_id, [(h.words, dict(h.scores), dict(h.meta)) for h in nb.hyps]) for nb in recs]
    assert before == after
    best = out[0].hyps[0]
    assert best.text == "the cat" and best.meta["first_pass_rank"] == 1
    assert best.scores["am"] == -2.0 and best.scores["lm:toy"] == pytest.approx(toy_lm.ln(("the", "cat")))
    assert best.scores["rescore"] == pytest.approx(-2.0 + toy_lm.ln(("the", "cat")))
    assert out[0].ref == recs[0].ref and out[0] is not recs[0]


def test_rerank_refuses_other_lists():
    a = [_nb("u", [("a", {})])]
    table = score_table(a)
    with pytest.raises(InputError, match="not the ones"):
        rerank([_nb("v", [("a", {})])], table, np.zeros(1))


def test_reserved_and_unknown_names():
    with pytest.raises(ConfigError, match="not allowed"):
        score_table([_nb("u", [("a", {})])], {"rank": object()})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="prior"):
        Combination(prior="acoustic")
    with pytest.raises(ConfigError, match="unknown weight"):
        Combination(lms=("lm",)).check_weights({"lm": 1, "word_penalty": 0, "wp": 1})
