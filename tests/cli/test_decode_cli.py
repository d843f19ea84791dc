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


def _speak(folder, texts, voice):
    import soundfile as sf

    from privasr.asr.tts import synthesize

    folder.mkdir(parents=True)
    for utt, words in texts.items():
        sf.write(str(folder / f"{utt}.wav"), synthesize(" ".join(words), voice), 16000, subtype="PCM_16")


def test_adapt_then_decode(tmp_path, test_data, sphinx_tools):
    """``privasr adapt`` writes a model that ``decode --hmm`` uses; ``decode --adapt`` does both in one go."""
    from privasr.asr.tts import Voice
    from privasr.corpus.formats.kaldi_text import read_kaldi_text
    from privasr.corpus.formats.nbest_jsonl import read_nbest

    lines = (test_data / "tts" / "generic.txt").read_text().splitlines()[:12]
    texts = {f"a{i:02d}": tuple(line.split()) for i, line in enumerate(lines)}
    _speak(tmp_path / "adapt", texts, Voice("en-us+klatt2", 150, 0.01))
    (tmp_path / "adapt.txt").write_text("".join(f"{u} {' '.join(w)}\n" for u, w in texts.items()))
    ev = {t.utt_id: t.words for t in read_kaldi_text(test_data / "tts" / "eval.txt")}
    _speak(tmp_path / "eval", dict(list(ev.items())[:2]), Voice("en-us+klatt2", 150, 0.01))
    lm, dic = __import__("privasr.asr.decode", fromlist=["digits_lm"]).digits_lm(
        tmp_path / "lm", sorted({w for ws in ev.values() for w in ws}))
    assert main(["adapt", str(tmp_path / "adapt"), str(tmp_path / "adapt.txt"), "--out", str(tmp_path / "m")]) == 0
    man = json.loads((tmp_path / "m" / "privasr-model.json").read_text())
    assert man["method"] == "map" and man["utterances"] == 12
    common = [str(tmp_path / "eval"), "--lm", str(lm), "--dict", str(dic)]
    assert main(["decode", *common, "--hmm", str(tmp_path / "m"), "--out", str(tmp_path / "a.jsonl")]) == 0
    assert main(["decode", *common, "--adapt", str(tmp_path / "adapt"), str(tmp_path / "adapt.txt"),
                 "--adapt-out", str(tmp_path / "m2"), "--out", str(tmp_path / "b.jsonl")]) == 0
    assert read_nbest(tmp_path / "a.jsonl") == read_nbest(tmp_path / "b.jsonl")
    res = json.loads((tmp_path / "b.jsonl.results.json").read_text())
    assert res["config"]["adapt"] and res["config"]["hmm"] == str(tmp_path / "m2")
    # the model folder exists now: adapting into it again is refused, nothing is overwritten
    assert main(["adapt", str(tmp_path / "adapt"), str(tmp_path / "adapt.txt"), "--out", str(tmp_path / "m")]) == 2
    # a WAV without a transcript is named
    (tmp_path / "adapt2.txt").write_text("".join(f"{u} {' '.join(w)}\n" for u, w in list(texts.items())[1:]))
    assert main(["adapt", str(tmp_path / "adapt"), str(tmp_path / "adapt2.txt"), "--out", str(tmp_path / "m3")]) == 2
    assert not (tmp_path / "m3").exists()
