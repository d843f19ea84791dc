"""Likelihood-ratio membership scores (privasr.privacy.audit.lrt) against scipy's densities."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from privasr.errors import ConfigError, InputError
from privasr.privacy.audit.lrt import count_presence, gaussian_llr, laplace_llr

X = np.linspace(-6.0, 6.0, 241)


@pytest.mark.parametrize(("shift", "scale"), [(1.0, 1.0), (3.0, 0.5), (-2.0, 2.0), (0.25, 10.0), (0.0, 1.0)])
def test_laplace_llr_is_the_log_density_ratio(shift, scale):
    want = stats.laplace.logpdf(X, loc=shift, scale=scale) - stats.laplace.logpdf(X, loc=0.0, scale=scale)
    got = laplace_llr(X, shift, scale)
    assert got.shape == X.shape
    np.testing.assert_allclose(got, want, atol=1e-12)
    # the privacy loss of the Laplace mechanism never exceeds |shift| / scale, and reaches it on both sides
    assert np.max(np.abs(got)) == pytest.approx(abs(shift) / scale)


def test_laplace_llr_plateaus_are_exact():
    """Thresholds at +-|shift|/b select exactly the x beyond shift / on the side of 0 (no rounding)."""
    x = np.array([1.1, 7.3, 1e6, -0.3, -1e6])
    assert laplace_llr(x, 1.0, 1.0).tolist() == [1.0, 1.0, 1.0, -1.0, -1.0]


@pytest.mark.parametrize(("shift", "sigma"), [(1.0, 1.0), (2.0, 0.7), (-1.5, 3.0)])
def test_gaussian_llr_is_the_log_density_ratio(shift, sigma):
    want = stats.norm.logpdf(X, loc=shift, scale=sigma) - stats.norm.logpdf(X, loc=0.0, scale=sigma)
    np.testing.assert_allclose(gaussian_llr(X, shift, sigma), want, atol=1e-10)


def test_llrs_broadcast_and_return_floats_for_scalars():
    x = np.zeros((2, 3))
    shifts = np.array([1.0, 2.0, 4.0])
    assert laplace_llr(x, shifts, 2.0).tolist() == [[-0.5, -1.0, -2.0]] * 2
    assert gaussian_llr(x, shifts, np.array([[1.0], [2.0]])).tolist() == [[-0.5, -2.0, -8.0],
                                                                          [-0.125, -0.5, -2.0]]
    for value in (laplace_llr(0.5, 1.0, 1.0), gaussian_llr(0.5, 1.0, 1.0), count_presence(3)):
        assert isinstance(value, float) and not isinstance(value, np.ndarray)


def test_summed_gaussian_llr_beats_a_single_coordinate_at_the_same_false_positive_rate():
    """Neyman-Pearson on a vector: the summed LLR over 4 noisy coordinates is more powerful than any one."""
    rng = np.random.default_rng(0)
    n, shift = 20000, np.array([0.5, 0.5, 0.5, 0.5])
    members, others = shift + rng.normal(size=(n, 4)), rng.normal(size=(n, 4))

    def tpr_at_fpr(s_in, s_out, fpr=0.05):
        return float(np.mean(s_in >= np.quantile(s_out, 1 - fpr)))

    full = tpr_at_fpr(gaussian_llr(members, shift, 1.0).sum(axis=1), gaussian_llr(others, shift, 1.0).sum(axis=1))
    one = tpr_at_fpr(gaussian_llr(members[:, 0], 0.5, 1.0), gaussian_llr(others[:, 0], 0.5, 1.0))
    # theory: 1 - Phi(1.645 - 1.0) = 0.26 against 1 - Phi(1.645 - 0.5) = 0.126
    assert full == pytest.approx(0.26, abs=0.02) and one == pytest.approx(0.126, abs=0.015)


def test_count_presence():
    assert count_presence([0, 1, 0, 7]).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert count_presence(np.array([[2.0, 3.0]]), baseline=np.array([2.0, 2.0])).tolist() == [[0.0, 1.0]]
    assert count_presence(0) == 0.0


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: laplace_llr([0.0, float("nan")], 1.0, 1.0), InputError, r"x\[1\] is nan"),
    (lambda: laplace_llr(["a"], 1.0, 1.0), InputError, "x is not numeric"),
    (lambda: laplace_llr(0.0, 1.0, 0.0), ConfigError, "scale must be > 0"),
    (lambda: laplace_llr(0.0, float("inf"), 1.0), ConfigError, "shift must be finite"),
    (lambda: gaussian_llr(float("inf"), 1.0, 1.0), InputError, "x is inf"),
    (lambda: gaussian_llr(0.0, 1.0, -1.0), ConfigError, "sigma must be > 0"),
    (lambda: gaussian_llr(0.0, "one", 1.0), ConfigError, "shift must be a number"),
    (lambda: count_presence([[1.0], [float("nan")]]), InputError, r"x\[1, 0\] is nan"),
    (lambda: count_presence([1.0], baseline=float("nan")), ConfigError, "baseline must be finite"),
])
def test_bad_input_is_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()
