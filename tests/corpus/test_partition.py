"""Tests of partitioning: by key, Zipf devices, time-ordered rounds."""

import numpy as np
import pytest

from privasr.corpus.partition import by_key, time_rounds, zipf_devices, zipf_probabilities
from privasr.corpus.records import Transcript
from privasr.errors import ConfigError, InputError


def _utts(n, client="c"):
    return [Transcript(f"u{i:05d}", ("w",), client=client, speaker=f"s{i % 3}", order=i, meta={"ch": i % 2})
            for i in range(n)]


def test_by_key_variants():
    us = _utts(6)
    assert [c.id for c in by_key(us, "speaker")] == ["s0", "s1", "s2"]
    assert [len(c) for c in by_key(us, "meta:ch")] == [3, 3]
    assert len(by_key(us, "utterance")) == 6
    assert len(by_key(us, lambda u: u.utt_id[-1] in "02468")) == 2
    with pytest.raises(ConfigError):
        by_key(us, "meeting")
    with pytest.raises(InputError):
        by_key(us, "meta:missing")


def test_time_rounds_even_contiguous_ordered():
    us = _utts(10)[::-1]  # input order reversed: groups follow the order key, not input order
    groups = time_rounds(us, 3)
    assert [len(g) for g in groups] == [3, 3, 2, 2]
    flat = [u.order for g in groups for u in g]
    assert flat == list(range(10))
    assert [len(g) for g in time_rounds(_utts(2), 3)] == [1, 1, 0, 0]
    assert [len(g) for g in time_rounds(_utts(5), 0)] == [5]
    with pytest.raises(ConfigError):
        time_rounds(us, -1)


def test_zipf_probabilities_shape():
    p = zipf_probabilities(1000, 1.2)
    assert p.sum() == pytest.approx(1.0)
    assert np.all(np.diff(p) < 0)
    assert np.allclose(zipf_probabilities(4, 0.0), 0.25)
    with pytest.raises(ConfigError):
        zipf_probabilities(0, 1.0)
    with pytest.raises(ConfigError):
        zipf_probabilities(10, -1.0)


def test_zipf_devices_seeded_skewed_and_lossless():
    us = _utts(20000)
    a = zipf_devices(us, n_devices=8000, exponent=1.0, seed=7)
    b = zipf_devices(us, n_devices=8000, exponent=1.0, seed=7)
    c = zipf_devices(us, n_devices=8000, exponent=1.0, seed=8)
    assert [(k.id, len(k)) for k in a] == [(k.id, len(k)) for k in b]
    assert [(k.id, len(k)) for k in a] != [(k.id, len(k)) for k in c]
    assert a.num_utterances == 20000
    assert sorted(u.utt_id for k in a for u in k) == [u.utt_id for u in us]
    sizes = np.array(sorted((len(k) for k in a), reverse=True))
    # Skewed: the biggest device holds far more than the median one, as in paper 001's Figure 1.
    assert sizes[0] > 50 * np.median(sizes)
    # The empirical share of device 1 matches its Zipf probability.
    assert len(a["dev0001"]) / 20000 == pytest.approx(zipf_probabilities(8000, 1.0)[0], rel=0.1)
    assert us[0].client == "c"  # inputs untouched
    # Within a device, time order is kept.
    for k in a:
        orders = [u.order for u in k]
        assert orders == sorted(orders)
