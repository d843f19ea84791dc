"""Training helpers for the acoustic models: AN4 examples, length-sorted batches, a train loop, evaluation.

Plain functions over plain data, so the federated platform can reuse the pieces per client:

* :func:`an4_examples` -- the feature pipeline: AN4 Sphinx MFCCs (:func:`~privasr.asr.features.an4_features`)
  -> CMVN (per speaker, each speaker normalised with its own statistics, as a federated client would; or
  global, with given -- e.g. training-set -- statistics) -> :func:`~privasr.asr.features.stack_frames` (3
  frames, 39 dims at about 33 frames/s) -> :class:`Example` with the tokenizer's unit ids;
* :func:`length_batches` -- utterances sorted by length and cut into batches of at most ``batch_size``
  utterances and ``max_frames`` padded frames, the batch order shuffled by a seeded generator;
* :func:`train` -- ``steps`` or ``epochs`` of ``optimizer`` steps on the per-unit loss
  (:meth:`~privasr.asr.models.AcousticModel.loss` divided by its unit count), gradient-norm clipping, seeded
  dropout; :func:`evaluate_loss` -- the per-unit loss of a data set;
* :func:`evaluate` -- WER and CER (:func:`privasr.metrics.wer.wer`; CER on characters with the word boundary
  as one more character) of greedy or beam decoding (:func:`privasr.asr.search.decode`).

SpecAugment (:func:`~privasr.asr.features.spec_augment`) applies to 10 ms frames: :func:`spec_augment_stacked`
undoes the non-overlapping stacking of an :class:`Example`'s features, masks, and stacks again, and
``train(augment=...)`` applies it to every utterance of every batch with the run's seeded generator (a fresh
mask each time an utterance is seen).

>>> import numpy as np
>>> from privasr.asr.models import AcousticConfig, build_model
>>> from privasr.asr.units import CharTokenizer
>>> tok = CharTokenizer.train([("AB",), ("BA",)])
>>> rng = np.random.default_rng(0)
>>> data = [Example(f"u{i}", "s", w, rng.normal(size=(6, 4)).astype(np.float32), tuple(tok.encode(w)))
...         for i, w in enumerate([("AB",), ("BA",)])]
>>> model = build_model(AcousticConfig.preset("tiny", arch="ctc", input_dim=4), tok, seed=0)
>>> log = train(model, torch.optim.Adam(model.parameters(), 1e-2), data, steps=3, batch_size=2)
>>> log.steps, len(log.losses), evaluate_loss(model, data)[1]
(3, 3, 4)
>>> ev = evaluate(model, tok, data, method="greedy")
>>> ev.wer.ref_words, ev.cer.ref_words
(2, 4)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from privasr.asr.features import An4Utterance, CmvnStats, apply_cmvn, speaker_cmvn_stats, stack_frames
from privasr.asr.models import AcousticModel, Batch, collate
from privasr.asr.units import WORD_BOUNDARY, Tokenizer
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.metrics.wer import WerResult, wer

__all__ = [
    "Example",
    "an4_examples",
    "length_batches",
    "make_batch",
    "TrainLog",
    "train",
    "evaluate_loss",
    "Evaluation",
    "evaluate",
    "char_tokens",
    "spec_augment_stacked",
]


@dataclass(frozen=True, eq=False)
class Example:
    """One training/test utterance: id, speaker, reference words, model input ``[T, F]`` and unit ids."""

    utt_id: str
    speaker: str
    words: tuple[str, ...]
    features: np.ndarray = field(repr=False)
    units: tuple[int, ...]

    @property
    def num_frames(self) -> int:
        return int(self.features.shape[0])


Cmvn = Literal["speaker", "global", "none"]


def an4_examples(utterances: Sequence[An4Utterance], tokenizer: Tokenizer, *, cmvn: Cmvn = "speaker",
                 global_stats: CmvnStats | None = None, stack: int = 3) -> list[Example]:
    """AN4 utterances -> model inputs: CMVN (``"speaker"``, ``"global"`` or ``"none"``) then frame stacking.

    With ``cmvn="global"`` the statistics are ``global_stats`` (pass the training set's for a test set) or,
    when ``None``, those of ``utterances``. With ``"speaker"`` each speaker is normalised with the statistics
    of its own utterances among ``utterances``.

    >>> import numpy as np
    >>> from privasr.asr.units import CharTokenizer
    >>> u = An4Utterance("a-fash-b", "fash", ("GO",), np.arange(26, dtype=np.float32).reshape(2, 13))
    >>> ex = an4_examples([u], CharTokenizer.train([("GO",)]))[0]
    >>> ex.features.shape, ex.units
    ((1, 39), (5, 6))
    """
    if cmvn not in ("speaker", "global", "none"):
        raise ConfigError(f"cmvn={cmvn!r}", expected="'speaker', 'global' or 'none'")
    utts = list(utterances)
    if not utts:
        raise InputError("no utterances", expected="at least one AN4 utterance")
    if cmvn == "speaker":
        stats = speaker_cmvn_stats((u.speaker, u.features) for u in utts)
    elif cmvn == "global":
        g = global_stats if global_stats is not None else CmvnStats.from_arrays(u.features for u in utts)
    out = []
    for u in utts:
        x = u.features
        if cmvn == "speaker":
            x = apply_cmvn(x, stats[u.speaker])
        elif cmvn == "global":
            x = apply_cmvn(x, g)
        out.append(Example(u.utt_id, u.speaker, tuple(u.words), stack_frames(x, stack).astype(np.float32),
                           tuple(tokenizer.encode(u.words))))
    return out


def length_batches(lengths: Sequence[int], *, batch_size: int = 16, max_frames: int | None = None,
                   rng: np.random.Generator | None = None) -> list[list[int]]:
    """Indices of utterances grouped by length: sorted (ties by index), cut into batches of at most
    ``batch_size`` utterances and at most ``max_frames`` padded frames (``batch * longest``; a longer single
    utterance gets a batch of its own); the batch order shuffled with ``rng`` when given.

    >>> length_batches([5, 1, 3, 2], batch_size=2)
    [[1, 3], [2, 0]]
    >>> length_batches([5, 1, 3, 2], batch_size=4, max_frames=9)
    [[1, 3, 2], [0]]
    """
    batch_size = _positive(batch_size, "batch_size")
    if max_frames is not None:
        max_frames = _positive(max_frames, "max_frames")
    order = sorted(range(len(lengths)), key=lambda i: (int(lengths[i]), i))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = int(lengths[i])  # sorted ascending: the newcomer is the longest
        if cur and (len(cur) >= batch_size or (max_frames is not None and (len(cur) + 1) * longest > max_frames)):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    if rng is not None:
        perm = rng.permutation(len(batches))
        batches = [batches[int(p)] for p in perm]
    return batches


def _positive(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ConfigError(f"{name}={v!r}", expected="a positive integer")
    return int(v)


def make_batch(examples: Sequence[Example], indices: Sequence[int] | None = None,
               augment: Callable[[np.ndarray], np.ndarray] | None = None) -> Batch:
    """A padded :class:`~privasr.asr.models.Batch` of ``examples`` (or of those at ``indices``), each utterance's
    features passed through ``augment`` first when given."""
    ex = list(examples) if indices is None else [examples[i] for i in indices]
    feats = [e.features if augment is None else augment(e.features) for e in ex]
    return collate(feats, [e.units for e in ex], [e.utt_id for e in ex])


def spec_augment_stacked(x: np.ndarray, rng: np.random.Generator, stack: int = 3, **options: Any) -> np.ndarray:
    """SpecAugment on features stacked ``stack`` frames at a time without overlap (``(T, stack * D)``, as
    :func:`an4_examples` makes them): unstack to ``(T * stack, D)``, mask with
    :func:`~privasr.asr.features.spec_augment` (``options``: its mask settings), stack again. A new array.

    >>> x = np.ones((4, 6), dtype=np.float32)
    >>> y = spec_augment_stacked(x, np.random.default_rng(0), stack=3, time_width=2, time_ratio=1.0)
    >>> y.shape, bool((y == 0).any()), bool((x == 1).all())
    ((4, 6), True, True)
    """
    from privasr.asr.features import spec_augment

    t, d = x.shape
    if d % stack:
        raise ConfigError(f"features of {d} dims are not {stack} stacked frames", expected=f"a multiple of {stack}")
    frames = x.reshape(t * stack, d // stack)
    return spec_augment(frames, rng, **options).reshape(t, d).astype(x.dtype, copy=False)


@dataclass
class TrainLog:
    """What :func:`train` did: steps, epochs begun, per-step per-unit losses, units seen, seconds."""

    steps: int = 0
    epochs: int = 0
    losses: list[float] = field(default_factory=list)
    units: int = 0
    seconds: float = 0.0

    @property
    def last_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan


def train(model: AcousticModel, optimizer: torch.optim.Optimizer, examples: Sequence[Example], *,
          steps: int | None = None, epochs: int | None = None, batch_size: int = 16, max_frames: int | None = None,
          seed: int = 0, clip_norm: float | None = 5.0, scheduler: Any = None,
          callback: Callable[[int, float], None] | None = None, time_limit: float | None = None,
          augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None) -> TrainLog:
    """Train for ``steps`` optimiser steps or ``epochs`` passes (give one) over length-sorted batches.

    Each step minimises the batch's loss per target unit (``loss / count`` of
    :meth:`~privasr.asr.models.AcousticModel.loss`); gradients are clipped to ``clip_norm`` (``None``: no
    clipping); ``scheduler.step()`` follows every optimiser step; ``callback(step, loss)`` is called after
    each. The batch order (reshuffled every epoch) and dropout are seeded by ``seed`` (inside
    :func:`torch.random.fork_rng`: the global random state is untouched). ``time_limit`` (seconds) stops early.
    ``augment(features, rng)`` (e.g. :func:`spec_augment_stacked`) transforms every utterance of every batch,
    drawing from a generator seeded by ``seed``.
    """
    if (steps is None) == (epochs is None):
        raise ConfigError("give exactly one of steps and epochs")
    total = _positive(steps if steps is not None else epochs, "steps" if steps is not None else "epochs")
    ex = list(examples)
    if not ex:
        raise InputError("no training examples", expected="at least one example")
    rng = np.random.default_rng(seed)
    aug_rng = np.random.default_rng([seed, 7])
    aug = None if augment is None else (lambda f: augment(f, aug_rng))
    log = TrainLog()
    t0 = time.perf_counter()
    device = model.device
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model.train()
        done = False
        while not done:
            log.epochs += 1
            for idx in length_batches([e.num_frames for e in ex], batch_size=batch_size, max_frames=max_frames,
                                      rng=rng):
                batch = make_batch(ex, idx, aug).to(device)
                loss, count = model.loss(batch)
                per_unit = loss / max(count, 1)
                optimizer.zero_grad(set_to_none=True)
                per_unit.backward()
                if clip_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                log.steps += 1
                log.units += count
                value = float(per_unit.detach())
                log.losses.append(value)
                if callback is not None:
                    callback(log.steps, value)
                if (steps is not None and log.steps >= total) or \
                        (time_limit is not None and time.perf_counter() - t0 >= time_limit):
                    done = True
                    break
            if epochs is not None and log.epochs >= total:
                done = True
    log.seconds = time.perf_counter() - t0
    return log


def evaluate_loss(model: AcousticModel, examples: Sequence[Example], *, batch_size: int = 32) -> tuple[float, int]:
    """``(loss per target unit, number of target units)`` of ``examples`` in evaluation mode (no dropout)."""
    ex = list(examples)
    if not ex:
        raise InputError("no examples to evaluate", expected="at least one example")
    was = model.training
    model.eval()
    total, units = 0.0, 0
    try:
        with torch.inference_mode():
            for idx in length_batches([e.num_frames for e in ex], batch_size=batch_size):
                loss, count = model.loss(make_batch(ex, idx).to(model.device))
                total += float(loss)
                units += count
    finally:
        model.train(was)
    return total / max(units, 1), units


def char_tokens(words: Sequence[str]) -> tuple[str, ...]:
    """The characters of a word sequence with ``▁`` between words (the CER tokens).

    >>> char_tokens(("GO", "ON"))
    ('G', 'O', '▁', 'O', 'N')
    """
    return tuple(WORD_BOUNDARY.join(words))


@dataclass(frozen=True)
class Evaluation:
    """WER and CER of a decoding, with its N-best lists (1-best = ``nbest[i].best``)."""

    wer: WerResult
    cer: WerResult
    nbest: list[NBest]


def evaluate(model: AcousticModel, tokenizer: Tokenizer, examples: Sequence[Example], *,
             method: Literal["greedy", "beam"] = "greedy", **options: Any) -> Evaluation:
    """Decode ``examples`` (:func:`privasr.asr.search.decode` with ``options``) and score the 1-best against
    their words: WER on words, CER on :func:`char_tokens`."""
    from privasr.asr.search import decode

    ex = list(examples)
    if not ex:
        raise InputError("no examples to evaluate", expected="at least one example")
    nbs = decode(model, tokenizer, [e.features for e in ex], [e.utt_id for e in ex], method=method,
                 refs=[e.words for e in ex], speakers=[e.speaker for e in ex], **options)
    refs = [e.words for e in ex]
    hyps = [nb.best.words for nb in nbs]
    return Evaluation(wer(refs, hyps), wer([char_tokens(r) for r in refs], [char_tokens(h) for h in hyps]), nbs)
