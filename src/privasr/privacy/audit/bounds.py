"""Empirical epsilon lower bounds from a membership attack's error rates (Jagielski et al. 2020; Nasr et al. 2021).

If a mechanism ``M`` is (epsilon, delta)-DP, every test that decides "member" (the unit was in the data, ``D``)
or "non-member" (it was not, ``D'``) from ``M``'s output has, for both directions of the neighbouring pair,

    TPR <= e^epsilon FPR + delta        and        TNR <= e^epsilon FNR + delta,

so an attack's false-positive and false-negative rates *lower-bound* epsilon:

    epsilon >= max(log((1 - delta - FNR) / FPR), log((1 - delta - FPR) / FNR), 0).

The rates are measured on finitely many trials, so the bound uses upper confidence limits on FPR and FNR
(Clopper-Pearson, :func:`clopper_pearson`) in their place: with probability at least ``confidence`` (over the
trials) the true epsilon is at least the reported ``eps_lb``. The audit never claims more leakage than the
trials support; a weak attack, or too few trials, gives a small (or zero) bound, not a wrong one.

Clopper-Pearson treats the decisions as independent Bernoulli draws, so each trial must be an independent
release of the mechanism (its own noise draw) on a pair of neighbouring inputs: ``D`` with the unit under
test, ``D'`` without it, differing in exactly what the mechanism's epsilon is accounted for (one
contribution, clipped or capped as in the run). Many units tested against one shared release are not
independent trials, and the bound then need not hold as stated.

:func:`threshold_attack` turns membership scores (higher = "more likely a member") into an :class:`AuditResult`,
choosing the decision threshold on one random half of the trials and counting errors on the other half only.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> members, others = 1.0 + rng.laplace(0, 1, 4000), rng.laplace(0, 1, 4000)   # a count behind eps=1 Laplace
>>> result = threshold_attack(members, others, rng=rng)
>>> 0.0 < result.eps_lb <= 1.0
True
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from privasr.errors import ConfigError, InputError

__all__ = ["clopper_pearson", "epsilon_lower_bound", "AuditResult", "threshold_attack"]


# ------------------------------------------------------------------------------------------------ checks


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise InputError(f"{name} must be a count (an integer >= 0), got {value!r}")
    return int(value)


def _confidence(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"confidence must be a number in (0, 1), got {value!r}", expected="e.g. 0.95")
    return float(value)


def _delta(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(f"delta must be a number in [0, 1), got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------------ Clopper-Pearson


def _cp_upper(k: np.ndarray, n: np.ndarray, alpha: float) -> np.ndarray:
    """One-sided upper Clopper-Pearson limits at level ``1 - alpha``, vectorised (1 where ``k == n``)."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    full = k >= n
    hi = stats.beta.ppf(1.0 - alpha, k + 1.0, np.where(full, 1.0, n - k))
    return np.where(full, 1.0, hi)


def clopper_pearson(k: int, n: int, confidence: float = 0.95, *, two_sided: bool = True) -> tuple[float, float]:
    """The exact (Clopper-Pearson) confidence interval ``(lo, hi)`` of a binomial proportion: ``k`` of ``n``.

    Built from quantiles of the Beta distribution (:data:`scipy.stats.beta`)::

        lo = Beta.ppf(a, k, n - k + 1)        (0 when k == 0)
        hi = Beta.ppf(1 - a, k + 1, n - k)    (1 when k == n)

    * ``two_sided=True`` (the default): ``a = (1 - confidence) / 2``; ``[lo, hi]`` covers the true proportion
      with probability at least ``confidence`` -- the interval of statsmodels'
      ``proportion_confint(k, n, alpha=1 - confidence, method="beta")``.
    * ``two_sided=False``: ``a = 1 - confidence``; then ``lo`` alone is a one-sided lower bound, and ``hi``
      alone a one-sided upper bound, each holding with probability at least ``confidence`` (use one of them,
      not the pair).

    Raises:
        InputError: ``k`` or ``n`` not integers, ``n == 0`` or ``k > n``.
        ConfigError: ``confidence`` outside (0, 1).

    >>> lo, hi = clopper_pearson(5, 20)
    >>> round(lo, 4), round(hi, 4)
    (0.0866, 0.491)
    >>> clopper_pearson(0, 10)[0], round(clopper_pearson(0, 10)[1], 4)   # hi = 1 - 0.025 ** (1 / 10)
    (0.0, 0.3085)
    >>> round(clopper_pearson(0, 10, two_sided=False)[1], 4)            # one-sided: 1 - 0.05 ** (1 / 10)
    0.2589
    """
    k, n = _count("k", k), _count("n", n)
    if n == 0:
        raise InputError("no trials (n = 0): a proportion needs at least one trial")
    if k > n:
        raise InputError(f"k = {k} successes out of n = {n} trials", expected="0 <= k <= n")
    confidence = _confidence(confidence)
    a = (1.0 - confidence) / 2.0 if two_sided else 1.0 - confidence
    lo = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    hi = float(_cp_upper(np.array(k), np.array(n), a))
    return lo, hi


# -------------------------------------------------------------------------------------------- the bound


def _eps_from_upper(fpr_hi: np.ndarray, fnr_hi: np.ndarray, delta: float) -> np.ndarray:
    """``max(log((1 - delta - fnr_hi) / fpr_hi), log((1 - delta - fpr_hi) / fnr_hi), 0)``, vectorised."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr_hi, 0.0) / fpr_hi)
        b = np.log(np.maximum(1.0 - delta - fpr_hi, 0.0) / fnr_hi)
    return np.maximum(np.maximum(np.nan_to_num(a, nan=0.0, neginf=0.0), np.nan_to_num(b, nan=0.0, neginf=0.0)), 0.0)


def _upper_limits(tp: Any, fn: Any, fp: Any, tn: Any, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Upper limits of FPR and FNR that hold *together* with probability >= ``confidence`` (union bound)."""
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = _cp_upper(np.asarray(fp), np.asarray(fp) + np.asarray(tn), alpha)
    fnr_hi = _cp_upper(np.asarray(fn), np.asarray(fn) + np.asarray(tp), alpha)
    return fpr_hi, fnr_hi


def epsilon_lower_bound(tp: int, fn: int, fp: int, tn: int, delta: float = 0.0, confidence: float = 0.95) -> float:
    """The epsilon that an attack with these outcome counts proves, with probability at least ``confidence``.

    ``tp``/``fn``: member trials decided member/non-member; ``fp``/``tn``: non-member trials decided
    member/non-member. With ``FPR_hi`` and ``FNR_hi`` upper Clopper-Pearson limits of ``fp / (fp + tn)`` and
    ``fn / (fn + tp)``::

        eps_lb = max(log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi), 0)

    (a term whose numerator is not positive is dropped). Both limits must hold at once, so each is a one-sided
    limit at level ``1 - (1 - confidence) / 2`` -- the upper end of the two-sided ``confidence`` interval of
    :func:`clopper_pearson` -- and by the union bound the pair, and so ``eps_lb``, holds with probability at
    least ``confidence``. A Clopper-Pearson upper limit is never 0 (``k = 0`` of ``n`` gives
    ``1 - (alpha)^(1/n)``), so the bound is finite: at most about ``log(n / 3.7)`` at 95% even for a perfect
    attack. An attack no better than chance gives 0.

    Raises:
        InputError: a count that is not an integer >= 0, or no member or no non-member trials.
        ConfigError: ``delta`` outside [0, 1) or ``confidence`` outside (0, 1).

    >>> round(epsilon_lower_bound(tp=5000, fn=0, fp=0, tn=5000), 3)    # a perfect attack on 5000 + 5000 trials
    7.212
    >>> round(epsilon_lower_bound(tp=500, fn=500, fp=184, tn=816), 3)  # TPR 0.5 at FPR 0.184: log(0.5/0.184) = 1.0
    0.805
    >>> epsilon_lower_bound(tp=50, fn=50, fp=50, tn=50)                # chance
    0.0
    """
    tp, fn, fp, tn = (_count(name, v) for name, v in (("tp", tp), ("fn", fn), ("fp", fp), ("tn", tn)))
    if tp + fn == 0 or fp + tn == 0:
        raise InputError(f"need member and non-member trials, got {tp + fn} member and {fp + tn} non-member")
    delta, confidence = _delta(delta), _confidence(confidence)
    fpr_hi, fnr_hi = _upper_limits(tp, fn, fp, tn, confidence)
    return float(_eps_from_upper(fpr_hi, fnr_hi, delta))


@dataclass(frozen=True)
class AuditResult:
    """A membership attack's outcome counts and the epsilon lower bound they prove.

    Attributes:
        tp, fn: member trials decided member / non-member.
        fp, tn: non-member trials decided member / non-member.
        tpr, fpr: the point estimates ``tp / (tp + fn)`` and ``fp / (fp + tn)``.
        eps_lb: :func:`epsilon_lower_bound` of the counts.
        confidence: the probability with which ``eps_lb`` holds.
        delta: the delta the bound is for.
        threshold: the decision threshold (scores ``>= threshold`` were decided member), or None.
        fpr_hi, fnr_hi: the upper Clopper-Pearson limits of FPR and FNR that ``eps_lb`` used.

    >>> r = AuditResult.from_counts(90, 10, 5, 95, threshold=0.5)
    >>> r.tpr, r.fpr, round(r.eps_lb, 3)
    (0.9, 0.05, 1.988)
    >>> sorted(r.to_dict())[:4]
    ['confidence', 'delta', 'eps_lb', 'fn']
    """

    tp: int
    fn: int
    fp: int
    tn: int
    tpr: float
    fpr: float
    eps_lb: float
    confidence: float
    delta: float
    threshold: float | None
    fpr_hi: float
    fnr_hi: float

    @classmethod
    def from_counts(cls, tp: int, fn: int, fp: int, tn: int, *, delta: float = 0.0, confidence: float = 0.95,
                    threshold: float | None = None) -> AuditResult:
        """The result for these counts (validated as in :func:`epsilon_lower_bound`).

        >>> AuditResult.from_counts(1, 1, 1, 1).eps_lb
        0.0
        """
        eps = epsilon_lower_bound(tp, fn, fp, tn, delta=delta, confidence=confidence)
        fpr_hi, fnr_hi = _upper_limits(tp, fn, fp, tn, float(confidence))
        return cls(tp=int(tp), fn=int(fn), fp=int(fp), tn=int(tn), tpr=tp / (tp + fn), fpr=fp / (fp + tn),
                   eps_lb=eps, confidence=float(confidence), delta=float(delta),
                   threshold=None if threshold is None else float(threshold),
                   fpr_hi=float(fpr_hi), fnr_hi=float(fnr_hi))

    @property
    def eps_lb_max(self) -> float:
        """The largest bound these trials could prove at all: a perfect attack on as many member and non-member
        trials (what limits what the audit can show).

        >>> round(AuditResult.from_counts(3, 97, 0, 100).eps_lb_max, 3)  # 100 + 100 trials, perfectly separated
        3.281
        """
        return epsilon_lower_bound(self.tp + self.fn, 0, 0, self.fp + self.tn, delta=self.delta,
                                   confidence=self.confidence)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-friendly dict (plain ints and floats).

        >>> AuditResult.from_counts(3, 1, 0, 4, threshold=2.0).to_dict()["threshold"]
        2.0
        """
        return asdict(self)


# ------------------------------------------------------------------------------------------------ attack


def _scores(name: str, values: Any) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"{name} are not numbers ({e})", expected="a 1-D array of finite floats") from None
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.size < 2:
        raise InputError(f"{name} has {arr.size} score(s); the attack needs at least 2 (one per half)")
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise InputError(f"{name}[{bad[0]}] is {arr[bad[0]]} ({bad.size} non-finite scores)",
                         expected="finite scores")
    return arr


def threshold_attack(
    scores_in: Any,
    scores_out: Any,
    *,
    delta: float = 0.0,
    confidence: float = 0.95,
    rng: np.random.Generator,
) -> AuditResult:
    """The best threshold test "member iff score >= t", audited without tuning on the trials it is scored on.

    ``scores_in`` are the attack's scores on member trials, ``scores_out`` on non-member trials; higher means
    "more likely a member" (a log-likelihood ratio from :mod:`~privasr.privacy.audit.lrt`; negate
    log-perplexities). Each list is shuffled with ``rng`` and split in two halves:

    1. on the *selection* halves, every cut between two consecutive distinct scores is tried (``t`` the
       midpoint of the two; the lowest score itself for the cut below everything) and the ``t`` with the
       largest :func:`epsilon_lower_bound` there is kept (the lowest such ``t`` when several tie);
    2. on the *evaluation* halves (the other ``len - len // 2`` member and non-member trials, unseen in step
       1) that ``t`` is applied once and its counts give the reported :class:`AuditResult`.

    The threshold is thus a fixed function of data independent of the evaluation trials, and the
    Clopper-Pearson guarantee of :func:`epsilon_lower_bound` holds for the reported bound as stated; picking
    the best of many thresholds on the same trials would overstate it.

    Args:
        scores_in: member-trial scores, 1-D, finite, at least 2.
        scores_out: non-member-trial scores, 1-D, finite, at least 2.
        delta: the delta of the bound, in [0, 1).
        confidence: the probability with which the bound holds, in (0, 1).
        rng: the generator of the random split (``numpy.random.default_rng(seed)``).

    Raises:
        InputError: scores that are not a 1-D array of at least 2 finite numbers.
        ConfigError: bad ``delta``, ``confidence`` or ``rng``.

    >>> import numpy as np
    >>> rng = np.random.default_rng(1)
    >>> r = threshold_attack([5.0, 6.0, 7.0, 8.0] * 50, [0.0, 1.0, 2.0, 3.0] * 50, rng=rng)
    >>> r.tp, r.fn, r.fp, r.tn, r.threshold
    (100, 0, 0, 100, 4.0)
    >>> round(r.eps_lb, 2)
    3.28
    """
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed)), "
                          f"got {type(rng).__name__}")
    delta, confidence = _delta(delta), _confidence(confidence)
    s_in, s_out = _scores("scores_in", scores_in), _scores("scores_out", scores_out)
    s_in, s_out = rng.permutation(s_in), rng.permutation(s_out)
    sel_in, ev_in = np.sort(s_in[: s_in.size // 2]), s_in[s_in.size // 2:]
    sel_out, ev_out = np.sort(s_out[: s_out.size // 2]), s_out[s_out.size // 2:]

    candidates = np.unique(np.concatenate([sel_in, sel_out]))
    tp = sel_in.size - np.searchsorted(sel_in, candidates, side="left")
    fp = sel_out.size - np.searchsorted(sel_out, candidates, side="left")
    fpr_hi, fnr_hi = _upper_limits(tp, sel_in.size - tp, fp, sel_out.size - fp, confidence)
    # "score >= candidates[i]" decides the selection trials as any t in (candidates[i - 1], candidates[i]] does:
    # take the midpoint, so that a threshold between two classes is not pinned to the edge of one of them
    mids = np.concatenate([candidates[:1], candidates[:-1] / 2.0 + candidates[1:] / 2.0])
    t = float(mids[int(np.argmax(_eps_from_upper(fpr_hi, fnr_hi, delta)))])

    tp_e, fp_e = int(np.sum(ev_in >= t)), int(np.sum(ev_out >= t))
    return AuditResult.from_counts(tp_e, ev_in.size - tp_e, fp_e, ev_out.size - fp_e,
                                   delta=delta, confidence=confidence, threshold=t)

