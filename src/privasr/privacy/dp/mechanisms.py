"""Noise mechanisms for a differentially private sum, added once to the aggregate: by the server, or in shares.

Each contribution ``v_i`` (a client's clipped model delta, a user's capped count vector) is bounded first (see
:mod:`privasr.privacy.dp.clip`); the server then releases ``sum_i v_i + z`` with one draw of ``z``:

* **Gaussian** (:class:`GaussianMechanism`): ``||v_i||_2 <= C`` (``clip_norm``), ``z ~ N(0, s^2 I)`` with
  ``s = noise_multiplier * C``. Its accounting event is ``GaussianDpEvent(noise_multiplier)``
  (dp_accounting defines the noise multiplier as ``s / C``); epsilon comes from an accountant
  (:mod:`privasr.privacy.dp.accounting`).
* **Laplace** (:class:`LaplaceMechanism`): ``||v_i||_1 <= Delta`` (``sensitivity``), every coordinate of ``z``
  drawn from ``Laplace(0, b)`` (density ``exp(-|x| / b) / (2 b)``) with ``b = Delta / epsilon``: the release
  is ``epsilon``-DP (pure, ``delta = 0``) under adding or removing one contribution. Its accounting event is
  ``LaplaceDpEvent(b / Delta) = LaplaceDpEvent(1 / epsilon)``.

The noise is drawn from the generator the caller passes in, so :meth:`GaussianMechanism.add_noise` is a pure
function of ``(total, rng)``: the same seed gives the same noise, and counting how many times noise was added
(exactly once per round) is the caller's business.

**Distributed noise.** Under secure aggregation the server never sees the exact sum when each client adds a share
of the noise (:meth:`GaussianMechanism.share`, :meth:`LaplaceMechanism.share`): ``parts`` shares sum to exactly
the mechanism's noise (Gaussian: ``N(0, s^2 / parts)`` each; Laplace: the difference of two
``Gamma(1 / parts, b)`` draws each, as the Laplace distribution is infinitely divisible), and more shares to more
noise. ``with_shares(parts, received)`` is the mechanism that ran when ``received`` shares arrived; the federated
loop accounts for the calibrated ``parts`` shares instead (conservative, and independent of the cohort's size).

>>> import numpy as np
>>> mech = make_mechanism({"mechanism": "gaussian", "clip_norm": 0.5, "noise_multiplier": 2.0})
>>> mech.std
1.0
>>> total = {"w": np.zeros(3)}
>>> noisy = mech.add_noise(total, np.random.default_rng(0))
>>> noisy["w"].shape, total["w"].tolist()
((3,), [0.0, 0.0, 0.0])
>>> LaplaceMechanism(sensitivity=2.0, epsilon=0.5).scale
4.0
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from privasr.errors import ConfigError, InputError

if TYPE_CHECKING:  # pragma: no cover
    from dp_accounting import DpEvent

__all__ = ["GaussianMechanism", "LaplaceMechanism", "Mechanism", "make_mechanism", "MECHANISMS"]

MECHANISMS = ("gaussian", "laplace")
"""Names :func:`make_mechanism` accepts."""


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed)), "
                          f"got {type(rng).__name__}")
    return rng


def _noisy(total: Mapping[str, Any], draw: Any) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    # arrays in name order, so the same seed gives the same noise whatever order the mapping was built in
    for name in sorted(total):
        try:
            arr = np.array(total[name], dtype=np.float64)  # a copy: the input is never modified
        except (TypeError, ValueError) as e:
            raise InputError(f"aggregate {name!r} is not numeric ({e})", expected="a numeric array") from None
        if not np.all(np.isfinite(arr)):
            raise InputError(f"aggregate {name!r} holds non-finite values (nan or inf)", expected="finite numbers")
        out[name] = arr + draw(arr.shape)
    return {name: out[name] for name in total}


@dataclass(frozen=True)
class GaussianMechanism:
    """The Gaussian mechanism: add ``N(0, (noise_multiplier * clip_norm)^2)`` to every coordinate of a sum.

    Args:
        clip_norm: ``C``, the bound on the L2 norm of one contribution (the sum's L2 sensitivity under adding or
            removing one contribution; ``2 C`` under replacing one, which the accountant takes care of).
        noise_multiplier: ``s / C``; ``0`` adds no noise (and gives infinite epsilon).

    Raises:
        ConfigError: ``clip_norm`` is not a finite number > 0 or ``noise_multiplier`` not a finite number >= 0.

    >>> import numpy as np
    >>> m = GaussianMechanism(clip_norm=2.0, noise_multiplier=0.5)
    >>> m.std
    1.0
    >>> a = m.add_noise({"x": np.ones(2)}, np.random.default_rng(7))
    >>> b = m.add_noise({"x": np.ones(2)}, np.random.default_rng(7))
    >>> bool((a["x"] == b["x"]).all())
    True
    """

    clip_norm: float
    noise_multiplier: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_norm", _positive("clip_norm", self.clip_norm))
        object.__setattr__(self, "noise_multiplier",
                           _positive("noise_multiplier", self.noise_multiplier, allow_zero=True))

    @property
    def std(self) -> float:
        """Standard deviation of the noise on each coordinate, ``noise_multiplier * clip_norm``.

        >>> GaussianMechanism(0.5, 3.0).std
        1.5
        """
        return self.noise_multiplier * self.clip_norm

    def add_noise(self, total: Mapping[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A float64 copy of ``total`` with independent ``N(0, std^2)`` noise on every coordinate.

        Call it once per release, on the aggregate (never per client). Arrays are drawn in name order.

        Args:
            total: flat ``name -> array`` mapping (the sum of the clipped contributions); not modified.
            rng: the generator to draw from (the caller controls seeding).

        Raises:
            InputError: an array is not numeric or holds nan/inf.
            ConfigError: ``rng`` is not a ``numpy.random.Generator``.

        >>> import numpy as np
        >>> out = GaussianMechanism(1.0, 0.0).add_noise({"x": np.array([1, 2])}, np.random.default_rng(0))
        >>> out["x"].dtype, out["x"].tolist()
        (dtype('float64'), [1.0, 2.0])
        """
        rng = _check_rng(rng)
        std = self.std
        return _noisy(total, lambda shape: rng.normal(0.0, std, size=shape) if std > 0 else np.zeros(shape))

    def share(self, total: Mapping[str, Any], parts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``total`` plus one of ``parts`` shares of the noise: ``N(0, std^2 / parts)`` on every coordinate.

        Distributed DP: when ``parts`` clients each add a share to their own contribution, the sum carries
        exactly :meth:`add_noise`'s noise; ``m >= parts`` shares carry more.

        >>> import numpy as np
        >>> m = GaussianMechanism(1.0, 2.0)
        >>> x = sum(m.share({"x": np.zeros(100_000)}, 4, np.random.default_rng(i))["x"] for i in range(4))
        >>> round(float(x.std()), 1)
        2.0
        """
        rng = _check_rng(rng)
        std = self.share_std(parts)
        return _noisy(total, lambda shape: rng.normal(0.0, std, size=shape) if std > 0 else np.zeros(shape))

    def share_std(self, parts: int) -> float:
        """The standard deviation of one of ``parts`` shares, ``std / sqrt(parts)``.

        >>> GaussianMechanism(1.0, 2.0).share_std(4)
        1.0
        """
        return self.std / math.sqrt(_parts(parts))

    def with_shares(self, parts: int, received: int) -> GaussianMechanism:
        """The mechanism that ran when ``received`` of the ``parts``-way shares arrived (``received >= parts``):
        the noise multiplier grows by ``sqrt(received / parts)``.

        >>> GaussianMechanism(1.0, 2.0).with_shares(4, 9).noise_multiplier
        3.0
        """
        return GaussianMechanism(self.clip_norm, self.noise_multiplier * math.sqrt(received / _parts(parts)))

    def dp_event(self) -> DpEvent:
        """The accounting event of one release: ``dp_accounting.GaussianDpEvent(noise_multiplier)``.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> GaussianMechanism(0.5, 1.1).dp_event()
        GaussianDpEvent(noise_multiplier=1.1)
        """
        from dp_accounting import GaussianDpEvent

        return GaussianDpEvent(self.noise_multiplier)

    def to_spec(self) -> dict[str, Any]:
        """The configuration :func:`make_mechanism` rebuilds this mechanism from.

        >>> GaussianMechanism(0.5, 1.5).to_spec()
        {'mechanism': 'gaussian', 'clip_norm': 0.5, 'noise_multiplier': 1.5}
        """
        return {"mechanism": "gaussian", "clip_norm": self.clip_norm, "noise_multiplier": self.noise_multiplier}


@dataclass(frozen=True)
class LaplaceMechanism:
    """The Laplace mechanism: add ``Laplace(0, b)`` with ``b = sensitivity / epsilon`` to every coordinate.

    One release is ``epsilon``-DP (``delta = 0``) when one contribution changes the sum by at most
    ``sensitivity`` in L1 norm (adding or removing it).

    Args:
        sensitivity: ``Delta``, the L1 sensitivity of the sum (e.g. the ``max_total`` of
            :func:`~privasr.privacy.dp.clip.cap_counts`).
        epsilon: the privacy parameter of one release.

    Raises:
        ConfigError: either is not a finite number > 0.

    >>> LaplaceMechanism(sensitivity=1.0, epsilon=0.5).scale
    2.0
    >>> LaplaceMechanism(1.0, 0.5).noise_multiplier
    2.0
    """

    sensitivity: float
    epsilon: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "sensitivity", _positive("sensitivity", self.sensitivity))
        object.__setattr__(self, "epsilon", _positive("epsilon", self.epsilon))

    @property
    def scale(self) -> float:
        """The Laplace scale ``b = sensitivity / epsilon`` (standard deviation ``sqrt(2) b``).

        >>> LaplaceMechanism(3.0, 1.5).scale
        2.0
        """
        return self.sensitivity / self.epsilon

    @property
    def noise_multiplier(self) -> float:
        """``b / sensitivity = 1 / epsilon``, the parameter of ``dp_accounting.LaplaceDpEvent``.

        >>> LaplaceMechanism(3.0, 0.25).noise_multiplier
        4.0
        """
        return 1.0 / self.epsilon

    def add_noise(self, total: Mapping[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """A float64 copy of ``total`` with independent ``Laplace(0, scale)`` noise on every coordinate.

        Args:
            total: flat ``name -> array`` mapping (the sum of the capped contributions); not modified.
            rng: the generator to draw from (the caller controls seeding).

        Raises:
            InputError: an array is not numeric or holds nan/inf.
            ConfigError: ``rng`` is not a ``numpy.random.Generator``.

        >>> import numpy as np
        >>> counts = {"bigrams": np.array([5.0, 0.0, 2.0])}
        >>> noisy = LaplaceMechanism(1.0, 1.0).add_noise(counts, np.random.default_rng(0))
        >>> noisy["bigrams"].shape, counts["bigrams"].tolist()
        ((3,), [5.0, 0.0, 2.0])
        """
        rng = _check_rng(rng)
        b = self.scale
        return _noisy(total, lambda shape: rng.laplace(0.0, b, size=shape))

    def share(self, total: Mapping[str, Any], parts: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``total`` plus one of ``parts`` shares of the noise: ``Gamma(1/parts, b) - Gamma(1/parts, b)``.

        The Laplace distribution is infinitely divisible: the sum of ``parts`` such shares is exactly
        ``Laplace(0, b)``; ``m > parts`` shares are ``Laplace(0, b)`` plus independent noise, which cannot weaken
        the guarantee.

        >>> import numpy as np
        >>> m = LaplaceMechanism(1.0, 0.5)
        >>> x = sum(m.share({"x": np.zeros(200_000)}, 3, np.random.default_rng(i))["x"] for i in range(3))
        >>> round(float(np.abs(x).mean()), 1)   # the mean absolute value of Laplace(0, b) is b
        2.0
        """
        rng = _check_rng(rng)
        k, b = 1.0 / _parts(parts), self.scale
        return _noisy(total, lambda shape: rng.gamma(k, b, size=shape) - rng.gamma(k, b, size=shape))

    def share_std(self, parts: int) -> float:
        """The standard deviation of one of ``parts`` shares, ``b * sqrt(2 / parts)``.

        >>> LaplaceMechanism(1.0, 1.0).share_std(2)
        1.0
        """
        return self.scale * math.sqrt(2.0 / _parts(parts))

    def with_shares(self, parts: int, received: int) -> LaplaceMechanism:
        """The mechanism to account for when ``received >= parts`` shares arrived: this one (the extra noise is
        not counted, which is conservative).

        >>> LaplaceMechanism(1.0, 0.5).with_shares(3, 5).epsilon
        0.5
        """
        return self

    def dp_event(self) -> DpEvent:
        """The accounting event of one release: ``dp_accounting.LaplaceDpEvent(b / sensitivity)``.

        dp_accounting's ``LaplaceDpEvent.noise_multiplier`` is the Laplace parameter divided by the L1 bound, so
        the event is ``LaplaceDpEvent(1 / epsilon)``.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> LaplaceMechanism(2.0, 0.5).dp_event()
        LaplaceDpEvent(noise_multiplier=2.0)
        """
        from dp_accounting import LaplaceDpEvent

        return LaplaceDpEvent(self.noise_multiplier)

    def to_spec(self) -> dict[str, Any]:
        """The configuration :func:`make_mechanism` rebuilds this mechanism from.

        >>> LaplaceMechanism(1.0, 0.5).to_spec()
        {'mechanism': 'laplace', 'sensitivity': 1.0, 'epsilon': 0.5}
        """
        return {"mechanism": "laplace", "sensitivity": self.sensitivity, "epsilon": self.epsilon}


def _parts(parts: Any) -> int:
    if isinstance(parts, bool) or not isinstance(parts, int | np.integer) or parts < 1:
        raise ConfigError(f"parts={parts!r}", expected="an integer >= 1 (the number of noise shares)")
    return int(parts)


Mechanism = GaussianMechanism | LaplaceMechanism
"""Either noise mechanism."""

_KEYS = {"gaussian": ("clip_norm", "noise_multiplier"), "laplace": ("sensitivity", "epsilon")}


def make_mechanism(spec: Mapping[str, Any]) -> Mechanism:
    """Build a mechanism from a configuration mapping.

    ``{"mechanism": "gaussian", "clip_norm": C, "noise_multiplier": z}`` or
    ``{"mechanism": "laplace", "sensitivity": Delta, "epsilon": eps}``; every key is required and no other key
    is allowed.

    Raises:
        ConfigError: not a mapping, unknown mechanism, a missing or unknown key, or a value out of range.

    >>> make_mechanism({"mechanism": "laplace", "sensitivity": 1.0, "epsilon": 1.0})
    LaplaceMechanism(sensitivity=1.0, epsilon=1.0)
    >>> make_mechanism({"mechanism": "gaussian", "clip_norm": 1.0, "noise_multiplier": 1.0, "sigma": 2})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: unknown key 'sigma' in the gaussian mechanism's configuration (expected only ...)
    """
    if not isinstance(spec, Mapping):
        raise ConfigError(f"mechanism configuration must be a mapping, got {type(spec).__name__}")
    kind = spec.get("mechanism")
    if kind not in _KEYS:
        raise ConfigError(f"unknown mechanism {kind!r}", expected=f"'mechanism' set to one of {list(MECHANISMS)}")
    allowed = ("mechanism", *_KEYS[kind])
    for key in spec:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!r} in the {kind} mechanism's configuration",
                              expected=f"only {', '.join(allowed)}")
    missing = [k for k in _KEYS[kind] if k not in spec]
    if missing:
        raise ConfigError(f"the {kind} mechanism's configuration lacks {', '.join(missing)}",
                          expected=f"keys {', '.join(allowed)}")
    if kind == "gaussian":
        return GaussianMechanism(clip_norm=spec["clip_norm"], noise_multiplier=spec["noise_multiplier"])
    return LaplaceMechanism(sensitivity=spec["sensitivity"], epsilon=spec["epsilon"])
