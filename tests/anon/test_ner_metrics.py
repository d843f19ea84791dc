"""NER scores: span P/R/F1, mention outcomes, leak counting through the real anonymiser, name leaks, a
detector scored on the part asked for."""

from __future__ import annotations

import pytest

from privasr.anon.ner_data import clean_speaker_names
from privasr.anon.ner_metrics import leak_counts, mention_outcomes, names_leaked, span_prf, token_recall
from privasr.anon.transform import EntitySpan
from privasr.errors import InputError


def test_span_prf_counts_exact_spans_only() -> None:
    gold = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "LOC")], [EntitySpan(0, 1, "ORG")]]
    pred = [[EntitySpan(0, 1, "PER"), EntitySpan(3, 4, "LOC")], [EntitySpan(0, 1, "ORG"), EntitySpan(2, 3, "MISC")]]
    r = span_prf(gold, pred)
    assert r["PER"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "tp": 0, "gold": 1, "pred": 1}
    assert r["LOC"]["f1"] == 1.0 and r["MISC"]["precision"] == 0.0
    assert r["micro"]["precision"] == 0.5 and r["micro"]["recall"] == pytest.approx(2 / 3)
    assert token_recall(gold, pred)["PER"] == 0.5
    with pytest.raises(InputError):
        span_prf(gold, pred[:1])


def test_mention_outcomes_separate_boundaries_labels_and_misses() -> None:
    gold = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "PER"), EntitySpan(5, 7, "PER")],
            [EntitySpan(0, 3, "PER"), EntitySpan(4, 5, "ORG")]]
    pred = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "LOC"), EntitySpan(6, 7, "PER")],
            [EntitySpan(0, 1, "PER"), EntitySpan(1, 3, "ORG"), EntitySpan(4, 5, "ORG")]]
    r = mention_outcomes(gold, pred, ["PER", "ORG"])
    per = r["PER"]
    assert (per["exact"], per["other_label"], per["covered"], per["partial"], per["missed"]) == (1, 1, 1, 1, 0)
    assert per["mentions"] == 4 and per["covered_recall"] == 0.75
    assert r["ORG"]["exact"] == 1 and r["ORG"]["covered_recall"] == 1.0
    # exact-span recall is the "exact" share
    assert span_prf(gold, pred)["PER"]["recall"] == per["exact"] / per["mentions"]
    missed = mention_outcomes([[EntitySpan(0, 1, "PER")]], [[]], ["PER"])["PER"]
    assert missed["missed"] == 1 and missed["covered_recall"] == 0.0
    assert mention_outcomes([[]], [[]], ["PER"])["PER"]["covered_recall"] == 0.0
    with pytest.raises(InputError):
        mention_outcomes(gold, pred[:1])


def test_leak_counts_use_the_anonymiser() -> None:
    words = [("john", "smith", "of", "acme", "in", "paris")]
    gold = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "ORG"), EntitySpan(5, 6, "LOC")]]
    assert leak_counts(words, gold, [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "MISC")]])["all"] == \
        {"mentions": 3, "leaked": 1, "leak_rate": pytest.approx(1 / 3)}
    partial = leak_counts(words, gold, [[EntitySpan(1, 2, "PER")]])
    assert partial["PER"]["leaked"] == 1 and partial["LOC"]["leaked"] == 1


def test_names_leaked_counts_common_words_only_as_names() -> None:
    names = clean_speaker_names(["Speaker 1", "Operator", "Mark Lee", "Zed"])
    assert names == [("mark", "lee"), ("zed",)]
    words = [("mark", "lee", "spoke"), ("we", "mark", "it"), ("zed", "said")]
    gold = [[EntitySpan(0, 2, "PER")], [], [EntitySpan(0, 1, "PER")]]
    anon = [("bob", "lee", "spoke"), ("we", "mark", "it"), ("zed", "said")]
    r = names_leaked(words, gold, anon, names, common={"mark"})
    assert r["leaked"] == ["lee", "zed"]  # "mark" survives only as the verb
    assert r["leaked_strict"] == ["lee", "mark", "zed"]
    full = names_leaked(words, gold, words, names, common={"mark"})
    assert "mark lee" in full["leaked"]


def test_evaluate_detector_scores_the_part_asked_for() -> None:
    from privasr.anon.ner import PatternDetector
    from privasr.anon.ner_data import NerData
    from privasr.anon.ner_metrics import evaluate_detector
    from privasr.errors import ConfigError

    gold = [EntitySpan(0, 1, "PER")]
    data = NerData({"x": {"test": [(("John", "went"), gold)], "dev": [(("Mary", "went"), gold)]}},
                   {"x": {"test": ["a"], "dev": ["b"]}}, {}, {})
    det = PatternDetector(names={"john"}, common=set())
    assert evaluate_detector(det, data)["asr"]["all"]["prf"]["PER"]["recall"] == 1.0
    assert evaluate_detector(det, data, part="dev")["asr"]["all"]["prf"]["PER"]["recall"] == 0.0
    with pytest.raises(ConfigError, match="part="):
        evaluate_detector(det, data, part="train")
