"""NER data preparation on tiny fabricated files: punctuation tokens, sentence cuts and label mapping, splits
without overlap, located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from privasr.anon.ner_data import earnings21_docs, load_ner_data, split_ids, wikigold_docs
from privasr.anon.transform import EntitySpan
from privasr.errors import ConfigError, InputError

from ._ner_data import fabricate_ner_data


def test_data_preparation_and_splits(tmp_path: Path) -> None:
    root = fabricate_ner_data(tmp_path)
    calls = earnings21_docs(root / "earnings21" / "references_nlp_wertags.tar.xz")
    first = calls["0"]
    # punctuation restored as tokens, sentence cut after ".", DATE is not an entity, GPE -> LOC
    assert first[0] == (("Thanks", "Bob", "Kane", "."), [EntitySpan(1, 3, "PER")])
    assert first[1] == (("Revenue", "rose", "in", "Texas", ",", "next", "year", "."), [EntitySpan(3, 4, "LOC")])
    assert len(wikigold_docs(root / "ner-wikigold" / "wikigold.conll.txt")) == 12
    data = load_ner_data(root, seed=1)
    for name, ids in data.ids.items():
        assert not set(ids["test"]) & set(ids["train"]) and not set(ids["dev"]) & set(ids["train"]), name
        assert not set(ids["test"]) & set(ids["dev"])
    assert len(data.ids["earnings21"]["test"]) == 10 and len(data.ids["earnings21"]["dev"]) == 4
    assert load_ner_data(root, seed=1).ids == data.ids and load_ner_data(root, seed=2).ids != data.ids
    with pytest.raises(ConfigError):
        split_ids(["a", "b"], 0, n_test=1, n_dev=1)
    with pytest.raises(ConfigError, match="not found"):
        load_ner_data(tmp_path / "nowhere")


def test_bad_conll_gives_a_located_error(tmp_path: Path) -> None:
    p = tmp_path / "w.conll"
    p.write_text("a O\nb Q-PER\n")
    with pytest.raises(InputError, match="w.conll:2"):
        wikigold_docs(p)


def test_any_annotated_file_is_one_held_out_part(tmp_path: Path) -> None:
    from privasr.anon.ner_data import file_ner_data

    conll = tmp_path / "held.conll"
    conll.write_text("-DOCSTART- O\n\nJohn B-PERSON\nSmith I-PERSON\nvisited O\nParis B-GPE\n\nit O\ncost O\n"
                     "5 B-CARDINAL\n\n-DOCSTART- O\n\nMary B-PER\nworks O\n")
    d = file_ner_data(conll)
    (name,) = d.parts
    assert name == "held.conll" and set(d.parts[name]) == {"test"}
    docs = d.parts[name]["test"]
    assert [[(s.label, " ".join(w[s.start:s.end])) for s in spans] for w, spans in docs] == [
        [("PER", "John Smith"), ("LOC", "Paris")], [], [("PER", "Mary")]]  # OntoNotes mapped, numbers dropped
    assert d.clients[name]["test"] == ["doc0000", "doc0000", "doc0001"]


def test_presidio_synthetic_records_are_tokenised_with_their_spans(tmp_path: Path) -> None:
    import json

    from privasr.anon.ner_data import file_ner_data

    f = tmp_path / "synth.json"
    text = "Call Mary-Jane O'Neil at 555-0101, she lives in Oslo."
    f.write_text(json.dumps([{"full_text": text, "spans": [
        {"entity_type": "PERSON", "entity_value": "Mary-Jane O'Neil", "start_position": 5, "end_position": 21},
        {"entity_type": "PHONE_NUMBER", "entity_value": "555-0101", "start_position": 25, "end_position": 33},
        {"entity_type": "LOCATION", "entity_value": "Oslo", "start_position": 48, "end_position": 52}]}]))
    (words, spans), = file_ner_data(f).parts["synth.json"]["test"]
    assert words == ("Call", "Mary-Jane", "O'Neil", "at", "555-0101", ",", "she", "lives", "in", "Oslo", ".")
    assert [(s.label, " ".join(words[s.start:s.end])) for s in spans] == [
        ("PER", "Mary-Jane O'Neil"), ("MISC", "555-0101"), ("LOC", "Oslo")]


@pytest.mark.parametrize(("content", "match"), [
    ('[{"full_text": "a", "spans": [{"start_position": 0}]}]', "record 0 has a span without"),
    ('[{"full_text": "a", "spans": "none"}]', "record 0 has no 'full_text' string and 'spans' list"),
])
def test_bad_presidio_records_are_named(tmp_path: Path, content: str, match: str) -> None:
    from privasr.anon.ner_data import file_ner_data

    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(InputError, match=match):
        file_ner_data(f)


def test_a_file_without_known_entity_labels_is_refused(tmp_path: Path) -> None:
    from privasr.anon.ner_data import file_ner_data

    f = tmp_path / "x.conll"
    f.write_text("a O\nb B-CARDINAL\n")
    with pytest.raises(InputError, match=r"no entity with a known label \(labels found: \['CARDINAL'\]\)"):
        file_ner_data(f)
