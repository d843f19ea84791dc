"""fedlm's model bundle: the operator writes it; a device turns its own N-best lists into its fedlm client with it.

What the bundle holds (:func:`write_fedlm_bundle`):

* ``settings.json``: ``fedlm`` (the :class:`~privasr.federated.algorithms.fedlm.FedLmConfig`: loss, local
  epochs, learning rate, clipping, compression), ``nnlm`` (the network's configuration and vocabulary),
  ``confidence`` (where a device's word confidences come from: ``data``, the decoder's confidences in its
  files; ``classifier``, the operator's word-confidence classifier on the N-best features; ``none``, every
  word weight 1) with the classifier's header, ``rounds`` and ``run`` (the run's public settings);
* ``arrays.npz``: ``confidence/<name>`` (the classifier's arrays, :meth:`ConfidenceModel.to_arrays
  <privasr.confidence.model.ConfidenceModel.to_arrays>`). The NNLM's weights are not in the bundle: the server
  sends the current parameters with every round.

A device's client text (:func:`read_client_text`) is the 1-best of each of its N-best lists (any N-best format
privasr reads; empty 1-bests skipped), as the fedlm runner's client text of N-best data
(``data.client_text: first_pass``), or its first-pass transcripts: CTM files with word confidences (cut at
pauses longer than ``split_gap`` seconds, lowercased, tokens without a letter or digit dropped, as the runner's
Earnings-21 clients) and any other transcript format privasr reads (Kaldi ``text``, trn; no confidences). Its
word weights are the confidences above.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.corpus.records import NBest
from privasr.device.bundle import Bundle, build_model, write_bundle
from privasr.errors import ConfigError, InputError

__all__ = ["write_fedlm_bundle", "FedLmDeviceModel", "FEDLM_BUNDLE", "CONFIDENCE_SOURCES", "read_client_text"]

FEDLM_BUNDLE = "fedlm"
CONFIDENCE_SOURCES = ("data", "classifier", "none")


def write_fedlm_bundle(folder: str | os.PathLike[str], *, algorithm: Any, confidence: str,
                       classifier: Any = None, rounds: int, run: Mapping[str, Any] | None = None,
                       split_gap: float = 1.0) -> str:
    """Write fedlm's bundle into the new folder ``folder``; its hash.

    Args:
        algorithm: the server's :class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm`.
        confidence: ``data``, ``classifier`` (with ``classifier``, a
            :class:`~privasr.confidence.model.ConfidenceModel` trained on the operator's labelled lists) or
            ``none``.
        rounds: the run's rounds; ``run``: its public settings.
        split_gap: a device's CTM files are cut into utterances at pauses longer than this (seconds).

    Raises:
        ConfigError: an unknown confidence source, a classifier missing or given without ``classifier``.
    """
    import json

    if confidence not in CONFIDENCE_SOURCES:
        raise ConfigError(f"confidence source {confidence!r} on a device", expected=f"one of {CONFIDENCE_SOURCES}")
    if (confidence == "classifier") != (classifier is not None):
        raise ConfigError("a classifier goes with confidence source 'classifier' only",
                          expected="a ConfidenceModel for 'classifier', none otherwise")
    arrays: dict[str, np.ndarray] = {}
    meta = None
    if classifier is not None:
        meta, arr = classifier.to_arrays()
        arrays.update({f"confidence/{k}": v for k, v in arr.items()})
    settings = {"fedlm": algorithm.config.to_dict(),
                "nnlm": {"config": algorithm.model_config.to_dict(), "vocab": json.loads(algorithm.vocab.to_json())},
                "confidence": {"source": confidence, "classifier": meta}, "split_gap": float(split_gap),
                "rounds": int(rounds),
                "run": dict(run or {})}
    if not arrays:
        arrays["confidence/none"] = np.zeros(0)
    return write_bundle(folder, FEDLM_BUNDLE, settings, arrays)


def read_client_text(path: str | os.PathLike[str], split_gap: float = 1.0) -> list[NBest]:
    """A device file's utterances as N-best lists (transcripts as one-hypothesis lists, with their confidences).

    Raises:
        InputError: naming the file (and line): unreadable, no utterances, a CTM without confidences.
    """
    from pathlib import Path

    from privasr.corpus.formats.ctm import ctm_utterances
    from privasr.corpus.load import load_path
    from privasr.corpus.records import Hypothesis

    p = Path(path)
    if p.suffix.lower() == ".ctm":
        recs: list[Any] = list(ctm_utterances(p, split_gap))
    else:
        recs = [r for d in load_path(p) for r in d.records]
    out = []
    for r in recs:
        if isinstance(r, NBest):
            out.append(r)
        elif r.words:
            out.append(NBest(r.utt_id, (Hypothesis(tuple(r.words), confidences=r.confidences),)))
    if not out:
        raise InputError("holds no utterances with words", path=p, expected="N-best lists or transcripts")
    return out


@dataclass
class FedLmDeviceModel:
    """What a device builds from fedlm's bundle: the algorithm (installed code, the bundle's settings), the
    vocabulary and the confidence source."""

    bundle: Bundle
    vocab: Any
    source: str
    classifier: Any
    rounds: int

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | Bundle, *,
             expected: str | None = None) -> FedLmDeviceModel:
        """Read fedlm's bundle from ``folder`` and build the model.

        Raises:
            InputError: a bundle of another kind or hash, or settings that do not make the model.
        """
        def build(b: Bundle) -> FedLmDeviceModel:
            from privasr.confidence.model import ConfidenceModel
            from privasr.lm.neural.vocab import Vocabulary

            s = b.settings
            vocab = Vocabulary.from_json(s["nnlm"]["vocab"])
            conf = s["confidence"]
            source = conf["source"]
            if source not in CONFIDENCE_SOURCES:
                raise ValueError(f"confidence source {source!r}")
            clf = None
            if source == "classifier":
                arr = {k[len("confidence/"):]: v for k, v in b.arrays.items() if k.startswith("confidence/")}
                clf = ConfidenceModel.from_arrays(conf["classifier"], arr)
            model = cls(b, vocab, source, clf, int(s["rounds"]))
            model.algorithm()
            return model

        return build_model(folder, expected, FEDLM_BUNDLE, "fedlm", build)  # type: ignore[no-any-return]

    def algorithm(self, nbests: Sequence[NBest] = ()) -> Any:
        """The device's :class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm` (the parameters arrive with
        every round's payload)."""
        from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
        from privasr.lm.neural.models import NeuralLMConfig

        s = self.bundle.settings
        return FedLmAlgorithm(FedLmConfig.from_dict(s["fedlm"]), NeuralLMConfig.from_dict(s["nnlm"]["config"]),
                              self.vocab)

    def utterances(self, nbests: Sequence[NBest]) -> list[dict[str, Any]]:
        """One dict per list with a non-empty 1-best: ``ids`` (the 1-best as word ids) and ``conf`` (its word
        confidences, or an empty array with source ``none``).

        Raises:
            InputError: source ``data`` and a 1-best without confidences (naming the utterance).
        """
        kept = [nb for nb in nbests if nb.best.words]
        if self.source == "classifier":
            confs = [np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0) for c in self.classifier.predict_many(kept)]
        elif self.source == "data":
            confs = []
            for nb in kept:
                if nb.best.confidences is None:
                    raise InputError(f"utterance {nb.utt_id!r}: the 1-best has no word confidences",
                                     expected="per-word confidences (the bundle's confidence source is 'data')")
                confs.append(np.asarray(nb.best.confidences, dtype=np.float64))
        else:
            confs = [np.zeros(0) for _ in kept]
        return [{"utt_id": nb.utt_id, "ids": np.asarray(self.vocab.encode(nb.best.words), dtype=np.int64),
                 "conf": c} for nb, c in zip(kept, confs, strict=True)]

    def client(self, name: str, groups: Sequence[Sequence[Mapping[str, Any]]]) -> Any:
        """The device's :class:`~privasr.federated.algorithms.fedlm.FedLmClient`: every utterance taken so far."""
        from privasr.federated.algorithms.fedlm import FedLmClient

        utts = [u for g in groups for u in g]
        sents = tuple(tuple(int(i) for i in u["ids"]) for u in utts)
        weights = None if self.source == "none" else tuple(np.asarray(u["conf"]) for u in utts)
        return FedLmClient(name, sents, weights)
