"""Earnings-21 reference transcripts: ``.nlp`` token files plus ``wer_tags/<id>.wer_tag.json`` entity types.

An ``.nlp`` file has a header line, then one token per line, ``|``-separated::

    token|speaker|ts|endTs|punctuation|case|tags|wer_tags
    2020|0|||.|CA|['0:YEAR']|['0', '1', '6']

and ``<id>.wer_tag.json`` maps entity id -> ``{"entity_type": "PERSON"}``. Each speaker turn (maximal run
of tokens with the same speaker) becomes a :class:`~privasr.corpus.records.Transcript`:
``utt_id = f"{file_id}_{turn:04d}"``, ``client`` = file id, ``speaker = f"{file_id}_{speaker}"``, ``order`` =
turn index, ``entities`` = one :class:`~privasr.corpus.records.Span` per contiguous run of tokens of a
``wer_tags`` entity within the turn, labelled with its ``entity_type`` (taken from the ``tags`` column,
``"id:TYPE"``, when the JSON lacks the id; entities with no type anywhere are listed in
``meta["untyped_entity_ids"]``). ``meta`` keeps, per token, ``punctuation``, ``case`` and the raw ``tags``
column, and per span the entity id (``entity_ids``), so nothing is lost. Times come from ``ts``/``endTs``
when every token of the turn has numeric ones (they are empty in the public references); otherwise
non-empty raw values are kept as ``meta["ts"]``/``meta["endTs"]``.

Data quirks handled: tokens are stripped of surrounding whitespace; an empty token (two lines in
4382825) cannot be a word, so it is dropped and recorded in ``meta["dropped"]`` as ``[line, raw line]``.
Without a tags file (no sibling ``wer_tags/`` folder, nor ``<id>.wer_tag.json`` next to the ``.nlp``), a
transcript has no entities.

Accepted inputs: an ``.nlp`` file, a folder (holding ``*.nlp`` or ``nlp_references/``), or a tar archive
with ``nlp_references/*.nlp`` and ``wer_tags/*.wer_tag.json`` members.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> (d / "wer_tags").mkdir()
>>> _ = (d / "c1.nlp").write_text("token|speaker|ts|endTs|punctuation|case|tags|wer_tags\\n"
...     "Hi|0||||UC|[]|[]\\nSteve|0||||UC|[]|['7']\\nJobs|0|||.|UC|[]|['7']\\nHello|1|||.|UC|[]|[]\\n")
>>> _ = (d / "wer_tags" / "c1.wer_tag.json").write_text('{"7": {"entity_type": "PERSON"}}')
>>> ts = read_earnings21(d / "c1.nlp")
>>> [(t.utt_id, t.speaker, t.words) for t in ts]
[('c1_0000', 'c1_0', ('Hi', 'Steve', 'Jobs')), ('c1_0001', 'c1_1', ('Hello',))]
>>> ts[0].entities, ts[0].meta["punctuation"]
((Span(start=1, end=3, label='PERSON'),), ('', '', '.'))
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privasr.corpus.formats._common import (
    is_tar,
    iter_tar_texts,
    json_line_of,
    loads_json,
    natural_key,
    strip_compression,
)
from privasr.corpus.records import Span, Transcript
from privasr.corpus.textio import PathLike, read_text
from privasr.errors import InputError

__all__ = ["read_earnings21", "read_nlp", "parse_nlp", "parse_wer_tags", "read_speaker_names", "call_tokens",
           "NLP_HEADER"]

NLP_HEADER = ("token", "speaker", "ts", "endTs", "punctuation", "case", "tags", "wer_tags")
_EXPECTED = "|".join(NLP_HEADER)


def _file_id(name: str) -> str:
    n = strip_compression(Path(name).name)
    return n[:-4] if n.lower().endswith(".nlp") else n


def _str_list(s: str, what: str) -> list[str]:
    s = s.strip()
    if s == "[]":
        return []
    if len(s) < 2 or s[0] != "[" or s[-1] != "]":
        raise InputError(f"{what} column {s[:40]!r} is not a list", expected="a list like ['1', '2']")
    out = []
    for item in s[1:-1].split(","):
        item = item.strip()
        if len(item) < 2 or item[0] != item[-1] or item[0] not in "'\"":
            raise InputError(f"{what} column {s[:40]!r} is not a list of quoted strings",
                             expected="a list like ['1', '2']")
        out.append(item[1:-1])
    return out


def parse_wer_tags(text: str, where: str) -> dict[str, str]:
    """Parse a ``wer_tag.json`` text into entity id -> entity type.

    >>> parse_wer_tags('{"0": {"entity_type": "YEAR"}}', "x.json")
    {'0': 'YEAR'}
    """
    try:
        data = loads_json(text)
    except InputError as e:
        raise e.at(where, json_line_of(e)) from None
    if not isinstance(data, dict):
        raise InputError(f"the file holds a JSON {type(data).__name__}", path=where,
                         expected='an object {id: {"entity_type": ...}}')
    out = {}
    for k, v in data.items():
        t = v.get("entity_type") if isinstance(v, dict) else None
        if not isinstance(t, str) or not t or any(c.isspace() for c in t):
            raise InputError(f"entity {k[:40]!r} has no valid entity_type", path=where,
                             expected='{"entity_type": "LABEL"}')
        out[k] = t
    return out


def _times(ts: list[str], te: list[str]) -> tuple[tuple[tuple[float, float], ...] | None, bool]:
    """(times, keep_raw): times when all numeric and valid; keep_raw when any non-empty value exists."""
    if not any(ts) and not any(te):
        return None, False
    try:
        out = tuple((float(a), float(b)) for a, b in zip(ts, te, strict=True))
    except ValueError:
        return None, True
    if all(math.isfinite(a) and math.isfinite(b) and 0 <= a <= b for a, b in out):
        return out, False
    return None, True


@dataclass
class _NlpColumns:
    """The kept tokens' columns of an ``.nlp`` file, its entities and what was dropped."""

    words: list[str] = field(default_factory=list)
    spk: list[str] = field(default_factory=list)
    punct: list[str] = field(default_factory=list)
    case: list[str] = field(default_factory=list)
    tagcol: list[list[str]] = field(default_factory=list)
    ts: list[str] = field(default_factory=list)
    te: list[str] = field(default_factory=list)
    ents: dict[str, list[int]] = field(default_factory=dict)  # wer_tags entity id -> token indices
    fallback: dict[str, str] = field(default_factory=dict)  # entity id -> type from the tags column
    dropped: list[tuple[int, str, list[Any]]] = field(default_factory=list)  # (next kept token, speaker, [line, raw])


def _nlp_columns(rows: list[str], where: str) -> _NlpColumns:
    """The token lines (``rows[1:]``, after the header) checked and split into columns."""
    cols = _NlpColumns()
    for n, row in enumerate(rows[1:], start=2):
        if not row.strip():
            continue
        f = row.split("|")
        if len(f) != 8:
            raise InputError(f"{len(f)} fields", path=where, line=n, expected=_EXPECTED)
        s = f[1].strip()
        if not s or any(c.isspace() for c in s):
            raise InputError(f"speaker {f[1][:40]!r} is invalid", path=where, line=n, expected="a speaker id")
        try:
            tcol = _str_list(f[6], "tags")
            wcol = _str_list(f[7], "wer_tags")
        except InputError as e:
            raise e.at(where, n) from None
        for t in tcol:
            k, sep, lab = t.partition(":")
            if sep and lab and not any(c.isspace() for c in lab):
                cols.fallback.setdefault(k, lab)
        tok = f[0].strip()
        if not tok:
            cols.dropped.append((len(cols.words), s, [n, row]))
            continue
        if any(c.isspace() for c in tok):
            raise InputError(f"token {tok[:40]!r} contains whitespace", path=where, line=n,
                             expected="one token per line")
        i = len(cols.words)
        cols.words.append(tok)
        cols.spk.append(s)
        cols.ts.append(f[2].strip())
        cols.te.append(f[3].strip())
        cols.punct.append(f[4])
        cols.case.append(f[5])
        cols.tagcol.append(tcol)
        for e in wcol:
            cols.ents.setdefault(e, []).append(i)
    return cols


def _turns(spk: list[str]) -> tuple[list[tuple[int, int]], list[int]]:
    """Speaker turns as ``(start, end)`` token ranges, and each token's turn."""
    bounds: list[tuple[int, int]] = []
    a = 0
    for i in range(1, len(spk) + 1):
        if i == len(spk) or spk[i] != spk[a]:
            bounds.append((a, i))
            a = i
    turn_of = [0] * len(spk)
    for k, (a, b) in enumerate(bounds):
        for i in range(a, b):
            turn_of[i] = k
    return bounds, turn_of


def _turn_entities(cols: _NlpColumns, tags: dict[str, str], bounds: list[tuple[int, int]], turn_of: list[int],
                   ) -> tuple[list[list[tuple[int, int, str, str]]], list[list[str]]]:
    """Per turn: the entity spans ``(start, end, label, id)`` (one per contiguous run of an entity's tokens
    within the turn) and the ids of entities with no type."""
    spans: list[list[tuple[int, int, str, str]]] = [[] for _ in bounds]
    untyped: list[list[str]] = [[] for _ in bounds]
    for eid, idx in cols.ents.items():
        label = tags.get(eid) or cols.fallback.get(eid)
        runs: list[list[int]] = [[idx[0]]]
        for i in idx[1:]:
            if i == runs[-1][-1] + 1 and turn_of[i] == turn_of[runs[-1][-1]]:
                runs[-1].append(i)
            elif i != runs[-1][-1]:
                runs.append([i])
        for r in runs:
            k = turn_of[r[0]]
            if label is None:
                if eid not in untyped[k]:
                    untyped[k].append(eid)
                continue
            off = bounds[k][0]
            spans[k].append((r[0] - off, r[-1] + 1 - off, label, eid))
    return spans, untyped


def _turn_drops(cols: _NlpColumns, bounds: list[tuple[int, int]], turn_of: list[int]) -> list[list[list[Any]]]:
    """The dropped (empty) tokens per turn: a dropped token belongs to the turn of the previous token if the
    speaker matches, else the next."""
    words, spk = cols.words, cols.spk
    drops: list[list[list[Any]]] = [[] for _ in bounds]
    for i, s, d in cols.dropped:
        if not bounds:
            break
        k = turn_of[i - 1] if i > 0 and (i == len(words) or spk[i - 1] == s) else turn_of[min(i, len(words) - 1)]
        drops[k].append(d)
    return drops


def parse_nlp(text: str, file_id: str, where: str, tags: dict[str, str] | None) -> list[Transcript]:
    """Parse the text of one ``.nlp`` file into per-turn transcripts (see the module documentation).

    >>> parse_nlp("token|speaker|ts|endTs|punctuation|case|tags|wer_tags\\nok|3||||LC|[]|[]\\n", "f", "f.nlp", None)[0].speaker
    'f_3'
    """
    rows = text.splitlines()
    if not rows or rows[0].strip().split("|") != list(NLP_HEADER):
        raise InputError("the header line is missing or wrong", path=where, line=1, expected=_EXPECTED)
    cols = _nlp_columns(rows, where)
    bounds, turn_of = _turns(cols.spk)
    if tags is None:
        spans: list[list[tuple[int, int, str, str]]] = [[] for _ in bounds]
        untyped: list[list[str]] = [[] for _ in bounds]
    else:
        spans, untyped = _turn_entities(cols, tags, bounds, turn_of)
    drops = _turn_drops(cols, bounds, turn_of)
    out = []
    for k, (a, b) in enumerate(bounds):
        sp = sorted(spans[k], key=lambda x: (x[0], x[1], x[2], natural_key(x[3])))
        meta: dict[str, Any] = {"punctuation": cols.punct[a:b], "case": cols.case[a:b], "tags": cols.tagcol[a:b]}
        if sp:
            meta["entity_ids"] = [x[3] for x in sp]
        if untyped[k]:
            meta["untyped_entity_ids"] = untyped[k]
        if drops[k]:
            meta["dropped"] = drops[k]
        times, raw = _times(cols.ts[a:b], cols.te[a:b])
        if raw:
            meta["ts"], meta["endTs"] = cols.ts[a:b], cols.te[a:b]
        try:
            out.append(Transcript(f"{file_id}_{k:04d}", tuple(cols.words[a:b]), times=times, client=file_id,
                                  speaker=f"{file_id}_{cols.spk[a]}", order=k,
                                  entities=tuple(Span(x[0], x[1], x[2]) for x in sp), meta=meta))
        except InputError as e:
            raise e.at(where) from None
    return out


def _tags_file(nlp: Path) -> Path | None:
    fid = _file_id(nlp.name)
    for cand in (nlp.parent / "wer_tags", nlp.parent.parent / "wer_tags", nlp.parent):
        for name in (f"{fid}.wer_tag.json", f"{fid}.wer_tag.json.gz", f"{fid}.wer_tag.json.xz"):
            if (cand / name).is_file():
                return cand / name
    return None


def read_nlp(path: PathLike, tags: PathLike | None = None) -> list[Transcript]:
    """Read one ``.nlp`` file; ``tags`` is its ``wer_tag.json`` (default: found beside it, else no entities).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.nlp"
    >>> _ = p.write_text("token|speaker|ts|endTs|punctuation|case|tags|wer_tags\\nYes|0||||UC|[]|['0']\\n")
    >>> read_nlp(p)[0].entities
    ()
    """
    p = Path(path)
    tp = Path(tags) if tags is not None else _tags_file(p)
    tmap = parse_wer_tags(read_text(tp), str(tp)) if tp is not None else None
    return parse_nlp(read_text(p), _file_id(p.name), str(p), tmap)


def _folder_nlps(p: Path) -> list[Path]:
    for d in (p, p / "nlp_references"):
        if d.is_dir():
            fs = [q for q in d.iterdir() if q.is_file() and strip_compression(q.name).lower().endswith(".nlp")]
            if fs:
                return sorted(fs, key=lambda q: natural_key(q.name))
    return []


def read_earnings21(path: PathLike) -> list[Transcript]:
    """Read Earnings-21 references from an ``.nlp`` file, a folder, or the references tar archive.

    Calls are read in natural order of their file ids; turns in file order.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> read_earnings21(d)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...: no .nlp files here or in nlp_references/ (expected Earnings-21 .nlp references)
    """
    p = Path(path)
    if p.is_dir():
        files = _folder_nlps(p)
        if not files:
            raise InputError("no .nlp files here or in nlp_references/", path=p,
                             expected="Earnings-21 .nlp references")
        return [t for f in files for t in read_nlp(f)]
    if is_tar(p):
        nlps: dict[str, tuple[str, str]] = {}
        tagmaps: dict[str, dict[str, str]] = {}
        for name, text in iter_tar_texts(p, (".nlp", ".wer_tag.json")):
            where = f"{p}:{name}"
            base = Path(name).name
            if base.endswith(".wer_tag.json"):
                tagmaps[base[: -len(".wer_tag.json")]] = parse_wer_tags(text, where)
            else:
                nlps[_file_id(base)] = (where, text)
        if not nlps:
            raise InputError("the archive has no .nlp members", path=p, expected="nlp_references/<id>.nlp")
        return [t for fid in sorted(nlps, key=natural_key)
                for t in parse_nlp(nlps[fid][1], fid, nlps[fid][0], tagmaps.get(fid))]
    return read_nlp(p)


def call_tokens(transcripts: Iterable[Transcript]) -> dict[str, tuple[str, ...]]:
    """Each call's tokens in order (all turns joined), keyed by call id: the reference for a call's CTM.

    >>> call_tokens([Transcript("c_0000", ("a",), client="c"), Transcript("c_0001", ("b",), client="c")])
    {'c': ('a', 'b')}
    """
    acc: dict[str, list[str]] = {}
    for t in transcripts:
        acc.setdefault(t.client or t.utt_id, []).extend(t.words)
    return {k: tuple(v) for k, v in acc.items()}


def read_speaker_names(path: PathLike) -> dict[str, str]:
    """Read ``speaker-metadata.csv`` (``file_id,speaker_id,speaker_name``) into speaker id -> name.

    Keys are the transcript speaker ids, ``f"{file_id}_{speaker_id}"``.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "s.csv"
    >>> _ = p.write_text("file_id,speaker_id,speaker_name\\n4341191,1,Steve Whitaker\\n")
    >>> read_speaker_names(p)
    {'4341191_1': 'Steve Whitaker'}
    """
    text = read_text(path)
    rows = csv.reader(io.StringIO(text))
    out: dict[str, str] = {}
    header = None
    try:
        for n, row in enumerate(rows, start=1):
            if not row or not any(x.strip() for x in row):
                continue
            if header is None:
                header = [x.strip() for x in row]
                if header[:3] != ["file_id", "speaker_id", "speaker_name"]:
                    raise InputError(f"header is {','.join(header)[:80]!r}", path=path, line=n,
                                     expected="file_id,speaker_id,speaker_name")
                continue
            if len(row) != len(header):
                raise InputError(f"{len(row)} fields", path=path, line=n, expected=f"{len(header)} fields")
            fid, sid, name = (x.strip() for x in row[:3])
            if not fid or not sid or any(c.isspace() for c in fid + sid):
                raise InputError("empty or spaced file or speaker id", path=path, line=n,
                                 expected="file_id,speaker_id,speaker_name")
            key = f"{fid}_{sid}"
            if key in out:
                raise InputError(f"speaker {key} listed twice", path=path, line=n, expected="unique rows")
            out[key] = name
    except csv.Error as e:
        raise InputError(f"bad CSV: {e}", path=path, line=rows.line_num, expected="CSV") from None
    if header is None:
        raise InputError("empty file", path=path, expected="file_id,speaker_id,speaker_name")
    return out

