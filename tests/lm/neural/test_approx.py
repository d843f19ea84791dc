"""N-gram approximations of a neural LM: normalisation, the averaged probabilities, KenLM loading, the CLI."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.lm.neural.approx import (  # noqa: E402
    ApproxStats,
    ModelSource,
    approximate_ngram,
    check_normalised,
    overwrite_ngram,
)
from privasr.lm.neural.models import NeuralLMConfig, build_model  # noqa: E402
from privasr.lm.neural.scorer import NeuralLM  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402
from privasr.lm.ngram.arpa import read_arpa, write_arpa  # noqa: E402
from privasr.lm.ngram.mkn import train_mkn  # noqa: E402

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park", "and", "it"]


def corpus(n: int = 60, seed: int = 1) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(seed)
    p = np.linspace(2.0, 0.5, len(WORDS))
    p /= p.sum()
    return [tuple(rng.choice(WORDS, size=int(rng.integers(1, 9)), p=p).tolist()) for _ in range(n)]


def neural(preset: str, sents, *, min_count: int = 1, seed: int = 0) -> NeuralLM:
    vocab = Vocabulary.build(sents, min_count=min_count)
    torch.manual_seed(seed)
    model = build_model(NeuralLMConfig.preset(preset), vocab)
    with torch.no_grad():  # sharper than the init so that histories matter
        model.output.weight.mul_(8.0)
    return NeuralLM(model, vocab)


def brute_force(lm: NeuralLM, sents, order: int) -> dict[tuple[str, ...], np.ndarray]:
    """Average neural distribution (probabilities, <s> removed, renormalised) of every history, by the scorer."""
    sums: dict[tuple[str, ...], np.ndarray] = defaultdict(lambda: np.zeros(len(lm.vocab)))
    count: dict[tuple[str, ...], int] = defaultdict(int)
    prefixes = [s[:i] for s in sents for i in range(len(s) + 1)]
    dists = 10.0 ** lm.distributions(prefixes)
    dists[:, lm.vocab.bos_id] = 0.0
    dists /= dists.sum(axis=1, keepdims=True)
    for pre, d in zip(prefixes, dists, strict=True):
        toks = ["<s>"] + [w if w in lm.vocab else "<unk>" for w in pre]
        for n in range(1, order + 1):
            if len(toks) >= n - 1:
                h = tuple(toks[len(toks) - (n - 1):]) if n > 1 else ()
                sums[h] += d
                count[h] += 1
    return {h: sums[h] / count[h] for h in sums}


@pytest.mark.parametrize("preset", ["tiny-lstm", "tiny-transformer"])
def test_approximation_is_the_averaged_neural_distribution(preset: str) -> None:
    sents = corpus()
    lm = neural(preset, sents)
    stats = ApproxStats()
    model = approximate_ngram(lm, sents, order=3, stats=stats)
    assert check_normalised(model) < 1e-6
    assert stats.positions == sum(len(s) + 1 for s in sents)
    # every corpus n-gram is listed, nothing else
    grams = {n: set() for n in (2, 3)}
    for s in sents:
        t = ("<s>", *s, "</s>")
        for n in (2, 3):
            grams[n].update(t[i:i + n] for i in range(len(t) - n + 1))
    for n in (2, 3):
        assert {w for w, _, _ in model.entries(n)} == grams[n]
    assert [w[0] for w, _, _ in model.entries(1)] == list(lm.vocab.words)
    # explicit probabilities = the neural distributions averaged over the history's occurrences
    ref = brute_force(lm, sents, 3)
    vid = {w: i for i, w in enumerate(lm.vocab.words)}
    worst = 0.0
    for n in (1, 2, 3):
        for words, lp, _ in model.entries(n):
            if words == ("<s>",):
                assert lp == -99.0
                continue
            want = ref[words[:-1]][vid[words[-1]]]
            worst = max(worst, abs(10.0 ** lp - want))
    assert worst < 1e-6
    # a backed-off word gets its share of the history's left-over mass: the full approximated distribution of a
    # bigram history equals the averaged neural one on listed words and is proportional to the unigram elsewhere
    h = ("the",)
    listed = {w[-1] for w, _, _ in model.entries(2) if w[0] == "the"}
    unlisted = [w for w in lm.vocab.words if w not in listed and w != "<s>"]
    assert unlisted
    ratio = [10 ** model.logprob(w, h) / 10 ** model.logprob(w, []) for w in unlisted]
    assert max(ratio) - min(ratio) < 1e-9


def test_oov_words_become_unk_and_topk_adds_neural_candidates() -> None:
    sents = corpus(80, seed=3)
    lm = neural("tiny-lstm", sents, min_count=20)  # rare words are <unk> for the neural model
    assert any(w not in lm.vocab for s in sents for w in s)
    plain = approximate_ngram(lm, sents, order=3)
    assert "<unk>" in plain and all(w in lm.vocab for w in plain.vocab)
    assert any("<unk>" in w for w, _, _ in plain.entries(2))
    stats = ApproxStats()
    top = approximate_ngram(lm, sents, order=3, topk=3, stats=stats)
    assert check_normalised(top) < 1e-6
    for n in (2, 3):
        base = {w for w, _, _ in plain.entries(n)}
        more = {w for w, _, _ in top.entries(n)}
        assert base < more
        assert stats.topk_added[n - 1] == len(more) - len(base)
    # suffix-closed (KenLM finds an n-gram through its suffix) and prefix-closed (ARPA)
    tri = {w for w, _, _ in top.entries(3)}
    bi = {w for w, _, _ in top.entries(2)}
    assert all(t[1:] in bi and t[:2] in bi for t in tri)
    # listed words keep exactly their averaged neural probability in both models
    common = {w: lp for w, lp, _ in plain.entries(3)}
    diffs = [abs(lp - common[w]) for w, lp, _ in top.entries(3) if w in common]
    assert max(diffs) < 1e-9


def test_overwrite_keeps_the_base_ngram_set() -> None:
    sents = corpus(70, seed=5)
    base = train_mkn(sents, 3, discount_fallback=(0.5, 1.0, 1.5))
    lm = neural("tiny-transformer", sents, min_count=20)
    assert any(w not in lm.vocab for w in base.vocab if w not in ("<s>", "</s>", "<unk>"))
    stats = ApproxStats()
    new = overwrite_ngram(lm, base, sents, stats=stats)
    assert new.vocab == base.vocab and new.order == base.order
    for n in (1, 2, 3):
        assert np.array_equal(new.ngram_ids(n), base.ngram_ids(n))
    assert check_normalised(new) < 1e-6
    assert stats.kept_base == 0  # every base history occurs in its own training text
    changed = [abs(a[1] - b[1]) for a, b in zip(new.entries(3), base.entries(3), strict=True)]
    assert max(changed) > 1e-3
    # words the neural model does not know share its <unk> probability by their base unigram probabilities
    uni_new = {w[0]: lp for w, lp, _ in new.entries(1)}
    uni_base = {w[0]: lp for w, lp, _ in base.entries(1)}
    group = [w for w in base.vocab if (w not in lm.vocab or w == "<unk>") and w != "<s>"]
    assert len(group) >= 2
    r = [uni_new[w] - uni_base[w] for w in group]
    assert max(r) - min(r) < 1e-9
    # a history that never occurs in the corpus keeps the base probabilities
    other = overwrite_ngram(lm, base, sents[:10], stats=stats)
    assert stats.kept_base > 0
    assert check_normalised(other) < 1e-6


def test_inputs_are_checked() -> None:
    from privasr.errors import InputError

    sents = corpus(5)
    lm = neural("tiny-lstm", sents)
    with pytest.raises(InputError):
        approximate_ngram(lm, [], order=3)
    with pytest.raises(InputError):
        approximate_ngram(lm, sents, order=0)
    with pytest.raises(InputError):
        approximate_ngram(lm, [("a", "</s>")], order=2)
    with pytest.raises(InputError):
        approximate_ngram(object(), sents)


def test_long_sentences_in_windows_match_whole_lstm_pass() -> None:
    sents = [tuple(WORDS * 3)] + corpus(5)
    lm = neural("tiny-lstm", sents)
    whole = approximate_ngram(ModelSource(lm.model, lm.vocab), sents, order=2)
    windows = approximate_ngram(ModelSource(lm.model, lm.vocab, max_len=7), sents, order=2)
    a = np.array([lp for _, lp, _ in whole.entries(2)])
    b = np.array([lp for _, lp, _ in windows.entries(2)])
    assert np.abs(a - b).max() < 1e-5


def test_kenlm_loads_and_agrees(tmp_path: Path) -> None:
    kenlm = pytest.importorskip("kenlm")
    sents = corpus(60, seed=7)
    lm = neural("tiny-lstm", sents, min_count=3)
    base = train_mkn(sents, 3, discount_fallback=(0.5, 1.0, 1.5))
    models = {"approx": approximate_ngram(lm, sents, order=3), "topk": approximate_ngram(lm, sents, 3, topk=2),
              "overwrite": overwrite_ngram(lm, base, sents)}
    tests = corpus(30, seed=11) + [("zebra", "the", "cat"), ("park",)]
    for name, m in models.items():
        path = tmp_path / f"{name}.arpa"
        write_arpa(m, path)
        assert read_arpa(path).num_ngrams(3) == m.num_ngrams(3)
        k = kenlm.Model(str(path))
        for s in tests:
            ours = m.score(s).total()
            theirs = k.score(" ".join(s), bos=True, eos=True)
            assert math.isclose(ours, theirs, abs_tol=1e-4), (name, s, ours, theirs)


def test_cli_approx_ngram(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from privasr.cli.lm_neural_approx import register
    from privasr.lm.neural.checkpoint import save_checkpoint

    sents = corpus(40, seed=2)
    lm = neural("tiny-lstm", sents)
    ck = tmp_path / "lm.pt"
    save_checkpoint(ck, lm.model, lm.vocab, lm.model.config)
    text = tmp_path / "text.txt"
    text.write_text("\n".join(" ".join(s) for s in sents) + "\n", encoding="utf-8")
    base = tmp_path / "base.arpa"
    write_arpa(train_mkn(sents, 2, discount_fallback=(0.5, 1.0, 1.5)), base)
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps typer from flattening the group
        pass

    runner = CliRunner()
    res = runner.invoke(app, ["approx-ngram", "--checkpoint", str(ck), "--text", str(text), "--order", "2",
                              "--arpa", str(tmp_path / "a.arpa"), "--json", "--results", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    import json

    assert json.loads((tmp_path / "r.json").read_text())["metrics"]["order"] == 2
    m = read_arpa(tmp_path / "a.arpa")
    assert m.order == 2 and check_normalised(m) < 1e-6
    assert np.allclose([lp for _, lp, _ in m.entries(2)],
                       [lp for _, lp, _ in approximate_ngram(lm, sents, 2).entries(2)], atol=1e-6)
    res = runner.invoke(app, ["approx-ngram", "--checkpoint", str(ck), "--text", str(text), "--base", str(base),
                              "--arpa", str(tmp_path / "b.arpa")])
    assert res.exit_code == 0, res.output
    b = read_arpa(tmp_path / "b.arpa")
    assert np.array_equal(b.ngram_ids(2), read_arpa(base).ngram_ids(2))
    res = runner.invoke(app, ["approx-ngram", "--checkpoint", str(ck), "--text", str(text), "--base", str(base),
                              "--topk", "2", "--arpa", str(tmp_path / "c.arpa")])
    assert res.exit_code != 0
