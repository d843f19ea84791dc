"""Opening text files the way readers need: compressed or not, decoded strictly, errors located.

Byte-level conventions, the same for every reader: UTF-8 only (a line that is not valid UTF-8 is an error naming
the line and the byte); a UTF-8 byte-order mark at the start of a file is dropped (editors on Windows write one;
sclite and Kaldi would glue it to the first word or id); a UTF-16 or UTF-32 file (recognised by its byte-order
mark or its NUL bytes) is refused with the command that converts it; ``\r\n`` line ends are read as ``\n``.
Words are split on ASCII whitespace only (:func:`split_words`, as sclite, Kaldi, SRILM and KenLM do), so a
no-break or zero-width space stays inside a token, where :func:`privasr.corpus.records.check_words` refuses it
by name.

>>> import tempfile, pathlib, gzip
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> p = d / "a.txt.gz"
>>> with gzip.open(p, "wt", encoding="utf-8") as f:
...     _ = f.write("one\\ntwo\\n")
>>> list(iter_lines(p))
[(1, 'one'), (2, 'two')]
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from privasr.errors import InputError

__all__ = ["open_text", "iter_lines", "read_text", "read_bytes", "open_write_text", "split_words", "PathLike",
           "BOM"]

PathLike = str | os.PathLike[str]

_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}

BOM = "\ufeff"
"""The byte-order mark (U+FEFF); at the start of a file it is dropped, anywhere else refused as a word character."""

_UTF16_32 = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
             (b"\xff\xfe", "UTF-16"))
_ASCII_WS = re.compile(r"[ \t\n\r\f\v]+")


def split_words(text: str) -> list[str]:
    """Split on ASCII whitespace only (space, tab, newline, CR, form feed, vertical tab), as sclite, Kaldi and KenLM.

    Python's ``str.split()`` also splits on no-break and other Unicode spaces, which those tools keep inside a
    word; here they stay in the token, so that :func:`~privasr.corpus.records.check_words` names them.

    >>> split_words(" a\tb  c\u00a0d ")
    ['a', 'b', 'c\xa0d']
    """
    if text.isascii():
        return text.split()
    return [t for t in _ASCII_WS.split(text) if t]


def _encoding_problem(head: bytes) -> str | None:
    """Why the first bytes of a file show it is not UTF-8 text (a UTF-16/32 byte-order mark or NUL bytes)."""
    for bom, name in _UTF16_32:
        if head.startswith(bom):
            return f"the file is {name} text (it starts with a {name} byte-order mark)"
    if b"\x00" in head[:2]:
        return "the file has NUL bytes (UTF-16 or UTF-32 text without a byte-order mark, or binary data)"
    return None


def _refuse_encoding(p: Path, head: bytes) -> None:
    why = _encoding_problem(head)
    if why is not None:
        raise InputError(why, path=p, line=1, expected="UTF-8 text (convert it with: iconv -f UTF-16 -t UTF-8 "
                                                       "FILE > FILE.utf8)")


def _raw_open(path: Path, mode: str) -> IO[bytes]:
    opener = _OPENERS.get(path.suffix.lower())
    return opener(path, mode) if opener else open(path, mode)  # type: ignore[return-value]


def open_text(path: PathLike) -> IO[str]:
    """Open ``path`` for reading text (UTF-8, strict), decompressing ``.gz``/``.xz``/``.bz2``.

    Raises :class:`InputError` if the file is missing or is not a file.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=p)
    if not p.is_file():
        raise InputError("not a regular file", path=p, expected="a file")
    try:
        raw = _raw_open(p, "rb")
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror or e}", path=p) from None
    try:
        _refuse_encoding(p, raw.peek(4)[:4] if hasattr(raw, "peek") else b"")
    except (InputError, OSError, EOFError, lzma.LZMAError, zlib.error) as e:
        raw.close()
        if isinstance(e, InputError):
            raise
        raise InputError(f"cannot read: {e}", path=p, expected="an intact (possibly compressed) text file") from None
    return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="strict", newline=None)


def iter_lines(path: PathLike) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` pairs (1-based, newline stripped) of a text file.

    Lines are decoded one at a time, so a decoding or decompression problem becomes an
    :class:`InputError` naming exactly the line where it happened.
    """
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path=p)
    if not p.is_file():
        raise InputError("not a regular file", path=p, expected="a file")
    n = 0
    try:
        raw = _raw_open(p, "rb")
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror or e}", path=p) from None
    with raw:
        try:
            for n, bline in enumerate(raw, start=1):  # noqa: B007 - n is used after the loop on error
                if n == 1:
                    _refuse_encoding(p, bline[:4])
                    if bline.startswith(b"\xef\xbb\xbf"):
                        bline = bline[3:]
                try:
                    line = bline.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"invalid UTF-8 at byte {e.start} of the line "
                                     f"(0x{bline[e.start]:02x} in {bline[max(0, e.start - 12):e.start + 12]!r})",
                                     path=p, line=n, expected="UTF-8 text; a Latin-1 or Windows-1252 file converts "
                                                              "with: iconv -f CP1252 -t UTF-8 FILE > FILE.utf8") from None
                yield n, line.rstrip("\r\n")
        except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as e:
            if isinstance(e, InputError):
                raise
            raise InputError(f"cannot read: {e}", path=p, line=n + 1,
                             expected="an intact (possibly compressed) text file") from None


def read_text(path: PathLike) -> str:
    """Read a whole text file (decompressing as needed), with errors as :class:`InputError`."""
    with open_text(path) as f:
        try:
            return f.read()
        except UnicodeDecodeError as e:
            raise InputError(f"the file is not valid UTF-8 text (byte {e.start})", path=path,
                             expected="UTF-8 text") from None
        except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as e:
            raise InputError(f"cannot read: {e}", path=path,
                             expected="an intact (possibly compressed) text file") from None


def read_bytes(path: PathLike) -> bytes:
    """All bytes of a (possibly ``.gz``/``.xz``/``.bz2``-compressed) file, errors as :class:`InputError`."""
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file" if not p.exists() else "not a regular file", path=p)
    try:
        with _raw_open(p, "rb") as f:
            return f.read()
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as e:
        raise InputError(f"cannot read: {e}", path=p, expected="an intact (possibly compressed) file") from None


def open_write_text(path: PathLike) -> IO[str]:
    """Open ``path`` for writing UTF-8 text, compressing by suffix; parent folders are created."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    return io.TextIOWrapper(_raw_open(p, "wb"), encoding="utf-8", newline="\n")
