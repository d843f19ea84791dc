"""Tests of privasr.asr.models: config validation, batching, encoder, attention, losses, padding invariance."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from privasr.asr.models import (  # noqa: E402
    BLANK_ID,
    EOS_ID,
    PRESETS,
    SOS_ID,
    AcousticConfig,
    CtcModel,
    Encoder,
    Seq2SeqModel,
    build_model,
    collate,
    ctc_min_frames,
)
from privasr.asr.units import CharTokenizer  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402

V = 9  # 4 specials, word boundary, 4 units (ids 5..8)


def _data(seed: int = 0, n: int = 4, dim: int = 8, lengths=(7, 11, 5, 9), tlens=(3, 0, 2, 4)):
    g = np.random.default_rng(seed)
    feats = [g.normal(size=(lengths[k], dim)).astype(np.float32) for k in range(n)]
    targets = [g.integers(4, V, size=tlens[k]).tolist() for k in range(n)]
    return feats, targets


# ------------------------------------------------------------------------------------------------ config


def test_presets_roundtrip_and_paper_sizes():
    for name in PRESETS:
        cfg = AcousticConfig.preset(name)
        assert AcousticConfig.from_dict(cfg.to_dict()) == cfg
    p = AcousticConfig.preset("paper002")
    assert (p.enc_layers, p.dec_layers, p.input_dim, p.vocab_size, p.arch) == (6, 2, 240, 16000, "seq2seq")
    s = AcousticConfig.preset("small")
    assert (s.enc_layers, s.enc_hidden, s.input_dim) == (3, 256, 39)
    assert AcousticConfig.preset("small", subsample=[1, 2, 2]).frame_reduction == 4


@pytest.mark.parametrize(("changes", "message"), [
    ({"arch": "rnnt"}, "unknown arch 'rnnt'"),
    ({"enc_layers": 0}, "enc_layers=0 must be positive"),
    ({"enc_hidden": 2.5}, "enc_hidden=2.5 is not an integer"),
    ({"att_conv_width": 4}, "att_conv_width=4 must be odd"),
    ({"subsample": (2, 2)}, "subsample has 2 factor(s) for 1 encoder layer(s)"),
    ({"subsample": (0,)}, "non-positive or non-integer factor"),
    ({"subsample_mode": "avg"}, "subsample_mode='avg'"),
    ({"dropout": 1.0}, "dropout=1.0 is outside [0, 1)"),
    ({"label_smoothing": -0.1}, "label_smoothing=-0.1 is outside [0, 1)"),
    ({"vocab_size": 3}, "vocab_size=3 leaves no room"),
    ({"arch": "ctc", "ctc_weight": 0.3}, "apply to arch='seq2seq' only"),
    ({"dropout": float("nan")}, "dropout=nan is not a number"),
])
def test_config_errors_are_clear(changes, message):
    with pytest.raises(ConfigError) as e:
        AcousticConfig.preset("tiny", **changes)
    assert message in str(e.value)


def test_config_unknown_key_and_preset():
    with pytest.raises(ConfigError, match=r"unknown acoustic model config key\(s\) \['hidden'\]"):
        AcousticConfig.from_dict({"hidden": 3})
    with pytest.raises(ConfigError, match="unknown acoustic model preset 'big'"):
        AcousticConfig.preset("big")
    with pytest.raises(ConfigError, match="not a mapping"):
        AcousticConfig.from_dict([1, 2])  # type: ignore[arg-type]


def test_build_model_vocab_from_tokenizer_and_mismatch():
    tok = CharTokenizer.train([("AB", "C")])
    m = build_model(AcousticConfig.preset("tiny"), tok)
    assert m.config.vocab_size == tok.vocab_size == 8
    with pytest.raises(ConfigError, match="vocab_size=9 but the tokenizer has 8 units"):
        build_model(AcousticConfig.preset("tiny", vocab_size=9), tok)
    with pytest.raises(ConfigError, match="seed"):
        build_model(AcousticConfig.preset("tiny", vocab_size=9), seed="1")  # type: ignore[arg-type]


def test_seed_is_deterministic_and_leaves_global_rng_alone():
    cfg = AcousticConfig.preset("tiny", vocab_size=V)
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = build_model(cfg, seed=5), build_model(cfg, seed=5), build_model(cfg, seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert isinstance(a, Seq2SeqModel) and isinstance(build_model(cfg.replace(arch="ctc")), CtcModel)


# ------------------------------------------------------------------------------------------------- batch


def test_collate_pads_and_errors():
    b = collate([np.ones((2, 3)), np.ones((4, 3))], [[5, 6, 7], []], ["a", "b"])
    assert b.feats.shape == (2, 4, 3) and b.feats[0, 2:].abs().sum() == 0
    assert b.target_lengths.tolist() == [3, 0] and b.utt_ids == ("a", "b") and b.size == 2
    with pytest.raises(InputError, match="empty batch"):
        collate([])
    with pytest.raises(InputError, match="utterance 'b': zero-length features"):
        collate([np.ones((2, 3)), np.zeros((0, 3))], utt_ids=["a", "b"])
    with pytest.raises(InputError, match="utterance 1: 2-dim features, utterance 0 has 3"):
        collate([np.ones((2, 3)), np.ones((2, 2))])
    with pytest.raises(InputError, match="non-finite"):
        collate([np.full((2, 3), np.nan)])
    with pytest.raises(InputError, match="2 feature arrays but 1 target"):
        collate([np.ones((2, 3))] * 2, [[5]])
    with pytest.raises(InputError, match="features of shape"):
        collate([np.ones(3)])


def test_ctc_min_frames_counts_repeats():
    assert ctc_min_frames(torch.tensor([[5, 5, 5, 6], [6, 7, 0, 0]]), torch.tensor([4, 2])).tolist() == [6, 2]


# ----------------------------------------------------------------------------------------------- encoder


@pytest.mark.parametrize("mode", ["concat", "skip"])
def test_encoder_subsampling_and_padding_invariance(mode):
    cfg = AcousticConfig.preset("tiny", enc_layers=2, subsample=(2, 3), subsample_mode=mode)
    torch.manual_seed(0)
    enc = Encoder(cfg).eval()
    feats, _ = _data()
    b = collate(feats)
    h, n = enc(b.feats, b.feat_lengths)
    assert n.tolist() == [math.ceil(math.ceil(L / 2) / 3) for L in (7, 11, 5, 9)]
    assert h.shape[1] == int(n.max())
    assert enc.output_dim == h.shape[2] == (32 * 3 if mode == "concat" else 32)
    for k, x in enumerate(feats):
        hk, nk = enc(torch.as_tensor(x)[None], torch.tensor([len(x)]))
        assert int(nk) == int(n[k])
        torch.testing.assert_close(h[k, : int(nk)], hk[0], atol=1e-5, rtol=1e-5)
        assert h[k, int(nk):].abs().sum() == 0


def test_encoder_rejects_bad_input():
    enc = Encoder(AcousticConfig.preset("tiny"))
    with pytest.raises(InputError, match=r"\[batch, frames, 8\]"):
        enc(torch.zeros(1, 3, 5), torch.tensor([3]))
    with pytest.raises(InputError, match="lengths"):
        enc(torch.zeros(1, 3, 8), torch.tensor([0]))


# ---------------------------------------------------------------------------------------- losses, masks


CONFIGS = {
    "seq2seq": AcousticConfig.preset("tiny", vocab_size=V),
    "seq2seq-subsample-smooth": AcousticConfig.preset("tiny", vocab_size=V, enc_layers=2, subsample=(2, 1),
                                                      label_smoothing=0.1),
    "joint": AcousticConfig.preset("tiny", vocab_size=V, ctc_weight=0.3),
    "ctc": AcousticConfig.preset("tiny", vocab_size=V, arch="ctc"),
    "ctc-2layer-skip": AcousticConfig.preset("tiny", vocab_size=V, arch="ctc", enc_layers=2, subsample=(1, 2),
                                             subsample_mode="skip"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_padded_batch_loss_equals_sum_of_single_losses(name):
    cfg = CONFIGS[name]
    model = build_model(cfg, seed=1)
    feats, targets = _data(seed=2)
    loss, count = model.loss(collate(feats, targets))
    singles = [model.loss(collate([x], [y])) for x, y in zip(feats, targets, strict=True)]
    assert abs(float(loss.detach()) - sum(float(s[0].detach()) for s in singles)) < 1e-4
    assert count == sum(s[1] for s in singles)
    expected = sum(len(y) for y in targets) + (0 if cfg.arch == "ctc" else len(targets))
    assert count == expected
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())


def test_seq2seq_loss_is_teacher_forced_cross_entropy():
    model = build_model(CONFIGS["seq2seq"], seed=0)
    feats, targets = _data(seed=3)
    batch = collate(feats, targets)
    logits, _ = model(batch)
    y, valid = model.decoder_targets(batch)
    assert y[1, 0] == EOS_ID and valid[1].tolist() == [True] + [False] * (valid.shape[1] - 1)
    ce = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    loss, _ = model.loss(batch)
    assert abs(float((ce * valid).sum().detach()) - float(loss.detach())) < 1e-4
    probs = logits.detach().softmax(-1)
    assert float(probs[..., [BLANK_ID, SOS_ID]].max()) == 0.0


def test_label_smoothing_formula():
    cfg = CONFIGS["seq2seq"]
    plain = build_model(cfg, seed=0)
    smooth = build_model(cfg.replace(label_smoothing=0.2), seed=0)
    batch = collate(*_data(seed=4))
    logits, _ = plain(batch)
    y, valid = plain.decoder_targets(batch)
    lp = logits.log_softmax(-1)
    keep = [i for i in range(V) if i not in (BLANK_ID, SOS_ID)]
    nll = -lp.gather(-1, y[..., None])[..., 0]
    expected = ((0.8 * nll + 0.2 * -lp[..., keep].mean(-1)) * valid).sum()
    assert abs(float(smooth.loss(batch)[0].detach()) - float(expected.detach())) < 1e-4


def test_attention_weights_sum_to_one_and_ignore_padding():
    model = build_model(CONFIGS["seq2seq-subsample-smooth"], seed=0)
    feats, targets = _data(seed=5)
    batch = collate(feats, targets)
    torch.set_grad_enabled(False)
    try:
        _check_alphas(model, batch, feats, targets)
    finally:
        torch.set_grad_enabled(True)


def _check_alphas(model, batch, feats, targets):
    _, alphas = model(batch)
    _, n = model.encode(batch.feats, batch.feat_lengths)
    for k in range(len(feats)):
        a = alphas[k, : len(targets[k]) + 1]
        torch.testing.assert_close(a.sum(-1), torch.ones(a.shape[0]), atol=1e-6, rtol=0)
        assert float(a[:, int(n[k]):].abs().sum()) == 0.0
        _, single = model(collate([feats[k]], [targets[k]]))
        torch.testing.assert_close(a[:, : int(n[k])], single[0], atol=1e-5, rtol=1e-4)


def test_ctc_output_masks_sos_eos():
    model = build_model(CONFIGS["ctc"], seed=0)
    lp, n = model.log_probs(collate(_data()[0]).feats, torch.tensor([7, 11, 5, 9]))
    assert lp.shape == (4, 11, V) and n.tolist() == [7, 11, 5, 9]
    assert float(lp.detach()[..., [SOS_ID, EOS_ID]].exp().max()) == 0.0


def test_loss_input_errors():
    model = build_model(CONFIGS["ctc"], seed=0)
    with pytest.raises(InputError, match=r"utterance 'u': 4 target units need at least 5 encoder frames for CTC, "
                                         r"the encoder gives 3"):
        model.loss(collate([np.zeros((3, 8))], [[5, 6, 6, 7]], ["u"]))
    with pytest.raises(InputError, match="utterance 0: unit id 9 out of range"):
        build_model(CONFIGS["seq2seq"]).loss(collate([np.zeros((3, 8))], [[5, 9]]))
    with pytest.raises(ConfigError, match="no CTC head"):
        build_model(CONFIGS["seq2seq"]).ctc_log_probs(torch.zeros(1, 2, 8), torch.tensor([2]))
