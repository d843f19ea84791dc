"""Prefix tries for shared-prefix scoring: every prefix once, preorder subtrees, segments, packed rows, the
tree attention mask and the scored (node, target) pairs (property-based against brute force), and the compiled
loops (``privasr.lm.neural._trie``) against the Python reference, array for array."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import privasr.lm.neural.trie as trie_mod  # noqa: E402
from privasr.lm.neural.trie import (  # noqa: E402
    PrefixTrie,
    best_fit,
    lex_order,
    pack_rows,
    pack_segments,
    target_pairs,
)

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


@pytest.fixture(params=["compiled", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test on the compiled loops and on the Python reference."""
    if request.param == "python":
        monkeypatch.setattr(trie_mod, "_compiled", None)
    elif trie_mod._compiled is None:
        pytest.skip("privasr.lm.neural._trie is not built in this install")
    return str(request.param)


@settings(max_examples=100, deadline=None)
@given(SEQS, st.lists(st.integers(0, 6), min_size=25, max_size=25))
def test_target_pairs_are_each_targets_context_and_target_once(seqs: list[list[int]], finals: list[int]) -> None:
    for python in (False, True):
        saved = trie_mod._compiled
        if python:
            trie_mod._compiled = None
        try:
            trie = PrefixTrie.build(seqs)
            pnode, ptarget, tokpair = target_pairs(trie, finals[:len(seqs)])
        finally:
            trie_mod._compiled = saved
        flat, off = trie.paths()
        expect = []
        for i, s in enumerate(seqs):  # brute force: (prefix node, next token), then (whole sequence, final)
            path = flat[off[i]:off[i + 1]].tolist()
            expect += [(path[j], t) for j, t in enumerate(s)] + [(path[-1], finals[i])]
        got = list(zip(pnode[tokpair].tolist(), ptarget[tokpair].tolist(), strict=True))
        assert got == expect
        pairs = list(zip(pnode.tolist(), ptarget.tolist(), strict=True))
        assert len(set(pairs)) == len(pairs) == len(set(expect))  # distinct, and only the needed ones
        assert (np.diff(pnode) >= 0).all()  # grouped by node, nodes increasing


def test_target_pairs_refusals(impl: str) -> None:
    trie = PrefixTrie.build([[1, 2], [3]])
    with pytest.raises(ValueError, match="one target per sequence"):
        target_pairs(trie, [2])
    with pytest.raises(ValueError, match="non-negative"):
        target_pairs(trie, [2, -1])
    with pytest.raises(ValueError, match="non-negative"):
        target_pairs(PrefixTrie.build([[-3]]), [2])


@pytest.mark.skipif(trie_mod._compiled is None, reason="privasr.lm.neural._trie is not built in this install")
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=9), max_size=40), st.integers(0, 4), st.integers(0, 6),
       st.lists(st.integers(0, 7), min_size=40, max_size=40))
def test_compiled_loops_equal_the_python_reference(seqs: list[list[int]], extra: int, slack: int,
                                                   finals: list[int]) -> None:
    c = trie_mod._compiled
    fin = finals[:len(seqs)]

    def run() -> dict[str, object]:
        trie = PrefixTrie.build(seqs, root_token=7)
        max_len = int(trie.depth.max()) + 1 + extra
        flat, off = trie.segment_arrays(max_len)
        packed = pack_segments(trie, flat, off, max_len + slack)
        tokens = np.array([t for s in seqs for t in s], dtype=np.int64)
        offsets = np.cumsum([0] + [len(s) for s in seqs])
        pnode, ptarget, tokpair = target_pairs(trie, fin)
        return {"trie": [trie.parent, trie.token, trie.depth, trie.size, trie.ends, trie.lengths, *trie.paths()],
                "segments": [flat, off, *trie.segments(max_len)],
                "packed": [packed.nodes, packed.parent_pos, packed.own, packed.positions, packed.attention(),
                           packed.attention(slice(1, None))],
                "order": [lex_order(tokens, offsets)],
                "pairs": [pnode[tokpair], ptarget[tokpair], np.sort(pnode * 100 + ptarget)]}

    compiled = run()
    trie_mod._compiled = None
    try:
        python = run()
    finally:
        trie_mod._compiled = c
    for key, arrays in compiled.items():
        for a, b in zip(arrays, python[key], strict=True):  # type: ignore[call-overload]
            assert a.dtype == b.dtype and np.array_equal(a, b), key


def test_from_flat_equals_build_and_refuses_bad_offsets(impl: str) -> None:
    t = PrefixTrie.from_flat(np.array([4, 5, 4]), np.array([0, 2, 2, 3]), root_token=1)
    ref = PrefixTrie.build([[4, 5], [], [4]], root_token=1)
    for name in ("parent", "token", "depth", "size", "ends", "lengths"):
        assert np.array_equal(getattr(t, name), getattr(ref, name))
    assert t.paths()[0].tolist() == ref.paths()[0].tolist() == [0, 1, 2, 0, 0, 1]
    for tokens, offsets, match in (([1, 2], [0, 1], "end at len"), ([1, 2], [1, 2], "start at 0"),
                                   ([1, 2], [0, 2, 1, 2], "never decrease"), ([[1, 2]], [0, 2], "vectors"),
                                   ([1], [], "vectors")):
        with pytest.raises(ValueError, match=match):
            PrefixTrie.from_flat(tokens, offsets)
    with pytest.raises(ValueError, match="end at len"):
        lex_order([1, 2], [0, 1])


def test_pack_refuses_a_child_before_its_parent(impl: str) -> None:
    trie = PrefixTrie.build([[1, 2]])
    with pytest.raises(ValueError, match="not closed"):
        pack_segments(trie, np.array([0, 2, 1]), np.array([0, 3]), 4)
    with pytest.raises(ValueError, match="does not fit"):
        pack_segments(trie, np.array([0, 1, 2]), np.array([0, 3]), 2)


@pytest.mark.skipif(trie_mod._compiled is None, reason="privasr.lm.neural._trie is not built in this install")
def test_compiled_module_refuses_bad_buffers() -> None:
    c = trie_mod._compiled
    i64 = np.zeros(4, dtype=np.int64)
    with pytest.raises(TypeError, match="int64"):
        c.build(np.zeros(3, dtype=np.int32), np.array([0, 3]), 0, i64, i64, i64, i64, np.zeros(1, np.int64),
                np.zeros(4, np.int64))
    with pytest.raises(TypeError, match="writable"):
        ro = np.zeros(4, dtype=np.int64)
        ro.setflags(write=False)
        c.build(np.zeros(3, np.int64), np.array([0, 3]), 0, ro, i64, i64, i64, np.zeros(1, np.int64),
                np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="entries"):
        c.build(np.zeros(3, np.int64), np.array([0, 3]), 0, i64[:2], i64, i64, i64, np.zeros(1, np.int64),
                np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="offsets"):
        c.build(np.zeros(3, np.int64), np.array([0, 2]), 0, i64, i64, i64, i64, np.zeros(1, np.int64),
                np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="preorder"):
        c.segments(np.array([-1, 0]), np.array([2, 5]), np.array([0, 1]), 4)
    with pytest.raises(ValueError, match="outside the trie"):
        c.pack(np.array([-1]), np.array([0]), np.array([3]), np.array([0, 1]), 4)
    with pytest.raises(ValueError, match="before its child"):
        c.attention(np.array([1, -1]), 2, np.zeros(4, dtype=bool))
    with pytest.raises(TypeError, match="bool or uint8"):
        c.attention(np.array([-1, 0]), 2, np.zeros(4, dtype=np.int16))
    with pytest.raises(ValueError, match="outside the trie"):
        c.pairs(np.array([1]), np.array([-1]), np.array([3]), np.array([0, 0]), np.array([2]), i64, i64,
                np.zeros(1, np.int64))
