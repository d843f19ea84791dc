"""Name canaries planted in transcripts and counted after anonymisation."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faker")

from privasr.anon.canaries import plant_names, surviving  # noqa: E402
from privasr.anon.ner import detect_grouped, faker_names  # noqa: E402
from privasr.anon.ner_model import load_detector  # noqa: E402
from privasr.anon.transform import Anonymizer  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402

DOCS = [[("the", "quarterly", "numbers", "look", "fine"), ("we", "will", "ship", "in", "march")],
        [("please", "check", "the", "slides"), ("the", "budget", "is", "late", "again")],
        [("thanks", "everyone", "for", "joining")]]


def _anonymise(detector, docs):
    anon = Anonymizer("surrogate", seed=0)
    out = []
    for k, d in enumerate(docs):
        spans = detect_grouped(detector, d, [k] * len(d))
        out.append([anon.transform(s, sp, client=str(k)) for s, sp in zip(d, spans, strict=True)])
    return out


def test_canaries_are_planted_where_they_say_and_the_input_is_kept():
    before = [list(d) for d in DOCS]
    docs, canaries = plant_names(DOCS, 30, np.random.default_rng(1))
    assert [list(d) for d in DOCS] == before  # not modified
    assert sum(map(len, docs)) == sum(map(len, DOCS)) + 30 and len({c.name for c in canaries}) == 30
    listed = faker_names("all")
    for c in canaries:
        assert docs[c.doc][c.sentence][c.start:c.end] == c.name
        assert not set(c.name) & listed  # unlisted: no detector's gazetteer has them
    _, listed_canaries = plant_names(DOCS, 10, np.random.default_rng(1), source="listed")
    assert all(w in listed for c in listed_canaries for w in c.name)


def test_a_gazetteer_catches_listed_names_that_unlisted_ones_slip_past():
    det = load_detector("patterns")
    rates = {}
    for source in ("listed", "unlisted"):
        docs, canaries = plant_names(DOCS, 40, np.random.default_rng(2), source=source)
        rates[source] = surviving(canaries, docs, _anonymise(det, docs))
    assert surviving(canaries, docs, docs)["leak_rate_full"] == 1.0  # without anonymisation all leak
    assert rates["listed"]["leak_rate_any"] < rates["unlisted"]["leak_rate_any"]
    assert rates["unlisted"]["leaked_any"] > 0  # so the audit can fail: a patterns-only detector misses some


def test_bad_inputs():
    with pytest.raises(InputError, match="no documents"):
        plant_names([], 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="name source"):
        plant_names(DOCS, 1, np.random.default_rng(0), source="phonebook")
    docs, canaries = plant_names(DOCS, 2, np.random.default_rng(0))
    short = [[s[:1] for s in d] for d in docs]
    with pytest.raises(InputError, match="one per planted token"):
        surviving(canaries, docs, short)
