"""Bounding the sensitivity of one contribution: norm clipping and count capping.

A differentially private sum needs a bound on how much one contribution (one client's model delta, one user's
or one utterance's n-gram counts) can move it. Parameters are a flat ``name -> array`` mapping, viewed as one
long vector ``x`` (the concatenation of every array, flattened):

* ``||x||_2 = sqrt(sum_i x_i^2)`` and ``||x||_1 = sum_i |x_i|`` (:func:`global_norm`, always in float64);
* clipping to ``C`` scales by ``min(1, C / ||x||)``, so ``||clip(x)|| <= C`` while the direction is kept
  (:func:`clip_by_norm`). With every contribution clipped to ``C`` in L2, adding or removing one contribution
  moves the sum by at most ``C`` (the L2 sensitivity a Gaussian mechanism is calibrated to); replacing one moves
  it by at most ``2 C``.
* a non-negative count vector ``c`` is capped to total ``T`` by scaling it by ``min(1, T / sum(c))``
  (:func:`cap_counts`), which bounds its L1 norm -- the sensitivity of a Laplace mechanism -- by ``T``.

>>> import numpy as np
>>> delta = {"w": np.array([3.0, 0.0]), "b": np.array([4.0])}
>>> global_norm(delta)
5.0
>>> clipped, norm = clip_by_norm(delta, 1.0)
>>> norm, clipped["w"].round(6).tolist(), clipped["b"].round(6).tolist()
(5.0, [0.6, 0.0], [0.8])
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["global_norm", "clip_by_norm", "clip_float32", "cap_counts"]


def _check_ord(ord: Any) -> int:
    if isinstance(ord, bool) or ord not in (1, 2):
        raise ConfigError(f"norm order must be 1 or 2, got {ord!r}")
    return int(ord)


def _as_float64(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"parameter {name!r} is not numeric ({e})", expected="a numeric array") from None
    if not np.all(np.isfinite(arr)):
        raise InputError(f"parameter {name!r} holds non-finite values (nan or inf)", expected="finite numbers")
    return arr


def _norm(arrays: Sequence[np.ndarray], ord: int) -> float:
    if ord == 1:
        return float(math.fsum(float(np.abs(a).sum()) for a in arrays))
    # L2 without overflow or underflow: scale by the largest magnitude first
    peak = max((float(np.abs(a).max()) for a in arrays if a.size), default=0.0)
    if peak == 0.0:
        return 0.0
    return peak * math.sqrt(math.fsum(float(np.square(a / peak).sum()) for a in arrays))


def global_norm(params: Mapping[str, Any], ord: int = 2) -> float:
    """The L2 (``ord=2``) or L1 (``ord=1``) norm of all arrays of ``params`` taken together, in float64.

    An empty mapping (or only empty arrays) has norm ``0.0``.

    Args:
        params: flat ``name -> array`` mapping (arrays of any shape; scalars allowed).
        ord: 2 for the Euclidean norm, 1 for the sum of absolute values.

    Raises:
        InputError: an array is not numeric or holds nan/inf.
        ConfigError: ``ord`` is not 1 or 2.

    >>> import numpy as np
    >>> global_norm({"a": np.array([1.0, -2.0]), "b": np.array([[2.0]])})
    3.0
    >>> global_norm({"a": np.array([1.0, -2.0]), "b": np.array([[2.0]])}, ord=1)
    5.0
    """
    ord = _check_ord(ord)
    return _norm([_as_float64(k, v) for k, v in params.items()], ord)


def clip_by_norm(
    params: Mapping[str, Any], max_norm: float, ord: int = 2
) -> tuple[dict[str, np.ndarray], float]:
    """Scale ``params`` so that their global norm is at most ``max_norm``; return the copy and the original norm.

    The scale is ``min(1, max_norm / norm)``: contributions already inside the ball are returned unchanged (as
    float64 copies), larger ones keep their direction. The result is guaranteed to satisfy
    ``global_norm(clipped, ord) <= max_norm`` even after floating-point rounding. The inputs are never modified.

    Args:
        params: flat ``name -> array`` mapping, e.g. a client's model delta.
        max_norm: the clipping bound ``C > 0``.
        ord: 2 (L2, for the Gaussian mechanism) or 1 (L1, for the Laplace mechanism).

    Returns:
        ``(clipped, norm)``: float64 copies with the same names and shapes, and the norm before clipping (handy
        for logging how often clipping was active).

    Raises:
        ConfigError: ``max_norm`` is not a finite number > 0, or ``ord`` is not 1 or 2.
        InputError: an array is not numeric or holds nan/inf.

    >>> import numpy as np
    >>> x = {"g": np.array([6.0, 8.0], dtype=np.float32)}
    >>> clipped, norm = clip_by_norm(x, 2.0)
    >>> norm, clipped["g"].round(6).tolist(), x["g"].tolist()
    (10.0, [1.2, 1.6], [6.0, 8.0])
    >>> clip_by_norm(x, 20.0)[0]["g"].tolist()
    [6.0, 8.0]
    """
    ord = _check_ord(ord)
    if isinstance(max_norm, bool) or not isinstance(max_norm, int | float) or not math.isfinite(max_norm) \
            or max_norm <= 0:
        raise ConfigError(f"max_norm must be a finite number > 0, got {max_norm!r}")
    arrays = {k: _as_float64(k, v).copy() for k, v in params.items()}
    norm = _norm(list(arrays.values()), ord)
    if norm <= max_norm:
        return arrays, norm
    scale = float(max_norm) / norm
    clipped = {k: a * scale for k, a in arrays.items()}
    # rounding may leave the norm an ulp above the bound; shrink until it is not (sensitivity must hold exactly)
    while _norm(list(clipped.values()), ord) > max_norm:
        scale *= 1.0 - 1e-12
        clipped = {k: a * scale for k, a in arrays.items()}
    return clipped, norm


def clip_float32(delta: Mapping[str, Any], clip_norm: float) -> tuple[dict[str, np.ndarray], bool]:
    """``delta`` clipped to L2 ``<= clip_norm`` as float32 arrays (what a client sends), shrunk further when the
    cast rounds the norm above the bound; and whether clipping was active.

    >>> import numpy as np
    >>> out, clipped = clip_float32({"d": np.array([3.0, 4.0])}, 1.0)
    >>> out["d"].dtype, global_norm(out) <= 1.0, clipped
    (dtype('float32'), True, True)
    """
    clipped, norm = clip_by_norm(delta, clip_norm)
    out = {k: v.astype(np.float32) for k, v in clipped.items()}
    scale = 1.0
    while global_norm(out) > clip_norm:
        scale *= 1.0 - 1e-6
        out = {k: (v * scale).astype(np.float32) for k, v in clipped.items()}
    return out, norm > clip_norm


def cap_counts(
    ids: Sequence[Hashable] | np.ndarray, counts: Sequence[float] | np.ndarray, max_total: float
) -> tuple[list[Hashable] | np.ndarray, np.ndarray, float]:
    """Scale a sparse non-negative count vector so that its total (L1 norm) is at most ``max_total``.

    ``ids[i]`` has count ``counts[i]`` (e.g. the n-grams of one utterance or one user and how often each
    occurs). If the total ``T = sum(counts)`` exceeds ``max_total``, every count is multiplied by
    ``max_total / T``; otherwise the counts are returned unchanged. Capped counts are fractional.

    Capping every utterance (or every user) this way bounds the L1 sensitivity of the summed count vector under
    adding or removing that utterance (user) by ``max_total``: a Laplace mechanism with ``sensitivity =
    max_total`` then protects the whole contribution. Since ``||c||_2 <= ||c||_1``, ``max_total`` also bounds
    the L2 sensitivity (loosely; use :func:`clip_by_norm` with ``ord=2`` for a tight Gaussian bound). To protect a
    *user* rather than an utterance, sum the user's utterances first and cap the user's total. Duplicate ids
    are allowed and each counts towards the total.

    Args:
        ids: the names of the non-zero coordinates (returned as a copy: a list, or an array if given one).
        counts: their non-negative, finite counts (same length as ``ids``).
        max_total: the bound ``T_max > 0`` on the total.

    Returns:
        ``(ids, capped_counts, total)``: a copy of the ids, float64 capped counts, and the total before capping.

    Raises:
        ConfigError: ``max_total`` is not a finite number > 0.
        InputError: lengths differ, or a count is negative, nan or inf.

    >>> ids, capped, total = cap_counts(["the cat", "cat sat"], [3, 1], max_total=2.0)
    >>> ids, capped.tolist(), total
    (['the cat', 'cat sat'], [1.5, 0.5], 4.0)
    >>> cap_counts(["a"], [1], max_total=2.0)[1].tolist()
    [1.0]
    """
    if isinstance(max_total, bool) or not isinstance(max_total, int | float) or not math.isfinite(max_total) \
            or max_total <= 0:
        raise ConfigError(f"max_total must be a finite number > 0, got {max_total!r}")
    c = _as_float64("counts", counts).copy()
    if c.ndim != 1:
        raise InputError(f"counts must be one-dimensional, got shape {c.shape}", expected="a 1-D count vector")
    if len(ids) != len(c):
        raise InputError(f"{len(ids)} ids but {len(c)} counts", expected="one count per id")
    if np.any(c < 0):
        raise InputError(f"counts must be non-negative, got {float(c.min())}", expected="counts >= 0")
    ids_out: list[Hashable] | np.ndarray = np.array(ids, copy=True) if isinstance(ids, np.ndarray) else list(ids)
    total = float(math.fsum(c.tolist()))
    if total <= max_total:
        return ids_out, c, total
    scale = float(max_total) / total
    capped = c * scale
    while math.fsum(capped.tolist()) > max_total:
        scale *= 1.0 - 1e-12
        capped = c * scale
    return ids_out, capped, total
