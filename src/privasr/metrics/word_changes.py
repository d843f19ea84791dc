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

__all__ = ["WordHitChanges", "word_hit_changes"]


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
