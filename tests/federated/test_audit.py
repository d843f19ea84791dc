"""Attacks on what a federated server sees (privasr.federated.audit): the recorded views, FMP membership on
per-client uploads and on aggregates, fedlm word-set reconstruction and canaries."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig
from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpClient, FmpConfig, FmpUtterance
from privasr.federated.audit import (
    MembershipTrials,
    RecordingBackend,
    WordSetResult,
    aggregate_recorder,
    client_word_set,
    cohort_word_set_scores,
    embedding_word_set,
    fmp_aggregate_trials,
    fmp_canary_count,
    fmp_membership_scores,
    fmp_trial_runner,
    noisy_word_set_scores,
    plant_fedlm,
    plant_fmp,
    sentence_log_perplexity,
    sum_updates,
    unused_ids,
    word_set_scores,
)
from privasr.federated.backends import run_on
from privasr.federated.backends.local import LocalBackend
from privasr.federated.core import ClientOutcome, Update, run_client
from privasr.federated.loop import PrivacySettings, run_federated
from privasr.federated.sampling import AllClients, UniformWithoutReplacement
from privasr.lm.neural.models import NeuralLMConfig
from privasr.lm.neural.vocab import Vocabulary
from privasr.privacy.dp.accounting import PrivacyAccountant
from privasr.privacy.dp.mechanisms import GaussianMechanism, LaplaceMechanism

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --------------------------------------------------------------------------------------------------------------
# FMP helpers: clients use word ids 1..9 of a vocabulary of 16; 10..15 are free for canaries

V = 16


def _fmp_clients(n: int = 6, seed: int = 0, groups: int = 2) -> list[FmpClient]:
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        gs = []
        for g in range(groups):
            utts = []
            for k in range(2):
                hyps = tuple(rng.integers(1, 10, size=int(rng.integers(1, 5))) for _ in range(3))
                utts.append(FmpUtterance(f"c{c}g{g}u{k}", hyps, np.sort(rng.normal(size=3))[::-1].copy(), 0.7))
            gs.append(tuple(utts))
        out.append(FmpClient(f"client{c}", tuple(gs)))
    return out


def _fmp(**kw) -> FmpAlgorithm:
    u = np.random.default_rng(5).uniform(0.5, 2.0, size=V)
    return FmpAlgorithm(FmpConfig(**kw), u / u.sum())


# --------------------------------------------------------------------------------------------------------------
# what the server sees


def test_recording_backend_passes_outcomes_through_and_records_each_upload():
    clients = _fmp_clients()
    alg = _fmp()
    plain = run_federated(alg, clients, rounds=2, sampler=AllClients(), seed=3)
    rec = RecordingBackend()
    on_round, aggs = aggregate_recorder("sum")
    res = run_federated(alg, clients, rounds=2, sampler=AllClients(), seed=3, backend=rec, on_round=on_round)
    np.testing.assert_array_equal(res.state["sum"], plain.state["sum"])
    assert sorted(rec.views) == [0, 1] and all(sorted(v) == list(range(6)) for v in rec.views.values())
    assert rec.name == "recording(local)" and rec.secagg is None
    # each recorded update is what that client sent (same seed -> same update)
    task = SimpleNamespace(client=clients[2], state=None, seed=(3, 0, 2, 2, 1))
    again, _ = run_client(alg, rec.payloads[0], task)
    np.testing.assert_array_equal(rec.views[0][2].arrays["counts"], again.arrays["counts"])
    # the per-round aggregate is the sum of the round's uploads (no DP), and the rounds add up to the state
    for r in (0, 1):
        dense = np.zeros(V)
        for u in rec.views[r].values():
            dense[u.arrays["ids"]] += u.arrays["counts"]
        np.testing.assert_allclose(aggs[r].value, dense)
        assert aggs[r].round == r
    np.testing.assert_allclose(aggs[0].value + aggs[1].value, res.state["sum"])
    # the broadcast of round 1 is the qbar after round 0
    assert rec.payloads[1]["round"] == 1 and rec.payloads[1]["qbar"].size == V


def test_recording_only_chosen_rounds_with_sampling_and_clear():
    clients = _fmp_clients()
    rec = RecordingBackend(LocalBackend(), rounds={1})
    run_federated(_fmp(), clients, rounds=2, sampler=UniformWithoutReplacement(3), seed=1, backend=rec)
    assert list(rec.views) == [1] and len(rec.views[1]) == 3 and list(rec.payloads) == [1]
    assert all(u.round == 1 for u in rec.uploads)
    rec.clear()
    assert rec.views == {} and rec.payloads == {}
    with pytest.raises(ConfigError, match="without run"):
        RecordingBackend(object())


class _SecureLocal(LocalBackend):
    """A stand-in for a secure-aggregation backend: it sums the updates itself and returns no update."""

    secagg = SimpleNamespace(noise="server")

    def run_secure(self, algorithm, payload, tasks, timeout=None, noise=None):
        acc, outs = None, []
        for out in self.run(algorithm, payload, tasks, timeout):
            acc = algorithm.accumulate(acc, out.update)
            outs.append(ClientOutcome(out.slot, out.index, None, out.state))
        return outs, acc, 0.0


def test_recording_under_secure_aggregation_sees_only_the_sum():
    clients = _fmp_clients(4)
    rec = RecordingBackend(_SecureLocal())
    on_round, aggs = aggregate_recorder("sum")
    res = run_federated(_fmp(), clients, rounds=1, sampler=AllClients(), backend=rec, on_round=on_round)
    plain = run_federated(_fmp(), clients, rounds=1, sampler=AllClients())
    assert rec.views == {} and rec.secagg is not None
    np.testing.assert_allclose(aggs[0].value, plain.state["sum"])
    np.testing.assert_allclose(res.state["sum"], plain.state["sum"])


def test_aggregate_recorder_cumulative_dicts_and_errors():
    cb, aggs = aggregate_recorder("p", initial={"w": np.ones(2)})
    cb(SimpleNamespace(round=4, metrics={"epsilon": 1.5}), {"p": {"w": np.array([2.0, 1.0])}})
    assert aggs[0].round == 4 and aggs[0].value["w"].tolist() == [1.0, 0.0] and aggs[0].metrics == {"epsilon": 1.5}
    cb2, aggs2 = aggregate_recorder("sum", cumulative=True)
    cb2(None, {"sum": np.array([3.0])})
    cb2(None, {"sum": np.array([1.0])})
    assert [a.value.tolist() for a in aggs2] == [[3.0], [1.0]]
    with pytest.raises(InputError, match="no entry 'sum'"):
        cb2(None, {"params": {}})
    with pytest.raises(InputError, match="no updates"):
        sum_updates([])


def test_cumulative_fmp_aggregate_is_the_round_sum():
    clients = _fmp_clients(4)
    alg = _fmp(send="cumulative")
    rec = RecordingBackend()
    on_round, aggs = aggregate_recorder("sum", cumulative=True)
    run_federated(alg, clients, rounds=2, sampler=AllClients(), backend=rec, on_round=on_round)
    for r in (0, 1):
        dense = np.zeros(V)
        for u in rec.views[r].values():
            dense[u.arrays["ids"]] += u.arrays["counts"]
        np.testing.assert_allclose(aggs[r].value, dense)


# --------------------------------------------------------------------------------------------------------------
# FMP membership


def test_plant_fmp_adds_canary_utterances_without_touching_the_input():
    clients = _fmp_clients()
    before = [(c.id, c.n_utterances) for c in clients]
    canary = unused_ids(clients, V)[:2]
    assert canary.tolist() == [10, 11]
    planted = plant_fmp(clients, V, canary, np.array([True, False, True, False, False, False]),
                        np.random.default_rng(0), repeats=3)
    assert [(c.id, c.n_utterances) for c in clients] == before
    assert planted[1] is clients[1] and planted[0] is not clients[0]
    assert planted[0].n_utterances == clients[0].n_utterances + 3
    new = [u for u in planted[0].groups[0] if u.utt_id.startswith("canary")]
    assert len(new) == 3 and len(planted[0].groups) == 2
    for u in new:
        assert all(set(canary.tolist()) <= set(h.tolist()) for h in u.word_ids)
    # a client without utterances gets one that is only the canary
    [lone] = plant_fmp([FmpClient("empty", ())], V, [12], [0], np.random.default_rng(0))
    assert [h.tolist() for h in lone.groups[0][0].word_ids] == [[12]]
    for bad, match in (([16], "word ids in"), ([10, 10], "repeat"), ([], "non-empty")):
        with pytest.raises(InputError, match=match):
            plant_fmp(clients, V, bad, [0], np.random.default_rng(0))
    with pytest.raises(InputError, match="repeats"):
        plant_fmp(clients, V, [10], [0], np.random.default_rng(0), repeats=0)
    with pytest.raises(InputError, match="index 6"):
        plant_fmp(clients, V, [10], [6], np.random.default_rng(0))
    with pytest.raises(InputError, match="mask of length 2"):
        plant_fmp(clients, V, [10], [True, False], np.random.default_rng(0))


def test_per_client_fmp_uploads_reveal_the_planted_words_exactly():
    """The attack clearly succeeds without secure aggregation: members score > 0, non-members exactly 0."""
    clients = _fmp_clients(8)
    canary = unused_ids(clients, V)[:2]
    members = [1, 2, 5, 6]
    planted = plant_fmp(clients, V, canary, members, np.random.default_rng(1), repeats=2)
    rec = RecordingBackend()
    run_federated(_fmp(sigma=0.01), planted, rounds=2, sampler=AllClients(), backend=rec)
    t = fmp_membership_scores(rec.views, canary, members)
    assert t.ids.tolist() == list(range(8)) and t.n == 8 and t.n_members == 4
    assert t.labels.tolist() == [i in members for i in range(8)]
    # sigma 0.01 keeps only the 1-best: 2 planted utterances x 2 canary words, each counted once
    assert t.scores[t.labels].tolist() == [4.0] * 4 and t.scores[~t.labels].tolist() == [0.0] * 4
    # round 1 sends only the counts added since: the canaries are not in it
    assert fmp_membership_scores(rec.views, canary, members, round=1).scores.tolist() == [0.0] * 8
    # a boolean mask works the same
    mask = np.isin(np.arange(8), members)
    assert fmp_membership_scores(rec.views, canary, mask).labels.tolist() == mask.tolist()
    with pytest.raises(InputError, match="no uploads recorded for round 5"):
        fmp_membership_scores(rec.views, canary, members, round=5)
    with pytest.raises(InputError, match="mask of length 3"):
        fmp_membership_scores(rec.views, canary, [True, False, True])


def test_per_client_uploads_are_seen_before_the_dp_noise():
    """With central DP the server still sees each client's capped counts: members keep scoring > 0, others 0."""
    clients = _fmp_clients(4)
    canary = unused_ids(clients, V)[:1]
    planted = plant_fmp(clients, V, canary, [0, 3], np.random.default_rng(2))
    alg = _fmp(dp_unit="user", dp_cap=2.0)
    priv = PrivacySettings(LaplaceMechanism(2.0, 1.0), PrivacyAccountant("pld", target_delta=1e-5),
                           composition=alg.config.privacy_composition())
    rec = RecordingBackend()
    run_federated(alg, planted, rounds=1, sampler=AllClients(), backend=rec, privacy=priv)
    t = fmp_membership_scores(rec.views, canary, [0, 3])
    assert np.all(t.scores[t.labels] > 0) and np.all(t.scores[t.labels] <= 2.0)
    assert np.all(t.scores[~t.labels] == 0)


def test_fmp_canary_count_and_trials_validation():
    u = Update({"ids": np.array([2, 10]), "counts": np.array([1.0, 3.0])})
    assert fmp_canary_count(u, [10, 11]) == 3.0
    assert fmp_canary_count(np.arange(V, dtype=float), [10, 11]) == 21.0
    with pytest.raises(InputError, match="dense count vector"):
        fmp_canary_count(np.zeros(5), [10])
    with pytest.raises(InputError, match="arrays"):
        fmp_canary_count(Update({"x": np.zeros(2)}), [1])
    with pytest.raises(InputError, match="same length"):
        MembershipTrials(np.zeros(2), np.zeros(3, bool), np.arange(2))
    with pytest.raises(ConfigError, match="n_trials"):
        fmp_aggregate_trials(lambda m, r: 0.0, 0, np.random.default_rng(0))
    with pytest.raises(InputError, match="a number"):
        fmp_aggregate_trials(lambda m, r: "x", 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="round"):
        fmp_trial_runner(_fmp(), _fmp_clients(2), [10], sampler=AllClients(), rounds=1, round=1)


def test_aggregate_trials_without_dp_separate_members_from_non_members():
    clients = _fmp_clients(5)
    canary = unused_ids(clients, V)[:1]
    backend = RecordingBackend()  # a backend object: reused by every trial and left open
    run = fmp_trial_runner(_fmp(), clients, canary, sampler=AllClients(), rounds=2, backend=backend)
    t = fmp_aggregate_trials(run, 10, np.random.default_rng(4))
    assert 0 < t.n_members < 10 and t.ids.tolist() == list(range(10))
    assert np.all(t.scores[t.labels] > 0) and np.all(t.scores[~t.labels] == 0)
    # every trial ran: 2 rounds x 5 clients each
    assert len(backend.uploads) == 10 * 2 * 5
    # same generator seed, same trials
    again = fmp_aggregate_trials(fmp_trial_runner(_fmp(), clients, canary, sampler=AllClients(), rounds=2),
                                 10, np.random.default_rng(4))
    np.testing.assert_array_equal(again.scores, t.scores)
    np.testing.assert_array_equal(again.labels, t.labels)


def test_aggregate_trials_with_laplace_noise_are_noisy_at_the_laplace_scale():
    clients = _fmp_clients(4, groups=1)
    canary = unused_ids(clients, V)[:1]
    alg = _fmp(dp_unit="user", dp_cap=1.0, sigma=0.01)

    def privacy():
        return PrivacySettings(LaplaceMechanism(1.0, 0.5), PrivacyAccountant("pld", target_delta=1e-5),
                               composition="parallel")

    run = fmp_trial_runner(alg, clients, canary, sampler=AllClients(), privacy=privacy)
    t = fmp_aggregate_trials(run, 40, np.random.default_rng(0))
    non = t.scores[~t.labels]
    assert non.size >= 10 and np.all(non != 0)  # noise everywhere: a non-member is no longer exactly 0
    # Laplace(b = dp_cap / epsilon = 2): mean absolute deviation 2
    assert 1.0 < np.mean(np.abs(non)) < 3.5


# --------------------------------------------------------------------------------------------------------------
# fedlm word sets

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]  # ids 3..10


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return Vocabulary(("<unk>", "<s>", "</s>", *WORDS))


def _fedlm(vocab, model=None, **kw) -> FedLmAlgorithm:
    kw = {"server": "fedavg", "batch_size": 4, "client_lr": 0.5, **kw}
    return FedLmAlgorithm(FedLmConfig(**kw), model or NeuralLMConfig.preset("tiny-transformer"), vocab)


FEDLM_CLIENTS = [FedLmClient("c0", ((3, 4), (4, 5, 3))), FedLmClient("c1", ((6, 7),)),
                 FedLmClient("c2", ((8, 0, 9),))]


def test_client_deltas_reveal_their_word_sets_exactly(vocab):
    """The attack clearly succeeds without noise: precision and recall 1, <s> always, <unk> when used."""
    rec = RecordingBackend()
    run_federated(_fedlm(vocab), FEDLM_CLIENTS, rounds=1, sampler=AllClients(), backend=rec)
    results = word_set_scores(rec.views[0], FEDLM_CLIENTS)
    assert [(r.precision, r.recall) for r in results] == [(1.0, 1.0)] * 3
    assert [sorted(r.found_words) for r in results] == [[3, 4, 5], [6, 7], [8, 9]]
    assert [sorted(r.special_found) for r in results] == [[1], [1], [0, 1]]  # </s> is never an input
    # the same with a list aligned to the clients, and with a clipped delta (DP-FedAvg clips before sending)
    rec2 = RecordingBackend()
    run_federated(_fedlm(vocab, clip_norm=0.01, weighting="uniform"), FEDLM_CLIENTS, rounds=1,
                  sampler=AllClients(), backend=rec2)
    ups = [rec2.views[0][i] for i in range(3)]
    assert all(u.metrics["clipped"] == 1.0 for u in ups)
    assert [(r.precision, r.recall) for r in word_set_scores(ups, FEDLM_CLIENTS)] == [(1.0, 1.0)] * 3
    with pytest.raises(InputError, match="2 updates for 3 clients"):
        word_set_scores(ups[:2], FEDLM_CLIENTS)
    with pytest.raises(InputError, match="no array 'emb'"):
        embedding_word_set(ups[0], "emb")


def test_dropped_utterances_and_tied_embeddings(vocab):
    cfg = FedLmConfig(loss="threshold", threshold=0.5, server="fedavg")
    client = FedLmClient("t", ((3, 4), (9, 10)), (np.ones(2), np.full(2, 0.1)))
    assert client_word_set(client, cfg) == {3, 4} and client_word_set(client) == {3, 4, 9, 10}
    alg = FedLmAlgorithm(cfg, NeuralLMConfig.preset("tiny-transformer"), vocab)
    state = alg.init(np.random.default_rng(0))
    upd, _ = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
    [r] = word_set_scores([upd], [client], config=cfg)
    assert (r.precision, r.recall) == (1.0, 1.0)
    # tied input/output embeddings: the softmax moves every row, so the read-off is the whole vocabulary
    tied = _fedlm(vocab, NeuralLMConfig.preset("tiny-transformer").replace(tie_embeddings=True))
    st = tied.init(np.random.default_rng(0))
    u2, _ = tied.client_update(tied.broadcast(st, 0), FEDLM_CLIENTS[1], None, np.random.default_rng(1))
    [r2] = word_set_scores([u2], [FEDLM_CLIENTS[1]])
    assert r2.recall == 1.0 and r2.precision == pytest.approx(2 / 8) and 2 in r2.special_found


def test_cohort_sum_reveals_the_union_but_not_who(vocab):
    base = _fedlm(vocab)
    init = base.init(np.random.default_rng(7))["params"]
    alg = FedLmAlgorithm(base.config, base.model_config, vocab, init_state=init)
    rec = RecordingBackend()
    on_round, aggs = aggregate_recorder("params", initial=init)
    run_federated(alg, FEDLM_CLIENTS, rounds=1, sampler=AllClients(), backend=rec, on_round=on_round)
    summed = sum_updates(rec.views[0].values())
    cs = cohort_word_set_scores(summed, FEDLM_CLIENTS)
    assert (cs.union.precision, cs.union.recall) == (1.0, 1.0)
    assert sorted(cs.union.found_words) == [3, 4, 5, 6, 7, 8, 9]
    assert [r.precision for r in cs.per_client] == pytest.approx([3 / 7, 2 / 7, 2 / 7])
    assert [r.recall for r in cs.per_client] == [1.0, 1.0, 1.0]
    # the released server step (fedavg: the weighted mean delta) has the same rows
    assert embedding_word_set(aggs[0].value) == embedding_word_set(summed) == {0, 1, *range(3, 10)}
    with pytest.raises(InputError, match="empty cohort"):
        cohort_word_set_scores(summed, [])


def test_noisy_word_set_of_a_lone_client(vocab):
    alg = _fedlm(vocab, clip_norm=0.5, weighting="uniform", client_lr=1.0)
    state = alg.init(np.random.default_rng(0))
    client = FEDLM_CLIENTS[0]
    upd, _ = alg.client_update(alg.broadcast(state, 0), client, None, np.random.default_rng(1))
    clean = noisy_word_set_scores(upd, client, GaussianMechanism(0.5, 0.0), np.random.default_rng(0))
    assert (clean.precision, clean.recall) == (1.0, 1.0)
    # noise far above the signal: a 3-sigma read-off finds almost none of the client's words
    recalls = [noisy_word_set_scores(upd, client, GaussianMechanism(0.5, 20.0), np.random.default_rng(s)).recall
               for s in range(10)]
    assert np.mean(recalls) < 0.2
    # small noise: the words stand out
    mild = noisy_word_set_scores(upd, client, GaussianMechanism(0.5, 1e-4), np.random.default_rng(0))
    assert mild.recall == 1.0
    with pytest.raises(InputError, match="above the mechanism's clip_norm"):
        noisy_word_set_scores(upd, client, GaussianMechanism(0.1, 1.0), np.random.default_rng(0))
    with pytest.raises(ConfigError, match="GaussianMechanism"):
        noisy_word_set_scores(upd, client, LaplaceMechanism(1.0, 1.0), np.random.default_rng(0))


def test_word_set_result_compare_undefined_rates():
    r = WordSetResult.compare(set(), {3})
    assert math.isnan(r.precision) and r.recall == 0.0
    r = WordSetResult.compare({1, 4}, {1})
    assert r.precision == 0.0 and math.isnan(r.recall) and r.special_found == {1}


# --------------------------------------------------------------------------------------------------------------
# fedlm canaries


def test_plant_fedlm():
    clients = [FedLmClient("a", ((3, 4), (5,)), (np.array([0.5, 1.0]), np.array([0.2]))),
               FedLmClient("b", ((6,),))]
    out = plant_fedlm(clients, [(9, 9, 10), (8,)], members=[0, 1], repeats=[3, 1], rng=np.random.default_rng(0))
    assert clients[0].sentences == ((3, 4), (5,))  # the input is left as it was
    for c, p in zip(clients, out, strict=True):
        assert p.sentences.count((9, 9, 10)) == 3 and p.sentences.count((8,)) == 1
        assert sorted(s for s in p.sentences if s not in ((9, 9, 10), (8,))) == sorted(c.sentences)
    w = dict(zip(out[0].sentences, out[0].weights, strict=True))
    assert w[(9, 9, 10)].tolist() == [1.0, 1.0, 1.0] and w[(3, 4)].tolist() == [0.5, 1.0]
    assert out[1].weights is None
    same = plant_fedlm(clients, [(9,)], members=[], repeats=2, rng=np.random.default_rng(0))
    assert same[0] is clients[0] and same[1] is clients[1]
    with pytest.raises(InputError, match="one per canary"):
        plant_fedlm(clients, [(9,), (8,)], [0], [1], np.random.default_rng(0))
    with pytest.raises(InputError, match="canary 0"):
        plant_fedlm(clients, [()], [0], 1, np.random.default_rng(0))


def test_sentence_log_perplexity_matches_perplexity_and_windows(vocab):
    alg = _fedlm(vocab, NeuralLMConfig.preset("tiny-transformer").replace(max_len=4))
    params = alg.init(np.random.default_rng(0))["params"]
    sents = [(3, 4), (5, 6, 7, 8, 9, 10, 3), (4,)]  # the second is cut into two windows
    nll = sentence_log_perplexity(alg, params, sents)
    one = sentence_log_perplexity(alg, params, sents, batch_size=1)
    np.testing.assert_allclose(nll, one, rtol=1e-6)
    tokens = np.array([len(s) + 1 for s in sents])
    assert math.exp((nll * tokens).sum() / tokens.sum()) == pytest.approx(alg.perplexity(params, sents), rel=1e-6)
    for j, s in enumerate(sents):
        assert math.exp(nll[j]) == pytest.approx(alg.perplexity(params, [s]), rel=1e-6)
    assert sentence_log_perplexity(alg, params, []).shape == (0,)
    with pytest.raises(InputError, match="sentence 1"):
        sentence_log_perplexity(alg, params, [(3,), (11,)])


def test_a_planted_canary_becomes_likelier_than_unseen_candidates(vocab):
    """The premise of exposure: after training on a client holding the canary, the canary's log-perplexity
    drops below those of candidates of the same format that nobody held."""
    alg = _fedlm(vocab, local_epochs=3, client_lr=0.5)
    canary = (9, 4, 10, 7)
    rng = np.random.default_rng(3)
    candidates = [canary] + [tuple(int(x) for x in rng.integers(3, 11, size=4)) for _ in range(20)]
    ranks = []
    for repeats in (0, 10):  # 0: nobody holds the canary (the control)
        clients = plant_fedlm([FedLmClient("a", ((3, 5), (6, 8, 3))), FedLmClient("b", ((5, 6),))], [canary],
                              [0], repeats, np.random.default_rng(0))
        res = run_on(None, alg, clients, rounds=1, sampler=AllClients(), seed=0)
        after = sentence_log_perplexity(alg, res.state["params"], candidates)
        ranks.append(int((after < after[0]).sum()) + 1)
    assert ranks[0] > 5 and ranks[1] == 1  # of 21 candidates


# --------------------------------------------------------------------------------------------------------------
# on Ray


@pytest.mark.slow
def test_recording_on_ray_matches_local():
    pytest.importorskip("ray")
    from privasr.federated.backends.ray import RayBackend

    clients = _fmp_clients(4)
    canary = unused_ids(clients, V)[:1]
    planted = plant_fmp(clients, V, canary, [1, 2], np.random.default_rng(0))
    local = RecordingBackend()
    run_federated(_fmp(), planted, rounds=1, sampler=AllClients(), backend=local)
    ray = RecordingBackend(RayBackend(num_workers=1))
    try:
        run_on(ray, _fmp(), planted, rounds=1, sampler=AllClients())
    finally:
        ray.close()
    a = fmp_membership_scores(local.views, canary, [1, 2])
    b = fmp_membership_scores(ray.views, canary, [1, 2])
    np.testing.assert_array_equal(a.scores, b.scores)
    np.testing.assert_array_equal(a.labels, b.labels)
