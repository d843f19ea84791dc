"""The Matched Pairs Sentence-Segment Word Error (MAPSSWE) test, exactly as NIST ``sc_stats`` runs it.

Reference implementation: SCTK ``src/sclite/mtchprs.c`` (``test_comp_sents``, ``count_seg``) and
``statdist.c`` (``calc_mean_var_std_dev_Zstat``, ``Z_pass``). Both systems are aligned against the same
reference with sclite's alignment (:mod:`privasr.metrics.align`). Each sentence is then cut into
**segments**: stretches bounded by at least ``min_boundary`` consecutive words that *both* systems got
right, or by the sentence start/end; consecutive segments share their boundary words. sclite's state
machine is reproduced step by step, including its quirks:

* an insertion in either system counts as an error position and restarts the count of good words;
* a segment starts ``min_boundary - 1`` positions before the last both-correct word seen before the
  error (clamped to the sentence start), and positions are counted on each system's own alignment path;
* its reference length is ``(ref words in A's span + ref words in B's span) // 2``;
* trailing insertions of system B alone close a final segment;
* segments where neither system erred are dropped.

For segment *i*, ``d_i = errors_A - errors_B``; ``Z = mean(d) / (sd(d) / sqrt(n))`` with ``n - 1`` in
``sd``. As in sc_stats, ``Z = 0`` when all ``d_i`` are equal (zero variance), and the systems differ when
``|Z|`` exceeds the two-tailed critical value (1.960 at alpha = 0.05, from sclite's table); the system with
fewer errors (``mean < 0`` means A) is then the better one. The two-sided normal p-value is
``erfc(|Z| / sqrt 2)``; it underflows to 0.0 beyond ``|Z| ~ 38``, so ``log10_p`` is given as well.

Sentences are grouped by speaker (:func:`~privasr.corpus.formats.trn.spu_id` of the id, in order of first
appearance) and kept in input order within a speaker, which is sclite's segment order for sorted input.

>>> refs = [s.split() for s in ["the cat sat on the mat today", "hello world how are you"]]
>>> a = [s.split() for s in ["the cat sat on a mat today", "hello world how are you"]]
>>> b = [s.split() for s in ["the bat sat on the mat", "hello word how are you doing"]]
>>> r = mapsswe(refs, a, b, ids=["spk1-utt01", "spk2-utt04"])
>>> [(s.ref_words, s.errors_a, s.errors_b) for s in r.segments]
[(4, 0, 1), (5, 1, 1), (4, 0, 1), (2, 0, 1)]
>>> round(r.z, 3), r.better
(-3.0, 'A')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.special import log_ndtr, ndtri

from privasr.corpus.formats.trn import spu_id
from privasr.errors import InputError
from privasr.metrics.align import SCLITE_WEIGHTS, Alignment, align_many

__all__ = ["Segment", "MapssweResult", "mapsswe", "mapsswe_from_alignments", "segment_sentence", "z_test"]

# sclite's two-tailed critical values (statdist.c, Z2tail), by significance level.
_SCLITE_Z2TAIL = {0.01: 2.575, 0.02: 2.329, 0.03: 2.170, 0.04: 2.055, 0.05: 1.960,
                  0.06: 1.881, 0.07: 1.811, 0.08: 1.751, 0.09: 1.695, 0.10: 1.645}


@dataclass(frozen=True, slots=True)
class Segment:
    """One MAPSSWE segment.

    Attributes:
        sentence_id: the sentence (utterance) id.
        speaker: its speaker, or ``None`` when no ids were given.
        ref_words: reference words in the segment (sclite's ``(refA + refB) // 2``).
        errors_a, errors_b: word errors (substitutions, deletions, insertions) of each system in it.
        ref_start, ref_end: the reference words ``[ref_start, ref_end)`` it covers (from A's span).
        span_a, span_b: positions ``[start, end)`` on each system's alignment path.
    """

    sentence_id: str
    speaker: str | None
    ref_words: int
    errors_a: int
    errors_b: int
    ref_start: int
    ref_end: int
    span_a: tuple[int, int]
    span_b: tuple[int, int]

    @property
    def diff(self) -> int:
        """``errors_a - errors_b``."""
        return self.errors_a - self.errors_b


@dataclass(frozen=True, slots=True)
class MapssweResult:
    """The outcome of a MAPSSWE test of system A against system B.

    Attributes:
        segments: the segments, in speaker then sentence order.
        n: number of segments.
        sentences: number of sentences compared.
        ref_words, errors_a, errors_b: totals over the segments.
        pct_error_a, pct_error_b: ``100 * errors / ref_words`` over the segments (sclite's "% Error").
        mean, sd: mean and standard deviation (``n - 1``) of ``d_i = errors_a - errors_b``.
        z: the Z statistic (0.0 when ``sd == 0`` or ``n < 2``, as in sc_stats).
        p: two-sided normal p-value ``erfc(|z| / sqrt 2)`` (may underflow to 0.0).
        log10_p: ``log10(p)`` computed without underflow.
        alpha: significance level; critical_z: the ``|Z|`` threshold used.
        min_boundary: minimum number of both-correct words bounding a segment.
        better: ``"A"``, ``"B"`` or ``"same"``.
    """

    segments: tuple[Segment, ...]
    n: int
    sentences: int
    ref_words: int
    errors_a: int
    errors_b: int
    pct_error_a: float
    pct_error_b: float
    mean: float
    sd: float
    z: float
    p: float
    log10_p: float
    alpha: float
    critical_z: float
    min_boundary: int
    better: str

    @property
    def significant(self) -> bool:
        """Whether the systems differ at level ``alpha``."""
        return self.better != "same"

    @property
    def segments_per_sentence(self) -> float:
        """``n / sentences`` (sclite's "Seg per Sent")."""
        return self.n / self.sentences if self.sentences else 0.0


def segment_sentence(ops_a: str, ops_b: str, min_boundary: int = 2) -> list[tuple[int, int, int, int]]:
    """sclite's ``test_comp_sents`` on two alignment paths (op strings over the same reference).

    Returns ``(begin_a, end_a, begin_b, end_b)`` path positions per candidate segment, ends inclusive, begins
    already clamped at 0, including segments without errors (which :func:`mapsswe` then drops).

    >>> segment_sentence("CCCCSCC", "CSCCCCD")  # tiny/ example, sentence utt01
    [(0, 3, 0, 3), (2, 6, 2, 6)]
    """
    if min_boundary < 1:
        raise InputError(f"min_boundary is {min_boundary}", expected="an integer >= 1")
    n1, n2 = len(ops_a), len(ops_b)
    back = min_boundary - 1
    ind1 = ind2 = eog1 = eog2 = num_good = 0
    state = "b"
    segs: list[tuple[int, int, int, int]] = []
    while ind1 < n1:
        while ind1 < n1 and ops_a[ind1] == "I":
            ind1 += 1
            state = "e"
        while ind2 < n2 and ops_b[ind2] == "I":
            ind2 += 1
            state = "e"
        both = ind1 < n1 and ops_a[ind1] == "C" and ind2 < n2 and ops_b[ind2] == "C"
        if state == "b":
            if both:
                eog1, eog2 = ind1, ind2
            else:
                state = "e"
        elif both:  # state 'e' or 'g'
            num_good = 1 if state == "e" else num_good + 1
            if num_good == min_boundary:
                segs.append((max(eog1 - back, 0), ind1, max(eog2 - back, 0), ind2))
                eog1, eog2, state = ind1, ind2, "b"
            else:
                state = "g"
        elif state == "g":
            state = "e"
        if ind1 < n1:
            ind1 += 1
        if ind2 < n2:
            ind2 += 1
    if state != "b" or n2 > ind2:
        segs.append((max(eog1 - back, 0), n1 - 1, max(eog2 - back, 0), n2 - 1))
    return segs


def _critical_z(alpha: float) -> float:
    for a, z in _SCLITE_Z2TAIL.items():
        if abs(alpha - a) < 1e-12:
            return z
    return float(-ndtri(alpha / 2))


def z_test(diffs: Sequence[int], alpha: float = 0.05) -> tuple[float, float, float, float, float, str]:
    """sc_stats' statistic on per-segment differences: ``(mean, sd, z, p, log10_p, better)``.

    >>> m, sd, z, p, lp, better = z_test([-1, 0, -1, -1, 0, -1, -1])
    >>> round(m, 3), round(sd, 3), round(z, 3), better
    (-0.714, 0.488, -3.873, 'A')
    """
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha is {alpha}", expected="a significance level in (0, 1)")
    n = len(diffs)
    if n == 0:
        return 0.0, 0.0, 0.0, 1.0, 0.0, "same"
    mean = sum(diffs) / n
    ss = sum((d - mean) * (d - mean) for d in diffs)
    if ss != 0.0:
        sd = math.sqrt(ss / (n - 1))
        z = mean / (sd / math.sqrt(n))
    else:
        sd = z = 0.0
    p = math.erfc(abs(z) / math.sqrt(2.0))
    log10_p = float((log_ndtr(-abs(z)) + math.log(2.0)) / math.log(10.0))
    better = "same"
    if abs(z) > _critical_z(alpha):
        better = "A" if mean < 0 else "B"
    return mean, sd, z, p, log10_p, better


def _speaker_order(ids: Sequence[str]) -> list[int]:
    groups: dict[str, list[int]] = {}
    for k, i in enumerate(ids):
        groups.setdefault(spu_id(i), []).append(k)
    return [k for g in groups.values() for k in g]


def mapsswe_from_alignments(
    alignments_a: Sequence[Alignment],
    alignments_b: Sequence[Alignment],
    ids: Sequence[str] | None = None,
    *,
    min_boundary: int = 2,
    alpha: float = 0.05,
    same_references: bool = True,
) -> MapssweResult:
    """MAPSSWE from precomputed sclite-style alignments of both systems against the same references.

    ``same_references=False`` lets the two alignments of a sentence hold different reference words: with
    sclite's alternations (:mod:`privasr.metrics.sclite`) each system may take another branch, and sc_stats
    segments the two paths all the same (a segment's reference words are the mean of both sides').

    >>> from privasr.metrics.align import align_many
    >>> A = align_many([["a", "b", "c"]], [["a", "x", "c"]])
    >>> B = align_many([["a", "b", "c"]], [["a", "b", "c"]])
    >>> r = mapsswe_from_alignments(A, B)
    >>> [(s.ref_words, s.errors_a, s.errors_b) for s in r.segments], r.z
    ([(3, 1, 0)], 0.0)
    """
    if len(alignments_a) != len(alignments_b):
        raise InputError(f"{len(alignments_a)} alignments for system A but {len(alignments_b)} for B")
    n = len(alignments_a)
    if ids is None:
        names = [str(k) for k in range(n)]
        order = list(range(n))
    else:
        names = list(ids)
        if len(names) != n:
            raise InputError(f"{len(names)} ids for {n} sentences", expected="one id per sentence")
        if len(set(names)) != n:
            raise InputError("duplicate sentence ids", expected="unique ids")
        order = _speaker_order(names)
    segs: list[Segment] = []
    for k in order:
        a, b = alignments_a[k], alignments_b[k]
        if same_references and a.ref != b.ref:
            raise InputError(f"sentence {names[k]}: the two alignments have different references")
        oa, ob = a.ops, b.ops
        for b1, e1, b2, e2 in segment_sentence(oa, ob, min_boundary):
            sa, sb = oa[b1 : e1 + 1], ob[b2 : e2 + 1]
            err_a = len(sa) - sa.count("C")
            err_b = len(sb) - sb.count("C")
            if err_a == 0 and err_b == 0:
                continue
            ref_a = len(sa) - sa.count("I")
            ref_b = len(sb) - sb.count("I")
            r0 = b1 - oa[:b1].count("I")
            segs.append(Segment(
                sentence_id=names[k], speaker=None if ids is None else spu_id(names[k]),
                ref_words=(ref_a + ref_b) // 2, errors_a=err_a, errors_b=err_b,
                ref_start=r0, ref_end=r0 + ref_a, span_a=(b1, e1 + 1), span_b=(b2, e2 + 1),
            ))
    mean, sd, z, p, log10_p, better = z_test([s.diff for s in segs], alpha)
    tot_ref = sum(s.ref_words for s in segs)
    tot_a = sum(s.errors_a for s in segs)
    tot_b = sum(s.errors_b for s in segs)
    return MapssweResult(
        segments=tuple(segs), n=len(segs), sentences=n, ref_words=tot_ref, errors_a=tot_a, errors_b=tot_b,
        pct_error_a=100.0 * tot_a / tot_ref if tot_ref else 0.0,
        pct_error_b=100.0 * tot_b / tot_ref if tot_ref else 0.0,
        mean=mean, sd=sd, z=z, p=p, log10_p=log10_p, alpha=alpha, critical_z=_critical_z(alpha),
        min_boundary=min_boundary, better=better,
    )


def mapsswe(
    refs: Sequence[Sequence[str]],
    hyps_a: Sequence[Sequence[str]],
    hyps_b: Sequence[Sequence[str]],
    ids: Sequence[str] | None = None,
    *,
    min_boundary: int = 2,
    alpha: float = 0.05,
    weights: Sequence[int] = SCLITE_WEIGHTS,
) -> MapssweResult:
    """MAPSSWE test of system A against system B on the same references (matched by position).

    Args:
        refs: reference word sequences.
        hyps_a, hyps_b: each system's hypothesis per reference.
        ids: sentence ids (give them to group segments by speaker like sclite); default ``"0", "1", ...``.
        min_boundary: minimum number of consecutive both-correct words that bound a segment (sclite: 2).
        alpha: significance level (sclite: 0.05).
        weights: alignment weights (sclite: substitution 4, insertion 3, deletion 3).

    >>> r = mapsswe([["a", "b"]] * 3, [["a", "b"], ["a", "x"], ["y", "b"]], [["a", "b"]] * 3)
    >>> r.n, r.errors_a, r.errors_b, r.better
    (2, 2, 0, 'same')
    """
    if not len(refs) == len(hyps_a) == len(hyps_b):
        raise InputError(f"{len(refs)} references, {len(hyps_a)} hypotheses for A and {len(hyps_b)} for B",
                         expected="one hypothesis per reference for each system")
    return mapsswe_from_alignments(align_many(refs, hyps_a, weights=weights),
                                   align_many(refs, hyps_b, weights=weights),
                                   ids, min_boundary=min_boundary, alpha=alpha)
