"""Federated acoustic training (paper 002): client and server optimisers, count / uniform / softmax weighting
(streamed equals batch), server replay, what leaves a client, and whole runs on the federated loop."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from privasr.asr.models import AcousticConfig  # noqa: E402
from privasr.asr.train import Example  # noqa: E402
from privasr.asr.units import CharTokenizer  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.federated.algorithms.ftl import FtlAlgorithm, FtlClient, FtlConfig  # noqa: E402
from privasr.federated.core import Update  # noqa: E402
from privasr.federated.loop import run_federated  # noqa: E402
from privasr.federated.sampling import UniformWithReplacement  # noqa: E402
from privasr.federated.weighting import weights  # noqa: E402

WORDS = [("AB",), ("BA",), ("ABA",), ("B",), ("AAB",), ("BB",)]
TOK = CharTokenizer.train(WORDS)
MODEL = AcousticConfig.preset("tiny", arch="ctc", input_dim=4)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _examples(seed: int, n: int = 4) -> tuple[Example, ...]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        w = WORDS[(seed + i) % len(WORDS)]
        units = tuple(TOK.encode(w))
        # features that carry the label: one-hot-ish frames per unit, so that training can make progress
        frames = np.concatenate([np.eye(4, dtype=np.float32)[[u % 4] * 3] for u in units])
        out.append(Example(f"c{seed}-u{i}", f"s{seed}", w, frames + 0.1 * rng.normal(size=frames.shape)
                           .astype(np.float32), units))
    return tuple(out)


def _clients(k: int = 4) -> list[FtlClient]:
    return [FtlClient(f"c{i}", _examples(i)) for i in range(k)]


def _alg(**cfg) -> FtlAlgorithm:
    return FtlAlgorithm(FtlConfig(**cfg), MODEL, TOK)


def _fake(alg: FtlAlgorithm, state, value: float, loss: float, units: float) -> Update:
    return Update({k: np.full(v.shape, value, dtype=np.float32) for k, v in state["params"].items()},
                  weight=units, metrics={"loss": loss, "units": units})


@pytest.mark.parametrize("weighting", ["count", "uniform", "softmax"])
def test_streamed_weighting_equals_the_batch_weights(weighting: str) -> None:
    alg = _alg(weighting=weighting, temperature=0.5, server="fedavg")
    state = alg.init(np.random.default_rng(0))
    vals, losses, units = [1.0, -2.0, 4.0], [0.3, 2.0, 1.1], [10.0, 5.0, 1.0]
    acc = None
    for v, lo, u in zip(vals, losses, units, strict=True):
        acc = alg.accumulate(acc, _fake(alg, state, v, lo, u))
    new, m = alg.server_update(state, acc, 0, np.random.default_rng(1))
    w = weights(weighting, units, losses=losses, temperature=0.5)
    want = float(np.dot(w, vals))
    k = next(iter(state["params"]))
    assert np.allclose(new["params"][k] - state["params"][k], want, atol=1e-6)  # fedavg: x + d
    assert m["clients"] == 3 and m["loss"] == pytest.approx(np.mean(losses)) and m["units"] == 16


def test_softmax_weights_do_not_overflow_for_huge_losses() -> None:
    alg = _alg(weighting="softmax", temperature=0.01, server="fedavg")
    state = alg.init(np.random.default_rng(0))
    acc = alg.accumulate(None, _fake(alg, state, 1.0, 500.0, 1.0))
    acc = alg.accumulate(acc, _fake(alg, state, 3.0, 500.0, 1.0))
    new, _ = alg.server_update(state, acc, 0, np.random.default_rng(1))
    k = next(iter(state["params"]))
    assert np.allclose(new["params"][k] - state["params"][k], 2.0, atol=1e-5)


def test_client_update_trains_and_sends_only_float32_deltas() -> None:
    alg = _alg()
    state = alg.init(np.random.default_rng(0))
    client = _clients(1)[0]
    upd, cs = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
    assert cs is None
    assert set(upd.arrays) == set(state["params"])
    assert all(a.dtype == np.float32 and a.shape == state["params"][k].shape for k, a in upd.arrays.items())
    assert upd.weight == sum(len(e.units) for e in client.examples) == upd.metrics["units"]
    assert set(upd.metrics) == {"loss", "units"} and upd.metrics["loss"] > 0
    assert any(np.abs(a).max() > 0 for a in upd.arrays.values())
    # same rng, same update (deterministic clients)
    again, _ = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
    assert all(np.array_equal(upd.arrays[k], again.arrays[k]) for k in upd.arrays)


def test_fedavg_with_one_client_gives_the_client_model() -> None:
    alg = _alg(server="fedavg", client_optimizer={"name": "adam", "lr": 0.01})
    state = alg.init(np.random.default_rng(0))
    client = _clients(1)[0]
    upd, _ = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
    new, _ = alg.server_update(state, alg.accumulate(None, upd), 0, np.random.default_rng(2))
    for k, v in state["params"].items():
        assert np.allclose(new["params"][k], v + upd.arrays[k], atol=1e-6)


def test_server_replay_moves_the_model_and_reports_its_loss() -> None:
    replay = _examples(9, 6)
    alg = FtlAlgorithm(FtlConfig(server="fedavg", replay_steps=3, replay_lr=0.5), MODEL, TOK, replay=replay)
    plain = _alg(server="fedavg")
    state = alg.init(np.random.default_rng(0))
    upd, _ = alg.client_update(alg.broadcast(state, 0), _clients(1)[0], None, np.random.default_rng(1))
    with_replay, m = alg.server_update(state, alg.accumulate(None, upd), 0, np.random.default_rng(2))
    without, m0 = plain.server_update(state, plain.accumulate(None, upd), 0, np.random.default_rng(2))
    assert "replay_loss" in m and "replay_loss" not in m0 and math.isfinite(m["replay_loss"])
    assert any(not np.allclose(with_replay["params"][k], without["params"][k]) for k in without["params"])
    with pytest.raises(ConfigError, match="no replay data"):
        FtlAlgorithm(FtlConfig(replay_steps=2), MODEL, TOK)


def test_a_federated_run_lowers_the_loss_and_is_reproducible() -> None:
    clients = _clients(4)
    held = [e for c in clients for e in c.examples]

    def run():
        alg = _alg(client_optimizer={"name": "sgd", "lr": 0.5}, server={"name": "adam", "lr": 0.02},
                   weighting="softmax")
        res = run_federated(alg, clients, rounds=6, sampler=UniformWithReplacement(3), seed=3)
        return alg, res

    alg, res = run()
    start = alg.init(np.random.default_rng([3, 0, 3]))["params"]  # the loop's init draw for seed 3
    assert alg.loss(res.state["params"], held) < alg.loss(start, held)
    assert res.history[-1].metrics["loss"] < res.history[0].metrics["loss"]
    _, again = run()
    for k, v in res.state["params"].items():
        assert np.array_equal(v, again.state["params"][k])


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"weighting": "loss"}, "weighting"),
        ({"local_epochs": 0}, "local_epochs"),
        ({"client_optimizer": {"name": "rmsprop"}}, "client_optimizer name"),
        ({"client_optimizer": {"name": "sgd", "lr": -1}}, "lr"),
        ({"client_optimizer": {"name": "adam", "momentum": 0.9}}, "unknown setting"),
        ({"server": {"name": "sgdd"}}, "sgdd"),
        ({"replay_lr": 0}, "replay_lr"),
        ({"clip_norm": -1.0}, "clip_norm"),
        ({"delta_clip": 0.0, "weighting": "uniform"}, "delta_clip=0.0"),
        ({"delta_clip": 1.0, "weighting": "softmax"}, "weighting='uniform'"),
    ],
)
def test_bad_settings_are_config_errors(cfg, match) -> None:
    with pytest.raises(ConfigError, match=match):
        FtlConfig(**cfg)


def test_bad_clients_and_parameters_are_input_errors() -> None:
    with pytest.raises(InputError, match="no utterances"):
        FtlClient("empty", ())
    e = _examples(0, 1)[0]
    with pytest.raises(InputError, match="0 units"):
        FtlClient("c", (Example("u", "s", ("A",), e.features, ()),))
    alg = _alg()
    state = alg.init(np.random.default_rng(0))
    bad = dict(state["params"])
    bad.pop(next(iter(bad)))
    with pytest.raises(InputError, match="parameters"):
        alg.client_update(bad, _clients(1)[0], None, np.random.default_rng(0))
    with pytest.raises(InputError, match="FtlClient"):
        alg.client_update(state["params"], object(), None, np.random.default_rng(0))


def test_spec_augment_changes_the_client_update_and_stays_deterministic() -> None:
    client = FtlClient("c", tuple(Example(e.utt_id, e.speaker, e.words, np.repeat(e.features, 3, axis=1), e.units)
                                  for e in _examples(0)))  # features as 3 stacked frames of 4 dims
    model = AcousticConfig.preset("tiny", arch="ctc", input_dim=12)
    plain, aug = FtlAlgorithm(FtlConfig(), model, TOK), FtlAlgorithm(FtlConfig(spec_augment=True), model, TOK)
    state = plain.init(np.random.default_rng(0))
    u0, _ = plain.client_update(state["params"], client, None, np.random.default_rng(1))
    u1, _ = aug.client_update(state["params"], client, None, np.random.default_rng(1))
    u2, _ = aug.client_update(state["params"], client, None, np.random.default_rng(1))
    assert any(not np.allclose(u0.arrays[k], u1.arrays[k]) for k in u0.arrays)
    assert all(np.array_equal(u1.arrays[k], u2.arrays[k]) for k in u1.arrays)
    with pytest.raises(ConfigError, match="spec_augment"):
        FtlConfig(spec_augment="yes")


def test_dp_clips_the_delta_divides_by_the_fixed_denominator_and_publishes_only_the_release() -> None:
    pytest.importorskip("dp_accounting")
    from privasr.federated.loop import PrivacySettings
    from privasr.federated.sampling import Poisson
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.clip import global_norm
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    alg = _alg(server="fedavg", weighting="uniform", delta_clip=0.1)
    state = alg.init(np.random.default_rng(0))
    upd, _ = alg.client_update(alg.broadcast(state, 0), _clients(1)[0], None, np.random.default_rng(1))
    assert global_norm(upd.arrays) <= 0.1 and upd.metrics["clipped"] == 1.0
    seen = []
    update = alg.server_update

    def spy(state, acc, round, rng):
        seen.append((acc.weight, acc.count, dict(acc.metrics)))
        return update(state, acc, round, rng)

    alg.server_update = spy  # type: ignore[method-assign]
    sampler = Poisson(0.25)
    assert 0 in [sampler.sample(4, r, 1).size for r in range(3)]  # an empty round: noise alone is released
    priv = PrivacySettings(GaussianMechanism(clip_norm=0.1, noise_multiplier=1.0), PrivacyAccountant("rdp"))
    res = run_federated(alg, _clients(4), rounds=3, sampler=sampler, seed=1, privacy=priv)
    assert seen == [(1.0, 0, {})] * 3  # q x N = 0.25 x 4, whoever reported
    assert all(set(h.metrics) == {"update_norm", "epsilon", "delta"} and h.reported is None for h in res.history)
    with pytest.raises(ConfigError, match="FTL without delta_clip"):
        run_federated(_alg(weighting="uniform"), _clients(2), rounds=1, sampler=sampler, privacy=priv)
