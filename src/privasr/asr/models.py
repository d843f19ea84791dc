"""Acoustic models of paper 002 (section 2.2): a BiLSTM + LayerNorm encoder, location-aware attention seq2seq, CTC.

Paper 002 (Dimitriadis et al., "A Federated Approach in Training Acoustic Models", 2.2 and 4) trains an
attention-based sequence-to-sequence model (LAS style):

* **encoder**: a stack of bidirectional LSTMs with Layer Normalisation (Ba et al. 2016), eq. (1); section 4
  uses 6 bLSTM layers "with dropouts" over 3 stacked 80-dim filter-bank frames;
* **attention**: location-aware (Chorowski et al. 2015, the paper's [15]), single head, eq. (2):
  ``e_{n,t} = w^T tanh(W d_n + V h_t + U f_{n,t} + b)`` with ``f_n = F * alpha_{n-1}`` (a 1-D convolution of
  the previous attention weights), ``alpha_n = softmax_t(e_n)`` over the valid (unpadded) frames and the
  context ``c_n = sum_t alpha_{n,t} h_t``;
* **decoder**: a multi-layer unidirectional LSTM (2 layers in section 4), eq. (3):
  ``d_n, h^dec_n = Decoder(y_{n-1}, c_{n-1}, h^dec_{n-1})`` -- its input is the embedding of the previous unit
  concatenated with the previous context -- and ``DecoderOut`` (eq. 4), an affine layer over ``[c_n; d_n]``
  followed by a softmax;
* **loss**: cross entropy against ``r_1 .. r_N <eos>`` with teacher forcing (optionally label smoothing).

Details the paper does not state, and what we chose (following the cited literature / common LAS recipes):
the layer widths of ``paper002`` (512 units per direction, 512 decoder units, attention dimension 512, 10
convolution channels of width 201 as in Chorowski et al. and ESPnet, dropout 0.2); ``alpha_0`` uniform over the
valid frames and ``c_0 = 0``; LayerNorm then dropout after every encoder layer; no encoder frame subsampling
beyond the 3-frame stacking (optional here: ``subsample`` merges frames between layers, by concatenation as in
pyramidal LAS or by skipping).

:class:`CtcModel` is the same encoder with a linear layer over the units (``<blank>`` included) and CTC loss
(Graves et al. 2006). :class:`Seq2SeqModel` with ``ctc_weight > 0`` adds a CTC head on its encoder (the joint
CTC-attention loss of Kim, Hori & Watanabe 2017: ``(1 - w) * CE + w * CTC``).

**Output units and special ids.** The output layer has one row per tokenizer unit
(:mod:`privasr.asr.units`: ``<blank>`` = 0, ``<sos>`` = 1, ``<eos>`` = 2, ``<unk>`` = 3, then the units).
The attention decoder never emits ``<blank>`` or ``<sos>`` and CTC never emits ``<sos>``/``<eos>``: those
logits are replaced by :data:`MASKED_LOGIT` (a large finite negative: an infinite one makes the CTC gradient
NaN), so they have probability 0 in float32. No padding id exists: batches are padded with
:data:`PAD_ID` and every padded position is masked by the lengths, so padding never changes a sequence's
loss, attention weights or outputs.

**Federated use.** :meth:`AcousticModel.loss` returns ``(summed loss, number of target units)`` so clients can
be weighted by their unit counts; :func:`build_model` takes a ``seed`` and builds identical weights for the
same seed without touching the global random state.

>>> import torch
>>> cfg = AcousticConfig.preset("tiny", input_dim=4, vocab_size=9)
>>> model = build_model(cfg, seed=0)
>>> batch = collate([torch.zeros(7, 4), torch.ones(5, 4)], [[5, 6], [7]])
>>> loss, count = model.loss(batch)
>>> count, loss.item() > 0
(5, True)
>>> ctc = build_model(cfg.replace(arch="ctc"), seed=0)
>>> ctc.loss(batch)[1]
3
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from privasr.asr.units import Tokenizer
from privasr.errors import ConfigError, InputError

__all__ = [
    "AcousticConfig",
    "PRESETS",
    "Batch",
    "collate",
    "build_model",
    "AcousticModel",
    "Encoder",
    "LocationAwareAttention",
    "Seq2SeqModel",
    "CtcModel",
    "DecoderState",
    "BLANK_ID",
    "SOS_ID",
    "EOS_ID",
    "PAD_ID",
    "MASKED_LOGIT",
]

BLANK_ID = Tokenizer.blank_id
"""``<blank>`` (0): the CTC blank; never emitted by the attention decoder."""
SOS_ID = Tokenizer.sos_id
"""``<sos>`` (1): the attention decoder's first input; never emitted."""
EOS_ID = Tokenizer.eos_id
"""``<eos>`` (2): ends every attention target; never emitted by CTC."""
PAD_ID = BLANK_ID
"""The value padded target positions hold (never read: lengths mask them)."""
MASKED_LOGIT = -1.0e4
"""The logit of a unit a model may not emit (probability 0 in float32, finite gradients)."""

ARCHS = ("seq2seq", "ctc")
SUBSAMPLE_MODES = ("concat", "skip")


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class AcousticConfig:
    """Architecture and size of an acoustic model (validated on creation; :meth:`preset` gives named sizes).

    Attributes:
        arch: ``"seq2seq"`` (encoder + location-aware attention + LSTM decoder) or ``"ctc"``.
        input_dim: feature dimension per (stacked) input frame (39 = 3 x 13 AN4 MFCCs; 240 = 3 x 80 fbank).
        vocab_size: output units (the tokenizer's ``vocab_size``, specials included); ``0`` = take it from
            the tokenizer given to :func:`build_model`.
        enc_layers: bidirectional LSTM layers of the encoder.
        enc_hidden: LSTM units per direction (each layer outputs ``2 * enc_hidden``).
        subsample: frame-rate reduction factor after each encoder layer (``()`` = none; otherwise one integer
            >= 1 per layer, e.g. ``(1, 2, 1)`` halves the frame rate after the second layer).
        subsample_mode: ``"concat"`` (concatenate the merged frames, pyramidal LAS; zeros pad a short last
            group) or ``"skip"`` (keep every ``f``-th frame).
        dropout: dropout after every encoder layer, between decoder layers and on the decoder output.
        dec_layers: unidirectional LSTM layers of the decoder (seq2seq).
        dec_hidden: decoder LSTM units (seq2seq).
        embed_dim: unit embedding size of the decoder input (seq2seq).
        att_dim: attention energy dimension (seq2seq).
        att_conv_channels: location filters ``F`` of the attention (seq2seq).
        att_conv_width: their width in encoder frames (odd, seq2seq).
        label_smoothing: mass spread uniformly over the units the decoder may emit (seq2seq, in [0, 1)).
        ctc_weight: weight ``w`` of a CTC head on the seq2seq encoder (joint loss ``(1-w) CE + w CTC``; 0 = none).
    """

    arch: str = "seq2seq"
    input_dim: int = 39
    vocab_size: int = 0
    enc_layers: int = 3
    enc_hidden: int = 256
    subsample: tuple[int, ...] = ()
    subsample_mode: str = "concat"
    dropout: float = 0.1
    dec_layers: int = 1
    dec_hidden: int = 256
    embed_dim: int = 64
    att_dim: int = 128
    att_conv_channels: int = 10
    att_conv_width: int = 31
    label_smoothing: float = 0.0
    ctc_weight: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int | np.integer)):
                raise ConfigError(f"acoustic model config: {f.name}={v!r} is not an integer", expected="an integer")
            if f.type in ("int", int):
                object.__setattr__(self, f.name, int(v))
            if f.type in ("float", float):
                if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                    raise ConfigError(f"acoustic model config: {f.name}={v!r} is not a number", expected="a number")
                object.__setattr__(self, f.name, float(v))
        if self.arch not in ARCHS:
            raise ConfigError(f"acoustic model config: unknown arch {self.arch!r}", expected=" or ".join(ARCHS))
        for name in ("input_dim", "enc_layers", "enc_hidden", "dec_layers", "dec_hidden", "embed_dim", "att_dim",
                     "att_conv_channels", "att_conv_width"):
            if getattr(self, name) < 1:
                raise ConfigError(f"acoustic model config: {name}={getattr(self, name)} must be positive",
                                  expected="an integer >= 1")
        if self.att_conv_width % 2 == 0:
            raise ConfigError(f"acoustic model config: att_conv_width={self.att_conv_width} must be odd "
                              "(the convolution is centred on each frame)", expected="an odd integer")
        if self.vocab_size != 0 and self.vocab_size < 5:
            raise ConfigError(f"acoustic model config: vocab_size={self.vocab_size} leaves no room for units "
                              "after the 4 specials (<blank>, <sos>, <eos>, <unk>)",
                              expected="0 (from the tokenizer) or at least 5")
        try:
            sub = tuple(self.subsample)
        except TypeError:
            raise ConfigError(f"acoustic model config: subsample={self.subsample!r} is not a list",
                              expected="[] or one factor per encoder layer") from None
        if any(isinstance(s, bool) or not isinstance(s, int | np.integer) or s < 1 for s in sub):
            raise ConfigError(f"acoustic model config: subsample={list(sub)} holds a non-positive or non-integer "
                              "factor", expected="integers >= 1")
        if sub and len(sub) != self.enc_layers:
            raise ConfigError(f"acoustic model config: subsample has {len(sub)} factor(s) for {self.enc_layers} "
                              "encoder layer(s)", expected="[] or one factor per encoder layer")
        object.__setattr__(self, "subsample", tuple(int(s) for s in sub))
        if self.subsample_mode not in SUBSAMPLE_MODES:
            raise ConfigError(f"acoustic model config: subsample_mode={self.subsample_mode!r}",
                              expected=" or ".join(SUBSAMPLE_MODES))
        for name in ("dropout", "label_smoothing", "ctc_weight"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ConfigError(f"acoustic model config: {name}={v} is outside [0, 1)", expected="a value in [0, 1)")
        if self.arch == "ctc" and (self.ctc_weight or self.label_smoothing):
            raise ConfigError("acoustic model config: ctc_weight and label_smoothing apply to arch='seq2seq' only",
                              expected="0 for arch='ctc'")

    @property
    def frame_reduction(self) -> int:
        """How many input frames one encoder output frame covers (the product of ``subsample``)."""
        return int(np.prod(self.subsample)) if self.subsample else 1

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``subsample`` as a list).

        >>> AcousticConfig.preset("tiny").to_dict()["enc_layers"]
        1
        """
        d = dataclasses.asdict(self)
        d["subsample"] = list(self.subsample)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcousticConfig:
        """Inverse of :meth:`to_dict`; unknown keys are a :class:`ConfigError`.

        >>> AcousticConfig.from_dict({"arch": "ctc", "enc_layers": 2}).enc_layers
        2
        >>> AcousticConfig.from_dict({"layers": 2})
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: unknown acoustic model config key(s) ['layers'] (expected some of [...])
        """
        if not isinstance(data, Mapping):
            raise ConfigError("the acoustic model config is not a mapping", expected="key: value pairs")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ConfigError(f"unknown acoustic model config key(s) {unknown}", expected=f"some of {names}")
        kw = dict(data)
        if isinstance(kw.get("subsample"), list):
            kw["subsample"] = tuple(kw["subsample"])
        return cls(**kw)

    def replace(self, **changes: Any) -> AcousticConfig:
        """A copy with ``changes`` applied (validated)."""
        return self.from_dict({**self.to_dict(), **changes})

    @classmethod
    def preset(cls, name: str, **changes: Any) -> AcousticConfig:
        """A named configuration (see :data:`PRESETS`), with optional ``changes``.

        >>> AcousticConfig.preset("paper002").enc_layers, AcousticConfig.preset("small", arch="ctc").arch
        (6, 'ctc')
        >>> AcousticConfig.preset("huge")
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: unknown acoustic model preset 'huge' (expected one of ['paper002', 'small', 'tiny'])
        """
        if name not in PRESETS:
            raise ConfigError(f"unknown acoustic model preset {name!r}", expected=f"one of {sorted(PRESETS)}")
        return cls.from_dict({**PRESETS[name], **changes})


PRESETS: dict[str, dict[str, Any]] = {
    # paper 002, section 4: 6-layer bLSTM encoder with dropout, 2-layer LSTM decoder, single-head location-aware
    # attention, 3 stacked 80-dim fbank frames (240 inputs), 16k unigram subwords. Widths and dropout are not
    # stated: 512 per direction / 512 decoder units / attention 512 (our choice), location filters as in
    # Chorowski et al. 2015 (10 of width 201), dropout 0.2.
    "paper002": {"arch": "seq2seq", "input_dim": 240, "vocab_size": 16000, "enc_layers": 6, "enc_hidden": 512,
                 "dropout": 0.2, "dec_layers": 2, "dec_hidden": 512, "embed_dim": 512, "att_dim": 512,
                 "att_conv_channels": 10, "att_conv_width": 201},
    # AN4 on a CPU: 3 x 13 stacked MFCCs, 3-layer BiLSTM of 256 per direction (no further subsampling: AN4
    # needs ~2 stacked frames per character for CTC), 1 decoder layer.
    "small": {"arch": "seq2seq", "input_dim": 39, "enc_layers": 3, "enc_hidden": 256, "dropout": 0.1,
              "dec_layers": 1, "dec_hidden": 256, "embed_dim": 64, "att_dim": 128, "att_conv_channels": 10,
              "att_conv_width": 31},
    # tests
    "tiny": {"arch": "seq2seq", "input_dim": 8, "enc_layers": 1, "enc_hidden": 16, "dropout": 0.0,
             "dec_layers": 1, "dec_hidden": 16, "embed_dim": 8, "att_dim": 16, "att_conv_channels": 4,
             "att_conv_width": 5},
}


# ------------------------------------------------------------------------------------------------- batch


@dataclass(frozen=True)
class Batch:
    """A padded batch: ``feats [B, T, F]`` (float32), ``feat_lengths [B]``, ``targets [B, S]`` (unit ids, no
    ``<sos>``/``<eos>``, padded with :data:`PAD_ID`), ``target_lengths [B]`` (int64, on the CPU), ``utt_ids``."""

    feats: torch.Tensor
    feat_lengths: torch.Tensor
    targets: torch.Tensor
    target_lengths: torch.Tensor
    utt_ids: tuple[str, ...] = ()

    def to(self, device: torch.device | str) -> Batch:
        """The tensors on ``device`` (lengths stay on the CPU, where packing wants them)."""
        return dataclasses.replace(self, feats=self.feats.to(device), targets=self.targets.to(device))

    @property
    def size(self) -> int:
        """Number of utterances."""
        return int(self.feat_lengths.shape[0])


def _as_tensor2d(x: Any, k: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x, dtype=np.float32)) if not isinstance(x, torch.Tensor) else x.float()
    if t.dim() != 2:
        raise InputError(f"utterance {k}: features of shape {tuple(t.shape)}", expected="a [frames, dim] array")
    if t.shape[0] == 0:
        raise InputError(f"utterance {k}: zero-length features (0 frames)", expected="at least one frame")
    if not torch.isfinite(t).all():
        raise InputError(f"utterance {k}: non-finite feature values", expected="finite features")
    return t


def collate(features: Sequence[Any], targets: Sequence[Sequence[int]] | None = None,
            utt_ids: Sequence[str] | None = None) -> Batch:
    """Pad utterances into a :class:`Batch`: ``features`` ``[T_i, F]`` arrays/tensors, ``targets`` unit-id lists.

    ``targets=None`` gives empty targets (for decoding). An empty batch, a zero-length or non-2-D feature
    array, mismatched dimensions or a negative unit id is an :class:`InputError` naming the utterance.

    >>> import numpy as np
    >>> b = collate([np.zeros((3, 2)), np.ones((1, 2))], [[5], [6, 7]], ["a", "b"])
    >>> tuple(b.feats.shape), b.feat_lengths.tolist(), b.targets.tolist(), b.target_lengths.tolist()
    ((2, 3, 2), [3, 1], [[5, 0], [6, 7]], [1, 2])
    >>> collate([np.zeros((0, 2))])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: utterance 0: zero-length features (0 frames) (expected at least one frame)
    """
    feats = list(features)
    if not feats:
        raise InputError("empty batch (no utterances)", expected="at least one utterance")
    ids = tuple(utt_ids) if utt_ids is not None else ()
    if utt_ids is not None and len(ids) != len(feats):
        raise InputError(f"{len(feats)} utterances but {len(ids)} ids", expected="one id per utterance")
    names = [repr(i) for i in ids] if ids else [str(k) for k in range(len(feats))]
    ts = [_as_tensor2d(x, names[k]) for k, x in enumerate(feats)]
    dim = ts[0].shape[1]
    for k, t in enumerate(ts):
        if t.shape[1] != dim:
            raise InputError(f"utterance {names[k]}: {t.shape[1]}-dim features, utterance {names[0]} has {dim}",
                             expected="one feature dimension per batch")
    tg = [[] for _ in ts] if targets is None else [list(map(int, y)) for y in targets]
    if len(tg) != len(ts):
        raise InputError(f"{len(ts)} feature arrays but {len(tg)} target sequences", expected="one target per utterance")
    for k, y in enumerate(tg):
        if any(i < 0 for i in y):
            raise InputError(f"utterance {names[k]}: negative unit id in {y}", expected="unit ids >= 0")
    lengths = torch.tensor([t.shape[0] for t in ts], dtype=torch.long)
    x = torch.zeros(len(ts), int(lengths.max()), dim)
    for k, t in enumerate(ts):
        x[k, : t.shape[0]] = t
    tl = torch.tensor([len(y) for y in tg], dtype=torch.long)
    y = torch.full((len(ts), max(1, int(tl.max()))), PAD_ID, dtype=torch.long)
    for k, s in enumerate(tg):
        if s:
            y[k, : len(s)] = torch.tensor(s, dtype=torch.long)
    return Batch(x, lengths, y, tl, ids)


def _length_mask(lengths: torch.Tensor, t: int, device: torch.device) -> torch.Tensor:
    """``[B, t]`` bool, True at valid positions."""
    return torch.arange(t, device=device)[None, :] < lengths.to(device)[:, None]


# ----------------------------------------------------------------------------------------------- encoder


class Encoder(nn.Module):
    """Stacked bidirectional LSTMs, each followed by LayerNorm and dropout, with optional frame subsampling.

    Input ``[B, T, input_dim]`` with lengths; output ``[B, T', 2 * enc_hidden]`` and the output lengths
    (``T' = ceil(T / frame_reduction)``). Every layer runs on packed sequences and padded positions are set to
    zero after every layer, so an utterance's output does not depend on the rest of its batch.

    >>> enc = Encoder(AcousticConfig.preset("tiny", subsample=(2,)))
    >>> h, n = enc(torch.zeros(2, 5, 8), torch.tensor([5, 3]))
    >>> tuple(h.shape), n.tolist()
    ((2, 3, 64), [3, 2])
    """

    def __init__(self, config: AcousticConfig) -> None:
        super().__init__()
        self.config = config
        self.factors = config.subsample or (1,) * config.enc_layers
        self.mode = config.subsample_mode
        h = config.enc_hidden
        self.lstms = nn.ModuleList()
        self.norms = nn.ModuleList()
        in_dim = config.input_dim
        for f in self.factors:
            self.lstms.append(nn.LSTM(in_dim, h, batch_first=True, bidirectional=True))
            self.norms.append(nn.LayerNorm(2 * h))
            in_dim = 2 * h * (f if self.mode == "concat" else 1)
        self.drop = nn.Dropout(config.dropout)
        self.output_dim = 2 * h * (self.factors[-1] if self.mode == "concat" else 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encode ``x [B, T, F]`` with ``lengths [B]``; returns ``(h [B, T', D], lengths' [B])``."""
        if x.dim() != 3 or x.shape[-1] != self.config.input_dim:
            raise InputError(f"encoder input of shape {tuple(x.shape)}",
                             expected=f"[batch, frames, {self.config.input_dim}]")
        lengths = lengths.detach().to("cpu", torch.long)
        if lengths.numel() != x.shape[0] or (lengths < 1).any() or int(lengths.max()) > x.shape[1]:
            raise InputError(f"encoder lengths {lengths.tolist()} for input of shape {tuple(x.shape)}",
                             expected="one length per utterance in 1..frames")
        h = x
        for lstm, norm, f in zip(self.lstms, self.norms, self.factors, strict=True):
            t = h.shape[1]
            packed = nn.utils.rnn.pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
            out, _ = lstm(packed)
            h, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=t)
            h = self.drop(norm(h))
            h = h * _length_mask(lengths, t, h.device).unsqueeze(-1).to(h.dtype)
            if f > 1:
                h, lengths = self._subsample(h, lengths, f)
        return h, lengths

    def _subsample(self, h: torch.Tensor, lengths: torch.Tensor, f: int) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, d = h.shape
        new_lengths = (lengths + f - 1) // f
        if self.mode == "skip":
            return h[:, ::f], new_lengths
        pad = (-t) % f
        if pad:
            h = F.pad(h, (0, 0, 0, pad))
        return h.reshape(b, (t + pad) // f, f * d), new_lengths


# --------------------------------------------------------------------------------------------- attention


class LocationAwareAttention(nn.Module):
    """Location-aware attention (Chorowski et al. 2015, eq. 2 of paper 002).

    ``e_t = w^T tanh(W d + V h_t + U f_t + b)`` with ``f = conv1d(alpha_prev)``; ``alpha = softmax(e)`` over the
    valid frames (padding gets weight exactly 0); returns ``(context [B, D_enc], alpha [B, T])``.

    >>> att = LocationAwareAttention(enc_dim=6, dec_dim=4, att_dim=5, channels=2, width=3)
    >>> enc, mask = torch.randn(2, 4, 6), torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]).bool()
    >>> c, a = att(torch.randn(2, 4), mask.float() / mask.sum(1, keepdim=True), enc, att.project(enc), mask)
    >>> tuple(c.shape), a.sum(1).tolist() == [1.0, 1.0], a[1, 2:].tolist()
    ((2, 6), True, [0.0, 0.0])
    """

    def __init__(self, enc_dim: int, dec_dim: int, att_dim: int, channels: int, width: int) -> None:
        super().__init__()
        self.enc_proj = nn.Linear(enc_dim, att_dim)  # V h_t + b
        self.dec_proj = nn.Linear(dec_dim, att_dim, bias=False)  # W d
        self.conv = nn.Conv1d(1, channels, width, padding=width // 2, bias=False)  # F
        self.loc_proj = nn.Linear(channels, att_dim, bias=False)  # U
        self.energy = nn.Linear(att_dim, 1, bias=False)  # w

    def project(self, enc: torch.Tensor) -> torch.Tensor:
        """``V h_t + b`` for every frame (computed once per utterance)."""
        return self.enc_proj(enc)

    def forward(self, d: torch.Tensor, alpha_prev: torch.Tensor, enc: torch.Tensor, enc_projected: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.loc_proj(self.conv(alpha_prev.unsqueeze(1)).transpose(1, 2))
        e = self.energy(torch.tanh(enc_projected + self.dec_proj(d).unsqueeze(1) + loc)).squeeze(-1)
        alpha = torch.softmax(e.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.bmm(alpha.unsqueeze(1), enc).squeeze(1), alpha


# ------------------------------------------------------------------------------------------------ models


class AcousticModel(nn.Module):
    """Common interface: ``encode``, ``loss(batch) -> (summed loss, number of target units)``, ``config``."""

    config: AcousticConfig
    encoder: Encoder

    def encode(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder output ``[B, T', D]`` and its lengths."""
        return self.encoder(feats, lengths)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_targets(self, batch: Batch) -> None:
        tl = batch.target_lengths
        if tl.numel() != batch.size:
            raise InputError(f"{batch.size} utterances but {tl.numel()} target lengths", expected="one per utterance")
        if int(tl.max()) > 0:
            y = batch.targets[:, : int(tl.max())]
            valid = _length_mask(tl, y.shape[1], y.device)
            bad = valid & ((y < 0) | (y >= self.config.vocab_size))
            if bad.any():
                k = int(bad.any(1).nonzero()[0, 0])
                raise InputError(f"utterance {_name(batch, k)}: unit id {int(y[k][bad[k]][0])} out of range",
                                 expected=f"0..{self.config.vocab_size - 1}")


def _name(batch: Batch, k: int) -> str:
    return repr(batch.utt_ids[k]) if batch.utt_ids else str(k)


def _ctc_sum(log_probs: torch.Tensor, enc_lengths: torch.Tensor, batch: Batch) -> torch.Tensor:
    """Summed CTC loss; an utterance with too few encoder frames for its targets is an :class:`InputError`."""
    need = ctc_min_frames(batch.targets, batch.target_lengths)
    short = (enc_lengths.cpu() < need).nonzero().flatten().tolist()
    if short:
        k = short[0]
        raise InputError(f"utterance {_name(batch, k)}: {int(batch.target_lengths[k])} target units need at least "
                         f"{int(need[k])} encoder frames for CTC, the encoder gives {int(enc_lengths[k])}"
                         f" ({len(short)} such utterance(s) in the batch)",
                         expected="shorter targets, longer input or less subsampling")
    return F.ctc_loss(log_probs.transpose(0, 1).float(), batch.targets, enc_lengths, batch.target_lengths,
                      blank=BLANK_ID, reduction="sum", zero_infinity=False)


def ctc_min_frames(targets: torch.Tensor, target_lengths: torch.Tensor) -> torch.Tensor:
    """Frames CTC needs for each padded target: its length plus one blank between repeated units.

    >>> ctc_min_frames(torch.tensor([[5, 5, 6], [7, 0, 0]]), torch.tensor([3, 1])).tolist()
    [4, 1]
    """
    y = targets.detach().cpu()
    tl = target_lengths.detach().cpu()
    if y.shape[1] < 2:
        return tl.clone()
    same = (y[:, 1:] == y[:, :-1]) & _length_mask(tl - 1, y.shape[1] - 1, y.device)
    return tl + same.sum(1)


class CtcModel(AcousticModel):
    """Encoder + linear layer over the units (``<blank>`` = 0) + CTC loss (:func:`torch.nn.functional.ctc_loss`).

    ``<sos>``/``<eos>`` are masked out of the output (:data:`MASKED_LOGIT`).

    >>> m = build_model(AcousticConfig.preset("tiny", arch="ctc", input_dim=4, vocab_size=8), seed=1)
    >>> lp, n = m.log_probs(torch.zeros(1, 6, 4), torch.tensor([6]))
    >>> tuple(lp.shape), n.tolist(), round(float(lp[0, 0].detach().exp().sum()), 5)
    ((1, 6, 8), [6], 1.0)
    """

    def __init__(self, config: AcousticConfig) -> None:
        super().__init__()
        if config.arch != "ctc" or config.vocab_size < 5:
            raise ConfigError("CtcModel needs arch='ctc' and a vocab_size (see build_model)")
        self.config = config
        self.encoder = Encoder(config)
        self.out = nn.Linear(self.encoder.output_dim, config.vocab_size)
        mask = torch.zeros(config.vocab_size, dtype=torch.bool)
        mask[[SOS_ID, EOS_ID]] = True
        self.register_buffer("_out_mask", mask, persistent=False)

    def log_probs(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-frame log-probabilities ``[B, T', V]`` and the encoder lengths."""
        h, n = self.encode(feats, lengths)
        return F.log_softmax(self.out(h).masked_fill(self._out_mask, MASKED_LOGIT), dim=-1), n

    ctc_log_probs = log_probs

    def loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        """``(summed CTC loss over the batch, number of target units)``."""
        self._check_targets(batch)
        lp, n = self.log_probs(batch.feats, batch.feat_lengths)
        return _ctc_sum(lp, n, batch), int(batch.target_lengths.sum())


class DecoderState(NamedTuple):
    """The attention decoder's recurrent state: per-layer ``h``/``c`` ``[B, H]``, the previous context
    ``[B, D_enc]`` and attention weights ``[B, T']``."""

    h: tuple[torch.Tensor, ...]
    c: tuple[torch.Tensor, ...]
    context: torch.Tensor
    alpha: torch.Tensor

    def select(self, index: torch.Tensor) -> DecoderState:
        """The states of rows ``index`` (beam search reordering)."""
        return DecoderState(tuple(x[index] for x in self.h), tuple(x[index] for x in self.c),
                            self.context[index], self.alpha[index])


class Memory(NamedTuple):
    """Encoder output the decoder attends to: ``enc [B, T', D]``, its projection, valid-frame mask, lengths."""

    enc: torch.Tensor
    projected: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor

    def select(self, index: torch.Tensor) -> Memory:
        return Memory(self.enc[index], self.projected[index], self.mask[index], self.lengths[index.cpu()])


class Seq2SeqModel(AcousticModel):
    """Encoder + location-aware attention + LSTM decoder (paper 002, eqs. 1-4); see the module documentation.

    >>> m = build_model(AcousticConfig.preset("tiny", input_dim=4, vocab_size=8), seed=0)
    >>> b = collate([torch.zeros(6, 4)], [[5, 6, 7]])
    >>> logits, alphas = m(b)
    >>> tuple(logits.shape), tuple(alphas.shape)          # 3 units + <eos>, 6 encoder frames
    ((1, 4, 8), (1, 4, 6))
    """

    def __init__(self, config: AcousticConfig) -> None:
        super().__init__()
        if config.arch != "seq2seq" or config.vocab_size < 5:
            raise ConfigError("Seq2SeqModel needs arch='seq2seq' and a vocab_size (see build_model)")
        self.config = config
        c = config
        self.encoder = Encoder(c)
        d_enc = self.encoder.output_dim
        self.embed = nn.Embedding(c.vocab_size, c.embed_dim)
        self.cells = nn.ModuleList(
            nn.LSTMCell((c.embed_dim + d_enc) if i == 0 else c.dec_hidden, c.dec_hidden) for i in range(c.dec_layers))
        self.attention = LocationAwareAttention(d_enc, c.dec_hidden, c.att_dim, c.att_conv_channels, c.att_conv_width)
        self.drop = nn.Dropout(c.dropout)
        self.out = nn.Linear(d_enc + c.dec_hidden, c.vocab_size)
        mask = torch.zeros(c.vocab_size, dtype=torch.bool)
        mask[[BLANK_ID, SOS_ID]] = True
        self.register_buffer("_out_mask", mask, persistent=False)
        self.ctc_out = nn.Linear(d_enc, c.vocab_size) if c.ctc_weight > 0 else None
        if self.ctc_out is not None:
            cmask = torch.zeros(c.vocab_size, dtype=torch.bool)
            cmask[[SOS_ID, EOS_ID]] = True
            self.register_buffer("_ctc_mask", cmask, persistent=False)

    # -- decoding primitives (also used by privasr.asr.search) ----------------------------------------------
    def memory(self, feats: torch.Tensor, lengths: torch.Tensor) -> Memory:
        """Encode a batch once for decoding."""
        h, n = self.encode(feats, lengths)
        return self._memory(h, n)

    def _memory(self, h: torch.Tensor, n: torch.Tensor) -> Memory:
        return Memory(h, self.attention.project(h), _length_mask(n, h.shape[1], h.device), n)

    def initial_state(self, mem: Memory) -> DecoderState:
        """``h = c = 0``, ``c_0 = 0``, ``alpha_0`` uniform over the valid frames."""
        b = mem.enc.shape[0]
        z = mem.enc.new_zeros(b, self.config.dec_hidden)
        alpha = mem.mask.to(mem.enc.dtype)
        alpha = alpha / alpha.sum(1, keepdim=True)
        zs = (z,) * self.config.dec_layers
        return DecoderState(zs, zs, mem.enc.new_zeros(b, mem.enc.shape[2]), alpha)

    def step(self, prev: torch.Tensor, state: DecoderState, mem: Memory) -> tuple[torch.Tensor, DecoderState]:
        """One decoder step (eqs. 2-4): previous units ``[B]`` -> logits ``[B, V]`` (masked) and the new state."""
        x = torch.cat([self.embed(prev), state.context], dim=-1)
        hs, cs = [], []
        for i, cell in enumerate(self.cells):
            h, c = cell(x, (state.h[i], state.c[i]))
            hs.append(h)
            cs.append(c)
            x = self.drop(h) if i + 1 < len(self.cells) else h
        context, alpha = self.attention(x, state.alpha, mem.enc, mem.projected, mem.mask)
        logits = self.out(self.drop(torch.cat([context, x], dim=-1))).masked_fill(self._out_mask, MASKED_LOGIT)
        return logits, DecoderState(tuple(hs), tuple(cs), context, alpha)

    def ctc_log_probs(self, feats: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """CTC head log-probabilities (only with ``ctc_weight > 0``)."""
        if self.ctc_out is None:
            raise ConfigError("this seq2seq model has no CTC head", expected="ctc_weight > 0")
        h, n = self.encode(feats, lengths)
        return self._ctc_lp(h), n

    def _ctc_lp(self, h: torch.Tensor) -> torch.Tensor:
        assert self.ctc_out is not None
        return F.log_softmax(self.ctc_out(h).masked_fill(self._ctc_mask, MASKED_LOGIT), dim=-1)

    # -- training ---------------------------------------------------------------------------------------------
    def _teacher_forced(self, batch: Batch, h: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mem = self._memory(h, n)
        b = h.shape[0]
        steps = int(batch.target_lengths.max()) + 1
        y = batch.targets.to(h.device)
        if y.shape[1] < steps:
            y = F.pad(y, (0, steps - y.shape[1]), value=PAD_ID)
        prev = torch.cat([torch.full((b, 1), SOS_ID, dtype=torch.long, device=h.device), y[:, : steps - 1]], 1)
        state = self.initial_state(mem)
        logits, alphas = [], []
        for i in range(steps):
            lg, state = self.step(prev[:, i], state, mem)
            logits.append(lg)
            alphas.append(state.alpha)
        return torch.stack(logits, 1), torch.stack(alphas, 1)

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced logits ``[B, S + 1, V]`` (targets then ``<eos>``) and attention weights ``[B, S + 1, T']``."""
        h, n = self.encode(batch.feats, batch.feat_lengths)
        return self._teacher_forced(batch, h, n)

    def decoder_targets(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, S + 1]`` targets (units then ``<eos>``, padding after) and their validity mask."""
        tl = batch.target_lengths
        steps = int(tl.max()) + 1
        y = F.pad(batch.targets, (0, max(0, steps - batch.targets.shape[1])), value=PAD_ID)[:, :steps].clone()
        y[torch.arange(batch.size), tl.to(y.device)] = EOS_ID
        return y, _length_mask(tl + 1, steps, y.device)

    def loss(self, batch: Batch) -> tuple[torch.Tensor, int]:
        """``(summed loss, number of target units including one <eos> per utterance)``.

        Cross entropy with teacher forcing; with ``label_smoothing = e`` each token's loss is
        ``(1 - e) * -log p(y) + e * mean over the emittable units u of -log p(u)``; with ``ctc_weight = w`` the
        loss is ``(1 - w) * CE + w * CTC`` (both summed).
        """
        self._check_targets(batch)
        h, n = self.encode(batch.feats, batch.feat_lengths)
        logits, _ = self._teacher_forced(batch, h, n)
        y, valid = self.decoder_targets(batch)
        y = y.to(logits.device)
        valid = valid.to(logits.device)
        lp = F.log_softmax(logits.float(), dim=-1)
        nll = -lp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        eps = self.config.label_smoothing
        if eps > 0:
            keep = ~self._out_mask
            smooth = -lp[..., keep].mean(-1)
            nll = (1.0 - eps) * nll + eps * smooth
        ce = (nll * valid).sum()
        count = int(valid.sum())
        w = self.config.ctc_weight
        if w > 0:
            ctc = _ctc_sum(self._ctc_lp(h), n, batch)
            return (1.0 - w) * ce + w * ctc, count
        return ce, count


def build_model(config: AcousticConfig, tokenizer: Tokenizer | None = None, *, seed: int = 0) -> AcousticModel:
    """Build a :class:`Seq2SeqModel` or :class:`CtcModel` with deterministic initial weights.

    ``vocab_size`` comes from ``tokenizer`` when the config says 0 (a config naming another size than the
    tokenizer's is a :class:`ConfigError`). The weights depend only on ``config`` and ``seed``: they are drawn
    inside :func:`torch.random.fork_rng`, so the global random state is left as it was.

    >>> from privasr.asr.units import CharTokenizer
    >>> tok = CharTokenizer.train([("AB",)])
    >>> m1 = build_model(AcousticConfig.preset("tiny"), tok, seed=3)
    >>> m2 = build_model(AcousticConfig.preset("tiny"), tok, seed=3)
    >>> m1.config.vocab_size, all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    (7, True)
    >>> build_model(AcousticConfig.preset("tiny"))
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: vocab_size is 0 and no tokenizer was given (expected a tokenizer or vocab_size >= 5)
    """
    if not isinstance(config, AcousticConfig):
        raise ConfigError(f"config is {type(config).__name__}", expected="an AcousticConfig")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise ConfigError(f"seed={seed!r}", expected="an integer")
    if tokenizer is not None:
        if config.vocab_size == 0:
            config = config.replace(vocab_size=tokenizer.vocab_size)
        elif config.vocab_size != tokenizer.vocab_size:
            raise ConfigError(f"vocab_size={config.vocab_size} but the tokenizer has {tokenizer.vocab_size} units",
                              expected="vocab_size 0 (from the tokenizer) or the tokenizer's size")
    if config.vocab_size == 0:
        raise ConfigError("vocab_size is 0 and no tokenizer was given", expected="a tokenizer or vocab_size >= 5")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model: AcousticModel = Seq2SeqModel(config) if config.arch == "seq2seq" else CtcModel(config)
    return model
