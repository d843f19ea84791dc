"""How good word confidences are: calibration (ECE, reliability curve), NCE, Brier score and ROC AUC.

Every function takes ``conf`` (predicted probabilities that each word is correct, in [0, 1]) and
``correct`` (whether it is: booleans or 0/1), one entry per word.

* **Reliability curve** -- ``[0, 1]`` is cut into ``bins`` equal-width bins ``[b/B, (b+1)/B)`` (the last
  one closed, so a confidence of exactly 1 falls in it). For each bin: the number of words ``n_b``, their
  mean confidence ``conf_b`` and their accuracy ``acc_b`` (fraction correct). A calibrated predictor has
  ``acc_b ~= conf_b`` in every bin.
* **Expected calibration error** (Guo et al., 2017, with 15 bins by default)::

      ECE = sum_b (n_b / N) * |acc_b - conf_b|

  0 for a perfectly calibrated predictor; empty bins contribute nothing.
* **Normalised cross entropy** (NIST's confidence measure, as in sclite)::

      H_max = -n_c log2(p_c) - (N - n_c) log2(1 - p_c),   p_c = n_c / N  (the base rate)
      H     = -sum_{correct} log2(conf) - sum_{incorrect} log2(1 - conf)
      NCE   = (H_max - H) / H_max

  1 for perfect confidences, 0 for the constant base rate, negative when worse than that; undefined (NaN)
  when every word is correct or every word is wrong. Confidences are clipped to ``[eps, 1 - eps]``.
* **Brier score** -- ``mean((conf - correct) ** 2)``.
* **ROC AUC** -- the probability that a random correct word gets a higher confidence than a random
  incorrect one (ties count half); scikit-learn's ``roc_auc_score``; NaN when only one class occurs.

>>> conf, correct = [0.9, 0.9, 0.2, 0.2], [True, False, False, False]
>>> round(expected_calibration_error(conf, correct, bins=5), 6)  # 0.5 * |0.5 - 0.9| + 0.5 * |0 - 0.2|
0.3
>>> round(normalized_cross_entropy([0.8, 0.6], [True, False]), 5)
0.17807
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = [
    "ReliabilityCurve",
    "reliability_curve",
    "expected_calibration_error",
    "normalized_cross_entropy",
    "brier_score",
    "roc_auc",
    "check_conf",
    "require_sklearn",
    "fit_isotonic",
    "DEFAULT_BINS",
]

DEFAULT_BINS = 15
"""Bins of the reliability curve and of the ECE unless told otherwise (Guo et al., 2017)."""


def require_sklearn() -> None:
    """Raise :class:`~privasr.errors.ConfigError` (one clear line) when scikit-learn is not installed."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise ConfigError("scikit-learn is not installed (needed to train confidence models and for the AUC)",
                          expected="pip install 'privasr[federated]'") from None


def fit_isotonic(conf: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An increasing map from a raw confidence to P(correct): scikit-learn's ``IsotonicRegression``
    (``out_of_bounds="clip"``), returned as its thresholds ``(x, y)`` for ``np.interp(c, x, y)``.

    One pseudo-word of the opposite class is added at each end (a correct one at the lowest confidence, a wrong
    one at the highest), so no mapped confidence is exactly 0 or 1: a correct word at 0 (or a wrong one at 1)
    would cost unbounded cross entropy and silence a word completely in a confidence-weighted loss. With no
    words the map is the constant 0.5.

    >>> x, y = fit_isotonic(np.array([0.2, 0.4, 0.6, 0.8]), np.array([False, False, True, True]))
    >>> np.interp([0.2, 0.8], x, y).round(3).tolist()
    [0.333, 0.667]
    """
    require_sklearn()
    from sklearn.isotonic import IsotonicRegression

    raw = np.asarray(conf, dtype=np.float64)
    xs = np.concatenate([raw, [raw.min(), raw.max()]]) if raw.size else np.array([0.0, 1.0])
    ys = np.concatenate([np.asarray(correct, dtype=np.float64), [1.0, 0.0]])
    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0, increasing=True).fit(xs, ys)
    return np.asarray(iso.X_thresholds_, dtype=np.float64), np.asarray(iso.y_thresholds_, dtype=np.float64)


def check_conf(conf: Any, correct: Any) -> tuple[np.ndarray, np.ndarray]:
    """``conf`` and ``correct`` as float64 and bool arrays of one equal length; :class:`InputError` if not.

    >>> c, y = check_conf([0.5, 1], [1, 0])
    >>> c.dtype.name, y.tolist()
    ('float64', [True, False])
    >>> check_conf([1.5], [True])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: confidence 1.5 is outside [0, 1] (expected probabilities)
    """
    try:
        c = np.asarray(conf, dtype=np.float64)
        y_raw = np.asarray(correct)
    except (TypeError, ValueError):
        raise InputError("confidences must be numbers", expected="probabilities") from None
    if c.ndim != 1 or y_raw.ndim != 1 or c.shape != y_raw.shape:
        raise InputError(f"{c.size} confidences for {y_raw.size} correctness labels",
                         expected="two 1-D sequences of equal length")
    if y_raw.dtype != bool:
        if y_raw.size and not np.isin(y_raw, (0, 1)).all():
            raise InputError("correctness labels must be booleans or 0/1", expected="booleans")
    bad = ~np.isfinite(c) | (c < 0) | (c > 1)
    if bad.any():
        raise InputError(f"confidence {float(c[bad][0])!r} is outside [0, 1]", expected="probabilities")
    return c, y_raw.astype(bool)


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per-bin statistics of a reliability (calibration) plot.

    Attributes:
        lower: each bin's lower edge.
        upper: each bin's upper edge.
        count: words in each bin.
        mean_confidence: mean confidence of the words in each bin (NaN for an empty bin).
        accuracy: fraction of the words in each bin that are correct (NaN for an empty bin).
    """

    lower: np.ndarray
    upper: np.ndarray
    count: np.ndarray
    mean_confidence: np.ndarray
    accuracy: np.ndarray

    @property
    def centre(self) -> np.ndarray:
        """Each bin's centre (the x position of a bar in a reliability plot)."""
        return (self.lower + self.upper) / 2

    @property
    def ece(self) -> float:
        """The expected calibration error over these bins (NaN with no words)."""
        n = int(self.count.sum())
        if n == 0:
            return math.nan
        keep = self.count > 0
        gap = np.abs(self.accuracy[keep] - self.mean_confidence[keep])
        return float((self.count[keep] / n * gap).sum())

    def as_dict(self) -> dict[str, list[Any]]:
        """Plain lists (NaN for empty bins; :func:`privasr.results.to_jsonable` writes them as null).

        >>> reliability_curve([0.1, 0.9], [False, True], bins=2).as_dict()["accuracy"]
        [0.0, 1.0]
        """
        return {"bin_lower": self.lower.tolist(), "bin_upper": self.upper.tolist(), "bin_centre": self.centre.tolist(),
                "count": self.count.tolist(), "mean_confidence": self.mean_confidence.tolist(),
                "accuracy": self.accuracy.tolist()}

    def write_csv(self, path: str | Path) -> Path:
        """Write one row per bin (``bin_lower, bin_upper, bin_centre, count, mean_confidence, accuracy``;
        empty cells for empty bins) and return the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        d = self.as_dict()
        cols = list(d)
        with open(p, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for row in zip(*(d[c] for c in cols), strict=True):
                w.writerow(["" if isinstance(v, float) and math.isnan(v) else repr(v) if isinstance(v, float)
                            else v for v in row])
        return p


def _check_bins(bins: int) -> int:
    if isinstance(bins, bool) or not isinstance(bins, int | np.integer) or bins < 1:
        raise InputError(f"bins={bins!r}", expected="an integer >= 1")
    return int(bins)


def reliability_curve(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray,
                      bins: int = DEFAULT_BINS) -> ReliabilityCurve:
    """Bin the words by confidence into ``bins`` equal-width bins and measure each bin's accuracy.

    >>> r = reliability_curve([0.05, 0.15, 0.95, 1.0], [False, True, True, True], bins=2)
    >>> r.count.tolist(), r.mean_confidence.round(3).tolist(), r.accuracy.tolist()
    ([2, 2], [0.1, 0.975], [0.5, 1.0])
    """
    c, y = check_conf(conf, correct)
    b = _check_bins(bins)
    idx = np.minimum((c * b).astype(np.int64), b - 1)
    count = np.bincount(idx, minlength=b)
    sum_c = np.bincount(idx, weights=c, minlength=b)
    sum_y = np.bincount(idx, weights=y.astype(np.float64), minlength=b)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_c = np.where(count > 0, sum_c / np.maximum(count, 1), np.nan)
        acc = np.where(count > 0, sum_y / np.maximum(count, 1), np.nan)
    edges = np.arange(b + 1, dtype=np.float64) / b
    return ReliabilityCurve(edges[:-1], edges[1:], count.astype(np.int64), mean_c, acc)


def expected_calibration_error(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray,
                               bins: int = DEFAULT_BINS) -> float:
    """``sum_b (n_b / N) |acc_b - conf_b|`` over ``bins`` equal-width bins (see the module docstring).

    NaN when there are no words.

    >>> expected_calibration_error([1.0, 0.0], [True, False])
    0.0
    >>> expected_calibration_error([0.7] * 10, [True] * 7 + [False] * 3) < 1e-12
    True
    """
    return reliability_curve(conf, correct, bins).ece


def normalized_cross_entropy(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray,
                             eps: float = 1e-12) -> float:
    """NIST's normalised cross entropy of the confidences (see the module docstring); NaN if one class only.

    >>> normalized_cross_entropy([0.75] * 4, [True, True, True, False])  # the base rate itself scores 0
    0.0
    >>> normalized_cross_entropy([1.0, 0.0], [True, False]) > 0.999
    True
    """
    c, y = check_conf(conf, correct)
    n, n_c = y.size, int(y.sum())
    if n == 0 or n_c in (0, n):
        return math.nan
    p = n_c / n
    h_max = -(n_c * math.log2(p) + (n - n_c) * math.log2(1 - p))
    cc = np.clip(c, eps, 1 - eps)
    h = -float(np.log2(cc[y]).sum() + np.log2(1 - cc[~y]).sum())
    return (h_max - h) / h_max


def brier_score(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray) -> float:
    """Mean squared difference between confidence and correctness (NaN with no words).

    >>> round(brier_score([0.9, 0.2], [True, True]), 6)
    0.325
    """
    c, y = check_conf(conf, correct)
    if c.size == 0:
        return math.nan
    return float(np.mean((c - y) ** 2))


def roc_auc(conf: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray) -> float:
    """Area under the ROC curve of ``conf`` as a detector of correct words (scikit-learn's ``roc_auc_score``).

    NaN when only one class occurs. Needs scikit-learn (the ``federated`` extra).

    >>> roc_auc([0.9, 0.8, 0.3, 0.1], [True, False, True, False])
    0.75
    >>> roc_auc([0.5, 0.5, 0.5], [True, False, True])  # a constant predictor
    0.5
    """
    require_sklearn()
    from sklearn.metrics import roc_auc_score

    c, y = check_conf(conf, correct)
    if y.size == 0 or y.all() or not y.any():
        return math.nan
    return float(roc_auc_score(y, c))
