"""Name canaries: person names planted in transcripts, to count how many an anonymiser lets through.

An anonymiser's recall on annotated text (:mod:`privasr.anon.ner_metrics`) says how many gold mentions it
misses; a canary says whether a *given* secret survives. :func:`plant_names` inserts sentences that carry fresh
full names (lower-cased as ASR writes them, never a word of the text they go into) into documents at random
positions, through a few spoken templates. The names come from one of two sources:

* ``"listed"``: Faker's offline person-name lists, which the project's detectors also use as a gazetteer
  (:func:`~privasr.anon.ner.faker_names`): the canaries a gazetteer can catch;
* ``"unlisted"``: made-up names (consonant-vowel syllables) in no Faker list: what a name the detector has never
  seen faces, which it can only find from its context (a real user's unusual name, a misrecognised name).

:func:`surviving` compares the anonymised text with what was planted: a canary **leaks** when any of its name
tokens is unchanged, and **leaks fully** when all of them are.

>>> import numpy as np
>>> docs = [[("we", "met", "at", "noon")], [("the", "budget", "is", "late")]]
>>> planted_docs, canaries = plant_names(docs, 2, np.random.default_rng(0))
>>> len(canaries), sum(len(d) for d in planted_docs)
(2, 4)
>>> c = canaries[0]
>>> planted_docs[c.doc][c.sentence][c.start:c.end] == c.name
True
>>> surviving(canaries, planted_docs, planted_docs)["leak_rate_full"]   # no anonymisation: every name leaks
1.0
>>> masked = [[tuple("<name>" for _ in s) for s in d] for d in planted_docs]
>>> surviving(canaries, planted_docs, masked)["leaked_any"]
0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = ["NameCanary", "plant_names", "surviving", "TEMPLATES", "person_names", "unlisted_names", "SOURCES"]

SOURCES = ("unlisted", "listed")

TEMPLATES: tuple[tuple[str, ...], ...] = (
    ("i", "spoke", "to", "{name}", "about", "the", "contract", "yesterday"),
    ("{name}", "will", "send", "the", "figures", "on", "monday"),
    ("can", "you", "ask", "{name}", "to", "call", "me", "back"),
    ("my", "name", "is", "{name}", "and", "i", "work", "in", "finance"),
    ("we", "should", "invite", "{name}", "to", "the", "next", "meeting"),
)
"""Spoken sentences a name is planted in (lower case, no punctuation, as ASR writes)."""


@dataclass(frozen=True)
class NameCanary:
    """A planted name: document ``doc``, sentence ``sentence`` (of the planted documents), tokens
    ``[start, end)`` are ``name``."""

    doc: int
    sentence: int
    start: int
    end: int
    name: tuple[str, ...]


def person_names(locale: str = "en_US") -> tuple[list[str], list[str]]:
    """Faker's first and last names of ``locale`` (offline lists in the package), lower-cased, single words.

    >>> first, last = person_names()
    >>> len(first) > 100 and len(last) > 100 and all(" " not in w for w in first)
    True
    """
    try:
        from faker import Faker
    except ImportError as e:  # pragma: no cover - Faker comes with the ner extra
        raise ConfigError("name canaries need Faker", expected="pip install 'privasr[ner]'") from e
    provider = Faker(locale).provider("faker.providers.person")
    def words(attr: str) -> list[str]:
        src = getattr(provider, attr, ())
        items = src.keys() if isinstance(src, dict) else src
        return sorted({w.lower() for w in items if w.isalpha()})
    first = sorted(set(words("first_names_female")) | set(words("first_names_male")) | set(words("first_names")))
    return first, words("last_names")


_CONSONANTS = tuple("bdfgklmnprstvz")
_VOWELS = tuple("aeiou")


def unlisted_names(n: int, rng: np.random.Generator, exclude: set[str] | frozenset[str] = frozenset()
                   ) -> tuple[list[str], list[str]]:
    """``n`` made-up first names (two syllables) and ``n`` last names (three syllables and a final consonant),
    in no Faker person-name list and not in ``exclude``.

    >>> first, last = unlisted_names(3, np.random.default_rng(0))
    >>> len(set(first)) == len(set(last)) == 3 and all(w.isalpha() for w in first + last)
    True
    """
    from privasr.anon.ner import faker_names

    listed = faker_names("all")
    def make(syllables: int, coda: bool, taken: set[str]) -> str:
        while True:
            w = "".join(str(rng.choice(_CONSONANTS)) + str(rng.choice(_VOWELS)) for _ in range(syllables))
            w += str(rng.choice(_CONSONANTS)) if coda else ""
            if w not in listed and w not in exclude and w not in taken:
                taken.add(w)
                return w
    taken: set[str] = set()
    return [make(2, False, taken) for _ in range(n)], [make(3, True, taken) for _ in range(n)]


def plant_names(docs: Sequence[Sequence[Sequence[str]]], n: int, rng: np.random.Generator, *,
                source: str = "unlisted", templates: Sequence[Sequence[str]] = TEMPLATES, locale: str = "en_US"
                ) -> tuple[list[list[tuple[str, ...]]], list[NameCanary]]:
    """``docs`` (documents of tokenised sentences; not modified) with ``n`` canary sentences inserted, and the
    canaries.

    Each canary is a fresh ``first last`` name from ``source`` (``"unlisted"`` or ``"listed"``, see the module
    docstring; distinct canaries, no name word occurring in ``docs``) in a random template, inserted at a
    random position of a random document.

    Raises:
        InputError: no documents, or ``n`` larger than the names available.
        ConfigError: an unknown source or a bad ``n``.
    """
    if not docs:
        raise InputError("no documents to plant name canaries in")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ConfigError(f"n={n!r}", expected="an integer >= 0")
    if source not in SOURCES:
        raise ConfigError(f"name source {source!r}", expected=f"one of {', '.join(SOURCES)}")
    vocab = {w.lower() for d in docs for s in d for w in s}
    if source == "unlisted":
        first, last = unlisted_names(n, rng, frozenset(vocab))
    else:
        first, last = person_names(locale)
    first = [w for w in first if w not in vocab]
    last = [w for w in last if w not in vocab]
    if n > min(len(first), len(last)):
        raise InputError(f"{n} name canaries", expected=f"at most {min(len(first), len(last))} (distinct names)")
    names = list(zip(rng.permutation(first)[:n], rng.permutation(last)[:n], strict=True))
    out: list[list[tuple[str, ...]]] = [[tuple(s) for s in d] for d in docs]
    placed: list[tuple[int, int, tuple[str, ...], int]] = []
    for k in range(n):
        tpl = tuple(templates[int(rng.integers(len(templates)))])
        slot = tpl.index("{name}")
        name = (str(names[k][0]), str(names[k][1]))
        sentence = tpl[:slot] + name + tpl[slot + 1:]
        d = int(rng.integers(len(out)))
        pos = int(rng.integers(len(out[d]) + 1))
        out[d].insert(pos, sentence)
        placed = [(dd, (p + 1 if dd == d and p >= pos else p), nm, st) for dd, p, nm, st in placed]
        placed.append((d, pos, name, slot))
    canaries = [NameCanary(d, p, st, st + len(nm), nm) for d, p, nm, st in placed]
    return out, canaries


def surviving(canaries: Sequence[NameCanary], planted: Sequence[Sequence[Sequence[str]]],
              anonymised: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
    """How many canaries an anonymiser let through: ``leaked_any`` (a name token unchanged), ``leaked_full``
    (every name token unchanged), their rates, and the leaked names.

    ``anonymised`` must keep the planted documents' sentence and token positions (surrogate or tag
    anonymisation with one token per token, as :class:`~privasr.anon.transform.Anonymizer` does).

    Raises:
        InputError: a canary's sentence is missing or has another length in ``anonymised``.
    """
    leaked_any, leaked_full = [], []
    for c in canaries:
        try:
            src = planted[c.doc][c.sentence]
            out = anonymised[c.doc][c.sentence]
        except IndexError:
            raise InputError(f"canary {' '.join(c.name)!r}: sentence {c.sentence} of document {c.doc} is missing "
                             "from the anonymised text") from None
        if len(out) != len(src):
            raise InputError(f"canary {' '.join(c.name)!r}: the anonymised sentence has {len(out)} tokens",
                             expected=f"{len(src)}, one per planted token")
        same = [out[i] == src[i] for i in range(c.start, c.end)]
        if any(same):
            leaked_any.append(" ".join(c.name))
        if all(same):
            leaked_full.append(" ".join(c.name))
    n = len(canaries)
    return {"canaries": n, "leaked_any": len(leaked_any), "leaked_full": len(leaked_full),
            "leak_rate_any": len(leaked_any) / n if n else 0.0, "leak_rate_full": len(leaked_full) / n if n else 0.0,
            "leaked_names": leaked_any}
