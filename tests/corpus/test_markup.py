"""sclite's transcript markup: parsing, its refusals, counting and markup-preserving normalisation."""

from __future__ import annotations

import re

import pytest

from privasr.corpus.markup import has_markup, is_optional, map_words, markup_counts, parse_markup
from privasr.errors import InputError
from privasr.metrics.sclite import align_sclite


def test_parse_nested_and_glued_alternations():
    assert parse_markup("x { a { b / c } / d e } y".split()) == ("x", (("a", (("b",), ("c",))), ("d", "e")), "y")
    assert parse_markup(["{um/uh/@}"]) == ((("um",), ("uh",), ("@",)),)
    assert parse_markup(["x", "{", "a", "}", "y"]) == ("x", "a", "y")  # one alternative: its words
    assert parse_markup(["and/or"]) == ("and/or",)  # '/' outside braces is part of a word, as in sclite
    assert is_optional("(um)") and not is_optional("()")


@pytest.mark.parametrize(("text", "needle"), [
    ("a { b / c", "never closed"),
    ("a } b", "closes no"),
    ("a { / b }", "empty alternative"),
    ("a { b / }", "empty alternative"),
    ("c{a / b}", "glued"),
    ("a () b", "'()'"),
])
def test_malformed_markup_is_refused(text, needle):
    with pytest.raises(InputError, match=re.escape(needle)):
        parse_markup(text.split())
    if text != "a () b":  # not markup to the aligner: sclite reads '()' as a word; the trn reader refuses it
        with pytest.raises(InputError, match=re.escape(needle)):
            align_sclite([text.split()], [["a"]])


def test_normalising_keeps_the_markup():
    from privasr.text.normalize import Normalizer

    norm = Normalizer.from_spec("wer,fillers=keep")
    assert map_words(["I've", "{", "UM", "/", "@", "}", "Far."], norm)[1:6] == ("{", "um", "/", "@", "}")
    # a normaliser that drops fillers leaves the alternative empty: it becomes the null word
    assert map_words(["{", "UM", "/", "yes", "}"], Normalizer.preset("wer")) == ("{", "@", "/", "yes", "}")
    assert markup_counts(["a", "{", "b", "/", "@", "}"]) == (1, 1, 0)
    assert has_markup(["{b/c}"]) and not has_markup(["and/or"])
