"""Tests of federated NNLM fine-tuning (paper 001): confidence-weighted losses, FedAvg/FedAdam, DP clipping."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmClient, FedLmConfig
from privasr.federated.core import SumAccumulator
from privasr.federated.loop import PrivacySettings, run_federated
from privasr.federated.sampling import AllClients
from privasr.lm.neural.models import NeuralLMConfig, build_model
from privasr.lm.neural.train import make_batch
from privasr.lm.neural.vocab import Vocabulary
from privasr.privacy.dp.accounting import PrivacyAccountant
from privasr.privacy.dp.clip import global_norm
from privasr.privacy.dp.mechanisms import GaussianMechanism

WORDS = ["a", "b", "c", "d", "e"]  # ids 3..7


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def vocab() -> Vocabulary:
    return Vocabulary(("<unk>", "<s>", "</s>", *WORDS))


@pytest.fixture(scope="module")
def mcfg() -> NeuralLMConfig:
    return NeuralLMConfig.preset("tiny-transformer")


def make_alg(vocab, mcfg, **kw) -> FedLmAlgorithm:
    return FedLmAlgorithm(FedLmConfig(**kw), mcfg, vocab)


def rng(*s):
    return np.random.default_rng(list(s))


def test_one_client_fedavg_equals_local_training(vocab, mcfg):
    alg = make_alg(vocab, mcfg, server="fedavg", batch_size=16, client_lr=0.5)
    state = alg.init(rng(0))
    client = FedLmClient("c", ((3, 4, 5), (4, 4), (6, 7, 3, 3)))
    upd, _ = alg.client_update(alg.broadcast(state, 0), client, None, rng(1))
    new, m = alg.server_update(state, alg.accumulate(None, upd), 0, rng(2))
    # by hand: one full-batch SGD step on the mean token cross-entropy
    torch.manual_seed(123)
    model = build_model(mcfg, vocab)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(state["params"][k]))
    seqs = [np.array([1, *s, 2]) for s in client.sentences]
    x, y = make_batch(seqs)
    logits, _ = model(x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
    loss.backward()
    hand = {k: (p - 0.5 * p.grad).detach().numpy() for k, p in model.named_parameters()}
    assert set(new["params"]) == set(hand)
    moved = 0.0
    for k in hand:
        np.testing.assert_allclose(new["params"][k], hand[k], atol=2e-6, rtol=1e-5)
        moved = max(moved, float(np.abs(hand[k] - state["params"][k]).max()))
    assert moved > 1e-3  # the step is not trivially zero
    assert m["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    assert upd.weight == 9.0 and m["tokens"] == 12.0


def test_two_clients_word_weighted_mean(vocab, mcfg):
    alg = make_alg(vocab, mcfg, server="fedavg")
    state = alg.init(rng(0))
    c1 = FedLmClient("c1", ((3, 4, 5, 6),))
    c2 = FedLmClient("c2", ((7, 7),))
    payload = alg.broadcast(state, 0)
    u1, _ = alg.client_update(payload, c1, None, rng(1))
    u2, _ = alg.client_update(payload, c2, None, rng(2))
    assert (u1.weight, u2.weight) == (4.0, 2.0)
    acc = alg.accumulate(alg.accumulate(None, u1), u2)
    new, m = alg.server_update(state, acc, 0, rng(3))
    for k in state["params"]:
        want = state["params"][k] + (4 * u1.arrays[k].astype(np.float64) + 2 * u2.arrays[k]) / 6
        np.testing.assert_allclose(new["params"][k], want, atol=1e-6)
        # not the unweighted mean
    k = "output.weight"
    unweighted = state["params"][k] + (u1.arrays[k].astype(np.float64) + u2.arrays[k]) / 2
    assert not np.allclose(new["params"][k], unweighted, atol=1e-6)
    assert m["update_norm"] > 0 and m["clients"] == 2.0


def test_zero_token_weights_remove_those_losses(vocab, mcfg):
    alg = make_alg(vocab, mcfg, loss="token", server="fedavg", batch_size=4)
    state = alg.init(rng(0))
    p = alg.broadcast(state, 0)
    # all-zero confidences: nothing is trained, the delta is exactly 0 and the word weight 0
    zero = FedLmClient("z", ((3, 4), (5,)), (np.zeros(2), np.zeros(1)))
    uz, _ = alg.client_update(p, zero, None, rng(1))
    assert uz.weight == 0.0 and all(not a.any() for a in uz.arrays.values())
    # a weight of 0 on a token removes exactly that target's loss: compare with a hand-made masked loss
    client = FedLmClient("t", ((3, 4, 5),), (np.array([1.0, 0.0, 1.0]),))
    u, _ = alg.client_update(p, client, None, rng(1))
    model = build_model(mcfg, vocab)
    with torch.no_grad():
        for k, t in model.named_parameters():
            t.copy_(torch.from_numpy(p[k]))
    x, y = make_batch([np.array([1, 3, 4, 5, 2])])
    y[0, 1] = -100  # target "b" (id 4) dropped; </s> keeps the utterance confidence 2/3
    w = torch.tensor([1.0, 0.0, 1.0, 2 / 3])
    logits, _ = model(x)
    ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
    ((ce * w).sum() / w.sum()).backward()
    for k, t in model.named_parameters():
        np.testing.assert_allclose(u.arrays[k], -1.0 * t.grad.numpy(), atol=2e-6)


def test_threshold_drops_low_confidence_utterances(vocab, mcfg):
    alg = make_alg(vocab, mcfg, loss="threshold", threshold=0.6, server="fedavg", batch_size=8)
    state = alg.init(rng(0))
    p = alg.broadcast(state, 0)
    mixed = FedLmClient("m", ((3, 4), (6, 7, 7)), (np.array([1.0, 0.9]), np.array([0.5, 0.2, 0.9])))
    kept_only = FedLmClient("k", ((3, 4),))
    um, _ = alg.client_update(p, mixed, None, rng(1))
    uk, _ = alg.client_update(p, kept_only, None, rng(1))
    assert um.weight == 2.0 and um.metrics["tokens"] == 3.0
    for k in um.arrays:
        np.testing.assert_allclose(um.arrays[k], uk.arrays[k], atol=1e-6)
    # with "all" the dropped utterance counts again
    ua, _ = make_alg(vocab, mcfg, loss="all", server="fedavg").client_update(p, mixed, None, rng(1))
    assert ua.weight == 5.0 and not np.allclose(ua.arrays["output.bias"], um.arrays["output.bias"])


def test_dropped_utterances_do_not_take_batch_slots(vocab, mcfg):
    # batch 2: the kept utterances A and C must share one batch, as for a client holding only A and C
    alg = make_alg(vocab, mcfg, loss="threshold", threshold=0.6, server="fedavg", batch_size=2)
    p = alg.broadcast(alg.init(rng(0)), 0)
    hi, lo = np.array([1.0, 1.0]), np.array([0.1, 0.1])
    mixed = FedLmClient("m", ((3, 4), (5, 6), (7, 3)), (hi, lo, hi))
    kept_only = FedLmClient("k", ((3, 4), (7, 3)), (hi, hi))
    seqs, _, _ = alg._windows(mixed)
    assert len(seqs) == 2
    um, _ = alg.client_update(p, mixed, None, rng(1))
    uk, _ = alg.client_update(p, kept_only, None, rng(1))
    for k in um.arrays:
        np.testing.assert_array_equal(um.arrays[k], uk.arrays[k])


def test_clipping_bounds_the_update(vocab, mcfg):
    alg = make_alg(vocab, mcfg, clip_norm=0.01, weighting="uniform", server="fedavg")
    state = alg.init(rng(0))
    u, _ = alg.client_update(alg.broadcast(state, 0), FedLmClient("c", ((3, 4, 5), (6, 7))), None, rng(1))
    assert global_norm(u.arrays) <= 0.01
    assert u.metrics["clipped"] == 1.0 and u.weight == 1.0
    assert all(a.dtype == np.float32 for a in u.arrays.values())
    big = make_alg(vocab, mcfg, clip_norm=1e6, weighting="uniform", server="fedavg")
    ub, _ = big.client_update(alg.broadcast(state, 0), FedLmClient("c", ((3, 4, 5), (6, 7))), None, rng(1))
    assert ub.metrics["clipped"] == 0.0 and global_norm(ub.arrays) > 0.01
    with pytest.raises(ConfigError, match="weighting"):
        FedLmConfig(clip_norm=1.0, weighting="words")


def test_grad_clip_bounds_every_local_step(vocab, mcfg):
    client = FedLmClient("c", ((3, 4, 5), (6, 7), (4, 4, 3), (5, 6)))
    start = make_alg(vocab, mcfg, server="fedavg").init(rng(0))["params"]
    # batch_size 1: four SGD steps, each at most client_lr * grad_clip long
    tight = make_alg(vocab, mcfg, server="fedavg", batch_size=1, client_lr=1.0, grad_clip=1e-3)
    u, _ = tight.client_update(start, client, None, rng(1))
    assert 0 < global_norm(u.arrays) <= 4 * 1e-3 * (1 + 1e-4)
    _, m = tight.local_train(start, client, rng(1))
    assert m["steps"] == 4 and m["clipped_steps"] == 4  # counted on the device, never uploaded
    assert set(u.metrics) == {"loss", "tokens"}
    # a bound no gradient reaches changes nothing: the same delta as no clipping, bit for bit
    loose = make_alg(vocab, mcfg, server="fedavg", batch_size=1, client_lr=1.0, grad_clip=1e9)
    plain = make_alg(vocab, mcfg, server="fedavg", batch_size=1, client_lr=1.0)
    ul, _ = loose.client_update(start, client, None, rng(1))
    up, _ = plain.client_update(start, client, None, rng(1))
    assert all(np.array_equal(ul.arrays[k], up.arrays[k]) for k in up.arrays)
    assert global_norm(up.arrays) > 4e-3
    # the key is written only when set (runs without it keep their checkpoint keys) and reads back
    assert "grad_clip" not in FedLmConfig().to_dict()
    assert FedLmConfig.from_dict(FedLmConfig(grad_clip=2.0).to_dict()).grad_clip == 2.0
    for bad in (0, -1.0, float("nan"), True, "2"):
        with pytest.raises(ConfigError, match="grad_clip"):
            FedLmConfig(grad_clip=bad)


def _clients() -> list[FedLmClient]:
    return [FedLmClient("u1", ((3, 4, 5), (5, 4)), (np.array([1.0, 0.8, 0.9]), np.array([0.7, 1.0]))),
            FedLmClient("u2", ((6, 7, 6, 7),)),
            FedLmClient("u3", ((3, 3), (4, 5, 6, 7, 3)))]


def test_only_parameter_deltas_cross(vocab, mcfg):
    alg = make_alg(vocab, mcfg, loss="token", server={"name": "adam", "lr": 0.01})
    names = set(alg.param_names())
    clients = _clients()
    seen = []
    orig = alg.client_update

    def spy(payload, client, cstate, g):
        upd, st = orig(payload, client, cstate, g)
        seen.append(upd)
        assert st is None
        return upd, st

    alg.client_update = spy  # type: ignore[method-assign]
    run_federated(alg, clients, rounds=2, sampler=AllClients(), seed=0)
    assert len(seen) == 6
    sents = [np.array(s) for c in clients for s in c.sentences]
    for upd in seen:
        assert set(upd.arrays) == names
        assert set(upd.metrics) <= {"loss", "tokens", "clipped"}
        for a in upd.arrays.values():
            assert a.dtype == np.float32
            flat = a.ravel()
            for s in sents:
                assert not (flat.size == s.size and np.array_equal(flat, s))
                # nor as a contiguous run anywhere in the array
                if flat.size >= s.size:
                    win = np.lib.stride_tricks.sliding_window_view(flat, s.size)
                    assert not (win == s).all(axis=1).any()


def test_dp_run_adds_noise_once_per_round(vocab, mcfg):
    alg = make_alg(vocab, mcfg, clip_norm=0.5, weighting="uniform", server="fedavg")
    noised = []
    orig = alg.server_update

    def spy(state, acc, r, g):
        assert isinstance(acc, SumAccumulator)
        noised.append(acc.noised)
        return orig(state, acc, r, g)

    alg.server_update = spy  # type: ignore[method-assign]
    priv = PrivacySettings(GaussianMechanism(clip_norm=0.5, noise_multiplier=1.0),
                           PrivacyAccountant(accountant="rdp", target_delta=1e-5))
    res = run_federated(alg, _clients(), rounds=2, sampler=AllClients(), seed=0, privacy=priv)
    assert noised == [1, 1]
    eps = [h.metrics["epsilon"] for h in res.history]
    assert 0 < eps[0] < eps[1] < float("inf")
    assert all(np.isfinite(h.metrics["update_norm"]) for h in res.history)


def test_training_lowers_perplexity(vocab, mcfg):
    corpus = ((3, 4, 5, 6), (3, 4, 5, 7), (3, 4, 5, 6))
    clients = [FedLmClient(f"d{i}", corpus) for i in range(2)]
    alg = make_alg(vocab, mcfg, server={"name": "adam", "lr": 0.01}, client_lr=0.5, local_epochs=2)
    start = alg.init(np.random.default_rng([0, 0]))
    res = run_federated(alg, clients, rounds=5, sampler=AllClients(), seed=0)
    before = alg.perplexity(start["params"], corpus)
    after = alg.perplexity(res.state["params"], corpus)
    assert after < 0.7 * before, (before, after)
    assert res.history[-1].metrics["loss"] < res.history[0].metrics["loss"]


def test_deterministic_and_pretrained_init(vocab, mcfg):
    alg = make_alg(vocab, mcfg)
    s1, s2 = alg.init(rng(5)), alg.init(rng(5))
    assert all(np.array_equal(s1["params"][k], s2["params"][k]) for k in s1["params"])
    assert not np.array_equal(alg.init(rng(6))["params"]["output.weight"], s1["params"]["output.weight"])
    c = FedLmClient("c", ((3, 4), (5, 6)))
    u1, _ = alg.client_update(s1["params"], c, None, rng(1))
    u2, _ = alg.client_update(s1["params"], c, None, rng(1))
    assert all(np.array_equal(u1.arrays[k], u2.arrays[k]) for k in u1.arrays)
    pre = FedLmAlgorithm(FedLmConfig(), mcfg, vocab, init_state=s1["params"])
    assert all(np.array_equal(pre.init(rng(9))["params"][k], s1["params"][k]) for k in s1["params"])
    with pytest.raises(InputError, match="init_state"):
        FedLmAlgorithm(FedLmConfig(), mcfg, vocab, init_state={"x": np.zeros(2)})


def test_bad_inputs(vocab, mcfg):
    with pytest.raises(InputError, match="'dev'.*utterance 1.*shape"):
        FedLmClient("dev", ((3, 4), (5,)), (np.array([1.0, 1.0]), np.array([1.0, 0.5])))
    with pytest.raises(InputError, match="'dev'.*2 weight arrays for 1"):
        FedLmClient("dev", ((3, 4),), (np.ones(2), np.ones(1)))
    with pytest.raises(InputError, match="'dev'.*empty"):
        FedLmClient("dev", ((),))
    with pytest.raises(InputError, match="'dev'.*integers"):
        FedLmClient("dev", ((3, -1),))
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        FedLmClient("dev", ((3,),), (np.array([np.nan]),))
    alg = make_alg(vocab, mcfg)
    state = alg.init(rng(0))
    with pytest.raises(InputError, match="'far'.*outside the vocabulary"):
        alg.client_update(state["params"], FedLmClient("far", ((3, 8),)), None, rng(1))
    with pytest.raises(InputError, match="outside the vocabulary"):
        alg.perplexity(state["params"], [(3, 99)])
    for bad in ({"loss": "median"}, {"threshold": 1.5}, {"local_epochs": 0}, {"batch_size": 2.0},
                {"client_lr": 0}, {"clip_norm": -1.0, "weighting": "uniform"}, {"weighting": "tokens"},
                {"server": {"name": "nope"}}, {"server": 3}, {"threshold": True}):
        with pytest.raises(ConfigError):
            FedLmConfig(**bad)
    with pytest.raises(ConfigError, match="unknown FedLM setting"):
        FedLmConfig.from_dict({"epochs": 2})
    cfg = FedLmConfig(loss="utterance", clip_norm=2.0, weighting="uniform", server="fedavg")
    assert FedLmConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="vocab_size"):
        FedLmAlgorithm(FedLmConfig(), mcfg.replace(vocab_size=99), vocab)
