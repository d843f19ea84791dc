"""The ``ray`` backend: same results as ``local`` (up to summation order), failures, timeouts, dead workers.

One Ray session serves the whole module (``ray.init`` costs seconds); the module is skipped without Ray.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest

pytest.importorskip("ray")

from privasr.federated.backends import make_backend  # noqa: E402
from privasr.federated.backends.ray import RayBackend, ship_by_value  # noqa: E402
from privasr.federated.core import ClientTask, FederatedError, SumAccumulator, Update, client_seed  # noqa: E402
from privasr.federated.loop import run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, UniformWithReplacement  # noqa: E402


class Drift:
    """A small weighted-mean algorithm with a client state and random client noise."""

    name = "drift"

    def init(self, rng):
        return {"w": rng.normal(size=3)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        x = np.asarray(client["x"], dtype=np.float64)
        noise = rng.normal(size=3)
        delta = x.mean(axis=0) - payload["w"] + 0.1 * noise
        seen = 0 if client_state is None else client_state["seen"]
        return (Update({"delta": delta}, weight=float(len(x)), metrics={"n": len(x)}),
                {"seen": seen + 1, "last_round": payload["round"], "noise": noise, "last": delta})

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update, scale=update.weight)

    def server_update(self, state, acc, round, rng):
        mean = acc.mean()["delta"]
        return {"w": state["w"] + 0.5 * mean}, {"step": float(np.linalg.norm(mean))}


class Moody:
    """A client does what its data says: report, raise, vanish, hang or kill its worker."""

    name = "moody"

    def init(self, rng):
        return {}

    def broadcast(self, state, round):
        return None

    def client_update(self, payload, client, client_state, rng):
        from privasr.federated.backends.local import ClientVanished

        if client == "raise":
            raise ValueError("bad data\nsecond line")
        if client == "vanish":
            raise ClientVanished("phone went offline")
        if client == "hang":
            time.sleep(30)
        if client == "die":
            os._exit(3)
        return Update({"one": np.ones(1)}), None

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update)

    def server_update(self, state, acc, round, rng):
        return state, {"count": acc.count}


def _clients(k=6, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(loc=i, size=(i + 2, 3))} for i in range(k)]


def _tasks(clients, r=0):
    return [ClientTask(s, s, c, None, client_seed(0, r, s, s)) for s, c in enumerate(clients)]


@pytest.fixture(scope="module")
def backend():
    b = RayBackend(num_workers=2)
    yield b
    b.close()


def test_same_result_as_local(backend):
    clients = _clients()
    kw = dict(rounds=3, sampler=UniformWithReplacement(n=5), seed=11)
    local = run_federated(Drift(), clients, **kw)
    remote = run_federated(Drift(), clients, backend=backend, **kw)
    np.testing.assert_allclose(remote.state["w"], local.state["w"], rtol=1e-12, atol=0)
    assert sorted(remote.client_states) == sorted(local.client_states)
    for i, s in local.client_states.items():
        r = remote.client_states[i]
        assert (r["seen"], r["last_round"]) == (s["seen"], s["last_round"])
        assert np.array_equal(r["noise"], s["noise"])  # a client's own random draws are exact
        np.testing.assert_allclose(r["last"], s["last"], rtol=1e-12)  # it saw a payload summed in another order
    assert [(h.sampled, h.reported) for h in remote.history] == [(h.sampled, h.reported) for h in local.history]
    for a, b in zip(remote.history, local.history, strict=True):
        assert math.isclose(a.metrics["step"], b.metrics["step"], rel_tol=1e-12)


def test_algorithm_and_clients_are_shipped_once(backend):
    clients = _clients(4)
    algo = Drift()
    puts = backend.algorithm_puts
    run_federated(algo, clients, rounds=2, sampler=AllClients(), backend=backend)
    assert backend.algorithm_puts == puts + 1  # one algorithm object: put once for both rounds
    assert all(id(c) in backend._client_refs for c in clients)
    n_refs = len(backend._client_refs)
    run_federated(algo, clients, rounds=1, sampler=AllClients(), backend=backend)
    assert len(backend._client_refs) == n_refs and backend.algorithm_puts == puts + 1
    run_federated(Drift(), clients, rounds=1, sampler=AllClients(), backend=backend)
    assert backend.algorithm_puts == puts + 2  # another algorithm object is shipped again


def test_failures_are_reported_like_local(backend):
    tasks = _tasks(["ok", "raise", "vanish", "ok"])
    remote = {o.slot: o for o in backend.run(Moody(), None, tasks)}
    local = {o.slot: o for o in make_backend("local").run(Moody(), None, tasks)}
    assert [remote[s].error for s in range(4)] == [local[s].error for s in range(4)]
    assert remote[1].error == "raised ValueError: bad data"
    assert remote[2].error == "vanished: phone went offline"
    assert remote[0].ok and remote[3].ok


def test_timeout_kills_and_replaces_the_worker(backend):
    replaced = backend.replaced_workers
    t0 = time.perf_counter()
    outs = list(backend.run(Moody(), None, _tasks(["hang", "ok", "ok"]), timeout=1.0))
    assert time.perf_counter() - t0 < 10
    by_slot = {o.slot: o for o in outs}
    assert by_slot[0].error.startswith("timed out") and by_slot[1].ok and by_slot[2].ok
    assert [o.slot for o in outs][-1] == 0  # arrival order: the hung client comes last
    assert backend.replaced_workers == replaced + 1
    assert all(o.ok for o in backend.run(Moody(), None, _tasks(["ok"] * 3)))  # the pool still works


def test_dead_worker_is_vanished_and_replaced(backend):
    replaced = backend.replaced_workers
    outs = {o.slot: o for o in backend.run(Moody(), None, _tasks(["die", "ok", "ok"]))}
    assert outs[0].error.startswith("vanished: its Ray worker died")
    assert outs[1].ok and outs[2].ok
    assert backend.replaced_workers == replaced + 1
    assert all(o.ok for o in backend.run(Moody(), None, _tasks(["ok"] * 4)))


def test_min_clients_still_enforced(backend):
    with pytest.raises(FederatedError, match="only 1 of 3"):
        run_federated(Moody(), ["ok", "raise", "vanish"], rounds=1, sampler=AllClients(), backend=backend,
                      min_clients=2)


def test_make_backend_and_validation():
    assert isinstance(make_backend("ray", num_workers=3), RayBackend)
    with pytest.raises(ValueError, match="num_cpus_per_worker"):
        RayBackend(num_cpus_per_worker=0)
    assert ship_by_value(Drift()) in ([], [__name__])  # a test module outside sys.path ships by value
