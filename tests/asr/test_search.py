"""Tests of privasr.asr.search: greedy / beam search for seq2seq and CTC, N-best conventions, overfitted models."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.asr.models import EOS_ID, AcousticConfig, build_model, collate  # noqa: E402
from privasr.asr.search import (  # noqa: E402
    UnitHypothesis,
    ctc_beam_search,
    ctc_greedy,
    ctc_prefix_beam_search,
    decode,
    decode_to_jsonl,
    joint_rescore,
    seq2seq_beam_search,
    seq2seq_greedy,
    to_nbest,
)
from privasr.asr.train import Example, evaluate, train  # noqa: E402
from privasr.asr.units import CharTokenizer  # noqa: E402
from privasr.corpus.formats.nbest_jsonl import read_nbest  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402

TOK = CharTokenizer.train([("ABC", "DE")])  # 10 units


def _batch(seed=0, lengths=(9, 4, 13), dim=8):
    g = torch.Generator().manual_seed(seed)
    b = collate([torch.randn(n, dim, generator=g) for n in lengths])
    return b.feats, b.feat_lengths


def _seq2seq(seed=0, **kw):
    return build_model(AcousticConfig.preset("tiny", **kw), TOK, seed=seed)


# ------------------------------------------------------------------------------------------- seq2seq


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_len", [None, 2])
def test_beam_one_equals_greedy(seed, max_len):
    m = _seq2seq(seed)
    x, n = _batch(seed)
    greedy = seq2seq_greedy(m, x, n, max_len=max_len)
    beam = seq2seq_beam_search(m, x, n, beam=1, max_len=max_len)
    assert [b[0].units for b in beam] == [h.units for h in greedy]
    assert [b[0].finished for b in beam] == [h.finished for h in greedy]
    for b, h in zip(beam, greedy, strict=True):
        assert b[0].logprob == pytest.approx(h.logprob, abs=1e-5)
    assert all(len(b) == 1 for b in beam)
    if max_len == 2:
        assert all(len(h.units) <= 2 for h in greedy)


def test_beam_hypotheses_sorted_and_logprob_is_model_probability():
    m = _seq2seq(3)
    x, n = _batch(3)
    out = seq2seq_beam_search(m, x, n, beam=5, max_len=6)
    for k, hyps in enumerate(out):
        assert 1 <= len(hyps) <= 5
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({h.units for h in hyps}) == len(hyps)
        for h in hyps:
            assert EOS_ID not in h.units and all(u >= 3 for u in h.units)
            if h.finished:  # the teacher-forced loss of the same units is minus the search's log-probability
                loss, _ = m.loss(collate([x[k, : int(n[k])]], [list(h.units)]))
                assert abs(-float(loss.detach()) - h.logprob) < 1e-4


def test_wider_beam_finds_at_least_as_good_best():
    m = _seq2seq(4)
    x, n = _batch(4)
    narrow = seq2seq_beam_search(m, x, n, beam=1, max_len=5)
    wide = seq2seq_beam_search(m, x, n, beam=6, max_len=5)
    for a, b in zip(narrow, wide, strict=True):
        if a[0].finished and b[0].finished:
            assert b[0].score >= a[0].score - 1e-9


def test_length_normalisation_ranks_by_total():
    m = _seq2seq(5)
    x, n = _batch(5, lengths=(10,))
    nbs = decode(m, TOK, [x[0]], ["u"], beam=4, length_norm=1.0, length_penalty=0.5, max_len=5)
    totals = [h.scores["total"] for h in nbs[0]]
    assert totals == sorted(totals, reverse=True)
    raw = seq2seq_beam_search(m, x, n, beam=4, max_len=5)[0]
    assert all("total" not in h.scores for h in to_nbest("u", raw, TOK))


def test_search_argument_errors():
    m = _seq2seq()
    x, n = _batch()
    with pytest.raises(ConfigError, match="nbest=5 is larger than beam=2"):
        seq2seq_beam_search(m, x, n, beam=2, nbest=5)
    with pytest.raises(ConfigError, match="beam=0"):
        seq2seq_beam_search(m, x, n, beam=0)
    with pytest.raises(ConfigError, match="needs a Seq2SeqModel"):
        seq2seq_greedy(build_model(AcousticConfig.preset("tiny", arch="ctc"), TOK), x, n)
    with pytest.raises(ConfigError, match="has no CTC head"):
        ctc_greedy(m, x, n)
    with pytest.raises(InputError, match="utterance 1: zero-length input"):
        seq2seq_greedy(m, x, torch.tensor([9, 0, 13]))
    with pytest.raises(InputError, match="empty batch"):
        seq2seq_beam_search(m, torch.zeros(0, 3, 8), torch.zeros(0, dtype=torch.long))
    with pytest.raises(InputError, match="utterance 'b': zero-length features"):
        decode(m, TOK, [np.zeros((3, 8)), np.zeros((0, 8))], ["a", "b"])
    with pytest.raises(ConfigError, match="method='viterbi'"):
        decode(m, TOK, [np.zeros((3, 8))], ["a"], method="viterbi")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="2 feature arrays but 1 utterance ids"):
        decode(m, TOK, [np.zeros((3, 8))] * 2, ["a"])


# ----------------------------------------------------------------------------------------------- CTC


def _brute_force_ctc(lp: np.ndarray, blank: int = 0) -> dict[tuple[int, ...], float]:
    t, v = lp.shape
    probs: dict[tuple[int, ...], float] = {}
    for path in itertools.product(range(v), repeat=t):
        out, last = [], None
        for u in path:
            if u != last and u != blank:
                out.append(u)
            last = u
        p = math.exp(sum(lp[i, u] for i, u in enumerate(path)))
        probs[tuple(out)] = probs.get(tuple(out), 0.0) + p
    return probs


def test_prefix_beam_search_is_exact_without_pruning():
    g = np.random.default_rng(0)
    logits = g.normal(size=(4, 3)) * 2
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    exact = _brute_force_ctc(lp)
    hyps = ctc_prefix_beam_search(lp, beam=50, exclude=())
    assert {h.units for h in hyps} == set(exact)
    for h in hyps:
        assert abs(math.exp(h.logprob) - exact[h.units]) < 1e-9
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    top = ctc_prefix_beam_search(lp, beam=50, nbest=2, exclude=())
    assert [h.units for h in top] == sorted(exact, key=lambda k: -exact[k])[:2]


def test_prefix_beam_search_input_errors():
    with pytest.raises(InputError, match="frames >= 1"):
        ctc_prefix_beam_search(np.zeros((0, 3)))
    with pytest.raises(ConfigError, match="blank=5"):
        ctc_prefix_beam_search(np.zeros((2, 3)), blank=5)
    with pytest.raises(ConfigError, match="unit_beam=0"):
        ctc_prefix_beam_search(np.zeros((2, 3)), unit_beam=0)


def test_ctc_greedy_score_is_sequence_logprob():
    m = build_model(AcousticConfig.preset("tiny", arch="ctc"), TOK, seed=0)
    x, n = _batch(1)
    lp, ln = m.log_probs(x, n)
    for k, h in enumerate(ctc_greedy(m, x, n)):
        ref = -float(torch.nn.functional.ctc_loss(lp[k, : int(ln[k])][:, None].detach(),
                                                  torch.tensor([list(h.units) or [0]]), torch.tensor([int(ln[k])]),
                                                  torch.tensor([len(h.units)]), reduction="sum"))
        assert abs(h.logprob - ref) < 1e-5
    beams = ctc_beam_search(m, x, n, beam=4, nbest=2)
    assert all(len(b) == 2 and b[0].score >= b[1].score for b in beams)


# -------------------------------------------------------------------------------------------- N-best


def test_to_nbest_merges_duplicate_words_and_sorts():
    hyps = [UnitHypothesis((5, 6), -3.0, -3.0), UnitHypothesis((5, 6, 4), -1.0, -1.0),
            UnitHypothesis((8,), -2.0, -2.0, finished=False), UnitHypothesis((), -5.0, -5.0)]
    nb = to_nbest("u", hyps, TOK, ref=("AB",), speaker="s", client="c", meta={"search": "x"})
    assert [h.text for h in nb] == ["AB", "D", ""]
    assert [h.scores["am"] for h in nb] == [-1.0, -2.0, -5.0]
    assert nb.hyps[1].meta["finished"] is False and not nb.hyps[0].meta
    assert (nb.utt_id, nb.ref, nb.speaker, nb.client, nb.meta["search"]) == ("u", ("AB",), "s", "c", "x")


@pytest.mark.parametrize("arch", ["seq2seq", "ctc"])
def test_decode_nbest_conventions_and_jsonl(tmp_path, arch):
    m = build_model(AcousticConfig.preset("tiny", arch=arch), TOK, seed=2)
    g = np.random.default_rng(0)
    feats = [g.normal(size=(n, 8)).astype(np.float32) for n in (6, 12, 3)]
    ids = ["a", "b", "c"]
    path = tmp_path / "am.jsonl"
    nbs = decode_to_jsonl(path, m, TOK, feats, ids, beam=6, nbest=4, batch_size=2, speakers=["s1", "s1", "s2"],
                          refs=[("AB",), ("C", "DE"), ()])
    assert [nb.utt_id for nb in nbs] == ids
    for nb in nbs:
        assert 1 <= len(nb) <= 4
        am = [h.scores["am"] for h in nb]
        assert am == sorted(am, reverse=True) and all(s <= 0 for s in am)
        assert len({h.words for h in nb}) == len(nb)
        assert nb.meta == {"search": f"{'attention' if arch == 'seq2seq' else 'ctc'}-beam", "beam": 6}
    assert read_nbest(path) == nbs
    greedy = decode(m, TOK, feats, ids, method="greedy")
    assert all(len(nb) == 1 for nb in greedy)


def test_joint_model_decodes_with_either_head():
    m = build_model(AcousticConfig.preset("tiny", ctc_weight=0.5), TOK, seed=0)
    feats = [np.ones((5, 8), np.float32)]
    assert decode(m, TOK, feats, ["u"], head="ctc", method="greedy")[0].meta["search"] == "ctc-greedy"
    assert decode(m, TOK, feats, ["u"], method="greedy")[0].meta["search"] == "attention-greedy"
    nb = decode(m, TOK, feats, ["u"], head="joint", method="beam", beam=3)[0]
    assert nb.meta == {"search": "joint-beam", "beam": 3, "ctc_weight": 0.5}
    assert [h.scores["total"] for h in nb] == sorted((h.scores["total"] for h in nb), reverse=True)


def test_joint_rescore_is_the_weighted_sum_of_both_heads():
    m = _seq2seq(ctc_weight=0.3)
    x, n = _batch()
    beams = seq2seq_beam_search(m, x, n, beam=4, max_len=6)
    with torch.inference_mode():
        lp, ln = m.ctc_log_probs(x, n)
    for w in (0.0, 0.3, 1.0):
        out = joint_rescore(m, x, n, beams, ctc_weight=w)
        for b, hs in enumerate(out):
            assert sorted(h.units for h in hs) == sorted(h.units for h in beams[b])
            assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
            for h in hs:
                t = int(ln[b])
                nll = torch.nn.functional.ctc_loss(lp[b, :t, None].float(), torch.tensor([list(h.units) or [0]]),
                                                   torch.tensor([t]), torch.tensor([len(h.units)]),
                                                   reduction="sum")
                ctc = -float(nll) if math.isfinite(float(nll)) else -1e9
                assert h.score == pytest.approx((1 - w) * h.logprob + w * ctc, rel=1e-5, abs=1e-4)
    # weight 0 keeps the attention order
    assert [[h.units for h in hs] for hs in joint_rescore(m, x, n, beams, ctc_weight=0.0)] == \
        [[h.units for h in sorted(hs, key=lambda h: (-h.logprob, h.units))] for hs in beams]


def test_joint_rescore_penalises_units_the_frames_cannot_hold():
    m = _seq2seq(ctc_weight=0.3)
    x, n = _batch(lengths=(3,))
    long_h = UnitHypothesis(tuple([4, 5] * 4), -1.0, -1.0)  # 8 units > 3 frames: no CTC alignment
    short_h = UnitHypothesis((4,), -5.0, -5.0)
    out = joint_rescore(m, x, n, [[long_h, short_h]], ctc_weight=0.5)[0]
    assert out[0].units == (4,) and out[1].score < -1e8


def test_joint_search_errors():
    x, n = _batch()
    feats = [np.ones((5, 8), np.float32)]
    with pytest.raises(ConfigError, match="CTC head"):
        decode(_seq2seq(), TOK, feats, ["u"], head="joint", method="beam")
    with pytest.raises(ConfigError, match="method='beam'"):
        decode(_seq2seq(ctc_weight=0.3), TOK, feats, ["u"], head="joint", method="greedy")
    with pytest.raises(ConfigError, match="ctc_weight"):
        joint_rescore(_seq2seq(ctc_weight=0.3), x, n, [[], [], []], ctc_weight=-0.1)
    with pytest.raises(ConfigError, match="ctc_weight"):
        decode(_seq2seq(ctc_weight=0.3), TOK, feats, ["u"], head="joint", method="beam", ctc_weight="high")
    with pytest.raises(InputError, match="hypothesis lists"):
        joint_rescore(_seq2seq(ctc_weight=0.3), x, n, [[]], ctc_weight=0.3)


# ------------------------------------------------------------------------------------ overfitted models


def _synthetic(n=8, seed=0):
    g = np.random.default_rng(seed)
    letters = list("ABCDEFG")
    words = [("".join(g.choice(letters, size=int(g.integers(3, 6)))),) for _ in range(n)]
    tok = CharTokenizer.train(words)
    data = [Example(f"u{i}", "s", w, g.normal(size=(int(g.integers(12, 20)), 8)).astype(np.float32),
                    tuple(tok.encode(w))) for i, w in enumerate(words)]
    return tok, data


@pytest.fixture(scope="module")
def overfitted():
    torch.set_num_threads(1)
    tok, data = _synthetic()
    models = {}
    for arch in ("ctc", "seq2seq"):
        m = build_model(AcousticConfig.preset("tiny", arch=arch, enc_hidden=32, dec_hidden=32), tok, seed=0)
        train(m, torch.optim.Adam(m.parameters(), 1e-2), data, steps=250, batch_size=8, seed=0)
        models[arch] = m
    return tok, data, models


@pytest.mark.parametrize("arch", ["ctc", "seq2seq"])
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_overfitted_model_recovers_labels(overfitted, arch, method):
    tok, data, models = overfitted
    ev = evaluate(models[arch], tok, data, method=method, beam=4)
    assert [nb.best.words for nb in ev.nbest] == [e.words for e in data]
    assert ev.wer.wer == 0.0 and ev.cer.wer == 0.0
    if method == "beam":
        assert all(nb.best.scores["am"] > -0.5 for nb in ev.nbest)
