"""The configured runner: config validation, end-to-end runs on a generated task, dev-only tuning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from privasr.config import apply_overrides, expand_vars, read_config
from privasr.corpus.formats.hyporadise import write_hyporadise
from privasr.corpus.formats.nbest_jsonl import read_nbest, write_nbest
from privasr.corpus.partition import split_by_key
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.experiments.rescore import load_config, run_rescore


def _cfg(files, **over):
    raw = {"data": {"dev": str(files["dev"]), "test": str(files["test"])}, "lms": {"toy": str(files["arpa"])},
           "search": {"ranges": {"lm": [0, 2, 1], "toy": [0, 10, 0.5], "word_penalty": [-3, 3, 1]}}}
    return apply_overrides(raw, over)


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"serach.method": "grid"}, "unknown config key 'serach'"),
        ({"search.metod": "grid"}, "unknown config key 'search.metod'"),
        ({"data.tset": "x"}, "unknown config key 'data.tset'"),
        ({"lms.toy": {"train": {"text": "ami-train", "oder": 3}}}, "unknown config key 'lms.toy.train.oder'"),
        ({"search.method": "annealing"}, "search.method"),
        ({"search.max_rounds": "5"}, "search.max_rounds"),
        ({"seed": 1.5}, "'seed'"),
        ({"combine.prior": "acoustic"}, "prior 'acoustic'"),
        ({"combine.first_pass_lm": "yes"}, "first_pass_lm"),
        ({"search.ranges.toy": [0, 1]}, r"\[min, max, step\]"),
        ({"search.ranges.toy": [1, 0, 0.1]}, "empty"),
        ({"search.ranges.other": [0, 1, 0.1]}, "unknown parameter"),
        ({"lms.rank": "x.arpa"}, "not allowed"),
        ({"lms.toy": {"arpa": "a", "train": {}}}, "exactly one"),
        ({"lms.toy": {"train": {"order": 3}}}, "'lms.toy.train.text' is missing"),
        ({"lms.toy": {"train": {"text": "ami-train", "order": 0}}}, "order"),
        ({"data.dev": None, "search.method": "coordinate"}, "data.dev"),
        ({"search.method": "fixed"}, "weights lack"),
        ({"eval.confidence": 1.5}, "confidence"),
        ({"output.nbest": "../x.jsonl"}, "output.nbest"),
        ({"data.format": "mp3"}, "data.format"),
        ({"combine.mode": "linear", "search.lambda_step": 0.3, "search.ranges": {}}, "does not divide"),
        ({"combine.mode": "linear"}, "unknown parameter"),
    ],
)
def test_config_errors_name_the_problem(toy_files, over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_cfg(toy_files, **over))


def test_missing_files_are_reported_before_any_work(toy_files, tmp_path):
    with pytest.raises(ConfigError, match="'data.test': no such file") as e:
        load_config(_cfg(toy_files, **{"data.test": str(tmp_path / "nope.jsonl")}))
    assert "nope.jsonl" in str(e.value)
    with pytest.raises(ConfigError, match="lms.toy"):
        load_config(_cfg(toy_files, **{"lms.toy": str(tmp_path / "none.arpa")}))
    with pytest.raises(ConfigError, match="lms.toy.train.text"):
        load_config(_cfg(toy_files, **{"lms.toy": {"train": {"text": str(tmp_path / "t.txt")}}}))


def test_privasr_data_is_expanded(monkeypatch, toy_files):
    monkeypatch.setenv("PRIVASR_DATA", str(toy_files["dev"].parent))
    cfg = load_config(_cfg(toy_files, **{"data.dev": "${PRIVASR_DATA}/dev.jsonl"}))
    assert cfg.data.dev == toy_files["dev"]
    assert expand_vars("${PRIVASR_DATA}/a") == f"{toy_files['dev'].parent}/a"
    with pytest.raises(ConfigError, match="HOME"):
        expand_vars("${HOME}/a")


def test_read_config_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("data: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_config(p)
    p.write_text("- a\n")
    with pytest.raises(ConfigError, match="a mapping"):
        read_config(p)
    with pytest.raises(ConfigError, match="no such config"):
        read_config(tmp_path / "none.yaml")


def test_default_ranges_follow_the_prior(toy_files):
    cfg = load_config(apply_overrides(_cfg(toy_files), {"search.ranges": {}, "combine.prior": "rank"}))
    grids = cfg.space().grids
    assert grids["toy"][1] == pytest.approx(0.05) and grids["word_penalty"][0] == -5.0
    cfg = load_config(apply_overrides(_cfg(toy_files), {"search.ranges": {}}))
    assert cfg.space().grids["toy"][-1] == 30.0


# ------------------------------------------------------------------------------------------ runs


def test_end_to_end_run_writes_results_report_and_nbest(toy_files, tmp_path):
    out = tmp_path / "out"
    m = run_rescore(load_config(_cfg(toy_files)), out)
    res = json.loads((out / "results.json").read_text())
    for k in ("wer", "wer_baseline", "wer_rel_change", "mapsswe_p", "weights", "dev_wer", "dev_wer_baseline",
              "wer_oracle", "bootstrap_ci_low", "bootstrap_ci_high"):
        assert k in res["metrics"], k
    assert res["metrics"]["wer"] < res["metrics"]["wer_baseline"]
    assert res["metrics"]["wer_rel_change"] == pytest.approx((m["wer"] - m["wer_baseline"]) / m["wer_baseline"])
    assert res["metrics"]["mapsswe_p"] < 0.05
    assert res["metrics"]["bootstrap_ci_high"] < 0
    assert set(res["data"]) == {"dev", "test", "lm:toy"} and "sha256" in res["data"]["test"]
    assert res["config"]["lms"]["toy"]["arpa"] == str(toy_files["arpa"])
    assert (out / "report.md").read_text().startswith("# N-best rescoring")
    rescored = read_nbest(out / "test.rescored.jsonl.gz")
    test = read_nbest(toy_files["test"])
    assert [r.utt_id for r in rescored] == [r.utt_id for r in test]
    assert all(sorted(h.words for h in a) == sorted(h.words for h in b) for a, b in zip(rescored, test, strict=True))
    assert all("rescore" in h.scores and "lm:toy" in h.scores for r in rescored for h in r)


def test_test_data_never_influences_the_weights(toy_files, tmp_path, task):
    """Tuning is on dev only: a different test set (other lists, no references) gives the same weights."""
    other = tmp_path / "other_test.jsonl"
    write_nbest(other, task(99, 30, prefix="x", refs=False))
    m1 = run_rescore(load_config(_cfg(toy_files)), tmp_path / "a")
    m2 = run_rescore(load_config(_cfg(toy_files, **{"data.test": str(other)})), tmp_path / "b")
    assert m1["weights"] == m2["weights"] and m1["dev_wer"] == m2["dev_wer"]
    assert m2["wer"] is None and m2["mapsswe_p"] is None  # no references: no WER, lists still written
    assert len(read_nbest(tmp_path / "b" / "test.rescored.jsonl.gz")) == 30


def test_grid_search_and_linear_mode_run(toy_files, tmp_path):
    m = run_rescore(load_config(_cfg(toy_files, **{"search.method": "grid"})), tmp_path / "g")
    assert m["search_evaluations"] == 3 * 21 * 7
    lin = _cfg(toy_files, **{"combine.mode": "linear", "search.lambda_step": 0.25})
    lin["search"]["ranges"] = {"lm_scale": [0, 10, 1], "word_penalty": [-2, 2, 1]}
    m = run_rescore(load_config(lin), tmp_path / "l")
    assert set(m["weights"]) == {"lm_scale", "lambda", "word_penalty"} and m["wer"] <= m["wer_baseline"]


def test_fixed_weights_need_no_dev_set(toy_files, tmp_path):
    raw = _cfg(toy_files, **{"search.method": "fixed",
                             "search.weights": {"lm": 0.0, "toy": 5.0, "word_penalty": 0.0}})
    del raw["data"]["dev"]
    m = run_rescore(load_config(raw), tmp_path / "f")
    assert m["weights"] == {"lm": 0.0, "toy": 5.0, "word_penalty": 0.0} and "dev_wer" not in m


def test_rank_only_lists_split_by_speaker(tmp_path, task, toy_files):
    """HyPoradise-style lists without scores: rank prior, dev/test split by speaker, new LM only."""
    recs = task(11, 120, scores=False, speakers=6)
    recs = [NBest(f"{10 + i % 6}-100-{i:04d}", r.hyps, ref=r.ref) for i, r in enumerate(recs)]
    write_hyporadise(tmp_path / "ls.json", recs, ids=tmp_path / "ls.ids.txt")
    raw = {"data": {"nbest": str(tmp_path / "ls.json"), "split": {"key": "speaker", "dev": "even"}},
           "lms": {"toy": str(toy_files["arpa"])}, "combine": {"prior": "rank", "first_pass_lm": False}}
    out = tmp_path / "o"
    m = run_rescore(load_config(raw), out)
    res = json.loads((out / "results.json").read_text())
    assert res["split"]["dev_keys"] == ["10", "12", "14"] and res["split"]["test_keys"] == ["11", "13", "15"]
    assert m["dev_utterances"] == 60 and m["test_utterances"] == 60
    assert set(m["weights"]) == {"toy", "word_penalty"} and m["wer"] < m["wer_baseline"]
    with pytest.raises(InputError, match="without a 'am' score"):
        run_rescore(load_config(apply_overrides(raw, {"combine.prior": "am"})), tmp_path / "p")


def test_split_by_key_is_documented_and_fixed():
    recs = [NBest(f"u{i}", (), speaker=s) for i, s in enumerate(["3", "1", "2", "1", "10"])]
    d, t, dk, tk = split_by_key(recs, dev="odd")
    assert dk == ["2", "10"] and tk == ["1", "3"] and [r.utt_id for r in d] == ["u2", "u4"]
    with pytest.raises(InputError, match="no speaker"):
        split_by_key([NBest("u", ())])


def test_missing_first_pass_scores_are_reported_before_lm_work(tmp_path, task, toy_files):
    write_nbest(tmp_path / "rank.jsonl", task(12, 10, scores=False))
    raw = _cfg(toy_files, **{"data.test": str(tmp_path / "rank.jsonl")})
    raw["lms"] = {"toy": {"train": {"text": str(Path(toy_files["arpa"]))}}}  # would fail if it were trained
    with pytest.raises(InputError, match="without a 'am' score"):
        run_rescore(load_config(raw), tmp_path / "o")


def test_the_full_system_is_never_worse_on_dev_than_its_baseline(toy_files, tmp_path):
    # no coarse grid: the descent starts at weights 0 and at the tuned baseline (other LMs at 0)
    raw = _cfg(toy_files, **{"lms.toy2": str(toy_files["arpa"]), "search.ranges.toy2": [0, 10, 0.5],
                             "search.coarse_points": 0, "eval.baseline_lms": ["toy"],
                             "eval.bootstrap_resamples": 50, "output.nbest": None})
    m = run_rescore(load_config(raw), tmp_path / "out")
    assert m["dev_wer"] <= m["dev_wer_baseline"] < m["dev_wer_first_pass"]


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "configs").glob("rescore-*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_rescore_configs_validate(path):
    cfg = load_config(read_config(path), check_files=False)
    assert cfg.lms and cfg.search.method in ("coordinate", "grid", "fixed")
