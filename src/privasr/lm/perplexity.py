"""Perplexity as SRILM ``ngram -ppl`` and KenLM ``query`` compute it, each on its own conventions.

The two tools disagree on the same text, so every figure privasr prints says whose it is.

**SRILM** (``ngram -ppl``, without ``-unk``; ``LM::sentenceProb``/``prepareSentence`` in ``lm/src/LM.cc``):

* ``<s>`` and ``</s>`` are added around each line *unless the line already starts with <s> / ends with </s>*;
  either way they are not counted as words.
* Out-of-vocabulary words (and the token ``<unk>``) are **OOVs**: not scored, not in the denominators, and the
  next word is scored without context (the context restarts after an OOV).
* In-vocabulary words with probability 0 are **zeroprobs**, left out the same way.
* ``ppl = 10^(-logprob / (words - OOVs - zeroprobs + sentences))``, ``ppl1`` without the ``</s>`` tokens
  (:mod:`privasr.metrics.perplexity`).

**KenLM** (``query``; ``lm/ngram_query.hh``):

* every token of the line is a word, ``<s>`` and ``</s>`` included (a line ``<s> a b </s>`` is scored as four
  words after ``<s>``, then ``</s>``); ``</s>`` is added to every line;
* an OOV is scored as ``<unk>``, whose log10 probability is **-100** when the model has no ``<unk>`` (KenLM
  substitutes it when loading the ARPA file), plus the backoff weights of its context;
* "Perplexity including OOVs" is ``10^(-total / tokens)`` over every token and ``</s>``; "excluding OOVs"
  removes the OOV tokens' log probabilities and counts; "Tokens" counts every token and ``</s>``.

A ``<s>`` or ``</s>`` inside a line (not first / last) is refused with its line: the tools score it
differently and neither as a word of the sentence.

>>> from privasr.lm.ngram.model import NgramModel
>>> m = NgramModel.from_entries(2, {
...     1: {("<s>",): (-99.0, -0.5), ("a",): (-0.6, -0.3), ("b",): (-0.8, -0.2), ("</s>",): (-1.0, 0.0)},
...     2: {("<s>", "a"): (-0.2, 0.0), ("a", "b"): (-0.3, 0.0), ("b", "</s>"): (-0.1, 0.0)}})
>>> s = srilm_perplexity(m, [["<s>", "a", "b", "</s>"]])
>>> s.words, round(s.logprob, 6), round(s.ppl, 5), round(s.ppl1, 5)
(2, -0.6, 1.58489, 1.99526)
>>> k = kenlm_perplexity(m, [["<s>", "a", "b", "</s>"]])
>>> k.tokens, round(k.total, 1)
(5, -101.1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from privasr.errors import InputError
from privasr.lm.base import BOS, EOS, UNK, LanguageModel
from privasr.metrics.perplexity import PplStats, sentence_stats

__all__ = ["srilm_perplexity", "kenlm_perplexity", "KenlmStats", "check_markers", "strip_markers", "KENLM_UNK_LOGPROB"]

KENLM_UNK_LOGPROB = -100.0
"""The log10 probability KenLM gives ``<unk>`` when the ARPA file has none."""


def check_markers(words: Sequence[str]) -> None:
    """Refuse ``<s>``/``</s>`` anywhere but first/last (:class:`InputError`, no location: callers add it).

    >>> check_markers(["<s>", "a", "</s>"])
    >>> check_markers(["a", "<s>", "b"])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: '<s>' inside the sentence (word 2) (expected '<s>' only first and '</s>' only last: SRILM and KenLM score a marker inside a sentence differently)
    """
    for k, w in enumerate(words):
        if (w == BOS and k != 0) or (w == EOS and k != len(words) - 1):
            raise InputError(f"{w!r} inside the sentence (word {k + 1})",
                             expected="'<s>' only first and '</s>' only last: SRILM and KenLM score a marker inside "
                                      "a sentence differently")


def _check_all(sentences: Sequence[Sequence[str]]) -> None:
    """:func:`check_markers` on every sentence; the error's ``line`` is the sentence's 1-based index."""
    for k, s in enumerate(sentences, start=1):
        try:
            check_markers(s)
        except InputError as e:
            raise InputError(e.message, line=k, expected=e.expected) from None


def strip_markers(words: Sequence[str]) -> list[str]:
    """A line's words without its own leading ``<s>`` and trailing ``</s>`` (SRILM's ``prepareSentence``).

    >>> strip_markers(["<s>", "a", "</s>"]), strip_markers(["a", "</s>"]), strip_markers(["</s>"])
    (['a'], ['a'], [])
    """
    lo = 1 if words and words[0] == BOS else 0
    hi = len(words) - 1 if len(words) > lo and words[-1] == EOS else len(words)
    return list(words[lo:hi])


def srilm_perplexity(lm: LanguageModel, sentences: Sequence[Sequence[str]]) -> PplStats:
    """SRILM ``ngram -ppl`` statistics (see the module docstring for its conventions).

    Args:
        lm: any language model (:class:`~privasr.lm.base.LanguageModel`).
        sentences: token lists, one per line of the text, markers included as written.

    Raises:
        InputError: a marker inside a sentence (its ``line`` is the sentence's 1-based index).
    """
    pieces: list[tuple[list[str], bool, bool]] = []   # (words, bos, eos) scored as one run
    owner: list[int] = []
    per: list[tuple[int, int]] = []                    # (words, OOVs) per sentence
    _check_all(sentences)
    for k, s in enumerate(sentences):
        words = strip_markers(s)
        oov = 0
        run: list[str] = []
        bos = True
        for w in words:
            if w == UNK or w not in lm:
                oov += 1
                if run or bos:
                    pieces.append((run, bos, False))
                    owner.append(k)
                run, bos = [], False
            else:
                run.append(w)
        pieces.append((run, bos, True))
        owner.append(k)
        per.append((len(words), oov))
    total = PplStats()
    lps: list[list[float]] = [[] for _ in sentences]
    eos: list[float] = [0.0] * len(sentences)
    for flag in ((True, True), (True, False), (False, True), (False, False)):
        idx = [i for i, (_, b, e) in enumerate(pieces) if (b, e) == flag]
        if not idx:
            continue
        for i, sc in zip(idx, lm.score_batch([pieces[i][0] for i in idx], bos=flag[0], eos=flag[1]), strict=True):
            vals = [float(x) for x in sc.logprobs]
            if flag[1]:
                eos[owner[i]] = vals.pop()
            lps[owner[i]].extend(vals)
    for k, (n, oov) in enumerate(per):
        st = sentence_stats([*lps[k], *([None] * oov)], eos[k])
        total = total + PplStats(1, n, st.oovs, st.zeroprobs, st.logprob)
    return total


@dataclass(frozen=True, slots=True)
class KenlmStats:
    """KenLM ``query``'s summary.

    Attributes:
        tokens: scored tokens, ``</s>`` included ("Tokens").
        oovs: tokens outside the vocabulary ("OOVs").
        total: log10 probability of all tokens (OOVs as ``<unk>``).
        oov_total: the OOV tokens' share of ``total``.
    """

    tokens: int
    oovs: int
    total: float
    oov_total: float

    def __add__(self, other: KenlmStats) -> KenlmStats:
        """The statistics of both texts together."""
        if not isinstance(other, KenlmStats):
            return NotImplemented
        return KenlmStats(self.tokens + other.tokens, self.oovs + other.oovs, self.total + other.total,
                          self.oov_total + other.oov_total)

    @property
    def ppl_including_oovs(self) -> float:
        """"Perplexity including OOVs": ``10^(-total / tokens)`` (``nan`` for no tokens)."""
        return 10.0 ** (-self.total / self.tokens) if self.tokens else math.nan

    @property
    def ppl_excluding_oovs(self) -> float:
        """"Perplexity excluding OOVs": ``10^(-(total - oov_total) / (tokens - oovs))``."""
        d = self.tokens - self.oovs
        return 10.0 ** (-(self.total - self.oov_total) / d) if d else math.nan


def kenlm_perplexity(lm: LanguageModel, sentences: Sequence[Sequence[str]]) -> KenlmStats:
    """KenLM ``query`` statistics (see the module docstring). An n-gram model without ``<unk>`` scores OOVs with
    KenLM's -100 (:func:`privasr.lm.ngram.model.with_unk`); another model must have ``<unk>``.

    Raises:
        InputError: a marker inside a sentence (its ``line`` is the sentence's 1-based index), or a model without
            ``<unk>`` that is not an n-gram model.
    """
    from privasr.lm.ngram.model import NgramModel, with_unk

    _check_all(sentences)
    model: LanguageModel = lm
    if UNK not in lm:
        if not isinstance(lm, NgramModel):
            raise InputError("the model has no <unk>", expected="an n-gram model (KenLM's -100 is substituted) or "
                                                                 "a model with <unk>")
        model = with_unk(lm, KENLM_UNK_LOGPROB)
    tokens = oovs = 0
    total = oov_total = 0.0
    for sc in model.score_batch([list(s) for s in sentences], bos=True, eos=True):
        tokens += len(sc.tokens)
        lp = sc.logprobs
        total += float(lp.sum())
        for t, x in zip(sc.tokens, lp.tolist(), strict=True):
            if t == UNK or t not in lm:  # KenLM's Index("<unk>") is its NotFound too
                oovs += 1
                oov_total += x
    return KenlmStats(tokens, oovs, total, oov_total)
