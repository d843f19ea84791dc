"""Where the real evaluation data and golden outputs are, when they are present.

They are never part of the repository: they live beside it in ``../shared`` (``data/`` and ``golden/``).
``$PRIVASR_DATA`` points at another data folder; ``$PRIVASR_SHARED`` at another shared folder. Functions
return ``None`` when the folder is absent, so callers can skip or fall back to generated data.

>>> p = data_dir()
>>> p is None or p.is_dir()
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["shared_dir", "data_dir", "golden_dir"]


def shared_dir() -> Path | None:
    """``$PRIVASR_SHARED``, else ``../shared`` of the source checkout, else ``./../shared``."""
    env = os.environ.get("PRIVASR_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[3] / "shared", Path.cwd().parent / "shared"]
    for c in candidates:
        if c.is_dir():
            return c
    return None


def data_dir() -> Path | None:
    """``$PRIVASR_DATA``, else ``<shared>/data``."""
    env = os.environ.get("PRIVASR_DATA")
    if env:
        return Path(env) if Path(env).is_dir() else None
    s = shared_dir()
    return s / "data" if s is not None and (s / "data").is_dir() else None


def golden_dir() -> Path | None:
    """``<shared>/golden``."""
    s = shared_dir()
    return s / "golden" if s is not None and (s / "golden").is_dir() else None
