"""Tests of privasr.asr.tts: speaker voices, synthesis (espeak-ng + sox) and its noise modes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from privasr.asr.tts import (
    KLATT_VOICES,
    Voice,
    check_voice,
    file_seed,
    require_programs,
    speaker_voice,
    synthesize,
)
from privasr.errors import ConfigError, InputError

needs_tts = pytest.mark.skipif(shutil.which("espeak-ng") is None or shutil.which("sox") is None,
                               reason="espeak-ng and sox (Debian packages) are not installed")


def test_speaker_voice_is_fixed_per_speaker():
    a, b = speaker_voice("M_A"), speaker_voice("M_B")
    assert a == speaker_voice("M_A")
    assert a.voice in KLATT_VOICES and 140 <= a.rate <= 170 and 0.008 <= a.noise <= 0.015
    voices = {speaker_voice(f"s{i}").voice for i in range(40)}
    assert voices == set(KLATT_VOICES)  # every voice is used
    assert a != b or speaker_voice("M_C") != a


@pytest.mark.shared
def test_speaker_voice_reproduces_the_shared_set(shared_data):
    from privasr.corpus.formats.ami_tts import read_ami_tts

    f = shared_data / "ami-tts-nbest-adapted" / "dev.jsonl.xz"
    if not f.is_file():
        pytest.skip("ami-tts-nbest-adapted not present")
    tts = {nb.speaker: dict(nb.meta["tts"]) for nb in read_ami_tts(f)}
    assert len(tts) == 40
    assert all(speaker_voice(s).as_dict() == t for s, t in tts.items())


def test_voice_validation():
    with pytest.raises(ConfigError, match="voice"):
        Voice("-x", 150, 0.01)
    with pytest.raises(ConfigError, match="rate"):
        Voice("en-us", 5, 0.01)
    with pytest.raises(ConfigError, match="noise"):
        Voice("en-us", 150, 1.5)
    with pytest.raises(ConfigError, match="no voices"):
        speaker_voice("a", voices=[])


def test_file_seed():
    assert file_seed(0, "u") == file_seed(0, "u")
    assert len({file_seed(s, u) for s in range(3) for u in "abc"}) == 9
    assert 0 <= file_seed(7, "x") < 2**63


def test_require_programs_names_the_package():
    with pytest.raises(ConfigError, match="apt-get install"):
        require_programs("privasr-no-such-program")


@needs_tts
def test_synthesize_is_deterministic_and_noisy():
    v = Voice("en-us+klatt", 150, 0.01)
    a = synthesize("hello there this is a test", v)
    assert a.dtype == np.int16 and 16000 < len(a) < 5 * 16000
    assert np.array_equal(a, synthesize("hello there this is a test", v))
    quiet = synthesize("hello there this is a test", Voice("en-us+klatt", 150, 0.0))
    assert len(quiet) == len(a) and 0 < np.std(quiet.astype(float) - a.astype(float)) < 0.02 * 32768
    s1 = synthesize("hello there this is a test", v, noise_seed=1)
    s2 = synthesize("hello there this is a test", v, noise_seed=2)
    assert len(s1) == len(a) and np.array_equal(s1, synthesize("hello there this is a test", v, noise_seed=1))
    d = s1.astype(float) - s2.astype(float)
    assert 0 < np.std(d) < 0.02 * 32768  # only the noise differs, and it is light
    assert not np.array_equal(s1, a)


@needs_tts
def test_synthesize_errors():
    with pytest.raises(InputError, match="at least one word"):
        synthesize("   ", Voice("en-us+klatt", 150, 0.01))
    with pytest.raises(ConfigError, match="espeak-ng has no voice 'no-such-voice-xyz'"):
        synthesize("hello", Voice("no-such-voice-xyz", 150, 0.01))  # espeak-ng alone would fall back silently
    with pytest.raises(ConfigError, match="no voice 'en-us\\+nokl'"):
        synthesize("hello", Voice("en-us+nokl", 150, 0.01))
    check_voice("en-us+klatt4")
    check_voice("en-gb")
    with pytest.raises(ConfigError, match="noise_seed"):
        synthesize("hello", Voice("en-us+klatt", 150, 0.01), noise_seed=1.5)  # type: ignore[arg-type]
