"""Earnings-21 call lists: the ``file_id`` column of a metadata CSV (e.g. ``eval10-file-metadata.csv``).

The Earnings-21 experiments hold out the calls such a list names (evaluated on their references) and use the
other calls' CTMs (:func:`~privasr.corpus.formats.ctm.ctm_utterances`) as client text.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from privasr.errors import InputError

__all__ = ["read_call_ids"]


def read_call_ids(path: str | Path) -> list[str]:
    """The ``file_id`` column of an Earnings-21 metadata CSV (e.g. ``eval10-file-metadata.csv``).

    Raises:
        InputError: no ``file_id`` column, or an empty id (naming the line).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "m.csv"
    >>> _ = p.write_text("file_id,company_name\\n4320211,Monro\\n")
    >>> read_call_ids(p)
    ['4320211']
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the call list: {e}", path=p) from None
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "file_id" not in reader.fieldnames:
        raise InputError("no file_id column", path=p, line=1, expected="a CSV header with file_id")
    out = []
    for n, row in enumerate(reader, start=2):
        fid = (row.get("file_id") or "").strip()
        if not fid:
            raise InputError("empty file_id", path=p, line=n, expected="a call id")
        out.append(fid)
    if not out:
        raise InputError("the call list is empty", path=p, expected="at least one call")
    return out
