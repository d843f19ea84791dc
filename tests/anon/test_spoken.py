"""Spoken identifiers: every kind of docs/anonymisation.md's list found whole, and ordinary speech left alone."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.anon.spoken import KINDS, spoken_identifiers


def found(text: str) -> list[tuple[str, str]]:
    ws = text.split()
    return [(s.kind, " ".join(ws[s.start:s.end])) for s in spoken_identifiers(ws)]


@pytest.mark.parametrize(("text", "kind", "span"), [
    ("mail me at john dot smith at example dot com please", "email", "john dot smith at example dot com"),
    ("it is j underscore doe at mail dot co dot uk", "email", "j underscore doe at mail dot co dot uk"),
    ("go to w w w dot acme dot co dot uk slash careers", "url", "w w w dot acme dot co dot uk slash careers"),
    ("see double u double u double u dot acme dot com", "url", "double u double u double u dot acme dot com"),
    ("the site is acme dot org", "url", "acme dot org"),
    ("h t t p s colon slash slash example dot com slash login", "url",
     "h t t p s colon slash slash example dot com slash login"),
    ("call me on five five five double one two three", "digits", "five five five double one two three"),
    ("my number is plus four four seven seven oh nine one two three four five six", "digits",
     "plus four four seven seven oh nine one two three four five six"),
    ("the account is 4111 1111 1111 1111", "digits", "4111 1111 1111 1111"),
    ("i was born on the fifth of march nineteen eighty four", "date", "the fifth of march nineteen eighty four"),
    ("the deadline is march fifth twenty twenty three", "date", "march fifth twenty twenty three"),
    ("my date of birth is the twenty first of june", "date", "the twenty first of june"),
    ("the third of may two thousand and five", "date", "the third of may two thousand and five"),
    ("she lives at twenty two baker street in london", "address", "twenty two baker street"),
    ("send it to 1600 pennsylvania avenue", "address", "1600 pennsylvania avenue"),
    ("my post code is s w one a one a a", "postcode", "s w one a one a a"),
    ("zip code nine four one zero five", "postcode", "nine four one zero five"),
])
def test_each_kind_is_found_whole(text: str, kind: str, span: str) -> None:
    assert (kind, span) in found(text)
    assert set(KINDS) >= {kind}


@pytest.mark.parametrize("text", [
    "we meet at three in the dot com building",
    "the meeting is on march fifth",
    "it may rain on the fifth",
    "we sold two thousand units in may",
    "walk one block down the street",
    "look at the data dot by dot",
    "we had one two three four five six people",  # six digits: not a number read out
    "the zip file is on the server",
])
def test_ordinary_speech_is_left_alone(text: str) -> None:
    assert found(text) == []


def test_other_casings_are_read_lower_case() -> None:
    assert found("MAIL JOHN AT EXAMPLE DOT COM") == [("email", "JOHN AT EXAMPLE DOT COM")]


DIGIT_WORDS = ["zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(DIGIT_WORDS),
                          st.tuples(st.sampled_from(["double", "triple"]), st.sampled_from(DIGIT_WORDS))),
                min_size=7, max_size=16),
       st.sampled_from([("call", "me", "on"), ("my", "card", "is"), ()]),
       st.sampled_from([("thanks",), ("please", "call", "back"), ()]))
def test_any_number_read_digit_by_digit_is_found_whole(parts, before, after) -> None:
    number = [w for p in parts for w in (p if isinstance(p, tuple) else (p,))]
    ws = [*before, *number, *after]
    spans = spoken_identifiers(ws)
    assert [(s.start, s.end, s.kind) for s in spans] == [(len(before), len(before) + len(number), "digits")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["we", "the", "report", "at", "dot", "com", "is", "on", "march", "street", "one",
                                 "meeting", "to", "be", "held", "next", "week", "may", "and"]), max_size=12))
def test_found_spans_are_ordered_and_disjoint(ws) -> None:
    spans = spoken_identifiers(ws)
    for a, b in zip(spans, spans[1:], strict=False):
        assert a.end <= b.start
    assert all(0 <= s.start < s.end <= len(ws) for s in spans)
