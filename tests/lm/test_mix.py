"""Linear interpolation: runtime mixture, EM weights (compute-best-mix), static merge of n-gram models."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privasr.errors import InputError
from privasr.lm.base import LanguageModel, perplexity_stats
from privasr.lm.mix import LinearMix, em_weights, estimate_weights, merge_ngrams
from privasr.lm.ngram.model import NgramModel
from privasr.lm.ngram.tables import NgramTables, recompute_backoffs, synthetic_model, unigram_mass

TOL = 1e-6


def _sample(model: NgramModel, rng: np.random.Generator, n: int, max_len: int = 12) -> list[list[str]]:
    """Sentences sampled from a backoff model (so a held-out text that model fits best)."""
    t = NgramTables.from_model(model)
    out = []
    for _ in range(n):
        hist = ["<s>"]
        sent: list[str] = []
        while len(sent) < max_len:
            p = 10.0 ** t.distribution(hist)
            w = t.vocab[int(rng.choice(len(p), p=p / p.sum()))]
            if w == "</s>":
                break
            sent.append(w)
            hist.append(w)
        out.append(sent)
    return out


def _mix_distribution(mix: LinearMix, history: list[str], vocab: list[str]) -> np.ndarray:
    """log10 P(w|history) of a runtime mixture for every w, by scoring history + w."""
    bos = bool(history) and history[0] == "<s>"
    hist = history[1:] if bos else history
    scores = mix.score_batch([[*hist, w] for w in vocab], bos=bos, eos=False)
    return np.array([s.logprobs[-1] for s in scores])


def _all_histories(t: NgramTables) -> list[list[str]]:
    return [[t.vocab[i] for i in h] for h in t.histories()]


@pytest.mark.parametrize("order", [2, 3, 4])
def test_recompute_backoffs_normalises_every_history(order: int) -> None:
    m = synthetic_model(order, 7, seed=order)
    t = NgramTables.from_model(m)
    worst = max(abs(float((10 ** t.distribution(h)).sum()) - 1.0) for h in t.histories())
    assert worst < 1e-12
    # scrambling the backoffs breaks it, recomputing repairs it
    bad = {n: t.bo[n] + 0.1 for n in t.bo}
    assert max(abs(float((10 ** t.distribution(h, bo=bad)).sum()) - 1.0) for h in t.histories()) > 1e-3
    fixed = recompute_backoffs(t, t.lp)
    for n in range(1, order):
        np.testing.assert_allclose(fixed[n], t.bo[n], atol=1e-12)


def test_tables_distribution_matches_ngram_model_logprob() -> None:
    m = synthetic_model(3, 6, seed=11)
    t = NgramTables.from_model(m)
    rng = np.random.default_rng(0)
    for _ in range(30):
        h = [t.vocab[i] for i in rng.integers(0, len(t.vocab), size=rng.integers(0, 4))]
        d = t.distribution(h)
        for w in t.vocab:
            if w == "<s>":
                continue
            assert d[t.wid[w]] == pytest.approx(m.logprob(w, h), abs=1e-12)


def test_em_matches_brute_force_maximum() -> None:
    rng = np.random.default_rng(3)
    p = rng.uniform(0.01, 0.9, size=(2, 50))
    r = em_weights(np.log10(p))
    grid = np.linspace(0, 1, 200001)
    ll = np.log(np.outer(grid, p[0]) + np.outer(1 - grid, p[1])).sum(axis=1)
    assert r.weights[0] == pytest.approx(grid[ll.argmax()], abs=1e-4)
    assert sum(r.weights) == pytest.approx(1.0, abs=1e-12)
    assert r.converged
    # the held-out perplexity never increases (EM is monotone) and the stopping rule held
    ppls = [it.ppl for it in r.iterations]
    assert all(b <= a + 1e-12 for a, b in zip(ppls, ppls[1:], strict=False))
    assert r.ppl <= ppls[-1] + 1e-12
    last = np.array(r.iterations[-1].weights)
    assert np.all(np.abs(np.array(r.weights) - last) <= 1e-6 * last)


def test_em_three_components_and_skipped_tokens() -> None:
    with np.errstate(divide="ignore"):
        lp = np.log10(np.array([[0.5, 0.0, 0.2, 0.0], [0.1, 0.2, 0.2, 0.0], [0.3, 0.3, 0.1, 0.0]]))
    r = em_weights(lp)
    assert r.tokens == 3 and r.skipped == 1
    assert len(r.weights) == 3 and sum(r.weights) == pytest.approx(1.0)
    with pytest.raises(InputError):
        em_weights([[-math.inf, -math.inf]])
    with pytest.raises(InputError):
        em_weights([[0.5]])  # a log10 probability > 0


def test_estimate_weights_prefers_the_better_model() -> None:
    good = synthetic_model(3, 8, seed=21)
    bad = synthetic_model(3, 8, seed=22)
    held = _sample(good, np.random.default_rng(5), 300)
    seen: list[float] = []
    r = estimate_weights([bad, good], held, callback=lambda it: seen.append(it.ppl))
    assert r.weights[1] > 0.8
    assert sum(r.weights) == pytest.approx(1.0, abs=1e-12)
    assert seen == [it.ppl for it in r.iterations]
    # the reported perplexity is the mixture's perplexity on the held-out text
    mix = LinearMix([bad, good], r.weights)
    assert perplexity_stats(mix.score_batch(held)).ppl == pytest.approx(r.ppl, rel=1e-9)
    assert r.ppl <= min(perplexity_stats(m.score_batch(held)).ppl for m in (bad, good)) + 1e-9


@pytest.mark.parametrize("oov", ["unk", "zero"])
def test_runtime_mixture_is_normalised(oov: str) -> None:
    a = synthetic_model(3, 6, seed=1)
    b = synthetic_model(2, 6, seed=2)
    mix = LinearMix([a, b], [0.3, 0.7], oov=oov)  # type: ignore[arg-type]
    assert isinstance(mix, LanguageModel) and mix.order == 3
    vocab = [w for w in a.vocab if w != "<s>"]
    hists = _all_histories(NgramTables.from_model(a)) + [["<s>", "w1", "w9"], ["w0", "w0"]]
    for h in hists:
        total = float((10 ** _mix_distribution(mix, h, vocab)).sum())
        assert abs(total - 1.0) < TOL


def test_runtime_mixture_over_different_vocabularies() -> None:
    a = synthetic_model(2, ["x", "y", "z"], seed=1, unk=False)
    b = synthetic_model(2, ["y", "z", "q"], seed=2, unk=True)
    zero = LinearMix([a, b], [0.4, 0.6], oov="zero")
    union = ["</s>", "<unk>", "x", "y", "z", "q"]
    for h in (["<s>"], ["<s>", "x"], ["q"], ["y", "q"]):
        assert abs(float((10 ** _mix_distribution(zero, h, union)).sum()) - 1.0) < TOL
    # "unk": b scores "x" with its <unk> probability, so the mixture puts more on x than with "zero"
    unk = LinearMix([a, b], [0.4, 0.6], oov="unk")
    s_unk, s_zero = unk.score(["x"]), zero.score(["x"])
    expected = math.log10(0.4 * 10 ** a.logprob("x", ["<s>"]) + 0.6 * 10 ** b.logprob("<unk>", ["<s>"]))
    assert s_unk.logprobs[0] == pytest.approx(expected, abs=1e-12)
    assert s_zero.logprobs[0] == pytest.approx(math.log10(0.4 * 10 ** a.logprob("x", ["<s>"])), abs=1e-12)
    assert not s_unk.oov[0]
    assert unk.score(["nope"]).oov[0]


def test_mix_weights_are_checked() -> None:
    m = synthetic_model(2, 3)
    with pytest.raises(InputError):
        LinearMix([m, m], [0.5, 0.6])
    with pytest.raises(InputError):
        LinearMix([m, m], [1.0])
    with pytest.raises(InputError):
        LinearMix([m], [1.0], oov="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize("order", [2, 3, 4])
def test_merge_is_normalised_and_equals_runtime_mix_on_union_ngrams(order: int) -> None:
    a = synthetic_model(order, 6, seed=10 + order)
    b = synthetic_model(order - 1 if order > 2 else 2, 6, seed=20 + order, keep=0.6)
    w = [0.35, 0.65]
    merged = merge_ngrams([a, b], w)
    mt = NgramTables.from_model(merged)
    assert unigram_mass(mt) == pytest.approx(1.0, abs=1e-12)
    worst = max(abs(float((10 ** mt.distribution(h)).sum()) - 1.0) for h in mt.histories())
    assert worst < 1e-9
    # union of the n-gram sets
    for n in range(1, order + 1):
        expect = {tuple(k) for m in (a, b) if n <= m.order for k, _, _ in m.entries(n)}
        assert {k for k, _, _ in merged.entries(n)} == expect
    mix = LinearMix([a, b], w, oov="zero")
    checked = 0
    for n in range(1, order + 1):
        for key, lp, _ in merged.entries(n):
            if key[-1] == "<s>":
                continue
            h, word = list(key[:-1]), key[-1]
            exact = math.log10(sum(lam * 10 ** m.logprob(word, h) for lam, m in zip(w, (a, b), strict=True)))
            assert lp == pytest.approx(exact, abs=1e-12)
            assert merged.logprob(word, h) == pytest.approx(exact, abs=1e-12)
            if h and h[0] == "<s>" and "<s>" not in h[1:]:
                got = mix.score([*h[1:], word], eos=False).logprobs[-1]
                assert got == pytest.approx(exact, abs=1e-12)
            checked += 1
    assert checked > 20


def test_merge_differs_from_runtime_mix_only_where_it_backs_off() -> None:
    a = synthetic_model(3, 5, seed=1)
    b = synthetic_model(3, 5, seed=2)
    merged = merge_ngrams([a, b], [0.5, 0.5])
    listed = {k for n in range(1, 4) for k, _, _ in merged.entries(n)}
    diffs = []
    for h in (["w0", "w1"], ["w2", "w3"], ["w4", "w4"], ["w1", "w0"]):
        for w in ("w0", "w1", "w2", "w3", "w4", "</s>"):
            exact = math.log10(0.5 * 10 ** a.logprob(w, h) + 0.5 * 10 ** b.logprob(w, h))
            if (*h, w) not in listed and (h[-1], w) not in listed:
                diffs.append(abs(merged.logprob(w, h) - exact))
    assert diffs and max(diffs) > 1e-6  # the documented approximation is real


def test_merge_rejects_bad_weights() -> None:
    m = synthetic_model(2, 3)
    with pytest.raises(InputError):
        merge_ngrams([m, m], [0.2, 0.2])
