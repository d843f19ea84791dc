"""The one config system: typed dataclass schemas read from YAML mappings, with errors that name the key path.

Every runner's config (``privasr rescore run``, ``fmp run``, ``fedlm run``, ``anon run``, ``ftl run``) is a
frozen dataclass whose fields say the type of each key; :func:`from_mapping` validates a mapping against it
before any work starts. Unknown keys, wrong types and bad values are :class:`~privasr.errors.ConfigError`\\ s
naming the dotted key path (``search.max_rounds``); ``${PRIVASR_DATA}`` in path and string values is expanded
(:func:`expand_vars`); ``--set a.b=c`` overrides are applied to the raw mapping first
(:func:`parse_overrides`, :func:`apply_overrides`); :func:`to_dict` gives the resolved config for
results.json.

Field types understood: ``bool``, ``int``, ``float``, ``str``, :class:`~pathlib.Path`, ``Literal[...]``,
``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, ``Any`` (kept as given) and nested schema dataclasses.
Per-field rules go in the field's metadata with :func:`setting`: ``min``/``max`` (inclusive; ``gt``/``lt``
exclusive), ``choices``, ``exists`` (``"file"``, ``"folder"`` or ``"path"``, the word the error uses: checked when ``check_files``),
``expand`` (``${VAR}`` expansion of a ``str``). A schema may define ``__config_value__(cls, value, where)`` to
accept a shorthand (an ARPA path for ``{arpa: PATH}``) and ``__config_check__(self, where, ctx)`` for rules that
tie keys together (it may return a resolved copy, e.g. with a source name turned into a path); both raise
:class:`ConfigError` naming the key.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Search:
...     method: Literal["grid", "coordinate"] = "coordinate"
...     max_rounds: int = setting(20, min=1)
>>> from_mapping(Search, {"max_rounds": 5})
Search(method='coordinate', max_rounds=5)
>>> from_mapping(Search, {"max_round": 5}, "search")
Traceback (most recent call last):
...
privasr.errors.ConfigError: unknown config key 'search.max_round' (expected one of max_rounds, method)
>>> from_mapping(Search, {"max_rounds": 0}, "search")
Traceback (most recent call last):
...
privasr.errors.ConfigError: config key 'search.max_rounds' is 0 (expected an integer >= 1)
>>> to_dict(from_mapping(Search, apply_overrides({}, parse_overrides(["method=grid"]))))
{'method': 'grid', 'max_rounds': 20}
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from privasr.errors import ConfigError

__all__ = ["expand_vars", "apply_overrides", "parse_overrides", "read_config", "setting", "from_mapping",
           "to_dict", "Context", "key_path", "check_int", "check_number", "check_str", "check_mapping",
           "unknown_keys"]

T = TypeVar("T")
_VAR = re.compile(r"\$\{([^}]*)\}")


# ---------------------------------------------------------------------------------------------- raw mappings


def expand_vars(value: str) -> str:
    """Expand ``${PRIVASR_DATA}`` (other ``${...}`` are an error).

    ``$PRIVASR_DATA`` if set, else the shared data folder beside the checkout, else the literal
    ``../shared/data``.

    >>> os.environ["PRIVASR_DATA"] = "/data"
    >>> expand_vars("${PRIVASR_DATA}/ami/dev.jsonl")
    '/data/ami/dev.jsonl'
    >>> del os.environ["PRIVASR_DATA"]
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1) != "PRIVASR_DATA":
            raise ConfigError(f"unknown variable ${{{m.group(1)}}} in {value!r}", expected="only ${PRIVASR_DATA}")
        env = os.environ.get("PRIVASR_DATA")
        if env:
            return env
        from privasr.paths import data_dir

        d = data_dir()
        return str(d) if d is not None else "../shared/data"

    return _VAR.sub(sub, value)


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with dotted-key overrides applied (``search.method=grid``).

    >>> apply_overrides({"a": {"b": 1}}, {"a.b": 2, "a.c.d": 3})
    {'a': {'b': 2, 'c': {'d': 3}}}
    """
    out = copy.deepcopy(dict(config))
    for key, value in overrides.items():
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"override key {key!r} is not valid", expected="dotted keys such as search.method")
        node = out
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"override {key}: {'.'.join(parts[:i + 1])} is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` overrides; values are read as YAML scalars (numbers, booleans, lists).

    >>> parse_overrides(["n_clients=12", "name=x", "rates=[0.1, 0.2]"])
    {'n_clients': 12, 'name': 'x', 'rates': [0.1, 0.2]}
    """
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not key=value", expected="e.g. --set n_clients=100")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r} has an unreadable value", expected="a YAML scalar or list") from None
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict (:class:`ConfigError` with the file and line on any problem)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError("no such config file", path=p)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', e)}", path=p,
                          line=None if line is None else line + 1) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"the config is a YAML {type(data).__name__}", path=p, expected="a mapping")
    return data


# ---------------------------------------------------------------------------------------------- value checks


def key_path(where: str, key: Any) -> str:
    """``where.key`` (just ``key`` at the top level).

    >>> key_path("", "seed"), key_path("search", "method")
    ('seed', 'search.method')
    """
    return f"{where}.{key}" if where else str(key)


def unknown_keys(d: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    """Raise :class:`ConfigError` for the first key of ``d`` not in ``keys``."""
    for k in d:
        if k not in keys:
            raise ConfigError(f"unknown config key {key_path(where, k)!r}", expected=f"one of {', '.join(sorted(keys))}")


def check_mapping(v: Any, where: str, keys: Sequence[str] | None = None) -> dict[str, Any]:
    """``v`` as a dict (``None`` is empty); with ``keys``, any other key is an error.

    >>> check_mapping(None, "eval")
    {}
    """
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"config key {where!r} is {type(v).__name__}", expected="a mapping")
    if keys is not None:
        unknown_keys(v, keys, where)
    return dict(v)


def check_int(v: Any, where: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool) in ``[lo, hi]``.

    >>> check_int(3, "seed", 0)
    3
    """
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        if lo is None and hi is None:
            rng = ""
        elif hi is None:
            rng = f" >= {lo}"
        elif lo is None:
            rng = f" <= {hi}"
        else:
            rng = f" in [{lo}, {hi}]"
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"an integer{rng}")
    return v


def check_number(v: Any, where: str, lo: float | None = None, hi: float | None = None,
                 gt: float | None = None, lt: float | None = None) -> float:
    """A finite number (not a bool) as a float, within the given bounds.

    >>> check_number(1, "prior_weight")
    1.0
    """
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a finite number")
    x = float(v)
    bad = ((lo is not None and x < lo) or (hi is not None and x > hi) or (gt is not None and x <= gt)
           or (lt is not None and x >= lt))
    if bad:
        parts = [f">= {lo}" if lo is not None else "", f"<= {hi}" if hi is not None else "",
                 f"> {gt}" if gt is not None else "", f"< {lt}" if lt is not None else ""]
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"a number {' and '.join(p for p in parts if p)}")
    return x


def check_str(v: Any, where: str, choices: Sequence[str] | None = None) -> str:
    """A non-empty string (one of ``choices`` if given).

    >>> check_str("grid", "search.method", ("grid", "fixed"))
    'grid'
    """
    if not isinstance(v, str) or not v:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a non-empty string")
    if choices is not None and v not in choices:
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"one of {', '.join(choices)}")
    return v


# ---------------------------------------------------------------------------------------------- schemas


@dataclass(frozen=True)
class Context:
    """What :func:`from_mapping` needs besides the data: whether input files must exist."""

    check_files: bool = True


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            **rules: Any) -> Any:
    """A schema field with validation rules (``min``, ``max``, ``gt``, ``lt``, ``choices``, ``exists``, ``expand``).

    >>> @dataclass(frozen=True)
    ... class S:
    ...     rounds: int = setting(10, min=1)
    >>> from_mapping(S, {"rounds": 3}).rounds
    3
    """
    known = {"min", "max", "gt", "lt", "choices", "exists", "expand"}
    bad = set(rules) - known
    if bad:
        raise TypeError(f"unknown setting rule(s) {sorted(bad)}")
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=rules)
    return dataclasses.field(default=default, metadata=rules)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        import sys

        try:  # each class's annotations in its own module (a subclass may inherit fields from another module)
            _HINTS[cls] = typing.get_type_hints(cls)
        except NameError:  # a class made where its names are not module globals (a doctest, a function)
            module = sys.modules.get(cls.__module__)
            _HINTS[cls] = typing.get_type_hints(cls, globalns=vars(module) if module else None)
    return _HINTS[cls]


def from_mapping(cls: type[T], data: Any, where: str = "", ctx: Context | None = None) -> T:
    """Build the schema dataclass ``cls`` from ``data``, validating every key (errors name the key path).

    ``None`` gives the defaults. A required field (no default) that is missing is an error.
    """
    ctx = ctx or Context()
    hook = getattr(cls, "__config_value__", None)
    if hook is not None:
        data = hook(data, where)
    d = check_mapping(data, where) if where else _top_mapping(data)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    unknown_keys(d, [f.name for f in fields], where)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in fields:
        key = key_path(where, f.name)
        if f.name not in d:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"config key {key!r} is missing")
            continue
        kwargs[f.name] = _convert(hints[f.name], d[f.name], key, f.metadata, ctx)
    try:
        obj = cls(**kwargs)
    except ConfigError as e:  # a schema's own value checks: name the section they are in
        if not where or where in e.message:
            raise
        raise ConfigError(f"config key {where!r}: {e.message}", path=e.path, line=e.line,
                          expected=e.expected) from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config key {where or 'config'!r}: {e}") from None
    check = getattr(obj, "__config_check__", None)
    if check is not None:
        replaced = check(where, ctx)
        if replaced is not None:
            obj = replaced
    return obj


def _top_mapping(data: Any) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"the config is a {type(data).__name__}", expected="a mapping")
    return dict(data)


def _convert(tp: Any, v: Any, where: str, rules: Mapping[str, Any], ctx: Context) -> Any:
    """``v`` checked against the type ``tp`` and the field's ``rules``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _convert(rest[0], v, where, rules, ctx)
        raise TypeError(f"{where}: unions of several types are not supported in schemas")
    if tp is Any:
        return copy.deepcopy(v)
    if origin is Literal:
        return check_str(v, where, tuple(args)) if all(isinstance(a, str) for a in args) else _literal(v, args, where)
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, v, where, ctx)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"config key {where!r} is {v!r}", expected="true or false")
        return v
    if tp is int:
        return check_int(v, where, rules.get("min"), rules.get("max"))
    if tp is float:
        return check_number(v, where, rules.get("min"), rules.get("max"), rules.get("gt"), rules.get("lt"))
    if tp is str:
        s = check_str(v, where, rules.get("choices"))
        return expand_vars(s) if rules.get("expand") else s
    if tp is Path:
        p = Path(expand_vars(check_str(v, where)))
        kind = rules.get("exists")
        if kind is not None and ctx.check_files and not p.exists():
            raise ConfigError(f"config key {where!r}: no such {'file' if kind == 'path' else kind}", path=p)
        return p
    if origin is tuple:
        if not isinstance(v, list | tuple):
            raise ConfigError(f"config key {where!r} is {v!r}", expected="a list")
        item = args[0] if args else Any
        return tuple(_convert(item, x, f"{where}[{i}]", {}, ctx) for i, x in enumerate(v))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        d = check_mapping(v, where)
        item = args[1] if len(args) == 2 else Any
        return {str(k): _convert(item, x, key_path(where, k), {}, ctx) for k, x in d.items()}
    raise TypeError(f"{where}: field type {tp!r} is not supported in schemas")


def _literal(v: Any, args: tuple[Any, ...], where: str) -> Any:
    if v not in args or isinstance(v, bool) != any(isinstance(a, bool) and a == v for a in args):
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"one of {', '.join(map(str, args))}")
    return v


def to_dict(obj: Any) -> Any:
    """A JSON-ready copy of a schema object (paths as strings, tuples as lists), for results.json.

    A schema may define ``__config_dict__(self)`` to give its own (e.g. the resolved form of a shorthand).
    """
    custom = getattr(obj, "__config_dict__", None)
    if custom is not None and dataclasses.is_dataclass(obj):
        return custom()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, Mapping):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_dict(v) for v in obj]
    return obj
