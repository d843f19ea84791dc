"""The model bundle: what the operator publishes to devices, as arrays and one JSON of settings, never code.

A bundle is a folder of three files:

================  ===========================================================================================
``arrays.npz``    every array (the background unigram, the NNLM's weights, ...), read with
                  ``allow_pickle=False``: object arrays are refused
``settings.json`` the settings (algorithm, rescoring weights, vocabulary, DP and SecAgg settings), strict JSON
``manifest.json`` ``{"format": "privasr-bundle", "version": 1, "kind": ..., "files": {name: sha256}}``
================  ===========================================================================================

The bundle's *hash* is the SHA-256 of ``manifest.json``; the manifest holds the SHA-256 of the other two files,
so the one hash pins every byte. A device is given that hash out of band (with its credentials) and
:func:`read_bundle` refuses a bundle whose hash, file hashes, format or version differ, with one
:class:`~privasr.errors.InputError` naming the file. Nothing in a bundle is executed or unpickled.

>>> import tempfile, numpy as np
>>> d = tempfile.mkdtemp()
>>> h = write_bundle(d + "/b", "demo", {"alpha": 0.5}, {"u": np.full(4, 0.25)})
>>> b = read_bundle(d + "/b", expected=h)
>>> b.kind, b.settings["alpha"], b.arrays["u"].tolist()
('demo', 0.5, [0.25, 0.25, 0.25, 0.25])
>>> try:
...     read_bundle(d + "/b", expected="0" * 64)
... except InputError as e:
...     print(e.message.split(",")[1].strip(), "|", e.expected)
not the 0000000000000000... this device was given | the bundle the operator published
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["Bundle", "write_bundle", "read_bundle", "bundle_hash", "build_model", "BUNDLE_FORMAT",
           "BUNDLE_VERSION", "BUNDLE_FILES"]

BUNDLE_FORMAT = "privasr-bundle"
BUNDLE_VERSION = 1
BUNDLE_FILES = ("arrays.npz", "settings.json", "manifest.json")


@dataclass(frozen=True)
class Bundle:
    """A read bundle.

    Attributes:
        kind: what it is for (``"fmp"``, ...).
        settings: the parsed ``settings.json``.
        arrays: name -> read-only numpy array.
        hash: the SHA-256 of ``manifest.json`` (hex).
        folder: where it was read from.
    """

    kind: str
    settings: dict[str, Any]
    arrays: dict[str, np.ndarray]
    hash: str
    folder: Path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _strict_json(obj: Any) -> bytes:
    try:
        return (json.dumps(obj, indent=1, sort_keys=True, allow_nan=False, ensure_ascii=False) + "\n").encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"bundle settings are not strict JSON ({e})", expected="numbers, strings, lists, dicts") \
            from None


def write_bundle(folder: str | os.PathLike[str], kind: str, settings: Mapping[str, Any],
                 arrays: Mapping[str, np.ndarray]) -> str:
    """Write a bundle into the new folder ``folder``; its hash (the SHA-256 of ``manifest.json``).

    Args:
        folder: a folder that does not exist or is empty.
        kind: what the bundle is for (a non-empty string).
        settings: strict-JSON settings (no NaN or infinity).
        arrays: numeric or boolean arrays (no object or string arrays).

    Raises:
        ConfigError: a non-empty folder, settings that are not strict JSON, a non-numeric array.
    """
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not an empty folder", expected="a new folder for the bundle")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"bundle kind {kind!r}", expected="a non-empty string")
    clean = {}
    for name, a in arrays.items():
        arr = np.ascontiguousarray(a)
        if arr.dtype.kind not in "biuf":
            raise ConfigError(f"bundle array {name!r} has dtype {arr.dtype}", expected="a numeric or boolean array")
        clean[str(name)] = arr
    buf = io.BytesIO()
    np.savez(buf, **clean)
    blobs = {"arrays.npz": buf.getvalue(), "settings.json": _strict_json(dict(settings))}
    manifest = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "kind": kind,
                "files": {k: _sha256(v) for k, v in blobs.items()}}
    blobs["manifest.json"] = _strict_json(manifest)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in blobs.items():
        tmp = out / f".{name}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
    return _sha256(blobs["manifest.json"])


def bundle_hash(folder: str | os.PathLike[str]) -> str:
    """The hash of the bundle in ``folder`` (the SHA-256 of its ``manifest.json``).

    Raises:
        InputError: no readable ``manifest.json``.
    """
    p = Path(folder) / "manifest.json"
    try:
        return _sha256(p.read_bytes())
    except OSError as e:
        raise InputError(f"cannot read the bundle manifest ({e.strerror})", path=p,
                         expected="a bundle written by `privasr serve`") from None


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not strict JSON")


def read_bundle(folder: str | os.PathLike[str], *, expected: str | None = None) -> Bundle:
    """Read and check the bundle in ``folder``.

    Args:
        folder: the bundle's folder.
        expected: the hash the device was given; ``None`` only checks the manifest's own file hashes.

    Raises:
        InputError: naming the file: a missing file, a hash other than ``expected``, an unknown format or
            version, a file whose SHA-256 differs from the manifest's, settings that are not strict JSON, an
            archive member that is not a plain numeric array (nothing is ever unpickled).
    """
    root = Path(folder)
    mpath = root / "manifest.json"
    try:
        mbytes = mpath.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read the bundle manifest ({e.strerror})", path=mpath,
                         expected="a bundle written by `privasr serve`") from None
    digest = _sha256(mbytes)
    if expected is not None and digest != expected:
        raise InputError(f"the bundle's hash is {digest[:16]}..., not the {str(expected)[:16]}... this device was "
                         "given", path=mpath, expected="the bundle the operator published")
    try:
        manifest = json.loads(mbytes, parse_constant=_no_constants)
    except ValueError as e:
        raise InputError(f"not a bundle manifest ({e})", path=mpath) from None
    if not isinstance(manifest, dict) or manifest.get("format") != BUNDLE_FORMAT:
        raise InputError("not a privasr bundle manifest", path=mpath, expected=f"'format': '{BUNDLE_FORMAT}'")
    if manifest.get("version") != BUNDLE_VERSION:
        raise InputError(f"bundle format version {manifest.get('version')!r} is not supported", path=mpath,
                         expected=f"version {BUNDLE_VERSION} (this privasr); update privasr or the bundle")
    files = manifest.get("files")
    kind = manifest.get("kind")
    if not isinstance(files, dict) or set(files) != {"arrays.npz", "settings.json"} or not isinstance(kind, str):
        raise InputError("the manifest's 'files' or 'kind' entry is malformed", path=mpath,
                         expected="files: {arrays.npz: sha256, settings.json: sha256}, kind: a string")
    blobs = {}
    for name, want in files.items():
        p = root / name
        try:
            data = p.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read ({e.strerror})", path=p, expected="the bundle's file") from None
        if _sha256(data) != want:
            raise InputError("the file's SHA-256 differs from the bundle manifest's", path=p,
                             expected="the file as the operator published it")
        blobs[name] = data
    try:
        settings = json.loads(blobs["settings.json"], parse_constant=_no_constants)
    except ValueError as e:
        raise InputError(f"not strict JSON ({e})", path=root / "settings.json") from None
    if not isinstance(settings, dict):
        raise InputError("the settings are not a JSON object", path=root / "settings.json")
    return Bundle(kind, settings, _read_arrays(root / "arrays.npz", blobs["arrays.npz"]), digest, root)


def _read_arrays(path: Path, data: bytes) -> dict[str, np.ndarray]:
    out = {}
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            for name in z.files:
                a = z[name]
                if a.dtype.kind not in "biuf":
                    raise InputError(f"array {name!r} has dtype {a.dtype}", path=path,
                                     expected="numeric or boolean arrays")
                a.setflags(write=False)
                out[name] = a
    except InputError:
        raise
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise InputError(f"not a readable array archive ({type(e).__name__}: {e})", path=path,
                         expected="an .npz of plain arrays (no pickled objects)") from None
    return out


def build_model(folder: str | os.PathLike[str] | Bundle, expected: str | None, kind: str, what: str,
                build: Callable[[Bundle], Any]) -> Any:
    """Read and check the bundle in ``folder`` (:func:`read_bundle`; a :class:`Bundle` already read is taken as it
    is), then ``build(bundle)``: a device's model of ``kind`` (``what`` names it in errors).

    Raises:
        InputError: a bundle of another kind, or settings and arrays that do not make the model (naming
            ``settings.json``), besides :func:`read_bundle`'s errors.
    """
    from privasr.errors import ConfigError

    b = folder if isinstance(folder, Bundle) else read_bundle(folder, expected=expected)
    if b.kind != kind:
        raise InputError(f"a {b.kind!r} bundle", path=b.folder / "manifest.json", expected=f"{what}'s bundle")
    where = b.folder / "settings.json"
    try:
        return build(b)
    except InputError as e:
        raise InputError(f"the bundle does not make {what}'s model: {e.message}", path=where,
                         expected=e.expected) from None
    except (ConfigError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"the bundle does not make {what}'s model ({type(e).__name__}: {e})"[:400], path=where,
                         expected=f"a bundle written by `privasr serve {kind}` with this privasr") from None


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite real number (not a bool)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
