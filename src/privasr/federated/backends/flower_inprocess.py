"""Flower's ``Grid`` in one process: the real ``ClientApp`` answers every message, and every byte is counted.

:class:`InProcessGrid` stands where a SuperLink and its SuperNodes would be, for tests and benchmarks of the
ServerApp's logic (:class:`~privasr.federated.backends.flower.GridBackend`, the SecAgg+ stages of
:mod:`~privasr.federated.backends.flower_secagg`) without processes or sockets:

* each of its ``n`` nodes has its own Flower ``Context`` (node id ``9000 + 7 i``, node config
  ``partition-id = i``), whose ``state`` persists across messages as on a SuperNode;
* every message crosses "the wire" as it would between processes: serialised with Flower's own protobuf
  serialisation (``flwr.common.serde.message_to_proto``), parsed again on the other side, so a node never
  shares an object with the server (Flower's ``secaggplus_mod`` edits the content it is given), and the
  serialised size of the content is what it costs on the network (framing and the metadata, about 70 bytes
  aside);
* a ``ClientApp`` that raises gives an error reply, as Flower's runtime does;
* ``crash``: ``(group_id, partition)`` pairs whose node goes offline in the SecAgg+ ``collect masked
  vectors`` stage of that round (after the key exchange), as a device that dies mid-round;
* it answers ``push_messages``/``pull_messages`` (what :class:`~privasr.federated.backends.flower.GridBackend`
  uses for plain rounds) and ``send_and_receive`` (what Flower's ``SecAggPlusWorkflow`` uses), synchronously:
  a message is answered when it is pushed.

Every exchange is recorded as an :class:`Exchange` (bytes down, bytes up, the node's seconds, the SecAgg+
stage); with ``keep_messages`` (the default) also the server's message and the reply it got, in ``log``.

Flower creates a server's messages with the identity of the running task (``TaskIdentity``), which its runtime
sets; in one process :func:`task_identity` sets it for the duration of a ``with`` block.

>>> from flwr.app import ConfigRecord, Message, RecordDict
>>> from flwr.clientapp import ClientApp
>>> app = ClientApp()
>>> @app.query("echo")
... def echo(message, context):
...     text = str(message.content["q"]["text"])
...     return Message(RecordDict({"a": ConfigRecord({"text": text * 2})}), reply_to=message)
>>> grid = InProcessGrid(app, 2)
>>> with task_identity():
...     msg = Message(RecordDict({"q": ConfigRecord({"text": "ab"})}), dst_node_id=grid.get_node_ids()[1],
...                   message_type="query.echo")
...     reply, = grid.send_and_receive([msg])
>>> str(reply.content["a"]["text"]), reply.metadata.src_node_id
('abab', 9007)
>>> x = grid.exchanges[0]
>>> x.partition, x.message_type, x.bytes_down < x.bytes_up, x.error
(1, 'query.echo', True, '')
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["InProcessGrid", "Exchange", "task_identity", "run_inprocess", "serve_inprocess", "SECAGG_STAGES"]

SECAGG_STAGES = ("setup", "share_keys", "collect_masked_vectors", "unmask")
"""The SecAgg+ stages as Flower names them in its messages (``secaggplus_configs["stage"]``)."""

_CONFIGS = "secaggplus_configs"  # Flower's record of the protocol's messages (flwr.common.constant)


@dataclass(frozen=True)
class Exchange:
    """One message to a node and the reply.

    Attributes:
        node: the node's id.
        partition: the node's ``partition-id`` (the client it serves).
        message_type: the message's type (``train``, ``query.privasr_hello``, ...).
        group_id: the message's group (privasr: the round).
        stage: the SecAgg+ stage of a secure round's message (:data:`SECAGG_STAGES`), else ``""``.
        bytes_down: the serialised size of the message's content (server to node).
        bytes_up: the serialised size of the reply's content (node to server; 0 for an error reply).
        node_s: seconds the ``ClientApp`` took to answer (its mods and handler; not the serialisation).
        error: the error reply's reason, or ``""``.
    """

    node: int
    partition: int
    message_type: str
    group_id: str
    stage: str
    bytes_down: int
    bytes_up: int
    node_s: float
    error: str


@contextmanager
def task_identity(run_id: int = 1, node_id: int = 0, task_id: int = 1) -> Iterator[None]:
    """Set Flower's ``TaskIdentity`` (which it reads to create a server's messages) for a ``with`` block, and
    restore the previous one after it.

    >>> from flwr.supercore.task_identity import TaskIdentity
    >>> with task_identity(run_id=5):
    ...     TaskIdentity.run_id
    5
    """
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, task_id
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class InProcessGrid:
    """A Flower ``Grid`` whose ``n`` nodes run ``app`` in this process (see the module docstring).

    Args:
        app: the ``ClientApp`` every node runs.
        n: the number of nodes; node ``i`` serves partition ``i``.
        crash: ``(group_id, partition)`` pairs: that node goes offline in the ``collect masked vectors`` stage
            of the secure round of that group (its reply is an error, ``ConnectionError``).
        keep_messages: keep every exchange's server message and reply in :attr:`log` (large for big payloads).

    Attributes:
        exchanges: every :class:`Exchange`, in order.
        log: ``(message, reply)`` of every exchange as the server sent and received them (with
            ``keep_messages``).
    """

    def __init__(self, app: Any, n: int, crash: Iterable[tuple[Any, int]] = (), *,
                 keep_messages: bool = True) -> None:
        from flwr.app import Context, RecordDict

        self.app = app
        self.node_of = {i: 9000 + 7 * i for i in range(int(n))}
        self.partition = {v: k for k, v in self.node_of.items()}
        self.contexts = {node: Context(run_id=1, node_id=node, node_config={"partition-id": i, "num-partitions": n},
                                       state=RecordDict(), run_config={}) for i, node in self.node_of.items()}
        self.crash = {(str(g), int(i)) for g, i in crash}
        self.keep_messages = keep_messages
        self.exchanges: list[Exchange] = []
        self.log: list[tuple[Any, Any]] = []
        self._replies: dict[str, Any] = {}

    def get_node_ids(self) -> list[int]:
        """The node ids."""
        return list(self.contexts)

    def _handle(self, message: Any) -> tuple[str, Any]:
        from flwr.app import Error, Message
        from flwr.common.serde import message_from_proto, message_to_proto

        mid = uuid.uuid4().hex
        message.metadata.__dict__["_message_id"] = mid  # what the SuperLink does on a push
        node = int(message.metadata.dst_node_id)
        if node not in self.contexts:
            raise ValueError(f"no node {node} in this grid (nodes {sorted(self.contexts)})")
        part = self.partition[node]
        wire = message_to_proto(message)
        down = wire.content.ByteSize() if wire.HasField("content") else 0
        stage = ""
        if message.has_content() and _CONFIGS in message.content.config_records:
            stage = str(message.content.config_records[_CONFIGS].get("stage", ""))
        t0 = time.perf_counter()
        try:
            if stage == "collect_masked_vectors" and (message.metadata.group_id, part) in self.crash:
                raise ConnectionError("the device went offline")
            reply = self.app(message_from_proto(wire), self.contexts[node])  # the node's own copy
        except Exception as e:  # Flower's runtime turns a ClientApp's exception into an error reply
            reply = Message(Error(code=2, reason=f"{type(e)}:<'{e}'>"), reply_to=message)
        seconds = time.perf_counter() - t0
        reply.metadata.__dict__["_src_node_id"] = node
        reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
        back = message_to_proto(reply)
        up = back.content.ByteSize() if back.HasField("content") else 0
        reply = message_from_proto(back)  # the server's copy
        error = str(reply.error.reason or "") if reply.has_error() else ""
        self.exchanges.append(Exchange(node, part, str(message.metadata.message_type),
                                       str(message.metadata.group_id), stage, down, up, seconds, error))
        if self.keep_messages:
            self.log.append((message, reply))
        return mid, reply

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        """Deliver ``messages`` (each is answered now); their ids, for :meth:`pull_messages`."""
        ids = []
        for m in messages:
            mid, reply = self._handle(m)
            self._replies[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        """The replies to the pushed messages ``message_ids`` not pulled yet."""
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        """Deliver ``messages`` and return their replies (``timeout`` is moot: every node answers at once)."""
        return [self._handle(m)[1] for m in messages]

    def exchanges_of(self, group_id: Any, message_type: str = "train") -> Sequence[Exchange]:
        """The exchanges of one round (``group_id``) and message type.

        >>> InProcessGrid(None, 1).exchanges_of(0)
        []
        """
        return [x for x in self.exchanges if x.group_id == str(group_id) and x.message_type == message_type]


def serve_inprocess(app: Any, n: int, algorithm: Any, *, rounds: int, sampler: Any, seed: int = 0,
                    min_clients: int = 1, privacy: Any = None, secagg: Any = None,
                    client_timeout: float | None = None, client_states: bool = False,
                    checkpoint_dir: Any = None, key: Any = None) -> tuple[Any, InProcessGrid]:
    """The ServerApp's whole loop (:func:`~privasr.federated.backends.flower._serve`) over an :class:`InProcessGrid`
    of ``n`` nodes answered by ``app`` (a ``ClientApp``, or any ``app(message, context)``: e.g. privasr devices,
    :func:`privasr.device.node.dispatch`), with Flower's log at warnings only.

    Args:
        checkpoint_dir: the server's checkpoint folder (the run then resumes from it and its nodes keep their
            states in files); ``None``: no checkpoint.
        key: the run's identity in the checkpoint.
        client_states: collect the clients' states from the nodes at the end.

    Returns:
        The :class:`~privasr.federated.loop.FederatedResult` and the grid (its :attr:`InProcessGrid.exchanges`).

    Raises:
        ConfigError: the loop's and the secure aggregation's checks.
    """
    from privasr.federated.backends.flower import _serve, _ServerSpec, check_secagg, flower_log_level

    secure = check_secagg(secagg, algorithm, sampler, n, privacy)
    with flower_log_level(logging.WARNING), task_identity():  # Flower logs every SecAgg+ stage of every node
        grid = InProcessGrid(app, n, keep_messages=False)
        spec = _ServerSpec(algorithm, n, rounds, sampler, int(seed), min_clients, client_timeout, privacy, None,
                           client_states, 5.0, 0.01, None if checkpoint_dir is None else str(checkpoint_dir),
                           checkpoint_dir is not None, key, secure)
        return _serve(grid, spec), grid


def run_inprocess(algorithm: Any, clients: Sequence[Any], *, rounds: int, sampler: Any, workdir: Any,
                  seed: int = 0, min_clients: int = 1, privacy: Any = None, secagg: Any = None,
                  client_timeout: float | None = None, client_states: bool = False) -> Any:
    """The ServerApp's whole loop over an :class:`InProcessGrid`: Flower's real ``ClientApp`` (with
    ``secaggplus_mod`` when ``secagg`` is enabled) answering every message in this process, one node per client.

    What :func:`~privasr.federated.backends.flower.run_flower` runs, without Ray, processes or sockets: for tests
    and audits that need many short runs of the real protocol (e.g. the DP membership games of
    :mod:`privasr.federated.dp_games` under SecAgg+ with distributed noise). The clients are written to a file
    under ``workdir`` for the ClientApp, as the simulation does; the client states stay on the grid's nodes
    (:func:`serve_inprocess`).

    Returns:
        The :class:`~privasr.federated.loop.FederatedResult` (client states collected from the nodes only with
        ``client_states``).

    Raises:
        ConfigError: the loop's and the secure aggregation's checks.
    """
    from pathlib import Path

    from privasr.federated.backends.flower import check_secagg, make_client_app
    from privasr.federated.backends.flower_deploy import _dump

    secure = check_secagg(secagg, algorithm, sampler, len(clients), privacy)
    path = Path(workdir) / f"clients-{uuid.uuid4().hex}.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    _dump(path, (algorithm, list(clients)))
    try:
        result, _ = serve_inprocess(make_client_app(path, None, secure=secure is not None), len(clients),
                                    algorithm, rounds=rounds, sampler=sampler, seed=seed,
                                    min_clients=min_clients, privacy=privacy, secagg=secagg,
                                    client_timeout=client_timeout, client_states=client_states)
        return result
    finally:
        path.unlink(missing_ok=True)
