"""Word alignment exactly as NIST sclite computes it.

sclite (SCTK ``net_dp.c``, ``word.c``) aligns a reference with a hypothesis by dynamic programming with
integer weights, by default **correct 0, substitution 4, insertion 3, deletion 3**, and breaks ties in a
fixed way: at each cell it keeps the diagonal move (correct or substitution) if it is no worse than both
others, else the deletion if it is strictly better than the insertion, else the insertion; the back-trace
starts from the last reference and hypothesis words. Because a substitution (4) is cheaper than a deletion
plus an insertion (6) but dearer than either alone, sclite's alignment can differ from a plain Levenshtein
alignment (jiwer/rapidfuzz, unit costs) in *where* errors fall and, rarely, in how many there are. The
MAPSSWE test segments sentences by the alignment, so reproducing sc_stats needs this alignment.

Not modelled: sclite's optionally deletable reference words ``(word)``, the ``@`` null word, fragments and
case folding. Words are compared as exact strings.

>>> a = align("the cat sat".split(), "the bat sat down".split())
>>> a.ops, a.substitutions, a.insertions
('CSCI', 1, 1)
>>> print(a.pretty())
REF:  the CAT sat ****
HYP:  the BAT sat DOWN
Eval:     S       I

The DP over many sentences is batched with numpy (row by row, the insertion recurrence solved by a
running minimum), so thousands of sentences align in well under a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privasr.corpus.records import check_words
from privasr.errors import InputError

__all__ = ["Alignment", "align", "align_many", "SCLITE_WEIGHTS"]

SCLITE_WEIGHTS: tuple[int, int, int] = (4, 3, 3)
"""sclite's default (substitution, insertion, deletion) weights; a correct word costs 0."""

_SUB, _DEL, _INS = 0, 1, 2
_CELL_BUDGET = 4_000_000  # DP cells per numpy batch (bounds memory: one int8 back-pointer per cell)


@dataclass(frozen=True, slots=True)
class Alignment:
    """The alignment of one reference with one hypothesis.

    Attributes:
        ref: the reference words.
        hyp: the hypothesis words.
        ops: one letter per aligned position, in order: ``C`` correct, ``S`` substitution,
            ``D`` deletion (a reference word with no hypothesis word), ``I`` insertion.

    >>> a = Alignment(("a", "b"), ("a",), "CD")
    >>> a.pairs()
    (('a', 'a', 'C'), ('b', None, 'D'))
    >>> a.hits, a.deletions, a.errors
    (1, 1, 1)
    """

    ref: tuple[str, ...]
    hyp: tuple[str, ...]
    ops: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "ref", tuple(self.ref))
        object.__setattr__(self, "hyp", tuple(self.hyp))
        if set(self.ops) - set("CSDI"):
            raise InputError(f"alignment ops {self.ops!r} contain letters other than C, S, D, I")
        n_ref = len(self.ops) - self.ops.count("I")
        n_hyp = len(self.ops) - self.ops.count("D")
        if n_ref != len(self.ref) or n_hyp != len(self.hyp):
            raise InputError(f"alignment ops {self.ops!r} do not fit {len(self.ref)} reference and "
                             f"{len(self.hyp)} hypothesis words")

    @property
    def hits(self) -> int:
        """Number of correct words."""
        return self.ops.count("C")

    @property
    def substitutions(self) -> int:
        """Number of substituted reference words."""
        return self.ops.count("S")

    @property
    def deletions(self) -> int:
        """Number of deleted reference words."""
        return self.ops.count("D")

    @property
    def insertions(self) -> int:
        """Number of inserted hypothesis words."""
        return self.ops.count("I")

    @property
    def errors(self) -> int:
        """Substitutions + deletions + insertions."""
        return len(self.ops) - self.ops.count("C")

    def pairs(self) -> tuple[tuple[str | None, str | None, str], ...]:
        """``(ref word or None, hyp word or None, op)`` per aligned position."""
        out = []
        i = j = 0
        for op in self.ops:
            r = h = None
            if op != "I":
                r = self.ref[i]
                i += 1
            if op != "D":
                h = self.hyp[j]
                j += 1
            out.append((r, h, op))
        return tuple(out)

    def pretty(self) -> str:
        """sclite-style ``REF:``/``HYP:``/``Eval:`` lines (errors upper-cased, gaps as asterisks).

        >>> print(align(["a"], []).pretty())
        REF:  A
        HYP:  *
        Eval: D
        """
        rs, hs, es = [], [], []
        for r, h, op in self.pairs():
            if op == "C":
                r_s, h_s = r or "", h or ""
            else:
                r_s = r.upper() if r is not None else ""
                h_s = h.upper() if h is not None else ""
            w = max(len(r_s), len(h_s), 1)
            rs.append(r_s.ljust(w, " ") if r is not None else "*" * w)
            hs.append(h_s.ljust(w, " ") if h is not None else "*" * w)
            es.append((" " if op == "C" else op).ljust(w))
        return "\n".join(("REF:  " + " ".join(rs)).rstrip() if k == 0 else
                         ("HYP:  " + " ".join(hs)).rstrip() if k == 1 else
                         ("Eval: " + " ".join(es)).rstrip() for k in range(3))


def _check_weights(weights: Sequence[int]) -> tuple[int, int, int]:
    try:
        sub, ins, dele = weights
    except (TypeError, ValueError):
        raise InputError(f"alignment weights {weights!r}", expected="(substitution, insertion, deletion)") from None
    for w in (sub, ins, dele):
        if isinstance(w, bool) or not isinstance(w, int | np.integer) or w < 0:
            raise InputError(f"alignment weight {w!r}", expected="a non-negative integer")
    return int(sub), int(ins), int(dele)


def align(ref: Sequence[str], hyp: Sequence[str], *, weights: Sequence[int] = SCLITE_WEIGHTS) -> Alignment:
    """Align one reference with one hypothesis as sclite does.

    Args:
        ref: reference words.
        hyp: hypothesis words.
        weights: integer (substitution, insertion, deletion) costs; sclite's default ``(4, 3, 3)``.

    >>> align(["a", "b"], ["b", "c"]).ops  # sclite prefers D + I (6) to two substitutions (8)
    'DCI'
    >>> align([], ["x"]).ops, align(["x"], []).ops
    ('I', 'D')
    """
    return align_many([ref], [hyp], weights=weights)[0]


def align_many(
    refs: Sequence[Sequence[str]],
    hyps: Sequence[Sequence[str]],
    *,
    weights: Sequence[int] = SCLITE_WEIGHTS,
) -> tuple[Alignment, ...]:
    """Align many sentence pairs as sclite does (batched with numpy).

    Raises :class:`InputError` when ``refs`` and ``hyps`` differ in length.

    >>> [a.ops for a in align_many([["a"], ["a", "b"]], [["a"], ["a", "x", "b"]])]
    ['C', 'CIC']
    """
    if len(refs) != len(hyps):
        raise InputError(f"{len(refs)} references but {len(hyps)} hypotheses", expected="one hypothesis per reference")
    sub_w, ins_w, del_w = _check_weights(weights)
    R = [check_words(r, f"reference {k}") for k, r in enumerate(refs)]
    H = [check_words(h, f"hypothesis {k}") for k, h in enumerate(hyps)]
    ops: list[str | None] = [None] * len(R)
    todo = []
    for k, (r, h) in enumerate(zip(R, H, strict=True)):
        if r == h:
            ops[k] = "C" * len(r)  # the all-correct path has cost 0 and is the only one that does
        elif not r:
            ops[k] = "I" * len(h)
        elif not h:
            ops[k] = "D" * len(r)
        else:
            todo.append(k)
    if todo:
        vocab: dict[str, int] = {}
        rid = [np.fromiter((vocab.setdefault(w, len(vocab)) for w in R[k]), np.int64, len(R[k])) for k in todo]
        hid = [np.fromiter((vocab.setdefault(w, len(vocab)) for w in H[k]), np.int64, len(H[k])) for k in todo]
        order = sorted(range(len(todo)), key=lambda t: (len(rid[t]), len(hid[t])))
        start = 0
        while start < len(order):
            stop = start + 1
            n_max, m_max = len(rid[order[start]]), len(hid[order[start]])
            while stop < len(order):
                n2 = max(n_max, len(rid[order[stop]]))
                m2 = max(m_max, len(hid[order[stop]]))
                if (stop - start + 1) * (n2 + 1) * (m2 + 1) > _CELL_BUDGET:
                    break
                n_max, m_max, stop = n2, m2, stop + 1
            batch = order[start:stop]
            for t, o in zip(batch, _align_batch([rid[t] for t in batch], [hid[t] for t in batch],
                                                n_max, m_max, sub_w, ins_w, del_w), strict=True):
                ops[todo[t]] = o
            start = stop
    return tuple(Alignment(r, h, o) for r, h, o in zip(R, H, ops, strict=True))  # type: ignore[arg-type]


def _align_batch(
    rids: list[np.ndarray], hids: list[np.ndarray], n_max: int, m_max: int, sub_w: int, ins_w: int, del_w: int
) -> list[str]:
    B = len(rids)
    ref = np.full((B, n_max), -1, np.int64)
    hyp = np.full((B, m_max), -2, np.int64)
    for b in range(B):
        ref[b, : len(rids[b])] = rids[b]
        hyp[b, : len(hids[b])] = hids[b]
    back = np.empty((B, n_max + 1, m_max + 1), np.int8)
    back[:, 0, :] = _INS
    back[:, :, 0] = _DEL
    jins = np.arange(m_max + 1, dtype=np.int64) * ins_w
    prev = np.broadcast_to(jins, (B, m_max + 1)).copy()  # row a = 0: insertions only
    full = np.empty((B, m_max + 1), np.int64)
    for a in range(1, n_max + 1):
        sub = prev[:, :-1] + np.where(ref[:, a - 1 : a] == hyp, 0, sub_w)
        dele = prev[:, 1:] + del_w
        full[:, 0] = a * del_w
        np.minimum(sub, dele, out=full[:, 1:])
        # D[b] = min(full[b], D[b-1] + ins)  <=>  D[b] = min_{k<=b} (full[k] - k*ins) + b*ins
        cur = np.minimum.accumulate(full - jins, axis=1) + jins
        ins = cur[:, :-1] + ins_w
        back[:, a, 1:] = np.where((sub <= dele) & (sub <= ins), _SUB, np.where(dele < ins, _DEL, _INS))
        prev = cur
    out = []
    for b in range(B):
        r, h = rids[b], hids[b]
        i, j = len(r), len(h)
        bk = back[b]
        seq = []
        while i > 0 or j > 0:
            c = bk[i, j]
            if c == _SUB:
                i -= 1
                j -= 1
                seq.append("C" if r[i] == h[j] else "S")
            elif c == _DEL:
                i -= 1
                seq.append("D")
            else:
                j -= 1
                seq.append("I")
        out.append("".join(reversed(seq)))
    return out
