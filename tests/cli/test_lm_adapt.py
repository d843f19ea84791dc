"""``privasr lm train-class``, ``privasr lm mix`` and ``privasr lm fma``."""

from __future__ import annotations

import json

import numpy as np
import pytest

from privasr.cli import lm as lm_cli
from privasr.cli import lm_adapt, main
from privasr.lm.base import perplexity_stats
from privasr.lm.ngram.arpa import read_arpa, write_arpa
from privasr.lm.ngram.classes import read_classes
from privasr.lm.ngram.tables import NgramTables, synthetic_model

if not any(c.name == "train-class" for c in lm_cli.app.registered_commands):
    lm_adapt.register(lm_cli.app)  # until privasr.cli.lm wires it in


def _sample(model, rng, n: int) -> list[str]:
    t = NgramTables.from_model(model)
    lines = []
    for _ in range(n):
        hist, sent = ["<s>"], []
        while len(sent) < 15:
            p = 10.0 ** t.distribution(hist)
            w = t.vocab[int(rng.choice(len(p), p=p / p.sum()))]
            if w == "</s>":
                break
            if w != "<unk>":
                sent.append(w)
            hist.append(w)
        lines.append(" ".join(sent))
    return lines


def _zipf(rng, n: int) -> list[str]:
    """Zipfian random text over 3000 words (enough variety for Kneser-Ney discounts)."""
    p = 1.0 / np.arange(1, 3001)
    p /= p.sum()
    return [" ".join(f"w{i}" for i in rng.choice(3000, size=rng.integers(2, 12), p=p)) for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("lmcli")
    rng = np.random.default_rng(0)
    src = synthetic_model(3, 25, seed=3, keep=0.3)
    other = synthetic_model(3, 25, seed=4, keep=0.3)
    (d / "train.txt").write_text("\n".join(_sample(src, rng, 1000) + _zipf(rng, 3000)) + "\n")
    (d / "held.txt").write_text("\n".join(_sample(src, rng, 200)) + "\n")
    (d / "adapt.txt").write_text("\n".join(_sample(other, rng, 100)) + "\n")
    (d / "ne.classes").write_text("<A> w3\n<A> w4\n<B> 0.5 w5\n<B> 0.25 w6\n<B> 0.25 w7\n")
    write_arpa(src, d / "src.arpa")
    write_arpa(other, d / "other.arpa")
    return d


def test_train_class_writes_class_lm_members_and_exact_word_arpa(corpus, capsys) -> None:
    out = corpus / "cls"
    rc = main(["lm", "train-class", "--text", str(corpus / "train.txt"), "--classes", str(corpus / "ne.classes"),
               "--order", "3", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "expanded word LM" in capsys.readouterr().out
    class_lm = read_arpa(out / "class.arpa")
    assert "<A>" in class_lm and "w3" not in class_lm
    members = read_classes(out / "members.classes")
    assert members.file_probs("<B>") == {"w5": 0.5, "w6": 0.25, "w7": 0.25}
    pa = members.file_probs("<A>")
    assert pa is not None and sum(pa.values()) == pytest.approx(1.0)
    from privasr.lm.ngram.class_lm import ClassNgramModel

    model = ClassNgramModel(class_lm, members, {c: members.file_probs(c) for c in members.classes})
    word = read_arpa(out / "word.arpa")
    held = [line.split() for line in (corpus / "held.txt").read_text().splitlines()]
    for a, b in zip(model.score_batch(held[:50]), word.score_batch(held[:50]), strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["command"] == "lm train-class" and res["metrics"]["classes"] == 2
    assert res["metrics"]["class_ngrams"][0] == class_lm.num_ngrams(1) and "text" in res["data"]


def test_mix_em_and_merge(corpus, capsys) -> None:
    merged = corpus / "mix.arpa"
    rc = main(["lm", "mix", "--lm", str(corpus / "other.arpa"), "--lm", str(corpus / "src.arpa"),
               "--heldout", str(corpus / "held.txt"), "--arpa", str(merged)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "iteration 1:" in text and "EM converged" in text and "mixture:" in text
    w = [float(x) for x in text.split("weights: ")[1].split()[:2]]
    assert w[1] > 0.8 and sum(w) == pytest.approx(1.0, abs=1e-5)
    m = read_arpa(merged)
    t = NgramTables.from_model(m)
    assert max(abs(float((10 ** t.distribution(h)).sum()) - 1) for h in t.histories()) < 1e-6
    rc = main(["lm", "mix", "--lm", str(corpus / "other.arpa"), "--lm", str(corpus / "src.arpa"),
               "--weights", "0.5,0.5", "--heldout", str(corpus / "held.txt"), "--results", str(corpus / "mix.json")])
    assert rc == 0 and "weights: 0.500000 0.500000" in capsys.readouterr().out
    res = json.loads((corpus / "mix.json").read_text())
    assert res["metrics"]["weights"] == [0.5, 0.5] and set(res["metrics"]["heldout"]) == {"other.arpa", "src.arpa",
                                                                                         "mixture"}


def test_fma_writes_an_adapted_model(corpus, capsys) -> None:
    out = corpus / "fma.arpa"
    rc = main(["lm", "fma", "--lm", str(corpus / "src.arpa"), "--adapt-text", str(corpus / "adapt.txt"),
               "--beta", "0.5", "--arpa", str(out), "--heldout", str(corpus / "adapt.txt"),
               "--results", str(corpus / "fma.json")])
    assert rc == 0
    res = json.loads((corpus / "fma.json").read_text())
    assert res["metrics"]["adapted"]["ppl"] < res["metrics"]["base"]["ppl"] and res["config"]["beta"] == 0.5
    text = capsys.readouterr().out
    assert "adapted:" in text
    adapted = read_arpa(out)
    held = [line.split() for line in (corpus / "adapt.txt").read_text().splitlines()]
    base = read_arpa(corpus / "src.arpa")
    assert perplexity_stats(adapted.score_batch(held)).ppl < perplexity_stats(base.score_batch(held)).ppl
    t = NgramTables.from_model(adapted)
    assert max(abs(float((10 ** t.distribution(h)).sum()) - 1) for h in t.histories()) < 1e-6


@pytest.mark.parametrize("args", [
    ["lm", "mix", "--lm", "{d}/src.arpa", "--lm", "{d}/other.arpa"],
    ["lm", "mix", "--lm", "{d}/src.arpa", "--lm", "{d}/other.arpa", "--weights", "0.5,x"],
    ["lm", "mix", "--lm", "{d}/src.arpa", "--lm", "{d}/other.arpa", "--weights", "0.5,0.6"],
    ["lm", "mix", "--lm", "{d}/src.arpa", "--lm", "{d}/missing.arpa", "--weights", "0.5,0.5"],
    ["lm", "fma", "--lm", "{d}/src.arpa", "--adapt-text", "{d}/adapt.txt", "--beta", "-1", "--arpa", "{d}/x"],
    ["lm", "fma", "--lm", "{d}/held.txt", "--adapt-text", "{d}/adapt.txt", "--arpa", "{d}/x"],
    ["lm", "train-class", "--text", "{d}/train.txt", "--classes", "{d}/bad.classes", "--out", "{d}/o"],
])
def test_bad_input_is_one_line_and_exit_2(corpus, capsys, args) -> None:
    (corpus / "bad.classes").write_text("<A> w1\n<A> 0.5 w2 w3\n")
    rc = main([a.format(d=corpus) for a in args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error:") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("cmd", ["train-class", "mix", "fma"])
def test_help(cmd, capsys) -> None:
    assert main(["lm", cmd, "--help"]) == 0
    assert "--" in capsys.readouterr().out
