"""Planted names of every shape: how often does a name survive anonymisation, shape by shape?

A detector's recall on annotated text (:mod:`privasr.anon.ner_metrics`) pools the names a corpus happens to
have. Here names are made to order -- Faker's first and last names of 14 locales (English, Irish, Dutch,
German, Spanish, French, Italian, Polish, Indian English, Yoruba, Igbo, Zulu, Twi), folded to ASCII -- in every
:data:`SHAPES` (particles, apostrophes, ``mc``, hyphens, initials, titles, middle names), written in every
:data:`CASINGS` (ASR-style lower case, ALL CAPS, cased with punctuation), inside spoken carrier sentences
(:data:`CARRIERS`, some with a verb right after the name). :func:`plant` draws them; :func:`survival`
anonymises each sentence (surrogate mode, :class:`~privasr.anon.transform.Anonymizer`) with a detector's spans
and counts, per shape and casing:

* **survival**: the share of planted names with at least one name token unchanged (a title such as ``mr`` is
  not a name token);
* **collateral**: the share of the carrier's own words (everything but the name and its title) rewritten.

>>> plants = plant(SHAPES, CASINGS, 2, seed=0)
>>> len(plants) == 2 * len(SHAPES) * len(CASINGS)
True
>>> p = plants[0]
>>> p.shape, p.casing, p.words[p.start:p.end] == p.name
('first_last', 'lower', True)
>>> class Nothing:
...     def detect(self, sentences): return [[] for _ in sentences]
>>> survival(Nothing(), plants)["survival"]
1.0
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.errors import ConfigError

__all__ = ["SHAPES", "CASINGS", "CARRIERS", "LOCALES", "PlantedName", "plant", "survival"]

SHAPES = ("first_last", "first_middle_last", "title_last", "title_first_last", "apostrophe", "mc",
          "hyphenated", "particle", "initials", "hyphenated_first")
"""The name shapes: ``first_last`` (``wendela orsatti``), ``first_middle_last``, ``title_last`` (``mr
okafor``), ``title_first_last``, ``apostrophe`` (``o'halloran``, ``d'souza``), ``mc`` (``mcallister``,
``macleod``), ``hyphenated`` surnames (``okonkwo-bright``), ``particle`` (``van der berg``, ``de la cruz``,
``al-rashid``, ``von``, ``bin``), ``initials`` (``j r okafor``), ``hyphenated_first`` (``jean-luc``)."""

CASINGS = ("lower", "upper", "cased")
"""How the sentence is written: ASR-style lower case without punctuation, ALL CAPS (Kaldi-style transcripts),
or cased with a full stop and, after a title, a period (``Mr. O'Halloran``)."""

CARRIERS: tuple[tuple[str, ...], ...] = (
    ("i", "spoke", "to", "{name}", "about", "the", "contract", "yesterday"),
    ("{name}", "will", "send", "the", "figures", "on", "monday"),
    ("can", "you", "ask", "{name}", "to", "call", "me", "back"),
    ("the", "report", "was", "signed", "by", "{name}"),
    ("{name}", "chaired", "the", "meeting"),
    ("{name}", "joined", "the", "call", "late"),
    ("thanks", "{name}", "that", "was", "helpful"),
    ("we", "should", "invite", "{name}", "to", "the", "next", "review"),
)
"""Spoken carrier sentences, lower case (``{name}`` is where the name goes)."""

LOCALES = ("en_US", "en_GB", "en_IE", "nl_NL", "de_DE", "es_ES", "fr_FR", "it_IT", "pl_PL", "en_IN", "yo_NG",
           "ig_NG", "zu_ZA", "tw_GH")
"""Faker locales the first and last names come from."""

_TITLES = ("mr", "mrs", "ms", "dr", "mister", "doctor", "professor")
_PARTICLES = (("van",), ("van", "der"), ("van", "de"), ("de",), ("de", "la"), ("von",), ("da",), ("bin",),
              ("al-",), ("el-",))
_INITIALS = "bcdfghjklmnprstvwz"  # no a, e, i, o, u, y: those read as words


@dataclass(frozen=True)
class PlantedName:
    """A carrier sentence ``words`` with a name at ``[start, end)``; ``title`` tokens before ``start`` belong
    to neither the name nor the carrier."""

    shape: str
    casing: str
    words: tuple[str, ...]
    start: int
    end: int
    title: int

    @property
    def name(self) -> tuple[str, ...]:
        """The name's tokens."""
        return self.words[self.start:self.end]


def _ascii(s: str) -> str:
    return unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode().lower()


@functools.lru_cache(maxsize=1)
def _pools() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Single-token ASCII first and last names (2+ letters) of :data:`LOCALES`."""
    import importlib

    firsts: set[str] = set()
    lasts: set[str] = set()
    for loc in LOCALES:
        prov = importlib.import_module(f"faker.providers.person.{loc}").Provider
        for attr, out in (("first_names", firsts), ("first_names_male", firsts), ("first_names_female", firsts),
                          ("last_names", lasts)):
            v = getattr(prov, attr, None)
            if v is None or isinstance(v, property | str):
                continue
            for n in v:
                w = _ascii(str(n))
                if w.isalpha() and len(w) > 1:
                    out.add(w)
    return tuple(sorted(firsts)), tuple(sorted(lasts))


def _name(shape: str, rng: np.random.Generator) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(title tokens, name tokens) of one name of ``shape``."""
    firsts, lasts = _pools()

    def pick(pool: Sequence[str]) -> str:
        return pool[int(rng.integers(len(pool)))]

    first, last = pick(firsts), pick(lasts)
    title = (pick(_TITLES),)
    if shape == "first_last":
        return (), (first, last)
    if shape == "first_middle_last":
        return (), (first, pick(firsts), last)
    if shape == "title_last":
        return title, (last,)
    if shape == "title_first_last":
        return title, (first, last)
    if shape == "apostrophe":
        return (), (first, pick(("o'", "d'")) + last)
    if shape == "mc":
        return (), (first, pick(("mc", "mac")) + last)
    if shape == "hyphenated":
        return (), (first, f"{last}-{pick(lasts)}")
    if shape == "particle":
        particle = _PARTICLES[int(rng.integers(len(_PARTICLES)))]
        if particle[-1].endswith("-"):
            return (), (first, particle[-1] + last)
        return (), (first, *particle, last)
    if shape == "initials":
        k = 1 + int(rng.integers(2))
        return (), (*(pick(_INITIALS) for _ in range(k)), last)
    if shape == "hyphenated_first":
        return (), (f"{first}-{pick(firsts)}", last)
    raise ConfigError(f"name shape {shape!r}", expected=f"one of {list(SHAPES)}")


def _cased(word: str) -> str:
    """``o'halloran`` -> ``O'Halloran``, ``okonkwo-bright`` -> ``Okonkwo-Bright``, ``mcallister`` ->
    ``McAllister``; particles stay lower case."""
    if word in ("van", "der", "de", "la", "von", "da", "bin"):
        return word
    out = "-".join("'".join(p[:1].upper() + p[1:] for p in part.split("'")) for part in word.split("-"))
    if out.startswith("Mc") and len(out) > 2:
        out = "Mc" + out[2].upper() + out[3:]
    return out


def _write(carrier: Sequence[str], title: Sequence[str], name: Sequence[str], casing: str
           ) -> tuple[tuple[str, ...], int, int]:
    """The sentence in ``casing``, and where the name is in it."""
    at = carrier.index("{name}")
    if casing == "cased":
        title = tuple(t[:1].upper() + t[1:] + ("." if t in ("mr", "mrs", "ms", "dr") else "") for t in title)
        name = tuple(_cased(w) for w in name)
        before = list(carrier[:at])
        after = list(carrier[at + 1:])
        words = ["I" if w == "i" else w for w in [*before, *title, *name, *after, "."]]
        words[0] = words[0][:1].upper() + words[0][1:]
    else:
        words = [*carrier[:at], *title, *name, *carrier[at + 1:]]
        if casing == "upper":
            words = [w.upper() for w in words]
    start = at + len(title)
    return tuple(words), start, start + len(name)


def plant(shapes: Sequence[str] = SHAPES, casings: Sequence[str] = CASINGS, n: int = 100, *, seed: int = 0
          ) -> list[PlantedName]:
    """``n`` planted names for every shape and casing (``n * len(shapes) * len(casings)`` sentences), each in a
    carrier of :data:`CARRIERS` drawn at random; seeded.

    Raises:
        ConfigError: an unknown shape or casing, or ``n < 1``.
    """
    if n < 1:
        raise ConfigError(f"n={n!r}", expected="at least one name per shape")
    for c in casings:
        if c not in CASINGS:
            raise ConfigError(f"casing {c!r}", expected=f"one of {list(CASINGS)}")
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        for casing in casings:
            for _ in range(n):
                title, name = _name(shape, rng)
                carrier = CARRIERS[int(rng.integers(len(CARRIERS)))]
                words, start, end = _write(carrier, title, name, casing)
                out.append(PlantedName(shape, casing, words, start, end, len(title)))
    return out


def survival(detector: Any, plants: Sequence[PlantedName], *, seed: int = 0) -> dict[str, Any]:
    """Anonymise every planted sentence (surrogate mode) with ``detector``'s spans and count what survives.

    Returns ``survival`` and ``collateral`` pooled, ``by_shape`` and ``by_casing`` (each ``{name: {"names": n,
    "survival": rate, "collateral": rate}}``) and ``examples``: up to 3 sentences per shape whose name survived, as
    ``"original -> anonymised"``.
    """
    from privasr.anon.transform import Anonymizer

    if not plants:
        raise ConfigError("no planted names", expected="at least one")
    spans = detector.detect([p.words for p in plants])
    anon = Anonymizer(mode="surrogate", seed=seed)
    rows = []
    examples: dict[str, list[str]] = {}
    for k, (p, ss) in enumerate(zip(plants, spans, strict=True)):
        out = anon.transform(p.words, ss, client=str(k))
        leaked = any(out[i] == p.words[i] for i in range(p.start, p.end))
        carrier = [i for i in range(len(p.words)) if not (p.start - p.title <= i < p.end)]
        changed = sum(out[i] != p.words[i] for i in carrier)
        rows.append((p.shape, p.casing, leaked, changed, len(carrier)))
        if leaked and len(examples.setdefault(p.shape, [])) < 3:
            examples[p.shape].append(f"{' '.join(p.words)} -> {' '.join(out)}")

    def summary(key: int) -> dict[str, dict[str, float]]:
        groups: dict[str, list[tuple[Any, ...]]] = {}
        for r in rows:
            groups.setdefault(r[key], []).append(r)
        return {g: {"names": len(rs), "survival": sum(r[2] for r in rs) / len(rs),
                    "collateral": sum(r[3] for r in rs) / max(1, sum(r[4] for r in rs))} for g, rs in groups.items()}

    return {"names": len(rows), "survival": sum(r[2] for r in rows) / len(rows),
            "collateral": sum(r[3] for r in rows) / max(1, sum(r[4] for r in rows)),
            "by_shape": summary(0), "by_casing": summary(1), "examples": examples}
