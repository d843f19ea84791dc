"""SRILM perplexity accounting, checked against KenLM's golden dev perplexity."""

from __future__ import annotations

import json
import lzma
import math

import pytest

from privasr.errors import InputError
from privasr.metrics.perplexity import OOV, ZEROPROB, PplStats, corpus_stats, format_ppl, sentence_stats


def test_srilm_formulas():
    s = sentence_stats([-1.0, OOV, -2.0, ZEROPROB], eos=-1.0)
    assert (s.sentences, s.words, s.oovs, s.zeroprobs, s.logprob) == (1, 4, 1, 1, -4.0)
    assert s.denominator == 4 - 1 - 1 + 1
    assert s.ppl == pytest.approx(10 ** (4.0 / 3))
    assert s.ppl1 == pytest.approx(10 ** (4.0 / 2))


def test_accumulation_and_merge():
    parts = [sentence_stats([-0.5] * k, eos=-0.25) for k in range(1, 6)]
    total = corpus_stats(parts)
    assert total == parts[0] + parts[1] + parts[2] + parts[3] + parts[4]
    assert total == corpus_stats(parts[:2]).merge(corpus_stats(parts[2:]))
    assert (total.sentences, total.words) == (5, 15)
    assert total.logprob == pytest.approx(-0.5 * 15 - 0.25 * 5)
    assert PplStats().ppl != PplStats().ppl  # nan: nothing scored


def test_format_matches_srilm_layout():
    s = PplStats(sentences=3, words=20, oovs=2, zeroprobs=0, logprob=-45.6789)
    lines = format_ppl(s, "test.txt").splitlines()
    assert lines[0] == "file test.txt: 3 sentences, 20 words, 2 OOVs"
    assert lines[1] == f"0 zeroprobs, logprob= -45.6789 ppl= {10 ** (45.6789 / 21):g} ppl1= {10 ** (45.6789 / 18):g}"
    assert format_ppl(PplStats(1, 1, 1, 0, 0.0)).endswith("ppl1= undefined")


def test_input_errors():
    with pytest.raises(InputError):
        sentence_stats([0.5], eos=-1.0)  # positive log10 probability
    with pytest.raises(InputError):
        sentence_stats([math.nan], eos=-1.0)
    with pytest.raises(InputError):
        sentence_stats([-1.0], eos=None)  # </s> cannot be OOV
    with pytest.raises(InputError):
        PplStats(1, 2, 5, 0, -1.0)
    with pytest.raises(InputError):
        PplStats(1, 2, 0, 0, math.inf)


@pytest.mark.shared
@pytest.mark.parametrize("order", ["o3", "o5"])
def test_kenlm_dev_perplexity(golden, order):
    d = golden / "kenlm-mkn"
    dev = json.loads((d / "summary.json").read_text())["models"][order]["dev"]
    acc = PplStats()
    oov = 0
    with lzma.open(d / f"dev_scores.{order}.tsv.xz", "rt") as f:
        for line in f:
            lp, n_words, n_oov = line.split("\t")
            # KenLM scores OOVs as <unk> (an in-vocabulary word): not OOVs in SRILM's sense
            acc = acc + PplStats(sentences=1, words=int(n_words), logprob=float(lp))
            oov += int(n_oov)
    assert (acc.sentences, acc.words, acc.denominator, oov) == (
        dev["n_sentences"], dev["n_words"], dev["n_tokens_incl_eos"], dev["n_oov"])
    assert acc.logprob == pytest.approx(dev["total_log10prob_float64_sum"], rel=1e-13)
    assert acc.ppl == pytest.approx(dev["ppl_incl_oov_from_tsv"], rel=1e-12)
    assert acc.ppl == pytest.approx(dev["query_ppl_incl_oov"], rel=5e-8)
    assert f"ppl= {acc.ppl:g}" in format_ppl(acc)
