"""privasr's canonical JSON Lines formats: N-best lists and transcripts, one utterance per line.

N-best line (keys in this order; optional keys are omitted when null or empty)::

    {"utt_id": "m1_A_0", "client": "m1", "speaker": "m1_A", "order": 0, "ref": "hello world",
     "hyps": [{"words": "hello world", "scores": {"am": -120.5, "lm": -9.2, "total": -130.1},
               "confidences": [0.9, 0.8], "times": [[0.0, 0.4], [0.4, 0.9]], "meta": {...}}],
     "meta": {...}}

Transcript line::

    {"utt_id": "s1", "words": "call bob smith", "confidences": [...], "times": [[s, e], ...],
     "client": "c1", "speaker": "c1_0", "order": 3, "entities": [[1, 3, "PER"]], "meta": {...}}

``hyps`` is never empty: a list with nothing recognised holds one empty hypothesis ``{"words": ""}`` (the
writer writes an :class:`NBest` without hypotheses that way, so it reads back with one). Words are space-separated tokens; scores are natural-log, larger is better; ``-inf`` scores are written as
the string ``"-inf"`` (strict JSON has no infinities) and read back from ``"-inf"`` or ``-Infinity``.
Floats are written with ``repr`` precision so round trips are exact. Unknown keys, duplicate keys,
duplicate utterance ids, NaN/Infinity and wrong types are :class:`~privasr.errors.InputError` located at
the file and line. Blank lines are skipped. See ``docs/formats.md``.

>>> import tempfile, pathlib
>>> from privasr.corpus.records import Hypothesis, NBest
>>> p = pathlib.Path(tempfile.mkdtemp()) / "nb.jsonl"
>>> recs = [NBest("u1", (Hypothesis.from_text("a b", scores={"am": -1.5, "lm": float("-inf")}),), ref=("a", "b"))]
>>> write_nbest(p, recs)
1
>>> print(p.read_text().strip())
{"utt_id": "u1", "ref": "a b", "hyps": [{"words": "a b", "scores": {"am": -1.5, "lm": "-inf"}}]}
>>> read_nbest(p) == recs
True
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from privasr.corpus.formats._common import (
    NEG_INF,
    check_finite,
    check_keys,
    iter_json_records,
    to_float,
    to_floats,
    to_times,
)
from privasr.corpus.records import Hypothesis, NBest, Span, Transcript, thaw_json
from privasr.corpus.textio import PathLike, open_write_text, split_words
from privasr.errors import InputError

__all__ = [
    "read_nbest",
    "iter_nbest",
    "write_nbest",
    "read_transcripts",
    "iter_transcripts",
    "write_transcripts",
    "nbest_to_json",
    "nbest_from_json",
    "transcript_to_json",
    "transcript_from_json",
    "NBEST_KEYS",
    "HYP_KEYS",
    "TRANSCRIPT_KEYS",
]

NBEST_KEYS = ("utt_id", "client", "speaker", "order", "ref", "hyps", "meta")
HYP_KEYS = ("words", "scores", "confidences", "times", "meta")
TRANSCRIPT_KEYS = ("utt_id", "words", "confidences", "times", "client", "speaker", "order", "entities", "meta")


# ---------------------------------------------------------------------------------------------- reading


def _words(x: Any, what: str) -> tuple[str, ...]:
    if not isinstance(x, str):
        raise InputError(f"{what} is {type(x).__name__}", expected="a string of space-separated words")
    return tuple(split_words(x))


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    v = obj.get(key)
    if v is not None and not isinstance(v, str):
        raise InputError(f"{key!r} is {type(v).__name__}", expected="a string or null")
    return v


def _meta(obj: dict[str, Any], what: str) -> dict[str, Any]:
    m = obj.get("meta")
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise InputError(f"{what} meta is {type(m).__name__}", expected="a JSON object")
    check_finite(m, f"{what} meta")
    return m


def _hyp_from_json(h: Any, k: int) -> Hypothesis:
    what = f"hypothesis {k}"
    check_keys(h, HYP_KEYS, ("words",), what)
    scores = h.get("scores")
    if scores is not None:
        if not isinstance(scores, dict):
            raise InputError(f"{what} scores is {type(scores).__name__}", expected="an object {name: number}")
        scores = {name: to_float(v, f"{what} score {name!r}", allow_neg_inf=True) for name, v in scores.items()}
    return Hypothesis(
        _words(h["words"], f"{what} words"),
        scores=scores,
        confidences=to_floats(h.get("confidences"), f"{what} confidences"),
        times=to_times(h.get("times"), f"{what} times"),
        meta=_meta(h, what),
    )


def nbest_from_json(obj: Any) -> NBest:
    """Build an :class:`NBest` from one decoded canonical JSON object (errors unlocated).

    >>> nbest_from_json({"utt_id": "u", "hyps": [{"words": "x y", "scores": {"total": -2}}]}).best.scores["total"]
    -2.0
    """
    check_keys(obj, NBEST_KEYS, ("utt_id", "hyps"), "utterance")
    hyps = obj["hyps"]
    if not isinstance(hyps, list):
        raise InputError(f"'hyps' is {type(hyps).__name__}", expected="a list of hypothesis objects")
    if not hyps:
        raise InputError("'hyps' is empty", expected='at least one hypothesis ({"words": ""} when nothing '
                         "was recognised)")
    ref = obj.get("ref")
    return NBest(
        obj["utt_id"],
        tuple(_hyp_from_json(h, k) for k, h in enumerate(hyps)),
        client=_opt_str(obj, "client"),
        speaker=_opt_str(obj, "speaker"),
        order=obj.get("order"),
        ref=None if ref is None else _words(ref, "'ref'"),
        meta=_meta(obj, "utterance"),
    )


def _entities(x: Any) -> tuple[Span, ...]:
    if x is None:
        return ()
    if not isinstance(x, list):
        raise InputError(f"'entities' is {type(x).__name__}", expected="a list of [start, end, label]")
    out = []
    for e in x:
        if not isinstance(e, list) or len(e) != 3:
            raise InputError(f"entity {str(e)[:40]} is not [start, end, label]", expected="[start, end, label]")
        out.append(Span(e[0], e[1], e[2]))
    return tuple(out)


def transcript_from_json(obj: Any) -> Transcript:
    """Build a :class:`Transcript` from one decoded canonical JSON object (errors unlocated).

    >>> transcript_from_json({"utt_id": "s", "words": "bob smith", "entities": [[0, 2, "PER"]]}).entities
    (Span(start=0, end=2, label='PER'),)
    """
    check_keys(obj, TRANSCRIPT_KEYS, ("utt_id", "words"), "transcript")
    return Transcript(
        obj["utt_id"],
        _words(obj["words"], "'words'"),
        confidences=to_floats(obj.get("confidences"), "confidences"),
        times=to_times(obj.get("times"), "times"),
        client=_opt_str(obj, "client"),
        speaker=_opt_str(obj, "speaker"),
        order=obj.get("order"),
        entities=_entities(obj.get("entities")),
        meta=_meta(obj, "transcript"),
    )


def iter_nbest(path: PathLike) -> Iterator[NBest]:
    """Yield the N-best lists of a canonical N-best JSON Lines file (``.gz``/``.xz``/``.bz2`` allowed).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = p.write_text('{"utt_id": "a", "hyps": [{"words": "hi"}]}\\n\\n{"utt_id": "b", "hyps": [{"words": ""}]}\\n')
    >>> [(r.utt_id, len(r)) for r in iter_nbest(p)]
    [('a', 1), ('b', 1)]
    >>> _ = p.write_text('{"utt_id": "a", "hyps": []}\\n')
    >>> list(iter_nbest(p))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x.jsonl:1: 'hyps' is empty (expected at least one hypothesis ({"words": ""} when nothing was recognised))
    """
    return iter_json_records(path, nbest_from_json)


def read_nbest(path: PathLike) -> list[NBest]:
    """Read a canonical N-best JSON Lines file into a list (see :func:`iter_nbest`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = p.write_text('{"utt_id": "a", "hyps": [{"words": "hi", "bogus": 1}]}\\n')
    >>> read_nbest(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...x.jsonl:1: hypothesis 0 has unknown key 'bogus' (expected keys words, scores, confidences, times, meta)
    """
    return list(iter_nbest(path))


def iter_transcripts(path: PathLike) -> Iterator[Transcript]:
    """Yield the transcripts of a canonical transcript JSON Lines file.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
    >>> _ = p.write_text('{"utt_id": "a", "words": "hello there", "client": "c"}\\n')
    >>> [(t.utt_id, t.words, t.client) for t in iter_transcripts(p)]
    [('a', ('hello', 'there'), 'c')]
    """
    return iter_json_records(path, transcript_from_json)


def read_transcripts(path: PathLike) -> list[Transcript]:
    """Read a canonical transcript JSON Lines file into a list (see :func:`iter_transcripts`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
    >>> _ = p.write_text('{"utt_id": "a", "words": "x"}\\n{"utt_id": "a", "words": "y"}\\n')
    >>> read_transcripts(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...t.jsonl:2: duplicate utterance id 'a' (first on line 1) (expected unique utterance ids)
    """
    return list(iter_transcripts(path))


# ---------------------------------------------------------------------------------------------- writing


def _score(x: float) -> float | str:
    return NEG_INF if x == -math.inf else x


def _put_common(d: dict[str, Any], r: NBest | Transcript) -> None:
    if r.client is not None:
        d["client"] = r.client
    if r.speaker is not None:
        d["speaker"] = r.speaker
    if r.order is not None:
        d["order"] = r.order


def _hyp_to_json(h: Hypothesis) -> dict[str, Any]:
    d: dict[str, Any] = {"words": h.text}
    if h.scores:
        d["scores"] = {k: _score(v) for k, v in h.scores.items()}
    if h.confidences is not None:
        d["confidences"] = list(h.confidences)
    if h.times is not None:
        d["times"] = [list(t) for t in h.times]
    if h.meta:
        d["meta"] = thaw_json(h.meta)
    return d


def nbest_to_json(r: NBest) -> dict[str, Any]:
    """The canonical JSON object of an N-best list (keys in the documented order, empty fields omitted).

    >>> from privasr.corpus.records import Hypothesis
    >>> nbest_to_json(NBest("u", (Hypothesis(("a",)),), client="c", order=2))
    {'utt_id': 'u', 'client': 'c', 'order': 2, 'hyps': [{'words': 'a'}]}
    """
    d: dict[str, Any] = {"utt_id": r.utt_id}
    _put_common(d, r)
    if r.ref is not None:
        d["ref"] = " ".join(r.ref)
    d["hyps"] = [_hyp_to_json(h) for h in r.hyps] or [{"words": ""}]  # nothing recognised: one empty hypothesis
    if r.meta:
        d["meta"] = thaw_json(r.meta)
    return d


def transcript_to_json(t: Transcript) -> dict[str, Any]:
    """The canonical JSON object of a transcript (keys in the documented order, empty fields omitted).

    >>> transcript_to_json(Transcript("s", ("bob", "x"), entities=(Span(0, 1, "PER"),)))
    {'utt_id': 's', 'words': 'bob x', 'entities': [[0, 1, 'PER']]}
    """
    d: dict[str, Any] = {"utt_id": t.utt_id, "words": t.text}
    if t.confidences is not None:
        d["confidences"] = list(t.confidences)
    if t.times is not None:
        d["times"] = [list(x) for x in t.times]
    _put_common(d, t)
    if t.entities:
        d["entities"] = [[s.start, s.end, s.label] for s in t.entities]
    if t.meta:
        d["meta"] = thaw_json(t.meta)
    return d


def _dump(obj: Mapping[str, Any], utt_id: str) -> str:
    try:
        return json.dumps(obj, ensure_ascii=False, allow_nan=False)
    except (ValueError, TypeError) as e:
        raise InputError(f"utterance {utt_id!r} cannot be written as JSON: {e}",
                         expected="JSON-compatible meta with finite numbers") from None


def _write(path: PathLike, records: Iterable[Any], kind: type, to_json: Any) -> int:
    n = 0
    with open_write_text(path) as f:
        for r in records:
            if not isinstance(r, kind):
                raise InputError(f"record {n} is {type(r).__name__}", path=path, expected=kind.__name__)
            f.write(_dump(to_json(r), r.utt_id))
            f.write("\n")
            n += 1
    return n


def write_nbest(path: PathLike, records: Iterable[NBest]) -> int:
    """Write N-best lists as canonical JSON Lines (compressed by suffix); returns the number written.

    >>> import tempfile, pathlib
    >>> from privasr.corpus.records import Hypothesis
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "out.jsonl.gz"
    >>> write_nbest(p, [NBest("u", (Hypothesis(("a",), scores={"total": -0.1}),))])
    1
    >>> read_nbest(p)[0].best.scores["total"]
    -0.1
    """
    return _write(path, records, NBest, nbest_to_json)


def write_transcripts(path: PathLike, records: Iterable[Transcript]) -> int:
    """Write transcripts as canonical JSON Lines (compressed by suffix); returns the number written.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.jsonl"
    >>> recs = [Transcript("s", ("a", "b"), times=((0.0, 0.5), (0.5, 1.25)))]
    >>> write_transcripts(p, recs), read_transcripts(p) == recs
    (1, True)
    """
    return _write(path, records, Transcript, transcript_to_json)
