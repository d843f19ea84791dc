"""Saving and loading neural LM checkpoints safely.

A checkpoint is one ``torch.save`` file holding only plain data: ``{"format": "privasr-nnlm", "version": 1,
"meta": JSON text (model config, vocabulary, extra), "state": {name: tensor}}`` and, in training's ``last``
checkpoints, ``"train_state"`` (optimizer state, RNG states, counters; see :mod:`privasr.lm.neural.train`). It
is read with ``torch.load(weights_only=True)``, so loading never runs pickled code, and every problem (missing,
truncated or corrupt file, another format, a vocabulary that does not fit the weights, missing or misshapen
tensors) is an :class:`~privasr.errors.InputError` naming the file. A model with the class-factored softmax
keeps its word classes in the state (``output.classes``), so the checkpoint alone rebuilds it exactly; the
vocabulary's training counts (when recorded) are saved with it too.

>>> import tempfile, pathlib, torch
>>> from privasr.lm.neural.models import NeuralLMConfig, build_model
>>> from privasr.lm.neural.vocab import Vocabulary
>>> v = Vocabulary.build([["hello", "world"]])
>>> m = build_model(NeuralLMConfig.preset("tiny-lstm"), v)
>>> p = pathlib.Path(tempfile.mkdtemp()) / "lm.pt"
>>> save_checkpoint(p, m, v, m.config, extra={"note": "doc"})
>>> ck = load_checkpoint(p)
>>> ck.vocab == v, ck.extra["note"], ck.model.training
(True, 'doc', False)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from privasr.errors import InputError
from privasr.lm.neural.models import LstmLM, NeuralLMConfig, TransformerLM, build_model
from privasr.lm.neural.vocab import Vocabulary
from privasr.results import to_jsonable

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "FORMAT", "VERSION"]

FORMAT = "privasr-nnlm"
VERSION = 1


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes:
        model: the model, in eval mode, on ``map_location``.
        vocab: its vocabulary.
        config: its configuration (``vocab_size`` filled in).
        extra: the JSON metadata saved with it (training saves options, epoch, perplexities).
        path: the file it was read from.
        train_state: the resumable training state (only in training's ``last`` checkpoints), else ``None``.
    """

    model: TransformerLM | LstmLM
    vocab: Vocabulary
    config: NeuralLMConfig
    extra: dict[str, Any]
    path: Path | None = None
    train_state: dict[str, Any] | None = None


def save_checkpoint(path: str | os.PathLike[str], model: nn.Module, vocab: Vocabulary, config: NeuralLMConfig,
                    *, extra: Mapping[str, Any] | None = None,
                    train_state: Mapping[str, Any] | None = None) -> None:
    """Write ``model``'s weights with ``vocab``, ``config`` and JSON ``extra`` to ``path`` (atomically).

    ``train_state`` (tensors, numbers, strings, lists and dicts only) is stored for resuming training.
    """
    if config.vocab_size not in (0, len(vocab)):
        raise InputError(f"config.vocab_size={config.vocab_size} but the vocabulary has {len(vocab)} words")
    cfg = config if config.vocab_size else config.replace(vocab_size=len(vocab))
    meta = {"config": cfg.to_dict(), "vocab": json.loads(vocab.to_json()), "extra": to_jsonable(dict(extra or {}))}
    payload: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "meta": json.dumps(meta, ensure_ascii=False, allow_nan=False),
        "state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if train_state is not None:
        payload["train_state"] = dict(train_state)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, p)


def load_checkpoint(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a checkpoint written by :func:`save_checkpoint`; the model comes back in eval mode.

    Raises :class:`InputError` (naming ``path``) for anything that is not a complete, consistent checkpoint.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=p, expected="a privasr neural LM checkpoint")
    if not p.is_file():
        raise InputError("not a regular file", path=p, expected="a privasr neural LM checkpoint")
    try:
        obj = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch/pickle/zip raise many types; all mean "unreadable"
        # torch's own message is long advice about weights_only; its first sentence says what happened
        reason = str(e).strip().splitlines()[0].split(". ")[0][:120] if str(e).strip() else type(e).__name__
        raise InputError(f"cannot read the checkpoint, the file is truncated, corrupt or not a torch file "
                         f"({type(e).__name__}: {reason})", path=p,
                         expected="a file written by privasr's save_checkpoint") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise InputError("not a privasr neural LM checkpoint (no 'format': 'privasr-nnlm' entry)", path=p)
    if obj.get("version") != VERSION:
        raise InputError(f"checkpoint format version {obj.get('version')!r} is not supported", path=p,
                         expected=f"version {VERSION}")
    try:
        meta = json.loads(obj["meta"])
        config = NeuralLMConfig.from_dict(meta["config"])
        vocab = Vocabulary.from_json(meta["vocab"])
        extra = meta.get("extra", {})
        state = obj["state"]
    except InputError as e:
        raise InputError(f"bad metadata: {e.message}", path=p, expected=e.expected) from None
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"bad metadata ({type(e).__name__}: {e})", path=p) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError("the 'state' entry is not a mapping of names to tensors", path=p)
    if config.vocab_size != len(vocab):
        raise InputError(f"vocabulary mismatch: the config says {config.vocab_size} words, the vocabulary has "
                         f"{len(vocab)}", path=p)
    with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # loading leaves the global RNG alone
        model = build_model(config, vocab)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors {missing[:5]}")
        if unexpected:
            parts.append(f"unexpected tensors {unexpected[:5]}")
        raise InputError("the weights do not match the model config: " + "; ".join(parts), path=p)
    for name, t in expected.items():
        if tuple(state[name].shape) != tuple(t.shape):
            what = "vocabulary mismatch: " if len(vocab) in tuple(t.shape) else ""
            raise InputError(f"{what}tensor {name!r} has shape {tuple(state[name].shape)}, the model needs "
                             f"{tuple(t.shape)} (vocabulary of {len(vocab)} words)", path=p)
    try:
        model.load_state_dict(state)
    except (RuntimeError, ValueError) as e:  # e.g. word classes that do not fit the class softmax
        raise InputError(f"the weights do not fit the model: {str(e).strip().splitlines()[0][:200]}", path=p) from None
    model.to(map_location)
    model.eval()
    ts = obj.get("train_state")
    return Checkpoint(model=model, vocab=vocab, config=config, extra=dict(extra), path=p,
                      train_state=ts if isinstance(ts, dict) else None)
