"""The synthetic AN4-like acoustic corpus: shapes, speakers, determinism."""

from __future__ import annotations

import numpy as np

from privasr.asr.features import An4Utterance
from privasr.asr.synth_an4 import synthetic_corpus


def test_synthetic_corpus_is_deterministic_with_its_seed():
    a, b = synthetic_corpus(speakers=4, utterances=3, test_speakers=2, seed=5)
    c, d = synthetic_corpus(speakers=4, utterances=3, test_speakers=2, seed=5)
    assert len(a) == 12 and len(b) == 6
    assert [u.words for u in a] == [u.words for u in c] and [u.words for u in b] == [u.words for u in d]
    assert all(np.array_equal(x.features, y.features) for x, y in zip(a + b, c + d, strict=True))
    e, _ = synthetic_corpus(speakers=4, utterances=3, test_speakers=2, seed=6)
    assert [u.words for u in a] != [u.words for u in e]


def test_synthetic_corpus_shape():
    train, test = synthetic_corpus(speakers=3, utterances=2, test_speakers=2, dim=5)
    assert all(isinstance(u, An4Utterance) for u in train + test)
    assert sorted({u.speaker for u in train}) == ["spk00", "spk01", "spk02"]
    assert sorted({u.speaker for u in test}) == ["tst00", "tst01"]
    assert [u.utt_id for u in train[:2]] == ["spk00-000", "spk00-001"]
    for u in train + test:
        assert u.features.dtype == np.float32 and u.features.shape[1] == 5
        assert 1 <= len(u.words) <= 3 and all(set(w) <= set("ABCDEFGH") and 2 <= len(w) <= 4 for w in u.words)
        # 6 padding frames around and between the words, 6-9 frames per letter
        letters = sum(map(len, u.words))
        assert 6 * (len(u.words) + 1) + 6 * letters <= len(u.features) <= 6 * (len(u.words) + 1) + 9 * letters
