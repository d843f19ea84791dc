"""CMU AN4 transcription files (``etc/an4_train.transcription``): ``[<s>] WORDS [</s>] (utt_id)`` per line.

The utterance id is ``an<number>-<speaker>-b`` (e.g. ``an251-fash-b``; the speaker folder of the features
is ``feat/an4_clstk/fash``). Each line becomes a :class:`~privasr.corpus.records.Transcript` with
``speaker`` = ``client`` = the middle field of the id (the whole id when it has no ``-``), ``order`` =
the line number; ``<s>``/``</s>`` sentence markers are dropped. Blank lines are skipped; duplicate ids and
lines without a final ``(id)`` are errors.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "an4_test.transcription"
>>> _ = p.write_text("<s> ERASE C Q </s> (an407-fcaw-b)\\nYES (an251-fash-b)\\n")
>>> [(t.utt_id, t.words, t.speaker, t.order) for t in read_an4(p)]
[('an407-fcaw-b', ('ERASE', 'C', 'Q'), 'fcaw', 1), ('an251-fash-b', ('YES',), 'fash', 2)]
"""

from __future__ import annotations

import re

from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines, split_words
from privasr.errors import InputError

__all__ = ["read_an4", "an4_speaker", "parse_an4_line", "AN4_ID"]

AN4_ID = re.compile(r"^[A-Za-z]*\d+-[A-Za-z0-9]+-[A-Za-z0-9]+$")
"""The shape of an AN4 utterance id (``an251-fash-b``)."""


def an4_speaker(utt_id: str) -> str:
    """The speaker of an AN4 utterance id: its middle ``-`` field.

    >>> an4_speaker("an251-fash-b"), an4_speaker("x")
    ('fash', 'x')
    """
    parts = utt_id.split("-")
    return parts[1] if len(parts) >= 3 and parts[1] else utt_id


def parse_an4_line(line: str) -> tuple[tuple[str, ...], str]:
    """``(words, utt_id)`` of one transcription line (markers ``<s>``/``</s>`` dropped).

    >>> parse_an4_line("<s> GO </s> (an253-fash-b)")
    (('GO',), 'an253-fash-b')
    """
    s = line.rstrip()
    start = s.rfind("(")
    if not s.endswith(")") or start < 0:
        raise InputError("no utterance id at the end of the line", expected="WORDS (utt_id)")
    utt = s[start + 1 : -1].strip()
    if not utt or any(c.isspace() or c in "()" for c in utt):
        raise InputError(f"invalid utterance id {utt[:40]!r}", expected="WORDS (utt_id)")
    words = tuple(w for w in split_words(s[:start]) if w not in ("<s>", "</s>"))
    return words, utt


def read_an4(path: PathLike) -> list[Transcript]:
    """Read an AN4 ``.transcription`` file into transcripts (see the module documentation).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.transcription"
    >>> _ = p.write_text("YES (an1-a-b)\\nNO\\n")
    >>> read_an4(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x.transcription:2: no utterance id at the end of the line (expected WORDS (utt_id))
    """
    out = []
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        if not line.strip():
            continue
        try:
            words, utt = parse_an4_line(line)
            if utt in seen:
                raise InputError(f"duplicate utterance id {utt!r} (first on line {seen[utt]})",
                                 expected="unique ids")
            seen[utt] = n
            spk = an4_speaker(utt)
            out.append(Transcript(utt, words, client=spk, speaker=spk, order=n))
        except InputError as e:
            raise e.at(path, n) from None
    return out
