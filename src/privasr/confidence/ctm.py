"""Word-confidence features of CTM transcripts (words with times and a decoder's own confidence).

A decoder's CTM confidences can be poor: Kaldi's on Earnings-21's 49%-WER system average 0.95 where half
the words are right (AUC 0.60 as a detector of correct words). Paper 001 uses "a confidence classifier ...
trained using feed-forward networks and handcrafted input features from decoding results"; for CTM data
these are the features at hand, one row per word (:data:`CTM_FEATURE_NAMES`):

* the decoder's confidence, and those of the previous and next word (1.0 at an utterance edge);
* the utterance's mean and minimum confidence, its length in words, and the word's relative position;
* the word's duration, duration per character, length in characters, and the pauses before and after it
  (1.0 s at an utterance edge);
* how common the word is in **background text** the server holds (:class:`BackgroundFrequencies`:
  add-0.5 smoothed log relative frequency, and whether it is unseen there): decoders mostly err on rare
  words and substitute common ones.

:meth:`privasr.confidence.model.ConfidenceModel.fit_features` trains the classifier on these (labels: the
word is a hit in the alignment against a reference) and calibrates it with isotonic regression.

>>> from privasr.corpus.records import Transcript
>>> bg = BackgroundFrequencies.from_sentences([("the", "call"), ("the", "results")])
>>> u = Transcript("c1-0", ("the", "revenue"), client="c1", confidences=(0.9, 0.5),
...                times=((0.0, 0.2), (0.3, 0.9)))
>>> x = ctm_word_features(u, bg)
>>> col = CTM_FEATURE_NAMES.index
>>> x.shape, float(x[0, col("next_confidence")]), float(x[1, col("background_unseen")])
((2, 14), 0.5, 1.0)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from privasr.errors import InputError

__all__ = ["CTM_FEATURE_NAMES", "BackgroundFrequencies", "ctm_word_features", "ctm_features_many"]

CTM_FEATURE_NAMES: tuple[str, ...] = (
    "confidence", "prev_confidence", "next_confidence", "utt_mean_confidence", "utt_min_confidence",
    "utt_words", "relative_position", "duration", "duration_per_char", "chars", "pause_before", "pause_after",
    "background_log_freq", "background_unseen",
)
"""Column names of :func:`ctm_word_features`."""

_EDGE_PAUSE = 1.0


class BackgroundFrequencies:
    """Word frequencies of background text: ``log_freq(w) = ln((count(w) + 0.5) / total)``.

    >>> bg = BackgroundFrequencies.from_sentences([("a", "b", "a")])
    >>> round(bg.log_freq("a"), 3), round(bg.log_freq("z"), 3), bg.seen("z")
    (-0.182, -1.792, False)
    """

    def __init__(self, counts: Counter[str]) -> None:
        self._counts = counts
        self._total = float(sum(counts.values()))
        if self._total <= 0:
            raise InputError("background text has no words", expected="at least one sentence with words")

    @classmethod
    def from_sentences(cls, sentences: Iterable[Sequence[str]]) -> BackgroundFrequencies:
        """Count the words of ``sentences``."""
        c: Counter[str] = Counter()
        for s in sentences:
            c.update(s)
        return cls(c)

    def log_freq(self, word: str) -> float:
        """The add-0.5 smoothed natural-log relative frequency of ``word``."""
        return math.log((self._counts.get(word, 0) + 0.5) / self._total)

    def seen(self, word: str) -> bool:
        """Whether ``word`` occurs in the background text."""
        return word in self._counts

    def __len__(self) -> int:
        return len(self._counts)


def ctm_word_features(utt: Any, background: BackgroundFrequencies) -> np.ndarray:
    """The ``[words, len(CTM_FEATURE_NAMES)]`` features of one utterance with ``words``, ``confidences`` and
    ``times`` (``(start, end)`` seconds per word), e.g. a :class:`~privasr.corpus.records.Transcript` from a CTM.

    Raises:
        InputError: the utterance lacks confidences or times, or their counts differ from its words.
    """
    words = tuple(utt.words)
    n = len(words)
    uid = getattr(utt, "utt_id", "?")
    if utt.confidences is None or len(utt.confidences) != n:
        raise InputError(f"utterance {uid!r} has no confidence per word", expected="a CTM with confidences")
    if utt.times is None or len(utt.times) != n:
        raise InputError(f"utterance {uid!r} has no time per word", expected="a CTM with start and duration")
    x = np.zeros((n, len(CTM_FEATURE_NAMES)))
    if n == 0:
        return x
    c = np.asarray(utt.confidences, dtype=np.float64)
    t = np.asarray(utt.times, dtype=np.float64).reshape(n, 2)
    dur = t[:, 1] - t[:, 0]
    chars = np.array([len(w) for w in words], dtype=np.float64)
    x[:, 0] = c
    x[:, 1] = np.concatenate([[1.0], c[:-1]])
    x[:, 2] = np.concatenate([c[1:], [1.0]])
    x[:, 3] = c.mean()
    x[:, 4] = c.min()
    x[:, 5] = n
    x[:, 6] = np.arange(n) / max(n - 1, 1)
    x[:, 7] = dur
    x[:, 8] = dur / np.maximum(chars, 1.0)
    x[:, 9] = chars
    pauses = t[1:, 0] - t[:-1, 1]
    x[:, 10] = np.concatenate([[_EDGE_PAUSE], pauses])
    x[:, 11] = np.concatenate([pauses, [_EDGE_PAUSE]])
    x[:, 12] = [background.log_freq(w) for w in words]
    x[:, 13] = [0.0 if background.seen(w) else 1.0 for w in words]
    return x


def ctm_features_many(utts: Sequence[Any], background: BackgroundFrequencies) -> list[np.ndarray]:
    """:func:`ctm_word_features` of each utterance."""
    return [ctm_word_features(u, background) for u in utts]
