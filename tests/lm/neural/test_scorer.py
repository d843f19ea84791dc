"""NeuralLM: prefix-shared batched scoring equals the naive per-sentence path (both architectures, awkward
inputs, tiny batches), per-word bias unnormalised and renormalised, next-word distributions, checkpoints and
N-best rescoring through the generic engine."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import math  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from privasr.corpus.records import Hypothesis, NBest  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.lm.base import LanguageModel  # noqa: E402
from privasr.lm.neural.checkpoint import save_checkpoint  # noqa: E402
from privasr.lm.neural.models import NeuralLMConfig, build_model  # noqa: E402
from privasr.lm.neural.scorer import UNBOUNDED_ORDER, NeuralLM  # noqa: E402
from privasr.lm.neural.vocab import Vocabulary  # noqa: E402
from privasr.rescore import Combination, rescore  # noqa: E402

TOL = 1e-5  # log10
WORDS = [f"w{i}" for i in range(40)]
VOCAB = Vocabulary.build([WORDS])
PRESETS = {"transformer": "tiny-transformer", "lstm": "tiny-lstm", "lstm-char": "tiny-lstm-char"}


def _model(kind: str, **changes: object) -> torch.nn.Module:
    torch.manual_seed(7)
    cfg = NeuralLMConfig.preset(PRESETS[kind]).replace(**changes)
    model = build_model(cfg, VOCAB)
    with torch.no_grad():  # larger output weights than the init: peaked distributions, larger log-probs
        model.output.weight.mul_(4.0)
        model.output.bias.normal_(0.0, 1.0)
    return model


@pytest.fixture(scope="module", params=sorted(PRESETS))
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return _model(request.param)


def _sentences() -> list[list[str]]:
    rng = np.random.default_rng(3)
    pool = WORDS + ["oov-a", "oov-b"]
    out: list[list[str]] = []
    for _ in range(12):  # N-best-like groups sharing prefixes
        base = [str(w) for w in rng.choice(pool, size=int(rng.integers(1, 14)))]
        for _ in range(6):
            cut = int(rng.integers(0, len(base) + 1))
            out.append(base[:cut] + [str(w) for w in rng.choice(pool, size=int(rng.integers(0, 4)))])
    out += [[], ["w1"], ["w1"], [], ["oov-a"], ["oov-a", "oov-b", "oov-a"], ["<unk>", "w2"],
            [str(w) for w in rng.choice(WORDS, size=45)], out[0], out[5]]
    return out


SENTS = _sentences()


def _max_diff(a: list, b: list) -> float:
    assert len(a) == len(b)
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.tokens == y.tokens
        assert x.oov.tolist() == y.oov.tolist()
        assert x.logprobs.shape == y.logprobs.shape
        if len(x.logprobs):
            assert np.isfinite(x.logprobs).all()
            worst = max(worst, float(np.max(np.abs(x.logprobs - y.logprobs))))
    return worst


@pytest.mark.parametrize("batch_tokens", [3, 4096])
@pytest.mark.parametrize("eos", [True, False])
def test_fast_equals_naive(model: torch.nn.Module, batch_tokens: int, eos: bool) -> None:
    lm = NeuralLM(model, VOCAB, batch_tokens=batch_tokens, row_len=16, out_rows=7)
    fast = lm.score_batch(SENTS, eos=eos)
    assert _max_diff(fast, lm.score_naive(SENTS, eos=eos)) <= TOL
    # the conventions: words (then </s>), OOVs flagged and scored as <unk>
    s = fast[SENTS.index(["oov-a", "oov-b", "oov-a"])]
    assert s.tokens == ("oov-a", "oov-b", "oov-a") + (("</s>",) if eos else ())
    assert s.oov.tolist() == [True, True, True] + ([False] if eos else [])
    unk = lm.score_naive([["<unk>", "<unk>", "<unk>"]], eos=eos)[0]
    assert np.allclose(s.logprobs, unk.logprobs, atol=TOL)
    empty = fast[SENTS.index([])]
    assert empty.tokens == (("</s>",) if eos else ()) and len(empty.logprobs) == (1 if eos else 0)


def test_learned_positions_long_sentences_and_small_groups() -> None:
    model = _model("transformer", positions="learned", max_len=64)
    lm = NeuralLM(model, VOCAB, batch_tokens=48, row_len=8, group_tokens=20)
    assert _max_diff(lm.score_batch(SENTS), lm.score_naive(SENTS)) <= TOL
    assert lm.order == 64
    with pytest.raises(InputError, match="longer"):
        lm.score_batch([["w1"] * 64])


def test_score_matches_batch_and_results_keep_input_order(model: torch.nn.Module) -> None:
    lm = NeuralLM(model, VOCAB)
    batch = lm.score_batch(SENTS)
    rev = lm.score_batch(SENTS[::-1])[::-1]
    assert _max_diff(batch, rev) <= TOL
    for i in (0, 5, len(SENTS) - 3):
        assert _max_diff([lm.score(SENTS[i])], [batch[i]]) <= TOL
    assert lm.score_batch([]) == []


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS[:6] + ["zz"]), max_size=9), min_size=1, max_size=12),
       st.integers(1, 40), st.integers(1, 12), st.booleans())
def test_fast_equals_naive_property(sents: list[list[str]], batch_tokens: int, row_len: int, eos: bool) -> None:
    for kind in ("transformer", "lstm"):
        lm = NeuralLM(_MODELS[kind], VOCAB, batch_tokens=batch_tokens, row_len=row_len, out_rows=3)
        assert _max_diff(lm.score_batch(sents, eos=eos), lm.score_naive(sents, eos=eos)) <= TOL


_MODELS = {k: _model(k) for k in ("transformer", "lstm")}


def test_is_a_language_model() -> None:
    lm = NeuralLM(_MODELS["lstm"], VOCAB)
    assert isinstance(lm, LanguageModel)
    assert "w3" in lm and "nope" not in lm and len(lm) == len(VOCAB)
    assert lm.order == UNBOUNDED_ORDER
    assert NeuralLM(_MODELS["transformer"], VOCAB).order == 64
    with pytest.raises(InputError, match="<s>"):
        lm.score(["w1"], bos=False)
    with pytest.raises(InputError, match="string"):
        lm.score_batch("w1 w2")
    with pytest.raises(ConfigError):
        NeuralLM(_MODELS["lstm"], VOCAB, batch_tokens=0)
    with pytest.raises(ConfigError, match="vocabulary"):
        NeuralLM(_MODELS["lstm"], Vocabulary.build([["x"]]))


# -- distributions ---------------------------------------------------------------------------------------------
def test_distributions_rows_sum_to_one_and_match_scores(model: torch.nn.Module) -> None:
    lm = NeuralLM(model, VOCAB, batch_tokens=6, row_len=8, out_rows=2)
    hist = [s for s in SENTS[:40]] + [[], ["oov-a"]]
    d = lm.distributions(hist)
    assert d.shape == (len(hist), len(VOCAB)) and d.dtype == np.float64
    assert np.allclose((10.0 ** d).sum(axis=1), 1.0, atol=1e-5)
    for h, row in zip(hist, d, strict=True):
        target = "w5"
        lp = lm.score_naive([[*h, target]], eos=False)[0].logprobs[-1]
        assert abs(row[VOCAB.index(target)] - lp) <= TOL
        eos = lm.score_naive([h])[0].logprobs[-1]
        assert abs(row[VOCAB.eos_id] - eos) <= TOL
    assert lm.distributions([]).shape == (0, len(VOCAB))


# -- per-word bias ---------------------------------------------------------------------------------------------
def _bias(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 1.5, len(VOCAB))


def test_zero_bias_changes_nothing(model: torch.nn.Module) -> None:
    lm = NeuralLM(model, VOCAB)
    base = lm.score_batch(SENTS)
    for renorm in (False, True):
        zero = lm.with_bias(np.zeros(len(VOCAB)), renormalize=renorm)
        assert _max_diff(zero.score_batch(SENTS), base) <= 1e-6
        assert np.allclose(zero.distributions(SENTS[:5]), lm.distributions(SENTS[:5]), atol=1e-6)


def test_unnormalised_bias_adds_per_word(model: torch.nn.Module) -> None:
    lm = NeuralLM(model, VOCAB, batch_tokens=9, row_len=9)
    bias = _bias()
    biased = lm.with_bias(bias)
    assert biased.model is lm.model and not biased.renormalize
    base, got = lm.score_batch(SENTS), biased.score_batch(SENTS)
    assert _max_diff(got, biased.score_naive(SENTS)) <= TOL
    for s, b, g in zip(SENTS, base, got, strict=True):
        ids = VOCAB.encode([*s, "</s>"])
        assert np.allclose(g.logprobs - b.logprobs, bias[ids] / math.log(10), atol=TOL)
    d = biased.distributions(SENTS[:6])
    assert np.allclose(d, lm.distributions(SENTS[:6]) + bias / math.log(10), atol=TOL)
    assert not np.allclose((10.0 ** d).sum(axis=1), 1.0, atol=1e-3)  # unnormalised: not a distribution
    # the original scorer is unchanged
    assert lm.log_bias is None and _max_diff(lm.score_batch(SENTS[:5]), base[:5]) <= TOL


def test_renormalised_bias_is_exact(model: torch.nn.Module) -> None:
    bias = _bias(1)
    lm = NeuralLM(model, VOCAB, log_bias=bias, renormalize=True, batch_tokens=7, row_len=12, out_rows=5)
    fast = lm.score_batch(SENTS)
    assert _max_diff(fast, lm.score_naive(SENTS)) <= TOL
    d = lm.distributions(SENTS[:8])
    assert np.allclose((10.0 ** d).sum(axis=1), 1.0, atol=1e-5)
    # by hand: p'(w|h) = p(w|h) exp(bias[w]) / sum_v p(v|h) exp(bias[v])
    plain = NeuralLM(model, VOCAB).distributions(SENTS[:8]) * math.log(10) + bias
    expect = (plain - np.log(np.exp(plain).sum(axis=1, keepdims=True))) / math.log(10)
    assert np.allclose(d, expect, atol=TOL)
    # a constant bias changes nothing once renormalised, but shifts the unnormalised scores
    const = np.full(len(VOCAB), 0.7)
    plain_scores = NeuralLM(model, VOCAB).score_batch(SENTS)
    assert _max_diff(lm.with_bias(const).score_batch(SENTS), plain_scores) <= TOL
    shifted = lm.with_bias(const, renormalize=False).score_batch(SENTS)
    assert all(np.allclose(s.logprobs - p.logprobs, 0.7 / math.log(10), atol=TOL)
               for s, p in zip(shifted, plain_scores, strict=True))


def test_bias_validation() -> None:
    lm = NeuralLM(_MODELS["lstm"], VOCAB)
    with pytest.raises(InputError, match="shape"):
        lm.with_bias(np.zeros(3))
    with pytest.raises(InputError, match="NaN"):
        lm.with_bias(np.full(len(VOCAB), np.nan))
    forbid = np.zeros(len(VOCAB))
    forbid[VOCAB.index("w1")] = -np.inf
    s = lm.with_bias(torch.tensor(forbid)).score(["w1", "w2"])
    assert s.logprobs[0] == -np.inf and np.isfinite(s.logprobs[1:]).all()


# -- checkpoints and rescoring ---------------------------------------------------------------------------------
def test_from_checkpoint(tmp_path) -> None:
    model = _MODELS["transformer"]
    p = tmp_path / "lm.pt"
    save_checkpoint(p, model, VOCAB, model.config)
    loaded = NeuralLM.from_checkpoint(p, batch_tokens=32)
    assert loaded.batch_tokens == 32 and loaded.model is not model
    # another batch size sums in another float32 order: the same tolerance as the fast-vs-naive tests
    assert _max_diff(loaded.score_batch(SENTS), NeuralLM(model, VOCAB).score_batch(SENTS)) <= TOL


def test_rescoring_with_a_neural_lm() -> None:
    lm = NeuralLM(_MODELS["lstm"], VOCAB)
    rng = np.random.default_rng(5)
    nbests = []
    for u in range(6):
        base = [str(w) for w in rng.choice(WORDS, size=6)]
        hyps = []
        for k in range(5):
            words = base[:4 + k % 3] + [str(w) for w in rng.choice(WORDS + ["oov-z"], size=k % 2)]
            hyps.append(Hypothesis(tuple(words), scores={"am": float(rng.normal(-20, 1))}))
        nbests.append(NBest(f"u{u}", tuple(hyps)))
    weights = {"nn": 1.5, "word_penalty": 0.3}
    out = rescore(nbests, Combination(prior="am", lms=("nn",)), weights, {"nn": lm})
    changed = 0
    for nb, res in zip(nbests, out, strict=True):
        ln = [s.ln_total for s in lm.score_naive([h.words for h in nb.hyps])]
        totals = [h.scores["am"] + 1.5 * x + 0.3 * len(h.words) for h, x in zip(nb.hyps, ln, strict=True)]
        order = sorted(range(len(totals)), key=lambda i: (-totals[i], i))
        assert [h.words for h in res.hyps] == [nb.hyps[i].words for i in order]
        am_best = max(range(len(nb.hyps)), key=lambda i: nb.hyps[i].scores["am"])
        changed += order[0] != am_best
    assert changed  # the LM changes some decisions (so a wrong LM score would show)


@pytest.mark.parametrize("kind", ["transformer", "lstm"])
def test_each_distinct_prefix_is_computed_once(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = NeuralLM(_MODELS[kind], VOCAB, batch_tokens=10, row_len=12)
    seen: list[int] = []
    inner = NeuralLM._node_states

    def spy(self: NeuralLM, trie):  # type: ignore[no-untyped-def]
        for nodes, h in inner(self, trie):
            assert h.shape[0] == len(nodes)
            seen.extend(nodes.tolist())
            yield nodes, h

    monkeypatch.setattr(NeuralLM, "_node_states", spy)
    lm.score_batch(SENTS)
    ids = [tuple(VOCAB.encode(s)) for s in SENTS]
    prefixes = {x[:k] for x in ids for k in range(len(x) + 1)}
    assert len(seen) == len(set(seen)) == len(prefixes)
    assert len(prefixes) < sum(len(x) + 1 for x in ids) * 0.8  # the test set does share prefixes


def test_unk_probability_is_spread_over_the_unk_types(tmp_path) -> None:
    # 3 word types of the training text fall below min_count: an OOV word gets p(<unk>|h) / (3 + 1)
    v = Vocabulary.build([["a", "a", "b", "b", "x", "y", "z"]], min_count=2)
    assert v.unk_types == 3 and Vocabulary.from_json(v.to_json()).unk_types == 3
    torch.manual_seed(0)
    model = build_model(NeuralLMConfig.preset("tiny-transformer"), v)
    spread = NeuralLM(model, v)
    raw = NeuralLM(model, v, spread_unk=False)
    sents = [["a", "zz", "b"], ["a", "b"], ["x"]]
    fast, naive, plain = spread.score_batch(sents), spread.score_naive(sents), raw.score_batch(sents)
    for f, n, p in zip(fast, naive, plain, strict=True):
        assert np.allclose(f.logprobs, n.logprobs, atol=TOL)
        assert np.allclose(f.logprobs, p.logprobs - np.where(p.oov, math.log10(4), 0.0), atol=1e-12)
    assert fast[1].total() == plain[1].total()  # no OOV: unchanged
    # the spread survives a checkpoint
    save_checkpoint(tmp_path / "m.pt", model, v, model.config)
    back = NeuralLM.from_checkpoint(tmp_path / "m.pt")
    assert back.vocab.unk_types == 3
    assert np.allclose(back.score(["zz"]).logprobs, spread.score(["zz"]).logprobs)
    with pytest.raises(ConfigError):
        NeuralLM(model, v, spread_unk="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("eos", [True, False])
def test_score_ids_equals_score_batch_in_one_group_or_many(model: torch.nn.Module, eos: bool) -> None:
    ids, off = VOCAB.encode_flat(SENTS)
    whole = NeuralLM(model, VOCAB, out_rows=5)
    flat = whole.score_ids(ids, off, eos=eos)
    batch = whole.score_batch(SENTS, eos=eos)
    assert flat.dtype == np.float64 and len(flat) == sum(len(s) + eos for s in SENTS)
    assert np.array_equal(flat, np.concatenate([s.logprobs for s in batch]))
    naive = np.concatenate([s.logprobs for s in whole.score_naive(SENTS, eos=eos)])
    assert np.max(np.abs(flat - naive)) <= TOL
    # groups of ~25 targets of sorted sentences (each its own trie), results back in input order
    grouped = NeuralLM(model, VOCAB, out_rows=5, batch_tokens=12, row_len=12, group_tokens=25)
    assert np.max(np.abs(grouped.score_ids(ids, off, eos=eos) - naive)) <= TOL
    assert whole.score_ids(np.zeros(0, dtype=np.int64), [0]).shape == (0,)
    assert whole.score_ids([], [0, 0, 0], eos=eos).tolist() == ([whole.score([]).logprobs[0]] * 2 if eos else [])


def test_score_ids_takes_every_unk_id_for_an_oov_word() -> None:
    v = Vocabulary.build([["a", "a", "b", "b", "x", "y", "z"]], min_count=2)  # 3 types behind <unk>
    torch.manual_seed(0)
    lm = NeuralLM(build_model(NeuralLMConfig.preset("tiny-transformer"), v), v)
    sents = [["a", "zz", "b"], ["q"]]
    ids, off = v.encode_flat(sents)
    assert ids.tolist() == [v.index("a"), v.unk_id, v.index("b"), v.unk_id]
    assert np.allclose(lm.score_ids(ids, off), np.concatenate([s.logprobs for s in lm.score_batch(sents)]),
                       atol=1e-12)
    raw = NeuralLM(lm.model, v, spread_unk=False).score_ids(ids, off)
    assert np.allclose(lm.score_ids(ids, off), raw - np.array([0, 1, 0, 0, 1, 0]) * math.log10(4), atol=1e-12)
    # score_batch: the word <unk> itself is in the vocabulary, so no share is taken off it
    literal = lm.score_batch([["<unk>"], ["zz"]])
    assert literal[0].oov.tolist() == [False, False] and literal[1].oov.tolist() == [True, False]
    assert abs(literal[0].logprobs[0] - literal[1].logprobs[0] - math.log10(4)) < 1e-9


def test_score_ids_refuses_bad_arrays() -> None:
    lm = NeuralLM(_MODELS["transformer"], VOCAB)
    for ids, off, match in (([3, 4], [0, 1], "offsets must"), ([3, 4], [1, 2], "offsets must"),
                            ([3, 4], [0, 2, 1, 2], "offsets must"), ([[3, 4]], [0, 2], "vectors"),
                            ([3, len(VOCAB)], [0, 2], "word ids of this vocabulary"),
                            ([-1, 3], [0, 2], "word ids of this vocabulary"), (["a"], [0, 1], "ids and offsets")):
        with pytest.raises(InputError, match=match):
            lm.score_ids(ids, off)
    with pytest.raises(ConfigError, match="eos"):
        lm.score_ids([3], [0, 1], eos="yes")  # type: ignore[arg-type]


def test_scoring_without_the_compiled_trie_gives_the_same_scores(model: torch.nn.Module,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import privasr.lm.neural.trie as trie_mod

    lm = NeuralLM(model, VOCAB, batch_tokens=40, row_len=16, out_rows=7)
    compiled = [lm.score_batch(SENTS, eos=e) for e in (True, False)]
    monkeypatch.setattr(trie_mod, "_compiled", None)
    for e, ref in zip((True, False), compiled, strict=True):
        assert _max_diff(lm.score_batch(SENTS, eos=e), ref) == 0.0
