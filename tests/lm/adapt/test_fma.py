"""Fast marginal adaptation: exact normaliser, exact ARPA rewrite, beta = 0, marginal shift."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privasr.errors import InputError
from privasr.lm.adapt.fma import (
    FmaModel,
    adaptation_unigram,
    fma_alpha,
    fma_normalizers,
    fma_rewrite,
    text_unigram,
)
from privasr.lm.base import LanguageModel
from privasr.lm.ngram.arpa import read_arpa, write_arpa
from privasr.lm.ngram.tables import NgramTables, synthetic_model


def _adapt_unigram(model, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    words = [w for w in model.vocab if w != "<s>"]
    p = rng.dirichlet(np.ones(len(words)) * 0.5) + 1e-3
    return dict(zip(words, (p / p.sum()).tolist(), strict=True))


def _random_histories(t: NgramTables, rng: np.random.Generator, n: int) -> list[list[str]]:
    hs = []
    for _ in range(n):
        k = int(rng.integers(0, t.order + 1))
        hs.append([t.vocab[int(i)] for i in rng.integers(0, len(t.vocab), size=k)])
    return hs


@pytest.mark.parametrize("order", [2, 3, 4])
def test_every_adapted_distribution_sums_to_one(order: int) -> None:
    base = synthetic_model(order, 8, seed=order)
    pa = _adapt_unigram(base, order)
    fma = FmaModel(base, pa, beta=0.7)
    t = NgramTables.from_model(base)
    hists = [[t.vocab[i] for i in h] for h in t.histories()]
    hists += _random_histories(t, np.random.default_rng(order), 30)
    dev = [abs(float((10 ** fma.distribution(h)).sum()) - 1.0) for h in hists]
    assert max(dev) < 1e-12
    # the rewritten ARPA is normalised too (its own backoff arithmetic, not FmaModel's)
    rt = NgramTables.from_model(fma_rewrite(base, pa, 0.7))
    assert max(abs(float((10 ** rt.distribution(h)).sum()) - 1.0) for h in hists) < 1e-12


def test_normaliser_equals_brute_force_sum() -> None:
    base = synthetic_model(3, 6, seed=7)
    t = NgramTables.from_model(base)
    alpha = fma_alpha(base, _adapt_unigram(base, 1), 1.0)
    z0, zs = fma_normalizers(base, alpha)
    mask = np.array([w != "<s>" for w in t.vocab])
    assert z0 == pytest.approx(float((alpha * 10 ** t.distribution([]))[mask].sum()), rel=1e-13)
    for k in (1, 2):
        for r, key in enumerate(t.keys[k]):
            brute = float((alpha * 10 ** t.distribution(key))[mask].sum())
            assert zs[k][r] == pytest.approx(brute, rel=1e-12)
    # a non-trivial adaptation: Z varies with the history
    assert np.ptp(zs[2]) > 1e-3


@pytest.mark.parametrize("order", [2, 3, 4])
def test_rewrite_equals_runtime_wrapper(order: int) -> None:
    base = synthetic_model(order, 7, seed=100 + order)
    pa = _adapt_unigram(base, order)
    fma = FmaModel(base, pa, beta=0.5)
    new = fma_rewrite(base, pa, 0.5)
    assert [new.num_ngrams(n) for n in range(1, order + 1)] == [base.num_ngrams(n) for n in range(1, order + 1)]
    for n in range(1, order + 1):
        for key, _, _ in new.entries(n):
            if key[-1] == "<s>":
                continue
            assert new.logprob(key[-1], list(key[:-1])) == pytest.approx(fma.logprob(key[-1], list(key[:-1])),
                                                                         abs=1e-9)
    rng = np.random.default_rng(order)
    words = [w for w in base.vocab if w not in ("<s>", "</s>")] + ["never-seen"]
    sents = [[words[int(i)] for i in rng.integers(0, len(words), size=rng.integers(0, 10))] for _ in range(50)]
    for a, b in zip(fma.score_batch(sents), new.score_batch(sents), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-9, rtol=0)
        assert a.oov.tolist() == b.oov.tolist()
    # scalar and batch scoring agree
    s = sents[3]
    hist = ["<s>", *s]
    assert fma.score(s).logprobs[-1] == pytest.approx(fma.logprob("</s>", hist), abs=1e-12)


def test_rewrite_survives_the_arpa_file(tmp_path) -> None:
    base = synthetic_model(3, 6, seed=5)
    pa = _adapt_unigram(base, 5)
    p = tmp_path / "fma.arpa"
    write_arpa(fma_rewrite(base, pa, 0.5), p)
    back = read_arpa(p)
    fma = FmaModel(base, pa, 0.5)
    sents = [["w0", "w1", "w2"], ["w3"], [], ["w5", "w5", "w4", "w1"]]
    for a, b in zip(fma.score_batch(sents), back.score_batch(sents), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-7, rtol=0)


def test_beta_zero_gives_back_the_base_model() -> None:
    base = synthetic_model(3, 6, seed=9)
    pa = _adapt_unigram(base, 2)
    fma = FmaModel(base, pa, beta=0.0)
    new = fma_rewrite(base, pa, 0.0)
    for n in range(1, 4):
        for (k1, p1, b1), (k2, p2, b2) in zip(base.entries(n), new.entries(n), strict=True):
            assert k1 == k2
            assert p2 == pytest.approx(p1, abs=1e-12) and b2 == pytest.approx(b1, abs=1e-12)
    sents = [["w0", "w3"], ["w1", "w1", "w2"]]
    for a, b in zip(fma.score_batch(sents), base.score_batch(sents), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-12)


def test_adapting_towards_a_word_raises_its_marginal() -> None:
    base = synthetic_model(3, 8, seed=13)
    t = NgramTables.from_model(base)
    target = "w3"
    text = [["w3", "w3", "w1"], ["w3", "w0"], ["w3"]] * 20
    pa = adaptation_unigram(text, base, mu=50.0)
    fma = FmaModel(base, pa, beta=1.0)
    assert isinstance(fma, LanguageModel)
    hists = [[t.vocab[i] for i in h] for h in t.histories()]
    j = t.wid[target]
    before = np.mean([10 ** t.distribution(h)[j] for h in hists])
    after = np.mean([10 ** fma.distribution(h)[j] for h in hists])
    assert after > 1.5 * before
    # the adapted unigram marginal moves towards P_A
    new = fma_rewrite(base, pa, 1.0)
    p_new = dict((k[0], 10 ** p) for k, p, _ in new.entries(1))
    p_old = dict((k[0], 10 ** p) for k, p, _ in base.entries(1))
    assert abs(p_new[target] - pa[target]) < abs(p_old[target] - pa[target])
    # words absent from the adaptation text lose probability everywhere
    k = t.wid["w7"]
    assert all(fma.distribution(h)[k] < t.distribution(h)[k] for h in hists)


def test_unigram_estimates() -> None:
    base = synthetic_model(2, ["a", "b", "c"], seed=1)
    pu = adaptation_unigram([["a", "a", "zz"]], base, smoothing="add-k", k=1.0)
    # events: </s>, <unk>, a, b, c; counts a=2, zz -> <unk>=1, </s>=1
    assert pu["a"] == pytest.approx(3 / 9) and pu["<unk>"] == pytest.approx(2 / 9)
    assert math.fsum(pu.values()) == pytest.approx(1.0)
    pd = adaptation_unigram([["a"]], base, mu=1e9)
    p1 = {k[0]: 10 ** p for k, p, _ in base.entries(1) if k[0] != "<s>"}
    assert pd["b"] == pytest.approx(p1["b"], rel=1e-6)  # huge prior: the base unigram
    assert text_unigram([["a", "b"]], base)["c"] == 0.0
    with pytest.raises(InputError):
        adaptation_unigram([["a"]], base, smoothing="magic")  # type: ignore[arg-type]


def test_bad_inputs() -> None:
    base = synthetic_model(2, ["a", "b"], seed=1)
    with pytest.raises(InputError, match="no probability"):
        FmaModel(base, {"a": 1.0}, 0.5)
    with pytest.raises(InputError, match="> 0"):
        FmaModel(base, {"a": 0.5, "b": 0.5, "</s>": 0.0, "<unk>": 0.0}, 0.5)
    with pytest.raises(InputError):
        FmaModel(base, _adapt_unigram(base, 1), -1.0)


@pytest.mark.shared
def test_fma_on_the_ami_trigram(golden) -> None:
    from privasr.lm.ngram.counts import read_sentences

    base = read_arpa(golden / "kenlm-mkn" / "ami_train.o3.arpa.xz")
    dev = list(read_sentences(golden / "kenlm-mkn" / "ami_dev.txt.xz"))[:1500]
    pa = adaptation_unigram(dev, base)
    fma = FmaModel(base, pa, 0.5)
    new = fma_rewrite(base, pa, 0.5)
    for a, b in zip(fma.score_batch(dev), new.score_batch(dev), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-9, rtol=0)
    t = NgramTables.from_model(new)
    rng = np.random.default_rng(0)
    hists = [()] + [t.keys[1][int(i)] for i in rng.choice(t.num_ngrams(1), 100, replace=False)]
    hists += [t.keys[2][int(i)] for i in rng.choice(t.num_ngrams(2), 100, replace=False)]
    assert max(abs(float((10 ** t.distribution(h)).sum()) - 1.0) for h in hists) < 1e-9
    assert max(abs(float((10 ** fma.distribution([t.vocab[i] for i in h])).sum()) - 1.0) for h in hists) < 1e-9
