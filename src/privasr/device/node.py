"""A device serving a federated run (FMP, fedlm or FTL), and (FMP) rescoring its own lists for its user.

:class:`Device` joins a device folder (:mod:`privasr.device.folder`) and the model it builds from the operator's
bundle (:class:`~privasr.device.fmp.FmpDeviceModel`). It answers the server's Flower messages with privasr's
installed ClientApp handlers (:mod:`privasr.federated.backends.flower`): ``hello`` (which client it serves),
``train`` (take this round's new files, prepare them, run FMP's client update from the state the server named,
reply with the counts only; under SecAgg+ the masked summand) and ``state``. The client's index, state folder and
data come from the device's own ``device.json``, never from the message or the SuperNode's node config.

Everything a client computes is computed here: NNLM scores of its own N-best lists, the baseline totals, the
word ids, FMP's cache and rank kernel. What leaves the device is the update (ids and counts; with SecAgg+ a
masked vector). :meth:`Device.rescore` gives the user's personalised 1-best from the device's latest state.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr.device.fmp import FmpDeviceModel
from privasr.device.folder import DeviceFolder
from privasr.errors import InputError

__all__ = ["Device", "dispatch"]

log = logging.getLogger(__name__)


class Device:
    """One device: its folder and the model from its bundle (checked against the hash in ``device.json``).

    ``replay``: a folder of :func:`~privasr.device.folder.write_replay` (tests, demos and the AMI deployment):
    round ``r``'s files are copied into the inbox just before the device takes round ``r``.

    Raises:
        InputError: a folder that is not a device folder, a bundle that fails its checks.
    """

    def __init__(self, folder: str | os.PathLike[str], *, replay: str | os.PathLike[str] | None = None) -> None:
        from privasr.device.bundle import read_bundle
        from privasr.device.fedlm import FedLmDeviceModel
        from privasr.device.ftl import FtlDeviceModel

        self.folder = DeviceFolder(folder)
        self.replay = None if replay is None else Path(replay)
        bundle = read_bundle(self.folder.bundle, expected=self.folder.bundle_hash)  # read and hashed once
        models = {"fmp": FmpDeviceModel, "fedlm": FedLmDeviceModel, "ftl": FtlDeviceModel}
        if bundle.kind not in models:
            raise InputError(f"a bundle of kind {bundle.kind!r}", path=self.folder.bundle / "manifest.json",
                             expected=f"one of {sorted(models)}")
        self.kind = bundle.kind
        self.model: Any = models[bundle.kind].load(bundle)
        run = self.model.bundle.settings.get("run", {})
        self.secure = bool(run.get("secagg"))
        self._stored: dict[int, list[dict[str, Any]]] = {}  # the taken groups as stored (they never change)
        self._groups: dict[int, tuple[Any, ...]] = {}  # FMP's utterances of them
        self._app: Any = None

    # -- data ----------------------------------------------------------------------------------------------

    def prepare(self, nbests: list[Any]) -> list[dict[str, Any]]:
        """One stored dict per utterance: FMP's inputs (ids, baseline totals, weight) and the hypotheses' words
        (for the user's 1-best and exact renormalisation); fedlm's 1-best ids and word confidences; FTL's words
        and features."""
        if self.kind != "fmp":
            return list(self.model.utterances(nbests))
        utts = self.model.utterances(nbests)
        return [{"utt_id": u.utt_id, "word_ids": list(u.word_ids), "base": np.asarray(u.base),
                 "bias_weight": float(u.bias_weight), "hyps": [" ".join(h.words) for h in nb.hyps]}
                for u, nb in zip(utts, nbests, strict=True)]

    def _stored_group(self, r: int) -> list[dict[str, Any]]:
        """Round ``r``'s stored group, read from disk once (call it for rounds already taken: a group never changes
        once its round is taken, and a round skipped before a later one was taken stays empty)."""
        if r not in self._stored:
            self._stored[r] = self.folder.group(r)
        return self._stored[r]

    def _group(self, r: int) -> tuple[Any, ...]:
        from privasr.federated.algorithms.fmp import FmpUtterance

        if r not in self._groups:
            self._groups[r] = tuple(FmpUtterance(d["utt_id"], tuple(np.asarray(w, dtype=np.int64)
                                                                    for w in d["word_ids"]),
                                                 d["base"], d["bias_weight"]) for d in self._stored_group(r))
        return self._groups[r]

    def client(self, upto: int) -> Any:
        """The device's client: FMP's :class:`~privasr.federated.algorithms.fmp.FmpClient` of the groups of rounds
        ``0 .. upto`` (a round the device was not asked in has an empty group); fedlm's
        :class:`~privasr.federated.algorithms.fedlm.FedLmClient` or FTL's
        :class:`~privasr.federated.algorithms.ftl.FtlClient` of every utterance taken so far."""
        from privasr.federated.algorithms.fmp import FmpClient

        if self.kind != "fmp":
            return self.model.client(self.folder.name, [self._stored_group(t) for t in range(upto + 1)])

        return FmpClient(self.folder.name, tuple(self._group(t) for t in range(upto + 1)))

    def _nbests(self) -> list[Any]:
        from privasr.corpus.records import Hypothesis, NBest

        out = []
        for r in self.folder.taken_rounds():
            for d in self._stored_group(r):
                out.append(NBest(d["utt_id"], tuple(Hypothesis.from_text(t) for t in d["hyps"])))
        return out

    def algorithm(self) -> Any:
        """The device's algorithm (FMP: with exact renormalisation over its own lists when the bundle says so)."""
        if self.kind != "fmp":
            return self.model.algorithm()
        normalized = bool(self.model.bundle.settings.get("normalized"))
        return self.model.algorithm(self._nbests() if normalized else ())

    def _take(self, r: int) -> Any:
        if self.kind == "ftl":
            from privasr.device.ftl import COMPANION_SUFFIXES, read_transcripts

            return self.folder.take(r, self.prepare, read=read_transcripts, companions=COMPANION_SUFFIXES)
        if self.kind == "fedlm":
            from privasr.device.fedlm import read_client_text

            gap = float(self.model.bundle.settings.get("split_gap", 1.0))
            return self.folder.take(r, self.prepare, read=lambda p: read_client_text(p, gap))
        return self.folder.take(r, self.prepare)

    def source(self, context: Any, epoch: int) -> tuple[Any, dict[int, Any]]:
        """For round ``epoch``: take the new files (:meth:`DeviceFolder.take`), then the algorithm and
        ``{index: client}``."""
        if self.replay is not None:  # the files a phone would have decoded by this round
            from privasr.device.folder import replay_into

            replay_into(self.replay, self.folder.inbox, epoch)
        taken = self._take(epoch)
        if taken.used or taken.set_aside:
            log.info("round %d: %d file(s) used, %d set aside", epoch, len(taken.used), len(taken.set_aside))
        return self.algorithm(), {self.folder.index: self.client(epoch)}

    # -- Flower --------------------------------------------------------------------------------------------

    def client_app(self) -> Any:
        """privasr's ClientApp for this device (installed code; Flower's ``secaggplus_mod`` when the bundle's
        run uses SecAgg+, so that no update leaves the device unmasked)."""
        if self._app is not None:
            return self._app
        from flwr.clientapp import ClientApp

        from privasr.federated.backends import flower as fl

        state_dir = str(self.folder.node_states)
        if self.secure:
            from flwr.client.mod import secaggplus_mod

            app = ClientApp(mods=[secaggplus_mod])
        else:
            app = ClientApp()

        @app.train()
        def train(message: Any, context: Any) -> Any:
            return fl._node_train(message, context, self.source, state_dir)

        @app.query("privasr_hello")
        def hello(message: Any, context: Any) -> Any:
            from flwr.app import ConfigRecord, Message, RecordDict

            return Message(RecordDict({"privasr.hello": ConfigRecord({"partition": self.folder.index,
                                                                       "state_dir": True})}), reply_to=message)

        @app.query("privasr_state")
        def state(message: Any, context: Any) -> Any:
            return fl._node_state(message, context, state_dir)

        self._app = app
        return app

    def handle(self, message: Any, context: Any) -> Any:
        """Run privasr's ClientApp on ``message``, with this device's own node settings (its index and state
        folder) in place of the SuperNode's node config while it runs."""
        from privasr.federated.backends.flower_deploy import STATE_DIR_KEY

        original = context.node_config
        context.node_config = {"partition-id": self.folder.index, STATE_DIR_KEY: str(self.folder.node_states)}
        try:
            return self.client_app()(message=message, context=context)
        finally:
            context.node_config = original

    # -- the user's side -----------------------------------------------------------------------------------

    def latest_state(self) -> Any:
        """The client's newest state on this device (``None`` before its first round): the state of the
        latest round it computed, whether or not the server used its update."""
        from privasr.federated.tree import load_tree

        files = list(self.folder.node_states.glob("*/client-*/*.npz"))
        if not files:
            return None

        def key(p: Path) -> tuple[int, int]:
            r, s = p.name[:-len(".npz")].split(".")
            return int(r), -int(s)

        return load_tree(max(files, key=key))

    def rescore(self) -> list[tuple[str, str]]:
        """The user's personalised 1-best, ``(utt_id, text)`` per utterance in the order taken: files that
        arrived after the last round are taken now (as a final group, sent nowhere) and every group the client
        has not rescored yet is rescored with the last global distribution it received
        (:meth:`~privasr.federated.algorithms.fmp.FmpAlgorithm.finish`).

        Raises:
            InputError: a device with no utterances.
            ConfigError: a device of another algorithm than FMP (its model is the server's).
        """
        if self.kind != "fmp":
            from privasr.errors import ConfigError

            raise ConfigError(f"a {self.kind} device has no personal rescoring",
                              expected="an FMP device (fedlm's adapted model is the server's release)")
        done = self.folder.taken_rounds()
        last = max([*done, -1]) + 1
        self.folder.take(last, self.prepare)
        self._stored.pop(last, None)
        self._groups.pop(last, None)
        client = self.client(last)
        if client.n_utterances == 0:
            raise InputError("the device has no utterances yet", path=self.folder.inbox,
                             expected="N-best files in the inbox")
        st = self.algorithm().finish(client, self.latest_state())
        out = []
        for r in range(last + 1):
            for d in self._stored_group(r):
                out.append((d["utt_id"], d["hyps"][int(st["chosen"][d["utt_id"]])]))
        return out


def dispatch(devices: Sequence[Device]) -> Callable[[Any, Any], Any]:
    """``app(message, context)`` answering each message with the device of the node's ``partition-id``: several
    devices behind one in-process grid (:func:`~privasr.federated.backends.flower_inprocess.serve_inprocess`),
    for tests and benchmarks."""

    def app(message: Any, context: Any) -> Any:
        return devices[int(context.node_config["partition-id"])].handle(message, context)

    return app
