"""Opening text files the way readers need: compressed or not, decoded strictly, errors located.

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
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from privasr.errors import InputError

__all__ = ["open_text", "iter_lines", "read_text", "read_bytes", "open_write_text", "PathLike"]

PathLike = str | os.PathLike[str]

_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


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
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None)


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
                try:
                    line = bline.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"invalid UTF-8 at byte {e.start} of the line", path=p, line=n,
                                     expected="UTF-8 text") from None
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
