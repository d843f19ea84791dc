"""Tests of privasr.asr.train: AN4 examples (CMVN + stacking), length batches, the train loop, evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from privasr.asr.features import An4Utterance, CmvnStats, an4_features  # noqa: E402
from privasr.asr.models import AcousticConfig, build_model  # noqa: E402
from privasr.asr.train import (  # noqa: E402
    Example,
    an4_examples,
    char_tokens,
    evaluate,
    evaluate_loss,
    length_batches,
    make_batch,
    train,
)
from privasr.asr.units import CharTokenizer  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.paths import data_dir  # noqa: E402


def _an4_root() -> Path:
    d = data_dir()
    if d is None or not (d / "an4" / "feat").is_dir():
        pytest.skip("AN4 data not available (../shared/data/an4 or $PRIVASR_DATA/an4)")
    return d / "an4"


def _utts():
    g = np.random.default_rng(0)
    return [An4Utterance(f"u{i}-{spk}-b", spk, ("GO", "ON") if i % 2 else ("NO",),
                         (g.normal(size=(7 + i, 13)) * (1 + i) + i).astype(np.float32))
            for i, spk in enumerate(["aa", "aa", "bb", "bb", "bb"])]


def _toy(n=6, seed=0):
    g = np.random.default_rng(seed)
    words = [("AB",), ("BA", "A"), ("B",), ("AAB",), ("BB",), ("A", "B")][:n]
    tok = CharTokenizer.train(words)
    return tok, [Example(f"u{i}", "s", w, g.normal(size=(int(g.integers(8, 15)), 4)).astype(np.float32),
                         tuple(tok.encode(w))) for i, w in enumerate(words)]


# -------------------------------------------------------------------------------------------- features


def test_an4_examples_cmvn_and_stacking():
    utts = _utts()
    tok = CharTokenizer.train([u.words for u in utts])
    spk = an4_examples(utts, tok, cmvn="speaker", stack=1)
    for s in ("aa", "bb"):
        x = np.concatenate([e.features for e in spk if e.speaker == s])
        np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
        np.testing.assert_allclose(x.std(0), 1, atol=1e-4)
    glob = an4_examples(utts, tok, cmvn="global", stack=1)
    np.testing.assert_allclose(np.concatenate([e.features for e in glob]).mean(0), 0, atol=1e-5)
    stats = CmvnStats.from_arrays([np.zeros((2, 13)), np.full((2, 13), 2.0)])  # mean 1, std 1
    given = an4_examples(utts[:1], tok, cmvn="global", global_stats=stats, stack=1)
    np.testing.assert_allclose(given[0].features, utts[0].features - 1.0, atol=1e-5)
    stacked = an4_examples(utts, tok, cmvn="none")
    assert [e.features.shape for e in stacked] == [(-(-(7 + i) // 3), 39) for i in range(5)]
    assert stacked[1].units == tuple(tok.encode(("GO", "ON"))) and stacked[1].words == ("GO", "ON")
    with pytest.raises(ConfigError, match="cmvn='utterance'"):
        an4_examples(utts, tok, cmvn="utterance")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="no utterances"):
        an4_examples([], tok)


def test_char_tokens():
    assert char_tokens(("AB", "C")) == ("A", "B", "▁", "C") and char_tokens(()) == ()


# -------------------------------------------------------------------------------------------- batches


def test_length_batches_cover_everything_once_and_respect_limits():
    g = np.random.default_rng(1)
    lengths = g.integers(1, 50, size=37).tolist()
    batches = length_batches(lengths, batch_size=5, max_frames=120, rng=np.random.default_rng(0))
    assert sorted(i for b in batches for i in b) == list(range(37))
    for b in batches:
        assert len(b) <= 5
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 120
    again = length_batches(lengths, batch_size=5, max_frames=120, rng=np.random.default_rng(0))
    assert again == batches
    assert length_batches(lengths, batch_size=5, max_frames=120) != batches  # unshuffled: sorted order
    with pytest.raises(ConfigError, match="batch_size=0"):
        length_batches(lengths, batch_size=0)
    with pytest.raises(ConfigError, match="max_frames=-1"):
        length_batches(lengths, max_frames=-1)


def test_make_batch_keeps_ids_and_units():
    _, data = _toy()
    b = make_batch(data, [2, 0])
    assert b.utt_ids == ("u2", "u0") and b.target_lengths.tolist() == [len(data[2].units), len(data[0].units)]


# ---------------------------------------------------------------------------------------------- train


def test_train_is_seeded_and_lowers_the_loss():
    tok, data = _toy()
    cfg = AcousticConfig.preset("tiny", input_dim=4, dropout=0.2)
    runs = []
    torch.manual_seed(7)
    before = torch.random.get_rng_state()
    for _ in range(2):
        m = build_model(cfg, tok, seed=0)
        start = evaluate_loss(m, data)[0]
        seen = []
        log = train(m, torch.optim.Adam(m.parameters(), 5e-3), data, steps=20, batch_size=3, seed=1,
                    callback=lambda s, v, seen=seen: seen.append(s))
        assert log.steps == 20 and seen == list(range(1, 21)) and log.epochs == 10
        assert evaluate_loss(m, data)[0] < start
        runs.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(torch.random.get_rng_state(), before)


def test_train_epochs_and_errors():
    tok, data = _toy()
    m = build_model(AcousticConfig.preset("tiny", input_dim=4, arch="ctc"), tok, seed=0)
    opt = torch.optim.SGD(m.parameters(), 0.1)
    log = train(m, opt, data, epochs=2, batch_size=4, clip_norm=None)
    assert (log.epochs, log.steps, log.units) == (2, 4, 2 * sum(len(e.units) for e in data))
    with pytest.raises(ConfigError, match="exactly one of steps and epochs"):
        train(m, opt, data)
    with pytest.raises(ConfigError, match="exactly one of steps and epochs"):
        train(m, opt, data, steps=1, epochs=1)
    with pytest.raises(InputError, match="no training examples"):
        train(m, opt, [], steps=1)


def test_evaluate_loss_is_per_unit_sum():
    tok, data = _toy()
    m = build_model(AcousticConfig.preset("tiny", input_dim=4), tok, seed=0)
    per_unit, units = evaluate_loss(m, data, batch_size=4)
    m.eval()
    total = sum(float(m.loss(make_batch(data, [i]))[0].detach()) for i in range(len(data)))
    assert units == sum(len(e.units) + 1 for e in data)
    assert per_unit == pytest.approx(total / units, rel=1e-5)
    ev = evaluate(m, tok, data, method="beam", beam=2)
    assert ev.wer.sentences == len(data) and ev.cer.ref_words == sum(len(char_tokens(e.words)) for e in data)


# --------------------------------------------------------------------------------------------- AN4


@pytest.mark.shared
def test_an4_pipeline_and_a_few_steps():
    root = _an4_root()
    test = an4_features(root, "test")
    train_utts = an4_features(root, "train")
    tok = CharTokenizer.train([u.words for u in train_utts])
    stats = CmvnStats.from_arrays(u.features for u in train_utts)
    ex = an4_examples(test[:12], tok, cmvn="global", global_stats=stats)
    assert all(e.features.shape[1] == 39 and e.features.dtype == np.float32 for e in ex)
    assert all(tok.decode(e.units) == e.words for e in ex)
    m = build_model(AcousticConfig.preset("tiny", input_dim=39, arch="ctc"), tok, seed=0)
    log = train(m, torch.optim.Adam(m.parameters(), 1e-3), ex, steps=2, batch_size=6)
    assert np.isfinite(log.losses).all()
    assert len(evaluate(m, tok, ex[:3], method="greedy").nbest) == 3


def test_spec_augment_stacked_masks_whole_base_frames_and_checks_the_stacking() -> None:
    import numpy as np
    import pytest

    from privasr.asr.train import spec_augment_stacked
    from privasr.errors import ConfigError

    x = np.arange(1, 1 + 10 * 12, dtype=np.float32).reshape(10, 12)  # 10 stacks of 3 frames of 4 dims
    y = spec_augment_stacked(x, np.random.default_rng(3), stack=3, freq_masks=0, time_masks=1, time_width=5,
                             time_ratio=1.0)
    frames = y.reshape(30, 4)
    masked = (frames == 0).all(axis=1)
    assert masked.any() and ((frames == 0).any(axis=1) == masked).all()  # whole 10 ms frames, not parts
    with pytest.raises(ConfigError, match="stacked"):
        spec_augment_stacked(np.ones((2, 5), dtype=np.float32), np.random.default_rng(0), stack=3)
