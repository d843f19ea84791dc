"""The compiled query engine (``privasr.lm.ngram._engine``) gives the numpy path's scores, float for float, on
every query the model answers: sentence totals, per-token scores and OOV flags, and word-by-word states."""

from __future__ import annotations

import math
import pickle
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.lm.ngram import model as model_mod
from privasr.lm.ngram.mkn import train_mkn
from privasr.lm.ngram.model import NgramModel

compiled = pytest.mark.skipif(model_mod._Engine is None, reason="the compiled engine is not built in this install")


def _same(m: NgramModel, sents: list[list[str]]) -> None:
    """Every query of ``m`` on ``sents`` through the engine equals the numpy path's."""
    runs = {}
    for name, lm in (("compiled", m), ("numpy", m._numpy_twin())):
        for bos in (True, False):
            for eos in (True, False):
                tot, oov = lm.score_totals(sents, bos=bos, eos=eos)
                batch = lm.score_batch(sents, bos=bos, eos=eos)
                runs[name, bos, eos] = (tot, oov, batch)
        steps = []
        for s in sents:
            st_ = lm.begin_state()
            for w in [*s, "</s>"]:
                lp, st_ = lm.advance(st_, w)
                steps.append((lp, st_))
        runs[name] = steps
    assert m._compiled() is not None
    for bos in (True, False):
        for eos in (True, False):
            (ct, co, cb), (nt, no, nb) = runs["compiled", bos, eos], runs["numpy", bos, eos]
            assert np.allclose(ct, nt, rtol=0, atol=1e-12) and np.array_equal(np.isinf(ct), np.isinf(nt))
            assert np.array_equal(co, no)
            for a, b in zip(cb, nb, strict=True):
                assert a.tokens == b.tokens and np.array_equal(a.logprobs, b.logprobs) and np.array_equal(a.oov, b.oov)
                assert a.logprobs.dtype == np.float64 and a.oov.dtype == bool
                assert not (a.logprobs.flags.writeable or a.oov.flags.writeable or b.logprobs.flags.writeable)
    assert runs["compiled"] == runs["numpy"]  # word by word: the same scores and the same states


@compiled
def test_the_install_uses_the_compiled_engine() -> None:
    assert model_mod.QUERY_ENGINE == "compiled"
    m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0)}})
    assert m.advance == m._advance_first  # the query path is chosen at the first query
    m.score_totals([["a"]])
    assert m._engine and m.advance == m._engine.advance


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
def test_a_machine_with_a_compiler_builds_the_engine() -> None:
    # optional=True in setup.py lets an install without a compiler fall back to numpy; with one, a build
    # failure would silently cost the query speed: make it loud here
    assert model_mod._Engine is not None, "the C extension privasr.lm.ngram._engine was not built: pip install -e ."


@compiled
@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_trained_models_score_the_same(order: int) -> None:
    rng = np.random.default_rng(order)
    words = [f"w{i}" for i in range(30)]
    text = [[str(w) for w in rng.choice(words, size=int(rng.integers(1, 14)))] for _ in range(300)]
    m = train_mkn(text, order, discount_fallback=(0.5, 1.0, 1.5), vocab=set(words[:25]))
    queries = [*text[:80], ["zz", "w1", "w2"], [], ["w3"] * 20, ["<s>", "w1", "</s>", "w2"], ["w29", "w28"]]
    _same(m, queries)


@compiled
def test_models_without_specials_score_the_same() -> None:
    # no <s> (an unknown context), no <unk> (OOVs score -inf and reset the state), no </s> (flagged OOV)
    bare = NgramModel.from_entries(2, {1: {("a",): (-0.5, -0.1), ("b",): (-0.7, -0.2)},
                                       2: {("a", "b"): (-0.05, 0.0), ("b", "a"): (-0.1, 0.0)}})
    _same(bare, [["a", "b"], ["a", "zz", "b"], [], ["b", "a", "b"]])
    tot, oov = bare.score_totals([["a", "b"]])
    assert tot[0] == -math.inf and oov.tolist() == [1]  # </s> is not in the model


@compiled
@settings(max_examples=40, deadline=None)
@given(order=st.integers(1, 4), seed=st.integers(0, 10_000),
       sents=st.lists(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "<s>", "</s>", "<unk>", "oov", ""]),
                               max_size=12), max_size=12))
def test_random_models_and_queries_score_the_same(order: int, seed: int, sents: list[list[str]]) -> None:
    rng = np.random.default_rng(seed)
    text = [[str(w) for w in rng.choice(list("abcde"), size=int(rng.integers(1, 9)))] for _ in range(40)]
    m = train_mkn(text, order, discount_fallback=(0.5, 1.0, 1.5), prune=[0] + [int(rng.integers(0, 2))] * (order - 1))
    _same(m, sents)


@compiled
def test_inputs_are_taken_as_the_numpy_path_takes_them() -> None:
    m = train_mkn([["a", "b", "c"], ["b", "c", "a"]], 3, discount_fallback=(0.5, 1.0, 1.5))
    ref = m._numpy_twin()
    # tuples, lists and other sequences of tokens; tokens that are not words are OOVs
    mixed = [("a", "b"), ["b", "c"], "abc", [1, None, "a"]]
    got, want = m.score_totals(mixed), ref.score_totals(mixed)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    bos = [m.word_id("<s>")]
    assert m.advance(bos, "a") == ref.advance(bos, "a") == m.advance(tuple(bos), "a")  # a state as a list
    assert m.advance((), "zz") == ref.advance((), "zz")
    for lm in (m, ref):  # a sentence or a state that is not a sequence fails as it does on the numpy path
        with pytest.raises(TypeError):
            lm.score_totals([["a"], 5])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            lm.score_totals([[["unhashable"]]])  # type: ignore[list-item]
        with pytest.raises(TypeError):
            lm.advance(5, "a")  # type: ignore[arg-type]


@compiled
def test_engine_is_rebuilt_after_pickling_and_refuses_bad_arrays() -> None:
    m = train_mkn([["a", "b", "c"], ["b", "c", "a"]], 2, discount_fallback=(0.5, 1.0, 1.5))
    tot = m.score_totals([["a", "b"]])[0]
    twin = m._numpy_twin()  # the same arrays on the numpy path
    assert twin._compiled() is None and twin.advance == twin._advance_numpy and twin._prob[0] is m._prob[0]
    copy = pickle.loads(pickle.dumps(m))
    assert copy._engine is None and copy.advance == copy._advance_first
    assert np.array_equal(copy.score_totals([["a", "b"]])[0], tot) and copy._engine
    with pytest.raises(TypeError, match="float64"):
        model_mod._Engine(m._ids, m._keys, [p.astype(np.float32) for p in m._prob], m._bow, m._unk, m._bos)
    with pytest.raises(ValueError, match="one array per order"):
        model_mod._Engine(m._ids, m._keys, m._prob, m._bow[:1], m._unk, m._bos)
    with pytest.raises(ValueError, match="too small"):
        m._compiled().score([["a", "b"]], True, "</s>", np.empty(1), None, np.empty(2), None)
    with pytest.raises(TypeError, match="totals"):
        m._compiled().score([["a", "b"]], True, "</s>", None, None, None, None)
    bare = model_mod._Engine.__new__(model_mod._Engine)  # never initialised: refuses, does not crash
    with pytest.raises(RuntimeError, match="not initialised"):
        bare.advance((), "a")
    with pytest.raises(RuntimeError, match="not initialised"):
        bare.score([["a"]], True, None, np.empty(1), None, None, None)


@compiled
def test_orders_beyond_the_engine_fall_back_to_numpy() -> None:
    m = NgramModel.from_arrays(["a"], [np.array([[0]])] + [np.zeros((0, n), dtype=np.int64) for n in range(2, 66)],
                               [np.array([-0.5])] + [np.zeros(0)] * 64, [np.zeros(1)] + [np.zeros(0)] * 64)
    assert m.order == 65
    assert m.score_totals([["a", "a"]], eos=False)[0].tolist() == [-1.0]
    assert m._engine is False and m.advance == m._advance_numpy


@compiled
def test_a_token_that_changes_its_sentence_is_an_error_not_a_crash() -> None:
    m = train_mkn([["a", "b", "c"], ["b", "c", "a"]], 2, discount_fallback=(0.5, 1.0, 1.5))
    sent: list[object] = []

    class Shrinking:
        def __hash__(self) -> int:
            sent.clear()  # a token whose hash empties the sentence under the engine
            return 0

    sent.extend([Shrinking(), "a", "b"])
    with pytest.raises(RuntimeError, match="changed while"):
        m.score_totals([sent])
