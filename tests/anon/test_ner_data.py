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


def test_presidio_reader_gives_sentences_or_a_located_error(tmp_path: Path) -> None:
    import json

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from privasr.anon.ner_data import file_ner_data

    good = [{"full_text": "Call Mary at 555-0101.", "spans": [
        {"entity_type": "PERSON", "start_position": 5, "end_position": 9},
        {"entity_type": "PHONE_NUMBER", "start_position": 13, "end_position": 21}]}]
    junk = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                     st.text(max_size=5), st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3),
                                                                                           st.integers(), max_size=2))

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.sampled_from(["full_text", "spans", "entity_type", "start_position", "end_position", "cut"]), junk,
           st.integers(0, 200))
    def fuzz(key, value, cut):
        recs = json.loads(json.dumps(good))
        if key in ("full_text", "spans"):
            recs[0][key] = value
        elif key != "cut":
            recs[0]["spans"][0][key] = value
        text = json.dumps(recs)
        if key == "cut":
            text = text[:cut]
        f = tmp_path / "f.json"
        f.write_text(text)
        try:
            d = file_ner_data(f)
        except InputError as e:
            assert "f.json" in str(e)
            return
        for words, spans in d.parts["f.json"]["test"]:
            assert all(0 <= s.start < s.end <= len(words) for s in spans)

    fuzz()
