"""A hash index over a sorted array of distinct n-gram keys, for vectorised exact lookups.

:class:`~privasr.lm.ngram.model.NgramModel` stores the n-grams of each order as one sorted ``int64`` key array,
and a lookup is a binary search (``np.searchsorted``). For large batches of queries a hash table is about three
times faster: each query touches one or two slots instead of ~18 cache lines. :class:`KeyIndex` is an
open-addressing table (linear probing, multiplicative hashing, load at most one half) that maps a key to its row
in the sorted array, built and probed with numpy, one vectorised step per probe. Lookups are exact: the result is
the row :func:`numpy.searchsorted` finds, or ``-1`` for a key that is not there.

>>> keys = np.array([3, 10, 11, 40, 2**40], dtype=np.int64)
>>> index = KeyIndex(keys)
>>> index.lookup(np.array([10, 4, 2**40, 3, 0])).tolist()
[1, -1, 4, 0, -1]
"""

from __future__ import annotations

import numpy as np

__all__ = ["KeyIndex"]

_MULT = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd: Fibonacci hashing


class KeyIndex:
    """Hash index of a sorted, distinct, non-negative ``int64`` key array (see the module docstring).

    Args:
        keys: the sorted key array (kept by reference; it must not change).
    """

    __slots__ = ("keys", "bits", "slots")

    def __init__(self, keys: np.ndarray) -> None:
        self.keys = keys
        self.bits = max(3, int(2 * len(keys) - 1).bit_length())  # at least 2 slots per key
        size = 1 << self.bits
        mask = size - 1
        slots = np.full(size, -1, dtype=np.int64 if len(keys) >= 2**31 else np.int32)
        pos = self._hash(keys)
        pending = np.arange(len(keys))
        placed = np.zeros(len(keys), dtype=bool)
        while pending.size:
            # every pending key whose slot is free competes for it; the first of each slot wins, the rest move on
            free = pending[slots[pos[pending]] < 0]
            _, first = np.unique(pos[free], return_index=True)
            win = free[first]
            slots[pos[win]] = win
            placed[win] = True
            pending = pending[~placed[pending]]
            pos[pending] = (pos[pending] + 1) & mask
        self.slots = slots

    def _hash(self, q: np.ndarray) -> np.ndarray:
        return ((q.astype(np.uint64) * _MULT) >> np.uint64(64 - self.bits)).astype(np.int64)

    def lookup(self, q: np.ndarray) -> np.ndarray:
        """Row of each query key in ``keys``, ``-1`` where absent (``int64``, the shape of ``q``)."""
        q = np.asarray(q, dtype=np.int64)
        mask = (1 << self.bits) - 1
        pos = self._hash(q)
        out = np.full(len(q), -1, dtype=np.int64)
        active = np.arange(len(q))
        while active.size:
            s = self.slots[pos[active]].astype(np.int64)
            occupied = s >= 0
            hit = occupied.copy()
            hit[occupied] = self.keys[s[occupied]] == q[active[occupied]]
            out[active[hit]] = s[hit]
            active = active[occupied & ~hit]  # an empty slot ends the search: the key is absent
            pos[active] = (pos[active] + 1) & mask
        return out
