"""Word classes: the SRILM ``classes-format(5)`` file, class maps, and frequency-binned classes.

A classes file has one *expansion* per line::

    class [p] word1 word2 ...

``class`` names the class (for example ``<PER>``), ``p`` is the probability of the expansion given the class
(SRILM: "if p is omitted it is assumed to be 1"), and ``word1 word2 ...`` is the word string the class expands
to. A class may have many lines. Blank lines are skipped. As in SRILM, the second field is read as ``p`` when it
parses as a number *and* more fields follow, so ``<NUM> 5`` is the one-word expansion ``5`` with ``p`` omitted.

What this module supports, and what it rejects with an :class:`~privasr.errors.InputError` naming the file and
line:

- **single-word expansions only**. SRILM allows multi-word expansions ("multi-words"); a line with more than one
  word after the class (and ``p``) is rejected, since the class n-grams here map one word to one class token;
- **simple classes** (SRILM ``-simple-classes``): every word belongs to at most one class, so a word's class is
  known from the word and P(w|h) = P(c(w)|...) P(w|c(w)). A word listed under two classes is rejected; the same
  class/word pair twice is rejected too;
- ``p`` must be a finite number in [0, 1]; the special tokens ``<s>``, ``</s>``, ``<unk>`` cannot be class names or
  members, and a class name cannot also be a member word.

:class:`ClassMap` keeps, per class, its members in file order with their ``p`` (``None`` where it was omitted).
:meth:`ClassMap.file_probs` gives a class's member distribution from the file, when every line of that class
gives ``p``.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "ne.classes"
>>> _ = p.write_text("<PER> 0.75 alice\\n<PER> 0.25 bob\\n<LOC> paris\\n<LOC> london\\n")
>>> cm = read_classes(p)
>>> cm.classes, cm.members("<PER>"), cm.class_of("paris"), "bob" in cm
(('<PER>', '<LOC>'), ('alice', 'bob'), '<LOC>', True)
>>> cm.file_probs("<PER>"), cm.file_probs("<LOC>") is None
({'alice': 0.75, 'bob': 0.25}, True)
>>> cm.map_words(["alice", "went", "to", "paris"])
('<PER>', 'went', 'to', '<LOC>')
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["ClassMap", "read_classes", "write_classes", "parse_classes", "frequency_bin_classes", "SPECIAL_TOKENS"]

SPECIAL_TOKENS: frozenset[str] = frozenset({"<s>", "</s>", "<unk>"})
"""Tokens that can be neither a class nor a class member."""


@dataclass(frozen=True)
class ClassMap:
    """A simple class map: each word in at most one class, each class with its members and optional ``p``.

    Build one with :meth:`from_members`, :meth:`from_word_classes`, :func:`read_classes` or
    :func:`frequency_bin_classes`.

    Attributes:
        expansions: class -> ((member, p or None), ...) in the order the members were given.

    >>> cm = ClassMap.from_word_classes({"alice": "<PER>", "bob": "<PER>", "paris": "<LOC>"})
    >>> cm.classes, cm.members("<PER>"), len(cm)
    (('<PER>', '<LOC>'), ('alice', 'bob'), 3)
    """

    expansions: Mapping[str, tuple[tuple[str, float | None], ...]]
    _word_class: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exp: dict[str, tuple[tuple[str, float | None], ...]] = {}
        word_class: dict[str, str] = {}
        for cls, members in self.expansions.items():
            _check_token(cls, "class name")
            if not members:
                raise InputError(f"class {cls!r} has no members", expected="at least one expansion per class")
            seen: list[tuple[str, float | None]] = []
            for word, p in members:
                _check_token(word, "class member")
                if word in word_class:
                    other = word_class[word]
                    what = "twice in class" if other == cls else f"in classes {other!r} and"
                    raise InputError(f"word {word!r} is listed {what} {cls!r}",
                                     expected="each word in at most one class (simple classes)")
                if p is not None and not (math.isfinite(p) and 0.0 <= p <= 1.0):
                    raise InputError(f"class {cls!r}, word {word!r}: probability {p!r}",
                                     expected="a probability in [0, 1]")
                word_class[word] = cls
                seen.append((word, None if p is None else float(p)))
            exp[cls] = tuple(seen)
        clash = sorted(set(exp) & set(word_class))
        if clash:
            raise InputError(f"{clash[0]!r} is both a class name and a class member",
                             expected="class names distinct from member words")
        object.__setattr__(self, "expansions", exp)
        object.__setattr__(self, "_word_class", word_class)

    # ------------------------------------------------------------------------------------ builders
    @classmethod
    def from_members(cls, members: Mapping[str, Iterable[str]]) -> ClassMap:
        """A class map from ``{class: [words]}`` (no probabilities).

        >>> ClassMap.from_members({"<DAY>": ["monday", "tuesday"]}).class_of("tuesday")
        '<DAY>'
        """
        return cls({c: tuple((w, None) for w in ws) for c, ws in members.items()})

    @classmethod
    def from_word_classes(cls, word_classes: Mapping[str, str]) -> ClassMap:
        """A class map from ``{word: class}`` (classes in order of first appearance, no probabilities)."""
        grouped: dict[str, list[str]] = {}
        for w, c in word_classes.items():
            grouped.setdefault(c, []).append(w)
        return cls.from_members(grouped)

    # ------------------------------------------------------------------------------------ queries
    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, in the order they were given."""
        return tuple(self.expansions)

    def members(self, cls: str) -> tuple[str, ...]:
        """The member words of class ``cls`` (``KeyError`` if there is no such class)."""
        return tuple(w for w, _ in self.expansions[cls])

    def class_of(self, word: str) -> str | None:
        """The class of ``word``, or ``None`` when the word is in no class."""
        return self._word_class.get(word)

    def is_class(self, token: str) -> bool:
        """Whether ``token`` is a class name.

        >>> ClassMap.from_members({"<C>": ["x"]}).is_class("<C>")
        True
        """
        return token in self.expansions

    def __contains__(self, word: object) -> bool:
        return word in self._word_class

    def __len__(self) -> int:
        """Number of member words over all classes."""
        return len(self._word_class)

    @property
    def word_classes(self) -> dict[str, str]:
        """``{word: class}`` for every member word (a copy)."""
        return dict(self._word_class)

    def file_probs(self, cls: str) -> dict[str, float] | None:
        """``{member: p}`` of class ``cls`` when every one of its lines gave ``p``; ``None`` otherwise."""
        exp = self.expansions[cls]
        if any(p is None for _, p in exp):
            return None
        return {w: float(p) for w, p in exp}  # type: ignore[arg-type]

    def map_words(self, words: Sequence[str]) -> tuple[str, ...]:
        """Replace every member word by its class token; other words are kept."""
        wc = self._word_class
        return tuple(wc.get(w, w) for w in words)


def _check_token(tok: str, what: str) -> None:
    if not isinstance(tok, str) or not tok or any(ch.isspace() for ch in tok):
        raise InputError(f"{what} {tok!r} is not a token", expected="a non-empty string without whitespace")
    if tok in SPECIAL_TOKENS:
        raise InputError(f"{what} {tok!r} is a reserved token", expected=f"none of {sorted(SPECIAL_TOKENS)}")


def _parse_prob(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v


def parse_classes(lines: Iterable[tuple[int, str]], *, path: PathLike | None = None) -> ClassMap:
    """Parse ``(line_number, line)`` pairs in SRILM classes format (see the module docstring).

    >>> parse_classes([(1, "<N> 0.5 one"), (2, "<N> 0.5 two")]).file_probs("<N>")
    {'one': 0.5, 'two': 0.5}
    >>> parse_classes([(1, "<N> 1 new york")])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: line 1: class '<N>' expands to 2 words; multi-word expansions are not supported (expected one word per expansion: 'class [p] word')
    """
    grouped: dict[str, list[tuple[str, float | None]]] = {}
    where: dict[str, int] = {}
    for n, line in lines:
        fields = split_words(line)
        if not fields:
            continue
        cls, rest = fields[0], fields[1:]
        p: float | None = None
        if len(rest) >= 2:
            p = _parse_prob(rest[0])
            if p is not None:
                rest = rest[1:]
        if not rest:
            raise InputError(f"class {cls!r} has no expansion on this line", path=path, line=n,
                             expected="'class [p] word'")
        if len(rest) > 1:
            raise InputError(f"class {cls!r} expands to {len(rest)} words; multi-word expansions are not "
                             "supported", path=path, line=n, expected="one word per expansion: 'class [p] word'")
        word = rest[0]
        if p is not None and not (math.isfinite(p) and 0.0 <= p <= 1.0):
            raise InputError(f"expansion probability {fields[1]!r} out of range", path=path, line=n,
                             expected="a probability in [0, 1]")
        try:
            _check_token(cls, "class name")
            _check_token(word, "class member")
        except InputError as e:
            raise e.at(path, n) from None
        if word in where:
            raise InputError(f"word {word!r} already listed on line {where[word]}", path=path, line=n,
                             expected="each word in at most one class (simple classes)")
        where[word] = n
        grouped.setdefault(cls, []).append((word, p))
    try:
        return ClassMap({c: tuple(m) for c, m in grouped.items()})
    except InputError as e:
        raise e.at(path) from None


def read_classes(path: PathLike) -> ClassMap:
    """Read an SRILM classes file (``.gz``/``.xz``/``.bz2`` allowed); errors name the file and line.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "bad.classes"
    >>> _ = p.write_text("<A> x\\n<B> x\\n")
    >>> read_classes(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: .../bad.classes:2: word 'x' already listed on line 1 (expected each word in at most one class (simple classes))
    """
    return parse_classes(iter_lines(path), path=path)


def write_classes(cmap: ClassMap, path: PathLike, probs: Mapping[str, Mapping[str, float]] | None = None) -> None:
    """Write ``cmap`` in SRILM classes format, one ``class p word`` line per member.

    ``probs`` (``{class: {word: p}}``, e.g. estimated member distributions) overrides the probabilities of
    the map; where neither gives one, ``p`` is left out. Probabilities are written with 17 significant digits,
    so they read back exactly.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.classes"
    >>> cm = ClassMap.from_members({"<C>": ["a", "b"]})
    >>> write_classes(cm, p, {"<C>": {"a": 0.1, "b": 0.9}})
    >>> p.read_text()
    '<C> 0.10000000000000001 a\\n<C> 0.90000000000000002 b\\n'
    >>> read_classes(p).file_probs("<C>")
    {'a': 0.1, 'b': 0.9}
    """
    with open_write_text(path) as f:
        for cls, members in cmap.expansions.items():
            given = probs.get(cls) if probs is not None else None
            for word, p in members:
                q = given.get(word, p) if given is not None else p
                f.write(f"{cls} {word}\n" if q is None else f"{cls} {q:.17g} {word}\n")


def frequency_bin_classes(counts: Mapping[str, int], n_classes: int, *, prefix: str = "<C",
                          exclude: Iterable[str] = SPECIAL_TOKENS) -> ClassMap:
    """Frequency-binned classes: words sorted by count, cut into ``n_classes`` bins of about equal token mass.

    Words are sorted by decreasing count (ties by the word itself). Bins are filled in that order; a bin is
    closed once its mass reaches the mass still to assign divided by the number of bins still open, so the most
    frequent words get small bins (often a bin of their own) and rare words share large ones, as in the
    frequency binning of Mikolov et al. (2011). There are exactly ``min(n_classes, number of words)`` classes,
    named ``f"{prefix}{i}>"`` (``<C0>``, ``<C1>``, ...; ``<C0>`` holds the most frequent words). Words in
    ``exclude`` (by default ``<s>``, ``</s>``, ``<unk>``) and words with count 0 are left out of every class.

    >>> cm = frequency_bin_classes({"the": 50, "a": 30, "cat": 10, "dog": 6, "emu": 4}, 3)
    >>> [cm.members(c) for c in cm.classes]
    [('the',), ('a',), ('cat', 'dog', 'emu')]
    """
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
        raise InputError(f"n_classes is {n_classes!r}", expected="an integer >= 1")
    skip = set(exclude)
    items = sorted(((w, int(c)) for w, c in counts.items() if w not in skip and c > 0),
                   key=lambda wc: (-wc[1], wc[0]))
    if not items:
        raise InputError("no words to put into classes", expected="at least one word with a count > 0")
    n_bins = min(n_classes, len(items))
    names = [f"{prefix}{i}>" for i in range(n_bins)]
    clash = set(names) & set(counts)
    if clash:
        raise InputError(f"class name {sorted(clash)[0]!r} is also a word", expected="another class prefix")
    remaining = float(sum(c for _, c in items))
    bins: list[list[str]] = [[]]
    mass = 0.0
    target = remaining / n_bins
    for i, (w, c) in enumerate(items):
        bins[-1].append(w)
        mass += c
        words_left = len(items) - i - 1
        bins_left = n_bins - len(bins)  # bins still to open after this one
        if bins_left > 0 and (mass >= target or words_left == bins_left):
            remaining -= mass
            mass = 0.0
            target = remaining / bins_left
            bins.append([])
    return ClassMap.from_members(dict(zip(names, bins, strict=True)))
