"""HyPoradise-style N-best JSON: one JSON list of ``{"input": [hyps...], "output": ref, ...}`` items.

As in ``librispeech-whisper-5best``::

    [{"instruction": "please find the best sentence ...", "input": ["hyp 1", "hyp 2", ...], "output": "ref"}, ...]

with an optional ids file (one utterance id per line, line *k* = item *k*). Mapping onto
:class:`~privasr.corpus.records.NBest`:

* with ids: ``utt_id`` = the id; for LibriSpeech-style ids ``speaker-chapter-utterance`` (all digits),
  ``speaker`` = ``client`` = the first field, ``meta["chapter"]`` = the first two fields, and ``order`` = the
  id with every field zero-padded to 10 digits (so string order is reading order); for other ids, no
  speaker/client and ``order`` = the item index;
* without ids: ``utt_id`` = ``f"{stem}-{k:05d}"`` (*k* the 0-based item index, *stem* the file name without
  ``.json`` and compression suffixes), ``order`` = *k*;
* ``hyps`` = the ``input`` strings in the given order, duplicates included (rank only: no scores);
  ``ref`` = ``output`` split on whitespace; other item keys (``instruction``...) go into ``NBest.meta``.

Errors in the JSON name the JSON line; errors in an item name the item: ``line`` = the 1-based item
number (the message says so). An ids file whose length differs from the item count is an error.

>>> import tempfile, pathlib, json
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "t.json").write_text(json.dumps([{"input": ["a b", "a b", "a c"], "output": "a b"}]))
>>> _ = (d / "t.ids.txt").write_text("1688-142285-0000\\n")
>>> nb = read_hyporadise(d / "t.json", ids=d / "t.ids.txt")[0]
>>> nb.utt_id, nb.speaker, nb.meta["chapter"], [h.text for h in nb], nb.order
('1688-142285-0000', '1688', '1688-142285', ['a b', 'a b', 'a c'], '0000001688-0000142285-0000000000')
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from privasr.corpus.formats._common import (
    check_finite,
    json_line_of,
    loads_json,
    located,
    strip_compression,
)
from privasr.corpus.records import Hypothesis, NBest, thaw_json
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, read_text, split_words
from privasr.errors import InputError

__all__ = ["read_hyporadise", "write_hyporadise", "read_ids", "default_ids_path", "librispeech_fields"]

_LS_ID = re.compile(r"^(\d+)-(\d+)-(\d+)$")


def librispeech_fields(utt_id: str) -> tuple[str, str, str] | None:
    """``(speaker, chapter, order)`` for a LibriSpeech-style id, else ``None``.

    >>> librispeech_fields("1688-142285-0007")
    ('1688', '1688-142285', '0000001688-0000142285-0000000007')
    >>> librispeech_fields("utt7") is None
    True
    """
    m = _LS_ID.match(utt_id)
    if m is None:
        return None
    spk, chap, utt = m.groups()
    order = "-".join(f"{int(x):010d}" if len(x) <= 10 else x for x in (spk, chap, utt))
    return spk, f"{spk}-{chap}", order


def read_ids(path: PathLike) -> list[str]:
    """Read an ids file: one non-empty id per line, no spaces, no duplicates.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "ids.txt"
    >>> _ = p.write_text("a\\nb\\n")
    >>> read_ids(p)
    ['a', 'b']
    """
    ids: list[str] = []
    seen: set[str] = set()
    for n, line in iter_lines(path):
        u = line.strip()
        if not u or len(u.split()) != 1:
            raise InputError(f"ids line is {line!r}"[:100], path=path, line=n, expected="one id per line")
        if u in seen:
            raise InputError(f"duplicate id {u!r}", path=path, line=n, expected="unique ids")
        seen.add(u)
        ids.append(u)
    return ids


def default_ids_path(path: PathLike) -> Path:
    """The ids file that goes with a HyPoradise JSON file: ``<stem>.ids.txt`` beside it.

    >>> default_ids_path("data/test_ls_other.json.xz").name
    'test_ls_other.ids.txt'
    """
    p = Path(path)
    return p.with_name(_stem(p) + ".ids.txt")


def _stem(p: Path) -> str:
    name = strip_compression(p.name)
    return name[:-5] if name.lower().endswith(".json") else Path(name).stem


def _item(obj: Any, utt_id: str, k: int, ls: tuple[str, str, str] | None) -> NBest:
    if not isinstance(obj, dict):
        raise InputError(f"item is a JSON {type(obj).__name__}", expected='an object {"input": [...], "output": ...}')
    for key in ("input", "output"):
        if key not in obj:
            raise InputError(f"item has no {key!r}", expected='keys "input" (list of strings) and "output"')
    hyps = obj["input"]
    if not isinstance(hyps, list) or not all(isinstance(h, str) for h in hyps):
        raise InputError("item 'input' is not a list of strings", expected="a list of hypothesis strings")
    ref = obj["output"]
    if not isinstance(ref, str):
        raise InputError(f"item 'output' is {type(ref).__name__}", expected="the reference string")
    meta = {key: v for key, v in obj.items() if key not in ("input", "output")}
    check_finite(meta, "item")
    speaker = order = None
    if ls is not None:
        speaker, chapter, order = ls
        meta["chapter"] = chapter
    return NBest(
        utt_id,
        tuple(Hypothesis(tuple(split_words(h))) for h in hyps),
        client=speaker,
        speaker=speaker,
        order=order if order is not None else k,
        ref=tuple(split_words(ref)),
        meta=meta,
    )


def read_hyporadise(path: PathLike, ids: PathLike | Sequence[str] | None = None) -> list[NBest]:
    """Read a HyPoradise JSON file (``.xz``/``.gz`` allowed) into N-best lists, in item order.

    Args:
        path: the JSON file (a list of items).
        ids: an ids file (or a list of ids), one per item; ``None`` for generated ids.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "hp.json"
    >>> _ = p.write_text('[{"input": ["x"], "output": "x"},\\n {"input": "x", "output": "x"}]')
    >>> read_hyporadise(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...hp.json:2: item 2 (line = 1-based item number): item 'input' is not a list of strings (expected a list of hypothesis strings)
    >>> _ = p.write_text('[{"input": ["x"], "output": "x"}]')
    >>> read_hyporadise(p)[0].utt_id
    'hp-00000'
    """
    p = Path(path)
    text = read_text(p)
    try:
        data = loads_json(text)
    except InputError as e:
        raise e.at(p, json_line_of(e, text)) from None
    if not isinstance(data, list):
        raise InputError(f"the file holds a JSON {type(data).__name__}", path=p, expected="a JSON list of items")
    id_path: PathLike | None = None
    if ids is None:
        id_list = [f"{_stem(p)}-{k:05d}" for k in range(len(data))]
    elif isinstance(ids, str | Path) or hasattr(ids, "__fspath__"):
        id_path = ids  # type: ignore[assignment]
        id_list = read_ids(ids)  # type: ignore[arg-type]
    else:
        id_list = list(ids)  # type: ignore[arg-type]
    if len(id_list) != len(data):
        raise InputError(f"{len(data)} items but {len(id_list)} ids" + (f" in {id_path}" if id_path else ""),
                         path=p, expected="one id per item")
    out = []
    for k, (obj, u) in enumerate(zip(data, id_list, strict=True)):
        ls = librispeech_fields(u) if ids is not None else None
        with located(p, k + 1):
            try:
                out.append(_item(obj, u, k, ls))
            except InputError as e:
                raise InputError(f"item {k + 1} (line = 1-based item number): {e.message}",
                                 expected=e.expected) from None
    return out


def write_hyporadise(path: PathLike, records: Iterable[NBest], ids: PathLike | None = None,
                     instruction: str | None = None) -> int:
    """Write N-best lists as HyPoradise JSON (and their ids, one per line, to ``ids`` if given).

    Scores, confidences and times are not representable and are dropped; a missing reference is written
    as ``""``. Item keys from ``NBest.meta`` other than ``chapter`` are written back (e.g. ``instruction``);
    ``instruction`` overrides it. Returns the number of items.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> recs = [NBest("1-2-3", (Hypothesis(("a",)), Hypothesis(("a",))), ref=("a",))]
    >>> write_hyporadise(d / "x.json", recs, ids=d / "x.ids.txt")
    1
    >>> [h.text for h in read_hyporadise(d / "x.json", ids=d / "x.ids.txt")[0]]
    ['a', 'a']
    """
    items = []
    names = []
    for r in records:
        if not isinstance(r, NBest):
            raise InputError(f"record {len(items)} is {type(r).__name__}", path=path, expected="NBest")
        item: dict[str, Any] = {k: thaw_json(v) for k, v in r.meta.items() if k not in ("chapter", "input", "output")}
        if instruction is not None:
            item["instruction"] = instruction
        item["input"] = [h.text for h in r.hyps]
        item["output"] = " ".join(r.ref or ())
        items.append(item)
        names.append(r.utt_id)
    try:
        text = json.dumps(items, ensure_ascii=False, allow_nan=False, indent=1)
    except (ValueError, TypeError) as e:
        raise InputError(f"cannot write as JSON: {e}", path=path, expected="JSON-compatible meta") from None
    with open_write_text(path) as f:
        f.write(text + "\n")
    if ids is not None:
        with open_write_text(ids) as f:
            f.writelines(u + "\n" for u in names)
    return len(items)
