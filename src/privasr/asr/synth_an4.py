"""A small synthetic AN4-like acoustic corpus: per-speaker feature sequences of spelled words, for tests, the
federated acoustic training demo (``data.kind: synthetic`` of ``privasr ftl run``) and ``privasr bench ftl``.

Every letter of an 8-letter alphabet has its own random 13-dim mean; a word of a 20-word lexicon is its
letters' frames (6-9 each) around those means, shifted by a per-speaker offset and noisy; low-noise frames
pad the words. The utterances are :class:`~privasr.asr.features.An4Utterance` objects, as the AN4 reader gives.
(The synthetic N-best / transcript corpus of the demo is :mod:`privasr.synth`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from privasr.asr.features import An4Utterance

__all__ = ["synthetic_corpus"]


def synthetic_corpus(speakers: int = 16, utterances: int = 12, test_speakers: int = 4, seed: int = 0,
                     dim: int = 13) -> tuple[list[Any], list[Any]]:
    """A small AN4-like corpus (train, test) of :class:`~privasr.asr.features.An4Utterance`: 1-3 words of a
    20-word lexicon spelled over 8 letters, each letter 6-9 frames of its own random 13-dim mean plus a
    per-speaker offset and noise, 6 frames of low noise before, between and after the words.

    >>> tr, te = synthetic_corpus(speakers=3, utterances=2, test_speakers=2)
    >>> len(tr), len(te), tr[0].features.shape[1], len({u.speaker for u in tr})
    (6, 4, 13, 3)
    """
    rng = np.random.default_rng([seed, 21])
    letters = "ABCDEFGH"
    means = rng.normal(0.0, 2.0, size=(len(letters), dim))
    lexicon = ["".join(rng.choice(list(letters), size=int(rng.integers(2, 5)))) for _ in range(20)]

    def speaker(name: str, n: int, sid: int) -> list[Any]:
        r = np.random.default_rng([seed, 22, sid])
        offset = r.normal(0.0, 0.5, size=dim)
        out = []
        for i in range(n):
            words = tuple(str(w) for w in r.choice(lexicon, size=int(r.integers(1, 4))))
            frames = [r.normal(0.0, 0.3, size=(6, dim))]
            for w in words:
                for ch in w:
                    k = int(r.integers(6, 10))
                    frames.append(means[letters.index(ch)] + offset + r.normal(0.0, 0.7, size=(k, dim)))
                frames.append(r.normal(0.0, 0.3, size=(6, dim)))
            feats = np.concatenate(frames).astype(np.float32)
            out.append(An4Utterance(f"{name}-{i:03d}", name, words, feats))
        return out

    train = [u for s in range(speakers) for u in speaker(f"spk{s:02d}", utterances, s)]
    test = [u for s in range(test_speakers) for u in speaker(f"tst{s:02d}", utterances, 1000 + s)]
    return train, test
