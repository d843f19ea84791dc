"""MAPSSWE against NIST sc_stats (golden tiny example and three LibriSpeech system pairs)."""

from __future__ import annotations

import lzma
import math
import re

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.formats import trn as trn_format
from privasr.errors import InputError
from privasr.metrics.mapsswe import mapsswe, segment_sentence, z_test


def read_trn(path):
    """Golden trn file as {utterance id: words}, through the project's trn reader."""
    return {t.utt_id: list(t.words) for t in trn_format.read_trn(path)}


def read_seglist(path):
    txt = lzma.open(path, "rt").read() if str(path).endswith(".xz") else path.read_text()
    body = txt.split("---------------------------------------\n")[1]
    segs = [tuple(map(int, line.split())) for line in body.strip().splitlines()]
    m = re.search(r"MTCH_PR_RESULTS .*\(# segs: (\d+)\).*\(mean: (\S+)\) \(std dev: (\S+)\) \(Z Stat: (\S+)\) "
                  r"\(Stat Diff: (\w+)\)", txt)
    tot = re.search(r"Totals\s+(\d+)\s+(\d+)\s+(\d+)", txt)
    return segs, m.groups(), tuple(map(int, tot.groups()))


def run_pair(d, a, b):
    ref, ha, hb = read_trn(d / "ref.trn"), read_trn(d / f"{a}.trn"), read_trn(d / f"{b}.trn")
    ids = list(ref)
    return mapsswe([ref[i] for i in ids], [ha[i] for i in ids], [hb[i] for i in ids], ids=ids)


@pytest.mark.shared
def test_tiny_segment_by_segment(golden):
    d = golden / "sctk-mapsswe" / "tiny"
    r = run_pair(d, "sysA", "sysB")
    ref = read_trn(d / "ref.trn")
    # the README's table: sentence, ref span, ref words, err A, err B
    table = [
        ("spk1-utt01", "the cat sat on", 4, 0, 1),
        ("spk1-utt01", "sat on the mat today", 5, 1, 1),
        ("spk1-utt02", "she sells sea shells by", 5, 0, 1),
        ("spk1-utt02", "shells by the sea shore", 5, 0, 1),
        ("spk2-utt03", "brown fox jumps over the lazy", 6, 1, 1),
        ("spk2-utt04", "hello world how are", 4, 0, 1),
        ("spk2-utt04", "are you", 2, 0, 1),
    ]
    got = [(s.sentence_id, " ".join(ref[s.sentence_id][s.ref_start : s.ref_end]), s.ref_words, s.errors_a, s.errors_b)
           for s in r.segments]
    assert got == table
    # path spans from the segdebug trace ("Count Segment: ... beg=, end=", ends inclusive)
    trace = (d / "sysA_vs_sysB.PATCHED_segdebug.stdout.txt").read_text()
    spans = [((int(m[0]), int(m[1]) + 1), (int(m[2]), int(m[3]) + 1)) for m in
             re.findall(r"sys1=\[beg=(\d+),end=(\d+),ref=\d+,err=\d+\] sys2=\[beg=(\d+),end=(\d+)", trace)]
    assert [(s.span_a, s.span_b) for s in r.segments] == spans
    segs, (n, mean, sd, z, diff), totals = read_seglist(d / "sysA_vs_sysB.PATCHED_seglist.stats.mapsswe.txt")
    assert [(s.ref_words, s.errors_a, s.errors_b) for s in r.segments] == segs
    assert (r.n, f"{r.mean:.3f}", f"{r.sd:.3f}", f"{r.z:.3f}") == (int(n), mean, sd, z) == (7, "-0.714", "0.488", "-3.873")
    assert (r.ref_words, r.errors_a, r.errors_b) == totals == (31, 2, 7)
    assert r.better == "A" and diff == "Yes"
    assert r.p == pytest.approx(1.08e-4, rel=5e-3)
    assert f"{r.pct_error_a:.2f} {r.pct_error_b:.2f}" == "6.45 22.58"


@pytest.mark.shared
@pytest.mark.parametrize("a,b,n,z", [("sys1", "sys2", 3542, "-40.537"), ("sys1", "sys3", 3659, "-58.074"),
                                     ("sys2", "sys3", 4760, "-5.921")])
def test_librispeech_pairs(golden, a, b, n, z):
    d = golden / "sctk-mapsswe"
    r = run_pair(d, a, b)
    segs, (gn, mean, sd, gz, diff), totals = read_seglist(d / f"{a}_vs_{b}.PATCHED_seglist.stats.mapsswe.txt.xz")
    assert len(segs) == int(gn) == n
    assert [(s.ref_words, s.errors_a, s.errors_b) for s in r.segments] == segs  # exact ordered list
    assert (r.ref_words, r.errors_a, r.errors_b) == totals
    assert (f"{r.mean:.3f}", f"{r.sd:.3f}", f"{r.z:.3f}") == (mean, sd, gz) and gz == z
    assert diff == "Yes" and r.better == "A"
    assert r.sentences == 2939
    # p underflows for the first two pairs; log10 p is exact
    exact = mpmath.log10(mpmath.erfc(mpmath.mpf(abs(r.z)) / mpmath.sqrt(2)))
    assert r.log10_p == pytest.approx(float(exact), rel=1e-9)
    assert r.p == pytest.approx(10.0**r.log10_p, rel=1e-6) if r.log10_p > -300 else r.p == 0.0


def test_z_test_sclite_conventions():
    assert z_test([]) == (0.0, 0.0, 0.0, 1.0, 0.0, "same")
    m, sd, z, p, lp, better = z_test([-1, -1, -1])  # zero variance: sc_stats reports Z = 0
    assert (m, sd, z, p, better) == (-1.0, 0.0, 0.0, 1.0, "same")
    m, sd, z, p, lp, better = z_test([2, 1, 3, 1, 2, 2])
    assert z > 1.96 and better == "B" and p == pytest.approx(math.erfc(abs(z) / math.sqrt(2)))
    # sclite's table value at 0.05, the exact normal quantile elsewhere
    assert mapsswe([["a"]], [["a"]], [["b"]]).critical_z == 1.960
    assert mapsswe([["a"]], [["a"]], [["b"]], alpha=0.5).critical_z == pytest.approx(0.6744897501960817)
    with pytest.raises(InputError):
        z_test([1, 2], alpha=1.5)


def test_segment_sentence_edges():
    assert segment_sentence("", "") == []
    assert segment_sentence("", "II") == [(0, -1, 0, 1)]
    assert segment_sentence("CCC", "CCC") == []
    assert segment_sentence("CCCI", "CCC") == [(1, 3, 1, 2)]  # trailing insertion of A
    assert segment_sentence("CCC", "CCCI") == [(1, 2, 1, 3)]  # trailing insertion of B only
    assert segment_sentence("SCCS", "CCCC", min_boundary=1) == [(0, 1, 0, 1), (2, 3, 2, 3)]
    with pytest.raises(InputError):
        segment_sentence("C", "C", min_boundary=0)


sent = st.lists(st.sampled_from("abc"), max_size=8)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(sent, sent, sent), min_size=1, max_size=5), st.integers(1, 3))
def test_segments_account_for_every_error(triples, k):
    refs, A, B = zip(*triples, strict=True)
    r = mapsswe(refs, A, B, min_boundary=k)
    from privasr.metrics.wer import wer

    wa, wb = wer(refs, A, aligner="sclite"), wer(refs, B, aligner="sclite")
    # every error lies in exactly one segment only when segments cannot overlap on errors: the shared
    # boundary words are correct in both systems, so the error totals must match the sentence totals
    assert r.errors_a == wa.errors and r.errors_b == wb.errors
    assert all(s.errors_a + s.errors_b > 0 for s in r.segments)
    if A == B:
        assert r.z == 0.0 and r.better == "same"
    swapped = mapsswe(refs, B, A, min_boundary=k)
    assert [(s.errors_a, s.errors_b) for s in swapped.segments] == [(s.errors_b, s.errors_a) for s in r.segments]
    assert swapped.z == -r.z


def test_input_errors():
    with pytest.raises(InputError):
        mapsswe([["a"]], [["a"]], [])
    with pytest.raises(InputError):
        mapsswe([["a"], ["b"]], [["a"], ["b"]], [["a"], ["b"]], ids=["x-1", "x-1"])
