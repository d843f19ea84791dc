"""Checkpoint and resume on the ``flower`` backend: the server checkpoints every round, the nodes keep their
clients' states on their own disks, and a killed run resumes to the same result as an uninterrupted one.

Fast tests run the real ServerApp logic and the real ``ClientApp`` through an in-process stand-in for Flower's
``Grid`` (a fresh stand-in is a restart: every node forgets what it held in memory). One pair of Flower
simulations (killed, then resumed) runs by default; an uninterrupted simulation to compare with, and a real
SuperLink with SuperNodes, run under ``-m slow``.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("flwr")

from privasr.errors import ConfigError  # noqa: E402
from privasr.federated.backends import run_on  # noqa: E402
from privasr.federated.backends.flower import (  # noqa: E402
    _serve,
    _ServerSpec,
    make_client_app,
    run_flower,
)
from privasr.federated.backends.flower_deploy import STATE_DIR_KEY, _dump  # noqa: E402
from privasr.federated.core import FederatedError, SumAccumulator, Update  # noqa: E402
from privasr.federated.loop import CHECKPOINT_NAME, PrivacySettings, run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, UniformWithReplacement  # noqa: E402
from privasr.federated.tree import load_tree  # noqa: E402

from .toys import fmp_toy  # noqa: E402


class Drift:
    """A weighted-mean algorithm whose clients keep a state; clients marked ``flaky`` fail in round 1."""

    name = "drift"

    def init(self, rng):
        return {"w": rng.normal(size=3)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        if payload["round"] == 1 and client.get("flaky"):
            raise ValueError("flaky client")
        x = np.asarray(client["x"], dtype=np.float64)
        noise = rng.normal(size=3)
        seen = 0 if client_state is None else client_state["seen"]
        total = np.zeros(3) if client_state is None else client_state["total"]
        # the update depends on the state, so a wrong state after a resume changes the server state
        delta = x.mean(axis=0) - payload["w"] + 0.1 * noise + 0.01 * total
        return (Update({"delta": delta}, weight=float(len(x)), metrics={"n": len(x)}),
                {"seen": seen + 1, "last_round": payload["round"], "total": total + noise})

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
        return SumAccumulator({"delta": np.zeros(3)})


@dataclass(frozen=True)
class FakeGaussian:
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


def _privacy():
    return PrivacySettings(FakeGaussian(), CountingAccountant(), composition="parallel")


def _clients(k=4, seed=1, flaky=()):
    rng = np.random.default_rng(seed)
    out = [{"x": rng.normal(loc=i, size=(i + 2, 3))} for i in range(k)]
    for i in flaky:
        out[i]["flaky"] = True
    return out


def _same_tree(a, b, rtol=1e-12):
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str)
        for k in a:
            _same_tree(a[k], b[k], rtol)
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same_tree(x, y, rtol)
    elif isinstance(a, np.ndarray) and a.dtype.kind == "f":
        np.testing.assert_allclose(a, b, rtol=rtol, atol=0)
    elif isinstance(a, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=1e-300)
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b)
    else:
        assert a == b


def _same_result(result, reference, rtol=1e-12):
    """The same FederatedResult: server state to ``rtol``, client states, and the history (not the timings)."""
    _same_tree(result.state, reference.state, rtol)
    assert sorted(result.client_states) == sorted(reference.client_states)
    for i, s in reference.client_states.items():
        _same_tree(result.client_states[i], s, rtol)
    def rows(res):  # a device sends only its exception's type, local also the message; timings vary
        return [(h.round, h.sampled, h.reported, {k: v.split(":")[0].split(" (")[0] for k, v in h.dropped.items()})
                for h in res.history]

    assert rows(result) == rows(reference)
    for a, b in zip(result.history, reference.history, strict=True):
        _same_tree(a.metrics, b.metrics, max(rtol, 1e-9))


# -- an in-process Grid ----------------------------------------------------------------------------------------


class FakeGrid:
    """Flower's Grid in one process: the real ClientApp handles each message as it is pushed.

    A new ``FakeGrid`` is a restart of every node: ``context.state`` starts empty. ``withhold`` holds
    ``(group_id, partition)`` pairs whose replies never arrive; ``node_config`` is added to every node's.
    """

    def __init__(self, app, n, withhold=(), node_config=None):
        from flwr.app import Context, RecordDict

        self.app = app
        self.node_of = {i: 7000 + 13 * i for i in range(n)}
        self.contexts = {node: Context(run_id=1, node_id=node,
                                       node_config={"partition-id": i, "num-partitions": n, **(node_config or {})},
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
    if base.get("checkpoint_dir") is not None:
        base["checkpoint_dir"] = str(base["checkpoint_dir"])
    return _ServerSpec(algorithm, n, **base)


@pytest.fixture
def client_app(tmp_path):
    """Build the real ClientApp over pickled clients; messages get a run identity as inside a Flower run."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    def make(algorithm, clients, state_dir=None):
        path = tmp_path / "clients.pkl"
        _dump(path, (algorithm, clients))
        return make_client_app(path, state_dir)

    yield make
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _state_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.npz"))


# -- fast: the protocol through an in-process grid -------------------------------------------------------------


def test_grid_resume_matches_an_uninterrupted_run(client_app, tmp_path):
    clients = _clients(4, flaky=[2])
    kw = dict(sampler=UniformWithReplacement(n=5), seed=5)
    nodes = tmp_path / "nodes"
    local_priv, full_priv, killed_priv, resumed_priv = _privacy(), _privacy(), _privacy(), _privacy()
    local = run_federated(Drift(), clients, rounds=4, privacy=local_priv, **kw)
    full = _serve(FakeGrid(client_app(Drift(), clients), 4), _spec(Drift(), 4, rounds=4, privacy=full_priv, **kw))
    ck = tmp_path / "ck"
    killed = _serve(FakeGrid(client_app(Drift(), clients, nodes), 4),
                    _spec(Drift(), 4, rounds=2, privacy=killed_priv, checkpoint_dir=ck, collect_client_states=False,
                          **kw))
    assert killed.resumed_from == 0 and len(killed.history) == 2 and killed.client_states == {}
    # the server's checkpoint names each client's state; the states themselves are on the nodes' disks
    saved = load_tree(ck / CHECKPOINT_NAME)
    assert saved["round"] == 2 and saved["client_states"]
    assert all(set(v) == {"node_state"} and len(v["node_state"]) == 2 for v in saved["client_states"].values())
    files = _state_files(nodes)
    assert files and all(f.split("/")[1].startswith("client-") for f in files)
    for i, v in saved["client_states"].items():
        run_dir = files[0].split("/")[0]
        assert f"{run_dir}/client-{i}/{v['node_state'][0]}.{v['node_state'][1]}.npz" in files
    # restarted nodes (nothing in memory) and a restarted server
    resumed = _serve(FakeGrid(client_app(Drift(), clients, nodes), 4),
                     _spec(Drift(), 4, rounds=4, privacy=resumed_priv, checkpoint_dir=ck, resume=True, **kw))
    assert resumed.resumed_from == 2
    _same_result(resumed, full, rtol=0)  # in-process: the same arrival order, so bit for bit
    _same_result(resumed, local)
    assert resumed_priv.accountant.events == full_priv.accountant.events == local_priv.accountant.events
    # once the final states are collected, each node keeps only the state the checkpoint names
    named = {f"client-{i}/{v['node_state'][0]}.{v['node_state'][1]}.npz"
             for i, v in load_tree(ck / CHECKPOINT_NAME)["client_states"].items()}
    assert {f.split("/", 1)[1] for f in _state_files(nodes)} == named


def test_a_late_reply_before_the_kill_is_not_adopted_after_the_resume(client_app, tmp_path):
    # client 2's round-1 reply never arrives: its node holds a round-1 state on disk, but the checkpoint
    # names its round-0 state, which the restarted node must use
    clients = _clients(3)
    withhold = [(1, 2)]
    full = _serve(FakeGrid(client_app(Drift(), clients), 3, withhold=withhold),
                  _spec(Drift(), 3, rounds=3, client_timeout=0.2))
    nodes, ck = tmp_path / "nodes", tmp_path / "ck"
    _serve(FakeGrid(client_app(Drift(), clients, nodes), 3, withhold=withhold),
           _spec(Drift(), 3, rounds=2, client_timeout=0.2, checkpoint_dir=ck, collect_client_states=False))
    assert any(f.endswith("client-2/1.2.npz") for f in _state_files(nodes))
    resumed = _serve(FakeGrid(client_app(Drift(), clients, nodes), 3),
                     _spec(Drift(), 3, rounds=3, client_timeout=0.2, checkpoint_dir=ck, resume=True))
    assert resumed.history[1].dropped["2:2"].startswith("timed out")
    assert resumed.client_states[2]["seen"] == 2
    _same_result(resumed, full, rtol=0)


def test_killed_mid_round_resumes_from_the_last_checkpoint(client_app, tmp_path):
    # the server dies in round 2 after the nodes computed it, before its checkpoint: the nodes hold states of
    # a round the server never saw, which the resumed run recomputes
    clients = _clients(3)
    kw = dict(sampler=UniformWithReplacement(n=3), seed=8)
    full = _serve(FakeGrid(client_app(Drift(), clients), 3), _spec(Drift(), 3, rounds=4, **kw))
    nodes, ck = tmp_path / "nodes", tmp_path / "ck"

    def die(entry, state):
        if entry.round == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _serve(FakeGrid(client_app(Drift(), clients, nodes), 3),
               _spec(Drift(), 3, rounds=4, on_round=die, checkpoint_dir=ck, **kw))
    assert load_tree(ck / CHECKPOINT_NAME)["round"] == 2
    assert any("/2." in f for f in _state_files(nodes))
    resumed = _serve(FakeGrid(client_app(Drift(), clients, nodes), 3),
                     _spec(Drift(), 3, rounds=4, checkpoint_dir=ck, resume=True, **kw))
    assert resumed.resumed_from == 2
    _same_result(resumed, full, rtol=0)


def test_node_config_state_folder(client_app, tmp_path):
    # a real SuperNode is configured with its own folder (node config), which wins over the app's default
    clients = _clients(2)
    own = tmp_path / "device-disk"
    grid = FakeGrid(client_app(Drift(), clients, tmp_path / "default"), 2, node_config={STATE_DIR_KEY: str(own)})
    _serve(grid, _spec(Drift(), 2, rounds=1, checkpoint_dir=tmp_path / "ck"))
    assert _state_files(own) and not (tmp_path / "default").exists()
    # nothing but the payload, the seeds and the state names travel to a node
    for m in grid.pushed:
        assert "x" not in m.content and not any("state" in k for k in m.content.keys())


def test_resume_refuses_a_checkpoint_of_another_run(client_app, tmp_path):
    clients = _clients(3)
    nodes, ck = tmp_path / "nodes", tmp_path / "ck"
    app = client_app(Drift(), clients, nodes)
    _serve(FakeGrid(app, 3), _spec(Drift(), 3, rounds=1, seed=1, checkpoint_dir=ck))
    with pytest.raises(FederatedError, match="belongs to another run"):
        _serve(FakeGrid(app, 3), _spec(Drift(), 3, rounds=2, seed=2, checkpoint_dir=ck, resume=True))
    with pytest.raises(FederatedError, match="belongs to another run"):
        _serve(FakeGrid(app, 3), _spec(Drift(), 3, rounds=2, seed=1, checkpoint_dir=ck, resume=True,
                                        key={"data": "other"}))
    # a Flower checkpoint names states on nodes: local cannot continue it, nor Flower a local one
    with pytest.raises(FederatedError, match="belongs to another run"):
        run_federated(Drift(), clients, rounds=2, sampler=AllClients(), seed=1, checkpoint_dir=ck, resume=True)
    local_ck = tmp_path / "local"
    run_federated(Drift(), clients, rounds=1, sampler=AllClients(), seed=1, checkpoint_dir=local_ck)
    with pytest.raises(FederatedError, match="belongs to another run"):
        _serve(FakeGrid(app, 3), _spec(Drift(), 3, rounds=2, seed=1, checkpoint_dir=local_ck, resume=True))


def test_a_checkpointed_run_needs_a_state_folder_on_every_node(client_app, tmp_path):
    clients = _clients(2)
    with pytest.raises(FederatedError, match="no state folder"):
        _serve(FakeGrid(client_app(Drift(), clients), 2), _spec(Drift(), 2, rounds=1, checkpoint_dir=tmp_path))


def test_a_node_that_lost_its_state_is_dropped_never_restarted(client_app, tmp_path):
    import shutil

    clients = _clients(3)
    nodes, ck = tmp_path / "nodes", tmp_path / "ck"
    _serve(FakeGrid(client_app(Drift(), clients, nodes), 3), _spec(Drift(), 3, rounds=1, checkpoint_dir=ck))
    for d in nodes.glob("*/client-1"):
        shutil.rmtree(d)
    resumed = _serve(FakeGrid(client_app(Drift(), clients, nodes), 3),
                     _spec(Drift(), 3, rounds=3, checkpoint_dir=ck, resume=True, collect_client_states=False))
    assert [h.reported for h in resumed.history] == [3, 2, 2]
    assert resumed.history[1].dropped["1:1"].startswith("lost its state of round 0, slot 1")
    with pytest.raises(FederatedError, match="client 1's SuperNode lost its state"):
        _serve(FakeGrid(client_app(Drift(), clients, nodes), 3),
               _spec(Drift(), 3, rounds=3, checkpoint_dir=ck, resume=True))


def test_run_flower_argument_checks(tmp_path):
    with pytest.raises(ConfigError, match="node_state_dir"):
        run_flower(Drift(), _clients(2), rounds=1, sampler=AllClients(), node_state_dir=tmp_path)


# -- Flower's engines ------------------------------------------------------------------------------------------


def _slow(request, what):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"{what}: run with -m slow")


def test_simulation_resumes_a_killed_run(client_app, tmp_path):
    """FMP killed after round 2, resumed to round 3 in Flower's simulation engine (through ``run_on``).

    To start Ray once, the killed part runs through the in-process grid, with the very ServerApp logic,
    ClientApp and folders that ``run_flower`` uses; the slow test below kills a real simulation.
    """
    alg, clients = fmp_toy()
    kw = dict(sampler=UniformWithReplacement(n=3), seed=4)
    local = run_federated(alg, clients, rounds=3, **kw)
    ck = tmp_path.resolve() / "ck"
    killed = _serve(FakeGrid(client_app(alg, clients, ck / "nodes"), 3),
                    _spec(alg, 3, rounds=2, checkpoint_dir=ck, collect_client_states=False, **kw))
    assert len(killed.history) == 2
    resumed = run_on("flower", alg, clients, checkpoint_dir=ck, rounds=3, **kw)
    assert resumed.resumed_from == 2
    _same_result(resumed, local)


@pytest.mark.slow
def test_simulation_resume_matches_an_uninterrupted_simulation(request, tmp_path):
    _slow(request, "four Flower simulations (about 40 s)")
    alg, clients = fmp_toy(n_clients=4)
    kw = dict(sampler=UniformWithReplacement(n=4), seed=6)
    full = run_flower(alg, clients, rounds=3, **kw)
    ck = tmp_path / "ck"
    killed = run_flower(alg, clients, rounds=1, checkpoint_dir=ck, collect_client_states=False, **kw)
    assert len(killed.history) == 1 and _state_files(ck / "nodes")
    with pytest.raises(FederatedError, match="belongs to another run"):
        run_flower(alg, clients, rounds=3, checkpoint_dir=ck, resume=True, **{**kw, "seed": 7})
    resumed = run_flower(alg, clients, rounds=3, checkpoint_dir=ck, resume=True, **kw)
    assert resumed.resumed_from == 1
    _same_result(resumed, full)


@pytest.mark.slow
def test_deployment_resume_matches_local(request, tmp_path):
    _slow(request, "two runs on a real SuperLink with SuperNodes (about 70 s)")
    clients = _clients(3, flaky=[1])
    kw = dict(sampler=UniformWithReplacement(n=3), seed=3)
    local_priv, killed_priv, resumed_priv = _privacy(), _privacy(), _privacy()
    local = run_federated(Drift(), clients, rounds=3, privacy=local_priv, **kw)
    ck, nodes = tmp_path / "ck", tmp_path / "devices"
    run_flower(Drift(), clients, rounds=1, privacy=killed_priv, mode="deployment", run_timeout=240,
               checkpoint_dir=ck, node_state_dir=nodes, **kw)
    assert _state_files(nodes)
    resumed = run_flower(Drift(), clients, rounds=3, privacy=resumed_priv, mode="deployment", run_timeout=240,
                         checkpoint_dir=ck, resume=True, node_state_dir=nodes, **kw)
    assert resumed.resumed_from == 1
    _same_result(resumed, local)
    assert resumed_priv.accountant.events == local_priv.accountant.events
