"""The word vocabulary of a neural language model: a frozen, ordered list of words with their ids.

Ids ``0, 1, 2`` are always ``<unk>``, ``<s>`` and ``</s>`` (the n-gram code's convention); the other words
follow, most frequent first, ties in alphabetical (code point) order, so a vocabulary built from the same
text is always the same. Unknown words map to ``<unk>``.

>>> v = Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]])
>>> v.words
('<unk>', '<s>', '</s>', 'a', 'b', 'c')
>>> v.encode(["a", "zz", "c"]), v.index("</s>"), "b" in v, "zz" in v, len(v)
([3, 0, 5], 2, True, False, 6)
>>> Vocabulary.from_json(v.to_json()) == v
True

``unk_types`` records how many word types of the training text were mapped to ``<unk>`` (left out by
``min_count`` or ``max_size``): a scorer can spread ``<unk>``'s probability over them
(:class:`~privasr.lm.neural.scorer.NeuralLM`, ``spread_unk``).

>>> Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]], min_count=2).unk_types
1

``counts`` (optional) are the training counts of the targets each id stands for, as a model trained on the
text sees them: a word's occurrences, ``<unk>``'s the occurrences of the words left out, ``</s>``'s one per
sentence, ``<s>``'s 0 (it is never predicted). :meth:`Vocabulary.build` records them; a class-factored softmax
(:mod:`~privasr.lm.neural.models`) bins the words by them. They are metadata: two vocabularies with the same
words and ``unk_types`` are equal whatever their counts.

>>> Vocabulary.build([["a", "b", "a"], ["c", "a", "b"]], min_count=2).counts
(1, 0, 2, 3, 2)
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import BOS, EOS, UNK

__all__ = ["Vocabulary", "SPECIALS"]

SPECIALS: tuple[str, str, str] = (UNK, BOS, EOS)
_FORMAT = "privasr-vocab"


@dataclass(frozen=True)
class Vocabulary:
    """An immutable word list; the position of a word is its id.

    Args:
        words: the words, ids ``0..V-1``; must start with ``<unk>``, ``<s>``, ``</s>`` and have no duplicates
            or empty strings.
        unk_types: the number of training word types mapped to ``<unk>`` (0: unknown or none).
        counts: the training count of every id (see the module docstring), or ``None`` (not recorded).
    """

    words: tuple[str, ...]
    unk_types: int = 0
    counts: tuple[int, ...] | None = field(default=None, compare=False)
    _ids: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        words = tuple(self.words)
        if words[:3] != SPECIALS:
            raise InputError(f"the vocabulary starts with {list(words[:3])}",
                             expected=f"the special words {list(SPECIALS)} first")
        ids: dict[str, int] = {}
        for i, w in enumerate(words):
            if not isinstance(w, str) or not w or any(c.isspace() for c in w):
                raise InputError(f"vocabulary entry {i} is {w!r}", expected="non-empty words without whitespace")
            if w in ids:
                raise InputError(f"the word {w!r} appears twice in the vocabulary (ids {ids[w]} and {i})")
            ids[w] = i
        if isinstance(self.unk_types, bool) or not isinstance(self.unk_types, int) or self.unk_types < 0:
            raise InputError(f"unk_types={self.unk_types!r}", expected="a count of at least 0")
        if self.counts is not None:
            counts = tuple(self.counts)
            if len(counts) != len(words) or any(isinstance(c, bool) or not isinstance(c, int) or c < 0
                                                for c in counts):
                raise InputError(f"the vocabulary has {len(words)} words but counts={list(counts)[:8]!r}...",
                                 expected="one count of at least 0 per word")
            object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "words", words)
        object.__setattr__(self, "_ids", ids)

    # -- construction --------------------------------------------------------------------------------------
    @classmethod
    def build(cls, sentences: Iterable[Sequence[str]], max_size: int | None = None,
              min_count: int = 1) -> Vocabulary:
        """The vocabulary of tokenised ``sentences``: specials, then words by count (ties alphabetical).

        Args:
            sentences: the training text, one list of words per sentence. Occurrences of ``<s>``, ``</s>`` and
                ``<unk>`` in the text are not counted (they are always in the vocabulary).
            max_size: the largest vocabulary size **including** the three special words (``None``: no limit).
            min_count: words seen fewer times are left out (they become ``<unk>``).

        >>> Vocabulary.build([["b", "a", "b", "c"]], max_size=4).words
        ('<unk>', '<s>', '</s>', 'b')
        """
        if max_size is not None and max_size < len(SPECIALS):
            raise InputError(f"max_size={max_size}", expected=f"at least {len(SPECIALS)} (the special words)")
        if min_count < 1:
            raise InputError(f"min_count={min_count}", expected="a count of at least 1")
        counts: Counter[str] = Counter()
        n_sent = 0
        for s in sentences:
            counts.update(s)
            n_sent += 1
        special = [counts.pop(sp, 0) for sp in SPECIALS]
        ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            ranked = ranked[: max_size - len(SPECIALS)]
        kept = [counts[w] for w in ranked]
        special[0] += sum(counts.values()) - sum(kept)  # the words left out are <unk>
        special[2] += n_sent  # one </s> per sentence
        return cls(SPECIALS + tuple(ranked), unk_types=len(counts) - len(ranked), counts=tuple(special + kept))

    # -- lookup --------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.words)

    def __contains__(self, word: object) -> bool:
        return word in self._ids

    def index(self, word: str) -> int:
        """The id of ``word``; ``unk_id`` for a word outside the vocabulary."""
        return self._ids.get(word, 0)

    def encode(self, words: Iterable[str]) -> list[int]:
        """The ids of ``words`` (unknown words as ``<unk>``); no ``<s>``/``</s>`` are added."""
        get = self._ids.get
        return [get(w, 0) for w in words]

    def encode_flat(self, sentences: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of many sentences as one int64 vector and offsets: sentence ``i`` is ``ids[off[i]:off[i+1]]``
        (the array form :meth:`~privasr.lm.neural.scorer.NeuralLM.score_ids` takes).

        >>> ids, off = Vocabulary.build([["a", "b"]]).encode_flat([["b", "zz"], [], ["a"]])
        >>> ids.tolist(), off.tolist()
        ([4, 0, 3], [0, 2, 2, 3])
        """
        off = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences)), out=off[1:])
        words = itertools.chain.from_iterable(sentences)
        ids = np.fromiter(map(self._ids.get, words, itertools.repeat(0)), dtype=np.int64, count=int(off[-1]))
        return ids, off

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The words of ``ids``.

        >>> Vocabulary.build([["x"]]).decode([3, 2])
        ['x', '</s>']
        """
        return [self.words[i] for i in ids]

    @property
    def unk_id(self) -> int:
        """Id of ``<unk>`` (0)."""
        return 0

    @property
    def bos_id(self) -> int:
        """Id of ``<s>`` (1)."""
        return 1

    @property
    def eos_id(self) -> int:
        """Id of ``</s>`` (2)."""
        return 2

    # -- serialisation -------------------------------------------------------------------------------------
    def to_json(self) -> str:
        """A JSON string (``{"format": "privasr-vocab", "words": [...], "unk_types": K}``, plus ``"counts"``
        when recorded) that :meth:`from_json` reads back."""
        d: dict[str, Any] = {"format": _FORMAT, "words": list(self.words), "unk_types": self.unk_types}
        if self.counts is not None:
            d["counts"] = list(self.counts)
        return json.dumps(d, ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any]) -> Vocabulary:
        """Read :meth:`to_json` output (a JSON string or the already parsed object).

        Raises :class:`InputError` if it is not a privasr vocabulary.
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise InputError(f"the vocabulary is not valid JSON ({e.msg} at char {e.pos})") from None
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT or not isinstance(data.get("words"), list):
            raise InputError("not a privasr vocabulary", expected=f'{{"format": "{_FORMAT}", "words": [...]}}')
        counts = data.get("counts")
        if counts is not None and not isinstance(counts, list):
            raise InputError("the vocabulary's counts are not a list", expected="one count per word")
        return cls(tuple(data["words"]), unk_types=data.get("unk_types", 0),
                   counts=None if counts is None else tuple(counts))
