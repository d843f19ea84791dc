"""Client samplers: which of the ``K`` clients take part in a federated round.

* :class:`AllClients` -- every client, every round (``q = 1``).
* :class:`UniformWithoutReplacement` -- ``n`` distinct clients drawn uniformly (``q = n / K``), sorted.
* :class:`UniformWithReplacement` -- ``n`` independent uniform draws, so a client may appear more than once;
  the clients are "returned to the pool" after every round (paper 002, section 3.1).
* :class:`Poisson` -- every client joins independently with probability ``q = rate``; the number of clients
  is ``Binomial(K, q)`` and may be zero. This is the sampling the moments/RDP accountants assume.

The randomness of round ``r`` depends only on ``(seed, r)`` and a fixed tag of the sampler kind: the generator
is ``numpy.random.default_rng([seed, r, tag])``, so a run resumed at round ``r`` samples exactly the clients
the uninterrupted run would have, whatever happened in earlier rounds.

:meth:`Sampler.sampling_probability` is the ``q`` a privacy accountant needs. A sampler's :meth:`to_dict`
is its configuration form and :func:`make_sampler` reads it back.

>>> s = make_sampler({"kind": "without_replacement", "n": 3})
>>> s.sample(10, round=0, seed=7).tolist() == s.sample(10, round=0, seed=7).tolist()
True
>>> len(s.sample(10, round=1, seed=7)), s.sampling_probability(10)
(3, 0.3)
>>> make_sampler("all").sample(4, round=5, seed=0).tolist()
[0, 1, 2, 3]
>>> make_sampler(s.to_dict()) == s
True
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from privasr.config import setting
from privasr.errors import ConfigError
from privasr.federated.secagg import SecAggSettings

__all__ = [
    "Sampler",
    "AllClients",
    "UniformWithoutReplacement",
    "UniformWithReplacement",
    "Poisson",
    "make_sampler",
    "SAMPLER_KINDS",
    "FederationSettings",
]


def _nonneg_int(name: str, value: Any) -> int:
    """``value`` as a Python int >= 0, or a ConfigError naming ``name``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be an integer >= 0, got {value!r}") from None
    if v < 0:
        raise ConfigError(f"{name} must be an integer >= 0, got {v}")
    return v


def _population(population: Any) -> int:
    k = _nonneg_int("population", population)
    if k < 1:
        raise ConfigError(f"population must be at least 1 client, got {k}")
    return k


@dataclass(frozen=True)
class Sampler:
    """Base class of the client samplers (frozen dataclasses; see the module docstring).

    Subclasses set ``_KIND`` and ``_TAG`` and implement ``_draw(rng, population)``.

    >>> AllClients().kind
    'all'
    """

    _KIND: ClassVar[str] = ""
    _TAG: ClassVar[int] = 0

    @property
    def kind(self) -> str:
        """The sampler kind: ``"all"``, ``"without_replacement"``, ``"with_replacement"`` or ``"poisson"``."""
        return self._KIND

    def rng(self, round: int, seed: int) -> np.random.Generator:
        """The generator of round ``round``: ``default_rng([seed, round, tag])`` (independent of other rounds).

        >>> a, b = Poisson(0.5).rng(3, 1), Poisson(0.5).rng(3, 1)
        >>> a.random() == b.random()
        True
        """
        r = _nonneg_int("round", round)
        s = _nonneg_int("seed", seed)
        return np.random.default_rng([s, r, self._TAG])

    def sample(self, population: int, round: int, seed: int) -> np.ndarray:
        """The indices (int64, into ``0..population-1``) of the clients taking part in round ``round``.

        Args:
            population: number of clients ``K`` (>= 1).
            round: 0-based round number.
            seed: the run's seed (>= 0).

        Returns:
            A 1-D int64 array; see each sampler for order, duplicates and size.

        >>> UniformWithReplacement(5).sample(3, round=0, seed=0).shape
        (5,)
        """
        k = _population(population)
        out = np.asarray(self._draw(self.rng(round, seed), k), dtype=np.int64)
        return out

    def _draw(self, rng: np.random.Generator, population: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def sampling_probability(self, population: int) -> float:
        """The sampling ratio ``q`` a privacy accountant uses for a population of ``population`` clients.

        >>> AllClients().sampling_probability(100)
        1.0
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def to_dict(self) -> dict[str, Any]:
        """The configuration form (read back by :func:`make_sampler`).

        >>> Poisson(0.25).to_dict()
        {'kind': 'poisson', 'rate': 0.25}
        """
        raise NotImplementedError  # pragma: no cover - abstract


@dataclass(frozen=True)
class AllClients(Sampler):
    """Every client, every round, in index order (``q = 1``).

    >>> AllClients().sample(3, round=0, seed=0).tolist()
    [0, 1, 2]
    """

    _KIND: ClassVar[str] = "all"
    _TAG: ClassVar[int] = 0x5A0

    def _draw(self, rng: np.random.Generator, population: int) -> np.ndarray:
        return np.arange(population, dtype=np.int64)

    def sampling_probability(self, population: int) -> float:
        """Always ``1.0`` (every client takes part).

        >>> AllClients().sampling_probability(7)
        1.0
        """
        _population(population)
        return 1.0

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "all"}``.

        >>> AllClients().to_dict()
        {'kind': 'all'}
        """
        return {"kind": self._KIND}


def _positive_n(value: Any) -> int:
    n = _nonneg_int("n", value)
    if n < 1:
        raise ConfigError(f"n (clients per round) must be an integer >= 1, got {n}")
    return n


@dataclass(frozen=True)
class UniformWithoutReplacement(Sampler):
    """``n`` distinct clients drawn uniformly at random, returned sorted ascending (``q = n / K``).

    Every subset of size ``n`` is equally likely, so every client takes part with probability ``n / K``.
    ``n`` larger than the population is a :class:`~privasr.errors.ConfigError`.

    Attributes:
        n: clients per round (>= 1).

    >>> idx = UniformWithoutReplacement(4).sample(10, round=2, seed=1)
    >>> len(set(idx.tolist())), bool((idx[:-1] < idx[1:]).all())
    (4, True)
    """

    n: int

    _KIND: ClassVar[str] = "without_replacement"
    _TAG: ClassVar[int] = 0x5A1

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _positive_n(self.n))

    def _check(self, population: int) -> int:
        k = _population(population)
        if self.n > k:
            raise ConfigError(
                f"cannot sample n={self.n} distinct clients from a population of {k}",
                expected=f"n <= {k}, or sampling with replacement",
            )
        return k

    def sample(self, population: int, round: int, seed: int) -> np.ndarray:
        """``n`` distinct client indices, sorted ascending (see :meth:`Sampler.sample`).

        >>> UniformWithoutReplacement(3).sample(3, round=0, seed=0).tolist()
        [0, 1, 2]
        """
        self._check(population)
        return super().sample(population, round, seed)

    def _draw(self, rng: np.random.Generator, population: int) -> np.ndarray:
        return np.sort(rng.choice(population, size=self.n, replace=False))

    def sampling_probability(self, population: int) -> float:
        """``n / K``.

        >>> UniformWithoutReplacement(10).sampling_probability(1000)
        0.01
        """
        return self.n / self._check(population)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "without_replacement", "n": n}``.

        >>> UniformWithoutReplacement(2).to_dict()
        {'kind': 'without_replacement', 'n': 2}
        """
        return {"kind": self._KIND, "n": self.n}


@dataclass(frozen=True)
class UniformWithReplacement(Sampler):
    """``n`` independent uniform draws, in draw order, duplicates kept (paper 002: clients return to the pool).

    ``n`` may exceed the population. A client drawn twice contributes twice, so its influence on the round
    (and its privacy sensitivity) is multiplied accordingly.

    Attributes:
        n: draws per round (>= 1).

    >>> UniformWithReplacement(6).sample(2, round=0, seed=0).tolist()
    [1, 0, 1, 1, 0, 0]
    """

    n: int

    _KIND: ClassVar[str] = "with_replacement"
    _TAG: ClassVar[int] = 0x5A2

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _positive_n(self.n))

    def _draw(self, rng: np.random.Generator, population: int) -> np.ndarray:
        return rng.integers(0, population, size=self.n, dtype=np.int64)

    def sampling_probability(self, population: int) -> float:
        """``min(1, n / K)``: the expected number of times a client is drawn, capped at 1.

        This is an upper bound on the exact inclusion probability ``1 - (1 - 1/K) ** n`` and is what
        N-of-K accounting uses; an accountant must still account for a client being drawn more than once.

        >>> UniformWithReplacement(5).sampling_probability(100)
        0.05
        """
        k = _population(population)
        return min(1.0, self.n / k)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "with_replacement", "n": n}``.

        >>> UniformWithReplacement(2).to_dict()
        {'kind': 'with_replacement', 'n': 2}
        """
        return {"kind": self._KIND, "n": self.n}


@dataclass(frozen=True)
class Poisson(Sampler):
    """Every client joins independently with probability ``rate`` (``q = rate``); sorted; possibly empty.

    Attributes:
        rate: the per-client inclusion probability, ``0 < rate <= 1``.

    >>> Poisson(1.0).sample(3, round=9, seed=9).tolist()
    [0, 1, 2]
    """

    rate: float

    _KIND: ClassVar[str] = "poisson"
    _TAG: ClassVar[int] = 0x5A3

    def __post_init__(self) -> None:
        r = self.rate
        if isinstance(r, bool) or not isinstance(r, int | float | np.integer | np.floating) or not math.isfinite(r) \
                or not 0 < r <= 1:
            raise ConfigError(f"Poisson sampling rate must be a number in (0, 1], got {r!r}")
        object.__setattr__(self, "rate", float(r))

    def _draw(self, rng: np.random.Generator, population: int) -> np.ndarray:
        return np.flatnonzero(rng.random(population) < self.rate)

    def sampling_probability(self, population: int) -> float:
        """``rate``.

        >>> Poisson(0.1).sampling_probability(50)
        0.1
        """
        _population(population)
        return self.rate

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": "poisson", "rate": rate}``.

        >>> Poisson(0.5).to_dict()
        {'kind': 'poisson', 'rate': 0.5}
        """
        return {"kind": self._KIND, "rate": self.rate}


_CLASSES: dict[str, type[Sampler]] = {
    cls._KIND: cls for cls in (AllClients, UniformWithoutReplacement, UniformWithReplacement, Poisson)
}
_FIELDS: dict[str, tuple[str, ...]] = {
    "all": (),
    "without_replacement": ("n",),
    "with_replacement": ("n",),
    "poisson": ("rate",),
}

SAMPLER_KINDS = tuple(_CLASSES)
"""The sampler kinds :func:`make_sampler` accepts."""


def make_sampler(spec: str | Mapping[str, Any] | Sampler) -> Sampler:
    """A sampler from its configuration form.

    ``spec`` is ``"all"``, or a mapping with ``kind`` and that kind's fields:
    ``{"kind": "without_replacement", "n": 10}``, ``{"kind": "with_replacement", "n": 10}``,
    ``{"kind": "poisson", "rate": 0.1}``, ``{"kind": "all"}``. A :class:`Sampler` is returned unchanged.

    Raises:
        ConfigError: an unknown kind, a missing or unknown field, or a field out of range.

    >>> make_sampler({"kind": "poisson", "rate": 0.1})
    Poisson(rate=0.1)
    >>> make_sampler({"kind": "poisson", "n": 3})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: unknown field 'n' for sampler kind 'poisson' (expected only ['rate'])
    """
    if isinstance(spec, Sampler):
        return spec
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, Mapping):
        raise ConfigError(f"sampler spec is a {type(spec).__name__}",
                          expected="'all' or a mapping like {'kind': 'poisson', 'rate': 0.1}")
    fields = dict(spec)
    kind = fields.pop("kind", None)
    if kind not in _CLASSES:
        raise ConfigError(f"unknown sampler kind {kind!r}", expected=f"one of {list(SAMPLER_KINDS)}")
    allowed = _FIELDS[kind]
    for key in fields:
        if key not in allowed:
            raise ConfigError(f"unknown field {key!r} for sampler kind {kind!r}", expected=f"only {list(allowed)}")
    for key in allowed:
        if key not in fields:
            raise ConfigError(f"sampler kind {kind!r} needs the field {key!r}")
    return _CLASSES[kind](**fields)


@dataclass(frozen=True)
class FederationSettings:
    """A runner config's ``federated`` section (schema of :mod:`privasr.config`), every key optional.

    ``backend``: ``local`` | ``ray`` | ``flower``; ``backend_options``: passed to the backend; ``sampler``:
    ``all`` or a sampler spec (:func:`make_sampler`); ``min_clients``: without DP a round that sampled clients
    of which fewer reported fails (a round that sampled nobody is skipped); with the server's DP noise it must be
    1 (every round is released); with distributed noise it is the number of noise shares
    (:func:`~privasr.federated.loop.run_federated`, docs/federated.md);
    ``secagg``: secure aggregation (:class:`~privasr.federated.secagg.SecAggSettings`; ``flower`` only).

    >>> from privasr.config import from_mapping
    >>> from_mapping(FederationSettings, {"sampler": {"kind": "poisson", "rate": 0.2}}, "federated").make_sampler()
    Poisson(rate=0.2)
    """

    backend: str = setting("local", choices=("local", "ray", "flower"))
    backend_options: dict[str, Any] = field(default_factory=dict)
    sampler: Any = "all"
    min_clients: int = setting(1, min=1)
    secagg: SecAggSettings = field(default_factory=SecAggSettings)

    def __config_check__(self, where: str, ctx: Any) -> None:
        if self.secagg.enabled and self.backend != "flower":
            raise ConfigError(f"config key '{where}.secagg.enabled': secure aggregation on the {self.backend} "
                              "backend", expected="backend: flower (SecAgg+ runs between Flower's ServerApp and "
                                                  "ClientApps)")
        try:
            self.make_sampler()
        except ConfigError as e:
            raise ConfigError(f"config key '{where}.sampler': {e.message}", expected=e.expected) from None

    def make_sampler(self) -> Any:
        """The client sampler the ``sampler`` spec describes."""
        return make_sampler(self.sampler)
