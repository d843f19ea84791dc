"""Canary formats and exposure (privasr.privacy.audit.exposure)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from privasr.errors import ConfigError, InputError
from privasr.privacy.audit.exposure import (
    DIGIT_WORDS,
    CanaryFormat,
    estimated_rank,
    exposure,
    extrapolated_exposure,
)

PIN = CanaryFormat("my pin is {} {} {} {} {} {}")

# -------------------------------------------------------------------------------------------------- formats


def test_format_size_slots_render_and_membership():
    assert PIN.alphabet == DIGIT_WORDS and PIN.slots == 6 and PIN.size == 10**6
    assert PIN.render([1, 2, 3, 4, 5, 0]) == "my pin is one two three four five zero"
    assert "my pin is one two three four five zero" in PIN
    assert "my pin is one two three four five" not in PIN and "my pin is 1 2 3 4 5 6" not in PIN
    braces = CanaryFormat("{{code}}: {}-{}", alphabet=["x", "yy"])
    assert braces.size == 4 and braces.render([1, 0]) == "{code}: yy-x" and "{code}: yy-x" in braces
    assert CanaryFormat("{}" * 30).size == 10**30        # exact, beyond int64


@pytest.mark.parametrize(("template", "alphabet", "match"), [
    ("no slots here", DIGIT_WORDS, "has no '{}' slot"),
    ("pin {0} {1}", DIGIT_WORDS, "fields other than plain"),
    ("pin {name}", DIGIT_WORDS, "fields other than plain"),
    ("pin {:>3}", DIGIT_WORDS, "fields other than plain"),
    ("pin {!r}", DIGIT_WORDS, "fields other than plain"),
    ("pin { ", DIGIT_WORDS, "not a valid format string"),
    (42, DIGIT_WORDS, "must be a string"),
    ("pin {}", ("one",), "at least 2 distinct"),
    ("pin {}", ("one", "one"), "at least 2 distinct"),
    ("pin {}", ("one", ""), "at least 2 distinct"),
    ("pin {}", "0123456789", "must be a list of words"),
])
def test_bad_formats_are_refused(template, alphabet, match):
    with pytest.raises(ConfigError, match=match):
        CanaryFormat(template, alphabet=alphabet)


def test_render_refuses_a_wrong_choice():
    with pytest.raises(ConfigError, match=r"6 indices in \[0, 10\)"):
        PIN.render([1, 2, 3])
    with pytest.raises(ConfigError, match="one word per slot"):
        PIN.render([1, 2, 3, 4, 5, 10])


def test_sample_is_distinct_reproducible_and_uniform():
    canaries = PIN.sample(np.random.default_rng(5), 5000)
    assert len(set(canaries)) == 5000 and all(c in PIN for c in canaries)
    assert PIN.sample(np.random.default_rng(5), 5000) == canaries
    words = np.array([c.split()[3:] for c in canaries])
    for slot in range(6):
        freq = [int(np.sum(words[:, slot] == w)) for w in DIGIT_WORDS]
        assert stats.chisquare(freq).pvalue > 1e-4, (slot, freq)


def test_sample_can_take_the_whole_space_and_no_more():
    tiny = CanaryFormat("{} {}", alphabet=("a", "b", "c"))
    assert sorted(tiny.sample(np.random.default_rng(0), 9)) == sorted(f"{x} {y}" for x in "abc" for y in "abc")
    with pytest.raises(ConfigError, match="cannot draw 10 distinct canaries from 9"):
        tiny.sample(np.random.default_rng(0), 10)
    with pytest.raises(ConfigError, match="integer >= 0"):
        tiny.sample(np.random.default_rng(0), -1)
    with pytest.raises(ConfigError, match="numpy.random.Generator"):
        tiny.sample(0, 1)
    assert tiny.sample(np.random.default_rng(0), 0) == []


def test_a_format_whose_canaries_run_into_each_other_is_refused_when_it_matters():
    ambiguous = CanaryFormat("{}{}", alphabet=("a", "aa"))    # "a" + "aa" == "aa" + "a"
    with pytest.raises(ConfigError, match="same text"):
        ambiguous.sample(np.random.default_rng(0), 4)


def test_random_candidates_avoid_the_canaries():
    tiny = CanaryFormat("{} {}", alphabet=("a", "b", "c"))
    planted = ["a a", "b c", "c c"]
    rest = tiny.random_candidates(np.random.default_rng(1), 6, exclude=planted + ["not a canary"])
    assert sorted(rest) == sorted({f"{x} {y}" for x in "abc" for y in "abc"} - set(planted))
    with pytest.raises(ConfigError, match="3 excluded"):
        tiny.random_candidates(np.random.default_rng(1), 7, exclude=planted)
    assert tiny.random_candidates(np.random.default_rng(1), 8, exclude="a a").count("a a") == 0


def test_a_space_beyond_int64_is_sampled_too():
    big = CanaryFormat("{}" * 20)
    assert big.size > 2**63
    out = big.random_candidates(np.random.default_rng(0), 1000, exclude=["zero" * 20])
    assert len(set(out)) == 1000 and all(c in big for c in out)


# ------------------------------------------------------------------------------------------------ exposure


def test_a_canary_below_every_candidate_gets_the_most_a_sample_can_measure():
    cand = np.linspace(10.0, 20.0, 999)
    assert exposure(1.0, cand, PIN.size) == pytest.approx(math.log2(1000))
    assert estimated_rank(1.0, cand, PIN.size) == pytest.approx(1000.0)   # |R| / (n + 1): top 0.1%
    assert exposure(25.0, cand, PIN.size) == 0.0                          # above them all: rank |R|


def test_a_canary_in_the_middle_gets_about_one_bit():
    cand = np.arange(1000.0)
    assert exposure(499.5, cand, PIN.size) == pytest.approx(1.0, abs=0.01)
    assert estimated_rank(499.5, cand, PIN.size) == pytest.approx(PIN.size / 2, rel=0.01)


def test_ties_count_against_the_canary():
    assert exposure(2.0, [1.0, 2.0, 2.0, 3.0], 100) == pytest.approx(math.log2(5 / 4))
    assert exposure(5.0, [5.0] * 99, 100) == 0.0      # a model that scores everything alike exposes nothing


def test_with_every_candidate_the_exposure_is_exact():
    """|R| = 10 scored in full: a canary of rank 3 has exposure log2(10) - log2(3)."""
    others = [0.5, 0.7, 1.1, 1.2, 1.3, 2.0, 2.5, 3.0, 9.0]
    assert exposure(0.9, others, space_size=10) == pytest.approx(math.log2(10) - math.log2(3))
    assert estimated_rank(0.9, others, space_size=10) == pytest.approx(3.0)


def test_exposure_is_minus_log2_of_the_canary_quantile_on_average():
    rng = np.random.default_rng(0)
    cand = rng.normal(size=20000)
    for q in (0.5, 0.1, 0.01):
        assert exposure(stats.norm.ppf(q), cand, PIN.size) == pytest.approx(-math.log2(q), abs=0.1)


def test_exposure_takes_an_array_of_canaries():
    got = exposure(np.array([0.0, 5.0, 11.0]), np.arange(1.0, 11.0), 1000)
    np.testing.assert_allclose(got, [math.log2(11), math.log2(11 / 6), 0.0])


def test_exposure_grows_with_repetitions_of_a_canary_in_the_training_text():
    """The Secret Sharer on a toy model: per-slot word counts (add-one) over background pins plus r copies."""
    rng = np.random.default_rng(0)
    canary = [int(i) for i in rng.integers(0, 10, 6)]
    background = rng.integers(0, 10, size=(500, 6))

    def score(pins: np.ndarray, r: int) -> np.ndarray:      # log-perplexity (nats) of each pin
        counts = np.stack([np.bincount(background[:, j], minlength=10) for j in range(6)]).astype(float)
        counts[np.arange(6), canary] += r
        logp = np.log((counts + 1.0) / (counts.sum(axis=1, keepdims=True) + 10.0))
        return -logp[np.arange(6), pins].mean(axis=-1)

    fmt = CanaryFormat("my pin is {} {} {} {} {} {}")
    text = fmt.render(canary)
    cand = np.array([[DIGIT_WORDS.index(w) for w in c.split()[3:]]
                     for c in fmt.random_candidates(rng, 2000, exclude=[text])])
    bits = {r: exposure(score(np.array(canary), r), score(cand, r), fmt.size) for r in (0, 5, 20, 100)}
    assert bits[0] < 3.0                                   # never seen: a random place
    assert bits[0] < bits[5] < bits[20]
    assert bits[100] == pytest.approx(math.log2(2001))     # memorised: ahead of every candidate


def test_extrapolated_exposure_reads_the_fitted_tail():
    rng = np.random.default_rng(0)
    cand = rng.normal(50.0, 5.0, 3000)
    assert extrapolated_exposure(50.0, cand, PIN.size) == pytest.approx(1.0, abs=0.1)
    want = -stats.norm.logcdf(-4.0) / math.log(2)          # 4 sd below: 15.1 bits, past log2(3001) = 11.6
    assert extrapolated_exposure(30.0, cand, PIN.size) == pytest.approx(want, rel=0.1)
    assert extrapolated_exposure(-1e4, cand, PIN.size) == pytest.approx(math.log2(PIN.size))   # capped
    assert extrapolated_exposure(1e4, cand, PIN.size) == 0.0
    skewed = stats.skewnorm.rvs(4.0, loc=10.0, scale=3.0, size=3000, random_state=rng)
    q = 1e-3
    assert extrapolated_exposure(stats.skewnorm.ppf(q, 4.0, loc=10.0, scale=3.0), skewed, PIN.size) == \
        pytest.approx(-math.log2(q), abs=1.0)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: exposure(float("nan"), [1.0, 2.0], 100), InputError, "canary_score is nan"),
    (lambda: exposure(1.0, [1.0, float("nan")], 100), InputError, r"candidate_scores\[1\] is nan"),
    (lambda: exposure(1.0, [], 100), InputError, "candidate_scores is empty"),
    (lambda: exposure(1.0, [[1.0, 2.0]], 100), InputError, "1-D"),
    (lambda: exposure(1.0, ["low"], 100), InputError, "are not numbers"),
    (lambda: exposure(1.0, [1.0, 2.0, 3.0], 3), InputError, "holds only 2 besides the canary"),
    (lambda: exposure(1.0, [1.0], 1), ConfigError, "space_size must be an integer >= 2"),
    (lambda: exposure(1.0, [1.0], 1e6), ConfigError, "space_size must be an integer"),
    (lambda: estimated_rank([[1.0]], [1.0], 100), InputError, "a number or a 1-D array"),
    (lambda: extrapolated_exposure(1.0, [1.0, 2.0, 1.0, 2.0], 100), InputError, "at least 3"),
    (lambda: extrapolated_exposure(float("inf"), [1.0, 2.0, 3.0], 100), InputError, "canary_score is inf"),
])
def test_bad_scores_are_refused_with_a_clear_message(call, error, match):
    with pytest.raises(error, match=match):
        call()
