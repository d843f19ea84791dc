"""Prefix tries for shared-prefix scoring: every prefix once, preorder subtrees, segments, packed rows and the
tree attention mask (property-based against brute force)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from privasr.lm.neural.trie import PrefixTrie, best_fit, pack_rows  # noqa: E402

SEQS = st.lists(st.lists(st.integers(0, 4), max_size=7), max_size=25)


def _prefix(trie: PrefixTrie, n: int) -> tuple[int, ...]:
    out = []
    while n > 0:
        out.append(int(trie.token[n]))
        n = int(trie.parent[n])
    return tuple(out[::-1])


@settings(max_examples=150, deadline=None)
@given(SEQS)
def test_every_prefix_exactly_once(seqs: list[list[int]]) -> None:
    trie = PrefixTrie.build(seqs, root_token=9)
    prefixes = [_prefix(trie, n) for n in range(len(trie))]
    expected = {tuple(s[:k]) for s in seqs for k in range(len(s) + 1)} | {()}
    assert len(prefixes) == len(set(prefixes)) == len(expected)
    assert set(prefixes) == expected
    assert trie.token[0] == 9 and trie.parent[0] == -1 and trie.depth[0] == 0
    assert all(trie.depth[n] == len(prefixes[n]) for n in range(len(trie)))
    # ends and paths give each sequence back
    for i, s in enumerate(seqs):
        assert prefixes[int(trie.ends[i])] == tuple(s)
        assert trie.lengths[i] == len(s)
        path = trie.path(i)
        assert [prefixes[int(n)] for n in path] == [tuple(s[:k]) for k in range(len(s) + 1)]
    flat, off = trie.paths()
    assert off[-1] == len(flat) == sum(len(s) + 1 for s in seqs)
    for i in range(len(seqs)):
        assert flat[off[i]:off[i + 1]].tolist() == trie.path(i).tolist()


@settings(max_examples=150, deadline=None)
@given(SEQS)
def test_preorder_subtrees_levels_children(seqs: list[list[int]]) -> None:
    trie = PrefixTrie.build(seqs)
    prefixes = [_prefix(trie, n) for n in range(len(trie))]
    for n in range(len(trie)):
        p = prefixes[n]
        desc = [m for m in range(len(trie)) if prefixes[m][:len(p)] == p]
        assert desc == list(range(n, n + int(trie.size[n])))  # contiguous subtree, n first
        kids = [m for m in range(len(trie)) if trie.parent[m] == n]
        assert trie.children(n) == kids
        assert [int(trie.token[k]) for k in kids] == sorted(int(trie.token[k]) for k in kids)
        assert trie.ancestors(n) == [m for m in range(len(trie)) if prefixes[n][:len(prefixes[m])] == prefixes[m]
                                     and m != n]
    levels = trie.levels()
    assert sorted(np.concatenate(levels).tolist()) == list(range(len(trie)))
    for d, lev in enumerate(levels):
        assert (trie.depth[lev] == d).all()


@settings(max_examples=150, deadline=None)
@given(SEQS, st.integers(1, 12), st.integers(0, 6))
def test_segments_pack_rows_and_attention(seqs: list[list[int]], extra: int, slack: int) -> None:
    trie = PrefixTrie.build(seqs)
    max_len = int(trie.depth.max()) + extra
    segs = trie.segments(max_len)
    covered = np.zeros(len(trie), dtype=int)
    for seg in segs:
        assert 1 <= len(seg) <= max_len and len(set(seg.tolist())) == len(seg)
        pos = {int(n): i for i, n in enumerate(seg)}
        for i, n in enumerate(seg.tolist()):  # ancestor-closed, parents listed first
            assert all(a in pos and pos[a] < i for a in trie.ancestors(n))
        covered[seg] += 1
    assert (covered >= 1).all()

    row_len = max_len + slack
    packed = pack_rows(trie, segs, row_len)
    assert packed.nodes.shape[1] == row_len
    assert (packed.own.sum() == len(trie)) and sorted(packed.nodes[packed.own].tolist()) == list(range(len(trie)))
    assert not packed.own[packed.nodes < 0].any()
    mask = packed.attention()
    prefixes = [_prefix(trie, n) for n in range(len(trie))]
    for r in range(len(packed)):
        nodes = packed.nodes[r].tolist()
        # rows hold whole segments: positions of one tree copy are the run since the last root
        tree = np.cumsum([n == 0 for n in nodes])
        for i, ni in enumerate(nodes):
            if ni < 0:
                assert mask[r, i].tolist() == [j == i for j in range(row_len)]
                assert packed.parent_pos[r, i] == -1 and packed.positions[r, i] == 0
                continue
            assert packed.positions[r, i] == trie.depth[ni]
            for j, nj in enumerate(nodes):
                anc = nj >= 0 and tree[i] == tree[j] and prefixes[ni][:len(prefixes[nj])] == prefixes[nj]
                assert mask[r, i, j] == anc
    assert np.array_equal(packed.attention(slice(1, None)), mask[1:])


def test_duplicates_and_empty_share_nodes() -> None:
    trie = PrefixTrie.build([(1, 2), [1, 2], (), np.array([1, 2])])
    assert len(trie) == 3
    assert trie.ends.tolist() == [2, 2, 0, 2]
    assert trie.size.tolist() == [3, 2, 1]
    empty = PrefixTrie.build([])
    assert len(empty) == 1 and empty.ends.size == 0 and empty.paths()[0].size == 0


def test_segments_refuse_paths_longer_than_a_segment() -> None:
    trie = PrefixTrie.build([[1, 2, 3]])
    with pytest.raises(ValueError, match="does not fit"):
        trie.segments(3)
    assert [s.tolist() for s in trie.segments(4)] == [[0, 1, 2, 3]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows(trie, trie.segments(4), 3)
    with pytest.raises(ValueError, match="not closed"):
        pack_rows(trie, [np.array([0, 2])], 4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 20), max_size=40), st.integers(20, 45))
def test_best_fit_packs_every_item_once_within_capacity(sizes: list[int], cap: int) -> None:
    bins = best_fit(sizes, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in b) <= cap for b in bins)
    # no two bins could be merged (best fit leaves at most one bin at most half full)
    loads = sorted(sum(sizes[i] for i in b) for b in bins)
    assert len(loads) < 2 or loads[0] + loads[1] > cap
    with pytest.raises(ValueError):
        best_fit([cap + 1], cap)
