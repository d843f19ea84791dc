"""The federated loop: rounds, robustness (raising / slow / vanishing clients), checkpoints and resume, DP hook."""

from __future__ import annotations

import time

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError
from privasr.federated.backends import make_backend
from privasr.federated.backends.local import ClientVanished
from privasr.federated.core import FederatedError, SumAccumulator, Update
from privasr.federated.loop import CHECKPOINT_NAME, PrivacySettings, RoundLog, run_federated
from privasr.federated.sampling import AllClients, Poisson, UniformWithoutReplacement, UniformWithReplacement
from privasr.federated.tree import load_tree


class NoisyMean:
    """Clients send (value - global + N(0, 0.1)); the server moves to the weighted mean; clients count calls."""

    name = "noisy-mean"

    def __init__(self, fail: dict[int, str] | None = None, sleep: dict[int, float] | None = None) -> None:
        self.fail = fail or {}
        self.sleep = sleep or {}
        self.seen_noised: list[int] = []

    def config_dict(self) -> dict:
        return {"kind": "noisy-mean"}

    def init(self, rng: np.random.Generator) -> dict:
        return {"x": np.zeros(2), "round": 0}

    def broadcast(self, state: dict, round: int) -> dict:
        return {"x": state["x"], "round": round}

    def client_update(self, payload: dict, client: dict, client_state: dict | None, rng: np.random.Generator):
        cid = client["id"]
        if cid in self.fail:
            kind = self.fail[cid]
            if kind == "vanish":
                raise ClientVanished("device offline")
            raise RuntimeError(f"client {cid} broke")
        if cid in self.sleep:
            time.sleep(self.sleep[cid])
        calls = (client_state or {"calls": 0})["calls"] + 1
        delta = client["value"] - payload["x"] + rng.normal(0, 0.1, size=2)
        return Update({"delta": delta}, weight=float(client["n"]), metrics={"n": client["n"]}), {"calls": calls}

    def accumulate(self, acc: SumAccumulator | None, update: Update) -> SumAccumulator:
        return (acc or SumAccumulator.empty()).add(update, scale=update.weight)

    def server_update(self, state: dict, acc: SumAccumulator, round: int, rng: np.random.Generator):
        self.seen_noised.append(acc.noised)
        x = state["x"] + acc.mean()["delta"]
        return {"x": x, "round": round + 1}, {"x0": float(x[0]), "clients": acc.count}


class UniformMean(NoisyMean):
    """NoisyMean with uniform weights and deltas clipped to L2 1: what differential privacy needs."""

    name = "uniform-mean"
    dp_metrics = ("x0",)

    def client_update(self, payload, client, client_state, rng):
        upd, st = super().client_update(payload, client, client_state, rng)
        d = upd.arrays["delta"]
        return Update({"delta": d / max(1.0, float(np.linalg.norm(d)))}, 1.0, dict(upd.metrics)), st

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update)

    def dp_bound(self):
        return "l2", 1.0

    def zero_sum(self, state):
        return SumAccumulator({"delta": np.zeros(2)})


def _clients(k: int = 6) -> list[dict]:
    return [{"id": i, "value": np.array([float(i), -float(i)]), "n": i + 1} for i in range(k)]


def test_runs_and_is_reproducible():
    a = run_federated(NoisyMean(), _clients(), rounds=4, sampler=UniformWithoutReplacement(3), seed=7)
    b = run_federated(NoisyMean(), _clients(), rounds=4, sampler=UniformWithoutReplacement(3), seed=7)
    c = run_federated(NoisyMean(), _clients(), rounds=4, sampler=UniformWithoutReplacement(3), seed=8)
    assert np.array_equal(a.state["x"], b.state["x"])
    assert not np.array_equal(a.state["x"], c.state["x"])
    assert [h.reported for h in a.history] == [3, 3, 3, 3]
    assert sum(s["calls"] for s in a.client_states.values()) == 12


def test_weighted_mean_with_all_clients():
    cl = _clients(4)
    res = run_federated(NoisyMean(), cl, rounds=1, sampler=AllClients(), seed=0)
    w = np.array([c["n"] for c in cl], float)
    vals = np.stack([c["value"] for c in cl])
    # noise-free part of the weighted mean (noise sd 0.1 / sqrt-ish): within 0.2
    assert np.allclose(res.state["x"], (w[:, None] * vals).sum(0) / w.sum(), atol=0.2)


def test_failing_slow_and_vanished_clients_are_dropped_with_reasons():
    alg = NoisyMean(fail={1: "raise", 2: "vanish"}, sleep={3: 0.05})
    res = run_federated(alg, _clients(), rounds=2, sampler=AllClients(), client_timeout=0.02, min_clients=2)
    h = res.history[0]
    assert h.reported == 3 and h.sampled == 6
    reasons = h.dropped
    assert reasons["1:1"].startswith("raised RuntimeError: client 1 broke")
    assert reasons["2:2"].startswith("vanished")
    assert reasons["3:3"].startswith("timed out")
    assert 1 not in res.client_states and 3 not in res.client_states


def test_too_few_clients_fails_the_round():
    alg = NoisyMean(fail={i: "raise" for i in range(5)})
    with pytest.raises(FederatedError, match="only 1 of 6 sampled clients reported"):
        run_federated(alg, _clients(), rounds=1, sampler=AllClients(), min_clients=2)


def test_with_replacement_duplicates_keep_first_slot_state():
    res = run_federated(NoisyMean(), _clients(3), rounds=3, sampler=UniformWithReplacement(6), seed=1)
    assert all(h.sampled == 6 for h in res.history)
    # a client drawn twice in a round is counted once in its state (its first slot's state is kept)
    assert all(1 <= s["calls"] <= 3 for s in res.client_states.values())


def test_poisson_round_that_draws_nobody_is_skipped_without_dp(caplog):
    sampler = Poisson(0.3)
    empty = [r for r in range(20) if sampler.sample(2, r, 3).size == 0]
    assert empty and len(empty) < 20
    states: list[np.ndarray] = []
    with caplog.at_level("INFO", logger="privasr.federated"):
        res = run_federated(NoisyMean(), _clients(2), rounds=20, sampler=sampler, seed=3,
                            on_round=lambda e, st: states.append(st["x"].copy()))
    assert [h.round for h in res.history] == list(range(20))
    for r in empty:
        h = res.history[r]
        assert (h.sampled, h.reported, h.metrics) == (0, 0, {"skipped": 1.0})
        assert np.array_equal(states[r], states[r - 1] if r else np.zeros(2))  # nothing changed
    assert sum("the sampler drew no client" in m for m in caplog.messages) == len(empty)
    # a round that sampled clients of which too few reported still fails
    with pytest.raises(FederatedError, match="only 0 of 2 sampled clients reported"):
        run_federated(NoisyMean(fail={0: "raise", 1: "raise"}), _clients(2), rounds=1, sampler=AllClients())


def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    full = run_federated(NoisyMean(), _clients(), rounds=5, sampler=UniformWithoutReplacement(4), seed=3)
    d = tmp_path / "run"
    # "killed" after 2 rounds: run 2 rounds, then resume to 5 with the same arguments
    run_federated(NoisyMean(), _clients(), rounds=2, sampler=UniformWithoutReplacement(4), seed=3, checkpoint_dir=d)
    saved = load_tree(d / CHECKPOINT_NAME)
    assert saved["round"] == 2
    resumed = run_federated(NoisyMean(), _clients(), rounds=5, sampler=UniformWithoutReplacement(4), seed=3,
                            checkpoint_dir=d, resume=True)
    assert resumed.resumed_from == 2
    assert np.array_equal(full.state["x"], resumed.state["x"])
    assert full.client_states == resumed.client_states
    assert [h.metrics for h in full.history] == [h.metrics for h in resumed.history]


def test_killed_mid_round_resumes_from_last_complete_round(tmp_path):
    d = tmp_path / "run"

    class Killer(NoisyMean):
        def server_update(self, state, acc, round, rng):
            if round == 3:
                raise KeyboardInterrupt
            return super().server_update(state, acc, round, rng)

    with pytest.raises(KeyboardInterrupt):
        run_federated(Killer(), _clients(), rounds=5, sampler=AllClients(), seed=2, checkpoint_dir=d)
    assert load_tree(d / CHECKPOINT_NAME)["round"] == 3
    resumed = run_federated(NoisyMean(), _clients(), rounds=5, sampler=AllClients(), seed=2, checkpoint_dir=d,
                            resume=True)
    full = run_federated(NoisyMean(), _clients(), rounds=5, sampler=AllClients(), seed=2)
    assert np.array_equal(full.state["x"], resumed.state["x"])


def test_resume_refuses_another_run(tmp_path):
    d = tmp_path / "run"
    run_federated(NoisyMean(), _clients(), rounds=1, sampler=AllClients(), seed=0, checkpoint_dir=d)
    with pytest.raises(FederatedError, match="belongs to another run"):
        run_federated(NoisyMean(), _clients(), rounds=2, sampler=AllClients(), seed=1, checkpoint_dir=d, resume=True)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / CHECKPOINT_NAME).write_bytes(b"not a zip")
    with pytest.raises(InputError, match="unreadable state file"):
        run_federated(NoisyMean(), _clients(), rounds=1, sampler=AllClients(), checkpoint_dir=d, resume=True)


class CountingGaussian:
    """A stand-in mechanism that records every call."""

    clip_norm = 1.0

    def __init__(self) -> None:
        self.calls = 0

    def add_noise(self, arrays, rng):
        self.calls += 1
        return {k: v + rng.normal(0, 1e-3, size=v.shape) for k, v in arrays.items()}

    def dp_event(self):
        import dp_accounting

        return dp_accounting.GaussianDpEvent(1.0)


def test_noise_is_added_once_per_round_and_epsilon_reported():
    pytest.importorskip("dp_accounting")
    from privasr.privacy.dp.accounting import PrivacyAccountant

    mech = CountingGaussian()
    alg = UniformMean()
    priv = PrivacySettings(mech, PrivacyAccountant(accountant="rdp", target_delta=1e-5))
    res = run_federated(alg, _clients(), rounds=3, sampler=AllClients(), privacy=priv)
    assert mech.calls == 3 and alg.seen_noised == [1, 1, 1]
    eps = [h.metrics["epsilon"] for h in res.history]
    assert eps[0] > 0 and eps[0] < eps[1] < eps[2]
    assert all(h.metrics["delta"] == 1e-5 for h in res.history)


def test_noise_draws_differ_in_their_noise_only():
    pytest.importorskip("dp_accounting")
    from privasr.privacy.dp.accounting import PrivacyAccountant

    class Recording(CountingGaussian):
        def __init__(self):
            super().__init__()
            self.draws = []

        def add_noise(self, arrays, rng):
            self.draws.append(rng.normal(size=3))
            return super().add_noise(arrays, rng)

    def run(draw, seed=0):
        mech = Recording()
        priv = PrivacySettings(mech, PrivacyAccountant(accountant="rdp", target_delta=1e-5), noise_draw=draw)
        res = run_federated(UniformMean(), _clients(), rounds=2, sampler=AllClients(), seed=seed, privacy=priv)
        return mech.draws, res

    d0, r0 = run(0)
    d0b, _ = run(0)
    d1, r1 = run(1)
    d2, _ = run(2)
    assert all(np.array_equal(a, b) for a, b in zip(d0, d0b, strict=True))  # draw 0 is the plain run, repeatable
    assert not np.array_equal(d0[0], d1[0]) and not np.array_equal(d1[0], d2[0])  # other noise per draw
    # draw 0's noise is the run's own seed stream: existing results do not move
    assert np.array_equal(d0[0], np.random.default_rng([0, 0, 2]).normal(size=3))
    # the same epsilon for every draw: each draw is one release
    assert [h.metrics["epsilon"] for h in r0.history] == [h.metrics["epsilon"] for h in r1.history]
    with pytest.raises(ConfigError, match="noise_draw"):
        PrivacySettings(Recording(), None, noise_draw=-1)


def test_cohorts_that_can_never_reach_min_clients_are_refused_before_any_work():
    class Refuse(NoisyMean):
        def client_update(self, *a, **k):
            raise AssertionError("a refused run did work")

    with pytest.raises(ConfigError, match="min_clients=7 but a round's cohort holds at most 6 clients"):
        run_federated(Refuse(), _clients(), rounds=1, sampler=AllClients(), min_clients=7)
    with pytest.raises(ConfigError, match="min_clients=3 but a round's cohort holds at most 2 clients"):
        run_federated(Refuse(), _clients(), rounds=1, sampler=UniformWithoutReplacement(2), min_clients=3)
    with pytest.raises(ConfigError, match="draws n=8 distinct clients a round but there are 6"):
        run_federated(Refuse(), _clients(), rounds=1, sampler=UniformWithoutReplacement(8))


def test_bad_arguments():
    with pytest.raises(ConfigError):
        run_federated(NoisyMean(), [], rounds=1, sampler=AllClients())
    with pytest.raises(ConfigError):
        run_federated(NoisyMean(), _clients(), rounds=-1, sampler=AllClients())
    with pytest.raises(ConfigError):
        run_federated(NoisyMean(), _clients(), rounds=1, sampler=AllClients(), min_clients=0)
    with pytest.raises(ConfigError, match="unknown backend"):
        make_backend("carrier-pigeon")


def test_client_must_return_an_update():
    class Leaky(NoisyMean):
        def client_update(self, payload, client, client_state, rng):
            return {"text": "hello"}, None

    with pytest.raises(FederatedError, match="only 0 of"):
        run_federated(Leaky(), _clients(2), rounds=1, sampler=AllClients())


def test_update_rejects_text_and_nonfinite():
    with pytest.raises(InputError, match="no text leaves a client"):
        Update({"w": np.array(["a", "b"])})
    with pytest.raises(InputError, match="no text leaves a client"):
        Update({"w": np.array([b"a"])})
    with pytest.raises(InputError):
        Update({"w": np.array([object()], dtype=object)})
    with pytest.raises(InputError, match="NaN or infinity"):
        Update({"w": np.array([np.nan])})
    with pytest.raises(InputError):
        Update({}, weight=-1.0)
    with pytest.raises(InputError):
        Update({}, metrics={"note": "text"})  # type: ignore[dict-item]


def test_dp_run_resumes_with_its_accountant(tmp_path):
    pytest.importorskip("dp_accounting")
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    def priv():
        return PrivacySettings(GaussianMechanism(clip_norm=1.0, noise_multiplier=2.0),
                               PrivacyAccountant(accountant="rdp", target_delta=1e-5, neighboring="replace_one"))

    kw = {"sampler": UniformWithoutReplacement(3), "seed": 4}
    full_priv = priv()
    full = run_federated(UniformMean(), _clients(), rounds=4, privacy=full_priv, **kw)
    d = tmp_path / "run"
    run_federated(UniformMean(), _clients(), rounds=2, privacy=priv(), checkpoint_dir=d, **kw)
    p2 = priv()
    resumed = run_federated(UniformMean(), _clients(), rounds=4, privacy=p2, checkpoint_dir=d, resume=True, **kw)
    assert np.array_equal(full.state["x"], resumed.state["x"])
    assert p2.accountant.steps == 4
    assert resumed.history[-1].metrics["epsilon"] == pytest.approx(full.history[-1].metrics["epsilon"], rel=1e-12)


def test_blocks_are_folded_by_accumulate_many_unless_a_subclass_overrides_accumulate():
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig
    from privasr.federated.loop import _block_accumulator

    class Recording(FmpAlgorithm):
        def accumulate(self, acc, update):
            return super().accumulate(acc, update)

    class Blocks(Recording):
        def accumulate_many(self, acc, updates, block=4096):
            return super().accumulate_many(acc, updates, block)

    u = np.full(4, 0.25)
    assert _block_accumulator(FmpAlgorithm(FmpConfig(), u)) is not None
    assert _block_accumulator(Recording(FmpConfig(), u)) is None  # its accumulate would be bypassed
    assert _block_accumulator(Blocks(FmpConfig(), u)) is not None


# -- differential privacy: releases that depend on nothing but the noised sum ---------------------------------


def _gaussian(z: float = 2.0, clip: float = 1.0, neighboring: str = "add_or_remove_one", **kw):
    pytest.importorskip("dp_accounting")
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    return PrivacySettings(GaussianMechanism(clip_norm=clip, noise_multiplier=z),
                           PrivacyAccountant(accountant="rdp", target_delta=1e-5, neighboring=neighboring), **kw)


class Recording(UniformMean):
    """Keeps what ``server_update`` was handed."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seen: list[tuple[float, int, dict, int]] = []

    def server_update(self, state, acc, round, rng):
        self.seen.append((acc.weight, acc.count, dict(acc.metrics), acc.noised))
        return super().server_update(state, acc, round, rng)


def test_an_empty_poisson_round_under_dp_releases_noise_alone_and_is_accounted():
    from privasr.privacy.dp.accounting import epsilon_for

    sampler = Poisson(0.1)
    sizes = [sampler.sample(3, r, 0).size for r in range(5)]
    assert 0 in sizes  # the cohorts of the failing report: nobody is drawn in round 0
    alg = Recording()
    states: list[np.ndarray] = []
    res = run_federated(alg, _clients(3), rounds=5, sampler=sampler, seed=0, privacy=_gaussian(2.0),
                        on_round=lambda e, st: states.append(st["x"].copy()))
    assert len(res.history) == 5
    assert res.history[-1].metrics["epsilon"] == pytest.approx(epsilon_for(2.0, 5, "poisson", q=0.1), rel=1e-9)
    first_empty = sizes.index(0)
    before = states[first_empty - 1] if first_empty else np.zeros(2)
    assert not np.array_equal(states[first_empty], before)  # noise alone was released
    # every release: the fixed denominator q x N = 0.3, no count, no metrics, noised once
    assert alg.seen == [(pytest.approx(0.3), 0, {}, 1)] * 5


def test_the_denominator_is_fixed_by_the_sampler_and_the_declared_population():
    for sampler, population, want in ((Poisson(0.5), None, 3.0), (Poisson(0.5), 10, 5.0), (AllClients(), None, 6.0),
                                      (UniformWithoutReplacement(2), None, 2.0)):
        alg = Recording()
        rel = "replace_one" if sampler.kind == "without_replacement" else "add_or_remove_one"
        run_federated(alg, _clients(6), rounds=3, sampler=sampler, seed=1,
                      privacy=_gaussian(population=population, neighboring=rel))
        assert [w for w, *_ in alg.seen] == [want] * 3, (sampler, population)


def test_a_dp_round_publishes_only_its_release(tmp_path, caplog):
    alg = UniformMean(fail={1: "raise"})
    with caplog.at_level("DEBUG", logger="privasr.federated"):
        res = run_federated(alg, _clients(), rounds=3, sampler=Poisson(0.6), seed=2, privacy=_gaussian(),
                            checkpoint_dir=tmp_path)
    for h in [*res.history, *(RoundLog(**d) for d in load_tree(tmp_path / CHECKPOINT_NAME)["history"])]:
        d = h.to_dict()
        assert set(d["metrics"]) == {"x0", "epsilon", "delta"}  # dp_metrics and the accountant's, nothing else
        assert (d["sampled"], d["reported"], d["dropped"], d["seconds"], d["client_seconds"]) == \
            (None, None, {}, None, None)
    assert not [m for m in caplog.messages if "client" in m]  # no client named, no drop logged
    # without DP the same run logs and publishes the drop
    with caplog.at_level("WARNING", logger="privasr.federated"):
        plain = run_federated(NoisyMean(fail={1: "raise"}), _clients(), rounds=3, sampler=Poisson(0.6), seed=2)
    assert any(h.dropped for h in plain.history) and any("client 1" in m for m in caplog.messages)


def test_settings_that_void_the_guarantee_are_refused_before_any_work():
    from privasr.federated.secagg import SecAggSettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import LaplaceMechanism

    class Refuse(UniformMean):
        def client_update(self, *a, **k):
            raise AssertionError("a refused run did work")

    cl = _clients(4)
    with pytest.raises(ConfigError, match="does not define dp_bound"):
        run_federated(NoisyMean(), cl, rounds=1, sampler=AllClients(), privacy=_gaussian())
    with pytest.raises(ConfigError, match="epsilon would be understated"):
        run_federated(Refuse(), cl, rounds=1, sampler=AllClients(), privacy=_gaussian(clip=0.5))
    with pytest.raises(ConfigError, match="bounds a unit's contribution in L2"):
        run_federated(Refuse(), cl, rounds=1, sampler=AllClients(),
                      privacy=PrivacySettings(LaplaceMechanism(1.0, 1.0), PrivacyAccountant("pld")))
    with pytest.raises(ConfigError, match="min_clients=2 with differential privacy.*publish the cohort size"):
        run_federated(Refuse(), cl, rounds=1, sampler=AllClients(), min_clients=2, privacy=_gaussian())
    with pytest.raises(ConfigError, match=r"delta=1e-05 for a population of 100000 clients.*\(0, 1/N\)-DP"):
        run_federated(Refuse(), cl, rounds=1, sampler=AllClients(), privacy=_gaussian(population=100_000))
    with pytest.raises(ConfigError, match="declared population of 2 clients is smaller"):
        run_federated(Refuse(), cl, rounds=1, sampler=AllClients(), privacy=_gaussian(population=2))
    with pytest.raises(ConfigError, match="population=0"):
        _gaussian(population=0)
    with pytest.raises(ConfigError, match="'without_replacement' sampling; supported with .*replace_one"):
        run_federated(Refuse(), cl, rounds=1, sampler=UniformWithoutReplacement(2), privacy=_gaussian())

    class SecureLocal:  # a backend that says it aggregates securely (the check comes before any round)
        secagg = SecAggSettings(enabled=True)

        def run(self, *a, **k):
            raise AssertionError("a refused run did work")

    with pytest.raises(ConfigError, match="secure aggregation with differential privacy and 'poisson' sampling"):
        run_federated(Refuse(), cl, rounds=1, sampler=Poisson(0.5), backend=SecureLocal(), privacy=_gaussian())
    from privasr.errors import PrivacyWarning

    with pytest.warns(PrivacyWarning, match="epsilon is infinite"):
        run_federated(UniformMean(), cl, rounds=1, sampler=AllClients(), privacy=_gaussian(z=0.0))
