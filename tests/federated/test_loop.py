"""The federated loop: rounds, robustness (raising / slow / vanishing clients), checkpoints and resume, DP hook."""

from __future__ import annotations

import time

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError
from privasr.federated.backends import make_backend
from privasr.federated.backends.local import ClientVanished
from privasr.federated.core import FederatedError, SumAccumulator, Update
from privasr.federated.loop import CHECKPOINT_NAME, PrivacySettings, run_federated
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


def test_poisson_round_may_be_empty_and_then_fails_cleanly():
    with pytest.raises(FederatedError, match="reported"):
        run_federated(NoisyMean(), _clients(2), rounds=20, sampler=Poisson(0.05), seed=3)


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
    alg = NoisyMean()
    priv = PrivacySettings(mech, PrivacyAccountant(accountant="rdp", target_delta=1e-5))
    res = run_federated(alg, _clients(), rounds=3, sampler=AllClients(), privacy=priv)
    assert mech.calls == 3 and alg.seen_noised == [1, 1, 1]
    eps = [h.metrics["epsilon"] for h in res.history]
    assert eps[0] > 0 and eps[0] < eps[1] < eps[2]
    assert all(h.metrics["delta"] == 1e-5 for h in res.history)


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
    full = run_federated(NoisyMean(), _clients(), rounds=4, privacy=full_priv, **kw)
    d = tmp_path / "run"
    run_federated(NoisyMean(), _clients(), rounds=2, privacy=priv(), checkpoint_dir=d, **kw)
    p2 = priv()
    resumed = run_federated(NoisyMean(), _clients(), rounds=4, privacy=p2, checkpoint_dir=d, resume=True, **kw)
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
