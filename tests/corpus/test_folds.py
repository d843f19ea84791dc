"""Folds over clients: a partition, deterministic from the seed, never a client on both sides."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.corpus.folds import Fold, client_folds, split_fold
from privasr.corpus.records import Transcript
from privasr.errors import ConfigError, InputError


@settings(max_examples=80, deadline=None)
@given(st.sets(st.text("abcdef", min_size=1, max_size=4), min_size=2, max_size=30), st.integers(2, 8),
       st.integers(0, 2 ** 31))
def test_folds_partition_the_clients_and_never_share_one(clients, k, seed):
    if k > len(clients):
        with pytest.raises(ConfigError, match="distinct clients"):
            client_folds(clients, k, seed=seed)
        return
    folds = client_folds(clients, k, seed=seed)
    assert len(folds) == k and [f.index for f in folds] == list(range(k))
    tested = [c for f in folds for c in f.test]
    assert sorted(tested) == sorted(clients)  # every client tested exactly once
    sizes = [len(f.test) for f in folds]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    for f in folds:
        assert not set(f.dev) & set(f.test) and set(f.dev) | set(f.test) == set(clients)
        assert list(f.dev) == sorted(f.dev) and list(f.test) == sorted(f.test)
    # deterministic: the same clients in any order and with repeats give the same folds
    assert client_folds([*sorted(clients, reverse=True), *clients], k, seed=seed) == folds


def test_seeds_draw_other_folds_and_bad_k_is_refused():
    clients = [f"m{i:02d}" for i in range(26)]
    assert client_folds(clients, 5, seed=0) != client_folds(clients, 5, seed=1)
    for bad in (1, 0, 2.5, True, "3"):
        with pytest.raises(ConfigError, match="folds"):
            client_folds(clients, bad, seed=0)  # type: ignore[arg-type]


def test_split_fold_keeps_order_and_names_strays():
    recs = [Transcript(f"u{i}", ("w",), client=c) for i, c in enumerate("abcab")]
    fold = Fold(0, ("a", "c"), ("b",))
    dev, test = split_fold(recs, fold)
    assert [r.utt_id for r in dev] == ["u0", "u2", "u3"] and [r.utt_id for r in test] == ["u1", "u4"]
    with pytest.raises(InputError, match="client 'z'"):
        split_fold([Transcript("x", ("w",), client="z")], fold)
    with pytest.raises(InputError, match="no client"):
        split_fold([Transcript("x", ("w",))], fold)


def test_series_folds_keep_a_series_on_one_side():
    from privasr.corpus.folds import series_of

    clients = [f"{s}{x}" for s in ("ES2004", "ES2014", "IS1007", "IS1009", "TS3003") for x in "abcd"] + ["IS1005c"]
    folds = client_folds(clients, 3, seed=0, unit="series")
    assert sorted(c for f in folds for c in f.test) == sorted(clients)
    for f in folds:
        assert not {series_of(c) for c in f.test} & {series_of(c) for c in f.dev}
    with pytest.raises(ConfigError, match="6 series"):
        client_folds(clients, 7, seed=0, unit="series")
    with pytest.raises(ConfigError, match="fold unit"):
        client_folds(clients, 2, seed=0, unit="speaker")
