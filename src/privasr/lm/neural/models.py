"""Neural word language models: a Transformer decoder and an LSTM with optional character-aware embeddings.

Both take word ids ``[B, T]`` whose first input is ``<s>`` and predict the next word at every position (the
targets of a sentence are its words, then ``</s>``); both return ``(logits [B, T, V], state)``, and
``log_softmax(logits, -1)`` is the model's next-word log-probabilities.

**Output layer** (``softmax``). ``"full"`` (the default): one ``Linear(H, V)`` (``model.output``), a softmax over
the whole vocabulary. ``"class"`` (paper 003; Mikolov et al. 2011): a class-factored softmax
(:class:`ClassSoftmax`, ``model.output``), ``P(w|h) = P(c(w)|h) * P(w|c(w),h)`` with a class layer
``Linear(H, C)`` and a word layer ``Linear(H, V)`` whose logits are normalised within each class. The
``classes`` (``C``; 0 = ``round(sqrt(V))``) are frequency bins: the ids sorted by training count
(:attr:`Vocabulary.counts <privasr.lm.neural.vocab.Vocabulary.counts>`), cut into bins of about equal total count
(every bin non-empty); the class of every id is a buffer of the model (``output.classes``, in the state dict), so
a checkpoint is self-contained. The specials have classes like any word (``<s>``, count 0, is in the last bin):
like the full softmax, the class softmax is a distribution over all ``V`` ids and ``<s>``, never a target,
learns a vanishing probability. For the class softmax ``forward`` returns the normalised log-probabilities
themselves (``log_softmax`` leaves them unchanged up to rounding), so every consumer of the logits works
unchanged at the full ``H * V`` cost; :meth:`ClassSoftmax.target_logprob` gives the log-probabilities of given
targets at ``H * (C + |class|)`` per token (training's loss and the scorer use it).

**Transformer** (:class:`TransformerLM`, paper 000: embeddings 256, FFN 1024, 3 blocks, 4 heads, dropout 0.1):
*pre-LN* blocks (``x + Drop(Attn(LN(x)))`` then ``x + Drop(FFN(LN(x)))``, a final LayerNorm before the output
layer; pre-LN trains stably without learning-rate warm-up), GELU feed-forward, dropout on the residual branches
and the attention weights. Positions are *sinusoidal* by default (Vaswani et al.; computed for any position, so
packed prefix trees may use arbitrary position ids) or *learned* (``positions="learned"``: ``max_len`` rows);
word embeddings are scaled by ``sqrt(embed_dim)`` before the positions are added. The attention is causal; an
explicit ``attn_mask`` (``True`` = may attend) replaces the causal mask, so a prefix tree packed into one
sequence with each node attending to its ancestors and itself ("tree attention") gives every path the logits it
would get alone.

**LSTM** (:class:`LstmLM`, paper 001: 2 layers of 512, character-aware word embeddings): embeddings -> dropout
-> stacked LSTM (dropout between layers) -> dropout -> word softmax. With ``char_aware`` the input embedding of
a word is computed from its spelling as in Kim et al. (2016): character embeddings (``char_embed_dim``), one
convolution per filter width (``char_filters``: ``(width, count)`` pairs, tanh), max-over-time pooling,
``highway_layers`` highway layers (ReLU transform, carry-gate bias -2); the word vector has ``sum(count)``
dimensions (``embed_dim`` is then unused). The character vocabulary is built from the word vocabulary and a
``[V, max_chars]`` table maps every word id to its characters (``<bow> c1 .. cn <eow>``; the special words have
their own one-symbol spellings); :meth:`CharWordEmbedding.embed_words` embeds any string, in the vocabulary or
not. The output layer is a word softmax (full or class-factored, above). The state ``(h, c)`` is returned
and may be passed back in to go on from where a call stopped (incremental or trie scoring).

**Fine-tuning with frozen layers** (paper 003, 2.3) updates only :meth:`output_layers`: the output projection
(weight and bias), or with the class softmax its class and word layers. With ``tie_embeddings`` that (word)
weight *is* the input embedding matrix, so fine-tuning the output layer also changes the input embeddings (the
tie is kept, not broken); untie the embeddings when the rest of the model must stay bit-identical.

>>> from privasr.lm.neural.vocab import Vocabulary
>>> import torch
>>> v = Vocabulary.build([["a", "b"]])
>>> m = build_model(NeuralLMConfig.preset("tiny-transformer"), v)
>>> logits, state = m(torch.tensor([[v.bos_id, v.index("a")]]))
>>> tuple(logits.shape), state
((1, 2, 5), None)
>>> m2 = build_model(NeuralLMConfig.preset("tiny-lstm-char"), v)
>>> tuple(m2(torch.tensor([[1, 3, 4]]))[0].shape)
(1, 3, 5)
>>> m3 = build_model(NeuralLMConfig.preset("tiny-lstm-class"), v)
>>> lp = m3(torch.tensor([[1, 3]]))[0].detach()
>>> m3.output.classes.tolist(), torch.allclose(lp.exp().sum(-1), torch.ones(1, 2))
([1, 1, 0, 0, 1], True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from privasr.errors import ConfigError
from privasr.lm.neural.dropout import Dropout, attention, lstm
from privasr.lm.neural.vocab import SPECIALS, Vocabulary

__all__ = ["NeuralLMConfig", "PRESETS", "build_model", "TransformerLM", "LstmLM", "CharWordEmbedding",
           "NeuralModel", "ClassSoftmax", "frequency_classes", "SOFTMAXES"]

ARCHS = ("transformer", "lstm")
SOFTMAXES = ("full", "class")
KIM_SMALL_FILTERS: tuple[tuple[int, int], ...] = ((1, 25), (2, 50), (3, 75), (4, 100), (5, 125), (6, 150))


@dataclass(frozen=True)
class NeuralLMConfig:
    """Architecture and size of a neural LM (validated on creation; :meth:`preset` gives named sizes).

    Attributes:
        arch: ``"transformer"`` or ``"lstm"``.
        vocab_size: the number of words; ``0`` = take it from the vocabulary in :func:`build_model`.
        embed_dim: word embedding (and, for the Transformer, model) dimension.
        hidden_dim: LSTM hidden units per layer (LSTM only).
        ffn_dim: feed-forward inner dimension (Transformer only).
        layers: LSTM layers or Transformer blocks.
        heads: attention heads (Transformer; must divide ``embed_dim``).
        dropout: dropout probability (embeddings, between layers, residual branches, attention weights).
        max_len: the longest input the model is trained on (training splits longer sentences); the number of
            position embeddings when ``positions="learned"``.
        positions: ``"sinusoidal"`` or ``"learned"`` (Transformer only).
        char_aware: character-aware word embeddings (LSTM only, Kim et al. 2016).
        char_embed_dim: character embedding dimension.
        char_filters: ``(width, count)`` of each character convolution (Kim's "small" model by default).
        highway_layers: highway layers after the character CNN.
        max_word_chars: characters kept per word, including the begin/end-of-word symbols.
        tie_embeddings: share the input embedding and output projection matrices (needs word embeddings of
            the size of the layer below the softmax); with the class softmax, its word layer.
        softmax: ``"full"`` (one softmax over the vocabulary) or ``"class"`` (class-factored, see the module
            docstring).
        classes: the number of word classes of the class softmax (``0`` = ``round(sqrt(V))``; at most ``V``);
            must be 0 with the full softmax.
    """

    arch: str = "transformer"
    vocab_size: int = 0
    embed_dim: int = 256
    hidden_dim: int = 512
    ffn_dim: int = 1024
    layers: int = 3
    heads: int = 4
    dropout: float = 0.1
    max_len: int = 256
    positions: str = "sinusoidal"
    char_aware: bool = False
    char_embed_dim: int = 100
    char_filters: tuple[tuple[int, int], ...] = KIM_SMALL_FILTERS
    highway_layers: int = 1
    max_word_chars: int = 32
    tie_embeddings: bool = False
    softmax: str = "full"
    classes: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{f.name}={v!r}", expected="an integer")
            if f.type in ("bool", bool) and not isinstance(v, bool):
                raise ConfigError(f"{f.name}={v!r}", expected="true or false")
        if self.arch not in ARCHS:
            raise ConfigError(f"arch={self.arch!r}", expected=" or ".join(ARCHS))
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, int | float) \
                or not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout!r}", expected="a probability in [0, 1)")
        object.__setattr__(self, "dropout", float(self.dropout))
        for name in ("embed_dim", "hidden_dim", "ffn_dim", "layers", "heads", "max_len", "char_embed_dim",
                     "max_word_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}", expected="a positive integer")
        if self.vocab_size < 0 or 0 < self.vocab_size < len(SPECIALS):
            raise ConfigError(f"vocab_size={self.vocab_size}", expected="0 (from the vocabulary) or at least 3")
        if self.highway_layers < 0:
            raise ConfigError(f"highway_layers={self.highway_layers}", expected="0 or more")
        if self.softmax not in SOFTMAXES:
            raise ConfigError(f"softmax={self.softmax!r} is not a softmax type",
                              expected="full (one softmax over the vocabulary) or class (class-factored)")
        if self.classes < 0:
            raise ConfigError(f"classes={self.classes}", expected="0 (automatic: round(sqrt(V))) or a positive number "
                              "of word classes")
        if self.classes and self.softmax != "class":
            raise ConfigError(f"classes={self.classes} is only used with softmax=class (got softmax={self.softmax!r})",
                              expected="classes=0, or softmax=class")
        if self.vocab_size and self.classes > self.vocab_size:
            raise ConfigError(f"classes={self.classes} is more than the vocabulary's {self.vocab_size} words",
                              expected=f"at most {self.vocab_size} classes (or 0: automatic)")
        if self.positions not in ("sinusoidal", "learned"):
            raise ConfigError(f"positions={self.positions!r}", expected="sinusoidal or learned")
        try:
            filters = tuple((int(w), int(c)) for w, c in self.char_filters)
        except (TypeError, ValueError):
            raise ConfigError(f"char_filters={self.char_filters!r}", expected="[[width, count], ...]") from None
        if not filters or any(w < 1 or c < 1 for w, c in filters):
            raise ConfigError(f"char_filters={self.char_filters!r}", expected="positive widths and counts")
        object.__setattr__(self, "char_filters", filters)
        if self.arch == "transformer":
            if self.embed_dim % self.heads:
                raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by heads={self.heads}")
            if self.char_aware:
                raise ConfigError("char_aware is only implemented for arch=lstm")
        else:
            if self.tie_embeddings and self.char_aware:
                raise ConfigError("tie_embeddings needs word embeddings, not char_aware ones")
            if self.tie_embeddings and self.embed_dim != self.hidden_dim:
                raise ConfigError(f"tie_embeddings needs embed_dim == hidden_dim (got {self.embed_dim} and "
                                  f"{self.hidden_dim})")
            if self.char_aware and self.max_word_chars < max(w for w, _ in filters):
                raise ConfigError(f"max_word_chars={self.max_word_chars} is shorter than the widest char filter")

    # -- (de)serialisation ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``char_filters`` as lists). A full softmax leaves ``softmax``/``classes`` out,
        so the dicts (checkpoints, cache keys) of full-softmax models are what they were before those fields.

        >>> "softmax" in NeuralLMConfig.preset("tiny-lstm").to_dict()
        False
        >>> NeuralLMConfig.preset("tiny-lstm-class").to_dict()["softmax"]
        'class'
        """
        d = dataclasses.asdict(self)
        d["char_filters"] = [list(p) for p in self.char_filters]
        if self.softmax == "full" and self.classes == 0:
            del d["softmax"], d["classes"]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NeuralLMConfig:
        """Inverse of :meth:`to_dict`; unknown keys are a :class:`ConfigError`, missing keys take their defaults
        (a checkpoint written before ``softmax``/``classes`` existed loads as the full softmax).

        >>> NeuralLMConfig.from_dict({"arch": "lstm", "layers": 1}).layers
        1
        """
        if not isinstance(data, Mapping):
            raise ConfigError("the model config is not a mapping", expected="key: value pairs")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown model config key(s) {unknown}", expected=f"some of {sorted(names)}")
        kw = dict(data)
        if "char_filters" in kw and isinstance(kw["char_filters"], list | tuple):
            kw["char_filters"] = tuple(tuple(p) if isinstance(p, list | tuple) else p for p in kw["char_filters"])
        return cls(**kw)

    def replace(self, **changes: Any) -> NeuralLMConfig:
        """A copy with ``changes`` applied (validated)."""
        return self.from_dict({**self.to_dict(), **changes})

    @classmethod
    def preset(cls, name: str) -> NeuralLMConfig:
        """A named configuration (see :data:`PRESETS`).

        >>> NeuralLMConfig.preset("paper000-transformer").ffn_dim
        1024
        """
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}", expected=f"one of {sorted(PRESETS)}")
        return cls.from_dict(PRESETS[name])


PRESETS: dict[str, dict[str, Any]] = {
    # paper 000: word embeddings 256, FFN 1024, 3 blocks, 4 heads, dropout 0.1
    "paper000-transformer": {"arch": "transformer", "embed_dim": 256, "ffn_dim": 1024, "layers": 3, "heads": 4,
                             "dropout": 0.1, "max_len": 256},
    # paper 001: 2 x 512 LSTM with character-aware word embeddings (char embedding 100; Kim's small CNN;
    # dropout 0.5 as in Kim et al.)
    "paper001-lstm": {"arch": "lstm", "hidden_dim": 512, "layers": 2, "char_aware": True, "char_embed_dim": 100,
                      "char_filters": [list(p) for p in KIM_SMALL_FILTERS], "highway_layers": 1,
                      "dropout": 0.5, "embed_dim": 512},
    # paper 003: an LSTM with a class-factored softmax (2 x 512 as paper 001's LSTM, word embeddings 512,
    # sqrt(V) frequency-binned classes)
    "paper003-lstm": {"arch": "lstm", "embed_dim": 512, "hidden_dim": 512, "layers": 2, "dropout": 0.5,
                      "softmax": "class", "classes": 0},
    # small sizes for CPU experiments
    "small-transformer": {"arch": "transformer", "embed_dim": 128, "ffn_dim": 512, "layers": 2, "heads": 4,
                          "dropout": 0.1, "max_len": 128},
    "small-lstm": {"arch": "lstm", "embed_dim": 128, "hidden_dim": 256, "layers": 2, "dropout": 0.2},
    "small-lstm-class": {"arch": "lstm", "embed_dim": 128, "hidden_dim": 256, "layers": 2, "dropout": 0.2,
                         "softmax": "class"},
    "small-lstm-char": {"arch": "lstm", "hidden_dim": 256, "layers": 2, "dropout": 0.2, "char_aware": True,
                        "char_embed_dim": 16, "char_filters": [[1, 16], [2, 32], [3, 48], [4, 64]],
                        "highway_layers": 1},
    # tiny sizes for tests
    "tiny-transformer": {"arch": "transformer", "embed_dim": 16, "ffn_dim": 32, "layers": 2, "heads": 2,
                         "dropout": 0.0, "max_len": 64},
    "tiny-lstm": {"arch": "lstm", "embed_dim": 16, "hidden_dim": 24, "layers": 2, "dropout": 0.0},
    "tiny-lstm-char": {"arch": "lstm", "hidden_dim": 24, "layers": 2, "dropout": 0.0, "char_aware": True,
                       "char_embed_dim": 8, "char_filters": [[1, 4], [2, 6], [3, 8]], "highway_layers": 1,
                       "max_word_chars": 16},
    "tiny-lstm-class": {"arch": "lstm", "embed_dim": 16, "hidden_dim": 24, "layers": 2, "dropout": 0.0,
                        "softmax": "class"},
}


# ---------------------------------------------------------------------------------------------------------------
# Output layers: full or class-factored softmax
# ---------------------------------------------------------------------------------------------------------------
def frequency_classes(counts: Sequence[float], classes: int) -> list[int]:
    """Mikolov et al. (2011) frequency binning: the class of every id, ``0 .. classes - 1``.

    The ids are sorted by count (largest first, ties by id) and assigned in that order to class ``a``, which
    moves on to ``a + 1`` once the running total reaches ``(a + 1) / classes`` of the whole; the class also moves
    on when only as many ids are left as classes still empty, so every class has at least one id. All counts 0
    are treated as equal counts.

    >>> frequency_classes([0, 0, 10, 50, 20, 10, 5, 5], 3)
    [2, 2, 2, 0, 1, 2, 2, 2]
    >>> frequency_classes([0, 0, 10, 50, 20, 10, 5, 5], 8)  # as many classes as ids: one id each
    [6, 7, 2, 0, 1, 3, 4, 5]
    """
    n = len(counts)
    if not 1 <= classes <= n:
        raise ConfigError(f"classes={classes} for {n} words", expected=f"1 to {n} classes")
    total = float(sum(counts))
    mass = [float(c) for c in counts] if total > 0 else [1.0] * n
    total = total if total > 0 else float(n)
    order = sorted(range(n), key=lambda i: (-mass[i], i))
    out = [0] * n
    a, cum = 0, 0.0
    for k, i in enumerate(order):
        out[i] = a
        cum += mass[i]
        if a < classes - 1 and (cum >= (a + 1) * total / classes or n - k - 1 == classes - 1 - a):
            a += 1
    return out


def _vocab_counts(vocab: Vocabulary) -> list[float]:
    """The vocabulary's training counts; without recorded counts a Zipf guess from the ids (the words come most
    frequent first): ``1 / rank`` for the words, ``</s>`` and ``<unk>`` as frequent as the first word, ``<s>`` 0."""
    if vocab.counts is not None:
        return [float(c) for c in vocab.counts]
    zipf = [1.0 / r for r in range(1, len(vocab) - len(SPECIALS) + 1)]
    return [1.0, 0.0, 1.0, *zipf]


class _ClassLogSumExp(torch.autograd.Function):
    """``lse[r] = logsumexp_{w in class} (h[r] . W[w] + b[w])`` for groups ``(rows, class members)``, float32.

    A hand-written backward: autograd through one ``index_select`` per class would build a ``[V, H]`` gradient
    per class; this one accumulates every class into one. The softmax of each group is kept for the backward.
    """

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                groups: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        keep = any(ctx.needs_input_grad[:3])
        lse = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        probs = []
        for rows, mem in groups:
            z = h.index_select(0, rows) @ weight.index_select(0, mem).t()
            if bias is not None:
                z = z + bias.index_select(0, mem)
            z = z.float()
            part = torch.logsumexp(z, dim=1)
            lse[rows] = part
            if keep:
                probs.append(torch.exp(z - part[:, None]))
        ctx.groups, ctx.probs = groups, probs
        ctx.save_for_backward(h, weight, bias)
        return lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        h, weight, bias = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        gh = torch.zeros_like(h) if need_h else None
        gw = torch.zeros_like(weight) if need_w else None
        gb = torch.zeros_like(bias) if need_b and bias is not None else None
        for (rows, mem), p in zip(ctx.groups, ctx.probs, strict=True):
            p = p * grad.index_select(0, rows)[:, None].float()
            if gh is not None:
                gh.index_add_(0, rows, (p.to(weight.dtype) @ weight.index_select(0, mem)).to(h.dtype))
            if gw is not None:
                gw.index_add_(0, mem, (p.t() @ h.index_select(0, rows).to(p.dtype)).to(weight.dtype))
            if gb is not None:
                gb.index_add_(0, mem, p.sum(0).to(gb.dtype))
        ctx.probs = None
        return gh, gw, gb, None


class ClassSoftmax(nn.Module):
    """Class-factored softmax ``P(w|h) = P(c(w)|h) * P(w|c(w),h)`` (see the module docstring).

    Args:
        in_features: ``H``, the size of the hidden states.
        classes: the class of every word id (a list of ``V`` ints covering ``0 .. C - 1``, every class non-empty).

    ``cls`` (``Linear(H, C)``) gives the class logits, ``word`` (``Linear(H, V)``) the word logits, normalised
    within each class; ``classes`` (a buffer, saved in the state dict) holds the class of every id. Calling it
    gives the normalised log-probabilities ``[..., V]``; :meth:`target_logprob` only those of given targets.

    >>> out = ClassSoftmax(4, [0, 1, 1, 0, 1])
    >>> h = torch.randn(3, 4)
    >>> lp = out(h)
    >>> bool(torch.allclose(lp.exp().sum(-1), torch.ones(3)))
    True
    >>> t = torch.tensor([4, 0, 3])
    >>> bool(torch.allclose(out.target_logprob(h, t), lp[torch.arange(3), t], atol=1e-6))
    True
    """

    def __init__(self, in_features: int, classes: Sequence[int]) -> None:
        super().__init__()
        cl = torch.as_tensor(list(classes), dtype=torch.long)
        self.num_classes = int(cl.max()) + 1 if cl.numel() else 0
        self.in_features = in_features
        self.out_features = int(cl.numel())
        self.cls = nn.Linear(in_features, self.num_classes)
        self.word = nn.Linear(in_features, self.out_features)
        self.register_buffer("classes", cl)
        self._refresh()

    def _refresh(self) -> None:
        """Check ``classes`` and (re)compute the members of each class (after construction and loading)."""
        cl = self.classes
        if cl.dim() != 1 or cl.numel() != self.out_features or cl.dtype != torch.long:
            raise ValueError(f"the word classes must be {self.out_features} integer ids")
        sizes = torch.bincount(cl.cpu(), minlength=self.num_classes) if cl.numel() else torch.zeros(0)
        if cl.numel() and (int(cl.min()) < 0 or int(cl.max()) >= self.num_classes or bool((sizes == 0).any())):
            raise ValueError(f"the word classes must cover 0 .. {self.num_classes - 1}, every class non-empty")
        # members: the ids sorted by class (stable: by id within a class); class c is members[start[c]:start[c+1]]
        self.register_buffer("members", torch.argsort(cl, stable=True), persistent=False)
        self._start: list[int] = [0, *torch.cumsum(sizes, 0).tolist()]

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._refresh()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, classes={self.num_classes}"

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Normalised log-probabilities ``[..., V]`` (float32) of hidden states ``[..., H]``."""
        lead = h.shape[:-1]
        x = h.reshape(-1, h.shape[-1])
        z = self.word(x).float()
        n = z.shape[0]
        idx = self.classes.expand(n, -1)
        # log-sum-exp within each class: the class maximum (a constant, no gradient), then the sum of the rest
        m = torch.full((n, self.num_classes), -math.inf, device=z.device, dtype=z.dtype)
        m = m.scatter_reduce(1, idx, z.detach(), reduce="amax", include_self=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        mw = m.gather(1, idx)
        s = torch.zeros_like(m).scatter_add(1, idx, (z - mw).exp())
        lse = (m + s.log()).gather(1, idx)
        lpc = torch.log_softmax(self.cls(x).float(), dim=-1).gather(1, idx)
        return (lpc + z - lse).reshape(*lead, self.out_features)

    def target_logprob(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``ln P(targets | h)`` (float32 ``[N]``) of hidden states ``[N, H]`` and target ids ``[N]``, computing
        only the class softmax and the word logits of each target's class (tokens grouped by class)."""
        if h.dim() != 2 or targets.shape != h.shape[:1]:
            raise ValueError(f"h must be [N, H] and targets [N], got {tuple(h.shape)} and {tuple(targets.shape)}")
        tc = self.classes[targets]
        out = torch.log_softmax(self.cls(h).float(), dim=-1).gather(1, tc[:, None])[:, 0]
        z_t = ((self.word.weight[targets] * h).sum(-1) + (self.word.bias[targets] if self.word.bias is not None
                                                          else 0.0)).float()
        order = torch.argsort(tc, stable=True)
        present, counts = torch.unique_consecutive(tc[order], return_counts=True)
        groups = []
        lo = 0
        for c, k in zip(present.tolist(), counts.tolist(), strict=True):
            groups.append((order[lo:lo + k], self.members[self._start[c]:self._start[c + 1]]))
            lo += k
        lse = _ClassLogSumExp.apply(h, self.word.weight, self.word.bias, groups)
        return out + z_t - lse


def _output_layer(config: NeuralLMConfig, vocab: Vocabulary, in_features: int) -> nn.Linear | ClassSoftmax:
    """The output layer of ``config``: ``Linear(H, V)`` or a :class:`ClassSoftmax` binned on ``vocab``'s counts."""
    if config.softmax == "full":
        return nn.Linear(in_features, config.vocab_size)
    c = config.classes or max(1, round(math.sqrt(config.vocab_size)))
    return ClassSoftmax(in_features, frequency_classes(_vocab_counts(vocab), min(c, config.vocab_size)))


def _tie(output: nn.Linear | ClassSoftmax, embed: nn.Module) -> None:
    (output.word if isinstance(output, ClassSoftmax) else output).weight = embed.weight


def _output_layers(output: nn.Linear | ClassSoftmax) -> list[nn.Module]:
    return [output.cls, output.word] if isinstance(output, ClassSoftmax) else [output]


# ---------------------------------------------------------------------------------------------------------------
# Transformer
# ---------------------------------------------------------------------------------------------------------------
class _SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # F.scaled_dot_product_attention's results, with the attention dropout drawn faster on the CPU
        if mask is None:
            y = attention(q, k, v, dropout_p=self.dropout, training=self.training, is_causal=True)
        else:
            y = attention(q, k, v, dropout_p=self.dropout, training=self.training, attn_mask=mask[:, None])
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    def __init__(self, cfg: NeuralLMConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.embed_dim)
        self.attn = _SelfAttention(cfg.embed_dim, cfg.heads, cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.embed_dim)
        self.ff1 = nn.Linear(cfg.embed_dim, cfg.ffn_dim)
        self.ff2 = nn.Linear(cfg.ffn_dim, cfg.embed_dim)
        self.drop = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), mask))
        return x + self.drop(self.ff2(F.gelu(self.ff1(self.ln2(x)))))


class TransformerLM(nn.Module):
    """Pre-LN Transformer decoder LM (see the module docstring). Build it with :func:`build_model`."""

    def __init__(self, config: NeuralLMConfig, vocab: Vocabulary) -> None:
        super().__init__()
        self.config = config
        d = config.embed_dim
        self.embed = nn.Embedding(config.vocab_size, d)
        nn.init.normal_(self.embed.weight, std=d ** -0.5)
        if config.positions == "learned":
            self.pos_embed: nn.Embedding | None = nn.Embedding(config.max_len, d)
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        else:
            self.pos_embed = None
        self.register_buffer("inv_freq", torch.exp(torch.arange(0, d, 2).float() * (-math.log(10000.0) / d)),
                             persistent=False)
        self.drop = Dropout(config.dropout)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(d)
        self.output = _output_layer(config, vocab, d)
        if config.tie_embeddings:
            _tie(self.output, self.embed)

    def _positions(self, positions: torch.Tensor) -> torch.Tensor:
        if self.pos_embed is not None:
            if positions.numel() and (int(positions.max()) >= self.config.max_len or int(positions.min()) < 0):
                raise ValueError(f"positions must be in [0, {self.config.max_len}) for learned positions")
            return self.pos_embed(positions)
        ang = positions.to(self.inv_freq.dtype)[..., None] * self.inv_freq
        d = self.config.embed_dim
        pe = torch.stack((ang.sin(), ang.cos()), dim=-1).flatten(-2)
        return pe[..., :d]

    def forward(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None, state: Any = None) -> tuple[torch.Tensor, None]:
        """Logits ``[B, T, V]`` for word ids ``[B, T]`` (normalised log-probabilities with the class softmax);
        ``state`` must be ``None`` (returned as ``None``).

        ``positions`` (``[B, T]``, default ``arange(T)``) and ``attn_mask`` (bool ``[B, T, T]``, ``True`` = may
        attend, replacing the causal mask; every row needs at least one ``True``) allow tree attention.
        """
        h, _ = self.hidden(ids, positions=positions, attn_mask=attn_mask, state=state)
        return self.output(h), None

    def hidden(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None, state: Any = None) -> tuple[torch.Tensor, None]:
        """Like :meth:`forward`, but the states ``[B, T, H]`` that enter the output layer (no logits).

        Scorers that need only a few logits per position project these themselves.
        """
        if state is not None:
            raise ValueError("the Transformer LM keeps no state: pass state=None")
        if ids.dim() != 2:
            raise ValueError(f"ids must be [B, T], got shape {tuple(ids.shape)}")
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t, device=ids.device).expand(b, t)
        elif positions.shape != ids.shape:
            raise ValueError(f"positions {tuple(positions.shape)} must have the shape of ids {tuple(ids.shape)}")
        if attn_mask is not None:
            if attn_mask.shape != (b, t, t) or attn_mask.dtype != torch.bool:
                raise ValueError(f"attn_mask must be a bool tensor [B, T, T] = [{b}, {t}, {t}]")
        x = self.embed(ids) * math.sqrt(self.config.embed_dim) + self._positions(positions)
        x = self.drop(x)
        for blk in self.blocks:
            x = blk(x, attn_mask)
        return self.norm(x), None

    def output_layers(self) -> list[nn.Module]:
        """The layers fine-tuning with frozen layers updates: the output projection (weight + bias), or the
        class softmax's class and word layers."""
        return _output_layers(self.output)


# ---------------------------------------------------------------------------------------------------------------
# LSTM with optional character-aware embeddings
# ---------------------------------------------------------------------------------------------------------------
_PAD, _BOW, _EOW, _UNKC = 0, 1, 2, 3
_CHAR_SPECIALS = ("<pad>", "<bow>", "<eow>", "<unkc>") + SPECIALS


class _Highway(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.transform = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, dim)
        nn.init.constant_(self.gate.bias, -2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.sigmoid(self.gate(x))
        return t * F.relu(self.transform(x)) + (1.0 - t) * x


class CharWordEmbedding(nn.Module):
    """Kim et al. (2016) word embeddings from characters: char embeddings -> CNN (max over time) -> highway.

    The character vocabulary is ``<pad> <bow> <eow> <unkc>``, one symbol per special word, then every
    character of the word vocabulary in code-point order; ``char_table[id]`` spells word ``id``.
    """

    def __init__(self, vocab: Vocabulary, char_embed_dim: int, filters: Sequence[tuple[int, int]],
                 highway_layers: int, max_word_chars: int) -> None:
        super().__init__()
        chars = sorted({c for w in vocab.words[len(SPECIALS):] for c in w})
        self.chars: tuple[str, ...] = _CHAR_SPECIALS + tuple(chars)
        self._char_ids = {c: i for i, c in enumerate(self.chars[len(_CHAR_SPECIALS):], len(_CHAR_SPECIALS))}
        longest = max((len(w) for w in vocab.words[len(SPECIALS):]), default=1) + 2
        widest = max(w for w, _ in filters)
        self.max_chars = max(widest, min(max_word_chars, longest))
        table = self._spell(vocab.words[len(SPECIALS):])
        specials = torch.zeros(len(SPECIALS), self.max_chars, dtype=torch.long)
        specials[:, 0] = _BOW
        specials[:, 1] = torch.arange(len(SPECIALS)) + 4
        specials[:, 2] = _EOW
        self.register_buffer("char_table", torch.cat([specials, table]), persistent=False)
        self.char_embed = nn.Embedding(len(self.chars), char_embed_dim, padding_idx=_PAD)
        self.convs = nn.ModuleList(nn.Conv1d(char_embed_dim, count, width) for width, count in filters)
        self.dim = sum(c for _, c in filters)
        self.highways = nn.ModuleList(_Highway(self.dim) for _ in range(highway_layers))

    def _spell(self, words: Sequence[str]) -> torch.Tensor:
        table = torch.zeros(len(words), self.max_chars, dtype=torch.long)
        keep = self.max_chars - 2
        for i, w in enumerate(words):
            ids = [_BOW] + [self._char_ids.get(c, _UNKC) for c in w[:keep]] + [_EOW]
            table[i, : len(ids)] = torch.tensor(ids)
        return table

    def embed_chars(self, char_ids: torch.Tensor) -> torch.Tensor:
        """Word vectors ``[N, dim]`` of spelled words ``[N, max_chars]``."""
        x = self.char_embed(char_ids).transpose(1, 2)
        x = torch.cat([torch.tanh(conv(x)).amax(dim=2) for conv in self.convs], dim=1)
        for hw in self.highways:
            x = hw(x)
        return x

    def embed_words(self, words: Sequence[str]) -> torch.Tensor:
        """Vectors of arbitrary words (characters never seen become ``<unkc>``); the specials as in the table.

        A word of the vocabulary gets exactly the vector its id gets.
        """
        ids = self._spell(words).to(self.char_table.device)
        for i, w in enumerate(words):
            if w in SPECIALS:
                ids[i] = self.char_table[SPECIALS.index(w)]
        return self.embed_chars(ids)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        uniq, inverse = torch.unique(ids, return_inverse=True)
        return self.embed_chars(self.char_table[uniq])[inverse]


class LstmLM(nn.Module):
    """Stacked LSTM LM, word or character-aware input embeddings (see the module docstring)."""

    def __init__(self, config: NeuralLMConfig, vocab: Vocabulary) -> None:
        super().__init__()
        self.config = config
        if config.char_aware:
            self.embed: nn.Module = CharWordEmbedding(vocab, config.char_embed_dim, config.char_filters,
                                                      config.highway_layers, config.max_word_chars)
            in_dim = self.embed.dim
        else:
            self.embed = nn.Embedding(config.vocab_size, config.embed_dim)
            nn.init.uniform_(self.embed.weight, -0.1, 0.1)
            in_dim = config.embed_dim
        self.drop = Dropout(config.dropout)
        self.lstm = nn.LSTM(in_dim, config.hidden_dim, config.layers, batch_first=True,
                            dropout=config.dropout if config.layers > 1 else 0.0)
        self.output = _output_layer(config, vocab, config.hidden_dim)
        if config.tie_embeddings:
            _tie(self.output, self.embed)

    def forward(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None,
                state: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Logits ``[B, T, V]`` (normalised log-probabilities with the class softmax) and the state ``(h, c)``
        (each ``[layers, B, hidden]``) after the last step.

        ``state`` (default zeros) continues from an earlier call; ``positions``/``attn_mask`` must be ``None``.
        """
        h, new_state = self.hidden(ids, positions=positions, attn_mask=attn_mask, state=state)
        return self.output(h), new_state

    def hidden(self, ids: torch.Tensor, *, positions: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None,
               state: tuple[torch.Tensor, torch.Tensor] | None = None,
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Like :meth:`forward`, but the states ``[B, T, H]`` that enter the output layer (no logits)."""
        if positions is not None or attn_mask is not None:
            raise ValueError("the LSTM LM takes no positions or attn_mask (it reads the sequence in order)")
        if ids.dim() != 2:
            raise ValueError(f"ids must be [B, T], got shape {tuple(ids.shape)}")
        # nn.LSTM's results, with the dropout between layers drawn faster on the CPU
        y, new_state = lstm(self.lstm, self.drop(self.embed(ids)), state)
        return self.drop(y), new_state

    def output_layers(self) -> list[nn.Module]:
        """The layers fine-tuning with frozen layers updates: the output projection (weight + bias), or the
        class softmax's class and word layers."""
        return _output_layers(self.output)


NeuralModel = TransformerLM | LstmLM


def build_model(config: NeuralLMConfig, vocab: Vocabulary) -> TransformerLM | LstmLM:
    """A freshly initialised model of ``config`` for ``vocab`` (seed torch first for reproducible weights).

    ``config.vocab_size`` 0 is filled in from the vocabulary (the model's ``.config`` has the real size); any
    other value must equal ``len(vocab)``. The class softmax bins the words on ``vocab.counts`` (a Zipf guess
    from the word order when the vocabulary has none); a checkpoint's saved classes replace them on loading.
    """
    if config.vocab_size == 0:
        if config.classes > len(vocab):
            raise ConfigError(f"classes={config.classes} is more than the vocabulary's {len(vocab)} words",
                              expected=f"at most {len(vocab)} classes (or 0: automatic)")
        config = config.replace(vocab_size=len(vocab))
    elif config.vocab_size != len(vocab):
        raise ConfigError(f"vocab_size={config.vocab_size} but the vocabulary has {len(vocab)} words")
    return TransformerLM(config, vocab) if config.arch == "transformer" else LstmLM(config, vocab)
