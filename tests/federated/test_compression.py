"""Tests of compressed client updates: unbiased stochastic quantisation, exact byte counts, top-k with error
feedback, composition with clipping, DP and secure aggregation, and the fedlm / FTL / loop integration."""

from __future__ import annotations

import numpy as np
import pytest

from privasr.errors import ConfigError, InputError
from privasr.federated.compression import (
    CompressionSettings,
    compress,
    decompress,
    dequantize,
    payload_bytes,
    quantize,
    raw_bytes,
    top_k,
)
from privasr.federated.core import SumAccumulator
from privasr.federated.loop import PrivacySettings, run_federated
from privasr.federated.sampling import AllClients
from privasr.privacy.dp.accounting import PrivacyAccountant
from privasr.privacy.dp.clip import global_norm
from privasr.privacy.dp.mechanisms import GaussianMechanism

Q8 = CompressionSettings(kind="quantize", bits=8, block=64)
Q4 = CompressionSettings(kind="quantize", bits=4, block=64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rng(*s: int) -> np.random.Generator:
    return np.random.default_rng(list(s))


# ------------------------------------------------------------------------------------------------- quantisation


@pytest.mark.parametrize("bits", [8, 4])
def test_stochastic_quantisation_is_unbiased(bits):
    x = _rng(0).normal(size=300) * np.repeat([1e-3, 1.0, 30.0], 100)
    draws = 4000
    total = np.zeros_like(x)
    for i in range(draws):
        q = quantize(x, bits, 100, _rng(1, i))
        total += dequantize(q["scales"], q["codes"], x.shape, bits, 100)
    mean = total / draws
    step = np.repeat(q["scales"], 100) / (2 ** (bits - 1) - 1)
    # each draw is within one grid step of x (variance <= step^2 / 4): the mean is within 5 standard errors
    assert np.all(np.abs(mean - x) <= 5 * step / 2 / np.sqrt(draws))
    # and a deterministic rounding would not be: the error of one draw is of the order of a step
    one = dequantize(q["scales"], q["codes"], x.shape, bits, 100)
    assert np.all(np.abs(one - x) <= step * (1 + 1e-6))
    assert np.abs(one - x).mean() > 10 * np.abs(mean - x).mean()


def test_zeros_stay_zero_and_zero_blocks_send_no_codes():
    x = np.zeros((4, 64), dtype=np.float32)
    x[2] = np.linspace(-1, 1, 64)
    sent, _ = compress({"emb": x}, Q8, _rng(0))
    assert sent["emb#codes"].size == 64 and sent["emb#scales"].tolist() == [0, 0, 1, 0]
    back = decompress(sent, {"emb": (4, 64)}, Q8)["emb"]
    assert np.all(back[[0, 1, 3]] == 0) and back[2, 32] != 0


def test_byte_counts_are_exact():
    x = {"a": np.ones((10, 100), dtype=np.float32), "b": np.ones(7, dtype=np.float32)}
    assert raw_bytes(x) == 4 * 1007
    s8, _ = compress(x, CompressionSettings(kind="quantize", bits=8, block=256), _rng(0))
    # a: 4 blocks (4 float32 scales) + 1000 int8 codes; b: 1 block + 7 codes
    assert payload_bytes(s8) == (16 + 1000) + (4 + 7)
    s4, _ = compress(x, CompressionSettings(kind="quantize", bits=4, block=256), _rng(0))
    assert payload_bytes(s4) == (16 + 500) + (4 + 4)  # two codes per byte, the odd one padded
    t, _ = compress(x, CompressionSettings(kind="topk", fraction=0.01), _rng(0))
    # a: 10 values, uint16 positions (2 bytes) + float32 (4); b: ceil(0.07) = 1 value
    assert payload_bytes(t) == 10 * 6 + 1 * 6
    big = np.ones(70_000, dtype=np.float32)
    assert top_k(big, 0.001)["idx"].dtype == np.uint32  # positions past 65,536 need 4 bytes


def test_top_k_keeps_the_largest_values():
    x = np.array([0.5, -4.0, 0.1, 3.0, -0.2, 0.0, 1.0, -2.5])
    sent, _ = compress({"w": x}, CompressionSettings(kind="topk", fraction=0.5, error_feedback=False), _rng(0))
    back = decompress(sent, {"w": (8,)}, CompressionSettings(kind="topk", fraction=0.5))["w"]
    assert back.tolist() == [0.0, -4.0, 0.0, 3.0, 0.0, 0.0, 1.0, -2.5]


# ------------------------------------------------------------------------------------------------- error feedback


def test_top_k_with_error_feedback_sends_the_sum_over_rounds():
    s = CompressionSettings(kind="topk", fraction=0.05)
    deltas = [{"w": _rng(2, r).normal(size=200)} for r in range(60)]
    sent_total = np.zeros(200)
    residual = None
    for r, d in enumerate(deltas):
        sent, residual = compress(d, s, _rng(3, r), residual)
        sent_total += decompress(sent, {"w": (200,)}, s)["w"]
        # invariant: what was sent plus what the client still holds is everything it had to send
        truth = sum(x["w"] for x in deltas[: r + 1])
        np.testing.assert_allclose(sent_total + residual["w"], truth, atol=1e-4)
    truth = sum(d["w"] for d in deltas)
    # without feedback, 95% of every delta would be lost; with it only the last residual is still owed
    assert np.linalg.norm(sent_total - truth) < 0.25 * np.linalg.norm(truth)
    no_ef = CompressionSettings(kind="topk", fraction=0.05, error_feedback=False)
    lossy = sum(decompress(compress(d, no_ef, _rng(0))[0], {"w": (200,)}, no_ef)["w"] for d in deltas)
    assert np.linalg.norm(lossy - truth) > 2 * np.linalg.norm(sent_total - truth)


def test_residual_must_match_the_update():
    s = CompressionSettings(kind="topk")
    with pytest.raises(InputError, match="residual does not match"):
        compress({"w": np.ones(4)}, s, _rng(0), residual={"w": np.ones(5)})


# ------------------------------------------------------------------------------------------------- clipping / DP


@pytest.mark.parametrize("settings", [Q8, Q4, CompressionSettings(kind="topk", fraction=0.3)])
def test_decoded_update_keeps_the_clip_norm(settings):
    c = 0.5
    residual = None
    shrunk = 0
    for r in range(30):
        x = {"a": _rng(4, r).normal(size=(8, 40)), "b": _rng(5, r).normal(size=33)}
        scale = c / global_norm(x)
        x = {k: v * scale for k, v in x.items()}  # clipped exactly to the bound: rounding would exceed it
        sent, residual = compress(x, settings, _rng(6, r), residual, clip_norm=c)
        back = decompress(sent, {"a": (8, 40), "b": (33,)}, settings)
        assert global_norm(back) <= c
        shrunk += global_norm(back) < c * (1 - 1e-9)
    assert shrunk > 0


def test_unclipped_rounding_can_exceed_the_norm():
    """Why the re-scaling exists: stochastic rounding of a vector on the ball often leaves it."""
    x = {"a": np.full(256, 1 / 16.0) * _rng(0).uniform(0.5, 1, size=256)}
    x = {"a": x["a"] / np.linalg.norm(x["a"])}
    over = sum(np.linalg.norm(decompress(compress(x, Q4, _rng(1, i))[0], {"a": (256,)}, Q4)["a"]) > 1
               for i in range(50))
    assert over > 10


# ------------------------------------------------------------------------------------------------- config


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"compression\.kind='zip'"):
        CompressionSettings.of({"kind": "zip"})
    with pytest.raises(ConfigError, match=r"compression\.fraction=0"):
        CompressionSettings.of({"kind": "topk", "fraction": 0})
    with pytest.raises(ConfigError, match=r"compression\.block=0"):
        CompressionSettings.of({"kind": "quantize", "block": 0})
    with pytest.raises(ConfigError, match=r"compression\.error_feedback='yes'"):
        CompressionSettings.of({"kind": "topk", "error_feedback": "yes"})
    with pytest.raises(ConfigError, match="unknown compression setting 'level'"):
        CompressionSettings.of({"level": 3})
    with pytest.raises(ConfigError, match="compression=3"):
        CompressionSettings.of(3)


def test_decompress_refuses_a_foreign_payload():
    sent, _ = compress({"w": np.ones(10)}, Q8, _rng(0))
    with pytest.raises(InputError, match="unexpected arrays"):
        decompress(sent, {"v": (10,)}, Q8)
    with pytest.raises(InputError, match="scales"):
        decompress(sent, {"w": (1000,)}, Q8)
    bad = dict(sent, **{"w#codes": np.full(10, 127, np.int8).astype(np.int16)})
    with pytest.raises(InputError, match="int8 codes"):
        decompress(bad, {"w": (10,)}, Q8)


# ------------------------------------------------------------------------------------------------- fedlm / FTL


@pytest.fixture(scope="module")
def fedlm_parts():
    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.vocab import Vocabulary

    return Vocabulary(("<unk>", "<s>", "</s>", "a", "b", "c", "d", "e")), NeuralLMConfig.preset("tiny-transformer")


def _fedlm(parts, **kw):
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    return FedLmAlgorithm(FedLmConfig(**kw), parts[1], parts[0])


def _clients():
    from privasr.federated.algorithms.fedlm import FedLmClient

    return [FedLmClient(f"c{i}", ((3, 4, 5, i + 3), (4, 3, 3), (5, 6, 7))) for i in range(3)]


def test_fedlm_config_takes_compression_and_names_the_key(fedlm_parts):
    from privasr.experiments.fedlm import load_fedlm_config
    from privasr.federated.algorithms.fedlm import FedLmConfig

    c = FedLmConfig.from_dict({"compression": {"kind": "quantize", "bits": 4}})
    assert c.compression.bits == 4 and FedLmConfig.from_dict(c.to_dict()) == c
    assert "compression" not in FedLmConfig().to_dict()  # runs without it keep their checkpoint keys
    base = {"data": {"kind": "nbest", "dev": "d.jsonl", "test": "t.jsonl"},
            "nnlm": {"neural": {"checkpoint": "m.pt"}}}
    with pytest.raises(ConfigError, match=r"config key 'fedlm': compression\.bits=16"):
        load_fedlm_config({**base, "fedlm": {"compression": {"kind": "quantize", "bits": 16}}}, check_files=False)


def test_fedlm_round_with_quantised_updates_records_bytes(fedlm_parts):
    plain = run_federated(_fedlm(fedlm_parts, server="fedavg"), _clients(), rounds=1, sampler=AllClients())
    alg = _fedlm(fedlm_parts, server="fedavg", compression={"kind": "quantize", "bits": 8, "block": 64})
    res = run_federated(alg, _clients(), rounds=1, sampler=AllClients())
    m, p = res.history[0].metrics, plain.history[0].metrics
    assert p["upload_bytes"] == p["upload_raw_bytes"] == alg.raw_update_bytes() and p["upload_ratio"] == 1.0
    assert m["upload_raw_bytes"] == alg.raw_update_bytes()
    assert 3.0 < m["upload_ratio"] < 4.0  # 1 byte a value plus a float32 scale per block (the tiny tensors: one)
    # the decoded aggregate is close to the uncompressed one (same seeds, same local training)
    d = {k: res.state["params"][k] - plain.state["params"][k] for k in res.state["params"]}
    assert 0 < global_norm(d) < 0.05 * p["update_norm"]
    assert all(s is None for s in res.client_states.values())  # no error feedback: no client state


def test_fedlm_error_feedback_residual_stays_on_the_client(fedlm_parts):
    sent_arrays = []
    alg = _fedlm(fedlm_parts, server="fedavg", compression={"kind": "topk", "fraction": 0.05})
    orig = alg.accumulate

    def spy(acc, update):
        sent_arrays.append(dict(update.arrays))
        return orig(acc, update)

    alg.accumulate = spy  # type: ignore[method-assign]
    res = run_federated(alg, _clients(), rounds=2, sampler=AllClients())
    shapes = alg.param_shapes()
    assert len(sent_arrays) == 6
    for st in res.client_states.values():
        residual = st["residual"]
        assert set(residual) == set(shapes) and global_norm(residual) > 0
    for arrays in sent_arrays:
        # what left the clients is positions and values of 5% of each tensor: never a residual-sized array
        assert set(arrays) == {f"{k}#{p}" for k in shapes for p in ("idx", "val")}
        for k, shape in shapes.items():
            assert arrays[f"{k}#val"].size == max(1, int(np.ceil(0.05 * np.prod(shape))))
    assert res.history[1].metrics["upload_ratio"] > 5


def test_fedlm_dp_with_compression_adds_noise_once_and_keeps_the_bound(fedlm_parts):
    c = 0.05
    alg = _fedlm(fedlm_parts, server="fedavg", clip_norm=c, weighting="uniform",
                 compression={"kind": "quantize", "bits": 4, "block": 32, "error_feedback": True})
    norms, noised = [], []
    orig_acc, orig_server = alg.accumulate, alg.server_update

    def acc_spy(acc, update):
        norms.append(global_norm(alg.decoded(update).arrays))
        return orig_acc(acc, update)

    def server_spy(state, acc, r, g):
        assert isinstance(acc, SumAccumulator)
        noised.append(acc.noised)
        return orig_server(state, acc, r, g)

    alg.accumulate, alg.server_update = acc_spy, server_spy  # type: ignore[method-assign]
    priv = PrivacySettings(GaussianMechanism(clip_norm=c, noise_multiplier=1.0),
                           PrivacyAccountant(accountant="rdp", target_delta=1e-5))
    res = run_federated(alg, _clients(), rounds=2, sampler=AllClients(), privacy=priv)
    assert noised == [1, 1] and len(priv.accountant.events) == 2
    assert len(norms) == 6 and max(norms) <= c
    assert "upload_bytes" not in res.history[0].metrics  # un-noised sizes are not published with DP


def test_compression_is_refused_with_secure_aggregation(fedlm_parts):
    from privasr.federated.backends.flower import check_secagg
    from privasr.federated.secagg import SecAggSettings

    alg = _fedlm(fedlm_parts, clip_norm=0.5, weighting="uniform", compression="quantize")
    with pytest.raises(ConfigError, match="secure aggregation with fedlm.compression kind 'quantize'"):
        check_secagg(SecAggSettings(enabled=True), alg, AllClients(), 4, None)
    ok = _fedlm(fedlm_parts, clip_norm=0.5, weighting="uniform")
    assert check_secagg(SecAggSettings(enabled=True), ok, AllClients(), 4, None) is not None


def test_ftl_compressed_update_decodes_into_the_weighted_sum():
    from privasr.asr.models import AcousticConfig
    from privasr.asr.train import Example
    from privasr.asr.units import CharTokenizer
    from privasr.federated.algorithms.ftl import FtlAlgorithm, FtlClient, FtlConfig

    tok = CharTokenizer.train([("AB",), ("BA",)])
    g = _rng(0)
    ex = tuple(Example(f"u{i}", "s", w, g.normal(size=(6, 4)).astype(np.float32), tuple(tok.encode(w)))
               for i, w in enumerate([("AB",), ("BA",)]))
    mcfg = AcousticConfig.preset("tiny", arch="ctc", input_dim=4)
    plain = FtlAlgorithm(FtlConfig(weighting="count"), mcfg, tok)
    comp = FtlAlgorithm(FtlConfig(weighting="count", compression={"kind": "topk", "fraction": 0.2}), mcfg, tok)
    state = plain.init(_rng(1))
    u0, s0 = plain.client_update(plain.broadcast(state, 0), FtlClient("c", ex), None, _rng(2))
    u1, s1 = comp.client_update(comp.broadcast(state, 0), FtlClient("c", ex), None, _rng(2))
    assert s0 is None and set(s1) == {"residual"}
    assert u1.nbytes < 0.35 * u0.nbytes and comp.raw_update_bytes() == u0.nbytes
    dense = comp.accumulate(None, u1).arrays
    for k, v in u0.arrays.items():  # the decoded delta plus the residual is the delta, weighted by the units
        np.testing.assert_allclose(dense[k] / u1.weight + s1["residual"][k], v, atol=1e-6)
    with pytest.raises(ConfigError, match="ftl.compression"):
        comp.secure_bound(1.0)
