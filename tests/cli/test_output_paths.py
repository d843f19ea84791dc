"""Output-path problems are one ``error:`` line and exit status 2, before any work; nothing is created, and a run
that fails on its inputs leaves no empty output folder behind."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from privasr.cli import main
from privasr.corpus.formats.nbest_jsonl import write_nbest
from privasr.corpus.records import Hypothesis, NBest


def _nbest(n: int, prefix: str) -> list[NBest]:
    return [NBest(f"spk{i % 2}_{prefix}{i}", (Hypothesis(("a", "b"), scores={"am": -1.0, "lm": -2.0}),
                                             Hypothesis(("a", "c"), scores={"am": -1.5, "lm": -2.5})),
                  ref=("a", "b")) for i in range(n)]


@pytest.fixture()
def inputs(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "in"
    d.mkdir()
    write_nbest(d / "dev.jsonl", _nbest(4, "d"))
    write_nbest(d / "test.jsonl", _nbest(4, "t"))
    (d / "ref.txt").write_text("u1 a b\nu2 c d\n")
    (d / "hyp.txt").write_text("u1 a b\nu2 c e\n")
    (d / "text.txt").write_text("a b c\nb c d\na b d\n" * 5)
    (d / "bad.jsonl").write_text('{"utt_id": "x", "hyps": [{"words": "a", "scores": {"am": "nan?"}}]}\n')
    (d / "config.yaml").write_text("name: x\n")
    (d / "taken").write_text("the user's file\n")
    return {p.name: p for p in d.iterdir()}


def _commands(i: dict[str, Path], out: Path) -> dict[str, list[str]]:
    """Every command with an output path, its output at ``out`` (a folder for --out, a file otherwise)."""
    cfg = str(i["config.yaml"])
    return {
        "rescore run": ["rescore", "run", "--nbest", str(i["test.jsonl"]), "--dev", str(i["dev.jsonl"]),
                        "--out", str(out)],
        "score compare": ["score", "compare", str(i["ref.txt"]), str(i["hyp.txt"]), str(i["hyp.txt"]),
                          "--out", str(out)],
        "ftl compare": ["ftl", "compare", str(i["config.yaml"]), "--out", str(out)],
        "fmp run": ["fmp", "run", "--config", cfg, "--out", str(out)],
        "fedlm run": ["fedlm", "run", "--config", cfg, "--out", str(out)],
        "ftl run": ["ftl", "run", "--config", cfg, "--out", str(out)],
        "audit": ["audit", "--config", cfg, "--out", str(out)],
        "demo": ["demo", "--out", str(out)],
        "lm train-neural": ["lm", "train-neural", "--train", str(i["text.txt"]), "--valid", str(i["text.txt"]),
                            "--out", str(out)],
    }


def _file_commands(i: dict[str, Path], out: Path) -> dict[str, list[str]]:
    return {
        "score wer --json": ["score", "wer", str(i["ref.txt"]), str(i["hyp.txt"]), "--json", str(out)],
        "data convert": ["data", "convert", str(i["dev.jsonl"]), str(out)],
        "lm train-ngram --arpa": ["lm", "train-ngram", "--text", str(i["text.txt"]), "--arpa", str(out),
                                  "--discount-fallback"],
        "lm ppl --json": ["lm", "ppl", "--lm", str(i["text.txt"]), "--text", str(i["text.txt"]), "--json", str(out)],
        "data inspect --results": ["data", "inspect", str(i["dev.jsonl"]), "--results", str(out)],
        "privacy epsilon --results": ["privacy", "epsilon", "-z", "1.0", "-T", "3", "--results", str(out)],
    }


def _one_error_line(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


DIR_COMMANDS = list(_commands({k: Path(k) for k in ("test.jsonl", "dev.jsonl", "ref.txt", "hyp.txt", "config.yaml",
                                                    "text.txt")}, Path("o")))
FILE_COMMANDS = list(_file_commands({k: Path(k) for k in ("dev.jsonl", "ref.txt", "hyp.txt", "text.txt")}, Path("o")))


@pytest.mark.parametrize("name", DIR_COMMANDS)
def test_out_naming_an_existing_file(name, inputs, tmp_path, capsys):
    before = _snapshot(tmp_path)
    assert main(_commands(inputs, inputs["taken"])[name]) == 2
    _one_error_line(capsys, "taken", "existing file")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("name", DIR_COMMANDS + FILE_COMMANDS)
def test_out_under_a_regular_file(name, inputs, tmp_path, capsys):
    before = _snapshot(tmp_path)
    target = inputs["taken"] / "sub" / "out"
    cmd = {**_commands(inputs, target), **_file_commands(inputs, target)}[name]
    assert main(cmd) == 2
    _one_error_line(capsys, "taken", "is a file")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("name", [c for c in FILE_COMMANDS if c != "data convert"])  # convert writes into one
def test_file_output_naming_an_existing_folder(name, inputs, tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    before = _snapshot(tmp_path)
    assert main(_file_commands(inputs, tmp_path / "folder")[name]) == 2
    _one_error_line(capsys, "folder")
    assert _snapshot(tmp_path) == before


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write to read-only folders")
@pytest.mark.parametrize("name", ["rescore run", "score compare", "fmp run", "demo", "score wer --json",
                                  "data convert", "privacy epsilon --results"])
def test_out_under_a_read_only_folder(name, inputs, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = _snapshot(tmp_path)
        cmd = {**_commands(inputs, ro / "out"), **_file_commands(inputs, ro / "out")}[name]
        assert main(cmd) == 2
        _one_error_line(capsys, "not writable")
        assert _snapshot(tmp_path) == before
    finally:
        ro.chmod(stat.S_IRWXU)


def test_a_run_failing_on_its_inputs_leaves_no_folder(inputs, tmp_path, capsys):
    out = tmp_path / "runs" / "r1"
    assert main(["rescore", "run", "--nbest", str(inputs["bad.jsonl"]), "--dev", str(inputs["dev.jsonl"]),
                 "--out", str(out)]) == 2
    _one_error_line(capsys, "bad.jsonl")
    assert not (tmp_path / "runs").exists()


def test_fmp_run_failing_on_its_inputs_leaves_no_folder_but_keeps_the_users(inputs, tmp_path, capsys):
    arpa = tmp_path / "bg.arpa"
    assert main(["lm", "train-ngram", "--text", str(inputs["text.txt"]), "--arpa", str(arpa), "--order", "2",
                 "--discount-fallback"]) == 0
    cfg = tmp_path / "fmp.yaml"
    cfg.write_text(f"data: {{dev: {inputs['bad.jsonl']}, test: {inputs['test.jsonl']}}}\nnnlm: {arpa}\n")
    capsys.readouterr()
    assert main(["fmp", "run", "--config", str(cfg), "--out", str(tmp_path / "new" / "run")]) == 2
    _one_error_line(capsys, "bad.jsonl")
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "mine"
    (existing / "checkpoint").mkdir(parents=True)
    (existing / "checkpoint" / "round-1.json").write_text("{}")
    assert main(["fmp", "run", "--config", str(cfg), "--out", str(existing)]) == 2
    _one_error_line(capsys, "bad.jsonl")
    assert (existing / "checkpoint" / "round-1.json").read_text() == "{}"


def test_an_existing_output_folder_is_fine(inputs, tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    assert main(["score", "compare", str(inputs["ref.txt"]), str(inputs["hyp.txt"]), str(inputs["hyp.txt"]),
                 "--out", str(out), "--resamples", "10"]) == 0
    assert (out / "results.json").is_file()


@pytest.mark.parametrize("name", ["rescore run", "score compare", "demo", "score wer --json", "data convert"])
def test_an_unwritable_folder_as_the_os_reports_it(name, inputs, tmp_path, capsys, monkeypatch):
    """The same check where the test runs as root (who may write anywhere): the OS says the folder is not
    writable."""
    import privasr.outputs

    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(privasr.outputs.os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    before = _snapshot(tmp_path)
    cmd = {**_commands(inputs, ro / "out"), **_file_commands(inputs, ro / "out")}[name]
    assert main(cmd) == 2
    _one_error_line(capsys, "not writable", str(ro))
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------- results.json


@pytest.mark.parametrize(("cmd", "metric"), [
    (["lm", "train-ngram", "--text", "{text}", "--order", "2", "--arpa", "{tmp}/x.arpa", "--discount-fallback",
      "--json", "{out}"], "tokens"),
    (["data", "inspect", "{dev}", "--results", "{out}"], "utterances"),
    (["privacy", "epsilon", "-z", "1.1", "-T", "10", "--results", "{out}"], "epsilon"),
    (["score", "wer", "{ref}", "{hyp}", "--json", "{out}"], "wer"),
])
def test_numeric_commands_write_results_json(cmd, metric, inputs, tmp_path):
    import json

    out = tmp_path / "new" / "results.json"
    fill = {"{text}": str(inputs["text.txt"]), "{dev}": str(inputs["dev.jsonl"]), "{ref}": str(inputs["ref.txt"]),
            "{hyp}": str(inputs["hyp.txt"]), "{out}": str(out)}
    args = [fill.get(a, a.replace("{tmp}", str(tmp_path))) for a in cmd]
    assert main(args) == 0
    res = json.loads(out.read_text())
    assert {"config", "version", "data", "metrics"} <= set(res)
    assert res["config"]["command"] == " ".join(cmd[:2]) and res["metrics"][metric] is not None


def test_kneser_ney_error_names_the_commands_option(inputs, tmp_path, capsys):
    assert main(["lm", "train-ngram", "--text", str(inputs["ref.txt"]), "--arpa", str(tmp_path / "x.arpa")]) == 2
    _one_error_line(capsys, "--discount-fallback")
    assert not (tmp_path / "x.arpa").exists()
