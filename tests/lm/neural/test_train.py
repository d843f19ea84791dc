"""Training: perplexity goes down, resume is exact, frozen layers stay frozen, results and CLI."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.lm.neural.checkpoint import load_checkpoint  # noqa: E402
from privasr.lm.neural.models import NeuralLMConfig  # noqa: E402
from privasr.lm.neural.train import TrainOptions, load_run_config, parse_overrides, train_lm  # noqa: E402


def _corpus(n: int, seed: int, nouns: tuple[str, ...] = ("cat", "dog", "bird", "fish")) -> list[list[str]]:
    """A tiny grammar: strongly predictable word order, so a model can learn it in a few epochs."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        noun = rng.choice(nouns)
        verb = {"cat": "sleeps", "dog": "barks", "bird": "sings", "fish": "swims"}.get(noun, "waits")
        s = ["the", noun, verb]
        if rng.random() < 0.5:
            s += ["in", "the", rng.choice(["house", "garden"])]
        out.append(s)
    return out


TRAIN = _corpus(160, 1)
VALID = _corpus(30, 2)
FAST = TrainOptions(batch_size=16, max_epochs=3, lr=0.02, patience=0, schedule="constant")


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm", "tiny-lstm-char"])
def test_training_reduces_validation_perplexity(preset: str) -> None:
    res = train_lm(TRAIN, VALID, NeuralLMConfig.preset(preset), FAST, progress=False, seed=1)
    assert res.initial_valid_ppl > 8 and res.best_valid_ppl < 0.5 * res.initial_valid_ppl
    assert res.best_valid_ppl < 6.0  # uniform is 15; the grammar allows about 1.6
    assert len(res.epochs) == 3 and res.steps == 3 * 10
    assert res.epochs[-1]["train_ppl"] < res.epochs[0]["train_ppl"]
    assert res.tokens_per_s > 0 and not res.model.training
    assert res.best_valid_ppl == min(h["valid_ppl"] for h in res.history)


def test_results_checkpoints_and_sgd_cosine(tmp_path: Path) -> None:
    opts = FAST.replace(optimizer="sgd", lr=0.5, momentum=0.9, schedule="cosine", warmup_steps=3, valid_every=4,
                        max_vocab=10)
    res = train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-lstm"), opts, out_dir=tmp_path, seed=2,
                   progress=True)
    assert len(res.vocab) == 10 and res.metrics["train_oov_rate"] > 0
    assert not (tmp_path / "results.json").exists()  # the runner (privasr lm train-neural) writes it
    assert res.run["seed"] == 2 and res.run["train"]["optimizer"] == "sgd" and res.config.arch == "lstm"
    m = res.metrics
    assert len(m["train_ppl"]) == len(m["valid_ppl"]) == 3
    assert m["best_valid_ppl"] == min(h["valid_ppl"] for h in m["history"]) < m["valid_ppl_initial"]
    assert len(m["history"]) == 3 + 6  # epochs + every 4 steps not at an epoch end (steps 4, 8, 12, 16, 24, 28)
    assert m["tokens_per_s"] > 0 and m["steps"] == 30
    best_rec = next(h for h in res.history if h["valid_ppl"] == res.best_valid_ppl)
    assert (res.best_epoch, res.best_step) == (best_rec["epoch"], best_rec["step"])
    assert [h["epoch"] for h in res.history[:3]] == [0.4, 0.8, 1.0] and res.history[2]["step"] == 10
    best = load_checkpoint(tmp_path / "best.pt")
    x = torch.tensor([[1, 3, 4, 5]])
    assert torch.equal(best.model(x)[0], res.model(x)[0])
    last = load_checkpoint(tmp_path / "last.pt")
    assert last.train_state is not None and last.train_state["step"] == 30
    # cosine schedule ends near 0
    assert res.history[-1]["lr"] < 0.01


def test_early_stopping_and_max_steps() -> None:
    # a small training set and a large learning rate overfit quickly
    res = train_lm(TRAIN[:48], VALID, NeuralLMConfig.preset("tiny-lstm"),
                   FAST.replace(max_epochs=60, lr=0.1, patience=2), progress=False)
    assert res.stopped_early and len(res.epochs) < 60
    assert all(h["valid_ppl"] > res.best_valid_ppl for h in res.history[-2:])
    assert res.history[-3]["valid_ppl"] == res.best_valid_ppl
    res2 = train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-lstm"), FAST.replace(max_steps=7), progress=False)
    assert res2.steps == 7 and len(res2.epochs) == 0 and len(res2.history) == 0
    assert res2.best_valid_ppl == res2.metrics["final_valid_ppl"] < res2.initial_valid_ppl


@pytest.mark.parametrize("preset", ["tiny-transformer", "tiny-lstm-char"])
def test_resume_gives_the_same_model_as_an_uninterrupted_run(tmp_path: Path, preset: str) -> None:
    cfg = NeuralLMConfig.preset(preset).replace(dropout=0.3)  # dropout: the RNG state must be restored too
    opts = FAST.replace(valid_every=4, schedule="plateau", lr_decay=0.7)
    full = train_lm(TRAIN, VALID, cfg, opts, out_dir=tmp_path / "full", seed=5, progress=False)
    # interrupted once mid-epoch (max_steps) and once at an epoch end (max_epochs)
    part = tmp_path / "part"
    train_lm(TRAIN, VALID, cfg, opts.replace(max_steps=7), out_dir=part, seed=5, progress=False)
    train_lm(TRAIN, VALID, cfg, opts.replace(max_epochs=2), out_dir=part, seed=5, progress=False, resume=True)
    res = train_lm(TRAIN, VALID, cfg, opts, out_dir=part, seed=5, progress=False, resume=True)
    a = load_checkpoint(tmp_path / "full" / "last.pt")
    b = load_checkpoint(part / "last.pt")
    for k, v in a.model.state_dict().items():
        assert torch.equal(v, b.model.state_dict()[k]), k
    assert res.history == full.history and res.epochs == full.epochs
    assert res.best_valid_ppl == full.best_valid_ppl and res.steps == full.steps == 30
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, res.model.state_dict()[k]), k
    # a different seed gives a different model (the comparison above can fail)
    other = train_lm(TRAIN, VALID, cfg, opts.replace(max_epochs=1), seed=6, progress=False)
    assert other.history[0]["valid_ppl"] != full.history[0]["valid_ppl"]


def test_resume_errors(tmp_path: Path) -> None:
    cfg = NeuralLMConfig.preset("tiny-lstm")
    with pytest.raises(InputError, match="no such file"):
        train_lm(TRAIN, VALID, cfg, FAST, out_dir=tmp_path, resume=True, progress=False)
    train_lm(TRAIN, VALID, cfg, FAST.replace(max_epochs=1), out_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="lr"):
        train_lm(TRAIN, VALID, cfg, FAST.replace(lr=0.1), out_dir=tmp_path, resume=True, progress=False)
    with pytest.raises(ConfigError, match="seed"):
        train_lm(TRAIN, VALID, cfg, FAST, out_dir=tmp_path, resume=True, seed=9, progress=False)
    with pytest.raises(ConfigError):
        train_lm(TRAIN, VALID, cfg.replace(layers=1), FAST, out_dir=tmp_path, resume=True, progress=False)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pre")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-transformer").replace(dropout=0.1),
             FAST.replace(max_epochs=2), out_dir=out, progress=False)
    torch.set_num_threads(n)
    return out / "best.pt"


def test_frozen_layers_update_only_the_output_layer(pretrained: Path) -> None:
    ck = load_checkpoint(pretrained)
    before = _params(ck.model)
    new_text = _corpus(80, 7, nouns=("cat", "dog", "cow"))  # "cow" is not in the checkpoint's vocabulary
    res = train_lm(new_text, VALID, None, FAST.replace(max_epochs=2, lr=0.05), init=pretrained, freeze="output",
                   progress=False)
    after = _params(res.model)
    out_names = {n for n, _ in res.model.named_parameters() if n.startswith("output.")}
    assert out_names == {"output.weight", "output.bias"}
    for name, v in before.items():
        if name in out_names:
            assert not torch.equal(v, after[name]), name
        else:
            assert torch.equal(v, after[name]), name
    assert res.metrics["trainable_parameters"] == sum(after[n].numel() for n in out_names)
    # the new text was encoded with the checkpoint's vocabulary
    assert res.vocab == ck.vocab and "cow" not in res.vocab and res.metrics["train_oov_rate"] > 0
    # full fine-tuning changes the rest too
    full = train_lm(new_text, VALID, None, FAST.replace(max_epochs=1), init=ck, freeze="none", progress=False)
    changed = [n for n, v in _params(full.model).items() if not torch.equal(v, before[n])]
    assert len(changed) == len(before)


def test_fine_tuning_config_rules(pretrained: Path) -> None:
    ck = load_checkpoint(pretrained)
    res = train_lm(TRAIN, VALID, ck.config.replace(dropout=0.0), FAST.replace(max_epochs=1), init=ck,
                   progress=False)
    assert res.config.dropout == 0.0 and res.config.embed_dim == ck.config.embed_dim
    with pytest.raises(ConfigError, match="layers"):
        train_lm(TRAIN, VALID, ck.config.replace(layers=1), FAST, init=ck, progress=False)
    with pytest.raises(ConfigError, match="freeze"):
        train_lm(TRAIN, VALID, None, FAST, init=ck, freeze="encoder", progress=False)
    with pytest.raises(ConfigError):
        train_lm(TRAIN, VALID, None, FAST, progress=False)
    with pytest.raises(InputError, match="no sentences"):
        train_lm([], VALID, NeuralLMConfig.preset("tiny-lstm"), FAST, progress=False)


def test_run_config_from_file_and_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("preset: tiny-lstm\nmodel: {hidden_dim: 8}\ntrain: {lr: 0.05, batch_size: 4}\n")
    cfg, opts = load_run_config(p, overrides=["model.layers=1", "max_epochs=2"])
    assert (cfg.arch, cfg.hidden_dim, cfg.layers, opts.lr, opts.batch_size, opts.max_epochs) == \
        ("lstm", 8, 1, 0.05, 4, 2)
    cfg2, _ = load_run_config(p, preset="tiny-transformer")
    assert cfg2.arch == "transformer"
    assert parse_overrides(["tie_embeddings=true"]) == ({"tie_embeddings": True}, {})
    for bad in (["nokey"], ["bogus=1"], ["model.lr=1"], ["train.layers=2"]):
        with pytest.raises(ConfigError):
            parse_overrides(bad)
    (tmp_path / "bad.yaml").write_text("train: {lr: -1}\npreset: tiny-lstm\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_run_config(tmp_path / "bad.yaml")
    (tmp_path / "top.yaml").write_text("trian: {}\n")
    with pytest.raises(ConfigError, match="trian"):
        load_run_config(tmp_path / "top.yaml")
    with pytest.raises(ConfigError, match="preset"):
        load_run_config(None)
    init = NeuralLMConfig.preset("tiny-lstm")
    assert load_run_config(None, overrides=["dropout=0.2"], init_config=init)[0] == init.replace(dropout=0.2)
    with pytest.raises(ConfigError, match="architecture"):
        load_run_config(None, overrides=["layers=1"], init_config=init)


def test_cli_train_neural(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from privasr.cli.lm import app

    train = tmp_path / "train.txt.gz"
    with gzip.open(train, "wt") as f:
        f.write("\n".join(" ".join(s) for s in TRAIN) + "\n\n")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(" ".join(s) for s in VALID) + "\n")
    out = tmp_path / "run"
    args = ["train-neural", "--train", str(train), "--valid", str(valid), "--out", str(out), "--preset",
            "tiny-lstm", "--set", "max_epochs=1", "--set", "batch_size=16", "--seed", "3", "--no-progress"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads((out / "results.json").read_text())
    assert d["seed"] == 3 and d["data"]["train"]["sha256"] and len(d["metrics"]["valid_ppl"]) == 1
    r = CliRunner().invoke(app, [*args[:-5], "--set", "max_epochs=2", "--set", "batch_size=16", "--seed", "3",
                                 "--no-progress", "--resume"])
    assert r.exit_code == 0, r.output
    assert len(json.loads((out / "results.json").read_text())["metrics"]["valid_ppl"]) == 2
    ft = tmp_path / "ft"
    r = CliRunner().invoke(app, ["train-neural", "--train", str(valid), "--valid", str(valid), "--out", str(ft),
                                 "--init", str(out / "best.pt"), "--freeze", "output", "--set", "max_epochs=1",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    d = json.loads((ft / "results.json").read_text())
    assert d["config"]["freeze"] == "output" and d["config"]["init"] == str(out / "best.pt")
    r = CliRunner().invoke(app, ["train-neural", "--train", str(valid), "--valid", str(valid), "--out", str(ft),
                                 "--init", str(train), "--no-progress"])
    assert r.exit_code != 0 and isinstance(r.exception, InputError) and str(train) in str(r.exception)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_mixed_precision_training_and_resume(tmp_path: Path) -> None:
    cfg = NeuralLMConfig.preset("tiny-transformer")
    res = train_lm(TRAIN, VALID, cfg, FAST, out_dir=tmp_path, device="cuda", progress=False)
    assert res.best_valid_ppl < 0.5 * res.initial_valid_ppl
    assert next(res.model.parameters()).device.type == "cuda"
    assert next(res.model.parameters()).dtype == torch.float32  # autocast only, weights stay fp32
    more = train_lm(TRAIN, VALID, cfg, FAST.replace(max_epochs=4), out_dir=tmp_path, device="cuda",
                    progress=False, resume=True)
    assert more.steps == 40 and len(more.epochs) == 4
    assert load_checkpoint(tmp_path / "best.pt").model.output.weight.device.type == "cpu"


def test_cuda_unavailable_is_a_config_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ConfigError, match="CUDA"):
        train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-lstm"), FAST, device="cuda", progress=False)
    with pytest.raises(ConfigError, match="device"):
        train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-lstm"), FAST, device="tpu9", progress=False)


def test_losses_read_in_batches_give_the_same_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Losses read back every few steps (as on CUDA, where each read waits for the GPU) give the same training,
    the same per-epoch train perplexity and the same resume state as reading every step; a non-finite loss still
    stops the run naming its step."""
    from privasr.lm.neural import train as train_mod

    opts = FAST.replace(valid_every=4)
    cfg = NeuralLMConfig.preset("tiny-transformer")
    every = train_lm(TRAIN, VALID, cfg, opts, out_dir=tmp_path / "a", seed=3, progress=False)
    monkeypatch.setattr(train_mod, "_CPU_LOSS_READS", 7)
    batched = train_lm(TRAIN, VALID, cfg, opts, out_dir=tmp_path / "b", seed=3, progress=False)
    assert batched.metrics["train_ppl"] == every.metrics["train_ppl"]
    assert batched.metrics["history"] == every.metrics["history"]
    assert batched.metrics["train_tokens"] == every.metrics["train_tokens"]
    a = load_checkpoint(tmp_path / "a" / "last.pt").train_state
    b = load_checkpoint(tmp_path / "b" / "last.pt").train_state
    assert (a["loss_sum"], a["loss_tokens"]) == (b["loss_sum"], b["loss_tokens"])

    with pytest.raises(InputError, match=r"the training loss became (nan|inf) at step \d+"):
        train_lm(TRAIN, VALID, cfg, opts.replace(lr=1e30, clip_norm=0.0), seed=3, progress=False)


@pytest.mark.parametrize("rows", ["compiled", "torch"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize(("n", "v"), [(600, 300), (1, 300), (0, 300), (40, 7)])  # blocks; one row; none; v < 8
def test_fused_linear_nll_equals_cross_entropy(monkeypatch: pytest.MonkeyPatch, rows: str, bias: bool,
                                               frozen: bool, n: int, v: int) -> None:
    """The CPU loss that computes its gradients block by block gives cross_entropy's loss and gradients, also
    for targets the model finds very unlikely (logits far apart) and when the output layer is frozen: with the
    compiled rows and with torch's operations."""
    import torch.nn.functional as F

    from privasr.lm.neural import train

    if rows == "compiled" and train._nll is None:
        pytest.skip("privasr.lm.neural._nll is not built")
    if rows == "torch":
        monkeypatch.setattr(train, "_nll", None)
    g = torch.Generator().manual_seed(0)
    d = 16
    h = torch.randn(n, d, generator=g, requires_grad=True)
    w = (torch.randn(v, d, generator=g) * 3).requires_grad_(not frozen)
    b = torch.randn(v, generator=g).requires_grad_(not frozen) if bias else None
    t = torch.randint(0, v, (n,), generator=g)
    ours = train._LinearNll.apply(h, w, b, t, True)
    (ours * 0.5).backward()
    grads = [x.grad.clone() if x is not None and x.grad is not None else None for x in (h, w, b)]
    for x in (h, w, b):
        if x is not None:
            x.grad = None
    ref = F.cross_entropy(F.linear(h.double(), w.double(), None if b is None else b.double()), t, reduction="sum")
    (ref * 0.5).backward()
    assert torch.isfinite(ours) and abs(float(ours.detach()) - float(ref.detach())) <= 1e-5 * abs(float(ref.detach()))
    for ours_g, x in zip(grads, (h, w, b), strict=True):
        if x is None or not x.requires_grad:
            assert ours_g is None
        else:
            assert torch.allclose(ours_g, x.grad.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_fused_linear_nll_with_non_finite_logits_is_torch_s_answer(monkeypatch: pytest.MonkeyPatch,
                                                                    bad: float) -> None:
    """A block with a NaN or an infinity goes to torch's operations (the compiled rows give up on it), so the
    loss and gradients are what torch's path gives: the trainer then reports the non-finite loss."""
    from privasr.lm.neural import train

    def run() -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(1)
        h = torch.randn(300, 8, generator=g, requires_grad=True)  # two blocks: the second one holds the bad value
        w = torch.randn(50, 8, generator=g, requires_grad=True)
        b = torch.zeros(50, requires_grad=True)
        with torch.no_grad():
            h[280, 3] = bad
        loss = train._LinearNll.apply(h, w, b, torch.randint(0, 50, (300,), generator=g), True)
        loss.backward()
        return loss.detach(), h.grad, w.grad, b.grad

    got = run()
    monkeypatch.setattr(train, "_nll", None)
    want = run()
    assert not torch.isfinite(got[0])
    for a, e in zip(got, want, strict=True):
        assert torch.equal(a.isnan(), e.isnan())
        assert torch.allclose(a.nan_to_num(), e.nan_to_num(), rtol=1e-5, atol=1e-6)


def test_training_uses_the_fused_loss_and_validation_the_plain_one() -> None:
    from privasr.lm.neural.models import build_model
    from privasr.lm.neural.train import encode_sentences, make_batch, token_nll
    from privasr.lm.neural.vocab import Vocabulary

    vocab = Vocabulary.build(TRAIN)
    model = build_model(NeuralLMConfig.preset("tiny-transformer"), vocab).eval()
    x, y = make_batch(encode_sentences(vocab, TRAIN[:8], 64))
    fused = token_nll(model, x, y)
    with torch.no_grad():
        plain = token_nll(model, x, y)
    assert fused.grad_fn is not None and "LinearNll" in type(fused.grad_fn).__name__
    assert abs(float(fused.detach()) - float(plain)) <= 1e-5 * float(plain)


def test_fused_linear_nll_refuses_a_second_backward_pass() -> None:
    """Its backward pass scales the saved gradients in place, so a second one (retain_graph) would be wrong."""
    from privasr.lm.neural.train import _LinearNll

    h = torch.randn(5, 4, requires_grad=True)
    loss = _LinearNll.apply(h, torch.randn(7, 4, requires_grad=True), torch.zeros(7, requires_grad=True),
                            torch.tensor([0, 1, 2, 3, 6]), True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass"):
        loss.backward()
