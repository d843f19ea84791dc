"""AMI meeting transcripts as pre-processed for HMNet (``AMI_proprec``): one meeting per JSON line.

Each line (files ``split_*.jsonl.gz``)::

    {"id": "ES2004a", "meeting": [{"speaker": "B", "role": "PM",
                                   "utt": {"word": ["Hello", ",", ...], "pos_id": [...], "ent_id": [...]}}, ...],
     "summary": [...]}

Every turn (entry of ``meeting``) becomes a :class:`~privasr.corpus.records.Transcript` with
``utt_id = f"{meeting}_{letter}_{position}"`` (*position* = index of the turn in the meeting's list, the
same ids as ``ami-tts-nbest``), ``client`` = meeting, ``speaker = f"{meeting}_{letter}"``, ``order`` =
position, ``meta["role"]`` = role, and, when a whole ``AMI_proprec`` folder is read, ``meta["split"]``.
Words are the raw tokens (cased, punctuation tokens, split contractions: normalise separately).
``pos_id``/``ent_id`` (automatic spaCy tags with no label table) and the meeting ``summary`` are not kept.

Turns with no tokens are left out of the records but counted (:func:`scan_ami_hmnet`); positions of the
other turns are unchanged, so they still match the N-best ids. (The public files have no empty turns.)

Accepted inputs: a split file, a folder of split files (``AMI_proprec/train``), or ``AMI_proprec`` itself
(its ``train``, ``dev``, ``test`` sub-folders, in that order, then any others alphabetically).

>>> import tempfile, pathlib, gzip, json
>>> p = pathlib.Path(tempfile.mkdtemp()) / "split_0.jsonl.gz"
>>> m = {"id": "M1", "meeting": [{"speaker": "B", "role": "PM", "utt": {"word": ["Hi", "."]}},
...                               {"speaker": "A", "role": "ID", "utt": {"word": []}},
...                               {"speaker": "A", "role": "ID", "utt": {"word": ["we", "'re", "done"]}}]}
>>> with gzip.open(p, "wt") as f:
...     _ = f.write(json.dumps(m) + "\\n")
>>> [(t.utt_id, t.speaker, t.order, t.words) for t in read_ami_hmnet(p)]
[('M1_B_0', 'M1_B', 0, ('Hi', '.')), ('M1_A_2', 'M1_A', 2, ('we', "'re", 'done'))]
>>> scan_ami_hmnet(p)
HmnetCounts(meetings=1, turns=3, empty_turns=1, tokens=5)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr.corpus.formats._common import (
    loads_json,
    located,
    natural_key,
)
from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines
from privasr.errors import InputError

__all__ = ["read_ami_hmnet", "iter_ami_hmnet", "scan_ami_hmnet", "HmnetCounts", "hmnet_files", "SPLITS"]

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class HmnetCounts:
    """Counts over AMI HMNet meetings: meetings, turns (including empty ones), empty turns, tokens."""

    meetings: int
    turns: int
    empty_turns: int
    tokens: int


def _split_files(folder: Path) -> list[Path]:
    return sorted((q for q in folder.iterdir() if q.is_file() and ".jsonl" in q.name.lower()),
                  key=lambda q: natural_key(q.name))


def hmnet_files(path: PathLike) -> list[tuple[Path, str | None]]:
    """The meeting files of ``path`` with their split name (``None`` unless ``path`` is ``AMI_proprec``).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "dev").mkdir(); _ = (d / "dev" / "split_0.jsonl").write_text("")
    >>> [(f.name, s) for f, s in hmnet_files(d)]
    [('split_0.jsonl', 'dev')]
    """
    p = Path(path)
    if not p.is_dir():
        return [(p, None)]
    files = _split_files(p)
    if files:
        return [(f, None) for f in files]
    subs = [q for q in p.iterdir() if q.is_dir()]
    subs.sort(key=lambda q: (SPLITS.index(q.name) if q.name in SPLITS else len(SPLITS), q.name))
    out = [(f, q.name) for q in subs for f in _split_files(q)]
    if not out:
        raise InputError("no meeting files (*.jsonl[.gz]) here or in split sub-folders", path=p,
                         expected="an AMI_proprec split file, split folder, or AMI_proprec")
    return out


def _turns(obj: Any, counts: list[int]) -> Iterator[tuple[int, str, str, str, tuple[str, ...]]]:
    if not isinstance(obj, dict):
        raise InputError(f"the line is a JSON {type(obj).__name__}", expected="one meeting object per line")
    mid, turns = obj.get("id"), obj.get("meeting")
    if not isinstance(mid, str) or not mid.strip() or any(c.isspace() for c in mid):
        raise InputError(f"meeting id is {mid!r}"[:100], expected='"id": a meeting id without spaces')
    if not isinstance(turns, list):
        raise InputError(f"meeting {mid}: 'meeting' is {type(turns).__name__}", expected="a list of turns")
    counts[0] += 1
    for pos, t in enumerate(turns):
        what = f"meeting {mid} turn {pos}"
        if not isinstance(t, dict):
            raise InputError(f"{what} is {type(t).__name__}", expected="a turn object")
        spk, role, utt = t.get("speaker"), t.get("role"), t.get("utt")
        if not isinstance(spk, str) or not spk.strip() or any(c.isspace() for c in spk):
            raise InputError(f"{what}: speaker is {spk!r}"[:120], expected="a speaker letter")
        if role is not None and not isinstance(role, str):
            raise InputError(f"{what}: role is {role!r}"[:120], expected="a role string")
        if not isinstance(utt, dict) or not isinstance(utt.get("word"), list):
            raise InputError(f"{what}: no utt.word list", expected='"utt": {"word": [tokens...]}')
        words = utt["word"]
        if not all(isinstance(w, str) for w in words):
            raise InputError(f"{what}: a token is not a string", expected="string tokens")
        counts[1] += 1
        counts[3] += len(words)
        if not words:
            counts[2] += 1
            continue
        yield pos, mid, spk, role, tuple(words)


def _iter(path: PathLike, counts: list[int]) -> Iterator[Transcript]:
    seen: dict[str, str] = {}
    for f, split in hmnet_files(path):
        for n, line in iter_lines(f):
            if not line.strip():
                continue
            with located(f, n):
                obj = loads_json(line)
                recs = []
                for pos, mid, spk, role, words in _turns(obj, counts):
                    meta: dict[str, Any] = {}
                    if role is not None:
                        meta["role"] = role
                    if split is not None:
                        meta["split"] = split
                    recs.append(Transcript(f"{mid}_{spk}_{pos}", words, client=mid, speaker=f"{mid}_{spk}",
                                           order=pos, meta=meta))
                if isinstance(obj, dict):
                    mid = obj["id"]
                    if mid in seen:
                        raise InputError(f"meeting {mid} appears twice (first in {seen[mid]})",
                                         expected="each meeting once")
                    seen[mid] = f"{f}:{n}"
            yield from recs


def iter_ami_hmnet(path: PathLike) -> Iterator[Transcript]:
    """Yield the non-empty turns of AMI HMNet meetings as transcripts, meetings and turns in file order.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "s.jsonl"
    >>> _ = p.write_text('{"id": "M", "meeting": [{"speaker": "A", "role": "PM", "utt": {"word": "x"}}]}\\n')
    >>> list(iter_ami_hmnet(p))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...s.jsonl:1: meeting M turn 0: no utt.word list (expected "utt": {"word": [tokens...]})
    """
    return _iter(path, [0, 0, 0, 0])


def read_ami_hmnet(path: PathLike) -> list[Transcript]:
    """Read AMI HMNet meetings (file, split folder, or ``AMI_proprec``) into a list of transcripts.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "s.jsonl"
    >>> _ = p.write_text('{"id": "M", "meeting": [{"speaker": "A", "role": "PM", "utt": {"word": ["ok"]}}]}\\n')
    >>> read_ami_hmnet(p)[0].meta["role"]
    'PM'
    """
    return list(_iter(path, [0, 0, 0, 0]))


def scan_ami_hmnet(path: PathLike) -> HmnetCounts:
    """Count meetings, turns (empty ones included), empty turns and tokens, validating as it reads.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "s.jsonl"
    >>> _ = p.write_text('{"id": "M", "meeting": [{"speaker": "A", "utt": {"word": ["a", "b"]}}]}\\n')
    >>> scan_ami_hmnet(p)
    HmnetCounts(meetings=1, turns=1, empty_turns=0, tokens=2)
    """
    counts = [0, 0, 0, 0]
    for _ in _iter(path, counts):
        pass
    return HmnetCounts(*counts)
