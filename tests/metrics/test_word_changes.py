"""word_hit_changes: agrees with the WER counts, is antisymmetric, rejects bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.errors import InputError
from privasr.metrics import wer, word_hit_changes

WORDS = st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(WORDS, WORDS, WORDS), min_size=1, max_size=5))
def test_net_is_the_difference_of_correct_words_and_swapping_swaps(rows: list) -> None:
    refs, a, b = ([r[k] for r in rows] for k in range(3))
    ch = word_hit_changes(refs, a, b, top=100)

    def hits(h: list) -> int:
        w = wer(refs, h, aligner="sclite")
        return w.ref_words - w.substitutions - w.deletions

    assert ch.net == hits(a) - hits(b)
    assert sum(n for _, n in ch.gained) - sum(n for _, n in ch.lost) == ch.net
    back = word_hit_changes(refs, b, a, top=100)
    assert back.gained == ch.lost and back.lost == ch.gained and back.net == -ch.net
    assert ch.words_changed == len(ch.gained) + len(ch.lost)


def test_top_and_order() -> None:
    refs = [["x", "y", "y", "z"]]
    ch = word_hit_changes(refs, [["x", "y", "y", "q"]], [["q", "q", "q", "z"]], top=1)
    assert ch.gained == (("y", 2),) and ch.lost == (("z", 1),) and ch.net == 2 and ch.words_changed == 3
    assert ch.to_dict() == {"gained": [["y", 2]], "lost": [["z", 1]], "net": 2, "words_changed": 3}


def test_bad_input() -> None:
    with pytest.raises(InputError, match="one hypothesis of each system"):
        word_hit_changes([["a"]], [["a"]], [])
    with pytest.raises(InputError, match="top"):
        word_hit_changes([["a"]], [["a"]], [["a"]], top=-1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(WORDS, WORDS, WORDS), min_size=1, max_size=5))
def test_class_changes_add_up_to_the_wer_counts(rows: list) -> None:
    from privasr.metrics import class_changes

    refs, a, b = ([r[k] for r in rows] for k in range(3))
    classes = [["vowel" if w == "a" else "consonant" for w in r] for r in refs]
    ch = class_changes(refs, a, b, classes, order=("vowel",))
    wa, wb = wer(refs, a, aligner="sclite"), wer(refs, b, aligner="sclite")
    assert sum(c.ref_words for c in ch) == wa.ref_words
    assert sum(c.errors_a for c in ch) == wa.substitutions + wa.deletions
    assert sum(c.errors_b for c in ch) == wb.substitutions + wb.deletions
    assert all(c.fixed - c.broken == c.net for c in ch)
    assert [c.word_class for c in ch][:1] in ([], ["vowel"]) or "vowel" not in {c.word_class for c in ch}


def test_class_changes_reject_misshapen_classes() -> None:
    from privasr.metrics import class_changes

    with pytest.raises(InputError, match="one class per reference word"):
        class_changes([["a", "b"]], [["a"]], [["b"]], [["x"]])
    with pytest.raises(InputError, match="one of each"):
        class_changes([["a"]], [["a"]], [["a"]], [])
