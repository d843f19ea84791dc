"""Tests of the pronouncing dictionary, phone distances and acoustic confusions."""

from __future__ import annotations

import random
import time

import pytest

from privasr.corpus.phonetics import (
    PHONES,
    Confusions,
    default_cmudict_path,
    indel_cost,
    letter_to_sound,
    load_cmudict,
    phone_distance,
    phone_similarity,
    substitution_cost,
)
from privasr.errors import ConfigError, InputError


@pytest.fixture(scope="module")
def lex():
    return load_cmudict()


def test_cmudict_loads_variants_and_strips_stress(lex, tmp_path):
    assert default_cmudict_path().is_file()
    assert len(lex) > 100_000
    assert lex["read"] == (("R", "EH", "D"), ("R", "IY", "D"))
    assert "read(2)" not in lex
    p = tmp_path / "mini.dict"
    p.write_text("hello HH AH0 L OW1\nhello(2) HH EH0 L OW1\n\nworld W ER1 L D # comment\n")
    d = load_cmudict(p)
    assert d["hello"] == (("HH", "AH", "L", "OW"), ("HH", "EH", "L", "OW"))
    assert d["world"] == (("W", "ER", "L", "D"),)
    assert all(ph in PHONES for prons in lex.values() for pron in prons for ph in pron)


def test_cmudict_errors(tmp_path):
    with pytest.raises(InputError, match="no such"):
        load_cmudict(tmp_path / "missing.dict")
    bad = tmp_path / "bad.dict"
    bad.write_text("ok OW K EY\nodd XX Y\n")
    with pytest.raises(InputError) as e:
        load_cmudict(bad)
    assert e.value.line == 2


def test_substitution_costs_follow_articulation():
    assert substitution_cost("T", "T") == 0.0
    # voicing pairs < same manner < unrelated < vowel-consonant
    assert substitution_cost("P", "B") < substitution_cost("P", "K") < substitution_cost("P", "L")
    assert substitution_cost("P", "L") < substitution_cost("P", "IY") == 1.0
    # vowels among vowels are cheaper than consonants against vowels
    assert max(substitution_cost(a, b) for a in ("IY", "IH", "AA", "UW") for b in ("EH", "AO")) < 1.0
    assert substitution_cost("IY", "IH") < substitution_cost("IY", "AA")
    for a in PHONES:
        for b in PHONES:
            assert substitution_cost(a, b) == substitution_cost(b, a)
            assert 0.0 <= substitution_cost(a, b) <= 1.0
    assert indel_cost("AH") < indel_cost("K")
    with pytest.raises(InputError):
        substitution_cost("XX", "T")


def test_phone_distance_properties():
    a, b, c = ("R", "AY", "T"), ("L", "AY", "T"), ("B", "AH", "JH", "AH", "T")
    assert phone_distance(a, a) == 0.0
    assert phone_distance(a, b) == phone_distance(b, a) == 0.4
    assert phone_distance(a, c) <= phone_distance(a, b) + phone_distance(b, c) + 1e-9
    assert phone_distance((), c) == pytest.approx(sum(indel_cost(p) for p in c))
    assert phone_similarity(a, a) == 1.0
    assert 0.0 <= phone_similarity(a, c) < phone_similarity(a, b) < 1.0
    with pytest.raises(InputError):
        phone_distance(("R", "QQ"), a)


def test_letter_to_sound_is_plausible(lex):
    assert letter_to_sound("") == ()
    assert letter_to_sound("1234") == ()
    # close to the dictionary for regular words
    for w in ("smith", "thing", "chip", "sheep", "cat", "bright", "station"):
        assert phone_similarity(letter_to_sound(w), lex[w][0]) >= 0.6, w
    assert all(p in PHONES for p in letter_to_sound("Przybyszewski-O'Neill"))


def test_neighbours_are_phonetically_sensible():
    vocab = ["right", "write", "light", "bright", "rice", "wrote", "table", "budget", "elephant", "a"]
    c = Confusions(vocab, k=4)
    ns = c.neighbours("right")
    words = [n.word for n in ns]
    assert words[0] == "write" and ns[0].similarity == 1.0 and ns[0].distance == 0.0
    assert "light" in words
    assert "elephant" not in words and "right" not in words
    sims = [n.similarity for n in ns]
    assert sims == sorted(sims, reverse=True)
    assert len(c.neighbours("right", 2)) == 2
    assert [n.word for n in c.neighbours("budget", 1)] != ["a"]


def test_neighbours_in_a_large_vocabulary(lex):
    words = sorted(w for w in lex if w.isalpha())
    vocab = random.Random(0).sample(words, 5000) + ["right", "write", "light", "night", "flight"]
    t = time.perf_counter()
    c = Confusions(vocab, k=10)
    elapsed = time.perf_counter() - t
    assert elapsed < 10.0, elapsed  # ~1 s on two cores
    near = {n.word for n in c.neighbours("right")}
    assert {"write", "light", "night"} <= near
    assert {n.word for n in c.neighbours("light")} >= {"right", "night"}
    # the pre-filter rarely misses: compare with brute force on a sample of words
    rng = random.Random(1)
    loss = []
    for w in rng.sample(vocab, 25):
        pw = c.pronunciations(w)
        brute = sorted(
            (max(phone_similarity(a, b) for a in pw for b in c.pronunciations(v)) for v in c.words if v != w),
            reverse=True,
        )[:5]
        got = [n.similarity for n in c.neighbours(w, 5)]
        assert got[0] <= brute[0] + 1e-4  # similarities are rounded to 4 decimals
        loss.append(sum(brute) - sum(got))
    assert sum(loss) / (5 * len(loss)) < 0.03


def test_oov_words_use_letter_to_sound():
    c = Confusions(["zorblatt", "sorbet", "table"], k=2)
    assert "zorblatt" in c.oov and "table" not in c.oov
    assert c.pronunciations("zorblatt") == (letter_to_sound("zorblatt"),)
    assert c.neighbours("zorblatt")[0].word == "sorbet"


def test_result_independent_of_order_and_cached():
    a = Confusions(["cat", "bat", "hat", "dog", "fog"])
    b = Confusions(["fog", "dog", "hat", "bat", "cat", "cat"])
    assert a.table() == b.table()
    assert len(a) == 5 and "cat" in a
    assert Confusions.for_vocabulary(["x", "y"], k=3) is Confusions.for_vocabulary(("y", "x"), k=3)
    with pytest.raises(KeyError):
        a.neighbours("cow")


def test_confusions_validation():
    with pytest.raises(ConfigError, match="k="):
        Confusions(["a"], k=0)
    with pytest.raises(ConfigError, match="prefilter"):
        Confusions(["a"], prefilter=True)
    with pytest.raises(InputError):
        Confusions(["a b"])
    assert Confusions(["only"]).neighbours("only") == []
