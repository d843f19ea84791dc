"""N-best testbeds from transcripts: synthetic speech, an adapted first pass, lattice-scored N-best lists.

This is the recipe of the shared ``ami-tts-nbest-adapted`` set (its SOURCE.txt) as a library, so a user can
build the same kind of N-best set from their own transcripts and LM:

1. **Adaptation text** (:func:`select_adaptation_sentences`): from a *generic* text (never the evaluation
   text), sentences of ``min_words``-``max_words`` words (6-20) whose every word the dictionary has; shuffled
   with ``random.Random(seed)``, the first ``pool`` (400) kept, ``sentences`` (200) of them drawn with
   ``random.Random(seed + 2)``. With seed 0 that is the shared set's ``Random(0)`` / ``Random(2)``.
   :func:`overlapping_sentences` finds adaptation sentences equal to an evaluation transcript (after
   whitespace normalisation), which :func:`build_adapted_model` refuses.
2. **Adaptation** (:func:`build_adapted_model`): the sentences spoken in turn by the voices (rate and noise
   volume drawn from ``random.Random(seed)``), then :func:`privasr.asr.adapt.adapt_model` (MAP by default)
   of the bundled en-us model.
3. **Evaluation audio and first pass** (:func:`build_tts_nbest`): every transcript spoken by its speaker's
   fixed voice (:func:`privasr.asr.tts.speaker_voice`), decoded with the (adapted) model and the given LM
   into N-best lists with lattice acoustic scores (:class:`privasr.asr.decode.Decoder`).

The output is canonical N-best JSON Lines with every field of the shared set: ``client``, ``speaker``,
``order`` and ``ref`` from the transcript, hypothesis scores ``total``, ``lm``, ``am``, ``nbest`` and
``meta.score_src``, and ``NBest.meta`` with the transcript's own meta (e.g. ``role``), ``tts`` (voice, rate,
noise_vol), ``audio_sec``, ``decoder_1best``, ``onebest_in_nbest``, ``n_nbest_paths``, ``n_nbest_unique``.
The shared set's per-utterance ``timing_sec`` goes to ``timing.jsonl`` instead, so that the N-best file is
byte-identical between runs with the same seed.

Work is spread over ``jobs`` processes, each with its own decoder; each utterance's result is written to
``OUT/cache/`` as soon as it is done (atomically), so a killed run resumes where it stopped and gives the
same output as an uninterrupted one. A cache made with other settings is refused, never mixed in.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from privasr.asr.adapt import AdaptedModel, adapt_model, dictionary_words
from privasr.asr.tts import KLATT_VOICES, Voice, file_seed, program_versions, speaker_voice, synthesize
from privasr.corpus.records import NBest, Transcript
from privasr.corpus.textio import PathLike
from privasr.errors import ConfigError, InputError

__all__ = [
    "AdaptationSpec",
    "TtsSettings",
    "TtsNbestResult",
    "select_adaptation_sentences",
    "overlapping_sentences",
    "adaptation_voices",
    "build_adapted_model",
    "build_tts_nbest",
    "NOISE_MODES",
    "summary_metrics",
    "write_outputs",
    "clear_cache",
    "model_adaptation_sentences",
    "ADAPTATION_TEXT",
    "expand_lm",
    "make_decoder",
]

NOISE_MODES = ("repeat", "seeded")
ADAPTATION_TEXT = "adaptation-sentences.txt"
"""The file in an adapted model folder that lists the sentences it was adapted on (for overlap checks)."""
_CACHE_VERSION = 2


@dataclass(frozen=True)
class AdaptationSpec:
    """How adaptation sentences are chosen and used (defaults: the shared set's recipe)."""

    sentences: int = 200
    pool: int = 400
    min_words: int = 6
    max_words: int = 20
    method: str = "map"

    def __post_init__(self) -> None:
        for k in ("sentences", "pool", "min_words", "max_words"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"adaptation {k} is {v!r}", expected="an integer >= 1")
        if self.min_words > self.max_words or self.sentences > self.pool:
            raise ConfigError(f"adaptation {asdict(self)}", expected="min_words <= max_words and sentences <= pool")
        if self.method not in ("map", "mllr"):
            raise ConfigError(f"adaptation method {self.method!r}", expected="map or mllr")


@dataclass(frozen=True)
class TtsSettings:
    """Synthesis and decoding settings of a TTS N-best build (defaults: the shared set's recipe).

    ``noise_mode`` ``repeat`` is sox's repeatable noise (the same sequence in every file, as the shared
    sets); ``seeded`` draws each file's noise from ``seed`` and the utterance id.
    """

    seed: int = 0
    voices: tuple[str, ...] = KLATT_VOICES
    rate: tuple[int, int] = (140, 170)
    noise: tuple[float, float] = (0.008, 0.015)
    noise_mode: str = "repeat"
    nbest: int = 10
    nbest_paths: int = 300
    decoder_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed {self.seed!r}", expected="an integer")
        if self.noise_mode not in NOISE_MODES:
            raise ConfigError(f"noise mode {self.noise_mode!r}", expected=" or ".join(NOISE_MODES))
        object.__setattr__(self, "voices", tuple(self.voices))
        object.__setattr__(self, "decoder_options", dict(self.decoder_options))
        speaker_voice("probe", voices=self.voices, rate=self.rate, noise=self.noise)  # validates the ranges

    def voice_of(self, speaker: str) -> Voice:
        return speaker_voice(speaker, voices=self.voices, rate=self.rate, noise=self.noise)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["voices"], d["rate"], d["noise"] = list(self.voices), list(self.rate), list(self.noise)
        return d


def _key(words: Iterable[str]) -> str:
    return " ".join(" ".join(words).split())


def select_adaptation_sentences(sentences: Sequence[Sequence[str]], vocabulary: Iterable[str] | None = None,
                                spec: AdaptationSpec | None = None, seed: int = 0) -> list[tuple[str, ...]]:
    """The adaptation sentences of a generic text (see the module doc, step 1).

    >>> text = [tuple(f"w{i} w{j}".split()) for i in range(30) for j in range(3)]
    >>> picked = select_adaptation_sentences(text, None, AdaptationSpec(sentences=5, pool=10, min_words=2), seed=0)
    >>> len(picked), picked == select_adaptation_sentences(text, None, AdaptationSpec(5, 10, 2), seed=0)
    (5, True)
    """
    spec = spec or AdaptationSpec()
    vocab = None if vocabulary is None else frozenset(vocabulary)
    ok = [tuple(s) for s in sentences
          if spec.min_words <= len(s) <= spec.max_words and (vocab is None or all(w in vocab for w in s))]
    if len(ok) < spec.sentences:
        raise InputError(f"only {len(ok)} sentences of {spec.min_words}-{spec.max_words} words in the dictionary",
                         expected=f"at least {spec.sentences} adaptation sentences")
    random.Random(seed).shuffle(ok)
    pool = ok[: spec.pool]
    return random.Random(seed + 2).sample(pool, spec.sentences)


def overlapping_sentences(adaptation: Iterable[Sequence[str]], evaluation: Iterable[Sequence[str]]) -> list[str]:
    """Adaptation sentences that are also evaluation sentences (exact match of the words), in order.

    >>> overlapping_sentences([("a", "b"), ("c",)], [("x",), ("a", "b")])
    ['a b']
    """
    ev = {_key(s) for s in evaluation}
    return [k for k in (_key(s) for s in adaptation) if k in ev]


def model_adaptation_sentences(model: PathLike | None) -> list[tuple[str, ...]] | None:
    """The sentences a model folder of :func:`build_adapted_model` was adapted on (``None`` if it does not say)."""
    if model is None or not (Path(model) / ADAPTATION_TEXT).is_file():
        return None
    from privasr.corpus.textio import iter_lines

    return [tuple(line.split()) for _, line in iter_lines(Path(model) / ADAPTATION_TEXT) if line.split()]


def adaptation_voices(n: int, settings: TtsSettings) -> list[Voice]:
    """The voices of ``n`` adaptation sentences: the voices in turn, rate and noise from ``Random(seed)``."""
    rng = random.Random(settings.seed)
    out = []
    for i in range(n):
        out.append(Voice(settings.voices[i % len(settings.voices)], rng.randint(*settings.rate),
                         round(rng.uniform(*settings.noise), 4)))
    return out


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def build_adapted_model(sentences: Sequence[Sequence[str]], out: PathLike, *, settings: TtsSettings | None = None,
                        method: str = "map", evaluation: Iterable[Sequence[str]] = (),
                        base: PathLike | None = None, dictionary: PathLike | None = None,
                        progress: Callable[[str], None] | None = None) -> AdaptedModel:
    """Speak the adaptation sentences and adapt the acoustic model to the voices (steps 1-2 of the module doc).

    Refuses (:class:`InputError`) adaptation sentences that are evaluation sentences. If ``out`` already
    holds a model built from the same sentences and settings it is reused.
    """
    settings = settings or TtsSettings()
    sents = [tuple(s) for s in sentences]
    if not sents:
        raise InputError("no adaptation sentences", expected="at least one sentence")
    clash = overlapping_sentences(sents, evaluation)
    if clash:
        raise InputError(f"{len(clash)} adaptation sentences are evaluation sentences (e.g. {clash[0]!r})",
                         expected="adaptation text that does not overlap the evaluation text")
    dest = Path(out)
    want = _digest({"sentences": sents, "settings": settings.as_dict(), "method": method,
                    "base": str(base), "dictionary": str(dictionary)})
    stamp = dest / "privasr-build.json"
    if stamp.is_file():
        try:
            have = json.loads(stamp.read_text(encoding="utf-8")).get("digest")
        except ValueError:
            have = None
        if have == want:
            return AdaptedModel.load(dest)
        raise InputError("the folder holds a model adapted with other sentences or settings", path=dest,
                         expected="a new folder (or remove this one)")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError("the output exists and is not a model of this command", path=dest,
                         expected="a new folder for the adapted model")
    voices = adaptation_voices(len(sents), settings)
    say = progress or (lambda _m: None)
    say(f"synthesising {len(sents)} adaptation sentences")
    audio = {}
    for i, (s, v) in enumerate(zip(sents, voices, strict=True)):
        seed = None if settings.noise_mode == "repeat" else file_seed(settings.seed, f"adapt-{i}")
        audio[f"adapt{i:05d}"] = synthesize(" ".join(s), v, noise_seed=seed)
    texts = {f"adapt{i:05d}": s for i, s in enumerate(sents)}
    # built beside the destination and moved into place whole, stamp included, so that a killed run leaves
    # either no model or a complete one
    building = dest.parent / f".{dest.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    adapt_model(audio, texts, building, method=method, base=base, dictionary=dictionary, progress=say)
    (building / ADAPTATION_TEXT).write_text("".join(" ".join(s) + "\n" for s in sents), encoding="utf-8")
    (building / "privasr-build.json").write_text(json.dumps({"digest": want, "sentences": len(sents)}) + "\n",
                                                 encoding="utf-8")
    if dest.exists():
        dest.rmdir()  # an empty folder (checked above)
    os.replace(building, dest)
    return AdaptedModel.load(dest)


@dataclass(frozen=True)
class TtsNbestResult:
    """A finished build: the N-best lists (input order), per-utterance timing and totals."""

    records: list[NBest]
    timing: dict[str, dict[str, float]]
    resumed: int
    wall_s: float

    @property
    def audio_s(self) -> float:
        return sum(float(r.meta.get("audio_sec", 0.0)) for r in self.records)


# --- worker side -----------------------------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def make_decoder(decoder_kw: Mapping[str, Any]) -> Any:
    """The first-pass decoder of ``decoder_kw``: ``engine`` ``"pocketsphinx"`` (the default:
    :class:`~privasr.asr.decode.Decoder`) or ``"whisper"`` (:class:`~privasr.asr.whisper.WhisperDecoder`),
    the other keys its arguments."""
    kw = dict(decoder_kw)
    engine = kw.pop("engine", "pocketsphinx")
    if engine == "whisper":
        from privasr.asr.whisper import WhisperDecoder

        return WhisperDecoder(**kw)
    if engine != "pocketsphinx":
        raise ConfigError(f"engine {engine!r}", expected="pocketsphinx or whisper")
    from privasr.asr.decode import Decoder

    return Decoder(**kw)


def _decode_one(decoder: Any, pcm: Any, utt_id: str, ref: tuple[str, ...], timing: dict[str, float]) -> Any:
    """One utterance's N-best list from either engine (Whisper's reference normalised as its hypotheses are)."""
    from privasr.asr.whisper import WhisperDecoder

    if isinstance(decoder, WhisperDecoder):
        t: list[float] = []
        nb = decoder.decode_pcm([pcm], [utt_id], [decoder.norm(ref)], t)[0]
        timing["decode"] = t[0]
        return nb
    return decoder.decode_pcm(pcm, utt_id, ref, timing=timing)


def _init_worker(decoder_kw: dict[str, Any]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _WORKER["decoder"] = make_decoder(decoder_kw)


def _cache_path(cache: Path, utt_id: str) -> Path:
    return cache / f"{hashlib.sha1(utt_id.encode('utf-8')).hexdigest()[:24]}.json"


def _work(task: tuple[str, str, str, int | None, dict[str, Any], dict[str, Any], str]) -> tuple[str, float]:
    """Synthesise and decode one utterance, write its cache entry; returns (utt_id, audio seconds)."""
    from privasr.corpus.formats.nbest_jsonl import nbest_to_json

    utt_id, text, voice_json, noise_seed, base_json, meta, cache_file = task
    voice = Voice(**json.loads(voice_json))
    t0 = time.perf_counter()
    try:
        pcm = synthesize(text, voice, noise_seed=noise_seed)
    except InputError as e:
        raise InputError(f"utterance {utt_id}: {e.message}", expected=e.expected) from None
    synth = time.perf_counter() - t0
    timing: dict[str, float] = {}
    nb = _decode_one(_WORKER["decoder"], pcm, utt_id, tuple(text.split()), timing)
    rec = nbest_to_json(nb)
    rec.update({k: v for k, v in base_json.items() if v is not None})
    rec["meta"] = {**meta, "tts": voice.as_dict(), **rec.get("meta", {})}
    entry = {"v": _CACHE_VERSION, "utt_id": utt_id, "text": text, "record": rec,
             "timing": {"synth": synth, **timing}}
    tmp = Path(cache_file + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(entry, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, cache_file)
    return utt_id, float(nb.meta.get("audio_sec", 0.0))


def _read_cache(path: Path, utt_id: str, text: str) -> dict[str, Any] | None:
    try:
        e = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent, or cut short by a kill: redo it
    if not isinstance(e, dict) or e.get("v") != _CACHE_VERSION or e.get("utt_id") != utt_id or e.get("text") != text:
        return None
    return e


def expand_lm(lm: PathLike | None, out: PathLike) -> Path | None:
    """The first-pass LM as a file pocketsphinx reads: a compressed ARPA file is expanded to ``out/lm.arpa``.

    ``None`` (pocketsphinx's bundled LM) and uncompressed files are returned as they are.
    """
    if lm is None:
        return None
    src = Path(lm)
    if not src.is_file():
        raise InputError("no such LM", path=src, expected="an ARPA (.gz/.xz allowed) or pocketsphinx binary LM")
    if src.suffix not in (".gz", ".xz", ".bz2"):
        return src
    from privasr.corpus.textio import open_text

    dest = Path(out)
    dest.mkdir(parents=True, exist_ok=True)
    target, tmp = dest / "lm.arpa", dest / "lm.arpa.tmp"
    with open_text(src) as f, open(tmp, "w", encoding="utf-8") as g:
        for block in iter(lambda: f.read(1 << 20), ""):
            g.write(block)
    os.replace(tmp, target)
    return target


def _check_transcripts(recs: Sequence[Transcript]) -> None:
    if not recs:
        raise InputError("no transcripts", expected="at least one utterance to synthesise")
    seen: set[str] = set()
    for t in recs:
        if t.utt_id in seen:
            raise InputError(f"utterance id {t.utt_id!r} appears twice", expected="unique utterance ids")
        seen.add(t.utt_id)
        if not t.words:
            raise InputError(f"utterance {t.utt_id!r} has no words", expected="at least one word to speak")


def _claim_cache(cache: Path, dest: Path, settings_doc: dict[str, Any]) -> None:
    """Record the build's settings in ``cache/settings.json``, or check that a resumed build had the same."""
    sfile = cache / "settings.json"
    if sfile.is_file():
        try:
            old = json.loads(sfile.read_text(encoding="utf-8"))
        except ValueError:
            old = None
        if old != json.loads(json.dumps(settings_doc, default=str)):
            raise InputError("the output folder holds a build with other settings or inputs", path=dest,
                             expected="the same settings to resume, or a new --out folder")
    else:
        sfile.write_text(json.dumps(settings_doc, indent=1, default=str) + "\n", encoding="utf-8")


def _pending(recs: Sequence[Transcript], cache: Path, settings: TtsSettings,
             ) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """The worker tasks of the utterances not in the cache, and the cache entries of those that are."""
    tasks = []
    done: dict[str, dict[str, Any]] = {}
    for t in recs:
        text = " ".join(t.words)
        cf = _cache_path(cache, t.utt_id)
        e = _read_cache(cf, t.utt_id, text)
        if e is not None:
            done[t.utt_id] = e
            continue
        spk = t.speaker or t.client or t.utt_id
        voice = settings.voice_of(spk)
        seed = None if settings.noise_mode == "repeat" else file_seed(settings.seed, t.utt_id)
        base = {"client": t.client, "speaker": t.speaker, "order": t.order}
        tasks.append((t.utt_id, text, json.dumps(asdict(voice)), seed, base, dict(t.meta), str(cf)))
    return tasks, done


def build_tts_nbest(transcripts: Sequence[Transcript], out: PathLike, *, lm: PathLike | None = None,
                    hmm: PathLike | None = None, dictionary: PathLike | None = None,
                    settings: TtsSettings | None = None, jobs: int = 1, progress: bool = False,
                    fingerprints: Mapping[str, Any] | None = None,
                    whisper: Mapping[str, Any] | None = None) -> TtsNbestResult:
    """Synthesise and decode every transcript into an N-best list (step 3 of the module doc).

    Args:
        transcripts: the evaluation transcripts (unique ids, at least one word each); ``speaker`` picks the
            voice (the client, else the utterance id, when there is none).
        out: the output folder; ``out/cache`` keeps finished utterances for resuming.
        lm: the first-pass LM, an uncompressed ARPA or pocketsphinx binary file (``None``: bundled en-us).
        hmm: the acoustic model folder (``None``: bundled en-us; e.g. :func:`build_adapted_model`'s output).
        dictionary: pronunciations (``None``: the bundled cmudict).
        settings: voices, noise, seed and N-best sizes.
        jobs: worker processes.
        progress: show a progress bar (rich) on stderr.
        fingerprints: the inputs' fingerprints, recorded with the cache settings (a different input is
            then a different build, never mixed into this cache).
        whisper: decode with Whisper instead (:class:`~privasr.asr.whisper.WhisperDecoder`'s arguments, e.g.
            ``{"model": DIR, "beam_size": 10}``; ``nbest`` from ``settings``; one thread per worker); ``lm``,
            ``hmm`` and ``dictionary`` must then be ``None``. References are normalised as its hypotheses.
    """
    settings = settings or TtsSettings()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs is {jobs!r}", expected="an integer >= 1")
    recs = list(transcripts)
    _check_transcripts(recs)
    from privasr.corpus.formats.nbest_jsonl import nbest_from_json

    if whisper is not None:
        if lm is not None or hmm is not None or dictionary is not None:
            raise ConfigError("an LM, acoustic model or dictionary was given for Whisper",
                              expected="none of them with the whisper engine")
        decoder_kw: dict[str, Any] = {"engine": "whisper", **{k: str(v) if isinstance(v, Path) else v
                                                              for k, v in whisper.items()},
                                      "nbest": settings.nbest, "threads": 1}
    else:
        decoder_kw = {"lm": None if lm is None else str(lm), "dict": None if dictionary is None else str(dictionary),
                      "hmm": None if hmm is None else str(hmm), "nbest": settings.nbest,
                      "nbest_paths": settings.nbest_paths, "options": dict(settings.decoder_options)}
    probe = make_decoder(decoder_kw)  # validates the models before any work
    if whisper is None and not {w for t in recs for w in t.words} & dictionary_words(probe.paths["dict"]):
        raise InputError("no transcript word is in the dictionary (wrong case or normalisation?)",
                         path=probe.paths["dict"], expected="transcripts normalised like the dictionary")
    dest = Path(out)
    cache = dest / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    _claim_cache(cache, dest, {"v": _CACHE_VERSION, "settings": settings.as_dict(), "decoder": decoder_kw,
                               "inputs": dict(fingerprints or {})})
    tasks, done = _pending(recs, cache, settings)
    t0 = time.perf_counter()
    _run_tasks(tasks, decoder_kw, jobs, progress, len(done), len(recs), probe)
    del probe
    wall = time.perf_counter() - t0
    out_recs, timing = [], {}
    for t in recs:
        e = done.get(t.utt_id) or _read_cache(_cache_path(cache, t.utt_id), t.utt_id, " ".join(t.words))
        if e is None:
            raise InputError(f"utterance {t.utt_id!r} has no result", path=cache, expected="every utterance decoded")
        out_recs.append(nbest_from_json(e["record"]))
        timing[t.utt_id] = e["timing"]
    return TtsNbestResult(out_recs, timing, len(done), wall)


def _run_tasks(tasks: list[Any], decoder_kw: dict[str, Any], jobs: int, show: bool, already: int,
               total: int, decoder: Any) -> None:
    from contextlib import nullcontext

    from privasr import progress

    with progress.task("tts-nbest", total=total, completed=already) if show else nullcontext(progress.Task()) as bar:
        audio = 0.0
        if not tasks:
            return
        if jobs == 1:
            _WORKER["decoder"] = decoder  # the validated decoder does the work itself
            try:
                for task in tasks:
                    _, sec = _work(task)
                    audio += sec
                    bar.advance()
                    bar.update(info=f"{audio:.0f} s audio")
            finally:
                _WORKER.pop("decoder", None)
            return
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(decoder_kw,)) as ex:
            futs = [ex.submit(_work, task) for task in tasks]
            try:
                for f in as_completed(futs):
                    _, sec = f.result()
                    audio += sec
                    bar.advance()
                    bar.update(info=f"{audio:.0f} s audio")
            except BaseException:
                for f in futs:
                    f.cancel()
                raise


def summary_metrics(result: TtsNbestResult, jobs: int) -> dict[str, Any]:
    """1-best and oracle WER, decoding speed and list sizes of a build (for results.json)."""
    from privasr.metrics.oracle import onebest_wer, oracle_wer, ref_in_list

    recs = result.records
    w1, wo = onebest_wer(recs), oracle_wer(recs)
    tim = list(result.timing.values())
    busy = sum(sum(v for k, v in t.items()) for t in tim)
    decode = sum(t.get("decode", 0.0) for t in tim)
    audio = result.audio_s
    return {
        "utterances": len(recs),
        "resumed": result.resumed,
        "ref_words": w1.ref_words,
        "wer_1best": w1.wer,
        "wer_oracle": wo.wer,
        "hyps_per_utt": sum(len(r) for r in recs) / len(recs),
        # pocketsphinx's: whether the bestpath 1-best was among the A* paths (None for an engine without it)
        "onebest_in_nbest": (sum(bool(r.meta.get("onebest_in_nbest")) for r in recs) / len(recs)
                             if any("onebest_in_nbest" in r.meta for r in recs) else None),
        "ref_in_nbest": ref_in_list(recs),
        "merged_share": _merged_share(recs),
        "audio_s": audio,
        "decode_s_per_audio_s": decode / audio if audio > 0 else math.nan,
        "cpu_s_per_audio_s": busy / audio if audio > 0 else math.nan,
        "wall_s": result.wall_s,
        "utterances_per_s": (len(recs) - result.resumed) / result.wall_s if result.wall_s > 0 else math.nan,
        "jobs": jobs,
    }


def _merged_share(recs: Sequence[NBest]) -> float | None:
    """The share of a Whisper beam's hypotheses merged into others after normalisation (None for pocketsphinx)."""
    whisper = [r.meta for r in recs if r.meta.get("engine") == "whisper"]
    asked = sum(int(m["n_nbest_paths"]) for m in whisper)
    return 1 - sum(int(m["n_nbest_unique"]) for m in whisper) / asked if asked else None


def write_outputs(result: TtsNbestResult, out: PathLike, *, manifest: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``nbest.jsonl``, ``timing.jsonl`` and ``manifest.json`` (settings, versions, fingerprints)."""
    from privasr.corpus.formats.nbest_jsonl import write_nbest

    dest = Path(out)
    nb = dest / "nbest.jsonl"
    write_nbest(nb, result.records)
    tm = dest / "timing.jsonl"
    with open(tm, "w", encoding="utf-8") as f:
        for r in result.records:
            f.write(json.dumps({"utt_id": r.utt_id, "timing_sec": result.timing[r.utt_id]}) + "\n")
    mf = dest / "manifest.json"
    mf.write_text(json.dumps({**manifest, "tools": {**program_versions(), **manifest.get("tools", {})}},
                             indent=2, default=str) + "\n", encoding="utf-8")
    return {"nbest": nb, "timing": tm, "manifest": mf}


def clear_cache(out: PathLike) -> None:
    """Remove a finished build's per-utterance cache (the N-best file holds everything it had)."""
    shutil.rmtree(Path(out) / "cache", ignore_errors=True)
