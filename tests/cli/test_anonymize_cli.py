"""``privasr anonymize``: formats in and out, gold and detected entities, inputs untouched, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.anon.transform import EntitySpan
from privasr.cli import main

CONLL = "-DOCSTART- O\n\nJohn I-PER\nSmith I-PER\nvisited O\nParis I-LOC\n.\tO\n\nJohn I-PER\nleft O\n"


def _conll(tmp_path: Path) -> Path:
    p = tmp_path / "in.conll"
    p.write_text(CONLL.replace("\t", " "))
    return p


def test_gold_entities_to_jsonl_and_conll(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _conll(tmp_path)
    before = src.read_bytes()
    assert main(["anonymize", str(src), str(tmp_path / "out.jsonl"), "--entities", "gold", "--seed", "5"]) == 0
    assert src.read_bytes() == before
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    words = [x["words"].split() for x in lines]
    assert all(w not in ("John", "Smith", "Paris") for ws in words for w in ws)
    assert words[0][0] == words[1][0] and words[0][0][0].isupper()  # consistent, case kept
    report = json.loads((tmp_path / "out.jsonl.results.json").read_text())
    assert report["seed"] == 5 and report["metrics"]["sets"]["in"]["mentions"] == {"PER": 2, "LOC": 1}
    assert "John" not in json.dumps(report)  # the summary holds counts only

    assert main(["anonymize", str(src), str(tmp_path / "tag.conll"), "--entities", "gold", "--mode", "tag",
                 "--to", "conll"]) == 0
    text = (tmp_path / "tag.conll").read_text()
    assert "<PER> B-PER" in text and "<LOC> B-LOC" in text and "Smith" not in text


def test_detected_entities_with_the_ner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Det:
        def detect(self, sentences):
            return [[EntitySpan(i, i + 1, "PER") for i, w in enumerate(s) if w == "John"] for s in sentences]

    import privasr.anon.ner_model as ner_model

    seen = []
    monkeypatch.setattr(ner_model, "load_detector", lambda spec: seen.append(spec) or Det())
    src = _conll(tmp_path)
    assert main(["anonymize", str(src), str(tmp_path / "o.jsonl"), "--ner", "patterns", "--mode", "redact"]) == 0
    assert seen == ["patterns"]
    lines = [json.loads(x)["words"] for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert lines == ["Smith visited Paris .", "left"]


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _conll(tmp_path)
    out = tmp_path / "o.jsonl"
    out.write_text("keep")
    assert main(["anonymize", str(src), str(out), "--entities", "gold"]) == 2
    assert "output exists" in capsys.readouterr().err and out.read_text() == "keep"
    assert main(["anonymize", str(src), str(src), "--entities", "gold", "--force"]) == 2
    assert "refusing to write over the input" in capsys.readouterr().err
    assert main(["anonymize", str(src), str(tmp_path / "x.jsonl"), "--mode", "shuffle"]) == 2
    assert "anonymisation mode" in capsys.readouterr().err
    bad = tmp_path / "bad.conll"
    bad.write_text("John X-PER\n")
    assert main(["anonymize", str(bad), str(tmp_path / "y.jsonl"), "--entities", "gold", "--from", "conll"]) == 2
    err = capsys.readouterr().err
    assert "bad.conll" in err and "IOB" in err


def test_default_detector_is_the_finetuned_one_and_stock_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import privasr.anon.ner_model as ner_model

    class Det:
        def detect(self, sentences):
            return [[] for _ in sentences]

    seen = []
    monkeypatch.setattr(ner_model, "load_detector", lambda spec: seen.append(spec) or Det())  # no training here
    src = _conll(tmp_path)
    assert main(["anonymize", str(src), str(tmp_path / "a.jsonl")]) == 0
    assert seen == ["finetuned"] and "warning" not in capsys.readouterr().err
    assert main(["anonymize", str(src), str(tmp_path / "b.jsonl"), "--detector", "stock"]) == 0
    err = capsys.readouterr().err
    assert seen[-1] == "stock" and err.startswith("warning: detector 'stock'") and "lower-case ASR" in err
    assert len(err.strip().splitlines()) == 1


def test_the_finetuned_model_lives_in_the_user_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import privasr.anon.ner_model as ner_model

    monkeypatch.setenv("PRIVASR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ner_model, "recipe_data", lambda d, root, seed: ("DATA", root))
    seen = {}

    def fake_cached(data, data_dir, cfg, root, seed, log):
        seen["root"], seen["data"] = root, data
        return root / "ner-x", {}, True

    monkeypatch.setattr(ner_model, "cached_model", fake_cached)
    assert ner_model.finetuned_model(tmp_path) == tmp_path / "cache" / "ner-x"
    assert seen["root"] == tmp_path / "cache"
    assert seen["data"] == ("DATA", tmp_path / "cache")  # the recipe's templates come from the same cache
