"""FMP's inputs: word ids, the background unigram, clients from N-best lists, the DP settings of a run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privasr.corpus.records import Hypothesis, NBest
from privasr.federated.algorithms.fmp import FmpClient
from privasr.federated.algorithms.fmp_data import WordIds, background_unigram, build_clients, dp_settings


def _nb(uid: str, client: str, order: int, *hyps: tuple[str, ...], speaker: str | None = None,
        ref: tuple[str, ...] | None = None) -> NBest:
    return NBest(uid, tuple(Hypothesis(h) for h in hyps), client=client, speaker=speaker, order=order, ref=ref)


def test_word_ids_put_the_specials_first_and_words_by_count():
    v = WordIds.build([["b", "<s>", "a", "b"], ["c", "a", "b", "</s>"]])
    assert v.words == ("<unk>", "<s>", "</s>", "b", "a", "c")
    assert (v.unk_id, v.bos_id, v.eos_id, len(v)) == (0, 1, 2, 6)
    assert v.encode(["c", "zz", "b"]) == [5, 0, 3]


def test_background_unigram_is_add_one_with_one_end_of_sentence_per_sentence():
    v = WordIds.build([["a", "b", "a"]])
    u = background_unigram([["a", "b", "a"], ["zz"]], v)
    # <unk> 1+1, <s> 1, </s> 1+2, a 1+2, b 1+1 -> 11
    assert u.tolist() == pytest.approx([2 / 11, 1 / 11, 3 / 11, 3 / 11, 2 / 11])
    assert u.sum() == pytest.approx(1.0)


def test_build_clients_groups_orders_and_splits_into_rounds():
    v = WordIds.build([["a", "b", "c"]])
    nbs = [_nb("m1-2", "m1", 2, ("a", "b"), ("a",)), _nb("m2-1", "m2", 1, ("c",)),
           _nb("m1-1", "m1", 1, ("b", "zz"), ("c",), ("a",)), _nb("m1-3", "m1", 3, ("c", "c"))]
    offsets = np.array([0, 2, 3, 6, 7])
    totals = np.arange(7, dtype=np.float64)
    clients = build_clients(nbs, totals, offsets, v, "client", rounds=1, bias_weight=0.5)
    assert all(isinstance(c, FmpClient) for c in clients)
    by_id = {c.id: c for c in clients}
    assert sorted(by_id) == ["m1", "m2"]
    m1 = by_id["m1"]
    assert [[u.utt_id for u in g] for g in m1.groups] == [["m1-1", "m1-2"], ["m1-3"]]
    first = m1.groups[0][0]
    # unknown words are left out of the ids; the base scores are that list's slice of the totals
    assert [w.tolist() for w in first.word_ids] == [[v.encode(["b"])[0]], v.encode(["c"]), v.encode(["a"])]
    assert first.base.tolist() == [3.0, 4.0, 5.0] and first.bias_weight == 0.5
    assert [[u.utt_id for u in g] for g in by_id["m2"].groups] == [["m2-1"], []]


def test_build_clients_by_speaker_and_the_oracle_entry():
    v = WordIds.build([["a", "b"]])
    nbs = [_nb("u1", "m1", 1, ("a",), ("b",), speaker="s1", ref=("b", "b")),
           _nb("u2", "m1", 2, ("b",), speaker="s2", ref=("a",))]
    clients = build_clients(nbs, np.array([1.0, 2.0, 3.0]), np.array([0, 2, 3]), v, "speaker", rounds=0,
                            oracle=True)
    assert sorted(c.id for c in clients) == ["s1", "s2"]
    u1 = next(c for c in clients if c.id == "s1").groups[0][0]
    assert [w.tolist() for w in u1.word_ids] == [v.encode(["b", "b"]), v.encode(["a"]), v.encode(["b"])]
    assert u1.base.tolist() == [-1e300, 1.0, 2.0]


def test_dp_settings_add_unit_cap_and_the_noise_threshold():
    fmp = {"alpha": 0.5, "beta": 0.25}
    dp = {"epsilon": 0.5, "unit": "user", "cap": 2.0, "threshold_sd": 2.0}
    s = dp_settings(fmp, dp, rounds=3)
    assert s == {"alpha": 0.5, "beta": 0.25, "dp_unit": "user", "dp_cap": 2.0,
                 "qbar_threshold": 2.0 * 4.0 * math.sqrt(8.0)}
    assert fmp == {"alpha": 0.5, "beta": 0.25}  # the input is not changed
    assert dp_settings({**fmp, "qbar_threshold": 0.0}, dp, 3)["qbar_threshold"] == 0.0
    assert dp_settings(fmp, {"epsilon": 1.0, "unit": "utterance", "cap": 1.0}, 0)["qbar_threshold"] == (
        3.0 * 1.0 * math.sqrt(2.0))


def test_nnlm_normalizer_is_the_log_partition_sum(tmp_path):
    torch = pytest.importorskip("torch")

    from privasr.corpus.records import Hypothesis, NBest
    from privasr.federated.algorithms.fmp import FmpUtterance
    from privasr.federated.algorithms.fmp_data import nnlm_normalizer
    from privasr.lm.neural.models import NeuralLMConfig, build_model
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.neural.vocab import Vocabulary

    v = Vocabulary.build([["a", "b", "c"]])
    torch.manual_seed(0)
    lm = NeuralLM(build_model(NeuralLMConfig.preset("tiny-transformer"), v), v)
    nb = NBest("u", (Hypothesis.from_text("a b"), Hypothesis.from_text("c")))
    f = np.array([0.0, 0.0, 0.0, 0.7, -0.3, 0.2])
    got = nnlm_normalizer(lm, [nb])(FmpUtterance("u", ([3, 4], [5]), [0.0, 0.0]), f)
    # brute force: ln Z(h) = ln sum_v p(v|h) exp(f(v)) at every history of each hypothesis (</s> included)
    want = []
    for words in (["a", "b"], ["c"]):
        hist = [words[:k] for k in range(len(words) + 1)]
        d = lm.distributions(hist) * np.log(10)  # natural-log next-word distributions
        want.append(float(np.sum(np.log(np.exp(d + f).sum(axis=1)))))
    assert np.allclose(got, want, atol=1e-5)
