"""Oracle (best-in-list) and first-pass 1-best WER of N-best lists.

The oracle picks, per utterance, the hypothesis with the fewest word errors (Levenshtein distance on
words, rapidfuzz's C++ implementation) against the reference; ties go to the better-ranked hypothesis.
An empty list counts as the empty hypothesis (all reference words deleted).

>>> from privasr.corpus.records import Hypothesis, NBest
>>> nb = NBest("u1", (Hypothesis.from_text("a x c"), Hypothesis.from_text("a b c")), ref=("a", "b", "c"))
>>> onebest_wer([nb]).wer, oracle_wer([nb]).wer, oracle_indices([nb])
(0.3333333333333333, 0.0, (1,))
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rapidfuzz.distance import Levenshtein

from privasr.corpus.records import NBest
from privasr.errors import InputError
from privasr.metrics.wer import Aligner, WerResult, wer

__all__ = ["oracle_wer", "onebest_wer", "oracle_indices", "ref_in_list"]


def _with_refs(nbests: Iterable[NBest]) -> list[NBest]:
    out = []
    for k, nb in enumerate(nbests):
        if not isinstance(nb, NBest):
            raise InputError(f"item {k} is {type(nb).__name__}", expected="NBest records")
        if nb.ref is None:
            raise InputError(f"utterance {nb.utt_id} has no reference", expected="a reference for every utterance")
        out.append(nb)
    return out


def _check_k(top_k: int | None) -> None:
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise InputError(f"top_k is {top_k!r}", expected="None or an integer >= 1")


def _choose(nbests: list[NBest], top_k: int | None) -> tuple[int, ...]:
    out = []
    for nb in nbests:
        hyps = nb.hyps if top_k is None else nb.hyps[:top_k]
        best, best_d = -1, len(nb.ref or ())  # the empty hypothesis costs len(ref) deletions
        for i, h in enumerate(hyps):
            d = Levenshtein.distance(nb.ref, h.words, score_cutoff=best_d if best >= 0 else None)
            if best < 0 or d < best_d:
                best, best_d = i, d
            if best_d == 0:
                break
        out.append(best)
    return tuple(out)


def oracle_indices(nbests: Iterable[NBest], top_k: int | None = None) -> tuple[int, ...]:
    """Per utterance, the index of the oracle hypothesis (``-1`` for an empty list).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> oracle_indices([NBest("u", (), ref=("a",))])
    (-1,)
    """
    _check_k(top_k)
    return _choose(_with_refs(nbests), top_k)


def oracle_wer(nbests: Iterable[NBest], top_k: int | None = None, *, aligner: Aligner = "sclite") -> WerResult:
    """WER of the best hypothesis in each list (optionally among the first ``top_k``).

    Raises :class:`InputError` naming an utterance without a reference.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> nb = NBest("u1", (Hypothesis.from_text("a"), Hypothesis.from_text("a b")), ref=("a", "b"))
    >>> oracle_wer([nb]).errors, oracle_wer([nb], top_k=1).errors
    (0, 1)
    """
    _check_k(top_k)
    nbs = _with_refs(nbests)
    idx = _choose(nbs, top_k)
    return wer([nb.ref or () for nb in nbs], [nb.hyps[i].words if i >= 0 else () for nb, i in zip(nbs, idx, strict=True)],
               aligner=aligner)


def onebest_wer(nbests: Iterable[NBest], *, aligner: Aligner = "sclite") -> WerResult:
    """WER of the first-ranked hypothesis of each list (an empty list is the empty hypothesis).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> onebest_wer([NBest("u1", (), ref=("a", "b"))]).deletions
    2
    """
    nbs = _with_refs(nbests)
    return wer([nb.ref or () for nb in nbs], [nb.best.words for nb in nbs], aligner=aligner)


def ref_in_list(nbests: Sequence[NBest]) -> float:
    """The share of utterances whose non-empty reference is one of their hypotheses (what a perfect LM could
    pick); utterances without a reference count as misses. 0.0 for no utterances.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> ref_in_list([NBest("u", (Hypothesis.from_text("a b"),), ref=("a", "b")), NBest("v", (), ref=("c",))])
    0.5
    """
    if not nbests:
        return 0.0
    return sum(bool(nb.ref) and any(h.words == nb.ref for h in nb.hyps) for nb in nbests) / len(nbests)
