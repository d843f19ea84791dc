"""Exported neural LMs (ONNX / TorchScript, fp32 / int8) score as the PyTorch model does.

Tolerances (natural log, per sentence, ``</s>`` included): fp32 exports within ``FP32_TOL`` = 1e-4 nats of
:class:`NeuralLM` (they differ by float32 rounding only); int8 exports within ``INT8_TOL`` = 0.2 nats on these
tiny random models (the quantisation error of the weights and activations; the WER change on real N-best lists
is measured by the rescoring configs, docs/device.md).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from privasr.errors import InputError  # noqa: E402
from privasr.lm.neural.checkpoint import save_checkpoint  # noqa: E402
from privasr.lm.neural.export import (  # noqa: E402
    OnnxNeuralLM,
    TorchScriptNeuralLM,
    export_checkpoint,
    export_lm,
    load_exported,
)
from privasr.lm.neural.models import NeuralLMConfig, build_model  # noqa: E402
from privasr.lm.neural.scorer import NeuralLM  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402

FP32_TOL = 1e-4
INT8_TOL = 0.2
TEXT = [["the", "cat", "sat", "on", "the", "mat"], ["a", "dog", "sat"], ["the", "dog", "ran", "to", "a", "cat"],
        ["cats", "and", "dogs"], ["on", "the", "mat", "a", "cat", "sat"]]
SENTS = [["the", "cat", "sat"], ["the", "cat", "ran"], ["the", "cat", "sat", "on", "a", "mat"],
         ["zebra", "sat", "the"], [], ["dogs"], ["the", "cat", "sat"], ["a", "dog", "ran", "to", "the", "mat", "and"]]
PRESETS = ["tiny-transformer", "tiny-lstm", "tiny-lstm-class", "tiny-lstm-char"]


def _model(preset: str, scale: float = 3.0, **changes):
    vocab = Vocabulary.build(TEXT, min_count=2)
    torch.manual_seed(1)
    cfg = NeuralLMConfig.preset(preset).replace(**changes)
    model = build_model(cfg, vocab)
    with torch.no_grad():  # sharper distributions than the initialisation (fp32 checks)
        for p in model.parameters():
            p.mul_(scale)
    return model, vocab


def _ln(scores) -> np.ndarray:
    return np.array([s.ln_total for s in scores])


def _bias(vocab: Vocabulary) -> np.ndarray:
    rng = np.random.default_rng(0)
    b = rng.normal(0.0, 1.0, len(vocab))
    b[vocab.index("cat")] = 2.0
    return b


@pytest.mark.parametrize("preset", PRESETS)
def test_onnx_fp32_matches_pytorch_with_and_without_bias(tmp_path, preset):
    model, vocab = _model(preset)
    export_lm(model, vocab, tmp_path / "exp", to="onnx")
    ref, got = NeuralLM(model, vocab), load_exported(tmp_path / "exp", batch_tokens=16)
    assert isinstance(got, OnnxNeuralLM)
    r, g = ref.score_batch(SENTS), got.score_batch(SENTS)
    assert np.abs(_ln(r) - _ln(g)).max() < FP32_TOL
    assert [x.tokens for x in r] == [x.tokens for x in g]
    assert [x.oov.tolist() for x in r] == [x.oov.tolist() for x in g]
    bias = _bias(vocab)
    for renorm in (False, True):
        rb, gb = ref.with_bias(bias, renormalize=renorm), got.with_bias(bias, renormalize=renorm)
        diff = np.abs(_ln(rb.score_batch(SENTS)) - _ln(gb.score_batch(SENTS)))
        assert diff.max() < FP32_TOL, (renorm, diff)
        # the bias changes the scores (the comparison is not vacuous)
        assert np.abs(_ln(gb.score_batch(SENTS)) - _ln(g)).max() > 0.1
    # without eos too
    r2, g2 = ref.score_batch(SENTS, eos=False), got.score_batch(SENTS, eos=False)
    assert np.abs(_ln(r2) - _ln(g2)).max() < FP32_TOL


def test_with_bias_default_is_unnormalised_like_neurallm(tmp_path):
    model, vocab = _model("tiny-transformer")
    got = load_exported(export_lm(model, vocab, tmp_path / "e").folder)
    b = np.zeros(len(vocab))
    b[vocab.index("cat")] = np.log(4.0)
    diff = got.with_bias(b).score(["cat"]).logprobs[0] - got.score(["cat"]).logprobs[0]
    assert abs(diff - np.log10(4.0)) < 1e-6
    assert got.with_bias(b).renormalize is False and got.with_bias(b, renormalize=True).renormalize is True


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm-class"])
def test_learned_positions_and_tied_embeddings(tmp_path, preset):
    changes = {"positions": "learned", "tie_embeddings": True} if preset == "tiny-transformer" else \
        {"tie_embeddings": True, "embed_dim": 24}
    model, vocab = _model(preset, **changes)
    got = load_exported(export_lm(model, vocab, tmp_path / "e").folder)
    assert np.abs(_ln(NeuralLM(model, vocab).score_batch(SENTS)) - _ln(got.score_batch(SENTS))).max() < FP32_TOL


@pytest.mark.parametrize(("preset", "per_channel"), [("tiny-transformer", True), ("tiny-transformer", False),
                                                     ("tiny-lstm", True), ("tiny-lstm-class", True)])
def test_int8_onnx_is_quantised_and_close(tmp_path, preset, per_channel):
    # initialisation-scale weights: int8's error grows with the logits' range (about 0.1 nats per sentence on
    # the real 12k-word model, docs/device.md)
    model, vocab = _model(preset, scale=1.0)
    fp32 = export_lm(model, vocab, tmp_path / "f", to="onnx")
    q = export_lm(model, vocab, tmp_path / "q", to="onnx", int8=True, per_channel=per_channel)
    meta = json.loads((tmp_path / "q" / "meta.json").read_text())
    assert meta["int8"] is True and "MatMul" in meta["quantized_ops"] and meta["per_channel"] is per_channel
    import onnx

    ops = {n.op_type for n in onnx.load(str(q.folder / "model.onnx")).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops  # the size ratio is measured on the real model
    assert "MatMulInteger" not in {n.op_type for n in onnx.load(str(fp32.folder / "model.onnx")).graph.node}
    ref = _ln(NeuralLM(model, vocab).score_batch(SENTS))
    got = load_exported(tmp_path / "q")
    diff = np.abs(ref - _ln(got.score_batch(SENTS)))
    assert diff.max() < INT8_TOL, diff
    assert diff.max() > 0  # the weights really are quantised
    renorm = np.abs(_ln(NeuralLM(model, vocab).with_bias(_bias(vocab), renormalize=True).score_batch(SENTS))
                    - _ln(got.with_bias(_bias(vocab), renormalize=True).score_batch(SENTS)))
    assert renorm.max() < INT8_TOL


@pytest.mark.parametrize(("preset", "int8"), [("tiny-lstm", False), ("tiny-lstm", True), ("tiny-transformer", True),
                                            ("tiny-transformer", False)])
def test_torchscript_export(tmp_path, preset, int8):
    model, vocab = _model(preset, scale=1.0 if int8 else 3.0)
    export_lm(model, vocab, tmp_path / "t", to="torchscript", int8=int8)
    got = load_exported(tmp_path / "t")
    assert isinstance(got, TorchScriptNeuralLM) and got.model_path.name == "model.pt"
    diff = np.abs(_ln(NeuralLM(model, vocab).score_batch(SENTS)) - _ln(got.score_batch(SENTS)))
    assert diff.max() < (INT8_TOL if int8 else FP32_TOL)


def test_export_checkpoint_records_source_and_verifies_files(tmp_path):
    model, vocab = _model("tiny-transformer")
    ck = tmp_path / "lm.pt"
    save_checkpoint(ck, model, vocab, model.config)
    info = export_checkpoint(ck, tmp_path / "e", int8=True)
    assert info.meta["source"]["checkpoint"] == str(ck) and len(info.meta["source"]["sha256"]) == 64
    with open(tmp_path / "e" / "model.onnx", "ab") as f:
        f.write(b"x")
    with pytest.raises(InputError, match="sha256"):
        load_exported(tmp_path / "e")
    with pytest.raises(InputError, match="meta.json"):
        load_exported(tmp_path)
    with pytest.raises(InputError, match="not a privasr neural LM checkpoint|cannot read"):
        export_checkpoint(tmp_path / "e" / "vocab.json", tmp_path / "x")


def test_bad_bias_and_sentences(tmp_path):
    model, vocab = _model("tiny-transformer")
    got = load_exported(export_lm(model, vocab, tmp_path / "e").folder)
    with pytest.raises(InputError, match="log_bias"):
        got.with_bias(np.zeros(3))
    with pytest.raises(InputError, match="string"):
        got.score_batch("the cat")
    with pytest.raises(InputError, match="bos"):
        got.score_batch([["a"]], bos=False)


def test_cli_export_and_bad_inputs(tmp_path, capsys):
    from privasr.cli import main

    model, vocab = _model("tiny-lstm-class")
    ck = tmp_path / "lm.pt"
    save_checkpoint(ck, model, vocab, model.config)
    assert main(["lm", "export", str(ck), "--to", "onnx", "--int8", "--out", str(tmp_path / "q")]) == 0
    meta = json.loads((tmp_path / "q" / "meta.json").read_text())
    assert meta["int8"] and meta["per_channel"] and meta["softmax"] == "class"
    assert meta["source"]["checkpoint"] == str(ck)
    assert main(["lm", "export", str(ck), "--int8", "--per-tensor", "--out", str(tmp_path / "p")]) == 0
    assert json.loads((tmp_path / "p" / "meta.json").read_text())["per_channel"] is False
    assert main(["lm", "export", str(ck), "--to", "torchscript", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "model.pt").is_file()
    capsys.readouterr()
    (tmp_path / "taken").write_text("a file\n")
    (tmp_path / "notck.pt").write_text("not a checkpoint\n")
    for args in (["lm", "export", str(tmp_path / "notck.pt"), "--out", str(tmp_path / "x")],
                 ["lm", "export", str(tmp_path / "missing.pt"), "--out", str(tmp_path / "x")],
                 ["lm", "export", str(ck), "--out", str(tmp_path / "taken")],
                 ["lm", "export", str(ck), "--out", str(tmp_path / "taken" / "sub")],
                 ["lm", "export", str(ck), "--to", "tflite", "--out", str(tmp_path / "x")],
                 ["lm", "export", str(ck), "--per-channel", "--out", str(tmp_path / "x")],
                 ["lm", "export", str(ck), "--per-tensor", "--out", str(tmp_path / "x")]):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error:") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_rescore_lm_spec_onnx(tmp_path):
    from privasr.config import Context, from_mapping
    from privasr.errors import ConfigError
    from privasr.rescore.lms import LMSettings, build_lm

    model, vocab = _model("tiny-transformer")
    export_lm(model, vocab, tmp_path / "e", int8=True)
    s = from_mapping(LMSettings, {"onnx": str(tmp_path / "e")}, "lms.n", Context(True))
    lm, info = build_lm(s.spec("n"), None)
    assert isinstance(lm, OnnxNeuralLM) and info["int8"] is True and info["model_bytes"] > 0
    assert lm.threads == 1 and len(lm.score_batch(SENTS)) == len(SENTS)
    s2 = from_mapping(LMSettings, {"onnx": {"dir": str(tmp_path / "e"), "threads": 2}}, "lms.n", Context(True))
    assert s2.spec("n").to_dict()["onnx"]["threads"] == 2
    with pytest.raises(ConfigError, match="lms.n"):
        from_mapping(LMSettings, {"onnx": str(tmp_path / "nope")}, "lms.n", Context(True))
    with pytest.raises(ConfigError, match="exactly one"):
        from_mapping(LMSettings, {"onnx": str(tmp_path / "e"), "arpa": "x.arpa"}, "lms.n", Context(False))
