"""The neural LMs' dropout (``privasr.lm.neural.dropout``): torch's masks, values, gradients and generator state,
bit for bit, so that training gives the same losses for the same seed with the compiled masks and without."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from privasr.lm.neural import dropout as D
from privasr.lm.neural.models import NeuralLMConfig
from privasr.lm.neural.train import TrainOptions, train_lm

compiled = pytest.mark.skipif(D._compiled is None, reason="the compiled dropout masks are not built in this install")


@pytest.fixture
def torch_masks(monkeypatch: pytest.MonkeyPatch):
    """Within the test, the module behaves as an install without the compiled masks."""
    monkeypatch.setattr(D, "_compiled", None)
    D.fast_masks.cache_clear()
    yield
    D.fast_masks.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_check():
    D.fast_masks.cache_clear()
    yield
    D.fast_masks.cache_clear()


def _run(fn, seed: int):
    """fn() after seeding the default generator; also the generator state after it."""
    torch.manual_seed(seed)
    out = fn()
    return out, torch.get_rng_state()


def _assert_same_as_torch(x: torch.Tensor, p: float) -> None:
    """dropout(x, p) and F.dropout(x, p): the same values, gradients and generator state after them (the
    generator mid-block, not freshly seeded; x keeps its strides)."""
    weights = torch.randn(x.shape, dtype=x.dtype)
    res = []
    for fn in (lambda t: D.dropout(t, p), lambda t: F.dropout(t, p, True)):
        t = x.detach().requires_grad_()

        def step(fn=fn, t=t):
            torch.rand(3)
            y = fn(t)
            (y * weights).sum().backward()
            return y.detach()

        y, state = _run(step, 11)
        res.append((y, t.grad, state))
    (ya, ga, sa), (yb, gb, sb) = res
    assert torch.equal(ya, yb) and torch.equal(ga, gb) and torch.equal(sa, sb)


@compiled
def test_the_compiled_masks_pass_their_check():
    assert D.fast_masks() is True


@compiled
@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9, 1e-6, 1 - 1e-6])
@pytest.mark.parametrize("shape", [(1,), (623,), (624,), (625,), (3, 417), (2, 4, 33, 33), (5000,)])
def test_dropout_values_gradients_and_generator_state_are_torchs(p, shape):
    _assert_same_as_torch(torch.randn(shape), p)


@compiled
def test_long_runs_of_draws_stay_in_step_with_torch():
    """Many calls of many sizes in a row: the generator states never drift apart."""
    sizes = np.random.default_rng(0).integers(1, 3000, size=60)
    outs = []
    for fn in (D.dropout, lambda x, p: F.dropout(x, p, True)):
        torch.manual_seed(5)
        outs.append([fn(torch.ones(int(n)), 0.3) for n in sizes] + [torch.rand(4)])
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))


def test_outside_training_and_at_the_ends_it_is_torchs_dropout():
    x = torch.randn(4, 5)
    assert torch.equal(D.dropout(x, 0.5, training=False), x)
    assert torch.equal(D.dropout(x, 0.0), x)
    assert torch.equal(D.dropout(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        D.Dropout(1.5)


@compiled
@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 8).t(),  # transposed: torch's noise keeps these strides, filled in memory order
    lambda: torch.randn(5, 7, 3).permute(1, 0, 2),  # a batch_first view of a time-major LSTM output
    lambda: torch.randn(2, 3, 4, 5).permute(3, 1, 0, 2),
    lambda: torch.randn(9, 8)[::2],  # not dense: torch's noise is contiguous
    lambda: torch.randn(9, 8)[:, 1:5],
    lambda: torch.randn(6, 8, dtype=torch.float64),  # torch's dropout
    lambda: torch.randn(0, 3),
])
def test_strided_inputs_and_other_dtypes_give_torchs_result(make):
    _assert_same_as_torch(make(), 0.25)


@compiled
def test_dropout_module_matches_nn_dropout_and_saves_no_state():
    m, ref = D.Dropout(0.3), nn.Dropout(0.3)
    x = torch.randn(7, 9)
    assert torch.equal(_run(lambda: m(x), 4)[0], _run(lambda: ref(x), 4)[0])
    assert m.state_dict() == {} and "p=0.3" in repr(m)


@compiled
@pytest.mark.parametrize("shape", [(2, 4, 5, 8), (8, 4, 31, 32), (3, 2, 1, 16)])
def test_attention_is_torchs_attention(shape):
    base = [torch.randn(shape) for _ in range(3)]
    mask = torch.rand(shape[0], 1, shape[2], shape[2]) > 0.4
    mask[0, 0, 0] = False  # a row that may attend to nothing: zeros, as torch's safe softmax gives
    for kwargs in ({"is_causal": True}, {"attn_mask": mask}):
        res = []
        for fn in (lambda *a, **k: D.attention(*a, dropout_p=0.1, **k),
                   lambda *a, **k: F.scaled_dot_product_attention(*a, dropout_p=0.1, **k)):
            qkv = [t.clone().requires_grad_() for t in base]

            def step(fn=fn, qkv=qkv, kwargs=kwargs):
                y = fn(*qkv, **kwargs)
                (y * y).sum().backward()
                return y.detach()

            y, state = _run(step, 9)
            res.append((y, [t.grad for t in qkv], state))
        (ya, ga, sa), (yb, gb, sb) = res
        assert torch.equal(ya, yb) and torch.equal(sa, sb), kwargs
        assert all(torch.equal(a, b) for a, b in zip(ga, gb, strict=True)), kwargs
    # evaluation: no dropout, torch's kernel
    q = base[0]
    assert torch.equal(D.attention(q, q, q, dropout_p=0.1, training=False, is_causal=True),
                       F.scaled_dot_product_attention(q, q, q, is_causal=True))


@compiled
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("with_state", [False, True])
def test_lstm_is_nn_lstm(batch_first, with_state):
    torch.manual_seed(0)
    m = nn.LSTM(6, 10, 3, batch_first=batch_first, dropout=0.4)
    x0 = torch.randn(4, 7, 6) if batch_first else torch.randn(7, 4, 6)
    state = (torch.randn(3, 4, 10), torch.randn(3, 4, 10)) if with_state else None
    res = []
    for fn in (lambda x: D.lstm(m, x, state), lambda x: m(x, state)):
        m.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()

        def step(fn=fn, x=x):
            y, (h, c) = fn(x)
            (y.sin().sum() + h.sum() + c.cos().sum()).backward()
            return y.detach(), h.detach(), c.detach()

        out, st = _run(step, 3)
        res.append((out, x.grad, [p.grad.clone() for p in m.parameters()], st))
    (oa, xa, pa, sa), (ob, xb, pb, sb) = res
    assert all(torch.equal(a, b) for a, b in zip(oa, ob, strict=True))
    assert torch.equal(xa, xb) and torch.equal(sa, sb)
    assert all(torch.equal(a, b) for a, b in zip(pa, pb, strict=True))


def test_lstm_outside_training_is_the_module():
    m = nn.LSTM(3, 4, 2, dropout=0.5).eval()
    x = torch.randn(5, 2, 3)
    assert torch.equal(D.lstm(m, x)[0], m(x)[0])


@compiled
@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm"])
def test_training_gives_the_same_losses_and_weights_with_and_without_the_compiled_masks(preset, monkeypatch):
    sents = [["a", "b", "c"], ["b", "a"], ["c", "c", "a", "b", "a"], ["a"]] * 6
    cfg = NeuralLMConfig.preset(preset).replace(dropout=0.3)
    opts = TrainOptions(max_epochs=2, batch_size=4, lr=0.01)
    runs = []
    for off in (False, True):
        if off:
            monkeypatch.setattr(D, "_compiled", None)
        D.fast_masks.cache_clear()
        assert D.fast_masks() is not off
        r = train_lm(sents, sents[:4], cfg, opts, progress=False, seed=7)
        runs.append(r)
    a, b = runs
    assert [e["train_ppl"] for e in a.epochs] == [e["train_ppl"] for e in b.epochs]
    assert a.best_valid_ppl == b.best_valid_ppl
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_without_the_compiled_module_everything_is_torchs(torch_masks):
    assert D.fast_masks() is False
    x = torch.randn(50)
    assert torch.equal(_run(lambda: D.dropout(x, 0.5), 1)[0], _run(lambda: F.dropout(x, 0.5, True), 1)[0])


def test_a_module_that_draws_other_masks_is_not_used(monkeypatch):
    def wrong(out, state, keep, value):
        np.asarray(out)[...] = value  # keeps everything
        return bytes(state)

    monkeypatch.setattr(D, "_compiled", types.SimpleNamespace(bernoulli_scaled=wrong))
    assert D.fast_masks() is False
    x = torch.ones(1000)
    assert torch.equal(_run(lambda: D.dropout(x, 0.5), 1)[0], _run(lambda: F.dropout(x, 0.5, True), 1)[0])


@compiled
def test_the_compiled_function_refuses_bad_arguments():
    f = D._compiled.bernoulli_scaled
    state = torch.get_rng_state().numpy()
    with pytest.raises(TypeError, match="float32"):
        f(np.zeros(4), state, 0.5, 2.0)
    with pytest.raises((TypeError, BufferError, ValueError)):
        f(np.zeros(4, dtype=np.float32)[::2], state, 0.5, 2.0)  # not contiguous
    ro = np.zeros(4, dtype=np.float32)
    ro.flags.writeable = False
    with pytest.raises((TypeError, BufferError, ValueError)):
        f(ro, state, 0.5, 2.0)
    with pytest.raises(ValueError, match="5056 bytes"):
        f(np.zeros(4, dtype=np.float32), state[:100], 0.5, 2.0)
    for keep in (0.0, 1.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="keep"):
            f(np.zeros(4, dtype=np.float32), state, keep, 2.0)
    bad = state.copy()
    bad[8:12] = np.frombuffer(np.int32(0).tobytes(), dtype=np.uint8)
    with pytest.raises(ValueError, match="MT19937"):
        f(np.zeros(4, dtype=np.float32), bad, 0.5, 2.0)
    with pytest.raises(TypeError, match="4 arguments"):
        f(np.zeros(4, dtype=np.float32), state, 0.5)
    assert bytes(f(np.zeros(0, dtype=np.float32), state, 0.5, 2.0)) == bytes(state)  # no draws: as it was


@compiled
def test_lstm_leaves_packed_unbatched_and_malformed_inputs_to_the_module():
    m = nn.LSTM(3, 4, 2, dropout=0.5, batch_first=True)
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(2, 5, 3), [5, 2], batch_first=True)
    y, _ = _run(lambda: D.lstm(m, packed), 0)[0]
    y2, _ = _run(lambda: m(packed), 0)[0]
    assert torch.equal(y.data, y2.data)
    unbatched = torch.randn(5, 3)
    assert torch.equal(_run(lambda: D.lstm(m, unbatched)[0], 0)[0], _run(lambda: m(unbatched)[0], 0)[0])
    with pytest.raises(RuntimeError, match="input.size"):
        D.lstm(m, torch.randn(2, 5, 7))  # torch's own check of the input width
    with pytest.raises(RuntimeError, match="hidden"):
        D.lstm(m, torch.randn(2, 5, 3), (torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)))  # a state for 3, not 2
