"""WER: counts, edge cases, jiwer vs sclite aligners, golden sclite totals."""

from __future__ import annotations

import re

import jiwer
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rapidfuzz.distance import Levenshtein

from privasr.corpus.formats import trn as trn_format
from privasr.errors import InputError
from privasr.metrics.wer import error_rate, wer, wer_from_counts


def test_counts_and_rates():
    r = wer([["a", "b", "c", "d"], ["e", "f"]], [["a", "x", "c"], ["e", "f", "g"]])
    assert (r.ref_words, r.hits, r.substitutions, r.deletions, r.insertions, r.errors) == (6, 4, 1, 1, 1, 3)
    assert r.wer == 0.5 and r.sentences == 2 and r.sentence_errors == 2 and r.ser == 1.0
    assert r.utt_errors == (2, 1) and r.utt_ref_words == (4, 2)
    assert r.alignments is None


def test_empty_reference_and_hypothesis():
    r = wer([[], ["a", "b"], []], [["x", "y"], [], []])
    assert (r.insertions, r.deletions, r.hits, r.ref_words) == (2, 2, 0, 2)
    assert r.utt_errors == (2, 2, 0) and r.sentence_errors == 2
    only_empty = wer([[]], [[]])
    assert only_empty.wer == 0.0 and only_empty.errors == 0
    assert wer([[]], [["x"]]).wer == float("inf")
    assert wer([], []).sentences == 0 and wer([], []).ser == 0.0
    assert wer([[]], [["x"]]).as_dict()["wer"] is None  # JSON-safe


def test_input_errors():
    with pytest.raises(InputError):
        wer([["a"]], [["a"], ["b"]])
    with pytest.raises(InputError):
        wer(["a b"], [["a"]])  # a string, not tokens
    with pytest.raises(InputError):
        wer([["a b"]], [["a"]])  # token with a space
    with pytest.raises(InputError):
        wer([["a", ""]], [["a"]])
    with pytest.raises(InputError):
        wer([["a"]], [["a"]], aligner="nope")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        wer_from_counts([1], [0, 1], [0], [0])


def test_alignments_returned():
    r = wer([["a", "b"], []], [["a", "c", "d"], ["z"]], return_alignments=True)
    assert r.alignments is not None and len(r.alignments) == 2
    assert sorted(c.type for c in r.alignments[0]) == ["equal", "insert", "substitute"]  # jiwer's order
    assert [c.type for c in r.alignments[1]] == ["insert"]
    s = wer([["a", "b"]], [["b", "c"]], return_alignments=True, aligner="sclite")
    assert [c.type for c in s.alignments[0]] == ["delete", "equal", "insert"]


def test_error_rate():
    assert error_rate(0, 0) == 0.0 and error_rate(3, 0) == float("inf") and error_rate(1, 2) == 0.5


toks = st.lists(st.sampled_from(["a", "b", "c", "dd"]), max_size=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(toks, toks), max_size=6))
def test_matches_levenshtein_and_jiwer(pairs):
    refs = [r for r, _ in pairs]
    hyps = [h for _, h in pairs]
    r = wer(refs, hyps, aligner="jiwer")
    s = wer(refs, hyps)
    assert s == wer(refs, hyps, aligner="sclite")  # sclite's alignment is the default
    assert r.utt_errors == tuple(Levenshtein.distance(a, b) for a, b in pairs)
    assert all(x >= y for x, y in zip(s.utt_errors, r.utt_errors, strict=True))  # jiwer is minimal
    assert r.hits + r.substitutions + r.deletions == r.ref_words == s.ref_words == sum(map(len, refs))
    assert s.hits + s.substitutions + s.insertions == sum(map(len, hyps))
    nonempty = [(a, b) for a, b in pairs if a and b]
    if nonempty:
        j = jiwer.process_words([" ".join(a) for a, _ in nonempty], [" ".join(b) for _, b in nonempty])
        sub = wer([a for a, _ in nonempty], [b for _, b in nonempty], aligner="jiwer")
        assert (sub.hits, sub.substitutions, sub.deletions, sub.insertions) == (
            j.hits, j.substitutions, j.deletions, j.insertions)
    assert r.subset(range(len(pairs))) == r


def read_trn(path):
    """Golden trn file as {utterance id: words}, through the project's trn reader."""
    return {t.utt_id: list(t.words) for t in trn_format.read_trn(path)}


@pytest.mark.shared
@pytest.mark.parametrize("system", ["sys1", "sys2", "sys3"])
def test_totals_match_sclite(golden, system):
    d = golden / "sctk-mapsswe"
    ref, hyp = read_trn(d / "ref.trn"), read_trn(d / f"{system}.trn")
    ids = list(ref)
    s = wer([ref[i] for i in ids], [hyp[i] for i in ids], aligner="sclite")
    j = wer([ref[i] for i in ids], [hyp[i] for i in ids], aligner="jiwer")
    line = next(x for x in (d / f"{system}.sys").read_text().splitlines() if "Sum/Avg" in x)
    nums = re.findall(r"\d+(?:\.\d+)?", line)
    snt, wrd, corr, sub, dele, ins, err, serr = nums
    n = s.ref_words
    assert (s.sentences, n) == (int(snt), int(wrd)) == (2939, 52343)
    for count, pct in [(s.hits, corr), (s.substitutions, sub), (s.deletions, dele), (s.insertions, ins),
                       (s.errors, err)]:
        assert f"{100 * count / n:.1f}" == pct
    assert f"{100 * s.ser:.1f}" == serr
    assert j.errors == s.errors  # same error totals, different S/D/I split is allowed
    # per-speaker error counts from sc_stats' raw report
    pair = "sys1_vs_sys2" if system in ("sys1", "sys2") else "sys1_vs_sys3"
    col = 0 if system == "sys1" else 1
    raw = (d / f"{pair}_unified.raw.txt").read_text()
    gold = {m[0]: int(m[1 + col]) for m in re.findall(r"\|\s+(\w+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|", raw)}
    per_spk: dict[str, int] = {}
    for i, e in zip(ids, s.utt_errors, strict=True):
        per_spk[i.split("-")[0]] = per_spk.get(i.split("-")[0], 0) + e
    assert gold.pop("Sum") == s.errors
    assert per_spk == gold
