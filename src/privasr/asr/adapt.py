"""Acoustic adaptation of a pocketsphinx model to its speakers: MAP or MLLR with SphinxTrain.

A user with a little transcribed speech of their own speakers (minutes, not hours) adapts the recogniser
with :func:`adapt_model`; the result is a model folder that :class:`privasr.asr.decode.Decoder` takes as
``hmm``. The work is done by CMU's own tools (Debian ``sphinxtrain`` and ``sphinxbase-utils``, and
``pocketsphinx_mdef_convert`` from Debian ``pocketsphinx``), the standard CMU Sphinx adaptation recipe:

1. **Prepare the base model** (:func:`prepare_base`): SphinxTrain needs a text model definition
   (``pocketsphinx_mdef_convert -text mdef mdef.txt``) and a ``mixture_weights`` file. The en-us model that
   pocketsphinx ships has only the 8-bit ``sendump``, so the weights are rebuilt from it
   (:func:`read_sendump`: ``p = 1.0001 ** (-q * 1024)``, the values pocketsphinx itself decodes with).
2. **Features**: ``sphinx_fe`` with the model's own ``feat.params`` turns the 16 kHz audio into MFCCs.
3. **Statistics**: one Baum-Welch pass of ``bw`` over the utterances with the base model (feature type,
   stream split, CMN and AGC from ``feat.params``; tied Gaussians ``.ptm.``/``.semi.``/``.cont.`` from its
   ``-model``), with the model's dictionary (or a given one) and noise dictionary.
4. **Update**: ``map``: ``map_adapt`` (maximum a-posteriori re-estimation of means, variances, mixture
   weights and transition matrices from those counts, tau estimated), then ``mk_s2sendump`` writes the
   8-bit weights pocketsphinx reads; ``mllr``: ``mllr_solve`` estimates one global MLLR mean transform and
   ``mllr_transform`` applies it to the means (variances, weights and transitions are the base model's).

Utterances with a word outside the dictionary are left out (SphinxTrain has no letter-to-sound rules) and
counted; ``bw`` may skip utterances it cannot align (counted from its log). The output folder holds a full
pocketsphinx model plus ``privasr-model.json`` (method, base model and its fingerprint, utterances used and
left out, audio seconds, tool paths). Tool failures are :class:`~privasr.errors.InputError`/
:class:`~privasr.errors.ConfigError` with the last lines of the tool's log; nothing in the base model or the
user's audio is changed.

>>> q = np.array([[[0, 255]]], dtype=np.uint8)
>>> np.round(sendump_probabilities(q), 6).tolist()
[[[1.0, 0.0]]]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr.corpus.textio import PathLike
from privasr.errors import ConfigError, InputError

__all__ = [
    "METHODS",
    "AdaptedModel",
    "adapt_model",
    "prepare_base",
    "read_feat_params",
    "read_sendump",
    "sendump_probabilities",
    "write_s3_mixw",
    "read_s3_mixw",
    "sphinxtrain_program",
    "dictionary_words",
    "MODEL_MANIFEST",
]

METHODS = ("map", "mllr")
MODEL_MANIFEST = "privasr-model.json"
_SPHINXTRAIN_DIRS = ("/usr/lib/sphinxtrain", "/usr/local/lib/sphinxtrain", "/usr/libexec/sphinxtrain",
                     "/usr/local/libexec/sphinxtrain")
_VARIANT = re.compile(r"\(\d+\)$")
_MODEL_FILES = ("mdef", "feat.params", "noisedict", "means", "variances", "transition_matrices")


def sphinxtrain_program(name: str) -> str:
    """The path of a SphinxTrain program (``bw``, ``map_adapt``, ...): ``$PRIVASR_SPHINXTRAIN``, Debian's
    ``/usr/lib/sphinxtrain`` and similar folders, then ``PATH``. A :class:`ConfigError` if it is nowhere."""
    dirs = [os.environ["PRIVASR_SPHINXTRAIN"]] if os.environ.get("PRIVASR_SPHINXTRAIN") else []
    for d in (*dirs, *_SPHINXTRAIN_DIRS):
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    raise ConfigError(f"SphinxTrain program {name!r} not found",
                      expected="Debian's sphinxtrain (apt-get install sphinxtrain) or $PRIVASR_SPHINXTRAIN")


def read_feat_params(model: PathLike) -> dict[str, str]:
    """A model's ``feat.params`` as ``{"-feat": "1s_c_d_dd", ...}`` (empty if the file is absent)."""
    p = Path(model) / "feat.params"
    out: dict[str, str] = {}
    if not p.is_file():
        return out
    for k, line in enumerate(p.read_text(encoding="utf-8", errors="strict").splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) != 2 or not parts[0].startswith("-"):
            raise InputError(f"line {line.strip()[:60]!r}", path=p, line=k, expected="'-name value' per line")
        out[parts[0]] = parts[1]
    return out


def sendump_probabilities(q: np.ndarray) -> np.ndarray:
    """8-bit sendump values -> mixture weights, ``1.0001 ** (-q * 1024)`` (float32)."""
    return np.power(1.0001, -q.astype(np.float64) * 1024.0).astype(np.float32)


def read_sendump(path: PathLike) -> np.ndarray:
    """A pocketsphinx ``sendump`` as mixture weights ``[senone, feature, density]`` (float32).

    The file: length-prefixed header strings (``feature_count``, optionally ``mixture_count`` and
    ``model_count``) ending with a zero length, then (if the counts were not in the header) the numbers of
    densities and senones, then one byte per weight in ``[feature][density][senone]`` order. Cluster-
    compressed sendumps (``cluster_count`` > 0) are refused.
    """
    p = Path(path)
    try:
        b = p.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read ({e.strerror})", path=p, expected="a pocketsphinx sendump") from None
    pos = 0
    endian = "<"
    header: dict[str, int] = {}

    def take_int() -> int:
        nonlocal pos
        if pos + 4 > len(b):
            raise InputError("truncated sendump header", path=p, expected="a pocketsphinx sendump")
        (v,) = struct.unpack(endian + "i", b[pos:pos + 4])
        pos += 4
        return int(v)

    n = take_int()
    if not 0 <= n < 1000:
        endian = ">"
        pos = 0
        n = take_int()
        if not 0 <= n < 1000:
            raise InputError("no sendump header", path=p, expected="a pocketsphinx sendump")
    while n != 0:
        if n < 0 or pos + n > len(b):
            raise InputError("corrupt sendump header", path=p, expected="a pocketsphinx sendump")
        s = b[pos:pos + n].rstrip(b"\0").decode("ascii", "replace")
        pos += n
        m = re.match(r"^(feature_count|mixture_count|model_count|cluster_count|codebook_count) (\d+)$", s)
        if m:
            header[m.group(1)] = int(m.group(2))
        n = take_int()
    if header.get("cluster_count", 0) > 0:
        raise InputError("cluster-compressed sendump", path=p, expected="an uncompressed sendump (cluster_count 0)")
    n_feat = header.get("feature_count", 1)
    n_density, n_sen = header.get("mixture_count"), header.get("model_count")
    if not n_density or not n_sen:
        n_density, n_sen = take_int(), take_int()
    size = n_feat * n_density * n_sen
    if n_feat < 1 or n_density < 1 or n_sen < 1 or pos + size != len(b):
        raise InputError(f"{len(b) - pos} weight bytes for {n_feat} features x {n_density} densities x "
                         f"{n_sen} senones", path=p, expected="a complete pocketsphinx sendump")
    q = np.frombuffer(b, dtype=np.uint8, count=size, offset=pos).reshape(n_feat, n_density, n_sen)
    return np.ascontiguousarray(sendump_probabilities(q).transpose(2, 0, 1))


def write_s3_mixw(path: PathLike, mixw: np.ndarray) -> None:
    """Write mixture weights ``[senone, feature, density]`` as a SphinxTrain s3 float32 file (no checksum)."""
    if mixw.ndim != 3:
        raise ConfigError(f"mixture weights of shape {mixw.shape}", expected="[senone, feature, density]")
    a = np.ascontiguousarray(mixw, dtype="<f4")
    with open(path, "wb") as f:
        f.write(b"s3\nversion 1.0\nendhdr\n")
        f.write(struct.pack("<I", 0x11223344))
        f.write(struct.pack("<4i", *a.shape, a.size))
        f.write(a.tobytes())


def read_s3_mixw(path: PathLike) -> np.ndarray:
    """Read a SphinxTrain s3 mixture-weights file (as :func:`write_s3_mixw` or ``map_adapt`` writes it)."""
    p = Path(path)
    b = p.read_bytes()
    end = b.find(b"endhdr\n")
    if not b.startswith(b"s3\n") or end < 0:
        raise InputError("no s3 header", path=p, expected="a SphinxTrain s3 file")
    pos = end + len(b"endhdr\n")
    (magic,) = struct.unpack("<I", b[pos:pos + 4])
    endian = "<" if magic == 0x11223344 else ">"
    if endian == ">" and struct.unpack(">I", b[pos:pos + 4])[0] != 0x11223344:
        raise InputError("bad byte-order magic", path=p, expected="a SphinxTrain s3 file")
    d1, d2, d3, n = struct.unpack(endian + "4i", b[pos + 4:pos + 20])
    if n != d1 * d2 * d3 or len(b) < pos + 20 + 4 * n:
        raise InputError(f"{d1}x{d2}x{d3} weights, {n} values", path=p, expected="a complete s3 mixw file")
    return np.frombuffer(b, dtype=endian + "f4", count=n, offset=pos + 20).reshape(d1, d2, d3).astype(np.float32)


def dictionary_words(path: PathLike) -> frozenset[str]:
    """The words of a CMUdict-format pronunciation dictionary (variants ``word(2)`` folded)."""
    p = Path(path)
    words = set()
    try:
        with open(p, encoding="utf-8") as f:
            for line in f:
                head = line.split(maxsplit=1)[0] if line.strip() else ""
                if head:
                    words.add(_VARIANT.sub("", head))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the dictionary ({e})", path=p, expected="a CMUdict-format file") from None
    return frozenset(words)


def _merged_dictionary(mine: Path, bundled: Path, out: Path) -> Path:
    """``mine`` plus the entries of ``bundled`` for the words ``mine`` lacks (its pronunciations win)."""
    own = dictionary_words(mine)
    with open(out, "w", encoding="utf-8") as f:
        for src, skip in ((mine, frozenset()), (bundled, own)):
            with open(src, encoding="utf-8") as g:
                for line in g:
                    head = line.split(maxsplit=1)[0] if line.strip() else ""
                    if head and _VARIANT.sub("", head) not in skip:
                        f.write(line if line.endswith("\n") else line + "\n")
    return out


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        q = folder / name
        if q.is_file() and name != MODEL_MANIFEST:
            h.update(name.encode())
            h.update(q.read_bytes())
    return h.hexdigest()


def _tool(cmd: list[str], log: Path, what: str) -> str:
    """Run a tool, its output to ``log``; a clear error with the log's tail when it fails."""
    with open(log, "w", encoding="utf-8") as f:
        try:
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=24 * 3600, check=False)
        except OSError as e:
            raise ConfigError(f"{what}: cannot run {cmd[0]} ({e})", expected="SphinxTrain installed") from None
    text = log.read_text(encoding="utf-8", errors="replace")
    fatal = [ln for ln in text.splitlines() if "FATAL" in ln or "SYSTEM_ERROR" in ln]
    if r.returncode != 0 or fatal:
        tail = (fatal or text.strip().splitlines() or ["(no output)"])[-1].strip()
        raise InputError(f"{what}: {Path(cmd[0]).name} failed: {tail[:300]}", path=log,
                         expected="audio, transcripts and a model SphinxTrain accepts")
    return text


def prepare_base(hmm: PathLike | None, dest: PathLike) -> Path:
    """Copy a pocketsphinx model into ``dest`` with what SphinxTrain needs (``mdef.txt``, ``mixture_weights``).

    ``hmm`` ``None`` is pocketsphinx's bundled en-us model. Returns ``dest``.
    """
    from privasr.asr.decode import default_model

    src = Path(hmm) if hmm is not None else Path(default_model()["hmm"])
    if not src.is_dir():
        raise InputError("no such acoustic model folder", path=src, expected="a pocketsphinx model folder")
    missing = [n for n in _MODEL_FILES if not (src / n).is_file()]
    if missing or not ((src / "sendump").is_file() or (src / "mixture_weights").is_file()):
        raise InputError(f"the model folder lacks {', '.join(missing) or 'sendump / mixture_weights'}", path=src,
                         expected="a pocketsphinx model (mdef, feat.params, noisedict, means, variances, "
                                  "transition_matrices, sendump or mixture_weights)")
    d = Path(dest)
    d.mkdir(parents=True, exist_ok=True)
    for n in (*_MODEL_FILES, "sendump", "mixture_weights"):
        if (src / n).is_file():
            shutil.copyfile(src / n, d / n)
    head = (d / "mdef").read_bytes()[:4]
    if head == b"BMDF" or head == b"FDMB":
        conv = shutil.which("pocketsphinx_mdef_convert")
        if conv is None:
            raise ConfigError("pocketsphinx_mdef_convert not found (the model's mdef is binary)",
                              expected="Debian's pocketsphinx package (apt-get install pocketsphinx)")
        _tool([conv, "-text", str(d / "mdef"), str(d / "mdef.txt")], d / "mdef_convert.log", "converting mdef")
    else:
        shutil.copyfile(d / "mdef", d / "mdef.txt")
    if not (d / "mixture_weights").is_file():
        write_s3_mixw(d / "mixture_weights", read_sendump(d / "sendump"))
    return d


@dataclass(frozen=True)
class AdaptedModel:
    """An adapted model folder and what went into it (``manifest`` is ``privasr-model.json``)."""

    path: Path
    method: str
    utterances: int
    left_out: dict[str, int]
    audio_s: float
    manifest: dict[str, Any] = field(repr=False)

    @classmethod
    def load(cls, path: PathLike) -> AdaptedModel:
        """Read an adapted model folder's manifest (written by :func:`adapt_model`)."""
        p = Path(path)
        mf = p / MODEL_MANIFEST
        if not mf.is_file():
            raise InputError(f"no {MODEL_MANIFEST}", path=p, expected="a folder written by adapt_model")
        try:
            m = json.loads(mf.read_text(encoding="utf-8"))
            return cls(p, str(m["method"]), int(m["utterances"]), dict(m["left_out"]), float(m["audio_s"]), m)
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(f"unreadable manifest ({e})", path=mf, expected=f"{MODEL_MANIFEST} of adapt_model") from None


def _check_pcm(utt: str, x: Any) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 1 or a.dtype != np.int16 or len(a) < 1600:
        raise InputError(f"utterance {utt!r}: audio of shape {a.shape} and type {a.dtype}",
                         expected="16 kHz 16-bit mono samples, at least 0.1 s")
    return a


def _check_inputs(audio: Mapping[str, Any], transcripts: Mapping[str, Sequence[str]], dest: Path,
                  method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"adaptation method {method!r}", expected=" or ".join(METHODS))
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError("the output exists and is not an empty folder", path=dest,
                         expected="a new folder for the adapted model")
    if not audio:
        raise InputError("no adaptation audio", expected="at least one utterance")
    missing = [u for u in audio if u not in transcripts]
    if missing:
        raise InputError(f"{len(missing)} utterances have no transcript (e.g. {', '.join(missing[:3])})",
                         expected="a transcript for every audio utterance")


def _dictionary(dictionary: PathLike | None, base: PathLike | None) -> tuple[Path, frozenset[str], bool]:
    """The pronunciation dictionary, the words it (with the bundled one, if merged) knows, whether to merge."""
    from privasr.asr.decode import default_model

    dic = Path(dictionary) if dictionary is not None else Path(default_model()["dict"])
    if not dic.is_file():
        raise InputError("no such dictionary", path=dic, expected="a CMUdict-format pronunciation dictionary")
    known = dictionary_words(dic)
    merge = dictionary is not None and base is None  # the bundled model's own dictionary covers the rest
    if merge:
        known = known | dictionary_words(default_model()["dict"])
    return dic, known, merge


def _tools() -> dict[str, str]:
    """The SphinxTrain programs and ``sphinx_fe``, by name."""
    progs = {n: sphinxtrain_program(n) for n in ("bw", "map_adapt", "mk_s2sendump", "mllr_solve", "mllr_transform")}
    fe = shutil.which("sphinx_fe")
    if fe is None:
        raise ConfigError("sphinx_fe not found", expected="Debian's sphinxbase-utils (apt-get install sphinxbase-utils)")
    return {**progs, "sphinx_fe": fe}


def _write_audio(audio: Mapping[str, np.ndarray | PathLike], transcripts: Mapping[str, Sequence[str]],
                 known: frozenset[str], work: Path) -> tuple[list[str], list[str], int, float]:
    """The utterances the dictionary covers as ``work/wav/uNNNNNN.wav``: their ids, transcription lines, the
    number left out, the audio seconds."""
    import soundfile as sf

    from privasr.asr.decode import SAMPLE_RATE, read_audio

    (work / "wav").mkdir()
    ids, lines, oov, audio_s = [], [], 0, 0.0
    for k, (utt, x) in enumerate(audio.items()):
        words = [str(w) for w in transcripts[utt]]
        if not words or any(w not in known for w in words):
            oov += 1
            continue
        pcm = read_audio(x) if isinstance(x, str | os.PathLike) else _check_pcm(utt, x)
        name = f"u{k:06d}"
        sf.write(str(work / "wav" / f"{name}.wav"), pcm, SAMPLE_RATE, subtype="PCM_16")
        ids.append(name)
        lines.append(f"<s> {' '.join(words)} </s> ({name})")
        audio_s += len(pcm) / SAMPLE_RATE
    return ids, lines, oov, audio_s


def _features(tools: Mapping[str, str], model: Path, work: Path, ids: list[str], lines: list[str]) -> None:
    """The control and transcription files, and the MFCCs of ``work/wav`` (``sphinx_fe``)."""
    from privasr.asr.decode import SAMPLE_RATE

    (work / "adapt.fileids").write_text("\n".join(ids) + "\n", encoding="utf-8")
    (work / "adapt.transcription").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _tool([tools["sphinx_fe"], "-argfile", str(model / "feat.params"), "-samprate", str(SAMPLE_RATE), "-c",
           str(work / "adapt.fileids"), "-di", str(work / "wav"), "-do", str(work / "wav"), "-ei", "wav",
           "-eo", "mfc", "-mswav", "yes"], work / "sphinx_fe.log", "computing features")


def _baum_welch(tools: Mapping[str, str], model: Path, fp: Mapping[str, str], dic: Path, work: Path,
                n: int) -> int:
    """One ``bw`` pass into ``work/accum``; returns how many of the ``n`` utterances it could not align."""
    (work / "accum").mkdir()
    bw_cmd = [tools["bw"], "-hmmdir", str(model), "-moddeffn", str(model / "mdef.txt"), "-ts2cbfn", _kind(fp),
              "-dictfn", str(dic), "-fdictfn", str(model / "noisedict"), "-ctlfn", str(work / "adapt.fileids"),
              "-lsnfn", str(work / "adapt.transcription"), "-cepdir", str(work / "wav"), "-cepext", "mfc",
              "-accumdir", str(work / "accum")]
    for opt in ("-feat", "-svspec", "-cmn", "-agc", "-varnorm", "-lda", "-ldadim"):
        if opt in fp:
            bw_cmd += [opt, fp[opt]]
    log = _tool(bw_cmd, work / "bw.log", "collecting statistics")
    failed = len(re.findall(r"(?m)^ERROR: .*\bu\d{6} ignored$", log))  # bw skips what it cannot align
    if failed >= n:
        raise InputError(f"SphinxTrain could not align any of the {n} utterances to its transcript",
                         path=work / "bw.log", expected="audio that speaks its transcript")
    return failed


def _kind(fp: Mapping[str, str]) -> str:
    """SphinxTrain's tied-Gaussian type (``-ts2cbfn``) of a model's ``-model``."""
    return {"ptm": ".ptm.", "semi": ".semi.", "cont": ".cont."}.get(fp.get("-model", "ptm"), ".ptm.")


def _map_update(tools: Mapping[str, str], model: Path, fp: Mapping[str, str], work: Path, out_model: Path) -> None:
    """``map_adapt`` from the counts, then ``mk_s2sendump`` for the 8-bit mixture weights."""
    _tool([tools["map_adapt"], "-moddeffn", str(model / "mdef.txt"), "-ts2cbfn", _kind(fp),
           "-meanfn", str(model / "means"), "-varfn", str(model / "variances"),
           "-mixwfn", str(model / "mixture_weights"), "-tmatfn", str(model / "transition_matrices"),
           "-accumdir", str(work / "accum"), "-mapmeanfn", str(out_model / "means"),
           "-mapvarfn", str(out_model / "variances"), "-mapmixwfn", str(work / "mixture_weights"),
           "-maptmatfn", str(out_model / "transition_matrices")], work / "map_adapt.log", "MAP update")
    _tool([tools["mk_s2sendump"], "-pocketsphinx", "yes", "-moddeffn", str(model / "mdef.txt"),
           "-mixwfn", str(work / "mixture_weights"), "-sendumpfn", str(out_model / "sendump")],
          work / "mk_s2sendump.log", "writing the sendump")


def _mllr_update(tools: Mapping[str, str], model: Path, work: Path, out_model: Path) -> None:
    """One global MLLR mean transform (``mllr_solve``, ``mllr_transform``); the rest is the base model's."""
    _tool([tools["mllr_solve"], "-meanfn", str(model / "means"), "-varfn", str(model / "variances"),
           "-outmllrfn", str(work / "mllr_matrix"), "-accumdir", str(work / "accum")],
          work / "mllr_solve.log", "estimating MLLR")
    _tool([tools["mllr_transform"], "-inmeanfn", str(model / "means"), "-outmeanfn",
           str(out_model / "means"), "-mllrmat", str(work / "mllr_matrix")],
          work / "mllr_transform.log", "applying MLLR")
    for n in ("variances", "transition_matrices", "sendump", "mixture_weights"):
        if (model / n).is_file() and not (n == "mixture_weights" and (model / "sendump").is_file()):
            shutil.copyfile(model / n, out_model / n)
    shutil.copyfile(work / "mllr_matrix", out_model / "mllr_matrix")


def adapt_model(audio: Mapping[str, np.ndarray | PathLike], transcripts: Mapping[str, Sequence[str]],
                out: PathLike, *, method: str = "map", base: PathLike | None = None,
                dictionary: PathLike | None = None, keep_work: bool = False,
                progress: Callable[[str], None] | None = None) -> AdaptedModel:
    """Adapt a pocketsphinx acoustic model to the speakers of ``audio`` (see the module doc).

    Args:
        audio: utterance id -> 16 kHz 16-bit mono samples, or a WAV file (any rate; resampled).
        transcripts: utterance id -> words (lower-case, as in the dictionary). Every audio id needs one.
        out: the adapted model folder to write (must not exist, or be empty).
        method: ``map`` or ``mllr``.
        base: the model to adapt (``None``: pocketsphinx's bundled en-us).
        dictionary: pronunciations (``None``: the dictionary pocketsphinx ships). With the bundled base model
            its dictionary covers the words this one lacks (a decoding dictionary of a few words still adapts
            on any text); with another base model this dictionary alone must cover the transcripts.
        keep_work: keep the work folder (features, counts, tool logs) as ``out/work``.
        progress: called with a short message before each step.

    >>> from privasr.asr.tts import Voice, synthesize  # doctest: +SKIP
    >>> texts = {f"a{i}": s.split() for i, s in enumerate(["the cat sat on the mat", "so it goes"])}  # doctest: +SKIP
    >>> pcm = {u: synthesize(" ".join(w), Voice("en-us+klatt", 150, 0.01)) for u, w in texts.items()}  # doctest: +SKIP
    >>> model = adapt_model(pcm, texts, "adapted-model")  # doctest: +SKIP
    >>> model.method, model.utterances  # doctest: +SKIP
    ('map', 2)
    """
    from privasr.asr.decode import default_model

    dest = Path(out)
    _check_inputs(audio, transcripts, dest, method)
    dic, known, merge = _dictionary(dictionary, base)
    tools = _tools()
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".adapt-work-", dir=dest.parent))
    try:
        say("preparing the base model")
        model = prepare_base(base, work / "base")
        fp = read_feat_params(model)
        say("writing features")
        ids, lines, oov, audio_s = _write_audio(audio, transcripts, known, work)
        if not ids:
            raise InputError(f"none of the {len(audio)} utterances has every word in the dictionary", path=dic,
                             expected="adaptation transcripts the dictionary covers")
        if merge:
            dic = _merged_dictionary(dic, Path(default_model()["dict"]), work / "merged.dict")
        _features(tools, model, work, ids, lines)
        say(f"Baum-Welch statistics over {len(ids)} utterances")
        failed = _baum_welch(tools, model, fp, dic, work, len(ids))
        out_model = work / "model"
        out_model.mkdir()
        if method == "map":
            say("MAP update")
            _map_update(tools, model, fp, work, out_model)
        else:
            say("MLLR transform")
            _mllr_update(tools, model, work, out_model)
        for n in ("mdef", "feat.params", "noisedict"):
            shutil.copyfile(model / n, out_model / n)
        manifest = _manifest(method, base, dictionary, merge, len(ids) - failed, {"oov": oov, "not_aligned": failed},
                             audio_s, t0, tools, out_model)
        (out_model / MODEL_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if keep_work:
            shutil.copytree(work, out_model / "work", ignore=shutil.ignore_patterns("model"))
        if dest.exists():
            dest.rmdir()
        os.replace(out_model, dest)
        return AdaptedModel(dest, method, manifest["utterances"], manifest["left_out"], audio_s, manifest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _manifest(method: str, base: PathLike | None, dictionary: PathLike | None, merge: bool, utterances: int,
              left_out: dict[str, int], audio_s: float, t0: float, tools: Mapping[str, str],
              out_model: Path) -> dict[str, Any]:
    """``privasr-model.json`` of an adapted model folder."""
    from privasr import __version__
    from privasr.asr.decode import default_model

    return {
        "method": method,
        "base": str(Path(base).resolve()) if base is not None else "pocketsphinx bundled en-us",
        "base_fingerprint": _fingerprint(Path(base) if base is not None else Path(default_model()["hmm"])),
        "dictionary": str(Path(dictionary).resolve()) if dictionary is not None else "pocketsphinx bundled cmudict",
        "dictionary_merged_with_bundled": merge,
        "utterances": utterances,
        "left_out": left_out,
        "audio_s": round(audio_s, 3),
        "seconds": round(time.perf_counter() - t0, 1),
        "tools": dict(tools),
        "fingerprint": _fingerprint(out_model),
        "privasr_version": __version__,
    }
