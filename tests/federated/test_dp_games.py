"""Every DP configuration audited through the real loop (privasr.federated.dp_games): the membership game's epsilon
lower bound stays at or below the accountant's epsilon, and a planted leak of the kind the game is for (the
noised sum divided by the number of clients that reported; noise left out) is caught."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("dp_accounting")

from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.federated import loop  # noqa: E402
from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig  # noqa: E402
from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance  # noqa: E402
from privasr.federated.audit import fmp_aggregate_trials, fmp_trial_runner, unused_ids  # noqa: E402
from privasr.federated.core import SumAccumulator  # noqa: E402
from privasr.federated.dp_games import (  # noqa: E402
    aligned_step,
    loop_trial_runner,
    planted_leak,
    play,
    play_trials,
    released_step_norm,
)
from privasr.federated.loop import PrivacySettings  # noqa: E402
from privasr.federated.sampling import AllClients, Poisson, UniformWithoutReplacement  # noqa: E402
from privasr.lm.neural.models import NeuralLMConfig  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402
from privasr.privacy.dp.accounting import PrivacyAccountant  # noqa: E402
from privasr.privacy.dp.mechanisms import GaussianMechanism, LaplaceMechanism  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = Vocabulary.build([["a", "b", "c", "d"]])
CLIP = 0.5
DELTA = 1e-5


def _fedlm() -> FedLmAlgorithm:
    return FedLmAlgorithm(FedLmConfig(server="fedavg", weighting="uniform", clip_norm=CLIP),
                          NeuralLMConfig.preset("tiny-transformer"), VOCAB)


def _client(name: str, words: str) -> FedLmClient:
    return FedLmClient(name, (tuple(VOCAB.encode(words.split())),))


BASE = [_client("A", "a b c"), _client("B", "b c d")]
TARGET = _client("T", "c a d")
OTHER = _client("O", "d d a")


def _gaussian(z: float, neighboring: str = "add_or_remove_one", population: int = 3):
    return lambda: PrivacySettings(GaussianMechanism(clip_norm=CLIP, noise_multiplier=z),
                                   PrivacyAccountant("rdp", target_delta=DELTA, neighboring=neighboring),
                                   population=population)


def _old_normalisation(monkeypatch):
    """The bug the game is for, planted: the noised sum divided by the number of clients that reported (as
    planted_leak("count_denominator") does, here with pytest's monkeypatch)."""
    monkeypatch.setattr(loop, "_denominator", lambda acc, *a: acc.weight if acc.weight > 0 else 1.0)


def _game(sampler, privacy, trials, seed, **kw):
    run = loop_trial_runner(_fedlm(), BASE, TARGET, sampler=sampler, privacy=privacy, **kw)
    return play(run, trials, rng=np.random.default_rng(seed), delta=DELTA)


# -- fedlm, Gaussian, each sampler ---------------------------------------------------------------------------


def test_the_cohort_size_game_under_poisson_sampling(monkeypatch):
    """The failing report's game: tiny-transformer, clip 0.5, z = 10, FedAvg (lr 1), uniform weights, Poisson(0.5),
    one round, D' = {A, B} against D = {A, B, target}; the attacker reads the size of the released step."""
    fixed = _game(Poisson(0.5), _gaussian(10.0), 1000, seed=1)
    assert fixed.holds, fixed.to_dict()
    assert 0 < fixed.epsilon < 0.25
    _old_normalisation(monkeypatch)
    leaky = _game(Poisson(0.5), _gaussian(10.0), 1000, seed=1)
    assert leaky.epsilon == fixed.epsilon  # the accountant cannot see the leak ...
    assert not leaky.holds and leaky.audit.fpr == 0.0, leaky.to_dict()  # ... the game does


def test_the_game_with_every_client_sampled(monkeypatch):
    fixed = _game(AllClients(), _gaussian(10.0), 120, seed=2)
    assert fixed.holds, fixed.to_dict()
    _old_normalisation(monkeypatch)
    leaky = _game(AllClients(), _gaussian(10.0), 120, seed=2)
    assert not leaky.holds and leaky.audit.tpr == 1.0 and leaky.audit.fpr == 0.0, leaky.to_dict()


def test_the_game_with_fixed_size_cohorts_and_replace_one_neighbours():
    """An attacker who knows the target's and the replacement's data: the step's alignment with d_T - d_O."""
    fixed = _game(UniformWithoutReplacement(2), _gaussian(1.0, "replace_one"), 300, seed=3,
                  neighbours="replace", replacement=OTHER, score=aligned_step(_fedlm(), TARGET, OTHER))
    assert fixed.holds, fixed.to_dict()
    assert fixed.audit.tpr > fixed.audit.fpr  # the attack sees something; it proves less than the accountant allows


def test_an_empty_poisson_round_of_fedlm_releases_noise_alone_and_is_accounted():
    """The failing report's cohorts: Poisson(0.1) over 3 clients, z = 2; round 0 draws nobody."""
    from privasr.privacy.dp.accounting import epsilon_for

    sampler = Poisson(0.1)
    assert sampler.sample(3, 0, 0).size == 0
    alg = _fedlm()
    steps: list[float] = []
    res = loop.run_federated(alg, [*BASE, TARGET], rounds=5, sampler=sampler, seed=0, privacy=_gaussian(2.0)(),
                             on_round=lambda e, st: steps.append(e.metrics["update_norm"]))
    assert len(res.history) == 5 and all(n > 0 for n in steps)  # every round moved the model: noise alone too
    assert res.history[-1].metrics["epsilon"] == pytest.approx(epsilon_for(2.0, 5, "poisson", q=0.1), rel=1e-9)
    assert res.history[-1].metrics["epsilon"] == pytest.approx(0.7446, abs=1e-4)


def test_weighted_aggregation_stays_refused_under_dp():
    with pytest.raises(ConfigError, match="weighting='uniform'"):
        FedLmConfig(clip_norm=CLIP, weighting="words")
    alg = FedLmAlgorithm(FedLmConfig(weighting="uniform"), NeuralLMConfig.preset("tiny-transformer"), VOCAB)
    with pytest.raises(ConfigError, match="without clip_norm"):
        loop.run_federated(alg, [*BASE, TARGET], rounds=1, sampler=AllClients(), privacy=_gaussian(10.0)())


# -- FMP, Laplace ---------------------------------------------------------------------------------------------


def _fmp_population(n: int = 4) -> tuple[FmpAlgorithm, list[FmpClient]]:
    rng = np.random.default_rng(0)
    clients = []
    for c in range(n):
        utts = tuple(FmpUtterance(f"c{c}u{k}", tuple(rng.integers(1, 8, size=3) for _ in range(2)), [0.0, -1.0], 0.7)
                     for k in range(2))
        clients.append(FmpClient(f"client{c}", (utts,)))
    u = np.full(12, 1 / 12)
    return FmpAlgorithm(FmpConfig(dp_unit="utterance", dp_cap=1.0, sigma=0.01), u), clients


def _fmp_game(epsilon: float, trials: int, seed: int):
    alg, clients = _fmp_population()
    canary = unused_ids(clients, 12)[-1:]

    def privacy():
        return PrivacySettings(LaplaceMechanism(sensitivity=1.0, epsilon=epsilon),
                               PrivacyAccountant("pld", target_delta=DELTA), composition="parallel")

    run = fmp_trial_runner(alg, clients, canary, sampler=AllClients(), privacy=privacy)
    t = fmp_aggregate_trials(run, trials, np.random.default_rng(seed))
    return play_trials(t, epsilon=privacy().mechanism.epsilon, delta=DELTA, rng=np.random.default_rng(seed))


def test_fmp_laplace_holds_and_a_release_without_its_noise_is_caught(monkeypatch):
    fixed = _fmp_game(1.0, 100, seed=4)
    assert fixed.holds, fixed.to_dict()
    with planted_leak("no_noise"):
        leaky = _fmp_game(1.0, 100, seed=4)
    assert not leaky.holds, leaky.to_dict()
    assert SumAccumulator.add_noise is not None and _fmp_game(1.0, 20, seed=5).audit.fpr > 0  # the noise is back


# -- distributed noise under SecAgg+ (Flower's in-process grid, the real ClientApp and secaggplus_mod) ------------


def _secure_run(tmp_path):
    pytest.importorskip("flwr")
    from privasr.federated.backends.flower_inprocess import run_inprocess
    from privasr.federated.secagg import SecAggSettings

    def run(algorithm, clients, **kw):
        return run_inprocess(algorithm, clients, workdir=tmp_path,
                             secagg=SecAggSettings(enabled=True, noise="distributed"), **kw)

    return run


def test_distributed_noise_under_secagg(tmp_path):
    base = [*BASE, _client("C", "a a b")]
    run = loop_trial_runner(_fedlm(), base, TARGET, sampler=AllClients(), privacy=_gaussian(1.0, "replace_one", 4),
                            neighbours="replace", replacement=OTHER, run=_secure_run(tmp_path), min_clients=3,
                            score=aligned_step(_fedlm(), TARGET, OTHER))
    fixed = play(run, 40, rng=np.random.default_rng(5), delta=DELTA)
    assert fixed.holds, fixed.to_dict()


def test_distributed_noise_with_add_remove_neighbours_is_refused(tmp_path):
    base = [*BASE, _client("C", "a a b")]
    run = loop_trial_runner(_fedlm(), base, TARGET, sampler=AllClients(), privacy=_gaussian(4.0, population=4),
                            run=_secure_run(tmp_path), min_clients=3)
    with pytest.raises(ConfigError, match="noise level itself tells whether it took part"):
        run(True, np.random.default_rng(0))


# -- the game's own checks ------------------------------------------------------------------------------------


def test_game_arguments_and_a_data_dependent_epsilon_are_refused():
    with pytest.raises(ConfigError, match="neighbours"):
        loop_trial_runner(_fedlm(), BASE, TARGET, sampler=AllClients(), privacy=_gaussian(1.0), neighbours="swap")
    with pytest.raises(ConfigError, match="replacement"):
        loop_trial_runner(_fedlm(), BASE, TARGET, sampler=AllClients(), privacy=_gaussian(1.0), neighbours="replace")
    with pytest.raises(ConfigError, match="n_trials"):
        play(lambda m, r: (0.0, 1.0), 2, rng=np.random.default_rng(0), delta=DELTA)
    with pytest.raises(InputError, match="epsilons range"):
        play(lambda m, r: (0.0, 2.0 if m else 1.0), 20, rng=np.random.default_rng(0), delta=DELTA)
    assert released_step_norm({"params": {"w": np.ones(2)}}, {"params": {"w": np.ones(2)}}, []) == 0.0
    with pytest.raises(ConfigError, match="planted leak"), planted_leak("forgot_clipping"):
        pass
    before = loop._denominator
    with pytest.raises(RuntimeError), planted_leak("count_denominator"):
        raise RuntimeError("the block failed")
    assert loop._denominator is before  # restored whatever happened
