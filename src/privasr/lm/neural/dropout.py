"""Dropout for the neural LMs: torch's masks, bit for bit, drawn several times faster on the CPU.

torch's CPU dropout draws its mask one element at a time (``bernoulli_``: 8-14 ns an element, a tenth of a
small Transformer's training step). The compiled :mod:`privasr.lm.neural._dropout` draws the same masks from the
same generator state (torch's MT19937, run a block at a time) at about 1.3 ns an element and leaves the generator
where torch's draws would have. So a model trained with :func:`dropout`, :class:`Dropout`, :func:`attention` and
:func:`lstm` gets the losses and weights it would get with ``F.dropout``, ``nn.Dropout``,
``F.scaled_dot_product_attention`` and a stacked ``nn.LSTM`` for the same seed (``tests/lm/neural/test_dropout.py``
checks that; the module checks itself against torch's ``bernoulli_`` once before it is used).

Everywhere else (no compiled module, a check that fails, CUDA, other dtypes, evaluation) these functions are
torch's own. A draw reads the default generator's state and sets it back afterwards, so two Python threads must
not draw from it at once (torch's own draws lock it).

>>> x = torch.ones(4, 8)
>>> _ = torch.manual_seed(0)
>>> a = dropout(x, 0.5, training=True)
>>> _ = torch.manual_seed(0)
>>> torch.equal(a, F.dropout(x, 0.5, training=True))
True
>>> torch.equal(dropout(x, 0.5, training=False), x)
True
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

try:
    from privasr.lm.neural import _dropout as _compiled
except ImportError:  # built without a C compiler: torch's dropout
    _compiled = None

__all__ = ["dropout", "Dropout", "attention", "lstm", "fast_masks"]


@functools.cache
def fast_masks() -> bool:
    """Whether the compiled masks are in use: the module is built and draws what torch's ``bernoulli_`` draws
    (checked once, on a private generator, for a few sizes and probabilities).

    >>> isinstance(fast_masks(), bool)
    True
    """
    if _compiled is None:
        return False
    try:
        for keep, n in ((0.9, 1), (0.8, 1250), (0.5, 3001)):
            gen = torch.Generator().manual_seed(12345 + n)
            state = gen.get_state()
            want = torch.empty(n).bernoulli_(keep, generator=gen).div_(keep)
            got = torch.empty(n)
            after = _compiled.bernoulli_scaled(got.numpy(), state.numpy(), keep, _scale(keep))
            if not torch.equal(got, want) or bytes(after) != bytes(gen.get_state().numpy()):
                return False
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


@functools.cache
def _scale(keep: float) -> float:
    """``1 / keep`` as torch's ``noise.div_(keep)`` computes it in float32 (once per probability)."""
    return float(torch.ones((), dtype=torch.float32).div_(keep))


def _ours(p: float, *tensors: torch.Tensor) -> bool:
    """Whether the compiled masks serve: a dropout probability strictly between 0 and 1, CPU float32 tensors."""
    return (0.0 < p < 1.0 and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and fast_masks())


def _noise(x: torch.Tensor, p: float) -> torch.Tensor | None:
    """torch's dropout noise for ``x`` (``bernoulli_(1 - p) / (1 - p)``), drawn from the default generator;
    ``None`` where the noise tensor would not be dense (torch's dropout then draws it).

    torch makes the noise with ``empty_like(x)`` (``x``'s strides where ``x`` is dense, e.g. a transposed LSTM
    output; else contiguous) and fills it in memory order; so is the noise filled here, through a flat view of
    its storage."""
    keep = 1.0 - p
    noise = torch.empty_like(x)
    if noise.storage_offset() != 0 or noise.untyped_storage().nbytes() != noise.numel() * noise.element_size():
        return None
    flat = noise.as_strided((noise.numel(),), (1,))
    state = torch.get_rng_state()
    after = _compiled.bernoulli_scaled(flat.numpy(), state.numpy(), keep, _scale(keep))  # type: ignore[union-attr]
    torch.set_rng_state(torch.frombuffer(bytearray(after), dtype=torch.uint8))
    return noise


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``F.dropout(x, p, training)``: the same values, gradients and generator state after it.

    >>> _ = torch.manual_seed(1)
    >>> y = dropout(torch.ones(1000), 0.2)
    >>> round(float((y == 0).float().mean()), 1), float(y.max())
    (0.2, 1.25)
    """
    if training and x.numel() > 0 and _ours(p, x):
        noise = _noise(x, p)
        if noise is not None:
            return x * noise
    return F.dropout(x, p, training)


class Dropout(nn.Module):
    """``nn.Dropout`` through :func:`dropout` (no parameters or buffers: checkpoints do not change).

    >>> m = Dropout(0.1).eval()
    >>> torch.equal(m(torch.ones(3)), torch.ones(3))
    True
    """

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


@functools.cache
def _causal_bias(t: int, s: int) -> torch.Tensor:
    """The additive mask torch's attention builds for ``is_causal``: 0 on and below the diagonal, -inf above."""
    allowed = torch.ones(t, s, dtype=torch.bool).tril()
    return torch.where(allowed.logical_not(), -math.inf, 0.0).to(torch.float32)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, dropout_p: float = 0.0, training: bool = True,
              attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p if training else 0, is_causal)``.

    With dropout on the CPU torch computes attention on its reference ("math") path; this is that path's
    arithmetic, operation for operation, with the attention weights' dropout from :func:`dropout` (and the causal
    mask built once per length). Elsewhere it calls torch.

    >>> q = k = v = torch.randn(2, 4, 5, 8)
    >>> _ = torch.manual_seed(3)
    >>> a = attention(q, k, v, dropout_p=0.1, is_causal=True)
    >>> _ = torch.manual_seed(3)
    >>> torch.equal(a, F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True))
    True
    """
    p = dropout_p if training else 0.0
    ours = (q.dim() == k.dim() == v.dim() == 4 and q.shape[:2] == k.shape[:2] == v.shape[:2]
            and k.shape[-1] == q.shape[-1] and k.shape[-2] == v.shape[-2] and q.numel() > 0 and k.numel() > 0
            and (attn_mask is None or (attn_mask.dtype == torch.bool and not is_causal)) and _ours(p, q, k, v))
    if not ours:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=is_causal)
    factor = math.sqrt(1.0 / math.sqrt(q.shape[-1]))  # torch scales q and k by the root of 1 / sqrt(E) each
    attn = torch.matmul(q * factor, k.transpose(-2, -1) * factor)
    if is_causal:
        attn.add_(_causal_bias(q.shape[-2], k.shape[-2]))
        attn = attn.softmax(-1)  # every row may attend to its own position: torch's safe softmax is the softmax
    else:
        if attn_mask is not None:
            attn.add_(torch.where(attn_mask.logical_not(), -math.inf, 0.0).to(attn.dtype))
        attn = torch.ops.aten._safe_softmax(attn, -1)  # a row that may attend to nothing: zeros, not NaN
    return torch.matmul(dropout(attn, p), v)


_State = tuple[torch.Tensor, torch.Tensor]


def lstm(module: nn.LSTM, x: torch.Tensor, state: _State | None = None) -> tuple[torch.Tensor, _State]:
    """``module(x, state)`` for a stacked ``nn.LSTM``: the same outputs, gradients and generator state.

    In training with dropout between the layers torch applies ``F.dropout`` to each layer's output before the next
    layer; on the CPU this runs the layers one at a time (torch's own LSTM kernel, as ``nn.LSTM`` calls it) with
    :func:`dropout` between them. Otherwise (evaluation, one layer, no dropout, CUDA, a bidirectional or projected
    LSTM, a packed or unbatched input) it calls ``module``.

    >>> m = nn.LSTM(4, 6, 2, batch_first=True, dropout=0.3)
    >>> x = torch.randn(2, 5, 4)
    >>> _ = torch.manual_seed(0)
    >>> y, (h, c) = lstm(m, x)
    >>> _ = torch.manual_seed(0)
    >>> y2, (h2, c2) = m(x)
    >>> torch.equal(y, y2) and torch.equal(h, h2) and torch.equal(c, c2)
    True
    """
    layers, p = module.num_layers, module.dropout
    plain = isinstance(x, torch.Tensor) and x.dim() == 3  # not packed, not unbatched
    batch = (x.shape[0] if module.batch_first else x.shape[1]) if plain else 0
    shape = (layers, batch, module.hidden_size)
    if not (module.training and layers > 1 and plain and x.shape[-1] == module.input_size
            and not module.bidirectional and not module.proj_size and module.bias
            and _ours(p, x, *module._flat_weights, *(state or ()))
            and (state is None or all(s.shape == shape for s in state))):
        return module(x, state)  # torch's LSTM, and its checks of the input
    if state is None:
        zeros = torch.zeros(shape, dtype=x.dtype, device=x.device)
        state = (zeros, zeros)
    weights = module._flat_weights
    # nn.LSTM.forward's own call, here for one layer: (input, hx, weights, bias, layers, dropout, train,
    # bidirectional, batch_first)
    run = torch._VF.lstm  # type: ignore[attr-defined]
    hs, cs = [], []
    y = x
    for layer in range(layers):
        hx = (state[0][layer:layer + 1], state[1][layer:layer + 1])
        y, h, c = run(y, hx, weights[4 * layer:4 * layer + 4], True, 1, 0.0, True, False, module.batch_first)
        hs.append(h)
        cs.append(c)
        if layer < layers - 1:
            y = dropout(y, p)
    return y, (torch.cat(hs), torch.cat(cs))
