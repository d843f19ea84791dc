"""The hash index of n-gram keys finds exactly what binary search finds, and the model's numpy query path gives
the same scores with either."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from privasr.lm.ngram import model as model_mod
from privasr.lm.ngram.keyindex import KeyIndex
from privasr.lm.ngram.mkn import train_mkn


def _bsearch(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    p = np.searchsorted(keys, q)
    pc = np.minimum(p, max(len(keys) - 1, 0))
    return np.where((p < len(keys)) & (keys[pc] == q if len(keys) else False), p, -1)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 50_000])
def test_lookup_equals_binary_search(n: int) -> None:
    rng = np.random.default_rng(n)
    keys = np.unique(rng.integers(0, 2**62, size=n, dtype=np.int64))
    if n >= 1000:  # dense runs of consecutive keys collide in clusters: the probing must walk them
        keys = np.unique(np.concatenate([keys, np.arange(5_000, 5_000 + n // 2, dtype=np.int64)]))
    present = rng.choice(keys, size=min(len(keys), 3000)) if len(keys) else np.zeros(0, dtype=np.int64)
    q = np.concatenate([present, rng.integers(0, 2**62, size=3000, dtype=np.int64), keys[:5] + 1,
                        np.array([0, 2**62 - 1], dtype=np.int64)])
    index = KeyIndex(keys)
    assert len(index.slots) >= 2 * len(keys)
    assert np.array_equal(index.lookup(q), _bsearch(keys, q))
    assert index.lookup(np.zeros(0, dtype=np.int64)).shape == (0,)


def test_model_scores_are_the_same_with_the_hash_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_mod, "_Engine", None)  # the numpy path (the compiled engine has its own tables)
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    text = [[str(w) for w in rng.choice(words, size=int(rng.integers(1, 12)))] for _ in range(400)]
    lm = train_mkn(text, 3, discount_fallback=(0.5, 1.0, 1.5))
    queries = [*text[:200], ["zz", "w1", "w2"], [], ["w3"] * 20]
    plain, plain_oov = lm.score_totals(queries)
    plain_tokens = [s.logprobs for s in lm.score_batch(queries)]
    assert all(h is None for h in lm._hashed)  # small batches stay with binary search

    monkeypatch.setattr(model_mod, "_HASH_MIN_BATCH", 1)
    for _ in range(3):  # the index of an order is built once that order's queries add up to its size
        hashed, hashed_oov = lm.score_totals(queries)
    assert all(h is not None for h in lm._hashed[1:])
    assert np.array_equal(hashed, plain) and np.array_equal(hashed_oov, plain_oov)
    for a, b in zip(plain_tokens, (s.logprobs for s in lm.score_batch(queries)), strict=True):
        assert np.array_equal(a, b)

    copy = pickle.loads(pickle.dumps(lm))  # the index is not shipped; the copy rebuilds it when needed
    assert all(h is None for h in copy._hashed) and copy.vocab == lm.vocab
    assert np.array_equal(copy.score_totals(queries)[0], plain)
