"""Privacy accounting: how much (epsilon, delta) a sequence of noisy releases costs, via Google's dp_accounting.

One federated round releases a noisy sum over the participants the sampler chose; its *event* is the
mechanism's event (:meth:`~privasr.privacy.dp.mechanisms.GaussianMechanism.dp_event`) wrapped in the
sampling that picked the participants (:func:`round_event`), and ``T`` rounds compose. An (epsilon, delta)
guarantee means ``P[M(D) in S] <= e^epsilon P[M(D') in S] + delta`` for all neighbouring datasets ``D, D'``
(whose unit -- utterance, user, client -- is whatever one contribution is).

Accountants (``accountant=``):

* ``"rdp"`` -- Renyi DP (Mironov 2017; the moments accountant of Abadi et al. 2016): composition adds RDP
  curves, converted to (epsilon, delta) at the end. Fast; an upper bound that is a little loose.
* ``"pld"`` -- privacy loss distributions (Meiser & Mohammadi 2018; Koskela et al. 2020): near-exact, slower.
  **Recommended for Laplace**: ``T`` pure-DP Laplace releases at ``epsilon_0`` each compose to ``T
  epsilon_0`` with ``delta ~ 0``, which PLD reproduces (and improves on for larger ``delta``), while RDP,
  never reaching pure DP, reports slightly more than ``T epsilon_0`` at tiny ``delta``.

Neighbouring relations (``neighboring=``): ``"add_or_remove_one"`` (``D'`` lacks one unit of ``D``) or
``"replace_one"`` (``D'`` has one unit changed; the population size is public). Noise multipliers here are
always *per contribution bound* (``std / clip_norm``, ``b / sensitivity``), so replacing one contribution moves
the sum twice as far as adding one. The PLD accountant accounts for this itself; dp_accounting's RDP accountant
does not (under ``REPLACE_ONE`` it reads the noise multiplier as relative to the replace-one sensitivity), so
with ``accountant="rdp", neighboring="replace_one"`` every Gaussian and Laplace noise multiplier is halved
before it reaches dp_accounting -- the conservative, correct reading.

What each combination supports (:data:`SUPPORTED`; anything else raises :class:`~privasr.errors.ConfigError`,
never a silent substitute):

==================  ==========================  ==============================================================
mechanism           sampler                     accountant / neighbouring relation
==================  ==========================  ==============================================================
gaussian            all (no amplification)      rdp or pld, add_or_remove_one or replace_one
gaussian            poisson                     rdp + add_or_remove_one; pld + add_or_remove_one or replace_one
gaussian            without_replacement         rdp + replace_one only
gaussian            with_replacement            none
laplace             all                         rdp + either relation; pld + add_or_remove_one
laplace             poisson                     pld + add_or_remove_one only
laplace             without/with_replacement    none
==================  ==========================  ==============================================================

>>> import pytest
>>> _ = pytest.importorskip("dp_accounting")
>>> from privasr.privacy.dp.mechanisms import GaussianMechanism
>>> acct = PrivacyAccountant("rdp", target_delta=1e-5)
>>> event = round_event(GaussianMechanism(0.5, 1.1).dp_event(), "poisson", sampling_probability=0.01)
>>> acct.step(event, count=100)
>>> round(acct.epsilon(), 3)
0.956
>>> round(epsilon_for(1.1, 100, "poisson", q=0.01), 3)
0.956
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from privasr.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from dp_accounting import DpEvent
    from dp_accounting import PrivacyAccountant as _NativeAccountant

__all__ = [
    "PrivacyAccountant", "round_event", "epsilon_for", "noise_for_epsilon", "event_to_dict", "event_from_dict",
    "ACCOUNTANTS", "NEIGHBORING", "SAMPLERS", "SUPPORTED", "PldCost", "pld_cost", "PLD_MAX_SECONDS", "PLD_MAX_GIB",
]

ACCOUNTANTS = ("rdp", "pld")
"""Accountant names: Renyi DP or privacy loss distributions."""

NEIGHBORING = ("add_or_remove_one", "replace_one")
"""Neighbouring relations."""

SAMPLERS = ("all", "poisson", "without_replacement", "with_replacement")
"""How a round's participants are chosen (``"all"``: everyone, no amplification by sampling)."""

_EVERY = (("rdp", "add_or_remove_one"), ("rdp", "replace_one"), ("pld", "add_or_remove_one"), ("pld", "replace_one"))
SUPPORTED: dict[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("gaussian", "all"): _EVERY,
    ("gaussian", "poisson"): (("rdp", "add_or_remove_one"), ("pld", "add_or_remove_one"), ("pld", "replace_one")),
    ("gaussian", "without_replacement"): (("rdp", "replace_one"),),
    ("gaussian", "with_replacement"): (),
    ("laplace", "all"): (("rdp", "add_or_remove_one"), ("rdp", "replace_one"), ("pld", "add_or_remove_one")),
    ("laplace", "poisson"): (("pld", "add_or_remove_one"),),
    ("laplace", "without_replacement"): (),
    ("laplace", "with_replacement"): (),
}
"""``(mechanism, sampler) -> ((accountant, neighboring), ...)`` that dp_accounting can account for."""


class _QuietRdpOrders(logging.Filter):
    """Drops dp_accounting's "failed to converge ... Excluding this order" warnings.

    The RDP accountant evaluates a grid of orders and reports the smallest epsilon over them; an order whose
    series does not converge is left out, which keeps the result a valid bound. At small noise or large
    sampling rates it prints one such line per order at every composition, dozens per round. The count of
    dropped lines is kept in :attr:`dropped`.
    """

    dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "failed to converge" in record.getMessage() and "Excluding this order" in record.getMessage():
            type(self).dropped += 1
            return False
        return True


def _dp() -> Any:
    try:
        import dp_accounting
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("differential privacy accounting needs the dp-accounting package, which is not installed",
                          expected="pip install 'privasr[federated]' (or 'dp-accounting>=0.4')") from None
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _QuietRdpOrders) for f in absl.filters):
        absl.addFilter(_QuietRdpOrders())
    return dp_accounting


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _choice(name: str, value: Any, options: tuple[str, ...]) -> str:
    if value not in options:
        raise ConfigError(f"unknown {name} {value!r}", expected=f"one of {list(options)}")
    return value


def _delta(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ConfigError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


# --------------------------------------------------------------------------------------------------- events


def round_event(
    mechanism_event: DpEvent,
    sampler_kind: str,
    sampling_probability: float | None = None,
    sample_size: int | None = None,
    population: int | None = None,
) -> DpEvent:
    """The accounting event of one round: the mechanism's event inside the sampling that chose the participants.

    * ``"poisson"``: every unit joins independently with probability ``sampling_probability`` ->
      ``PoissonSampledDpEvent(q, event)``;
    * ``"without_replacement"``: ``sample_size`` distinct units out of ``population``, uniformly ->
      ``SampledWithoutReplacementDpEvent(population, sample_size, event)``;
    * ``"with_replacement"``: ``sample_size`` draws with replacement ->
      ``SampledWithReplacementDpEvent(population, sample_size, event)`` (no dp_accounting accountant supports
      it: :meth:`PrivacyAccountant.step` will refuse it);
    * ``"all"``: everyone takes part -> the event itself (no amplification).

    It must describe the sampler actually used; parameters that do not belong to the sampler are refused.

    Raises:
        ConfigError: unknown sampler, a missing, superfluous or out-of-range parameter.

    >>> import pytest
    >>> dp_accounting = pytest.importorskip("dp_accounting")
    >>> g = dp_accounting.GaussianDpEvent(1.0)
    >>> round_event(g, "poisson", sampling_probability=0.1)
    PoissonSampledDpEvent(sampling_probability=0.1, event=GaussianDpEvent(noise_multiplier=1.0))
    >>> wor = round_event(g, "without_replacement", sample_size=10, population=1000)
    >>> type(wor).__name__, wor.source_dataset_size, wor.sample_size, wor.event is g
    ('SampledWithoutReplacementDpEvent', 1000, 10, True)
    >>> round_event(g, "all") is g
    True
    """
    dp = _dp()
    _choice("sampler", sampler_kind, SAMPLERS)
    if not isinstance(mechanism_event, dp.DpEvent):
        raise ConfigError(f"mechanism_event must be a dp_accounting DpEvent, got {type(mechanism_event).__name__}")
    given = {"sampling_probability": sampling_probability, "sample_size": sample_size, "population": population}
    needs = {"all": (), "poisson": ("sampling_probability",), "without_replacement": ("sample_size", "population"),
             "with_replacement": ("sample_size", "population")}[sampler_kind]
    extra = [k for k, v in given.items() if v is not None and k not in needs]
    missing = [k for k in needs if given[k] is None]
    if extra or missing:
        what = " and ".join(needs) if needs else "no sampling parameters"
        problem = (f"lacks {', '.join(missing)}" if missing else "") + ("; " if missing and extra else "") + \
                  (f"does not take {', '.join(extra)}" if extra else "")
        raise ConfigError(f"sampler {sampler_kind!r} {problem}", expected=what)
    if sampler_kind == "all":
        return mechanism_event
    if sampler_kind == "poisson":
        q = sampling_probability
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q <= 1:
            raise ConfigError(f"sampling_probability must be a number in (0, 1], got {q!r}")
        return dp.PoissonSampledDpEvent(float(q), mechanism_event)
    if not _is_int(population) or population < 1:
        raise ConfigError(f"population must be an integer >= 1, got {population!r}")
    if not _is_int(sample_size) or not 1 <= sample_size <= population:
        raise ConfigError(f"sample_size must be an integer in [1, population={population}], got {sample_size!r}")
    cls = dp.SampledWithoutReplacementDpEvent if sampler_kind == "without_replacement" \
        else dp.SampledWithReplacementDpEvent
    return cls(population, sample_size, mechanism_event)


def _jsonable(value: Any) -> Any:
    dp = _dp()
    if isinstance(value, dp.DpEvent):
        return event_to_dict(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return value.item()
    return value


def event_to_dict(event: DpEvent) -> dict[str, Any]:
    """A JSON-friendly dict of a dp_accounting event: ``{"type": class name, field: value, ...}``, nested.

    >>> import pytest
    >>> dp_accounting = pytest.importorskip("dp_accounting")
    >>> event_to_dict(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'type': 'PoissonSampledDpEvent', 'sampling_probability': 0.1,
     'event': {'type': 'GaussianDpEvent', 'noise_multiplier': 1.0}}
    """
    import attr

    dp = _dp()
    if not isinstance(event, dp.DpEvent):
        raise ConfigError(f"not a dp_accounting DpEvent: {event!r}")
    out: dict[str, Any] = {"type": type(event).__name__}
    for f in attr.fields(type(event)):
        out[f.name] = _jsonable(getattr(event, f.name))
    return out


def _from_jsonable(value: Any) -> Any:
    if isinstance(value, Mapping) and "type" in value:
        return event_from_dict(value)
    if isinstance(value, list | tuple):
        return [_from_jsonable(v) for v in value]
    return value


def event_from_dict(data: Mapping[str, Any]) -> DpEvent:
    """Rebuild a dp_accounting event from :func:`event_to_dict`'s output.

    Raises:
        ConfigError: unknown event type or fields.

    >>> import pytest
    >>> dp_accounting = pytest.importorskip("dp_accounting")
    >>> e = dp_accounting.SelfComposedDpEvent(dp_accounting.LaplaceDpEvent(2.0), 3)
    >>> event_from_dict(event_to_dict(e)) == e
    True
    """
    import attr

    dp = _dp()
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        raise ConfigError(f"not a serialised DpEvent: {data!r}", expected="a mapping with a 'type' key")
    cls = getattr(dp.dp_event, data["type"], None)
    if not (isinstance(cls, type) and issubclass(cls, dp.DpEvent)):
        raise ConfigError(f"unknown DpEvent type {data['type']!r}", expected="a class of dp_accounting.dp_event")
    names = {f.name for f in attr.fields(cls)}
    unknown = [k for k in data if k != "type" and k not in names]
    if unknown:
        raise ConfigError(f"unknown fields {unknown} for {data['type']}", expected=f"fields {sorted(names)}")
    try:
        return cls(**{k: _from_jsonable(v) for k, v in data.items() if k != "type"})
    except TypeError as e:
        raise ConfigError(f"cannot rebuild {data['type']}: {e}") from None


def _classify(event: DpEvent) -> tuple[str, str] | None:
    """``(mechanism, sampler)`` of a round-shaped event, or None when it has another shape."""
    dp = _dp()
    while isinstance(event, dp.SelfComposedDpEvent):
        event = event.event
    sampler = "all"
    kinds = {dp.PoissonSampledDpEvent: "poisson", dp.SampledWithoutReplacementDpEvent: "without_replacement",
             dp.SampledWithReplacementDpEvent: "with_replacement"}
    if type(event) in kinds:
        sampler = kinds[type(event)]
        event = event.event
        while isinstance(event, dp.SelfComposedDpEvent):
            event = event.event
    if isinstance(event, dp.GaussianDpEvent):
        return "gaussian", sampler
    if isinstance(event, dp.LaplaceDpEvent):
        return "laplace", sampler
    return None


def _noise_text(event: DpEvent) -> str:
    """`` (noise multiplier X)`` of the first noise event inside ``event``, or ``""``."""
    dp = _dp()
    while not isinstance(event, dp.GaussianDpEvent | dp.LaplaceDpEvent):
        inner = getattr(event, "event", None)
        if inner is None:
            return ""
        event = inner
    return f" (noise multiplier {event.noise_multiplier:g})"


def _combos_text(combos: tuple[tuple[str, str], ...]) -> str:
    if not combos:
        return "no dp_accounting accountant supports it (use sampler 'poisson' or 'all' instead)"
    return "supported with " + " or ".join(f"accountant={a!r}, neighboring={n!r}" for a, n in combos)


# ------------------------------------------------------------------------------------------- PLD cost guard

PLD_MAX_SECONDS = 120.0
"""A PLD composition estimated to take longer than this is refused (:meth:`PrivacyAccountant.check_cost`)."""

PLD_MAX_GIB = 4.0
"""A PLD composition estimated to need more memory than this (GiB) is refused."""

_PLD_INTERVAL = 1e-4  # dp_accounting's PLDAccountant default value_discretization_interval (used here)
_GAUSS_TAIL = 9.4  # dp_accounting truncates the Gaussian's privacy loss about this many standard deviations out
_S_PER_POINT = 2e-6  # measured: seconds per grid point of the composed distributions (FFT and bookkeeping)
_S_PER_BUILD_POINT = 3e-6  # seconds per grid point of one event's distribution (built point by point)
_BYTES_PER_POINT = 80.0  # the FFT's complex arrays and their temporaries
_BYTES_PER_BUILD_POINT = 100.0  # Python floats while one event's distribution is built


@dataclass(frozen=True)
class PldCost:
    """An estimate of what dp_accounting's PLD accountant needs to compose some events.

    Attributes:
        points: grid points of the composed privacy loss distributions (both directions).
        build_points: grid points of the single events' distributions, built one point at a time.
        seconds: estimated run time (measured constants: a 2-core machine; the order of magnitude is what
            counts).
        gib: estimated peak memory in GiB.
    """

    points: float
    build_points: float
    seconds: float
    gib: float

    def __add__(self, other: PldCost) -> PldCost:
        return PldCost(self.points + other.points, self.build_points + other.build_points,
                       self.seconds + other.seconds, max(self.gib, other.gib))


_FREE = PldCost(0.0, 0.0, 0.0, 0.0)


def _loss_range(kind: str, noise: float, sensitivity: float, q: float) -> float:
    """Width of one event's privacy loss support (discretised by dp_accounting), in loss units."""
    if noise <= 0:
        return math.inf
    if kind == "laplace":
        width = 2.0 * sensitivity / noise
        top = sensitivity / noise
    else:
        width = 2.0 * _GAUSS_TAIL * sensitivity / noise
        top = _GAUSS_TAIL * sensitivity / noise + sensitivity ** 2 / (2.0 * noise ** 2)
    if q >= 1.0:
        return width
    # Poisson sampling: the loss is log(1 - q + q e^L); its upper end is about top + log q, its lower end
    # log(1 - q) (the other direction is no wider)
    upper = top + math.log(q) if top > 30 else math.log1p(q * math.expm1(top))
    return max(upper, 0.0) - math.log1p(-q)


def _event_cost(event: Any, count: int, sensitivity: float, q: float = 1.0) -> PldCost:
    dp = _dp()
    if isinstance(event, dp.SelfComposedDpEvent):
        return _event_cost(event.event, count * int(event.count), sensitivity, q)
    if isinstance(event, dp.ComposedDpEvent):
        total = _FREE
        for e in event.events:
            total = total + _event_cost(e, count, sensitivity, q)
        return total
    if isinstance(event, dp.PoissonSampledDpEvent):
        return _event_cost(event.event, count, sensitivity, q * float(event.sampling_probability))
    if isinstance(event, dp.GaussianDpEvent | dp.LaplaceDpEvent):
        kind = "gaussian" if isinstance(event, dp.GaussianDpEvent) else "laplace"
        one = _loss_range(kind, float(event.noise_multiplier), sensitivity, q) / _PLD_INTERVAL
        if not math.isfinite(one):  # no noise: dp_accounting answers at once (epsilon is infinite)
            return _FREE
        # the composed grid (measured against dp_accounting's): a floor from its tail bounds, then it spreads
        # like sqrt(count), less so under sampling (the sampled loss is mostly near 0); the other direction's
        # grid is as wide without sampling, about a third as wide with it
        spread = 0.9 * math.sqrt(count) if q >= 1.0 else 6.0 * math.sqrt(count * q)
        composed = one if count == 1 else one * min(float(count), max(3.5, spread))
        points, build = composed * (2.0 if q >= 1.0 else 1.3), 2.0 * one
        seconds = _S_PER_POINT * points + _S_PER_BUILD_POINT * build
        gib = max(_BYTES_PER_POINT * points / 2.0, _BYTES_PER_BUILD_POINT * build) / 2 ** 30
        return PldCost(points, build, seconds, gib)
    return _FREE  # other events (none of this module's) are not estimated


def pld_cost(event: DpEvent, count: int = 1, neighboring: str = "add_or_remove_one") -> PldCost:
    """Estimate the time and memory dp_accounting's PLD accountant needs to compose ``event`` ``count`` times.

    The PLD accountant discretises each event's privacy loss on a grid of step 1e-4 and composes by FFT; the
    grid spans the loss's range, which grows like ``1 / noise_multiplier`` (Gaussian: ``noise^-2`` at the top
    end), and the composed one like ``sqrt(count)``. A tiny noise multiplier therefore asks for a grid of
    billions of points (minutes, gigabytes), which this estimates in microseconds, before anything runs.

    >>> import pytest
    >>> dp_accounting = pytest.importorskip("dp_accounting")
    >>> pld_cost(dp_accounting.GaussianDpEvent(1.0), 100).seconds < PLD_MAX_SECONDS
    True
    >>> pld_cost(dp_accounting.GaussianDpEvent(0.01), 100).seconds > 600
    True
    """
    _choice("neighboring relation", neighboring, NEIGHBORING)
    if not _is_int(count) or count < 1:
        raise ConfigError(f"count must be an integer >= 1, got {count!r}")
    return _event_cost(event, count, 2.0 if neighboring == "replace_one" else 1.0)


def _cost_text(cost: PldCost) -> str:
    time_text = f"{cost.seconds / 60:.0f} minutes" if cost.seconds >= 120 else f"{cost.seconds:.0f} s"
    return f"about {time_text} and {cost.gib:.1f} GiB"


class PldTooCostly(ConfigError):
    """A PLD composition was refused before it ran: it would take minutes or gigabytes (:func:`pld_cost`)."""


def _refuse_pld(cost: PldCost, what: str) -> None:
    """Raise :class:`PldTooCostly` when ``cost`` is over :data:`PLD_MAX_SECONDS` or :data:`PLD_MAX_GIB`."""
    if cost.seconds > PLD_MAX_SECONDS or cost.gib > PLD_MAX_GIB:
        raise PldTooCostly(f"the PLD accountant would need {_cost_text(cost)} to compose {what} (its grid grows "
                          "like 1/noise multiplier)", expected="the rdp accountant (--accountant rdp, "
                          "accountant='rdp'), fast and slightly looser, or a larger noise multiplier")


# ---------------------------------------------------------------------------------------------- accountant


_RDP_CURVES: dict[tuple[str, str], np.ndarray | None] = {}
"""RDP curves of single events shared by every :class:`PrivacyAccountant` of the process (a fresh accountant per
run, as in the audit's membership games, would otherwise evaluate the same amplified event again: ~0.15 s)."""
_RDP_CURVES_MAX = 256


@dataclass
class PrivacyAccountant:
    """Composes the events of successive releases and reports epsilon at ``target_delta``.

    A thin, checkpointable wrapper around dp_accounting's ``RdpAccountant`` / ``PLDAccountant``: it keeps the
    history of ``(event, count)`` so that :meth:`state_dict` / :meth:`from_state_dict` can rebuild the same
    accountant by replaying it, refuses events the chosen accountant cannot handle with a
    :class:`~privasr.errors.ConfigError` naming a combination that works, and halves Gaussian/Laplace noise
    multipliers for ``rdp`` + ``replace_one`` (see the module docstring). Both accountants compose when epsilon
    or delta is asked for, merging consecutive repeats of an event into one self-composition (100 single-round
    steps then cost about as much as one, ~0.5 s for PLD); RDP also caches each distinct event's curve, so
    asking for epsilon after every round costs one evaluation of the event (~0.15 s for a Gaussian amplified
    by sampling without replacement), not one per round; the curves are shared by a process's accountants.

    Args:
        accountant: ``"rdp"`` or ``"pld"`` (recommended for Laplace).
        target_delta: the delta at which :meth:`epsilon` is reported, in (0, 1).
        neighboring: ``"add_or_remove_one"`` or ``"replace_one"`` (needed for sampling without replacement).

    Raises:
        ConfigError: unknown accountant or relation, ``target_delta`` outside (0, 1), dp-accounting missing.

    >>> import pytest
    >>> dp_accounting = pytest.importorskip("dp_accounting")
    >>> acct = PrivacyAccountant("pld", target_delta=1e-9)
    >>> acct.epsilon()
    0.0
    >>> acct.step(dp_accounting.LaplaceDpEvent(2.0), count=4)
    >>> round(acct.epsilon(), 6)
    2.0
    >>> PrivacyAccountant.from_state_dict(acct.state_dict()) == acct
    True
    """

    accountant: str = "rdp"
    target_delta: float = 1e-5
    neighboring: str = "add_or_remove_one"
    _history: list[tuple[DpEvent, int]] = field(default_factory=list, init=False, repr=False)
    _native: Any = field(default=None, init=False, repr=False, compare=False)
    _stale: bool = field(default=False, init=False, repr=False, compare=False)
    _curves: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _choice("accountant", self.accountant, ACCOUNTANTS)
        _choice("neighboring relation", self.neighboring, NEIGHBORING)
        self.target_delta = _delta("target_delta", self.target_delta)
        self._native = self._make_native()

    # -- dp_accounting plumbing

    def _make_native(self) -> _NativeAccountant:
        dp = _dp()
        rel = {"add_or_remove_one": dp.NeighboringRelation.ADD_OR_REMOVE_ONE,
               "replace_one": dp.NeighboringRelation.REPLACE_ONE}[self.neighboring]
        if self.accountant == "rdp":
            return dp.rdp.RdpAccountant(neighboring_relation=rel)
        return dp.pld.PLDAccountant(neighboring_relation=rel)

    def _native_event(self, event: DpEvent) -> DpEvent:
        """The event dp_accounting should see: noise multipliers halved for rdp + replace_one."""
        if not (self.accountant == "rdp" and self.neighboring == "replace_one"):
            return event
        dp = _dp()
        if isinstance(event, dp.GaussianDpEvent | dp.LaplaceDpEvent):
            return type(event)(event.noise_multiplier / 2.0)
        if isinstance(event, dp.SelfComposedDpEvent):
            return dp.SelfComposedDpEvent(self._native_event(event.event), event.count)
        if isinstance(event, dp.ComposedDpEvent):
            return dp.ComposedDpEvent([self._native_event(e) for e in event.events])
        if isinstance(event, dp.PoissonSampledDpEvent):
            return dp.PoissonSampledDpEvent(event.sampling_probability, self._native_event(event.event))
        if isinstance(event, dp.SampledWithoutReplacementDpEvent | dp.SampledWithReplacementDpEvent):
            return type(event)(event.source_dataset_size, event.sample_size, self._native_event(event.event))
        return event

    # -- public API

    def supports(self, event: DpEvent) -> bool:
        """Whether this accountant (with its neighbouring relation) can account for ``event``.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> wor = round_event(dp_accounting.GaussianDpEvent(1.0), "without_replacement", sample_size=5, population=50)
        >>> PrivacyAccountant("rdp").supports(wor), PrivacyAccountant("rdp", neighboring="replace_one").supports(wor)
        (False, True)
        """
        dp = _dp()
        if not isinstance(event, dp.DpEvent):
            return False
        return bool(self._native.supports(self._native_event(event)))

    def check(self, event: DpEvent) -> None:
        """Raise :class:`~privasr.errors.ConfigError` unless :meth:`supports` ``(event)``, saying what works.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> lap = round_event(dp_accounting.LaplaceDpEvent(1.0), "poisson", sampling_probability=0.1)
        >>> PrivacyAccountant("rdp").check(lap)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: the 'rdp' accountant ... cannot account for a laplace mechanism with 'poisson' \
sampling; supported with accountant='pld', neighboring='add_or_remove_one'
        """
        dp = _dp()
        if not isinstance(event, dp.DpEvent):
            raise ConfigError(f"not a dp_accounting DpEvent: {event!r}")
        if self.supports(event):
            return
        parts = event.events if isinstance(event, dp.ComposedDpEvent) else [event]
        culprit = next((e for e in parts if not self.supports(e)), event)
        shape = _classify(culprit)
        where = f"the {self.accountant!r} accountant with neighboring={self.neighboring!r}"
        if shape is not None:
            raise ConfigError(f"{where} cannot account for a {shape[0]} mechanism with {shape[1]!r} sampling; "
                              f"{_combos_text(SUPPORTED[shape])}")
        try:
            self._make_native().compose(self._native_event(culprit))
            reason = "unsupported event"
        except dp.UnsupportedEventError as e:
            reason = str(e)
        raise ConfigError(f"{where} cannot account for {culprit!r} ({reason})")

    def step(self, event: DpEvent, count: int = 1) -> None:
        """Compose ``event`` ``count`` times (e.g. one round's :func:`round_event`, once per round).

        Raises:
            ConfigError: the event is not supported (nothing is composed), or ``count`` is not an integer >= 1.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> acct = PrivacyAccountant()
        >>> acct.step(dp_accounting.GaussianDpEvent(5.0), count=2)
        >>> acct.steps, round(acct.epsilon(), 3)
        (2, 1.158)
        """
        if not _is_int(count) or count < 1:
            raise ConfigError(f"count must be an integer >= 1, got {count!r}")
        self.check(event)
        self._history.append((event, count))
        # compose lazily, consecutive repeats at once: a PLD self-composition is far cheaper than T steps (RDP
        # curves are cached per distinct event, see _rdp_curve)
        self._stale = True

    def _merged(self, extra: tuple[DpEvent, int] | None = None) -> list[list[Any]]:
        """The history (and ``extra``) with consecutive repeats of an event merged into one ``[event, count]``."""
        merged: list[list[Any]] = []
        for event, count in [*self._history, *([extra] if extra is not None else [])]:
            if merged and merged[-1][0] == event:
                merged[-1][1] += count
            else:
                merged.append([event, count])
        return merged

    def estimated_cost(self, event: DpEvent | None = None, count: int = 1) -> PldCost:
        """:func:`pld_cost` of the history composed so far, plus ``event`` ``count`` times (zero for ``rdp``).

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant("pld").estimated_cost(dp_accounting.GaussianDpEvent(0.01), 50).seconds > PLD_MAX_SECONDS
        True
        >>> PrivacyAccountant("rdp").estimated_cost(dp_accounting.GaussianDpEvent(0.01), 50).seconds
        0.0
        """
        if self.accountant != "pld":
            return _FREE
        total = _FREE
        for ev, c in self._merged(None if event is None else (event, count)):
            total = total + pld_cost(ev, c, self.neighboring)
        return total

    def check_cost(self, event: DpEvent | None = None, count: int = 1) -> None:
        """Refuse (:class:`~privasr.errors.ConfigError`, naming the rdp accountant) a PLD composition of the
        history plus ``event`` ``count`` times that would run for minutes or need gigabytes
        (:data:`PLD_MAX_SECONDS`, :data:`PLD_MAX_GIB`). Runners call it before their first round with the whole
        run's events; :meth:`epsilon` and :meth:`delta_for` call it before composing.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant("pld").check_cost(dp_accounting.GaussianDpEvent(0.01), 100)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        privasr.privacy.dp.accounting.PldTooCostly: the PLD accountant would need about ... minutes and ... GiB to compose ...
        """
        cost = self.estimated_cost(event, count)
        if event is None:
            what = f"these {self.steps} releases"
        else:
            shape = _classify(event)
            what = (f"{count} releases of " + (f"{shape[0]} noise with {shape[1]!r} sampling" if shape else
                                                type(event).__name__) + _noise_text(event))
        _refuse_pld(cost, what)

    def _current(self) -> _NativeAccountant:
        """The dp_accounting accountant with the whole history composed."""
        if self._stale:
            if self.accountant == "pld":
                self.check_cost()
            native = self._make_native()
            merged = self._merged()
            for event, count in merged:
                curve = self._rdp_curve(event) if self.accountant == "rdp" else None
                if curve is not None:  # RDP composes by adding curves: count times the event's cached curve
                    native._rdp = native._rdp + count * curve
                else:
                    native.compose(self._native_event(event), count)
            self._native, self._stale = native, False
        return self._native

    def _rdp_curve(self, event: DpEvent) -> np.ndarray | None:
        """The RDP curve (over the accountant's orders) of one ``event``, computed once per distinct event.

        An amplified Gaussian event costs ~0.15 s to evaluate, and the loop asks for epsilon every round with
        the same event composed ``r`` times; RDP composition is the sum of the events' curves, so the curve of
        one event is cached and scaled. ``None`` when dp_accounting's accountant does not expose its curve
        (``_rdp``): then it composes as usual.
        """
        key = repr(self._native_event(event))
        cache = self._curves
        if key not in cache:
            shared = (self.neighboring, key)  # the same event under the same relation: the same curve
            if shared not in _RDP_CURVES:
                one = self._make_native()
                one.compose(self._native_event(event), 1)
                curve = getattr(one, "_rdp", None)
                if len(_RDP_CURVES) >= _RDP_CURVES_MAX:
                    _RDP_CURVES.pop(next(iter(_RDP_CURVES)))
                _RDP_CURVES[shared] = None if curve is None else np.array(curve, dtype=np.float64)
            cache[key] = _RDP_CURVES[shared]
        return cache[key]

    def epsilon(self, delta: float | None = None) -> float:
        """Epsilon of everything composed so far at ``delta`` (default ``target_delta``); 0.0 before any step.

        ``inf`` when a composed mechanism adds no noise.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant().epsilon()
        0.0
        """
        d = self.target_delta if delta is None else _delta("delta", delta)
        if not self._history:
            return 0.0
        return float(self._current().get_epsilon(d))

    def delta_for(self, epsilon: float) -> float:
        """The smallest delta this accountant certifies at ``epsilon`` (0.0 before any step).

        Raises:
            ConfigError: ``epsilon`` is not a number >= 0.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> acct = PrivacyAccountant("pld")
        >>> acct.step(dp_accounting.LaplaceDpEvent(1.0))
        >>> acct.delta_for(1.0) < 1e-9, acct.delta_for(0.5) > 0.1
        (True, True)
        """
        if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or math.isnan(epsilon) or epsilon < 0:
            raise ConfigError(f"epsilon must be a number >= 0, got {epsilon!r}")
        if not self._history:
            return 0.0
        return float(self._current().get_delta(float(epsilon)))

    @property
    def events(self) -> list[tuple[dict[str, Any], int]]:
        """The composed history as ``(event_to_dict(event), count)`` pairs, oldest first.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> acct = PrivacyAccountant()
        >>> acct.step(dp_accounting.GaussianDpEvent(2.0), 3)
        >>> acct.events
        [({'type': 'GaussianDpEvent', 'noise_multiplier': 2.0}, 3)]
        """
        return [(event_to_dict(e), c) for e, c in self._history]

    @property
    def steps(self) -> int:
        """Total of the counts passed to :meth:`step` (e.g. the number of rounds accounted for).

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant().steps
        0
        """
        return sum(c for _, c in self._history)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary: configuration, steps, epsilon at ``target_delta`` and the event history.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant("pld").to_dict()["epsilon"]
        0.0
        """
        eps = self.epsilon()
        return {"accountant": self.accountant, "neighboring": self.neighboring, "target_delta": self.target_delta,
                "steps": self.steps, "epsilon": eps if math.isfinite(eps) else None,
                "events": [{"event": e, "count": c} for e, c in self.events]}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to rebuild this accountant (JSON-friendly): configuration and event history.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> sorted(PrivacyAccountant().state_dict())
        ['accountant', 'events', 'neighboring', 'target_delta']
        """
        return {"accountant": self.accountant, "neighboring": self.neighboring, "target_delta": self.target_delta,
                "events": [{"event": e, "count": c} for e, c in self.events]}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PrivacyAccountant:
        """Rebuild an accountant from :meth:`state_dict` by replaying its events.

        Events may be given as ``{"event": ..., "count": n}`` or ``[event, n]`` pairs.

        Raises:
            ConfigError: unknown keys or a malformed event.

        >>> import pytest
        >>> _ = pytest.importorskip("dp_accounting")
        >>> PrivacyAccountant.from_state_dict({"accountant": "pld", "events": []}).accountant
        'pld'
        """
        if not isinstance(state, Mapping):
            raise ConfigError(f"accountant state must be a mapping, got {type(state).__name__}")
        allowed = {"accountant", "neighboring", "target_delta", "events"}
        unknown = sorted(set(state) - allowed)
        if unknown:
            raise ConfigError(f"unknown keys {unknown} in the accountant state", expected=f"only {sorted(allowed)}")
        acct = cls(**{k: state[k] for k in ("accountant", "neighboring", "target_delta") if k in state})
        for i, item in enumerate(state.get("events", ())):
            if isinstance(item, Mapping) and set(item) == {"event", "count"}:
                ev, count = item["event"], item["count"]
            elif isinstance(item, list | tuple) and len(item) == 2:
                ev, count = item
            else:
                raise ConfigError(f"event {i} of the accountant state is malformed: {item!r}",
                                  expected="{'event': {...}, 'count': n}")
            acct.step(event_from_dict(ev) if isinstance(ev, Mapping) else ev, count)
        return acct

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace this accountant's history with the one in ``state`` (a resumed run keeps its accountant object).

        The configuration in ``state`` must match this accountant's, else :class:`ConfigError`.

        >>> import pytest
        >>> dp_accounting = pytest.importorskip("dp_accounting")
        >>> a = PrivacyAccountant("rdp"); a.step(dp_accounting.GaussianDpEvent(2.0), 3)
        >>> b = PrivacyAccountant("rdp"); b.load_state_dict(a.state_dict())
        >>> b.steps, b.epsilon() == a.epsilon()
        (3, True)
        """
        other = type(self).from_state_dict(state)
        for k in ("accountant", "neighboring", "target_delta"):
            if getattr(other, k) != getattr(self, k):
                raise ConfigError(f"the saved accountant has {k}={getattr(other, k)!r}, this run {getattr(self, k)!r}")
        self.__dict__.update(other.__dict__)


# ---------------------------------------------------------------------------------------- one-shot helpers


def _mechanism_event(mechanism: str, noise_multiplier: Any) -> DpEvent:
    dp = _dp()
    _choice("mechanism", mechanism, ("gaussian", "laplace"))
    nm = noise_multiplier
    if isinstance(nm, bool) or not isinstance(nm, int | float) or not math.isfinite(nm) or nm < 0 \
            or (mechanism == "laplace" and nm == 0):
        bound = "> 0" if mechanism == "laplace" else ">= 0"
        raise ConfigError(f"noise_multiplier must be a finite number {bound}, got {nm!r}")
    return dp.GaussianDpEvent(float(nm)) if mechanism == "gaussian" else dp.LaplaceDpEvent(float(nm))


def epsilon_for(
    noise_multiplier: float,
    rounds: int,
    sampler_kind: str,
    q: float | None = None,
    sample_size: int | None = None,
    population: int | None = None,
    delta: float = 1e-5,
    accountant: str = "rdp",
    *,
    mechanism: str = "gaussian",
    neighboring: str = "add_or_remove_one",
) -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of one mechanism under one sampler.

    Args:
        noise_multiplier: Gaussian ``std / clip_norm`` or Laplace ``b / sensitivity`` (``1 / epsilon`` per round).
        rounds: number of rounds (0 gives 0.0).
        sampler_kind: ``"all"``, ``"poisson"`` (needs ``q``), ``"without_replacement"`` / ``"with_replacement"``
            (need ``sample_size`` and ``population``).
        q: Poisson sampling probability.
        sample_size: participants per round for fixed-size samplers.
        population: number of units sampled from.
        delta: target delta in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.
        mechanism: ``"gaussian"`` or ``"laplace"``.
        neighboring: ``"add_or_remove_one"`` or ``"replace_one"``.

    Raises:
        ConfigError: bad values or an unsupported combination (see :data:`SUPPORTED`).

    >>> import pytest
    >>> _ = pytest.importorskip("dp_accounting")
    >>> round(epsilon_for(1.1, 10_000, "poisson", q=0.01), 2)  # DP-SGD on MNIST (Abadi et al. 2016 setting)
    5.63
    >>> round(epsilon_for(2.0, 10, "all", mechanism="laplace", accountant="pld", delta=1e-12), 4)
    5.0
    """
    acct = PrivacyAccountant(accountant, delta, neighboring)
    if not _is_int(rounds) or rounds < 0:
        raise ConfigError(f"rounds must be an integer >= 0, got {rounds!r}")
    event = round_event(_mechanism_event(mechanism, noise_multiplier), sampler_kind, q, sample_size, population)
    acct.check(event)
    if rounds:
        acct.step(event, rounds)
    return acct.epsilon()


def noise_for_epsilon(
    target_epsilon: float,
    rounds: int,
    sampler_kind: str,
    q: float | None = None,
    sample_size: int | None = None,
    population: int | None = None,
    delta: float = 1e-5,
    accountant: str = "rdp",
    *,
    mechanism: str = "gaussian",
    neighboring: str = "add_or_remove_one",
    tol: float = 1e-6,
) -> float:
    """The smallest noise multiplier whose ``rounds`` rounds cost at most ``target_epsilon`` at ``delta``.

    Uses ``dp_accounting.mechanism_calibration.calibrate_dp_mechanism`` (Brent's method in the noise
    multiplier, within ``tol``), which guarantees ``epsilon_for(result, ...) <= target_epsilon``. The search
    bracket is found by doubling/halving from 1 (for ``pld``, from the RDP answer, which is an upper bound
    when RDP supports the combination, so only noise levels near the answer need PLD's slower evaluation).
    Arguments are those of :func:`epsilon_for`.

    Raises:
        ConfigError: bad values, an unsupported combination, or a target that needs a noise multiplier below
            0.01 (no meaningful privacy) or above 1e6.

    >>> import pytest
    >>> _ = pytest.importorskip("dp_accounting")
    >>> s = noise_for_epsilon(2.0, 1000, "poisson", q=0.01)
    >>> round(s, 3), epsilon_for(s, 1000, "poisson", q=0.01) <= 2.0
    (1.022, True)
    """
    dp = _dp()
    acct = PrivacyAccountant(accountant, delta, neighboring)
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, int | float) \
            or not math.isfinite(target_epsilon) or target_epsilon <= 0:
        raise ConfigError(f"target_epsilon must be a finite number > 0, got {target_epsilon!r}")
    if not _is_int(rounds) or rounds < 1:
        raise ConfigError(f"rounds must be an integer >= 1, got {rounds!r}")
    if isinstance(tol, bool) or not isinstance(tol, int | float) or not tol > 0:
        raise ConfigError(f"tol must be a number > 0, got {tol!r}")

    def event(x: float) -> DpEvent:
        return round_event(_mechanism_event(mechanism, x), sampler_kind, q, sample_size, population)

    acct.check(event(1.0))

    def native(x: float) -> DpEvent:
        return dp.SelfComposedDpEvent(acct._native_event(event(x)), rounds)

    @functools.cache
    def eps_at(x: float) -> float:
        if accountant == "pld":
            _refuse_pld(pld_cost(event(x), rounds, neighboring),
                        f"{rounds} rounds at noise multiplier {x:.4g} while searching for the noise")
        return float(acct._make_native().compose(native(x)).get_epsilon(acct.target_delta))

    guess, factor = 1.0, 2.0
    if accountant == "pld" and PrivacyAccountant("rdp", delta, neighboring).supports(event(1.0)):
        guess = noise_for_epsilon(target_epsilon, rounds, sampler_kind, q, sample_size, population, delta, "rdp",
                                  mechanism=mechanism, neighboring=neighboring, tol=1e-3)
        factor = 1.25
    floor, ceiling = 0.01, 1e6
    lo = hi = guess
    if eps_at(guess) > target_epsilon:
        while eps_at(hi) > target_epsilon:
            lo, hi = hi, hi * factor
            if hi > ceiling:
                raise ConfigError(f"target epsilon {target_epsilon} needs a noise multiplier above {ceiling:g}")
    else:
        while eps_at(lo) <= target_epsilon:
            lo, hi = lo / factor, lo
            if lo < floor:
                raise ConfigError(f"target epsilon {target_epsilon} is reached with a noise multiplier below "
                                  f"{floor} (no meaningful privacy)", expected="a smaller target epsilon")
    if lo == hi:  # pragma: no cover - defensive
        return float(hi)
    result = dp.mechanism_calibration.calibrate_dp_mechanism(
        acct._make_native, native, float(target_epsilon), acct.target_delta,
        dp.mechanism_calibration.ExplicitBracketInterval(lo, hi), tol=float(tol))
    return float(result)
