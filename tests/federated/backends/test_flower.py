"""The ``flower`` backend: the wire format, the node-side state protocol, and whole runs against ``local``.

Fast tests drive the ServerApp logic and the real ``ClientApp`` through an in-process stand-in for Flower's
``Grid``; one Flower simulation (one Ray session) checks the real engine; a real SuperLink with SuperNodes runs
under ``-m slow``.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.errors import ConfigError  # noqa: E402
from privasr.federated.backends import make_backend  # noqa: E402
from privasr.federated.backends.flower import (  # noqa: E402
    GridBackend,
    _serve,
    _ServerSpec,
    make_client_app,
    pack_tree,
    run_flower,
    unpack_tree,
)
from privasr.federated.backends.flower_deploy import _dump  # noqa: E402
from privasr.federated.backends.local import ClientVanished  # noqa: E402
from privasr.federated.core import FederatedError, SumAccumulator, Update  # noqa: E402
from privasr.federated.loop import PrivacySettings, run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, UniformWithReplacement  # noqa: E402


class Drift:
    """A weighted-mean algorithm with a client state; clients marked ``flaky`` fail in round 1."""

    name = "drift"

    def init(self, rng):
        return {"w": rng.normal(size=3)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        if payload["round"] == 1 and client.get("flaky") == "raise":
            raise ValueError("flaky client\nmore")
        if payload["round"] == 1 and client.get("flaky") == "vanish":
            raise ClientVanished("out of battery")
        x = np.asarray(client["x"], dtype=np.float64)
        noise = rng.normal(size=3)
        delta = x.mean(axis=0) - payload["w"] + 0.1 * noise
        seen = 0 if client_state is None else client_state["seen"]
        return (Update({"delta": delta, "count": np.array([len(x)], dtype=np.int32)}, weight=float(len(x)),
                       metrics={"n": len(x)}),
                {"seen": seen + 1, "last_round": payload["round"], "noise": noise})

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update, scale=update.weight)

    def server_update(self, state, acc, round, rng):
        mean = acc.mean()["delta"]
        return {"w": state["w"] + 0.5 * mean}, {"step": float(np.linalg.norm(mean)), "n": acc.metrics.get("n", 0.0)}

    # differential privacy (a plumbing toy: its weighted sum has no real bound)
    dp_metrics = ("step",)

    def dp_bound(self):
        return "l2", 1.0

    def zero_sum(self, state):
        return SumAccumulator({"delta": np.zeros(3), "count": np.zeros(1)})


@dataclass(frozen=True)
class FakeGaussian:
    """A noise mechanism without dp_accounting: Gaussian noise, a symbolic accounting event."""

    std: float = 0.05
    clip_norm: float = 1.0

    def add_noise(self, total, rng):
        return {k: np.asarray(total[k], dtype=np.float64) + rng.normal(scale=self.std, size=np.shape(total[k]))
                for k in sorted(total)}

    def dp_event(self):
        return ("gaussian", self.std)


class CountingAccountant:
    target_delta = 1e-5

    def __init__(self):
        self.events = []

    def step(self, event):
        self.events.append(event)

    def epsilon(self):
        return float(len(self.events))

    def state_dict(self):
        return {"events": [list(e) for e in self.events]}

    def load_state_dict(self, d):
        self.events = [tuple(e) for e in d["events"]]


def _clients(k=5, seed=1, flaky=None):
    rng = np.random.default_rng(seed)
    out = [{"x": rng.normal(loc=i, size=(i + 2, 3))} for i in range(k)]
    for i, how in (flaky or {}).items():
        out[i]["flaky"] = how
    return out


def _same(result, local):
    np.testing.assert_allclose(result.state["w"], local.state["w"], rtol=1e-12, atol=0)
    assert sorted(result.client_states) == sorted(local.client_states)
    for i, s in local.client_states.items():
        r = result.client_states[i]
        assert (r["seen"], r["last_round"]) == (s["seen"], s["last_round"])
        assert np.array_equal(r["noise"], s["noise"])
    # a device sends only the exception's type (its message could quote the client's data)
    def reasons(h):
        return {k: v.split(":")[0] for k, v in h.dropped.items()}

    assert [(h.round, h.sampled, h.reported, reasons(h)) for h in result.history] == \
           [(h.round, h.sampled, h.reported, reasons(h)) for h in local.history]
    for a, b in zip(result.history, local.history, strict=True):
        assert math.isclose(a.metrics["step"], b.metrics["step"], rel_tol=1e-9)
        assert a.metrics.get("n") == b.metrics.get("n")


# -- an in-process Grid ----------------------------------------------------------------------------------------


class FakeGrid:
    """Flower's Grid in one process: the real ClientApp handles each message as it is pushed.

    ``withhold`` holds ``(group_id, partition)`` pairs whose replies never arrive (a slow device).
    """

    def __init__(self, app, n, withhold=()):
        from flwr.app import Context, RecordDict

        self.app = app
        self.node_of = {i: 7000 + 13 * i for i in range(n)}
        self.contexts = {node: Context(run_id=1, node_id=node, node_config={"partition-id": i, "num-partitions": n},
                                       state=RecordDict(), run_config={}) for i, node in self.node_of.items()}
        self.withhold = {(str(g), self.node_of[i]) for g, i in withhold}
        self.replies = {}
        self.pushed = []

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = uuid.uuid4().hex
            m.metadata.__dict__["_message_id"] = mid
            self.pushed.append(m)
            reply = self.app(m, self.contexts[m.metadata.dst_node_id])
            if (m.metadata.group_id, m.metadata.dst_node_id) not in self.withhold:
                self.replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def _spec(algorithm, n, **kw):
    base = dict(rounds=3, sampler=AllClients(), seed=0, min_clients=1, client_timeout=None, privacy=None,
                on_round=None, collect_client_states=True, node_wait=5.0, poll=0.01)
    base.update(kw)
    return _ServerSpec(algorithm, n, **base)


@pytest.fixture
def client_app(tmp_path):
    """Build the real ClientApp over pickled clients; messages get a run identity as inside a Flower run."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    def make(algorithm, clients):
        path = tmp_path / "clients.pkl"
        _dump(path, (algorithm, clients))
        return make_client_app(path)

    yield make
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def test_pack_tree_round_trip():
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "ids": np.array([3, 1], dtype=np.int64),
            "round": 4, "name": "x", "pair": (1.5, None), "nested": [{"z": np.zeros((0,), dtype=np.uint8)}]}
    back = unpack_tree(*pack_tree(tree))
    assert back["w"].dtype == np.float32 and back["w"].shape == (2, 3) and np.array_equal(back["w"], tree["w"])
    assert back["ids"].dtype == np.int64 and back["round"] == 4 and back["name"] == "x"
    assert back["pair"] == (1.5, None) and back["nested"][0]["z"].dtype == np.uint8
    assert unpack_tree(*pack_tree(2.5)) == 2.5


def test_grid_run_matches_local(client_app):
    clients = _clients(flaky={1: "raise", 3: "vanish"})
    kw = dict(rounds=4, sampler=UniformWithReplacement(n=6), seed=5)
    local = run_federated(Drift(), clients, **kw)
    grid = FakeGrid(client_app(Drift(), clients), len(clients))
    result = _serve(grid, _spec(Drift(), len(clients), **kw))
    _same(result, local)
    dropped = {k: v for h in result.history for k, v in h.dropped.items()}
    assert any(k.endswith(":1") and v == "raised ValueError" for k, v in dropped.items())
    # one message per distinct client per round, whatever the number of slots it was drawn for
    train = [m for m in grid.pushed if m.metadata.message_type == "train"]
    per_round = {}
    for m in train:
        per_round.setdefault(m.metadata.group_id, []).append(int(m.content["privasr.task"]["index"]))
    assert all(len(v) == len(set(v)) for v in per_round.values())
    assert sum(len(m.content["privasr.task"]["slots"]) for m in train) == sum(h.sampled for h in result.history)


def test_late_reply_is_dropped_and_its_state_not_kept(client_app):
    clients = _clients(3)
    grid = FakeGrid(client_app(Drift(), clients), 3, withhold=[(1, 2)])
    t0 = time.perf_counter()
    result = _serve(grid, _spec(Drift(), 3, client_timeout=0.2))
    assert time.perf_counter() - t0 < 5
    assert result.history[1].dropped["2:2"].startswith("timed out")
    assert [h.reported for h in result.history] == [3, 2, 3]
    # client 2 computed round 1 but the server never accepted it: its node kept the state of round 0
    assert result.client_states[2]["seen"] == 2 and result.client_states[0]["seen"] == 3


def test_no_state_leaves_a_node_without_collect(client_app):
    clients = _clients(2)
    grid = FakeGrid(client_app(Drift(), clients), 2)
    result = _serve(grid, _spec(Drift(), 2, collect_client_states=False, rounds=2))
    assert result.client_states == {}
    types = {m.metadata.message_type for m in grid.pushed}
    assert types == {"query.privasr_hello", "train"}
    for m in grid.pushed:  # the server sends the payload, never client data
        assert "x" not in m.content


def test_min_clients_and_missing_nodes(client_app):
    clients = _clients(2, flaky={0: "raise", 1: "raise"})
    grid = FakeGrid(client_app(Drift(), clients), 2)
    with pytest.raises(FederatedError, match="only 0 of 2"):
        _serve(grid, _spec(Drift(), 2, rounds=2))
    grid = FakeGrid(client_app(Drift(), clients), 1)
    with pytest.raises(FederatedError, match="only 1 of 2 SuperNodes"):
        _serve(grid, _spec(Drift(), 2, node_wait=0.2))


def test_unknown_node_is_vanished(client_app):
    from privasr.federated.core import ClientTask

    backend = GridBackend(FakeGrid(None, 0), {})
    outs = list(backend.run(Drift(), {"w": np.zeros(3), "round": 0}, [ClientTask(0, 4, None, None, (0, 0, 4, 0, 1))]))
    assert outs[0].error == "vanished: its SuperNode could not be reached"


def test_argument_checks():
    with pytest.raises(ConfigError, match="mode"):
        run_flower(Drift(), _clients(2), rounds=1, sampler=AllClients(), mode="grpc")
    with pytest.raises(ConfigError, match="on_round"):
        run_flower(Drift(), _clients(2), rounds=1, sampler=AllClients(), mode="deployment", on_round=print)
    with pytest.raises(ConfigError, match="min_clients"):
        run_flower(Drift(), _clients(2), rounds=1, sampler=AllClients(), min_clients=0)
    with pytest.raises(ConfigError, match="flower backend runs the whole loop"):
        make_backend("flower")


# -- Flower's engines --------------------------------------------------------------------------------------------


def _privacy():
    return PrivacySettings(FakeGaussian(), CountingAccountant(), composition="parallel")


@pytest.fixture(scope="module")
def simulated():
    """One Flower simulation (it starts and stops a Ray session) and the local run it must match."""
    clients = _clients(5, flaky={2: "raise"})
    kw = dict(rounds=3, sampler=UniformWithReplacement(n=4), seed=11)
    local_priv, sim_priv = _privacy(), _privacy()
    local = run_federated(Drift(), clients, privacy=local_priv, **kw)
    rounds = []
    t0 = time.perf_counter()
    result = run_flower(Drift(), clients, privacy=sim_priv, on_round=lambda h, s: rounds.append(h.round), **kw)
    return result, local, sim_priv, local_priv, rounds, time.perf_counter() - t0


def test_simulation_matches_local(simulated):
    result, local, sim_priv, local_priv, rounds, seconds = simulated
    _same(result, local)
    assert rounds == [0, 1, 2]
    assert sim_priv.accountant.events == local_priv.accountant.events == [("gaussian", 0.05)]
    assert [h.metrics["epsilon"] for h in result.history] == [h.metrics["epsilon"] for h in local.history]


@pytest.mark.slow
def test_deployment_matches_local(request, tmp_path, monkeypatch):
    """A real SuperLink over TLS with registered SuperNodes, each reading its client from its own folder."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a real SuperLink and SuperNodes (about 40 s): run with -m slow")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run's work folder goes there, to be looked at
    clients = _clients(3, flaky={1: "vanish"})
    kw = dict(rounds=2, sampler=UniformWithReplacement(n=3), seed=3)
    local_priv, dep_priv = _privacy(), _privacy()
    local = run_federated(Drift(), clients, privacy=local_priv, **kw)
    result = run_flower(Drift(), clients, privacy=dep_priv, mode="deployment", run_timeout=240, keep_workdir=True,
                        **kw)
    _same(result, local)
    assert dep_priv.accountant.events == local_priv.accountant.events
    (work,) = tmp_path.glob("privasr-flower-*")
    logs = work / "logs"
    link_log = (logs / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:" in link_log  # TLS
    assert "Option `--insecure` was set" not in link_log  # what Flower logs when started with --insecure
    assert sorted(p.name for p in (work / "data").iterdir()) == ["client-0", "client-1", "client-2"]
    for i in range(3):  # every node was registered, activated and served its message(s)
        assert "SuperNode ID:" in (logs / f"supernode-{i}.log").read_text()
