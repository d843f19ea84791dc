"""NIST ``trn`` transcripts (sclite's ``trn`` format): one utterance per line, ``words (id)``.

The utterance id is the text inside the **final** pair of parentheses, which must close the line (trailing
whitespace is ignored); everything before the ``(`` is the word sequence, split on whitespace. An empty
hypothesis is the line `` (id)``. Blank lines and lines starting with ``;;`` (sclite comments) are skipped.

sclite's markup (its documentation of the trn format): alternations ``{ um / uh / @ }``, the null word ``@`` and
optionally deletable words ``(um)`` are read only where privasr scores or counts transcripts as sclite does
(``privasr score``, ``privasr data inspect``), inside :func:`reading_markup`; there the tokens are kept as written
(:mod:`privasr.metrics.sclite` interprets them) and malformed alternations are refused at their line. Everywhere
else (training text, rescoring references, conversions) a line with markup is an error naming the line: its
words are not plain words.

Speakers follow sclite's ``-i spu_id`` convention: the speaker is the text of the id before the first
``-`` or ``_`` (:func:`spu_id`), e.g. ``(1688-1688-142285-0000)`` -> ``1688``. An id without either
character (or starting with one) is its own speaker. Each transcript's ``order`` is its line number.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "hyp.trn"
>>> write_trn(p, [Transcript("spk1-u1", ("hello", "world")), Transcript("spk1-u2", ())])
>>> print(p.read_text(), end="")
hello world (spk1-u1)
 (spk1-u2)
>>> [(t.utt_id, t.words, t.speaker, t.order) for t in read_trn(p)]
[('spk1-u1', ('hello', 'world'), 'spk1', 1), ('spk1-u2', (), 'spk1', 2)]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from privasr.corpus.markup import check_markup, markup_tokens
from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["read_trn", "write_trn", "parse_trn_line", "spu_id", "looks_like_trn", "reading_markup"]

_SPK_SPLIT = re.compile(r"[-_]")
_MARKUP = ContextVar("privasr_trn_markup", default=False)


@contextmanager
def reading_markup() -> Iterator[None]:
    """Within this block, the trn reader keeps sclite's markup tokens instead of refusing them.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "ref.trn"
    >>> _ = p.write_text("i've { um / @ } (so) far (s1-1)\\n")
    >>> with reading_markup():
    ...     print(read_trn(p)[0].words)
    ("i've", '{', 'um', '/', '@', '}', '(so)', 'far')
    >>> read_trn(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...ref.trn:1: sclite markup '{', '@', '}', '(so)': its words are not plain words; only privasr score and privasr data inspect read it (expected plain words here, or score the file with privasr score)
    """
    token = _MARKUP.set(True)
    try:
        yield
    finally:
        _MARKUP.reset(token)


def _check_markup(words: tuple[str, ...]) -> None:
    """Markup is well formed (inside :func:`reading_markup`) or absent (outside it)."""
    found = markup_tokens(words)
    if not found and not any("(" in w or ")" in w for w in words):
        return
    if not _MARKUP.get():
        shown = ", ".join(repr(w) for w in dict.fromkeys(found or [w for w in words if "(" in w or ")" in w]))
        raise InputError(f"sclite markup {shown[:80]}: its words are not plain words; only privasr score and "
                         "privasr data inspect read it", expected="plain words here, or score the file with privasr score")
    check_markup(words)


def spu_id(utt_id: str) -> str:
    """The speaker of an utterance id, as sclite's ``-i spu_id``: the text before the first ``-`` or ``_``.

    >>> spu_id("1688-1688-142285-0000"), spu_id("spk2_utt03"), spu_id("lonely"), spu_id("-x")
    ('1688', 'spk2', 'lonely', '-x')
    """
    head = _SPK_SPLIT.split(utt_id, maxsplit=1)[0]
    return head if head.strip() else utt_id


def parse_trn_line(line: str) -> tuple[tuple[str, ...], str]:
    """Split one trn line into ``(words, utt_id)``; raises :class:`InputError` (without location) if malformed.

    >>> parse_trn_line("a b (spk1-u1)")
    (('a', 'b'), 'spk1-u1')
    >>> parse_trn_line("a b")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: no utterance id: the line does not end with '(id)' (expected 'words (id)')
    """
    s = line.rstrip()
    if not s.endswith(")"):
        raise InputError("no utterance id: the line does not end with '(id)'", expected="'words (id)'")
    start = s.rfind("(")
    if start < 0:
        raise InputError("no '(' before the final ')'", expected="'words (id)'")
    utt_id = s[start + 1 : -1]
    if not utt_id.strip() or any(c.isspace() or c in "()" for c in utt_id):
        raise InputError(f"invalid utterance id {utt_id!r}",
                         expected="a non-empty id without spaces or parentheses inside '( )'")
    words = tuple(split_words(s[:start]))
    _check_markup(words)
    return words, utt_id


def looks_like_trn(line: str) -> bool:
    """Whether a line has trn shape (ends with ``(id)``), used for format auto-detection.

    >>> looks_like_trn("a b (u1)"), looks_like_trn("u1 a b")
    (True, False)
    """
    try:
        parse_trn_line(line)
    except InputError:
        return False
    return True


def read_trn(path: PathLike) -> list[Transcript]:
    """Read a trn file into :class:`Transcript` records (utt_id, words, speaker = :func:`spu_id`, order = line).

    Raises :class:`InputError` naming the file and line for a malformed line or a duplicate id.
    """
    out: list[Transcript] = []
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        if not line.strip() or line.lstrip().startswith(";;"):
            continue
        try:
            words, utt_id = parse_trn_line(line)
            if utt_id in seen:
                raise InputError(f"duplicate utterance id {utt_id!r} (first on line {seen[utt_id]})",
                                 expected="unique ids")
            seen[utt_id] = n
            out.append(Transcript(utt_id, words, speaker=spu_id(utt_id), order=n))
        except InputError as e:
            raise e.at(path, n) from None
    return out


def write_trn(path: PathLike, transcripts: Iterable[Transcript]) -> None:
    """Write transcripts as trn lines ``words (id)`` (an empty one as `` (id)``), compressing by suffix.

    Raises :class:`InputError` for an id that cannot be written (spaces or parentheses) or a duplicate id.
    """
    lines = []
    seen: set[str] = set()
    for k, t in enumerate(transcripts, start=1):
        if any(c.isspace() or c in "()" for c in t.utt_id):
            raise InputError(f"utterance id {t.utt_id!r} cannot be written to trn", path=path, line=k,
                             expected="ids without spaces or parentheses")
        if t.utt_id in seen:
            raise InputError(f"duplicate utterance id {t.utt_id!r}", path=path, line=k, expected="unique ids")
        if any("(" in w or ")" in w for w in t.words):
            raise InputError(f"utterance {t.utt_id}: a word contains a parenthesis", path=path, line=k,
                             expected="words without parentheses")
        seen.add(t.utt_id)
        lines.append(f"{' '.join(t.words)} ({t.utt_id})\n")
    with open_write_text(path) as f:
        f.writelines(lines)
