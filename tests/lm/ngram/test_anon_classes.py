"""Class n-gram inputs from anonymised transcripts (paper 003, M2) and the eq. 2 weights."""

from __future__ import annotations

import pytest

from privasr.anon.transform import Anonymizer, EntitySpan
from privasr.corpus.records import Transcript
from privasr.errors import InputError
from privasr.lm.ngram.anon_classes import (
    TurnTexts,
    build_turn_texts,
    entity_class_map,
    eq2_weights,
    normalise_marked,
)
from privasr.text.normalize import Normalizer

AMI = Normalizer.preset("ami")


def test_normalise_marked_keeps_entity_words_and_their_clitics():
    out = normalise_marked(["Zorblax", "'s", "team", "--", "in", "Blorpton", "."],
                           ["PER", None, None, "LOC", None, "LOC", None], AMI)
    assert out == [("", 0, "'s"), ("team", None, ""), ("in", None, ""), ("", 5, "")]
    with pytest.raises(InputError, match="3 words but 2 labels"):
        normalise_marked(["a", "b", "c"], [None, None], AMI)


def test_turn_texts_align_surrogates_tags_and_labels():
    turns = [Transcript("m_A_0", ("Zorblax", "went", "to", "Blorpton", "."), client="m"),
             Transcript("m_A_1", ("Um", "."), client="m"),
             Transcript("m_B_2", ("Zorblax", "is", "here"), client="m")]
    spans = [[EntitySpan(0, 1, "PER"), EntitySpan(3, 4, "LOC")], [], [EntitySpan(0, 1, "PER")]]
    texts = build_turn_texts(turns, spans, Anonymizer(seed=3), AMI)
    assert all(isinstance(t, TurnTexts) for t in texts)
    assert [t.original for t in texts] == [("zorblax", "went", "to", "blorpton"), ("um",), ("zorblax", "is", "here")]
    first, _, last = texts
    assert first.tagged == ("<PER>", "went", "to", "<LOC>") and first.labels == ("PER", None, None, "LOC")
    assert first.original_members == ("zorblax", "blorpton")
    assert len(first.surrogate) == len(first.tagged) and "zorblax" not in first.surrogate
    assert first.surrogate[1:3] == ("went", "to") and first.meeting == "m"
    # consistent within a meeting: the same name gets the same surrogate
    assert last.surrogate[0] == first.surrogate[0]


def test_entity_class_map_members_and_probabilities():
    t1 = TurnTexts("m", (), ("bob", "ann", "paris"), ("<PER>", "<PER>", "<LOC>"), ("PER", "PER", "LOC"),
                   ("zorblax", "quentavia", "blorpton"))
    t2 = TurnTexts("m", (), ("bob", "went"), ("<PER>", "went"), ("PER", None), ("zorblax",))
    cm = entity_class_map([t1, t2])
    assert cm.members("<PER>") == ("ann", "bob") and cm.file_probs("<PER>") == pytest.approx(
        {"ann": 1 / 3, "bob": 2 / 3})
    assert cm.file_probs("<LOC>") == {"paris": 1.0}
    orig = entity_class_map([t1, t2], "original")
    assert orig.file_probs("<PER>") == pytest.approx({"quentavia": 1 / 3, "zorblax": 2 / 3})
    # a word more often plain than an entity stays a word
    plain = TurnTexts("m", (), ("paris", "paris"), ("paris", "paris"), (None, None), ())
    assert "<LOC>" not in set(entity_class_map([t1, plain]).classes)
    with pytest.raises(InputError, match="member source"):
        entity_class_map([t1], "tagged")


def test_eq2_weights():
    assert eq2_weights([0.3, 0.7]) == {"lw": 0.3, "lc": 0.7}
    assert eq2_weights([0.0, 0.0, 1.0]) == {"lw": 0.5, "lc": 0.5, "ln": 1.0}
    w = eq2_weights([0.2, 0.6, 0.2])
    assert (w["lw"], w["lc"], w["ln"]) == (0.25, 0.75, 0.2)
