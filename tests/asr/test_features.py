"""Tests of privasr.asr.features: Sphinx MFC reading (fuzzed), AN4 loading, fbank, stacking, CMVN, SpecAugment."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privasr.asr.features import (
    CmvnStats,
    an4_features,
    apply_cmvn,
    fbank,
    read_sphinx_mfc,
    read_wav,
    speaker_cmvn_stats,
    spec_augment,
    spec_augment_masks,
    stack_frames,
)
from privasr.errors import ConfigError, InputError
from privasr.paths import data_dir

pytest.importorskip("kaldi_native_fbank")
sf = pytest.importorskip("soundfile")


def _an4_root() -> Path:
    d = data_dir()
    if d is None or not (d / "an4" / "feat").is_dir():
        pytest.skip("AN4 data not available (../shared/data/an4 or $PRIVASR_DATA/an4)")
    return d / "an4"


def _mfc_bytes(values, count: int | None = None) -> bytes:
    values = list(values)
    n = len(values) if count is None else count
    return struct.pack(">i", n) + struct.pack(f">{len(values)}f", *values)


# ------------------------------------------------------------------------------------------ read_sphinx_mfc


def test_read_mfc_roundtrip(tmp_path):
    vals = np.random.default_rng(0).normal(size=39).astype(np.float32)
    p = tmp_path / "u.mfc"
    p.write_bytes(_mfc_bytes(vals))
    x = read_sphinx_mfc(p)
    assert x.shape == (3, 13) and x.dtype == np.float32 and x.flags.writeable
    np.testing.assert_array_equal(x.ravel(), vals)
    assert read_sphinx_mfc(p, dim=39).shape == (1, 39)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty file"),
        (b"\x00\x00", "truncated header"),
        (_mfc_bytes(range(26))[:-2], "not a whole number of float32s"),
        (_mfc_bytes(range(25), count=26), "truncated file: header says 26 floats but the file holds 25"),
        (_mfc_bytes(range(27), count=26), "trailing data"),
        (_mfc_bytes(range(14)), "14 floats is not a whole number of 13-coefficient frames"),
        (_mfc_bytes([]), "no frames"),
        (_mfc_bytes([1.0] * 14 + [float("nan")] + [0.0] * 11), "non-finite value nan at byte offset 60 (frame 1, coefficient 1)"),
        (_mfc_bytes([float("inf")] + [0.0] * 12), "non-finite value inf at byte offset 4"),
        (struct.pack("<i", 13) + struct.pack(">13f", *range(13)), "little-endian"),
        (struct.pack(">i", -5) + b"\0" * 8, "negative float count"),
    ],
)
def test_read_mfc_errors(tmp_path, data, needle):
    p = tmp_path / "bad.mfc"
    p.write_bytes(data)
    with pytest.raises(InputError) as e:
        read_sphinx_mfc(p)
    assert needle in str(e.value)
    assert e.value.path == str(p) and e.value.expected


def test_read_mfc_missing_file_and_bad_dim(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        read_sphinx_mfc(tmp_path / "nope.mfc")
    with pytest.raises(ConfigError):
        read_sphinx_mfc(tmp_path / "nope.mfc", dim=0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200), dim=st.integers(1, 20))
def test_read_mfc_fuzz_random_bytes(tmp_path, data, dim):
    p = tmp_path / "fuzz.mfc"
    p.write_bytes(data)
    try:
        x = read_sphinx_mfc(p, dim=dim)
    except InputError as e:
        assert e.path == str(p) and e.expected
    else:
        assert x.ndim == 2 and x.shape[1] == dim and x.shape[0] >= 1 and np.isfinite(x).all()
        assert 4 + 4 * x.size == len(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.integers(1, 6), cut=st.integers(0, 400), flip=st.integers(0, 400))
def test_read_mfc_fuzz_truncated_and_corrupted(tmp_path, frames, cut, flip):
    good = _mfc_bytes(np.arange(frames * 13, dtype=np.float32))
    p = tmp_path / "t.mfc"
    cut %= len(good)
    p.write_bytes(good[:cut])  # every proper prefix is an error
    with pytest.raises(InputError):
        read_sphinx_mfc(p)
    bad = bytearray(good)
    bad[flip % len(bad)] ^= 0xFF
    p.write_bytes(bytes(bad))
    try:
        x = read_sphinx_mfc(p)
    except InputError:
        pass
    else:
        assert x.shape == (frames, 13)


# --------------------------------------------------------------------------------------------- AN4


def _tiny_an4(root: Path) -> None:
    (root / "etc").mkdir(parents=True)
    for spk in ("fash", "mjwl"):
        (root / "feat/an4_clstk" / spk).mkdir(parents=True)
    (root / "etc/an4_train.transcription").write_text(
        "YES (an251-fash-b)\n<s> GO TO </s> (an253-fash-b)\nNO (an1-mjwl-b)\n")
    for utt, n in (("an251-fash-b", 2), ("an253-fash-b", 3), ("an1-mjwl-b", 1)):
        spk = utt.split("-")[1]
        (root / "feat/an4_clstk" / spk / f"{utt}.mfc").write_bytes(_mfc_bytes(np.ones(13 * n)))


def test_an4_features_tiny(tmp_path):
    _tiny_an4(tmp_path)
    utts = an4_features(tmp_path, "train")
    assert [(u.utt_id, u.speaker, u.words, u.num_frames) for u in utts] == [
        ("an251-fash-b", "fash", ("YES",), 2), ("an253-fash-b", "fash", ("GO", "TO"), 3), ("an1-mjwl-b", "mjwl", ("NO",), 1)]


def test_an4_features_mismatches(tmp_path):
    _tiny_an4(tmp_path)
    f = tmp_path / "feat/an4_clstk/mjwl/an1-mjwl-b.mfc"
    f.rename(tmp_path / "an1-mjwl-b.mfc")
    with pytest.raises(InputError, match=r"1 transcript id\(s\) have no feature file: an1-mjwl-b"):
        an4_features(tmp_path)
    (tmp_path / "an1-mjwl-b.mfc").rename(tmp_path / "feat/an4_clstk/fash/an1-mjwl-b.mfc")
    with pytest.raises(InputError, match="is in speaker folder 'fash', not 'mjwl'"):
        an4_features(tmp_path)
    (tmp_path / "feat/an4_clstk/fash/an1-mjwl-b.mfc").rename(f)
    (tmp_path / "feat/an4_clstk/mjwl/an9-mjwl-b.mfc").write_bytes(_mfc_bytes(np.ones(13)))
    with pytest.raises(InputError, match=r"feature file\(s\) have no transcript: an9-mjwl-b") as e:
        an4_features(tmp_path)
    assert e.value.path.endswith("an4_train.transcription")
    (tmp_path / "feat/an4_clstk/mjwl/an9-mjwl-b.mfc").unlink()
    (tmp_path / "feat/an4_clstk/fash/an251-fash-b.mfc").write_bytes(b"\0\0\0\x0d")
    with pytest.raises(InputError, match="an251-fash-b.mfc: truncated file"):
        an4_features(tmp_path)
    with pytest.raises(InputError, match="feature folder not found"):
        an4_features(tmp_path, "test")
    with pytest.raises(ConfigError):
        an4_features(tmp_path, "dev")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def an4():
    root = _an4_root()
    t0 = time.perf_counter()
    train, test = an4_features(root, "train"), an4_features(root, "test")
    return train, test, time.perf_counter() - t0


@pytest.mark.shared
def test_an4_counts(an4):
    train, test, seconds = an4
    assert (len(train), len(test)) == (948, 130)
    assert len({u.speaker for u in train}) == 74 and len({u.speaker for u in test}) == 10
    assert not {u.speaker for u in train} & {u.speaker for u in test}
    assert sum(u.num_frames for u in train + test) == 289_252
    assert all(u.features.shape[1] == 13 and u.features.dtype == np.float32 for u in train + test)
    assert seconds < 5.0, f"loading AN4 took {seconds:.2f} s"


@pytest.mark.shared
def test_an4_speaker_cmvn(an4):
    train, _, _ = an4
    stats = speaker_cmvn_stats((u.speaker, u.features) for u in train)
    assert len(stats) == 74
    by_spk: dict[str, list[np.ndarray]] = {}
    for u in train:
        by_spk.setdefault(u.speaker, []).append(apply_cmvn(u.features, stats[u.speaker]))
    for frames in by_spk.values():
        a = np.concatenate(frames).astype(np.float64)
        np.testing.assert_allclose(a.mean(axis=0), 0.0, atol=1e-4)
        np.testing.assert_allclose(a.std(axis=0), 1.0, atol=1e-4)
    total = sum(stats.values(), CmvnStats.zeros(13))
    assert total.count == sum(u.num_frames for u in train)
    np.testing.assert_allclose(total.mean, np.concatenate([u.features for u in train]).mean(axis=0, dtype=np.float64),
                               rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------ wav / fbank


def _fsdd_wav() -> Path:
    d = data_dir()
    p = None if d is None else d / "fsdd-digits" / "recordings" / "0_george_0.wav"
    if p is None or not p.is_file():
        pytest.skip("FSDD recordings not available")
    return p


@pytest.mark.shared
def test_fbank_fsdd_matches_kaldi_native_fbank():
    import kaldi_native_fbank as knf
    from scipy.signal import resample_poly

    x, sr = read_wav(_fsdd_wav())
    assert sr == 8000 and x.dtype == np.float32 and np.abs(x).max() <= 1.0
    feats = fbank(x, sr)
    y = resample_poly(x.astype(np.float64), 2, 1)
    assert feats.shape == (1 + (len(y) - 400) // 160, 80)
    assert abs(feats.shape[0] - len(x) / sr * 100) <= 3  # about duration / 10 ms
    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.mel_opts.num_bins = 80
    ref = knf.OnlineFbank(opts)
    ref.accept_waveform(16000, (y * 32768).astype(np.float32))
    ref.input_finished()
    expected = np.stack([ref.get_frame(i) for i in range(ref.num_frames_ready)])
    np.testing.assert_array_equal(feats, expected)
    assert np.isfinite(feats).all()


def test_fbank_rates_and_options():
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal(11025)).astype(np.float32)  # 0.5 s at 22.05 kHz
    f = fbank(x, 22050)
    assert f.shape == (48, 80)  # resampled to 8000 samples at 16 kHz
    assert fbank(x, 22050.0, num_mel_bins=40, target_rate=8000).shape == (48, 40)
    assert fbank(x[:100], 16000).shape == (0, 80)
    assert fbank(np.zeros(0, np.float32), 8000).shape == (0, 80)
    np.testing.assert_array_equal(fbank(x, 16000), fbank(x, 16000))  # no dither: deterministic
    with pytest.raises(InputError):
        fbank(np.zeros((2, 400)), 16000)
    with pytest.raises(InputError):
        fbank(np.array([0.0, np.nan] * 300), 16000)
    with pytest.raises(InputError, match="divide 16-bit PCM by 32768"):
        fbank(np.zeros(800, np.int16), 16000)
    with pytest.raises(ConfigError):
        fbank(x, 0)
    with pytest.raises(ConfigError):
        fbank(x, 8000, num_mel_bins=400)


def test_read_wav_stereo_and_errors(tmp_path):
    p = tmp_path / "st.wav"
    sf.write(p, np.array([[0.5, 0.0], [-0.5, -0.25]]), 16000, subtype="FLOAT")
    x, sr = read_wav(p)
    assert sr == 16000 and x.tolist() == [0.25, -0.375]
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"RIFF not really")
    with pytest.raises(InputError, match="cannot read audio") as e:
        read_wav(bad)
    assert e.value.path == str(bad)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0), 8000, subtype="PCM_16")
    with pytest.raises(InputError, match="empty audio"):
        read_wav(empty)
    with pytest.raises(InputError, match="cannot read audio"):
        read_wav(tmp_path / "missing.wav")


# ------------------------------------------------------------------------------------ stacking / cmvn


@pytest.mark.parametrize(("t", "n", "stride", "out"), [(10, 3, None, 4), (9, 3, None, 3), (1, 3, None, 1),
                                                       (10, 3, 1, 10), (10, 1, None, 10), (7, 2, 3, 3)])
def test_stack_frames_shapes(t, n, stride, out):
    x = np.arange(t * 4, dtype=np.float32).reshape(t, 4)
    y = stack_frames(x, n, stride)
    assert y.shape == (out, n * 4) and y.dtype == np.float32
    s = n if stride is None else stride
    for k in range(out):
        for j in range(n):
            np.testing.assert_array_equal(y[k, 4 * j:4 * (j + 1)], x[min(k * s + j, t - 1)])


def test_stack_frames_edge_cases():
    assert stack_frames(np.zeros((0, 13)), 3).shape == (0, 39)
    with pytest.raises(InputError):
        stack_frames(np.zeros(5), 3)
    with pytest.raises(ConfigError):
        stack_frames(np.zeros((5, 2)), 0)


def test_cmvn_streaming_equals_batch():
    rng = np.random.default_rng(1)
    parts = [rng.normal(3.0, 2.0, size=(n, 5)) for n in (7, 1, 30)]
    s = CmvnStats.zeros(5)
    for p in parts:
        s.add(p)
    a = np.concatenate(parts)
    np.testing.assert_allclose(s.mean, a.mean(axis=0))
    np.testing.assert_allclose(s.var, a.var(axis=0))
    merged = CmvnStats.from_arrays(parts[:1]) + CmvnStats.from_arrays(parts[1:])
    assert merged.count == s.count
    np.testing.assert_allclose(merged.sum, s.sum)
    np.testing.assert_allclose(merged.sumsq, s.sumsq)
    y = apply_cmvn(a, s)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(axis=0), 1, atol=1e-5)
    z = apply_cmvn(a, s, variance=False)
    np.testing.assert_allclose(z.std(axis=0), a.std(axis=0), rtol=1e-5)
    assert CmvnStats.from_dict(s.to_dict()) == s
    with pytest.raises(InputError):
        CmvnStats.zeros(5).mean  # noqa: B018
    with pytest.raises(InputError):
        apply_cmvn(a[:, :4], s)
    with pytest.raises(InputError):
        CmvnStats.from_arrays([])
    with pytest.raises(InputError):
        CmvnStats.from_dict({"count": -1, "sum": [0.0], "sumsq": [0.0]})


# ---------------------------------------------------------------------------------------- SpecAugment


def test_spec_augment_masks_and_copy():
    x = np.random.default_rng(2).normal(size=(200, 80)).astype(np.float32) + 5.0
    before = x.copy()
    y = spec_augment(x, np.random.default_rng(7), fill=0.0)
    np.testing.assert_array_equal(x, before)  # input untouched
    m = spec_augment_masks(x.shape, np.random.default_rng(7))
    assert len(m.freq) == 2 and len(m.time) == 2
    expected_mask = np.zeros(x.shape, bool)
    for s, w in m.freq:
        assert 0 <= w <= 27 and 0 <= s and s + w <= 80
        expected_mask[:, s:s + w] = True
    for s, w in m.time:
        assert 0 <= w <= 40 and 0 <= s and s + w <= 200
        expected_mask[s:s + w] = True
    np.testing.assert_array_equal(y == 0.0, expected_mask)  # x has no zeros: masked cells are exactly these
    np.testing.assert_array_equal(y[~expected_mask], x[~expected_mask])
    np.testing.assert_array_equal(spec_augment(x, np.random.default_rng(7)), y)  # seeded: reproducible


def test_spec_augment_counts_and_scaling():
    rng = np.random.default_rng(3)
    m = spec_augment_masks((50, 13), rng, freq_masks=3, time_masks=5)
    assert len(m.freq) == 3 and len(m.time) == 5
    assert all(w <= 4 for _, w in m.freq)  # 27 scaled to 13 dims
    assert all(w <= 10 for _, w in m.time)  # 20 % of 50 frames
    assert spec_augment_masks((50, 13), rng, freq_masks=0, time_masks=0) == type(m)((), ())
    y = spec_augment(np.ones((10, 13)), rng, freq_masks=1, freq_width=13, time_masks=0)
    assert y.shape == (10, 13)
    with pytest.raises(ConfigError):
        spec_augment(np.ones((10, 13)), rng, freq_masks=-1)
    with pytest.raises(InputError):
        spec_augment(np.ones(10), rng)
