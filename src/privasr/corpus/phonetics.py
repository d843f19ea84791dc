"""Pronunciations and acoustic confusability of English words.

The synthetic corpus (:mod:`privasr.synth`) simulates a recogniser's errors by substituting words
with words that *sound* alike. This module supplies that notion of "sounds alike":

* :func:`load_cmudict` reads the CMU pronouncing dictionary that ships with ``pocketsphinx``
  (``<pocketsphinx.get_model_path()>/en-us/cmudict-en-us.dict``, ~135k entries, ARPAbet phones).
  Stress digits, if any, are stripped; variants such as ``read(2)`` become extra pronunciations of
  ``read``.
* :func:`phone_distance` is a weighted Levenshtein distance between phone sequences: substituting a vowel
  for a vowel, or a consonant for one of the same manner or place of articulation, costs less than an
  unrelated substitution (see :func:`substitution_cost`); inserting or deleting a weak phone (schwa,
  ``HH``) costs less than a full phone. :func:`phone_similarity` normalises it into ``[0, 1]``.
* :func:`letter_to_sound` approximates a pronunciation for words the dictionary lacks, from spelling
  alone (greedy longest-match rules for common English digraphs and letters, silent final ``e``, doubled
  consonants collapsed). It is crude -- good enough for invented names to have *some* plausible
  neighbours, never a substitute for a real lexicon.
* :class:`Confusions` finds, for every word of a vocabulary, its most confusable neighbours. All pairs
  would be too slow for 20k words in Python, so the search is vectorised: candidates are restricted to
  pronunciations within ``max_length_diff`` phones, pre-filtered by the cosine similarity of a small
  phone feature vector (phone counts, broad-class bigrams, first and last phone) computed as one matrix
  product per length bucket, and the best ``prefilter`` candidates of each word are then scored with the
  exact weighted edit distance, run as a numpy dynamic programme over all (word, candidate) pairs at once.

>>> lex = load_cmudict()
>>> lex["write"]
(('R', 'AY', 'T'),)
>>> phone_distance(("R", "AY", "T"), ("L", "AY", "T"))
0.4
>>> conf = Confusions(["right", "write", "light", "bright", "table", "budget"])
>>> [n.word for n in conf.neighbours("right", 3)]
['write', 'light', 'bright']
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from privasr.errors import ConfigError, InputError

__all__ = [
    "PHONES",
    "VOWELS",
    "Pronunciation",
    "Lexicon",
    "default_cmudict_path",
    "load_cmudict",
    "substitution_cost",
    "indel_cost",
    "phone_distance",
    "phone_similarity",
    "letter_to_sound",
    "Neighbour",
    "Confusions",
]

Pronunciation = tuple[str, ...]
Lexicon = Mapping[str, tuple[Pronunciation, ...]]

VOWELS: tuple[str, ...] = ("AA", "AE", "AH", "AO", "AW", "AY", "EH", "ER", "EY", "IH", "IY", "OW", "OY", "UH", "UW")
CONSONANTS: tuple[str, ...] = (
    "B", "CH", "D", "DH", "F", "G", "HH", "JH", "K", "L", "M", "N", "NG", "P", "R", "S", "SH", "T", "TH",
    "V", "W", "Y", "Z", "ZH",
)
PHONES: tuple[str, ...] = VOWELS + CONSONANTS
"""The 39 ARPAbet phones of the CMU dictionary (without stress)."""

_PHONE_INDEX = {p: i for i, p in enumerate(PHONES)}
_PAD = len(PHONES)  # index of the padding symbol in the cost tables

# Vowels: (height 0 = open .. 3 = close, backness 0 = front .. 2 = back).
_VOWEL_FEATS: dict[str, tuple[float, float]] = {
    "IY": (3, 0), "IH": (2.5, 0), "EY": (2, 0), "EH": (1.5, 0), "AE": (0.5, 0),
    "AH": (1.5, 1), "ER": (1.5, 1), "AY": (0.5, 1), "AW": (0.5, 1.5),
    "UW": (3, 2), "UH": (2.5, 2), "OW": (2, 2), "AO": (1, 2), "AA": (0, 2), "OY": (1, 2),
}
# Consonants: (manner, place, voiced).
_CONS_FEATS: dict[str, tuple[str, str, bool]] = {
    "P": ("stop", "labial", False), "B": ("stop", "labial", True),
    "T": ("stop", "alveolar", False), "D": ("stop", "alveolar", True),
    "K": ("stop", "velar", False), "G": ("stop", "velar", True),
    "CH": ("affricate", "postalveolar", False), "JH": ("affricate", "postalveolar", True),
    "F": ("fricative", "labiodental", False), "V": ("fricative", "labiodental", True),
    "TH": ("fricative", "dental", False), "DH": ("fricative", "dental", True),
    "S": ("fricative", "alveolar", False), "Z": ("fricative", "alveolar", True),
    "SH": ("fricative", "postalveolar", False), "ZH": ("fricative", "postalveolar", True),
    "HH": ("fricative", "glottal", False),
    "M": ("nasal", "labial", True), "N": ("nasal", "alveolar", True), "NG": ("nasal", "velar", True),
    "L": ("liquid", "alveolar", True), "R": ("liquid", "postalveolar", True),
    "W": ("glide", "labial", True), "Y": ("glide", "palatal", True),
}
_SONORANT = {"nasal", "liquid", "glide"}
# Pairs that listeners and recognisers confuse more than their features suggest.
_SPECIAL: dict[frozenset[str], float] = {
    frozenset(("TH", "F")): 0.3, frozenset(("DH", "V")): 0.35, frozenset(("DH", "D")): 0.35,
    frozenset(("TH", "T")): 0.4, frozenset(("M", "N")): 0.35, frozenset(("N", "NG")): 0.35,
    frozenset(("L", "R")): 0.4, frozenset(("S", "SH")): 0.4, frozenset(("Z", "ZH")): 0.4,
    frozenset(("CH", "SH")): 0.4, frozenset(("JH", "ZH")): 0.4, frozenset(("W", "V")): 0.5,
    frozenset(("ER", "R")): 0.4, frozenset(("W", "UW")): 0.6, frozenset(("Y", "IY")): 0.6,
    frozenset(("L", "UH")): 0.8,
}
# Weak phones that are often dropped or inserted.
_INDEL: dict[str, float] = {"AH": 0.6, "HH": 0.6, "IH": 0.8, "T": 0.8, "D": 0.8, "R": 0.9}


def substitution_cost(a: str, b: str) -> float:
    """Cost of recognising phone ``a`` as phone ``b`` (0 when equal, at most 1).

    Vowels cost 0.25-0.75 among themselves depending on height and backness; consonants cost 0.3 for a
    voicing pair, 0.5-0.6 for the same manner or place, 0.6 among sonorants, 0.85 otherwise; a few
    classic confusions (``TH``/``F``, ``M``/``N``, ``L``/``R``...) are cheaper; vowel-consonant is 1.

    >>> substitution_cost("P", "B"), substitution_cost("IY", "IH"), substitution_cost("K", "IY")
    (0.3, 0.3, 1.0)
    """
    if a == b:
        return 0.0
    special = _SPECIAL.get(frozenset((a, b)))
    if special is not None:
        return special
    if a in _VOWEL_FEATS and b in _VOWEL_FEATS:
        (ha, ba), (hb, bb) = _VOWEL_FEATS[a], _VOWEL_FEATS[b]
        return round(min(0.75, 0.25 + 0.1 * abs(ha - hb) + 0.1 * abs(ba - bb)), 4)
    if a in _CONS_FEATS and b in _CONS_FEATS:
        (ma, pa, va), (mb, pb, vb) = _CONS_FEATS[a], _CONS_FEATS[b]
        if ma == mb and pa == pb:
            return 0.3
        if ma == mb:
            return 0.5 if va == vb else 0.6
        if pa == pb:
            return 0.6
        if ma in _SONORANT and mb in _SONORANT:
            return 0.6
        return 0.85
    if a not in _PHONE_INDEX or b not in _PHONE_INDEX:
        raise InputError(f"unknown phone {a if a not in _PHONE_INDEX else b!r}", expected="an ARPAbet phone")
    return 1.0


def indel_cost(p: str) -> float:
    """Cost of inserting or deleting phone ``p`` (1, less for weak phones such as schwa).

    >>> indel_cost("AH"), indel_cost("K")
    (0.6, 1.0)
    """
    if p not in _PHONE_INDEX:
        raise InputError(f"unknown phone {p!r}", expected="an ARPAbet phone")
    return _INDEL.get(p, 1.0)


def _cost_tables() -> tuple[np.ndarray, np.ndarray]:
    n = len(PHONES)
    sub = np.ones((n + 1, n + 1), dtype=np.float64)
    for i, a in enumerate(PHONES):
        for j, b in enumerate(PHONES):
            sub[i, j] = substitution_cost(a, b)
    ins = np.array([indel_cost(p) for p in PHONES] + [1.0])
    return sub, ins


_SUB, _INS = _cost_tables()


def phone_distance(a: Sequence[str], b: Sequence[str]) -> float:
    """Weighted edit distance between two phone sequences (see :func:`substitution_cost`).

    >>> phone_distance(("K", "AE", "T"), ("K", "AE", "T"))
    0.0
    >>> phone_distance(("P", "AE", "T"), ("B", "AE", "T"))
    0.3
    >>> phone_distance((), ("AH",))
    0.6
    """
    ia = [_phone_id(p) for p in a]
    ib = [_phone_id(p) for p in b]
    prev = [0.0]
    for q in ib:
        prev.append(prev[-1] + _INS[q])
    for p in ia:
        cur = [prev[0] + _INS[p]]
        for j, q in enumerate(ib, start=1):
            cur.append(min(prev[j] + _INS[p], cur[j - 1] + _INS[q], prev[j - 1] + _SUB[p, q]))
        prev = cur
    return round(float(prev[-1]), 6)


def phone_similarity(a: Sequence[str], b: Sequence[str]) -> float:
    """``1 - phone_distance(a, b) / max(len(a), len(b))``, in ``[0, 1]`` (1 for identical sequences).

    >>> phone_similarity(("R", "AY", "T"), ("R", "AY", "T"))
    1.0
    >>> round(phone_similarity(("R", "AY", "T"), ("L", "AY", "T")), 3)
    0.867
    """
    n = max(len(a), len(b))
    if n == 0:
        return 1.0
    return max(0.0, 1.0 - phone_distance(a, b) / n)


def _phone_id(p: str) -> int:
    try:
        return _PHONE_INDEX[p]
    except KeyError:
        raise InputError(f"unknown phone {p!r}", expected="an ARPAbet phone") from None


# ---------------------------------------------------------------------------------------------- dictionary

def default_cmudict_path() -> Path:
    """Path of the CMU dictionary shipped with pocketsphinx.

    >>> default_cmudict_path().name
    'cmudict-en-us.dict'
    """
    import pocketsphinx

    return Path(pocketsphinx.get_model_path()) / "en-us" / "cmudict-en-us.dict"


_VARIANT = re.compile(r"\(\d+\)$")


@functools.lru_cache(maxsize=4)
def _load_cmudict_cached(path: str) -> Mapping[str, tuple[Pronunciation, ...]]:
    from types import MappingProxyType

    out: dict[str, list[Pronunciation]] = {}
    p = Path(path)
    if not p.is_file():
        raise InputError("no such pronouncing dictionary", path=p, expected="a CMU-format .dict file")
    with open(p, encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.split("#", 1)[0].strip()
            if not line or line.startswith(";;;"):
                continue
            parts = line.split()
            if len(parts) < 2:
                raise InputError("entry has no phones", path=p, line=lineno, expected="WORD PH1 PH2 ...")
            word = _VARIANT.sub("", parts[0]).lower()
            phones = tuple(ph.rstrip("012") for ph in parts[1:])
            for ph in phones:
                if ph not in _PHONE_INDEX:
                    raise InputError(f"unknown phone {ph!r}", path=p, line=lineno, expected="ARPAbet phones")
            prons = out.setdefault(word, [])
            if phones not in prons:
                prons.append(phones)
    return MappingProxyType({w: tuple(ps) for w, ps in out.items()})


def load_cmudict(path: str | os.PathLike[str] | None = None) -> Mapping[str, tuple[Pronunciation, ...]]:
    """Load a CMU-format pronouncing dictionary: lowercase word -> its pronunciations (stress stripped).

    Defaults to the dictionary shipped with pocketsphinx. The result is read-only and cached per path
    (loading takes about half a second). Malformed files raise :class:`~privasr.errors.InputError`.

    >>> d = load_cmudict()
    >>> d["read"]
    (('R', 'EH', 'D'), ('R', 'IY', 'D'))
    """
    p = default_cmudict_path() if path is None else Path(path)
    return _load_cmudict_cached(str(p.resolve()))


# ------------------------------------------------------------------------------------------ letter to sound

_LTS_RULES: tuple[tuple[str, tuple[str, ...]], ...] = tuple(sorted({
    "tion": ("SH", "AH", "N"), "sion": ("ZH", "AH", "N"), "ough": ("AO",), "augh": ("AO",),
    "eigh": ("EY",), "igh": ("AY",), "tch": ("CH",), "sch": ("SH",), "dge": ("JH",),
    "ch": ("CH",), "sh": ("SH",), "th": ("TH",), "ph": ("F",), "ck": ("K",), "ng": ("NG",), "qu": ("K", "W"),
    "wh": ("W",), "kn": ("N",), "wr": ("R",), "gh": ("G",), "ee": ("IY",), "ea": ("IY",), "oo": ("UW",),
    "ai": ("EY",), "ay": ("EY",), "ey": ("IY",), "ei": ("EY",), "ie": ("IY",), "oa": ("OW",), "ou": ("AW",),
    "ow": ("OW",), "oi": ("OY",), "oy": ("OY",), "au": ("AO",), "aw": ("AO",), "ew": ("UW",), "ue": ("UW",),
    "ar": ("AA", "R"), "er": ("ER",), "ir": ("ER",), "ur": ("ER",), "or": ("AO", "R"),
    "a": ("AE",), "b": ("B",), "c": ("K",), "d": ("D",), "e": ("EH",), "f": ("F",), "g": ("G",), "h": ("HH",),
    "i": ("IH",), "j": ("JH",), "k": ("K",), "l": ("L",), "m": ("M",), "n": ("N",), "o": ("AA",), "p": ("P",),
    "q": ("K",), "r": ("R",), "s": ("S",), "t": ("T",), "u": ("AH",), "v": ("V",), "w": ("W",),
    "x": ("K", "S"), "y": ("IY",), "z": ("Z",),
}.items(), key=lambda kv: -len(kv[0])))


def letter_to_sound(word: str) -> Pronunciation:
    """Approximate ARPAbet pronunciation of a word from its spelling (for words not in the dictionary).

    Greedy longest-match over common English spellings; ``c``/``g`` soften before ``e``/``i``/``y``;
    initial ``y`` is a glide; a final silent ``e`` is dropped; doubled letters are read once; characters
    other than ``a``-``z`` are ignored. Returns ``()`` when nothing is pronounceable.

    >>> letter_to_sound("smith")
    ('S', 'M', 'IH', 'TH')
    >>> letter_to_sound("kowalczyk")
    ('K', 'OW', 'AE', 'L', 'K', 'Z', 'IY', 'K')
    """
    w = re.sub(r"[^a-z]", "", word.lower())
    if len(w) > 2 and w.endswith("e") and w[-2] not in "aeiouy" and w[-3] in "aeiouy":
        w = w[:-1]
    w = re.sub(r"([bcdfgklmnprstvz])\1", r"\1", w)
    out: list[str] = []
    i = 0
    while i < len(w):
        nxt = w[i + 1] if i + 1 < len(w) else ""
        if w[i] == "c" and nxt in ("e", "i", "y"):
            out.append("S")
            i += 1
            continue
        if w[i] == "g" and nxt in ("e", "y"):
            out.append("JH")
            i += 1
            continue
        if i == 0 and w[i] == "y" and len(w) > 1:
            out.append("Y")
            i += 1
            continue
        for graph, phones in _LTS_RULES:
            if w.startswith(graph, i):
                out.extend(phones)
                i += len(graph)
                break
    return tuple(out)


# ---------------------------------------------------------------------------------------------- confusions

class Neighbour(NamedTuple):
    """A confusable word: its spelling, phone similarity in [0, 1] and weighted phone distance."""

    word: str
    similarity: float
    distance: float


_CLASS_OF = {p: ("V" if p in _VOWEL_FEATS else _CONS_FEATS[p][0]) for p in PHONES}
_CLASSES = ("#", "V", "stop", "affricate", "fricative", "nasal", "liquid", "glide")
_CLASS_ID = {c: i for i, c in enumerate(_CLASSES)}
_POS_BINS = 4
_BIGRAM_WEIGHT = 0.15


def _features(prons: Sequence[Pronunciation]) -> np.ndarray:
    """Dense feature rows for the cosine pre-filter (unit-normalised).

    "Soft" phone counts (each phone also lights up similar phones) in three position bins (start,
    middle, end, with triangular weights), plus broad-class bigrams with word boundaries.
    """
    n_ph = len(PHONES)
    n_cls = len(_CLASSES)
    nb = _POS_BINS
    dim = nb * n_ph + n_cls * n_cls
    X = np.zeros((len(prons), dim), dtype=np.float32)
    soft = np.clip(1.0 - _SUB[:n_ph, :n_ph], 0.0, None).astype(np.float32) ** 2
    centres = np.linspace(0.0, 1.0, nb)
    for r, pron in enumerate(prons):
        if not pron:
            continue
        ids = [_PHONE_INDEX[p] for p in pron]
        pos = np.linspace(0.0, 1.0, len(ids)) if len(ids) > 1 else np.array([0.5])
        w = np.clip(1.0 - np.abs(pos[:, None] - centres[None, :]) * (nb - 1), 0.0, None)  # (len, nb)
        X[r, : nb * n_ph] = (w.T.astype(np.float32) @ soft[ids]).reshape(-1)
        cls = [0] + [_CLASS_ID[_CLASS_OF[p]] for p in pron] + [0]
        for a, b in zip(cls[:-1], cls[1:], strict=True):
            X[r, nb * n_ph + a * n_cls + b] += _BIGRAM_WEIGHT
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return X / norms


def _batch_distances(A: np.ndarray, B: np.ndarray, len_b: np.ndarray) -> np.ndarray:
    """Weighted edit distances of pairs: rows of A (all of the same length) against padded rows of B."""
    P, La = A.shape
    Lb = B.shape[1]
    ins_b = _INS[B]  # (P, Lb)
    C = np.zeros((P, Lb + 1))
    np.cumsum(ins_b, axis=1, out=C[:, 1:])
    prev = C.copy()
    for i in range(La):
        a = A[:, i]
        dela = _INS[a][:, None]
        E = np.empty_like(prev)
        E[:, :1] = prev[:, :1] + dela
        np.minimum(prev[:, 1:] + dela, prev[:, :-1] + _SUB[a[:, None], B], out=E[:, 1:])
        prev = C + np.minimum.accumulate(E - C, axis=1)
    return prev[np.arange(P), len_b]


class Confusions:
    """Acoustically confusable neighbours for the words of a vocabulary.

    Args:
        vocabulary: the words a recogniser can output (duplicates ignored; sorted internally so the result
            does not depend on input order).
        lexicon: word -> pronunciations; defaults to :func:`load_cmudict`. Words missing from it are
            pronounced with :func:`letter_to_sound`.
        k: how many neighbours to keep per word (the most similar first).
        max_length_diff: candidates differ from the word by at most this many phones.
        prefilter: how many candidates per pronunciation survive the cosine pre-filter and get an exact
            distance.
        max_variants: pronunciation variants used per word (the dictionary's first ones).

    Neighbours are found for the whole vocabulary on construction (on two CPU cores: ~0.8 s for the
    synthetic corpus' 5.5k-word lexicon, ~1.3 s for 5k random dictionary words, ~2.5 s for 10k, ~6 s for
    20k); :meth:`for_vocabulary` caches instances in-process. Similarity of two words is the best
    :func:`phone_similarity` over their pronunciation variants. Homophones (``right``/``write``) have
    similarity 1 and come first.

    >>> c = Confusions(["cat", "bat", "cap", "dog"], k=2)
    >>> c.neighbours("cat")
    [Neighbour(word='cap', similarity=0.8333, distance=0.5), Neighbour(word='bat', similarity=0.8, distance=0.6)]
    >>> c.neighbours("zzz")
    Traceback (most recent call last):
    ...
    KeyError: 'zzz'
    """

    def __init__(
        self,
        vocabulary: Iterable[str],
        lexicon: Lexicon | None = None,
        *,
        k: int = 10,
        max_length_diff: int = 2,
        prefilter: int = 40,
        max_variants: int = 2,
    ) -> None:
        for name, value, lo in (("k", k, 1), ("max_length_diff", max_length_diff, 0), ("prefilter", prefilter, 1),
                                ("max_variants", max_variants, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise ConfigError(f"Confusions: {name}={value!r} is not valid", expected=f"an integer >= {lo}")
        self.lexicon: Lexicon = load_cmudict() if lexicon is None else lexicon
        self.k = k
        self.max_length_diff = max_length_diff
        self.prefilter = prefilter
        self.max_variants = max_variants
        self.words: tuple[str, ...] = tuple(sorted(set(vocabulary)))
        for w in self.words:
            if not isinstance(w, str) or not w or any(c.isspace() for c in w):
                raise InputError(f"vocabulary contains an invalid word {w!r}", expected="non-empty tokens")
        self.index = {w: i for i, w in enumerate(self.words)}
        self.oov: frozenset[str] = frozenset(w for w in self.words if w not in self.lexicon)
        self._prons: dict[str, tuple[Pronunciation, ...]] = {w: self.pronunciations(w) for w in self.words}
        self._table: dict[str, list[Neighbour]] = self._build()

    _CACHE: dict[tuple[object, ...], Confusions] = {}

    @classmethod
    def for_vocabulary(cls, vocabulary: Iterable[str], *, k: int = 10, **options: int) -> Confusions:
        """A cached instance for this vocabulary and options (default dictionary only).

        >>> Confusions.for_vocabulary(["a", "b"]) is Confusions.for_vocabulary(["b", "a"])
        True
        """
        key = (frozenset(vocabulary), k, tuple(sorted(options.items())))
        inst = cls._CACHE.get(key)
        if inst is None:
            if len(cls._CACHE) >= 8:
                cls._CACHE.pop(next(iter(cls._CACHE)))
            inst = cls._CACHE[key] = cls(key[0], k=k, **options)
        return inst

    def pronunciations(self, word: str) -> tuple[Pronunciation, ...]:
        """The word's pronunciations from the lexicon, else one from :func:`letter_to_sound`.

        >>> Confusions(["a"]).pronunciations("qzx")
        (('K', 'Z', 'K', 'S'),)
        """
        prons = self.lexicon.get(word) or self.lexicon.get(word.lower())
        if prons:
            return tuple(prons[: self.max_variants])
        lts = letter_to_sound(word)
        return (lts,) if lts else (("AH",),)

    def num_phones(self, word: str) -> int:
        """Phones in the word's first pronunciation.

        >>> Confusions(["budget"]).num_phones("budget")
        5
        """
        prons = self._prons.get(word) or self.pronunciations(word)
        return len(prons[0])

    def neighbours(self, word: str, k: int | None = None) -> list[Neighbour]:
        """The ``k`` (default: all kept) most confusable other words of the vocabulary, most similar first.

        Raises ``KeyError`` for a word outside the vocabulary.
        """
        table = self._table[word]
        return list(table if k is None else table[:k])

    def table(self) -> dict[str, list[Neighbour]]:
        """Every word's neighbours (a fresh dict)."""
        return {w: list(ns) for w, ns in self._table.items()}

    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self.index

    # ---------------------------------------------------------------------------------------- the search
    def _build(self) -> dict[str, list[Neighbour]]:
        entries: list[tuple[int, Pronunciation]] = [
            (wi, pron) for wi, w in enumerate(self.words) for pron in self._prons[w]
        ]
        table: dict[str, list[Neighbour]] = {w: [] for w in self.words}
        if len(self.words) < 2:
            return table
        ent_word = np.array([e[0] for e in entries], dtype=np.int64)
        lengths = np.array([len(e[1]) for e in entries], dtype=np.int64)
        order = np.argsort(lengths, kind="stable")
        ent_word, lengths = ent_word[order], lengths[order]
        prons = [entries[i][1] for i in order]
        feats = _features(prons)
        maxlen = int(lengths.max())
        codes = np.full((len(prons), maxlen), _PAD, dtype=np.int64)
        for r, pron in enumerate(prons):
            codes[r, : len(pron)] = [_PHONE_INDEX[p] for p in pron]

        q_all: list[np.ndarray] = []
        c_all: list[np.ndarray] = []
        d_all: list[np.ndarray] = []
        for L in np.unique(lengths):
            L = int(L)
            q_idx = np.flatnonzero(lengths == L)
            lo = np.searchsorted(lengths, L - self.max_length_diff, side="left")
            hi = np.searchsorted(lengths, L + self.max_length_diff, side="right")
            cand = np.arange(lo, hi)
            kk = min(self.prefilter + 1, len(cand))
            for start in range(0, len(q_idx), 1024):
                qs = q_idx[start:start + 1024]
                sims = feats[qs] @ feats[cand].T  # (nq, nc)
                # a word is never its own neighbour: push all its pronunciations to the bottom
                np.putmask(sims, ent_word[qs][:, None] == ent_word[cand][None, :], -2.0)
                if kk < len(cand):
                    top = np.argpartition(sims, len(cand) - kk, axis=1)[:, len(cand) - kk:]
                else:
                    top = np.broadcast_to(np.arange(len(cand)), (len(qs), len(cand)))
                pairs_q = np.repeat(qs, top.shape[1])
                pairs_c = cand[top.reshape(-1)]
                keep = ent_word[pairs_q] != ent_word[pairs_c]
                pairs_q, pairs_c = pairs_q[keep], pairs_c[keep]
                if len(pairs_q) == 0:
                    continue
                lb = lengths[pairs_c]
                width = int(lb.max())
                dist = _batch_distances(codes[pairs_q, :L], codes[pairs_c, :width], lb)
                q_all.append(pairs_q)
                c_all.append(pairs_c)
                d_all.append(dist)
        if not q_all:
            return table
        pq, pc, dist = np.concatenate(q_all), np.concatenate(c_all), np.concatenate(d_all)
        denom = np.maximum(lengths[pq], lengths[pc]).astype(np.float64)
        sim = np.clip(1.0 - dist / denom, 0.0, 1.0)
        wq, wc = ent_word[pq], ent_word[pc]
        # best variant pair per (word, neighbour); then rank by similarity, distance, spelling
        o = np.lexsort((dist, -sim, wc, wq))
        wq, wc, sim, dist = wq[o], wc[o], sim[o], dist[o]
        first = np.ones(len(wq), dtype=bool)
        first[1:] = (wq[1:] != wq[:-1]) | (wc[1:] != wc[:-1])
        wq, wc, sim, dist = wq[first], wc[first], sim[first], dist[first]
        o = np.lexsort((wc, dist, -np.round(sim, 9), wq))
        wq, wc, sim, dist = wq[o], wc[o], sim[o], dist[o]
        bounds = np.flatnonzero(np.r_[True, wq[1:] != wq[:-1], True])
        sim_l, dist_l, wc_l = np.round(sim, 4).tolist(), np.round(dist, 4).tolist(), wc.tolist()
        words = self.words
        for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            e = min(e, s + self.k)
            table[words[int(wq[s])]] = [
                Neighbour(words[wc_l[i]], sim_l[i], dist_l[i]) for i in range(s, e)
            ]
        return table
