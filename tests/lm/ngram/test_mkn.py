"""Modified Kneser-Ney estimation: counts, discounts, normalisation, pruning, vocabulary limits."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from privasr.errors import InputError
from privasr.lm.ngram.arpa import read_arpa, write_arpa
from privasr.lm.ngram.counts import count_ngrams, tokenize_line
from privasr.lm.ngram.mkn import DiscountError, estimate_mkn, kenlm_discounts, prune_thresholds, train_mkn
from privasr.lm.ngram.model import NgramModel


def markov_corpus(n_sent: int = 300, vocab: int = 40, seed: int = 0) -> list[list[str]]:
    """Sentences from a random bigram chain with Zipfian Dirichlet transitions: natural-looking
    counts-of-counts, so lmplz's discounts exist up to order 5 (for the seeds used here)."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    base = 1.0 / np.arange(1, vocab + 2)
    trans = np.array([rng.dirichlet(base / base.sum() * 2.0) for _ in range(vocab + 1)])  # state vocab = end
    out = []
    for _ in range(n_sent):
        s: list[str] = []
        state = vocab
        while len(s) < 15:
            nxt = int(rng.choice(vocab + 1, p=trans[state]))
            if nxt == vocab:
                if s:
                    break
                continue
            s.append(words[nxt])
            state = nxt
        out.append(s)
    return out


def histories(model: NgramModel) -> list[tuple[str, ...]]:
    hs: list[tuple[str, ...]] = [()]
    for n in range(1, model.order):
        hs += [w for w, _, _ in model.entries(n)]
    return hs + [("never-seen",), ("w1", "never-seen"), ("w3", "w1", "w2")]


def assert_normalised(model: NgramModel, tol: float = 1e-6) -> None:
    """For every history the model lists (and a few it does not), P(w | h) sums to 1 over the vocabulary
    without <s> (which is never predicted). Scored in one batch: the last token of ``h + [w]``."""
    words = [w for w in model.vocab if w != "<s>"]
    hs = histories(model)
    sents = [[*h, w] for h in hs for w in words]
    scores = model.score_batch(sents, bos=False, eos=False)
    last = np.array([s.logprobs[-1] for s in scores]).reshape(len(hs), len(words))
    totals = (10.0 ** last).sum(axis=1)
    bad = np.flatnonzero(np.abs(totals - 1.0) > tol)
    assert len(bad) == 0, [(hs[i], totals[i]) for i in bad[:5]]
    # spot-check the batch against the scalar query
    for h in hs[:: max(1, len(hs) // 20)]:
        assert sum(10.0 ** model.logprob(w, list(h)) for w in words) == pytest.approx(1.0, abs=tol)


@pytest.mark.parametrize("order", [1, 2, 3, 4, 5])
def test_normalised_every_history(order: int) -> None:
    res = estimate_mkn(markov_corpus(), order)
    assert res.model.order == order
    assert_normalised(res.model)
    # the estimated discounts are lmplz's closed form of the counts-of-counts
    for d, t in zip(res.discounts, res.counts_of_counts, strict=True):
        assert d == kenlm_discounts(t)


@pytest.mark.parametrize("interpolate", [True, False])
def test_normalised_with_pruning_and_vocab(interpolate: bool) -> None:
    corpus = markov_corpus(seed=1)
    vocab = {f"w{i}" for i in range(0, 40, 2)} | {"extra-word"}
    m = train_mkn(corpus, 3, vocab=vocab, prune=[0, 1, 2], interpolate_unigrams=interpolate)
    assert "w1" not in m and "w2" in m and "extra-word" in m and "<unk>" in m
    assert_normalised(m)
    full = train_mkn(corpus, 3, vocab=vocab)
    assert m.num_ngrams(3) < full.num_ngrams(3) and m.num_ngrams(1) == full.num_ngrams(1)
    assert_normalised(full)


def test_pruning_drops_rare_ngrams_only() -> None:
    corpus = markov_corpus(seed=2)
    counts = count_ngrams(corpus, 3)
    m = train_mkn(corpus, 3, prune=[0, 0, 1])
    raw3 = counts.orders[2].raw
    assert m.num_ngrams(3) == int((raw3 > 1).sum())
    assert m.num_ngrams(2) == len(counts.orders[1].keys)
    kept = {w for w, _, _ in m.entries(3)}
    table = dict(zip(map(tuple, counts.ids(3).tolist()), raw3.tolist(), strict=True))
    voc = counts.vocab
    assert all(table[tuple(voc.index(x) for x in w)] > 1 for w in kept)


def test_counts_follow_lmplz_conventions() -> None:
    c = count_ngrams([["a", "<unk>", "b"], [], ["a", "</s>"]], 3)
    assert c.vocab == ("<unk>", "<s>", "</s>", "a", "b")
    assert c.tokens == 3 and c.sentences == 3
    t2 = dict(c.table(2))
    assert t2[("<s>", "a")] == 2  # starts with <s>: raw count
    assert t2[("<s>", "</s>")] == 1  # the empty sentence
    assert t2[("a", "b")] == 1  # <unk> was dropped like whitespace
    t1 = dict(c.table(1))
    assert t1[("</s>",)] == 3 and t1[("<s>",)] == 0 and t1[("<unk>",)] == 0
    assert dict(c.table(3))[("<s>", "a", "b")] == 1


def test_tokenize_like_lmplz() -> None:
    assert tokenize_line("a  b\tc\r") == ["a", "b", "c"]
    assert tokenize_line("") == []


def test_discount_errors_and_options() -> None:
    tiny = [["a", "b"], ["b", "a"]]
    with pytest.raises(DiscountError):
        train_mkn(tiny, 2)
    m = estimate_mkn(tiny, 2, discount_fallback=(0.5, 1.0, 1.5)).model
    assert_normalised(m)
    with pytest.raises(InputError):
        train_mkn(tiny, 2, discounts=[(0.5, 1, 1.5)])
    with pytest.raises(InputError):
        prune_thresholds([1, 1], 3)
    with pytest.raises(InputError):
        prune_thresholds([0, 2, 1], 3)
    with pytest.raises(InputError):
        train_mkn(tiny, 0)
    with pytest.raises(InputError):
        train_mkn(["a b"], 2)  # type: ignore[list-item]


def test_discount_formula() -> None:
    t = (1000, 400, 200, 120)
    y = 1000 / (1000 + 800)
    expect = [1 - 2 * y * 400 / 1000, 2 - 3 * y * 200 / 400, 3 - 4 * y * 120 / 200]
    assert kenlm_discounts(t) == pytest.approx(expect, rel=1e-6)


def test_arpa_round_trip_of_trained_model(tmp_path: Path) -> None:
    m = train_mkn(markov_corpus(seed=3), 4)
    write_arpa(m, tmp_path / "m.arpa.gz")
    back = read_arpa(tmp_path / "m.arpa.gz")
    sents = markov_corpus(50, seed=9)
    a = m.score_batch(sents)
    b = back.score_batch(sents)
    assert max(abs(x.total() - y.total()) for x, y in zip(a, b, strict=True)) < 1e-6


def test_scoring_paths_agree() -> None:
    m = train_mkn(markov_corpus(seed=4), 5)
    sents = markov_corpus(60, seed=5) + [["w1", "zzz", "w2"], []]
    batch = m.score_batch(sents)
    for s, sc in zip(sents, batch, strict=True):
        assert sc == sc  # noqa: PLR0124 - frozen dataclass
        st = m.begin_state()
        hist = ["<s>"]
        for w, lp in zip([*s, "</s>"], sc.logprobs.tolist(), strict=True):
            got, st = m.advance(st, w)
            assert got == pytest.approx(lp, abs=1e-12)
            assert m.logprob(w, hist) == pytest.approx(lp, abs=1e-12)
            hist.append(w)
        assert math.isclose(m.score(s).total(), sc.total(), abs_tol=1e-12)
    assert batch[-2].oov.tolist() == [False, True, False, False]
    nob = m.score(["w1", "w2"], bos=False, eos=False)
    assert nob.tokens == ("w1", "w2")
    assert nob.logprobs[0] == pytest.approx(m.logprob("w1", []))


def test_score_totals_and_models_without_specials() -> None:
    m = train_mkn(markov_corpus(seed=6), 3)
    sents = [*markov_corpus(30, seed=8), ["w2", "nope"], []]
    tot, oov = m.score_totals(sents)
    batch = m.score_batch(sents)
    assert np.allclose(tot, [s.total() for s in batch], atol=1e-12)
    assert oov.tolist() == [int(s.oov.sum()) for s in batch]
    tot2, _ = m.score_totals(sents, bos=False, eos=False)
    assert tot2[-1] == 0.0 and tot2[0] == pytest.approx(m.score(sents[0], bos=False, eos=False).total())
    # no <s>, no <unk>: <s> is an unknown context (nothing matches) and OOV words score -inf
    bare = NgramModel.from_entries(2, {1: {("a",): (-0.5, -0.1), ("</s>",): (-0.3, 0.0)},
                                       2: {("a", "</s>"): (-0.05, 0.0)}})
    s = bare.score(["a", "b"])
    assert s.logprobs[0] == pytest.approx(-0.5) and s.logprobs[1] == -math.inf and s.oov.tolist() == [0, 1, 0]
    assert bare.score(["a"]).logprobs.tolist() == pytest.approx([-0.5, -0.05])
    assert bare.advance(bare.begin_state(), "a")[0] == pytest.approx(-0.5)
