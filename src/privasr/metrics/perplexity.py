"""Perplexity accounting exactly as SRILM ``ngram -ppl`` does it.

Per sentence, a language model gives the log10 probability of each word and of the end-of-sentence
``</s>``. Words outside the LM vocabulary (**OOVs**) are not scored; in-vocabulary words with probability 0
(**zeroprobs**) are counted apart and not scored either. ``words`` counts the words of the text, *without*
``</s>`` and including OOVs. Then, as in SRILM::

    ppl  = 10 ** (-logprob / (words - oovs - zeroprobs + sentences))   # </s> counted
    ppl1 = 10 ** (-logprob / (words - oovs - zeroprobs))               # </s> not counted

An open-vocabulary model that scores unknown words as ``<unk>`` (KenLM ``query``) simply has no OOVs in
this sense: pass the ``<unk>`` log probability as an ordinary word, and ``ppl`` is KenLM's "perplexity
including OOVs".

>>> s = sentence_stats([-1.0, None, -2.0], eos=-0.5)     # None marks an OOV word
>>> s.words, s.oovs, s.logprob
(3, 1, -3.5)
>>> print(format_ppl(s, "test.txt"))
file test.txt: 1 sentences, 3 words, 1 OOVs
0 zeroprobs, logprob= -3.5 ppl= 14.678 ppl1= 56.2341
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from privasr.errors import InputError

__all__ = ["PplStats", "sentence_stats", "corpus_stats", "format_ppl", "OOV", "ZEROPROB"]

OOV = None
"""Marker for an out-of-vocabulary word in a list of word log10 probabilities."""

ZEROPROB = -math.inf
"""Marker for an in-vocabulary word with probability 0 (log10 p = -inf)."""


@dataclass(frozen=True, slots=True)
class PplStats:
    """SRILM's text statistics; add them with ``+`` (or :meth:`merge`) to accumulate sentence by sentence.

    Attributes:
        sentences: number of sentences (each contributes one ``</s>`` token).
        words: number of words, without ``</s>``, including OOVs and zeroprobs.
        oovs: words not in the vocabulary (not scored).
        zeroprobs: in-vocabulary tokens with probability 0 (not scored).
        logprob: total log10 probability of the scored tokens (words and ``</s>``).

    >>> a = PplStats(1, 3, 0, 0, -4.0)
    >>> (a + PplStats(1, 1, 1, 0, -0.5)).words
    4
    """

    sentences: int = 0
    words: int = 0
    oovs: int = 0
    zeroprobs: int = 0
    logprob: float = 0.0

    def __post_init__(self) -> None:
        for k in ("sentences", "words", "oovs", "zeroprobs"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"{k} is {v!r}", expected="an integer >= 0")
        lp = self.logprob
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp) or lp > 0:
            raise InputError(f"logprob is {lp!r}", expected="a finite log10 probability <= 0")
        if self.oovs + self.zeroprobs > self.words + self.sentences:
            raise InputError("more OOVs and zeroprobs than tokens", expected="oovs + zeroprobs <= words + sentences")

    def __add__(self, other: PplStats) -> PplStats:
        if not isinstance(other, PplStats):
            return NotImplemented
        return self.merge(other)

    def merge(self, other: PplStats) -> PplStats:
        """The statistics of both texts together."""
        return PplStats(self.sentences + other.sentences, self.words + other.words, self.oovs + other.oovs,
                        self.zeroprobs + other.zeroprobs, self.logprob + other.logprob)

    @property
    def denominator(self) -> int:
        """Tokens scored for ``ppl``: ``words - oovs - zeroprobs + sentences``."""
        return self.words - self.oovs - self.zeroprobs + self.sentences

    @property
    def ppl(self) -> float:
        """Perplexity counting ``</s>`` (``nan`` when nothing was scored).

        >>> round(PplStats(2, 8, 0, 0, -10.0).ppl, 4)
        10.0
        """
        d = self.denominator
        return 10.0 ** (-self.logprob / d) if d > 0 else math.nan

    @property
    def ppl1(self) -> float:
        """Perplexity without ``</s>``: ``10 ** (-logprob / (words - oovs - zeroprobs))`` (``nan`` if no words)."""
        d = self.words - self.oovs - self.zeroprobs
        return 10.0 ** (-self.logprob / d) if d > 0 else math.nan


def sentence_stats(word_logprobs: Sequence[float | None], eos: float | None) -> PplStats:
    """Statistics of one sentence from its words' log10 probabilities and that of ``</s>``.

    A word's entry is ``None`` (:data:`OOV`) if it is out of vocabulary, ``-inf`` (:data:`ZEROPROB`) if the
    model gives it probability 0, else its log10 probability (<= 0). ``eos`` may be ``-inf`` (a zeroprob).

    >>> sentence_stats([-1.0, ZEROPROB], eos=-1.0)
    PplStats(sentences=1, words=2, oovs=0, zeroprobs=1, logprob=-2.0)
    """
    oovs = zeroprobs = 0
    total = 0.0
    for k, lp in enumerate([*word_logprobs, eos]):
        what = "</s>" if k == len(word_logprobs) else f"word {k}"
        if lp is None:
            if k == len(word_logprobs):
                raise InputError("</s> cannot be OOV", expected="a log10 probability or -inf")
            oovs += 1
            continue
        if isinstance(lp, bool) or not isinstance(lp, int | float) or math.isnan(lp) or lp > 0:
            raise InputError(f"{what} has log10 probability {lp!r}", expected="a number <= 0, -inf or None")
        if lp == -math.inf:
            zeroprobs += 1
        else:
            total += float(lp)
    return PplStats(1, len(word_logprobs), oovs, zeroprobs, total)


def corpus_stats(sentences: Iterable[PplStats]) -> PplStats:
    """Sum of many statistics (streaming).

    >>> corpus_stats(sentence_stats([-1.0], -1.0) for _ in range(3)).logprob
    -6.0
    """
    acc = PplStats()
    for s in sentences:
        acc = acc + s
    return acc


def _g(x: float) -> str:
    if math.isnan(x):
        return "undefined"
    return format(x, "g")


def format_ppl(stats: PplStats, filename: str = "-") -> str:
    """SRILM's two-line summary (numbers with 6 significant digits, like C++ streams).

    >>> print(format_ppl(PplStats(2, 8, 0, 0, -10.0), "dev.txt"))
    file dev.txt: 2 sentences, 8 words, 0 OOVs
    0 zeroprobs, logprob= -10 ppl= 10 ppl1= 17.7828
    """
    return (f"file {filename}: {stats.sentences} sentences, {stats.words} words, {stats.oovs} OOVs\n"
            f"{stats.zeroprobs} zeroprobs, logprob= {_g(stats.logprob)} ppl= {_g(stats.ppl)} "
            f"ppl1= {_g(stats.ppl1)}")
