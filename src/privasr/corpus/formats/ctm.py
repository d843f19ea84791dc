"""CTM (time-marked conversation) files: one recognised word per line, with times and confidences.

Line format (whitespace-separated; ``;;`` starts a comment line; blank lines are skipped)::

    <recording> <channel> <start> <duration> <word> [<confidence>]

e.g. ``4320211 A 3.24 0.15 good 1.00``. Each (recording, channel) becomes one
:class:`~privasr.corpus.records.Transcript` (in order of first appearance, words in file order) with
``times`` = ``(start, start + duration)`` (the end rounded to 9 decimals, i.e. nanoseconds, so that
write/read round trips are exact) and ``confidences`` when the lines have them (a transcript must
have a confidence on all of its lines or on none). ``utt_id`` = the recording id, or
``f"{recording}_{channel}"`` when the recording has several channels; ``client`` = the recording;
``meta["channel"]`` = the channel. With ``split_gap`` set, a transcript is also split wherever the pause
between one word's end and the next word's start exceeds ``split_gap`` seconds: then
``utt_id = f"{base}_{k:04d}"`` and ``order`` = *k*, the segment index within the (recording, channel).

Input may be a ``.ctm`` file (``.gz``/``.xz``/``.bz2`` allowed), a folder of ``*.ctm`` files (sorted by
name), or a tar archive of them (errors then name ``archive.tar.xz:member.ctm:LINE``). A recording may
not be continued in a second file.

:func:`ctm_utterances` reads a CTM with confidences as utterances (split at pauses, lowercased, tokens without
a letter or digit dropped): the client text of the Earnings-21 federated experiments (paper 001).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a.ctm"
>>> _ = p.write_text(";; comment\\nrec1 A 0.5 0.25 hello 0.9\\nrec1 A 0.8 0.2 world 1.00\\n")
>>> t = read_ctm(p)[0]
>>> t.utt_id, t.words, t.times, t.confidences
('rec1', ('hello', 'world'), ((0.5, 0.75), (0.8, 1.0)), (0.9, 1.0))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from privasr.corpus.formats._common import (
    is_tar,
    iter_tar_texts,
    natural_key,
)
from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["read_ctm", "write_ctm", "iter_ctm_files", "parse_ctm_line", "ctm_utterances"]

_EXPECTED = "<recording> <channel> <start> <duration> <word> [<confidence>]"


@dataclass
class _Acc:
    rec: str
    chan: str
    where: str
    words: list[str] = field(default_factory=list)
    times: list[tuple[float, float]] = field(default_factory=list)
    confs: list[float] = field(default_factory=list)
    has_conf: bool | None = None


def _num(s: str, what: str) -> float:
    try:
        x = float(s)
    except ValueError:
        raise InputError(f"{what} {s[:40]!r} is not a number", expected=_EXPECTED) from None
    if not math.isfinite(x) or x < 0:
        raise InputError(f"{what} {s[:40]!r} is invalid", expected="a finite number >= 0")
    return x


def parse_ctm_line(line: str) -> tuple[str, str, float, float, str, float | None]:
    """Parse one CTM line into ``(recording, channel, start, end, word, confidence or None)``.

    >>> parse_ctm_line("r 1 0.10 0.20 hi")
    ('r', '1', 0.1, 0.3, 'hi', None)
    >>> parse_ctm_line("r 1 0.10 x hi")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: duration 'x' is not a number (expected <recording> <channel> <start> <duration> <word> [<confidence>])
    """
    f = split_words(line)
    if len(f) >= 5 and f[4] in ("<ALT_BEGIN>", "<ALT>", "<ALT_END>"):
        raise InputError(f"sclite's CTM alternation tag {f[4]}: privasr reads alternations from trn files only",
                         expected="one word per line; write a reference with alternations as trn "
                                  "('i've { um / uh / @ } as far (id)'), which sclite reads too")
    if len(f) not in (5, 6):
        raise InputError(f"{len(f)} fields", expected=_EXPECTED)
    start = _num(f[2], "start time")
    dur = _num(f[3], "duration")
    end = max(start, round(start + dur, 9))
    if not math.isfinite(end):
        raise InputError("start + duration is out of range", expected="finite times")
    conf = None
    if len(f) == 6:
        conf = _num(f[5], "confidence")
        if conf > 1.0:
            raise InputError(f"confidence {f[5][:40]} is above 1", expected="a confidence in [0, 1]")
    return f[0], f[1], start, end, f[4], conf


def iter_ctm_files(path: PathLike) -> Iterator[tuple[str, Iterator[tuple[int, str]]]]:
    """Yield ``(where, numbered_lines)`` for each CTM file of a file, folder or tar archive.

    ``where`` is the path errors should name (``archive:member`` inside archives).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "b.ctm").write_text("r A 0 1 x\\n")
    >>> [(pathlib.Path(w).name, list(ls)) for w, ls in iter_ctm_files(d)]
    [('b.ctm', [(1, 'r A 0 1 x')])]
    """
    p = Path(path)
    if p.is_dir():
        files = sorted((q for q in p.iterdir() if q.is_file() and ".ctm" in q.name.lower()),
                       key=lambda q: natural_key(q.name))
        if not files:
            raise InputError("the folder has no .ctm files", path=p, expected="*.ctm files")
        for q in files:
            yield str(q), iter_lines(q)
    elif is_tar(p):
        for name, text in iter_tar_texts(p, (".ctm",)):
            yield f"{p}:{name}", enumerate(text.splitlines(), start=1)
    else:
        yield str(p), iter_lines(p)


def read_ctm(path: PathLike, split_gap: float | None = None) -> list[Transcript]:
    """Read CTM word lines into transcripts (see the module documentation for the mapping).

    Args:
        path: a ``.ctm`` file, a folder of them, or a tar archive of them.
        split_gap: if set, split at pauses longer than this many seconds.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "a.ctm"
    >>> _ = p.write_text("r A 0 0.5 a\\nr A 0.5 0.5 b\\nr A 3.0 0.5 c\\n")
    >>> [(t.utt_id, t.words, t.order) for t in read_ctm(p, split_gap=1.0)]
    [('r_0000', ('a', 'b'), 0), ('r_0001', ('c',), 1)]
    """
    if split_gap is not None and (not isinstance(split_gap, int | float) or not split_gap >= 0):
        raise InputError(f"split_gap is {split_gap!r}", expected="a number of seconds >= 0")
    accs: dict[tuple[str, str], _Acc] = {}
    rec_file: dict[str, str] = {}
    for where, numbered in iter_ctm_files(path):
        for n, line in numbered:
            s = line.strip()
            if not s or s.startswith(";;"):
                continue
            try:
                rec, chan, start, end, word, conf = parse_ctm_line(s)
            except InputError as e:
                raise e.at(where, n) from None
            key = (rec, chan)
            acc = accs.get(key)
            if acc is None:
                first = rec_file.setdefault(rec, where)
                if first != where:
                    raise InputError(f"recording {rec!r} already appeared in {first}", path=where, line=n,
                                     expected="each recording in one file")
                acc = accs[key] = _Acc(rec, chan, where)
            elif acc.where != where:
                raise InputError(f"recording {rec!r} already appeared in {acc.where}", path=where, line=n,
                                 expected="each recording in one file")
            if acc.has_conf is None:
                acc.has_conf = conf is not None
            elif acc.has_conf != (conf is not None):
                raise InputError(f"recording {rec!r} channel {chan!r} mixes lines with and without confidence",
                                 path=where, line=n, expected="a confidence on every line or on none")
            acc.words.append(word)
            acc.times.append((start, end))
            if conf is not None:
                acc.confs.append(conf)
    nchan: dict[str, int] = {}
    for rec, _ in accs:
        nchan[rec] = nchan.get(rec, 0) + 1
    out: list[Transcript] = []
    for (rec, chan), acc in accs.items():
        base = rec if nchan[rec] == 1 else f"{rec}_{chan}"
        try:
            out.extend(_transcripts(acc, base, split_gap))
        except InputError as e:
            raise e.at(acc.where) from None
    return out


def _transcripts(acc: _Acc, base: str, split_gap: float | None) -> Iterator[Transcript]:
    confs = acc.confs if acc.has_conf else None
    if split_gap is None:
        yield Transcript(base, tuple(acc.words), confidences=None if confs is None else tuple(confs),
                         times=tuple(acc.times), client=acc.rec, meta={"channel": acc.chan})
        return
    cuts = [0]
    for i in range(1, len(acc.words)):
        if acc.times[i][0] - acc.times[i - 1][1] > split_gap:
            cuts.append(i)
    cuts.append(len(acc.words))
    for k in range(len(cuts) - 1):
        a, b = cuts[k], cuts[k + 1]
        yield Transcript(f"{base}_{k:04d}", tuple(acc.words[a:b]),
                         confidences=None if confs is None else tuple(confs[a:b]),
                         times=tuple(acc.times[a:b]), client=acc.rec, order=k, meta={"channel": acc.chan})


def _fmt(x: float) -> str:
    return repr(float(x))


def write_ctm(path: PathLike, records: Iterable[Transcript], channel: str = "A") -> int:
    """Write transcripts as CTM lines; returns the number of word lines written.

    The recording is ``client`` (or ``utt_id`` when there is none), the channel ``meta["channel"]`` (or
    ``channel``). Every transcript needs word times; confidences are written when present. Times are
    written with full precision; the duration is ``end - start`` rounded to 9 decimals.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "o.ctm"
    >>> recs = [Transcript("r", ("a", "b"), times=((0.0, 0.3), (0.3, 0.45)), confidences=(1.0, 0.5), client="r")]
    >>> write_ctm(p, recs)
    2
    >>> print(p.read_text(), end="")
    r A 0.0 0.3 a 1.0
    r A 0.3 0.15 b 0.5
    >>> read_ctm(p)[0].times == recs[0].times
    True
    """
    n = 0
    with open_write_text(path) as f:
        for t in records:
            if not isinstance(t, Transcript):
                raise InputError(f"record is {type(t).__name__}", path=path, expected="Transcript")
            if t.times is None:
                raise InputError(f"transcript {t.utt_id!r} has no word times", path=path,
                                 expected="word times for CTM output")
            rec = t.client or t.utt_id
            chan = t.meta.get("channel", channel)
            if not isinstance(chan, str) or not chan or any(c.isspace() for c in chan) or any(
                    c.isspace() for c in rec):
                raise InputError(f"transcript {t.utt_id!r}: recording/channel cannot be written", path=path,
                                 expected="ids without whitespace")
            for i, w in enumerate(t.words):
                s, e = t.times[i]
                line = f"{rec} {chan} {_fmt(s)} {_fmt(round(e - s, 9))} {w}"
                if t.confidences is not None:
                    line += f" {_fmt(t.confidences[i])}"
                f.write(line + "\n")
                n += 1
    return n


def ctm_utterances(path: str | Path, split_gap: float) -> list[Any]:
    """CTM words as :class:`~privasr.corpus.records.Transcript` utterances split at pauses > ``split_gap`` s,
    lowercased, tokens without a letter or digit dropped (with their confidences); empty utterances dropped.

    Raises:
        InputError: a CTM without confidences (the per-word weights of paper 001 need them), or a read error.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.ctm"
    >>> _ = p.write_text("c1 A 0.0 0.2 Good 0.9\\nc1 A 0.2 0.1 , 1.0\\nc1 A 0.3 0.2 Day 0.8\\nc1 A 5.0 0.5 Um 0.4\\n")
    >>> [(u.utt_id, u.words, u.confidences) for u in ctm_utterances(p, 1.0)]
    [('c1_0000', ('good', 'day'), (0.9, 0.8)), ('c1_0001', ('um',), (0.4,))]
    """
    out = []
    for t in read_ctm(path, split_gap=split_gap):
        if t.confidences is None:
            raise InputError(f"recording {t.client!r} has no confidences", path=path,
                             expected="<recording> <channel> <start> <duration> <word> <confidence> lines")
        keep = [i for i, w in enumerate(t.words) if any(ch.isalnum() for ch in w)]
        if not keep:
            continue
        out.append(replace(t, words=tuple(t.words[i].lower() for i in keep),
                           confidences=tuple(t.confidences[i] for i in keep),
                           times=None if t.times is None else tuple(t.times[i] for i in keep)))
    return out
