"""Typed, frozen, validated records for ASR corpora.

The records are the currency of privasr: every reader converts into them, every writer converts out of
them, and algorithms consume them. They validate themselves on construction (raising
:class:`~privasr.errors.InputError`), hold only immutable containers, and never change once built.

* :class:`Hypothesis` -- one recognition hypothesis: words, first-pass scores by name, optional per-word
  confidences and times.
* :class:`NBest` -- one utterance's hypotheses, best first, with its client, speaker, order key and
  reference if known.
* :class:`Transcript` -- a single word sequence for an utterance (a reference, or a 1-best with word
  confidences from a CTM), with optional entity spans.
* :class:`Client` and :class:`Population` -- utterances grouped by a key (meeting, speaker, device) and
  ordered within each group.

Score names are free-form but these are conventional (natural log, larger is better):
``am`` (acoustic), ``lm`` (first-pass LM log-probability), ``total`` (the decoder's combined score).

>>> h = Hypothesis.from_text("hello world", scores={"am": -120.5, "lm": -9.2})
>>> h.words, h.text, h.scores["lm"]
(('hello', 'world'), 'hello world', -9.2)
>>> nb = NBest("u1", (h, Hypothesis.from_text("hello word")), client="m1", ref=("hello", "world"))
>>> nb.best.text, len(nb)
('hello world', 2)
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from privasr.errors import InputError

__all__ = [
    "Hypothesis",
    "NBest",
    "Transcript",
    "Span",
    "Client",
    "Population",
    "Utterance",
    "freeze_json",
    "order_key",
    "check_words",
    "thaw_json",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def freeze_json(value: Any) -> Any:
    """Return an immutable copy of a JSON-like value (dicts become read-only mappings, lists tuples).

    Non-finite floats are rejected (:class:`InputError`): ``meta`` must stay writable as strict JSON.

    >>> v = freeze_json({"a": [1, {"b": 2}]})
    >>> v["a"][1]["b"]
    2
    >>> thaw_json(v)
    {'a': [1, {'b': 2}]}
    """
    t = type(value)
    if t is str or t is int or t is bool or value is None:
        return value
    if t is float:
        if not math.isfinite(value):
            raise InputError(f"meta holds {value!r}", expected="finite numbers only")
        return value
    if t is dict or isinstance(value, Mapping):
        return MappingProxyType({str(k): freeze_json(v) for k, v in value.items()})
    if t is list or t is tuple:
        return tuple(freeze_json(v) for v in value)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"meta holds {value!r}", expected="finite numbers only")
    return value


def thaw_json(value: Any) -> Any:
    """Inverse of :func:`freeze_json`: plain dicts and lists, ready for :func:`json.dumps`."""
    if isinstance(value, Mapping):
        return {k: thaw_json(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw_json(v) for v in value]
    return value


def _reduce(record: Any) -> tuple[Any, tuple[Any, ...]]:
    """``__reduce__`` of the frozen records: rebuilt from their fields with the read-only mappings as plain
    dicts (a ``mappingproxy`` cannot be pickled), so records cross process boundaries (worker pools)."""
    return type(record), tuple(thaw_json(v) if isinstance(v, Mapping) else v
                               for v in (getattr(record, f.name) for f in fields(record)))


# Characters no word or id may hold: C0/C1 controls (NUL included), Unicode spaces and line separators other than
# the ASCII ones readers split on, and the invisible zero-width space, word joiner, byte-order mark and Mongolian
# vowel separator. Zero-width (non-)joiners and direction marks are left alone: scripts need them.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\xa0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u2060"
                        "\u3000\ufeff]")


def describe_char(c: str) -> str:
    """A character as a person can see it: code point and Unicode name.

    >>> describe_char("\\xa0"), describe_char("\\x00")
    ('U+00A0 NO-BREAK SPACE', 'U+0000 (a control character)')
    """
    name = unicodedata.name(c, "")
    return f"U+{ord(c):04X} {name}" if name else f"U+{ord(c):04X} (a control character)"


def invisible_problem(text: str) -> str | None:
    """Why ``text`` (a word or an id) cannot be used as it is: the first invisible or control character in it and
    where, shown with ``repr`` so that it can be seen; ``None`` if there is none.

    >>> print(invisible_problem("utt\\u200b1"))
    'utt\\u200b1' holds U+200B ZERO WIDTH SPACE at character 4
    >>> invisible_problem("hello") is None
    True
    """
    m = _INVISIBLE.search(text)
    if m is None:
        return None
    return f"{text!r} holds {describe_char(m.group())} at character {m.start() + 1}"


_INVISIBLE_HINT = ("visible characters only (sclite, Kaldi and KenLM do not split words on no-break or zero-width "
                   "spaces, so they would silently score 'a b' and 'a\u00a0b' differently): replace the character "
                   "with a space or remove it")


def check_words(words: Any, what: str) -> tuple[str, ...]:
    """``words`` as a tuple of tokens: non-empty strings without whitespace, else :class:`InputError`.

    A token holding an invisible or control character (a no-break or zero-width space, a byte-order mark, NUL...)
    is refused too, with the character named (:func:`invisible_problem`).

    >>> check_words(["a", "b"], "reference")
    ('a', 'b')
    >>> check_words("a b", "reference")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: reference must be a sequence of words, got a string (expected a list of tokens)
    >>> check_words(["caf\\u00e9", "a\\u00a0b"], "reference")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: reference: the word 'a\\xa0b' holds U+00A0 NO-BREAK SPACE at character 2 (expected visible characters only (...
    """
    if isinstance(words, str):
        raise InputError(f"{what} must be a sequence of words, got a string", expected="a list of tokens")
    try:
        words = tuple(words)
    except TypeError:
        raise InputError(f"{what} must be a sequence of words", expected="a list of tokens") from None
    # Fast path: strings whose single-space join splits back into exactly themselves are non-empty and
    # free of whitespace; only a failing sequence is searched for the bad token.
    try:
        joined = " ".join(words)
        if joined.split() == list(words) and (joined.isascii() and joined.isprintable() or not _INVISIBLE.search(joined)):
            return words
    except TypeError:
        pass
    for w in words:
        if isinstance(w, str) and w and not (w.isascii() and w.isprintable()):
            why = invisible_problem(w)
            if why is not None:
                raise InputError(f"{what}: the word {why}", expected=_INVISIBLE_HINT)
        if not isinstance(w, str) or not w or any(c.isspace() for c in w):
            raise InputError(f"{what} contains an invalid token {w!r}", expected="non-empty strings without spaces")
    return words  # pragma: no cover - the fast path accepts every valid sequence


def _check_float(x: Any, what: str, *, allow_neg_inf: bool = False) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise InputError(f"{what} is {x!r}", expected="a number")
    try:
        x = float(x)
    except OverflowError:
        raise InputError(f"{what} is out of range", expected="a finite number") from None
    if math.isnan(x) or x == math.inf or (x == -math.inf and not allow_neg_inf):
        raise InputError(f"{what} is {x!r}", expected="a finite number")
    return x


def _check_confidences(conf: Any, n: int, what: str) -> tuple[float, ...] | None:
    if conf is None:
        return None
    try:
        conf = tuple(conf)
    except TypeError:
        raise InputError(f"{what} confidences must be a list", expected="one number per word") from None
    if len(conf) != n:
        raise InputError(f"{what} has {len(conf)} confidences for {n} words", expected="one confidence per word")
    out = []
    for c in conf:
        c = _check_float(c, f"{what} confidence")
        if not 0.0 <= c <= 1.0:
            raise InputError(f"{what} confidence {c} is outside [0, 1]", expected="a probability")
        out.append(c)
    return tuple(out)


def _check_times(times: Any, n: int, what: str) -> tuple[tuple[float, float], ...] | None:
    if times is None:
        return None
    try:
        times = tuple(times)
    except TypeError:
        raise InputError(f"{what} times must be a list", expected="one [start, end] per word") from None
    if len(times) != n:
        raise InputError(f"{what} has {len(times)} word times for {n} words", expected="one [start, end] per word")
    out = []
    for t in times:
        try:
            s, e = t
        except (TypeError, ValueError):
            raise InputError(f"{what} word time {t!r} is not a pair", expected="[start, end] in seconds") from None
        s, e = _check_float(s, f"{what} start time"), _check_float(e, f"{what} end time")
        if s < 0 or e < s:
            raise InputError(f"{what} word time [{s}, {e}] is invalid", expected="0 <= start <= end")
        out.append((s, e))
    return tuple(out)


def _check_scores(scores: Any, what: str) -> Mapping[str, float]:
    if scores is None:
        return _EMPTY
    if not isinstance(scores, Mapping):
        raise InputError(f"{what} scores must be a mapping", expected="{name: number}")
    out: dict[str, float] = {}
    for k, v in scores.items():
        if not isinstance(k, str) or not k:
            raise InputError(f"{what} has a score with name {k!r}", expected="non-empty string names")
        out[k] = _check_float(v, f"{what} score {k!r}", allow_neg_inf=True)
    return MappingProxyType(out)


def _check_id(x: Any, what: str, *, optional: bool = True) -> str | None:
    if x is None and optional:
        return None
    if not isinstance(x, str) or not x.strip():
        raise InputError(f"{what} is {x!r}", expected="a non-empty string")
    if not (x.isascii() and x.isprintable()):
        why = invisible_problem(x)
        if why is not None:
            raise InputError(f"{what} {why}", expected="visible characters only (an id with an invisible character "
                                                        "prints like an id it differs from): remove the character")
    return x


def _check_order(x: Any) -> int | float | str | None:
    if x is None or isinstance(x, str):
        return x
    if isinstance(x, bool) or not isinstance(x, int | float) or (isinstance(x, float) and not math.isfinite(x)):
        raise InputError(f"order key is {x!r}", expected="an integer, a finite number or a string")
    return x


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """One recognition hypothesis.

    Attributes:
        words: the tokens, best hypothesis' spelling (no empty tokens, no whitespace inside a token).
        scores: first-pass scores by name (natural-log; conventional names ``am``, ``lm``, ``total``).
        confidences: one confidence in [0, 1] per word, or ``None``.
        times: one ``(start, end)`` in seconds per word, or ``None``.
        meta: any other JSON-like fields a format carries (kept so conversions are lossless).

    >>> Hypothesis(("a", "b"), confidences=(0.9, 1.2))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: hypothesis confidence 1.2 is outside [0, 1] (expected a probability)
    """

    __reduce__ = _reduce

    words: tuple[str, ...]
    scores: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    confidences: tuple[float, ...] | None = None
    times: tuple[tuple[float, float], ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        words = check_words(self.words, "hypothesis")
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "scores", _check_scores(self.scores, "hypothesis"))
        object.__setattr__(self, "confidences", _check_confidences(self.confidences, len(words), "hypothesis"))
        object.__setattr__(self, "times", _check_times(self.times, len(words), "hypothesis"))
        object.__setattr__(self, "meta", freeze_json(self.meta or {}))

    @classmethod
    def from_text(cls, text: str, **kwargs: Any) -> Hypothesis:
        """Build a hypothesis from whitespace-separated text."""
        return cls(tuple(text.split()), **kwargs)

    @property
    def text(self) -> str:
        """The words joined by single spaces."""
        return " ".join(self.words)

    def __len__(self) -> int:
        return len(self.words)


@dataclass(frozen=True, slots=True)
class Span:
    """A labelled span of tokens ``[start, end)`` in a word sequence (e.g. a named entity).

    >>> Span(0, 2, "PER")
    Span(start=0, end=2, label='PER')
    """

    start: int
    end: int
    label: str

    def __post_init__(self) -> None:
        if isinstance(self.start, bool) or isinstance(self.end, bool):
            raise InputError("span bounds must be integers", expected="0 <= start < end")
        if not isinstance(self.start, int) or not isinstance(self.end, int) or not 0 <= self.start < self.end:
            raise InputError(f"span [{self.start}, {self.end}) is invalid", expected="0 <= start < end")
        if not isinstance(self.label, str) or not self.label:
            raise InputError(f"span label {self.label!r} is invalid", expected="a non-empty string")


@dataclass(frozen=True, slots=True)
class NBest:
    """The hypotheses of one utterance, best first.

    Attributes:
        utt_id: the utterance id (unique within a corpus).
        hyps: hypotheses in first-pass rank order, best first (may be empty: nothing was recognised).
        client: the client this utterance belongs to (meeting, device, call), if known.
        speaker: a corpus-unique speaker id, if known.
        order: a sort key within the client (position, start time), if known.
        ref: the reference words, if known (may be empty).
        meta: other JSON-like fields of the source format.
    """

    __reduce__ = _reduce

    utt_id: str
    hyps: tuple[Hypothesis, ...]
    client: str | None = None
    speaker: str | None = None
    order: int | float | str | None = None
    ref: tuple[str, ...] | None = None
    meta: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        _check_id(self.utt_id, "utterance id", optional=False)
        hyps = tuple(self.hyps)
        if not all(isinstance(h, Hypothesis) for h in hyps):
            raise InputError(f"utterance {self.utt_id}: hyps must be Hypothesis records")
        object.__setattr__(self, "hyps", hyps)
        _check_id(self.client, f"utterance {self.utt_id}: client")
        _check_id(self.speaker, f"utterance {self.utt_id}: speaker")
        object.__setattr__(self, "order", _check_order(self.order))
        if self.ref is not None:
            object.__setattr__(self, "ref", check_words(self.ref, f"utterance {self.utt_id}: reference"))
        object.__setattr__(self, "meta", freeze_json(self.meta or {}))

    @property
    def best(self) -> Hypothesis:
        """The first-pass 1-best (an empty hypothesis when the list is empty)."""
        return self.hyps[0] if self.hyps else Hypothesis(())

    def __len__(self) -> int:
        return len(self.hyps)

    def __iter__(self) -> Iterator[Hypothesis]:
        return iter(self.hyps)

    def with_hyps(self, hyps: Sequence[Hypothesis]) -> NBest:
        """A copy with other hypotheses (e.g. re-ranked), everything else kept."""
        return replace(self, hyps=tuple(hyps))


@dataclass(frozen=True, slots=True)
class Transcript:
    """One word sequence for an utterance: a reference, or a recogniser output with word confidences.

    Attributes:
        utt_id: the utterance (or segment) id.
        words: the tokens.
        confidences: one confidence in [0, 1] per word, or ``None``.
        times: one ``(start, end)`` in seconds per word, or ``None``.
        client: the client (meeting, call, device), if known.
        speaker: a corpus-unique speaker id, if known.
        order: a sort key within the client, if known.
        entities: labelled token spans (named entities), possibly empty.
        meta: other JSON-like fields of the source format.

    >>> t = Transcript("s1", ("call", "bob", "smith"), entities=(Span(1, 3, "PER"),))
    >>> [t.words[s.start:s.end] for s in t.entities]
    [('bob', 'smith')]
    """

    __reduce__ = _reduce

    utt_id: str
    words: tuple[str, ...]
    confidences: tuple[float, ...] | None = None
    times: tuple[tuple[float, float], ...] | None = None
    client: str | None = None
    speaker: str | None = None
    order: int | float | str | None = None
    entities: tuple[Span, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        _check_id(self.utt_id, "utterance id", optional=False)
        what = f"transcript {self.utt_id}"
        words = check_words(self.words, what)
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "confidences", _check_confidences(self.confidences, len(words), what))
        object.__setattr__(self, "times", _check_times(self.times, len(words), what))
        _check_id(self.client, f"{what}: client")
        _check_id(self.speaker, f"{what}: speaker")
        object.__setattr__(self, "order", _check_order(self.order))
        ents = tuple(self.entities)
        for s in ents:
            if not isinstance(s, Span):
                raise InputError(f"{what}: entities must be Span records")
            if s.end > len(words):
                raise InputError(f"{what}: entity span [{s.start}, {s.end}) is past the {len(words)} words")
        object.__setattr__(self, "entities", ents)
        object.__setattr__(self, "meta", freeze_json(self.meta or {}))

    @property
    def text(self) -> str:
        """The words joined by single spaces."""
        return " ".join(self.words)

    def __len__(self) -> int:
        return len(self.words)


Utterance = NBest | Transcript
"""Anything a :class:`Population` can group: both records carry ``utt_id``, ``client``, ``speaker``, ``order``."""


def order_key(u: Utterance) -> tuple[int, Any]:
    """Sort key for utterances within a client: numbers first, then strings, then records without one.

    ``sorted()`` is stable, so records without an order key keep their input order.

    >>> [order_key(Transcript("a", (), order=o)) for o in (3, "x", None)]
    [(0, 3), (1, 'x'), (2, 0)]
    """
    o = u.order
    if o is None:
        return (2, 0)
    if isinstance(o, str):
        return (1, o)
    return (0, o)


@dataclass(frozen=True, slots=True)
class Client:
    """One client's utterances, in order.

    >>> c = Client("m1", (Transcript("a", ("hi",), order=2), Transcript("b", ("yo",), order=1)))
    >>> c.id, len(c)
    ('m1', 2)
    """

    id: str
    utterances: tuple[Utterance, ...]

    def __post_init__(self) -> None:
        _check_id(self.id, "client id", optional=False)
        object.__setattr__(self, "utterances", tuple(self.utterances))

    def __len__(self) -> int:
        return len(self.utterances)

    def __iter__(self) -> Iterator[Utterance]:
        return iter(self.utterances)

    @property
    def num_words(self) -> int:
        """Reference words when known, else 1-best words (N-best) or transcript words."""
        n = 0
        for u in self.utterances:
            if isinstance(u, NBest):
                n += len(u.ref) if u.ref is not None else len(u.best)
            else:
                n += len(u)
        return n


KeyFn = Callable[[Utterance], Hashable | None]

_KEYS: dict[str, KeyFn] = {
    "client": lambda u: u.client,
    "speaker": lambda u: u.speaker,
    "utterance": lambda u: u.utt_id,
}


@dataclass(frozen=True, slots=True)
class Population:
    """Utterances grouped into clients by a key, each client's utterances sorted by their order key.

    Clients appear in order of first appearance in the input; within a client, utterances are sorted
    by ``order`` (numbers first, then strings; records without one keep their input order).

    >>> us = [Transcript(f"u{i}", ("w",), client=c, order=i) for i, c in enumerate("abab")]
    >>> pop = Population.group(us, key="client")
    >>> [c.id for c in pop], [u.utt_id for u in pop["b"]]
    (['a', 'b'], ['u1', 'u3'])
    """

    clients: tuple[Client, ...]

    def __post_init__(self) -> None:
        clients = tuple(self.clients)
        ids = [c.id for c in clients]
        if len(set(ids)) != len(ids):
            raise InputError("population has duplicate client ids")
        object.__setattr__(self, "clients", clients)

    @classmethod
    def group(
        cls,
        utterances: Iterable[Utterance],
        key: str | KeyFn = "client",
        *,
        missing: str = "error",
    ) -> Population:
        """Group utterances by ``key`` (``"client"``, ``"speaker"``, ``"utterance"`` or a function).

        Args:
            utterances: N-best lists or transcripts.
            key: the grouping key.
            missing: what to do with an utterance whose key is ``None``: ``"error"`` (raise
                :class:`InputError`), ``"drop"``, or ``"own"`` (its own client, named by its utterance id).
        """
        fn = _KEYS[key] if isinstance(key, str) and key in _KEYS else key
        if isinstance(fn, str):
            raise InputError(f"unknown grouping key {key!r}", expected=f"one of {sorted(_KEYS)} or a function")
        groups: dict[str, list[Utterance]] = {}
        for u in utterances:
            k = fn(u)
            if k is None:
                if missing == "drop":
                    continue
                if missing == "own":
                    k = u.utt_id
                else:
                    raise InputError(f"utterance {u.utt_id} has no {key if isinstance(key, str) else 'key'}",
                                     expected="every utterance to carry the grouping key")
            groups.setdefault(str(k), []).append(u)
        return cls(tuple(Client(cid, tuple(sorted(us, key=order_key))) for cid, us in groups.items()))

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[Client]:
        return iter(self.clients)

    def __getitem__(self, client_id: str) -> Client:
        for c in self.clients:
            if c.id == client_id:
                return c
        raise KeyError(client_id)

    @property
    def num_utterances(self) -> int:
        """Total number of utterances over all clients."""
        return sum(len(c) for c in self.clients)
