"""Tests of ``privasr decode``: output files, metrics and one-line errors with exit code 2."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pocketsphinx")
pytest.importorskip("soundfile")

from privasr.cli import main  # noqa: E402


def test_decode_cli_fsdd_digits(tmp_path, capsys, fsdd_recordings):
    from privasr.asr.decode import digits_lm
    from privasr.corpus.formats.nbest_jsonl import read_nbest

    files = sorted(fsdd_recordings.glob("*_0.wav"))[:6]
    arpa, dic = digits_lm(tmp_path / "lm")
    out = tmp_path / "out" / "nb.jsonl"
    rc = main(["decode", *map(str, files), "--fsdd", "--lm", str(arpa), "--dict", str(dic), "--nbest", "3",
               "--out", str(out)])
    assert rc == 0
    line = capsys.readouterr().out.strip()
    assert "6 utterances" in line and "WER" in line and "RTF" in line
    nbs = read_nbest(out)
    assert [nb.utt_id for nb in nbs] == [f.stem for f in files]
    assert all(1 <= len(nb) <= 3 and nb.ref for nb in nbs)
    res = json.loads((out.parent / "nb.jsonl.results.json").read_text())
    m = res["metrics"]
    assert m["utterances"] == 6 and 0 <= m["oracle_wer"] <= m["wer"] and m["rtf"] > 0
    assert res["seed"] is None and res["config"]["nbest"] == 3 and "version" in res


def test_decode_cli_folder_limit_and_ref(tmp_path, capsys, fsdd_recordings):
    ref = tmp_path / "text"
    names = sorted(p.stem for p in fsdd_recordings.glob("*.wav"))
    ref.write_text("".join(f"{n} {['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine'][int(n[0])]}\n"
                           for n in names))
    out = tmp_path / "nb.jsonl"
    rc = main(["decode", str(fsdd_recordings), "--limit", "2", "--ref", str(ref), "--nbest", "2", "--out", str(out)])
    assert rc == 0
    assert len(out.read_text().splitlines()) == 2
    assert "2 utterances" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["missing", "not_wav", "empty", "lm", "empty_dir", "ref_missing"])
def test_decode_cli_errors(tmp_path, capsys, case):
    import wave

    wav = tmp_path / "ok.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 1600)
    out = ["--out", str(tmp_path / "o.jsonl")]
    if case == "missing":
        args, needle = [str(tmp_path / "nope.wav")], "nope.wav: no such file"
    elif case == "not_wav":
        (tmp_path / "x.wav").write_text("hello")
        args, needle = [str(tmp_path / "x.wav")], "x.wav: cannot read audio"
    elif case == "empty":
        with wave.open(str(tmp_path / "e.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
        args, needle = [str(tmp_path / "e.wav")], "e.wav: empty audio (no samples)"
    elif case == "lm":
        args, needle = [str(wav), "--lm", str(tmp_path / "no.arpa")], "no.arpa: no such LM"
    elif case == "empty_dir":
        (tmp_path / "d").mkdir()
        args, needle = [str(tmp_path / "d")], "no .wav files"
    else:
        (tmp_path / "text").write_text("other hello\n")
        args, needle = [str(wav), "--ref", str(tmp_path / "text")], "no reference"
    rc = main(["decode", *args, *out])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
