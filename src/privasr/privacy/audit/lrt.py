"""Likelihood-ratio membership statistics on the numbers a curious server sees.

A membership attack decides between two simple hypotheses about one released number ``x`` (a word's count in a
client's upload or in the noisy aggregate, a coordinate of a model delta):

* ``H0`` (non-member): ``x = base + noise``;
* ``H1`` (member): ``x = base + shift + noise`` -- the unit under test added ``shift`` (e.g. a planted word
  used ``shift`` times).

The caller subtracts what it knows of ``base`` (0 for a word nobody else uses) and passes ``x``. By the
Neyman-Pearson lemma, the test "member iff ``log p1(x) / p0(x) >= t``" is the most powerful test of ``H0``
against ``H1`` at its false-positive rate: no other test of the same FPR has a higher TPR. These functions return
that log-likelihood ratio (LLR), vectorised, as scores for
:func:`~privasr.privacy.audit.bounds.threshold_attack` (which finds ``t``):

* :func:`laplace_llr` -- noise ``Laplace(0, scale)`` (the Laplace mechanism; FMP's DP counts);
* :func:`gaussian_llr` -- noise ``N(0, sigma^2)`` (the Gaussian mechanism; DP-FedAvg deltas);
* :func:`count_presence` -- no noise at all: the hypotheses' supports do not overlap.

>>> import numpy as np
>>> laplace_llr(np.array([-3.0, 0.0, 0.25, 1.0, 5.0]), shift=1.0, scale=1.0)
array([-1. , -1. , -0.5,  1. ,  1. ])
>>> float(gaussian_llr(0.5, shift=1.0, sigma=2.0))   # halfway between the means: no evidence either way
0.0
>>> count_presence([0, 0, 3])
array([0., 0., 1.])
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["laplace_llr", "gaussian_llr", "count_presence"]


def _values(name: str, x: Any) -> np.ndarray:
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"{name} is not numeric ({e})", expected="numbers or an array of numbers") from None
    if not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        where = f"[{', '.join(str(int(i)) for i in bad)}]" if arr.ndim else ""
        raise InputError(f"{name}{where} is {arr[tuple(bad)]}", expected="finite numbers")
    return arr


def _param(name: str, value: Any, *, positive: bool) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number or an array of numbers, got {value!r}") from None
    ok = np.isfinite(arr) & (arr > 0) if positive else np.isfinite(arr)
    if not np.all(ok):
        raise ConfigError(f"{name} must be {'> 0 and ' if positive else ''}finite, got {value!r}")
    return arr


def _out(arr: np.ndarray) -> np.ndarray | float:
    return arr if arr.ndim else arr[()]


def laplace_llr(x: Any, shift: Any, scale: Any) -> np.ndarray | float:
    """``log p(x | Laplace(shift, scale)) - log p(x | Laplace(0, scale))``, elementwise.

    The most powerful test (Neyman-Pearson) of "a count of ``shift`` was planted" against "nothing was
    planted" when the released value carries Laplace noise of scale ``b`` (``b = sensitivity / epsilon``).
    With density ``exp(-|x - m| / b) / (2 b)`` the ratio is ``(|x| - |x - shift|) / b``, computed as
    ``sign(shift) * clip(2 x - shift, -|shift|, |shift|) / b`` (exact on its plateaus): it is
    ``-|shift| / b`` on the side of 0, ``+|shift| / b`` beyond ``shift``, and linear in between, so it never
    exceeds ``|shift| / b`` -- the privacy loss of ``|shift| / b``-DP (``epsilon`` for ``shift = sensitivity``).

    ``x``, ``shift`` and ``scale`` broadcast against each other; a scalar result is a numpy float.

    Raises:
        InputError: ``x`` not numeric or not finite.
        ConfigError: ``shift`` not finite, ``scale`` not a finite number > 0.

    >>> laplace_llr([-1.0, 0.5, 2.0], shift=1.0, scale=0.5)
    array([-2.,  0.,  2.])
    >>> float(laplace_llr(-4.0, shift=-2.0, scale=1.0))   # a negative shift: small x favours the member
    2.0
    """
    xs = _values("x", x)
    s = _param("shift", shift, positive=False)
    b = _param("scale", scale, positive=True)
    mag = np.abs(s)
    return _out(np.sign(s) * np.clip(2.0 * xs - s, -mag, mag) / b)


def gaussian_llr(x: Any, shift: Any, sigma: Any) -> np.ndarray | float:
    """``log p(x | N(shift, sigma^2)) - log p(x | N(0, sigma^2))`` = ``shift * (x - shift / 2) / sigma^2``.

    The most powerful test (Neyman-Pearson) of "``shift`` was added" against "nothing was added" under
    Gaussian noise of standard deviation ``sigma`` (``noise_multiplier * clip_norm``). It is linear in ``x``,
    so thresholding it is thresholding ``x`` itself (for ``shift > 0``); with several coordinates, summing
    their LLRs gives the test on the whole vector (independent noise per coordinate).

    ``x``, ``shift`` and ``sigma`` broadcast against each other; a scalar result is a numpy float.

    Raises:
        InputError: ``x`` not numeric or not finite.
        ConfigError: ``shift`` not finite, ``sigma`` not a finite number > 0.

    >>> gaussian_llr([0.0, 0.5, 1.0], shift=1.0, sigma=1.0)
    array([-0.5,  0. ,  0.5])
    >>> float(gaussian_llr(3.0, shift=2.0, sigma=2.0))
    1.0
    """
    xs = _values("x", x)
    s = _param("shift", shift, positive=False)
    sd = _param("sigma", sigma, positive=True)
    return _out(s * (xs - s / 2.0) / sd**2)


def count_presence(x: Any, baseline: Any = 0.0) -> np.ndarray | float:
    """``1.0`` where ``x > baseline``, else ``0.0``: the membership test on noiseless counts.

    Without noise a non-member's count is exactly ``baseline`` (0 for a planted word that nobody else uses) and
    a member's is larger: the two hypotheses have disjoint supports, their likelihood ratio is 0 or infinite,
    and the test "member iff the count exceeds the baseline" is most powerful (Neyman-Pearson) -- FPR 0 and
    TPR 1 whenever the hypotheses are as stated -- without needing to know the planted count. Thresholding
    the 0/1 scores at 1 is that test.

    Raises:
        InputError: ``x`` not numeric or not finite.
        ConfigError: ``baseline`` not finite.

    >>> count_presence([[0, 2], [1, 0]])
    array([[0., 1.],
           [1., 0.]])
    >>> count_presence([5, 6], baseline=5)
    array([0., 1.])
    """
    xs = _values("x", x)
    base = _param("baseline", baseline, positive=False)
    return _out((xs > base).astype(np.float64))
