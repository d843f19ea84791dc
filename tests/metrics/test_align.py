"""sclite-compatible alignment: brute-force cross-check, golden sclite SGML alignments."""

from __future__ import annotations

import lzma
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.formats import trn as trn_format
from privasr.errors import InputError
from privasr.metrics.align import Alignment, align, align_many


def sclite_dp(ref, hyp, sub=4, ins=3, dele=3):
    """Cell-by-cell transcription of SCTK net_dp.c for linear networks (reference implementation)."""
    n, m = len(ref), len(hyp)
    D = [[0] * (m + 1) for _ in range(n + 1)]
    B = [[""] * (m + 1) for _ in range(n + 1)]
    for b in range(1, m + 1):
        D[0][b], B[0][b] = D[0][b - 1] + ins, "I"
    for a in range(1, n + 1):
        D[a][0], B[a][0] = D[a - 1][0] + dele, "D"
    for a in range(1, n + 1):
        for b in range(1, m + 1):
            s = D[a - 1][b - 1] + (0 if ref[a - 1] == hyp[b - 1] else sub)
            d = D[a - 1][b] + dele
            i = D[a][b - 1] + ins
            if s <= d and s <= i:
                D[a][b], B[a][b] = s, "S"
            elif d < i:
                D[a][b], B[a][b] = d, "D"
            else:
                D[a][b], B[a][b] = i, "I"
    ops = []
    a, b = n, m
    while a > 0 or b > 0:
        c = B[a][b]
        if c == "S":
            a, b = a - 1, b - 1
            ops.append("C" if ref[a] == hyp[b] else "S")
        elif c == "D":
            a -= 1
            ops.append("D")
        else:
            b -= 1
            ops.append("I")
    return "".join(reversed(ops)), D[n][m]


words = st.lists(st.sampled_from("abcd"), max_size=9)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(words, words), min_size=1, max_size=6), st.sampled_from([(4, 3, 3), (1, 1, 1), (2, 3, 1)]))
def test_batched_dp_equals_cell_by_cell(pairs, weights):
    got = align_many([r for r, _ in pairs], [h for _, h in pairs], weights=weights)
    for (r, h), a in zip(pairs, got, strict=True):
        ops, cost = sclite_dp(r, h, *weights)
        assert a.ops == ops
        sub, ins, dele = weights
        assert a.substitutions * sub + a.insertions * ins + a.deletions * dele == cost
        assert [p[0] for p in a.pairs() if p[0] is not None] == list(r)
        assert [p[1] for p in a.pairs() if p[1] is not None] == list(h)


def test_known_tie_breaks():
    assert align(["a", "b"], ["b", "c"]).ops == "DCI"  # D+I (6) beats two substitutions (8)
    assert align(["shop", "boy"], ["shopboy"]).ops == "DS"  # as in sclite's sys1.sgml
    assert align(["a", "a"], ["a"]).ops == "DC"
    assert align(["a"], ["a", "a"]).ops == "IC"
    assert align([], []).ops == ""


def test_validation():
    with pytest.raises(InputError):
        align_many([["a"]], [])
    with pytest.raises(InputError):
        align("a b", ["a"])  # type: ignore[arg-type]
    with pytest.raises(InputError):
        align(["a"], ["b"], weights=(4, -1, 3))
    with pytest.raises(InputError):
        Alignment(("a",), ("b",), "CC")


def read_trn(path):
    """Golden trn file as {utterance id: words}, through the project's trn reader."""
    return {t.utt_id: list(t.words) for t in trn_format.read_trn(path)}


_ENTRY = re.compile(r'([CSDI]),(?:"([^"]*)")?,(?:"([^"]*)")?')


@pytest.mark.shared
@pytest.mark.parametrize("system", ["sys1", "sys2", "sys3"])
def test_alignments_equal_sclite_sgml(golden, system):
    d = golden / "sctk-mapsswe"
    ref, hyp = read_trn(d / "ref.trn"), read_trn(d / f"{system}.trn")
    ids = list(ref)
    got = align_many([ref[i] for i in ids], [hyp[i] for i in ids])
    txt = lzma.open(d / f"{system}.sgml.xz", "rt", encoding="utf-8").read()
    gold = {m.group(1): m.group(2) for m in re.finditer(r'<PATH id="\(([^)]*)\)"[^>]*>\n(.*?)\n</PATH>', txt, re.S)}
    assert len(gold) == len(ids) == 2939
    for i, a in zip(ids, got, strict=True):
        entries = _ENTRY.findall(gold[i])
        assert a.ops == "".join(e[0] for e in entries), i
        assert [(r or None, h or None) for _, r, h in entries] == [(p[0], p[1]) for p in a.pairs()], i
