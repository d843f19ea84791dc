"""Synthetic speech for testbeds: espeak-ng voices with light white noise, one fixed voice per speaker.

This is the synthesis of the shared ``ami-tts-nbest*`` sets (their SOURCE.txt), as a library:

* :func:`speaker_voice` gives a speaker its voice, rate and noise level from a generator seeded by the
  SHA-256 of the speaker id (``random.Random(int(sha256(speaker)[:16], 16))``: ``choice`` of the voices,
  ``randint`` of the rate in words per minute, ``round(uniform(...), 4)`` of the noise volume), so the same
  speaker always sounds the same, in any corpus and any process;
* :func:`synthesize` speaks a text: ``espeak-ng -v VOICE -s RATE -w raw.wav -- TEXT``, ``sox -R raw.wav -r
  16000 -c 1 -b 16 clean.wav``, a white-noise file of the same length at volume ``noise``, and ``sox -R -m
  clean.wav noise.wav -b 16`` (``-m`` halves both inputs), returning 16 kHz 16-bit mono samples.

The noise. ``sox -R`` (repeatable) makes sox's random generator start from the same state in every call, so
the recipe's ``sox -R clean.wav noise.wav synth whitenoise vol NOISE`` adds *the same* noise sequence (scaled)
to every file: ``noise_seed=None``, the default, reproduces that. With an integer ``noise_seed`` the noise is
drawn by numpy from that seed instead (uniform in ``[-noise, noise]``, as sox's ``whitenoise`` is, quantised to
16 bits) and mixed by the same ``sox -m``; callers derive one seed per file (:func:`file_seed`), so every file
gets its own noise and the result still depends only on the seed.

The programs come from Debian's ``espeak-ng`` and ``sox`` packages; :func:`require_programs` names what is
missing. Synthesis is deterministic: the same text, voice and seed give the same samples.

>>> v = speaker_voice("ES2004a_B")
>>> v == speaker_voice("ES2004a_B"), v.voice in KLATT_VOICES, 140 <= v.rate <= 170, 0.008 <= v.noise <= 0.015
(True, True, True, True)
>>> file_seed(0, "ES2004a_B_12") == file_seed(0, "ES2004a_B_12") != file_seed(1, "ES2004a_B_12")
True
"""

from __future__ import annotations

import functools
import hashlib
import random
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = [
    "KLATT_VOICES",
    "SAMPLE_RATE",
    "Voice",
    "speaker_voice",
    "synthesize",
    "file_seed",
    "require_programs",
    "check_voice",
    "program_versions",
]

SAMPLE_RATE = 16000
KLATT_VOICES = ("en-us+klatt", "en-us+klatt2", "en-us+klatt3", "en-us+klatt4")
"""The four espeak-ng klatt variants of the shared sets (the stock en-us model decodes them best)."""

_PACKAGES = {"espeak-ng": "espeak-ng", "sox": "sox", "sphinx_fe": "sphinxbase-utils",
             "pocketsphinx_mdef_convert": "pocketsphinx"}


def require_programs(*names: str) -> dict[str, str]:
    """The full paths of the named programs; a :class:`ConfigError` naming the Debian package if one is missing.

    >>> require_programs("sh")["sh"].endswith("sh")
    True
    """
    found: dict[str, str] = {}
    missing = []
    for n in names:
        p = shutil.which(n)
        if p is None:
            missing.append(n)
        else:
            found[n] = p
    if missing:
        pkgs = sorted({_PACKAGES.get(n, n) for n in missing})
        raise ConfigError(f"program(s) not found: {', '.join(missing)}",
                          expected=f"them on PATH (Debian: apt-get install {' '.join(pkgs)})")
    return found


@functools.lru_cache(maxsize=4)
def _espeak_voices(program: str) -> tuple[frozenset[str], frozenset[str]]:
    """(language and voice names, variant names) that ``espeak-ng --voices`` lists, lower-cased."""
    def table(arg: str) -> list[list[str]]:
        r = subprocess.run([program, arg], capture_output=True, text=True, timeout=60, check=False)
        return [ln.split() for ln in r.stdout.splitlines()[1:] if ln.split()]

    names: set[str] = set()
    for row in table("--voices"):  # Pty Language Age/Gender VoiceName File [Other Languages]
        if len(row) >= 5:
            names.update({row[1].lower(), row[3].lower(), row[4].lower(), row[4].split("/")[-1].lower()})
    variants = {v.lower() for row in table("--voices=variant") if len(row) >= 5
                for v in (row[3], row[4].split("/")[-1])}
    return frozenset(names), frozenset(variants)


def check_voice(voice: str) -> None:
    """A :class:`ConfigError` unless espeak-ng knows the voice (``lang`` or ``lang+variant``).

    espeak-ng itself falls back to its default voice, silently, for a name it does not know.
    """
    prog = require_programs("espeak-ng")["espeak-ng"]
    names, variants = _espeak_voices(prog)
    base, _, variant = voice.partition("+")
    if base.lower() not in names or (variant and variant.lower() not in variants):
        raise ConfigError(f"espeak-ng has no voice {voice!r}",
                          expected="a voice of 'espeak-ng --voices', optionally +variant ('espeak-ng --voices=variant')")


def program_versions() -> dict[str, str]:
    """Versions of what a TTS N-best build runs (for manifests): espeak-ng and sox (their first version line),
    the Debian packages of SphinxTrain and its companions (``dpkg-query``, where there is one) and the Python
    packages pocketsphinx and numpy; ``"missing"`` where absent.

    >>> sorted(program_versions())[:3]
    ['debian:espeak-ng', 'debian:pocketsphinx', 'debian:sox']
    """
    from importlib import metadata

    out: dict[str, str] = {}
    for prog in ("espeak-ng", "sox"):
        try:
            r = subprocess.run([prog, "--version"], capture_output=True, text=True, timeout=30, check=False)
            text = (r.stdout or r.stderr).strip()
            out[prog] = text.splitlines()[0] if text else "?"
        except (OSError, subprocess.TimeoutExpired):
            out[prog] = "missing"
    for pkg in ("espeak-ng", "sox", "sphinxtrain", "sphinxbase-utils", "pocketsphinx"):
        try:
            r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True, text=True,
                               timeout=30, check=False)
            out[f"debian:{pkg}"] = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "missing"
        except (OSError, subprocess.TimeoutExpired):
            out[f"debian:{pkg}"] = "missing"
    for pkg in ("pocketsphinx", "numpy"):
        try:
            out[f"python:{pkg}"] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[f"python:{pkg}"] = "missing"
    return out


@dataclass(frozen=True, slots=True)
class Voice:
    """An espeak-ng voice name, a speaking rate (words per minute) and a white-noise volume (0-1)."""

    voice: str
    rate: int
    noise: float

    def __post_init__(self) -> None:
        if not isinstance(self.voice, str) or not self.voice or self.voice.startswith("-") or " " in self.voice:
            raise ConfigError(f"voice {self.voice!r}", expected="an espeak-ng voice name such as en-us+klatt")
        if isinstance(self.rate, bool) or not isinstance(self.rate, int) or not 80 <= self.rate <= 450:
            raise ConfigError(f"rate {self.rate!r}", expected="words per minute, an integer in 80..450")
        if isinstance(self.noise, bool) or not isinstance(self.noise, int | float) or not 0.0 <= self.noise < 1.0:
            raise ConfigError(f"noise {self.noise!r}", expected="a volume in [0, 1)")

    def as_dict(self) -> dict[str, Any]:
        """The voice as the shared sets record it: ``{"voice", "rate", "noise_vol"}``."""
        d = asdict(self)
        return {"voice": d["voice"], "rate": d["rate"], "noise_vol": d["noise"]}


def speaker_voice(speaker: str, *, voices: Sequence[str] = KLATT_VOICES, rate: tuple[int, int] = (140, 170),
                  noise: tuple[float, float] = (0.008, 0.015)) -> Voice:
    """The fixed voice of a speaker (see the module doc): same id, same voice, everywhere.

    >>> speaker_voice("x", voices=["en-us+klatt"], rate=(150, 150), noise=(0.01, 0.01))
    Voice(voice='en-us+klatt', rate=150, noise=0.01)
    """
    if not voices:
        raise ConfigError("no voices given", expected="at least one espeak-ng voice")
    if rate[0] > rate[1] or noise[0] > noise[1]:
        raise ConfigError(f"rate {rate} / noise {noise}", expected="ranges (low, high) with low <= high")
    rng = random.Random(int(hashlib.sha256(speaker.encode("utf-8")).hexdigest()[:16], 16))
    return Voice(rng.choice(list(voices)), rng.randint(*rate), round(rng.uniform(*noise), 4))


def file_seed(seed: int, utt_id: str) -> int:
    """A 63-bit seed for one file's noise, from the run's seed and the utterance id."""
    h = hashlib.sha256(f"{seed}\x00{utt_id}".encode()).hexdigest()
    return int(h[:16], 16) >> 1


def _run(cmd: list[str], what: str) -> bytes:
    try:
        r = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    except OSError as e:
        raise ConfigError(f"{what}: cannot run {cmd[0]} ({e})", expected="espeak-ng and sox installed") from None
    except subprocess.TimeoutExpired:
        raise InputError(f"{what}: {cmd[0]} ran for over 300 s", expected="a sentence-sized text") from None
    if r.returncode != 0:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        raise InputError(f"{what}: {Path(cmd[0]).name} failed ({err[-1] if err else 'exit ' + str(r.returncode)})",
                         expected="a voice espeak-ng knows and text it can speak")
    return r.stdout


def synthesize(text: str, voice: Voice, *, noise_seed: int | None = None) -> np.ndarray:
    """Speak ``text`` with ``voice`` and mix in white noise: 16 kHz 16-bit mono samples (see the module doc).

    Args:
        text: the words to speak (one utterance).
        voice: the voice, rate and noise volume.
        noise_seed: ``None`` for sox's repeatable noise (the shared sets' recipe: the same sequence in every
            file); an integer to draw this file's noise from that seed.

    >>> pcm = synthesize("hello world", Voice("en-us+klatt", 150, 0.01))  # doctest: +SKIP
    >>> pcm.dtype, len(pcm) > 8000  # doctest: +SKIP
    (dtype('int16'), True)
    """
    if not isinstance(text, str) or not text.split():
        raise InputError(f"text {text!r}"[:80], expected="at least one word to speak")
    if noise_seed is not None and (isinstance(noise_seed, bool) or not isinstance(noise_seed, int)):
        raise ConfigError(f"noise_seed {noise_seed!r}", expected="an integer or None")
    progs = require_programs("espeak-ng", "sox")
    check_voice(voice.voice)
    what = f"synthesising {text[:40]!r}"
    with tempfile.TemporaryDirectory(prefix="privasr-tts-") as tmp:
        d = Path(tmp)
        _run([progs["espeak-ng"], "-v", voice.voice, "-s", str(voice.rate), "-w", str(d / "raw.wav"), "--",
              " ".join(text.split())], what)
        _run([progs["sox"], "-R", str(d / "raw.wav"), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16",
              str(d / "clean.wav")], what)
        if noise_seed is None:
            _run([progs["sox"], "-R", str(d / "clean.wav"), str(d / "noise.wav"), "synth", "whitenoise", "vol",
                  repr(float(voice.noise))], what)
        else:
            _write_noise(d / "clean.wav", d / "noise.wav", voice.noise, noise_seed)
        raw = _run([progs["sox"], "-R", "-m", str(d / "clean.wav"), str(d / "noise.wav"), "-b", "16", "-t", "raw",
                    "-e", "signed-integer", "-L", "-"], what)
    pcm = np.frombuffer(raw, dtype="<i2").astype(np.int16)
    if len(pcm) == 0:
        raise InputError(f"{what}: no audio came out", expected="text espeak-ng can speak")
    return pcm


def _write_noise(clean: Path, out: Path, volume: float, seed: int) -> None:
    import soundfile as sf

    n = sf.info(str(clean)).frames
    rng = np.random.default_rng(seed)
    x = rng.uniform(-volume, volume, size=n)
    sf.write(str(out), np.round(x * 32767.0).astype(np.int16), SAMPLE_RATE, subtype="PCM_16")
