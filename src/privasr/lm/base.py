"""The protocol every language model implements, and the per-sentence score it returns.

Probabilities are **log10**, as in ARPA files, SRILM and KenLM; rescoring converts to natural log
(:attr:`SentenceScore.ln_total`). A sentence is scored token by token after an implicit ``<s>``
(``bos``), with ``</s>`` as the last predicted token (``eos``). Words outside the model's vocabulary are
flagged in :attr:`SentenceScore.oov`; their log-probability is the model's ``<unk>`` probability when it
has one (KenLM's convention, what rescoring uses) and ``-inf`` otherwise. Perplexity follows SRILM and
leaves OOVs out (:func:`perplexity_stats`).

>>> s = SentenceScore(("a", "zz", "</s>"), np.array([-1.0, -3.0, -0.5]), np.array([False, True, False]))
>>> s.total(), s.total(include_oov=False), round(s.ln_total, 4)
(-4.5, -1.5, -10.3616)
>>> perplexity_stats([s]).oovs
1
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from privasr.errors import InputError
from privasr.metrics.perplexity import PplStats, sentence_stats

__all__ = ["LanguageModel", "SentenceScore", "perplexity_stats", "closed_vocab_perplexity", "LN10", "BOS", "EOS",
           "UNK"]

LN10 = math.log(10.0)
BOS, EOS, UNK = "<s>", "</s>", "<unk>"


@dataclass(frozen=True)
class SentenceScore:
    """Per-token scores of one sentence.

    Attributes:
        tokens: the predicted tokens (the words, then ``</s>`` when scored with ``eos``).
        logprobs: log10 probability of each token given its history (float64).
        oov: whether each token is outside the model's vocabulary.
    """

    tokens: tuple[str, ...]
    logprobs: np.ndarray = field(repr=False)
    oov: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        lp = np.asarray(self.logprobs, dtype=np.float64)
        oov = np.asarray(self.oov, dtype=bool)
        if lp.shape != (len(self.tokens),) or oov.shape != lp.shape:
            raise ValueError("logprobs and oov need one entry per token")
        lp.setflags(write=False)
        oov.setflags(write=False)
        object.__setattr__(self, "logprobs", lp)
        object.__setattr__(self, "oov", oov)

    @classmethod
    def _trusted(cls, tokens: tuple[str, ...], logprobs: np.ndarray, oov: np.ndarray) -> SentenceScore:
        """A score from arrays a model built itself: ``float64`` and ``bool``, one entry per token and read-only
        (slices of read-only arrays are); skips the checks and copies of the constructor (models build
        thousands of these per batch)."""
        out = object.__new__(cls)
        object.__setattr__(out, "tokens", tokens)
        object.__setattr__(out, "logprobs", logprobs)
        object.__setattr__(out, "oov", oov)
        return out

    def total(self, include_oov: bool = True) -> float:
        """Sum of log10 probabilities (OOV tokens included, as ``<unk>``, unless ``include_oov`` is false)."""
        lp = self.logprobs if include_oov else self.logprobs[~self.oov]
        return float(lp.sum())

    @property
    def ln_total(self) -> float:
        """Natural-log sentence probability, OOVs included (what N-best rescoring adds to the scores)."""
        return self.total() * LN10


@runtime_checkable
class LanguageModel(Protocol):
    """What rescoring, perplexity, interpolation and adaptation need from a language model."""

    @property
    def order(self) -> int:
        """The n-gram order (history length + 1); neural models report their context limit."""
        ...

    def __contains__(self, word: object) -> bool:
        """Whether ``word`` is in the vocabulary."""
        ...

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence (see the module docstring for the conventions)."""
        ...

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences (implementations batch or share prefixes; results equal :meth:`score`)."""
        ...


def perplexity_stats(scores: Iterable[SentenceScore]) -> PplStats:
    """SRILM-style perplexity accounting over sentence scores: OOVs excluded, ``-inf`` tokens as zeroprobs.

    ``</s>`` is counted as SRILM does (``words`` excludes it, ``ppl`` includes it, ``ppl1`` does not).
    """
    total = PplStats()
    for s in scores:
        if not s.tokens or s.tokens[-1] != EOS:
            raise InputError("perplexity needs sentences scored with </s>", expected="score(..., eos=True)")
        lps = [None if o else float(lp) for lp, o in zip(s.logprobs, s.oov, strict=True)]
        total = total + sentence_stats(lps[:-1], lps[-1])
    return total


def closed_vocab_perplexity(lm: LanguageModel, sentences: Sequence[Sequence[str]]) -> float:
    """Perplexity with every token counted: OOVs scored as ``<unk>`` and one ``</s>`` per sentence (what N-best
    rescoring sees, so models with different vocabularies compare fairly); NaN for no sentences.

    Unlike :func:`perplexity_stats` (SRILM's accounting), OOV tokens are not left out.

    >>> from privasr.lm.ngram.mkn import train_mkn
    >>> m = train_mkn([["a", "b"], ["b", "a"], ["a"]], 2, discounts=[(0.5, 1.0, 1.5)] * 2)
    >>> round(closed_vocab_perplexity(m, [["a", "b"], ["zzz"]]), 4), closed_vocab_perplexity(m, [])
    (3.9199, nan)
    """
    tokens = sum(len(s) + 1 for s in sentences)
    if not tokens:
        return math.nan
    return float(math.exp(-sum(s.ln_total for s in lm.score_batch(sentences, bos=True, eos=True)) / tokens))
