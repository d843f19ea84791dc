"""Secure aggregation on Flower: one round of SecAgg+ through a ``Grid``, and a node's share of it.

The protocol is Flower's own. The server runs the four stages of ``flwr.server.workflow.SecAggPlusWorkflow``
(``setup``, ``share keys``, ``collect masked vectors``, ``unmask``) for each round, through the round's
``Grid``; the ClientApp carries Flower's ``secaggplus_mod``, which answers the key-exchange stages itself and,
in the ``collect masked vectors`` stage, calls privasr's train handler, quantises and masks what it returns,
and sends only the masked vector. Flower's workflow is written for its legacy ``Strategy``; this module gives it
a minimal one (:class:`_RoundStrategy`) that selects the round's nodes and captures the unmasked aggregate, and
replaces the legacy ``FitIns`` with privasr's own message content (task, payload), so the rest of the loop is
unchanged.

What travels, per node and round (the server sees all of it):

* ``setup``: the protocol's parameters; the reply is the node's two public keys;
* ``share keys``: the neighbours' public keys; the reply is the node's secret shares, encrypted for each
  neighbour;
* ``collect masked vectors``: privasr's task and the payload (the model), plus the encrypted shares addressed
  to the node; the reply is the **masked** vector (uniformly distributed modulo ``2^32`` to anyone without
  the masks), ``num_examples = 1``, no metrics, and privasr's per-slot status (``seconds``, or the failed
  client's exception type) and the summand's layout (array names, shapes, bounds: the same for every node);
* ``unmask``: the lists of surviving and dropped neighbours; the reply is the shares the server needs to
  remove the masks (of survivors' self masks, of the dropped nodes' pairwise masks).

The unmasked result is the sum of the surviving nodes' encoded summands (:mod:`privasr.federated.secagg`).
Flower quantises each node's values to ``quantization_range = 2^bits`` levels over ``[-C, C]`` with
``C`` the largest number of slots one node serves in the round (1 unless the sampler draws a client twice),
weights every node by 1 (``max_weight = 1``), and divides the unmasked sum by the number of survivors; this
module multiplies that back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privasr.federated.core import ClientOutcome, ClientTask, FederatedError
from privasr.federated.secagg import SecAggSettings, check_layouts, decode, encode

__all__ = ["secure_round", "SecureRound", "node_secure_reply", "LAYOUT", "SECURE"]

LAYOUT = "privasr.layout"  # ConfigRecord of a node's reply: the JSON layout of its summand
SECURE = "privasr.secure"  # ConfigRecord of a secure round's task: bits, bound, noise


@dataclass
class SecureRound:
    """The outcome of one secure round.

    Attributes:
        total: the unmasked sum of the survivors' encoded values (``None`` when the protocol failed).
        replies: node id -> the node's ``collect masked vectors`` reply (per-slot status and layout), for the
            nodes whose masked vector is in ``total``.
        dropped: node id -> why it is not in the sum (the stage it dropped out at, or the protocol failure).
        stages_s: seconds each stage took.
    """

    total: list[np.ndarray] | None
    replies: dict[int, Any] = field(default_factory=dict)
    dropped: dict[int, str] = field(default_factory=dict)
    stages_s: dict[str, float] = field(default_factory=dict)


class _Proxy:
    """What Flower's workflow needs of a ``ClientProxy``: the node id."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.cid = str(node_id)


class _RoundStrategy:
    """The part of Flower's legacy ``Strategy`` that ``SecAggPlusWorkflow`` calls: select the round's nodes, and
    receive the unmasked aggregate."""

    def __init__(self, nodes: Sequence[int]) -> None:
        self.nodes = list(nodes)
        self.aggregate: list[np.ndarray] | None = None
        self.survivors = 0

    def configure_fit(self, server_round: int, parameters: Any, client_manager: Any) -> list[tuple[Any, Any]]:
        from flwr.common import FitIns, Parameters

        return [(_Proxy(n), FitIns(Parameters(tensors=[], tensor_type=""), {})) for n in self.nodes]

    def aggregate_fit(self, server_round: int, results: Sequence[Any], failures: Sequence[Any]
                      ) -> tuple[Any, dict[str, Any]]:
        from flwr.common import parameters_to_ndarrays

        if not results:
            return None, {}
        parameters = results[0][1].parameters  # the workflow put the aggregate into every result
        self.aggregate = [np.asarray(a, dtype=np.float64) for a in parameters_to_ndarrays(parameters)]
        self.survivors = len(results)
        return parameters, {}


class _Recorder:
    """The round's grid, keeping the replies of each ``send_and_receive`` (the workflow does not return them)."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid
        self.replies: list[list[Any]] = []

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Any]:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        self.replies.append(replies)
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)


_STAGES = ("setup", "share keys", "collect masked vectors", "unmask")


def secure_round(grid: Any, contents: Mapping[int, Any], settings: SecAggSettings, round: int, *,
                 timeout: float | None = None, max_slots: int = 1) -> SecureRound:
    """Run one round of SecAgg+ over the nodes of ``contents`` (node id -> privasr's train content).

    Args:
        grid: the ServerApp's ``Grid`` (anything with ``send_and_receive``).
        contents: node id -> the ``RecordDict`` privasr sends a node in a round (task and payload).
        settings: the run's :class:`~privasr.federated.secagg.SecAggSettings`.
        round: the round (the messages' group id).
        timeout: seconds to wait for the replies of each stage (``None``: until all arrived).
        max_slots: the largest number of slots one node serves this round (Flower's clipping range).

    Returns:
        A :class:`SecureRound`. Nodes that do not reply in time, or reply with an error, drop out; the round
        survives while every survivor keeps at least the reconstruction threshold of live neighbours.
    """
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState

    nodes = sorted(int(n) for n in contents)
    out = SecureRound(None)
    if len(nodes) < 2:
        out.dropped = {n: "not aggregated: SecAgg+ needs at least 2 nodes" for n in nodes}
        return out
    workflow = SecAggPlusWorkflow(settings.num_shares, float(settings.reconstruction_threshold), max_weight=1.0,
                                  clipping_range=float(max_slots), quantization_range=2 ** settings.quantization_bits,
                                  modulus_range=2 ** 32, timeout=timeout)
    strategy = _RoundStrategy(nodes)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy)  # type: ignore[arg-type]
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: int(round)})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    state = WorkflowState()
    rec = _Recorder(grid)
    alive = set(nodes)
    for k, stage in enumerate((workflow.setup_stage, workflow.share_keys_stage,
                               workflow.collect_masked_vectors_stage, workflow.unmask_stage)):
        t0 = time.perf_counter()
        ok = stage(rec, context, state)  # type: ignore[arg-type]
        out.stages_s[_STAGES[k]] = time.perf_counter() - t0
        last = rec.replies[-1] if len(rec.replies) > k else []
        replied = {int(m.metadata.src_node_id) for m in last if not m.has_error()}
        errors = {int(m.metadata.src_node_id): _reason(m) for m in last if m.has_error()}
        for n in sorted(alive - replied):
            if k < 3:  # a node lost in the unmask stage is still in the sum
                out.dropped[n] = f"dropped out of secure aggregation in its {_STAGES[k]} stage" + \
                    (f": {errors[n]}" if errors.get(n) else " (no reply)")
        if k < 3:
            alive &= replied
        if k == 0:  # privasr's content instead of the legacy FitIns
            state.nid_to_fitins = {n: _copy(contents[n]) for n in state.nid_to_fitins}
        if k == 2:
            out.replies = {int(m.metadata.src_node_id): m for m in rec.replies[-1] if not m.has_error()}
        if not ok:
            reason = f"secure aggregation failed in the {_STAGES[k]} stage: too few nodes left for the " \
                     f"reconstruction threshold"
            for n in nodes:
                out.dropped.setdefault(n, reason)
            out.replies = {}
            return out
    if strategy.aggregate is None:
        for n in nodes:
            out.dropped.setdefault(n, "secure aggregation produced no aggregate")
        out.replies = {}
        return out
    out.total = [a * strategy.survivors for a in strategy.aggregate]  # Flower divides by the survivors
    return out


def _reason(reply: Any) -> str:
    """The first line of an error reply's reason, without Flower's ``<class ...>:<'...'>`` wrapping."""
    reason = str(reply.error.reason or "").splitlines()[0] if reply.error.reason else ""
    if reason.startswith("<class '") and ":<'" in reason:
        cls = reason[len("<class '"):reason.index("'>")].rsplit(".", 1)[-1]
        reason = f"{cls}: {reason[reason.index(':<') + 3:].rstrip('>').rstrip(chr(39))}"
    return reason[:300]


def _copy(content: Any) -> Any:
    """A shallow copy of a ``RecordDict`` (the workflow adds its own record to each node's content)."""
    from flwr.app import RecordDict

    return RecordDict(dict(content.items()))


def outcomes_of(result: SecureRound, tasks_by_node: Mapping[int, Sequence[ClientTask]], epoch: int,
                token: Any) -> tuple[list[ClientOutcome], int, list[Any]]:
    """The round's per-slot outcomes (successful slots carry no update, only the state token), the number of
    successful slots and the layouts the summing nodes sent."""
    outs: list[ClientOutcome] = []
    count = 0
    layouts: list[Any] = []
    for node, ts in tasks_by_node.items():
        reply = result.replies.get(node)
        if reply is None:
            why = result.dropped.get(node, "dropped out of secure aggregation")
            outs.extend(ClientOutcome(t.slot, t.index, error=why) for t in ts)
            continue
        content = reply.content
        layouts.append(json.loads(str(content[LAYOUT]["layout"])))
        for t in ts:
            res = content.get(f"privasr.result.{t.slot}")
            failed = failed_slot(res, t, "no status in the reply")
            if failed is not None:
                outs.append(failed)
            else:
                count += 1
                outs.append(ClientOutcome(t.slot, t.index, None, token(epoch, t.slot), seconds=float(res["seconds"])))
    return outs, count, layouts


def failed_slot(status: Any, task: ClientTask, missing: str) -> ClientOutcome | None:
    """The outcome of a slot whose status record (``privasr.result.<slot>`` of a node's reply) is absent
    (error ``missing``) or reports the client's failure; ``None`` for a slot that succeeded."""
    if status is None:
        return ClientOutcome(task.slot, task.index, error=missing)
    if "error" in status:
        return ClientOutcome(task.slot, task.index, error=str(status["error"]), seconds=float(status["seconds"]))
    return None


def node_secure_reply(algorithm: Any, updates: Mapping[int, Any], failures: Mapping[int, tuple[str, float]],
                      seconds: Mapping[int, float], secure: Any, seeds: Mapping[int, Sequence[int]]) -> Any:
    """A node's reply in the ``collect masked vectors`` stage, before Flower's mod masks it.

    ``updates``: slot -> the slot's :class:`~privasr.federated.core.Update`; ``failures``: slot -> (the
    exception's type, seconds). Each update becomes the algorithm's summand, with its share of distributed DP
    noise when the task asks for it, encoded with a generator seeded by the slot's seed; the node sends the sum
    over its slots. Raises :class:`~privasr.federated.core.FederatedError` when no slot succeeded (the node
    then drops out of the round; Flower reports the error to the server).
    """
    from flwr.app import ConfigRecord
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    from privasr.privacy.dp.mechanisms import make_mechanism

    if not updates:
        raise FederatedError("no client of this node produced an update: " +
                             ", ".join(f"slot {s}: {why}" for s, (why, _) in sorted(failures.items())))
    bits = int(secure["bits"])
    bound = float(secure["bound"])
    noise = make_mechanism(json.loads(str(secure["noise"]))) if str(secure["noise"]) else None
    parts = int(secure["parts"])
    total: list[np.ndarray] | None = None
    layout: Any = None
    for slot, update in sorted(updates.items()):
        rng = np.random.default_rng([*(int(v) for v in seeds[slot]), 5])
        values, layout, _ = encode(algorithm.secure_summand(update, bound), bits, rng, noise, parts)
        total = values if total is None else [a + b for a, b in zip(total, values, strict=True)]
    assert total is not None
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(total), num_examples=1, metrics={})
    out = compat.fitres_to_recorddict(fitres, keep_input=False)
    for slot in updates:
        out[f"privasr.result.{slot}"] = ConfigRecord({"seconds": float(seconds[slot])})
    for slot, (why, dt) in failures.items():
        out[f"privasr.result.{slot}"] = ConfigRecord({"error": why, "seconds": float(dt)})
    out[LAYOUT] = ConfigRecord({"layout": json.dumps(layout)})
    return out


def decode_round(algorithm: Any, result: SecureRound, layouts: Sequence[Any], count: int) -> Any:
    """The round's accumulator from the unmasked sum (``None`` when nothing was summed), and the number of
    values the clients clipped."""
    if result.total is None or count == 0:
        return None, 0.0
    arrays, scalars = decode(result.total, check_layouts(layouts))
    clipped = scalars.pop("secagg_clipped", 0.0)
    return algorithm.from_secure_sum(arrays, scalars, count), clipped


def secure_task(settings: SecAggSettings, algorithm: Any, noise: tuple[Mapping[str, Any], int] | None) -> Any:
    """The ``privasr.secure`` record of a round's task: quantisation bits, the bound, the noise to share."""
    from flwr.app import ConfigRecord

    bound = algorithm.secure_bound(settings.bound)
    return ConfigRecord({"bits": int(settings.quantization_bits), "bound": float(bound),
                         "noise": json.dumps(dict(noise[0])) if noise is not None else "",
                         "parts": int(noise[1]) if noise is not None else 1})
