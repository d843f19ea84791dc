"""The ``local`` backend and the loop's guarantees every backend relies on.

Other backends yield outcomes in arrival order; the loop must give the same clients, client states and (up to
summation order) server state whatever that order, keep the first slot's state for a client drawn twice, and
resume to the same end state.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from privasr.federated.backends import make_backend
from privasr.federated.backends.local import ClientVanished, LocalBackend, describe_failure
from privasr.federated.core import ClientTask, FederatedError, SumAccumulator, Update, client_seed
from privasr.federated.loop import run_federated
from privasr.federated.sampling import AllClients, UniformWithReplacement


class Walk:
    """Clients report their mean minus the server's point plus noise; their state counts and remembers."""

    name = "walk"

    def init(self, rng):
        return {"w": np.zeros(2)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        if client == "raise":
            raise RuntimeError("disk full\ntrace")
        if client == "vanish":
            raise ClientVanished()
        noise = rng.normal(size=2)
        seen = 0 if client_state is None else client_state["seen"]
        return (Update({"d": np.asarray(client, dtype=float) - payload["w"] + noise}, weight=1.0),
                {"seen": seen + 1, "noise": noise, "round": payload["round"]})

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update)

    def server_update(self, state, acc, round, rng):
        return {"w": state["w"] + 0.5 * acc.mean()["d"]}, {"count": acc.count}


class Reversed:
    """A backend whose clients 'arrive' in reverse sample order."""

    name = "reversed"

    def run(self, algorithm, payload, tasks, timeout=None):
        return reversed(list(LocalBackend().run(algorithm, payload, tasks, timeout)))

    def close(self):
        pass


CLIENTS = [[0.0, 1.0], [2.0, 3.0], [4.0, -1.0], [1.0, 1.0]]


def test_failures_and_timeouts():
    class Slow:
        def client_update(self, payload, client, state, rng):
            time.sleep(client)
            return Update({"x": np.zeros(1)}), None

    tasks = [ClientTask(0, 0, 0.0, None, (0,)), ClientTask(1, 1, 0.05, None, (1,))]
    outs = list(LocalBackend().run(Slow(), None, tasks, timeout=0.02))
    assert outs[0].ok and outs[1].error.startswith("timed out")
    outs = list(LocalBackend().run(Walk(), {"w": np.zeros(2), "round": 0},
                                   [ClientTask(0, 0, "raise", None, (0,)), ClientTask(1, 1, "vanish", None, (1,))]))
    assert [o.error for o in outs] == ["raised RuntimeError: disk full", "vanished"]
    assert describe_failure(ClientVanished("gone")) == "vanished: gone"
    assert describe_failure(KeyError()) == "raised KeyError"


def test_bad_client_update_is_reported():
    class Bad:
        def client_update(self, payload, client, state, rng):
            return {"x": 1}

    out = next(iter(LocalBackend().run(Bad(), None, [ClientTask(0, 0, None, None, (0,))])))
    assert out.error.startswith("raised FederatedError: Bad.client_update returned dict")


def test_arrival_order_does_not_change_the_run():
    kw = dict(rounds=3, sampler=UniformWithReplacement(n=6), seed=4)
    a = run_federated(Walk(), CLIENTS, **kw)
    b = run_federated(Walk(), CLIENTS, backend=Reversed(), **kw)
    np.testing.assert_allclose(b.state["w"], a.state["w"], rtol=1e-12)
    assert sorted(a.client_states) == sorted(b.client_states)
    for i, s in a.client_states.items():
        assert b.client_states[i]["seen"] == s["seen"] and np.array_equal(b.client_states[i]["noise"], s["noise"])


def test_a_client_drawn_twice_keeps_its_first_slot():
    sampler = UniformWithReplacement(n=8)
    picked = sampler.sample(len(CLIENTS), 0, 2).tolist()
    dup = next(i for i in picked if picked.count(i) > 1)
    first = picked.index(dup)
    res = run_federated(Walk(), CLIENTS, rounds=1, sampler=sampler, seed=2, backend=Reversed())
    expected = np.random.default_rng(list(client_seed(2, 0, dup, first))).normal(size=2)
    assert np.array_equal(res.client_states[dup]["noise"], expected)
    assert res.client_states[dup]["seen"] == 1  # both slots started from the same (empty) state


def test_failed_clients_are_dropped_and_min_clients_enforced(tmp_path):
    clients = CLIENTS + ["raise", "vanish"]
    res = run_federated(Walk(), clients, rounds=1, sampler=AllClients())
    assert res.history[0].dropped == {"4:4": "raised RuntimeError: disk full", "5:5": "vanished"}
    assert res.history[0].reported == 4 and 4 not in res.client_states
    with pytest.raises(FederatedError, match="only 4 of 6"):
        run_federated(Walk(), clients, rounds=2, sampler=AllClients(), min_clients=5, checkpoint_dir=tmp_path)
    assert not (tmp_path / "state.npz").exists()


def test_resume_matches_an_uninterrupted_run(tmp_path):
    kw = dict(sampler=UniformWithReplacement(n=3), seed=9)
    full = run_federated(Walk(), CLIENTS, rounds=4, **kw)
    run_federated(Walk(), CLIENTS, rounds=2, checkpoint_dir=tmp_path, **kw)
    resumed = run_federated(Walk(), CLIENTS, rounds=4, checkpoint_dir=tmp_path, resume=True, **kw)
    assert resumed.resumed_from == 2
    assert np.array_equal(resumed.state["w"], full.state["w"])
    seen = {i: s["seen"] for i, s in full.client_states.items()}
    assert {i: s["seen"] for i, s in resumed.client_states.items()} == seen


def test_make_backend():
    assert make_backend().name == "local" and make_backend("local").name == "local"
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend("spark")
    with pytest.raises(ValueError, match="takes no options"):
        make_backend("local", workers=2)
