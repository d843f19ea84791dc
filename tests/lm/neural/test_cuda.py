"""The CUDA paths of the neural LMs give the CPU's numbers: batched scoring (with and without a per-word bias),
checkpoints loaded onto the GPU, and the neural -> n-gram approximation. Skipped without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from privasr.lm.neural.approx import approximate_ngram  # noqa: E402
from privasr.lm.neural.checkpoint import save_checkpoint  # noqa: E402
from privasr.lm.neural.models import NeuralLMConfig, build_model  # noqa: E402
from privasr.lm.neural.scorer import NeuralLM  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

WORDS = [f"w{i}" for i in range(30)]
VOCAB = Vocabulary.build([WORDS])
TOL = 1e-5  # log10, on one device and across devices (the scorer turns cuDNN's TF32 off: it moved LSTM
# scores by up to 2e-5)
CROSS_TOL = TOL


def _model(preset: str) -> torch.nn.Module:
    torch.manual_seed(3)
    model = build_model(NeuralLMConfig.preset(preset), VOCAB)
    with torch.no_grad():
        model.output.weight.mul_(4.0)
    return model


def _sentences() -> list[list[str]]:
    rng = np.random.default_rng(5)
    base = [[str(w) for w in rng.choice(WORDS + ["oov"], size=int(rng.integers(0, 12)))] for _ in range(20)]
    return [s[:k] + ["w1"] for s in base for k in range(0, len(s) + 1, 3)] + [[]]


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm", "tiny-lstm-char"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_cuda_scoring_equals_cpu(preset: str, renormalize: bool) -> None:
    model = _model(preset)
    bias = np.random.default_rng(0).normal(0, 1, len(VOCAB))
    sents = _sentences()
    for kw in ({}, {"log_bias": bias, "renormalize": renormalize}):
        cpu = NeuralLM(model, VOCAB, **kw).score_batch(sents)
        gpu = NeuralLM(model, VOCAB, device="cuda", **kw).score_batch(sents)
        naive = NeuralLM(model, VOCAB, device="cuda", **kw).score_naive(sents)
        for a, b, c in zip(cpu, gpu, naive, strict=True):
            assert np.max(np.abs(a.logprobs - b.logprobs), initial=0) <= CROSS_TOL
            assert np.max(np.abs(b.logprobs - c.logprobs), initial=0) <= TOL
        model.cpu()


def test_checkpoint_loads_onto_cuda(tmp_path: Path) -> None:
    model = _model("tiny-transformer")
    save_checkpoint(tmp_path / "m.pt", model, VOCAB, model.config)
    lm = NeuralLM.from_checkpoint(tmp_path / "m.pt", device="cuda")
    assert next(lm.model.parameters()).device.type == "cuda"
    ref = NeuralLM(model.cpu(), VOCAB).score_batch(_sentences())
    for a, b in zip(ref, lm.score_batch(_sentences()), strict=True):
        assert np.max(np.abs(a.logprobs - b.logprobs), initial=0) <= CROSS_TOL


def test_exact_inference_turns_cudnn_tf32_off_and_restores_it() -> None:
    from privasr.lm.neural.scorer import exact_inference

    before = torch.backends.cudnn.allow_tf32
    with exact_inference("cuda"):
        assert not torch.backends.cudnn.allow_tf32 and torch.is_inference_mode_enabled()
    assert torch.backends.cudnn.allow_tf32 == before


def test_approximation_on_cuda_equals_cpu() -> None:
    model = _model("tiny-lstm")
    sents = [s for s in _sentences() if s]
    cpu = approximate_ngram(NeuralLM(model, VOCAB), sents, order=3)
    gpu = approximate_ngram(NeuralLM(model, VOCAB, device="cuda"), sents, order=3)
    model.cpu()
    probe = sents[:10]
    for a, b in zip(cpu.score_batch(probe), gpu.score_batch(probe), strict=True):
        assert np.max(np.abs(a.logprobs - b.logprobs), initial=0) <= CROSS_TOL
