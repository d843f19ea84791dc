"""Tests of the frozen, validated corpus records."""

import dataclasses
import math

import pytest

from privasr.corpus.records import Client, Hypothesis, NBest, Population, Span, Transcript, thaw_json
from privasr.errors import InputError


def test_hypothesis_basic_and_frozen():
    h = Hypothesis.from_text("a b  c", scores={"am": -1.5, "lm": -2}, confidences=[0.5, 1, 0])
    assert h.words == ("a", "b", "c")
    assert h.scores["lm"] == -2.0 and isinstance(h.scores["lm"], float)
    assert h.confidences == (0.5, 1.0, 0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        h.words = ("x",)  # type: ignore[misc]
    with pytest.raises(TypeError):
        h.scores["am"] = 0.0  # type: ignore[index]


def test_inputs_are_not_aliased():
    scores = {"am": -1.0}
    meta = {"k": [1, 2]}
    h = Hypothesis(("a",), scores=scores, meta=meta)
    scores["am"] = 5.0
    meta["k"].append(3)
    assert h.scores["am"] == -1.0
    assert thaw_json(h.meta) == {"k": [1, 2]}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(words="a b"), "got a string"),
        (dict(words=("a", "")), "invalid token"),
        (dict(words=("a b",)), "invalid token"),
        (dict(words=("a",), confidences=(0.5, 0.5)), "2 confidences for 1 words"),
        (dict(words=("a",), confidences=(math.nan,)), "finite"),
        (dict(words=("a",), scores={"am": math.nan}), "finite"),
        (dict(words=("a",), scores={"am": "x"}), "a number"),
        (dict(words=("a",), scores={"am": True}), "a number"),
        (dict(words=("a",), times=((1.0, 0.5),)), "start <= end"),
        (dict(words=("a",), times=((1.0,),)), "not a pair"),
    ],
)
def test_hypothesis_validation(kwargs, match):
    with pytest.raises(InputError, match=match):
        Hypothesis(**kwargs)


def test_neg_inf_lm_score_allowed_pos_inf_not():
    assert Hypothesis(("a",), scores={"lm": -math.inf}).scores["lm"] == -math.inf
    with pytest.raises(InputError):
        Hypothesis(("a",), scores={"lm": math.inf})


def test_nbest_validation_and_helpers():
    nb = NBest("u", [Hypothesis(("a",)), Hypothesis(("b",))], client="c", order=3, ref=["a"])
    assert nb.best.words == ("a",) and nb.ref == ("a",) and len(nb) == 2
    assert NBest("e", ()).best.words == ()
    assert nb.with_hyps(nb.hyps[::-1]).best.words == ("b",)
    with pytest.raises(InputError, match="utterance id"):
        NBest("", ())
    with pytest.raises(InputError, match="Hypothesis records"):
        NBest("u", ("a b",))  # type: ignore[arg-type]
    with pytest.raises(InputError, match="order key"):
        NBest("u", (), order=math.inf)
    with pytest.raises(InputError, match="client"):
        NBest("u", (), client="  ")


def test_transcript_entities():
    t = Transcript("t", ("bob", "smith", "called"), entities=[Span(0, 2, "PER")])
    assert t.entities == (Span(0, 2, "PER"),)
    with pytest.raises(InputError, match="past the 3 words"):
        Transcript("t", ("a", "b", "c"), entities=[Span(2, 4, "PER")])
    with pytest.raises(InputError):
        Span(2, 2, "PER")
    with pytest.raises(InputError):
        Span(0, 1, "")


def test_population_grouping_and_order():
    us = [
        Transcript("u1", ("a",), client="m2", order=5),
        Transcript("u2", ("b",), client="m1", order="z"),
        Transcript("u3", ("c",), client="m2", order=1),
        Transcript("u4", ("d",), client="m1"),
        Transcript("u5", ("e",), client="m1", order=0),
    ]
    pop = Population.group(us)
    assert [c.id for c in pop] == ["m2", "m1"]
    assert [u.utt_id for u in pop["m2"]] == ["u3", "u1"]
    assert [u.utt_id for u in pop["m1"]] == ["u5", "u2", "u4"]
    assert pop.num_utterances == 5 and pop["m1"].num_words == 3
    with pytest.raises(KeyError):
        pop["nope"]


def test_population_missing_keys():
    us = [Transcript("u1", ("a",), speaker="s"), Transcript("u2", ("b",))]
    with pytest.raises(InputError, match="u2 has no speaker"):
        Population.group(us, "speaker")
    assert len(Population.group(us, "speaker", missing="drop")) == 1
    assert [c.id for c in Population.group(us, "speaker", missing="own")] == ["s", "u2"]
    with pytest.raises(InputError, match="duplicate client"):
        Population((Client("a", ()), Client("a", ())))


def test_client_words_prefers_reference():
    nb = NBest("u", (Hypothesis(("a", "b", "c")),), ref=("a",))
    assert Client("c", (nb,)).num_words == 1
    assert Client("c", (NBest("v", (Hypothesis(("a", "b")),)),)).num_words == 2


def test_huge_and_non_finite_values_are_input_errors():
    with pytest.raises(InputError, match="out of range"):
        Hypothesis(("a",), confidences=(10**400,))
    with pytest.raises(InputError, match="finite numbers only"):
        NBest("u", (), meta={"x": [1.0, math.inf]})


def test_records_cross_process_boundaries() -> None:
    """Records pickle (a worker pool returns them) and come back equal and still read-only."""
    import pickle

    h = Hypothesis(("a", "b"), scores={"am": -1.0}, meta={"x": {"y": [1, 2]}})
    nb = NBest("u", (h,), client="c", speaker="s", order=1, ref=("a",), meta={"k": 1})
    t = Transcript("u", ("a",), entities=(Span(0, 1, "PER"),), meta={"m": [1]})
    for rec in (h, nb, t):
        back = pickle.loads(pickle.dumps(rec))
        assert back == rec and type(back) is type(rec)
        with pytest.raises(TypeError):
            back.meta["new"] = 1  # type: ignore[index]
