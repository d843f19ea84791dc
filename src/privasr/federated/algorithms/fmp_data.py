"""What federated marginal personalisation (:mod:`privasr.federated.algorithms.fmp`) needs from the data: a word
-> id map, the background unigram ``u(w)``, the clients built from N-best lists, and the DP settings of a run.

* :class:`WordIds` -- a plain word -> id map with the neural vocabulary's conventions (FMP over an n-gram LM
  without torch); a :class:`~privasr.lm.neural.vocab.Vocabulary` serves as well wherever a ``vocab`` is taken.
* :func:`background_unigram` -- ``u(w)``, the add-one unigram of the background text over the vocabulary.
* :func:`build_clients` -- :class:`~privasr.federated.algorithms.fmp.FmpClient` objects from N-best lists and
  their baseline total scores: utterances grouped by meeting or speaker, in time order, split into rounds.
* :func:`dp_settings` -- the FMP config keys a differentially private run adds (unit, cap and the threshold
  that drops global counts within the noise: post-processing of the noisy sums).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from privasr.corpus.partition import time_rounds
from privasr.corpus.records import NBest, Population
from privasr.federated.algorithms.fmp import FmpClient, FmpUtterance

__all__ = ["WordIds", "background_unigram", "build_clients", "dp_settings", "nnlm_normalizer"]


class WordIds:
    """A plain word -> id map with the neural vocabulary's conventions (``<unk>``, ``<s>``, ``</s>`` = 0, 1, 2),
    for FMP over an n-gram LM without importing torch.

    >>> v = WordIds.build([["b", "a", "b"]])
    >>> v.words, v.encode(["a", "zz"]), v.unk_id, v.eos_id, len(v)
    (('<unk>', '<s>', '</s>', 'b', 'a'), [4, 0], 0, 2, 5)
    """

    unk_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, words: Sequence[str]) -> None:
        self.words = tuple(words)
        self._ids = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, sentences: Sequence[Sequence[str]]) -> WordIds:
        """Specials, then the words of ``sentences`` by count (ties alphabetical)."""
        c: Counter[str] = Counter(w for s in sentences for w in s)
        for sp in ("<unk>", "<s>", "</s>"):
            c.pop(sp, None)
        return cls(("<unk>", "<s>", "</s>", *sorted(c, key=lambda w: (-c[w], w))))

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, words: Sequence[str]) -> list[int]:
        """Ids of ``words`` (unknown: 0)."""
        get = self._ids.get
        return [get(w, 0) for w in words]


def background_unigram(sentences: Sequence[Sequence[str]], vocab: Any) -> np.ndarray:
    """``u(w)``: add-one unigram estimate over ``vocab`` from ``sentences`` (OOV tokens count as ``<unk>``;
    ``<s>`` gets no mass beyond its add-one count; ``</s>`` is counted once per sentence).

    >>> from privasr.lm.neural.vocab import Vocabulary
    >>> v = Vocabulary.build([["a", "b", "a"]])
    >>> background_unigram([["a", "b", "a"], ["a", "zz"]], v).round(3).tolist()
    [0.167, 0.083, 0.25, 0.333, 0.167]
    """
    counts = np.ones(len(vocab), dtype=np.float64)
    c: Counter[int] = Counter()
    for s in sentences:
        c.update(vocab.encode(s))
    for i, n in c.items():
        counts[i] += n
    counts[vocab.eos_id] += len(sentences)
    return counts / counts.sum()


def build_clients(nbests: Sequence[NBest], totals: np.ndarray, offsets: np.ndarray, vocab: Any, key: str,
                  rounds: int, bias_weight: float = 1.0, oracle: bool = False) -> list[Any]:
    """FMP clients from N-best lists: grouped by ``key`` (``client`` = meeting, ``speaker``), utterances in time
    order split into ``rounds + 1`` groups; each hypothesis as vocabulary ids and its baseline total score.

    Words outside the NNLM's vocabulary are left out of the ids: FMP neither counts nor rescales ``<unk>``
    (boosting a class of unknown words would reward hypotheses full of rare words).

    ``oracle=True`` is a diagnostic, not a system: each list gets the reference as an extra first entry that can
    never be chosen (score ``-1e300``), so that with a small kernel bandwidth the caches hold the reference text
    (the ceiling of unigram marginals); a chosen index is then one more than the index in the original
    list (the caller subtracts that shift)."""
    index = {nb.utt_id: k for k, nb in enumerate(nbests)}
    pop = Population.group(nbests, key=key)
    out = []
    for c in pop:
        groups = []
        for g in time_rounds(c.utterances, rounds):
            utts = []
            for nb in g:
                k = index[nb.utt_id]
                words = ([nb.ref or ()] if oracle else []) + [h.words for h in nb.hyps]
                enc = (np.asarray(vocab.encode(w), dtype=np.int64) for w in words)
                ids = tuple(e[e != vocab.unk_id] for e in enc)
                base = np.asarray(totals[offsets[k]:offsets[k + 1]], dtype=np.float64)
                if oracle:
                    base = np.concatenate([[-1e300], base])
                utts.append(FmpUtterance(nb.utt_id, ids, base, bias_weight))
            groups.append(tuple(utts))
        out.append(FmpClient(c.id, tuple(groups)))
    return out


def dp_settings(fmp: Mapping[str, Any], dp: Mapping[str, Any], rounds: int) -> dict[str, Any]:
    """The FMP config ``fmp`` of a run with ``dp`` (``epsilon``, ``unit``, ``cap``, optional ``threshold_sd``) over
    ``rounds + 1`` rounds: ``dp_unit`` and ``dp_cap`` set, and unless ``fmp`` sets ``qbar_threshold`` itself, the
    post-processing threshold that drops global counts below ``threshold_sd`` (default 3) standard deviations of
    the noise summed over all rounds (Laplace(b), ``b = cap / epsilon``, has variance ``2 b^2``; the running sum
    holds ``rounds + 1`` draws).

    >>> s = dp_settings({"alpha": 0.5}, {"epsilon": 2.0, "unit": "utterance", "cap": 1.0}, rounds=1)
    >>> s["alpha"], s["dp_unit"], s["dp_cap"], round(s["qbar_threshold"], 6)
    (0.5, 'utterance', 1.0, 3.0)
    >>> dp_settings({"qbar_threshold": 0.5}, {"epsilon": 2.0, "unit": "user", "cap": 1.0}, 1)["qbar_threshold"]
    0.5
    """
    cfg = dict(fmp)
    cfg.update(dp_unit=dp["unit"], dp_cap=dp["cap"])
    if "qbar_threshold" not in fmp:
        # post-processing: drop global counts below threshold_sd standard deviations of the noise summed
        # over all rounds (Laplace(b) has variance 2 b^2; the running sum holds rounds + 1 draws)
        b = dp["cap"] / dp["epsilon"]
        cfg["qbar_threshold"] = dp.get("threshold_sd", 3.0) * b * math.sqrt(2.0 * (rounds + 1))
    return cfg


def nnlm_normalizer(lm: Any, nbests: Sequence[NBest]) -> Any:
    """The ``normalizer`` of :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm` for a
    :class:`~privasr.lm.neural.scorer.NeuralLM`: per hypothesis ``sum_k ln Z(h_k)`` computed as
    ``ln P(s) + sum_k f(w_k) - ln P'(s)``, with ``P'`` the NNLM with the log-bias ``f`` renormalised exactly at
    every history (``NeuralLM.with_bias(f, renormalize=True)``). The special words (``<unk>``, ``<s>``, ``</s>``)
    keep factor 0, as in the unnormalised rescaling."""
    words = {nb.utt_id: [h.words for h in nb.hyps] for nb in nbests}
    specials = np.array([lm.vocab.unk_id, lm.vocab.bos_id, lm.vocab.eos_id])
    # the unbiased scores and the word ids of an utterance do not change between calls (rounds, lam values)
    fixed: dict[str, tuple[np.ndarray, list[np.ndarray]]] = {}

    def normalizer(utt: Any, f: np.ndarray) -> np.ndarray:
        g = np.array(f, dtype=np.float64)
        g[specials] = 0.0
        hyps = words[utt.utt_id]
        if utt.utt_id not in fixed:
            fixed[utt.utt_id] = (np.array([s.ln_total for s in lm.score_batch(hyps)]),
                                 [np.asarray(lm.vocab.encode(h), dtype=np.int64) for h in hyps])
        plain, ids = fixed[utt.utt_id]
        ren = np.array([s.ln_total for s in lm.with_bias(g, renormalize=True).score_batch(hyps)])
        bias = np.array([g[i].sum() for i in ids])
        return plain + bias - ren

    return normalizer
