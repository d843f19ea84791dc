"""Secure aggregation: what a client's update becomes so that Flower's SecAgg+ can sum it, and back.

With secure aggregation the server never sees one client's update, only the **sum** over the round's
surviving cohort. The protocol is Flower's SecAgg+ (Bell et al. 2020): the client side is Flower's
``secaggplus_mod``, the server side the stages of Flower's ``SecAggPlusWorkflow``, driven round by round by
:class:`~privasr.federated.backends.flower.GridBackend` (see :mod:`privasr.federated.backends.flower_secagg`).
SecAgg+ sums integer vectors modulo ``2^32``, so every update must first become bounded dense arrays on a
fixed grid. This module does that, and nothing else; it has no Flower code:

* an algorithm turns its :class:`~privasr.federated.core.Update` into a :class:`Summand` (its
  ``secure_summand(update, bound)``): dense arrays whose element-wise sum over clients is what its
  ``accumulate`` would have built (FMP: counts dense over the vocabulary; fedlm and FTL: their weighted
  deltas), each with a bound ``b``, plus named scalars (the weight, summed metrics), each with a bound;
* :func:`encode` clips every value to ``[-b, b]``, adds the client's share of distributed DP noise when asked,
  and rounds ``(x + b) / 2b`` stochastically (unbiased, seeded by the client's generator) onto ``2^bits``
  levels, giving values ``v = 2k / 2^bits - 1`` in ``[-1, 1]`` that Flower's own quantiser (range ``[-1, 1]``,
  ``2^bits`` levels) maps to the integers ``k`` exactly;
* the server unmasks ``sum_i k_i`` and Flower dequantises it; :func:`decode` multiplies by the bounds, so the
  secure sum equals the plain sum within one quantisation step, ``2b / 2^bits``, per client and coordinate
  (expected error 0). Integer values whose bound is a power of two at most ``2^(bits-1)`` (the scalar counts:
  utterances, tokens) are on the grid and come back exactly.

Overflow: ``n`` clients' integers in ``[0, 2^bits]`` sum to less than ``2^32`` only when
``n < 2^(32 - bits)``: :meth:`SecAggSettings.max_cohort` (1023 with the default 22 bits).

>>> import numpy as np
>>> s = Summand({"counts": np.array([3.0, 0.0, 7.0])}, {"counts": 8.0}, {"utterances": (2.0, 1024.0)})
>>> rng = np.random.default_rng(0)
>>> values, layout, clipped = encode(s, 22, rng)
>>> total = [v + w for v, w in zip(values, encode(s, 22, rng)[0])]   # two clients sent the same
>>> arrays, scalars = decode(total, layout)
>>> arrays["counts"].tolist(), scalars, clipped
([6.0, 0.0, 14.0], {'utterances': 4.0, 'secagg_clipped': 0.0}, 0)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privasr.config import setting
from privasr.errors import ConfigError, InputError

__all__ = ["SecAggSettings", "Summand", "encode", "decode", "check_layouts", "summand_of", "MODULUS_BITS",
           "SCALAR_BOUND", "CLIPPED"]

MODULUS_BITS = 32
"""SecAgg+ sums modulo ``2^32`` (Flower's largest modulus)."""

SCALAR_BOUND = float(2 ** 20)
"""The bound of count-like scalars (utterances, tokens): integers up to a million come back exactly."""

CLIPPED = "secagg_clipped"
"""The scalar every encoded summand carries: how many of its values were clipped to their bound."""


@dataclass(frozen=True)
class SecAggSettings:
    """Secure aggregation of a run (a runner config's ``federated.secagg`` section; :mod:`privasr.config`).

    Attributes:
        enabled: sum updates with SecAgg+ (Flower backends only); off: the server sees every update.
        num_shares: each client's secrets are shared with this many neighbours: a fraction of the round's
            cohort (a float in ``(0, 1]``; 1.0: all of it) or a count (an integer >= 3).
        reconstruction_threshold: shares needed to reconstruct a secret: a fraction of ``num_shares`` in
            ``(0, 1]``. A coalition of the server and fewer clients than this learns nothing about one client's
            update; more clients than ``num_shares`` minus this may drop out of a round before it fails.
        min_cohort: a round must send to at least this many distinct clients (a sum over fewer is too close to
            one client's update); also checked when the run starts, against the sampler.
        bound: the bound ``b`` of every value of an update's arrays (values beyond are clipped on the client);
            ``None``: the algorithm's own (FMP 4096 counts; fedlm its ``clip_norm``; FTL needs one).
        quantization_bits: values are rounded to ``2^bits`` levels; a cohort may have at most
            ``2^(32 - bits) - 1`` clients.
        noise: with differential privacy: ``server`` (the server adds the noise once to the unmasked sum) or
            ``distributed`` (each client adds a share; the server never sees an un-noised sum).
        timeout: seconds the server waits for the replies of each protocol stage (``None``: the run's client
            timeout, else forever).

    >>> from privasr.config import from_mapping
    >>> s = from_mapping(SecAggSettings, {"enabled": True, "noise": "distributed"}, "federated.secagg")
    >>> s.max_cohort, s.noise
    (1023, 'distributed')
    >>> from_mapping(SecAggSettings, {"num_shares": 2}, "federated.secagg")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'federated.secagg': num_shares=2 (expected a fraction in (0, 1] or an integer >= 3)
    """

    enabled: bool = False
    num_shares: Any = 1.0
    reconstruction_threshold: float = setting(0.67, gt=0.0, max=1.0)
    min_cohort: int = setting(3, min=2)
    bound: float | None = setting(None, gt=0.0)
    quantization_bits: int = setting(22, min=8, max=30)
    noise: str = setting("server", choices=("server", "distributed"))
    timeout: float | None = setting(None, gt=0.0)

    def __post_init__(self) -> None:
        n = self.num_shares
        ok = (isinstance(n, float) and 0.0 < n <= 1.0) or (isinstance(n, int) and not isinstance(n, bool) and n >= 3)
        if not ok:
            raise ConfigError(f"num_shares={n!r}", expected="a fraction in (0, 1] or an integer >= 3")
        if self.bound is not None and not math.isfinite(self.bound):
            raise ConfigError(f"bound={self.bound!r}", expected="a finite number > 0")

    @property
    def max_cohort(self) -> int:
        """The largest cohort whose sum cannot overflow ``2^32``: ``2^(32 - bits) - 1``."""
        return 2 ** (MODULUS_BITS - self.quantization_bits) - 1

    def check_cohort(self, n: int, where: str = "the sampler") -> None:
        """Refuse a cohort of ``n`` distinct clients outside ``[min_cohort, max_cohort]``.

        >>> SecAggSettings(enabled=True).check_cohort(2)
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: the sampler gives cohorts of 2 clients (expected at least min_cohort=3 for secure aggregation: a sum over fewer clients is too close to one client's update)
        """
        if n < self.min_cohort:
            raise ConfigError(f"{where} gives cohorts of {n} clients",
                              expected=f"at least min_cohort={self.min_cohort} for secure aggregation: a sum over "
                                       "fewer clients is too close to one client's update")
        if n > self.max_cohort:
            raise ConfigError(f"{where} gives cohorts of {n} clients",
                              expected=f"at most {self.max_cohort} with quantization_bits={self.quantization_bits} "
                                       "(the sum must stay below 2^32); lower quantization_bits")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a JSON-able dict (for results.json and the run's identity)."""
        return {k: getattr(self, k) for k in ("enabled", "num_shares", "reconstruction_threshold", "min_cohort",
                                              "bound", "quantization_bits", "noise", "timeout")}


@dataclass(frozen=True)
class Summand:
    """One client's contribution to a secure sum.

    Attributes:
        arrays: name -> dense numeric array; summed element-wise over clients, they become the round's
            :class:`~privasr.federated.core.SumAccumulator` arrays (DP noise applies to them).
        bounds: name -> ``b > 0``: every value of that array is in ``[-b, b]`` (beyond is clipped).
        scalars: name -> ``(value, bound)``: numbers summed over clients (the weight, metrics); no DP noise.
    """

    arrays: Mapping[str, np.ndarray]
    bounds: Mapping[str, float]
    scalars: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.arrays) != set(self.bounds):
            raise InputError(f"secure summand arrays {sorted(self.arrays)} and bounds {sorted(self.bounds)}",
                             expected="one bound per array")
        for name, b in [*self.bounds.items(), *((k, v[1]) for k, v in self.scalars.items())]:
            if not (isinstance(b, int | float) and math.isfinite(b) and b > 0):
                raise InputError(f"secure summand bound of {name!r} is {b!r}", expected="a finite number > 0")
        if CLIPPED in self.scalars or CLIPPED in self.arrays:
            raise InputError(f"secure summand uses the reserved name {CLIPPED!r}")


def summand_of(arrays: Mapping[str, np.ndarray], bound: float, *, weight: tuple[float, float] | None = None,
               metrics: Mapping[str, tuple[float, float]] | None = None) -> Summand:
    """A :class:`Summand` with one bound for every array, the weight as the scalar ``weight`` and ``metrics``.

    >>> s = summand_of({"w": np.ones(2)}, 0.5, weight=(1.0, 1.0))
    >>> dict(s.bounds), dict(s.scalars)
    ({'w': 0.5}, {'weight': (1.0, 1.0)})
    """
    scalars = dict(metrics or {})
    if weight is not None:
        scalars["weight"] = weight
    return Summand({k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()},
                   {k: float(bound) for k in arrays}, scalars)


def _layout(summand: Summand) -> list[list[Any]]:
    """``[name, shape, bound]`` per array in name order, then ``["", [n], bounds...]`` for the scalars."""
    out: list[list[Any]] = [[k, list(np.shape(summand.arrays[k])), float(summand.bounds[k])]
                            for k in sorted(summand.arrays)]
    names = sorted(summand.scalars) + [CLIPPED]
    bounds = [float(summand.scalars[k][1]) for k in sorted(summand.scalars)] + [SCALAR_BOUND]
    out.append(["", names, bounds])
    return out


def _to_grid(x: np.ndarray, bound: np.ndarray | float, levels: int, rng: np.random.Generator) -> np.ndarray:
    """``x`` (already in ``[-bound, bound]``) stochastically rounded to ``v = 2k/levels - 1``, ``k`` integer."""
    u = (x + bound) / (2.0 * bound) * levels
    k = np.floor(u)
    k += rng.random(size=np.shape(u)) < (u - k)
    return np.clip(k, 0, levels) * (2.0 / levels) - 1.0


def encode(summand: Summand, bits: int, rng: np.random.Generator, noise: Any = None, noise_parts: int = 1
           ) -> tuple[list[np.ndarray], list[list[Any]], int]:
    """The values a client hands to SecAgg+, their layout and how many were clipped.

    Args:
        summand: the client's :class:`Summand`.
        bits: ``2^bits`` quantisation levels (:attr:`SecAggSettings.quantization_bits`).
        rng: the client's generator (stochastic rounding and noise: the same seed gives the same values).
        noise: a DP mechanism (:mod:`privasr.privacy.dp.mechanisms`) whose ``share`` is added to every array
            after clipping (``noise="distributed"``); ``None``: none.
        noise_parts: the number of shares that together make the mechanism's noise.

    Returns:
        One float64 array per summand array (name order) and one of the scalars, all on the grid in
        ``[-1, 1]``; the layout (:func:`decode` needs it; it holds names, shapes and bounds, the same for every
        client); the number of values clipped to their bound (data beyond the bound, or data plus noise
        beyond the widened bound, see below).

    With noise, an array's bound is widened by ten standard deviations of the share, so that clipping the
    noisy value almost never happens (it is counted).
    """
    levels = 2 ** int(bits)
    layout = _layout(summand)
    values: list[np.ndarray] = []
    clipped = 0
    for name, _, bound in layout[:-1]:
        x = np.asarray(summand.arrays[name], dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise InputError(f"secure summand {name!r} holds NaN or infinity", expected="finite values")
        clipped += int(np.count_nonzero(np.abs(x) > bound))
        x = np.clip(x, -bound, bound)
        if noise is not None:
            x = noise.share({name: x}, noise_parts, rng)[name]
            wide = bound + 10.0 * noise.share_std(noise_parts)
            clipped += int(np.count_nonzero(np.abs(x) > wide))
            x = np.clip(x, -wide, wide)
            bound = wide
        values.append(_to_grid(x, bound, levels, rng))
    if noise is not None:  # the widened bounds are what the server must decode with
        for entry in layout[:-1]:
            entry[2] = float(entry[2] + 10.0 * noise.share_std(noise_parts))
    names, bounds = layout[-1][1], np.asarray(layout[-1][2])
    raw = np.array([float(summand.scalars[k][0]) for k in names[:-1]] + [float(clipped)])
    if not np.all(np.isfinite(raw)):
        raise InputError("a secure summand scalar is NaN or infinite", expected="finite values")
    over = np.abs(raw) > bounds
    if over[:-1].any():
        clipped += int(np.count_nonzero(over[:-1]))
        raw[-1] = float(clipped)
    values.append(_to_grid(np.clip(raw, -bounds, bounds), bounds, levels, rng))
    return values, layout, clipped


def decode(total: Sequence[np.ndarray], layout: Sequence[Sequence[Any]]) -> tuple[dict[str, np.ndarray],
                                                                                    dict[str, float]]:
    """The summed arrays and scalars from the sum of the clients' encoded values (see the module docstring).

    Raises:
        InputError: the sum does not fit the layout (another algorithm, or a corrupt reply).
    """
    if len(total) != len(layout):
        raise InputError(f"a secure sum of {len(total)} arrays", expected=f"{len(layout)} as in the layout")
    arrays: dict[str, np.ndarray] = {}
    for (name, shape, bound), v in zip(layout[:-1], total[:-1], strict=True):
        v = np.asarray(v, dtype=np.float64)
        if list(v.shape) != list(shape):
            raise InputError(f"secure sum of {name!r} has shape {v.shape}", expected=f"{tuple(shape)}")
        arrays[name] = v * float(bound)
    names, bounds = layout[-1][1], np.asarray(layout[-1][2], dtype=np.float64)
    sv = np.asarray(total[-1], dtype=np.float64)
    if sv.shape != bounds.shape:
        raise InputError(f"secure sum of the scalars has shape {sv.shape}", expected=f"{bounds.shape}")
    return arrays, {k: float(x) for k, x in zip(names, sv * bounds, strict=True)}


def check_layouts(layouts: Sequence[Any]) -> list[list[Any]]:
    """The one layout every client sent; :class:`InputError` when they differ (clients of other runs).

    >>> check_layouts([[["x", [2], 1.0]], [["x", [2], 1.0]]])
    [['x', [2], 1.0]]
    """
    if not layouts:
        raise InputError("no client sent the layout of its secure summand")
    first = layouts[0]
    for other in layouts[1:]:
        if other != first:
            raise InputError("clients sent secure summands of different layouts",
                             expected="every client of a round encodes the same arrays")
    return [list(e) for e in first]
