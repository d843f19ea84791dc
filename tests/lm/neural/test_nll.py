"""The compiled softmax cross-entropy rows of the trainer's output layer (``privasr.lm.neural._nll``): the loss, the
gradient written in place of the logits and the bias gradient, against a float64 reference, on the AVX2 and the
scalar path, in one thread and several; refusals of bad buffers; and training with the rows against torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privasr.lm.neural import train
from privasr.lm.neural.models import NeuralLMConfig
from privasr.lm.neural.train import TrainOptions, train_lm

if train._nll is None:
    pytest.skip("privasr.lm.neural._nll is not built in this install", allow_module_level=True)
_nll = train._nll


def _case(n: int, v: int, scale: float = 3.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = (rng.standard_normal((n, v)) * scale).astype(np.float32)
    bias = rng.standard_normal(v).astype(np.float32)
    return z, bias, rng.integers(0, v, n)


def _reference(z: np.ndarray, bias: np.ndarray | None, t: np.ndarray) -> tuple[float, np.ndarray]:
    x = z.astype(np.float64) + (0.0 if bias is None else bias.astype(np.float64))
    x -= x.max(axis=1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=1, keepdims=True)
    rows = np.arange(len(t))
    loss = float(-np.log(p[rows, t]).sum())
    p[rows, t] -= 1.0
    return loss, p


@pytest.mark.parametrize("simd", [True, False])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("v", [1, 7, 8, 31, 32, 33, 300, 8803])
@pytest.mark.parametrize("with_bias", [True, False])
def test_rows_equal_the_float64_softmax_cross_entropy(simd: bool, threads: int, v: int, with_bias: bool) -> None:
    z, bias, t = _case(5, v)
    b = bias if with_bias else None
    want_loss, want_grad = _reference(z, b, t)
    gbias = np.full(v, 0.25, np.float32)  # the rows' column sums are added to what is there
    got = z.copy()
    loss = _nll.nll_rows(got, v, b, t, gbias, threads, simd)
    assert loss == pytest.approx(want_loss, rel=1e-6, abs=1e-6)
    # float32 sums over up to 8803 terms: torch's float32 softmax is off by as much
    np.testing.assert_allclose(got, want_grad, rtol=5e-5, atol=1e-6)
    np.testing.assert_allclose(gbias, 0.25 + want_grad.sum(axis=0), rtol=5e-5, atol=1e-6)


def test_the_avx2_exponential_is_as_accurate_as_torch_s() -> None:
    """Softmax probabilities (targets aside: their ``p - 1`` cancels) within torch float32's own error of the
    float64 values, for logits spread over 90 nats."""
    z, bias, t = _case(64, 8803, scale=30.0, seed=3)
    got = z.copy()
    _nll.nll_rows(got, z.shape[1], bias, t, None, 2)
    x = torch.from_numpy(z).double() + torch.from_numpy(bias).double()
    p = torch.softmax(x, 1)
    keep = p > 1e-30
    keep[torch.arange(64), torch.from_numpy(t)] = False
    ours = ((torch.from_numpy(got).double() - p).abs() / p)[keep].max()
    torch32 = ((torch.softmax(x.float(), 1).double() - p).abs() / p)[keep].max()
    assert ours <= 1.5 * torch32 + 1e-7


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("simd", [True, False])
def test_a_non_finite_value_returns_none_and_leaves_the_bias_gradient(bad: float, simd: bool) -> None:
    z, bias, t = _case(6, 40)
    z[4, 17] = bad
    gbias = np.ones(40, np.float32)
    assert _nll.nll_rows(z, 40, bias, t, gbias, 2, simd) is None
    assert np.array_equal(gbias, np.ones(40, np.float32))


def test_no_rows_give_zero() -> None:
    assert _nll.nll_rows(np.zeros((0, 5), np.float32), 5, None, np.zeros(0, np.int64), None, 2) == 0.0


@pytest.mark.parametrize(("args", "error", "match"), [
    ((np.zeros((2, 4)), 4, None, np.zeros(2, np.int64), None, 1), TypeError, "z must hold float32"),
    ((np.zeros((2, 4), np.float32)[:, ::2], 2, None, np.zeros(2, np.int64), None, 1), TypeError, "C-contiguous"),
    ((np.zeros((2, 4), np.float32), 4, None, np.zeros(2, np.int32), None, 1), TypeError, "targets must hold int64"),
    ((np.zeros((2, 4), np.float32), 4, np.zeros(4), np.zeros(2, np.int64), None, 1), TypeError,
     "bias must hold float32"),
    ((np.zeros((2, 4), np.float32), 5, None, np.zeros(2, np.int64), None, 1), ValueError, "2 x 5 floats, not 8"),
    ((np.zeros((2, 4), np.float32), 4, np.zeros(3, np.float32), np.zeros(2, np.int64), None, 1), ValueError,
     "v = 4 floats"),
    ((np.zeros((2, 4), np.float32), 4, None, np.zeros(2, np.int64), np.zeros(5, np.float32), 1), ValueError,
     "v = 4 floats"),
    ((np.zeros((2, 4), np.float32), 4, None, np.array([0, 4]), None, 1), IndexError, "target 4 of row 1"),
    ((np.zeros((2, 4), np.float32), 4, None, np.array([-1, 0]), None, 1), IndexError, "target -1 of row 0"),
    ((np.zeros((0, 4), np.float32), 0, None, np.zeros(0, np.int64), None, 1), ValueError, "must be positive"),
    ((np.zeros((2, 4), np.float32), 4, None, np.zeros(2, np.int64)), TypeError, "argument"),
])
def test_bad_buffers_are_refused(args: tuple, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        _nll.nll_rows(*args)


def test_a_read_only_buffer_is_refused_and_nothing_is_written() -> None:
    z = np.ones((2, 4), np.float32)
    z.flags.writeable = False
    with pytest.raises(TypeError, match="z must be a C-contiguous writable buffer"):
        _nll.nll_rows(z, 4, None, np.zeros(2, np.int64), None, 1)
    gbias = np.ones(4, np.float32)
    gbias.flags.writeable = False
    with pytest.raises(TypeError, match="gbias must be a C-contiguous writable buffer"):
        _nll.nll_rows(np.ones((2, 4), np.float32), 4, None, np.zeros(2, np.int64), gbias, 1)
    assert np.array_equal(z, np.ones((2, 4), np.float32))


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm"])
def test_training_with_the_compiled_rows_gives_torch_s_losses_to_float_rounding(
        preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sents = [["a", "b", "c"], ["b", "a"], ["c", "c", "a", "b", "a"], ["a"]] * 6
    cfg = NeuralLMConfig.preset(preset).replace(dropout=0.3)
    opts = TrainOptions(max_epochs=2, batch_size=4, lr=0.01)
    compiled = train_lm(sents, sents[:4], cfg, opts, progress=False, seed=7)
    monkeypatch.setattr(train, "_nll", None)
    plain = train_lm(sents, sents[:4], cfg, opts, progress=False, seed=7)
    assert len(compiled.epochs) == len(plain.epochs) == 2
    for a, b in zip(compiled.epochs, plain.epochs, strict=True):
        assert a["train_ppl"] == pytest.approx(b["train_ppl"], rel=1e-5)
        assert a["valid_ppl"] == pytest.approx(b["valid_ppl"], rel=1e-5)
    sa, sb = compiled.model.state_dict(), plain.model.state_dict()
    if preset == "tiny-transformer":
        # the attention's key bias has a zero gradient in exact arithmetic (a softmax does not see a constant
        # added to all of a row's scores), so Adam turns its rounding noise into steps of the learning rate
        d = cfg.embed_dim
        for k in [k for k in sa if k.endswith("attn.qkv.bias")]:
            sa[k], sb[k] = torch.cat((sa[k][:d], sa[k][2 * d:])), torch.cat((sb[k][:d], sb[k][2 * d:]))
    assert all(torch.allclose(sa[k], sb[k], rtol=1e-4, atol=1e-6) for k in sa)
