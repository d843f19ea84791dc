"""Anonymising whole corpora: transcripts and N-best lists, alignment of per-word values, no entity left."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.anon.apply import anonymize_records, gold_spans, realign
from privasr.anon.transform import Anonymizer, EntitySpan
from privasr.corpus.records import Hypothesis, NBest, Span, Transcript
from privasr.errors import ConfigError, InputError


class WordListDetector:
    """A stand-in NER: fixed words are one-word PER entities."""

    def __init__(self, names: set[str]) -> None:
        self.names = names
        self.calls = 0

    def detect(self, sentences):
        self.calls += 1
        return [[EntitySpan(i, i + 1, "PER") for i, w in enumerate(s) if w in self.names] for s in sentences]


def _transcripts() -> list[Transcript]:
    return [
        Transcript("u1", ("hi", "john", "smith", "from", "paris"), confidences=(0.9, 0.8, 0.7, 0.6, 0.5),
                   times=((0, 1), (1, 2), (2, 3), (3, 4), (4, 5)), client="c1",
                   entities=(Span(1, 3, "PERSON"), Span(4, 5, "GPE")), meta={"case": ["LC"] * 5}),
        Transcript("u2", ("john", "again", "42"), client="c1", entities=(Span(0, 1, "PER"), Span(2, 3, "CARDINAL"))),
        Transcript("u3", ("john", "elsewhere"), client="c2", entities=(Span(0, 1, "PER"),)),
    ]


@pytest.mark.parametrize("mode", ["surrogate", "tag", "redact"])
def test_gold_entities_never_survive_and_inputs_unchanged(mode: str) -> None:
    recs = _transcripts()
    before = _transcripts()
    out, stats = anonymize_records(recs, Anonymizer(mode, seed=3), entities="gold")
    assert recs == before
    texts = [" ".join(t.words) for t in out]
    for name in ("john", "smith", "paris"):
        assert all(name not in t.split() for t in texts)
    assert "42" in out[1].words  # CARDINAL is not an entity to anonymise
    assert stats.mentions == {"PER": 3, "LOC": 1}
    assert stats.words_in == 10
    assert all(t.meta == {"anon": mode} for t in out)  # per-token meta (case, punctuation) is dropped


def test_surrogates_consistent_within_client_only() -> None:
    out, _ = anonymize_records(_transcripts(), Anonymizer("surrogate", seed=0), entities="gold")
    assert out[0].words[1] == out[1].words[0]  # "john" in c1 twice
    assert out[0].confidences == (0.9, 0.8, 0.7, 0.6, 0.5) and out[0].times == _transcripts()[0].times
    assert out[0].entities == (Span(1, 3, "PER"), Span(4, 5, "LOC"))
    # another client draws its own table: with the pool size it would be a coincidence to match every seed
    differs = 0
    for seed in range(5):
        o, _ = anonymize_records(_transcripts(), Anonymizer("surrogate", seed=seed), entities="gold")
        differs += o[2].words[0] != o[0].words[1]
    assert differs >= 4


def test_tag_mode_merges_times_and_confidences() -> None:
    out, stats = anonymize_records(_transcripts()[:1], Anonymizer("tag"), entities="gold")
    t = out[0]
    assert t.words == ("hi", "<PER>", "from", "<LOC>")
    assert t.confidences == (0.9, 0.7, 0.6, 0.5)
    assert t.times == ((0, 1), (1, 3), (3, 4), (4, 5))
    assert t.entities == (Span(1, 2, "PER"), Span(3, 4, "LOC"))
    assert stats.words_changed == 3


def test_redact_drops_words_and_their_values() -> None:
    out, _ = anonymize_records(_transcripts()[:1], Anonymizer("redact"), entities="gold")
    assert out[0].words == ("hi", "from") and out[0].confidences == (0.9, 0.6) and out[0].entities == ()


def test_nbest_lists_use_the_detector_on_every_hypothesis_and_the_reference() -> None:
    nb = NBest("u1", (Hypothesis(("call", "anna", "now"), scores={"am": -1.0}),
                      Hypothesis(("call", "hannah", "now"), scores={"am": -2.0})),
               client="m1", ref=("call", "anna", "now"))
    det = WordListDetector({"anna", "hannah"})
    out, stats = anonymize_records([nb], Anonymizer("surrogate", seed=1), det)
    assert det.calls == 1  # one batch for the whole corpus
    o = out[0]
    assert isinstance(o, NBest)
    assert o.hyps[0].words[1] == o.ref[1] != "anna"
    assert o.hyps[1].words[1] not in ("hannah", "anna")
    assert [h.scores for h in o.hyps] == [{"am": -1.0}, {"am": -2.0}]
    assert stats.word_sequences == 3 and stats.mentions == {"PER": 3}


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="entities="):
        anonymize_records([], Anonymizer(), entities="oracle")
    with pytest.raises(ConfigError, match="needs a detector"):
        anonymize_records([], Anonymizer())
    nb = NBest("u1", (Hypothesis(("a",)),))
    with pytest.raises(InputError, match="no entity annotations"):
        anonymize_records([nb], Anonymizer(), entities="gold")
    with pytest.raises(InputError, match="Transcript or NBest"):
        anonymize_records(["text"], Anonymizer(), entities="gold")  # type: ignore[list-item]

    class Short:
        def detect(self, sentences):
            return []

    with pytest.raises(InputError, match="one list of spans per word sequence"):
        anonymize_records(_transcripts(), Anonymizer(), Short())

    class Outside:
        def detect(self, sentences):
            return [[EntitySpan(0, len(s) + 1, "PER")] for s in sentences]

    with pytest.raises(InputError, match="goes past"):
        anonymize_records(_transcripts(), Anonymizer(), Outside())
    with pytest.raises(InputError, match="goes past"):
        gold_spans([Span(1, 9, "PER")], 3)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(1, 3)), max_size=4))),
    st.sampled_from(["surrogate", "tag", "redact"]))
def test_realign_keeps_values_in_step_with_words(case, mode) -> None:
    n, raw = case
    spans, end = [], 0
    for start, length in sorted(raw):
        if n and start >= end and start + length <= n:
            spans.append(EntitySpan(start, start + length, "PER"))
            end = start + length
    words = tuple(f"w{i}" for i in range(n))
    out_words = Anonymizer(mode).transform(words, spans)
    values = tuple(range(n))
    aligned = realign(values, spans, mode, min)
    assert aligned is not None and len(aligned) == len(out_words)
    # words outside the spans keep their own value
    kept = [i for i in range(n) if not any(s.start <= i < s.end for s in spans)]
    assert set(kept) <= set(aligned)
