"""Fast scoring with a neural LM: the :class:`~privasr.lm.base.LanguageModel` protocol for rescoring.

:class:`NeuralLM` wraps a :class:`~privasr.lm.neural.models.TransformerLM` or
:class:`~privasr.lm.neural.models.LstmLM` and its :class:`~privasr.lm.neural.vocab.Vocabulary`. Scores are
log10 (the protocol's convention); words outside the vocabulary are flagged OOV and scored as ``<unk>``,
whose probability is by default spread evenly over the word types it stands for (``spread_unk``):
``ln p(w|h) = ln p(<unk>|h) - ln(K + 1)`` with ``K`` the training word types mapped to ``<unk>``
(:attr:`~privasr.lm.neural.vocab.Vocabulary.unk_types`; the ``+ 1`` is a share for words never seen). Without
it, ``<unk>`` is a frequent class and a rescorer prefers hypotheses full of rare or invented words.

**Prefix sharing.** N-best hypotheses share prefixes, within an utterance and across utterances; the output
after a prefix depends only on that prefix. :meth:`NeuralLM.score_batch` builds one
:class:`~privasr.lm.neural.trie.PrefixTrie` over all sentences of the batch and runs the network once per
distinct prefix:

* Transformer: trie nodes are packed into rows of at most ``row_len`` positions, each node attending to its
  ancestors and itself (a tree attention mask; its position is its depth), and the rows are run in chunks
  of at most ``batch_tokens`` positions;
* LSTM: the trie is walked level by level, all nodes of one depth in one batch (chunks of ``batch_tokens``)
  with their parents' states.

Only what the log-probabilities need is computed from the hidden states: the output projection of each
distinct prefix once (in row blocks, so the logits stay in cache), a log-sum-exp per prefix and the logits of
the words that follow it (:func:`~privasr.lm.neural.trie.target_pairs`: each distinct (prefix, next word) pair
once); no softmax is materialised. All of that stays on the device, down to each target's log-probability, and
comes back in one copy: the host does not wait for the device inside a batch. :meth:`NeuralLM.score_ids` is the
array form (flat word ids and offsets in, one flat array of log10 scores out): without the Python objects of
:meth:`NeuralLM.score_batch`, which on a GPU take longer than the network itself. The trie and the rows are
built by compiled loops where they are built (:func:`~privasr.lm.neural.trie.compiled_trie`).

Everything runs in ``torch.inference_mode`` in fp32 (on CUDA with cuDNN's TF32 switched off, so an LSTM scores
the same on the GPU as on the CPU, to ~1e-6); the final differences are taken in float64. :meth:`NeuralLM.score_naive` is the reference: each sentence on
its own, a full forward pass and a float64 log-softmax over every position.

**Class-factored softmax** (``softmax="class"``, :class:`~privasr.lm.neural.models.ClassSoftmax`). Scoring
without a bias or with the unnormalised one computes, for each (prefix, next word) pair, only the class
softmax and the logits of the word's class (:meth:`~privasr.lm.neural.models.ClassSoftmax.target_logprob`).
A renormalised bias needs the sum over the whole vocabulary and :meth:`NeuralLM.distributions` whole rows:
there the full log-probability vector of each prefix is computed (the class softmax's ``forward``) and used
as the logits of the full-softmax path, so both give exactly what the full vector gives.

**Per-word bias** (paper 000, eq. 1). ``log_bias`` is a natural-log vector over the vocabulary added at
scoring time. By default (FMP's rescaling for rescoring) it is *unnormalised*:
``ln p'(w|h) = ln p(w|h) + bias[w]``; with ``renormalize=True`` it is renormalised exactly:
``ln p'(w|h) = ln p(w|h) + bias[w] - logsumexp_v(ln p(v|h) + bias[v])``. :meth:`NeuralLM.with_bias` gives a
scorer with another bias that shares the model (cheap: one vector per client).

>>> import torch
>>> from privasr.lm.neural.models import NeuralLMConfig, build_model
>>> from privasr.lm.neural.vocab import Vocabulary
>>> v = Vocabulary.build([["a", "b", "c"]])
>>> _ = torch.manual_seed(0)
>>> lm = NeuralLM(build_model(NeuralLMConfig.preset("tiny-transformer"), v), v)
>>> fast = lm.score_batch([["a", "b"], ["a", "c"], ["a", "zz"]])
>>> slow = lm.score_naive([["a", "b"], ["a", "c"], ["a", "zz"]])
>>> fast[2].tokens, fast[2].oov.tolist()
(('a', 'zz', '</s>'), [False, True, False])
>>> max(abs(f.total() - s.total()) for f, s in zip(fast, slow)) < 1e-5
True
>>> import numpy as np
>>> d = lm.distributions([["a"], []])
>>> d.shape, np.allclose((10.0 ** d).sum(axis=1), 1.0)
((2, 6), True)
>>> boosted = lm.with_bias(np.log(np.array([1, 1, 1, 1, 1, 4.0])))  # x4 for "c", unnormalised
>>> diff = boosted.score(["c"]).logprobs[0] - lm.score(["c"]).logprobs[0]
>>> bool(abs(diff - np.log10(4.0)) < 1e-6)
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from privasr.errors import ConfigError, InputError
from privasr.lm.base import EOS, LN10, UNK, SentenceScore
from privasr.lm.neural.models import ClassSoftmax
from privasr.lm.neural.scoring_base import NeuralScorerBase, checked_log_bias, checked_sentences
from privasr.lm.neural.trie import (
    PrefixTrie,
    checked_offsets,
    lex_order,
    offsets_of,
    pack_segments,
    target_pairs,
)
from privasr.lm.neural.vocab import Vocabulary

__all__ = ["NeuralLM", "UNBOUNDED_ORDER", "exact_inference"]

UNBOUNDED_ORDER = 2**31 - 1
""":attr:`NeuralLM.order` of a recurrent model (its history is not truncated)."""



def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r}", expected="a positive integer")
    return value


class NeuralLM(NeuralScorerBase):
    """A neural LM as a :class:`~privasr.lm.base.LanguageModel` (see the module docstring).

    Args:
        model: a :class:`~privasr.lm.neural.models.TransformerLM` or :class:`~privasr.lm.neural.models.LstmLM`
            (any module with that forward contract, a ``hidden`` method and an ``output`` linear layer or
            :class:`~privasr.lm.neural.models.ClassSoftmax`). It is put in eval mode,
            in fp32, on ``device``.
        vocab: its vocabulary.
        device: torch device to score on.
        batch_tokens: most positions (Transformer) or nodes (LSTM) per forward call.
        log_bias: natural-log bias per word id (length ``len(vocab)``), or ``None``.
        renormalize: renormalise the biased distribution exactly instead of the unnormalised rescaling.
        row_len: Transformer rows hold at most this many trie nodes (raised to the longest path when needed;
            lowered to ``batch_tokens`` when that is smaller). The attention cost per node grows with it.
        out_rows: hidden states per output-projection block (bounds the logits held at once).
        group_tokens: sentences are scored in groups of about this many tokens (sorted, so that shared
            prefixes stay together), which bounds memory for huge batches.
        spread_unk: score an OOV word as ``p(<unk>|h) / (K + 1)`` (``K = vocab.unk_types``) rather than
            ``p(<unk>|h)``; no effect when the vocabulary records no ``<unk>`` types.
    """

    def __init__(self, model: nn.Module, vocab: Vocabulary, *, device: str | torch.device = "cpu",
                 batch_tokens: int = 4096, log_bias: Any = None, renormalize: bool = False,
                 row_len: int = 128, out_rows: int = 128, group_tokens: int = 1 << 16,
                 spread_unk: bool = True) -> None:
        self.batch_tokens = _check_positive("batch_tokens", batch_tokens)
        self.row_len = _check_positive("row_len", row_len)
        self.out_rows = _check_positive("out_rows", out_rows)
        self.group_tokens = _check_positive("group_tokens", group_tokens)
        if not isinstance(renormalize, bool):
            raise ConfigError(f"renormalize={renormalize!r}", expected="true or false")
        if not isinstance(spread_unk, bool):
            raise ConfigError(f"spread_unk={spread_unk!r}", expected="true or false")
        self.spread_unk = spread_unk
        self._unk_log10 = float(np.log10(vocab.unk_types + 1)) if spread_unk else 0.0
        out = getattr(model, "output", None)
        if not isinstance(out, nn.Linear | ClassSoftmax):
            raise ConfigError(f"{type(model).__name__} has no `output` linear layer or class softmax",
                              expected="a privasr neural LM")
        if out.out_features != len(vocab):
            raise ConfigError(f"the model predicts {out.out_features} words but the vocabulary has {len(vocab)}")
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=torch.float32).eval()
        self.vocab = vocab
        cfg = getattr(model, "config", None)
        arch = getattr(cfg, "arch", None) or ("lstm" if hasattr(model, "lstm") else "transformer")
        self.arch: str = arch
        self._max_pos: int | None = None
        if arch == "transformer" and getattr(cfg, "positions", "sinusoidal") == "learned":
            self._max_pos = int(cfg.max_len)
        self._order = int(getattr(cfg, "max_len", UNBOUNDED_ORDER)) if arch == "transformer" else UNBOUNDED_ORDER
        self.renormalize = renormalize
        self._set_bias(log_bias)

    # -- construction ----------------------------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, path: str | os.PathLike[str], **kwargs: Any) -> NeuralLM:
        """Load a checkpoint (:func:`~privasr.lm.neural.checkpoint.load_checkpoint`) as a scorer.

        ``kwargs`` are :class:`NeuralLM`'s keyword arguments (``device`` also picks where it is loaded).
        """
        from privasr.lm.neural.checkpoint import load_checkpoint

        ck = load_checkpoint(path, map_location=kwargs.get("device", "cpu"))
        return cls(ck.model, ck.vocab, **kwargs)

    def _set_bias(self, log_bias: Any) -> None:
        if log_bias is None:
            self.log_bias: np.ndarray | None = None
            self._bias_t: torch.Tensor | None = None
            self._bias_t64: torch.Tensor | None = None
            return
        self.log_bias = checked_log_bias(log_bias, len(self.vocab))
        self._bias_t = torch.tensor(self.log_bias, dtype=torch.float32, device=self.device)
        self._bias_t64 = torch.tensor(self.log_bias, dtype=torch.float64, device=self.device)

    # -- protocol (order, in, len, score and with_bias: NeuralScorerBase) --------------------------------------
    def __repr__(self) -> str:
        bias = "none" if self.log_bias is None else ("renormalised" if self.renormalize else "unnormalised")
        return (f"NeuralLM(arch={self.arch}, vocab={len(self.vocab)}, unk_types={self.vocab.unk_types}, "
                f"bias={bias}, device={self.device})")

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences, each distinct prefix computed once (see the module docstring).

        ``bos`` must be true: a neural LM's history always starts at ``<s>``. The same scores as
        :meth:`score_ids` on the encoded sentences, as one :class:`~privasr.lm.base.SentenceScore` per sentence;
        a word is OOV when it is not in the vocabulary (the word ``<unk>`` itself is not).
        """
        sents = checked_sentences(sentences, bos)
        ids, off = self.vocab.encode_flat(sents)
        flat = self._score_flat(ids, off, eos)
        oov = np.zeros(len(flat), dtype=bool)
        unk = np.flatnonzero(ids == self.vocab.unk_id)
        if unk.size:  # a word mapped to <unk> is OOV unless it is the word <unk>
            sent = np.searchsorted(off, unk, "right") - 1
            word = (sents[i][k - off[i]] for i, k in zip(sent.tolist(), unk.tolist(), strict=True))
            is_oov = np.fromiter((w != UNK for w in word), dtype=bool, count=len(unk))
            oov[(unk + sent if eos else unk)[is_oov]] = True
            if self._unk_log10:
                flat[oov] -= self._unk_log10
        flat.setflags(write=False)
        oov.setflags(write=False)
        eos_t = (EOS,) if eos else ()
        bounds = offsets_of(np.diff(off) + (1 if eos else 0)).tolist()
        return [SentenceScore._trusted(s + eos_t, flat[lo:hi], oov[lo:hi])
                for s, lo, hi in zip(sents, bounds, bounds[1:], strict=False)]

    def score_ids(self, ids: Any, offsets: Any, *, eos: bool = True) -> np.ndarray:
        """Score sentences given as word ids: sentence ``i`` is ``ids[offsets[i]:offsets[i+1]]`` (as
        :meth:`~privasr.lm.neural.vocab.Vocabulary.encode_flat` gives them); ``<s>`` is always the history's start.

        Returns the log10 probability of every target, float64: sentence ``i``'s words, then ``</s>`` when ``eos``,
        one after the other in sentence order (``offsets[i+1] - offsets[i] + eos`` values each). The array form
        of :meth:`score_batch`, without a Python object per sentence or word: what a caller scoring large batches
        (and the GPU, which the host otherwise keeps waiting) wants. Every ``<unk>`` id is taken to stand for an
        OOV word: with ``spread_unk`` its share is taken off.

        >>> import torch
        >>> from privasr.lm.neural.models import NeuralLMConfig, build_model
        >>> v = Vocabulary.build([["a", "b", "c"]])
        >>> _ = torch.manual_seed(0)
        >>> lm = NeuralLM(build_model(NeuralLMConfig.preset("tiny-transformer"), v), v)
        >>> ids, off = v.encode_flat([["a", "b"], ["c"]])
        >>> lp = lm.score_ids(ids, off)
        >>> lp.shape, bool(abs(lp[:3].sum() - lm.score(["a", "b"]).total()) < 1e-6)
        ((5,), True)
        """
        if not isinstance(eos, bool):
            raise ConfigError(f"eos={eos!r}", expected="true or false")
        try:
            t, off = checked_offsets(ids, offsets)
        except (TypeError, ValueError) as e:
            raise InputError(f"ids and offsets: {e}", expected="int vectors, offsets from 0 to len(ids)") from None
        if len(t) and (int(t.min()) < 0 or int(t.max()) >= len(self.vocab)):
            raise InputError(f"ids hold {int(t.min())} .. {int(t.max())}",
                             expected=f"word ids of this vocabulary, 0 .. {len(self.vocab) - 1}")
        flat = self._score_flat(t, off, eos)
        if self._unk_log10:
            unk = np.flatnonzero(t == self.vocab.unk_id)
            flat[unk + (np.searchsorted(off, unk, "right") - 1 if eos else 0)] -= self._unk_log10
        return flat

    # -- reference ----------------------------------------------------------------------------------------------
    def score_naive(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """The reference path: each sentence on its own (no prefix sharing, no batching), the model's full
        forward pass, a float64 log-softmax over every position and the bias applied in float64."""
        sents, ids = self._prepare(sentences, bos)
        bias = self.log_bias
        out = []
        with exact_inference(self.device):
            for s, x in zip(sents, ids, strict=True):
                targets = list(x) + [self.vocab.eos_id] if eos else list(x)
                inp = [self.vocab.bos_id, *targets[:-1]]
                if targets:
                    logits, _ = self.model(torch.tensor([inp], dtype=torch.long, device=self.device))
                    lp = torch.log_softmax(logits[0].double(), dim=-1).cpu().numpy()
                    if bias is not None:
                        lp = lp + bias
                        if self.renormalize:
                            m = lp.max(axis=1, keepdims=True)
                            lp = lp - (m + np.log(np.exp(lp - m).sum(axis=1, keepdims=True)))
                    vals = lp[np.arange(len(targets)), targets] / LN10
                else:
                    vals = np.zeros(0)
                oov = self._oov(s, eos)
                out.append(SentenceScore(s + ((EOS,) if eos else ()), self._spread(vals, oov), oov))
        return out

    # -- distributions ------------------------------------------------------------------------------------------
    def distributions(self, histories: Sequence[Sequence[str]]) -> np.ndarray:
        """log10 next-word distributions after ``<s>`` + each history: float64 ``[len(histories), V]``.

        Histories share prefixes through the same trie as scoring. With an unnormalised bias the rows are the
        biased, unnormalised scores (they do not sum to one); otherwise each row sums to one.
        """
        _, ids = self._prepare(histories, True)
        v = len(self.vocab)
        result = np.empty((len(ids), v), dtype=np.float64)
        step = max(1, self.group_tokens // 4)
        for lo in range(0, len(ids), step):
            trie = PrefixTrie.build(ids[lo:lo + step], root_token=self.vocab.bos_id)
            nodes, inverse = np.unique(trie.ends, return_inverse=True)
            result[lo:lo + len(inverse)] = self._rows(trie, nodes)[inverse.ravel()]
        if self.log_bias is not None and not self.renormalize:
            result += self.log_bias
        result /= LN10
        return result

    # -- internals ----------------------------------------------------------------------------------------------
    def _prepare(self, sentences: Sequence[Sequence[str]], bos: bool
                 ) -> tuple[list[tuple[str, ...]], list[tuple[int, ...]]]:
        sents = checked_sentences(sentences, bos)
        encode = self.vocab.encode
        return sents, [tuple(encode(s)) for s in sents]

    def _score_flat(self, ids: np.ndarray, off: np.ndarray, eos: bool) -> np.ndarray:
        """log10 scores of every target (each sentence's words, then ``</s>`` if ``eos``; no ``<unk>`` share
        taken off), scored in groups of about ``group_tokens`` targets of lexicographically sorted sentences, so
        that groups keep shared prefixes together."""
        lens = np.diff(off)
        n_tgt = lens + (1 if eos else 0)
        toff = offsets_of(n_tgt)
        if int(toff[-1]) <= self.group_tokens:
            return self._score_group(ids, off, eos).cpu().numpy()
        # groups go to the device one after the other and come back together at the end: the host builds the
        # next group's trie while the device runs the last one
        order = lex_order(ids, off)
        cum = np.cumsum(n_tgt[order])
        parts: list[torch.Tensor] = []
        where: list[np.ndarray] = []
        start = 0
        while start < len(order):
            base = int(cum[start - 1]) if start else 0
            stop = min(len(order), int(np.searchsorted(cum, base + self.group_tokens, "left")) + 1)
            seqs = order[start:stop]
            idx, g_off = _spans(off, seqs)
            where.append(_spans(toff, seqs)[0])
            parts.append(self._score_group(ids[idx], g_off, eos))
            start = stop
        out = np.empty(int(toff[-1]), dtype=np.float64)
        out[np.concatenate(where)] = torch.cat(parts).cpu().numpy()
        return out

    def _score_group(self, ids: np.ndarray, off: np.ndarray, eos: bool) -> torch.Tensor:
        """:meth:`_score_flat` of one group (one trie, one pass of the network), float64 on the device."""
        lens = np.diff(off)
        if eos:  # contexts: every prefix of the sentence; the last target is </s>
            ctx, ctx_off = ids, off
            live = np.arange(len(lens))
            final = np.full(len(lens), self.vocab.eos_id, dtype=np.int64)
        else:  # contexts: all but the whole sentence; the last target is the last word
            live = np.flatnonzero(lens > 0)
            keep = np.ones(len(ids), dtype=bool)
            keep[off[1:][lens > 0] - 1] = False
            ctx = ids[keep]
            ctx_off = offsets_of(lens[live] - 1)
            final = ids[off[1:][lens > 0] - 1]
        if not len(live):
            return torch.zeros(0, dtype=torch.float64, device=self.device)
        trie = PrefixTrie.from_flat(ctx, ctx_off, root_token=self.vocab.bos_id)
        return self._evaluate(trie, final) / LN10

    def _hidden(self, ids: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, Any]:
        """The model's forward pass up to (not including) its output layer."""
        return self.model.hidden(ids, **kw)

    def _node_states(self, trie: PrefixTrie) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        """(nodes, hidden states ``[n, H]``) for every trie node once, in chunks."""
        if self.arch == "lstm":
            yield from self._lstm_states(trie)
        else:
            yield from self._transformer_states(trie)

    def _transformer_states(self, trie: PrefixTrie) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        deepest = int(trie.depth.max())
        if self._max_pos is not None and deepest >= self._max_pos:
            raise InputError(f"a sentence of {deepest} words is longer than the model's {self._max_pos} positions")
        row_len = max(min(self.row_len, self.batch_tokens), deepest + 1)
        packed = pack_segments(trie, *trie.segment_arrays(row_len), row_len)
        per_chunk = max(1, self.batch_tokens // row_len)
        tokens = trie.token
        fill = (packed.nodes >= 0).sum(axis=1)
        for r0 in range(0, len(packed), per_chunk):
            r1 = min(len(packed), r0 + per_chunk)
            width = int(fill[r0:r1].max())
            nodes = packed.nodes[r0:r1, :width]
            ids = np.where(nodes >= 0, tokens[np.maximum(nodes, 0)], self.vocab.eos_id)
            mask = packed.attention(slice(r0, r1))[:, :width, :width]
            dev = self.device
            h, _ = self._hidden(_to_device(ids, dev), positions=_to_device(packed.positions[r0:r1, :width], dev),
                                attn_mask=_to_device(mask, dev))
            own = packed.own[r0:r1, :width]
            yield nodes[own], h.reshape(-1, h.shape[-1]).index_select(0, _to_device(np.flatnonzero(own), dev))

    def _lstm_states(self, trie: PrefixTrie) -> Iterator[tuple[np.ndarray, torch.Tensor]]:
        slot = np.zeros(len(trie), dtype=np.int64)  # row of each node in its level's state tensors
        prev: tuple[torch.Tensor, torch.Tensor] | None = None
        for d, level in enumerate(trie.levels()):
            slot[level] = np.arange(len(level))
            hs, cs = [], []
            for lo in range(0, len(level), self.batch_tokens):
                nodes = level[lo:lo + self.batch_tokens]
                n = len(nodes)
                # batch sizes rounded up to a few buckets: oneDNN builds an LSTM kernel per input shape
                pad = _bucket(n) - n
                ids = np.concatenate([trie.token[nodes], np.full(pad, self.vocab.eos_id, dtype=np.int64)])
                state = None
                if d:
                    par = np.concatenate([slot[trie.parent[nodes]], np.zeros(pad, dtype=np.int64)])
                    par_t = _to_device(par, self.device)
                    state = (prev[0].index_select(1, par_t), prev[1].index_select(1, par_t))  # type: ignore[index]
                y, (h, c) = self._hidden(_to_device(ids[:, None], self.device), state=state)
                hs.append(h[:, :n])
                cs.append(c[:, :n])
                yield nodes, y[:n, 0]
            prev = (torch.cat(hs, dim=1), torch.cat(cs, dim=1)) if len(hs) > 1 else (hs[0], cs[0])

    def _states(self, trie: PrefixTrie) -> torch.Tensor:
        """The hidden state of every trie node, ``[len(trie), H]`` on the device, in node order."""
        states: torch.Tensor | None = None
        for nodes, h in self._node_states(trie):
            if states is None:
                states = h.new_empty((len(trie), h.shape[-1]))
            states.index_copy_(0, _to_device(nodes, self.device), h)
        assert states is not None
        return states

    def _evaluate(self, trie: PrefixTrie, final: np.ndarray) -> torch.Tensor:
        """Run the network over ``trie``; return the natural-log probability (biased as configured) of every
        target of its sequences (their tokens, then ``final``; laid out like ``trie.paths()``), float64 on the
        device.

        All of it happens on the device: the output projection over blocks of the nodes that have pairs, a
        log-sum-exp per node, each pair's logit, the differences in float64 and their spread over the targets;
        nothing comes back until the caller asks, and the host never waits for the device in between (it lists
        the pairs while the device runs the network)."""
        out = self.model.output
        dev = self.device
        # a class softmax's target_logprob is normalised: no log-sum-exp needed unless a bias is renormalised
        targets_only = isinstance(out, ClassSoftmax) and not (self.renormalize and self._bias_t is not None)
        with exact_inference(dev):
            states = self._states(trie)
            pnode, ptarget, tokpair = target_pairs(trie, final)
            # the nodes with pairs, and each pair's row among them (pairs are grouped by node, nodes increasing)
            first = np.ones(len(pnode), dtype=bool)
            first[1:] = pnode[1:] != pnode[:-1]
            need = pnode[first]
            prank = np.cumsum(first) - 1
            step = self.out_rows
            bounds = np.searchsorted(prank, np.arange(0, len(need) + step, step)).tolist()
            every = len(need) == len(trie)  # then need is 0 .. len(trie) - 1
            prank_t, ptarget_t = _to_device(prank, dev), _to_device(ptarget, dev)
            need_t = None if every else _to_device(need, dev)
            logits_of = self._logits_fn()
            pair_val = torch.empty(len(pnode), dtype=torch.float32, device=dev)
            lse_all = torch.zeros(len(need), dtype=torch.float32, device=dev)
            for k, r0 in enumerate(range(0, len(need), step)):
                r1 = min(len(need), r0 + step)
                h = states[r0:r1] if need_t is None else states.index_select(0, need_t[r0:r1])
                p0, p1 = bounds[k], bounds[k + 1]
                rows = prank_t[p0:p1] - r0
                if targets_only:
                    pair_val[p0:p1] = out.target_logprob(h.index_select(0, rows), ptarget_t[p0:p1])
                    continue
                logits = logits_of(h)
                lse_all[r0:r1] = _logsumexp(logits)
                pair_val[p0:p1] = logits[rows, ptarget_t[p0:p1]]
            ln = pair_val.double() - lse_all.double().index_select(0, prank_t)
            if self.log_bias is not None and not self.renormalize:
                ln += self._bias_t64.index_select(0, ptarget_t)
            return ln.index_select(0, _to_device(tokpair, dev))

    def _logits_fn(self) -> Any:
        """A function from hidden states to the output logits, a renormalised bias included (for a class
        softmax: its full log-probability rows, which stand in for the logits)."""
        out = self.model.output
        renorm_bias = self._bias_t if self.renormalize else None
        if isinstance(out, ClassSoftmax):
            return out if renorm_bias is None else (lambda h: out(h) + renorm_bias)
        bvec = out.bias if out.bias is not None else torch.zeros(out.out_features, device=self.device)
        if renorm_bias is not None:
            bvec = bvec + renorm_bias
        weight_t = out.weight.t()
        return lambda h: torch.addmm(bvec, h, weight_t)

    def _rows(self, trie: PrefixTrie, nodes: np.ndarray) -> np.ndarray:
        """The full natural-log rows (renormalised bias included) of ``nodes`` (sorted, distinct): float64
        ``[len(nodes), V]``."""
        full = np.empty((len(nodes), len(self.vocab)), dtype=np.float64)
        nodes_t = _to_device(nodes, self.device)
        with exact_inference(self.device):
            states = self._states(trie)
            logits_of = self._logits_fn()
            for r0 in range(0, len(nodes), self.out_rows):
                h = states.index_select(0, nodes_t[r0:r0 + self.out_rows])
                logits = logits_of(h)
                full[r0:r0 + len(h)] = (logits - _logsumexp(logits)[:, None]).double().cpu().numpy()
        return full


def exact_inference(device: str | torch.device) -> contextlib.ExitStack:
    """``torch.inference_mode`` and, on CUDA, cuDNN without TF32 (its default for LSTMs and convolutions, which
    moves log-probabilities by about 1e-5): inference in true fp32 on every device, restored on exit.

    >>> with exact_inference("cpu"):
    ...     torch.is_inference_mode_enabled()
    True
    """
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode())
    if torch.device(device).type == "cuda":
        c = torch.backends.cudnn
        stack.enter_context(c.flags(enabled=c.enabled, benchmark=c.benchmark, deterministic=c.deterministic,
                                    allow_tf32=False))
    return stack


def _to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """A numpy array on ``device``; to CUDA through pinned memory, without waiting for the GPU (a copy from
    ordinary memory would wait for every kernel queued before it)."""
    a = np.ascontiguousarray(a)
    t = torch.from_numpy(a if a.flags.writeable else a.copy())  # torch refuses to alias read-only memory
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def _spans(off: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the pieces ``off[i]:off[i+1]`` of the sequences ``seqs``, concatenated, and their offsets.

    >>> [a.tolist() for a in _spans(np.array([0, 2, 2, 5]), np.array([2, 0]))]
    [[2, 3, 4, 0, 1], [0, 3, 5]]
    """
    lens = off[1:][seqs] - off[:-1][seqs]
    g_off = offsets_of(lens)
    return np.repeat(off[:-1][seqs] - g_off[:-1], lens) + np.arange(int(g_off[-1])), g_off


def _logsumexp(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise log-sum-exp through torch's fused softmax kernel (much faster on CPU than
    ``torch.logsumexp``): the softmax at the row's maximum ``m`` is ``1 / sum_v exp(x_v - m)``, so
    ``lse = m - log(max softmax)``; that maximum is at least ``1 / V``, so the log loses nothing."""
    return logits.amax(dim=1) - torch.softmax(logits, dim=1).amax(dim=1).log()


def _bucket(n: int) -> int:
    """``n`` rounded up to a power of two up to 64, else to a multiple of 64.

    >>> [_bucket(n) for n in (1, 3, 64, 65, 130)]
    [1, 4, 64, 128, 192]
    """
    return 1 << (n - 1).bit_length() if n <= 64 else -(-n // 64) * 64
