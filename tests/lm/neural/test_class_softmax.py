"""The class-factored softmax (paper 003): normalisation, the targets-only path, frequency binning, training,
checkpoints, fast scoring with and without a per-word bias, frozen layers, the ARPA approximation, FedLM and
config errors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402, N812

from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.lm.neural.approx import ModelSource, approximate_ngram, check_normalised  # noqa: E402
from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from privasr.lm.neural.models import (  # noqa: E402
    PRESETS,
    ClassSoftmax,
    NeuralLMConfig,
    build_model,
    frequency_classes,
)
from privasr.lm.neural.scorer import NeuralLM  # noqa: E402
from privasr.lm.neural.train import (  # noqa: E402
    TrainOptions,
    encode_sentences,
    evaluate_ppl,
    load_run_config,
    make_batch,
    token_nll,
    train_lm,
)
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402

TOL = 1e-5  # log10 for scores, natural log for log-probabilities
WORDS = [f"w{i}" for i in range(40)]
# a Zipf-like text: the frequency bins differ in size
ZIPF = [[w for w, k in zip(WORDS, range(40), strict=True) for _ in range(max(1, 40 // (k + 1)))]]
VOCAB = Vocabulary.build(ZIPF)
CLASS_PRESETS = {"lstm": ("tiny-lstm-class", {}), "transformer": ("tiny-transformer", {"softmax": "class"}),
                 "lstm-tied": ("tiny-lstm-class", {"tie_embeddings": True, "embed_dim": 24, "classes": 5})}


def _model(kind: str, vocab: Vocabulary = VOCAB, seed: int = 7) -> torch.nn.Module:
    preset, changes = CLASS_PRESETS[kind]
    torch.manual_seed(seed)
    model = build_model(NeuralLMConfig.preset(preset).replace(**changes), vocab)
    with torch.no_grad():  # larger weights than the init: peaked distributions, larger log-probs
        model.output.word.weight.mul_(4.0)
        model.output.word.bias.normal_(0.0, 1.0)
        model.output.cls.weight.mul_(4.0)
        model.output.cls.bias.normal_(0.0, 1.0)
    return model.eval()


@pytest.fixture(scope="module", params=sorted(CLASS_PRESETS))
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return _model(request.param)


# ---------------------------------------------------------------------------------------------- the layer
def test_distribution_sums_to_one_and_the_target_path_matches(model: torch.nn.Module) -> None:
    out = model.output
    assert isinstance(out, ClassSoftmax) and out.out_features == len(VOCAB)
    assert out.num_classes == (model.config.classes or round(math.sqrt(len(VOCAB))))
    g = torch.Generator().manual_seed(1)
    h = 3.0 * torch.randn(50, out.in_features, generator=g)
    with torch.no_grad():
        lp = out(h)
        assert lp.shape == (50, len(VOCAB)) and lp.dtype == torch.float32
        # a distribution over all V ids (<s> included, as with the full softmax)
        torch.testing.assert_close(lp.double().exp().sum(-1), torch.ones(50, dtype=torch.float64), rtol=0,
                                   atol=TOL)
        # log_softmax of the output is the output: every consumer of logits sees the class-factored model
        torch.testing.assert_close(torch.log_softmax(lp, -1), lp, rtol=0, atol=TOL)
        for tg in (torch.randint(0, len(VOCAB), (50,), generator=g), torch.full((50,), VOCAB.bos_id)):
            torch.testing.assert_close(out.target_logprob(h, tg), lp[torch.arange(50), tg], rtol=0, atol=TOL)
        # P(c|h) * P(w|c,h): within each class the word probabilities sum to P(c|h)
        pc = torch.softmax(out.cls(h), -1)
        per_class = torch.zeros_like(pc).index_add_(1, out.classes, lp.exp())
        torch.testing.assert_close(per_class, pc, rtol=0, atol=TOL)
    # the targets-only path's gradients (a hand-written backward) are those of the full vector's
    tg = torch.randint(0, len(VOCAB), (50,), generator=g)
    hh = h.clone().requires_grad_(True)
    grads = []
    for path in (lambda: out(hh)[torch.arange(50), tg], lambda: out.target_logprob(hh, tg)):
        out.zero_grad()
        hh.grad = None
        (path() * torch.linspace(0.5, 2.0, 50)).sum().backward()
        grads.append([hh.grad.clone()] + [p.grad.clone() for p in out.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # through the whole model, with gradients
    x = torch.randint(3, len(VOCAB), (2, 6), generator=g)
    x[:, 0] = VOCAB.bos_id
    full, _ = model(x)
    torch.testing.assert_close(full.exp().sum(-1), torch.ones(2, 6), rtol=0, atol=TOL)
    y = torch.randint(0, len(VOCAB), (2, 6), generator=g)
    y[1, 4:] = -100
    ce = F.cross_entropy(full.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="sum")
    torch.testing.assert_close(token_nll(model, x, y), ce, rtol=0, atol=1e-4)


def test_frequency_binning() -> None:
    counts = VOCAB.counts
    assert counts is not None and counts[VOCAB.bos_id] == 0 and counts[VOCAB.eos_id] == 1
    classes = frequency_classes(counts, 6)
    order = sorted(range(len(VOCAB)), key=lambda i: (-counts[i], i))
    assert [classes[i] for i in order] == sorted(classes)  # bins of the count order
    assert set(classes) == set(range(6))  # no empty class
    mass = np.bincount(classes, weights=counts, minlength=6) / sum(counts)
    assert mass[0] > 0.1 and np.bincount(classes)[0] < np.bincount(classes)[-1]  # frequent words: small bins
    assert frequency_classes([5, 0, 0], 3) == [0, 1, 2] and frequency_classes([0, 0], 1) == [0, 0]
    assert frequency_classes([1] * 4, 2) == [0, 0, 1, 1]
    # the model's buffer holds the binning of the vocabulary's counts; without counts a Zipf guess
    m = build_model(NeuralLMConfig.preset("tiny-lstm-class").replace(classes=6), VOCAB)
    assert m.output.classes.tolist() == classes
    bare = Vocabulary(VOCAB.words)
    assert bare.counts is None and bare == VOCAB
    m2 = build_model(NeuralLMConfig.preset("tiny-lstm-class"), bare)
    assert sorted(set(m2.output.classes.tolist())) == list(range(m2.output.num_classes))
    # automatic: round(sqrt(V)), at most V; one class per word and a single class work too
    small = Vocabulary.build([["a"]])
    for c, want in ((0, 2), (4, 4), (1, 1)):
        m3 = build_model(NeuralLMConfig.preset("tiny-lstm-class").replace(classes=c), small)
        assert m3.output.num_classes == want
        lp = m3(torch.tensor([[1, 3]]))[0].detach()
        torch.testing.assert_close(lp.exp().sum(-1), torch.ones(1, 2), rtol=0, atol=TOL)


def test_vocabulary_counts_round_trip() -> None:
    v = Vocabulary.build([["a", "b", "a", "<unk>"], ["c", "a"]], max_size=4)
    assert v.words == ("<unk>", "<s>", "</s>", "a") and v.counts == (3, 0, 2, 3)
    back = Vocabulary.from_json(v.to_json())
    assert back == v and back.counts == v.counts
    old = json.loads(v.to_json())
    del old["counts"]
    assert Vocabulary.from_json(old).counts is None
    for bad in ((1, 2), (1, 0, 2, -1), (1, 0, 2, 1.5)):
        with pytest.raises(InputError, match="count"):
            Vocabulary(v.words, counts=bad)


# ---------------------------------------------------------------------------------------------- training
def _corpus(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        noun = rng.choice(("cat", "dog", "bird", "fish"))
        s = ["the", noun, {"cat": "sleeps", "dog": "barks", "bird": "sings", "fish": "swims"}[noun]]
        if rng.random() < 0.5:
            s += ["in", "the", rng.choice(["house", "garden"])]
        out.append(s)
    return out


TRAIN = _corpus(160, 1)
VALID = _corpus(30, 2)
FAST = TrainOptions(batch_size=16, max_epochs=3, lr=0.02, patience=0, schedule="constant")


def test_training_reduces_validation_perplexity_and_resumes(tmp_path: Path) -> None:
    cfg = NeuralLMConfig.preset("tiny-lstm-class").replace(dropout=0.3)
    opts = FAST.replace(valid_every=4)
    full = train_lm(TRAIN, VALID, cfg, opts, out_dir=tmp_path / "full", seed=1, progress=False)
    assert full.config.softmax == "class" and full.model.output.num_classes == 4  # V = 15
    assert full.initial_valid_ppl > 8 and full.best_valid_ppl < 0.5 * full.initial_valid_ppl
    assert full.best_valid_ppl < 6.0  # uniform is 15; the grammar allows about 1.6
    # the validation perplexity is that of the full log-probability vectors
    seqs = encode_sentences(full.vocab, VALID, cfg.max_len)
    x, y = make_batch(seqs)
    with torch.no_grad():
        lp, _ = full.model(x)
    ce = F.cross_entropy(lp.flatten(0, 1), y.flatten(), ignore_index=-100)
    assert evaluate_ppl(full.model, seqs)[0] == pytest.approx(math.exp(float(ce)), rel=1e-5)
    # interrupted mid-epoch, then resumed: the same model
    part = tmp_path / "part"
    train_lm(TRAIN, VALID, cfg, opts.replace(max_steps=7), out_dir=part, seed=1, progress=False)
    res = train_lm(TRAIN, VALID, cfg, opts, out_dir=part, seed=1, progress=False, resume=True)
    assert res.history == full.history and res.steps == full.steps == 30
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, res.model.state_dict()[k]), k


def test_checkpoint_round_trip_keeps_the_classes(tmp_path: Path) -> None:
    m = _model("lstm-tied")
    with torch.no_grad():  # classes of the model's own (not what the vocabulary's counts would give)
        m.output.classes.copy_(torch.arange(len(VOCAB)) % m.output.num_classes)
        m.output._refresh()
    p = tmp_path / "c.pt"
    save_checkpoint(p, m, VOCAB, m.config)
    ck = load_checkpoint(p)
    assert ck.config.softmax == "class" and ck.config.classes == 5 and ck.vocab.counts == VOCAB.counts
    assert torch.equal(ck.model.output.classes, m.output.classes)
    assert ck.model.output.word.weight is ck.model.embed.weight  # still tied
    x = torch.tensor([[1, 3, 5, 8, 2]])
    with torch.no_grad():
        torch.testing.assert_close(ck.model(x)[0], m(x)[0], rtol=0, atol=1e-6)
    # classes that do not fit the class layer: an InputError naming the file
    obj = torch.load(p, weights_only=True)
    obj["state"]["output.classes"] = torch.zeros(len(VOCAB), dtype=torch.long)
    torch.save(obj, tmp_path / "bad.pt")
    with pytest.raises(InputError, match="bad.pt.*non-empty"):
        load_checkpoint(tmp_path / "bad.pt")


def test_old_checkpoint_without_softmax_fields_loads_as_full(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = build_model(NeuralLMConfig.preset("tiny-lstm"), VOCAB)
    p = tmp_path / "old.pt"
    save_checkpoint(p, m, VOCAB, m.config)
    obj = torch.load(p, weights_only=True)
    meta = json.loads(obj["meta"])
    assert "softmax" not in meta["config"] and "classes" not in meta["config"]  # a full softmax writes neither
    del meta["vocab"]["counts"]
    obj["meta"] = json.dumps(meta)
    torch.save(obj, p)
    ck = load_checkpoint(p)
    assert ck.config.softmax == "full" and ck.config.classes == 0 and ck.vocab.counts is None
    assert isinstance(ck.model.output, torch.nn.Linear)
    assert torch.equal(ck.model.output.weight, m.output.weight)


def test_frozen_layers_update_only_the_class_and_word_layers(tmp_path: Path) -> None:
    pre = train_lm(TRAIN, VALID, NeuralLMConfig.preset("tiny-lstm-class"), FAST.replace(max_epochs=1),
                   out_dir=tmp_path, progress=False)
    layers = pre.model.output_layers()
    assert layers == [pre.model.output.cls, pre.model.output.word]
    before = {k: v.detach().clone() for k, v in pre.model.named_parameters()}
    res = train_lm(_corpus(60, 7), VALID, None, FAST.replace(max_epochs=2, lr=0.05), init=tmp_path / "best.pt",
                   freeze="output", progress=False)
    after = dict(res.model.named_parameters())
    out_names = {n for n in after if n.startswith("output.")}
    assert out_names == {"output.cls.weight", "output.cls.bias", "output.word.weight", "output.word.bias"}
    for name, v in before.items():
        assert torch.equal(v, after[name]) != (name in out_names), name
    assert torch.equal(res.model.output.classes, pre.model.output.classes)
    assert res.metrics["trainable_parameters"] == sum(after[n].numel() for n in out_names)


# ---------------------------------------------------------------------------------------------- scoring
def _sentences() -> list[list[str]]:
    rng = np.random.default_rng(3)
    pool = WORDS + ["oov-a"]
    out: list[list[str]] = []
    for _ in range(8):  # N-best-like groups sharing prefixes
        base = [str(w) for w in rng.choice(pool, size=int(rng.integers(1, 12)))]
        for _ in range(4):
            cut = int(rng.integers(0, len(base) + 1))
            out.append(base[:cut] + [str(w) for w in rng.choice(pool, size=int(rng.integers(0, 3)))])
    return out + [[], ["w1"], ["<unk>", "w2"], ["w39", "w38", "w39"]]


SENTS = _sentences()


def _max_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens and x.oov.tolist() == y.oov.tolist()
        if len(x.logprobs):
            assert np.isfinite(x.logprobs).all()
            worst = max(worst, float(np.max(np.abs(x.logprobs - y.logprobs))))
    return worst


@pytest.mark.parametrize("bias", ["none", "unnormalised", "renormalised"])
def test_fast_scoring_equals_naive(model: torch.nn.Module, bias: str) -> None:
    b = None if bias == "none" else np.random.default_rng(4).normal(0.0, 1.5, len(VOCAB))
    lm = NeuralLM(model, VOCAB, log_bias=b, renormalize=bias == "renormalised", batch_tokens=5, row_len=8,
                  out_rows=3)
    fast = lm.score_batch(SENTS)
    assert _max_diff(fast, lm.score_naive(SENTS)) <= TOL
    for eos in (True, False):
        big = NeuralLM(model, VOCAB, log_bias=b, renormalize=bias == "renormalised")
        assert _max_diff(big.score_batch(SENTS, eos=eos), lm.score_naive(SENTS, eos=eos)) <= TOL
    # next-word distributions: normalised (unless the bias is unnormalised) and the scores' values
    hist = [s for s in SENTS[:10] if all(w in VOCAB for w in s)]
    d = lm.distributions(hist)
    if bias != "unnormalised":
        np.testing.assert_allclose((10.0 ** d).sum(axis=1), 1.0, atol=1e-6)
    for h, row in zip(hist, d, strict=True):
        assert abs(row[VOCAB.eos_id] - lm.score(h).logprobs[-1]) <= TOL


def test_bias_is_added_per_word_and_the_vocabulary_is_checked(model: torch.nn.Module,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lm = NeuralLM(model, VOCAB)
    full_rows = []
    forward = ClassSoftmax.forward
    monkeypatch.setattr(ClassSoftmax, "forward", lambda self, h: full_rows.append(len(h)) or forward(self, h))
    lm.score_batch(SENTS)  # the targets-only path: no full log-probability vector
    lm.with_bias(np.ones(len(VOCAB))).score_batch(SENTS)
    assert full_rows == []
    lm.with_bias(np.ones(len(VOCAB)), renormalize=True).score_batch(SENTS[:3])  # needs the whole vector
    assert full_rows
    monkeypatch.undo()
    bias = np.zeros(len(VOCAB))
    bias[VOCAB.index("w5")] = math.log(4.0)
    boosted = lm.with_bias(bias)
    diff = boosted.score(["w5"]).logprobs[0] - lm.score(["w5"]).logprobs[0]
    assert abs(diff - math.log10(4.0)) < 1e-6
    with pytest.raises(ConfigError, match="vocabulary has"):
        NeuralLM(model, Vocabulary.build([WORDS[:5]]))


def test_approximation_of_a_class_softmax_model_is_normalised() -> None:
    sents = [s for s in SENTS if s][:20]
    vocab = Vocabulary.build(sents)
    lm = NeuralLM(_model("lstm", vocab), vocab)
    m = approximate_ngram(ModelSource.from_lm(lm), sents, order=2)
    assert check_normalised(m) < 1e-6
    # the unigram of </s> is the averaged neural probability of </s> over every position
    prefixes = [s[:i] for s in sents for i in range(len(s) + 1)]
    d = 10.0 ** lm.distributions(prefixes)
    d[:, vocab.bos_id] = 0.0
    d /= d.sum(axis=1, keepdims=True)
    assert abs(m.logprob("</s>", []) - math.log10(d[:, vocab.eos_id].mean())) < 1e-6


def test_fedlm_trains_a_class_softmax_model() -> None:
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig

    vocab = Vocabulary(("<unk>", "<s>", "</s>", "a", "b", "c", "d", "e"))  # no counts: Zipf-guessed classes
    alg = FedLmAlgorithm(FedLmConfig(server="fedavg", batch_size=16, client_lr=0.5),
                         NeuralLMConfig.preset("tiny-lstm-class"), vocab)
    rng = np.random.default_rng(0)
    state = alg.init(rng)
    assert not any("classes" in k for k in state["params"])  # the classes are rebuilt from the vocabulary
    client = FedLmClient("c", ((3, 4, 5), (4, 4), (6, 7, 3, 3)) * 4)
    before = alg.perplexity(state["params"], client.sentences)
    for r in range(3):
        upd, _ = alg.client_update(alg.broadcast(state, r), client, None, rng)
        state, _ = alg.server_update(state, alg.accumulate(None, upd), r, rng)
    assert alg.perplexity(state["params"], client.sentences) < before


# ---------------------------------------------------------------------------------------------- config
def test_config_errors_and_presets() -> None:
    base = NeuralLMConfig.preset("tiny-lstm")
    for changes, match in (({"softmax": "hier"}, "softmax='hier'.*full.*class"),
                           ({"softmax": "class", "classes": -1}, "classes=-1"),
                           ({"softmax": "class", "classes": 1.5}, "classes=1.5"),
                           ({"classes": 4}, "classes=4 is only used with softmax=class"),
                           ({"softmax": "class", "classes": 20, "vocab_size": 10}, "more than.*10 words")):
        with pytest.raises(ConfigError, match=match):
            base.replace(**changes)
    with pytest.raises(ConfigError, match="classes=50 is more than the vocabulary's 43 words"):
        build_model(base.replace(softmax="class", classes=50), VOCAB)
    cfg = NeuralLMConfig.preset("paper003-lstm")
    assert (cfg.arch, cfg.softmax, cfg.classes, cfg.hidden_dim, cfg.layers) == ("lstm", "class", 0, 512, 2)
    assert {"paper003-lstm", "tiny-lstm-class", "small-lstm-class"} <= set(PRESETS)
    assert NeuralLMConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["softmax"] == "class"
    # the command line's --set and config files
    c2, _ = load_run_config(preset="tiny-lstm", overrides=["softmax=class", "model.classes=3"])
    assert (c2.softmax, c2.classes) == ("class", 3)
    with pytest.raises(ConfigError, match="softmax"):
        load_run_config(preset="tiny-lstm", overrides=["softmax=hier"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["lstm", "transformer"])
def test_cuda_mixed_precision_training_and_scoring(kind: str) -> None:
    preset, changes = CLASS_PRESETS[kind]
    cfg = NeuralLMConfig.preset(preset).replace(**changes)
    res = train_lm(TRAIN, VALID, cfg, FAST, device="cuda", progress=False)  # bf16/fp16 autocast
    assert res.best_valid_ppl < 0.5 * res.initial_valid_ppl
    assert res.model.output.classes.device.type == "cuda"
    gpu = _model(kind).cuda()
    for renorm in (False, True):
        lm = NeuralLM(gpu, VOCAB, device="cuda", log_bias=np.linspace(-1, 1, len(VOCAB)), renormalize=renorm)
        assert _max_diff(lm.score_batch(SENTS), lm.score_naive(SENTS)) <= TOL
        cpu = NeuralLM(_model(kind), VOCAB, log_bias=lm.log_bias, renormalize=renorm)
        assert _max_diff(lm.score_batch(SENTS), cpu.score_batch(SENTS)) <= 1e-4
