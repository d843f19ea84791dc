"""Exactness against KenLM lmplz on the AMI transcripts (../shared/golden/kenlm-mkn)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from privasr.lm.base import perplexity_stats
from privasr.lm.ngram.arpa import read_arpa
from privasr.lm.ngram.counts import read_sentences
from privasr.lm.ngram.mkn import MknResult, estimate_mkn
from privasr.lm.ngram.model import NgramModel

pytestmark = pytest.mark.shared

_CACHE: dict[tuple[str, int], object] = {}


def _trained(golden: Path, order: int) -> MknResult:
    key = ("train", order)
    if key not in _CACHE:
        _CACHE[key] = estimate_mkn(read_sentences(golden / "kenlm-mkn" / "ami_train.txt.xz"), order)
    return _CACHE[key]  # type: ignore[return-value]


def _golden_model(golden: Path, order: int) -> NgramModel:
    key = ("arpa", order)
    if key not in _CACHE:
        _CACHE[key] = read_arpa(golden / "kenlm-mkn" / f"ami_train.o{order}.arpa.xz")
    return _CACHE[key]  # type: ignore[return-value]


def _dev(golden: Path) -> list[list[str]]:
    return list(read_sentences(golden / "kenlm-mkn" / "ami_dev.txt.xz"))


@pytest.mark.parametrize("order", [3, 5])
def test_same_ngrams_probs_and_backoffs(golden: Path, order: int) -> None:
    ours = _trained(golden, order).model
    ref = _golden_model(golden, order)
    assert ours.order == ref.order == order
    assert ours.vocab == ref.vocab  # same words, same ids (order of first appearance)
    for n in range(1, order + 1):
        ia, pa, ba = ours.arrays(n)
        ib, pb, bb = ref.arrays(n)
        assert ia.shape == ib.shape and np.array_equal(ia, ib), f"{n}-gram sets differ"
        assert np.abs(pa - pb).max() < 1e-4, n
        assert np.abs(ba - bb).max() < 1e-4, n
        # KenLM prints float32 values: in practice we agree to its printing precision
        assert np.abs(pa - pb).max() < 2e-6 and np.abs(ba - bb).max() < 2e-6, n


@pytest.mark.parametrize("order", [3, 5])
def test_counts_and_discounts(golden: Path, order: int) -> None:
    res = _trained(golden, order)
    summary = json.loads((golden / "kenlm-mkn" / "summary.json").read_text())["models"][f"o{order}"]
    assert res.tokens == summary["lmplz_unigram_tokens"]
    assert list(res.ngram_counts) == [summary["ngram_counts"][str(n)] for n in range(1, order + 1)]
    rows = [line.split("\t") for line in (golden / "kenlm-mkn" / "discounts.txt").read_text().splitlines()
            if line and not line.startswith("#")]
    printed = {int(r[1]): (int(r[2]), float(r[3]), float(r[4]), float(r[5])) for r in rows if r[0] == f"o{order}"}
    assert sorted(printed) == list(range(1, order + 1))
    for n, (count, *ds) in printed.items():
        assert res.ngram_counts[n - 1] == count
        assert res.discounts[n - 1] == pytest.approx(ds, rel=5e-6)  # printed with 6 significant digits


@pytest.mark.parametrize(("order", "key"), [(3, "o3"), (5, "o5")])
def test_dev_perplexity(golden: Path, order: int, key: str) -> None:
    dev = json.loads((golden / "kenlm-mkn" / "summary.json").read_text())["models"][key]["dev"]
    scores = _trained(golden, order).model.score_batch(_dev(golden))
    tokens = sum(len(s.tokens) for s in scores)
    total = sum(s.total() for s in scores)
    assert tokens == dev["n_tokens_incl_eos"]
    assert sum(int(s.oov.sum()) for s in scores) == dev["n_oov"]
    ppl_incl = 10 ** (-total / tokens)
    assert ppl_incl == pytest.approx(dev["query_ppl_incl_oov"], rel=1e-4)
    stats = perplexity_stats(scores)  # SRILM accounting: OOVs left out
    assert stats.oovs == dev["n_oov"] and stats.words == dev["n_words"]
    assert stats.ppl == pytest.approx(dev["query_ppl_excl_oov"], rel=1e-4)
    # per sentence against KenLM's float64 sums of its float32 token scores
    ref = [float(line.split("\t")[0])
           for line in lzma.open(golden / "kenlm-mkn" / f"dev_scores.o{order}.tsv.xz", "rt", encoding="utf-8")]
    ours = np.array([s.total() for s in scores])
    assert np.abs(ours - np.array(ref)).max() < 1e-4


@pytest.mark.parametrize("order", [3, 5])
def test_golden_arpa_scores_like_query(golden: Path, order: int) -> None:
    ref = [float(line.split("\t")[0])
           for line in lzma.open(golden / "kenlm-mkn" / f"dev_scores.o{order}.tsv.xz", "rt", encoding="utf-8")]
    scores = _golden_model(golden, order).score_batch(_dev(golden))
    assert np.abs(np.array([s.total() for s in scores]) - np.array(ref)).max() < 1e-4
