"""First-pass decoding of WAV files with pocketsphinx into canonical N-best lists.

:class:`Decoder` wraps a ``pocketsphinx.Decoder`` (the bundled en-us acoustic model, dictionary and LM by
default; or a given ARPA/binary LM, pronunciation dictionary and acoustic model, e.g. one adapted with
:func:`privasr.asr.adapt.adapt_model`). :func:`decode_files` reads each WAV (any sample rate, averaged to
mono, resampled to 16 kHz with :func:`scipy.signal.resample_poly`, 16-bit PCM), decodes it and returns one
:class:`~privasr.corpus.records.NBest` per file (``utt_id`` = the file stem).

The N-best list is built as the shared ``ami-tts-nbest*`` sets were (their SOURCE.txt): ``hyps[0]`` is
always the decoder's 1-best (``hyp()``, the bestpath result); then the first ``nbest_paths`` (300) paths of
pocketsphinx's A* search (``nbest()``) are read, filler and silence tokens removed (``<s>``, ``</s>``,
``<sil>``, ``[NOISE]``, ``++NOISE++``) and pronunciation-variant suffixes (``(2)``) stripped, identical
strings merged keeping their best A* score, and the best ``nbest - 1`` strings other than the 1-best follow,
best A* score first.

Scores (natural log, larger is better; pocketsphinx computes in integer log base ``logbase`` = 1.0001,
and its path scores are further right-shifted by ``SENSCR_SHIFT`` = 10 bits, so one path-score unit is
``1024 * ln(1.0001)`` nats):

* ``am`` -- the decoder's own acoustic score of the words: the best path through the utterance's word
  lattice (``Lattice.write_htk``, the links' ``a=`` scores) whose non-filler words are the hypothesis, fillers,
  silence and null nodes free (:func:`privasr.corpus.formats.htk_lattice.best_path_scores`). Every hypothesis
  of an utterance comes from the same lattice, so ``am`` is comparable across them (pocketsphinx normalises
  senone scores per frame, so not across utterances). Absent when no lattice path spells the words.
* ``lm`` -- the first-pass LM's log-probability ``ln P(w_1..w_n </s> | <s>)``: with an ARPA LM, the exact
  backoff value from :class:`~privasr.lm.ngram.model.NgramModel` (as KenLM's ``Model.score(bos=True,
  eos=True)`` gives it); with a binary LM, pocketsphinx's ``NGramModel`` (quantised to 1e-4 nats per word).
* ``total`` -- the decoder's path score: the bestpath score for ``hyps[0]`` and the A* score for the others.
  **The two are on different scales** (bestpath vs A*): compare ``total`` only within ``hyps[1:]``.
* ``nbest`` -- the A* score of every string found among the A* paths (``hyps[0]`` too, when it is there).

Word confidences: ``hyps[0].confidences`` are the 1-best words' lattice word posteriors ``C_max``
(:func:`privasr.corpus.formats.htk_lattice.word_posteriors`): pocketsphinx computes every lattice link's
posterior (forward-backward over the lattice with its acoustic scale ``ascale`` and the bestpath LM weight),
and a word's confidence is the most, over the frames of its 1-best segment (``Decoder.seg()``), of the
posteriors summed over the links of the same word through that frame. They are absent (``None``) when the
segmentation does not spell the 1-best or the lattice has no posteriors; ``NBest.meta["confidence"]`` then
says why. Other hypotheses carry no confidences.

``Hypothesis.meta["score_src"]`` is ``"hyp"`` for ``hyps[0]`` and ``"nbest"`` for the rest. ``NBest.meta``
holds ``decoder_1best``, ``audio_sec``, ``onebest_in_nbest`` (whether the 1-best string was among the A*
paths), ``n_nbest_paths`` and ``n_nbest_unique``. For rescoring use ``am + a*lm_new + b*lm + c*n_words``
with weights tuned on dev. Decoding is deterministic (no seed): the feature front end is reset before every
utterance (pocketsphinx otherwise carries CMN and noise estimates over from the previous one), so an
utterance's list does not depend on what was decoded before it, or in which process.

>>> strip_tokens(["<s>", "seven(2)", "<sil>", "[NOISE]", "two", "</s>"])
('seven', 'two')
>>> fsdd_reference("recordings/7_jackson_0.wav")
('seven',)
>>> nbs = decode_files(["7_jackson_0.wav"], lm=None)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import re
import tempfile
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


def _base_word(word: str) -> str:
    """A dictionary word without its pronunciation-variant suffix: ``to(3)`` -> ``to``."""
    return _VARIANT.sub("", word)


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
    """A pocketsphinx decoder producing canonical N-best lists (see the module doc for the recipe).

    Args:
        lm: an ARPA (or pocketsphinx binary) LM; ``None`` for the bundled en-us LM.
        dict: a pronunciation dictionary (CMUdict format); ``None`` for the bundled cmudict.
        hmm: an acoustic model folder; ``None`` for the bundled en-us model.
        nbest: the most hypotheses to keep per utterance (the 1-best and ``nbest - 1`` others).
        nbest_paths: how many A* paths to read for them.
        options: other pocketsphinx parameters (e.g. ``{"lw": 8.0, "beam": 1e-60}``).
    """

    def __init__(self, *, lm: str | Path | None = None, dict: str | Path | None = None,  # noqa: A002
                 hmm: str | Path | None = None, nbest: int = 10, nbest_paths: int = 300,
                 options: Mapping[str, Any] | None = None) -> None:
        import pocketsphinx

        for name, v in (("nbest", nbest), ("nbest_paths", nbest_paths)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} is {v!r}", expected="an integer >= 1")
        base = default_model()
        paths = {"lm": lm, "dict": dict, "hmm": hmm}
        for k, v in paths.items():
            if v is not None and not Path(v).exists():
                raise InputError(f"no such {'LM' if k == 'lm' else 'dictionary' if k == 'dict' else 'acoustic model'}",
                                 path=v, expected="an existing file" if k != "hmm" else "an existing folder")
        self.paths = {k: str(v) if v is not None else base[k] for k, v in paths.items()}
        self.nbest = nbest
        self.nbest_paths = nbest_paths
        self.options = dict_(options or {})
        kwargs = {**self.paths, "loglevel": "ERROR", "samprate": SAMPLE_RATE, **self.options}
        try:
            self._ps = pocketsphinx.Decoder(**kwargs)
        except (RuntimeError, ValueError, KeyError) as e:
            raise ConfigError(f"pocketsphinx could not load lm={self.paths['lm']} dict={self.paths['dict']} "
                              f"hmm={self.paths['hmm']} ({e})", expected="a valid LM, dictionary and model") from None
        self._arpa = _read_arpa_or_none(self.paths["lm"])
        if self._arpa is None:
            try:
                self._lm = pocketsphinx.NGramModel.readfile(self.paths["lm"])
            except ValueError:
                raise InputError("cannot read the LM", path=self.paths["lm"], expected="an ARPA or binary LM") from None
        cfg = self._ps.config
        self.logbase = float(cfg["logbase"])
        self.lw = float(cfg["lw"])
        self.bestpath_lw = float(cfg["bestpathlw"]) if cfg["bestpath"] else self.lw
        self.wip = float(cfg["wip"])
        self.frame_rate = int(cfg["frate"])
        self._ln_base = math.log(self.logbase)

    @property
    def config(self) -> dict[str, Any]:
        """The settings that determine the output (model paths, N-best size, LM weights)."""
        return {**self.paths, "nbest": self.nbest, "nbest_paths": self.nbest_paths, "logbase": self.logbase,
                "lw": self.lw, "bestpath_lw": self.bestpath_lw, "wip": self.wip, "sample_rate": SAMPLE_RATE,
                "am_score": "lattice best path", "confidence": "lattice word posterior C_max", **self.options}

    def lm_logprob(self, words: Sequence[str]) -> float:
        """``ln P(words </s> | <s>)`` under the first-pass LM (unweighted)."""
        if self._arpa is not None:
            return self._arpa.score(list(words)).ln_total
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

    def _lattice(self) -> Any:
        """The utterance's word lattice as SLF (:class:`~privasr.corpus.formats.htk_lattice.Lattice`), or None."""
        from privasr.corpus.formats.htk_lattice import read_htk_lattice

        lat = self._ps.get_lattice()
        if lat is None:
            return None
        with tempfile.TemporaryDirectory(prefix="privasr-lat-") as tmp:
            f = Path(tmp) / "utt.slf"
            lat.write_htk(str(f))
            return read_htk_lattice(f)

    def _confidences(self, lattice: Any, best_words: tuple[str, ...]) -> tuple[tuple[float, ...] | None, str]:
        """The 1-best words' lattice posteriors ``C_max`` and how they were found (see the module doc)."""
        from privasr.corpus.formats.htk_lattice import word_posteriors

        if lattice is None or lattice.link_posterior is None or np.isnan(lattice.link_posterior).any():
            return None, "none: no lattice posteriors"
        frame = 1.0 / self.frame_rate
        segs = []
        for sg in self._ps.seg():
            w = _base_word(sg.word)
            if not _FILLER.match(w):
                segs.append((w, sg.start_frame * frame, max(sg.start_frame, sg.end_frame) * frame))
        if tuple(w for w, _, _ in segs) != best_words:
            return None, "none: the segmentation does not spell the 1-best"
        post = word_posteriors(lattice, segs, word_on="start", frame_s=frame, word_key=_base_word)
        return tuple(post), "lattice C_max"

    def decode_pcm(self, pcm: np.ndarray, utt_id: str, ref: Sequence[str] | None = None, *,
                   timing: dict[str, float] | None = None) -> NBest:
        """Decode 16 kHz 16-bit mono samples into an :class:`NBest` (see the module doc for the recipe).

        ``timing``, if given, receives the seconds spent in ``decode``, ``nbest_lattice`` and ``post``.
        """
        ps = self._ps
        t0 = time.perf_counter()
        # pocketsphinx carries feature state (CMN, noise estimates) from one utterance to the next, so the
        # same audio decodes differently after different predecessors; a fresh front end per utterance makes
        # every result independent of the order and of the process that decodes it.
        ps.reinit_feat()
        ps.start_utt()
        ps.process_raw(np.ascontiguousarray(pcm, dtype=np.int16).tobytes(), full_utt=True)
        ps.end_utt()
        t1 = time.perf_counter()
        hyp = ps.hyp()
        meta: dict[str, Any] = {"audio_sec": len(pcm) / SAMPLE_RATE}
        if hyp is None:  # nothing recognised
            if timing is not None:
                timing.update(decode=t1 - t0, nbest_lattice=0.0, post=0.0)
            return NBest(utt_id, (), ref=tuple(ref) if ref is not None else None,
                         meta={**meta, "n_nbest_paths": 0, "n_nbest_unique": 0})
        best_words = strip_tokens(hyp.hypstr.split())
        best_total = self._path_score(hyp.score)
        astar: dict[tuple[str, ...], float] = {}
        n_paths = 0
        for h in ps.nbest():
            if h is None:  # the binding yields None when the A* search runs dry
                break
            n_paths += 1
            words = strip_tokens(h.hypstr.split())
            total = self._path_score(h.score)
            if words not in astar or total > astar[words]:
                astar[words] = total
            if n_paths >= self.nbest_paths:
                break
        others = sorted((w for w in astar if w != best_words), key=lambda w: -astar[w])[: self.nbest - 1]
        ranked = [best_words, *others]
        from privasr.corpus.formats.htk_lattice import best_path_scores

        lattice = self._lattice()
        if lattice is None:
            ams: list[float | None] = [None] * len(ranked)
        else:
            ams = best_path_scores(lattice, ranked, word_key=_base_word)
        confidences, how = self._confidences(lattice, best_words)
        t2 = time.perf_counter()
        hyps = []
        for k, (w, am) in enumerate(zip(ranked, ams, strict=True)):
            total = best_total if k == 0 else astar[w]
            scores = {"total": total, "lm": self.lm_logprob(w)}
            if am is not None:
                scores["am"] = am
            if w in astar:
                scores["nbest"] = astar[w]
            scores = {n: v for n, v in scores.items() if not math.isnan(v) and v != math.inf}
            hyps.append(Hypothesis(w, scores=scores, confidences=confidences if k == 0 else None,
                                   meta={"score_src": "hyp" if k == 0 else "nbest"}))
        meta.update(decoder_1best=" ".join(best_words), onebest_in_nbest=best_words in astar, confidence=how,
                    n_nbest_paths=n_paths, n_nbest_unique=len(astar))
        out = NBest(utt_id, tuple(hyps), ref=tuple(ref) if ref is not None else None, meta=meta)
        if timing is not None:
            timing.update(decode=t1 - t0, nbest_lattice=t2 - t1, post=time.perf_counter() - t2)
        return out

    def decode_file(self, path: str | Path, ref: Sequence[str] | None = None) -> NBest:
        """Read and decode one WAV file (``utt_id`` = its stem)."""
        return self.decode_pcm(read_audio(path), Path(path).stem, ref)


def _read_arpa_or_none(path: str) -> Any:
    """The LM as an :class:`NgramModel` when it is an ARPA file, else ``None`` (a pocketsphinx binary LM)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if b"\\data\\" not in head:
        return None
    from privasr.lm.ngram.arpa import read_arpa

    return read_arpa(path)


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
