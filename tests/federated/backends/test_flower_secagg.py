"""Secure aggregation on Flower: Flower's SecAgg+ (its workflow's stages and its client mod) sums the updates.

The in-process grid runs the real ``ClientApp`` with ``secaggplus_mod``; the server side is the real
``SecAggPlusWorkflow``. The tests check that the unmasked sum equals the plain sum within the quantisation error,
that the server never receives an update, that clients dropping mid-round are survived down to the threshold,
that the minimum cohort is enforced, and that distributed DP noise is added once, by the clients, and accounted.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.errors import ConfigError  # noqa: E402
from privasr.federated.backends.flower import _serve, _ServerSpec, check_secagg, make_client_app  # noqa: E402
from privasr.federated.backends.flower_deploy import _dump  # noqa: E402
from privasr.federated.backends.flower_inprocess import InProcessGrid as SecureGrid  # noqa: E402
from privasr.federated.backends.flower_inprocess import task_identity  # noqa: E402
from privasr.federated.core import FederatedError, SumAccumulator, Update  # noqa: E402
from privasr.federated.loop import PrivacySettings, run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, Poisson, UniformWithoutReplacement  # noqa: E402
from privasr.federated.secagg import SecAggSettings, summand_of  # noqa: E402
from privasr.privacy.dp.mechanisms import GaussianMechanism  # noqa: E402

from .toys import fmp_toy  # noqa: E402


class Mean:
    """A weighted mean of bounded client vectors; the client state counts its rounds. Clients may fail in a
    round: ``fail = {round: "raise" | "collect"}`` ("collect": the node crashes in the masked-vector stage)."""

    name = "mean"

    def init(self, rng):
        return {"w": np.zeros(4)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        if client.get("fail", {}).get(payload["round"]) == "raise":
            raise ValueError("client data in the message")
        delta = np.clip(np.asarray(client["x"]) - payload["w"] + 0.01 * rng.normal(size=4), -2.0, 2.0)
        seen = 0 if client_state is None else client_state["seen"]
        return Update({"delta": delta}, weight=1.0, metrics={"n": 1.0}), {"seen": seen + 1}

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update)

    def server_update(self, state, acc, round, rng):
        if acc is None:
            return dict(state), {"clients": 0.0}
        mean = acc.arrays["delta"] / acc.weight
        return {"w": state["w"] + mean}, {"clients": float(acc.count), "n": acc.metrics.get("n", 0.0)}

    # differential privacy: a delta in [-2, 2]^4 (the plumbing tests calibrate the noise to 2)
    dp_metrics = ()

    def dp_bound(self):
        return "l2", 2.0

    def zero_sum(self, state):
        return SumAccumulator({"delta": np.zeros(4)})

    def secure_bound(self, bound):
        return 2.0 if bound is None else float(bound)

    def secure_summand(self, update, bound):
        return summand_of(update.arrays, self.secure_bound(bound), weight=(update.weight, 1.0),
                          metrics={"n": (update.metrics["n"], 1024.0)})

    def from_secure_sum(self, arrays, scalars, count):
        return SumAccumulator(dict(arrays), scalars["weight"], count, {"n": scalars["n"]})


@pytest.fixture
def client_app(tmp_path):
    def make(algorithm, clients, state_dir=None):
        path = tmp_path / f"clients-{uuid.uuid4().hex}.pkl"
        _dump(path, (algorithm, clients))
        return make_client_app(path, state_dir, secure=True)

    with task_identity():
        yield make


def _clients(n, fail=None):
    rng = np.random.default_rng(3)
    return [{"x": rng.uniform(-1, 1, size=4), "fail": (fail or {}).get(i, {})} for i in range(n)]


def _spec(algorithm, n, secagg, **kw):
    base = dict(rounds=3, sampler=AllClients(), seed=0, min_clients=1, client_timeout=None, privacy=None,
                on_round=None, collect_client_states=True, node_wait=5.0, poll=0.01)
    base.update(kw)
    return _ServerSpec(algorithm, n, **base, secagg=secagg)


SECURE = SecAggSettings(enabled=True)
CONFIGS = "secaggplus_configs"  # Flower's record of the protocol's messages
STEP = 2 * 2.0 / 2 ** 22  # one quantisation step of a value bounded by 2


def test_secure_sum_equals_the_plain_sum_and_the_server_never_sees_an_update(client_app):
    from flwr.common import bytes_to_ndarray

    clients = _clients(5)
    local = run_federated(Mean(), clients, rounds=3, sampler=AllClients(), seed=0)
    grid = SecureGrid(client_app(Mean(), clients), 5)
    result = _serve(grid, _spec(Mean(), 5, SECURE))
    # each round's mean is within 5 clients' quantisation steps of the plain one
    assert np.allclose(result.state["w"], local.state["w"], rtol=0, atol=3 * 5 * STEP)
    assert not np.array_equal(result.state["w"], local.state["w"])  # it did go through the quantiser
    assert [h.reported for h in result.history] == [5, 5, 5]
    assert [h.metrics["n"] for h in result.history] == [5.0, 5.0, 5.0]  # summed scalars come back exactly
    assert result.client_states == local.client_states  # states stayed on the nodes, as without SecAgg
    stages = [m.content[CONFIGS]["stage"] for m, _ in grid.log if m.metadata.message_type == "train"]
    assert stages == ["setup"] * 5 + ["share_keys"] * 5 + ["collect_masked_vectors"] * 5 + ["unmask"] * 5 \
        or sorted(set(stages)) == ["collect_masked_vectors", "setup", "share_keys", "unmask"]
    for m, reply in grid.log:
        if m.metadata.message_type != "train":
            continue
        assert not any(k.startswith("privasr.update") or k.startswith("privasr.metrics") for k in reply.content)
        assert all(len(rec) == 0 for rec in reply.content.array_records.values())  # the mod clears the arrays
        if m.content[CONFIGS]["stage"] == "collect_masked_vectors":
            cfg = reply.content[CONFIGS]
            masked = np.concatenate([bytes_to_ndarray(b).ravel() for b in cfg["masked_params"]])
            # quantised values lie in [0, 2^22]; masked ones are uniform modulo 2^32
            assert masked.min() >= 0 and masked.max() < 2 ** 32 and (masked > 2 ** 23).mean() > 0.5
            assert dict(reply.content["fitres.metrics"]) == {}
            assert dict(reply.content["fitres.num_examples"]) == {"num_examples": 1}


def test_clients_that_drop_mid_round_are_survived_down_to_the_threshold(client_app):
    # client 1 crashes in round 1 after the key exchange; client 3 raises in round 2 (before masking)
    clients = _clients(5, fail={3: {2: "raise"}})
    grid = SecureGrid(client_app(Mean(), clients), 5, crash=[(1, 1)])
    result = _serve(grid, _spec(Mean(), 5, SECURE))
    assert [h.reported for h in result.history] == [5, 4, 4]
    assert result.history[1].dropped == {"1:1": "dropped out of secure aggregation in its collect masked vectors "
                                                "stage: ConnectionError: the device went offline"}
    assert result.history[2].dropped == {"3:3": "dropped out of secure aggregation in its collect masked vectors "
                                                "stage: FederatedError: no client of this node produced an update: "
                                                "slot 3: raised ValueError"}
    assert "client data" not in str(result.history[2].dropped)  # the exception's message stays on the device
    # the same rounds without SecAgg and with the same clients missing
    local_clients = _clients(5, fail={1: {1: "raise"}, 3: {2: "raise"}})
    local = run_federated(Mean(), local_clients, rounds=3, sampler=AllClients(), seed=0)
    assert np.allclose(result.state["w"], local.state["w"], rtol=0, atol=3 * 5 * STEP)
    assert result.client_states[1]["seen"] == 2  # the crashed round's state was never adopted


def test_too_many_dropouts_fail_the_round(client_app):
    clients = _clients(4)
    grid = SecureGrid(client_app(Mean(), clients), 4, crash=[(0, 0), (0, 1), (0, 2)])
    with pytest.raises(FederatedError, match="only 0 of 4"):
        _serve(grid, _spec(Mean(), 4, SECURE, rounds=1))


def test_minimum_cohort(client_app):
    clients = _clients(4)
    with pytest.raises(ConfigError, match="min_cohort=3"):
        check_secagg(SECURE, Mean(), UniformWithoutReplacement(n=2), 4, None)
    with pytest.raises(ConfigError, match="at most 1023"):
        check_secagg(SECURE, Mean(), AllClients(), 1024, None)
    # Poisson cohorts vary: a round whose cohort is too small is not aggregated at all
    grid = SecureGrid(client_app(Mean(), clients), 4)
    with pytest.raises(FederatedError, match="below min_cohort=4"):
        _serve(grid, _spec(Mean(), 4, SecAggSettings(enabled=True, min_cohort=4), sampler=Poisson(rate=0.3),
                           rounds=4))


def test_settings_are_checked_before_anything_runs():
    with pytest.raises(ConfigError, match="noise='distributed' without differential privacy"):
        check_secagg(SecAggSettings(enabled=True, noise="distributed"), Mean(), AllClients(), 4, None)
    with pytest.raises(ConfigError, match="cannot be aggregated securely"):
        check_secagg(SECURE, object(), AllClients(), 4, None)
    assert check_secagg(SecAggSettings(enabled=False), object(), AllClients(), 1, None) is None


class Accountant:
    target_delta = 1e-5
    neighboring = "replace_one"  # distributed noise: the cohort is fixed (one share per client)

    def __init__(self):
        self.events = []

    def step(self, event):
        self.events.append(event)

    def epsilon(self):
        return float(len(self.events))

    def state_dict(self):
        return {"events": list(self.events)}

    def load_state_dict(self, d):
        self.events = list(d["events"])


def test_distributed_noise_is_added_once_by_the_clients_and_accounted(client_app):
    clients = _clients(6)
    mech = GaussianMechanism(clip_norm=2.0, noise_multiplier=0.5)
    settings = SecAggSettings(enabled=True, noise="distributed")
    priv = PrivacySettings(mech, Accountant())
    grid = SecureGrid(client_app(Mean(), clients), 6)
    result = _serve(grid, _spec(Mean(), 6, settings, privacy=priv, min_clients=4, rounds=2))
    # 6 shares of a noise split 4 ways arrived (noise multiplier 0.5 * sqrt(6 / 4)); the accountant counts the
    # calibrated 4 (conservative): an epsilon that depended on how many reported would publish the cohort size
    assert [e.noise_multiplier for e in priv.accountant.events] == pytest.approx([0.5] * 2)
    assert all(set(h.metrics) == {"epsilon", "delta"} and h.reported is None for h in result.history)
    # the server added nothing: the plain run with server-side noise draws other noise, of the same size
    plain = run_federated(Mean(), clients, rounds=2, sampler=AllClients(), seed=0, min_clients=4)
    gap = np.abs(result.state["w"] - plain.state["w"])
    assert gap.max() > 10 * 6 * STEP  # noise is there ...
    assert gap.max() < 6 * mech.std * math.sqrt(1.5)  # ... of about the intended size (per-round std 0.61)
    # a round where fewer shares than the parts arrive is never released
    grid = SecureGrid(client_app(Mean(), clients), 6, crash=[(0, 0), (0, 1), (0, 2)])
    with pytest.raises(FederatedError, match="fewer than the 4 noise shares"):
        _serve(grid, _spec(Mean(), 6, settings, privacy=PrivacySettings(mech, Accountant()), min_clients=4,
                           rounds=1))


# -- the real algorithms -------------------------------------------------------------------------------------


def test_fmp_dense_counts_sum_to_the_plain_result_and_resume(client_app, tmp_path):
    alg, clients = fmp_toy(n_clients=4)
    local = run_federated(alg, clients, rounds=3, sampler=AllClients(), seed=4)
    grid = SecureGrid(client_app(alg, clients), 4)
    result = _serve(grid, _spec(alg, 4, SECURE, seed=4))
    step = 2 * 4096 / 2 ** 22  # counts are bounded by 4096
    assert np.allclose(result.state["sum"], local.state["sum"], rtol=0, atol=3 * 4 * step)
    assert np.allclose(result.state["qbar"], local.state["qbar"], rtol=1e-3, atol=1e-6)
    for i in range(4):  # the clients chose the same hypotheses: the caches stayed on the nodes
        assert result.client_states[i]["chosen"] == local.client_states[i]["chosen"]
    # the dense counts cost V values per client and round, where the sparse ids cost 2 per distinct word
    collect = [r for m, r in grid.log if m.metadata.message_type == "train"
               and m.content[CONFIGS]["stage"] == "collect_masked_vectors"]
    assert all(len(r.content[CONFIGS]["masked_params"]) == 3 for r in collect)  # factor, counts, scalars
    # kill after round 1, resume with new node processes: the nodes reload their caches from their folders
    ck = tmp_path.resolve() / "ck"
    spec = dict(seed=4, checkpoint_dir=str(ck), collect_client_states=False)
    grid = SecureGrid(client_app(alg, clients, ck / "nodes"), 4)
    assert len(_serve(grid, _spec(alg, 4, SECURE, rounds=1, **spec)).history) == 1
    grid = SecureGrid(client_app(alg, clients, ck / "nodes"), 4)
    resumed = _serve(grid, _spec(alg, 4, SECURE, rounds=3, resume=True, **{**spec, "collect_client_states": True}))
    assert resumed.resumed_from == 1
    assert np.allclose(resumed.state["sum"], local.state["sum"], rtol=0, atol=3 * 4 * step)
    assert all(resumed.client_states[i]["chosen"] == local.client_states[i]["chosen"] for i in range(4))
    with pytest.raises(FederatedError, match="belongs to another run"):  # SecAgg settings are part of the run
        _serve(SecureGrid(client_app(alg, clients, ck / "nodes"), 4),
               _spec(alg, 4, SecAggSettings(enabled=True, quantization_bits=20), rounds=3, resume=True, **spec))


def test_fedlm_deltas_need_a_bound_and_sum_within_the_quantisation_error(client_app):
    import torch

    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig
    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.vocab import Vocabulary

    torch.set_num_threads(1)
    vocab = Vocabulary(("<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"))
    clients = [FedLmClient("u1", ((3, 4, 5), (5, 4))), FedLmClient("u2", ((6, 7, 6, 7),)),
               FedLmClient("u3", ((3, 3), (4, 5, 6, 7, 3)))]
    mcfg = NeuralLMConfig.preset("tiny-transformer")
    with pytest.raises(ConfigError, match="without clip_norm"):
        check_secagg(SECURE, FedLmAlgorithm(FedLmConfig(), mcfg, vocab), AllClients(), 3, None)
    alg = FedLmAlgorithm(FedLmConfig(clip_norm=0.5, weighting="uniform", server="fedavg"), mcfg, vocab)
    step = 2 * 0.5 / 2 ** 22  # a coordinate's quantisation step (clip_norm bounds every coordinate)
    local = run_federated(alg, clients, rounds=1, sampler=AllClients(), seed=1)
    result = _serve(SecureGrid(client_app(alg, clients), 3), _spec(alg, 3, SECURE, rounds=1, seed=1))
    for k, v in local.state["params"].items():  # one FedAvg step: the mean of 3 errors below a step each
        assert np.allclose(result.state["params"][k], v, rtol=0, atol=step + 1e-7), k
    assert result.history[0].metrics["update_norm"] == pytest.approx(local.history[0].metrics["update_norm"], 1e-6)
    # later rounds train from a model that differs by that error, which local training amplifies a little
    local = run_federated(alg, clients, rounds=3, sampler=AllClients(), seed=1)
    result = _serve(SecureGrid(client_app(alg, clients), 3), _spec(alg, 3, SECURE, rounds=3, seed=1))
    gaps = [float(np.abs(result.state["params"][k] - v).max()) for k, v in local.state["params"].items()]
    assert 0 < max(gaps) < 1e-3


def test_fmp_distributed_laplace_noise_is_accounted_at_its_target(client_app):
    """FMP's Laplace noise in Gamma-difference shares: epsilon is the target (parallel composition, one event),
    the server adds nothing, and the noisy sum differs from the exact one by about the noise's scale."""
    from privasr.federated.algorithms import FmpAlgorithm, FmpConfig
    from privasr.privacy.dp.mechanisms import LaplaceMechanism

    toy, clients = fmp_toy(n_clients=4)
    alg = FmpAlgorithm(FmpConfig(dp_unit="utterance"), toy.background)  # utterance-level: capped counts
    mech = LaplaceMechanism(sensitivity=1.0, epsilon=0.5)
    priv = PrivacySettings(mech, Accountant(), composition="parallel")
    settings = SecAggSettings(enabled=True, noise="distributed")
    result = _serve(SecureGrid(client_app(alg, clients), 4),
                    _spec(alg, 4, settings, privacy=priv, min_clients=4, seed=4))
    assert [type(e).__name__ for e in priv.accountant.events] == ["LaplaceDpEvent"]
    assert priv.accountant.events[0].noise_multiplier == pytest.approx(2.0)  # 1 / epsilon: the target, once
    assert all(set(h.metrics) == {"qbar_mass", "qbar_support", "has_qbar", "epsilon", "delta"}
               for h in result.history)
    exact = run_federated(alg, clients, rounds=3, sampler=AllClients(), seed=4)
    gap = np.abs(result.state["sum"] - exact.state["sum"])  # three rounds of Laplace(2) per word
    assert 0.5 < gap.mean() < 8.0
    assert all("secagg_clipped" not in h.metrics for h in result.history)  # a count the noise does not cover
