"""Small helpers shared by the format readers: locating errors, strict JSON, numbers, archives.

Every helper raises :class:`~privasr.errors.InputError` and nothing else for bad data; helpers that
know no location raise it unlocated and the caller adds the file and line with :func:`located`.

>>> with located("a.jsonl", 3):
...     loads_json('{"a": NaN}')
Traceback (most recent call last):
...
privasr.errors.InputError: a.jsonl:3: invalid JSON number NaN (expected strict JSON: finite numbers only)
"""

from __future__ import annotations

import json
import lzma
import math
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from privasr.corpus.textio import PathLike, iter_lines
from privasr.errors import InputError

__all__ = [
    "located",
    "loads_json",
    "to_float",
    "to_floats",
    "to_times",
    "check_keys",
    "check_finite",
    "iter_json_records",
    "strip_compression",
    "is_tar",
    "iter_tar_texts",
    "decode_utf8",
    "natural_key",
    "is_file",
    "json_line_of",
    "NEG_INF",
]

NEG_INF = "-inf"
"""How ``-inf`` scores are written in JSON (strict JSON has no infinities)."""

_COMPRESSION = (".gz", ".xz", ".bz2")


@contextmanager
def located(path: PathLike | str | None, line: int | None) -> Iterator[None]:
    """Re-raise an unlocated :class:`InputError` from the block located at ``path``/``line``.

    >>> try:
    ...     with located("f.txt", 7):
    ...         raise InputError("bad")
    ... except InputError as e:
    ...     print(e)
    f.txt:7: bad
    """
    try:
        yield
    except InputError as e:
        raise e.at(path, line) from None


def _bad_constant(name: str) -> Any:
    if name == "-Infinity":
        return -math.inf
    raise InputError(f"invalid JSON number {name}", expected="strict JSON: finite numbers only")


def _parse_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise InputError(f"number {text[:40]} is out of range", expected="a finite number")
    return x


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise InputError(f"duplicate key {k!r} in a JSON object", expected="unique keys")
            seen.add(k)
    return d


def loads_json(text: str) -> Any:
    """Parse strict JSON (no NaN/Infinity, no duplicate keys); ``-Infinity`` is read as ``-inf``.

    Errors are unlocated :class:`InputError` whose message gives the line and column inside ``text``.

    >>> loads_json('{"x": [1, 2.5, -Infinity]}')
    {'x': [1, 2.5, -inf]}
    >>> loads_json('{"x": 1,}')
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: invalid JSON: Expecting property name enclosed in double quotes (line 1, column 9) (expected valid JSON)
    """
    try:
        return json.loads(text, parse_constant=_bad_constant, parse_float=_parse_float,
                          object_pairs_hook=_pairs)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})",
                         expected="valid JSON") from None
    except RecursionError:
        raise InputError("JSON nested too deeply", expected="valid JSON") from None
    except ValueError as e:  # e.g. integers beyond Python's int-string conversion limit
        if isinstance(e, InputError):
            raise
        raise InputError(f"invalid JSON: {e}", expected="valid JSON") from None


_JSON_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[^\s"\[\]{},:]+')


def json_line_of(err: InputError, text: str | None = None) -> int | None:
    """The JSON line number a :func:`loads_json` error mentions, if any (for whole-file JSON).

    A non-finite or out-of-range number names no line; given the parsed ``text``, its first occurrence
    outside a string gives it.

    >>> text = '[{"a": "NaN"},\\n {"a": NaN}]'
    >>> try:
    ...     loads_json(text)
    ... except InputError as e:
    ...     print(json_line_of(e), json_line_of(e, text))
    None 2
    """
    m = re.search(r"\(line (\d+), column \d+\)", err.message)
    if m:
        return int(m.group(1))
    m = re.match(r"(?:invalid JSON number|number) (\S+)", err.message)
    if m is None or text is None:
        return None
    for t in _JSON_TOKENS.finditer(text):
        if t.group() == m.group(1):
            return text.count("\n", 0, t.start()) + 1
    return None


def to_float(x: Any, what: str, *, allow_neg_inf: bool = False) -> float:
    """``x`` as a float: a number (not a bool), finite, or ``-inf`` (also spelled ``"-inf"``) if allowed.

    >>> to_float(3, "score"), to_float("-inf", "score", allow_neg_inf=True)
    (3.0, -inf)
    >>> to_float(10**400, "score")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: score is out of range (expected a finite number)
    """
    if allow_neg_inf and isinstance(x, str) and x in (NEG_INF, "-Infinity"):
        return -math.inf
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise InputError(f"{what} is {_short(x)}",
                         expected="a number" + (' or "-inf"' if allow_neg_inf else ""))
    try:
        f = float(x)
    except OverflowError:
        raise InputError(f"{what} is out of range", expected="a finite number") from None
    if math.isnan(f) or f == math.inf or (f == -math.inf and not allow_neg_inf):
        raise InputError(f"{what} is {f!r}", expected="a finite number")
    return f


def to_floats(xs: Any, what: str) -> tuple[float, ...] | None:
    """A JSON list of finite numbers as a tuple of floats (``None`` stays ``None``)."""
    if xs is None:
        return None
    if not isinstance(xs, list | tuple):
        raise InputError(f"{what} is {_short(xs)}", expected="a list of numbers")
    return tuple(to_float(x, what) for x in xs)


def to_times(xs: Any, what: str) -> tuple[tuple[float, float], ...] | None:
    """A JSON list of ``[start, end]`` pairs as a tuple of float pairs (``None`` stays ``None``)."""
    if xs is None:
        return None
    if not isinstance(xs, list | tuple):
        raise InputError(f"{what} is {_short(xs)}", expected="a list of [start, end] pairs")
    out = []
    for t in xs:
        if not isinstance(t, list | tuple) or len(t) != 2:
            raise InputError(f"{what} entry {_short(t)} is not a pair", expected="[start, end] in seconds")
        out.append((to_float(t[0], what), to_float(t[1], what)))
    return tuple(out)


def iter_json_records(path: PathLike, build: Callable[[Any], Any]) -> Iterator[Any]:
    """Yield ``build(obj)`` for every JSON object line of a JSON Lines file (blank lines skipped).

    Errors are located at the line; records must carry a ``utt_id``, unique in the file.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = p.write_text('{"utt_id": "a"}\\n{"utt_id": "a"}\\n')
    >>> from types import SimpleNamespace
    >>> list(iter_json_records(p, lambda o: SimpleNamespace(**o)))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x.jsonl:2: duplicate utterance id 'a' (first on line 1) (expected unique utterance ids)
    """
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        if not line.strip():
            continue
        with located(path, n):
            rec = build(loads_json(line))
            if rec.utt_id in seen:
                raise InputError(f"duplicate utterance id {rec.utt_id!r} (first on line {seen[rec.utt_id]})",
                                 expected="unique utterance ids")
        seen[rec.utt_id] = n
        yield rec


def check_finite(v: Any, what: str) -> None:
    """Raise :class:`InputError` if a decoded JSON value holds a non-finite float anywhere inside.

    Free-form ``meta`` must survive being written again as strict JSON.

    >>> check_finite({"a": [1.0, float("-inf")]}, "meta")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: meta holds -inf (expected finite numbers only)
    """
    if isinstance(v, float) and not math.isfinite(v):
        raise InputError(f"{what} holds {v!r}", expected="finite numbers only")
    if isinstance(v, dict):
        for x in v.values():
            check_finite(x, what)
    elif isinstance(v, list | tuple):
        for x in v:
            check_finite(x, what)


def check_keys(obj: Any, allowed: tuple[str, ...], required: tuple[str, ...], what: str) -> dict[str, Any]:
    """Check that ``obj`` is a JSON object with only ``allowed`` keys and all ``required`` ones."""
    if not isinstance(obj, dict):
        raise InputError(f"{what} is {type(obj).__name__}, not an object", expected="a JSON object")
    for k in obj:
        if k not in allowed:
            raise InputError(f"{what} has unknown key {k!r}", expected=f"keys {', '.join(allowed)}")
    for k in required:
        if k not in obj:
            raise InputError(f"{what} has no {k!r}", expected=f"keys {', '.join(allowed)}")
    return obj


def _short(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def strip_compression(name: str) -> str:
    """``name`` without a trailing ``.gz``/``.xz``/``.bz2``.

    >>> strip_compression("dev.jsonl.xz")
    'dev.jsonl'
    """
    for s in _COMPRESSION:
        if name.lower().endswith(s):
            return name[: -len(s)]
    return name


def is_tar(path: PathLike) -> bool:
    """Whether ``path`` names a tar archive (``.tar``, ``.tar.gz``/``.tgz``, ``.tar.xz``, ``.tar.bz2``)."""
    n = Path(path).name.lower()
    return n.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2"))


def decode_utf8(data: bytes, path: str) -> str:
    """Decode bytes as strict UTF-8; an error names the line where the bad byte is."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise InputError("the file is not valid UTF-8 text", path=path, line=line,
                         expected="UTF-8 text") from None


def iter_tar_texts(path: PathLike, suffixes: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Yield ``(member_name, text)`` for the regular-file members of a tar archive ending in ``suffixes``.

    Members are yielded in archive order; nothing is extracted to disk. Damaged archives and
    undecodable members raise :class:`InputError` (a member's path is ``f"{archive}:{member}"``).
    """
    p = Path(path)
    if not p.is_file():
        raise InputError("no such file" if not p.exists() else "not a regular file", path=p)
    try:
        with tarfile.open(p, "r:*") as tar:
            for m in tar:
                if not m.isfile() or not m.name.lower().endswith(suffixes):
                    continue
                f = tar.extractfile(m)
                if f is None:  # pragma: no cover - isfile() members always have data
                    continue
                data = f.read()
                yield m.name, decode_utf8(data, f"{p}:{m.name}")
    except InputError:
        raise
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as e:
        raise InputError(f"cannot read the archive: {e}", path=p,
                         expected="an intact tar archive (optionally .gz/.xz/.bz2)") from None


def is_file(path: PathLike) -> bool:
    """``Path(path).is_file()``, but ``False`` for names the OS rejects (too long, NUL bytes).

    >>> is_file("x" * 5000), is_file("a\\0b")
    (False, False)
    """
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def natural_key(name: str) -> tuple[Any, ...]:
    """Sort key putting ``split_2`` before ``split_10``.

    >>> sorted(["split_10", "split_2"], key=natural_key)
    ['split_2', 'split_10']
    """
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", name) if t)
