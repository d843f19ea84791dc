"""Numbers spelled out as people say them, and the ``neural`` normaliser preset on the cases a neural first pass
raises (digits, currency, decimals, ordinals, hyphens, contractions, British spelling)."""

from __future__ import annotations

import pytest

from privasr.text.normalize import Normalizer
from privasr.text.numbers import spell_number_token, spell_numbers


@pytest.mark.parametrize(("token", "words"), [
    ("1.4", "one point four"), ("12.25", "twelve point two five"), ("0.5", "zero point five"),
    ("$12.50", "twelve dollars fifty cents"), ("$1", "one dollar"), ("€5", "five euros"),
    ("£3.99", "three pounds ninety nine pence"), ("$2.5", "two point five dollars"),
    ("50%", "fifty percent"), ("3.5%", "three point five percent"), ("21st", "twenty first"), ("3rd", "third"),
    ("1990", "nineteen ninety"), ("2024", "twenty twenty four"), ("1,000", "one thousand"),
    ("1,000,000.5", "one million point five"), ("10:30", "ten thirty"), ("9:05", "nine oh five"),
    ("12:00", "twelve o'clock"), ("007", "zero zero seven"), ("42", "forty two"),
])
def test_a_number_token_is_spelled_as_spoken(token: str, words: str) -> None:
    assert " ".join(spell_number_token(token) or []) == words


@pytest.mark.parametrize("token", ["mp3", "4k", "b2b", "LC-DSH", "word", "1.2.3", "12:75", "$", "%"])
def test_other_tokens_are_left_alone(token: str) -> None:
    assert spell_number_token(token) is None and spell_numbers([token]) == (token,)


def test_punctuation_around_a_number_stays_around_it() -> None:
    assert spell_numbers(["($12.50),", "1.4."]) == ("(twelve", "dollars", "fifty", "cents),", "one", "point", "four.")


@pytest.mark.parametrize(("text", "want"), [
    ("It costs 1.4 times more.", "it costs one point four times more"),  # not "14"
    ("It's $12.50.", "it's twelve dollars fifty cents"),  # not "1250" ('s is kept: is or a possessive)
    ("About 12.25 units", "about twelve point two five units"),  # not "1225"
    ("The LC-DSH unit", "the lc dsh unit"),  # not "lcdsh"
    ("We're gonna do it, we'll see", "we are going to do it we will see"),
    ("The colour of the centre", "the color of the center"),
])
def test_the_neural_preset_on_a_neural_first_pass_s_output(text: str, want: str) -> None:
    pytest.importorskip("whisper_normalizer")
    assert Normalizer.preset("neural").text(text) == want


def test_references_and_hypotheses_meet_under_the_neural_preset() -> None:
    pytest.importorskip("whisper_normalizer")
    norm = Normalizer.preset("neural")
    assert norm.text("we're gonna need twenty one of them") == norm.text("We are going to need 21 of them.")


def test_the_ami_preset_spells_digits_and_keeps_everything_else() -> None:
    ami = Normalizer.preset("ami")
    assert ami.text("It was 1.4 and $12.50, the L_C_D") == "it was one point four and twelve dollars fifty cents the l c d"
    assert Normalizer.preset("asr").text("It was 1.4") == "it was 14"  # the default: the sets' convention
    with pytest.raises(Exception, match="numbers='say' is not valid"):
        Normalizer(numbers="say")
