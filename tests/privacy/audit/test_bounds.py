"""Clopper-Pearson intervals, epsilon lower bounds and the threshold attack (privasr.privacy.audit.bounds)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from privasr.errors import ConfigError, InputError
from privasr.privacy.audit.bounds import AuditResult, clopper_pearson, epsilon_lower_bound, threshold_attack

# ------------------------------------------------------------------------------------------ Clopper-Pearson


def test_clopper_pearson_matches_the_closed_forms_at_zero_and_all_successes():
    for n in (1, 10, 137):
        assert clopper_pearson(0, n)[0] == 0.0
        assert clopper_pearson(0, n)[1] == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-10)
        assert clopper_pearson(n, n)[0] == pytest.approx(0.025 ** (1 / n), rel=1e-10)
        assert clopper_pearson(n, n)[1] == 1.0
        # one-sided: the whole 5% in one tail
        assert clopper_pearson(0, n, two_sided=False)[1] == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-10)
        assert clopper_pearson(n, n, 0.9, two_sided=False)[0] == pytest.approx(0.1 ** (1 / n), rel=1e-10)


def test_clopper_pearson_matches_statsmodels_beta_intervals():
    # statsmodels.stats.proportion.proportion_confint(k, n, alpha=0.05, method="beta")
    assert clopper_pearson(5, 20) == pytest.approx((0.0865715, 0.4910459), abs=1e-6)
    assert clopper_pearson(50, 100) == pytest.approx((0.3983211, 0.6016789), abs=1e-6)


@pytest.mark.parametrize(("k", "n", "confidence"), [(1, 7, 0.95), (13, 40, 0.9), (250, 1000, 0.99)])
def test_clopper_pearson_ends_are_where_the_binomial_tails_reach_alpha(k, n, confidence):
    """The definition: hi is the p with P[X <= k] = alpha/2, lo the p with P[X >= k] = alpha/2."""
    lo, hi = clopper_pearson(k, n, confidence)
    half = (1 - confidence) / 2
    assert stats.binom.cdf(k, n, hi) == pytest.approx(half, rel=1e-6)
    assert stats.binom.sf(k - 1, n, lo) == pytest.approx(half, rel=1e-6)
    lo1, hi1 = clopper_pearson(k, n, confidence, two_sided=False)
    assert stats.binom.cdf(k, n, hi1) == pytest.approx(1 - confidence, rel=1e-6)
    assert lo < lo1 < k / n < hi1 < hi


@pytest.mark.parametrize("p", [0.01, 0.1, 0.37, 0.5, 0.93])
def test_clopper_pearson_covers_the_true_proportion_at_least_as_often_as_promised(p):
    """Exact coverage: the binomial probability of the k whose interval contains p."""
    n = 60
    intervals = [clopper_pearson(k, n, 0.9) for k in range(n + 1)]
    coverage = sum(stats.binom.pmf(k, n, p) for k, (lo, hi) in enumerate(intervals) if lo <= p <= hi)
    assert coverage >= 0.9
    one_sided = sum(stats.binom.pmf(k, n, p) for k in range(n + 1)
                    if p <= clopper_pearson(k, n, 0.9, two_sided=False)[1])
    assert one_sided >= 0.9


@pytest.mark.parametrize(("args", "kwargs", "error", "match"), [
    ((0, 0), {}, InputError, "no trials"),
    ((5, 4), {}, InputError, "0 <= k <= n"),
    ((-1, 4), {}, InputError, "k must be a count"),
    ((1.5, 4), {}, InputError, "k must be a count"),
    ((1, True), {}, InputError, "n must be a count"),
    ((1, 4), {"confidence": 1.0}, ConfigError, "confidence must be a number in"),
    ((1, 4), {"confidence": 0}, ConfigError, "confidence must be a number in"),
])
def test_clopper_pearson_refuses_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        clopper_pearson(*args, **kwargs)


# ------------------------------------------------------------------------------------------------ the bound


def test_epsilon_lower_bound_is_the_formula_on_the_upper_limits():
    tp, fn, fp, tn = 700, 300, 120, 880
    fpr_hi = clopper_pearson(fp, fp + tn, 0.95)[1]
    fnr_hi = clopper_pearson(fn, fn + tp, 0.95)[1]
    for delta in (0.0, 1e-3, 0.05):
        want = max(math.log((1 - delta - fnr_hi) / fpr_hi), math.log((1 - delta - fpr_hi) / fnr_hi), 0.0)
        assert epsilon_lower_bound(tp, fn, fp, tn, delta=delta) == pytest.approx(want, rel=1e-12)
    # the point estimate of the same attack claims more: the confidence limits cost something
    assert epsilon_lower_bound(tp, fn, fp, tn) < math.log(0.7 / 0.12)


def test_a_perfect_attack_proves_a_finite_epsilon_that_grows_with_the_trials():
    bounds = []
    for n in (100, 1000, 10000):
        h = 1 - 0.025 ** (1 / n)
        eps = epsilon_lower_bound(n, 0, 0, n)
        assert eps == pytest.approx(math.log((1 - h) / h), rel=1e-9)
        bounds.append(eps)
    assert bounds[0] < bounds[1] < bounds[2] < math.log(10000)


def test_the_bound_is_symmetric_in_the_two_directions_and_shrinks_with_delta_and_confidence():
    assert epsilon_lower_bound(900, 100, 300, 700) == pytest.approx(epsilon_lower_bound(700, 300, 100, 900))
    base = epsilon_lower_bound(900, 100, 50, 950)
    assert epsilon_lower_bound(900, 100, 50, 950, delta=0.1) < base
    assert epsilon_lower_bound(900, 100, 50, 950, confidence=0.99) < base < \
        epsilon_lower_bound(900, 100, 50, 950, confidence=0.5)


def test_an_attack_no_better_than_chance_proves_nothing():
    assert epsilon_lower_bound(500, 500, 500, 500) == 0.0
    assert epsilon_lower_bound(100, 900, 900, 100) == 0.0      # worse than chance: still 0, never negative
    assert epsilon_lower_bound(1, 0, 1, 0) == 0.0               # everything called a member
    assert epsilon_lower_bound(990, 10, 10, 990, delta=0.999) == 0.0


@pytest.mark.parametrize(("counts", "kwargs", "error", "match"), [
    ((0, 0, 5, 5), {}, InputError, "need member and non-member trials"),
    ((5, 5, 0, 0), {}, InputError, "need member and non-member trials"),
    ((5, -1, 5, 5), {}, InputError, "fn must be a count"),
    ((5, 5, 2.0, 5), {}, InputError, "fp must be a count"),
    ((5, 5, 5, 5), {"delta": 1.0}, ConfigError, "delta must be a number in"),
    ((5, 5, 5, 5), {"delta": -0.1}, ConfigError, "delta must be a number in"),
    ((5, 5, 5, 5), {"confidence": 95}, ConfigError, "confidence must be a number in"),
])
def test_epsilon_lower_bound_refuses_bad_input(counts, kwargs, error, match):
    with pytest.raises(error, match=match):
        epsilon_lower_bound(*counts, **kwargs)


def test_audit_result_from_counts_and_to_dict():
    r = AuditResult.from_counts(80, 20, 10, 90, delta=1e-5, confidence=0.9, threshold=np.float64(1.5))
    assert (r.tp, r.fn, r.fp, r.tn) == (80, 20, 10, 90)
    assert (r.tpr, r.fpr) == (0.8, 0.1)
    assert r.eps_lb == epsilon_lower_bound(80, 20, 10, 90, delta=1e-5, confidence=0.9)
    assert r.fpr_hi == pytest.approx(clopper_pearson(10, 100, 0.9)[1])
    assert r.fnr_hi == pytest.approx(clopper_pearson(20, 100, 0.9)[1])
    d = r.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["threshold"] == 1.5 and type(d["threshold"]) is float and d["delta"] == 1e-5
    assert set(d) == {"tp", "fn", "fp", "tn", "tpr", "fpr", "eps_lb", "confidence", "delta", "threshold",
                      "fpr_hi", "fnr_hi"}
    assert AuditResult.from_counts(1, 1, 1, 1).threshold is None


# ------------------------------------------------------------------------------------------- the attack


def test_threshold_attack_separates_separable_scores_and_counts_only_the_evaluation_halves():
    rng = np.random.default_rng(3)
    r = threshold_attack(rng.uniform(10, 11, 301), rng.uniform(0, 1, 200), rng=rng)
    assert (r.tp, r.fn, r.fp, r.tn) == (151, 0, 0, 100)   # the second halves: 301 - 150 and 200 - 100
    assert 1 < r.threshold < 10      # halfway between the classes, not at the lowest member seen
    assert r.eps_lb == epsilon_lower_bound(151, 0, 0, 100)


def test_threshold_attack_finds_nothing_when_members_and_non_members_look_alike():
    for seed in range(5):
        rng = np.random.default_rng(seed)
        r = threshold_attack(rng.normal(size=2000), rng.normal(size=2000), rng=rng)
        assert r.eps_lb == 0.0


def test_threshold_attack_uses_the_low_side_too_and_is_reproducible():
    """Members that are never below 0: 'member iff score >= t' with a low t has FNR 0 and a small FPR."""
    rng = np.random.default_rng(0)
    members, others = rng.uniform(0, 10, 4000), rng.uniform(-1, 10, 4000)
    r1 = threshold_attack(members, others, rng=np.random.default_rng(7))
    r2 = threshold_attack(members, others, rng=np.random.default_rng(7))
    assert r1 == r2
    assert r1.fn <= 2 and abs(r1.threshold) < 0.01
    assert r1.eps_lb == pytest.approx(epsilon_lower_bound(r1.tp, r1.fn, r1.fp, r1.tn))
    # log((1 - FPR_hi) / FNR_hi): TNR ~ 1/11 against FNR_hi ~ 0.002-0.003 of 2000 member trials
    assert r1.eps_lb > 3.0


@pytest.mark.parametrize(("scores_in", "kwargs", "error", "match"), [
    ([1.0, float("nan"), 2.0], {}, InputError, r"scores_in\[1\] is nan"),
    ([1.0, float("inf")], {}, InputError, r"scores_in\[1\] is inf"),
    ([1.0], {}, InputError, "at least 2"),
    ([[1.0, 2.0]], {}, InputError, "1-D"),
    (["a", "b"], {}, InputError, "are not numbers"),
    ([1.0, 2.0], {"rng": 0}, ConfigError, "numpy.random.Generator"),
    ([1.0, 2.0], {"delta": 2}, ConfigError, "delta"),
])
def test_threshold_attack_refuses_bad_input(scores_in, kwargs, error, match):
    kwargs = {"rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(error, match=match):
        threshold_attack(scores_in, [0.0, 1.0], **kwargs)
