"""Word error rate, with per-utterance counts kept for bootstrap and per-client breakdowns.

:func:`wer` aligns as NIST sclite does by default (:mod:`privasr.metrics.align`, sclite's weighted alignment), so
every S/D/I figure privasr reports comes from one alignment and matches sclite's Corr/Sub/Del/Ins;
``aligner="jiwer"`` uses jiwer 4 instead (``process_words``, rapidfuzz's C++ Levenshtein, unit costs). Both give
the minimum number of word errors per sentence in practice; they can split those errors differently between
substitutions, deletions and insertions (sclite counts a substitution as 4 and an insertion or deletion as 3,
so it prefers ``D + I`` to two substitutions).

Conventions (those of sclite): an empty reference scores every hypothesis word as an insertion, an empty
hypothesis every reference word as a deletion. WER is ``errors / ref_words``; with no reference words it
is ``0.0`` when there are no errors and ``inf`` otherwise.

>>> r = wer([["a", "b", "c"], ["d"]], [["a", "x", "c"], []])
>>> r.ref_words, r.hits, r.substitutions, r.deletions, r.insertions, r.wer
(4, 2, 1, 1, 0, 0.5)
>>> r.utt_errors, r.sentence_errors, r.ser
((1, 1), 2, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import jiwer
import numpy as np

from privasr.corpus.records import check_words
from privasr.errors import InputError
from privasr.metrics.align import Alignment, align_many

if TYPE_CHECKING:
    from privasr.metrics.sclite import Conventions

__all__ = ["WerResult", "wer", "wer_from_alignments", "wer_from_counts", "error_rate"]

Aligner = Literal["jiwer", "sclite"]

_TRANSFORM = jiwer.transforms.ReduceToListOfListOfWords()


def error_rate(errors: int, ref_words: int) -> float:
    """``errors / ref_words``; ``0.0`` for no errors on no words, ``inf`` for errors on no words.

    >>> error_rate(1, 4), error_rate(0, 0), error_rate(2, 0)
    (0.25, 0.0, inf)
    """
    if ref_words > 0:
        return errors / ref_words
    return 0.0 if errors == 0 else math.inf


@dataclass(frozen=True, slots=True)
class WerResult:
    """Word error counts over a set of utterances.

    Attributes:
        ref_words: number of reference words (``hits + substitutions + deletions``).
        hits, substitutions, deletions, insertions: totals over all utterances.
        errors: ``substitutions + deletions + insertions``.
        wer: ``errors / ref_words`` (see :func:`error_rate` for ``ref_words == 0``).
        sentences: number of utterances.
        sentence_errors: utterances with at least one error.
        ser: ``sentence_errors / sentences`` (0.0 when there are no utterances).
        utt_ref_words, utt_hits, utt_substitutions, utt_deletions, utt_insertions, utt_errors: the same
            counts per utterance, in input order, so that bootstrap and breakdowns need not realign.
        alignments: per utterance, jiwer ``AlignmentChunk`` lists when asked for, else ``None``.
    """

    ref_words: int
    hits: int
    substitutions: int
    deletions: int
    insertions: int
    errors: int
    wer: float
    sentences: int
    sentence_errors: int
    ser: float
    utt_ref_words: tuple[int, ...]
    utt_hits: tuple[int, ...]
    utt_substitutions: tuple[int, ...]
    utt_deletions: tuple[int, ...]
    utt_insertions: tuple[int, ...]
    utt_errors: tuple[int, ...]
    alignments: tuple[tuple[Any, ...], ...] | None = field(default=None, repr=False, compare=False)

    def subset(self, indices: Iterable[int]) -> WerResult:
        """The result restricted to some utterances (e.g. one client's), without realigning.

        >>> r = wer([["a"], ["b", "c"]], [["a"], ["b"]])
        >>> r.subset([1]).wer
        0.5
        """
        idx = list(indices)
        ali = None if self.alignments is None else [self.alignments[i] for i in idx]
        return wer_from_counts(
            [self.utt_hits[i] for i in idx], [self.utt_substitutions[i] for i in idx],
            [self.utt_deletions[i] for i in idx], [self.utt_insertions[i] for i in idx], alignments=ali,
        )

    def as_dict(self, per_utterance: bool = False) -> dict[str, Any]:
        """A JSON-ready dict of the totals (non-finite rates become ``None``).

        >>> wer([["a"]], [["b"]]).as_dict()["substitutions"]
        1
        """
        d: dict[str, Any] = {
            k: getattr(self, k)
            for k in ("ref_words", "hits", "substitutions", "deletions", "insertions", "errors", "wer",
                      "sentences", "sentence_errors", "ser")
        }
        for k in ("wer", "ser"):
            if not math.isfinite(d[k]):
                d[k] = None
        if per_utterance:
            for k in ("utt_ref_words", "utt_hits", "utt_substitutions", "utt_deletions", "utt_insertions",
                      "utt_errors"):
                d[k] = list(getattr(self, k))
        return d


def wer_from_counts(
    hits: Sequence[int],
    substitutions: Sequence[int],
    deletions: Sequence[int],
    insertions: Sequence[int],
    *,
    alignments: Sequence[Any] | None = None,
) -> WerResult:
    """Build a :class:`WerResult` from per-utterance counts.

    >>> wer_from_counts([3, 0], [1, 0], [0, 0], [0, 2]).wer
    0.75
    """
    h = tuple(int(x) for x in hits)
    s = tuple(int(x) for x in substitutions)
    d = tuple(int(x) for x in deletions)
    i = tuple(int(x) for x in insertions)
    if not len(h) == len(s) == len(d) == len(i):
        raise InputError("per-utterance count lists differ in length")
    if any(x < 0 for x in h + s + d + i):
        raise InputError("negative word count", expected="counts >= 0")
    ref = tuple(a + b + c for a, b, c in zip(h, s, d, strict=True))
    err = tuple(a + b + c for a, b, c in zip(s, d, i, strict=True))
    n_ref, n_err = sum(ref), sum(err)
    n = len(h)
    sent_err = sum(1 for e in err if e > 0)
    return WerResult(
        ref_words=n_ref, hits=sum(h), substitutions=sum(s), deletions=sum(d), insertions=sum(i),
        errors=n_err, wer=error_rate(n_err, n_ref), sentences=n, sentence_errors=sent_err,
        ser=sent_err / n if n else 0.0, utt_ref_words=ref, utt_hits=h, utt_substitutions=s,
        utt_deletions=d, utt_insertions=i, utt_errors=err,
        alignments=None if alignments is None else tuple(tuple(a) for a in alignments),
    )


def _chunks_from_ops(ops: str) -> list[Any]:
    names = {"C": "equal", "S": "substitute", "D": "delete", "I": "insert"}
    out: list[Any] = []
    i = j = k = 0
    while k < len(ops):
        op = ops[k]
        run = k
        while run < len(ops) and ops[run] == op:
            run += 1
        n = run - k
        di = 0 if op == "I" else n
        dj = 0 if op == "D" else n
        out.append(jiwer.AlignmentChunk(type=names[op], ref_start_idx=i, ref_end_idx=i + di,
                                        hyp_start_idx=j, hyp_end_idx=j + dj))
        i, j, k = i + di, j + dj, run
    return out


def wer_from_alignments(alignments: Sequence[Alignment], *, return_alignments: bool = False) -> WerResult:
    """Count errors from sclite-style :class:`~privasr.metrics.align.Alignment` records.

    >>> from privasr.metrics.align import align_many
    >>> wer_from_alignments(align_many([["a", "b"]], [["b", "c"]])).as_dict()["deletions"]
    1
    """
    return wer_from_counts(
        [a.hits for a in alignments], [a.substitutions for a in alignments],
        [a.deletions for a in alignments], [a.insertions for a in alignments],
        alignments=[_chunks_from_ops(a.ops) for a in alignments] if return_alignments else None,
    )


def wer(
    refs: Sequence[Sequence[str]],
    hyps: Sequence[Sequence[str]],
    *,
    return_alignments: bool = False,
    aligner: Aligner = "sclite",
    conventions: Conventions | None = None,
) -> WerResult:
    """Word error rate of hypotheses against references (one word sequence per utterance each).

    Args:
        refs: reference word sequences.
        hyps: hypothesis word sequences, one per reference, in the same order.
        return_alignments: also return jiwer ``AlignmentChunk`` lists per utterance.
        aligner: ``"sclite"`` (sclite's weighted alignment, the default) or ``"jiwer"`` (Levenshtein, unit
            costs).
        conventions: sclite's transcript conventions (:class:`privasr.metrics.sclite.Conventions`: alternations,
            ``@``, optionally deletable words, fragments, case folding); ``None`` compares every token as an
            exact word. With ``aligner="jiwer"`` only case folding applies, and markup is an error.

    Raises:
        InputError: if the lists differ in length, a token is empty, not a str, or contains whitespace, or the
            markup is malformed (or used with the jiwer aligner).

    >>> from privasr.metrics.sclite import SCLITE
    >>> wer([["I've", "{", "um", "/", "@", "}", "won"]], [["i've", "won"]], aligner="sclite", conventions=SCLITE).wer
    0.0

    >>> wer([["hello", "world"]], [["hello", "word", "again"]]).errors
    2
    >>> wer([[]], [["uh"]]).insertions, wer([[]], [["uh"]]).wer
    (1, inf)
    >>> wer([["a"]], [])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: 1 references but 0 hypotheses (expected one hypothesis per reference)
    """
    if isinstance(refs, str) or isinstance(hyps, str):
        raise InputError("refs and hyps must be sequences of word sequences, not strings")
    refs, hyps = list(refs), list(hyps)
    if len(refs) != len(hyps):
        raise InputError(f"{len(refs)} references but {len(hyps)} hypotheses", expected="one hypothesis per reference")
    R = [check_words(r, f"reference {k}") for k, r in enumerate(refs)]
    H = [check_words(h, f"hypothesis {k}") for k, h in enumerate(hyps)]
    if aligner not in ("jiwer", "sclite"):
        raise InputError(f"unknown aligner {aligner!r}", expected="'jiwer' or 'sclite'")
    if conventions is not None:
        from privasr.corpus.markup import has_markup
        from privasr.metrics.sclite import align_sclite

        if aligner == "sclite":
            return wer_from_alignments(align_sclite(R, H, conventions), return_alignments=return_alignments)
        if conventions.markup:
            for k, w in enumerate((*R, *H)):
                if has_markup(w):
                    side = "reference" if k < len(R) else "hypothesis"
                    raise InputError(f"{side} {k % len(R) + 1} uses sclite's alternations or '@'",
                                     expected="the sclite aligner for markup (the jiwer aligner compares words only)")
        if not conventions.case_sensitive:
            R = [tuple(w.lower() for w in r) for r in R]
            H = [tuple(w.lower() for w in h) for h in H]
    if aligner == "sclite":
        return wer_from_alignments(align_many(R, H), return_alignments=return_alignments)
    n = len(R)
    hits = np.zeros(n, np.int64)
    subs = np.zeros(n, np.int64)
    dels = np.zeros(n, np.int64)
    ins = np.zeros(n, np.int64)
    chunks: list[Any] = [None] * n
    todo = []
    for k, (r, h) in enumerate(zip(R, H, strict=True)):
        if not r or not h:  # handled here: jiwer versions differ on empty strings
            dels[k], ins[k] = len(r), len(h)
            if return_alignments:
                chunks[k] = _chunks_from_ops("D" * len(r) + "I" * len(h))
        else:
            todo.append(k)
    if todo:
        out = jiwer.process_words([" ".join(R[k]) for k in todo], [" ".join(H[k]) for k in todo],
                                  reference_transform=_TRANSFORM, hypothesis_transform=_TRANSFORM)
        for k, sent in zip(todo, out.alignments, strict=True):
            for c in sent:
                t = c.type
                if t == "equal":
                    hits[k] += c.ref_end_idx - c.ref_start_idx
                elif t == "substitute":
                    subs[k] += c.ref_end_idx - c.ref_start_idx
                elif t == "delete":
                    dels[k] += c.ref_end_idx - c.ref_start_idx
                else:
                    ins[k] += c.hyp_end_idx - c.hyp_start_idx
            if return_alignments:
                chunks[k] = sent
    return wer_from_counts(hits, subs, dels, ins, alignments=chunks if return_alignments else None)
