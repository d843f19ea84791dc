"""Prefix tries over token-id sequences, for scoring many sentences with shared prefixes once.

The N-best hypotheses of an utterance (and often of several utterances) share prefixes. A neural LM's
output after a prefix depends only on that prefix, so scoring a batch of sentences needs one forward
step per *distinct prefix*: the nodes of a :class:`PrefixTrie`. Node 0 is the root (the empty prefix,
fed as ``<s>``); every other node is one prefix, stored as its parent (the prefix one token shorter),
its last token and its depth (the prefix length, which is also the token's input position).

Nodes are numbered in depth-first preorder (children in increasing token order), so the subtree of node
``n`` is the contiguous range ``n .. n + size[n] - 1``; :meth:`PrefixTrie.levels` groups nodes by depth
for recurrent models, and :meth:`PrefixTrie.segments` cuts the trie into ancestor-closed pieces of bounded
length that :func:`pack_rows` packs into rows for a Transformer with a tree attention mask
(:meth:`PackedRows.attention`). :func:`target_pairs` lists the distinct (context node, target) pairs that scoring
a set of sequences needs, grouped by node.

The loops run in the compiled :mod:`privasr.lm.neural._trie` where it is built (:func:`compiled_trie`); the
Python and numpy code here is the fallback and the reference the tests hold it to, array for array.

>>> t = PrefixTrie.build([[5, 6], [5, 7], [5, 6], []])
>>> len(t), t.parent.tolist(), t.token.tolist(), t.depth.tolist()
(4, [-1, 0, 1, 1], [-1, 5, 6, 7], [0, 1, 2, 2])
>>> t.ends.tolist(), t.path(1).tolist()
([2, 3, 2, 0], [0, 1, 3])
>>> [s.tolist() for s in t.segments(3)]
[[0, 1, 2], [0, 1, 3]]
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    from privasr.lm.neural import _trie as _compiled
except ImportError:  # pragma: no cover - built by every install that has a C compiler
    _compiled = None

__all__ = ["PrefixTrie", "PackedRows", "pack_rows", "pack_segments", "best_fit", "target_pairs", "lex_order",
           "checked_offsets", "offsets_of", "compiled_trie"]


def compiled_trie() -> bool:
    """Whether the compiled trie loops (:mod:`privasr.lm.neural._trie`) are built in this install."""
    return _compiled is not None


def _ro(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def offsets_of(lengths: Any) -> np.ndarray:
    """The offsets of consecutive pieces of ``lengths``: ``[0, l0, l0 + l1, ...]`` (int64, one more entry).

    >>> offsets_of([2, 0, 3]).tolist()
    [0, 2, 2, 5]
    """
    lens = np.asarray(lengths, dtype=np.int64)
    off = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=off[1:])
    return off


def _flat(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    off = offsets_of(np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences)))
    tokens = np.fromiter(itertools.chain.from_iterable(sequences), dtype=np.int64, count=int(off[-1]))
    return tokens, off


def checked_offsets(tokens: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray]:
    """``tokens`` and ``offsets`` as int64 vectors, sequence ``i`` being ``tokens[offsets[i]:offsets[i+1]]``; a
    :class:`ValueError` unless ``offsets`` starts at 0, never decreases and ends at ``len(tokens)``.

    >>> [a.tolist() for a in checked_offsets([4, 5, 6], [0, 2, 2, 3])]
    [[4, 5, 6], [0, 2, 2, 3]]
    """
    t = np.ascontiguousarray(tokens, dtype=np.int64)
    o = np.ascontiguousarray(offsets, dtype=np.int64)
    if t.ndim != 1 or o.ndim != 1 or not len(o):
        raise ValueError("tokens and offsets must be vectors, offsets with at least one entry")
    if o[0] != 0 or o[-1] != len(t) or (np.diff(o) < 0).any():
        raise ValueError(f"offsets must start at 0, never decrease and end at len(tokens) = {len(t)}")
    return t, o


@dataclass(frozen=True)
class PrefixTrie:
    """Every distinct prefix of a set of sequences, once.

    Attributes:
        parent: parent node of each node (int64 ``[N]``; ``-1`` for the root).
        token: last token of each node's prefix (int64 ``[N]``; ``root_token`` for the root).
        depth: prefix length of each node (int64 ``[N]``; 0 for the root).
        size: number of nodes in each node's subtree, itself included (int64 ``[N]``).
        ends: node of each input sequence's full prefix (int64 ``[S]``, input order; duplicates share one).
        lengths: length of each input sequence (int64 ``[S]``).
    """

    parent: np.ndarray = field(repr=False)
    token: np.ndarray = field(repr=False)
    depth: np.ndarray = field(repr=False)
    size: np.ndarray = field(repr=False)
    ends: np.ndarray = field(repr=False)
    lengths: np.ndarray = field(repr=False)
    _paths: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, sequences: Sequence[Sequence[int]], *, root_token: int = -1) -> PrefixTrie:
        """The trie of all prefixes (the empty one included) of ``sequences``.

        Built by inserting the distinct sequences in sorted order, so each node is created once, in
        preorder, by extending the previous sequence's path past their common prefix.

        >>> t = PrefixTrie.build([(1, 2, 3), (1, 2), (4,)], root_token=0)
        >>> t.token.tolist(), t.size.tolist(), t.ends.tolist()
        ([0, 1, 2, 3, 4], [5, 3, 2, 1, 1], [3, 2, 4])
        """
        if _compiled is not None:
            return cls.from_flat(*_flat(sequences), root_token=root_token)
        return cls._build_py(sequences, root_token=root_token)

    @classmethod
    def from_flat(cls, tokens: Any, offsets: Any, *, root_token: int = -1) -> PrefixTrie:
        """The same trie as :meth:`build`, of sequences given as one flat token vector and offsets (sequence
        ``i`` is ``tokens[offsets[i]:offsets[i+1]]``): no Python object per token. Its :meth:`paths` come with it.

        >>> t = PrefixTrie.from_flat([1, 2, 3, 1, 2, 4], [0, 3, 5, 6], root_token=0)
        >>> t.token.tolist(), t.ends.tolist(), t.paths()[0].tolist()
        ([0, 1, 2, 3, 4], [3, 2, 4], [0, 1, 2, 3, 0, 1, 2, 0, 4])
        """
        t, off = checked_offsets(tokens, offsets)
        if _compiled is None:
            return cls._build_py([tuple(t[a:b].tolist()) for a, b in zip(off[:-1], off[1:], strict=True)],
                                 root_token=root_token)
        n_tok, n_seq = len(t), len(off) - 1
        parent, token, depth, size = (np.empty(n_tok + 1, dtype=np.int64) for _ in range(4))
        ends = np.empty(n_seq, dtype=np.int64)
        paths = np.empty(n_tok + n_seq, dtype=np.int64)
        n = _compiled.build(t, off, int(root_token), parent, token, depth, size, ends, paths)
        trie = cls(_ro(parent[:n]), _ro(token[:n]), _ro(depth[:n]), _ro(size[:n]), _ro(ends), _ro(np.diff(off)))
        path_off = off + np.arange(n_seq + 1)
        object.__setattr__(trie, "_paths", (_ro(paths), _ro(path_off)))
        return trie

    @classmethod
    def _build_py(cls, sequences: Sequence[Sequence[int]], *, root_token: int) -> PrefixTrie:
        keys = [s if isinstance(s, tuple) else tuple(int(x) for x in s) for s in sequences]
        parent, token, depth = [-1], [root_token], [0]
        end_of: dict[tuple[int, ...], int] = {}
        path = [0]  # path[d]: node of the previous sequence's prefix of length d
        prev: tuple[int, ...] = ()
        for s in sorted(set(keys)):
            n = min(len(prev), len(s))
            lcp = 0
            while lcp < n and prev[lcp] == s[lcp]:
                lcp += 1
            del path[lcp + 1:]
            for tok in s[lcp:]:
                parent.append(path[-1])
                token.append(tok)
                depth.append(len(path))
                path.append(len(parent) - 1)
            end_of[s] = path[-1]
            prev = s
        par = np.asarray(parent, dtype=np.int64)
        dep = np.asarray(depth, dtype=np.int64)
        size = np.ones(len(par), dtype=np.int64)
        order = np.argsort(dep, kind="stable")
        bounds = np.searchsorted(dep[order], np.arange(int(dep.max(initial=0)) + 2))
        for d in range(len(bounds) - 2, 0, -1):  # deepest level first: add each level into its parents
            nodes = order[bounds[d]:bounds[d + 1]]
            np.add.at(size, par[nodes], size[nodes])
        ends = np.fromiter((end_of[k] for k in keys), dtype=np.int64, count=len(keys))
        lens = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
        return cls(_ro(par), _ro(np.asarray(token, dtype=np.int64)), _ro(dep), _ro(size), _ro(ends), _ro(lens))

    def __len__(self) -> int:
        return len(self.parent)

    def path(self, i: int) -> np.ndarray:
        """Nodes of sequence ``i``'s prefixes of length ``0 .. lengths[i]`` (root first).

        >>> PrefixTrie.build([[3, 1]]).path(0).tolist()
        [0, 1, 2]
        """
        n = int(self.lengths[i])
        out = np.empty(n + 1, dtype=np.int64)
        node = int(self.ends[i])
        for d in range(n, -1, -1):
            out[d] = node
            node = int(self.parent[node])
        return out

    def paths(self) -> tuple[np.ndarray, np.ndarray]:
        """All sequences' paths concatenated, and offsets: sequence ``i``'s path is ``flat[off[i]:off[i+1]]``.

        Computed level by level (one vectorised step per depth), not node by node.

        >>> flat, off = PrefixTrie.build([[1, 2], [1], []]).paths()
        >>> flat.tolist(), off.tolist()
        ([0, 1, 2, 0, 1, 0], [0, 3, 5, 6])
        """
        if self._paths is not None:
            return self._paths
        off = offsets_of(self.lengths + 1)
        flat = np.empty(int(off[-1]), dtype=np.int64)
        cur = self.ends.copy()
        at = off[1:] - 1  # write position of each sequence's current node (filled from the end)
        alive = np.ones(len(cur), dtype=bool)
        while alive.any():
            idx = np.flatnonzero(alive)
            flat[at[idx]] = cur[idx]
            at[idx] -= 1
            cur[idx] = self.parent[cur[idx]]
            alive[idx] = cur[idx] >= 0
        return flat, off

    def levels(self) -> list[np.ndarray]:
        """Nodes grouped by depth: ``levels()[d]`` are the nodes of depth ``d`` (increasing node order).

        >>> [x.tolist() for x in PrefixTrie.build([[1, 2], [3]]).levels()]
        [[0], [1, 3], [2]]
        """
        order = np.argsort(self.depth, kind="stable")
        bounds = np.searchsorted(self.depth[order], np.arange(int(self.depth.max(initial=0)) + 2))
        return [order[bounds[d]:bounds[d + 1]] for d in range(len(bounds) - 1)]

    def children(self, n: int) -> list[int]:
        """Children of node ``n`` (increasing token order), found by skipping subtrees in preorder.

        >>> PrefixTrie.build([[1, 2], [1, 3], [4]]).children(0)
        [1, 4]
        """
        out = []
        c, stop = n + 1, n + int(self.size[n])
        while c < stop:
            out.append(c)
            c += int(self.size[c])
        return out

    def ancestors(self, n: int) -> list[int]:
        """Nodes from the root down to ``n``'s parent.

        >>> PrefixTrie.build([[1, 2]]).ancestors(2)
        [0, 1]
        """
        out = []
        p = int(self.parent[n])
        while p >= 0:
            out.append(p)
            p = int(self.parent[p])
        return out[::-1]

    def segments(self, max_len: int) -> list[np.ndarray]:
        """Cut the trie into ancestor-closed node lists of at most ``max_len`` nodes each.

        If the whole trie fits, it is the only segment. Otherwise, below a node ``n`` whose subtree is too
        large, the child subtrees that fit are grouped by best-fit decreasing bin packing into segments of
        ``n``'s path from the root followed by those whole subtrees (in preorder); children too large are split
        the same way, one level down. So the ancestors of a split subtree are repeated in each of its segments:
        every node is *owned* by the first segment it appears in (see :func:`pack_rows`), repeats are context
        only. ``max_len`` must exceed the depth of the deepest node (a segment must hold a whole path).

        >>> t = PrefixTrie.build([[1, 2, 3], [1, 2, 4], [1, 5], [6]])
        >>> [s.tolist() for s in t.segments(4)]
        [[0, 6], [0, 1, 5], [0, 1, 2, 3], [0, 1, 2, 4]]
        """
        flat, off = self.segment_arrays(max_len)
        return np.split(flat, off[1:-1])

    def segment_arrays(self, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`segments` as one flat node vector and offsets: segment ``k`` is ``flat[off[k]:off[k+1]]``.

        >>> flat, off = PrefixTrie.build([[1, 2, 3], [1, 2, 4], [1, 5], [6]]).segment_arrays(4)
        >>> flat.tolist(), off.tolist()
        ([0, 6, 0, 1, 5, 0, 1, 2, 3, 0, 1, 2, 4], [0, 2, 5, 9, 13])
        """
        if len(self) and int(self.depth.max()) + 1 > max_len:
            raise ValueError(f"a path of {int(self.depth.max()) + 1} nodes does not fit segments of {max_len}")
        if int(self.size[0]) <= max_len:
            return np.arange(len(self), dtype=np.int64), np.array([0, len(self)], dtype=np.int64)
        if _compiled is not None:
            fb, ob = _compiled.segments(self.parent, self.size, self.depth, int(max_len))
            return np.frombuffer(fb, dtype=np.int64), np.frombuffer(ob, dtype=np.int64)
        segs = self._segments_py(max_len)
        return np.concatenate(segs), offsets_of([len(x) for x in segs])

    def _segments_py(self, max_len: int) -> list[np.ndarray]:
        size = self.size
        out: list[np.ndarray] = []
        todo: list[tuple[int, list[int]]] = [(0, [0])]  # (node to split, path from the root to it)
        while todo:
            n, anc = todo.pop()
            kids = self.children(n)
            room = max_len - len(anc)
            fit = [c for c in kids if int(size[c]) <= room]
            prefix = np.asarray(anc, dtype=np.int64)
            for group in best_fit([int(size[c]) for c in fit], room):
                parts = [np.arange(c, c + int(size[c]), dtype=np.int64) for c in sorted(fit[i] for i in group)]
                out.append(np.concatenate([prefix, *parts]))
            todo.extend((c, [*anc, c]) for c in reversed(kids) if int(size[c]) > room)
        return out


def best_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing bin packing: indices of ``sizes`` grouped into bins of total at most ``capacity``.

    Each item (largest first) goes into the fullest bin it fits in, else a new bin. Bins are listed in the
    order they were opened; items larger than ``capacity`` are an error.

    >>> best_fit([5, 3, 4, 2, 6], 8)
    [[4, 3], [0, 1], [2]]
    """
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, bin), sorted
    for i in order:
        sz = sizes[i]
        if sz > capacity:
            raise ValueError(f"an item of {sz} does not fit bins of {capacity}")
        k = bisect.bisect_left(free, (sz, -1))
        if k < len(free):
            room, b = free.pop(k)
        else:
            room, b = capacity, len(bins)
            bins.append([])
        bins[b].append(i)
        if room - sz > 0:
            bisect.insort(free, (room - sz, b))
    return bins


def lex_order(tokens: Any, offsets: Any) -> np.ndarray:
    """Indices of the sequences ``tokens[offsets[i]:offsets[i+1]]`` in lexicographic order (a prefix first;
    equal sequences in input order).

    >>> lex_order([3, 1, 2, 1], [0, 1, 3, 4]).tolist()
    [2, 1, 0]
    """
    t, off = checked_offsets(tokens, offsets)
    if _compiled is not None:
        out = np.empty(len(off) - 1, dtype=np.int64)
        _compiled.lex_order(t, off, out)
        return out
    keys = [t[a:b].tolist() for a, b in zip(off[:-1], off[1:], strict=True)]
    return np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)


def target_pairs(trie: PrefixTrie, final: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (context node, target) pairs of scoring the trie's sequences.

    Sequence ``i``'s targets are its tokens, then ``final[i]`` (e.g. ``</s>``); the context of its ``j``-th target
    is its prefix of length ``j``, the node ``trie.paths()`` lists there. Returns ``pnode`` and ``ptarget`` (the
    pairs, grouped by node in increasing node order) and ``tokpair`` (each target's pair, laid out like
    :meth:`PrefixTrie.paths`). Targets must be non-negative.

    >>> t = PrefixTrie.build([[5, 6], [5]])
    >>> pnode, ptarget, tokpair = target_pairs(t, [2, 6])
    >>> [(int(n), int(g)) for n, g in zip(pnode, ptarget)], tokpair.tolist()
    ([(0, 5), (1, 6), (2, 2)], [0, 1, 2, 0, 1])
    """
    paths, poff = trie.paths()
    fin = np.ascontiguousarray(final, dtype=np.int64)
    if fin.shape != (len(trie.ends),):
        raise ValueError(f"final needs one target per sequence ({len(trie.ends)}), not shape {fin.shape}")
    if (len(fin) and int(fin.min()) < 0) or (len(trie) > 1 and int(trie.token[1:].min()) < 0):
        raise ValueError("targets must be non-negative")
    if _compiled is not None:
        off = poff - np.arange(len(poff))
        cap = len(trie) + len(fin)
        pnode, ptarget = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
        tokpair = np.empty(len(paths), dtype=np.int64)
        n = _compiled.pairs(trie.size, trie.token, paths, off, fin, pnode, ptarget, tokpair)
        return pnode[:n], ptarget[:n], tokpair
    nxt = paths[np.minimum(np.arange(1, len(paths) + 1), len(paths) - 1)]
    targets = trie.token[nxt]
    targets[poff[1:] - 1] = fin
    width = int(targets.max(initial=0)) + 1
    keys, inverse = np.unique(paths * width + targets, return_inverse=True)
    pnode, ptarget = np.divmod(keys, width)
    return pnode, ptarget, inverse.ravel()


def pack_rows(trie: PrefixTrie, segments: Sequence[np.ndarray], row_len: int) -> PackedRows:
    """Pack segments into rows of at most ``row_len`` positions (:func:`best_fit` bin packing).

    A row may hold several segments (several trees: the attention mask keeps them apart). Each node is
    *owned* by its first position over all rows; later copies are context only.

    >>> t = PrefixTrie.build([[1, 2], [1, 3], [4]])
    >>> p = pack_rows(t, t.segments(3), 6)
    >>> p.nodes.tolist(), p.parent_pos.tolist()
    ([[0, 1, 2, 0, 1, 3], [0, 4, -1, -1, -1, -1]], [[-1, 0, 1, -1, 3, 4], [-1, 0, -1, -1, -1, -1]])
    >>> p.own.astype(int).tolist()
    [[1, 1, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
    """
    flat = np.concatenate(segments).astype(np.int64, copy=False) if len(segments) else np.zeros(0, dtype=np.int64)
    return pack_segments(trie, flat, offsets_of([len(seg) for seg in segments]), row_len)


def pack_segments(trie: PrefixTrie, flat: np.ndarray, offsets: np.ndarray, row_len: int) -> PackedRows:
    """:func:`pack_rows` of segments given as one flat node vector and offsets (:meth:`PrefixTrie.segment_arrays`).

    >>> t = PrefixTrie.build([[1, 2], [1, 3], [4]])
    >>> pack_segments(t, *t.segment_arrays(3), 6).nodes.tolist()
    [[0, 1, 2, 0, 1, 3], [0, 4, -1, -1, -1, -1]]
    """
    flat = np.ascontiguousarray(flat, dtype=np.int64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    lens = np.diff(offsets)
    if len(lens) and int(lens.max()) > row_len:
        raise ValueError(f"a segment of {int(lens.max())} nodes does not fit rows of {row_len}")
    if _compiled is not None:
        rows, nb, pb, ob, qb = _compiled.pack(trie.parent, trie.depth, flat, offsets, int(row_len))
        shape = (rows, row_len)
        return PackedRows(np.frombuffer(nb, dtype=np.int64).reshape(shape),
                          np.frombuffer(pb, dtype=np.int64).reshape(shape),
                          np.frombuffer(ob, dtype=bool).reshape(shape),
                          np.frombuffer(qb, dtype=np.int64).reshape(shape))
    segments = [flat[offsets[k]:offsets[k + 1]] for k in range(len(lens))]
    rows = [[segments[i] for i in sorted(b)] for b in best_fit([len(seg) for seg in segments], row_len)]
    nodes = np.full((len(rows), row_len), -1, dtype=np.int64)
    parent_pos = np.full((len(rows), row_len), -1, dtype=np.int64)
    where = np.full(len(trie), -1, dtype=np.int64)
    for r, row in enumerate(rows):
        o = 0
        for seg in row:
            n = len(seg)
            where[seg] = np.arange(o, o + n)
            nodes[r, o:o + n] = seg
            par = trie.parent[seg]
            pp = where[np.maximum(par, 0)]
            pp[par < 0] = -1
            if ((pp < 0) != (par < 0)).any() or (pp >= np.arange(o, o + n)).any():
                raise ValueError("a segment is not closed under ancestors (or lists a child before its parent)")
            parent_pos[r, o:o + n] = pp
            where[seg] = -1
            o += n
    flat = nodes.ravel()
    valid = np.flatnonzero(flat >= 0)
    first = np.full(len(trie), -1, dtype=np.int64)
    first[flat[valid][::-1]] = valid[::-1]  # first position of each node (later writes win: reversed)
    own = np.zeros(flat.shape, dtype=bool)
    own[first[first >= 0]] = True
    return PackedRows(nodes, parent_pos, own.reshape(nodes.shape), trie.depth[np.maximum(nodes, 0)] * (nodes >= 0))


@dataclass(frozen=True)
class PackedRows:
    """Trie nodes packed into rows for a Transformer with a tree attention mask.

    Attributes:
        nodes: node at each position (int64 ``[R, L]``; ``-1`` for padding).
        parent_pos: position of each node's parent in the same row (``-1`` for roots and padding).
        own: whether the position is its node's owner (its output is the one to use).
        positions: depth of each node (its input position; 0 for padding).
    """

    nodes: np.ndarray = field(repr=False)
    parent_pos: np.ndarray = field(repr=False)
    own: np.ndarray = field(repr=False)
    positions: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return len(self.nodes)

    def attention(self, rows: slice | np.ndarray | None = None) -> np.ndarray:
        """Boolean mask ``[R, L, L]``: position ``i`` may attend to ``j`` when ``j`` is ``i`` or one of its
        ancestors (padding attends to itself only). One vectorised step per tree level.

        >>> t = PrefixTrie.build([[1, 2], [3]])
        >>> pack_rows(t, [np.arange(4)], 5).attention()[0].astype(int).tolist()
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
        """
        pp = self.parent_pos if rows is None else self.parent_pos[rows]
        r, length = pp.shape
        if _compiled is not None:
            mask = np.empty((r, length, length), dtype=bool)
            _compiled.attention(np.ascontiguousarray(pp), length, mask)
            return mask
        mask = np.zeros((r, length, length), dtype=bool)
        ri, ii = np.divmod(np.arange(r * length), length)
        mask[ri, ii, ii] = True
        cur = pp.ravel().copy()
        live = np.flatnonzero(cur >= 0)
        while live.size:
            mask[ri[live], ii[live], cur[live]] = True
            nxt = pp[ri[live], cur[live]]
            cur[live] = nxt
            live = live[nxt >= 0]
        return mask
