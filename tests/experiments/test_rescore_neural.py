"""Neural LM specs in rescoring configs: validation, training on the fly (cached), the n-gram baseline system."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from privasr.config import apply_overrides  # noqa: E402
from privasr.errors import ConfigError  # noqa: E402
from privasr.experiments.rescore import load_config, run_rescore  # noqa: E402

from .conftest import GOOD  # noqa: E402


def _text(path: Path, n: int = 300, seed: int = 3) -> Path:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(GOOD) for _ in range(rng.randint(3, 7))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


NEURAL_TRAIN = {"preset": "tiny-lstm", "seed": 0,
                "options": {"max_epochs": 3, "batch_size": 16, "lr": 0.01, "patience": 0}}


def _cfg(files, tmp_path: Path, **over):
    text = _text(tmp_path / "lm.txt")
    valid = _text(tmp_path / "valid.txt", 40, seed=4)
    raw = {"data": {"dev": str(files["dev"]), "test": str(files["test"])},
           "lms": {"toy": str(files["arpa"]),
                   "nn": {"neural": {"train": {"text": str(text), "valid": str(valid), **NEURAL_TRAIN}}}},
           "search": {"ranges": {"lm": [0, 2, 1], "toy": [0, 0.5, 0.25], "nn": [0, 4, 0.5], "word_penalty": [-3, 3, 1]}},
           "eval": {"baseline_lms": ["toy"], "bootstrap_resamples": 50}, "output": {"nbest": None}}
    return apply_overrides(raw, over)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"lms.nn.neural.foo": 1}, "unknown config key 'lms.nn.neural.foo'"),
        ({"lms.nn.neural.train.epochs": 3}, "unknown config key 'lms.nn.neural.train.epochs'"),
        ({"lms.nn.neural.train.options.epochz": 3}, "epochz"),
        ({"lms.nn.neural.train.options.batch_size": 0}, "batch_size"),
        ({"lms.nn.neural.train.preset": "huge-lstm"}, "preset"),
        ({"lms.nn.neural.train.model": {"layerz": 1}}, "layerz"),
        ({"lms.nn.neural.train.valid": None}, "'lms.nn.neural.train.valid' is None"),
        ({"lms.nn.neural.checkpoint": "x.pt"}, "exactly one of 'checkpoint' and 'train'"),
        ({"lms.nn.arpa": "x.arpa"}, "exactly one of 'arpa', 'train', 'neural' and 'onnx'"),
        ({"lms.nn.neural.batch_tokens": 0}, "batch_tokens"),
        ({"lms.nn.neural.spread_unk": "yes"}, "spread_unk"),
        ({"eval.baseline_lms": ["tyo"]}, "unknown LM"),
        ({"eval.baseline_lms": ["toy", "nn"]}, "every LM"),
        ({"eval.baseline_lms": "toy"}, "'eval.baseline_lms' is 'toy' .expected a list"),
    ],
)
def test_neural_spec_errors(toy_files, tmp_path, over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_cfg(toy_files, tmp_path, **over))


def test_missing_checkpoint_is_reported(toy_files, tmp_path):
    raw = _cfg(toy_files, tmp_path)
    raw["lms"]["nn"] = {"neural": {"checkpoint": str(tmp_path / "none.pt")}}
    with pytest.raises(ConfigError, match="no such file"):
        load_config(raw)
    assert load_config(raw, check_files=False).lm_specs[1].neural["checkpoint"].endswith("none.pt")


def test_neural_rescoring_with_ngram_baseline_runs_and_caches(toy_files, tmp_path):
    raw = _cfg(toy_files, tmp_path)
    m = run_rescore(load_config(raw), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["metrics"]["wer"] == m["wer"]
    for k in ("wer", "wer_baseline", "wer_rel_change", "mapsswe_p", "wer_first_pass"):
        assert m[k] is not None
    assert set(m["ppl_by_lm"]) == {"toy", "nn"} and all(v > 1 for v in m["ppl_by_lm"].values())
    assert m["ppl"] == m["ppl_by_lm"]["nn"]  # the LM under test (not in the baseline system)
    info = res["lms"]["nn"]
    # trained on uniform random GOOD-word sentences: the NNLM gets near their ~10-word perplexity, well below
    # where it started and below uniform over its 13-word vocabulary
    assert m["ppl_by_lm"]["nn"] < min(11.5, info["training"]["initial_valid_ppl"])
    assert set(m["weights"]) == {"lm", "toy", "nn", "word_penalty"}
    assert set(m["weights_baseline"]) == {"lm", "toy", "word_penalty"}
    assert info["cached"] is False and info["training"]["best_valid_ppl"] > 1
    assert (tmp_path / "out" / "lm" / "nn.pt").is_file()
    # the baseline is exactly the n-gram-only system of a separate run (same data, same search)
    only = apply_overrides(raw, {"eval.baseline_lms": None})
    only["lms"] = {"toy": raw["lms"]["toy"]}
    only["search"]["ranges"] = {k: v for k, v in raw["search"]["ranges"].items() if k != "nn"}
    m2 = run_rescore(load_config(only), tmp_path / "ngram")
    assert m2["wer"] == pytest.approx(m["wer_baseline"])
    assert m2["weights"] == m["weights_baseline"]
    assert m2["wer_baseline"] == pytest.approx(m["wer_first_pass"])
    # a second run reuses the trained checkpoint and reproduces the figures
    m3 = run_rescore(load_config(raw), tmp_path / "out")
    info3 = json.loads((tmp_path / "out" / "results.json").read_text())["lms"]["nn"]
    assert info3["cached"] is True
    assert m3["wer"] == m["wer"] and m3["ppl_by_lm"] == m["ppl_by_lm"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "baseline: rescoring with lm, toy" in report and "neural tiny-lstm" in report


def test_checkpoint_spec_scores_with_the_saved_model(toy_files, tmp_path):
    from privasr.lm.neural.checkpoint import save_checkpoint
    from privasr.lm.neural.models import NeuralLMConfig, build_model
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.neural.vocab import Vocabulary

    vocab = Vocabulary.build([list(GOOD)])
    torch.manual_seed(0)
    model = build_model(NeuralLMConfig.preset("tiny-transformer"), vocab)
    save_checkpoint(tmp_path / "m.pt", model, vocab, model.config)
    raw = _cfg(toy_files, tmp_path, **{"eval.baseline_lms": None})
    raw["lms"] = {"nn": {"neural": {"checkpoint": str(tmp_path / "m.pt")}}}
    raw["search"] = {"method": "fixed", "weights": {"lm": 0, "nn": 1.0, "word_penalty": 0}}
    cfg = load_config(raw)
    m = run_rescore(cfg, tmp_path / "out")
    refs = [nb.ref for nb in __import__("privasr.corpus.formats.nbest_jsonl", fromlist=["x"]).read_nbest(
        toy_files["test"])]
    lm = NeuralLM(model, vocab)
    import math

    lnp = sum(s.ln_total for s in lm.score_batch(refs))
    want = math.exp(-lnp / sum(len(r) + 1 for r in refs))
    assert m["ppl_by_lm"]["nn"] == pytest.approx(want, rel=1e-6)


def test_a_neural_lm_trains_on_normalised_text_and_keys_its_cache_by_the_normaliser(tmp_path):
    """``normalize: neural`` runs on both texts (contractions expanded as Whisper's lists have them); the
    normaliser joins the cache key only when set, so models trained before the option keep their keys."""
    from privasr.config import Context, from_mapping
    from privasr.rescore.lms import LMSettings, build_lm

    text = tmp_path / "t.txt"
    text.write_text("we're going to start\nwe're done\nit is one point four\n" * 20, encoding="utf-8")
    train = {"text": str(text), "valid": str(text), "preset": "tiny-transformer", "seed": 0,
             "options": {"max_epochs": 1, "batch_size": 16, "lr": 0.01, "patience": 0, "amp": False}}
    plain = from_mapping(LMSettings, {"neural": {"train": train}}, "lms.nn", Context(True)).spec("nn")
    norm = from_mapping(LMSettings, {"neural": {"train": {**train, "normalize": "neural"}}}, "lms.nn",
                        Context(True)).spec("nn")
    lm_plain, _ = build_lm(plain, tmp_path / "a")
    lm_norm, _ = build_lm(norm, tmp_path / "b")
    assert "we're" in lm_plain.vocab.words and "we're" not in lm_norm.vocab.words and "are" in lm_norm.vocab.words
    assert "normalize" not in json.loads((tmp_path / "a" / "nn.json").read_text())["key"]
    assert json.loads((tmp_path / "b" / "nn.json").read_text())["key"]["normalize"] == "neural"
    with pytest.raises(ConfigError, match="normali"):
        from_mapping(LMSettings, {"neural": {"train": {**train, "normalize": "klingon"}}}, "lms.nn", Context(True))


def test_a_shared_cache_resumes_only_its_own_interrupted_training(tmp_path, monkeypatch):
    """Two LMs under one name in one cache (``make headlines`` shares a cache across configs): the second never
    resumes the first's ``NAME.train/last.pt`` (another architecture failed; another text would have continued
    the first model, vocabulary and all); the same spec with more epochs still resumes."""
    import privasr.lm.neural.train as train_mod
    from privasr.config import Context, from_mapping
    from privasr.rescore.lms import LMSettings, build_lm

    resumed: list[bool] = []
    real = train_mod.train_lm

    def spy(*a, **kw):
        resumed.append(kw["resume"])
        return real(*a, **kw)

    monkeypatch.setattr(train_mod, "train_lm", spy)
    text_a, text_b = tmp_path / "a.txt", tmp_path / "b.txt"
    text_a.write_text("the cat sat on the mat\n" * 30, encoding="utf-8")
    text_b.write_text("we met in the room today\n" * 30, encoding="utf-8")

    def spec(text, preset="tiny-transformer", epochs=1):
        train = {"text": str(text), "valid": str(text), "preset": preset, "seed": 0,
                 "options": {"max_epochs": epochs, "batch_size": 16, "lr": 0.01, "patience": 0, "amp": False}}
        return from_mapping(LMSettings, {"neural": {"train": train}}, "lms.nn", Context(True)).spec("nn")

    cache = tmp_path / "cache"
    build_lm(spec(text_a), cache)
    assert (cache / "nn.train" / "last.pt").is_file()
    lm, info = build_lm(spec(text_a, preset="tiny-lstm"), cache)  # another architecture: was a ConfigError
    assert info["cached"] is False and lm.arch == "lstm"
    lm, info = build_lm(spec(text_b, preset="tiny-lstm"), cache)  # same architecture, another text
    assert "room" in lm.vocab.words and "cat" not in lm.vocab.words
    lm, info = build_lm(spec(text_b, preset="tiny-lstm", epochs=2), cache)  # an interrupted run, extended
    assert resumed == [False, False, False, True] and len(info["training"]["epochs"]) == 2
    assert json.loads((cache / "nn.train" / "spec.json").read_text())["text"] == str(text_b)
