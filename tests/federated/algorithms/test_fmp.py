"""Federated marginal personalisation (paper 000): eqs. 1-6, refresh and send modes, what crosses, DP caps, errors."""

from __future__ import annotations

import importlib.util
import math
import time
import tracemalloc

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms import (
    FmpAlgorithm,
    FmpClient,
    FmpConfig,
    FmpUtterance,
    adapted_scores,
    log_factor,
    personal_unigram,
    rank_kernel,
    utterance_counts,
)
from privasr.federated.core import SumAccumulator
from privasr.federated.loop import PrivacySettings, run_federated
from privasr.federated.sampling import AllClients, UniformWithoutReplacement

# --------------------------------------------------------------------------------------------------------------
# helpers

U4 = np.array([0.1, 0.3, 0.3, 0.3])


def _utt(uid: str, hyps, base, bw: float = 1.0) -> FmpUtterance:
    return FmpUtterance(uid, tuple(np.asarray(h, dtype=np.int64) for h in hyps), np.asarray(base, float), bw)


def _background(v: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).uniform(0.5, 2.0, size=v)
    return x / x.sum()


def _random_clients(n_clients: int = 3, n_groups: int = 3, per_group: int = 3, v: int = 40, n_hyps: int = 5,
                    seed: int = 1, min_len: int = 0) -> list[FmpClient]:
    rng = np.random.default_rng(seed)
    clients = []
    for c in range(n_clients):
        groups = []
        for g in range(n_groups):
            utts = []
            for k in range(per_group):
                hyps = [rng.integers(0, v, size=int(rng.integers(min_len, 7))) for _ in range(n_hyps)]
                utts.append(_utt(f"c{c}g{g}u{k}", hyps, np.sort(rng.normal(size=n_hyps))[::-1], 0.7))
            groups.append(tuple(utts))
        clients.append(FmpClient(f"client{c}", tuple(groups)))
    return clients


def _dense_counts(utt: FmpUtterance, sigma: float, v: int) -> np.ndarray:
    """Eq. 3 and the kernel-weighted counts, written independently of the module."""
    out = np.zeros(v)
    for k, hyp in enumerate(utt.word_ids):
        np.add.at(out, hyp, math.exp(-(k**2) / (2 * sigma**2)))
    return out


class Recording(FmpAlgorithm):
    """FMP that records every payload and every Update that crosses, and what server_update receives."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.updates, self.payloads, self.noised, self.qbars = [], [], [], []

    def broadcast(self, state, round):
        p = super().broadcast(state, round)
        self.payloads.append(p)
        return p

    def accumulate(self, acc, update):
        self.updates.append(update)
        return super().accumulate(acc, update)

    def server_update(self, state, acc, round, rng):
        self.noised.append(acc.noised)
        s, m = super().server_update(state, acc, round, rng)
        self.qbars.append(s["qbar"].copy())
        return s, m


def _run(alg, clients, rounds, sampler=None, **kw):
    return run_federated(alg, clients, rounds=rounds, sampler=sampler or AllClients(), **kw)


def _baseline_choice(utt: FmpUtterance) -> int:
    return int(np.argmax(utt.base))


# --------------------------------------------------------------------------------------------------------------
# eq. 3


def test_rank_kernel_values():
    k = rank_kernel(4, 2.0)
    assert np.allclose(k, [1.0, math.exp(-1 / 8), math.exp(-4 / 8), math.exp(-9 / 8)], rtol=0, atol=1e-15)
    assert rank_kernel(0, 1.0).size == 0


def test_rank_kernel_limits():
    assert rank_kernel(5, 1e-3).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert np.allclose(rank_kernel(20, 1e6), 1.0, atol=1e-9)
    for bad in (0.0, -1.0, float("nan"), True):
        with pytest.raises(ConfigError):
            rank_kernel(3, bad)


def test_utterance_counts_by_hand_and_limits():
    utt = _utt("u", [[1, 2, 2], [1, 3], [0, 0]], [0.0, -1.0, -2.0])
    ids, vals = utterance_counts(utt, 1.0)
    e1, e4 = math.exp(-0.5), math.exp(-2.0)
    assert ids.tolist() == [0, 1, 2, 3]  # <unk> (0) counts like any word
    assert np.allclose(vals, [2 * e4, 1 + e1, 2.0, e1], rtol=0, atol=1e-15)
    ids, vals = utterance_counts(utt, 1e-3)  # 1-best only; words of weight 0 are left out entirely
    assert ids.tolist() == [1, 2] and vals.tolist() == [1.0, 2.0]
    ids, vals = utterance_counts(utt, 1e6)  # ~ uniform: plain counts over the N-best list
    assert ids.tolist() == [0, 1, 2, 3] and np.allclose(vals, [2, 2, 2, 1], atol=1e-9)


# --------------------------------------------------------------------------------------------------------------
# eqs. 1-2, 4


@pytest.mark.parametrize("cfg", [dict(alpha=0.0, beta=0.0), dict(lam=0.0)])
def test_no_adaptation_is_the_baseline(cfg):
    clients = _random_clients(seed=3)
    alg = FmpAlgorithm(FmpConfig(**cfg), _background(40))
    res = _run(alg, clients, rounds=3)
    for i, c in enumerate(clients):
        chosen = res.client_states[i]["chosen"]
        assert len(chosen) == c.n_utterances
        assert all(chosen[u.utt_id] == _baseline_choice(u) for g in c.groups for u in g)


def test_round_zero_without_cache_is_the_baseline_and_later_rounds_change():
    clients = _random_clients(seed=4, per_group=6)
    alg = FmpAlgorithm(FmpConfig(refresh="round", alpha=0.5, beta=0.5, lam=3.0), _background(40))
    res = _run(alg, clients, rounds=3)
    changed = 0
    for i, c in enumerate(clients):
        chosen = res.client_states[i]["chosen"]
        assert all(chosen[u.utt_id] == _baseline_choice(u) for u in c.groups[0])
        changed += sum(chosen[u.utt_id] != _baseline_choice(u) for g in c.groups[1:] for u in g)
    assert changed > 0  # the test can tell adaptation from none


def test_personal_cache_switches_to_its_word_exactly():
    # group 0: the client said word 2 three times; group 1: "1" (baseline best) vs "2"
    said = _utt("a1", [[2, 2, 2]], [0.0])
    ask = _utt("a2", [[1], [2]], [0.0, -0.1], bw=0.5)
    client = FmpClient("m", ((said,), (ask,)))
    cfg = FmpConfig(alpha=0.0, beta=0.5, lam=1.0, smoothing=1.0)
    res = _run(FmpAlgorithm(cfg, U4), [client], rounds=2)
    assert res.client_states[0]["chosen"] == {"a1": 0, "a2": 1}
    # the exact adapted scores, by hand: q(1) = 0.3/4, q(2) = 3.3/4, g = 0.5 u + 0.5 q
    g1, g2 = 0.5 * 0.3 + 0.5 * 0.075, 0.5 * 0.3 + 0.5 * 0.825
    want = [0.0 + 0.5 * math.log(g1 / 0.3), -0.1 + 0.5 * math.log(g2 / 0.3)]
    ids = ask.vocab
    q = personal_unigram(ids, np.array([2]), np.array([3.0]), U4[ids], 1.0)
    assert np.allclose(q, [0.075, 0.825], rtol=0, atol=1e-15)
    got = adapted_scores(ask, log_factor(U4[ids], None, q, cfg))
    assert np.allclose(got, want, rtol=0, atol=1e-12)
    # without the personal weight, the baseline choice stays
    res0 = _run(FmpAlgorithm(FmpConfig(alpha=0.0, beta=0.0), U4), [client], rounds=2)
    assert res0.client_states[0]["chosen"]["a2"] == 0


def test_global_distribution_switches_other_clients_exactly():
    # client B talks about word 1; client A must choose between "2" (baseline best) and "1"
    b = FmpClient("B", ((_utt("b1", [[1, 1, 1]], [0.0]),), (_utt("b2", [[3]], [0.0]),)))
    a = FmpClient("A", ((_utt("a1", [[3]], [0.0]),), (_utt("a2", [[2], [1]], [0.0, -0.2]),)))
    cfg = FmpConfig(alpha=0.75, beta=0.0, lam=2.0, sigma=1.0)
    alg = Recording(cfg, U4)
    res = _run(alg, [a, b], rounds=2)
    qbar0 = np.array([0.0, 3.0, 0.0, 1.0]) / 4.0  # eq. 6 after round 0
    assert np.allclose(alg.qbars[0], qbar0, atol=1e-15)
    assert np.array_equal(alg.payloads[1]["qbar"], alg.qbars[0])
    g = 0.25 * U4 + 0.75 * qbar0
    scores = [0.0 + 2.0 * math.log(g[2] / U4[2]), -0.2 + 2.0 * math.log(g[1] / U4[1])]
    assert scores[1] > scores[0]
    assert res.client_states[0]["chosen"] == {"a1": 0, "a2": 1}
    ids = a.groups[1][0].vocab
    got = adapted_scores(a.groups[1][0], log_factor(U4[ids], qbar0[ids], U4[ids], cfg))
    assert np.allclose(got, scores, rtol=0, atol=1e-12)


def test_refresh_utterance_versus_round():
    said = _utt("a1", [[2, 2, 2]], [0.0])
    ask = _utt("a2", [[1], [2]], [0.0, -0.1], bw=0.5)
    client = FmpClient("m", ((said, ask),))  # both in the same round
    chosen = {}
    for refresh in ("utterance", "round"):
        alg = FmpAlgorithm(FmpConfig(alpha=0.0, beta=0.5, refresh=refresh), U4)
        chosen[refresh] = _run(alg, [client], rounds=1).client_states[0]["chosen"]["a2"]
    assert chosen == {"utterance": 1, "round": 0}


# --------------------------------------------------------------------------------------------------------------
# eq. 6


def test_eq6_cumulative_is_the_count_weighted_average_and_increment_agrees():
    v, sigma = 40, 2.0
    clients = _random_clients(n_clients=4, seed=5)
    qbars = {}
    for send in ("cumulative", "increment"):
        alg = Recording(FmpConfig(send=send, sigma=sigma), _background(v))
        _run(alg, clients, rounds=3)
        qbars[send] = alg.qbars
    for r in range(3):
        c_i, q_i = [], []
        for c in clients:
            cache = sum(_dense_counts(u, sigma, v) for g in c.groups[: r + 1] for u in g)
            c_i.append(cache.sum())
            q_i.append(cache / cache.sum())
        want = sum(ci * qi for ci, qi in zip(c_i, q_i, strict=True)) / sum(c_i)
        assert np.allclose(qbars["cumulative"][r], want, rtol=0, atol=1e-12)
        assert np.allclose(qbars["increment"][r], want, rtol=0, atol=1e-12)


def test_increment_sends_each_utterance_once_cumulative_resends():
    clients = _random_clients(n_clients=2, seed=6)
    sent = {}
    for send in ("increment", "cumulative"):
        alg = Recording(FmpConfig(send=send), _background(40))
        _run(alg, clients, rounds=4)  # round 3: no group left, clients still report
        sent[send] = [u.weight for u in alg.updates]
    mass = sum(utterance_counts(u, 5.0)[1].sum() for c in clients for g in c.groups for u in g)
    assert math.isclose(sum(sent["increment"]), mass, rel_tol=1e-12)
    assert sent["increment"][-2:] == [0.0, 0.0]  # nothing new after the last group
    assert sum(sent["cumulative"]) > 2 * mass


# --------------------------------------------------------------------------------------------------------------
# privacy: what crosses, caps, noise


def _contains_run(arr: np.ndarray, seq: np.ndarray) -> bool:
    a = np.asarray(arr).ravel()
    n = seq.size
    return any(np.array_equal(a[i : i + n], seq) for i in range(a.size - n + 1))


def test_only_sorted_ids_and_counts_cross_and_the_payload_holds_no_client_data():
    clients = _random_clients(n_clients=3, seed=7, min_len=3)
    alg = Recording(FmpConfig(), _background(40))
    _run(alg, clients, rounds=4)
    seqs = [h for c in clients for g in c.groups for u in g for h in u.word_ids
            if h.size >= 3 and not np.all(np.diff(h) > 0)]
    assert len(seqs) > 20
    assert len(alg.updates) == 12
    for up in alg.updates:
        assert set(up.arrays) == {"ids", "counts"} and set(up.metrics) == {"utterances", "changed"}
        ids, counts = up.arrays["ids"], up.arrays["counts"]
        assert ids.dtype == np.int64 and counts.dtype == np.float64
        assert np.all(np.diff(ids) > 0) and np.all(counts > 0)
        assert math.isclose(up.weight, counts.sum(), rel_tol=1e-12, abs_tol=1e-12)
        for a in up.arrays.values():
            assert a.dtype.kind in "if"
            assert not any(_contains_run(a, s) for s in seqs)
    for p in alg.payloads:
        assert set(p) == {"round", "qbar"} and isinstance(p["round"], int)
        assert p["qbar"].dtype == np.float64 and p["qbar"].size in (0, 40)
    assert alg.payloads[0]["qbar"].size == 0 and all(p["qbar"].size == 40 for p in alg.payloads[1:])


def test_dp_utterance_caps_every_utterance():
    cap = 0.5
    one_per_group = _random_clients(n_clients=2, per_group=1, seed=8, min_len=1)
    alg = Recording(FmpConfig(dp_unit="utterance", dp_cap=cap, sigma=1.0), _background(40))
    _run(alg, one_per_group, rounds=3)
    assert all(0 < u.weight <= cap for u in alg.updates)
    clients = _random_clients(n_clients=2, per_group=3, seed=9, min_len=1)
    alg = Recording(FmpConfig(dp_unit="utterance", dp_cap=cap, sigma=1.0), _background(40))
    res = _run(alg, clients, rounds=3)
    want = sum(min(utterance_counts(u, 1.0)[1].sum(), cap) for c in clients for g in c.groups for u in g)
    assert math.isclose(sum(u.weight for u in alg.updates), want, rel_tol=1e-9)
    # the cache itself holds the capped vectors
    cache_mass = sum(s["cache_counts"].sum() for s in res.client_states.values())
    assert math.isclose(cache_mass, want, rel_tol=1e-9)


def test_dp_user_caps_the_whole_run():
    cap = 2.0
    clients = _random_clients(n_clients=3, seed=10, min_len=1)
    alg = Recording(FmpConfig(dp_unit="user", dp_cap=cap), _background(40))
    res = _run(alg, clients, rounds=4)
    per_client = [alg.updates[i::3] for i in range(3)]  # AllClients: index order every round
    for c, ups in zip(clients, per_client, strict=True):
        total = sum(u.weight for u in ups)
        mass = sum(utterance_counts(u, 5.0)[1].sum() for g in c.groups for u in g)
        assert total <= cap + 1e-12 and math.isclose(total, min(mass, cap), rel_tol=1e-9)
        assert ups[-1].weight == 0 and ups[-1].arrays["ids"].size == 0
    # locally the cache keeps everything (only what is sent is capped)
    assert all(s["cache_counts"].sum() > cap for s in res.client_states.values())


def test_dp_user_cumulative_caps_each_release():
    alg = Recording(FmpConfig(dp_unit="user", dp_cap=1.5, send="cumulative"), _background(40))
    _run(alg, _random_clients(seed=11, min_len=1), rounds=3)
    assert all(0 < u.weight <= 1.5 for u in alg.updates)


def test_privacy_composition_and_sensitivity():
    assert FmpConfig().privacy_composition() == "parallel"
    assert FmpConfig(send="cumulative", dp_unit="user").privacy_composition() == "sequential"
    assert FmpConfig(dp_unit="user", dp_cap=3.0).sensitivity() == 3.0
    with pytest.raises(ConfigError, match="unbounded"):
        FmpConfig().sensitivity()


class _Laplace:
    """Stand-in Laplace mechanism (used when privasr.privacy.dp is not there yet)."""

    def __init__(self, sensitivity: float, epsilon: float) -> None:
        self.sensitivity, self.epsilon, self.calls = sensitivity, epsilon, 0

    def add_noise(self, arrays, rng):
        self.calls += 1
        return {k: v + rng.laplace(0.0, self.sensitivity / self.epsilon, size=v.shape) for k, v in arrays.items()}

    def dp_event(self):
        return ("laplace", self.sensitivity / self.epsilon)


class _Accountant:
    """Stand-in pure-DP accountant: epsilon adds up over the events."""

    target_delta = 0.0

    def __init__(self) -> None:
        self.events = []

    def step(self, event) -> None:
        self.events.append(event)

    def epsilon(self) -> float:
        return sum(1.0 / b for _, b in self.events)

    def state_dict(self):
        return {"n": len(self.events)}


def _dp_tools(sensitivity: float, epsilon: float):
    """The project's Laplace mechanism and PLD accountant when they (and dp_accounting) are there, else stand-ins."""
    if importlib.util.find_spec("dp_accounting") is None:
        return _Laplace(sensitivity, epsilon), _Accountant()
    try:
        from privasr.privacy.dp import LaplaceMechanism
        try:
            from privasr.privacy.dp import PrivacyAccountant
        except ImportError:
            from privasr.privacy.dp.accounting import PrivacyAccountant
        return LaplaceMechanism(sensitivity=sensitivity, epsilon=epsilon), \
            PrivacyAccountant(accountant="pld", target_delta=1e-6)
    except ImportError:
        return _Laplace(sensitivity, epsilon), _Accountant()


def test_laplace_noise_added_once_per_round_and_qbar_stays_a_distribution():
    cfg = FmpConfig(dp_unit="utterance", dp_cap=1.0, sigma=0.1)
    mech, accountant = _dp_tools(cfg.sensitivity(), 1.0)
    alg = Recording(cfg, _background(40))
    priv = PrivacySettings(mech, accountant, composition=cfg.privacy_composition())
    res = _run(alg, _random_clients(seed=12), rounds=3, privacy=priv)
    assert alg.noised == [1, 1, 1]
    for q in alg.qbars:
        assert q.size == 40 and np.all(q >= 0) and math.isclose(q.sum(), 1.0, rel_tol=1e-12)
    assert np.any(res.state["sum"] < 0)  # the running noisy sum is kept unclamped
    eps = [h.metrics["epsilon"] for h in res.history]
    assert eps[0] == eps[1] == eps[2] and 0 < eps[0] <= 1.0 + 1e-6  # parallel: one release's epsilon


def test_server_keeps_previous_qbar_when_the_noisy_mass_is_not_positive():
    alg = FmpAlgorithm(FmpConfig(send="cumulative"), U4)
    state = {"sum": np.zeros(4), "qbar": np.array([0.25, 0.25, 0.25, 0.25])}
    acc = SumAccumulator.empty().add_sparse("counts", 4, np.array([1]), np.array([-3.0]))
    new, m = alg.server_update(state, acc, 1, np.random.default_rng(0))
    assert new["qbar"].tolist() == [0.25] * 4 and m["qbar_mass"] == 0.0
    new, _ = alg.server_update(alg.init(np.random.default_rng(0)), acc, 0, np.random.default_rng(0))
    assert new["qbar"].size == 0  # still no global distribution


# --------------------------------------------------------------------------------------------------------------
# sampling, state, resume


class _Scripted:
    """A sampler that picks the given clients in each round."""

    kind = "scripted"

    def __init__(self, schedule):
        self.schedule = schedule

    def sample(self, population, round, seed):
        return np.array(self.schedule[round], dtype=np.int64)

    def sampling_probability(self, population):
        return 1.0

    def to_dict(self):
        return {"kind": "scripted", "schedule": self.schedule}


def _held_scenario(schedule):
    b = FmpClient("B", tuple((_utt(f"b{t}", [[1, 1, 1]], [0.0]),) for t in range(4)))
    a = FmpClient("A", ((_utt("a0", [[3]], [0.0]),),
                        *((_utt(f"a{t}", [[2], [1]], [0.0, -0.2]),) for t in (1, 2, 3))))
    alg = FmpAlgorithm(FmpConfig(alpha=0.75, beta=0.0, lam=2.0), U4)
    res = run_federated(alg, [a, b], rounds=len(schedule), sampler=_Scripted(schedule))
    return alg.finish(a, res.client_states[0])["chosen"]


def test_missed_groups_use_the_last_global_distribution_received():
    # A takes part in rounds 0 and 2: group 1 arrived when A held no qbar (background) -> baseline choice
    assert _held_scenario([[0, 1], [1], [0, 1]]) == {"a0": 0, "a1": 0, "a2": 1, "a3": 1}
    # A takes part in rounds 0, 1 and 3: group 2 is rescored with the qbar received in round 1
    assert _held_scenario([[0, 1], [0, 1], [1], [0, 1]]) == {"a0": 0, "a1": 1, "a2": 1, "a3": 1}


def test_finish_covers_every_utterance_under_sampling():
    clients = _random_clients(n_clients=5, seed=13)
    alg = FmpAlgorithm(FmpConfig(), _background(40))
    res = _run(alg, clients, rounds=2, sampler=UniformWithoutReplacement(2))
    for i, c in enumerate(clients):
        st = alg.finish(c, res.client_states.get(i))
        assert set(st["chosen"]) == {u.utt_id for g in c.groups for u in g}


def test_client_state_is_not_modified_and_updates_are_deterministic():
    clients = _random_clients(n_clients=1, seed=14)
    alg = FmpAlgorithm(FmpConfig(), _background(40))
    payload = alg.broadcast(alg.init(np.random.default_rng(0)), 0)
    up, st = alg.client_update(payload, clients[0], None, np.random.default_rng(0))
    payload1 = {"round": 1, "qbar": _background(40, seed=2)}
    before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in st.items()}
    before["chosen"] = dict(st["chosen"])
    a = alg.client_update(payload1, clients[0], st, np.random.default_rng(1))
    b = alg.client_update(payload1, clients[0], st, np.random.default_rng(2))
    assert np.array_equal(a[0].arrays["counts"], b[0].arrays["counts"]) and a[1]["chosen"] == b[1]["chosen"]
    for k, v in before.items():
        assert np.array_equal(st[k], v) if isinstance(v, np.ndarray) else st[k] == v


def test_resume_from_checkpoint_gives_the_same_run(tmp_path):
    clients = _random_clients(seed=15)
    cfg = FmpConfig(dp_unit="user", dp_cap=5.0)
    full = _run(FmpAlgorithm(cfg, _background(40)), clients, rounds=3)
    _run(FmpAlgorithm(cfg, _background(40)), clients, rounds=2, checkpoint_dir=tmp_path)
    resumed = _run(FmpAlgorithm(cfg, _background(40)), clients, rounds=3, checkpoint_dir=tmp_path, resume=True)
    assert resumed.resumed_from == 2
    assert np.array_equal(full.state["qbar"], resumed.state["qbar"])
    for i in range(3):
        assert full.client_states[i]["chosen"] == resumed.client_states[i]["chosen"]
        assert full.client_states[i]["sent"] == resumed.client_states[i]["sent"]


# --------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_utterances():
    with pytest.raises(InputError, match="'u1'.*2 base scores"):
        _utt("u1", [[1], [2], [3]], [0.0, 1.0])
    with pytest.raises(InputError, match="'u2', hypothesis 1: negative word id -4"):
        _utt("u2", [[1], [2, -4]], [0.0, 1.0])
    with pytest.raises(InputError, match="'u3' has no hypotheses"):
        FmpUtterance("u3", (), np.zeros(0))
    with pytest.raises(InputError, match="'u4', hypothesis 0.*1-d integer"):
        FmpUtterance("u4", (np.array([1.5]),), np.zeros(1))
    with pytest.raises(InputError, match="'u5'.*NaN or infinite"):
        _utt("u5", [[1]], [float("inf")])
    with pytest.raises(InputError, match="'u6'.*bias_weight"):
        _utt("u6", [[1]], [0.0], bw=-1.0)
    with pytest.raises(InputError, match="utterance id"):
        _utt("", [[1]], [0.0])
    assert _utt("u7", [[]], [0.0]).vocab.size == 0  # an empty hypothesis is fine


def test_bad_clients_and_ids_outside_the_vocabulary():
    u = _utt("x", [[1]], [0.0])
    with pytest.raises(InputError, match="'x' occurs twice"):
        FmpClient("c", ((u,), (u,)))
    with pytest.raises(InputError, match="holds a str"):
        FmpClient("c", (("x",),))
    alg = FmpAlgorithm(FmpConfig(), U4)
    far = FmpClient("c", ((_utt("far", [[1], [9]], [0.0, 0.0]),),))
    with pytest.raises(InputError, match="client 'c', utterance 'far': word id 9 is outside"):
        alg.client_update({"round": 0, "qbar": np.zeros(0)}, far, None, np.random.default_rng(0))
    with pytest.raises(InputError, match="qbar of shape"):
        alg.client_update({"round": 1, "qbar": np.ones(3) / 3}, FmpClient("c", ((u,),)), None,
                          np.random.default_rng(0))
    with pytest.raises(InputError, match="FmpClient"):
        alg.client_update({"round": 0, "qbar": np.zeros(0)}, {"id": "c"}, None, np.random.default_rng(0))


@pytest.mark.parametrize("bg, msg", [
    (np.array([0.5, 0.4]), "sums to"),
    (np.array([0.5, 0.5, 0.0]), "at word id 2"),
    (np.array([1.5, -0.5]), "at word id 1"),
    (np.array([[0.5, 0.5]]), "shape"),
    (np.array([0.5, float("nan"), 0.5]), "nan"),
])
def test_bad_background(bg, msg):
    with pytest.raises(InputError, match=msg):
        FmpAlgorithm(FmpConfig(), bg)


@pytest.mark.parametrize("kw, msg", [
    (dict(alpha=-0.1), "alpha"), (dict(alpha=0.8, beta=0.3), "alpha \\+ beta"), (dict(sigma=0.0), "sigma"),
    (dict(lam=-1.0), "lam"), (dict(smoothing=-1.0), "smoothing"), (dict(refresh="always"), "refresh"),
    (dict(send="all"), "send"), (dict(order=3), "order"), (dict(beta2=1.5), "beta2"), (dict(lam2=-1.0), "lam2"), (dict(dp_unit="speaker"), "dp_unit"),
    (dict(dp_cap=0.0), "dp_cap"), (dict(alpha=True), "alpha"), (dict(sigma=float("inf")), "sigma"),
])
def test_bad_config(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        FmpConfig(**kw)


def test_config_round_trip_and_unknown_keys():
    cfg = FmpConfig(alpha=0, beta=1, sigma=1, refresh="round", send="cumulative", dp_unit="user", dp_cap=2)
    d = cfg.to_dict()
    assert d["alpha"] == 0.0 and isinstance(d["alpha"], float)
    assert FmpConfig.from_dict(d) == cfg
    assert FmpAlgorithm(cfg, U4).config_dict() == {**d, "normalized": False}
    with pytest.raises(ConfigError, match="unknown FMP setting 'lambda'"):
        FmpConfig.from_dict({"lambda": 1.0})
    with pytest.raises(ConfigError):
        FmpAlgorithm({"alpha": 0.5}, U4)


# --------------------------------------------------------------------------------------------------------------
# cost: nothing vocabulary-sized per utterance


def test_client_update_never_builds_vocabulary_sized_arrays():
    v = 5_000_000
    u = np.full(v, 1.0 / v)
    rng = np.random.default_rng(16)
    utts = tuple(_utt(f"u{k}", [rng.integers(0, v, size=12) for _ in range(10)], np.sort(rng.normal(size=10))[::-1])
                 for k in range(200))
    client = FmpClient("big", (utts[:100], utts[100:]))
    alg = FmpAlgorithm(FmpConfig(), u)
    qbar = u.copy()
    qbar[:1000] *= 2.0
    qbar /= qbar.sum()
    _, st = alg.client_update({"round": 0, "qbar": np.zeros(0)}, client, None, np.random.default_rng(0))
    payload = {"round": 1, "qbar": qbar}
    t0 = time.perf_counter()
    alg.client_update(payload, client, st, np.random.default_rng(0))
    assert time.perf_counter() - t0 < 2.0
    tracemalloc.start()
    try:
        up, _ = alg.client_update(payload, client, st, np.random.default_rng(0))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak  # one float64 vector over the vocabulary would be 40 MB
    assert up.arrays["ids"].size <= 100 * 10 * 12


def test_qbar_threshold_zeroes_the_noise_floor():
    from privasr.federated.core import SumAccumulator

    u = np.full(5, 0.2)
    alg = FmpAlgorithm(FmpConfig(qbar_threshold=1.5), u)
    acc = SumAccumulator.empty().add_sparse("counts", 5, np.array([0, 1, 2, 3]), np.array([5.0, 1.0, 3.0, 0.4]))
    state, _ = alg.server_update(alg.init(np.random.default_rng(0)), acc, 0, np.random.default_rng(0))
    assert state["qbar"].tolist() == [5 / 8, 0.0, 3 / 8, 0.0, 0.0]
    assert state["sum"].tolist() == [5.0, 1.0, 3.0, 0.4, 0.0]  # the running sum itself is kept as released
    with pytest.raises(ConfigError):
        FmpConfig(qbar_threshold=-1.0)


def test_dp_runs_do_not_publish_exact_sums():
    from privasr.federated.core import SumAccumulator

    u = np.full(4, 0.25)
    acc = SumAccumulator.empty().add_sparse("counts", 4, np.array([1]), np.array([2.0]), 2.0, {"utterances": 3})
    for unit, hidden in ((None, False), ("utterance", True), ("user", True)):
        alg = FmpAlgorithm(FmpConfig(dp_unit=unit), u)
        _, m = alg.server_update(alg.init(np.random.default_rng(0)), acc, 0, np.random.default_rng(0))
        assert ("sent_mass" not in m and "utterances" not in m) == hidden


def _bigram_setup(**kw):
    from privasr.federated.algorithms.fmp import BackgroundBigram

    u = np.full(6, 1 / 6)
    bg = BackgroundBigram.from_sentences([[1, 2, 3], [2, 3, 4], [1, 5]], vocab_size=6, prior=1.0)
    return FmpAlgorithm(FmpConfig(order=2, alpha=0.0, beta=0.0, **kw), u, bg), u, bg


def test_personal_bigrams_switch_to_the_pair_the_client_said():
    # unigram factors are neutral (alpha = beta = 0); the client said "4 5" in round 0, so in round 1 "4 5"
    # beats "5 4", which the baseline prefers slightly
    alg, u, bg = _bigram_setup(beta2=0.5, lam2=1.0, sigma=0.1, smoothing2=1.0)
    said = FmpUtterance("a", (np.array([4, 5]),), np.array([0.0]))
    ask = FmpUtterance("b", (np.array([5, 4]), np.array([4, 5])), np.array([0.0, -0.01]))
    client = FmpClient("c", ((said,), (ask,)))
    state = alg.init(np.random.default_rng(0))
    up0, st = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(0))
    # exact factors with only "4 5" in the cache: u2(5|4) = (0 + 1/6) / (0 + 1) (4 starts no background pair),
    # q2 = (1 + 1 * u2) / (1 + 1), factor = ln((0.5 u2 + 0.5 q2) / u2); "5 4" is unseen: q2 = u2, factor 0
    u2 = 1 / 6
    q2 = (1 + u2) / 2
    f = alg._bigram_factors(ask, st)
    assert f[0] == pytest.approx(0.0, abs=1e-12)
    assert f[1] == pytest.approx(math.log((0.5 * u2 + 0.5 * q2) / u2), rel=1e-12)
    _, st1 = alg.client_update(alg.broadcast(state, 1), client, st, np.random.default_rng(0))
    assert st1["chosen"] == {"a": 0, "b": 1}
    # with lam2 = 0 the baseline's choice stays
    alg0, _, _ = _bigram_setup(beta2=0.5, lam2=0.0, sigma=0.1)
    _, s0 = alg0.client_update(alg0.broadcast(state, 0), client, None, np.random.default_rng(0))
    _, s1 = alg0.client_update(alg0.broadcast(state, 1), client, s0, np.random.default_rng(0))
    assert s1["chosen"] == {"a": 0, "b": 0}
    # the bigram cache stays on the device: the update carries unigram ids and counts only
    assert set(up0.arrays) == {"ids", "counts"} and up0.arrays["ids"].tolist() == [4, 5]


def test_order_two_with_lam2_zero_equals_order_one():
    u = np.full(6, 1 / 6)
    alg2, _, _ = _bigram_setup(lam2=0.0)
    alg1 = FmpAlgorithm(FmpConfig(order=1, alpha=0.0, beta=0.0), u)
    c = FmpClient("c", ((FmpUtterance("a", (np.array([1, 2]), np.array([2, 1])), np.array([0.0, 0.1])),),))
    p = {"round": 0, "qbar": np.zeros(0)}
    a = alg1.client_update(p, c, None, np.random.default_rng(0))[1]["chosen"]
    b = alg2.client_update(p, c, None, np.random.default_rng(0))[1]["chosen"]
    assert a == b == {"a": 1}


def test_order_two_needs_the_background_bigram():
    with pytest.raises(ConfigError, match="background bigram"):
        FmpAlgorithm(FmpConfig(order=2), np.full(3, 1 / 3))


def test_exactly_normalised_variant_matches_brute_force():
    # a toy "NNLM" with the same next-word distribution P after every history: Z = sum_v P(v) exp(f(v)), the same
    # at every position; the normaliser returns (words + </s>) * ln Z per hypothesis
    u = np.array([0.1, 0.2, 0.3, 0.4])
    P = np.array([0.25, 0.25, 0.25, 0.25])
    seen = []

    def normalizer(utt, f):
        seen.append(f.copy())
        lnz = math.log(float(np.sum(P * np.exp(f))))
        return np.array([(len(h) + 1) * lnz for h in utt.word_ids])

    cfg = FmpConfig(alpha=0.0, beta=0.5, lam=1.0, sigma=0.1, smoothing=1.0)
    alg = FmpAlgorithm(cfg, u, normalizer=normalizer)
    said = FmpUtterance("a", (np.array([3, 3]),), np.array([0.0]))
    ask = FmpUtterance("b", (np.array([3]), np.array([1, 2])), np.array([0.0, 2.3]), bias_weight=2.0)
    client = FmpClient("c", ((said, ask),))
    _, st = alg.client_update({"round": 0, "qbar": np.zeros(0)}, client, None, np.random.default_rng(0))
    # brute force for "b" after the cache took "a" (word 3 twice): q = (cache + u) / (2 + 1)
    q = (np.array([0, 0, 0, 2.0]) + u) / 3
    f = np.log((0.5 * u + 0.5 * q) / u)
    assert np.allclose(seen[-1], f) and len(seen[-1]) == 4
    lnz = math.log(float(np.sum(P * np.exp(f))))
    want = np.array([0.0, 2.3]) + 2.0 * np.array([f[3] - 2 * lnz, f[1] + f[2] - 3 * lnz])
    unnormalised = np.array([0.0, 2.3]) + 2.0 * np.array([f[3], f[1] + f[2]])
    assert int(np.argmax(want)) == 1 and int(np.argmax(unnormalised)) == 0  # the example separates the two
    assert st["chosen"]["b"] == 1
    _, st_u = FmpAlgorithm(cfg, u).client_update({"round": 0, "qbar": np.zeros(0)}, client, None,
                                                  np.random.default_rng(0))
    assert st_u["chosen"]["b"] == 0
    # with lam = 0 nothing is normalised (f = 0, Z = 1): the baseline choice
    alg0 = FmpAlgorithm(FmpConfig(alpha=0.0, beta=0.5, lam=0.0), u, normalizer=normalizer)
    _, st0 = alg0.client_update({"round": 0, "qbar": np.zeros(0)}, client, None, np.random.default_rng(0))
    assert st0["chosen"] == {"a": 0, "b": 1}  # the baseline (base scores only)
    with pytest.raises(ConfigError):
        FmpAlgorithm(cfg, u, normalizer="yes")  # type: ignore[arg-type]
    bad = FmpAlgorithm(cfg, u, normalizer=lambda utt, f: np.zeros(7))
    with pytest.raises(InputError, match="normalizer"):
        bad.client_update({"round": 0, "qbar": np.zeros(0)}, client, None, np.random.default_rng(0))


def test_accumulate_many_folds_blocks_to_the_same_sum_as_one_at_a_time():
    from privasr.errors import InputError
    from privasr.federated.core import Update

    rng = np.random.default_rng(0)
    alg = FmpAlgorithm(FmpConfig(), np.full(50, 0.02))
    ups = []
    for _ in range(37):
        ids = np.unique(rng.integers(0, 50, size=8))
        ups.append(Update({"ids": ids, "counts": rng.gamma(1.0, size=ids.size)}, 1.5, {"utterances": 2.0}))
    one = None
    for u in ups:
        one = alg.accumulate(one, u)
    for block in (1, 5, 37, 100):
        many = alg.accumulate_many(None, iter(ups), block=block)
        np.testing.assert_allclose(many.arrays["counts"], one.arrays["counts"], rtol=0, atol=1e-12)
        assert (many.count, many.weight, many.metrics) == (one.count, one.weight, one.metrics)
    bad = Update({"ids": np.array([1, 60]), "counts": np.array([1.0, 1.0])}, 1.0)
    with pytest.raises(InputError, match=r"ids outside \[0, 50\)"):
        alg.accumulate_many(None, [ups[0], bad])
    with pytest.raises(InputError, match="expected 1-d integer ids"):
        alg.accumulate_many(None, [ups[0], Update({"ids": np.array([1, 2]), "counts": np.array([1.0])}, 1.0)])
    with pytest.raises(InputError, match="FMP update with arrays"):
        alg.accumulate_many(None, [Update({"x": np.array([1.0])}, 1.0)])
