"""Acoustic front end for the federated acoustic model (paper 002): features, stacking, CMVN, SpecAugment.

Paper 002 (Dimitriadis et al., section 4) feeds its seq2seq encoder with 80-dimensional log mel filter-bank
energies computed every 10 ms, stacks 3 frames, and uses 16k unigram subwords as output units (see
:mod:`privasr.asr.units`). This module provides:

* :func:`read_sphinx_mfc` / :func:`an4_features`: the CMU AN4 corpus ships only 13-dim Sphinx MFCCs (100
  frames/s, no audio), so the AN4 experiments use those cepstra instead of filter banks;
* :func:`read_wav` / :func:`fbank`: Kaldi-compatible log mel filter banks from audio, computed with
  kaldi-native-fbank (never a hand-rolled mel filterbank), resampling to 16 kHz first when needed;
* :func:`stack_frames`: frame stacking (3 frames, non-overlapping by default: the frame rate drops 3x);
* :class:`CmvnStats` / :func:`apply_cmvn`: streaming mean (and variance) normalisation, global or per
  speaker (each federated client can compute its own speaker statistics locally);
* :func:`spec_augment`: optional frequency/time masking (Park et al. 2019), seeded by a
  :class:`numpy.random.Generator`.

>>> import numpy as np
>>> x = np.arange(8, dtype=np.float32).reshape(4, 2)
>>> stats = CmvnStats.from_arrays([x])
>>> y = stack_frames(apply_cmvn(x, stats), 3)
>>> y.shape
(2, 6)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = [
    "resample",
    "MFC_DIM",
    "read_sphinx_mfc",
    "An4Utterance",
    "an4_features",
    "read_wav",
    "fbank",
    "stack_frames",
    "CmvnStats",
    "apply_cmvn",
    "speaker_cmvn_stats",
    "SpecAugmentMasks",
    "spec_augment_masks",
    "spec_augment",
]

PathLike = str | os.PathLike[str]

MFC_DIM = 13
"""Coefficients per frame in the AN4 Sphinx ``.mfc`` files."""

_MFC_LAYOUT = "a 4-byte big-endian int32 float count, then that many big-endian float32 values"


# --------------------------------------------------------------------------------------------- Sphinx MFC


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def read_sphinx_mfc(path: PathLike, dim: int = MFC_DIM) -> np.ndarray:
    """Read a Sphinx ``.mfc`` cepstrum file into a ``(frames, dim)`` float32 array.

    The layout is a 4-byte **big-endian** int32 giving the number of floats, then that many big-endian
    float32 values, ``dim`` per frame. Every problem (unreadable, empty, truncated or over-long file, a
    count that does not match the file size or is not a multiple of ``dim``, a file with no frames, NaN or
    infinite values) is an :class:`~privasr.errors.InputError` naming the file (and the byte offset where
    it applies) and what was expected. A file whose count only makes sense read little-endian says so.

    >>> import struct, tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.mfc"
    >>> _ = p.write_bytes(struct.pack(">i26f", 26, *range(26)))
    >>> x = read_sphinx_mfc(p)
    >>> x.shape, x.dtype, float(x[1, 0])
    ((2, 13), dtype('float32'), 13.0)
    >>> _ = p.write_bytes(struct.pack(">i25f", 26, *range(25)))
    >>> read_sphinx_mfc(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...a.mfc: truncated file: header says 26 floats but the file holds 25 (expected a file of 4 + 4*26 = 108 bytes)
    """
    dim = _check_positive_int(dim, "dim")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the file: {e.strerror or e}", path=path,
                         expected="a readable Sphinx .mfc file") from None
    size = len(data)
    if size == 0:
        raise InputError("empty file", path=path, expected=_MFC_LAYOUT)
    if size < 4:
        raise InputError(f"truncated header: {size} byte(s)", path=path, expected=_MFC_LAYOUT)
    count = int.from_bytes(data[:4], "big", signed=True)
    if (size - 4) % 4:
        exp = f"a file of 4 + 4*{count} = {4 + 4 * count} bytes" if count >= 0 else _MFC_LAYOUT
        raise InputError(f"truncated file: {size - 4} byte(s) after the header is not a whole number of float32s",
                         path=path, expected=exp)
    held = (size - 4) // 4
    if count != held:
        little = int.from_bytes(data[:4], "little", signed=True)
        hint = " (the header reads correctly as little-endian: wrong byte order?)" if little == held else ""
        if count < 0:
            msg, exp = f"negative float count {count} in the header", _MFC_LAYOUT
        else:
            kind = "truncated file: " if held < count else "trailing data: "
            msg = f"{kind}header says {count} floats but the file holds {held}"
            exp = f"a file of 4 + 4*{count} = {4 + 4 * count} bytes"
        raise InputError(msg + hint, path=path, expected=exp)
    if count == 0:
        raise InputError("no frames (the header says 0 floats)", path=path, expected=f"at least one frame of {dim}")
    if count % dim:
        raise InputError(f"{count} floats is not a whole number of {dim}-coefficient frames", path=path,
                         expected=f"a multiple of {dim} floats")
    x = np.frombuffer(data, dtype=">f4", offset=4).astype(np.float32).reshape(-1, dim)
    finite = np.isfinite(x)
    if not finite.all():
        i = int(np.flatnonzero(~finite.ravel())[0])
        raise InputError(f"non-finite value {float(x.ravel()[i])} at byte offset {4 + 4 * i} "
                         f"(frame {i // dim}, coefficient {i % dim})", path=path, expected="finite float32 values")
    return x


@dataclass(frozen=True, eq=False)
class An4Utterance:
    """One AN4 utterance: id, speaker (= its federated client), reference words and ``(frames, 13)`` MFCCs.

    >>> import numpy as np
    >>> u = An4Utterance("an251-fash-b", "fash", ("YES",), np.zeros((3, 13), np.float32))
    >>> u.num_frames, u.duration
    (3, 0.03)
    """

    utt_id: str
    speaker: str
    words: tuple[str, ...]
    features: np.ndarray = field(repr=False)

    @property
    def num_frames(self) -> int:
        """Number of feature frames."""
        return int(self.features.shape[0])

    @property
    def duration(self) -> float:
        """Length in seconds at 100 frames/s."""
        return self.num_frames / 100.0


_AN4_SPLITS = {"train": ("an4_clstk", "an4_train.transcription"),
               "test": ("an4test_clstk", "an4_test.transcription")}


def _list_preview(items: Iterable[str], n: int = 5) -> str:
    items = sorted(items)
    head = ", ".join(items[:n])
    return head + (f", ... ({len(items)} in all)" if len(items) > n else "")


def an4_features(root: PathLike | None = None, split: Literal["train", "test"] = "train",
                 dim: int = MFC_DIM) -> list[An4Utterance]:
    """Load one AN4 split: the MFCCs of ``feat/<split dir>/<speaker>/<utt>.mfc`` with their transcripts.

    ``root`` is the AN4 folder (with ``etc/`` and ``feat/``); ``None`` means ``<data_dir()>/an4``
    (:func:`privasr.paths.data_dir`). Transcripts come from ``etc/an4_train.transcription`` or
    ``etc/an4_test.transcription`` (read with :func:`~privasr.corpus.formats.an4.read_an4`); utterances
    are returned in transcript order. Every transcript id must have exactly one feature file, in the
    folder of its speaker, and every feature file must have a transcript; otherwise an
    :class:`~privasr.errors.InputError` lists the unmatched ids.

    >>> import struct, tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "etc").mkdir(); (root / "feat/an4test_clstk/fcaw").mkdir(parents=True)
    >>> _ = (root / "etc/an4_test.transcription").write_text("<s> GO </s> (an406-fcaw-b)\\n")
    >>> _ = (root / "feat/an4test_clstk/fcaw/an406-fcaw-b.mfc").write_bytes(struct.pack(">i13f", 13, *range(13)))
    >>> [(u.utt_id, u.speaker, u.words, u.features.shape) for u in an4_features(root, "test")]
    [('an406-fcaw-b', 'fcaw', ('GO',), (1, 13))]
    """
    from privasr.corpus.formats.an4 import read_an4

    if split not in _AN4_SPLITS:
        raise ConfigError(f"unknown AN4 split {split!r}", expected="'train' or 'test'")
    if root is None:
        from privasr.paths import data_dir

        d = data_dir()
        if d is None or not (d / "an4").is_dir():
            raise InputError("AN4 data not found", path=None if d is None else d / "an4",
                             expected="an4/ in ../shared/data or $PRIVASR_DATA")
        root = d / "an4"
    root = Path(root)
    sub, trans_name = _AN4_SPLITS[split]
    feat_dir = root / "feat" / sub
    if not feat_dir.is_dir():
        raise InputError("feature folder not found", path=feat_dir, expected=f"feat/{sub}/<speaker>/<utt>.mfc")
    transcripts = read_an4(root / "etc" / trans_name)
    files: dict[str, Path] = {}
    for f in feat_dir.glob("*/*.mfc"):
        if f.stem in files:
            raise InputError(f"utterance {f.stem!r} has two feature files ({files[f.stem]} and {f})",
                             path=feat_dir, expected="one .mfc file per utterance")
        files[f.stem] = f
    ids = {t.utt_id for t in transcripts}
    missing = ids - files.keys()
    if missing:
        raise InputError(f"{len(missing)} transcript id(s) have no feature file: {_list_preview(missing)}",
                         path=feat_dir, expected=f"<speaker>/<utt>.mfc for every id of {trans_name}")
    extra = files.keys() - ids
    if extra:
        raise InputError(f"{len(extra)} feature file(s) have no transcript: {_list_preview(extra)}",
                         path=root / "etc" / trans_name, expected=f"a line for every .mfc file under feat/{sub}")
    out = []
    for t in transcripts:
        f = files[t.utt_id]
        if f.parent.name != t.speaker:
            raise InputError(f"utterance {t.utt_id!r} is in speaker folder {f.parent.name!r}, not {t.speaker!r}",
                             path=f, expected="feat/<split>/<speaker>/<utt>.mfc with the id's speaker")
        out.append(An4Utterance(t.utt_id, str(t.speaker), tuple(t.words), read_sphinx_mfc(f, dim)))
    return out


# ---------------------------------------------------------------------------------------- audio, fbank


def read_wav(path: PathLike) -> tuple[np.ndarray, int]:
    """Read an audio file with soundfile: ``(float32 samples in [-1, 1], sample rate)``.

    Multi-channel audio is mixed down to mono by **averaging the channels**. Unreadable, empty or
    non-finite files raise :class:`~privasr.errors.InputError`.

    >>> import tempfile, pathlib, numpy as np, soundfile as sf
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "s.wav"
    >>> sf.write(p, np.array([[0.5, -0.5], [0.25, 0.25]]), 8000, subtype="PCM_16")
    >>> x, sr = read_wav(p)
    >>> x.tolist(), sr
    ([0.0, 0.25], 8000)
    """
    import soundfile as sf

    try:
        data, rate = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError, TypeError, ValueError) as e:  # sf.LibsndfileError is a RuntimeError
        raise InputError(f"cannot read audio: {e}", path=path, expected="an audio file soundfile can read (WAV, FLAC, ...)") from None
    if data.shape[0] == 0:
        raise InputError("empty audio (no samples)", path=path, expected="at least one sample")
    x = data.mean(axis=1, dtype=np.float64).astype(np.float32) if data.shape[1] > 1 else data[:, 0].copy()
    if not np.isfinite(x).all():
        raise InputError("non-finite audio samples", path=path, expected="finite samples")
    return x, int(rate)


def resample(x: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """``x`` (1-D) from ``rate`` to ``target_rate`` Hz with :func:`scipy.signal.resample_poly` (a polyphase
    filter, ratio reduced by the gcd); returned unchanged when the rates are equal or ``x`` is empty.

    >>> resample(np.ones(80), 8000, 16000).shape
    (160,)
    """
    if rate == target_rate or x.size == 0:
        return x
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), int(target_rate))
    return resample_poly(x, int(target_rate) // g, int(rate) // g)


def _as_rate(value: Any, name: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return _check_positive_int(value, name)


def fbank(samples: np.ndarray, sample_rate: int, num_mel_bins: int = 80, frame_shift_ms: float = 10.0,
          frame_length_ms: float = 25.0, dither: float = 0.0, target_rate: int = 16000, *,
          waveform_scale: float = 32768.0, low_freq: float = 20.0, high_freq: float = 0.0,
          snip_edges: bool = True) -> np.ndarray:
    """Log mel filter-bank energies ``(frames, num_mel_bins)`` (float32), computed by kaldi-native-fbank.

    The input is 1-D samples (floats in [-1, 1], as from :func:`read_wav`) at any ``sample_rate``; when it
    differs from ``target_rate`` the signal is first resampled with :func:`scipy.signal.resample_poly`
    (polyphase, ratio reduced by the gcd). Samples are multiplied by ``waveform_scale`` (default 32768,
    the 16-bit integer range Kaldi's ``compute-fbank-feats`` sees) before the analysis. The remaining
    options are Kaldi's defaults (povey window, pre-emphasis 0.97, DC removal, power spectrum, mel bins
    from ``low_freq`` to ``high_freq`` (0 = Nyquist, negative = offset from Nyquist), ``snip_edges``: only
    whole frames, so ``1 + (n - 400) // 160`` frames at 16 kHz with 25/10 ms). ``dither`` > 0 uses
    kaldi-native-fbank's own unseeded random generator, so keep it 0 (the default) for reproducible
    features. A signal shorter than one frame gives ``(0, num_mel_bins)``.

    >>> import numpy as np
    >>> x = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000).astype(np.float32)   # 1 s at 8 kHz
    >>> f = fbank(x, 8000)            # resampled to 16 kHz first
    >>> f.shape, f.dtype
    ((98, 80), dtype('float32'))
    >>> fbank(x, 8000, num_mel_bins=40, target_rate=8000).shape
    (98, 40)
    """
    import kaldi_native_fbank as knf

    sample_rate = _as_rate(sample_rate, "sample_rate")
    target_rate = _as_rate(target_rate, "target_rate")
    num_mel_bins = _check_positive_int(num_mel_bins, "num_mel_bins")
    for name, v in (("frame_shift_ms", frame_shift_ms), ("frame_length_ms", frame_length_ms)):
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ConfigError(f"{name} must be a positive number of milliseconds, got {v!r}")
    if not (isinstance(dither, int | float) and math.isfinite(dither) and dither >= 0):
        raise ConfigError(f"dither must be a non-negative number, got {dither!r}")
    x = np.asarray(samples)
    if x.ndim != 1:
        raise InputError(f"samples must be 1-D, got shape {x.shape}", expected="mono samples (see read_wav)")
    if x.dtype.kind != "f":
        hint = " (divide 16-bit PCM by 32768, or use read_wav)" if x.dtype.kind in "iu" else ""
        raise InputError(f"samples must be floating point, got dtype {x.dtype}{hint}",
                         expected="float samples in [-1, 1]")
    if not np.isfinite(x).all():
        raise InputError("samples contain NaN or infinity", expected="finite samples")
    x = resample(x.astype(np.float64), sample_rate, target_rate)
    x = (x * waveform_scale).astype(np.float32)

    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = float(target_rate)
    opts.frame_opts.frame_shift_ms = float(frame_shift_ms)
    opts.frame_opts.frame_length_ms = float(frame_length_ms)
    opts.frame_opts.dither = float(dither)
    opts.frame_opts.snip_edges = bool(snip_edges)
    opts.mel_opts.num_bins = num_mel_bins
    opts.mel_opts.low_freq = float(low_freq)
    opts.mel_opts.high_freq = float(high_freq)
    try:
        fb = knf.OnlineFbank(opts)
        if x.size:
            fb.accept_waveform(float(target_rate), x)
        fb.input_finished()
        n = fb.num_frames_ready
        out = np.stack([fb.get_frame(i) for i in range(n)]) if n else np.zeros((0, num_mel_bins), np.float32)
    except (ValueError, RuntimeError) as e:
        raise ConfigError(f"kaldi-native-fbank rejected the options: {e}",
                          expected=f"num_mel_bins and low/high_freq that fit a {target_rate} Hz signal") from None
    return np.ascontiguousarray(out, dtype=np.float32)


# ------------------------------------------------------------------------------------------- stacking


def _as_frames(x: Any, name: str = "x") -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2:
        raise InputError(f"{name} must be a 2-D (frames, dims) array, got shape {a.shape}", expected="(frames, dims)")
    return a


def stack_frames(x: np.ndarray, n: int = 3, stride: int | None = None) -> np.ndarray:
    """Stack ``n`` consecutive frames into one: ``(T, D)`` -> ``(ceil(T / stride), n * D)``.

    Output frame ``k`` is the concatenation of input frames ``k*stride, ..., k*stride + n - 1``.
    ``stride`` defaults to ``n``: non-overlapping stacks, so the frame rate drops ``n`` times (paper 002
    stacks 3 frames of 10 ms: 30 ms per encoder step). At the end, missing frames are filled by
    **repeating the last input frame**, so every input frame is used and no zeros are invented. An empty
    input gives ``(0, n * D)``.

    >>> import numpy as np
    >>> x = np.arange(5, dtype=np.float32)[:, None]          # 5 frames of 1 dim
    >>> stack_frames(x, 3).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 4.0]]
    >>> stack_frames(x, 2, stride=1).shape
    (5, 2)
    """
    a = _as_frames(x)
    n = _check_positive_int(n, "n")
    stride = n if stride is None else _check_positive_int(stride, "stride")
    t, d = a.shape
    if t == 0:
        return np.zeros((0, n * d), dtype=a.dtype)
    idx = np.minimum(np.arange(0, t, stride)[:, None] + np.arange(n)[None, :], t - 1)
    return a[idx].reshape(idx.shape[0], n * d)


# ----------------------------------------------------------------------------------------------- CMVN


@dataclass
class CmvnStats:
    """Streaming sufficient statistics for mean/variance normalisation: frame count, sums, sums of squares.

    Accumulate with :meth:`add` (in float64), combine with ``+`` (statistics of disjoint data add up, so a
    federated client can normalise with its own speaker statistics, or a server can sum client ones for
    a global normaliser). ``to_dict``/``from_dict`` give a JSON-ready form.

    >>> import numpy as np
    >>> s = CmvnStats.zeros(2).add(np.array([[1.0, 10.0], [3.0, 10.0]]))
    >>> s.count, s.mean.tolist(), s.var.tolist()
    (2, [2.0, 10.0], [1.0, 0.0])
    >>> (s + s).count, CmvnStats.from_dict(s.to_dict()) == s
    (4, True)
    """

    count: int
    sum: np.ndarray
    sumsq: np.ndarray

    @classmethod
    def zeros(cls, dim: int) -> CmvnStats:
        """Empty statistics for ``dim``-dimensional frames."""
        dim = _check_positive_int(dim, "dim")
        return cls(0, np.zeros(dim), np.zeros(dim))

    @classmethod
    def from_arrays(cls, arrays: Iterable[np.ndarray]) -> CmvnStats:
        """Statistics over all frames of ``arrays`` (each ``(frames, dim)``; at least one needed).

        >>> import numpy as np
        >>> CmvnStats.from_arrays([np.ones((2, 3)), np.zeros((2, 3))]).mean.tolist()
        [0.5, 0.5, 0.5]
        """
        stats: CmvnStats | None = None
        for a in arrays:
            a = _as_frames(a, "features")
            stats = (stats or cls.zeros(a.shape[1])).add(a)
        if stats is None:
            raise InputError("no feature arrays to compute CMVN statistics from", expected="at least one array")
        return stats

    @property
    def dim(self) -> int:
        """Feature dimension."""
        return int(self.sum.shape[0])

    def add(self, x: np.ndarray) -> CmvnStats:
        """Accumulate the frames of ``x`` (``(frames, dim)``) in place; returns ``self``."""
        a = _as_frames(x, "features")
        if a.shape[1] != self.dim:
            raise InputError(f"features have {a.shape[1]} dims, statistics have {self.dim}", expected=f"{self.dim} dims")
        a = a.astype(np.float64, copy=False)
        self.count += int(a.shape[0])
        self.sum += a.sum(axis=0)
        self.sumsq += np.square(a).sum(axis=0)
        return self

    def __add__(self, other: CmvnStats) -> CmvnStats:
        if not isinstance(other, CmvnStats):
            return NotImplemented
        if other.dim != self.dim:
            raise InputError(f"cannot add {other.dim}-dim statistics to {self.dim}-dim ones", expected="equal dims")
        return CmvnStats(self.count + other.count, self.sum + other.sum, self.sumsq + other.sumsq)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CmvnStats):
            return NotImplemented
        return (self.count == other.count and np.array_equal(self.sum, other.sum)
                and np.array_equal(self.sumsq, other.sumsq))

    __hash__ = None  # type: ignore[assignment]

    def _need_frames(self) -> None:
        if self.count <= 0:
            raise InputError("CMVN statistics hold no frames", expected="statistics accumulated from data")

    @property
    def mean(self) -> np.ndarray:
        """Per-dimension mean (float64)."""
        self._need_frames()
        return self.sum / self.count

    @property
    def var(self) -> np.ndarray:
        """Per-dimension (biased) variance, clipped at 0 against rounding (float64)."""
        m = self.mean
        return np.maximum(self.sumsq / self.count - m * m, 0.0)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``count``, ``sum``, ``sumsq`` as lists)."""
        return {"count": self.count, "sum": self.sum.tolist(), "sumsq": self.sumsq.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CmvnStats:
        """Inverse of :meth:`to_dict` (validated)."""
        try:
            count = d["count"]
            s = np.asarray(d["sum"], dtype=np.float64)
            q = np.asarray(d["sumsq"], dtype=np.float64)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"invalid CMVN statistics: {e}", expected="{count, sum, sumsq}") from None
        if (isinstance(count, bool) or not isinstance(count, int) or count < 0 or s.ndim != 1 or q.shape != s.shape
                or not (np.isfinite(s).all() and np.isfinite(q).all())):
            raise InputError("invalid CMVN statistics", expected="count >= 0 and equal-length finite sum/sumsq")
        return cls(count, s, q)


def apply_cmvn(x: np.ndarray, stats: CmvnStats, variance: bool = True, var_floor: float = 1e-10) -> np.ndarray:
    """Normalise ``x`` (``(frames, dim)``) with ``stats``: subtract the mean, divide by the standard deviation.

    Returns a new float32 array. With ``variance=False`` only the mean is removed (CMN). Variances below
    ``var_floor`` are floored so constant dimensions do not divide by zero.

    >>> import numpy as np
    >>> x = np.array([[1.0, 5.0], [3.0, 5.0]])
    >>> apply_cmvn(x, CmvnStats.from_arrays([x])).tolist()
    [[-1.0, 0.0], [1.0, 0.0]]
    >>> apply_cmvn(x, CmvnStats.from_arrays([x]), variance=False).tolist()
    [[-1.0, 0.0], [1.0, 0.0]]
    """
    a = _as_frames(x)
    if a.shape[1] != stats.dim:
        raise InputError(f"features have {a.shape[1]} dims, statistics have {stats.dim}", expected=f"{stats.dim} dims")
    y = a.astype(np.float64) - stats.mean
    if variance:
        y /= np.sqrt(np.maximum(stats.var, var_floor))
    return y.astype(np.float32)


def speaker_cmvn_stats(items: Iterable[tuple[str, np.ndarray]]) -> dict[str, CmvnStats]:
    """Per-speaker CMVN statistics from ``(speaker, features)`` pairs (e.g. AN4 utterances).

    >>> import numpy as np
    >>> st = speaker_cmvn_stats([("a", np.ones((2, 1))), ("b", np.zeros((1, 1))), ("a", np.zeros((2, 1)))])
    >>> {k: (v.count, v.mean.tolist()) for k, v in st.items()}
    {'a': (4, [0.5]), 'b': (1, [0.0])}
    """
    out: dict[str, CmvnStats] = {}
    for spk, a in items:
        a = _as_frames(a, "features")
        if spk not in out:
            out[spk] = CmvnStats.zeros(a.shape[1])
        out[spk].add(a)
    return out


# ---------------------------------------------------------------------------------------- SpecAugment


@dataclass(frozen=True)
class SpecAugmentMasks:
    """The masks of one :func:`spec_augment` call: ``(start, width)`` per frequency and per time mask."""

    freq: tuple[tuple[int, int], ...]
    time: tuple[tuple[int, int], ...]


def spec_augment_masks(shape: tuple[int, int], rng: np.random.Generator, freq_masks: int = 2,
                       freq_width: int | None = None, time_masks: int = 2, time_width: int = 40,
                       time_ratio: float = 0.2) -> SpecAugmentMasks:
    """Draw SpecAugment masks for a ``(frames, dims)`` feature matrix (see :func:`spec_augment`).

    Each frequency mask has width ``f ~ U{0..F}`` (``F = min(freq_width, dims)``) and start
    ``f0 ~ U{0..dims - f}``; each time mask has width ``t ~ U{0..W}`` with
    ``W = min(time_width, floor(time_ratio * frames))`` and start ``t0 ~ U{0..frames - t}``.

    >>> import numpy as np
    >>> m = spec_augment_masks((100, 80), np.random.default_rng(0))
    >>> len(m.freq), len(m.time), all(0 <= w <= 27 and s + w <= 80 for s, w in m.freq)
    (2, 2, True)
    """
    t, d = shape
    for name, v in (("freq_masks", freq_masks), ("time_masks", time_masks), ("time_width", time_width)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {v!r}")
    if freq_width is None:
        freq_width = max(1, round(27 * d / 80))
    elif isinstance(freq_width, bool) or not isinstance(freq_width, int | np.integer) or freq_width < 0:
        raise ConfigError(f"freq_width must be a non-negative integer, got {freq_width!r}")
    if not (isinstance(time_ratio, int | float) and 0 <= time_ratio <= 1):
        raise ConfigError(f"time_ratio must be in [0, 1], got {time_ratio!r}")
    fmax = min(int(freq_width), d)
    tmax = min(int(time_width), int(time_ratio * t))
    freq = []
    for _ in range(freq_masks):
        w = int(rng.integers(0, fmax + 1))
        freq.append((int(rng.integers(0, d - w + 1)), w))
    time = []
    for _ in range(time_masks):
        w = int(rng.integers(0, tmax + 1))
        time.append((int(rng.integers(0, t - w + 1)), w))
    return SpecAugmentMasks(tuple(freq), tuple(time))


def spec_augment(x: np.ndarray, rng: np.random.Generator, freq_masks: int = 2, freq_width: int | None = None,
                 time_masks: int = 2, time_width: int = 40, time_ratio: float = 0.2,
                 fill: float = 0.0) -> np.ndarray:
    """SpecAugment frequency and time masking (Park et al. 2019; no time warping) on a copy of ``x``.

    ``x`` is ``(frames, dims)``; the input is never modified. ``freq_masks`` bands of up to
    ``freq_width`` dims (default: 27 scaled to the dimension, ``round(27 * dims / 80)`` - the LibriSpeech
    policy's F=27 for 80 mel bins, 4 for 13 MFCCs) and ``time_masks`` spans of up to ``time_width``
    frames, capped at ``time_ratio`` of the utterance (the "p" bound of the SM/SS policies; defaults
    40 frames = 0.4 s and 0.2, chosen for AN4's 1-7 s utterances), are set to ``fill`` (0: the mean after
    CMVN). The draws come from ``rng`` only (see :func:`spec_augment_masks`), so a seeded generator
    reproduces them. Apply it before :func:`stack_frames` so masks align with 10 ms frames.

    >>> import numpy as np
    >>> x = np.ones((50, 13), np.float32)
    >>> y = spec_augment(x, np.random.default_rng(1))
    >>> bool((x == 1).all()), y.shape, bool((y == 0).any())
    (True, (50, 13), True)
    """
    a = _as_frames(x)
    masks = spec_augment_masks(a.shape, rng, freq_masks, freq_width, time_masks, time_width, time_ratio)
    y = np.array(a, dtype=np.result_type(a.dtype, np.float32), copy=True)
    for s, w in masks.freq:
        y[:, s:s + w] = fill
    for s, w in masks.time:
        y[s:s + w, :] = fill
    return y
