"""sclite's transcript conventions: alternations, the null word ``@``, optionally deletable words, fragments, case.

NIST sclite (SCTK 2.4.10: ``net_adt.c`` builds, ``net_dp.c`` aligns, ``word.c`` costs) reads every reference
and hypothesis as a *network* of words, not a sequence:

* **Alternations** ``{ um / uh / @ }`` (nested freely, alternatives of any length) are branches; the alignment
  takes the branch that costs least. ``@`` is the **null word**: inserting or deleting it costs 0.001 and it
  is never counted, so ``i've { um / uh / @ } as far`` scores a hypothesis with or without a filler as correct
  and counts only the words of the branch it took. An alternation in a hypothesis is read the same way.
* **Optionally deletable words** ``(um)``: with sclite's ``-D`` (:attr:`Conventions.optional_deletable`) a
  deleted or inserted ``(um)`` costs 2 and is scored *correct*, and ``(um)`` matches ``um``; without ``-D`` it
  is the literal word ``(um)``.
* **Fragments** ``th-`` and ``-at``: with ``-F`` (:attr:`Conventions.fragments`) a fragment matches any word it
  begins (or ends) and is scored correct.
* **Case**: sclite folds case unless ``-s`` (:attr:`Conventions.case_sensitive`).

Costs are sclite's: correct 0, ``@`` inserted or deleted 0.001, ``@`` for ``@`` 1, an optionally deletable word
inserted or deleted 2, insertion or deletion 3, substitution 4, summed in single precision as sclite does, with
its tie-breaking (:mod:`privasr.metrics.align` describes it for plain sentences, which align through that
module's batched DP: without markup the two give the same alignment). The path keeps sclite's conventions:
``@`` never appears in it, and an optionally deletable word that was skipped is a correct word aligned with the
empty string ``""``.

What privasr refuses (sclite accepts and does something surprising; :mod:`privasr.corpus.markup` parses): an
unclosed ``{``, a ``}`` that closes nothing, an empty alternative (``{ / a }``: sclite silently drops it, use ``@``), ``{`` glued to a word
(``c{a / b}``), and ``()``.

>>> a = align_sclite([["i've", "{", "um", "/", "uh", "/", "@", "}", "as", "far"]], [["i've", "as", "far"]])[0]
>>> a.ref, a.hyp, a.ops
(("i've", 'as', 'far'), ("i've", 'as', 'far'), 'CCC')
>>> a = align_sclite([["I've", "(um)", "as"]], [["i've", "as"]], Conventions(optional_deletable=True))[0]
>>> a.ref, a.hyp, a.ops
(("i've", '(um)', 'as'), ("i've", '', 'as'), 'CCC')
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.corpus.markup import NULL_WORD, Item, has_markup, parse_markup
from privasr.errors import InputError
from privasr.metrics.align import Alignment, align_many

try:  # the compiled DP (setup.py builds it where a C compiler is available); else the same loops in Python
    from privasr.metrics import _netdp
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _netdp = None

__all__ = ["Conventions", "SCLITE", "align_sclite"]



@dataclass(frozen=True, slots=True)
class Conventions:
    """How sclite is told to read transcripts (its options of the same meaning in brackets).

    Attributes:
        case_sensitive: compare words exactly (``-s``); by default both sides are lower-cased first.
        optional_deletable: ``(word)`` may be deleted or inserted at no error (``-D``); otherwise it is a word.
        fragments: ``th-`` / ``-at`` match any word they begin / end (``-F``).
        markup: read alternations ``{ a / b }`` and ``@``; ``False`` makes every token a plain word (the
            convention of Kaldi's ``compute-wer`` and jiwer).
    """

    case_sensitive: bool = False
    optional_deletable: bool = False
    fragments: bool = False
    markup: bool = True

    def options(self) -> str:
        """The sclite options these conventions correspond to (for reports and tests).

        >>> Conventions(optional_deletable=True).options(), Conventions(case_sensitive=True).options()
        ('-D', '-s')
        """
        return " ".join(o for o, on in (("-s", self.case_sensitive), ("-D", self.optional_deletable),
                                        ("-F", self.fragments)) if on)


SCLITE = Conventions()
"""sclite's defaults: case folded, alternations read, ``(word)`` and fragments literal."""


# ------------------------------------------------------------------------------------------------ networks


@dataclass(frozen=True, slots=True)
class _Word:
    value: str        # as written (after case folding)
    intern: bytes     # what it is compared by: without the parentheses of an optionally deletable word
    opt_del: bool
    frag: bool
    null: bool


def _word(value: str, conv: Conventions) -> _Word:
    opt = conv.optional_deletable and len(value) >= 2 and value[0] == "(" and value[-1] == ")"
    intern = value[1:-1] if opt else value
    v = value.encode("utf-8")
    frag = conv.fragments and (v.endswith(b"-") or v.startswith(b"-") or (opt and len(v) >= 2 and v[-2:-1] == b"-"))
    return _Word(value, intern.encode("utf-8"), opt, frag, value == NULL_WORD)


class _Net:
    """A word network in sclite's layout: arc 0 is the null head; ``pred[a]`` the arcs ending where arc ``a``
    starts (in sclite's in-arc order), ``final`` the arcs that end the network."""

    __slots__ = ("words", "pred", "final")

    def __init__(self, items: Sequence[Item], conv: Conventions) -> None:
        self.words: list[_Word | None] = [None]
        self.pred: list[list[int]] = [[]]
        ends = self._seq(items, [0], conv)
        self.final = ends

    def _seq(self, items: Sequence[Item], into: list[int], conv: Conventions) -> list[int]:
        """Add ``items`` after the arcs ``into``; return the arcs they end with."""
        cur = into
        for it in items:
            if isinstance(it, str):
                self.words.append(_word(it, conv))
                self.pred.append(list(cur))
                cur = [len(self.words) - 1]
            else:
                ends: list[int] = []
                for alt in it:
                    ends.extend(self._seq(alt, cur, conv))
                cur = ends
        return cur


def _equal(w1: _Word, w2: _Word) -> bool:
    """sclite's ``equal_WORD2``: byte comparison of the internal values, fragments matching prefixes/suffixes."""
    it1, it2 = w1.intern, w2.intern
    if w1.frag or w2.frag:
        l1, l2 = len(it1), len(it2)
        if l1 > 1 and it1[:1] == b"-":
            return l2 >= l1 - 1 and it1[1:] == it2[l2 - (l1 - 1):]
        if l1 > 1 and it1[-1:] == b"-":
            return it1[:l1 - 1] == it2[:l1 - 1]
        if l2 > 1 and it2[:1] == b"-":
            return l1 >= l2 - 1 and it1[l1 - (l2 - 1):] == it2[1:]
        if l2 > 1 and it2[-1:] == b"-":
            return it1[:l2 - 1] == it2[:l2 - 1]
    return it1 == it2


_F = np.float32
_C_NULL, _C_ONE, _C_OPT, _C_INSDEL, _C_SUB, _C_ZERO = _F(0.001), _F(1.0), _F(2.0), _F(3.0), _F(4.0), _F(0.0)
_BIG = _F(999999999.9)


def _cost(w1: _Word | None, w2: _Word | None) -> np.float32:
    """sclite's ``wwd_WORD``."""
    if w2 is None and w1 is not None and w1.null:
        return _C_NULL
    if w1 is None and w2 is not None and w2.null:
        return _C_NULL
    if (w1 is None and w2 is not None and w2.opt_del) or (w2 is None and w1 is not None and w1.opt_del):
        return _C_OPT
    if w1 is None or w2 is None:
        return _C_INSDEL
    if w1.null and w2.null:
        return _C_ONE
    return _C_ZERO if _equal(w1, w2) else _C_SUB


def _dp_python(ra: _Net, hb: _Net) -> tuple[list[Any], list[list[int]], list[list[int]]]:
    """sclite's ``calculate_margin_cells`` and ``calculate_internal_cells`` in Python (the compiled
    :mod:`privasr.metrics._netdp` does the same): ``(cost, back_a, back_b)`` per cell.

    Costs are summed as C ``float``: each sum of two single-precision values is exact in a Python float (their
    exponents are close) and is rounded to single precision by storing it in an ``array('f')``, which is what the
    C addition does; comparisons then see sclite's values, ties included.
    """
    na, nb = len(ra.words), len(hb.words)
    big = float(_BIG)
    wa, wb, pa, pb = ra.words, hb.words, ra.pred, hb.pred
    cdel = [0.0] + [float(_cost(w, None)) for w in wa[1:]]
    cins = [0.0] + [float(_cost(None, w)) for w in wb[1:]]
    simple_a = [w is not None and not (w.null or w.frag) for w in wa]
    simple_b = [w is not None and not (w.null or w.frag) for w in wb]
    key_a = [w.intern if w is not None else None for w in wa]
    key_b = [w.intern if w is not None else None for w in wb]
    cost = [array("f", [big]) * nb for _ in range(na)]
    back: list[list[tuple[int, int]]] = [[(-1, -1)] * nb for _ in range(na)]  # (back_a, back_b)
    cost[0][0] = 0.0
    r32 = array("f", [0.0])
    row0 = cost[0]
    for b in range(1, nb):
        m, mi = big, -1
        for q in pb[b]:
            if row0[q] < m:
                m, mi = row0[q], q
        row0[b] = m + cins[b]
        back[0][b] = (0, mi)
    for a in range(1, na):
        m, mi = big, -1
        for p in pa[a]:
            if cost[p][0] < m:
                m, mi = cost[p][0], p
        cost[a][0] = m + cdel[a]
        back[a][0] = (mi, 0)
    for a in range(1, na):
        row, brow, preds, da_cost, ka, sa_ok, wa_a = cost[a], back[a], pa[a], cdel[a], key_a[a], simple_a[a], wa[a]
        prow = [cost[p] for p in preds]
        single = len(preds) == 1
        for b in range(1, nb):
            qs = pb[b]
            ins, ib = big, -1
            for q in qs:
                if row[q] < ins:
                    ins, ib = row[q], q
            if single:
                pr, p0 = prow[0], preds[0]
                dele, da = pr[b], p0
                sub, sa, sb = big, -1, -1
                for q in qs:
                    if pr[q] < sub:
                        sub, sa, sb = pr[q], p0, q
            else:
                dele, da = big, -1
                for p, pr in zip(preds, prow, strict=True):
                    if pr[b] < dele:
                        dele, da = pr[b], p
                sub, sa, sb = big, -1, -1
                for p, pr in zip(preds, prow, strict=True):
                    for q in qs:
                        if pr[q] < sub:
                            sub, sa, sb = pr[q], p, q
            if sa_ok and simple_b[b]:
                cs = 0.0 if ka == key_b[b] else 4.0
            else:
                cs = float(_cost(wa_a, wb[b]))
            r32[0] = sub + cs
            sub = r32[0]
            r32[0] = dele + da_cost
            dele = r32[0]
            r32[0] = ins + cins[b]
            ins = r32[0]
            if sub <= dele and sub <= ins:
                row[b], brow[b] = sub, (sa, sb)
            elif dele < ins:
                row[b], brow[b] = dele, (da, b)
            else:
                row[b], brow[b] = ins, (a, ib)
    return cost, [[x for x, _ in r] for r in back], [[y for _, y in r] for r in back]


def _dp_compiled(ra: _Net, hb: _Net) -> tuple[list[Any], list[list[int]], list[list[int]]]:
    """The same DP in :mod:`privasr.metrics._netdp` (C, single precision as sclite)."""
    na, nb = len(ra.words), len(hb.words)

    def csr(pred: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        ptr = np.zeros(len(pred) + 1, np.int32)
        ptr[1:] = np.cumsum([len(p) for p in pred])
        return ptr, np.fromiter((q for p in pred for q in p), np.int32, count=int(ptr[-1]))

    wa, wb = ra.words, hb.words
    cdel = np.array([0.0] + [_cost(w, None) for w in wa[1:]], np.float32)
    cins = np.array([0.0] + [_cost(None, w) for w in wb[1:]], np.float32)
    ids: dict[bytes, int] = {}
    ia = np.array([-1] + [ids.setdefault(w.intern, len(ids)) for w in wa[1:]], np.int64)  # type: ignore[union-attr]
    ib = np.array([-2] + [ids.setdefault(w.intern, len(ids)) for w in wb[1:]], np.int64)  # type: ignore[union-attr]
    csub = np.where(ia[:, None] == ib[None, :], np.float32(0.0), np.float32(4.0)).astype(np.float32)
    special_a = [a for a in range(1, na) if wa[a].null or wa[a].frag]  # type: ignore[union-attr]
    special_b = [b for b in range(1, nb) if wb[b].null or wb[b].frag]  # type: ignore[union-attr]
    for a in special_a:
        csub[a, 1:] = [_cost(wa[a], wb[b]) for b in range(1, nb)]
    for b in special_b:
        csub[1:, b] = [_cost(wa[a], wb[b]) for a in range(1, na)]
    cost = np.empty((na, nb), np.float32)
    back_a = np.empty((na, nb), np.int32)
    back_b = np.empty((na, nb), np.int32)
    _netdp.align(na, nb, *csr(ra.pred), *csr(hb.pred), cdel, cins, csub, cost, back_a, back_b)
    return cost.tolist(), back_a.tolist(), back_b.tolist()


def _align_nets(ra: _Net, hb: _Net) -> Alignment:
    """sclite's ``Network_dpalign`` and ``extract_NET_ALIGN_result`` (nulls left out of the path)."""
    wa, wb = ra.words, hb.words
    cost, back_a, back_b = (_dp_compiled if _netdp is not None else _dp_python)(ra, hb)
    best, a, b = float(_F(999999.9)), -1, -1
    for p in ra.final:
        for q in hb.final:
            if best > cost[p][q]:
                best, a, b = cost[p][q], p, q
    ref: list[str] = []
    hyp: list[str] = []
    ops: list[str] = []
    while a > 0 or b > 0:
        la, lb = back_a[a][b], back_b[a][b]
        x, y = wa[a], wb[b]
        if a == la:  # insertion of hypothesis word b
            assert y is not None
            if not y.null:
                if y.opt_del:  # an optionally deletable hypothesis word: correct, against nothing
                    ref.append("")
                hyp.append(y.value)
                ops.append("C" if y.opt_del else "I")
        elif b == lb:  # deletion of reference word a
            assert x is not None
            if not x.null:
                ref.append(x.value)
                if x.opt_del:
                    hyp.append("")
                ops.append("C" if x.opt_del else "D")
        else:
            assert x is not None and y is not None
            if not (x.null and y.null):
                ref.append(x.value)
                hyp.append(y.value)
                ops.append("C" if _equal(x, y) else "S")
        a, b = la, lb
    return Alignment(tuple(reversed(ref)), tuple(reversed(hyp)), "".join(reversed(ops)))


def _needs_network(words: Sequence[str], conv: Conventions) -> bool:
    if conv.markup and has_markup(words):
        return True
    if conv.optional_deletable and any(len(w) >= 2 and w[0] == "(" and w[-1] == ")" for w in words):
        return True
    return conv.fragments and any(len(w) > 1 and (w[0] == "-" or w[-1] == "-") for w in words)


def _fold(words: Sequence[str]) -> list[str]:
    return [w.lower() for w in words]


def align_sclite(refs: Sequence[Sequence[str]], hyps: Sequence[Sequence[str]],
                 conventions: Conventions = SCLITE) -> list[Alignment]:
    """Align each reference with its hypothesis as sclite does under ``conventions``.

    Sentences without markup go through :func:`privasr.metrics.align.align_many` (batched); the others through
    sclite's network alignment. The alignments hold the words as compared (lower-cased unless
    ``case_sensitive``) and never ``@``.

    Args:
        refs, hyps: token sequences as written (markup tokens included), one hypothesis per reference.
        conventions: sclite's options (:class:`Conventions`).

    Raises:
        InputError: lists of different lengths, or malformed markup (the message names the side and sentence).

    >>> [a.ops for a in align_sclite([["a", "{", "b", "/", "@", "}"], ["X"]], [["a", "c"], ["x"]])]
    ['CI', 'C']
    """
    if len(refs) != len(hyps):
        raise InputError(f"{len(refs)} references but {len(hyps)} hypotheses", expected="one hypothesis per reference")
    conv = conventions
    R = [list(r) if conv.case_sensitive else _fold(r) for r in refs]
    H = [list(h) if conv.case_sensitive else _fold(h) for h in hyps]
    out: list[Alignment | None] = [None] * len(R)
    plain = []
    for k, (r, h) in enumerate(zip(R, H, strict=True)):
        if _needs_network(r, conv) or _needs_network(h, conv):
            try:
                ri = parse_markup(r) if conv.markup else tuple(r)
            except InputError as e:
                raise InputError(f"reference {k + 1}: {e.message}", expected=e.expected) from None
            try:
                hi = parse_markup(h) if conv.markup else tuple(h)
            except InputError as e:
                raise InputError(f"hypothesis {k + 1}: {e.message}", expected=e.expected) from None
            out[k] = _align_nets(_Net(ri, conv), _Net(hi, conv))
        else:
            plain.append(k)
    if plain:
        for k, a in zip(plain, align_many([R[k] for k in plain], [H[k] for k in plain]), strict=True):
            out[k] = a
    return out  # type: ignore[return-value]
