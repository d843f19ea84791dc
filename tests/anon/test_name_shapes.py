"""Names of every shape and casing are rewritten whole, and the words around them are not.

The fast tests drive the detector's rules with a stand-in model that behaves as the fine-tuned one did on the
reported cases (case-sensitive, a first name only, a name read as a place or a firm); the slow test runs the
fine-tuned model itself on planted names of every shape (the acceptance figure: at most 2% survive per shape).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("faker")

from privasr.anon.name_shapes import CASINGS, SHAPES, plant, survival  # noqa: E402
from privasr.anon.ner import CombinedDetector, PatternDetector, Truecaser  # noqa: E402
from privasr.anon.transform import Anonymizer, EntitySpan  # noqa: E402

COMMON = {"the", "report", "was", "signed", "by", "i", "spoke", "to", "yesterday", "joined", "call", "chaired",
          "meeting", "ms", "mister", "thanks", "that", "helpful"}


class StandIn:
    """Finds the first names it knows, in lower case only (as a model trained on ASR-style text), and labels
    the spans it is told to."""

    def __init__(self, per=(), fixed=None):
        self.per, self.fixed = set(per), dict(fixed or {})

    def detect(self, sentences):
        out = []
        for ws in sentences:
            key = " ".join(ws)
            if key in self.fixed:
                out.append(list(self.fixed[key]))
                continue
            out.append([EntitySpan(i, i + 1, "PER") for i, w in enumerate(ws) if w in self.per])
        return out


def rewrite(det, text: str) -> str:
    ws = text.split()
    return " ".join(Anonymizer(mode="tag").transform(ws, det.detect([ws])[0]))


def combined(model, names=()):
    return CombinedDetector(model, PatternDetector(names=set(names), common=COMMON), refine=True,
                            truecaser=Truecaser.fit([]))


def test_a_name_in_all_capitals_is_rewritten_whole() -> None:
    det = combined(StandIn(per={"wendela"}))
    assert rewrite(det, "THE REPORT WAS SIGNED BY WENDELA ORSATTI") == "THE REPORT WAS SIGNED BY <PER>"
    assert rewrite(det, "the report was signed by wendela orsatti") == "the report was signed by <PER>"
    assert rewrite(det, "wendela orsatti") == "<PER>"


def test_apostrophe_and_hyphenated_surnames_after_a_title_are_rewritten_whole() -> None:
    det = combined(StandIn())
    assert rewrite(det, "i spoke to mister o'halloran yesterday") == "i spoke to mister <PER> yesterday"
    # the model read "ms adaeze okonkwo-bright" as a firm: the name after the title is found, the verb is kept
    det = combined(StandIn(fixed={"ms adaeze okonkwo-bright joined the call": [EntitySpan(0, 3, "ORG")]}))
    assert rewrite(det, "ms adaeze okonkwo-bright joined the call") == "ms <PER> joined the call"


def test_the_verb_after_a_name_is_not_part_of_it() -> None:
    det = combined(StandIn(per={"tomas"}))
    assert rewrite(det, "tomas varnholt chaired the meeting") == "<PER> chaired the meeting"
    # the model itself ran the name on into the verb: the verb is given back, a gazetteer surname is not
    det = combined(StandIn(fixed={"tomas varnholt chaired": [EntitySpan(0, 3, "PER")],
                                  "tomas manning": [EntitySpan(0, 2, "PER")]}), names={"manning"})
    assert rewrite(det, "tomas varnholt chaired") == "<PER> chaired"
    assert rewrite(det, "tomas manning") == "<PER>"
    det = combined(StandIn(fixed={"joined": [EntitySpan(0, 1, "PER")]}))
    assert rewrite(det, "joined") == "<PER>"  # a one-word span is left as the model found it


def test_a_place_label_on_a_first_name_gives_way_to_the_person() -> None:
    # plain run: PER; truecased run: LOC, on the same word -> PER wins, and the surname joins it
    class Split(StandIn):
        def detect(self, sentences):
            return [[EntitySpan(0, 1, "LOC" if ws[0][:1].isupper() else "PER")] for ws in sentences]

    det = CombinedDetector(Split(), PatternDetector(names=set(), common=COMMON), refine=True,
                           truecaser=Truecaser.fit([["Wendela", "walked"]]))
    assert rewrite(det, "wendela orsatti") == "<PER>"


def test_particles_initials_and_gazetteer_edges_join_the_name() -> None:
    det = combined(StandIn(per={"kylie", "blewanus"}), names={"kylie"})
    assert rewrite(det, "thanks kylie de la herranz that was helpful") == "thanks <PER> that was helpful"
    assert rewrite(det, "i spoke to r f blewanus yesterday") == "i spoke to <PER> yesterday"


def test_planted_names_cover_every_shape_and_casing() -> None:
    plants = plant(n=3, seed=1)
    assert {p.shape for p in plants} == set(SHAPES) and {p.casing for p in plants} == set(CASINGS)
    for p in plants:
        name = p.name
        assert name and p.words[p.start:p.end] == name
        if p.shape == "apostrophe":
            assert "'" in name[-1]
        if p.shape in ("hyphenated", "hyphenated_first"):
            assert any("-" in w for w in name)
        if p.shape.startswith("title"):
            assert p.title == 1
        if p.shape == "initials":
            assert all(len(w) == 1 for w in name[:-1])
        if p.casing == "upper":
            assert all(not c.islower() for w in p.words for c in w)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_survival_counts_what_a_detector_leaves(seed) -> None:
    plants = plant(n=2, seed=seed)

    class Oracle:  # the name (and its title) exactly
        def detect(self, sentences):
            return [[EntitySpan(p.start - p.title, p.end, "PER")] for p in plants]

    class Nothing:
        def detect(self, sentences):
            return [[] for _ in sentences]

    perfect = survival(Oracle(), plants, seed=seed)
    assert perfect["survival"] == 0.0 and perfect["collateral"] == 0.0
    assert set(perfect["by_shape"]) == set(SHAPES)
    none = survival(Nothing(), plants)
    assert none["survival"] == 1.0 and all(v["survival"] == 1.0 for v in none["by_shape"].values())


@pytest.mark.slow
def test_the_finetuned_detector_keeps_survival_under_two_percent_per_shape() -> None:
    pytest.importorskip("spacy")
    from privasr.anon.ner_model import load_detector
    from privasr.paths import data_dir

    if data_dir() is None:
        pytest.skip("the fine-tuned NER trains on ../shared/data")
    det = load_detector("finetuned")
    for text, want in [("THE REPORT WAS SIGNED BY WENDELA ORSATTI", "THE REPORT WAS SIGNED BY <PER>"),
                       ("wendela orsatti", "<PER>"),
                       ("i spoke to mister o'halloran yesterday", "i spoke to mister <PER> yesterday"),
                       ("ms adaeze okonkwo-bright joined the call", "ms <PER> joined the call"),
                       ("tomas varnholt chaired", "<PER> chaired")]:
        assert rewrite(det, text) == want
    r = survival(det, plant(n=100, seed=0))
    assert all(v["survival"] <= 0.02 for v in r["by_shape"].values()), r["by_shape"]
    assert r["collateral"] <= 0.01
