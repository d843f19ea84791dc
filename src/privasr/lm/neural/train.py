"""Training neural LMs: from scratch, fine-tuned from a checkpoint, or with all but the output layer frozen.

:func:`train_lm` is the Python entry point and ``privasr lm train-neural`` the command line. What it does:

* **Data.** Sentences (lists of words; a string is split on whitespace) are encoded with the vocabulary — built
  from the training text (``max_vocab``, ``min_count``; other words become ``<unk>``), or the checkpoint's
  vocabulary when fine-tuning from ``init`` (the new text is encoded with it and its OOVs become ``<unk>``: the
  model and its softmax are not resized; the OOV rates are reported). A sentence is the input
  ``<s> w1 .. wn`` with targets ``w1 .. wn </s>``; one longer than ``max_len`` tokens is cut into windows of
  ``max_len`` (a later window's first input is the previous window's last target; context does not cross
  windows).
* **Batches** are padded batches of ``batch_size`` whole sentences (not a packed stream: an ASR LM scores
  sentences independently, so it is trained the same way). Each epoch shuffles with a generator seeded by
  ``(seed, epoch)``; with ``bucket`` the shuffled sentences are sorted by length within pools of
  ``50 * batch_size`` and the batches shuffled again, which cuts padding. Padding is ignored by the loss.
* **Optimisation**: Adam (``optimizer="adam"``, with ``weight_decay`` as AdamW) or SGD (``momentum``); linear
  warm-up over ``warmup_steps``, then a ``constant``, ``cosine`` (to 0 at the last step) or ``plateau``
  (multiply by ``lr_decay`` after each validation that does not improve) schedule; gradient clipping at
  ``clip_norm`` (0 = off); mixed precision (bf16, else fp16 with loss scaling) only on CUDA (``amp``).
* **Validation** perplexity after every epoch and every ``valid_every`` steps: per token, over the words and
  ``</s>``, with OOV words scored as ``<unk>`` (so it is not comparable with an n-gram perplexity that leaves
  OOVs out). Early stopping after ``patience`` validations without improvement (0 = never). The best model is
  kept (``best.pt``) and the latest state (``last.pt``, with optimizer, schedule, RNG states and counters) is
  saved at each validation; ``resume=True`` continues from ``last.pt`` and ends with the same model as an
  uninterrupted run (deterministic on CPU).
* **Loss**: cross-entropy per target token (:func:`token_nll`); a model with the class-factored softmax
  (``softmax="class"``) computes only the class softmax and the word logits of each target's class. On the CPU
  the output layer runs on the real (non-padding) tokens only, and in training the full softmax's loss computes
  its gradients a block of rows at a time, so the ``[tokens, V]`` logits never exist whole (the same loss and
  gradients to float32 rounding; 1.45x tokens/s for ``small-transformer`` on one thread); each block's softmax
  rows are computed by the compiled :mod:`privasr.lm.neural._nll` where it is built
  (:func:`compiled_output_rows`), else by torch's operations.
* **Dropout** masks come from :mod:`privasr.lm.neural.dropout`: torch's masks from torch's generator, bit for bit
  (the same losses for the same seed), drawn several times faster on the CPU where its compiled part is built.
* **Frozen layers** (paper 003, 2.3): ``freeze="output"`` trains only ``model.output_layers()`` (the output
  projection and its bias; the class and word layers of a class softmax); every other parameter stays
  bit-identical. ``freeze="none"`` trains everything.
* The result's ``metrics`` (train and valid perplexity per epoch, the validation history, the best valid
  perplexity, tokens/s) and ``run`` (the settings) are what ``privasr lm train-neural`` records in
  ``out/results.json``; the library writes only the checkpoints.

>>> sents = [["a", "b"], ["b", "a", "b"]] * 8
>>> res = train_lm(sents, sents[:4], NeuralLMConfig.preset("tiny-lstm"),
...                TrainOptions(max_epochs=2, batch_size=4, lr=0.01), progress=False)
>>> len(res.epochs), res.best_valid_ppl < len(res.vocab)
(2, True)
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privasr import progress
from privasr.errors import ConfigError, InputError
from privasr.lm.neural.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from privasr.lm.neural.models import ClassSoftmax, LstmLM, NeuralLMConfig, TransformerLM, build_model
from privasr.lm.neural.vocab import Vocabulary

try:  # after torch: the module's libgomp.so.1 then binds to torch's (see _nll.c)
    from privasr.lm.neural import _nll
except ImportError:  # built without a C compiler or OpenMP: the output layer's rows by torch's operations
    _nll = None

__all__ = ["TrainOptions", "TrainResult", "train_lm", "encode_sentences", "make_batch", "evaluate_ppl",
           "token_nll", "FREEZE_CHOICES", "RESUMABLE_CHANGES", "parse_overrides", "load_run_config", "TrainNeuralFile",
           "set_num_threads", "compiled_output_rows"]

FREEZE_CHOICES = ("none", "output")
#: training options that may differ between an interrupted run and its ``resume`` (they only decide when to stop)
RESUMABLE_CHANGES = frozenset({"max_epochs", "max_steps", "patience"})
_IGNORE = -100
_CUDA_LOSS_READS = 50
"""On CUDA, training losses are read back every this many steps (a read waits for the GPU to finish)."""
_CPU_LOSS_READS = 1


@dataclass(frozen=True)
class TrainOptions:
    """How to train (validated on creation).

    Attributes:
        batch_size: sentences per batch.
        max_epochs: passes over the training text.
        max_steps: stop after this many updates (0 = no limit).
        optimizer: ``"adam"`` (AdamW when ``weight_decay`` > 0) or ``"sgd"``.
        lr: peak learning rate.
        weight_decay: decoupled weight decay (Adam) or L2 (SGD).
        momentum: SGD momentum.
        schedule: ``"constant"``, ``"cosine"`` or ``"plateau"``.
        warmup_steps: linear warm-up updates.
        lr_decay: the plateau schedule's factor.
        clip_norm: gradient norm clipping threshold (0 = off).
        valid_every: validate every this many updates as well as after each epoch (0 = after epochs only).
        patience: stop after this many validations in a row without a new best (0 = never stop early).
        max_vocab: vocabulary size limit including ``<unk> <s> </s>`` (``None`` = all words).
        min_count: words seen fewer times in the training text are ``<unk>``.
        bucket: sort sentences by length within pools before batching (less padding).
        amp: mixed precision on CUDA (ignored on CPU).
        eval_batch_size: sentences per batch when computing perplexity.
    """

    batch_size: int = 32
    max_epochs: int = 10
    max_steps: int = 0
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.0
    schedule: str = "plateau"
    warmup_steps: int = 0
    lr_decay: float = 0.5
    clip_norm: float = 1.0
    valid_every: int = 0
    patience: int = 3
    max_vocab: int | None = None
    min_count: int = 1
    bucket: bool = True
    amp: bool = True
    eval_batch_size: int = 64

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{f.name}={v!r}", expected="an integer")
            if f.type == "float":
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ConfigError(f"{f.name}={v!r}", expected="a number")
                object.__setattr__(self, f.name, float(v))
            if f.type == "bool" and not isinstance(v, bool):
                raise ConfigError(f"{f.name}={v!r}", expected="true or false")
        for name in ("batch_size", "max_epochs", "eval_batch_size", "min_count"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}", expected="a positive integer")
        for name in ("max_steps", "warmup_steps", "valid_every", "patience"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)}", expected="0 or more")
        for name in ("weight_decay", "momentum", "clip_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)}", expected="0 or more")
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr}", expected="a positive learning rate")
        if not 0 < self.lr_decay <= 1:
            raise ConfigError(f"lr_decay={self.lr_decay}", expected="a factor in (0, 1]")
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"optimizer={self.optimizer!r}", expected="adam or sgd")
        if self.schedule not in ("constant", "cosine", "plateau"):
            raise ConfigError(f"schedule={self.schedule!r}", expected="constant, cosine or plateau")
        if self.max_vocab is not None and (isinstance(self.max_vocab, bool) or not isinstance(self.max_vocab, int)
                                           or self.max_vocab < 3):
            raise ConfigError(f"max_vocab={self.max_vocab!r}", expected="an integer of at least 3, or null")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainOptions:
        """Inverse of :meth:`to_dict`; unknown keys are a :class:`ConfigError`.

        >>> TrainOptions.from_dict({"lr": 1}).lr
        1.0
        """
        if not isinstance(data, Mapping):
            raise ConfigError("the training options are not a mapping", expected="key: value pairs")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown training option(s) {unknown}", expected=f"some of {sorted(names)}")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> TrainOptions:
        """A copy with ``changes`` applied (validated)."""
        return self.from_dict({**self.to_dict(), **changes})


@dataclass
class TrainResult:
    """What :func:`train_lm` returns.

    Attributes:
        model: the best model (lowest validation perplexity), in eval mode.
        vocab, config, options: what it was trained with (``config.vocab_size`` filled in).
        epochs: one dict per completed epoch (``epoch``, ``train_ppl``, ``valid_ppl``, ``lr``, ``steps``).
        history: every validation (``epoch``, ``step``, ``valid_ppl``, ``lr``).
        best_valid_ppl, best_epoch, best_step: the best validation and when it happened (``best_epoch`` counts
            epochs done, fractional for a validation within an epoch).
        initial_valid_ppl: the validation perplexity before training.
        steps: updates made; tokens_per_s: training tokens (targets, no padding) per second of training.
        stopped_early: whether early stopping ended the run.
        metrics: the run's metrics (what ``privasr lm train-neural`` writes to ``results.json``).
        run: the run's settings as the checkpoints record them (``train`` options, ``seed``, ``freeze``,
            ``device``, ``init``).
        out_dir: where the checkpoints went (``None``: nothing written).
    """

    model: TransformerLM | LstmLM
    vocab: Vocabulary
    config: NeuralLMConfig
    options: TrainOptions
    epochs: list[dict[str, Any]]
    history: list[dict[str, Any]]
    best_valid_ppl: float
    best_epoch: float
    best_step: int
    initial_valid_ppl: float
    steps: int
    tokens_per_s: float
    stopped_early: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None


# ---------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------
def _words(sentences: Sequence[Sequence[str] | str], what: str) -> list[Sequence[str]]:
    out: list[Sequence[str]] = []
    for i, s in enumerate(sentences, 1):
        if isinstance(s, str):
            s = s.split()
        elif not all(isinstance(w, str) for w in s):
            raise InputError(f"{what} sentence {i} is not a list of words", expected="lists of strings")
        out.append(s)
    if not out:
        raise InputError(f"the {what} text has no sentences", expected="at least one sentence")
    return out


def encode_sentences(vocab: Vocabulary, sentences: Sequence[Sequence[str]], max_len: int) -> list[np.ndarray]:
    """Token sequences ``<s> w1 .. wn </s>`` as id arrays, cut into windows of at most ``max_len + 1`` ids.

    Each array gives ``max_len`` or fewer (input, target) pairs: inputs ``a[:-1]``, targets ``a[1:]``.

    >>> v = Vocabulary.build([["a", "b"]])
    >>> [a.tolist() for a in encode_sentences(v, [["a", "b", "a"]], max_len=2)]
    [[1, 3, 4], [4, 3, 2]]
    """
    out: list[np.ndarray] = []
    for s in sentences:
        ids = np.array([vocab.bos_id, *vocab.encode(s), vocab.eos_id], dtype=np.int64)
        for start in range(0, len(ids) - 1, max_len):
            out.append(ids[start:start + max_len + 1])
    return out


def make_batch(seqs: Sequence[np.ndarray], device: torch.device | str = "cpu",
               pad_to: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``(inputs, targets)`` ``[B, T]`` of encoded sequences; padded targets are -100 (ignored).

    ``pad_to`` rounds ``T`` up to a multiple of it. Trailing padding changes no real position's output (the
    models are causal), and on CUDA it keeps the number of distinct batch shapes small: bf16 autocast there
    was measured 10x slower per step on batches of ever-new lengths than on recurring ones.

    >>> x, y = make_batch([np.array([1, 3, 2]), np.array([1, 2])])
    >>> x.tolist(), y.tolist()
    ([[1, 3], [1, 0]], [[3, 2], [2, -100]])
    >>> tuple(make_batch([np.array([1, 3, 2])], pad_to=8)[0].shape)
    (1, 8)
    """
    t = max(len(s) for s in seqs) - 1
    t = -(-t // pad_to) * pad_to
    x = np.zeros((len(seqs), t), dtype=np.int64)
    y = np.full((len(seqs), t), _IGNORE, dtype=np.int64)
    for i, s in enumerate(seqs):
        x[i, : len(s) - 1] = s[:-1]
        y[i, : len(s) - 1] = s[1:]
    if torch.device(device).type == "cuda":  # through pinned memory, without waiting for the GPU
        return (torch.from_numpy(x).pin_memory().to(device, non_blocking=True),
                torch.from_numpy(y).pin_memory().to(device, non_blocking=True))
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def _epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, bucket: bool) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, epoch])
    perm = rng.permutation(len(lengths))
    if not bucket:
        return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]
    pool = 50 * batch_size
    batches: list[np.ndarray] = []
    for lo in range(0, len(perm), pool):
        chunk = perm[lo:lo + pool]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size))
    order = rng.permutation(len(batches))
    return [batches[i] for i in order]


def _pad_to(device: torch.device | str) -> int:
    """Batch lengths are rounded up to a multiple of 8 on CUDA (few distinct shapes), not on the CPU."""
    return 8 if torch.device(device).type == "cuda" else 1


def _autocast(device: torch.device, amp_dtype: torch.dtype | None):
    if amp_dtype is None:
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


@torch.no_grad()
def evaluate_ppl(model: nn.Module, seqs: Sequence[np.ndarray], *, batch_size: int = 64,
                 device: torch.device | str = "cpu", amp_dtype: torch.dtype | None = None) -> tuple[float, int]:
    """Perplexity (natural-log based, per target token) of encoded sequences and the number of tokens.

    The model is put in eval mode and left there.
    """
    model.eval()
    device = torch.device(device)
    order = np.argsort([len(s) for s in seqs], kind="stable")
    total, count = 0.0, 0
    for lo in range(0, len(order), batch_size):
        x, y = make_batch([seqs[i] for i in order[lo:lo + batch_size]], device, _pad_to(device))
        with _autocast(device, amp_dtype):
            total += float(token_nll(model, x, y))
        count += int((y != _IGNORE).sum())
    return (math.exp(total / count) if count else math.nan), count


def token_nll(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The summed negative log-likelihood (natural log, fp32 scalar) of targets ``y`` (-100 = padding) after
    inputs ``x``.

    A model with a full softmax goes through its logits and ``cross_entropy`` (on the CPU, of the non-padding
    positions only); one with a class-factored
    softmax (:class:`~privasr.lm.neural.models.ClassSoftmax`) computes only what the targets need: its hidden
    states, then :meth:`~privasr.lm.neural.models.ClassSoftmax.target_logprob` of the non-padding positions
    (``H * (C + |class|)`` per token instead of ``H * V``).

    >>> from privasr.lm.neural.models import NeuralLMConfig, build_model
    >>> v = Vocabulary.build([["a", "b"]])
    >>> m = build_model(NeuralLMConfig.preset("tiny-lstm-class"), v)
    >>> x, y = make_batch([np.array([1, 3, 4, 2]), np.array([1, 2])])
    >>> full = F.cross_entropy(m(x)[0].flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
    >>> bool(torch.allclose(token_nll(m, x, y), full, atol=1e-5))
    True
    """
    if isinstance(getattr(model, "output", None), ClassSoftmax):
        h, _ = model.hidden(x)  # type: ignore[operator]
        keep = y != _IGNORE
        return -model.output.target_logprob(h[keep], y[keep]).sum()  # type: ignore[union-attr, operator]
    if y.device.type == "cpu":
        # the output layer and softmax of the real tokens only (padding is a fifth of AMI batches); on CUDA the
        # selection would wait for the GPU, so there the padded positions are computed and ignored
        h, _ = model.hidden(x)  # type: ignore[operator]
        keep = (y != _IGNORE).flatten()
        h, targets, out = h.flatten(0, 1)[keep], y.flatten()[keep], model.output
        if torch.is_grad_enabled() and h.dtype == torch.float32 and isinstance(out, nn.Linear):
            return _LinearNll.apply(h, out.weight, out.bias, targets, True)
        return F.cross_entropy(out(h).float(), targets, reduction="sum")  # type: ignore[operator]
    logits, _ = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=_IGNORE, reduction="sum")


class _LinearNll(torch.autograd.Function):
    """``cross_entropy(h @ weight.T + bias, targets, reduction="sum")`` on the CPU, with its gradients computed
    in the forward pass a block of rows at a time: the ``[N, V]`` logits never exist whole (one block-sized
    buffer is reused), so the passes over them (the log-softmax and its backward) run from cache instead of
    memory. The rows of a block (bias, log-sum-exp, loss, softmax gradient and the bias gradient's column sums)
    are done by the compiled :mod:`privasr.lm.neural._nll` when it is built and ``compiled_rows`` is true (a row
    at a time, in torch's threads: equal to torch's operations to float rounding), else by torch's operations,
    which also take any block with a NaN or an infinity. The backward pass only scales the gradients, in place
    (so it runs once: a second backward through the same graph is refused)."""

    ROWS = 256

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                targets: torch.Tensor, compiled_rows: bool) -> torch.Tensor:
        n = h.shape[0]
        ctx.has = (h.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
        ctx.used = False
        w = weight.detach()
        b = bias.detach().contiguous() if bias is not None else None
        gh = torch.empty_like(h) if ctx.has[0] else None
        gw = torch.empty_like(w) if ctx.has[1] else None
        gb = torch.zeros_like(b) if ctx.has[2] else None  # type: ignore[arg-type]
        z_buf = h.new_empty(min(_LinearNll.ROWS, n), w.shape[0])
        compiled = (compiled_rows and _nll is not None and h.dtype == w.dtype == torch.float32
                    and (b is None or b.dtype == h.dtype))
        if compiled:
            targets = targets.to(torch.int64).contiguous()
            arrays = (b.numpy() if b is not None else None, gb.numpy() if gb is not None else None)
        parts: list[torch.Tensor | float] = []
        for lo in range(0, n, _LinearNll.ROWS):
            hc, tc = h[lo:lo + _LinearNll.ROWS], targets[lo:lo + _LinearNll.ROWS]
            z = z_buf[:len(tc)]
            torch.mm(hc, w.t(), out=z)
            loss = None
            if compiled:
                loss = _nll.nll_rows(  # type: ignore[union-attr]
                    z.numpy(), z.shape[1], arrays[0], tc.numpy(), arrays[1], torch.get_num_threads())
                if loss is None:  # a NaN or an infinity in the block: torch's operations propagate it
                    torch.mm(hc, w.t(), out=z)
            if loss is not None:
                parts.append(loss)
            else:
                if b is not None:
                    z.add_(b)  # a pass over the block: cheaper than addmm's broadcast copy before it
                # the block's loss from its log-sum-exp, then z becomes its gradient: softmax(z) - onehot(targets)
                rows = torch.arange(len(tc))
                m = z.amax(dim=1, keepdim=True)
                target = z[rows, tc] - m[:, 0]
                z.sub_(m).exp_()
                total = z.sum(dim=1, keepdim=True)
                parts.append((total[:, 0].log() - target).sum())  # lse - z[target], both relative to the max
                z.div_(total)
                z[rows, tc] -= 1.0
                if gb is not None:
                    gb.add_(z.sum(dim=0))
            if gh is not None:
                torch.mm(z, w, out=gh[lo:lo + _LinearNll.ROWS])
            if gw is not None:
                if lo == 0:
                    torch.mm(z.t(), hc, out=gw)
                else:
                    gw.addmm_(z.t(), hc)
        if gw is not None and n == 0:  # no rows: zero gradients
            gw.zero_()
        empty = torch.empty(0)
        ctx.save_for_backward(*(g if g is not None else empty for g in (gh, gw, gb)))
        return h.new_tensor(sum(float(p) for p in parts))  # the blocks' sums added in double precision

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        if ctx.used:
            raise RuntimeError("the fused training loss supports one backward pass per forward pass")
        ctx.used = True
        saved = ctx.saved_tensors
        return (*(g.mul_(grad) if has else None for g, has in zip(saved, ctx.has, strict=True)), None, None)


def compiled_output_rows() -> bool:
    """Whether training on the CPU computes the full softmax's rows with the compiled
    :mod:`privasr.lm.neural._nll` (else with torch's operations: the same losses to float rounding).

    >>> isinstance(compiled_output_rows(), bool)
    True
    """
    return _nll is not None


def _oov_rate(vocab: Vocabulary, sentences: Sequence[Sequence[str]]) -> float:
    n = sum(len(s) for s in sentences)
    oov = sum(1 for s in sentences for w in s if w not in vocab or w == "<unk>")
    return oov / n if n else 0.0


# ---------------------------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------------------------
def set_num_threads(n: int) -> None:
    """Set torch's CPU thread count (for callers that must not import torch themselves)."""
    torch.set_num_threads(n)


def _resolve_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device={device!r}", expected="cpu or cuda[:N]") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but CUDA is not available", expected="device=cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}", expected="cpu or cuda[:N]")
    return dev


def _rng_state(dev: torch.device) -> dict[str, Any]:
    st: dict[str, Any] = {"torch": torch.get_rng_state()}
    if dev.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(dev)
    return st


def _set_rng_state(st: Mapping[str, Any], dev: torch.device) -> None:
    torch.set_rng_state(st["torch"].cpu())
    if dev.type == "cuda" and "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"].cpu(), dev)


class _Progress:
    """The trainer's bars (:mod:`privasr.progress`): one per epoch, the previous one closed when the next opens;
    or nothing when ``enabled`` is false."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._current: Any = None

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close()

    def _close(self) -> None:
        if self._current is not None:
            self._current.__exit__(None, None, None)
            self._current = None

    def task(self, description: str, total: int, completed: int = 0) -> Any:
        if not self.enabled:
            return None
        self._close()
        self._current = progress.task(description, total=total, completed=completed)
        return self._current.__enter__()

    def update(self, task: Any, **kw: Any) -> None:
        if task is not None:
            task.update(**kw)

    def log(self, text: str) -> None:
        if self.enabled:
            progress.note(text)


def _lr_factor(opts: TrainOptions, step: int, total_steps: int, plateau_scale: float) -> float:
    f = min(1.0, step / opts.warmup_steps) if opts.warmup_steps else 1.0
    if opts.schedule == "cosine":
        f *= 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / max(1, total_steps))))
    elif opts.schedule == "plateau":
        f *= plateau_scale
    return f


def _load_init(init: str | os.PathLike[str] | Checkpoint) -> Checkpoint:
    return init if isinstance(init, Checkpoint) else load_checkpoint(init)


def _setup_source(config: NeuralLMConfig | None, opts: TrainOptions, out: Path | None,
                  init: str | os.PathLike[str] | Checkpoint | None, resume: bool, seed: int, freeze: str,
                  train_words: Sequence[Sequence[str]],
                  ) -> tuple[Vocabulary, NeuralLMConfig, Checkpoint | None]:
    """The vocabulary, the model config and the checkpoint whose weights start the run (``None``: from scratch).

    Resuming takes all three from ``out/last.pt`` (checking that nothing but :data:`RESUMABLE_CHANGES`
    differs), fine-tuning from ``init`` (only ``dropout`` may differ), training from scratch builds the
    vocabulary from the training text.
    """
    if resume:
        return _resume_source(config, opts, out, seed, freeze)
    if init is not None:
        init_ck = _load_init(init)
        model_cfg = init_ck.config
        if config is not None:
            cfg = config.replace(vocab_size=model_cfg.vocab_size)
            if cfg.replace(dropout=model_cfg.dropout) != model_cfg:
                diff = sorted(k for k, v in cfg.to_dict().items() if model_cfg.to_dict()[k] != v and k != "dropout")
                raise ConfigError(f"the model config differs from the --init checkpoint's in {diff}",
                                  expected="the checkpoint's architecture (only dropout may change)")
            model_cfg = cfg
        return init_ck.vocab, model_cfg, init_ck
    if config is None:
        raise ConfigError("a model config is needed to train from scratch")
    vocab = Vocabulary.build(train_words, max_size=opts.max_vocab, min_count=opts.min_count)
    return vocab, (config.replace(vocab_size=0) if config.vocab_size != len(vocab) else config), None


def _resume_source(config: NeuralLMConfig | None, opts: TrainOptions, out: Path | None, seed: int,
                   freeze: str) -> tuple[Vocabulary, NeuralLMConfig, Checkpoint]:
    """``out/last.pt``'s vocabulary, config and checkpoint, after checking the run may resume from it."""
    if out is None:
        raise ConfigError("resume needs out_dir (where last.pt is)")
    resumed = load_checkpoint(out / "last.pt")
    if resumed.train_state is None:
        raise InputError("the checkpoint has no training state to resume from", path=out / "last.pt")
    model_cfg = resumed.config
    saved = resumed.extra.get("run", {})
    if config is not None and config.replace(vocab_size=model_cfg.vocab_size) != model_cfg:
        raise ConfigError("resume: the model config differs from the one in last.pt")
    changed = {k for k, v in opts.to_dict().items() if saved.get("train", {}).get(k) != v}
    if changed - RESUMABLE_CHANGES:
        raise ConfigError(f"resume: training options {sorted(changed - RESUMABLE_CHANGES)} differ from the "
                          f"interrupted run's", expected=f"only {sorted(RESUMABLE_CHANGES)} may change")
    if saved.get("seed") != seed or saved.get("freeze") != freeze:
        raise ConfigError(f"resume: seed/freeze ({seed}, {freeze}) differ from the interrupted run's "
                          f"({saved.get('seed')}, {saved.get('freeze')})")
    return resumed.vocab, model_cfg, resumed


def _build_trainable(model_cfg: NeuralLMConfig, vocab: Vocabulary, start: Checkpoint | None, seed: int,
                     dev: torch.device, freeze: str) -> tuple[TransformerLM | LstmLM, list[nn.Parameter]]:
    """The model (seeded, with ``start``'s weights if given, on ``dev``) and its trainable parameters."""
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = build_model(model_cfg, vocab)
    if start is not None:
        model.load_state_dict(start.model.state_dict())
    model.to(dev)
    if freeze == "output":
        keep = {id(p) for layer in model.output_layers() for p in layer.parameters()}
        for p in model.parameters():
            p.requires_grad_(id(p) in keep)
    return model, [p for p in model.parameters() if p.requires_grad]


def _optimizer(params: list[nn.Parameter], opts: TrainOptions) -> torch.optim.Optimizer:
    if opts.optimizer == "adam":
        # Adam's fused kernel (CUDA and CPU): one pass over each parameter instead of one per operation
        fused = {"fused": True} if params and all(p.device.type in ("cuda", "cpu") for p in params) else {}
        return torch.optim.AdamW(params, lr=opts.lr, weight_decay=opts.weight_decay, **fused) \
            if opts.weight_decay else torch.optim.Adam(params, lr=opts.lr, **fused)
    return torch.optim.SGD(params, lr=opts.lr, momentum=opts.momentum, weight_decay=opts.weight_decay)


def _mixed_precision(dev: torch.device, opts: TrainOptions) -> tuple[torch.dtype | None, Any]:
    """The autocast dtype (``None``: fp32) and the fp16 loss scaler (``None``: no scaling)."""
    if dev.type != "cuda" or not opts.amp:
        return None, None
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, None
    return torch.float16, torch.amp.GradScaler("cuda")


def _init_source(init: str | os.PathLike[str] | Checkpoint | None) -> str | None:
    """How ``results.json`` and the checkpoints name the ``init`` checkpoint."""
    if init is None:
        return None
    return str(init) if not isinstance(init, Checkpoint) else str(init.path or "<checkpoint object>")


class _Trainer:
    """One training run's state and stages: start or resume, epochs of update steps, validations, checkpoints.

    ``st`` holds every counter a resume needs (saved in ``last.pt``); ``best_state`` the best weights so far.
    """

    def __init__(self, model: TransformerLM | LstmLM, params: list[nn.Parameter], vocab: Vocabulary,
                 opts: TrainOptions, train_seqs: list[np.ndarray], valid_seqs: list[np.ndarray], *, seed: int,
                 dev: torch.device, out: Path | None, run_info: dict[str, Any],
                 on_validation: Callable[[dict[str, Any]], None] | None) -> None:
        self.model, self.params, self.vocab, self.opts = model, params, vocab, opts
        self.model_cfg = model.config
        self.train_seqs, self.valid_seqs = train_seqs, valid_seqs
        self.seed, self.dev, self.out, self.run_info, self.on_validation = seed, dev, out, run_info, on_validation
        self.optim = _optimizer(params, opts)
        self.amp_dtype, self.scaler = _mixed_precision(dev, opts)
        self.lengths = np.array([len(s) - 1 for s in train_seqs])
        self.n_batches = math.ceil(len(train_seqs) / opts.batch_size)
        self.total_steps = opts.max_steps or opts.max_epochs * self.n_batches
        self.st: dict[str, Any] = {}
        self.best_state: dict[str, torch.Tensor] | None = None
        # (step, loss tensor, tokens) not yet read back: on CUDA reading a loss waits for the GPU, so losses are
        # read every _CUDA_LOSS_READS steps (and before validating, saving or ending); on the CPU every step
        self._pending: list[tuple[int, torch.Tensor, int]] = []
        self._read_every = _CUDA_LOSS_READS if dev.type == "cuda" else _CPU_LOSS_READS

    # -- start ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """A fresh run: the validation perplexity before training and zeroed counters."""
        initial = self._valid_ppl()
        self.st = {"epoch": 0, "batch": 0, "step": 0, "best_ppl": math.inf, "best_epoch": 0, "best_step": 0,
                   "bad": 0, "plateau": 1.0, "history": [], "epochs": [], "loss_sum": 0.0, "loss_tokens": 0,
                   "train_time": 0.0, "train_tokens": 0, "stopped_early": False, "initial_ppl": initial,
                   "done": False}

    def resume(self, resumed: Checkpoint) -> None:
        """Counters, optimizer, loss scaler, best weights and RNG states of the interrupted run."""
        st = copy.deepcopy(resumed.train_state)
        self.optim.load_state_dict(st.pop("optimizer"))
        if self.scaler is not None and "scaler" in st:
            self.scaler.load_state_dict(st.pop("scaler"))
        st.pop("scaler", None)
        self.run_info["init"] = resumed.extra.get("run", {}).get("init")
        best_path = self.out / "best.pt"  # type: ignore[operator]
        self.best_state = load_checkpoint(best_path).model.state_dict() if best_path.exists() else None
        _set_rng_state(st.pop("rng"), self.dev)
        self.st = st

    # -- training -------------------------------------------------------------------------------------------
    def train(self, bar: _Progress) -> None:
        """Epochs until ``max_epochs``, ``max_steps`` or early stopping (a resumed run may go on past where the
        interrupted one stopped: a larger ``max_epochs`` or ``max_steps``)."""
        st, opts = self.st, self.opts
        self.model.train()
        while not st["stopped_early"] and st["epoch"] < opts.max_epochs \
                and not (opts.max_steps and st["step"] >= opts.max_steps):
            if not self._epoch(bar):
                break
            self._end_epoch(bar)
        self._read_losses()

    def _epoch(self, bar: _Progress) -> bool:
        """The rest of the current epoch's batches (with any ``valid_every`` validations); ``False`` when it
        stopped mid-epoch (``max_steps`` or early stopping)."""
        st, opts = self.st, self.opts
        batches = _epoch_batches(self.lengths, opts.batch_size, self.seed, st["epoch"], opts.bucket)
        task = bar.task(f"epoch {st['epoch'] + 1}/{opts.max_epochs}", len(batches), st["batch"])
        validated_here = False
        while st["batch"] < len(batches):
            if opts.max_steps and st["step"] >= opts.max_steps:
                break
            lr = self._step(batches[st["batch"]])
            st["batch"] += 1
            tps = st["train_tokens"] / max(st["train_time"], 1e-9)
            ppl = math.exp(st["loss_sum"] / st["loss_tokens"]) if st["loss_tokens"] else math.nan
            bar.update(task, completed=st["batch"], info=f"ppl {ppl:8.2f}  lr {lr:.2e}  {tps:,.0f} tok/s")
            validated_here = False
            if opts.valid_every and st["step"] % opts.valid_every == 0 and st["batch"] < len(batches):
                self._validate()
                validated_here = True
                self._save_last()
                if st["stopped_early"]:
                    break
        if st["batch"] < len(batches):
            # stopped early (just validated and saved) or max_steps reached mid-epoch: no unscheduled validation
            # (resume must see the same schedule state as an uninterrupted run)
            if not validated_here:
                self._save_last()
            return False
        return True

    def _step(self, batch: np.ndarray) -> float:
        """One update on the sentences ``batch``; returns its learning rate."""
        st, opts, optim, scaler = self.st, self.opts, self.optim, self.scaler
        t0 = time.perf_counter()
        seqs = [self.train_seqs[i] for i in batch]
        ntok = sum(len(s) - 1 for s in seqs)  # the targets, counted on the host (no wait for the GPU)
        x, y = make_batch(seqs, self.dev, _pad_to(self.dev))
        st["step"] += 1
        lr = opts.lr * _lr_factor(opts, st["step"], self.total_steps, st["plateau"])
        for g in optim.param_groups:
            g["lr"] = lr
        with _autocast(self.dev, self.amp_dtype):
            loss = token_nll(self.model, x, y) / max(1, ntok)
        optim.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optim)
        else:
            loss.backward()
        if opts.clip_norm:
            torch.nn.utils.clip_grad_norm_(self.params, opts.clip_norm)
        if scaler is not None:
            scaler.step(optim)
            scaler.update()
        else:
            optim.step()
        self._pending.append((st["step"], loss.detach(), ntok))
        st["train_time"] += time.perf_counter() - t0
        st["train_tokens"] += ntok
        if len(self._pending) >= self._read_every:
            self._read_losses()
        return lr

    def _read_losses(self) -> None:
        """Add the pending steps' losses to the running sums (waiting for the GPU: the wait counts as training
        time); a non-finite loss stops the run, naming its step."""
        if not self._pending:
            return
        st = self.st
        t0 = time.perf_counter()
        values = torch.stack([loss for _, loss, _ in self._pending]).double().cpu().tolist()
        st["train_time"] += time.perf_counter() - t0
        pending, self._pending = self._pending, []
        for (step, _, ntok), lv in zip(pending, values, strict=True):
            if not math.isfinite(lv):
                raise InputError(f"the training loss became {lv} at step {step}",
                                 expected="a smaller learning rate or gradient clipping")
            st["loss_sum"] += lv * ntok
            st["loss_tokens"] += ntok

    def _end_epoch(self, bar: _Progress) -> None:
        """The end-of-epoch validation, the epoch's record and ``last.pt``."""
        self._read_losses()
        st = self.st
        train_ppl = math.exp(st["loss_sum"] / st["loss_tokens"]) if st["loss_tokens"] else math.nan
        st["epoch"] += 1
        st["batch"] = 0
        self._validate()
        st["epochs"].append({"epoch": st["epoch"], "train_ppl": train_ppl,
                             "valid_ppl": st["history"][-1]["valid_ppl"], "lr": self.optim.param_groups[0]["lr"],
                             "steps": st["step"]})
        bar.log(f"epoch {st['epoch']}: train ppl {train_ppl:.2f}, valid ppl "
                f"{st['history'][-1]['valid_ppl']:.2f} (best {st['best_ppl']:.2f})")
        st["loss_sum"], st["loss_tokens"] = 0.0, 0
        self._save_last()

    # -- validation, early stopping, checkpoints ------------------------------------------------------------
    def _valid_ppl(self) -> float:
        return evaluate_ppl(self.model, self.valid_seqs, batch_size=self.opts.eval_batch_size, device=self.dev,
                            amp_dtype=self.amp_dtype)[0]

    def _validate(self) -> None:
        """A validation: its record, the best model (``best.pt``), the plateau schedule and early stopping."""
        self._read_losses()
        st, opts = self.st, self.opts
        ppl = self._valid_ppl()
        self.model.train()
        rec = {"epoch": st["epoch"] + st["batch"] / self.n_batches, "step": st["step"], "valid_ppl": ppl,
               "lr": self.optim.param_groups[0]["lr"]}
        st["history"].append(rec)
        if ppl < st["best_ppl"]:
            st.update(best_ppl=ppl, best_epoch=rec["epoch"], best_step=st["step"], bad=0)
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self._save_best()
        else:
            st["bad"] += 1
            if opts.schedule == "plateau":
                st["plateau"] *= opts.lr_decay
            if opts.patience and st["bad"] >= opts.patience:
                st["stopped_early"] = True
        if self.on_validation is not None:
            self.on_validation(dict(rec))

    def _checkpoint_extra(self) -> dict[str, Any]:
        return {"run": self.run_info, "epoch": self.st["epoch"], "step": self.st["step"],
                "best_valid_ppl": self.st["best_ppl"]}

    def _save_best(self) -> None:
        if self.out is not None:
            save_checkpoint(self.out / "best.pt", self.model, self.vocab, self.model_cfg,
                            extra=self._checkpoint_extra())

    def _save_last(self) -> None:
        self._read_losses()
        if self.out is None:
            return
        ts = {**self.st, "optimizer": self.optim.state_dict(), "rng": _rng_state(self.dev)}
        if self.scaler is not None:
            ts["scaler"] = self.scaler.state_dict()
        save_checkpoint(self.out / "last.pt", self.model, self.vocab, self.model_cfg,
                        extra=self._checkpoint_extra(), train_state=ts)

    # -- end ------------------------------------------------------------------------------------------------
    def finish(self) -> tuple[TransformerLM | LstmLM, dict[str, Any]]:
        """The best model (in eval mode, on the device) and the best validation's ``best_valid_ppl``,
        ``best_epoch``, ``best_step`` and ``final_valid_ppl``.

        The final model's validation perplexity is the last scheduled validation's, or a fresh one that changes
        no training state. With no scheduled validation yet (``max_steps`` before the first), the final model
        is the best.
        """
        st = self.st
        if st["history"] and st["history"][-1]["step"] == st["step"]:
            final_ppl = st["history"][-1]["valid_ppl"]
        else:
            final_ppl = self._valid_ppl()
        best = {"best_valid_ppl": st["best_ppl"], "best_epoch": st["best_epoch"], "best_step": st["best_step"],
                "final_valid_ppl": final_ppl}
        if self.best_state is None:
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            best.update(best_valid_ppl=final_ppl, best_epoch=st["epoch"] + st["batch"] / self.n_batches,
                        best_step=st["step"])
            self._save_best()
        with torch.device("cpu"):
            model = build_model(self.model_cfg, self.vocab)
        model.load_state_dict(self.best_state)
        model.to(self.dev).eval()
        return model, best

    def metrics(self, best: Mapping[str, Any], train_words: Sequence[Sequence[str]],
                valid_words: Sequence[Sequence[str]]) -> dict[str, Any]:
        """The run's metrics (:attr:`TrainResult.metrics`)."""
        st, vocab = self.st, self.vocab
        return {
            "train_ppl": [e["train_ppl"] for e in st["epochs"]],
            "valid_ppl": [e["valid_ppl"] for e in st["epochs"]],
            "best_valid_ppl": best["best_valid_ppl"], "best_epoch": best["best_epoch"],
            "best_step": best["best_step"], "final_valid_ppl": best["final_valid_ppl"],
            "valid_ppl_initial": st["initial_ppl"], "epochs_completed": st["epoch"], "steps": st["step"],
            "stopped_early": st["stopped_early"], "tokens_per_s": self.tokens_per_s(),
            "train_seconds": st["train_time"], "train_tokens": st["train_tokens"], "vocab_size": len(vocab),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "trainable_parameters": sum(p.numel() for p in self.params),
            "train_oov_rate": _oov_rate(vocab, train_words), "valid_oov_rate": _oov_rate(vocab, valid_words),
            "valid_tokens": sum(len(s) - 1 for s in self.valid_seqs), "history": st["history"],
            "epochs": st["epochs"],
        }

    def tokens_per_s(self) -> float:
        return self.st["train_tokens"] / self.st["train_time"] if self.st["train_time"] else math.nan


def train_lm(
    train_sentences: Sequence[Sequence[str] | str],
    valid_sentences: Sequence[Sequence[str] | str],
    config: NeuralLMConfig | None,
    train_options: TrainOptions | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    init: str | os.PathLike[str] | Checkpoint | None = None,
    freeze: str = "none",
    seed: int = 0,
    device: str = "cpu",
    progress: bool = True,
    *,
    resume: bool = False,
    on_validation: Callable[[dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train a neural LM (see the module docstring); returns the best model and the training record.

    Args:
        train_sentences, valid_sentences: tokenised sentences (or whitespace-separated strings).
        config: the architecture; ``None`` with ``init`` (or ``resume``) takes the checkpoint's. With ``init`` a
            given config may differ from the checkpoint's only in ``dropout``.
        train_options: optimisation options (defaults: :class:`TrainOptions`).
        out_dir: where ``best.pt`` and ``last.pt`` go (``None``: write nothing).
        init: a checkpoint (path or loaded) to fine-tune; its vocabulary is used.
        freeze: ``"none"`` (train everything) or ``"output"`` (only ``model.output_layers()``).
        seed: seeds the weights, dropout and the batch order.
        device: ``"cpu"`` or ``"cuda[:N]"``.
        progress: show rich progress bars on stderr.
        resume: continue from ``out_dir/last.pt`` (same data, config, seed, freeze and options except
            :data:`RESUMABLE_CHANGES`).
        on_validation: called with each validation record (for logging or experiment hooks).
    """
    opts = train_options or TrainOptions()
    if freeze not in FREEZE_CHOICES:
        raise ConfigError(f"freeze={freeze!r}", expected=" or ".join(FREEZE_CHOICES))
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed={seed!r}", expected="an integer")
    dev = _resolve_device(device)
    out = Path(out_dir) if out_dir is not None else None
    train_words = _words(train_sentences, "training")
    valid_words = _words(valid_sentences, "validation")

    vocab, model_cfg, start = _setup_source(config, opts, out, init, resume, seed, freeze, train_words)
    model, params = _build_trainable(model_cfg, vocab, start, seed, dev, freeze)
    run_info = {"train": opts.to_dict(), "seed": seed, "freeze": freeze, "device": str(dev),
                "init": _init_source(init)}
    trainer = _Trainer(model, params, vocab, opts, encode_sentences(vocab, train_words, model.config.max_len),
                       encode_sentences(vocab, valid_words, model.config.max_len), seed=seed, dev=dev, out=out,
                       run_info=run_info, on_validation=on_validation)
    if resume:
        trainer.resume(start)  # type: ignore[arg-type]
    else:
        trainer.start()
    with _Progress(progress) as bar:
        trainer.train(bar)
    best_model, best = trainer.finish()
    st = trainer.st
    return TrainResult(model=best_model, vocab=vocab, config=model.config, options=opts, epochs=list(st["epochs"]),
                       history=list(st["history"]), best_valid_ppl=best["best_valid_ppl"],
                       best_epoch=best["best_epoch"], best_step=best["best_step"],
                       initial_valid_ppl=st["initial_ppl"], steps=st["step"], tokens_per_s=trainer.tokens_per_s(),
                       stopped_early=st["stopped_early"], metrics=trainer.metrics(best, train_words, valid_words),
                       run=run_info, out_dir=out)


# ---------------------------------------------------------------------------------------------------------------
# configuration from files and --set overrides (the command line)
# ---------------------------------------------------------------------------------------------------------------
_MODEL_KEYS = frozenset(f.name for f in dataclasses.fields(NeuralLMConfig))
_TRAIN_KEYS = frozenset(f.name for f in dataclasses.fields(TrainOptions))


def parse_overrides(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``key=value`` strings into (model, train) override dicts; values are YAML (``0.1``, ``true``, ``[1, 2]``).

    A key is ``model.NAME``, ``train.NAME`` or a bare ``NAME`` of either (the names do not overlap).

    >>> parse_overrides(["layers=1", "train.lr=0.01", "char_filters=[[1, 4]]"])
    ({'layers': 1, 'char_filters': [[1, 4]]}, {'lr': 0.01})
    """
    import yaml

    model: dict[str, Any] = {}
    train: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r} is not key=value", expected="e.g. --set layers=2 or train.lr=0.01")
        section, _, name = key.rpartition(".")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML") from None
        if section == "model" or (not section and name in _MODEL_KEYS):
            if name not in _MODEL_KEYS:
                raise ConfigError(f"--set {item!r}: no model option {name!r}", expected=f"one of {sorted(_MODEL_KEYS)}")
            model[name] = parsed
        elif section == "train" or (not section and name in _TRAIN_KEYS):
            if name not in _TRAIN_KEYS:
                raise ConfigError(f"--set {item!r}: no training option {name!r}",
                                  expected=f"one of {sorted(_TRAIN_KEYS)}")
            train[name] = parsed
        else:
            raise ConfigError(f"--set {item!r}: unknown option {key!r}",
                              expected=f"model.* ({sorted(_MODEL_KEYS)}) or train.* ({sorted(_TRAIN_KEYS)})")
    return model, train


@dataclass(frozen=True)
class TrainNeuralFile:
    """The config file of ``privasr lm train-neural`` (schema of :mod:`privasr.config`): a preset, model
    options over it (:class:`~privasr.lm.neural.models.NeuralLMConfig` fields) and training options
    (:class:`TrainOptions` fields), each checked by its own class."""

    preset: str | None = None
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)


def load_run_config(config_file: str | os.PathLike[str] | None = None, preset: str | None = None,
                    overrides: Sequence[str] = (), init_config: NeuralLMConfig | None = None,
                    ) -> tuple[NeuralLMConfig, TrainOptions]:
    """The model config and training options of ``privasr lm train-neural``.

    ``config_file`` (YAML or JSON) may hold ``preset: NAME``, ``model: {...}`` and ``train: {...}``; ``preset``
    overrides the file's preset, then the file's ``model`` keys and the ``overrides`` apply. With
    ``init_config`` (fine-tuning) the architecture is the checkpoint's: no preset is allowed and only
    ``dropout`` may be overridden.

    >>> cfg, opts = load_run_config(preset="tiny-lstm", overrides=["layers=1", "lr=0.1"])
    >>> cfg.layers, opts.lr
    (1, 0.1)
    """
    data: dict[str, Any] = {}
    where = None
    if config_file is not None:
        import yaml

        from privasr.config import from_mapping
        from privasr.corpus.textio import read_text

        where = Path(config_file)
        try:
            raw = yaml.safe_load(read_text(where)) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"not valid YAML/JSON: {e}", path=where) from None
        try:
            parsed = from_mapping(TrainNeuralFile, raw)
        except ConfigError as e:
            raise ConfigError(e.message, path=where, expected=e.expected) from None
        data = {"preset": parsed.preset, "model": parsed.model, "train": parsed.train}
    model_set, train_set = parse_overrides(overrides)
    try:
        file_model = dict(data.get("model") or {})
        train_opts = TrainOptions.from_dict({**dict(data.get("train") or {}), **train_set})
        name = preset or data.get("preset")
        if init_config is not None:
            changed = {**file_model, **model_set}
            if name is not None or set(changed) - {"dropout"}:
                raise ConfigError("fine-tuning (--init) keeps the checkpoint's architecture: give no preset and "
                                  f"no model options but dropout (got preset={name!r}, {sorted(changed)})")
            return init_config.replace(**changed), train_opts
        if name is None and not file_model:
            raise ConfigError("no model: give --preset NAME or a config file with preset/model",
                              expected="e.g. --preset small-transformer")
        base = NeuralLMConfig.preset(name).to_dict() if name is not None else {}
        return NeuralLMConfig.from_dict({**base, **file_model, **model_set}), train_opts
    except ConfigError as e:
        if where is None or e.path is not None:
            raise
        raise ConfigError(e.message, path=where, expected=e.expected) from None
