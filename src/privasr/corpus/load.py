"""Load any supported corpus file or folder, detecting its format from its content.

:func:`load_path` returns a list of :class:`Dataset` (one per set: ``dev`` and ``test`` files, each ASR
system's CTMs...). Formats are recognised by content, not by folder names, so a user's own copies work.
:data:`FORMATS` maps each format name to its reader and writer (used by ``privasr data convert``), and
:func:`write_dataset` writes a dataset in any format with a writer.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "a.ctm").write_text("rec1 A 0.0 0.5 hello 0.9\\n")
>>> [(ds.name, ds.kind, ds.fmt, len(ds.records)) for ds in load_path(d / "a.ctm")]
[('a', 'transcript', 'ctm', 1)]
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from privasr import progress
from privasr.corpus.formats import (
    ami_hmnet,
    ami_tts,
    an4,
    conll,
    ctm,
    earnings21,
    fsdd,
    hyporadise,
    kaldi_text,
    nbest_jsonl,
    slf_nbest,
    srilm_nbest,
)
from privasr.corpus.formats._common import (
    is_file,
    is_tar,
    iter_tar_texts,
    loads_json,
    natural_key,
    strip_compression,
)
from privasr.corpus.records import NBest, Transcript
from privasr.corpus.textio import PathLike, iter_lines, split_words
from privasr.errors import InputError

__all__ = ["Dataset", "FormatSpec", "FORMATS", "FORMAT_KINDS", "load_path", "load_nbest", "detect_format",
           "likely_formats", "no_utterances", "write_dataset", "read_text_lines"]


@dataclass(frozen=True)
class Dataset:
    """One loaded set of records.

    Attributes:
        name: e.g. ``"ami-tts-nbest/dev"`` (folder name and file stem).
        kind: ``"nbest"`` or ``"transcript"``.
        fmt: the format name (a key of :data:`FORMATS`).
        records: the N-best lists or transcripts.
        references: utt_id -> reference words, when the records are hypotheses scored against references
            kept elsewhere (e.g. Earnings-21 CTMs, whose utt_id is the call id, paired with the call's
            ``.nlp`` tokens); otherwise ``None``.
    """

    name: str
    kind: str
    fmt: str
    records: tuple[NBest, ...] | tuple[Transcript, ...]
    references: Mapping[str, tuple[str, ...]] | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("nbest", "transcript"):
            raise InputError(f"dataset kind {self.kind!r}", expected="'nbest' or 'transcript'")
        object.__setattr__(self, "records", tuple(self.records))
        if self.references is not None:
            object.__setattr__(self, "references", MappingProxyType(dict(self.references)))


class FormatSpec(NamedTuple):
    """A format's reader ``(path) -> list of records`` and writer ``(path, records) -> count`` (or None)."""

    reader: Callable[[PathLike], list[Any]]
    writer: Callable[[PathLike, Iterable[Any]], int | None] | None


# ------------------------------------------------------------------------------------------ small readers


def read_text_lines(path: PathLike) -> list[Transcript]:
    """Plain tokenized text (a file, or a tar of ``.txt`` files): one transcript per non-blank line.

    ``utt_id = f"{name}-{line:06d}"``, ``client`` = the file name without ``.txt``, ``order`` = the line
    number. A first line of the form ``[ Title by Author Year ]`` (as in the Gutenberg set) is left out.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "book.txt"
    >>> _ = p.write_text("[ Book by Me 1900 ]\\nIt was .\\n\\nThe end .\\n")
    >>> [(t.utt_id, t.text) for t in read_text_lines(p)]
    [('book-000002', 'It was .'), ('book-000004', 'The end .')]
    """
    p = Path(path)
    if is_tar(p):
        sources = [(Path(n).name, f"{p}:{n}", enumerate(text.splitlines(), start=1))
                   for n, text in iter_tar_texts(p, (".txt",))]
    else:
        sources = [(strip_compression(p.name), str(p), iter_lines(p))]
    out = []
    for name, where, numbered in sources:
        book = name[:-4] if name.endswith(".txt") else name
        for n, line in numbered:
            words = tuple(split_words(line))
            if not words or (n == 1 and line.startswith("[") and line.rstrip().endswith("]")):
                continue
            try:
                out.append(Transcript(f"{book}-{n:06d}", words, client=book, order=n))
            except InputError as e:
                raise e.at(where, n) from None
    return out


def _optional(module: str, name: str) -> Callable[..., Any] | None:
    try:
        mod = __import__(f"privasr.corpus.formats.{module}", fromlist=[name])
    except ImportError:
        return None
    return getattr(mod, name, None)


def _counted(writer: Callable[..., Any]) -> Callable[[PathLike, Iterable[Any]], int]:
    def write(path: PathLike, records: Iterable[Any]) -> int:
        recs = list(records)
        writer(path, recs)
        return len(recs)

    write.__doc__ = writer.__doc__
    return write


def _hyporadise_writer(path: PathLike, records: Iterable[NBest]) -> int:
    return hyporadise.write_hyporadise(path, records, ids=hyporadise.default_ids_path(path))


def _hyporadise_reader(path: PathLike) -> list[NBest]:
    ids = hyporadise.default_ids_path(path)
    return hyporadise.read_hyporadise(path, ids=ids if ids.is_file() else None)


FORMATS: dict[str, FormatSpec] = {
    "nbest-jsonl": FormatSpec(nbest_jsonl.read_nbest, nbest_jsonl.write_nbest),
    "transcript-jsonl": FormatSpec(nbest_jsonl.read_transcripts, nbest_jsonl.write_transcripts),
    "ami-tts": FormatSpec(ami_tts.read_ami_tts, None),
    "hyporadise": FormatSpec(_hyporadise_reader, _hyporadise_writer),
    "srilm": FormatSpec(srilm_nbest.read_srilm_nbest, srilm_nbest.write_srilm_nbest),
    "ctm": FormatSpec(ctm.read_ctm, ctm.write_ctm),
    "ami-hmnet": FormatSpec(ami_hmnet.read_ami_hmnet, None),
    "earnings21": FormatSpec(earnings21.read_earnings21, None),
    "conll": FormatSpec(conll.read_conll, conll.write_conll),
    "an4": FormatSpec(an4.read_an4, None),
    "text-lines": FormatSpec(read_text_lines, None),
    "fsdd": FormatSpec(fsdd.read_fsdd, None),
    "htk-lattice": FormatSpec(slf_nbest.read_htk_nbest, None),
}
"""Format name -> (reader, writer or None). ``kaldi-text`` and ``trn`` are added when their modules exist."""

FORMAT_KINDS: dict[str, str] = {
    "nbest-jsonl": "nbest", "ami-tts": "nbest", "hyporadise": "nbest", "srilm": "nbest",
    "transcript-jsonl": "transcript", "ctm": "transcript", "ami-hmnet": "transcript", "earnings21": "transcript",
    "conll": "transcript", "an4": "transcript", "text-lines": "transcript",
    "fsdd": "transcript", "htk-lattice": "nbest",
}
"""Format name -> the kind of records it holds."""

for _name, _mod, _r, _w in (("kaldi-text", "kaldi_text", "read_kaldi_text", "write_kaldi_text"),
                            ("trn", "trn", "read_trn", "write_trn")):
    _reader = _optional(_mod, _r)
    if _reader is not None:
        _writer = _optional(_mod, _w)
        FORMATS[_name] = FormatSpec(_reader, _counted(_writer) if _writer is not None else None)
        FORMAT_KINDS[_name] = "transcript"

_TRIED = ("nbest-jsonl", "transcript-jsonl", "ami-tts", "ami-hmnet", "hyporadise", "srilm", "ctm", "earnings21",
          "conll", "an4", "trn", "kaldi-text", "text-lines (tar of .txt)", "fsdd (folder of digit_speaker_index.wav)",
          "htk-lattice")
_SKIP_SUFFIXES = (".wav", ".mfc", ".mp3", ".flac", ".sph", ".dmp", ".pdf", ".png", ".csv",
                  ".md", ".arpa", ".arpa.xz", ".arpa.gz", ".dic", ".phone", ".filler", ".fileids", ".rst")
# files of these formats in one folder form one set
_GROUPED = ("ctm", "ami-hmnet", "srilm", "earnings21", "htk-lattice")
_IOB = re.compile(r"^(O|[BI]-\S+)$")
_KALDI_ID = re.compile(r"[\d_-]")
_SLF = re.compile(r"^(VERSION|UTTERANCE|N)=\S")


# ---------------------------------------------------------------------------------------------- detection


def _head(path: Path, n: int = 50) -> list[str]:
    """The first ``n`` non-blank lines (``[]`` when the file cannot be read: folder scans skip such files)."""
    lines, err = _head_and_error(path, n)
    return [] if err is not None else lines


def _head_and_error(path: Path, n: int = 50) -> tuple[list[str], InputError | None]:
    """The first ``n`` non-blank lines that could be read, and the read error that stopped them (if any)."""
    out: list[str] = []
    try:
        for _, line in iter_lines(path):
            if line.strip():
                out.append(line)
                if len(out) >= n:
                    break
    except InputError as e:
        return out, e
    return out, None


def _json_kind(obj: Any) -> str | None:
    if ami_tts.looks_like_ami_tts(obj):
        return "ami-tts"
    if isinstance(obj, dict) and "utt_id" in obj and "hyps" in obj:
        return "nbest-jsonl"
    if isinstance(obj, dict) and "utt_id" in obj and "words" in obj:
        return "transcript-jsonl"
    if isinstance(obj, dict) and "id" in obj and "meeting" in obj:
        return "ami-hmnet"
    return None


def _is_ctm(head: list[str]) -> bool:
    rows = [x for x in head if not x.lstrip().startswith(";;")]
    if not rows:
        return False
    try:
        for x in rows:
            ctm.parse_ctm_line(x)
    except InputError:
        return False
    return True


def _is_conll(head: list[str]) -> bool:
    seen_tag = False
    for x in head:
        f = x.split()
        if f[0] == conll.DOCSTART:
            continue
        if len(f) < 2 or not _IOB.match(f[-1]):
            return False
        seen_tag = True
    return seen_tag


def _tar_kind(p: Path) -> str | None:
    try:
        with tarfile.open(p, "r:*") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                n = m.name.lower()
                if n.endswith(".ctm"):
                    return "ctm"
                if n.endswith(".nlp"):
                    return "earnings21"
                if n.endswith(".txt"):
                    return "text-lines"
    except (tarfile.TarError, OSError, EOFError, ValueError, Exception):  # noqa: BLE001 - any damage: unknown
        return None
    return None


def detect_format(path: PathLike, *, strict: bool = True, fallback: str | None = None) -> str | None:
    """The format name of a file, from its content (``None`` when unknown and ``strict`` is false).

    With ``strict`` (the default, for a file given by the user) the loose formats are also tried: an
    SRILM list file, and Kaldi ``text`` (lines ``utt_id words...`` whose ids contain a digit, ``-`` or
    ``_``, unique among the first lines, and no other format likelier); in folder scans only files named
    ``text`` are taken as Kaldi text.

    When a strict detection recognises nothing, the error is the reader's own error (file, line and
    expectation) for the likeliest format (:func:`likely_formats`: extension and the shape of the first
    lines), followed by the list of formats tried; an empty file "holds no utterances". ``fallback`` (e.g.
    ``"kaldi-text"``) is returned instead when no format is likelier than it.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.conll"
    >>> _ = p.write_text("Bob I-PER\\nran O\\n")
    >>> detect_format(p)
    'conll'
    >>> _ = p.write_text("Bob I-PER\\nran\\n")
    >>> detect_format(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x.conll:2: line has 1 field (expected token [columns...] TAG; read as conll, the likeliest format: auto-detection recognised none of nbest-jsonl, ...)
    """
    p = Path(path)
    low = p.name.lower()
    if is_tar(p):
        kind = _tar_kind(p)
        if kind is None and strict:
            _explain_tar(p)
    elif strip_compression(low).endswith(".stm"):
        if strict:
            raise InputError("sclite's STM format (segment time marks) is not read", path=p, line=1,
                             expected="utterance transcripts: one trn line per segment, 'words (recording-start)', "
                                      "or Kaldi text; see docs/formats.md")
        kind = None
    elif strip_compression(low).endswith(".json"):
        head = _head(p, 1)
        kind = "hyporadise" if head and head[0].lstrip().startswith("[") else None
    else:
        kind = _detect_text(p, strict)
    if kind is None and strict:
        kind = _explain(p, fallback)
    return kind


def _detect_text(p: Path, strict: bool) -> str | None:
    head, err = _head_and_error(p)
    if err is not None and not strict:
        return None  # unreadable files are skipped in folder scans
    if not head:
        return None
    first = head[0].strip()
    if first.startswith("{") and not first.endswith(")"):  # '{ um / @ } words (id)' is trn
        try:
            return _json_kind(loads_json(first))
        except InputError:
            return None
    if first.startswith("["):
        return "hyporadise"
    if _SLF.match(next((x.strip() for x in head if not x.lstrip().startswith("#")), "")):
        return "htk-lattice"
    if first in ("NBestList1.0", "NBestList2.0"):
        return "srilm"
    if first.split("|")[:2] == ["token", "speaker"]:
        return "earnings21"
    if _is_ctm(head):
        return "ctm"
    if _is_conll(head):
        return "conll"
    rows = [x for x in head if not x.lstrip().startswith(";;")]
    if rows and all(x.rstrip().endswith(")") for x in rows):
        ids = [x.rstrip()[x.rstrip().rfind("(") + 1 : -1] for x in rows]
        if all(an4.AN4_ID.match(i) for i in ids) or p.name.endswith(".transcription"):
            return "an4"
        if "trn" in FORMATS:
            return "trn"
    if srilm_nbest.srilm_nbest_format(p) == 3 and all(len(x.split()) >= 3 for x in head):
        try:
            srilm_nbest.read_srilm_file(p)
            return "srilm"
        except InputError:
            pass
    if strict and all(is_file(p.parent / r.strip()) or is_file(r.strip()) for r in head):
        return "srilm"  # a list of N-best files
    if "kaldi-text" in FORMATS and p.name == "text":
        return "kaldi-text"
    if "kaldi-text" in FORMATS and strict and all(_KALDI_ID.search(x.split()[0]) for x in head):
        ids = [x.split()[0] for x in head]
        if len(set(ids)) == len(ids) and likely_formats(p, head)[:1] == ["kaldi-text"]:
            return "kaldi-text"
    return None


# ------------------------------------------------------------------------ evidence when detection fails

_EXTENSIONS = ((".jsonl", "nbest-jsonl"), (".json", "hyporadise"), (".ctm", "ctm"), (".conll", "conll"),
               (".trn", "trn"), (".nlp", "earnings21"), (".transcription", "an4"))
_LOOSE_TAG = re.compile(r"^(O|[A-Za-z]{1,2}-\S+)$")
_CHANNEL = re.compile(r"^[A-Za-z0-9]{1,3}$")
_JSON_KEY = re.compile(r'"([^"\\]{1,40})"\s*:')


def _is_num(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _json_guess(line: str) -> str:
    """The JSON Lines format a (possibly broken) JSON object line most resembles."""
    try:
        obj = loads_json(line)
        keys = set(obj) if isinstance(obj, dict) else set()
    except InputError:
        keys = set(_JSON_KEY.findall(line))
    if {"meeting", "position"} <= keys:
        return "ami-tts"
    if "hyps" in keys:
        return "nbest-jsonl"
    if "words" in keys:
        return "transcript-jsonl"
    if {"id", "meeting"} <= keys:
        return "ami-hmnet"
    nb, tr = len(keys & set(nbest_jsonl.NBEST_KEYS)), len(keys & set(nbest_jsonl.TRANSCRIPT_KEYS))
    return "transcript-jsonl" if tr > nb else "nbest-jsonl"


def _shapes(line: str) -> set[str]:
    """The formats whose line shape ``line`` loosely has (right or wrong in the details)."""
    s = line.strip()
    f = s.split()
    out: set[str] = set()
    if s.startswith("{") and not s.endswith(")"):  # '{ um / @ } words (id)': a trn line opening with an alternation
        out.add(_json_guess(s))
        return out
    if s.startswith("["):
        return {"hyporadise"}
    if f[0] in ("NBestList1.0", "NBestList2.0") or (f[0].startswith("(") and f[0].endswith(")")
                                                     and _is_num(f[0][1:-1])):
        out.add("srilm")
    if len(f) >= 3 and _is_num(f[0]) and _is_num(f[1]) and _is_num(f[2]):
        out.add("srilm")
    if 4 <= len(f) <= 7 and _CHANNEL.match(f[1]) and (_is_num(f[2]) or _is_num(f[3])):
        out.add("ctm")
    if s.startswith(";;"):
        out.update(("ctm", "trn"))
    if s.endswith(")") or f[-1].startswith("("):
        out.add("trn")
        if an4.AN4_ID.match(s[s.rfind("(") + 1 : -1]):
            out.add("an4")
    if f[0] == conll.DOCSTART or (len(f) >= 2 and _LOOSE_TAG.match(f[-1])):
        out.add("conll")
    if s.count("|") >= 4:
        out.add("earnings21")
    return out


def likely_formats(path: PathLike, head: Sequence[str] | None = None) -> list[str]:
    """Formats a file most resembles, likeliest first, from its name and the shape of its first lines.

    The evidence: a matching extension (``.jsonl``, ``.ctm``, ``.conll``, ``.trn``...) counts 2, a first
    non-blank line of the format's shape 2, and the share of the first 50 non-blank lines of its shape 1
    (JSON objects count for the JSON Lines format their keys name; lines naming existing files count for an
    SRILM list file). Kaldi text, which any line fits,
    counts 0.5 (2 more for a file named ``text``). Used to give the likeliest reader's error when detection fails.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "hyp.txt"
    >>> _ = p.write_text("-10.5 -2.25 3 hello world\\n")
    >>> likely_formats(p)
    ['srilm', 'kaldi-text']
    """
    p = Path(path)
    if head is None:
        head = _head_and_error(p)[0]
    score: dict[str, float] = {}
    base = strip_compression(p.name.lower())
    for ext, fmt in _EXTENSIONS:
        if base.endswith(ext):
            score[fmt] = score.get(fmt, 0.0) + 2.0
    if base == "text":
        score["kaldi-text"] = score.get("kaldi-text", 0.0) + 2.0
    if head:
        for k, line in enumerate(head):
            for fmt in _shapes(line):
                score[fmt] = score.get(fmt, 0.0) + (2.0 if k == 0 else 0.0) + 1.0 / len(head)
        if not head[0].lstrip().startswith(("{", "[")):
            score["kaldi-text"] = score.get("kaldi-text", 0.0) + 0.5
        listed = [is_file(p.parent / x.strip()) or is_file(x.strip()) for x in head]
        if any(listed):  # an SRILM list file names N-best files
            score["srilm"] = score.get("srilm", 0.0) + (2.0 if listed[0] else 0.0) + sum(listed) / len(head)
    if "transcript-jsonl" in score and base.endswith(".jsonl") and "nbest-jsonl" in score and \
            score["transcript-jsonl"] > 2.0:
        score["nbest-jsonl"] -= 2.0  # the extension speaks for whichever JSON Lines kind the keys name
    order = list(FORMATS)
    return sorted((f for f in score if f in FORMATS), key=lambda f: (-score[f], order.index(f)))


def _tried() -> str:
    return ", ".join(_TRIED)


def _as_likeliest(e: InputError, fmt: str) -> InputError:
    note = f"read as {fmt}, the likeliest format: auto-detection recognised none of {_tried()}"
    msg = f"{e.message} (expected {e.expected}; {note})" if e.expected else f"{e.message} ({note})"
    return InputError(msg, path=e.path, line=e.line)


def _explain(p: Path, fallback: str | None) -> str:
    """For a file no format recognised: raise the likeliest format's reader error (or return ``fallback``)."""
    head, err = _head_and_error(p)
    if not head and err is None:
        raise no_utterances(p)
    ranked = likely_formats(p, head)
    if fallback is not None and (not ranked or ranked[0] == fallback):
        return fallback
    kaldi_ids = all(_KALDI_ID.search(x.split()[0]) for x in head)
    if ranked and (ranked[0] != "kaldi-text" or err is not None or kaldi_ids):
        fmt = ranked[0]
        try:
            FORMATS[fmt].reader(p)
        except InputError as e:
            raise _as_likeliest(e, fmt) from None
        return fmt  # the likeliest reader accepts the whole file
    if err is not None:
        raise _as_likeliest(err, "text") from None
    raise InputError("unrecognised content", path=p, expected=f"one of the formats {_tried()}")


def _explain_tar(p: Path) -> None:
    try:
        for _ in iter_tar_texts(p, ("",)):
            pass
    except InputError as e:
        raise InputError(f"{e.message} (expected {e.expected}; auto-detection recognised none of {_tried()})",
                         path=e.path, line=e.line) from None
    raise InputError("the archive holds no .ctm, .nlp or .txt files", path=p,
                     expected=f"one of the formats {_tried()}")


def no_utterances(path: PathLike) -> InputError:
    """The error for a file that holds no utterances (saying so when it is empty or blank).

    >>> str(no_utterances("a.txt"))
    'a.txt: holds no utterances (expected at least one utterance)'
    """
    p = Path(path)
    blank = False
    if p.is_file():
        head, err = _head_and_error(p, 1)
        blank = not head and err is None
    return InputError("holds no utterances" + (": the file is empty" if blank else ""), path=p,
                      expected="at least one utterance")


# ---------------------------------------------------------------------------------------------- loading


def _name(root: Path, p: Path) -> str:
    base = strip_compression(p.name)
    for suf in (".jsonl", ".json", ".tar", ".ctm", ".nlp", ".conll", ".txt", ".transcription"):
        if base.lower().endswith(suf) and len(base) > len(suf):
            base = base[: -len(suf)]
            break
    try:
        rel = p.parent.relative_to(root)
    except ValueError:
        rel = Path()
    parts = [root.name, *rel.parts, base] if root != p else [base]
    return "/".join(x for x in parts if x)


def _dataset(name: str, fmt: str, path: Path) -> Dataset:
    with progress.task(f"reading {name} ({fmt})", transient=True):  # a big corpus takes seconds to minutes
        records = FORMATS[fmt].reader(path)
    return Dataset(name, FORMAT_KINDS[fmt], fmt, tuple(records))


def load_path(path: PathLike, fmt: str | None = None, *, fallback: str | None = None) -> list[Dataset]:
    """Load a corpus file or folder into datasets, detecting the format(s) unless ``fmt`` is given.

    A folder is scanned recursively (hidden entries skipped): files of a per-file format (JSON Lines,
    HyPoradise JSON, CoNLL, AN4, trn...) give one dataset each; the files of a folder-wide format (CTM,
    AMI HMNet splits, SRILM N-best files, ``.nlp`` references) give one dataset for their folder. Files
    that fit no format are skipped (an error if nothing fits). Transcript datasets of hypotheses (CTMs)
    whose utterance ids are the clients of an Earnings-21 reference set found in the same load get that
    set's call tokens as ``references``. A dataset whose utterance ids equal the union of its siblings'
    (AN4's ``combined`` file) is left out.

    A file (not a folder) that holds no utterances is an error, with or without ``fmt``. When a file's
    format is not recognised the error is the likeliest format's own (see :func:`detect_format`, which
    also explains ``fallback``).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "README").write_text("Just words here.\\n")
    >>> load_path(d)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...: no corpus files found (expected one of the formats nbest-jsonl, ...)
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such file or folder", path=p)
    if fmt is not None:
        if fmt == "jsonl":
            fmt = _detect_text(p, True) if not p.is_dir() else None
            if fmt not in ("nbest-jsonl", "transcript-jsonl"):
                raise InputError("not canonical JSON Lines", path=p, expected="nbest-jsonl or transcript-jsonl")
        if fmt not in FORMATS:
            raise InputError(f"unknown format {fmt!r}", expected=f"one of {', '.join(sorted(FORMATS))}")
        return [_nonempty(_dataset(_name(p, p), fmt, p), p)]
    if p.is_file():
        kind = detect_format(p, fallback=fallback)
        return _pair([_nonempty(_dataset(_name(p, p), kind, p), p)])  # type: ignore[arg-type]
    out = _scan(p, p, depth=0)
    if not out:
        raise InputError("no corpus files found", path=p, expected=f"one of the formats {', '.join(_TRIED)}")
    return _pair(_drop_unions(out))


def _nonempty(d: Dataset, p: Path) -> Dataset:
    if not d.records and p.is_file():
        raise no_utterances(p)
    return d


def load_nbest(path: PathLike, fmt: str | None = None) -> list[NBest]:
    """The N-best lists of a file or folder that holds exactly one non-empty N-best set (:func:`load_path`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.txt"
    >>> _ = p.write_text("u1 hello\\n")
    >>> load_nbest(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...: holds 0 N-best sets (expected exactly one N-best set)
    """
    sets = [d for d in load_path(path, fmt) if d.kind == "nbest"]
    if len(sets) != 1:
        raise InputError(f"holds {len(sets)} N-best sets", path=path, expected="exactly one N-best set")
    recs = list(sets[0].records)
    if not recs:
        raise InputError("holds no utterances", path=path, expected="at least one N-best list")
    return recs  # type: ignore[return-value]


def _scan(root: Path, folder: Path, depth: int) -> list[Dataset]:
    entries = sorted((q for q in folder.iterdir() if not q.name.startswith(".")), key=lambda q: natural_key(q.name))
    files = [q for q in entries if q.is_file() and not q.name.lower().endswith(_SKIP_SUFFIXES)
             and q.name not in kaldi_text.KALDI_DATA_FILES
             and not q.name.lower().endswith(".ids.txt")]
    out: list[Dataset] = []
    if fsdd.looks_like_fsdd(folder):
        out.append(_dataset("/".join([root.name, *folder.relative_to(root).parts]), "fsdd", folder))
    grouped: dict[str, list[Path]] = {}
    for q in files:
        kind = detect_format(q, strict=False)
        if kind is None:
            continue
        if kind in _GROUPED and not is_tar(q):
            grouped.setdefault(kind, []).append(q)
        else:
            out.append(_dataset(_name(root, q), kind, q))
    for kind, qs in grouped.items():
        name = "/".join([root.name, *folder.relative_to(root).parts]) if folder != root else root.name
        if kind == "ami-hmnet":
            recs = [t for q in qs for t in ami_hmnet.read_ami_hmnet(q)]
            out.append(Dataset(name, "transcript", kind, tuple(recs)))
        elif kind == "srilm":
            out.append(Dataset(name, "nbest", kind, tuple(srilm_nbest._read_many(qs, folder))))
        else:
            out.append(Dataset(name, FORMAT_KINDS[kind], kind, tuple(FORMATS[kind].reader(folder))))
    if depth < 4:
        for q in entries:
            if q.is_dir():
                out.extend(_scan(root, q, depth + 1))
    return out


def _drop_unions(sets: list[Dataset]) -> list[Dataset]:
    keep = []
    for d in sets:
        others = [o for o in sets if o is not d and o.fmt == d.fmt]
        if len(others) >= 2:
            union = {r.utt_id for o in others for r in o.records}
            if union == {r.utt_id for r in d.records}:
                continue
        keep.append(d)
    return keep


def _pair(sets: list[Dataset]) -> list[Dataset]:
    refsets = [d for d in sets if d.fmt == "earnings21"]
    if not refsets:
        return sets
    refs: dict[str, tuple[str, ...]] = {}
    for d in refsets:
        refs.update(earnings21.call_tokens(d.records))  # type: ignore[arg-type]
    out = []
    for d in sets:
        if d.fmt == "ctm" and d.references is None and any(r.utt_id in refs for r in d.records):
            d = Dataset(d.name, d.kind, d.fmt, d.records, references=refs)
        out.append(d)
    return out


def write_dataset(dataset: Dataset, path: PathLike, fmt: str = "jsonl") -> int:
    """Write a dataset in format ``fmt`` (``"jsonl"``: canonical N-best or transcript JSON Lines by kind).

    Returns the number of records (CTM: word lines; SRILM: files) written.

    >>> import tempfile, pathlib
    >>> from privasr.corpus.records import Transcript
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> ds = Dataset("x", "transcript", "ctm", (Transcript("u", ("a",)),))
    >>> write_dataset(ds, d / "x.jsonl")
    1
    """
    if fmt == "jsonl":
        fmt = "nbest-jsonl" if dataset.kind == "nbest" else "transcript-jsonl"
    spec = FORMATS.get(fmt)
    if spec is None or spec.writer is None:
        writable = sorted(k for k, v in FORMATS.items() if v.writer is not None)
        raise InputError(f"no writer for format {fmt!r}", expected=f"one of jsonl, {', '.join(writable)}")
    if FORMAT_KINDS[fmt] != dataset.kind:
        raise InputError(f"{dataset.name} holds {dataset.kind} records but {fmt} stores {FORMAT_KINDS[fmt]}",
                         expected=f"a {dataset.kind} format")
    n = spec.writer(path, dataset.records)
    return len(dataset.records) if n is None else n


def dataset_names(sets: Sequence[Dataset]) -> list[str]:
    """The names of some datasets (a convenience for printing).

    >>> dataset_names([Dataset("a/dev", "nbest", "nbest-jsonl", ())])
    ['a/dev']
    """
    return [d.name for d in sets]
