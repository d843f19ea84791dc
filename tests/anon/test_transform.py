"""Surrogate, tag and redaction rewrites of entity spans: consistency within a client, seeding, inputs left
alone, label mapping and bad spans."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.anon import Anonymizer, EntitySpan, check_spans, map_label
from privasr.anon.transform import surrogate_pools
from privasr.errors import ConfigError, InputError

WORDS = ("yesterday", "john", "smith", "from", "acme", "flew", "to", "paris", "with", "john")
SPANS = [EntitySpan(1, 3, "PER"), EntitySpan(4, 5, "ORG"), EntitySpan(7, 8, "LOC"), EntitySpan(9, 10, "PER")]


def test_surrogates_are_consistent_within_a_client_and_drawn_from_the_category() -> None:
    anon = Anonymizer("surrogate", seed=3)
    out = anon.transform(WORDS, SPANS, client="a")
    assert len(out) == len(WORDS)
    assert [out[i] for i in (0, 3, 5, 6, 8)] == [WORDS[i] for i in (0, 3, 5, 6, 8)]  # non-entities kept
    assert out[1] == out[9] != "john"  # the same name, the same surrogate
    pools = surrogate_pools()
    assert out[1] in pools["PER"] and out[2] in pools["PER"] and out[4] in pools["ORG"] and out[7] in pools["LOC"]
    again = anon.transform(("john", "likes", "paris"), [EntitySpan(0, 1, "PER"), EntitySpan(2, 3, "LOC")], "a")
    assert again == (out[1], "likes", out[7])
    assert anon.mapping("a")[("PER", "john")] == out[1]


def test_seeded_per_client_independent_of_the_order_clients_are_seen() -> None:
    a1, a2 = Anonymizer(seed=5), Anonymizer(seed=5)
    x = a1.transform(WORDS, SPANS, client="x")
    a1.transform(WORDS, SPANS, client="y")
    a2.transform(WORDS, SPANS, client="y")
    assert a2.transform(WORDS, SPANS, client="x") == x
    other = Anonymizer(seed=6).transform(WORDS, SPANS, client="x")
    assert other != x


def test_tag_and_redact_modes() -> None:
    assert Anonymizer("tag").transform(WORDS, SPANS) == (
        "yesterday", "<PER>", "from", "<ORG>", "flew", "to", "<LOC>", "with", "<PER>")
    assert Anonymizer("redact").transform(WORDS, SPANS) == ("yesterday", "from", "flew", "to", "with")


def test_inputs_are_not_modified() -> None:
    words = list(WORDS)
    spans = list(reversed(SPANS))
    Anonymizer().transform(words, spans, client="c")
    assert words == list(WORDS) and spans == list(reversed(SPANS))


def test_ontonotes_labels_map_to_the_four_categories() -> None:
    assert [map_label(x) for x in ("PERSON", "ORG", "GPE", "LOC", "FAC", "NORP", "DATE", "TIME", "LAW")] == \
        ["PER", "ORG", "LOC", "LOC", "LOC", "MISC", "MISC", "MISC", "MISC"]
    assert map_label("CARDINAL") is None and map_label("MONEY") is None


@pytest.mark.parametrize(
    ("spans", "match"),
    [
        ([EntitySpan(0, 2, "PER"), EntitySpan(1, 3, "LOC")], "overlap"),
        ([EntitySpan(8, 11, "PER")], "goes past"),
    ],
)
def test_bad_spans_are_input_errors(spans, match) -> None:
    with pytest.raises(InputError, match=match):
        check_spans(WORDS, spans)


def test_bad_span_fields_and_settings() -> None:
    with pytest.raises(InputError, match="label"):
        EntitySpan(0, 1, "PERSON")
    with pytest.raises(InputError, match="integer"):
        EntitySpan(0.0, 1, "PER")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="mode"):
        Anonymizer("scramble")
    with pytest.raises(ConfigError, match="seed"):
        Anonymizer(seed="1")  # type: ignore[arg-type]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=12), st.data())
def test_any_valid_spans_keep_the_other_words_in_order(words, data) -> None:
    n = len(words)
    cuts = sorted(data.draw(st.sets(st.integers(0, n), max_size=6)))
    spans = [EntitySpan(a, b, data.draw(st.sampled_from(["PER", "ORG", "LOC", "MISC"])))
             for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b]
    inside = {i for s in spans for i in range(s.start, s.end)}
    kept = [w for i, w in enumerate(words) if i not in inside]
    assert list(Anonymizer("redact").transform(words, spans)) == kept
    sur = Anonymizer("surrogate", seed=1).transform(words, spans, client="z")
    assert len(sur) == n and [w for i, w in enumerate(sur) if i not in inside] == kept
