r"""Membership games that audit a differentially private configuration through the real federated loop.

A DP guarantee for one unit says that no test can tell a run on ``D`` (with the unit) from a run on a neighbouring
``D'`` (without it, or with it replaced) better than ``e^epsilon`` allows. The game (Jagielski et al. 2020; Nasr
et al. 2021) plays that test: each of ``n_trials`` independent trials flips a fair coin, runs the whole
configuration -- sampler, clients, clipping, noise, denominator, server optimiser, the loop's published history --
on ``D`` (heads) or ``D'`` (tails) with a fresh seed, and scores only what the run **releases** (the final server
state and :class:`~privasr.federated.loop.RoundLog` history: what every model user sees). The scores go to
:func:`~privasr.privacy.audit.bounds.threshold_attack`, whose epsilon lower bound holds with 95% confidence; it
must stay at or below the accountant's epsilon for the same configuration, and a configuration whose release
leaks more than it accounts for (e.g. dividing the noised sum by the number of clients that reported, which
publishes the cohort size) is caught (:class:`GameResult`, ``holds``).

* :func:`loop_trial_runner` builds a trial for any algorithm: ``D = base + [target]`` and, by ``neighbours``,
  ``D' = base`` (``"add_remove"``: Poisson or all-client sampling with ``neighboring="add_or_remove_one"``) or
  ``D' = base + [replacement]`` (``"replace"``: fixed-size sampling with ``neighboring="replace_one"``). The
  population the DP denominator uses is declared (``PrivacySettings.population``), so it is the same on both
  sides, as the mechanism's parameters are.
* :func:`released_step_norm` is the score of the cohort-size attack: minus the L2 norm of the change of the
  server's ``params`` over the run (a step divided by the reporting count is smaller the more clients took part).
  :func:`aligned_step` is the attacker who knows the data (as the DP game allows): the released step's inner
  product with what the target would send, minus what its replacement would (computed from the public initial
  state), the statistic of the likelihood-ratio test against the Gaussian mechanism.
* :func:`play` runs the trials and the attack.
* :func:`planted_leak` puts a known leak back for the length of a ``with`` block -- ``"count_denominator"``: the
  noised sum divided by the number of clients that reported, the normalisation DP-FedAvg replaces by a fixed
  one; ``"no_noise"``: the loop's noise left out -- so that an audit shows its game catches what it is for.

FMP's games (a planted rare word, the canary count of the released sum) are
:func:`~privasr.federated.audit.fmp_trial_runner` with :func:`~privasr.federated.audit.fmp_aggregate_trials`;
their scores go to :func:`play_trials` in the same way.

>>> import numpy as np
>>> from privasr.federated.audit import MembershipTrials, fmp_aggregate_trials
>>> rng = np.random.default_rng(0)
>>> r = play_trials(MembershipTrials(np.r_[np.ones(100), np.zeros(100)], np.r_[np.ones(100, bool), np.zeros(100, bool)],
...                                  np.arange(200)), epsilon=1.0, delta=1e-5, rng=rng)
>>> r.audit.eps_lb > 1.0, r.holds
(True, False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms._config import is_int
from privasr.federated.audit import MembershipTrials, fmp_aggregate_trials
from privasr.privacy.audit.bounds import AuditResult, threshold_attack
from privasr.privacy.dp.clip import global_norm

__all__ = ["GameResult", "loop_trial_runner", "released_step_norm", "aligned_step", "play", "play_trials",
           "planted_leak", "NEIGHBOURS", "LEAKS"]

NEIGHBOURS = ("add_remove", "replace")
"""How ``D'`` differs from ``D``: the target left out, or the target replaced by another client."""

LEAKS = ("count_denominator", "no_noise")
"""The leaks :func:`planted_leak` can put back (the audit's planted controls)."""


@dataclass(frozen=True)
class GameResult:
    """A membership game's trials, the attack's outcome and the accountant's epsilon for the configuration.

    Attributes:
        trials: the scores and coins (:class:`~privasr.federated.audit.MembershipTrials`).
        audit: :func:`~privasr.privacy.audit.bounds.threshold_attack` on them (``eps_lb``, rates, counts).
        epsilon: what the accountant says one trial's run costs (at ``delta``).
        delta: the delta of both.
    """

    trials: MembershipTrials
    audit: AuditResult
    epsilon: float
    delta: float

    @property
    def holds(self) -> bool:
        """Whether the empirical lower bound stays at or below the accountant's epsilon."""
        return self.audit.eps_lb <= self.epsilon

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly summary (the attack's counts and bound, epsilon, delta, the number of trials)."""
        return {"trials": int(self.trials.scores.size), "epsilon": float(self.epsilon), "delta": float(self.delta),
                "holds": self.holds, **self.audit.to_dict()}


def released_step_norm(before: Mapping[str, Any], after: Mapping[str, Any], history: Sequence[Any]) -> float:
    """Minus the L2 norm of the change of ``params`` between two server states (the cohort-size attack's score:
    higher means "more clients reported", i.e. the target took part).

    >>> released_step_norm({"params": {"w": np.zeros(2)}}, {"params": {"w": np.array([3.0, 4.0])}}, [])
    -5.0
    """
    p0, p1 = before["params"], after["params"]
    return -global_norm({k: np.asarray(p1[k], dtype=np.float64) - np.asarray(p0[k], dtype=np.float64) for k in p0})


def aligned_step(algorithm: Any, target: Any, replacement: Any = None
                 ) -> Callable[[Mapping[str, Any], Mapping[str, Any], Sequence[Any]], float]:
    """The score of an attacker who knows the target's data: ``<released step, d_T - d_R>``, with ``d_T`` the
    (clipped) update the target would send from the run's initial state and ``d_R`` its replacement's (0 for
    add/remove-one neighbours). The initial state is public (the first broadcast), so the attacker computes
    both per trial; the client's generator is its own guess (seed 0), not the run's.

    >>> class Shift:
    ...     def broadcast(self, state, round): return state
    ...     def client_update(self, payload, client, client_state, rng):
    ...         from privasr.federated.core import Update
    ...         return Update({"w": np.array([client])}), None
    >>> score = aligned_step(Shift(), 2.0, 0.5)
    >>> score({"params": {"w": np.zeros(1)}}, {"params": {"w": np.array([3.0])}}, [])
    4.5
    """
    def delta(client: Any, state: Mapping[str, Any]) -> dict[str, np.ndarray]:
        upd, _ = algorithm.client_update(algorithm.broadcast(state, 0), client, None, np.random.default_rng(0))
        decoded = algorithm.decoded(upd) if hasattr(algorithm, "decoded") else upd
        return {k: np.asarray(v, dtype=np.float64) for k, v in decoded.arrays.items()}

    def score(before: Mapping[str, Any], after: Mapping[str, Any], history: Sequence[Any]) -> float:
        d = delta(target, before)
        if replacement is not None:
            r = delta(replacement, before)
            d = {k: v - r[k] for k, v in d.items()}
        p0, p1 = before["params"], after["params"]
        return float(sum(np.vdot(np.asarray(p1[k], dtype=np.float64) - np.asarray(p0[k], dtype=np.float64), d[k])
                         for k in d))

    return score


def loop_trial_runner(algorithm: Any, base: Sequence[Any], target: Any, *, sampler: Any,
                      privacy: Callable[[], Any], rounds: int = 1, neighbours: str = "add_remove",
                      replacement: Any = None,
                      score: Callable[[Any, Any, Sequence[Any]], float] = released_step_norm,
                      run: Callable[..., Any] | None = None, min_clients: int = 1,
                      ) -> Callable[[bool, np.random.Generator], tuple[float, float]]:
    """A trial of the game for any algorithm: ``make_run(member, rng) -> (score, epsilon)``.

    Each call runs ``rounds`` rounds of ``algorithm`` on ``base + [target]`` (``member``) or on its neighbour,
    with a seed drawn from ``rng`` and fresh privacy settings from ``privacy()`` (an accountant is stateful; give
    it a declared ``population``), and scores the release with ``score(initial state, final state, history)``.

    Args:
        algorithm: a federated algorithm with a DP path.
        base: the clients both datasets share.
        target: the client under test.
        sampler, rounds, min_clients: the loop's settings.
        privacy: a function returning fresh :class:`~privasr.federated.loop.PrivacySettings`.
        neighbours: ``"add_remove"`` or ``"replace"`` (then ``replacement`` stands in ``D'``).
        score: what the attacker computes from the release.
        run: ``run(algorithm, clients, *, rounds, sampler, seed, privacy, min_clients) -> FederatedResult``;
            by default :func:`~privasr.federated.loop.run_federated` on the local backend (pass one that drives
            Flower's in-process grid to audit secure aggregation).

    Raises:
        ConfigError: bad settings.
    """
    from privasr.federated.loop import run_federated

    if neighbours not in NEIGHBOURS:
        raise ConfigError(f"neighbours={neighbours!r}", expected=f"one of {list(NEIGHBOURS)}")
    if neighbours == "replace" and replacement is None:
        raise ConfigError("neighbours='replace' without a replacement client", expected="replacement=<a client>")
    if not callable(privacy):
        raise ConfigError(f"privacy is a {type(privacy).__name__}",
                          expected="a function returning fresh PrivacySettings")
    if not is_int(rounds) or rounds < 1:
        raise ConfigError(f"rounds={rounds!r}", expected="an integer >= 1")
    members = [*base, target]
    others = [*base] if neighbours == "add_remove" else [*base, replacement]
    driver = run if run is not None else run_federated

    def make_run(member: bool, rng: np.random.Generator) -> tuple[float, float]:
        seed = int(rng.integers(2 ** 31 - 1))
        settings = privacy()
        init = algorithm.init(np.random.default_rng([seed, 0, 3]))  # the loop's own initial state
        res = driver(algorithm, members if member else others, rounds=rounds, sampler=sampler, seed=seed,
                     privacy=settings, min_clients=min_clients)
        return float(score(init, res.state, res.history)), float(settings.accountant.epsilon())

    return make_run


def play(make_run: Callable[[bool, np.random.Generator], tuple[float, float]], n_trials: int, *,
         rng: np.random.Generator, delta: float, confidence: float = 0.95) -> GameResult:
    """``n_trials`` independent trials of ``make_run`` (a fair coin each), then the threshold attack.

    The accountant's epsilon must be the same in every trial (it is a property of the configuration, never of
    the data: a run whose epsilon varied with the cohort would fail here).

    Raises:
        ConfigError: ``n_trials`` < 4 or a bad ``rng``.
        InputError: trials whose epsilons differ.
    """
    if not is_int(n_trials) or n_trials < 4:
        raise ConfigError(f"n_trials={n_trials!r}", expected="an integer >= 4 (two halves of members and others)")
    epsilons: list[float] = []

    def scored(member: bool, trial_rng: np.random.Generator) -> float:
        score, epsilon = make_run(member, trial_rng)
        epsilons.append(float(epsilon))
        return score

    trials = fmp_aggregate_trials(scored, int(n_trials), rng)  # the coins and per-trial streams of every game
    eps = np.asarray(epsilons)
    if not np.allclose(eps, eps[0], rtol=1e-9, atol=0.0):
        raise InputError(f"the trials' epsilons range from {eps.min():.6g} to {eps.max():.6g}",
                         expected="one epsilon per configuration, independent of the data")
    return play_trials(trials, epsilon=float(eps[0]), delta=delta, rng=rng, confidence=confidence)


def play_trials(trials: MembershipTrials, *, epsilon: float, delta: float, rng: np.random.Generator,
                confidence: float = 0.95) -> GameResult:
    """The threshold attack on finished trials (e.g. FMP's :func:`~privasr.federated.audit.fmp_aggregate_trials`)
    against the accountant's ``epsilon``.

    Raises:
        InputError: fewer than two member or two non-member trials.
    """
    s_in, s_out = trials.scores[trials.labels], trials.scores[~trials.labels]
    if s_in.size < 2 or s_out.size < 2:
        raise InputError(f"{s_in.size} member and {s_out.size} non-member trials",
                         expected="at least two of each (play more trials)")
    audit = threshold_attack(s_in, s_out, delta=delta, confidence=confidence, rng=rng)
    return GameResult(trials, audit, float(epsilon), float(delta))


@contextmanager
def planted_leak(kind: str) -> Iterator[None]:
    """Put a known leak back into the federated loop for the ``with`` block (a planted control of the audit).

    * ``"count_denominator"``: a DP round's noised sum is divided by the exact number of clients that reported
      (1 when none did), as before fixed denominators: the released step's size then tells the cohort's size;
    * ``"no_noise"``: the loop adds no noise (it still counts the round as noised and steps the accountant).

    Never use it outside an audit: it changes the process's loop until the block ends.

    Raises:
        ConfigError: an unknown ``kind``.

    >>> from privasr.federated import loop
    >>> with planted_leak("count_denominator"):
    ...     patched = loop._denominator
    >>> patched is loop._denominator
    False
    """
    from privasr.federated import loop
    from privasr.federated.core import SumAccumulator

    if kind not in LEAKS:
        raise ConfigError(f"planted leak {kind!r}", expected=f"one of {list(LEAKS)}")
    if kind == "count_denominator":
        saved = loop._denominator
        loop._denominator = lambda acc, *a: acc.weight if acc.weight > 0 else 1.0  # type: ignore[assignment]
        try:
            yield
        finally:
            loop._denominator = saved  # type: ignore[assignment]
        return
    saved_noise = SumAccumulator.add_noise

    def silent(self: SumAccumulator, mechanism: Any, rng: np.random.Generator) -> SumAccumulator:
        return SumAccumulator(dict(self.arrays), self.weight, self.count, dict(self.metrics), self.noised + 1)

    SumAccumulator.add_noise = silent  # type: ignore[method-assign]
    try:
        yield
    finally:
        SumAccumulator.add_noise = saved_noise  # type: ignore[method-assign]
