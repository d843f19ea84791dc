"""Class n-gram LMs: normalisation, training, exact expansion into a word ARPA, class-vs-word experiment."""

from __future__ import annotations

import hashlib
import itertools
import lzma
import math

import numpy as np
import pytest

from privasr.errors import InputError
from privasr.lm.base import LanguageModel, perplexity_stats
from privasr.lm.ngram.arpa import read_arpa, write_arpa
from privasr.lm.ngram.class_lm import (
    ClassNgramModel,
    class_vs_word_ppl,
    expand_to_word_arpa,
    member_distributions,
    normalise_ami_tokens,
    train_class_lm,
)
from privasr.lm.ngram.classes import ClassMap, frequency_bin_classes
from privasr.lm.ngram.mkn import train_mkn
from privasr.lm.ngram.tables import NgramTables, synthetic_model

CLASSES = ClassMap.from_members({"<PER>": ["alice", "bob", "carol"], "<LOC>": ["paris", "rome"]})
PLAIN = ["the", "sees", "in", "likes", "a"]
D3 = [(0.5, 1.0, 1.5), (0.6, 1.1, 1.4), (0.7, 1.2, 1.3)]


def _class_model(order: int, seed: int) -> ClassNgramModel:
    lm = synthetic_model(order, [*PLAIN, "<PER>", "<LOC>"], seed=seed, keep=0.5)
    rng = np.random.default_rng(seed)
    probs = {c: dict(zip(CLASSES.members(c), rng.dirichlet(np.ones(len(CLASSES.members(c)))).tolist(),
                         strict=True)) for c in CLASSES.classes}
    return ClassNgramModel(lm, CLASSES, probs)


def _word_histories(model: ClassNgramModel, rng: np.random.Generator) -> list[list[str]]:
    """Every class-LM history, with class tokens replaced by each (or a random) member, plus random ones."""
    t = NgramTables.from_model(model.class_lm)
    out = []
    for h in t.histories():
        toks = [t.vocab[i] for i in h]
        options = [CLASSES.members(x) if CLASSES.is_class(x) else (x,) for x in toks]
        combos = list(itertools.product(*options))
        for j in rng.choice(len(combos), size=min(3, len(combos)), replace=False):
            out.append(list(combos[int(j)]))
    words = list(model.vocab) + ["unknown"]
    for _ in range(20):
        out.append([words[int(i)] for i in rng.integers(0, len(words), size=rng.integers(0, 4))])
    return out


@pytest.mark.parametrize("order", [2, 3, 4])
def test_class_lm_and_expansion_are_normalised_and_equal(order: int) -> None:
    model = _class_model(order, seed=order)
    assert isinstance(model, LanguageModel)
    assert "alice" in model and "<PER>" not in model and "the" in model
    rng = np.random.default_rng(order)
    hists = _word_histories(model, rng)
    dev = [abs(float((10 ** model.distribution(h)).sum()) - 1.0) for h in hists]
    assert max(dev) < 1e-12
    # the vectorised distribution is the model's logprob
    h = hists[len(hists) // 2]
    d = model.distribution(h)
    for j, w in enumerate(model.vocab):
        if w != "<s>":
            assert d[j] == pytest.approx(model.logprob(w, h), abs=1e-12)

    word = expand_to_word_arpa(model)
    wt = NgramTables.from_model(word)
    assert set(word.vocab) == set(model.vocab)
    # every history of the expanded model sums to 1
    wdev = [abs(float((10 ** wt.distribution(hh)).sum()) - 1.0) for hh in wt.histories()]
    assert max(wdev) < 1e-12
    # the expansion gives the class LM's probability for every word after every history (exact)
    for hh in hists:
        dw = wt.distribution(hh)
        dc = model.distribution(hh)
        for j, w in enumerate(model.vocab):
            if w != "<s>":
                assert dw[wt.wid[w]] == pytest.approx(dc[j], abs=1e-10)
    # recomputed backoff weights equal the class backoffs of the class history
    for key, _, bo in word.entries(order - 1):
        mapped = model.map_words(list(key))
        c_bo = [b for k, _, b in model.class_lm.entries(order - 1) if list(k) == mapped]
        assert bo == pytest.approx(c_bo[0], abs=1e-10)
    # sentences score the same, OOVs included
    words = [w for w in model.vocab if w not in ("<s>", "</s>")] + ["zzz"]
    sents = [[words[int(i)] for i in rng.integers(0, len(words), size=rng.integers(0, 9))] for _ in range(40)]
    for a, b in zip(model.score_batch(sents), word.score_batch(sents), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-10, rtol=0)
        assert a.oov.tolist() == b.oov.tolist()


def test_expansion_counts_and_guard() -> None:
    model = _class_model(3, seed=1)
    word = expand_to_word_arpa(model)
    sizes = {"<PER>": 3, "<LOC>": 2}
    for n in (1, 2, 3):
        expect = sum(math.prod(sizes.get(w, 1) for w in k) for k, _, _ in model.class_lm.entries(n))
        assert word.num_ngrams(n) == expect
    with pytest.raises(InputError, match="expanded model would have"):
        expand_to_word_arpa(model, max_ngrams=10)


def test_expansion_through_an_arpa_file(tmp_path) -> None:
    model = _class_model(3, seed=5)
    p = tmp_path / "word.arpa"
    write_arpa(expand_to_word_arpa(model), p)
    back = read_arpa(p)
    sents = [["alice", "sees", "rome"], ["bob", "likes", "carol", "in", "paris"], ["the"]]
    for a, b in zip(model.score_batch(sents), back.score_batch(sents), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-7)


def _text(rng: np.random.Generator, n: int) -> list[list[str]]:
    people = ["alice"] * 6 + ["bob"] * 3 + ["carol"]
    places = ["paris", "rome", "rome"]
    verbs = ["sees", "likes", "meets"]
    out = []
    for _ in range(n):
        s = [str(rng.choice(people)), str(rng.choice(verbs))]
        s.append(str(rng.choice(people)) if rng.random() < 0.5 else "the " + str(rng.choice(["cat", "dog"])))
        if rng.random() < 0.4:
            s += ["in", str(rng.choice(places))]
        out.append(" ".join(s).split())
    return out


def test_training_counts_members_and_maps_the_text() -> None:
    text = _text(np.random.default_rng(0), 400)
    model = train_class_lm(text, CLASSES, order=3, discounts=D3)
    counts = {w: sum(s.count(w) for s in text) for w in ("alice", "bob", "carol")}
    total = sum(counts.values())
    for w, c in counts.items():
        assert 10 ** model.member_logprob(w) == pytest.approx(c / total, rel=1e-12)
    assert "<PER>" in model.class_lm and "alice" not in model.class_lm
    s = ["bob", "meets", "carol", "in", "paris"]
    expect = model.class_lm.score(["<PER>", "meets", "<PER>", "in", "<LOC>"]).logprobs.copy()
    expect[[0, 2, 4]] += [model.member_logprob("bob"), model.member_logprob("carol"), model.member_logprob("paris")]
    np.testing.assert_allclose(model.score(s).logprobs[:-1], expect[:-1], atol=1e-12)
    # add-k gives unseen members probability; ML leaves them out
    cm = ClassMap.from_members({"<PER>": ["alice", "bob", "carol", "dave"], "<LOC>": ["paris", "rome"]})
    ml = train_class_lm(text, cm, order=2, discounts=D3[:2])
    assert "dave" not in ml and ml.score(["dave"]).oov[0]
    smooth = train_class_lm(text, cm, order=2, k=0.5, discounts=D3[:2])
    assert 10 ** smooth.member_logprob("dave") == pytest.approx(0.5 / (total + 2.0))


def test_anonymised_text_with_class_tokens_and_file_probabilities() -> None:
    cm = ClassMap({"<PER>": (("alice", 0.7), ("bob", 0.3))})
    text = [["<PER>", "sees", "<PER>"], ["<PER>", "waves"]] * 30 + [["hello"]] * 10
    model = train_class_lm(text, cm, order=2, discounts=[(0.5, 1.0, 1.5)] * 2)
    assert 10 ** model.member_logprob("alice") == pytest.approx(0.7)
    counted = train_class_lm(text, cm, order=2, member_probs="counts", discounts=[(0.5, 1.0, 1.5)] * 2)
    assert 10 ** counted.member_logprob("alice") == pytest.approx(0.5)  # no member seen: uniform
    with pytest.raises(InputError):
        member_distributions(text, ClassMap.from_members({"<PER>": ["alice"]}), source="file")


def test_inconsistent_models_are_rejected() -> None:
    lm = synthetic_model(2, ["alice", "<PER>", "x"], seed=1)
    with pytest.raises(InputError, match="also a word"):
        ClassNgramModel(lm, CLASSES, None)
    lm2 = synthetic_model(2, ["<PER>", "x"], seed=1)
    with pytest.raises(InputError, match="no member with probability"):
        ClassNgramModel(lm2, CLASSES, {"<PER>": {"alice": 0.0}})


def test_class_vs_word_on_synthetic_text() -> None:
    rng = np.random.default_rng(1)
    train, test = _text(rng, 1500), _text(rng, 300)
    r = class_vs_word_ppl(train, test, n_classes=5, order=3, discounts=D3)
    assert r.n_classes == 5 and r.test_sentences == 300 and r.oovs == 0
    assert 1.0 < r.word_ppl < 20 and 1.0 < r.class_ppl < 40
    word = perplexity_stats(train_mkn(train, 3, discounts=D3).score_batch(test))
    assert r.word_ppl == pytest.approx(word.ppl)
    # one class per word is the word model again, up to MKN's treatment of the renamed tokens
    counts: dict[str, int] = {}
    for s in train:
        for w in s:
            counts[w] = counts.get(w, 0) + 1
    r_all = class_vs_word_ppl(train, test, n_classes=len(counts), order=3, discounts=D3)
    assert r_all.class_ppl == pytest.approx(r_all.word_ppl, rel=1e-9)
    assert len(frequency_bin_classes(counts, len(counts)).classes) == len(counts)


def test_normalise_ami_tokens() -> None:
    assert normalise_ami_tokens(["Hello", ",", "we", "'re", "'", "do", "n't", "'em", "--"]) == \
        ["hello", "we're", "don't'em"]
    assert normalise_ami_tokens(["'s", "ok"]) == ["'s", "ok"]


@pytest.mark.shared
def test_ami_normalisation_reproduces_the_golden_dev_text(shared_data, golden) -> None:
    from privasr.corpus.formats.ami_hmnet import iter_ami_hmnet

    lines = []
    for tr in iter_ami_hmnet(shared_data / "ami-transcripts" / "AMI_proprec" / "dev"):
        toks = normalise_ami_tokens(tr.words)
        if toks:
            lines.append(" ".join(toks) + "\n")
    text = "".join(lines).encode("utf-8")
    with lzma.open(golden / "kenlm-mkn" / "ami_dev.txt.xz", "rb") as f:
        gold = f.read()
    assert hashlib.sha256(text).hexdigest() == hashlib.sha256(gold).hexdigest()


@pytest.mark.shared
def test_class_vs_word_on_ami(golden) -> None:
    train = golden / "kenlm-mkn" / "ami_train.txt.xz"
    dev = golden / "kenlm-mkn" / "ami_dev.txt.xz"
    r = class_vs_word_ppl(train, dev, n_classes=500, order=3)
    # the word model is lmplz's: KenLM query's perplexity excluding OOVs on the same text
    assert r.word_ppl == pytest.approx(99.51034267765449, rel=1e-7)
    assert r.oovs == 793 and r.test_sentences == 5676
    assert r.n_classes == 500 and math.isfinite(r.class_ppl) and r.class_ppl > 1


def test_expansion_with_top_members_keeps_the_most_probable_renormalised():
    lm = synthetic_model(2, ["hi", "there", "<PER>"], seed=3)
    members = {"<PER>": {"ann": 0.5, "bo": 0.3, "cy": 0.2}}
    m = ClassNgramModel(lm, ClassMap.from_members({"<PER>": ["ann", "bo", "cy"]}), members)
    full = expand_to_word_arpa(m)
    top2 = expand_to_word_arpa(m, top_members=2)
    assert "cy" in full.vocab and "cy" not in top2.vocab
    # the kept members share the class's probability in their old proportion
    p_class = 10 ** m.logprob("ann", ["hi"]) / 0.5
    assert 10 ** top2.logprob("ann", ["hi"]) == pytest.approx(p_class * 0.5 / 0.8, rel=1e-6)
    assert 10 ** top2.logprob("bo", ["hi"]) == pytest.approx(p_class * 0.3 / 0.8, rel=1e-6)
    for h in (["hi"], ["ann"], ["<s>"]):
        total = sum(10 ** top2.logprob(w, h) for w in top2.vocab if w not in ("<s>",))
        assert total == pytest.approx(1.0, abs=1e-6)
    assert top2.num_ngrams(2) < full.num_ngrams(2)
    with pytest.raises(InputError, match="top_members"):
        expand_to_word_arpa(m, top_members=0)
