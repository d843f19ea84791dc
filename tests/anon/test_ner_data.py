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
