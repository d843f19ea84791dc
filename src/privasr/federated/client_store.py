"""One client's data as files in a folder of its own, read and written without pickle.

A device in a real federation holds one client's data on its own disk; :func:`split_clients` writes a
population that way (``out/client-0/``, ``out/client-1/``, ...) and a Flower SuperNode started with
``--node-config "privasr-data-dir='out/client-3'"`` reads its client back with :func:`load_client` (see
:mod:`privasr.federated.backends.flower`). A client folder holds two files:

* ``client.npz``: the client as a :func:`~privasr.federated.tree.save_tree` file. The client is first turned
  into a *tagged pytree*: a dataclass becomes ``{"privasr.dataclass": [name, {field: value}]}`` (its ``init``
  fields only; the class is rebuilt from them, so its own checks run again), a numpy scalar
  ``{"privasr.scalar": 0-d array}``; numbers, strings, ``None``, lists, tuples, dicts and numeric arrays stay
  as they are. The arrays are then pooled by dtype (one array per dtype in the file, plus a table of offsets and
  shapes), so a client with thousands of short N-best hypotheses is a handful of arrays, not thousands of
  archive members. Nothing is pickled: the file is read with ``allow_pickle=False``.
* ``manifest.json``: ``{"format", "kind", "index", "privasr", "data", "sha256"}``: the file format, the client's
  type (``"FmpClient"``, ``"FedLmClient"``, ``"FtlClient"`` or ``"pytree"``), its index in the population, the
  privasr version that wrote it and the SHA-256 of ``client.npz``, checked on every load.

Only the dataclasses privasr's algorithms use are allowed, by name (:data:`CLIENT_CLASSES`); a file naming any
other class is refused, never imported. A missing, garbled or tampered folder gives an
:class:`~privasr.errors.InputError` naming the file. Client folders are created with mode 0700.

>>> import numpy as np, tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     folders = split_clients([{"x": np.arange(3.0)}, {"x": np.ones(2)}], Path(d) / "clients")
...     back = load_client(folders[1], index=1)
...     [f.name for f in folders], back["x"].tolist()
(['client-0', 'client-1'], [1.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import InputError
from privasr.federated.tree import flatten, load_tree, save_tree, unflatten

__all__ = ["save_client", "load_client", "split_clients", "CLIENT_CLASSES", "DATA_NAME", "MANIFEST_NAME"]

DATA_NAME = "client.npz"
MANIFEST_NAME = "manifest.json"
_FORMAT = "privasr-client-1"

CLIENT_CLASSES = {
    "FmpClient": "privasr.federated.algorithms.fmp",
    "FmpUtterance": "privasr.federated.algorithms.fmp",
    "FedLmClient": "privasr.federated.algorithms.fedlm",
    "FtlClient": "privasr.federated.algorithms.ftl",
    "Example": "privasr.asr.train",
}
"""The dataclasses a client folder may hold: name -> defining module (nothing else is ever imported)."""

_DATACLASS = "privasr.dataclass"
_SCALAR = "privasr.scalar"
_DICT = "privasr.dict"  # a plain dict whose keys would read as a tag
_TAGS = (_DATACLASS, _SCALAR, _DICT)
_STORABLE = ("FmpClient, FedLmClient, FtlClient, or numbers, strings, None, numeric numpy arrays, lists, tuples "
             "and dicts of them")


class _Garbled(Exception):
    """The data file does not hold what :func:`save_client` writes."""


def _class(name: str) -> type:
    """The allowed dataclass called ``name`` (imported from privasr only; see :data:`CLIENT_CLASSES`)."""
    if name in ("FmpClient", "FmpUtterance"):
        from privasr.federated.algorithms import fmp

        return getattr(fmp, name)  # type: ignore[no-any-return]
    if name == "FedLmClient":
        from privasr.federated.algorithms.fedlm import FedLmClient

        return FedLmClient
    if name == "FtlClient":
        from privasr.federated.algorithms.ftl import FtlClient

        return FtlClient
    if name == "Example":
        from privasr.asr.train import Example

        return Example
    raise _Garbled(f"it names the class {name!r}, which a client folder may not hold")


def _allowed(cls: type) -> str | None:
    """The registry name of ``cls``, if it is one of :data:`CLIENT_CLASSES` (an instance exists, so its module
    is imported already)."""
    name = cls.__qualname__
    if CLIENT_CLASSES.get(name) != cls.__module__:
        return None
    return name if _class(name) is cls else None


# -- the tagged pytree -------------------------------------------------------------------------------------------


def _tag(x: Any, where: str) -> Any:
    """``x`` as a tagged pytree (see the module docstring); :class:`InputError` naming ``where`` otherwise."""
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is np.ndarray:
        if x.dtype.kind not in "biufc":
            raise InputError(f"{where} is an array of dtype {x.dtype}", expected="numeric arrays")
        return x
    if isinstance(x, np.generic) and x.dtype.kind in "biufc":
        return {_SCALAR: np.asarray(x)}
    if t is list:
        return [_tag(v, f"{where}[{i}]") for i, v in enumerate(x)]
    if t is tuple:
        return tuple(_tag(v, f"{where}[{i}]") for i, v in enumerate(x))
    if t is dict:
        for k in x:
            if type(k) not in (str, int):
                raise InputError(f"{where} has a key of type {type(k).__name__}", expected="str or int keys")
        items = {k: _tag(v, f"{where}[{k!r}]") for k, v in x.items()}
        if any(k in _TAGS for k in x):
            return {_DICT: [[k, v] for k, v in items.items()]}
        return items
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        name = _allowed(t)
        if name is not None:
            return {_DATACLASS: [name, {f.name: _tag(getattr(x, f.name), f"{where}.{f.name}")
                                        for f in dataclasses.fields(x) if f.init}]}
    raise InputError(f"{where} is a {t.__module__}.{t.__qualname__}, which privasr cannot store without pickle",
                     expected=_STORABLE)


def _untag(s: Any) -> Any:
    """Inverse of :func:`_tag` (:class:`_Garbled` for what it never writes)."""
    if isinstance(s, dict):
        if len(s) == 1 and next(iter(s)) in _TAGS:
            tag, body = next(iter(s.items()))
            if tag == _SCALAR:
                if not (isinstance(body, np.ndarray) and body.ndim == 0):
                    raise _Garbled("a scalar is not a 0-d array")
                return body[()]
            if tag == _DICT:
                if not (isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body)):
                    raise _Garbled("an escaped dict is not a list of pairs")
                return {k: _untag(v) for k, v in body}
            if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str)
                    and isinstance(body[1], dict)):
                raise _Garbled("a dataclass is not [name, fields]")
            cls = _class(body[0])
            names = sorted(f.name for f in dataclasses.fields(cls) if f.init)
            if sorted(body[1]) != names:
                raise _Garbled(f"a {body[0]} has the fields {sorted(body[1])}, not {names}")
            try:
                return cls(**{k: _untag(v) for k, v in body[1].items()})
            except (InputError, TypeError, ValueError) as e:
                raise _Garbled(f"a {body[0]} is invalid ({e})") from None
        return {k: _untag(v) for k, v in s.items()}
    if isinstance(s, list):
        return [_untag(v) for v in s]
    if isinstance(s, tuple):
        return tuple(_untag(v) for v in s)
    return s


# -- arrays pooled by dtype --------------------------------------------------------------------------------------


def _pool(arrays: list[np.ndarray]) -> dict[str, Any]:
    """The arrays as one flat array per dtype plus, per array, its pool, offset and shape."""
    pools: dict[str, list[np.ndarray]] = {}
    sizes: dict[str, int] = {}
    order: list[str] = []
    pool_of, offset, ndim, dims = [], [], [], []
    for a in arrays:
        key = a.dtype.str
        if key not in pools:
            pools[key], sizes[key] = [], 0
            order.append(key)
        pool_of.append(order.index(key))
        offset.append(sizes[key])
        ndim.append(a.ndim)
        dims.extend(a.shape)
        pools[key].append(a.reshape(-1))
        sizes[key] += a.size
    def ints(v: list[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.int64).reshape(-1)

    # concatenate() makes byte order native: keep each pool's dtype as it was
    return {"pools": [np.concatenate(pools[k]).astype(np.dtype(k), copy=False) for k in order],
            "pool": ints(pool_of), "offset": ints(offset),
            "ndim": ints(ndim), "dims": ints(dims)}


def _unpool(doc: dict[str, Any]) -> list[np.ndarray]:
    """Inverse of :func:`_pool`, checking every index (:class:`_Garbled`)."""
    try:
        pools, pool_of, offset, ndim, dims = (doc[k] for k in ("pools", "pool", "offset", "ndim", "dims"))
    except KeyError as e:
        raise _Garbled(f"no {e.args[0]!r} entry") from None
    if not (isinstance(pools, list) and all(isinstance(p, np.ndarray) and p.ndim == 1 for p in pools)):
        raise _Garbled("the array pools are not 1-d arrays")
    table = (pool_of, offset, ndim, dims)
    if not all(isinstance(t, np.ndarray) and t.ndim == 1 and t.dtype.kind == "i" for t in table):
        raise _Garbled("the array table is not integer vectors")
    if not (len(pool_of) == len(offset) == len(ndim)) or (ndim < 0).any() or (dims < 0).any() \
            or int(ndim.sum()) != len(dims):
        raise _Garbled("the array table is inconsistent")
    out = []
    d = 0
    for p, o, n in zip(pool_of.tolist(), offset.tolist(), ndim.tolist(), strict=True):
        shape = tuple(dims[d:d + n].tolist())
        d += n
        size = int(np.prod(shape, dtype=np.int64))
        if not (0 <= p < len(pools) and 0 <= o and o + size <= pools[p].size):
            raise _Garbled("an array lies outside its pool")
        out.append(pools[p][o:o + size].reshape(shape))
    return out


# -- folders -----------------------------------------------------------------------------------------------------


def _new_folder(folder: Path, what: str) -> bool:
    """Refuse an existing non-empty ``folder``; create it (mode 0700) if needed. Whether it was created."""
    if folder.exists():
        if not folder.is_dir() or any(folder.iterdir()):
            raise InputError(f"the {what} exists and is not empty", path=folder,
                             expected="a new or empty folder (client data is never overwritten)")
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.mkdir(mode=0o700)
    return True


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def save_client(folder: str | os.PathLike[str], client: Any, index: int) -> Path:
    """Write ``client`` (client ``index`` of its population) into the new or empty ``folder``; return it.

    Raises:
        InputError: ``folder`` exists and is not empty, or ``client`` holds something that cannot be stored
            without pickle (naming where in the client).

    >>> import tempfile
    >>> from privasr.federated.algorithms import FmpClient, FmpUtterance
    >>> client = FmpClient("m1", ((FmpUtterance("a", ([3, 1],), [0.0]),), ()))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     folder = save_client(Path(d) / "m1", client, 0)
    ...     sorted(p.name for p in folder.iterdir()), load_client(folder).groups[0][0].vocab.tolist()
    (['client.npz', 'manifest.json'], [1, 3])
    >>> save_client("unused", {"s": {1, 2}}, 0)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: client 0['s'] is a builtins.set, which privasr cannot store without pickle (expected FmpClient, FedLmClient, FtlClient, or numbers, strings, None, numeric numpy arrays, lists, tuples and dicts of them)
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise InputError(f"client index {index!r}", expected="an integer >= 0")
    out = Path(folder)
    tagged = _tag(client, f"client {index}")
    skel, arrays = flatten(tagged)
    kind = tagged[_DATACLASS][0] if isinstance(tagged, dict) and _DATACLASS in tagged else "pytree"
    _new_folder(out, "client folder")
    data = out / DATA_NAME
    save_tree(data, {"skeleton": json.dumps(skel), **_pool(arrays)})
    from privasr import __version__

    manifest = {"format": _FORMAT, "kind": kind, "index": index, "privasr": __version__, "data": DATA_NAME,
                "sha256": _sha256(data)}
    tmp = out / (MANIFEST_NAME + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, out / MANIFEST_NAME)
    return out


def _read_manifest(folder: Path) -> dict[str, Any]:
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise InputError("no such client folder", path=folder, expected="a folder written by split_clients")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("no manifest in the client folder", path=path,
                         expected="a folder written by split_clients") from None
    except (OSError, ValueError) as e:
        raise InputError(f"unreadable manifest ({type(e).__name__}: {e})", path=path,
                         expected="the JSON manifest split_clients writes") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise InputError("not a privasr client manifest", path=path, expected=f'format "{_FORMAT}"')
    ok = (isinstance(doc.get("kind"), str) and isinstance(doc.get("index"), int) and doc["index"] >= 0
          and doc.get("data") == DATA_NAME and isinstance(doc.get("sha256"), str))
    if not ok:
        raise InputError("the manifest lacks kind, index, data or sha256", path=path,
                         expected=f'"kind", an "index" >= 0, "data": "{DATA_NAME}" and a "sha256"')
    return doc


def load_client(folder: str | os.PathLike[str], *, index: int | None = None) -> Any:
    """The client :func:`save_client` wrote into ``folder`` (reading only that folder's two files).

    Args:
        folder: a client folder.
        index: if given, the client index the folder must hold (a SuperNode's ``partition-id``).

    Raises:
        InputError: naming the file: no folder or manifest, a manifest of another format or index, a data file
            whose SHA-256 differs from the manifest's, or one that does not hold a stored client.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     folder = save_client(Path(d) / "c", {"x": np.arange(2)}, 4)
    ...     _ = (folder / "client.npz").write_bytes(b"changed")
    ...     load_client(folder, index=4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: .../c/client.npz: the data file does not match the SHA-256 in its manifest ...
    """
    where = Path(folder)
    manifest = _read_manifest(where)
    if index is not None and manifest["index"] != index:
        raise InputError(f"the folder holds client {manifest['index']}", path=where / MANIFEST_NAME,
                         expected=f"client {index}")
    data = where / DATA_NAME
    try:
        digest = _sha256(data)
    except FileNotFoundError:
        raise InputError("the client's data file is missing", path=data) from None
    if digest != manifest["sha256"]:
        raise InputError("the data file does not match the SHA-256 in its manifest (changed or damaged)",
                         path=data, expected=f"sha256 {manifest['sha256']}")
    doc = load_tree(data)
    try:
        if not (isinstance(doc, dict) and isinstance(doc.get("skeleton"), str)):
            raise _Garbled("no skeleton")
        client = _untag(unflatten(json.loads(doc["skeleton"]), _unpool(doc)))
    except _Garbled as e:
        raise InputError(f"not a stored client: {e}", path=data, expected="a file written by save_client") from None
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise InputError(f"not a stored client ({type(e).__name__}: {e})", path=data,
                         expected="a file written by save_client") from None
    kind = type(client).__name__ if dataclasses.is_dataclass(client) else "pytree"
    if kind != manifest["kind"]:
        raise InputError(f"the data file holds a {kind}, the manifest says {manifest['kind']}", path=data)
    return client


def split_clients(clients: Sequence[Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write client ``i`` of ``clients`` into ``out_dir/client-<i>/`` (:func:`save_client`); the folders.

    Raises:
        InputError: ``out_dir`` exists and is not empty, or a client cannot be stored (nothing is left behind).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [f.name for f in split_clients([{"x": 1}, {"x": 2}, {"x": 3}], Path(d) / "devices")]
    ['client-0', 'client-1', 'client-2']
    """
    out = Path(out_dir)
    created = _new_folder(out, "output folder")
    written: list[Path] = []
    try:
        for i, client in enumerate(clients):
            folder = out / f"client-{i}"
            try:
                save_client(folder, client, i)
            finally:
                written.append(folder)
    except BaseException:
        for f in written:
            shutil.rmtree(f, ignore_errors=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return written
