"""The ``dp_games`` section of ``privasr audit``: every differentially private path of privasr audited by a
membership game through the real federated loop (:mod:`privasr.federated.dp_games`), beside a planted control.

Each game runs one configuration ``trials`` times on ``D`` or its neighbour ``D'`` (a fair coin per trial, a
fresh seed per run), scores what the run releases, and turns the scores into an empirical epsilon lower bound
(95%, Clopper-Pearson, threshold chosen on half the trials) that must stay at or below the accountant's epsilon
for the same configuration. The control replays the game with a known leak put back
(:func:`~privasr.federated.dp_games.planted_leak`); its bound above the accountant's epsilon shows the game can
see the leak it is for.

The games, on the configuration of the cohort-size report (a tiny Transformer over a 7-word vocabulary, clients
``A``, ``B`` and the target ``T`` with one three-word sentence each, FedAvg with server learning rate 1,
uniform weights, deltas clipped to ``clip_norm``, one round):

* ``fedlm_poisson``: Poisson sampling at ``rate``, noise multiplier ``noise_multiplier``, add/remove-one
  neighbours (``D' = {A, B}``); the attacker reads the size of the released step
  (:func:`~privasr.federated.dp_games.released_step_norm`). Control: the count denominator.
* ``fedlm_all``: every client each round, the same noise and neighbours. Control: the count denominator.
* ``fedlm_fixed``: two clients drawn without replacement, replace-one neighbours (``D' = {A, B, O}``), noise
  multiplier ``fixed_noise_multiplier``; the attacker knows both candidates' data and scores the released step's
  alignment with ``d_T - d_O`` (:func:`~privasr.federated.dp_games.aligned_step`). No control (the cohort is
  fixed, so its size tells nothing).
* ``fedlm_distributed``: secure aggregation (Flower's SecAgg+ through the in-process grid, the real ClientApp)
  with each client adding a share of the noise (``t = 3``), every client of ``{A, B, C}`` plus ``T`` or ``O``,
  replace-one neighbours, the aligned-step attacker; ``secagg_trials`` trials (each runs the whole protocol).
  No control.
* ``fmp_laplace``: FMP with utterance-level caps and Laplace noise at ``fmp_epsilon``, a rare word planted in
  one utterance of a random target (:func:`~privasr.federated.audit.fmp_trial_runner`); the score is its count
  in the released noisy sum. Control: the noise left out.

The weighted aggregations are not games: under DP they are refused before any work (fedlm ``clip_norm`` and FTL
``delta_clip`` need uniform weights), and the section records the refusals.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.config import setting
from privasr.errors import ConfigError

__all__ = ["DpGamesSettings", "GAMES", "audit_dp_games", "dp_games_report"]

GAMES = ("fedlm_poisson", "fedlm_all", "fedlm_fixed", "fedlm_distributed", "fmp_laplace")
"""The DP configurations the section can audit (see the module docstring)."""

_CONTROLS = {"fedlm_poisson": "count_denominator", "fedlm_all": "count_denominator", "fmp_laplace": "no_noise"}

_DESCRIPTION = {
    "fedlm_poisson": "fedlm, Gaussian, Poisson sampling, add/remove-one",
    "fedlm_all": "fedlm, Gaussian, every client, add/remove-one",
    "fedlm_fixed": "fedlm, Gaussian, 2 of 3 without replacement, replace-one",
    "fedlm_distributed": "fedlm, Gaussian shares under SecAgg+ (t = 3), every client, replace-one",
    "fmp_laplace": "FMP, Laplace, utterance-level caps, every client",
}
_LEAK = {"count_denominator": "noised sum / clients that reported", "no_noise": "the noise left out"}


@dataclass(frozen=True)
class DpGamesSettings:
    """The ``dp_games`` section (see the module docstring).

    ``games``: which of :data:`GAMES`; ``trials``: trials per game (and per control); ``secagg_trials``: trials
    of ``fedlm_distributed`` (each runs SecAgg+); ``noise_multiplier``, ``clip_norm``, ``rate``: fedlm's Gaussian
    games; ``fixed_noise_multiplier``: the fixed-cohort games'; ``fmp_epsilon``: FMP's Laplace epsilon per
    release; ``controls``: also play each game's planted control; ``confidence``: of the bounds.
    """

    games: tuple[str, ...] = GAMES
    trials: int = setting(1000, min=10)
    secagg_trials: int = setting(100, min=10)
    noise_multiplier: float = setting(10.0, gt=0.0)
    fixed_noise_multiplier: float = setting(1.0, gt=0.0)
    clip_norm: float = setting(0.5, gt=0.0)
    rate: float = setting(0.5, gt=0.0, max=1.0)
    fmp_epsilon: float = setting(1.0, gt=0.0)
    controls: bool = True
    confidence: float = setting(0.95, gt=0.0, lt=1.0)

    def __config_check__(self, where: str, ctx: Any) -> None:
        bad = [g for g in self.games if g not in GAMES]
        if bad or not self.games or len(set(self.games)) != len(self.games):
            raise ConfigError(f"config key '{where}.games': {list(self.games)}",
                              expected=f"one or more of {', '.join(GAMES)}, each once")


def _fedlm_setup(s: DpGamesSettings) -> tuple[Any, dict[str, Any]]:
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig
    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.vocab import Vocabulary

    vocab = Vocabulary.build([["a", "b", "c", "d"]])
    alg = FedLmAlgorithm(FedLmConfig(server="fedavg", weighting="uniform", clip_norm=s.clip_norm),
                         NeuralLMConfig.preset("tiny-transformer"), vocab)

    def client(name: str, words: str) -> Any:
        return FedLmClient(name, (tuple(vocab.encode(words.split())),))

    people = {"A": client("A", "a b c"), "B": client("B", "b c d"), "C": client("C", "a a b"),
              "T": client("T", "c a d"), "O": client("O", "d d a")}
    return alg, people


def _gaussian(z: float, clip: float, neighboring: str, population: int) -> Any:
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    return lambda: PrivacySettings(GaussianMechanism(clip_norm=clip, noise_multiplier=z),
                                   PrivacyAccountant("rdp", target_delta=1e-5, neighboring=neighboring),
                                   population=population)


def _fedlm_game(name: str, s: DpGamesSettings, rng: np.random.Generator, workdir: str) -> Any:
    from privasr.federated.backends.flower_inprocess import run_inprocess
    from privasr.federated.dp_games import aligned_step, loop_trial_runner, play
    from privasr.federated.sampling import AllClients, Poisson, UniformWithoutReplacement
    from privasr.federated.secagg import SecAggSettings

    alg, p = _fedlm_setup(s)
    base, trials, kw = [p["A"], p["B"]], s.trials, {}
    if name == "fedlm_poisson":
        sampler, privacy = Poisson(s.rate), _gaussian(s.noise_multiplier, s.clip_norm, "add_or_remove_one", 3)
    elif name == "fedlm_all":
        sampler, privacy = AllClients(), _gaussian(s.noise_multiplier, s.clip_norm, "add_or_remove_one", 3)
    elif name == "fedlm_fixed":
        sampler = UniformWithoutReplacement(2)
        privacy = _gaussian(s.fixed_noise_multiplier, s.clip_norm, "replace_one", 3)
        kw = {"neighbours": "replace", "replacement": p["O"], "score": aligned_step(alg, p["T"], p["O"])}
    else:  # fedlm_distributed
        base, trials, sampler = [p["A"], p["B"], p["C"]], s.secagg_trials, AllClients()
        privacy = _gaussian(s.fixed_noise_multiplier, s.clip_norm, "replace_one", 4)
        secure = SecAggSettings(enabled=True, noise="distributed")

        def run(algorithm: Any, clients: Any, **k: Any) -> Any:
            return run_inprocess(algorithm, clients, workdir=workdir, secagg=secure, **k)

        kw = {"neighbours": "replace", "replacement": p["O"], "run": run, "min_clients": 3,
              "score": aligned_step(alg, p["T"], p["O"])}
    make_run = loop_trial_runner(alg, base, p["T"], sampler=sampler, privacy=privacy, **kw)
    return play(make_run, trials, rng=rng, delta=1e-5, confidence=s.confidence)


def _fmp_game(s: DpGamesSettings, rng: np.random.Generator) -> Any:
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance
    from privasr.federated.audit import fmp_aggregate_trials, fmp_trial_runner, unused_ids
    from privasr.federated.dp_games import play_trials
    from privasr.federated.loop import PrivacySettings
    from privasr.federated.sampling import AllClients
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import LaplaceMechanism

    words = np.random.default_rng(0)
    clients = [FmpClient(f"client{c}", (tuple(
        FmpUtterance(f"c{c}u{k}", tuple(words.integers(1, 8, size=3) for _ in range(2)), [0.0, -1.0], 0.7)
        for k in range(2)),)) for c in range(4)]
    alg = FmpAlgorithm(FmpConfig(dp_unit="utterance", dp_cap=1.0, sigma=0.01), np.full(12, 1 / 12))

    def privacy() -> Any:
        return PrivacySettings(LaplaceMechanism(sensitivity=1.0, epsilon=s.fmp_epsilon),
                               PrivacyAccountant("pld", target_delta=1e-5), composition="parallel")

    run = fmp_trial_runner(alg, clients, unused_ids(clients, 12)[-1:], sampler=AllClients(), privacy=privacy)
    trials = fmp_aggregate_trials(run, s.trials, rng)
    one = privacy()  # the accountant of one run: one release (parallel composition)
    one.accountant.step(one.mechanism.dp_event())
    return play_trials(trials, epsilon=float(one.accountant.epsilon()), delta=1e-5, rng=rng, confidence=s.confidence)


def _summary(result: Any) -> dict[str, Any]:
    from privasr.experiments.audit_runs import roc_points

    t = result.trials
    return {**result.to_dict(), "eps_lb_max": result.audit.eps_lb_max,
            "roc": roc_points(t.scores[t.labels], t.scores[~t.labels])}


def _refusals(s: DpGamesSettings) -> dict[str, str]:
    """The weighted aggregations under DP: refused before any work (their messages)."""
    from privasr.federated.algorithms.fedlm import FedLmConfig
    from privasr.federated.algorithms.ftl import FtlConfig

    out = {}
    for name, make in (("fedlm weighting: words", lambda: FedLmConfig(clip_norm=s.clip_norm, weighting="words")),
                       ("ftl weighting: count", lambda: FtlConfig(delta_clip=s.clip_norm, weighting="count")),
                       ("ftl weighting: softmax", lambda: FtlConfig(delta_clip=s.clip_norm, weighting="softmax"))):
        try:
            make()
        except ConfigError as e:
            out[name] = str(e)
        else:  # pragma: no cover - a weighted DP aggregation accepted is a bug the section must report
            out[name] = "ACCEPTED"
    return out


def audit_dp_games(s: DpGamesSettings, seed: int) -> dict[str, Any]:
    """Play every configured game (and its planted control); the section of results.json."""
    from privasr import progress
    from privasr.federated.dp_games import planted_leak

    t0 = time.perf_counter()
    games: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="privasr-dp-games-") as work, \
            progress.task("DP games", total=len(s.games)) as bar:
        for i, name in enumerate(s.games):
            def play(name: str = name, i: int = i) -> Any:  # the release and its control draw alike
                rng = np.random.default_rng([seed, 36, i])
                return _fmp_game(s, rng) if name == "fmp_laplace" else _fedlm_game(name, s, rng, work)

            g: dict[str, Any] = {"description": _DESCRIPTION[name], "release": _summary(play())}
            leak = _CONTROLS.get(name)
            if s.controls and leak is not None:
                with planted_leak(leak):
                    g["control"] = {"leak": leak, "what": _LEAK[leak], **_summary(play())}
            games[name] = g
            bar.advance()
    return {"games": games, "refused": _refusals(s), "seconds": time.perf_counter() - t0}


def dp_games_report(section: dict[str, Any]) -> list[str]:
    """The report's lines for the section: one row per game and control, then the refusals.

    >>> r = {"trials": 10, "tpr": 0.5, "fpr": 0.0, "eps_lb": 0.1, "eps_lb_max": 1.0, "epsilon": 0.2, "holds": True}
    >>> lines = dp_games_report({"games": {"fedlm_all": {"description": "d", "release": r}}, "refused": {}})
    >>> lines[-2]
    '| d | the release | 10 | 0.500 | 0.000 | 0.100 | 1.000 | 0.2 | yes |'
    """
    lines = ["## DP configurations audited through the loop (membership games)", "",
             "Each trial is a fresh run on D or its neighbour; the attacker scores only the release. The bound "
             "holds with 95% confidence; it must stay at or below the accountant's epsilon. A control replays the "
             "game with a known leak put back.", "",
             "| configuration | run | trials | TPR | FPR | epsilon lower bound | provable at most | "
             "accountant's epsilon | bound <= epsilon |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for g in section["games"].values():
        runs = [("the release", g["release"])]
        if "control" in g:
            runs.append((f"control: {g['control']['what']}", g["control"]))
        for label, r in runs:
            lines.append(f"| {g['description']} | {label} | {r['trials']} | {r['tpr']:.3f} | {r['fpr']:.3f} | "
                         f"{r['eps_lb']:.3f} | {r['eps_lb_max']:.3f} | {r['epsilon']:.3g} | "
                         f"{'yes' if r['holds'] else '**no**'} |")
    if section.get("refused"):
        lines += ["", "Refused before any work (weighted aggregation under DP):", ""]
        lines += [f"- {name}: {msg}" for name, msg in section["refused"].items()]
    lines.append("")
    return lines
