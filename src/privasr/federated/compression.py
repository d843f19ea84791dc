r"""Compressed client updates: stochastic 8- and 4-bit quantisation, top-k sparsification, error feedback.

A client that sends a model delta (fedlm, FTL) can send it compressed; the server decodes every update before
it folds it into the round's sum, so accumulation, DP noise and the server optimiser are unchanged. The scheme
is chosen by an algorithm config's ``compression`` key (:class:`CompressionSettings`)::

    compression: {kind: quantize, bits: 8, block: 256}        # or bits: 4
    compression: {kind: topk, fraction: 0.01}                  # error_feedback: true by default for top-k
    compression: none

**Quantisation** (``kind: quantize``, per-block scale). Each tensor is flattened and cut into blocks of
``block`` values (the last one may be shorter). A block's scale is ``s = max |x|`` (float32); every value
is rounded *stochastically* onto the symmetric grid ``s * k / L``, ``k`` an integer in ``[-L, L]``, with
``L = 2^(bits-1) - 1`` (127 for 8 bits, 7 for 4 bits): ``k = floor(y) + [U < y - floor(y)]`` with
``y = L x / s`` and ``U`` uniform, so ``E[s k / L] = x`` (unbiased) and the error of a value is below one
grid step ``s / L``. The grid holds 0, so zero values stay exactly 0, and a block of zeros (scale 0; e.g. the
embedding rows of words a fedlm client never saw) sends its scale only, no codes. 8-bit codes are ``int8``;
4-bit codes are stored as ``k + 7`` in ``[0, 14]``, two per byte (low nibble first).

**Top-k** (``kind: topk``). For each tensor the ``k = ceil(fraction * n)`` values of largest magnitude are
sent exactly (float32) with their flat positions (``uint16`` for tensors of at most 65,536 values, else
``uint32``); the rest is dropped.

**Error feedback** (``error_feedback``; default on for top-k, off for quantisation). The client keeps the
residual ``e`` of what it did not send in its own persistent state, compresses ``u = delta + e`` and keeps
``e' = u - decode(sent)`` for the next round in which it is sampled. The residual **never leaves the client**:
it is the algorithm's ``client_state``, not part of the :class:`~privasr.federated.core.Update`. Over rounds
the sent values add up to the sum of the deltas minus the last residual.

**Clipping and DP** (``clip_norm``). Compression comes after clipping: the clipped delta (plus the residual) is
what is compressed. Stochastic rounding can *increase* the norm (and a residual adds to it), so the client
decodes what it is about to send and, if its L2 norm exceeds ``clip_norm``, multiplies the scales (top-k: the
values) by ``clip_norm / norm`` -- the codes are unchanged and the decoded vector scales exactly -- shrinking
further if float32 rounding lands above the bound. **What the server decodes therefore has norm at most
``clip_norm``**, so the Gaussian mechanism's sensitivity holds for the decoded sum, the loop adds its noise once
to that sum and steps the accountant once per round as without compression. The re-scaling (when it happens) is
the only bias of quantisation; with error feedback it goes into the residual.

**Secure aggregation** is refused with compression: SecAgg+ sums dense integer vectors on its own grid
(:mod:`privasr.federated.secagg`), while compressed updates carry per-client scales and positions that do not
add up in its field (and its masked vectors are dense 8-byte integers, so compression would not reduce the
upload). Use either one.

**Payload and bytes.** A compressed update is still one :class:`~privasr.federated.core.Update` of numeric
arrays: for a tensor ``NAME``, ``NAME#scales`` (float32, one per block) and ``NAME#codes`` (int8 or packed
uint8) for quantisation; ``NAME#idx`` and ``NAME#val`` for top-k. :func:`payload_bytes` (the same as
``Update.nbytes``) counts exactly those bytes: codes, scales, indices and values; the dense float32 delta is
:func:`raw_bytes`.

>>> rng = np.random.default_rng(0)
>>> x = {"w": np.linspace(-1, 1, 1000).astype(np.float32)}
>>> q = CompressionSettings(kind="quantize", bits=8, block=256)
>>> sent, residual = compress(x, q, rng)
>>> sorted(sent), payload_bytes(sent), raw_bytes(x)          # 1000 int8 codes + 4 float32 scales
(['w#codes', 'w#scales'], 1016, 4000)
>>> back = decompress(sent, {"w": (1000,)}, q)
>>> bool(np.max(np.abs(back["w"] - x["w"])) <= 1 / 127), residual is None
(True, True)
>>> t = CompressionSettings(kind="topk", fraction=0.01)
>>> sent, residual = compress(x, t, rng)
>>> payload_bytes(sent), sorted(residual)                     # 10 uint16 positions + 10 float32 values
(60, ['w'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["CompressionSettings", "KINDS", "compress", "decompress", "quantize", "dequantize", "top_k",
           "payload_bytes", "raw_bytes", "check_no_secagg"]

KINDS = ("none", "quantize", "topk")
"""The compression kinds: ``none``, stochastic ``quantize`` (8 or 4 bits), ``topk`` sparsification."""

_SEP = "#"


def _bad(key: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"compression.{key}={value!r}", expected=expected)


@dataclass(frozen=True)
class CompressionSettings:
    """How a client compresses its update (an algorithm config's ``compression`` key; module docstring).

    Attributes:
        kind: ``"none"``, ``"quantize"`` or ``"topk"``.
        bits: quantisation bits, 8 or 4.
        block: values per quantisation block (one float32 scale each), an integer >= 1.
        fraction: top-k: the share of each tensor's values sent, in ``(0, 1]``.
        error_feedback: keep the residual on the client and add it to the next update; ``None``: on for
            top-k, off for quantisation.

    Raises:
        ConfigError: naming the key (``compression.bits=3 ...``).

    >>> CompressionSettings(kind="topk").error_feedback, CompressionSettings(kind="quantize").error_feedback
    (True, False)
    >>> CompressionSettings(kind="quantize", bits=3)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: compression.bits=3 (expected 8 or 4)
    """

    kind: str = "none"
    bits: int = 8
    block: int = 256
    fraction: float = 0.01
    error_feedback: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in KINDS:
            raise _bad("kind", self.kind, f"one of {list(KINDS)}")
        if isinstance(self.bits, bool) or self.bits not in (8, 4):
            raise _bad("bits", self.bits, "8 or 4")
        if isinstance(self.block, bool) or not isinstance(self.block, int | np.integer) or self.block < 1:
            raise _bad("block", self.block, "an integer >= 1")
        f = self.fraction
        if isinstance(f, bool) or not isinstance(f, int | float | np.integer | np.floating) or not math.isfinite(f) \
                or not 0 < f <= 1:
            raise _bad("fraction", f, "a number in (0, 1]")
        ef = self.error_feedback
        if ef is not None and not isinstance(ef, bool):
            raise _bad("error_feedback", ef, "true, false or null (on for topk, off for quantize)")
        object.__setattr__(self, "bits", int(self.bits))
        object.__setattr__(self, "block", int(self.block))
        object.__setattr__(self, "fraction", float(f))
        object.__setattr__(self, "error_feedback", (self.kind == "topk") if ef is None else ef)

    @property
    def enabled(self) -> bool:
        """Whether updates are compressed (``kind`` is not ``none``)."""
        return self.kind != "none"

    @classmethod
    def of(cls, value: Any) -> CompressionSettings:
        """Settings from a config value: ``None``, a kind name, a mapping of the fields, or settings.

        >>> CompressionSettings.of({"kind": "topk", "fraction": 0.1}).fraction
        0.1
        >>> CompressionSettings.of({"kind": "topk", "ratio": 0.1})
        Traceback (most recent call last):
        ...
        privasr.errors.ConfigError: unknown compression setting 'ratio' (expected one of ['kind', 'bits', 'block', 'fraction', 'error_feedback'])
        """
        if value is None:
            return cls()
        if isinstance(value, CompressionSettings):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if not isinstance(value, Mapping):
            raise ConfigError(f"compression={value!r}", expected="none, a kind name or a mapping with 'kind'")
        names = ["kind", "bits", "block", "fraction", "error_feedback"]
        for k in value:
            if k not in names:
                raise ConfigError(f"unknown compression setting {k!r}", expected=f"one of {names}")
        return cls(**dict(value))

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (read back by :meth:`of`)."""
        return {"kind": self.kind, "bits": self.bits, "block": self.block, "fraction": self.fraction,
                "error_feedback": self.error_feedback}


def check_no_secagg(settings: CompressionSettings, what: str) -> None:
    """Refuse secure aggregation of compressed updates (module docstring), naming the algorithm's config key.

    >>> check_no_secagg(CompressionSettings(), "fedlm")
    >>> check_no_secagg(CompressionSettings(kind="topk"), "fedlm")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: secure aggregation with fedlm.compression kind 'topk' (expected compression: none with federated.secagg: SecAgg+ sums dense vectors on its own grid; compressed codes with per-client scales or positions do not sum in its field)
    """
    if settings.enabled:
        raise ConfigError(f"secure aggregation with {what}.compression kind {settings.kind!r}",
                          expected="compression: none with federated.secagg: SecAgg+ sums dense vectors on its own "
                                   "grid; compressed codes with per-client scales or positions do not sum in its "
                                   "field")


# --------------------------------------------------------------------------------------------------- tensors


def _levels(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def quantize(x: np.ndarray, bits: int, block: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One tensor stochastically quantised with per-block scales: ``{"scales", "codes"}`` (module docstring).

    >>> q = quantize(np.array([0.0, 0.5, -1.0, 0.0, 0.0]), 4, 2, np.random.default_rng(0))
    >>> q["scales"].tolist(), q["codes"].dtype.name, q["codes"].size   # the zero block sends no codes
    ([0.5, 1.0, 0.0], 'uint8', 2)
    """
    flat = np.asarray(x, dtype=np.float64).ravel()
    n = flat.size
    nb = -(-n // block)
    padded = np.zeros(nb * block)
    padded[:n] = flat
    blocks = padded.reshape(nb, block)
    scales = np.abs(blocks).max(axis=1).astype(np.float32) if nb else np.zeros(0, dtype=np.float32)
    levels = _levels(bits)
    keep = np.repeat(scales > 0, block)[:n]
    s = np.repeat(scales.astype(np.float64), block)[:n][keep]
    y = flat[keep] / s * levels
    k = np.floor(y)
    k += rng.random(size=y.shape) < (y - k)
    k = np.clip(k, -levels, levels).astype(np.int64)
    if bits == 8:
        codes = k.astype(np.int8)
    else:
        u = (k + levels).astype(np.uint8)
        if u.size % 2:
            u = np.append(u, np.uint8(0))
        codes = (u[0::2] | (u[1::2] << 4)).astype(np.uint8)
    return {"scales": scales, "codes": codes}


def dequantize(scales: np.ndarray, codes: np.ndarray, shape: tuple[int, ...], bits: int, block: int) -> np.ndarray:
    """The float32 tensor of ``shape`` that :func:`quantize`'s ``scales`` and ``codes`` stand for.

    Raises:
        InputError: the scales or codes do not fit ``shape`` and ``block`` (a corrupt or foreign update).
    """
    n = int(np.prod(shape, dtype=np.int64))
    nb = -(-n // block)
    scales = np.asarray(scales)
    if scales.shape != (nb,) or scales.dtype.kind != "f" or not np.all(np.isfinite(scales)) or np.any(scales < 0):
        raise InputError(f"quantised update: {scales.shape} scales for {n} values in blocks of {block}",
                         expected=f"{nb} finite scales >= 0")
    keep = np.repeat(scales > 0, block)[:n]
    m = int(keep.sum())
    codes = np.asarray(codes)
    levels = _levels(bits)
    if bits == 8:
        if codes.shape != (m,) or codes.dtype != np.int8:
            raise InputError(f"quantised update: {codes.shape} {codes.dtype} codes", expected=f"{m} int8 codes")
        k = codes.astype(np.float32)
    else:
        if codes.shape != ((m + 1) // 2,) or codes.dtype != np.uint8:
            raise InputError(f"quantised update: {codes.shape} {codes.dtype} codes",
                             expected=f"{(m + 1) // 2} bytes of packed 4-bit codes")
        u = np.empty(2 * codes.size, dtype=np.uint8)
        u[0::2] = codes & 0x0F
        u[1::2] = codes >> 4
        k = u[:m].astype(np.float32) - levels
    if np.any(np.abs(k) > levels):
        raise InputError("quantised update: codes outside the grid", expected=f"integers in [-{levels}, {levels}]")
    out = np.zeros(n, dtype=np.float32)
    out[keep] = np.repeat(scales.astype(np.float32), block)[:n][keep] * (k / np.float32(levels))
    return out.reshape(shape)


def _index_dtype(n: int) -> type:
    return np.uint16 if n <= 2 ** 16 else np.uint32


def top_k(x: np.ndarray, fraction: float) -> dict[str, np.ndarray]:
    """The ``ceil(fraction * n)`` largest-magnitude values of a tensor (float32) and their sorted flat positions.

    >>> t = top_k(np.array([0.1, -3.0, 2.0, 0.0]), 0.5)
    >>> t["idx"].tolist(), t["val"].tolist(), t["idx"].dtype.name
    ([1, 2], [-3.0, 2.0], 'uint16')
    """
    flat = np.asarray(x, dtype=np.float32).ravel()
    n = flat.size
    k = min(n, max(1, math.ceil(fraction * n))) if n else 0
    idx = np.sort(np.argpartition(np.abs(flat), n - k)[n - k:]) if k < n else np.arange(n)
    return {"idx": idx.astype(_index_dtype(n)), "val": flat[idx].astype(np.float32)}


def _untop(idx: np.ndarray, val: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    idx, val = np.asarray(idx), np.asarray(val)
    if idx.ndim != 1 or idx.shape != val.shape or idx.dtype.kind not in "iu" or val.dtype.kind != "f":
        raise InputError(f"top-k update: positions {idx.shape} {idx.dtype}, values {val.shape} {val.dtype}",
                         expected="1-d integer positions and float values of the same length")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n or np.any(np.diff(idx.astype(np.int64)) <= 0)):
        raise InputError(f"top-k update: positions outside [0, {n}) or not increasing")
    out = np.zeros(n, dtype=np.float32)
    out[idx.astype(np.int64)] = val
    return out.reshape(shape)


# --------------------------------------------------------------------------------------------------- updates


def payload_bytes(payload: Mapping[str, np.ndarray]) -> int:
    """The exact bytes of an update's arrays (codes, scales, positions, values; ``Update.nbytes``).

    >>> payload_bytes({"a#codes": np.zeros(10, np.int8), "a#scales": np.zeros(1, np.float32)})
    14
    """
    return int(sum(np.asarray(a).nbytes for a in payload.values()))


def raw_bytes(arrays: Mapping[str, np.ndarray]) -> int:
    """The bytes of the same arrays as dense float32 (what an uncompressed delta costs).

    >>> raw_bytes({"w": np.zeros((3, 4))})
    48
    """
    return int(sum(4 * np.asarray(a).size for a in arrays.values()))


def _encode(arrays: Mapping[str, np.ndarray], s: CompressionSettings, rng: np.random.Generator
            ) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for name in sorted(arrays):
        if _SEP in name:
            raise InputError(f"update array name {name!r} contains {_SEP!r}", expected="names without it")
        parts = quantize(arrays[name], s.bits, s.block, rng) if s.kind == "quantize" else top_k(arrays[name],
                                                                                                 s.fraction)
        out.update({f"{name}{_SEP}{k}": v for k, v in parts.items()})
    return out


def decompress(payload: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]],
               settings: CompressionSettings) -> dict[str, np.ndarray]:
    """The dense float32 arrays a compressed payload stands for (run by the server on every update).

    Args:
        payload: a compressed update's arrays (:func:`compress`).
        shapes: name -> shape of every dense array (the model's parameters).
        settings: the compression the clients used (the same config as theirs).

    Raises:
        InputError: the payload does not hold exactly the parts of ``shapes``' arrays, or a part does not fit.
    """
    if not settings.enabled:
        return {k: np.asarray(v, dtype=np.float32) for k, v in payload.items()}
    parts = ("scales", "codes") if settings.kind == "quantize" else ("idx", "val")
    want = {f"{n}{_SEP}{p}" for n in shapes for p in parts}
    if set(payload) != want:
        extra = sorted(set(payload) - want)[:3]
        missing = sorted(want - set(payload))[:3]
        raise InputError(f"compressed update with unexpected arrays {extra} and missing {missing}",
                         expected=f"the {settings.kind} parts of the model's {len(shapes)} parameters")
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        a, b = (payload[f"{name}{_SEP}{p}"] for p in parts)
        out[name] = dequantize(a, b, tuple(shape), settings.bits, settings.block) if settings.kind == "quantize" \
            else _untop(a, b, tuple(shape))
    return out


def _rescale(payload: dict[str, np.ndarray], kind: str, factor: float) -> dict[str, np.ndarray]:
    key = "scales" if kind == "quantize" else "val"
    return {k: (v * np.float32(factor)).astype(np.float32) if k.endswith(_SEP + key) else v for k, v in payload.items()}


def _norm(arrays: Mapping[str, np.ndarray]) -> float:
    return math.sqrt(sum(float(np.dot(a.ravel().astype(np.float64), a.ravel().astype(np.float64)))
                         for a in arrays.values()))


def compress(arrays: Mapping[str, np.ndarray], settings: CompressionSettings, rng: np.random.Generator,
             residual: Mapping[str, np.ndarray] | None = None, clip_norm: float | None = None
             ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """What a client sends instead of the dense ``arrays``, and its new residual (module docstring).

    Args:
        arrays: the (clipped) delta, name -> array.
        settings: the compression.
        rng: the client's generator (stochastic rounding).
        residual: the client's residual from its last round (error feedback), ``None`` the first time.
        clip_norm: with DP, the L2 bound that the *decoded* payload must keep (the scales or top-k values are
            shrunk when rounding or the residual would exceed it).

    Returns:
        The payload (name -> numeric array) and, with error feedback, the residual to keep on the device (else
        ``None``).

    Raises:
        InputError: the residual does not have the arrays' names and shapes.

    >>> s = CompressionSettings(kind="quantize", bits=4, block=4)
    >>> x = {"w": np.full(8, 0.5)}
    >>> sent, _ = compress(x, s, np.random.default_rng(0), clip_norm=1.0)
    >>> bool(np.linalg.norm(decompress(sent, {"w": (8,)}, s)["w"]) <= 1.0)
    True
    """
    if not settings.enabled:
        return {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}, None
    u = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    if settings.error_feedback and residual is not None:
        if set(residual) != set(u) or any(np.shape(residual[k]) != u[k].shape for k in u):
            raise InputError("the client's compression residual does not match its update",
                             expected="the same array names and shapes (a client state of another model?)")
        u = {k: v + np.asarray(residual[k], dtype=np.float64) for k, v in u.items()}
    payload = _encode(u, settings, rng)
    shapes = {k: v.shape for k, v in u.items()}
    decoded = decompress(payload, shapes, settings)
    if clip_norm is not None:
        original, factor = payload, 1.0
        norm = _norm(decoded)
        while norm > clip_norm:  # shrink the scales (values) of the original codes; float32 may need a retry
            factor *= min(clip_norm / norm, 1.0 - 1e-7)
            payload = _rescale(original, settings.kind, factor)
            decoded = decompress(payload, shapes, settings)
            norm = _norm(decoded)
    new_residual = None
    if settings.error_feedback:
        new_residual = {k: (u[k] - decoded[k]).astype(np.float32) for k in u}
    return payload, new_residual
