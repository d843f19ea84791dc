"""The ``results.json`` every run writes: config, seed, version, data fingerprints and metrics, and (run from a git
checkout) the commit of the code that produced them.

>>> import tempfile, json, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> p = write_results(out, config={"n": 1}, seed=3, metrics={"wer": 0.25})
>>> d = json.loads(p.read_text())
>>> d["seed"], d["metrics"]["wer"], sorted(set(d) - {"source"})
(3, 0.25, ['config', 'data', 'metrics', 'packages', 'platform', 'python', 'seed', 'version'])
>>> "numpy" in d["packages"]
True
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privasr import __version__

__all__ = ["fingerprint", "write_results", "to_jsonable", "source_revision", "package_versions", "PACKAGES"]

#: The installed libraries whose arithmetic a figure can depend on (their versions go into every results.json):
#: a new scikit-learn or torch can move a figure as a code change can (docs/results.md, "The drift check").
PACKAGES = ("numpy", "scipy", "torch", "scikit-learn", "dp-accounting", "flwr", "jiwer", "spacy", "onnxruntime",
            "ctranslate2", "faster-whisper", "kenlm")


@functools.cache
def source_revision() -> dict[str, Any] | None:
    """``{"commit": SHA, "dirty": bool}``: the git commit of the source tree privasr runs from and whether its
    tracked files differ from it; ``None`` for an installed package (no ``.git`` beside ``src/``) or without git.

    Pinned at the first call: the command line calls it as it starts, so a run that takes an hour records the code
    it started with, not a commit made meanwhile. :func:`write_results` records it as ``source``.

    >>> r = source_revision()
    >>> r is None or (len(r["commit"]) == 40 and isinstance(r["dirty"], bool))
    True
    """
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip()

        head = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head, "dirty": dirty} if len(head) == 40 else None


@functools.cache
def package_versions() -> dict[str, str]:
    """The installed version of each of :data:`PACKAGES` (from the distributions' metadata, without importing
    them; one not installed is left out).

    >>> package_versions()["numpy"].split(".")[0].isdigit()
    True
    """
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def fingerprint(path: str | Path) -> dict[str, Any]:
    """A content fingerprint of a file (sha256) or folder (sha256 over its files' names and hashes).

    >>> import tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "a.txt"
    >>> _ = f.write_text("hi")
    >>> fingerprint(f)["sha256"][:12]
    '8f434346648f'
    """
    p = Path(path)
    if p.is_file():
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return {"path": str(p), "bytes": p.stat().st_size, "sha256": h.hexdigest()}
    if p.is_dir():
        h = hashlib.sha256()
        size = 0
        for child in sorted(q for q in p.rglob("*") if q.is_file()):
            sub = fingerprint(child)
            size += sub["bytes"]
            h.update(f"{child.relative_to(p)}\0{sub['sha256']}\n".encode())
        return {"path": str(p), "bytes": size, "sha256": h.hexdigest()}
    return {"path": str(p), "missing": True}


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays, paths, mappings, tuples and non-finite floats into strict JSON values."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "tolist"):  # numpy
        return to_jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_results(
    out_dir: str | Path,
    *,
    config: Mapping[str, Any],
    seed: int | None,
    metrics: Mapping[str, Any],
    data: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    filename: str = "results.json",
    runner: str | None = None,
) -> Path:
    """Write ``out_dir/results.json`` with ``runner``, ``config``, ``seed``, ``version``, ``source`` (the code's
    commit, :func:`source_revision`, when known), ``python``, ``platform`` and ``packages`` (the numerical
    libraries' versions, :func:`package_versions`), ``data`` and ``metrics``.

    ``data`` maps a name to a path (fingerprinted here) or to an already computed fingerprint; ``runner`` names
    what wrote the run (``fmp``, ``fedlm``, ``rescore``, ...: ``privasr report`` overlays runs of one runner).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fps = {k: (fingerprint(v) if isinstance(v, str | Path) else v) for k, v in (data or {}).items()}
    payload = {
        **({"runner": runner} if runner is not None else {}),
        "config": to_jsonable(config),
        "seed": seed,
        "version": __version__,
        **({"source": src} if (src := source_revision()) is not None else {}),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "data": to_jsonable(fps),
        "metrics": to_jsonable(metrics),
        **to_jsonable(extra or {}),
    }
    path = out / filename
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, allow_nan=False) + "\n", encoding="utf-8")
    return path
