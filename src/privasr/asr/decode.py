"""First-pass decoding of WAV files with pocketsphinx into canonical N-best lists.

:class:`Decoder` wraps a ``pocketsphinx.Decoder`` (the bundled en-us acoustic model, dictionary and LM by
default; or a given ARPA/binary LM and pronunciation dictionary). :func:`decode_files` reads each WAV
(any sample rate, averaged to mono, resampled to 16 kHz with :func:`scipy.signal.resample_poly`, 16-bit
PCM), decodes it and returns one :class:`~privasr.corpus.records.NBest` per file (``utt_id`` = the file
stem). Each list is the decoder's N-best (A* search over the lattice) with identical word sequences merged
(the best score kept), filler and silence tokens removed (``<s>``, ``</s>``, ``<sil>``, ``[NOISE]``,
``++NOISE++``) and pronunciation-variant suffixes (``(2)``) stripped; the decoder's 1-best (bestpath) is
added when the N-best lacks it; hypotheses are sorted by ``total``, best first.

Scores (natural log, larger is better; pocketsphinx computes in integer log base ``logbase`` = 1.0001,
and its path scores are further right-shifted by ``SENSCR_SHIFT`` = 10 bits, so one path-score unit is
``1024 * ln(1.0001)`` nats):

* ``total`` -- the decoder's N-best path score, ``raw * 1024 * ln(logbase)``: pocketsphinx's acoustic
  score (senone scores normalised by the best senone of each frame, so not a true log-likelihood) plus
  ``bestpathlw`` times the LM log-probability plus ``bestpathlw/lw * ln(wip)`` per word. Only differences
  between hypotheses of one utterance are meaningful.
* ``lm`` -- the first-pass LM's log-probability of the words, unweighted: ``ln P(w_1..w_n </s> | <s>)``
  with trigram context, computed here from the same LM file (pocketsphinx ``NGramModel``, raw
  ``log_1.0001`` values times ``ln 1.0001``). This is what :mod:`privasr.rescore.combine` expects as the
  ``lm`` feature.
* ``am`` -- the acoustic part implied by the total: ``total - bestpathlw * lm - (n + 1) * bestpathlw/lw *
  ln(wip)`` (``n`` words plus ``</s>``). pocketsphinx's Python API gives only the total for N-best entries,
  so ``am`` is derived, not measured; it includes silence/filler penalties and the per-frame normalisation.

The decoder's 1-best, when the N-best lacks it, has no N-best path score; it gets the best ``total`` of the
list (so it ranks first) and ``meta["source"] = "hyp"`` (N-best entries have ``"nbest"``). Decoding is
deterministic (no seed).

>>> strip_tokens(["<s>", "seven(2)", "<sil>", "[NOISE]", "two", "</s>"])
('seven', 'two')
>>> fsdd_reference("recordings/7_jackson_0.wav")
('seven',)
>>> nbs = decode_files(["7_jackson_0.wav"], lm=None)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError

__all__ = [
    "Decoder",
    "DecodeStats",
    "SAMPLE_RATE",
    "SENSCR_SHIFT",
    "decode_files",
    "default_model",
    "digits_lm",
    "fsdd_reference",
    "read_audio",
    "strip_tokens",
]

SAMPLE_RATE = 16000
"""The rate the bundled acoustic model expects; every input is resampled to it."""

SENSCR_SHIFT = 10
"""pocketsphinx keeps path scores right-shifted by this many bits (``SENSCR_SHIFT`` in its sources)."""

_FILLER = re.compile(r"^(<.*>|\[.*\]|\+\+.*\+\+)$")
_VARIANT = re.compile(r"\(\d+\)$")


def default_model() -> dict[str, str]:
    """Paths of the bundled en-us acoustic model (``hmm``), LM (``lm``) and dictionary (``dict``)."""
    import pocketsphinx

    return {"hmm": pocketsphinx.get_model_path("en-us/en-us"),
            "lm": pocketsphinx.get_model_path("en-us/en-us.lm.bin"),
            "dict": pocketsphinx.get_model_path("en-us/cmudict-en-us.dict")}


def strip_tokens(words: Iterable[str]) -> tuple[str, ...]:
    """Drop fillers/silence (``<s>``, ``<sil>``, ``[NOISE]``, ``++X++``) and ``(2)`` variant suffixes."""
    out = []
    for w in words:
        if _FILLER.match(w):
            continue
        w = _VARIANT.sub("", w)
        if w:
            out.append(w)
    return tuple(out)


def fsdd_reference(path: str | Path) -> tuple[str, ...]:
    """The reference of a Free Spoken Digit Dataset file ``{digit}_{speaker}_{index}.wav``.

    >>> fsdd_reference("0_theo_49.wav")
    ('zero',)
    """
    from privasr.corpus.formats.fsdd import DIGITS, FSDD_NAME

    m = FSDD_NAME.match(Path(path).name)
    if m is None:
        raise InputError("file name does not follow the FSDD layout", path=path,
                         expected="{digit}_{speaker}_{index}.wav")
    return (DIGITS[int(m.group(1))],)


def read_audio(path: str | Path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """A WAV (any format soundfile reads) as mono 16-bit PCM at ``sample_rate``.

    Channels are averaged; other rates are resampled with a polyphase filter. Missing, unreadable or
    empty audio is an :class:`InputError` naming the file.
    """
    from privasr.asr.features import read_wav, resample

    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", path=p, expected="a WAV file")
    x, sr = read_wav(p)
    y = resample(x.astype(np.float64), sr, sample_rate)
    return np.round(np.clip(y, -1.0, 1.0) * 32767.0).astype(np.int16)


@dataclass(frozen=True, slots=True)
class DecodeStats:
    """Totals of a decoding run: utterances, seconds of audio and seconds spent decoding.

    ``rtf`` is the real-time factor, decode seconds over audio seconds (1.0 = as fast as the audio plays).
    """

    utterances: int
    audio_s: float
    decode_s: float

    @property
    def rtf(self) -> float:
        return self.decode_s / self.audio_s if self.audio_s > 0 else math.nan


class Decoder:
    """A pocketsphinx decoder producing canonical N-best lists.

    Args:
        lm: an ARPA (or pocketsphinx binary) LM; ``None`` for the bundled en-us LM.
        dict: a pronunciation dictionary (CMUdict format); ``None`` for the bundled cmudict.
        hmm: an acoustic model folder; ``None`` for the bundled en-us model.
        nbest: the most hypotheses to keep per utterance (after merging duplicates).
        options: other pocketsphinx parameters (e.g. ``{"lw": 8.0, "beam": 1e-60}``).
    """

    def __init__(self, *, lm: str | Path | None = None, dict: str | Path | None = None,  # noqa: A002
                 hmm: str | Path | None = None, nbest: int = 10,
                 options: Mapping[str, Any] | None = None) -> None:
        import pocketsphinx

        if isinstance(nbest, bool) or not isinstance(nbest, int) or nbest < 1:
            raise ConfigError(f"nbest is {nbest!r}", expected="an integer >= 1")
        base = default_model()
        paths = {"lm": lm, "dict": dict, "hmm": hmm}
        for k, v in paths.items():
            if v is not None and not Path(v).exists():
                raise InputError(f"no such {'LM' if k == 'lm' else 'dictionary' if k == 'dict' else 'acoustic model'}",
                                 path=v, expected="an existing file" if k != "hmm" else "an existing folder")
        self.paths = {k: str(v) if v is not None else base[k] for k, v in paths.items()}
        self.nbest = nbest
        self.options = dict_(options or {})
        kwargs = {**self.paths, "loglevel": "ERROR", "samprate": SAMPLE_RATE, **self.options}
        try:
            self._ps = pocketsphinx.Decoder(**kwargs)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ConfigError(f"pocketsphinx could not load lm={self.paths['lm']} dict={self.paths['dict']} "
                              f"hmm={self.paths['hmm']} ({e})", expected="a valid LM, dictionary and model") from None
        try:
            self._lm = pocketsphinx.NGramModel.readfile(self.paths["lm"])
        except ValueError:
            raise InputError("cannot read the LM", path=self.paths["lm"], expected="an ARPA or binary LM") from None
        cfg = self._ps.config
        self.logbase = float(cfg["logbase"])
        self.lw = float(cfg["lw"])
        self.bestpath_lw = float(cfg["bestpathlw"]) if cfg["bestpath"] else self.lw
        self.wip = float(cfg["wip"])
        self._ln_base = math.log(self.logbase)

    @property
    def config(self) -> dict[str, Any]:
        """The settings that determine the output (model paths, N-best size, LM weights)."""
        return {**self.paths, "nbest": self.nbest, "logbase": self.logbase, "lw": self.lw,
                "bestpath_lw": self.bestpath_lw, "wip": self.wip, "sample_rate": SAMPLE_RATE, **self.options}

    def lm_logprob(self, words: Sequence[str]) -> float:
        """``ln P(words </s> | <s>)`` under the first-pass LM (unweighted, trigram context at most)."""
        ctx = ["<s>"]
        total = 0
        for w in (*words, "</s>"):
            # NGramModel.prob takes the word then its history, most recent first; at most 3 words
            # (pocketsphinx's binding allocates len(words) bytes for the pointer array: keep it small).
            total += self._lm.prob([w, *reversed(ctx[-2:])])
            ctx.append(w)
        return total * self._ln_base

    def _path_score(self, raw: float) -> float:
        """A probability-domain value from the binding back to its log, in nats of the unshifted scale."""
        if raw <= 0.0:
            return -math.inf
        return math.log(raw) * (1 << SENSCR_SHIFT)

    def decode_pcm(self, pcm: np.ndarray, utt_id: str, ref: Sequence[str] | None = None) -> NBest:
        """Decode 16 kHz 16-bit mono samples into an :class:`NBest` (see the module doc for the scores)."""
        ps = self._ps
        ps.start_utt()
        ps.process_raw(np.ascontiguousarray(pcm, dtype=np.int16).tobytes(), full_utt=True)
        ps.end_utt()
        hyp = ps.hyp()
        best_words = strip_tokens(hyp.hypstr.split()) if hyp is not None else None
        merged: dict[tuple[str, ...], float] = {}
        order: list[tuple[str, ...]] = []
        if hyp is not None:
            seen = 0
            for h in ps.nbest():
                if h is None:  # the binding yields None when the A* search runs dry
                    break
                # the binding returns logmath_exp(score): log() undoes it; the score is in shifted units
                words = strip_tokens(h.hypstr.split())
                total = self._path_score(h.score)
                if words not in merged:
                    order.append(words)
                    merged[words] = total
                elif total > merged[words]:
                    merged[words] = total
                seen += 1
                if len(merged) >= self.nbest and seen >= self.nbest:
                    break
        sources = dict.fromkeys(merged, "nbest")
        if best_words is not None and best_words not in merged:
            top = max(merged.values(), default=self._path_score(hyp.score))
            merged[best_words] = top
            sources[best_words] = "hyp"
            order.insert(0, best_words)
        ranked = sorted(order, key=lambda w: (-merged[w], 0 if w == best_words else 1))[: self.nbest]
        if best_words is not None and best_words not in ranked:
            ranked[-1] = best_words
            ranked.sort(key=lambda w: (-merged[w], 0 if w == best_words else 1))
        lwf = self.bestpath_lw / self.lw
        hyps = []
        for w in ranked:
            if not w and best_words is not None and w != best_words:
                continue  # an empty N-best entry adds nothing unless it is the decoder's answer
            total = merged[w]
            lm = self.lm_logprob(w)
            am = total - self.bestpath_lw * lm - (len(w) + 1) * lwf * math.log(self.wip)
            scores = {"am": am, "lm": lm, "total": total} if math.isfinite(total) else {"lm": lm}
            hyps.append(Hypothesis(w, scores=scores, meta={"source": sources[w]}))
        meta = {"decoder_1best": " ".join(best_words) if best_words is not None else None,
                "audio_s": round(len(pcm) / SAMPLE_RATE, 6)}
        return NBest(utt_id, tuple(hyps), ref=tuple(ref) if ref is not None else None,
                     meta={k: v for k, v in meta.items() if v is not None})

    def decode_file(self, path: str | Path, ref: Sequence[str] | None = None) -> NBest:
        """Read and decode one WAV file (``utt_id`` = its stem)."""
        return self.decode_pcm(read_audio(path), Path(path).stem, ref)


def dict_(m: Mapping[str, Any]) -> dict[str, Any]:
    """A plain dict copy (the ``dict`` argument of :class:`Decoder` shadows the builtin there)."""
    return {str(k): v for k, v in m.items()}


def decode_files(paths: Sequence[str | Path], *, lm: str | Path | None = None, dict: str | Path | None = None,  # noqa: A002
                 hmm: str | Path | None = None, nbest: int = 10,
                 refs: Mapping[str, Sequence[str]] | None = None,
                 options: Mapping[str, Any] | None = None,
                 stats: list[DecodeStats] | None = None, decoder: Decoder | None = None) -> list[NBest]:
    """Decode WAV files into N-best lists, in input order (see the module doc).

    Args:
        paths: WAV files (any sample rate; stereo is averaged).
        lm, dict, hmm: LM, dictionary and acoustic model (``None``: the bundled en-us ones).
        nbest: the most hypotheses per utterance.
        refs: references by utterance id (file stem), attached to the lists when present.
        options: other pocketsphinx parameters.
        stats: if given, a :class:`DecodeStats` (audio and decoding seconds) is appended to it.
        decoder: an already built :class:`Decoder` to use (then ``lm``, ``dict``, ``hmm``, ``nbest`` and
            ``options`` are ignored).

    >>> nbs = decode_files(["recordings/7_jackson_0.wav"])  # doctest: +SKIP
    >>> nbs[0].utt_id, nbs[0].best.text  # doctest: +SKIP
    ('7_jackson_0', "i've done")
    """
    dec = decoder if decoder is not None else Decoder(lm=lm, dict=dict, hmm=hmm, nbest=nbest, options=options)
    out = []
    audio = busy = 0.0
    for p in paths:
        pcm = read_audio(p)
        stem = Path(p).stem
        t0 = time.perf_counter()
        out.append(dec.decode_pcm(pcm, stem, None if refs is None else refs.get(stem)))
        busy += time.perf_counter() - t0
        audio += len(pcm) / SAMPLE_RATE
    if stats is not None:
        stats.append(DecodeStats(len(out), audio, busy))
    return out


def digits_lm(out_dir: str | Path, words: Sequence[str] | None = None) -> tuple[Path, Path]:
    """Write a uniform unigram ARPA LM and a dictionary for the ten digit words (or ``words``).

    The LM gives every word and ``</s>`` probability ``1 / (len(words) + 1)``; the dictionary holds their
    pronunciations (all variants) from the bundled cmudict. Returns ``(arpa_path, dict_path)``.

    >>> import tempfile
    >>> arpa, dic = digits_lm(tempfile.mkdtemp())
    >>> sorted(line.split()[0] for line in dic.read_text().splitlines())[:3]
    ['eight', 'five', 'four']
    >>> "ngram 1=12" in arpa.read_text()
    True
    """
    from privasr.corpus.formats.fsdd import DIGITS
    from privasr.lm.ngram.arpa import write_arpa
    from privasr.lm.ngram.model import NgramModel

    vocab = tuple(words) if words is not None else DIGITS
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lp = -math.log10(len(vocab) + 1)
    entries = {("<s>",): (-99.0, 0.0), **{(w,): (lp, 0.0) for w in vocab}, ("</s>",): (lp, 0.0)}
    arpa = out / "digits.arpa"
    write_arpa(NgramModel.from_entries(1, {1: entries}), arpa)
    want = set(vocab)
    lines = []
    with open(default_model()["dict"], encoding="utf-8") as f:
        for line in f:
            head = line.split(maxsplit=1)[0] if line.strip() else ""
            if _VARIANT.sub("", head) in want:
                lines.append(line if line.endswith("\n") else line + "\n")
    missing = want - {_VARIANT.sub("", ln.split()[0]) for ln in lines}
    if missing:
        raise InputError(f"no pronunciation for {sorted(missing)}", path=default_model()["dict"],
                         expected="every word in the bundled dictionary")
    dic = out / "digits.dict"
    dic.write_text("".join(lines), encoding="utf-8")
    return arpa, dic
