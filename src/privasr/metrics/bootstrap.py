"""Paired bootstrap confidence interval for the WER difference of two systems (Bisani & Ney, 2004).

Utterances are resampled with replacement (the same resample for both systems); in each resample both
WERs are recomputed from the per-utterance error and reference-word counts, so nothing is realigned. The
interval is the percentile interval of ``WER_A - WER_B`` over the resamples, and ``prob_a_better`` is the
fraction of resamples where A made strictly fewer errors than B (Bisani & Ney's "probability of
improvement"). Vectorised with numpy and seeded through :func:`numpy.random.default_rng`.

>>> r = paired_bootstrap([1, 0, 2, 0], [2, 1, 2, 1], [5, 5, 5, 5], seed=0, resamples=200)
>>> r.difference, r.ci_low <= r.difference <= r.ci_high, r.resamples
(-0.15, True, 200)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from privasr.errors import InputError
from privasr.metrics.wer import WerResult, error_rate

__all__ = ["BootstrapResult", "paired_bootstrap", "draw_mean_bootstrap", "bootstrap_wer_difference",
           "difference_interval"]

_MAX_DRAWS = 4_000_000  # indices drawn per numpy batch


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    """Paired bootstrap of ``WER_A - WER_B``.

    Attributes:
        wer_a, wer_b: the observed WERs.
        difference: the observed ``wer_a - wer_b``.
        ci_low, ci_high: the percentile confidence interval of the difference.
        confidence: the interval's coverage (e.g. 0.95).
        prob_a_better: fraction of resamples where A had fewer errors than B.
        resamples: number of bootstrap resamples.
        seed: the seed used.
    """

    wer_a: float
    wer_b: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    prob_a_better: float
    resamples: int
    seed: int | None


def difference_interval(ci_low: float | None, ci_high: float | None, confidence: float = 0.95) -> str:
    """An interval of ``WER(system) - WER(baseline)`` (fractions) in words, in WER points, labelled the way every
    privasr report labels it; ``"n/a"`` when either end is missing.

    >>> difference_interval(-0.0548, -0.0465)
    '95% CI of system minus baseline: [-5.48, -4.65] WER points'
    """
    if ci_low is None or ci_high is None:
        return "n/a"
    return f"{100 * confidence:.0f}% CI of system minus baseline: [{100 * ci_low:+.2f}, {100 * ci_high:+.2f}] WER points"


def _counts(x: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise InputError(f"{what} must be a list of integer counts")
    if a.size and a.min() < 0:
        raise InputError(f"{what} contains a negative count", expected="counts >= 0")
    return a.astype(np.int64)


def _rates(err: np.ndarray, ref: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = err / ref
    return np.where(ref > 0, r, np.where(err > 0, np.inf, 0.0))


def paired_bootstrap(
    errors_a: Sequence[int] | np.ndarray,
    errors_b: Sequence[int] | np.ndarray,
    ref_words: Sequence[int] | np.ndarray,
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
    ref_words_b: Sequence[int] | np.ndarray | None = None,
) -> BootstrapResult:
    """Paired bootstrap CI of the WER difference from per-utterance counts.

    Args:
        errors_a, errors_b: word errors of each system per utterance.
        ref_words: reference words per utterance (system A's when ``ref_words_b`` is given).
        ref_words_b: system B's reference words per utterance, where they differ from A's (references with
            sclite's alternations, where each system may take another branch); ``None``: the same as A's.
        resamples: number of bootstrap resamples (default 1000).
        confidence: coverage of the interval (default 0.95).
        seed: seed of the numpy random generator (``None``: fresh entropy, not reproducible).

    >>> r = paired_bootstrap([1, 2], [1, 2], [3, 3], seed=1)
    >>> r.ci_low, r.ci_high, r.prob_a_better
    (0.0, 0.0, 0.0)
    """
    ea, eb, rw = _counts(errors_a, "errors_a"), _counts(errors_b, "errors_b"), _counts(ref_words, "ref_words")
    rb = rw if ref_words_b is None else _counts(ref_words_b, "ref_words_b")
    if not len(ea) == len(eb) == len(rw) == len(rb):
        raise InputError(f"count lists differ in length ({len(ea)}, {len(eb)}, {len(rw)}, {len(rb)})",
                         expected="one count per utterance for each list")
    if len(ea) == 0:
        raise InputError("no utterances to resample")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise InputError(f"resamples is {resamples!r}", expected="an integer >= 1")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence is {confidence!r}", expected="a number in (0, 1)")
    n = len(ea)
    wa = error_rate(int(ea.sum()), int(rw.sum()))
    wb = error_rate(int(eb.sum()), int(rb.sum()))
    rng = np.random.default_rng(seed)
    diffs = np.empty(resamples)
    a_better = 0
    per_batch = max(1, _MAX_DRAWS // n)
    done = 0
    while done < resamples:
        m = min(per_batch, resamples - done)
        idx = rng.integers(0, n, size=(m, n))
        sa, sb, sr = ea[idx].sum(axis=1), eb[idx].sum(axis=1), rw[idx].sum(axis=1)
        srb = sr if rb is rw else rb[idx].sum(axis=1)
        ra, rbb = _rates(sa, sr), _rates(sb, srb)
        with np.errstate(invalid="ignore"):
            diffs[done : done + m] = ra - rbb
        a_better += int((sa < sb).sum() if rb is rw else (ra < rbb).sum())
        done += m
    tail = (1.0 - confidence) / 2.0
    finite = diffs[np.isfinite(diffs)]
    if finite.size:
        lo, hi = np.quantile(finite, [tail, 1.0 - tail])
    else:
        lo = hi = math.nan
    diff = wa - wb if math.isfinite(wa) and math.isfinite(wb) else math.nan
    return BootstrapResult(wer_a=wa, wer_b=wb, difference=diff, ci_low=float(lo), ci_high=float(hi),
                           confidence=confidence, prob_a_better=a_better / resamples, resamples=resamples,
                           seed=seed)


def draw_mean_bootstrap(
    draw_errors: Sequence[Sequence[int] | np.ndarray],
    base_errors: Sequence[int] | np.ndarray,
    ref_words: Sequence[int] | np.ndarray,
    *,
    resamples: int = 1000,
    confidence: float = 0.95,
    seed: int | None = 0,
) -> BootstrapResult:
    """Paired bootstrap CI of the change of a system's mean WER over repeated draws (e.g. DP noise draws) against
    a baseline run once: the draws' summed per-utterance errors against ``R`` times the baseline's, over ``R``
    times the reference words, so each resample's difference is the draw-mean's WER minus the baseline's.

    >>> r = draw_mean_bootstrap([[1, 0], [1, 2]], [2, 1], [5, 5], seed=0)  # mean WER 0.2 against 0.3
    >>> round(r.difference, 6)
    -0.1
    """
    if not draw_errors:
        raise InputError("no draws", expected="the per-utterance errors of one run or more")
    draws = [_counts(e, "draw_errors") for e in draw_errors]
    if len({len(e) for e in draws}) != 1:
        raise InputError("the draws' error lists differ in length", expected="one count per utterance in every draw")
    total = np.sum(draws, axis=0)
    r = len(draws)
    return paired_bootstrap(total, r * _counts(base_errors, "base_errors"), r * _counts(ref_words, "ref_words"),
                            resamples=resamples, confidence=confidence, seed=seed)


def bootstrap_wer_difference(
    a: WerResult, b: WerResult, *, resamples: int = 1000, confidence: float = 0.95, seed: int | None = 0,
    same_references: bool = True,
) -> BootstrapResult:
    """:func:`paired_bootstrap` on two :class:`~privasr.metrics.wer.WerResult` of the same utterances.

    ``same_references=False`` accepts per-utterance reference words that differ between the systems (sclite's
    alternations: each system's alignment may take another branch); the number of utterances must still agree.

    >>> from privasr.metrics.wer import wer
    >>> refs = [["a", "b"], ["c"]]
    >>> r = bootstrap_wer_difference(wer(refs, [["a", "b"], ["c"]]), wer(refs, [["a"], ["x"]]), seed=3)
    >>> round(r.difference, 4), r.ci_high <= 0
    (-0.6667, True)
    """
    if same_references and a.utt_ref_words != b.utt_ref_words:
        raise InputError("the two results are not on the same utterances (per-utterance reference words differ)")
    if len(a.utt_ref_words) != len(b.utt_ref_words):
        raise InputError(f"the two results hold {len(a.utt_ref_words)} and {len(b.utt_ref_words)} utterances",
                         expected="the same utterances")
    return paired_bootstrap(a.utt_errors, b.utt_errors, a.utt_ref_words, resamples=resamples,
                            confidence=confidence, seed=seed,
                            ref_words_b=None if a.utt_ref_words == b.utt_ref_words else b.utt_ref_words)
