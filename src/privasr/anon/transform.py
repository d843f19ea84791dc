"""Privacy transformations of transcripts with named-entity spans (paper 003, section 2.1).

Given a transcript as words and its named entities as token spans labelled ``PER``, ``ORG``, ``LOC`` or
``MISC`` (:data:`LABELS`; :func:`map_label` maps OntoNotes labels, as spaCy's English pipelines predict them,
onto these four), an :class:`Anonymizer` rewrites it in one of three ways:

* ``"surrogate"`` -- same-type, word-by-word replacement with random surrogates (Adelani et al. 2020): every
  word of an entity is replaced by a word drawn from its category's pool (:func:`surrogate_pools`, lower-cased
  ASR-style words from Faker's English name, place, company and word lists, written in the original word's
  case pattern by :func:`match_case`, so cased text stays cased). The replacement is **consistent
  within a client**: an :class:`Anonymizer` keeps one table per client, so the same original word of the same
  category always becomes the same surrogate there (another client gets its own draws), and it never maps a
  word to itself. Seeded by ``(seed, client)``, so the output does not depend on the order clients are seen in.
* ``"tag"`` -- each entity becomes one class tag (``<PER>``, ``<ORG>``, ``<LOC>``, ``<MISC>``), the input of
  class-based LMs;
* ``"redact"`` -- the entity's words are removed.

Inputs are never modified: every function returns new tuples.

>>> anon = Anonymizer("surrogate", seed=0)
>>> words = ("i", "met", "john", "smith", "in", "paris")
>>> spans = [EntitySpan(2, 4, "PER"), EntitySpan(5, 6, "LOC")]
>>> out = anon.transform(words, spans, client="c1")
>>> len(out) == len(words) and out[:2] == ("i", "met") and out[2] != "john"
True
>>> anon.transform(("john", "called"), [EntitySpan(0, 1, "PER")], client="c1")[0] == out[2]
True
>>> Anonymizer("tag").transform(words, spans)
('i', 'met', '<PER>', 'in', '<LOC>')
>>> Anonymizer("redact").transform(words, spans)
('i', 'met', 'in')
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["LABELS", "ONTONOTES_TO_LABEL", "MODES", "EntitySpan", "Anonymizer", "map_label", "surrogate_pools",
           "check_spans", "match_case"]

LABELS = ("PER", "ORG", "LOC", "MISC")
"""The entity categories of paper 003."""

ONTONOTES_TO_LABEL: Mapping[str, str] = {
    "PERSON": "PER", "ORG": "ORG", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC",
    "NORP": "MISC", "PRODUCT": "MISC", "EVENT": "MISC", "WORK_OF_ART": "MISC", "LAW": "MISC", "LANGUAGE": "MISC",
    "DATE": "MISC", "TIME": "MISC",
}
"""OntoNotes (spaCy) labels -> paper 003's categories; the numeric ones (CARDINAL, MONEY, ...) are not entities."""

MODES = ("surrogate", "tag", "redact")
"""The transformations."""


def map_label(label: str) -> str | None:
    """Paper 003's category of an OntoNotes or CoNLL label (``None``: not an entity to anonymise).

    >>> map_label("GPE"), map_label("PER"), map_label("CARDINAL")
    ('LOC', 'PER', None)
    """
    if label in LABELS:
        return label
    return ONTONOTES_TO_LABEL.get(label)


@dataclass(frozen=True)
class EntitySpan:
    """Words ``start .. end - 1`` of a transcript form one entity of category ``label`` (one of :data:`LABELS`).

    >>> EntitySpan(2, 2, "PER")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: entity span [2, 2) is empty or reversed (expected 0 <= start < end)
    """

    start: int
    end: int
    label: str

    def __post_init__(self) -> None:
        for name in ("start", "end"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | np.integer):
                raise InputError(f"entity span {name}={v!r}", expected="an integer word index")
        if not 0 <= self.start < self.end:
            raise InputError(f"entity span [{self.start}, {self.end}) is empty or reversed",
                             expected="0 <= start < end")
        if self.label not in LABELS:
            raise InputError(f"entity label {self.label!r}", expected=f"one of {list(LABELS)} (see map_label)")


def check_spans(words: Sequence[str], spans: Iterable[EntitySpan]) -> list[EntitySpan]:
    """The spans sorted by start, checked to lie within ``words`` and not to overlap.

    >>> check_spans(("a", "b"), [EntitySpan(1, 3, "PER")])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: entity span [1, 3) goes past the transcript's 2 words (expected spans within the words)
    """
    out = sorted(spans, key=lambda s: (s.start, s.end))
    for s in out:
        if not isinstance(s, EntitySpan):
            raise InputError(f"an entity span is a {type(s).__name__}", expected="an EntitySpan")
        if s.end > len(words):
            raise InputError(f"entity span [{s.start}, {s.end}) goes past the transcript's {len(words)} words",
                             expected="spans within the words")
    for a, b in zip(out, out[1:], strict=False):
        if b.start < a.end:
            raise InputError(f"entity spans [{a.start}, {a.end}) and [{b.start}, {b.end}) overlap",
                             expected="non-overlapping spans")
    return out


def _words_of(names: Iterable[str]) -> tuple[str, ...]:
    out = set()
    for n in names:
        for w in n.lower().replace("-", " ").split():
            if w.isalpha():
                out.add(w)
    return tuple(sorted(out))


@functools.lru_cache(maxsize=1)
def surrogate_pools() -> dict[str, tuple[str, ...]]:
    """The surrogate words of each category, lower-case single alphabetic words, sorted: ``PER`` Faker's English
    first and last names, ``LOC`` its countries and US states, ``ORG`` last names and company suffixes, ``MISC``
    its lorem word list.

    >>> pools = surrogate_pools()
    >>> sorted(pools) == sorted(LABELS) and all(len(p) > 40 for p in pools.values())
    True
    """
    from faker.providers.address.en import Provider as Address
    from faker.providers.address.en_US import Provider as UsAddress
    from faker.providers.lorem.en_US import Provider as Lorem
    from faker.providers.person.en_US import Provider as Person

    first, last = tuple(Person.first_names), tuple(Person.last_names)  # sequences or name -> weight mappings
    return {
        "PER": _words_of((*first, *last)),
        "LOC": _words_of((*Address.countries, *UsAddress.states)),
        "ORG": _words_of((*last, "group", "inc", "corporation", "company", "partners", "holdings", "industries",
                          "systems", "associates", "limited", "international", "solutions", "labs")),
        "MISC": _words_of(Lorem.word_list),
    }


def match_case(original: str, surrogate: str) -> str:
    """``surrogate`` written in the case pattern of ``original``: upper, title or (otherwise) lower case.

    >>> match_case("JOHN", "mary"), match_case("John", "mary"), match_case("john", "mary"), match_case("McD", "ann")
    ('MARY', 'Mary', 'mary', 'Ann')
    """
    if len(original) > 1 and original.isupper():
        return surrogate.upper()
    if original[:1].isupper():
        return surrogate[:1].upper() + surrogate[1:]
    return surrogate


def _client_seed(seed: int, client: str) -> list[int]:
    digest = hashlib.sha256(client.encode("utf-8")).digest()
    return [int(seed), int.from_bytes(digest[:8], "little")]


@dataclass
class Anonymizer:
    """Rewrites transcripts with entity spans (see the module docstring).

    Args:
        mode: ``"surrogate"``, ``"tag"`` or ``"redact"``.
        seed: seeds the surrogate draws (with the client's name).

    Raises:
        ConfigError: an unknown mode or a seed that is not an integer.
    """

    mode: str = "surrogate"
    seed: int = 0
    _tables: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict, init=False, repr=False)
    _rngs: dict[str, np.random.Generator] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"anonymisation mode {self.mode!r}", expected=f"one of {list(MODES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ConfigError(f"seed={self.seed!r}", expected="an integer")

    def surrogate(self, word: str, label: str, client: str = "") -> str:
        """The surrogate of ``word`` (category ``label``) for ``client``: drawn once, then always the same.

        >>> a = Anonymizer(seed=1)
        >>> a.surrogate("john", "PER", "x") == a.surrogate("john", "PER", "x") != "john"
        True
        """
        if label not in LABELS:
            raise InputError(f"entity label {label!r}", expected=f"one of {list(LABELS)}")
        table = self._tables.setdefault(client, {})
        key = (label, word.lower())
        if key not in table:
            rng = self._rngs.setdefault(client, np.random.default_rng(_client_seed(self.seed, client)))
            pool = surrogate_pools()[label]
            while True:
                pick = pool[int(rng.integers(len(pool)))]
                if pick != key[1]:
                    break
            table[key] = pick
        return table[key]

    def transform(self, words: Sequence[str], spans: Iterable[EntitySpan], client: str = "") -> tuple[str, ...]:
        """``words`` with every entity span rewritten by the mode; a new tuple (the input is not changed).

        Raises:
            InputError: spans outside the words, overlapping, or with an unknown label.
        """
        ws = tuple(words)
        ordered = check_spans(ws, spans)
        out: list[str] = []
        pos = 0
        for s in ordered:
            out.extend(ws[pos:s.start])
            if self.mode == "surrogate":
                out.extend(match_case(w, self.surrogate(w, s.label, client)) for w in ws[s.start:s.end])
            elif self.mode == "tag":
                out.append(f"<{s.label}>")
            pos = s.end
        out.extend(ws[pos:])
        return tuple(out)

    def mapping(self, client: str = "") -> dict[tuple[str, str], str]:
        """A copy of ``client``'s surrogate table: ``(label, original word) -> surrogate``."""
        return dict(self._tables.get(client, {}))
