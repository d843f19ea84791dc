"""Template sentences as NER training text: reading, filling, labelling, whole-template splits, the hash-checked
wheel, and presidio records of seen templates left out of held-out evaluation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.anon.ner_templates import (
    PLACEHOLDER_LABEL,
    fill_templates,
    presidio_templates,
    read_templates,
    template_key,
)
from privasr.errors import ConfigError, InputError

from ._ner_data import fabricate_ner_data

TEMPLATES = ["My name is {{person}} and I live in {{city}}.",
             "Please call {{first_name}} at {{phone_number}}",
             "How do I open my statement?",
             "<name_female> works for {{organization}}\\nin {{country}}",
             "Send it to {{ADDRESS}} by {{date_time}}"]


def _folder(tmp_path: Path, lines: list[str] = TEMPLATES) -> Path:
    f = tmp_path / "tpl"
    f.mkdir()
    (f / "templates.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (f / "nationalities.csv").write_text("country,nationality,man,woman,plural\nfrance,french,french,french,"
                                         "french people\n", encoding="utf-8")
    return f


def test_templates_are_read_with_presidio_slot_forms(tmp_path: Path) -> None:
    t = read_templates(_folder(tmp_path) / "templates.txt")
    assert t[3] == "{{name_female}} works for {{organization}}\nin {{country}}"  # <x> and \n as presidio writes them
    assert t[4] == "Send it to {{address}} by {{date_time}}"  # slot names are case-blind


@pytest.mark.parametrize(("lines", "match"), [
    (["fine {{person}}", "bad {{favourite_colour}}"], r"tpl/templates.txt:2: unknown placeholder \{\{favourite"),
    (["no slots here", "nor here"], "no template with a"),
])
def test_bad_template_files_are_named(tmp_path: Path, lines: list[str], match: str) -> None:
    with pytest.raises(InputError, match=match):
        read_templates(_folder(tmp_path, lines) / "templates.txt")


def test_filled_templates_label_their_slots_whole_and_repeat_with_the_seed(tmp_path: Path) -> None:
    t = read_templates(_folder(tmp_path) / "templates.txt")
    out = fill_templates(t, range(len(t)), 6, seed=3)
    assert out == fill_templates(t, range(len(t)), 6, seed=3) != fill_templates(t, range(len(t)), 6, seed=4)
    assert sorted(out) == ["t0", "t1", "t2", "t3", "t4"] and all(len(v) == 6 for v in out.values())
    for words, spans in out["t0"]:
        (per, loc) = spans
        assert (per.label, loc.label) == ("PER", "LOC")
        assert words[:3] == ("My", "name", "is") and words[per.end:per.end + 4] == ("and", "I", "live", "in")
        assert words[loc.end:] == (".",)  # the value is the span, the template's words around it are not
    for _, spans in out["t1"]:
        assert [s.label for s in spans] == ["PER"]  # the phone number is filled, not an NER entity
    assert all(spans == [] for _, spans in out["t2"])
    for words, spans in out["t4"]:  # an address: its street and town are places, its numbers are not
        assert [s.label for s in spans] == ["LOC", "LOC"]
        assert not any(c.isdigit() for s in spans for c in " ".join(words[s.start:s.end]))
    titles = {"mr", "mrs", "ms", "miss", "dr", "md", "phd", "dds", "dvm", "jr", "sr", "ii", "iii", "iv", "v"}
    for words, spans in (d for k in ("t0", "t3") for d in out[k]):
        per = spans[0]
        assert words[per.start].lower().rstrip(".") not in titles and words[per.end - 1].lower() not in titles
    for words, spans in out["t3"]:
        assert [s.label for s in spans] == ["PER", "ORG", "LOC"] and "," in words  # the line break is a comma
        assert words[spans[1].end:spans[2].start] == (",", "in")


def test_every_placeholder_fills() -> None:
    slots = sorted(PLACEHOLDER_LABEL)
    t = [" and ".join("{{" + s + "}}" for s in slots)]
    for words, spans in fill_templates(t, [0], 3, seed=0)["t0"]:
        assert len(words) > len(slots) and spans


def test_fill_count_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="per_template=0"):
        fill_templates(["{{person}}"], [0], 0, seed=0)


def test_templates_join_the_recipe_as_a_synthetic_set_split_whole(tmp_path: Path) -> None:
    from privasr.anon.ner import PatternDetector
    from privasr.anon.ner_data import TEMPLATES_SET, load_ner_data, seen_templates
    from privasr.anon.ner_metrics import evaluate_detector

    root = fabricate_ner_data(tmp_path / "data")
    lines = [f"Hello {{{{person}}}}, welcome to {{{{city}}}} number {k}" for k in range(20)]
    folder = _folder(tmp_path, lines)
    data = load_ner_data(root, seed=1, templates=folder)
    assert data.synthetic == {TEMPLATES_SET} and data.files[TEMPLATES_SET] == folder / "templates.txt"
    ids = data.ids[TEMPLATES_SET]
    assert [len(ids[p]) for p in ("train", "dev", "test")] == [10, 2, 8]
    assert not set(ids["test"]) & (set(ids["train"]) | set(ids["dev"]))
    assert len(data.parts[TEMPLATES_SET]["train"]) == 10 * 8 and set(data.clients[TEMPLATES_SET]["test"]) == set(
        ids["test"])
    seen, texts = seen_templates(folder, seed=1)
    assert seen == {int(k[1:]) for k in ids["train"] + ids["dev"]} and texts == lines
    res = evaluate_detector(PatternDetector(), data, part="test")
    gold = sum(len(data.parts[n]["test"]) for n in data.parts if n != TEMPLATES_SET)
    assert res["asr"]["all"]["sentences"] == gold  # the synthetic set is scored apart, never pooled
    assert res["asr"][TEMPLATES_SET]["sentences"] == len(data.parts[TEMPLATES_SET]["test"])
    assert load_ner_data(root, seed=1).synthetic == frozenset()


def test_presidio_records_of_seen_templates_are_left_out(tmp_path: Path) -> None:
    from privasr.anon.ner_data import file_ner_data

    lines = ["Hi {{person}}", "Bye {{person}}", "Meet {{first_name}} in {{city}}"]
    recs = [{"full_text": f"Hi Ann{k}", "masked": "Hi {{PERSON}}", "template_id": 0,
             "spans": [{"entity_type": "PERSON", "start_position": 3, "end_position": 7}]} for k in range(3)]
    recs.append({"full_text": "Meet Bo in Oslo", "masked": "Meet {{PERSON}} in {{GPE}}", "template_id": 2,
                 "spans": [{"entity_type": "PERSON", "start_position": 5, "end_position": 7}]})
    f = tmp_path / "synth.json"
    f.write_text(json.dumps(recs))
    d = file_ner_data(f, seen_templates=({0, 1}, lines))
    assert [w for w, _ in d.parts["synth.json"]["test"]] == [("Meet", "Bo", "in", "Oslo")]
    assert d.left_out.startswith("3 of 4 records left out")
    # ids that do not match the templates' text are not trusted: nothing is left out, and the note says so
    d2 = file_ner_data(f, seen_templates=({0, 1}, ["Other {{person}}", "x {{person}}", "y {{person}}"]))
    assert len(d2.parts["synth.json"]["test"]) == 4 and d2.left_out.startswith("not known to be held out")
    assert file_ner_data(f).left_out == ""


def test_template_keys_compare_templates_with_masked_records() -> None:
    assert template_key("Meet {{first_name}} in <city>") == template_key("meet {{PERSON}}  in {{GPE}}")
    assert template_key("Meet {{x}}") != template_key("Greet {{x}}")


def test_the_wheel_is_hash_checked_and_the_cache_is_reused(tmp_path: Path) -> None:
    bad = tmp_path / "presidio_evaluator-0.3.2-py3-none-any.whl"
    bad.write_bytes(b"PK not a wheel")
    with pytest.raises(InputError, match="SHA-256 .* is not that of presidio_evaluator-0.3.2"):
        presidio_templates(tmp_path / "cache", bad)
    with pytest.raises(InputError, match="no such file"):
        presidio_templates(tmp_path / "cache", tmp_path / "absent.whl")
    with pytest.raises(ConfigError, match="not in the cache.*fetch-templates"):
        presidio_templates(tmp_path / "cache", download=False)
    cached = tmp_path / "cache" / "presidio-evaluator-0.3.2"
    cached.mkdir(parents=True)
    for name in ("templates.txt", "nationalities.csv"):
        (cached / name).write_text("x\n")
    assert presidio_templates(tmp_path / "cache", download=False) == cached


def test_the_cached_presidio_templates_read_whole() -> None:
    """presidio-evaluator's own file, where this machine has fetched it (skipped otherwise: tests never go to PyPI)."""
    folder = Path.home() / ".cache" / "privasr" / "presidio-evaluator-0.3.2"
    if not (folder / "templates.txt").is_file():
        pytest.skip("presidio-evaluator's templates are not cached here (`privasr anon fetch-templates`)")
    t = read_templates(folder / "templates.txt")
    assert len(t) == 210 and (folder / "LICENSE").is_file()
    filled = fill_templates(t, range(len(t)), 1, seed=0)
    assert sum(bool(spans) for v in filled.values() for _, spans in v) >= 140  # 148 of 210 have an NER entity
