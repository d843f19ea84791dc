"""Which reference words a system gets right more (or less) often than another: a diagnostic for adaptation
methods (FMP, FMA, fine-tuning) that shows what a WER difference is made of.

>>> r = word_hit_changes([["the", "remote", "is", "red"]], [["the", "remote", "is", "read"]],
...                      [["a", "remote", "is", "red"]])
>>> r.gained, r.lost, r.net
((('the', 1),), (('red', 1),), 0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from privasr.errors import InputError
from privasr.metrics.align import align_many

__all__ = ["WordHitChanges", "word_hit_changes", "ClassChanges", "class_changes"]


@dataclass(frozen=True)
class WordHitChanges:
    """Per reference word, correct occurrences in system A minus those in system B (sclite alignment).

    Attributes:
        gained: ``(word, count)`` with the largest positive changes first (ties alphabetical), at most ``top``.
        lost: ``(word, count)`` with the largest negative changes first, counts as positive numbers.
        net: total correct words of A minus those of B.
        words_changed: how many distinct reference words changed at all.
    """

    gained: tuple[tuple[str, int], ...]
    lost: tuple[tuple[str, int], ...]
    net: int
    words_changed: int

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"gained": [list(x) for x in self.gained], "lost": [list(x) for x in self.lost], "net": self.net,
                "words_changed": self.words_changed}


def _hits(refs: Sequence[Sequence[str]], hyps: Sequence[Sequence[str]]) -> Counter[str]:
    c: Counter[str] = Counter()
    for a in align_many(refs, hyps):
        c.update(r for r, _, op in a.pairs() if op == "C" and r is not None)
    return c


def word_hit_changes(refs: Sequence[Sequence[str]], hyps_a: Sequence[Sequence[str]],
                     hyps_b: Sequence[Sequence[str]], *, top: int = 15) -> WordHitChanges:
    """Compare the correctly recognised reference words of two systems on the same references.

    Raises:
        InputError: the three lists differ in length, or ``top`` < 0.
    """
    if not (len(refs) == len(hyps_a) == len(hyps_b)):
        raise InputError(f"{len(refs)} references, {len(hyps_a)} and {len(hyps_b)} hypotheses",
                         expected="one hypothesis of each system per reference")
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise InputError(f"top={top!r}", expected="an integer >= 0")
    a, b = _hits(refs, hyps_a), _hits(refs, hyps_b)
    diff = {w: a[w] - b[w] for w in set(a) | set(b) if a[w] != b[w]}
    gained = sorted(((w, d) for w, d in diff.items() if d > 0), key=lambda x: (-x[1], x[0]))[:top]
    lost = sorted(((w, -d) for w, d in diff.items() if d < 0), key=lambda x: (-x[1], x[0]))[:top]
    return WordHitChanges(tuple(gained), tuple(lost), sum(a.values()) - sum(b.values()), len(diff))


@dataclass(frozen=True)
class ClassChanges:
    """Reference words of one class: errors of system A and of system B (substituted or deleted: sclite
    alignment), and the words A fixed (wrong in B, correct in A) and broke (correct in B, wrong in A).

    ``fixed - broken == errors_b - errors_a``.
    """

    word_class: str
    ref_words: int
    errors_a: int
    errors_b: int
    fixed: int
    broken: int

    @property
    def net(self) -> int:
        """Errors removed by A (``errors_b - errors_a``; negative: A made more)."""
        return self.errors_b - self.errors_a

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"class": self.word_class, "ref_words": self.ref_words, "errors_a": self.errors_a,
                "errors_b": self.errors_b, "fixed": self.fixed, "broken": self.broken, "net": self.net}


def _correct(refs: Sequence[Sequence[str]], hyps: Sequence[Sequence[str]]) -> list[list[bool]]:
    out = []
    for a in align_many(refs, hyps):
        out.append([op == "C" for r, _, op in a.pairs() if r is not None])
    return out


def class_changes(refs: Sequence[Sequence[str]], hyps_a: Sequence[Sequence[str]],
                  hyps_b: Sequence[Sequence[str]], classes: Sequence[Sequence[str]],
                  order: Sequence[str] = ()) -> tuple[ClassChanges, ...]:
    """Per word class of the reference words (``classes``: one label per reference word), how A's errors differ
    from B's. Insertions belong to no reference word and are left out (A's and B's totals are in the WER).

    Classes come in ``order`` first, then the rest alphabetically; classes with no reference word are left out.

    >>> r = class_changes([["the", "cat", "sat"]], [["the", "cat", "sad"]], [["a", "cat", "sat"]],
    ...                   [["function", "noun", "verb"]])
    >>> [(c.word_class, c.errors_a, c.errors_b, c.fixed, c.broken) for c in r]
    [('function', 0, 1, 1, 0), ('noun', 0, 0, 0, 0), ('verb', 1, 0, 0, 1)]

    Raises:
        InputError: the lists differ in length, or a sentence's classes are not one per reference word.
    """
    if not (len(refs) == len(hyps_a) == len(hyps_b) == len(classes)):
        raise InputError(f"{len(refs)} references, {len(hyps_a)} and {len(hyps_b)} hypotheses, {len(classes)} "
                         "class sequences", expected="one of each per reference")
    for i, (r, c) in enumerate(zip(refs, classes, strict=True)):
        if len(r) != len(c):
            raise InputError(f"reference {i} has {len(r)} words and {len(c)} word classes",
                             expected="one class per reference word")
    ca, cb = _correct(refs, hyps_a), _correct(refs, hyps_b)
    counts: dict[str, list[int]] = {}
    for cls, xa, xb in zip(classes, ca, cb, strict=True):
        for k, a, b in zip(cls, xa, xb, strict=True):
            row = counts.setdefault(k, [0, 0, 0, 0, 0])
            row[0] += 1
            row[1] += not a
            row[2] += not b
            row[3] += a and not b
            row[4] += b and not a
    rank = {k: i for i, k in enumerate(order)}
    keys = sorted(counts, key=lambda k: (rank.get(k, len(rank)), k))
    return tuple(ClassChanges(k, *counts[k]) for k in keys)
