"""Helpers shared by the format tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from privasr.errors import InputError


def expect_error(reader: Callable[[Path], Any], path: Path, line: int | None, *needles: str) -> InputError:
    """Assert that ``reader(path)`` raises InputError located at ``path``/``line`` mentioning ``needles``."""
    with pytest.raises(InputError) as info:
        reader(path)
    err = info.value
    assert err.path is not None and str(path) in err.path, str(err)
    assert err.line == line, str(err)
    for n in needles:
        assert n in str(err), str(err)
    return err
