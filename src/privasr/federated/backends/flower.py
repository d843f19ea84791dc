"""The ``flower`` backend: the same algorithm, rounds and seeds, run through Flower's Message API.

Flower drives its own loop, so instead of a ``run(...)`` backend for :func:`~privasr.federated.loop.run_federated`
this module provides :func:`run_flower`, which returns the same :class:`~privasr.federated.loop.FederatedResult`.
It builds

* a ``ServerApp`` whose main function calls :func:`~privasr.federated.loop.run_federated` itself, with a
  :class:`GridBackend` that sends one ``Message`` per sampled client through Flower's ``Grid`` and turns the
  replies back into :class:`~privasr.federated.core.ClientOutcome` objects as they arrive: sampling, seeding,
  accumulation, differential privacy (noise once per round) and ``server_update`` are literally the loop's;
* a ``ClientApp`` whose ``train`` handler serves the client ``context.node_config["partition-id"]``, read from
  the node's own data folder (node config ``privasr-data-dir``, :mod:`~privasr.federated.client_store`) or, in
  simulation, from the pickled population; it keeps the client's state on the node (``context.state`` or the
  node's state folder; the state is not part of any update, and ``collect_client_states=True`` fetches it at the
  end, for tests and research runs), runs :func:`~privasr.federated.core.run_client` and replies with the update
  only: arrays, weight and metrics. With secure aggregation (``secagg``) Flower's ``secaggplus_mod`` masks the
  update first, so the server only ever sees the cohort's sum (:mod:`privasr.federated.backends.flower_secagg`).

Two modes:

* ``"simulation"``: Flower's simulation engine (``flwr.simulation.run_simulation``) with one virtual SuperNode
  per client; ClientApps run in Ray actors on this machine, offline.
* ``"deployment"``: a real ``flower-superlink`` and one ``flower-supernode`` per client, started on free
  loopback ports, over TLS with authenticated SuperNodes, each node reading its client from a folder of its own
  (:mod:`~privasr.federated.backends.flower_deploy`); the ServerApp is submitted with ``flwr run`` as a
  generated Flower app (a tiny package in a temporary folder that imports privasr and unpickles the algorithm,
  never client data, from a file). Every process is stopped when the run ends, also on failure.

**Wire format.** A pytree (the payload, a client state) travels as a ``ConfigRecord`` holding the JSON skeleton
of :func:`privasr.federated.tree.flatten` plus an ``ArrayRecord`` of its arrays (``"0"``, ``"1"``, ...), so
arrays keep their dtype and shape and nothing is pickled on the wire. An update is an ``ArrayRecord``
(``Update.arrays``), a ``MetricRecord`` (``Update.metrics``) and a ``ConfigRecord`` with ``weight`` and
``seconds``, or with ``error`` if the client failed. A client sampled twice in a round (sampling with
replacement) gets one message listing both slots, so its SuperNode runs both from the same state.

**Client state.** A client's state stays on its SuperNode. What the server's loop keeps as the client's state
is a *token*, ``{"node_state": [round, slot]}``: the name of the state the client computed in that round and
slot, kept only once the server accepted that update (the first successful slot of a client, as in the loop).
Every message to a node carries its client's token; the node runs from exactly the state it names and forgets
the states of earlier rounds it does not name. So a new state stays *pending* until a later message names it,
and a client whose reply came too late keeps its previous state, exactly as on the ``local`` backend. With
``collect_client_states=True`` (the default, for tests and simulations) the server asks every node for its
named state at the end, to fill ``FederatedResult.client_states``; turn it off for a real federation, where
states must stay on the devices.

**Checkpoint and resume.** With ``checkpoint_dir`` the ServerApp's loop writes ``state.npz`` after every round,
as on ``local``: server state, accountant, history and the clients' tokens, never a client's state. Each node
writes every state it computes to its own disk, ``<folder>/<run id>/client-<i>/<round>.<slot>.npz``
(:func:`~privasr.federated.tree.save_tree`, atomic), where ``<folder>`` is the node config's
``privasr-state-dir`` (deployment: each SuperNode is started with one) or the ClientApp's default
(simulation: ``node_state_dir``, by default ``checkpoint_dir/nodes``). ``resume=True`` continues from the
checkpoint: restarted nodes reload the states its tokens name, so a killed run ends in the same result as an
uninterrupted one. A token is written in the checkpoint of the round whose update it names, before any message
names it, so the server's checkpoint and the nodes' files always agree; states of a round the server did not
checkpoint are never adopted. A node that lost the named state is dropped with ``lost its state ...`` (it never
restarts from an empty state, which would change the result silently). The run's identity includes the
backend: a Flower checkpoint cannot be continued on ``local``/``ray`` (their checkpoints hold the client
states themselves) and the other way round.

**Determinism.** Same seed, same sampled clients, same client updates and same client states as the ``local``
backend; the server state agrees up to floating-point summation order (updates are accumulated in arrival
order). A client timeout counts from the moment the round's messages are sent, so in simulation it also counts
the time a message waits for a free Ray actor.

>>> run_flower(object(), [1, 2], rounds=1, sampler=None, mode="cloud")
Traceback (most recent call last):
...
privasr.errors.ConfigError: mode='cloud' (expected one of simulation, deployment)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr import progress
from privasr.errors import ConfigError, InputError
from privasr.federated.backends.flower_deploy import (
    ALGORITHM_KEY,
    DATA_DIR_KEY,
    STATE_DIR_KEY,
    _dump,
    _run_deployment,
)
from privasr.federated.backends.flower_secagg import (
    SECURE,
    decode_round,
    failed_slot,
    node_secure_reply,
    outcomes_of,
    secure_round,
    secure_task,
)
from privasr.federated.client_store import load_client
from privasr.federated.core import ClientOutcome, ClientTask, FederatedError, Update, run_client
from privasr.federated.loop import (
    CHECKPOINT_NAME,
    FederatedResult,
    PrivacySettings,
    _run_key,
    check_run_arguments,
    run_federated,
)
from privasr.federated.secagg import SecAggSettings
from privasr.federated.tree import flatten, load_tree, save_tree, unflatten

__all__ = [
    "run_flower",
    "GridBackend",
    "make_client_app",
    "make_server_app",
    "deployment_server_app",
    "discover_nodes",
    "check_secagg",
    "pack_tree",
    "unpack_tree",
    "FLOWER_MODES",
]

log = logging.getLogger("privasr.federated")

FLOWER_MODES = ("simulation", "deployment")

TRAIN = "train"
HELLO = "query.privasr_hello"
STATE = "query.privasr_state"

_NODE = "privasr.node"  # ConfigRecord of a SuperNode's bookkeeping in context.state
_STATE = "privasr.state"  # prefix of the client states kept in context.state


def _flwr() -> None:
    """Import Flower with its telemetry off (unless the user turned it on explicitly)."""
    if "FLWR_TELEMETRY_ENABLED" not in os.environ:
        os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    try:
        import flwr.supercore.telemetry as telemetry
    except ImportError as e:
        raise ConfigError("the flower backend needs Flower", expected="pip install 'privasr[federated]'") from e
    if os.environ["FLWR_TELEMETRY_ENABLED"] != "1":
        telemetry.FLWR_TELEMETRY_ENABLED = "0"


@contextmanager
def flower_log_level(level: int) -> Iterator[None]:
    """Flower's logger (``flwr``) at ``level`` for a ``with`` block, restored after. Flower is imported first:
    it sets its logger's level when first imported, which would undo a level set before."""
    _flwr()
    import flwr.common.logger  # noqa: F401

    flwr_logger = logging.getLogger("flwr")
    saved = flwr_logger.level
    flwr_logger.setLevel(level)
    try:
        yield
    finally:
        flwr_logger.setLevel(saved)


# -- pytrees as records --------------------------------------------------------------------------------------


def pack_tree(tree: Any) -> tuple[Any, Any]:
    """``tree`` as a ``(ConfigRecord, ArrayRecord)`` pair: the JSON skeleton and the arrays."""
    _flwr()
    from flwr.app import Array, ArrayRecord, ConfigRecord

    skel, arrays = flatten(tree)
    rec = ArrayRecord()
    for i, a in enumerate(arrays):
        rec[str(i)] = Array.from_numpy_ndarray(np.asarray(a))
    return ConfigRecord({"tree": json.dumps(skel)}), rec


def unpack_tree(config: Any, arrays: Any) -> Any:
    """Inverse of :func:`pack_tree`."""
    skel = json.loads(str(config["tree"]))
    return unflatten(skel, [arrays[str(i)].numpy() for i in range(len(arrays))])


def _put_tree(records: Any, name: str, tree: Any) -> None:
    config, arrays = pack_tree(tree)
    records[f"{name}.tree"] = config
    records[f"{name}.arrays"] = arrays


def _get_tree(records: Any, name: str) -> Any:
    return unpack_tree(records[f"{name}.tree"], records[f"{name}.arrays"])


def _drop_tree(records: Any, name: str) -> None:
    for suffix in (".tree", ".arrays"):
        if name + suffix in records:
            del records[name + suffix]


# -- the ClientApp ---------------------------------------------------------------------------------------------

_LOADED: dict[str, Any] = {}


def _load(path: str) -> Any:
    """The pickled object at ``path`` (written by this module), loaded once per process."""
    if path not in _LOADED:
        with open(path, "rb") as f:
            _LOADED[path] = pickle.load(f)  # noqa: S301 - our own file, written by run_flower
    return _LOADED[path]


_CLIENTS: dict[str, Any] = {}


def _node_data_dir(context: Any) -> Path | None:
    """The node's own data folder (node config ``privasr-data-dir``), if it was started with one."""
    folder = context.node_config.get(DATA_DIR_KEY) if context.node_config is not None else None
    return Path(str(folder)) if folder else None


def _node_client(folder: Path, index: int) -> Any:
    """Client ``index`` from the node's data folder (:func:`~privasr.federated.client_store.load_client`),
    read once per process."""
    key = str(folder)
    if key not in _CLIENTS:
        _CLIENTS[key] = load_client(folder, index=index)
    return _CLIENTS[key]


def _node_data(context: Any, algorithm_path: str) -> tuple[Any, Any]:
    """The algorithm and the node's clients by index: ``{index: client}`` read from the node's own data folder
    when it has one (deployment), else the population pickled with the algorithm (simulation)."""
    if context.node_config is not None and context.node_config.get(ALGORITHM_KEY):
        algorithm_path = str(context.node_config[ALGORITHM_KEY])  # where this device keeps the public model
    algorithm, clients = _load(algorithm_path)
    folder = _node_data_dir(context)
    if folder is not None:
        index = int(context.node_config["partition-id"])
        return algorithm, {index: _node_client(folder, index)}
    if clients is None:
        raise FederatedError(f"this SuperNode has no data folder (node config {DATA_DIR_KEY})")
    return algorithm, clients


def _node_train(message: Any, context: Any, source: str | Callable[[Any, int], tuple[Any, Any]],
                state_dir: str | None) -> Any:
    """Handle a ``train`` message: run the node's client (``source(context, epoch)`` gives the algorithm and
    ``{index: client}``; a path: :func:`_node_data` of the pickled algorithm there) from the state the server
    named, keep the new state, reply with the update (or, under SecAgg+, the masked summand)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    from privasr.federated.backends.local import describe_failure

    task = message.content["privasr.task"]
    index = int(context.node_config["partition-id"])
    if int(task["index"]) != index:
        raise FederatedError(f"a message for client {task['index']} reached the node of client {index}")
    epoch = int(task["epoch"])
    if callable(source):
        algorithm, clients = source(context, epoch)
    else:
        algorithm, clients = _node_data(context, source)
    slots = [int(s) for s in task["slots"]]
    store = _NodeStates(context, _node_folder(context, state_dir), str(task.get("run", "")))
    out = RecordDict()
    try:
        state = store.adopt(list(task["accepted"]), epoch)
    except _LostState as e:  # the server named a state this node does not have: never guess one
        if SECURE in message.content:  # the node drops out of the secure round, naming why
            raise FederatedError(str(e)) from None
        for slot in slots:
            out[f"privasr.result.{slot}"] = ConfigRecord({"error": str(e), "seconds": 0.0})
        return Message(out, reply_to=message)
    payload = _get_tree(message.content, "privasr.payload")
    secure = message.content.get(SECURE)
    updates: dict[int, Update] = {}
    failures: dict[int, tuple[str, float]] = {}
    seconds: dict[int, float] = {}
    for slot in slots:
        seed = tuple(int(v) for v in task[f"seed.{slot}"])
        t0 = time.perf_counter()
        try:
            update, new_state = run_client(algorithm, payload, ClientTask(slot, index, clients[index], state, seed))
            store.put(_state_name(epoch, slot), new_state)  # pending until the server names it
        except Exception as e:  # reported to the server; the node keeps its state
            failures[slot] = (describe_failure(e, with_message=False), time.perf_counter() - t0)
            continue
        updates[slot], seconds[slot] = update, time.perf_counter() - t0
    if secure is not None:  # Flower's secaggplus_mod masks what this returns
        seeds = {slot: [int(v) for v in task[f"seed.{slot}"]] for slot in slots}
        return Message(node_secure_reply(algorithm, updates, failures, seconds, secure, seeds), reply_to=message)
    for slot, (why, dt) in failures.items():
        out[f"privasr.result.{slot}"] = ConfigRecord({"error": why, "seconds": dt})
    for slot, update in updates.items():
        arrays = ArrayRecord()
        for k, a in update.arrays.items():
            arrays[k] = _array(a)
        out[f"privasr.update.{slot}"] = arrays
        out[f"privasr.metrics.{slot}"] = MetricRecord(dict(update.metrics))
        out[f"privasr.result.{slot}"] = ConfigRecord({"weight": float(update.weight), "seconds": seconds[slot]})
    return Message(out, reply_to=message)


def _array(a: np.ndarray) -> Any:
    from flwr.app import Array

    return Array.from_numpy_ndarray(np.asarray(a))


# -- a client's states on its node -------------------------------------------------------------------------------

class _LostState(Exception):
    """The server named a state (round, slot) that this node does not hold."""


def _state_name(round: int, slot: int) -> str:
    return f"{int(round)}.{int(slot)}"


def _node_folder(context: Any, state_dir: str | None) -> Path | None:
    """The node's own state folder: its node config's ``privasr-state-dir``, else the ClientApp's default."""
    folder = context.node_config.get(STATE_DIR_KEY) if context.node_config is not None else None
    if folder:
        return Path(str(folder))
    return Path(state_dir) if state_dir else None


class _NodeStates:
    """The states one client computed on its node, named ``"<round>.<slot>"``.

    The server names the client's current state with a *token* ``[round, slot]`` (the loop's client state on
    Flower, written in the server's checkpoint): the state computed in that round and slot, which the server
    accepted. A new state stays pending (unnamed) until a later message names it; a message of round ``r``
    lets the node forget every state of an earlier round except the named one.

    Where: in ``context.state`` (lives as long as the SuperNode), or, when the node has a state folder and the
    run is checkpointed (``run`` is its id), as :func:`~privasr.federated.tree.save_tree` files
    ``<folder>/<run>/client-<i>/<round>.<slot>.npz`` on the node's own disk, so that the node can serve a
    resumed run after a restart. The states never leave the node except when the server asks for them
    (``collect_client_states``).
    """

    def __init__(self, context: Any, folder: Path | None, run: str) -> None:
        from flwr.app import ConfigRecord

        self.records = context.state
        self.folder = None
        if folder is not None and run:
            self.folder = folder / run / f"client-{int(context.node_config['partition-id'])}"
        elif _NODE not in self.records:
            self.records[_NODE] = ConfigRecord({"states": [""]})  # names of the states in context.state

    def names(self) -> list[str]:
        """The names of the states held."""
        if self.folder is not None:
            return sorted(p.name[:-len(".npz")] for p in self.folder.glob("*.npz")) if self.folder.is_dir() else []
        return [str(n) for n in self.records[_NODE]["states"] if n]

    def get(self, name: str) -> Any:
        """The state called ``name`` (:class:`_LostState` if it is not held)."""
        if self.folder is not None:
            try:
                return load_tree(self.folder / f"{name}.npz")
            except InputError as e:
                raise _LostState(f"lost its state of round {name.replace('.', ', slot ')} ({e.message})") from None
        if name not in self.names():
            raise _LostState(f"lost its state of round {name.replace('.', ', slot ')}")
        return _get_tree(self.records, f"{_STATE}.{name}")

    def put(self, name: str, tree: Any) -> None:
        """Keep ``tree`` as ``name`` (replacing a state of that name)."""
        if self.folder is not None:
            save_tree(self.folder / f"{name}.npz", tree)
            return
        _put_tree(self.records, f"{_STATE}.{name}", tree)
        names = self.names()
        if name not in names:
            self.records[_NODE]["states"] = [*names, name]

    def drop(self, name: str) -> None:
        """Forget the state called ``name``."""
        if self.folder is not None:
            (self.folder / f"{name}.npz").unlink(missing_ok=True)
            return
        _drop_tree(self.records, f"{_STATE}.{name}")
        self.records[_NODE]["states"] = [n for n in self.names() if n != name] or [""]

    def adopt(self, token: list[Any], epoch: int) -> Any:
        """The state the server named (``None`` for none); forget every other state of a round before ``epoch``."""
        name = _state_name(*token) if token else None
        state = self.get(name) if name is not None else None
        for other in self.names():
            if other != name and int(other.split(".")[0]) < epoch:
                self.drop(other)
        return state


def _node_hello(message: Any, context: Any, state_dir: str | None, algorithm_path: str) -> Any:
    from flwr.app import ConfigRecord, Message, RecordDict

    partition = int(context.node_config["partition-id"])
    hello: dict[str, Any] = {"partition": partition, "state_dir": _node_folder(context, state_dir) is not None}
    folder = _node_data_dir(context)
    if folder is not None:  # a node that cannot read its client says so before the first round
        try:
            _node_client(folder, partition)
        except InputError as e:  # the details (which could quote the data) stay in the node's log
            log.error("this SuperNode cannot read its client: %s", e)
            file = Path(e.path).name if e.path else folder.name
            hello["error"] = f"cannot read its client from {folder} ({file}; the SuperNode's log says why)"
    elif _load(algorithm_path)[1] is None:
        hello["error"] = f"has no data folder (start it with --node-config \"... {DATA_DIR_KEY}='<folder>'\")"
    return Message(RecordDict({"privasr.hello": ConfigRecord(hello)}), reply_to=message)


def _node_state(message: Any, context: Any, state_dir: str | None) -> Any:
    from flwr.app import ConfigRecord, Message, RecordDict

    req = message.content["privasr.task"]
    store = _NodeStates(context, _node_folder(context, state_dir), str(req.get("run", "")))
    out = RecordDict()
    token = list(req["accepted"])
    try:
        state = store.adopt(token, int(req["epoch"]))
    except _LostState as e:
        out["privasr.has_state"] = ConfigRecord({"has": False, "error": str(e)})
        return Message(out, reply_to=message)
    out["privasr.has_state"] = ConfigRecord({"has": bool(token)})
    if token:
        _put_tree(out, "privasr.state", state)
    return Message(out, reply_to=message)


def make_client_app(algorithm_path: str | os.PathLike[str],
                    state_dir: str | os.PathLike[str] | None = None, *, secure: bool = False) -> Any:
    """A ``ClientApp`` running the algorithm pickled at ``algorithm_path`` as ``(algorithm, clients)``.

    Each SuperNode serves one client, ``context.node_config["partition-id"]``. A node started with a data folder
    (``flower-supernode --node-config "partition-id=3 ... privasr-data-dir='/data/privasr'"``, a
    :func:`~privasr.federated.client_store.save_client` folder) reads its client from that folder and nothing
    else; ``clients`` is then ``None`` (deployment: the pickle holds the public model and settings only). Nodes
    without one (the simulation's virtual SuperNodes) serve ``clients[partition-id]`` from the pickle. Both are
    read once per process.
    ``secure=True`` adds Flower's ``secaggplus_mod``, for runs with secure aggregation (every ``train`` message
    is then a SecAgg+ stage).

    A checkpointed run keeps each client's states in files under the node's own folder: its node config's
    ``privasr-state-dir`` (``flower-supernode --node-config "... privasr-state-dir='/var/lib/privasr'"``), or
    ``state_dir`` for nodes without one (the simulation's virtual SuperNodes); see :class:`_NodeStates`.
    """
    _flwr()
    from flwr.clientapp import ClientApp

    path = str(algorithm_path)
    folder = None if state_dir is None else str(state_dir)
    if secure:
        from flwr.client.mod import secaggplus_mod

        app = ClientApp(mods=[secaggplus_mod])
    else:
        app = ClientApp()

    @app.train()
    def train(message: Any, context: Any) -> Any:
        return _node_train(message, context, path, folder)

    @app.query("privasr_hello")
    def hello(message: Any, context: Any) -> Any:
        return _node_hello(message, context, folder, path)

    @app.query("privasr_state")
    def state(message: Any, context: Any) -> Any:
        return _node_state(message, context, folder)

    return app


# -- the server side -------------------------------------------------------------------------------------------


def _pull_until(grid: Any, waiting: dict[str, Any], deadline: float | None, poll: float) -> Iterator[Any]:
    """Yield replies to the messages in ``waiting`` (removing them) until all came or ``deadline`` passed."""
    sleep = min(0.02, poll)
    while waiting:
        got = False
        for reply in grid.pull_messages(list(waiting)):
            if reply.metadata.reply_to_message_id in waiting:
                got = True
                yield reply
        if not waiting or (deadline is not None and time.monotonic() >= deadline):
            return
        sleep = min(0.02, poll) if got else min(poll, sleep * 1.5)
        time.sleep(sleep if deadline is None else max(0.0, min(sleep, deadline - time.monotonic())))


def _push(grid: Any, message: Any) -> str | None:
    ids = [str(i) for i in grid.push_messages([message]) if i]
    return ids[0] if ids else None


def discover_nodes(grid: Any, n: int, wait: float = 120.0, poll: float = 0.2, *,
                   need_state_dir: bool = False) -> dict[int, int]:
    """Map client index (the SuperNodes' ``partition-id``) to Flower node id, waiting for ``n`` nodes.

    With ``need_state_dir`` (a checkpointed run) every node must have a state folder to keep its client's
    states in (:func:`make_client_app`), else :class:`~privasr.federated.core.FederatedError`.
    """
    _flwr()
    from flwr.app import ConfigRecord, Message, RecordDict

    deadline = time.monotonic() + wait
    while True:
        node_ids = [int(i) for i in grid.get_node_ids()]
        if len(node_ids) >= n:
            break
        if time.monotonic() >= deadline:
            raise FederatedError(f"only {len(node_ids)} of {n} SuperNodes connected within {wait:g} s")
        time.sleep(min(0.05, poll))
    waiting: dict[str, int] = {}
    for node in node_ids:
        msg = Message(RecordDict({"privasr.hello": ConfigRecord({})}), dst_node_id=node, message_type=HELLO)
        mid = _push(grid, msg)
        if mid is not None:
            waiting[mid] = node
    nodes: dict[int, int] = {}
    no_dir: list[int] = []
    for reply in _pull_until(grid, waiting, deadline, poll):
        node = waiting.pop(reply.metadata.reply_to_message_id)
        if reply.has_error():
            raise FederatedError(f"SuperNode {node} did not say which client it serves: {reply.error.reason}")
        hello = reply.content["privasr.hello"]
        part = int(hello["partition"])
        if "error" in hello:
            raise FederatedError(f"SuperNode {node} (client {part}) {hello['error']}")
        if part in nodes:
            raise FederatedError(f"two SuperNodes ({nodes[part]} and {node}) serve client {part}")
        nodes[part] = node
        if not bool(hello.get("state_dir", False)):
            no_dir.append(part)
    missing = sorted(set(range(n)) - set(nodes))
    if missing:
        raise FederatedError(f"no SuperNode answered for clients {missing[:10]} within {wait:g} s")
    if need_state_dir and no_dir:
        raise FederatedError(f"the SuperNodes of clients {sorted(no_dir)[:10]} have no state folder (node config "
                             f"{STATE_DIR_KEY}), so they could not serve a resumed run; a checkpointed run needs one "
                             "on every node")
    return nodes


class GridBackend:
    """A loop backend that sends each round's clients through a Flower ``Grid`` (see the module docstring).

    The client states the loop keeps (and checkpoints) are *tokens*, ``{"node_state": [round, slot]}``: they
    name the state the client computed in that round and slot, which stays on its node. Each message to a node
    carries its client's token, so the node adopts exactly the state the server's loop accepted.

    Args:
        grid: the ServerApp's ``Grid``.
        nodes: client index -> Flower node id (:func:`discover_nodes`).
        poll: the longest pause, in seconds, between two pulls of replies.
        first_round: the round of the first :meth:`run` (that of the checkpoint when a run is resumed).
        run_id: the checkpointed run's id (nodes keep its states in files under their state folder), or ``""``
            (nodes keep states in memory).
    """

    name = "flower"

    def __init__(self, grid: Any, nodes: Mapping[int, int], poll: float = 0.2, *, first_round: int = 0,
                 run_id: str = "", secagg: SecAggSettings | None = None) -> None:
        self.grid = grid
        self.nodes = dict(nodes)
        self.poll = poll
        self.epoch = int(first_round)  # the round of the next run()
        self.run_id = run_id
        self.secagg = secagg if secagg is not None and secagg.enabled else None
        self.last_secure: Any = None  # the last secure round's protocol outcome (stage timings, dropouts)

    def _task_record(self, index: int, epoch: int, token: Any, slots: Sequence[ClientTask] = ()) -> Any:
        from flwr.app import ConfigRecord

        rec: dict[str, Any] = {"index": index, "epoch": epoch, "accepted": _token_pair(token), "run": self.run_id,
                               "slots": [t.slot for t in slots]}
        for t in slots:
            rec[f"seed.{t.slot}"] = [int(v) for v in t.seed]
        return ConfigRecord(rec)

    def run(self, algorithm: Any, payload: Any, tasks: Sequence[ClientTask],
            timeout: float | None = None) -> Iterator[ClientOutcome]:
        """Send one message per sampled client and yield its outcomes as the replies arrive."""
        _flwr()
        from flwr.app import Message, RecordDict

        epoch = self.epoch
        self.epoch += 1
        if not tasks:
            return
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        payload_config, payload_arrays = pack_tree(payload)
        by_client: dict[int, list[ClientTask]] = {}
        for t in tasks:
            by_client.setdefault(t.index, []).append(t)
        waiting: dict[str, list[ClientTask]] = {}
        for index, ts in by_client.items():
            content = RecordDict({"privasr.task": self._task_record(index, epoch, ts[0].state, ts),
                                  "privasr.payload.tree": payload_config,
                                  "privasr.payload.arrays": payload_arrays})
            node = self.nodes.get(index)
            mid = None if node is None else _push(self.grid, Message(content, dst_node_id=node, message_type=TRAIN,
                                                                     group_id=str(epoch)))
            if mid is None:
                for t in ts:
                    yield ClientOutcome(t.slot, t.index, error="vanished: its SuperNode could not be reached")
                continue
            waiting[mid] = ts
        for reply in _pull_until(self.grid, waiting, deadline, self.poll):
            ts = waiting.pop(reply.metadata.reply_to_message_id)
            yield from self._outcomes(reply, ts, epoch)
        for ts in waiting.values():
            dt = time.monotonic() - t0
            for t in ts:
                yield ClientOutcome(t.slot, t.index, error=f"timed out ({dt:.3g} s > {timeout:g} s)", seconds=dt)

    def run_secure(self, algorithm: Any, payload: Any, tasks: Sequence[ClientTask], timeout: float | None = None,
                   noise: tuple[Mapping[str, Any], int] | None = None) -> tuple[list[ClientOutcome], Any, float]:
        """One round with secure aggregation (:mod:`~privasr.federated.backends.flower_secagg`).

        Returns the per-slot outcomes (a successful slot carries its state token but no update: the server
        never sees one), the round's accumulator built from the unmasked sum (``None`` when nothing was
        summed) and the number of values the clients clipped to the bound. ``noise``: the mechanism's spec and
        the number of shares, when each client adds a share of the DP noise.
        """
        _flwr()
        from flwr.app import RecordDict

        assert self.secagg is not None
        epoch = self.epoch
        self.epoch += 1
        by_client: dict[int, list[ClientTask]] = {}
        for t in tasks:
            by_client.setdefault(t.index, []).append(t)
        if len(by_client) < self.secagg.min_cohort:
            why = f"not aggregated: the round's cohort of {len(by_client)} clients is below min_cohort=" \
                  f"{self.secagg.min_cohort}"
            return [ClientOutcome(t.slot, t.index, error=why) for t in tasks], None, 0.0
        payload_config, payload_arrays = pack_tree(payload)
        secure = secure_task(self.secagg, algorithm, noise)
        contents: dict[int, Any] = {}
        by_node: dict[int, list[ClientTask]] = {}
        outs: list[ClientOutcome] = []
        for index, ts in by_client.items():
            node = self.nodes.get(index)
            if node is None:
                outs.extend(ClientOutcome(t.slot, t.index, error="vanished: its SuperNode could not be reached")
                            for t in ts)
                continue
            contents[node] = RecordDict({"privasr.task": self._task_record(index, epoch, ts[0].state, ts),
                                         "privasr.payload.tree": payload_config,
                                         "privasr.payload.arrays": payload_arrays, SECURE: secure})
            by_node[node] = ts
        wait = self.secagg.timeout if self.secagg.timeout is not None else timeout
        result = secure_round(self.grid, contents, self.secagg, epoch, timeout=wait,
                              max_slots=max((len(ts) for ts in by_node.values()), default=1))
        self.last_secure = result
        more, count, layouts = outcomes_of(result, by_node, epoch, _token)
        acc, clipped = decode_round(algorithm, result, layouts, count)
        return outs + more, acc, clipped

    @staticmethod
    def _outcomes(reply: Any, tasks: Sequence[ClientTask], epoch: int) -> list[ClientOutcome]:
        if reply.has_error():
            reason = str(reply.error.reason).splitlines()[0] if reply.error.reason else ""
            return [ClientOutcome(t.slot, t.index, error=f"vanished: Flower error {reply.error.code}: {reason}")
                    for t in tasks]
        content = reply.content
        outs = []
        for t in tasks:
            res = content.get(f"privasr.result.{t.slot}")
            failed = failed_slot(res, t, "no update in the reply")
            if failed is not None:
                outs.append(failed)
            else:
                try:  # the server checks what arrives as the client did: numbers only
                    arrays = {k: v.numpy() for k, v in content[f"privasr.update.{t.slot}"].items()}
                    update = Update(arrays, weight=float(res["weight"]),
                                    metrics=dict(content[f"privasr.metrics.{t.slot}"]))
                except (InputError, KeyError, TypeError, ValueError) as e:
                    outs.append(ClientOutcome(t.slot, t.index, error=f"sent an invalid update: {e}"))
                    continue
                outs.append(ClientOutcome(t.slot, t.index, update, _token(epoch, t.slot), seconds=float(res["seconds"])))
        return outs

    def collect_states(self, tokens: Mapping[int, Any], wait: float = 60.0) -> dict[int, Any]:
        """Ask every node for the state its client's token (the loop's ``client_states``) names; clients that
        never reported are left out."""
        _flwr()
        from flwr.app import Message, RecordDict

        waiting: dict[str, int] = {}
        for index, node in sorted(self.nodes.items()):
            content = RecordDict({"privasr.task": self._task_record(index, self.epoch, tokens.get(index))})
            mid = _push(self.grid, Message(content, dst_node_id=node, message_type=STATE))
            if mid is not None:
                waiting[mid] = index
        states: dict[int, Any] = {}
        for reply in _pull_until(self.grid, waiting, time.monotonic() + wait, self.poll):
            index = waiting.pop(reply.metadata.reply_to_message_id)
            if reply.has_error():
                raise FederatedError(f"client {index}'s SuperNode did not send its state: {reply.error.reason}")
            if "error" in reply.content["privasr.has_state"]:
                raise FederatedError(f"client {index}'s SuperNode {reply.content['privasr.has_state']['error']}")
            if reply.content["privasr.has_state"]["has"]:
                states[index] = _get_tree(reply.content, "privasr.state")
        if waiting:
            raise FederatedError(f"clients {sorted(waiting.values())[:10]} did not send their state in {wait:g} s")
        return states

    def close(self) -> None:
        """Nothing to release (Flower owns the grid)."""


def _token(round: int, slot: int) -> dict[str, Any]:
    """The loop's client state on Flower: the name of the state that stays on the node."""
    return {"node_state": [int(round), int(slot)]}


def _token_pair(token: Any) -> list[int]:
    """``[round, slot]`` of a :func:`_token`, or ``[]`` for none."""
    if token is None:
        return []
    if not (isinstance(token, dict) and "node_state" in token and len(token["node_state"]) == 2):
        raise FederatedError("a Flower run's client state is not a reference to a state on a node: the loop was "
                             "given client states from elsewhere")
    return [int(v) for v in token["node_state"]]


@dataclass
class _ServerSpec:
    """Everything the ServerApp needs (pickled to a file in deployment mode)."""

    algorithm: Any
    n_clients: int
    rounds: int
    sampler: Any
    seed: int
    min_clients: int
    client_timeout: float | None
    privacy: PrivacySettings | None
    on_round: Callable[..., None] | None
    collect_client_states: bool
    node_wait: float
    poll: float
    checkpoint_dir: str | None = None  # absolute: the ServerApp may run in another process
    resume: bool = False
    key: Any = None
    secagg: SecAggSettings | None = None


def _checkpoint_round(path: Path) -> int:
    """The number of rounds done in the checkpoint at ``path`` (0 if there is none or it is unreadable: the
    loop then reports it)."""
    try:
        saved = load_tree(path)
        return int(saved["round"]) if isinstance(saved, dict) else 0
    except (InputError, KeyError, TypeError, ValueError):
        return 0


def _serve(grid: Any, spec: _ServerSpec) -> FederatedResult:
    # a Flower checkpoint holds references to states on the nodes, not the states: it cannot continue on
    # local or ray (nor they on Flower), so the backend is part of the run's identity
    key = {"backend": "flower", "key": spec.key}
    if spec.secagg is not None and spec.secagg.enabled:  # another aggregation is another run
        key["secagg"] = spec.secagg.to_dict()
    run_id, first_round = "", 0
    if spec.checkpoint_dir is not None:
        run_id = hashlib.sha256(_run_key(spec.algorithm, spec.n_clients, spec.sampler, spec.seed, spec.privacy,
                                         key).encode("utf-8")).hexdigest()[:24]
        if spec.resume:
            first_round = _checkpoint_round(Path(spec.checkpoint_dir) / CHECKPOINT_NAME)
    nodes = discover_nodes(grid, spec.n_clients, spec.node_wait, spec.poll,
                           need_state_dir=spec.checkpoint_dir is not None)
    backend = GridBackend(grid, nodes, poll=spec.poll, first_round=first_round, run_id=run_id, secagg=spec.secagg)
    result = run_federated(spec.algorithm, [None] * spec.n_clients, rounds=spec.rounds, sampler=spec.sampler,
                           backend=backend, seed=spec.seed, min_clients=spec.min_clients,
                           client_timeout=spec.client_timeout, privacy=spec.privacy,
                           checkpoint_dir=spec.checkpoint_dir, resume=spec.resume, key=key, on_round=spec.on_round)
    tokens = result.client_states
    result.client_states = backend.collect_states(tokens, spec.node_wait) if spec.collect_client_states else {}
    return result


def make_server_app(spec: _ServerSpec, sink: Callable[[Any], None]) -> Any:
    """A ``ServerApp`` running the federated loop of ``spec`` over the grid and passing the result (or the
    exception that stopped it) to ``sink``."""
    _flwr()
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        try:
            result: FederatedResult | BaseException = _serve(grid, spec)
        except Exception as e:  # handed to run_flower, which raises it (Flower would only log it)
            result = e
        sink(result)

    return app


def deployment_server_app(spec_path: str | os.PathLike[str], result_path: str | os.PathLike[str]) -> Any:
    """The ServerApp of a deployment run: reads the pickled spec, writes the pickled outcome (or error)."""
    _flwr()
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: Any, context: Any) -> None:
        nonlocal result_path
        kit = str(context.run_config.get("kit", "") or "") if context.run_config is not None else ""
        spec_file = str(spec_path)
        if kit:  # a kit run where it lies now (kits can be moved): its files, not the paths it was written with
            spec_file, result_path = str(Path(kit) / "server.pkl"), str(Path(kit) / "result.pkl")
        try:
            spec = _load(spec_file)
            if kit and spec.checkpoint_dir is not None:
                spec.checkpoint_dir = str(Path(kit) / "checkpoint")
            result = _serve(grid, spec)
            accountant = spec.privacy.accountant.state_dict() if spec.privacy is not None else None
            outcome: dict[str, Any] = {"ok": True, "result": result, "accountant": accountant}
        except Exception as e:
            outcome = {"ok": False, "error": f"{type(e).__name__}: {e}", "federated": isinstance(e, FederatedError),
                       "message": str(e), "traceback": traceback.format_exc()}
        tmp = Path(str(result_path) + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(outcome, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, result_path)
        if not outcome["ok"]:
            raise FederatedError(outcome["error"])

    return app


# -- run_flower --------------------------------------------------------------------------------------------------


def run_flower(
    algorithm: Any,
    clients: Sequence[Any],
    *,
    rounds: int,
    sampler: Any,
    seed: int = 0,
    min_clients: int = 1,
    client_timeout: float | None = None,
    privacy: PrivacySettings | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    key: Any = None,
    node_state_dir: str | os.PathLike[str] | None = None,
    mode: str = "simulation",
    collect_client_states: bool = True,
    on_round: Callable[..., None] | None = None,
    backend_config: Mapping[str, Any] | None = None,
    node_wait: float = 120.0,
    run_timeout: float | None = None,
    quiet: bool = True,
    keep_workdir: bool = False,
    secagg: SecAggSettings | None = None,
) -> FederatedResult:
    """Run ``rounds`` rounds of ``algorithm`` over ``clients`` through Flower (see the module docstring).

    Args:
        algorithm: a :class:`~privasr.federated.core.FederatedAlgorithm` (picklable: it is shipped to the nodes).
        clients: the population; SuperNode ``i`` serves ``clients[i]``. In deployment mode each client is
            written to its node's own folder without pickle (:func:`~privasr.federated.client_store.save_client`:
            ``FmpClient``, ``FedLmClient``, ``FtlClient`` or pytrees of numbers, strings and numeric arrays).
        rounds: the total number of rounds (a resumed run continues up to it).
        sampler: a :mod:`privasr.federated.sampling` sampler.
        seed: seeds every random draw, as in :func:`~privasr.federated.loop.run_federated`.
        min_clients: as in :func:`~privasr.federated.loop.run_federated`: without DP a round with fewer
            successful clients fails (:class:`~privasr.federated.core.FederatedError`); with the server's DP
            noise it must be 1; with distributed noise it is the number of noise shares.
        client_timeout: seconds after a round's messages are sent after which a missing reply is dropped.
        privacy: differential privacy (:class:`~privasr.federated.loop.PrivacySettings`); in deployment mode the
            accountant is stepped in the ServerApp process and its state is loaded back into ``privacy.accountant``.
        checkpoint_dir: the ServerApp writes the loop's ``state.npz`` there after every round (server state,
            accountant, history and, per client, the name of its state on its node); the nodes keep their
            clients' states in files under ``node_state_dir``.
        resume: continue from ``checkpoint_dir/state.npz`` if it exists (it must come from the same Flower run:
            same arguments and ``key``); the nodes reload the states it names.
        key: anything JSON-able that identifies the run's data and settings (as for ``run_federated``).
        node_state_dir: with ``checkpoint_dir``: the folder standing for the nodes' own disks, where node ``i``
            keeps its client's states (``<node_state_dir>/<run id>/client-<i>/``); default
            ``checkpoint_dir/nodes``.
        mode: ``"simulation"`` or ``"deployment"``.
        collect_client_states: ask the nodes for their states at the end (``FederatedResult.client_states``);
            otherwise that dict is empty.
        on_round: called with each round's :class:`~privasr.federated.loop.RoundLog` and state (simulation only).
        backend_config: simulation only: Flower's ``backend_config``, merged over the defaults (one CPU per
            ClientApp actor, a quiet Ray with ``os.cpu_count()`` CPUs).
        node_wait: seconds to wait for the SuperNodes to connect and for the final state collection.
        run_timeout: deployment only: seconds the whole run may take (``None``: no limit).
        quiet: keep Flower's log messages below ERROR out of the console during the run.
        keep_workdir: deployment only: keep the temporary folder (app, pickles, client folders, credentials with
            their private keys, logs) whatever the outcome; otherwise it is removed after a success and all but
            the logs are removed after a failure.
        secagg: secure aggregation (:class:`~privasr.federated.secagg.SecAggSettings` with ``enabled=True``):
            every round's updates are summed with Flower's SecAgg+, so the server sees only the sum; with
            ``noise="distributed"`` each client adds a share of ``privacy``'s noise.

    Returns:
        A :class:`~privasr.federated.loop.FederatedResult` like :func:`~privasr.federated.loop.run_federated`'s.
    """
    _check_flower_arguments(clients, rounds, min_clients, client_timeout, checkpoint_dir, node_state_dir,
                            mode, on_round, backend_config, sampler)
    secagg = check_secagg(secagg, algorithm, sampler, len(clients), privacy)
    ckpt, nodes_dir = _state_dirs(checkpoint_dir, node_state_dir)
    _flwr()
    from privasr.federated.backends.ray import ship_by_value

    clients = list(clients)
    ship_by_value(algorithm, sampler, *(c for c in clients[:1]), on_round,
                  *((privacy.mechanism, privacy.accountant) if privacy is not None else ()))
    spec = _ServerSpec(algorithm, len(clients), rounds, sampler, int(seed), min_clients, client_timeout, privacy,
                       on_round, collect_client_states, float(node_wait), 0.2,
                       None if ckpt is None else str(ckpt), bool(resume), key, secagg)
    with flower_log_level(logging.ERROR) if quiet else nullcontext():
        if mode == "simulation":
            return _run_simulation(spec, clients, backend_config, nodes_dir)
        if resume and ckpt is not None and _checkpoint_round(ckpt / CHECKPOINT_NAME):  # the loop runs elsewhere
            progress.note(f"resuming from round {_checkpoint_round(ckpt / CHECKPOINT_NAME)} (checkpoint {ckpt})")
        return _run_deployment(spec, clients, nodes_dir, run_timeout=run_timeout, keep_workdir=keep_workdir)


def _check_flower_arguments(clients: Sequence[Any], rounds: Any, min_clients: Any, client_timeout: Any,
                            checkpoint_dir: Any, node_state_dir: Any, mode: str, on_round: Any,
                            backend_config: Any, sampler: Any = None) -> None:
    """The checks :func:`run_flower` makes before starting anything."""
    if mode not in FLOWER_MODES:
        raise ConfigError(f"mode={mode!r}", expected=f"one of {', '.join(FLOWER_MODES)}")
    check_run_arguments(clients, rounds, min_clients, client_timeout, sampler)
    if mode == "deployment" and on_round is not None:
        raise ConfigError("on_round is not supported in deployment mode (the ServerApp runs in another process)")
    if mode == "deployment" and backend_config is not None:
        raise ConfigError("backend_config configures the simulation engine", expected='mode="simulation"')
    if node_state_dir is not None and checkpoint_dir is None:
        raise ConfigError("node_state_dir is where nodes keep states for a resumed run", expected="checkpoint_dir")


def check_secagg(secagg: Any, algorithm: Any, sampler: Any, n_clients: int, privacy: PrivacySettings | None
                 ) -> SecAggSettings | None:
    """The run's secure aggregation settings, checked before anything starts (``None`` when off).

    The algorithm must be able to bound its updates (``secure_bound``), the sampler's cohorts must fit
    ``[min_cohort, max_cohort]`` (Poisson cohorts vary: they are checked every round), and distributed noise
    needs differential privacy.
    """
    if secagg is None:
        return None
    if not isinstance(secagg, SecAggSettings):
        raise ConfigError(f"secagg is a {type(secagg).__name__}", expected="a SecAggSettings or None")
    if not secagg.enabled:
        return None
    if not hasattr(algorithm, "secure_summand"):
        raise ConfigError(f"{type(algorithm).__name__} cannot be aggregated securely",
                          expected="an algorithm with secure_summand/from_secure_sum (FMP, fedlm, FTL)")
    algorithm.secure_bound(secagg.bound)  # raises ConfigError when the updates cannot be bounded
    kind = getattr(sampler, "kind", None)
    if kind == "all":
        secagg.check_cohort(n_clients)
    elif kind in ("without_replacement", "with_replacement"):
        secagg.check_cohort(min(int(sampler.n), n_clients) if kind == "without_replacement" else int(sampler.n))
    if secagg.noise == "distributed" and privacy is None:
        raise ConfigError("secagg.noise='distributed' without differential privacy",
                          expected="privacy settings whose noise the clients share, or noise='server'")
    return secagg


def _state_dirs(checkpoint_dir: str | os.PathLike[str] | None, node_state_dir: str | os.PathLike[str] | None
                ) -> tuple[Path | None, Path | None]:
    """The checkpoint folder and the folder of the nodes' states (default ``checkpoint_dir/nodes``), absolute and
    created here (in deployment the ServerApp runs elsewhere); both ``None`` without ``checkpoint_dir``."""
    if checkpoint_dir is None:
        return None, None
    ckpt = Path(checkpoint_dir).expanduser().resolve()
    nodes_dir = Path(node_state_dir).expanduser().resolve() if node_state_dir is not None else ckpt / "nodes"
    if any(c in str(nodes_dir) for c in "'\n\r"):
        raise ConfigError(f"node_state_dir={str(nodes_dir)!r}", expected="a path without quotes or newlines")
    ckpt.mkdir(parents=True, exist_ok=True)
    nodes_dir.mkdir(parents=True, exist_ok=True)
    return ckpt, nodes_dir


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _run_simulation(spec: _ServerSpec, clients: list[Any], backend_config: Mapping[str, Any] | None,
                    nodes_dir: Path | None) -> FederatedResult:
    from flwr.simulation import run_simulation

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    config = _merge({"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                     "init_args": {"num_cpus": os.cpu_count() or 1, "include_dashboard": False,
                                   "log_to_driver": False, "logging_level": "ERROR"}},
                    backend_config or {})
    results: list[Any] = []
    pythonpath = os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory(prefix="privasr-flower-") as work:
        data_path = Path(work) / "clients.pkl"
        _dump(data_path, (spec.algorithm, clients))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # Ray's notice about accelerator variables
                run_simulation(server_app=make_server_app(spec, results.append),
                               client_app=make_client_app(data_path, nodes_dir, secure=spec.secagg is not None),
                               num_supernodes=len(clients),
                               backend_config=config)  # type: ignore[arg-type]
        finally:  # Flower's Ray backend exports this process's sys.path as PYTHONPATH
            if pythonpath is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = pythonpath
    if not results:
        raise FederatedError("the Flower simulation ended without a result")
    if isinstance(results[0], BaseException):
        raise results[0]
    return results[0]
