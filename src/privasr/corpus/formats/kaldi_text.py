"""Kaldi ``text`` files: one utterance per line, ``utt_id w1 w2 ...``.

Fields are separated by whitespace; an utterance with no words (a line holding only the id) is allowed.
Blank lines are skipped. Each transcript's ``order`` is its line number; the speaker is not encoded in
the file (Kaldi keeps it in ``utt2spk``), so it is left unset.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "text"
>>> write_kaldi_text(p, [Transcript("u1", ("hello", "world")), Transcript("u2", ())])
>>> print(p.read_text(), end="")
u1 hello world
u2
>>> [(t.utt_id, t.words, t.order) for t in read_kaldi_text(p)]
[('u1', ('hello', 'world'), 1), ('u2', (), 2)]
"""

from __future__ import annotations

from collections.abc import Iterable

from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines, open_write_text
from privasr.errors import InputError

__all__ = ["read_kaldi_text", "write_kaldi_text"]


def read_kaldi_text(path: PathLike) -> list[Transcript]:
    """Read a Kaldi ``text`` file into :class:`Transcript` records.

    Raises :class:`InputError` naming the file and line for a duplicate id or an unreadable line.
    """
    out: list[Transcript] = []
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        fields = line.split()
        if not fields:
            continue
        utt_id, words = fields[0], tuple(fields[1:])
        try:
            if utt_id in seen:
                raise InputError(f"duplicate utterance id {utt_id!r} (first on line {seen[utt_id]})",
                                 expected="unique ids")
            seen[utt_id] = n
            out.append(Transcript(utt_id, words, order=n))
        except InputError as e:
            raise e.at(path, n) from None
    return out


def write_kaldi_text(path: PathLike, transcripts: Iterable[Transcript]) -> None:
    """Write transcripts as ``utt_id w1 w2 ...`` lines (compressing by suffix).

    Raises :class:`InputError` for an id containing whitespace or a duplicate id.
    """
    lines = []
    seen: set[str] = set()
    for k, t in enumerate(transcripts, start=1):
        if any(c.isspace() for c in t.utt_id):
            raise InputError(f"utterance id {t.utt_id!r} contains whitespace", path=path, line=k,
                             expected="ids without whitespace")
        if t.utt_id in seen:
            raise InputError(f"duplicate utterance id {t.utt_id!r}", path=path, line=k, expected="unique ids")
        seen.add(t.utt_id)
        lines.append(" ".join((t.utt_id, *t.words)) + "\n")
    with open_write_text(path) as f:
        f.writelines(lines)
