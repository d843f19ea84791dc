"""Flower deployment: every node reads only its own data folder, the app holds no client data, a failed run
leaves no secret behind, and (``-m slow``, real processes over TLS) an unregistered SuperNode never serves.

The fast tests drive the real ServerApp logic and ClientApp through an in-process stand-in for Flower's ``Grid``
whose nodes are configured as ``run_flower(mode="deployment")`` configures its SuperNodes.
"""

from __future__ import annotations

import os
import pickle
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.federated.backends.flower import _serve, _ServerSpec, make_client_app, run_flower  # noqa: E402
from privasr.federated.backends.flower_deploy import (  # noqa: E402
    DATA_DIR_KEY,
    STATE_DIR_KEY,
    _dump,
    _keep_only_logs,
    _Workdir,
    _write_app,
    supernode_config,
)
from privasr.federated.client_store import DATA_NAME, split_clients  # noqa: E402
from privasr.federated.core import FederatedError, SumAccumulator, Update  # noqa: E402
from privasr.federated.credentials import make_credentials  # noqa: E402
from privasr.federated.loop import run_federated  # noqa: E402
from privasr.federated.sampling import AllClients, UniformWithReplacement  # noqa: E402


class Drift:
    """A weighted-mean algorithm whose clients keep a state."""

    name = "drift"

    def init(self, rng):
        return {"w": rng.normal(size=3)}

    def broadcast(self, state, round):
        return {"w": state["w"], "round": round}

    def client_update(self, payload, client, client_state, rng):
        x = np.asarray(client["x"], dtype=np.float64)
        noise = rng.normal(size=3)
        seen = 0 if client_state is None else client_state["seen"]
        return (Update({"delta": x.mean(axis=0) - payload["w"] + 0.1 * noise}, weight=float(len(x)),
                       metrics={"n": len(x)}), {"seen": seen + 1, "noise": noise})

    def accumulate(self, acc, update):
        return (acc or SumAccumulator.empty()).add(update, scale=update.weight)

    def server_update(self, state, acc, round, rng):
        return {"w": state["w"] + 0.5 * acc.mean()["delta"]}, {"n": acc.metrics["n"]}


def _clients(k=4, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(loc=i, size=(i + 2, 3))} for i in range(k)]


def _spec(algorithm, n, **kw):
    base = dict(rounds=3, sampler=AllClients(), seed=0, min_clients=1, client_timeout=None, privacy=None,
                on_round=None, collect_client_states=True, node_wait=5.0, poll=0.01)
    base.update(kw)
    return _ServerSpec(algorithm, n, **base)


# -- what a node opens --------------------------------------------------------------------------------------------

_SEEN: dict[str, object] = {"node": None, "paths": []}


def _audit(event, args):
    """Every file or folder opened or listed while a node handles a message, with the node's client index."""
    if _SEEN["node"] is None or event not in ("open", "os.listdir", "os.scandir") or not args:
        return
    path = args[0]
    if isinstance(path, str | bytes | os.PathLike):
        _SEEN["paths"].append((_SEEN["node"], os.path.realpath(os.fsdecode(path))))


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only while a node is handling a message


class DeviceGrid:
    """Flower's Grid in one process; node ``i`` is configured as a deployment SuperNode: ``partition-id=i`` and
    its own ``privasr-data-dir`` (and ``privasr-state-dir``) in its node config."""

    def __init__(self, app, data_dirs, state_dir=None):
        from flwr.app import Context, RecordDict

        self.app = app
        n = len(data_dirs)
        self.node_of = {i: 5000 + 7 * i for i in range(n)}
        self.contexts = {}
        for i, node in self.node_of.items():
            config = {"partition-id": i, "num-partitions": n, DATA_DIR_KEY: str(data_dirs[i])}
            if state_dir is not None:
                config[STATE_DIR_KEY] = str(state_dir)
            self.contexts[node] = Context(run_id=1, node_id=node, node_config=config, state=RecordDict(),
                                          run_config={})
        self.partition = {node: i for i, node in self.node_of.items()}
        self.replies = {}

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            mid = uuid.uuid4().hex
            m.metadata.__dict__["_message_id"] = mid
            _SEEN["node"] = self.partition[m.metadata.dst_node_id]
            try:
                self.replies[mid] = self.app(m, self.contexts[m.metadata.dst_node_id])
            finally:
                _SEEN["node"] = None
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


@pytest.fixture
def algorithm_app(tmp_path):
    """The ClientApp of a deployment: it is given the pickled algorithm only (``(algorithm, None)``)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    def make(algorithm, name="algorithm.pkl"):
        path = tmp_path / name
        _dump(path, (algorithm, None))
        return make_client_app(path)

    yield make
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def test_each_node_reads_only_its_own_folder(tmp_path, algorithm_app):
    clients = _clients(4)
    root = (tmp_path / "devices").resolve()
    data_dirs = split_clients(clients, root / "data")
    kw = dict(rounds=3, sampler=UniformWithReplacement(n=5), seed=2)
    local = run_federated(Drift(), clients, **kw)
    grid = DeviceGrid(algorithm_app(Drift()), data_dirs, root / "states")
    _SEEN["paths"] = []
    result = _serve(grid, _spec(Drift(), 4, checkpoint_dir=str(tmp_path / "ck"), **kw))
    np.testing.assert_allclose(result.state["w"], local.state["w"], rtol=1e-12)
    for i, s in local.client_states.items():
        assert np.array_equal(result.client_states[i]["noise"], s["noise"])
    touched = {}
    for node, path in _SEEN["paths"]:
        if path.startswith(str(root) + os.sep):
            touched.setdefault(node, set()).add(Path(path).relative_to(root))
    assert sorted(touched) == [0, 1, 2, 3]
    for node, paths in touched.items():
        assert Path("data") / f"client-{node}" / DATA_NAME in paths  # it did read its client, from its folder
        for p in paths:  # data/client-<node>/... or states/<run>/client-<node>/...
            assert p.parts[0] in ("data", "states") and f"client-{node}" in p.parts, (node, p)
            assert not any(part.startswith("client-") and part != f"client-{node}" for part in p.parts), (node, p)
    assert {p.parts[0] for ps in touched.values() for p in ps} == {"data", "states"}


def test_the_app_and_the_server_spec_hold_no_client_data(tmp_path):
    marker = np.array([3.14159e-7, 2.71828e-9, 1.41421e-11, 1.73205e-13])  # a client's data, easy to find
    clients = [{"x": np.tile(marker, (3, 1))}, {"x": marker[None, :] + 1.0}]
    wd = _Workdir(tmp_path / "work")
    _write_app(wd, _spec(Drift(), 2))
    split_clients(clients, wd.data)
    with open(wd.algorithm, "rb") as f:
        algorithm, pickled_clients = pickle.load(f)  # noqa: S301 - written by the test
    assert isinstance(algorithm, Drift) and pickled_clients is None
    for p in wd.work.rglob("*"):
        if p.is_file() and wd.data not in p.parents:
            assert marker.tobytes() not in p.read_bytes(), p
    assert any(marker.tobytes() in p.read_bytes() for p in wd.data.rglob("*.npz"))  # it is findable


def test_a_node_that_cannot_read_its_client_is_refused_before_the_first_round(tmp_path, algorithm_app):
    dirs = split_clients(_clients(3), tmp_path / "data")
    swapped = [dirs[0], dirs[2], dirs[1]]  # node 1 is given client 2's folder
    with pytest.raises(FederatedError, match=r"client 1\) cannot read its client from .*client-2 \(manifest.json"):
        _serve(DeviceGrid(algorithm_app(Drift()), swapped), _spec(Drift(), 3))
    (dirs[2] / DATA_NAME).write_bytes(b"garbage")
    with pytest.raises(FederatedError, match=r"client 2\) cannot read its client .*\(client.npz; the SuperNode"):
        _serve(DeviceGrid(algorithm_app(Drift(), "other.pkl"), dirs), _spec(Drift(), 3))


def test_a_deployment_node_without_a_data_folder_is_refused(tmp_path, algorithm_app):
    grid = DeviceGrid(algorithm_app(Drift()), split_clients(_clients(2), tmp_path / "data"))
    del grid.contexts[grid.node_of[1]].node_config[DATA_DIR_KEY]
    with pytest.raises(FederatedError, match=r"client 1\) has no data folder .*privasr-data-dir="):
        _serve(grid, _spec(Drift(), 2))


def test_supernode_config():
    assert supernode_config(0, 2, "/d/c0", "/d/s") == \
        "partition-id=0 num-partitions=2 privasr-data-dir='/d/c0' privasr-state-dir='/d/s'"
    assert supernode_config(1, 2) == "partition-id=1 num-partitions=2"
    with pytest.raises(ConfigError, match="without quotes"):
        supernode_config(0, 1, "/it's/here")


def test_a_failed_run_keeps_its_logs_and_no_secret(tmp_path):
    wd = _Workdir(tmp_path / "work")
    _write_app(wd, _spec(Drift(), 2))
    split_clients(_clients(2), wd.data)
    creds = make_credentials(wd.credentials, nodes=2)
    (wd.logs / "superlink.log").write_text("started\n")
    wd.result.write_bytes(b"x")
    assert _keep_only_logs(wd)
    assert [p.relative_to(wd.work).as_posix() for p in sorted(wd.work.rglob("*"))] == ["logs", "logs/superlink.log"]
    assert not any(p.exists() for p in (creds.ca_key, creds.server_key, *creds.node_private_keys))
    bare = _Workdir(tmp_path / "bare")  # failed before any process started: nothing to keep
    _write_app(bare, _spec(Drift(), 1))
    assert not _keep_only_logs(bare) and not bare.work.exists()


def test_clients_that_cannot_be_stored_stop_a_deployment_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the run's work folder goes
    with pytest.raises(InputError, match=r"client 1\['x'\] is a builtins.set"):
        run_flower(Drift(), [{"x": np.zeros((2, 3))}, {"x": {1, 2}}], rounds=1, sampler=AllClients(),
                   mode="deployment")
    assert list(tmp_path.iterdir()) == []  # no work folder, no copy of client 0 left behind


# -- real processes ------------------------------------------------------------------------------------------------


def _slow(request, what):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip(f"{what}: run with -m slow")


@pytest.mark.slow
def test_an_unregistered_supernode_never_serves_a_client(request, tmp_path):
    """A TLS SuperLink with node authentication and two registered SuperNodes (the deployment's own code path),
    plus a third SuperNode, made with the same credentials but whose key was never registered, claiming client 1
    with other data: the run completes on the registered nodes and matches local (a second node for client 1
    would have stopped it: "two SuperNodes serve client 1"); the intruder is refused."""
    _slow(request, "a real SuperLink with three SuperNodes (about 40 s)")
    import json

    from privasr.federated.backends.flower_deploy import (
        _deployment_env,
        _flwr_cli,
        _flwr_run,
        _free_port,
        _Processes,
        _register_nodes,
        _start_superlink,
        _start_supernode,
        _wait_for_result,
        _write_flwr_config,
    )

    clients = _clients(2)
    kw = dict(rounds=2, sampler=AllClients(), seed=4)
    local = run_federated(Drift(), clients, **kw)
    from privasr.federated.backends.ray import ship_by_value

    ship_by_value(Drift(), kw["sampler"])  # as run_flower does: the test module's classes travel by value
    wd = _Workdir(tmp_path / "work")
    _write_app(wd, _spec(Drift(), 2, node_wait=60.0, poll=0.2, **kw))
    dirs = split_clients(clients, wd.data)
    intruder_dir = split_clients([{"x": np.full((2, 3), 99.0)}], tmp_path / "intruder")[0]
    creds = make_credentials(wd.credentials, nodes=3, hosts=("127.0.0.1", "localhost"))
    port = _free_port()
    _write_flwr_config(wd, port, creds)
    env = _deployment_env(wd.home)
    procs, stray = _Processes(env, wd.logs), _Processes(env, wd.logs)
    try:
        _start_superlink(procs, port, creds)
        _register_nodes(procs, creds.node_public_keys[:2])
        for i in (0, 1):
            _start_supernode(procs, f"supernode-{i}", port, creds.supernode_args(i), supernode_config(i, 2, dirs[i]))
        _start_supernode(stray, "intruder", port, creds.supernode_args(2), supernode_config(1, 2, intruder_dir))
        run_id = _flwr_run(wd.app, env)
        _wait_for_result(wd, procs, env, run_id, 240.0)
        with open(wd.result, "rb") as f:
            outcome = pickle.load(f)  # noqa: S301 - written by the ServerApp
        assert outcome["ok"], outcome.get("traceback")
        listed = json.loads(_flwr_cli(["supernode", "list", "privasr", "--format", "json"], env).stdout)["nodes"]
    finally:
        procs.stop()
        stray.stop()
    result = outcome["result"]
    np.testing.assert_allclose(result.state["w"], local.state["w"], rtol=1e-12)
    assert [h.reported for h in result.history] == [2, 2]
    intruder_log = (wd.logs / "intruder.log").read_text(errors="replace")
    assert "Failed to activate SuperNode" in intruder_log, intruder_log[-2000:]
    assert len(listed) == 2  # the SuperLink knows the registered keys only
    # no private key reaches a log: every log is free of each key file's base64 body
    secrets = [line for p in (creds.ca_key, creds.server_key, *creds.node_private_keys)
               for line in p.read_text().splitlines() if line and not line.startswith("-----")]
    for log in wd.logs.iterdir():
        text = log.read_text(errors="replace")
        assert not any(s in text for s in secrets), log
