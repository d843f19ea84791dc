"""``privasr rescore run``: config file, --set overrides, ad-hoc flags, one-line errors."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from privasr.cli import main
from privasr.corpus.formats.nbest_jsonl import read_nbest, write_nbest
from privasr.corpus.records import Hypothesis, NBest

GOOD = ("the", "cat", "sat", "on", "mat", "a", "dog", "ran")
BAD = ("tha", "cap", "set", "in", "map", "uh", "dig", "rang")


def _lists(seed: int, n: int, prefix: str) -> list[NBest]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ref = tuple(rng.choice(GOOD) for _ in range(rng.randint(3, 6)))
        hyps = {ref}
        while len(hyps) < 3:
            h = list(ref)
            j = rng.randrange(len(h))
            h[j] = BAD[GOOD.index(h[j])]
            hyps.add(tuple(h))
        scored = sorted(((-5.0 * len(h) - sum(w in BAD for w in h) + rng.gauss(0, 1.5), h) for h in hyps),
                        key=lambda x: -x[0])
        out.append(NBest(f"s{i % 3}_{prefix}{i}", tuple(
            Hypothesis(h, scores={"am": am, "lm": -3.0 * len(h) * math.log(10)}) for am, h in scored), ref=ref))
    return out


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    write_nbest(tmp_path / "dev.jsonl", _lists(1, 40, "d"))
    write_nbest(tmp_path / "test.jsonl", _lists(2, 50, "t"))
    words = [("<unk>", -3.0), ("<s>", -99.0), ("</s>", -0.5)] + [(w, -1.0) for w in GOOD] + [(w, -2.5) for w in BAD]
    arpa = "\n".join(["", "\\data\\", f"ngram 1={len(words)}", "", "\\1-grams:", *(f"{p}\t{w}" for w, p in words),
                      "", "\\end\\", ""])
    (tmp_path / "toy.arpa").write_text(arpa)
    cfg = (f"name: cli-test\ndata:\n  dev: {tmp_path / 'dev.jsonl'}\n  test: {tmp_path / 'test.jsonl'}\n"
           f"lms:\n  toy: {tmp_path / 'toy.arpa'}\nsearch:\n  ranges:\n    lm: [0, 2, 1]\n    toy: [0, 10, 1]\n"
           f"    word_penalty: [-2, 2, 1]\n")
    (tmp_path / "c.yaml").write_text(cfg)
    return {"dev": tmp_path / "dev.jsonl", "test": tmp_path / "test.jsonl", "arpa": tmp_path / "toy.arpa",
            "config": tmp_path / "c.yaml"}


def test_run_with_config_and_overrides(files, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["rescore", "run", "--config", str(files["config"]), "--set", "search.method=grid",
               "--set", "eval.bootstrap_resamples=200", "--out", str(out)])
    assert rc == 0
    assert "test WER" in capsys.readouterr().out
    res = json.loads((out / "results.json").read_text())
    assert res["config"]["search"]["method"] == "grid" and res["config"]["eval"]["bootstrap_resamples"] == 200
    m = res["metrics"]
    assert m["wer"] < m["wer_baseline"] and 0 <= m["mapsswe_p"] <= 1 and m["search_evaluations"] == 3 * 11 * 5
    assert (out / "report.md").is_file() and len(read_nbest(out / "test.rescored.jsonl.gz")) == 50


def test_ad_hoc_flags_build_the_same_config(files, tmp_path):
    out = tmp_path / "adhoc"
    rc = main(["rescore", "run", "--nbest", str(files["test"]), "--dev", str(files["dev"]),
               "--lm", f"toy={files['arpa']}", "--set", "search.ranges={lm: [0, 2, 1], toy: [0, 10, 1], "
               "word_penalty: [-2, 2, 1]}", "--out", str(out)])
    assert rc == 0
    ad = json.loads((out / "results.json").read_text())
    ref = tmp_path / "ref"
    assert main(["rescore", "run", "--config", str(files["config"]), "--out", str(ref)]) == 0
    cf = json.loads((ref / "results.json").read_text())
    assert ad["metrics"]["weights"] == cf["metrics"]["weights"] and ad["metrics"]["wer"] == cf["metrics"]["wer"]


def test_errors_are_one_line_with_status_2(files, tmp_path, capsys):
    assert main(["rescore", "run", "--config", str(files["config"]), "--set", "search.metod=grid",
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'search.metod'" in err and "Traceback" not in err
    assert main(["rescore", "run", "--out", str(tmp_path / "y")]) == 2
    assert "--config" in capsys.readouterr().err
    assert main(["rescore", "run", "--nbest", str(tmp_path / "none.jsonl"), "--lm", str(files["arpa"]),
                 "--method", "fixed", "--out", str(tmp_path / "z")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
