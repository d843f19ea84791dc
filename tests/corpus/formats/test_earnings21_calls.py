from __future__ import annotations

from pathlib import Path

import pytest

from privasr.corpus.formats.earnings21_calls import read_call_ids
from privasr.errors import InputError


def test_read_call_ids(tmp_path: Path) -> None:
    p = tmp_path / "eval.csv"
    p.write_text("file_id,company_name\n4320211,Monro\n 4341191 ,Kelly\n")
    assert read_call_ids(p) == ["4320211", "4341191"]


@pytest.mark.parametrize(("text", "needle", "line"), [
    ("id,name\n1,x\n", "no file_id column", 1),
    ("file_id,name\n1,x\n,y\n", "empty file_id", 3),
    ("file_id,name\n", "the call list is empty", None),
])
def test_read_call_ids_errors(tmp_path: Path, text: str, needle: str, line: int | None) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(InputError, match=needle) as e:
        read_call_ids(p)
    assert e.value.line == line


def test_read_call_ids_unreadable(tmp_path: Path) -> None:
    p = tmp_path / "bin.csv"
    p.write_bytes(b"file_id\n\xff\xfe\n")
    with pytest.raises(InputError, match="cannot read the call list"):
        read_call_ids(p)
