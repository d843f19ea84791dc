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
the words that follow it; no softmax is materialised. Everything runs in ``torch.inference_mode`` in fp32
(on CUDA with cuDNN's TF32 switched off, so an LSTM scores the same on the GPU as on the CPU, to ~1e-6);
the final differences are taken in float64. :meth:`NeuralLM.score_naive` is the reference: each sentence on
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
from privasr.lm.base import EOS, LN10, SentenceScore
from privasr.lm.neural.models import ClassSoftmax
from privasr.lm.neural.scoring_base import NeuralScorerBase, checked_log_bias, checked_sentences
from privasr.lm.neural.trie import PrefixTrie, pack_rows
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
            return
        self.log_bias = checked_log_bias(log_bias, len(self.vocab))
        self._bias_t = torch.tensor(self.log_bias, dtype=torch.float32, device=self.device)

    # -- protocol (order, in, len, score and with_bias: NeuralScorerBase) --------------------------------------
    def __repr__(self) -> str:
        bias = "none" if self.log_bias is None else ("renormalised" if self.renormalize else "unnormalised")
        return (f"NeuralLM(arch={self.arch}, vocab={len(self.vocab)}, unk_types={self.vocab.unk_types}, "
                f"bias={bias}, device={self.device})")

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences, each distinct prefix computed once (see the module docstring).

        ``bos`` must be true: a neural LM's history always starts at ``<s>``.
        """
        sents, ids = self._prepare(sentences, bos)
        out: list[SentenceScore | None] = [None] * len(sents)
        eos_t = (EOS,) if eos else ()
        # sentences sorted by their ids, so that groups keep shared prefixes together
        order = sorted(range(len(ids)), key=ids.__getitem__)
        group: list[int] = []
        size = 0
        for k, i in enumerate(order):
            group.append(i)
            size += len(ids[i]) + 1
            if size >= self.group_tokens or k == len(order) - 1:
                lps = self._score_group([ids[j] for j in group], eos)
                for j, lp in zip(group, lps, strict=True):
                    oov = self._oov(sents[j], eos)
                    out[j] = SentenceScore(sents[j] + eos_t, self._spread(lp, oov), oov)
                group, size = [], 0
        return out  # type: ignore[return-value]

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
        empty = np.zeros(0, dtype=np.int64)
        for lo in range(0, len(ids), step):
            trie = PrefixTrie.build(ids[lo:lo + step], root_token=self.vocab.bos_id)
            nodes, inverse = np.unique(trie.ends, return_inverse=True)
            rows = self._evaluate(trie, empty, empty, nodes)[2]
            result[lo:lo + len(inverse)] = rows[inverse.ravel()]
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

    def _score_group(self, ids: list[tuple[int, ...]], eos: bool) -> list[np.ndarray]:
        """log10 scores of each sentence's targets (its words, then ``</s>`` if ``eos``)."""
        n_tok = [len(x) + (1 if eos else 0) for x in ids]
        live = [i for i, n in enumerate(n_tok) if n]
        out = [np.zeros(0) for _ in ids]
        if not live:
            return out
        # the contexts: every prefix of the sentence (with eos) or all but the full sentence (without)
        contexts = [ids[i] if eos else ids[i][:-1] for i in live]
        trie = PrefixTrie.build(contexts, root_token=self.vocab.bos_id)
        flat_nodes, _ = trie.paths()
        eos_id = self.vocab.eos_id
        targets = np.fromiter((t for i in live for t in (ids[i] + (eos_id,) if eos else ids[i])),
                              dtype=np.int64, count=len(flat_nodes))
        v = len(self.vocab)
        keys, inverse = np.unique(flat_nodes * v + targets, return_inverse=True)
        pair_node, pair_tgt = np.divmod(keys, v)
        pair_logit, node_lse, _ = self._evaluate(trie, pair_node, pair_tgt)
        ln = pair_logit - node_lse[pair_node]
        if self.log_bias is not None and not self.renormalize:
            ln = ln + self.log_bias[pair_tgt]
        flat = ln[inverse.ravel()] / LN10
        lo = 0
        for i in live:
            out[i] = flat[lo:lo + n_tok[i]]
            lo += n_tok[i]
        return out

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
        packed = pack_rows(trie, trie.segments(row_len), row_len)
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

    def _evaluate(self, trie: PrefixTrie, pair_node: np.ndarray, pair_tgt: np.ndarray,
                  rows_of: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Run the network over ``trie``. Return the logits (bias included when renormalising) of each
        ``(pair_node, pair_tgt)`` pair (``pair_node`` sorted), each node's log-sum-exp, and the full natural-log
        rows ``[len(rows_of), V]`` of the nodes ``rows_of`` (sorted, distinct; float64)."""
        out = self.model.output
        renorm_bias = self._bias_t if self.renormalize else None
        classy = isinstance(out, ClassSoftmax)
        if classy:
            # the class softmax: only the targets' log-probabilities unless full rows or a renormalised bias
            # are needed, in which case the full (normalised) log-probability rows stand in for the logits
            targets_only = renorm_bias is None and rows_of is None
        else:
            weight_t = out.weight.t()
            bvec = out.bias if out.bias is not None else torch.zeros(out.out_features, device=self.device)
            if renorm_bias is not None:
                bvec = bvec + renorm_bias
        pair_logit = np.empty(len(pair_node), dtype=np.float64)
        node_lse = np.full(len(trie), np.nan, dtype=np.float64)
        want = np.full(len(trie), -1, dtype=np.int64)
        if rows_of is not None:
            want[rows_of] = np.arange(len(rows_of))
        full = np.empty((0 if rows_of is None else len(rows_of), out.out_features), dtype=np.float64)
        dev = self.device
        # results stay on the device until the end (one copy back, no wait for the GPU per block)
        lse_nodes: list[np.ndarray] = []
        lse_vals: list[torch.Tensor] = []
        pair_idx: list[np.ndarray] = []
        pair_vals: list[torch.Tensor] = []
        with exact_inference(dev):
            for nodes, h in self._node_states(trie):
                if classy and targets_only:
                    node_lse[nodes] = 0.0  # target_logprob is normalised
                    rows, idx = _pairs_of(pair_node, nodes)
                    if len(idx):
                        pair_idx.append(idx)
                        pair_vals.append(out.target_logprob(h.index_select(0, _to_device(rows, dev)),
                                                            _to_device(pair_tgt[idx], dev)))
                    continue
                for b0 in range(0, len(nodes), self.out_rows):
                    blk = nodes[b0:b0 + self.out_rows]
                    if classy:
                        logits = out(h[b0:b0 + self.out_rows])
                        if renorm_bias is not None:
                            logits = logits + renorm_bias
                    else:
                        logits = torch.addmm(bvec, h[b0:b0 + self.out_rows], weight_t)
                    lse = _logsumexp(logits)
                    lse_nodes.append(blk)
                    lse_vals.append(lse)
                    if len(pair_node):
                        rows, idx = _pairs_of(pair_node, blk)
                        if len(idx):
                            pair_idx.append(idx)
                            pair_vals.append(logits[_to_device(rows, dev), _to_device(pair_tgt[idx], dev)])
                    if rows_of is not None:
                        dest = want[blk]
                        keep = np.flatnonzero(dest >= 0)
                        if keep.size:
                            k = _to_device(keep, dev)
                            sel = logits.index_select(0, k) - lse.index_select(0, k)[:, None]
                            full[dest[keep]] = sel.double().cpu().numpy()
            if lse_vals:
                node_lse[np.concatenate(lse_nodes)] = torch.cat(lse_vals).double().cpu().numpy()
            if pair_vals:
                pair_logit[np.concatenate(pair_idx)] = torch.cat(pair_vals).double().cpu().numpy()
        return pair_logit, node_lse, full


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
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def _pairs_of(pair_node: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of ``nodes``: for each, its node's row in ``nodes`` and its index in ``pair_node`` (sorted).

    >>> _pairs_of(np.array([0, 0, 2, 5]), np.array([2, 0, 3]))
    (array([0, 1, 1]), array([2, 0, 1]))
    """
    if not len(pair_node):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    start = np.searchsorted(pair_node, nodes, "left")
    cnt = np.searchsorted(pair_node, nodes, "right") - start
    tot = int(cnt.sum())
    rows = np.repeat(np.arange(len(nodes)), cnt)
    idx = np.repeat(start - (np.cumsum(cnt) - cnt), cnt) + np.arange(tot)
    return rows, idx


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
