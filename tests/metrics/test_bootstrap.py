"""Paired bootstrap of the WER difference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.errors import InputError
from privasr.metrics.bootstrap import bootstrap_wer_difference, paired_bootstrap
from privasr.metrics.wer import wer


def test_ci_contains_observed_difference():
    rng = np.random.default_rng(5)
    ref = rng.integers(5, 30, 400)
    ea = rng.binomial(ref, 0.05)
    eb = rng.binomial(ref, 0.08)
    r = paired_bootstrap(ea, eb, ref, seed=1)
    assert r.difference == pytest.approx(ea.sum() / ref.sum() - eb.sum() / ref.sum())
    assert r.ci_low < r.difference < r.ci_high < 0
    assert r.prob_a_better > 0.99 and r.resamples == 1000 and r.confidence == 0.95


def test_identical_systems_give_zero_interval():
    r = paired_bootstrap([1, 0, 3], [1, 0, 3], [4, 2, 9], seed=0)
    assert (r.difference, r.ci_low, r.ci_high, r.prob_a_better) == (0.0, 0.0, 0.0, 0.0)


def test_seeded_reproducibility():
    args = ([1, 0, 3, 2, 5], [0, 2, 3, 1, 1], [4, 5, 9, 6, 7])
    a, b = paired_bootstrap(*args, seed=42), paired_bootstrap(*args, seed=42)
    assert a == b
    c = paired_bootstrap(*args, seed=43)
    assert (c.ci_low, c.ci_high, c.prob_a_better) != (a.ci_low, a.ci_high, a.prob_a_better)


def test_wider_confidence_gives_wider_interval():
    args = ([1, 0, 3, 2, 5, 0, 1], [0, 2, 3, 1, 1, 2, 2], [4, 5, 9, 6, 7, 3, 5])
    narrow = paired_bootstrap(*args, confidence=0.5, seed=7)
    wide = paired_bootstrap(*args, confidence=0.99, seed=7)
    assert wide.ci_low <= narrow.ci_low <= narrow.ci_high <= wide.ci_high


def test_from_wer_results():
    refs = [["a", "b", "c"], ["d", "e"], ["f"]]
    a = wer(refs, [["a", "b", "c"], ["d"], ["f"]])
    b = wer(refs, [["a", "x", "c"], ["d", "y"], []])
    r = bootstrap_wer_difference(a, b, seed=0, resamples=500)
    assert r.wer_a == pytest.approx(1 / 6) and r.wer_b == pytest.approx(3 / 6)
    with pytest.raises(InputError):
        bootstrap_wer_difference(a, wer([["a"]], [["a"]]))


def test_input_errors():
    with pytest.raises(InputError):
        paired_bootstrap([1], [1, 2], [3, 3])
    with pytest.raises(InputError):
        paired_bootstrap([], [], [])
    with pytest.raises(InputError):
        paired_bootstrap([1], [1], [3], resamples=0)
    with pytest.raises(InputError):
        paired_bootstrap([1], [1], [3], confidence=1.0)
    with pytest.raises(InputError):
        paired_bootstrap([-1], [1], [3])


counts = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(1, 10)), min_size=1, max_size=30)


@settings(max_examples=100, deadline=None)
@given(counts, st.integers(0, 2**32 - 1))
def test_properties(rows, seed):
    ea, eb, rw = (list(x) for x in zip(*rows, strict=True))
    r = paired_bootstrap(ea, eb, rw, seed=seed, resamples=200)
    assert r.ci_low <= r.ci_high
    assert 0.0 <= r.prob_a_better <= 1.0
    lo, hi = min(a / n - b / n for a, b, n in rows), max(a / n - b / n for a, b, n in rows)
    assert lo - 1e-12 <= r.ci_low and r.ci_high <= hi + 1e-12  # a ratio of sums lies between the extremes
    swapped = paired_bootstrap(eb, ea, rw, seed=seed, resamples=200)  # same resamples, negated differences
    assert swapped.ci_low == pytest.approx(-r.ci_high) and swapped.ci_high == pytest.approx(-r.ci_low)


def test_draw_mean_bootstrap_is_the_draws_summed_against_r_baselines():
    from privasr.metrics import draw_mean_bootstrap

    draws, base, refs = [[1, 0, 3], [2, 0, 1]], [2, 1, 2], [5, 4, 6]
    got = draw_mean_bootstrap(draws, base, refs, seed=3, resamples=300)
    want = paired_bootstrap([3, 0, 4], [4, 2, 4], [10, 8, 12], seed=3, resamples=300)
    assert got == want
    # the difference is the draw-mean's WER minus the baseline's
    assert got.difference == pytest.approx((7 / 2 - 5) / 15)
    with pytest.raises(InputError, match="differ in length"):
        draw_mean_bootstrap([[1, 0], [1, 0, 0]], base, refs)
    with pytest.raises(InputError, match="no draws"):
        draw_mean_bootstrap([], base, refs)
