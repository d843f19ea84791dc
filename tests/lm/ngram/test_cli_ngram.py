"""``privasr lm train-ngram`` and ``privasr lm ppl``, and the ngram benchmark's degraded mode."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from privasr.cli import main
from privasr.lm.base import perplexity_stats
from privasr.lm.ngram.arpa import read_arpa
from privasr.lm.ngram.mkn import train_mkn

from .test_mkn import markov_corpus


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    p = tmp_path / "train.txt.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write("\n".join(" ".join(s) for s in markov_corpus()) + "\n")
    return p


def test_train_then_ppl(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arpa = tmp_path / "m.arpa"
    assert main(["lm", "train-ngram", "--text", str(corpus), "--order", "3", "--arpa", str(arpa)]) == 0
    err = capsys.readouterr().err
    assert "Unigram tokens" in err and "D1=" in err
    m = read_arpa(arpa)
    sents = markov_corpus()
    direct = train_mkn(sents, 3)
    assert [m.num_ngrams(n) for n in (1, 2, 3)] == [direct.num_ngrams(n) for n in (1, 2, 3)]

    dev = tmp_path / "dev.txt"
    dev_sents = [*markov_corpus(20, seed=7), ["w1", "unseen-word", "w2"]]
    dev.write_text("\n".join(" ".join(s) for s in dev_sents) + "\n")
    out = tmp_path / "ppl.json"
    assert main(["lm", "ppl", "--lm", str(arpa), "--text", str(dev), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    stats = perplexity_stats(m.score_batch(dev_sents))
    assert text.splitlines()[0].startswith("# SRILM ngram -ppl")
    assert text.splitlines()[1] == f"file {dev}: {len(dev_sents)} sentences, {stats.words} words, 1 OOVs"
    assert f"ppl= {stats.ppl:g}" in text
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["oovs"] == 1 and metrics["ppl"] == pytest.approx(stats.ppl)
    scores = m.score_batch(dev_sents)
    incl = 10 ** (-sum(s.total() for s in scores) / sum(len(s.tokens) for s in scores))
    assert metrics["ppl_incl_oov"] == pytest.approx(incl) and metrics["ppl_incl_oov"] > metrics["ppl"]


def test_train_with_prune_and_vocab(corpus: Path, tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("w0 w1 w2\nw3\n")
    arpa = tmp_path / "p.arpa.gz"
    assert main(["lm", "train-ngram", "--text", str(corpus), "-o", "3", "--prune", "0 1 1", "--vocab", str(vocab), "--discount-fallback",
                 "--arpa", str(arpa)]) == 0
    m = read_arpa(arpa)
    assert set(m.vocab) == {"<unk>", "<s>", "</s>", "w0", "w1", "w2", "w3"}
    full = train_mkn(markov_corpus(), 3, vocab=["w0", "w1", "w2", "w3"], discounts=[(0.5, 1.0, 1.5)] * 3)
    assert m.num_ngrams(3) < full.num_ngrams(3)
    words = [w for w in m.vocab if w != "<s>"]
    assert math.isclose(sum(10 ** m.logprob(w, ["w1", "w2"]) for w in words), 1.0, abs_tol=1e-6)


@pytest.mark.parametrize("args", [
    ["--prune", "1 1"], ["--prune", "x"], ["--order", "0"], ["--vocab", "missing.txt"],
])
def test_bad_options_are_input_errors(corpus: Path, tmp_path: Path, args: list[str],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["lm", "train-ngram", "--text", str(corpus), "--arpa", str(tmp_path / "x.arpa"), *args])
    assert code == 2
    assert "error:" in capsys.readouterr().err


def test_ppl_on_malformed_arpa(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1\ta\tzz\n\\end\\\n")
    dev = tmp_path / "dev.txt"
    dev.write_text("a\n")
    assert main(["lm", "ppl", "--lm", str(bad), "--text", str(dev)]) == 2
    assert f"{bad}:5" in capsys.readouterr().err


def test_help() -> None:
    for cmd in (["lm", "--help"], ["lm", "train-ngram", "--help"], ["lm", "ppl", "--help"]):
        assert main(cmd) == 0


def test_benchmark_degrades_without_tools_or_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import privasr.bench.ngram as bench

    monkeypatch.setattr(bench, "golden_dir", lambda: None)
    monkeypatch.setattr(bench, "data_dir", lambda: None)
    monkeypatch.setattr(bench, "irstlm_bin", lambda: None)
    metrics = bench.run(tmp_path, quick=True)
    res = json.loads((tmp_path / "results.json").read_text())
    assert metrics == {}
    for key in ("max_abs_logprob_diff_vs_kenlm", "ppl_ratio_vs_kenlm", "query_speed_vs_kenlm",
                "train_speed_vs_irstlm", "train_speed_vs_lmplz"):
        assert key in res["skipped"] and res["skipped"][key]
