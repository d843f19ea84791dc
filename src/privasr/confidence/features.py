"""Decoding features of each word of an N-best list's 1-best, and whether the word is correct.

A confidence classifier (:mod:`privasr.confidence.model`) predicts from these features whether a 1-best
word is correct. For the 1-best ``h_0 = (w_1 .. w_n)`` of an N-best list ``h_0 .. h_{K-1}``, every other
hypothesis ``h_k`` is aligned to ``h_0`` with sclite's alignment (:func:`privasr.metrics.align.align`,
``h_0`` in the reference role); ``h_k`` *contains* ``w_i`` when the alignment marks position ``i`` correct
(same word, aligned). The columns (:data:`FEATURE_NAMES`) are, for word ``w_i``:

* ``posterior`` -- the N-best word posterior ``sum_k p_k [h_k contains w_i]`` with hypothesis weights
  ``p_k = softmax_k(scale * total_k)`` when every hypothesis has a decoder total (``-inf`` totals weigh 0),
  else the rank prior ``p_k`` proportional to ``1 / (k + 1)``. The decoder total is the ``total`` score, or
  on lists without a first-pass LM score (``lm``) the ``am`` score: an end-to-end recogniser's own total
  log-probability (Whisper's, :mod:`privasr.asr.whisper`);
* ``agreement`` -- the fraction of hypotheses that contain ``w_i`` (uniform weights);
* ``am_per_word``, ``lm_per_word``, ``total_per_word`` -- the 1-best's first-pass scores (natural log)
  divided by its length ``n`` (the same for every word of the utterance);
* ``word_length`` -- characters in ``w_i``;
* ``lm_logprob`` -- ``log10 P(w_i | <s> w_1 .. w_{i-1})`` from a language model's ``score_batch``, when one
  is given;
* ``position`` -- ``(i - 1) / (n - 1)``: 0 for the first word, 1 for the last (0 when ``n = 1``);
* ``utt_length`` -- ``n``;  ``nbest_size`` -- ``K``;
* ``score_gap`` -- ``total_0 - total_1`` (decoder totals), the first-pass margin of the 1-best over the
  runner-up;
* ``decoder_confidence`` -- the 1-best's own per-word confidence in the data (``Hypothesis.confidences``):
  for lists from :class:`privasr.asr.decode.Decoder`, the decoder's lattice word posterior ``C_max``.

A feature that cannot be computed (no such score, no LM, a single hypothesis, a non-finite value) is NaN;
the classifiers handle NaN (gradient boosting natively, the MLP by mean imputation).

>>> from privasr.corpus.records import Hypothesis, NBest
>>> nb = NBest("u1", (Hypothesis.from_text("the cat sat"), Hypothesis.from_text("the bat sat")),
...            ref=("the", "cat", "sat"))
>>> f = word_features(nb)
>>> f.column("agreement").tolist(), f.column("posterior").round(4).tolist()
([1.0, 0.5, 1.0], [1.0, 0.6667, 1.0])
>>> labels(nb).tolist()
[True, True, True]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel
from privasr.metrics.align import align_many

__all__ = [
    "FEATURE_NAMES",
    "features_without",
    "WordFeatures",
    "word_features",
    "word_features_many",
    "labels",
    "labels_many",
    "hypothesis_weights",
    "decoder_total",
    "stack",
]

FEATURE_NAMES: tuple[str, ...] = (
    "posterior",
    "agreement",
    "am_per_word",
    "lm_per_word",
    "total_per_word",
    "word_length",
    "lm_logprob",
    "position",
    "utt_length",
    "nbest_size",
    "score_gap",
    "decoder_confidence",
)
"""The feature columns, in order (see the module docstring)."""

_COL = {name: j for j, name in enumerate(FEATURE_NAMES)}


def features_without(excluded: Sequence[str], what: str = "excluded features") -> tuple[str, ...]:
    """:data:`FEATURE_NAMES` without ``excluded``, in order; ``what`` names the setting in the error.

    >>> features_without(["decoder_confidence"])[-1]
    'score_gap'
    >>> features_without(["pitch"], "--exclude")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: --exclude pitch (expected some (not all) of posterior, agreement, am_per_word, lm_per_word, total_per_word, word_length, lm_logprob, position, utt_length, nbest_size, score_gap, decoder_confidence)
    """
    unknown = sorted(set(excluded) - set(FEATURE_NAMES))
    keep = tuple(n for n in FEATURE_NAMES if n not in excluded)
    if unknown or not keep:
        raise ConfigError(f"{what} {', '.join(unknown or sorted(set(excluded)))}",
                          expected=f"some (not all) of {', '.join(FEATURE_NAMES)}")
    return keep


@dataclass(frozen=True)
class WordFeatures:
    """The features of one utterance's 1-best words.

    Attributes:
        utt_id: the utterance.
        words: the 1-best words (one row each).
        values: float64 matrix ``[len(words), len(FEATURE_NAMES)]`` (read-only); NaN where unavailable.
    """

    utt_id: str
    words: tuple[str, ...]
    values: np.ndarray

    def __post_init__(self) -> None:
        v = np.array(self.values, dtype=np.float64)
        if v.shape != (len(self.words), len(FEATURE_NAMES)):
            raise ValueError(f"features of shape {v.shape} for {len(self.words)} words")
        v.setflags(write=False)
        object.__setattr__(self, "values", v)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names (:data:`FEATURE_NAMES`)."""
        return FEATURE_NAMES

    def column(self, name: str) -> np.ndarray:
        """One feature for every word.

        >>> from privasr.corpus.records import Hypothesis, NBest
        >>> word_features(NBest("u", (Hypothesis.from_text("a bb ccc"),))).column("word_length").tolist()
        [1.0, 2.0, 3.0]
        """
        if name not in _COL:
            raise InputError(f"unknown confidence feature {name!r}", expected=f"one of {', '.join(FEATURE_NAMES)}")
        return self.values[:, _COL[name]]

    def __len__(self) -> int:
        return len(self.words)


def decoder_total(scores: Mapping[str, float]) -> float | None:
    """A hypothesis's decoder total: its ``total`` score, else its ``am`` score when it has no first-pass LM
    score (an end-to-end recogniser's total log-probability), else ``None``.

    >>> decoder_total({"am": -3.0, "lm": -1.0, "total": -4.0}), decoder_total({"am": -3.0})
    (-4.0, -3.0)
    >>> decoder_total({"am": -3.0, "lm": -1.0}) is None
    True
    """
    total = scores.get("total")
    if total is not None:
        return total
    return scores.get("am") if "lm" not in scores else None


def hypothesis_weights(nb: NBest, scale: float = 1.0) -> np.ndarray:
    """The weight of each hypothesis in the word posterior: ``softmax(scale * total)`` or the rank prior.

    The rank prior ``p_k`` proportional to ``1 / (k + 1)`` is used unless every hypothesis has a decoder total
    (:func:`decoder_total`) and at least one is finite.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> h = lambda t, s=None: Hypothesis.from_text(t, scores={} if s is None else {"total": s})
    >>> hypothesis_weights(NBest("u", (h("a", 0.0), h("b", -math.log(3))))).tolist()
    [0.75, 0.25]
    >>> hypothesis_weights(NBest("u", (h("a"), h("b"), h("c")))).round(4).tolist()
    [0.5455, 0.2727, 0.1818]
    """
    k = len(nb.hyps)
    if k == 0:
        return np.zeros(0)
    totals = [decoder_total(h.scores) for h in nb.hyps]
    if all(t is not None for t in totals):
        t = np.asarray(totals, dtype=np.float64) * float(scale)
        if np.isfinite(t).any():
            t = np.where(np.isfinite(t), t, -np.inf)
            e = np.exp(t - t.max())
            return e / e.sum()
    w = 1.0 / np.arange(1, k + 1, dtype=np.float64)
    return w / w.sum()


def _score(nb: NBest, name: str) -> float:
    h = nb.hyps[0]
    v = h.scores.get(name)
    if v is None or not math.isfinite(v) or not h.words:
        return math.nan
    return v / len(h.words)


def _gap(nb: NBest) -> float:
    if len(nb.hyps) < 2:
        return math.nan
    a, b = decoder_total(nb.hyps[0].scores), decoder_total(nb.hyps[1].scores)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    return a - b


def word_features_many(nbests: Sequence[NBest], lm: LanguageModel | None = None, *,
                       posterior_scale: float = 1.0) -> list[WordFeatures]:
    """:func:`word_features` of many N-best lists (the alignments and LM scores batched).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> fs = word_features_many([NBest("a", (Hypothesis.from_text("x y"),)), NBest("b", ())])
    >>> [f.values.shape for f in fs]
    [(2, 12), (0, 12)]
    """
    if not math.isfinite(posterior_scale) or posterior_scale < 0:
        raise InputError(f"posterior scale {posterior_scale!r}", expected="a finite number >= 0")
    # align every other hypothesis to its 1-best, all utterances at once
    pair_ref: list[tuple[str, ...]] = []
    pair_hyp: list[tuple[str, ...]] = []
    for nb in nbests:
        if nb.hyps and nb.hyps[0].words:
            for h in nb.hyps[1:]:
                pair_ref.append(nb.hyps[0].words)
                pair_hyp.append(h.words)
    alignments = align_many(pair_ref, pair_hyp) if pair_ref else ()
    lm_lp: list[np.ndarray | None] = [None] * len(nbests)
    if lm is not None:
        todo = [i for i, nb in enumerate(nbests) if nb.hyps and nb.hyps[0].words]
        scores = lm.score_batch([nbests[i].hyps[0].words for i in todo], bos=True, eos=False) if todo else []
        for i, s in zip(todo, scores, strict=True):
            lp = np.asarray(s.logprobs, dtype=np.float64)[: len(nbests[i].hyps[0].words)]
            lm_lp[i] = np.where(np.isfinite(lp), lp, np.nan)
    out: list[WordFeatures] = []
    a = 0
    for u, nb in enumerate(nbests):
        words = nb.hyps[0].words if nb.hyps else ()
        n = len(words)
        x = np.full((n, len(FEATURE_NAMES)), np.nan)
        if n:
            k = len(nb.hyps)
            contains = np.zeros((k, n), dtype=bool)
            contains[0] = True
            for j in range(1, k):
                ops = np.frombuffer(alignments[a].ops.encode("ascii"), dtype="S1")
                a += 1
                contains[j] = (ops == b"C")[ops != b"I"]
            w = hypothesis_weights(nb, posterior_scale)
            x[:, _COL["posterior"]] = np.clip(w @ contains, 0.0, 1.0)
            x[:, _COL["agreement"]] = contains.mean(axis=0)
            for name in ("am", "lm", "total"):
                x[:, _COL[f"{name}_per_word"]] = _score(nb, name)
            x[:, _COL["word_length"]] = [len(t) for t in words]
            if lm_lp[u] is not None:
                x[:, _COL["lm_logprob"]] = lm_lp[u]
            x[:, _COL["position"]] = np.arange(n) / (n - 1) if n > 1 else 0.0
            x[:, _COL["utt_length"]] = n
            x[:, _COL["nbest_size"]] = k
            x[:, _COL["score_gap"]] = _gap(nb)
            if nb.hyps[0].confidences is not None:
                x[:, _COL["decoder_confidence"]] = nb.hyps[0].confidences
        out.append(WordFeatures(nb.utt_id, tuple(words), x))
    return out


def word_features(nb: NBest, lm: LanguageModel | None = None, *, posterior_scale: float = 1.0) -> WordFeatures:
    """The decoding features of the words of ``nb``'s 1-best (zero rows when it is empty or there is none).

    Args:
        nb: the N-best list, best first.
        lm: a language model for the ``lm_logprob`` column (NaN without one).
        posterior_scale: the scale of the ``total`` scores in the hypothesis softmax.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> nb = NBest("u", (Hypothesis.from_text("a b", scores={"am": -4.0, "lm": -2.0, "total": -6.0}),))
    >>> f = word_features(nb)
    >>> f.column("total_per_word").tolist(), f.column("position").tolist(), math.isnan(f.column("score_gap")[0])
    ([-3.0, -3.0], [0.0, 1.0], True)
    """
    return word_features_many([nb], lm, posterior_scale=posterior_scale)[0]


def labels_many(nbests: Sequence[NBest]) -> list[np.ndarray]:
    """:func:`labels` of many N-best lists (aligned in one batch)."""
    for nb in nbests:
        if nb.ref is None:
            raise InputError(f"utterance {nb.utt_id} has no reference",
                             expected="references to label 1-best words correct or incorrect")
    alignments = align_many([nb.ref for nb in nbests], [nb.best.words for nb in nbests])  # type: ignore[misc]
    out = []
    for al in alignments:
        ops = np.frombuffer(al.ops.encode("ascii"), dtype="S1")
        out.append((ops == b"C")[ops != b"D"])
    return out


def labels(nb: NBest) -> np.ndarray:
    """Whether each 1-best word is correct: a hit in sclite's alignment of the 1-best against ``nb.ref``.

    Substituted and inserted words are incorrect. :class:`InputError` names the utterance if it has no
    reference.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> labels(NBest("u", (Hypothesis.from_text("the bat sat down"),), ref=("the", "cat", "sat"))).tolist()
    [True, False, True, False]
    """
    return labels_many([nb])[0]


def stack(features: Sequence[WordFeatures]) -> np.ndarray:
    """All words' features as one matrix ``[sum of words, len(FEATURE_NAMES)]``.

    >>> stack([]).shape
    (0, 12)
    """
    if not features:
        return np.zeros((0, len(FEATURE_NAMES)))
    return np.concatenate([f.values for f in features], axis=0)
