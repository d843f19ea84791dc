"""The federated loop: sample, broadcast, run clients on a backend, accumulate, privatise, update, checkpoint.

:func:`run_federated` drives any :class:`~privasr.federated.core.FederatedAlgorithm`. One round ``r``:

1. ``payload = algorithm.broadcast(state, r)``;
2. the sampler picks client indices (seeded by ``(seed, r)``);
3. the backend runs ``client_update`` for each (seeded by ``(seed, r, client, slot)``) and yields outcomes as
   they arrive; each successful :class:`~privasr.federated.core.Update` is folded in with
   ``algorithm.accumulate`` straight away (nothing is kept per client) and the client's new state is stored on
   its "device" (a client drawn twice in one round keeps the state of its first slot); without secure
   aggregation and DP the round's metrics get the mean upload size ``upload_bytes`` (and, for fedlm and FTL,
   ``upload_raw_bytes`` and ``upload_ratio``: :mod:`privasr.federated.compression`);
4. clients that raised, timed out or vanished are dropped with a logged reason; if fewer than
   ``min_clients`` reported, the round fails with :class:`~privasr.federated.core.FederatedError` (the last
   checkpoint stays, so the run can be resumed). A round in which the sampler drew nobody (Poisson) is skipped
   and logged: the state stays, and its history entry has the metric ``skipped``;
5. with differential privacy, noise is added **once** to the accumulated sum
   (:meth:`~privasr.federated.core.SumAccumulator.add_noise`) and the accountant is fed the round's event,
   matching the sampler used; ``epsilon``/``delta`` go into the round's metrics. Every DP round is a release,
   also one in which nobody was sampled or reported (noise alone, on the algorithm's ``zero_sum``), and
   ``server_update`` gets :meth:`~privasr.federated.core.SumAccumulator.released`: the noised arrays over the
   data-independent denominator of :func:`dp_denominator`, without the cohort's count, weight or metrics;
6. ``state, metrics = algorithm.server_update(state, acc, r, rng)``;
7. everything needed to continue — server state, client states, accountant events, the history and the round
   number — is written to ``checkpoint_dir/state.npz`` (:mod:`privasr.federated.tree`, atomic).

**What a DP run publishes.** With ``privacy``, a round's :class:`RoundLog` (what ``history``, the checkpoint,
``on_round`` and every runner's results.json get) holds only the round number and :data:`DP_PUBLISHED`: the
metrics the algorithm lists in ``dp_metrics`` (functions of the release) and ``epsilon``/``delta``. ``sampled``,
``reported``, the drop reasons and the seconds (which grow with the clients' data) are ``None``/empty, no client
is named in a log line, and no per-client progress bar is drawn. :func:`check_privacy` refuses, before round
0, the settings that would void the guarantee.

A run started with the same arguments and ``resume=True`` continues from the checkpoint; since every random
draw is seeded by round, client and slot, a killed and resumed run ends in the same state as an uninterrupted one.

>>> import numpy as np
>>> from privasr.federated.core import SumAccumulator, Update
>>> from privasr.federated.sampling import AllClients
>>> class Mean:
...     name = "mean"
...     def init(self, rng): return {"x": 0.0}
...     def broadcast(self, state, round): return state["x"]
...     def client_update(self, payload, client, client_state, rng):
...         return Update({"x": np.array([client - payload])}, weight=1.0), None
...     def accumulate(self, acc, update): return (acc or SumAccumulator.empty()).add(update)
...     def server_update(self, state, acc, round, rng):
...         x = state["x"] + float(acc.mean()["x"][0])
...         return {"x": x}, {"x": x}
>>> res = run_federated(Mean(), [1.0, 2.0, 6.0], rounds=2, sampler=AllClients())
>>> res.state["x"], [h.reported for h in res.history]
(3.0, [3, 3])
"""

from __future__ import annotations

import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import progress
from privasr.errors import ConfigError, PrivacyWarning
from privasr.federated.backends.local import LocalBackend
from privasr.federated.core import ClientTask, FederatedError, SumAccumulator, client_seed
from privasr.federated.tree import load_tree, save_tree

__all__ = ["run_federated", "check_run_arguments", "check_privacy", "dp_denominator", "RoundLog", "FederatedResult",
           "PrivacySettings", "Federation", "CHECKPOINT_NAME", "DP_PUBLISHED"]

log = logging.getLogger("privasr.federated")

CHECKPOINT_NAME = "state.npz"

DP_PUBLISHED = ("epsilon", "delta")
"""The loop's own metrics of a DP round; beside them a DP round publishes only the algorithm's ``dp_metrics``."""

BLOCK = 1024
"""Arriving updates buffered before an algorithm with ``accumulate_many`` folds them in at once (memory: one
block of updates, whatever the cohort)."""


@dataclass(frozen=True)
class PrivacySettings:
    """Differential privacy of a run.

    Attributes:
        mechanism: a :mod:`privasr.privacy.dp.mechanisms` mechanism (``add_noise(arrays, rng)``, ``dp_event()``).
        accountant: a :class:`privasr.privacy.dp.accounting.PrivacyAccountant` (fresh; the loop steps it).
        composition: ``"sequential"``: every round's release may contain every unit's data (the accountant
            composes one round event, amplified by the sampler, per round); ``"parallel"``: each unit (an
            utterance or user) contributes to exactly one round's release (e.g. FMP clients that send only the
            counts added since their last report), so the run costs one release: the accountant is stepped
            with the un-amplified mechanism event once.
        population: the number of clients the operator declares, fixed before the run and public: the ``N`` of
            the data-independent denominator (:func:`dp_denominator`: ``q x N`` for Poisson sampling, ``N``
            when every client takes part) and of the delta check (:func:`check_privacy`). ``None``: the run's
            number of clients, which is then taken as public (results.json states it). Under add/remove-one
            neighbours the guarantee is for the mechanism with this ``N`` fixed, whatever the data.
        noise_draw: which of a simulation's repeated noise draws this run is: round ``r``'s noise comes from
            ``default_rng([seed, r, 2])`` for draw 0 and ``[seed, r, 2, noise_draw]`` otherwise, so draws differ
            in their noise only (sampling, client training and server randomness stay those of ``seed``). Each
            draw is a release of its own epsilon; publishing several releases of the same data composes them.
            Central noise only (not with noise shares added by the clients under secure aggregation).
    """

    mechanism: Any
    accountant: Any
    composition: str = "sequential"
    population: int | None = None
    noise_draw: int = 0

    def __post_init__(self) -> None:
        if self.composition not in ("sequential", "parallel"):
            raise ConfigError(f"composition={self.composition!r}", expected="sequential or parallel")
        p = self.population
        if p is not None and (isinstance(p, bool) or not isinstance(p, int | np.integer) or p < 1):
            raise ConfigError(f"population={p!r}", expected="None or an integer >= 1 (the declared number of clients)")
        d = self.noise_draw
        if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0:
            raise ConfigError(f"noise_draw={d!r}", expected="an integer >= 0")


@dataclass(frozen=True)
class RoundLog:
    """What happened in one round.

    With differential privacy only ``round`` and ``metrics`` (the algorithm's ``dp_metrics`` and
    :data:`DP_PUBLISHED`, plus what ``on_round`` adds) are kept: ``sampled``, ``reported``, ``seconds`` and
    ``client_seconds`` are ``None`` and ``dropped`` is empty, since none of them is covered by the noise.
    """

    round: int
    sampled: int | None
    reported: int | None
    dropped: dict[str, str]
    metrics: dict[str, Any]
    seconds: float | None
    client_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict."""
        return asdict(self)


@dataclass
class FederatedResult:
    """The end of a run: the server state, every client's state, the per-round history."""

    state: Any
    client_states: dict[int, Any]
    history: list[RoundLog] = field(default_factory=list)
    resumed_from: int = 0


@dataclass
class Federation:
    """One federated run's algorithm, clients and loop settings: what a runner hands to a backend.

    ``privasr fed split`` writes one (the clients to their own folders, the rest for the ServerApp); the fields
    are :func:`run_federated`'s arguments, plus ``secagg`` (Flower backends only).
    """

    algorithm: Any
    clients: list[Any]
    rounds: int
    sampler: Any
    seed: int = 0
    min_clients: int = 1
    privacy: PrivacySettings | None = None
    secagg: Any = None
    key: Any = None
    name: str = ""


def check_run_arguments(clients: Sequence[Any], rounds: Any, min_clients: Any, client_timeout: Any,
                        sampler: Any = None) -> None:
    """The checks every driver of the loop (:func:`run_federated`, the Flower ServerApp, a deployment kit) makes
    before round 0; with ``sampler``, also that its cohorts fit the population and can reach ``min_clients``
    (a run that could only fail after a round is refused before any work).

    >>> check_run_arguments([1], 2, 1, None)
    >>> check_run_arguments([1], 2, 0, None)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: min_clients=0 (expected an integer >= 1)
    >>> from privasr.federated.sampling import AllClients
    >>> check_run_arguments([1, 2, 3], 2, 5, None, AllClients())
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: min_clients=5 but a round's cohort holds at most 3 clients (of 3, sampler 'all') (expected min_clients <= 3: every round would fail)
    """
    if isinstance(clients, str | bytes) or not hasattr(clients, "__len__"):
        raise ConfigError("clients must be a sequence")
    if len(clients) == 0:
        raise ConfigError("there are no clients", expected="at least one client")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ConfigError(f"rounds={rounds!r}", expected="an integer >= 0")
    if isinstance(min_clients, bool) or not isinstance(min_clients, int) or min_clients < 1:
        raise ConfigError(f"min_clients={min_clients!r}", expected="an integer >= 1")
    if client_timeout is not None and not client_timeout > 0:
        raise ConfigError(f"client_timeout={client_timeout!r}", expected="a positive number of seconds or none")
    if sampler is None:
        return
    n, kind = len(clients), getattr(sampler, "kind", None)
    if kind == "without_replacement" and int(sampler.n) > n:
        raise ConfigError(f"the sampler draws n={int(sampler.n)} distinct clients a round but there are {n}",
                          expected=f"n <= {n}")
    largest = int(sampler.n) if kind in ("without_replacement", "with_replacement") else n
    if min_clients > largest:
        raise ConfigError(f"min_clients={min_clients} but a round's cohort holds at most {largest} clients (of {n}, "
                          f"sampler {kind!r})", expected=f"min_clients <= {largest}: every round would fail")


def dp_denominator(sampler: Any, population: int) -> float:
    """The data-independent denominator of a DP round's mean: the expected number of reporting clients.

    ``q x N`` for Poisson sampling at rate ``q``, ``n`` for ``n`` clients drawn per round (with or without
    replacement) and ``N`` when every client takes part, with ``N`` the *declared* population
    (:attr:`PrivacySettings.population`). Under DP the clients' weights are 1 (a weighted sum has no bounded
    sensitivity), so this is also the expected cohort weight; dividing the noised sum by it, not by the clients
    who reported, keeps the cohort size out of the release (DP-FedAvg, McMahan et al. 2018, section 3).

    >>> from privasr.federated.sampling import AllClients, Poisson, UniformWithoutReplacement
    >>> dp_denominator(Poisson(0.5), 3), dp_denominator(UniformWithoutReplacement(4), 100), dp_denominator(AllClients(), 7)
    (1.5, 4.0, 7.0)
    """
    kind = sampler.kind
    if kind == "poisson":
        return float(sampler.sampling_probability(population) * population)
    if kind in ("without_replacement", "with_replacement"):
        return float(sampler.n)
    return float(population)


def check_privacy(algorithm: Any, privacy: PrivacySettings, sampler: Any, n_clients: int, min_clients: int,
                  secagg: Any = None) -> None:
    """Refuse, before round 0, the DP settings whose epsilon would not mean what it says (each reason named).

    * the algorithm must bound one unit's contribution (``dp_bound()``; a weighted sum, an unclipped delta
      raise there), in the norm the mechanism is calibrated for (Gaussian: L2, Laplace: L1), at most the
      mechanism's sensitivity, and give the zero sum an empty round releases (``zero_sum``);
    * with the noise added centrally, ``min_clients`` must be 1: a run that stops when fewer clients report
      would publish the cohort size, which the accountant does not count (every round is released instead);
    * with secure aggregation, a sampler whose cohorts vary (Poisson, with replacement) is refused: a cohort
      below ``min_cohort`` is not aggregated, so one client more could add a whole cohort's sum to the release;
    * with distributed noise every reporting client adds a share, so the noise level is the cohort's size: when
      the unit is a client (the algorithm's ``dp_unit``, by default ``"client"``; FMP's ``"user"``) the accountant
      must use ``neighboring="replace_one"`` (a fixed cohort), not add/remove-one, where one client more is
      one share more;
    * the declared population must hold every client, and for the Gaussian mechanism (approximate DP)
      ``delta < 1 / N``: a mechanism that publishes one random client's data whole is ``(0, 1/N)``-DP;
    * the accountant must be able to account for the round's event with the sampler used (its own check, e.g.
      sampling without replacement needs ``neighboring="replace_one"``), before any client runs;
    * a noise multiplier of 0 gives epsilon infinity: warned (:class:`~privasr.errors.PrivacyWarning`), since
      clipping alone is a useful baseline.

    Raises:
        ConfigError: naming the setting and why it voids the guarantee.
    """
    mech = privacy.mechanism
    name = getattr(algorithm, "name", type(algorithm).__name__)
    for member in ("dp_bound", "zero_sum", "dp_metrics"):
        if not hasattr(algorithm, member):
            raise ConfigError(f"differential privacy for {name}, which does not define {member}",
                              expected="an algorithm that bounds one unit's contribution (dp_bound), gives the "
                                       "zero sum of an empty round (zero_sum) and lists its release-only "
                                       "metrics (dp_metrics): FMP with dp_unit, fedlm with clip_norm, FTL with "
                                       "delta_clip")
    norm, bound = algorithm.dp_bound()
    want, sens = ("l2", getattr(mech, "clip_norm", None)) if hasattr(mech, "clip_norm")         else ("l1", getattr(mech, "sensitivity", None))
    if sens is None:
        raise ConfigError(f"privacy mechanism {mech!r}", expected="a Gaussian (clip_norm) or Laplace (sensitivity) "
                                                                 "mechanism")
    if norm != want:
        raise ConfigError(f"{name} bounds a unit's contribution in {norm.upper()} but the {type(mech).__name__} is "
                          f"calibrated to an {want.upper()} sensitivity",
                          expected="a Gaussian mechanism for L2 bounds (clip_norm), Laplace for L1 bounds (caps)")
    if bound > sens * (1 + 1e-9):
        raise ConfigError(f"{name} lets one unit move the sum by {bound:g} ({norm.upper()}) but the noise is "
                          f"calibrated to a sensitivity of {sens:g}: epsilon would be understated",
                          expected=f"the mechanism's sensitivity >= {bound:g} (or a smaller clip/cap)")
    central = secagg is None or getattr(secagg, "noise", "server") != "distributed"
    if central and min_clients != 1:
        raise ConfigError(f"min_clients={min_clients} with differential privacy (noise added by the server)",
                          expected="min_clients=1: every DP round is released, also one that few or no clients "
                                   "reported (noise alone); a run that stopped below min_clients would publish "
                                   "the cohort size, which the accountant does not count")
    if secagg is not None and sampler.kind in ("poisson", "with_replacement"):
        raise ConfigError(f"secure aggregation with differential privacy and {sampler.kind!r} sampling",
                          expected="a sampler of fixed cohorts (all, without_replacement): a cohort below "
                                   "min_cohort is not aggregated, so one client more could add a whole cohort's "
                                   "sum to the release, which the accountant does not count")
    unit = getattr(algorithm, "dp_unit", "client")
    if not central and unit in ("client", "user") \
            and getattr(privacy.accountant, "neighboring", "add_or_remove_one") != "replace_one":
        raise ConfigError(f"distributed noise with add/remove-one neighbours for a {unit}-level guarantee",
                          expected="neighboring='replace_one' (fixed cohorts): each reporting client adds a noise "
                                   "share, so with one client more or less the noise level itself tells whether "
                                   "it took part")
    population = privacy.population if privacy.population is not None else n_clients
    if population < n_clients:
        raise ConfigError(f"the declared population of {population} clients is smaller than the run's "
                          f"{n_clients} clients", expected="population >= the number of clients")
    delta = getattr(privacy.accountant, "target_delta", None)
    if hasattr(mech, "noise_multiplier") and hasattr(mech, "clip_norm") and delta is not None             and delta * population >= 1:
        raise ConfigError(f"delta={delta:g} for a population of {population} clients",
                          expected=f"delta < 1/N = {1 / population:.3g} (delta << 1/N is the usual choice): a "
                                   "mechanism that publishes one random client's data whole is (0, 1/N)-DP")
    check = getattr(privacy.accountant, "check", None)
    if check is not None:
        check(mech.dp_event() if privacy.composition == "parallel" else _round_event(mech, sampler, n_clients))
    multiplier = getattr(mech, "noise_multiplier", None)
    if multiplier is not None and (multiplier == 0 or not math.isfinite(multiplier)):
        warnings.warn(f"{name}: noise multiplier {multiplier:g}: epsilon is infinite (clipping only, no "
                      "differential privacy guarantee)", PrivacyWarning, stacklevel=3)


def _run_key(algorithm: Any, n_clients: int, sampler: Any, seed: int, privacy: PrivacySettings | None,
             extra: Any) -> str:
    key = {"algorithm": getattr(algorithm, "name", type(algorithm).__name__),
           "config": getattr(algorithm, "config_dict", lambda: None)(),
           "clients": n_clients, "sampler": sampler.to_dict(), "seed": seed,
           "privacy": None if privacy is None else {"mechanism": repr(privacy.mechanism),
                                                    "composition": privacy.composition,
                                                    **({} if privacy.population is None
                                                       else {"population": int(privacy.population)}),
                                                    **({"noise_draw": int(privacy.noise_draw)}
                                                       if privacy.noise_draw else {})},
           "extra": extra}
    return json.dumps(key, sort_keys=True, default=repr)


def run_federated(
    algorithm: Any,
    clients: Sequence[Any],
    *,
    rounds: int,
    sampler: Any,
    backend: Any = None,
    seed: int = 0,
    min_clients: int = 1,
    client_timeout: float | None = None,
    privacy: PrivacySettings | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    key: Any = None,
    on_round: Callable[[RoundLog, Any], None] | None = None,
) -> FederatedResult:
    """Run ``rounds`` rounds of ``algorithm`` over ``clients`` (see the module docstring).

    Args:
        algorithm: a :class:`~privasr.federated.core.FederatedAlgorithm`.
        clients: the population; ``clients[i]`` is passed to ``client_update`` as is (it stays on the device).
        rounds: the total number of rounds (a resumed run continues up to it).
        sampler: a :mod:`privasr.federated.sampling` sampler.
        backend: a backend (:func:`privasr.federated.backends.make_backend`); ``None``: local.
        seed: seeds every random draw (sampling, clients, noise, server).
        min_clients: without DP, a round that sampled clients of which fewer reported fails (one that sampled
            nobody is skipped); with the server's DP noise it must be 1 (every round is released); with
            distributed noise (SecAgg+), the number of noise shares a round needs.
        client_timeout: seconds after which a client is dropped (``None``: no limit).
        privacy: differential privacy (:class:`PrivacySettings`), or ``None``; checked by :func:`check_privacy`
            before round 0.
        checkpoint_dir: where ``state.npz`` is written after every round.
        resume: continue from ``checkpoint_dir/state.npz`` if it exists (it must come from the same run).
        key: anything JSON-able that identifies the run's data and settings beyond the arguments here; a
            checkpoint made with another key is refused.
        on_round: called with each round's :class:`RoundLog` and the new server state, before the round's
            checkpoint is written (metrics it adds to the entry are kept in it).

    Raises:
        ConfigError: bad arguments, or DP settings that would void the guarantee (:func:`check_privacy`).
        FederatedError: a round that cannot complete (too few reports without DP, too few noise shares with
            distributed noise) or a checkpoint of another run.
    """
    check_run_arguments(clients, rounds, min_clients, client_timeout, sampler)
    backend = backend if backend is not None else LocalBackend()
    n = len(clients)
    if privacy is not None:
        check_privacy(algorithm, privacy, sampler, n, min_clients, getattr(backend, "secagg", None))
    run_key = _run_key(algorithm, n, sampler, seed, privacy, key)
    ckpt = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None

    if resume and ckpt is not None and ckpt.is_file():
        start, state, client_states, history = _load_checkpoint(ckpt, run_key, privacy)
        progress.note(f"resuming from round {start} (checkpoint {ckpt.parent})")
    else:
        start, client_states, history = 0, {}, []
        state = algorithm.init(np.random.default_rng([seed, 0, 3]))
    if privacy is not None and start < rounds:
        _check_accounting_cost(privacy, sampler, n, rounds - start)

    name = getattr(algorithm, "name", type(algorithm).__name__)
    with progress.task(f"{name} rounds", total=rounds, completed=start) as bar:
        for r in range(start, rounds):
            state = _one_round(algorithm, clients, r, state, client_states, history, sampler=sampler,
                               backend=backend, seed=seed, min_clients=min_clients, client_timeout=client_timeout,
                               privacy=privacy, on_round=on_round, ckpt=ckpt, run_key=run_key)
            bar.advance()
    return FederatedResult(state, client_states, history, start)


def _one_round(algorithm: Any, clients: Sequence[Any], r: int, state: Any, client_states: dict[int, Any],
               history: list[RoundLog], *, sampler: Any, backend: Any, seed: int, min_clients: int,
               client_timeout: float | None, privacy: PrivacySettings | None,
               on_round: Callable[[RoundLog, Any], None] | None, ckpt: Path | None, run_key: str) -> Any:
    """Round ``r`` of :func:`run_federated`; returns the new server state (the clients' go into
    ``client_states``, the round's log onto ``history``; the checkpoint is written)."""
    n = len(clients)
    t0 = time.perf_counter()
    payload = algorithm.broadcast(state, r)
    picked = np.asarray(sampler.sample(n, r, seed), dtype=np.int64)
    tasks = [ClientTask(slot, int(i), clients[int(i)], client_states.get(int(i)), client_seed(seed, r, int(i), slot))
             for slot, i in enumerate(picked)]
    # the backend runs even an empty round (Flower's backend counts its rounds); it returns no outcome then
    acc, reported, dropped, new_states, client_s, metrics, shares = _round_sum(
        algorithm, backend, payload, tasks, client_timeout, privacy, min_clients, r)
    if not tasks and privacy is None:  # nobody sampled (Poisson): nothing to aggregate, nothing released
        log.info("round %d: the sampler drew no client; the round is skipped", r)
        entry = RoundLog(r, 0, 0, {}, {"skipped": 1.0}, time.perf_counter() - t0, 0.0)
        return _finish_round(entry, state, history, client_states, on_round, ckpt, run_key, privacy)
    # a DP round that sampled nobody still releases (noise alone, below)
    if privacy is None and reported < min_clients:
        raise FederatedError(f"round {r}: only {reported} of {len(tasks)} sampled clients reported "
                             f"(min_clients={min_clients}); dropped: {dropped}")
    for i, (_, s) in new_states.items():
        client_states[i] = s
    if privacy is None:
        state, m = algorithm.server_update(state, acc, r, np.random.default_rng([seed, r, 4]))
        entry = RoundLog(r, len(tasks), reported, dropped, {**dict(m or {}), **metrics}, time.perf_counter() - t0,
                         client_s)
        return _finish_round(entry, state, history, client_states, on_round, ckpt, run_key, privacy)
    if acc is None:  # nobody reported: the release is noise alone
        acc = algorithm.zero_sum(state)
    acc, dp = _privatise(acc, algorithm, privacy, sampler, n, len(tasks), seed, r,
                         None if shares is None else (shares, reported))
    acc = acc.released(_denominator(acc, privacy, sampler, n))
    state, m = algorithm.server_update(state, acc, r, np.random.default_rng([seed, r, 4]))
    public = {k: v for k, v in dict(m or {}).items() if k in tuple(algorithm.dp_metrics)}
    entry = RoundLog(r, None, None, {}, {**public, **{k: dp[k] for k in DP_PUBLISHED}}, None, None)
    return _finish_round(entry, state, history, client_states, on_round, ckpt, run_key, privacy)


def _denominator(acc: SumAccumulator, privacy: PrivacySettings, sampler: Any, n_clients: int) -> float:
    """The denominator of round's release: :func:`dp_denominator` of the declared population (``acc``, the
    noised sum, is not used: a test swaps this function for the exact weight, the normalisation that leaks)."""
    return dp_denominator(sampler, privacy.population if privacy.population is not None else n_clients)


def _finish_round(entry: RoundLog, state: Any, history: list[RoundLog], client_states: Mapping[int, Any],
                  on_round: Callable[[RoundLog, Any], None] | None, ckpt: Path | None, run_key: str,
                  privacy: PrivacySettings | None) -> Any:
    """Append the round's entry to the history, call ``on_round``, write the checkpoint; the new state."""
    r = entry.round
    history.append(entry)
    if on_round is not None:  # before the checkpoint, so that metrics it adds to the entry are kept
        on_round(entry, state)
    if ckpt is not None:
        _save_checkpoint(ckpt, run_key, r + 1, state, client_states, history, privacy)
    return state


def _check_accounting_cost(privacy: PrivacySettings, sampler: Any, population: int, rounds: int) -> None:
    """Refuse, before round one, a run whose accountant would take minutes to compose its rounds (PLD at a tiny
    noise multiplier: :meth:`~privasr.privacy.dp.accounting.PrivacyAccountant.check_cost`)."""
    check = getattr(privacy.accountant, "check_cost", None)
    if check is None or getattr(privacy.accountant, "accountant", None) != "pld":
        return
    if privacy.composition == "parallel":
        check(privacy.mechanism.dp_event(), 1)
        return
    check(_round_event(privacy.mechanism, sampler, population), rounds)


def _load_checkpoint(ckpt: Path, run_key: str, privacy: PrivacySettings | None
                     ) -> tuple[int, Any, dict[int, Any], list[RoundLog]]:
    """The round to continue at, the server state, the client states and the history saved in ``ckpt`` (the
    accountant's state is loaded into ``privacy``); a checkpoint of another run is refused."""
    saved = load_tree(ckpt)
    if saved.get("run_key") != run_key:
        raise FederatedError(f"the checkpoint {ckpt} belongs to another run (different algorithm settings, "
                             "clients, sampler, seed, privacy or data); use another --out or remove it")
    start = int(saved["round"])
    state = saved["state"]
    client_states = {int(k): v for k, v in saved["client_states"].items()}
    history = [RoundLog(**h) for h in saved["history"]]
    if privacy is not None:
        privacy.accountant.load_state_dict(saved["accountant"])
    log.info("resuming at round %d from %s", start, ckpt)
    return start, state, client_states, history


def _round_sum(algorithm: Any, backend: Any, payload: Any, tasks: list[ClientTask], client_timeout: float | None,
               privacy: PrivacySettings | None, min_clients: int, r: int
               ) -> tuple[Any, int, dict[str, str], dict[int, tuple[int, Any]], float, dict[str, Any], int | None]:
    """Run round ``r``'s clients on ``backend`` and sum what they sent: :func:`_gather`'s figures, the round's
    first metrics and, when the clients add the DP noise in shares, the number of shares that make it
    (``min_clients``). A backend with ``secagg`` (SecAgg+) sums the updates itself: the server gets the sum only."""
    secure = getattr(backend, "secagg", None)
    if secure is None:
        sizes: list[int] = []
        acc, reported, dropped, new_states, client_s = _gather(
            algorithm, _sized(backend.run(algorithm, payload, tasks, client_timeout), sizes), r, expected=len(tasks),
            private=privacy is not None)
        return acc, reported, dropped, new_states, client_s, _upload_metrics(algorithm, sizes, privacy), None
    parts = min_clients if privacy is not None and secure.noise == "distributed" else None
    noise = None if parts is None or privacy is None else (privacy.mechanism.to_spec(), parts)
    outs, acc, clipped = backend.run_secure(algorithm, payload, tasks, client_timeout, noise)
    _, reported, dropped, new_states, client_s = _gather(algorithm, outs, r, summed=True, private=privacy is not None)
    return acc, reported, dropped, new_states, client_s, {"secagg_clipped": float(clipped)}, parts


def _block_accumulator(algorithm: Any) -> Any:
    """The algorithm's ``accumulate_many`` (folds a block of updates at once; FMP: one bincount), unless a
    subclass overrides ``accumulate`` below where ``accumulate_many`` is defined (it would be bypassed)."""
    def definer(name: str) -> type | None:
        return next((c for c in type(algorithm).__mro__ if name in vars(c)), None)

    many, one = definer("accumulate_many"), definer("accumulate")
    if many is None or (one is not None and not issubclass(many, one)):
        return None
    return algorithm.accumulate_many


def _sized(outcomes: Iterable[Any], sizes: list[int]) -> Iterator[Any]:
    """``outcomes`` as they arrive, appending each update's payload bytes (``Update.nbytes``) to ``sizes``."""
    for out in outcomes:
        if out.ok:
            sizes.append(out.update.nbytes)
        yield out


def _upload_metrics(algorithm: Any, sizes: Sequence[int], privacy: PrivacySettings | None) -> dict[str, float]:
    """A round's upload figures: ``upload_bytes``, the mean payload bytes of a reporting client's update (its
    arrays exactly: codes, scales, ids, values), and for algorithms with ``raw_update_bytes`` (fedlm, FTL) the
    dense float32 size ``upload_raw_bytes`` and ``upload_ratio`` (raw / sent). With differential privacy none:
    sizes can depend on the data (FMP's ids, skipped zero blocks) and the noise does not cover them.

    >>> class Alg:
    ...     def raw_update_bytes(self): return 4000
    >>> _upload_metrics(Alg(), [1000, 1032], None)
    {'upload_bytes': 1016.0, 'upload_raw_bytes': 4000.0, 'upload_ratio': 3.937007874015748}
    """
    if privacy is not None or not sizes:
        return {}
    out = {"upload_bytes": float(np.mean(sizes))}
    raw = getattr(algorithm, "raw_update_bytes", None)
    if raw is not None:
        out["upload_raw_bytes"] = float(raw())
        if out["upload_bytes"] > 0:
            out["upload_ratio"] = out["upload_raw_bytes"] / out["upload_bytes"]
    return out


def _gather(algorithm: Any, outcomes: Iterable[Any], r: int, *, summed: bool = False, expected: int | None = None,
            private: bool = False) -> tuple[Any, int, dict[str, str], dict[int, tuple[int, Any]], float]:
    """Fold round ``r``'s successful updates into the accumulator as they arrive and log the dropped clients.

    Returns the accumulator, the number of clients that reported, the dropped ones (``"slot:index"`` -> why),
    each reporting client's new state with the slot it came from (the first slot of a client drawn twice) and
    the clients' summed seconds. ``summed``: the backend summed the updates securely, so a successful outcome
    carries no update (the accumulator returned is then ``None``). ``expected``: the number of clients sampled
    (the progress bar's total). ``private`` (a DP run): no client is named in a log line and no per-client
    progress bar is drawn, since both would publish the cohort's size.
    """
    acc = None
    dropped: dict[str, str] = {}
    reported = 0
    new_states: dict[int, tuple[int, Any]] = {}
    client_s = 0.0
    many = _block_accumulator(algorithm)
    pending: list[Any] = []
    for out in (outcomes if private else progress.track(outcomes, f"round {r + 1} clients", total=expected)):
        client_s += out.seconds
        if not (out.error is None if summed else out.ok):
            dropped[f"{out.slot}:{out.index}"] = out.error or "no update"
            if not private:
                log.warning("round %d: client %d (slot %d) dropped: %s", r, out.index, out.slot, out.error)
            continue
        if summed:
            pass
        elif many is None:
            acc = algorithm.accumulate(acc, out.update)
        else:
            pending.append(out.update)
            if len(pending) >= BLOCK:
                acc, pending = many(acc, pending), []
        reported += 1
        if out.index not in new_states or out.slot < new_states[out.index][0]:
            new_states[out.index] = (out.slot, out.state)
    if pending:
        acc = many(acc, pending)
    return acc, reported, dropped, new_states, client_s


def _privatise(acc: Any, algorithm: Any, privacy: PrivacySettings, sampler: Any, population: int, sample_size: int,
               seed: int, r: int, shares: tuple[int, int] | None = None) -> tuple[SumAccumulator, dict[str, Any]]:
    """Round ``r``'s accumulated sum with the mechanism's noise (added once), the accountant stepped, and the
    metrics ``epsilon`` and ``delta`` spent so far.

    ``shares = (parts, received)``: the clients added the noise themselves, each a ``1/parts`` share, and
    ``received`` shares are in the sum; nothing more is added, and the accountant is stepped with the
    calibrated mechanism, the noise of ``parts`` shares: ``received >= parts`` shares make at least that much,
    and accounting for the shares that arrived would make epsilon a function of the cohort size.
    """
    if not isinstance(acc, SumAccumulator):
        raise FederatedError(f"{type(algorithm).__name__} does not accumulate into a SumAccumulator; "
                             "differential privacy needs one to add noise to")
    mechanism = privacy.mechanism
    if shares is None:
        draw = int(privacy.noise_draw)
        acc = acc.add_noise(mechanism, np.random.default_rng([seed, r, 2] if draw == 0 else [seed, r, 2, draw]))
    else:
        if privacy.noise_draw:
            raise FederatedError(f"noise_draw={privacy.noise_draw} with noise shares added by the clients: "
                                 "noise draws repeat central noise only")
        parts, received = shares
        if received < parts:
            raise FederatedError(f"round {r}: fewer than the {parts} noise shares (min_clients) that make the "
                                 "calibrated noise arrived: with distributed noise the round cannot be released "
                                 "(resume the run to retry it)")
        acc = SumAccumulator(acc.arrays, acc.weight, acc.count, acc.metrics, acc.noised + 1)
    _account(privacy, mechanism, sampler, population, sample_size, r)
    return acc, {"epsilon": float(privacy.accountant.epsilon()), "delta": float(privacy.accountant.target_delta)}


def _save_checkpoint(ckpt: Path, run_key: str, rounds_done: int, state: Any, client_states: Mapping[int, Any],
                     history: Sequence[RoundLog], privacy: PrivacySettings | None) -> None:
    """Write everything needed to continue after ``rounds_done`` rounds to ``ckpt`` (atomic)."""
    save_tree(ckpt, {"run_key": run_key, "round": rounds_done, "state": state,
                     "client_states": {int(k): v for k, v in client_states.items()},
                     "history": [h.to_dict() for h in history],
                     "accountant": privacy.accountant.state_dict() if privacy is not None else None})


def _account(privacy: PrivacySettings, mechanism: Any, sampler: Any, population: int, sample_size: int,
             r: int) -> None:
    if privacy.composition == "parallel":
        if r == 0 or not privacy.accountant.events:
            privacy.accountant.step(mechanism.dp_event())
        return
    privacy.accountant.step(_round_event(mechanism, sampler, population))


def _round_event(mechanism: Any, sampler: Any, population: int) -> Any:
    """One round's accounting event: the mechanism's event amplified by the sampler that picked the clients."""
    from privasr.privacy.dp.accounting import round_event

    kind = sampler.kind
    params: dict[str, Any] = {}
    if kind == "poisson":
        params["sampling_probability"] = sampler.sampling_probability(population)
    elif kind in ("without_replacement", "with_replacement"):
        params.update(sample_size=int(sampler.n), population=population)
    return round_event(mechanism.dp_event(), kind, **params)
