"""The scripted bad-input suite: every reader, through every command that reads user files.

Each case writes one malformed (or unusable) input, runs a command on it in-process and asserts what a user
must see: exit status 2, exactly one line on stderr starting ``error:``, the file named, the line number
where the fault is on a line, no traceback, and nothing written (the command's output path does not exist
afterwards). A second table checks that auto-detection gives the same reader error as naming the format.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import re
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from privasr.cli import main

ANY = -1  # the fault is on a line, but which one depends on the compressor's block size

# A JSON Lines N-best file long enough that a truncated compressed copy fails after its first lines.
_LONG_NBEST = "".join(f'{{"utt_id": "u{i}", "hyps": [{{"words": "hello world number {i}"}}]}}\n'
                      for i in range(3000)).encode()


def _truncated(compress: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def build(p: Path) -> None:
        p.write_bytes(compress(_LONG_NBEST)[:400])
    return build


def _tar(members: dict[str, bytes], *, cut: int | None = None) -> Callable[[Path], None]:
    def build(p: Path) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        data = buf.getvalue()
        p.write_bytes(data if cut is None else data[:cut])
    return build


def _srilm_list(p: Path) -> None:
    (p.parent / "utt1").write_text("-10.5 -2.25 2 hello world\n")
    p.write_text("utt1\nno_such_utt\n")


def _ami_tts(n_words: str = "2", score: str = "-9.5") -> str:
    return ('{"utt_id": "M_A_3", "meeting": "M", "speaker": "A", "position": 3, "ref": "a b", "hyps": '
            f'[{{"words": "a c", "score": {score}, "lm_score": -3.0, "am_score": null, "n_words": {n_words}, '
            '"score_src": "hyp", "nbest_score": null}]}\n')


_GOOD_NB = '{"utt_id": "u1", "ref": "a b", "hyps": [{"words": "a b"}]}\n'
_NLP_HEAD = "token|speaker|ts|endTs|punctuation|case|tags|wer_tags\n"

# name, file name, content (text, bytes or a builder), the -f format (None: no reader to name), needle, line
BAD_FILES: list[tuple[str, str, str | bytes | Callable[[Path], None], str | None, str, int | None]] = [
    # canonical N-best JSON Lines
    ("nbest-nan", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": NaN}}]}\n',
     "nbest-jsonl", "NaN", 1),
    ("nbest-infinity", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": Infinity}}]}\n',
     "nbest-jsonl", "Infinity", 1),
    ("nbest-latin1-first-line", "x.jsonl", b'{"utt_id": "caf\xe9", "hyps": [{"words": "x"}]}\n',
     "nbest-jsonl", "UTF-8", 1),
    ("nbest-latin1-second-line", "x.jsonl", _GOOD_NB.encode() + b'{"utt_id": "\xe9", "hyps": []}\n',
     "nbest-jsonl", "UTF-8", 2),
    ("nbest-missing-hyps", "x.jsonl", '{"utt_id": "a", "ref": "x"}\n', "nbest-jsonl", "no 'hyps'", 1),
    ("nbest-empty-hyps", "x.jsonl", '{"utt_id": "a", "hyps": []}\n', "nbest-jsonl", "'hyps' is empty", 1),
    ("nbest-empty-hyps-line-3", "x.jsonl", _GOOD_NB + "\n" + '{"utt_id": "b", "hyps": []}\n',
     "nbest-jsonl", "'hyps' is empty", 3),
    ("nbest-truncated-gz", "x.jsonl.gz", _truncated(gzip.compress), "nbest-jsonl", "cannot read", ANY),
    ("nbest-truncated-xz", "x.jsonl.xz", _truncated(lzma.compress), "nbest-jsonl", "cannot read", ANY),
    ("nbest-garbage-gz", "x.jsonl.gz", b"\x1f\x8b\x08\x00garbage-garbage-garbage", "nbest-jsonl",
     "cannot read", 1),
    ("nbest-empty-file", "x.jsonl", "", "nbest-jsonl", "holds no utterances", None),
    ("nbest-blank-file", "x.jsonl", "\n  \n\n", "nbest-jsonl", "holds no utterances", None),
    ("nbest-duplicate-id", "x.jsonl", _GOOD_NB + _GOOD_NB, "nbest-jsonl", "duplicate utterance id", 2),
    ("nbest-unknown-hyp-key", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "bogus": 1}]}\n',
     "nbest-jsonl", "unknown key 'bogus'", 1),
    ("nbest-words-not-string", "x.jsonl", _GOOD_NB + '{"utt_id": "b", "hyps": [{"words": 3}]}\n',
     "nbest-jsonl", "words is int", 2),
    ("nbest-confidence-2", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "confidences": [2.0]}]}\n',
     "nbest-jsonl", "outside [0, 1]", 1),
    ("nbest-times-count", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x y", "times": [[0, 1]]}]}\n',
     "nbest-jsonl", "word times", 1),
    ("nbest-trailing-comma", "x.jsonl", _GOOD_NB + '{"utt_id": "b", "hyps": [{"words": "x"}],}\n',
     "nbest-jsonl", "invalid JSON", 2),
    ("nbest-score-string", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": "-Inf"}}]}\n',
     "nbest-jsonl", "score 'am'", 1),
    ("nbest-score-overflow", "x.jsonl", '{"utt_id": "a", "hyps": [{"words": "x", "scores": {"am": 1e999}}]}\n',
     "nbest-jsonl", "out of range", 1),
    ("nbest-duplicate-key", "x.jsonl", '{"utt_id": "a", "utt_id": "b", "hyps": [{"words": "x"}]}\n',
     "nbest-jsonl", "duplicate key", 1),
    ("nbest-ref-not-string", "x.jsonl", '{"utt_id": "a", "ref": 5, "hyps": [{"words": "x"}]}\n',
     "nbest-jsonl", "'ref' is int", 1),
    ("nbest-hyps-object", "x.jsonl", '{"utt_id": "a", "hyps": {"words": "x"}}\n', "nbest-jsonl",
     "'hyps' is dict", 1),
    # canonical transcript JSON Lines
    ("transcript-missing-words", "t.jsonl", '{"utt_id": "a", "entities": []}\n', "transcript-jsonl",
     "no 'words'", 1),
    ("transcript-nan-confidence", "t.jsonl", '{"utt_id": "a", "words": "x", "confidences": [NaN]}\n',
     "transcript-jsonl", "NaN", 1),
    ("transcript-entity-past-end", "t.jsonl",
     '{"utt_id": "a", "words": "x"}\n{"utt_id": "b", "words": "x", "entities": [[0, 2, "PER"]]}\n',
     "transcript-jsonl", "past the 1 words", 2),
    ("transcript-words-list", "t.jsonl", '{"utt_id": "a", "words": ["x"]}\n', "transcript-jsonl",
     "space-separated words", 1),
    # AMI TTS N-best JSON Lines
    ("ami-tts-n-words", "dev.jsonl", _ami_tts(n_words="3"), "ami-tts", "n_words", 1),
    ("ami-tts-nan-score", "dev.jsonl", _ami_tts(score="NaN"), "ami-tts", "NaN", 1),
    ("ami-tts-missing-hyps", "dev.jsonl",
     '{"utt_id": "M_A_3", "meeting": "M", "speaker": "A", "position": 3, "ref": "a b"}\n', "ami-tts", "hyps", 1),
    # AMI HMNet meetings
    ("ami-hmnet-meeting-not-list", "split_0.jsonl", '{"id": "M1", "meeting": 5}\n', "ami-hmnet", "meeting", 1),
    ("ami-hmnet-turn-without-utt", "split_0.jsonl", '{"id": "M1", "meeting": [{"speaker": "A"}]}\n',
     "ami-hmnet", "utt", 1),
    # HyPoradise JSON
    ("hyporadise-invalid-json", "h.json", '[{"input": ["a b"], "output": "a b"},\n {"input": ["a"] "output": "a"}]\n',
     "hyporadise", "invalid JSON", 2),
    ("hyporadise-missing-output", "h.json", '[{"input": ["a b"], "output": "a b"}, {"input": ["a"]}]\n',
     "hyporadise", "output", 2),
    ("hyporadise-input-not-list", "h.json", '[{"input": "a b", "output": "a b"}]\n', "hyporadise", "input", 1),
    ("hyporadise-empty-list", "h.json", "[]\n", "hyporadise", "holds no utterances", None),
    ("hyporadise-nan", "h.json", '[{"input": ["a"], "output": "a", "x": NaN}]\n', "hyporadise", "NaN", 1),
    # SRILM N-best lists
    ("srilm-nan", "utt_nan", "-100.5 nan 2 hello world\n", "srilm", "LM score is nan", 1),
    ("srilm-count", "utt_count", "-100.5 -12.25 3 hello world\n", "srilm", "nwords is 3", 1),
    ("srilm-count-line-2", "utt2", "-100.5 -12.25 2 hello world\n-101 -11 2 hello\n", "srilm", "nwords is 2", 2),
    ("srilm-plus-inf", "utt3", "inf -2 1 hello\n", "srilm", "acoustic score is inf", 1),
    ("srilm-v1-no-parens", "utt4", "NBestList1.0\n-1024 a b\n", "srilm", "not in parentheses", 2),
    ("srilm-v2-details", "utt5", "NBestList2.0\n(-10) a ( st: 0 et: 1 g: -1 b: -2 )\n", "srilm",
     "malformed details", 2),
    ("srilm-header-extra", "utt6", "NBestList1.0 extra\n(-1) a\n", "srilm", "header line has extra fields", 1),
    ("srilm-list-missing-file", "nbest.list", _srilm_list, "srilm", "neither an N-best hypothesis", 2),
    # CTM
    ("ctm-four-fields", "hyp.txt", "rec1 A 0.0 0.5\nrec1 A 0.5 0.5\n", "ctm", "4 fields", 1),
    ("ctm-confidence-1.7", "hyp.txt", "rec1 A 0.0 0.5 hi 1.7\nrec1 A 0.5 0.5 there 0.9\n", "ctm", "above 1", 1),
    ("ctm-start-abc", "hyp.txt", "rec1 A 0.0 0.5 hi 0.7\nrec1 A abc 0.5 there 0.9\n", "ctm",
     "start time 'abc' is not a number", 2),
    ("ctm-negative-duration", "a.ctm", "rec1 A 0.0 -0.5 hi\n", "ctm", "duration '-0.5' is invalid", 1),
    ("ctm-nan-duration", "hyp.txt", "rec1 A 0.0 0.5 hi\nrec1 A 0.5 nan there\n", "ctm", "duration 'nan'", 2),
    ("ctm-mixed-confidence", "a.ctm", "rec1 A 0.0 0.5 hi 0.7\nrec1 A 0.5 0.5 there\n", "ctm", "mixes lines", 2),
    ("ctm-seven-fields", "hyp.txt", "rec1 A 0.0 0.5 hi 0.7 extra\n", "ctm", "7 fields", 1),
    ("ctm-extension-kaldi-content", "a.ctm", "u1 hello world\n", "ctm", "3 fields", 1),
    # NIST trn
    ("trn-missing-paren", "hyp.txt", "hello (spk1-u1)\nworld (spk1-u2\n", "trn", "does not end with '(id)'", 2),
    ("trn-empty-id", "hyp.txt", "hello (spk1-u1)\nworld ()\n", "trn", "invalid utterance id", 2),
    ("trn-duplicate-id", "hyp.txt", "hello (spk1-u1)\nworld (spk1-u1)\n", "trn", "duplicate utterance id", 2),
    ("trn-unclosed-alternation", "hyp.txt", "a { b / c (spk1-u1)\n", "trn", "'{'", 1),
    ("trn-extension-no-id", "hyp.trn", "hello world\n", "trn", "does not end with '(id)'", 1),
    # AN4 transcriptions
    ("an4-no-id", "an4_test.transcription", "<s> YES </s> (an1-fash-b)\nNO\n", "an4", "no utterance id", 2),
    ("an4-duplicate-id", "an4_test.transcription", "YES (an1-fash-b)\nNO (an1-fash-b)\n", "an4",
     "duplicate utterance id", 2),
    # CoNLL
    ("conll-one-field", "x.conll", "Bob I-PER\nran\n", "conll", "line has 1 field", 2),
    ("conll-bad-tag", "ner.txt", "Bob I-PER\nran X-PER\n", "conll", "tag 'X-PER' is not IOB", 2),
    ("conll-extension-bad-tag", "x.conll", "Bob PER\n", "conll", "tag 'PER' is not IOB", 1),
    # Kaldi text
    ("kaldi-duplicate-id-named-text", "text", "utt1 hello\nutt1 world\n", "kaldi-text",
     "duplicate utterance id", 2),
    ("kaldi-duplicate-id", "hyp.txt", "utt1 hello\nutt2 big\nutt1 world\n", "kaldi-text",
     "duplicate utterance id", 3),
    # Earnings-21 references
    ("earnings21-few-fields", "c1.nlp", _NLP_HEAD + "Hi|0||||UC|[]|[]\nThere|0\n", "earnings21", "", 3),
    # archives (text-lines, CTM, Earnings-21 members)
    ("tar-truncated", "books.tar.gz", _tar({"a.txt": _LONG_NBEST}, cut=300), None,
     "cannot read the archive", None),
    ("tar-latin1-member", "books.tar.gz", _tar({"a.txt": b"hello\ncaf\xe9\n"}), "text-lines", "UTF-8", 2),
    ("tar-no-known-members", "x.tar.gz", _tar({"a.wav": b"RIFF"}), None, "holds no .ctm, .nlp or .txt", None),
    ("tar-bad-ctm-member", "sys.tar.gz", _tar({"c1.ctm": b"c1 A 0 1 hi\nc1 A x 1 there\n"}), "ctm",
     "start time 'x'", 2),
    # HTK SLF lattices (N-best lists from their best paths)
    ("slf-link-to-missing-node", "a.lat", "VERSION=1.0\nN=2 L=1\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\n"
     "J=0 S=0 E=7 a=-1.0 l=-1.0\n", "htk-lattice", "refers to node 7", 5),
    ("slf-score-not-a-number", "b.lat", "VERSION=1.0\nN=2 L=1\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\n"
     "J=0 S=0 E=1 a=abc l=-1.0\n", "htk-lattice", "a is 'abc'", 5),
    ("slf-size-line-wrong", "c.lat", "VERSION=1.0\nN=3 L=1\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\n"
     "J=0 S=0 E=1 a=-1 l=-1.0\n", "htk-lattice", "the size line says N=3 L=1", None),
    ("slf-bad-scale", "d.lat", "VERSION=1.0\nlmscale=abc\nN=2 L=1\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\n"
     "J=0 S=0 E=1 a=-1 l=-1.0\n", "htk-lattice", "lmscale='abc'", None),
    ("slf-cycle", "e.lat", "VERSION=1.0\nN=2 L=2\nI=0 t=0.0 W=!NULL\nI=1 t=0.5 W=hi\n"
     "J=0 S=0 E=1 a=-1 l=-1.0\nJ=1 S=1 E=0 a=-1 l=-1.0\n", "htk-lattice", "has a cycle", None),
    # no format at all
    ("prose", "notes.txt", "Hello there.\nThis is prose.\n", None, "unrecognised content", None),
    ("binary-junk", "blob.bin", b"\x00\xff\xfe\x80junk\n", None, "UTF-8", 1),
]

# The commands each bad file is given to; {bad} is the file, {ref}/{good} good inputs, {out} the output path.
INSPECT = ["data", "inspect", "{bad}"]
CONVERT = ["data", "convert", "{bad}", "{out}"]
WER_HYP = ["score", "wer", "{ref}", "{bad}", "--json", "{out}"]
WER_REF = ["score", "wer", "{bad}", "{good}", "--json", "{out}"]
COMPARE = ["score", "compare", "{ref}", "{good}", "{bad}", "--out", "{out}"]
CONF_TRAIN = ["confidence", "train", "--nbest", "{bad}", "--out", "{out}"]
ANONYMIZE = ["anonymize", "{bad}", "{out}", "--entities", "gold"]
TTS = ["data", "tts-nbest", "{bad}", "--out", "{out}"]

_NBEST_FMTS = ("nbest-jsonl", "ami-tts", "hyporadise", "srilm", "htk-lattice")


def _commands(k: int, fmt: str | None) -> list[list[str]]:
    """``data inspect`` and one more reading command for each bad file, in turn (N-best lists also go to
    ``confidence train``, transcripts to ``anonymize``)."""
    other = (CONF_TRAIN if fmt in _NBEST_FMTS else ANONYMIZE, CONVERT, WER_HYP)[k % 3]
    return [INSPECT, other]


CASES = [pytest.param(name, fname, content, cmd, needle, line, id=f"{name}:{cmd[0]}-{cmd[1]}")
         for k, (name, fname, content, fmt, needle, line) in enumerate(BAD_FILES) for cmd in _commands(k, fmt)]

# Cases that are about a command rather than a reader.
_REF = "a b (spk1-u1)\nc d (spk1-u2)\n"
EXTRA = [
    pytest.param("wer-empty-files", "hyp.trn", "", WER_REF, "holds no utterances", None, id="score-wer-empty-ref"),
    pytest.param("wer-jsonl-without-ref", "x.jsonl", '{"utt_id": "spk1-u1", "hyps": [{"words": "a"}]}\n', WER_REF,
                 "have no reference", None, id="score-wer-nbest-ref-without-refs"),
    pytest.param("wer-ids-differ", "hyp.trn", "a b (spk1-u1)\nc d (spk9-u9)\n", WER_HYP, "do not match", None,
                 id="score-wer-ids-differ"),
    pytest.param("compare-bad-b", "b.txt", "rec1 A 0.0 0.5 hi 1.7\n", COMPARE, "above 1", 1,
                 id="score-compare-ctm-confidence"),
    pytest.param("compare-nan-b", "b.jsonl", '{"utt_id": "spk1-u1", "hyps": [{"words": "a", "scores": {"x": NaN}}]}\n',
                 COMPARE, "NaN", 1, id="score-compare-jsonl-nan"),
    pytest.param("tts-bad-trn", "t.txt", "hello (spk1-u1)\nworld (spk1-u2\n", TTS, "does not end with '(id)'", 2,
                 id="data-tts-nbest-trn-missing-paren"),
    pytest.param("inspect-forced-wrong", "hyp.trn", "a b (spk1-u1)\n", [*INSPECT, "-f", "ctm"], "3 fields", 1,
                 id="data-inspect-forced-ctm-on-trn"),
    pytest.param("convert-forced-wrong", "x.jsonl", _GOOD_NB, [*CONVERT, "--from", "srilm"], "", 1,
                 id="data-convert-forced-srilm-on-jsonl"),
    pytest.param("rescore-bad-nbest", "t.jsonl", '{"utt_id": "u1", "hyps": []}\n',
                 ["rescore", "run", "--nbest", "{bad}", "--dev", "{bad}", "--out", "{out}"], "hyps", 1,
                 id="rescore-run-empty-hyps"),
    pytest.param("ref-bad-kaldi", "refs.txt", "u1 a b\nu1 c d\n",
                 ["data", "inspect", "{nbest}", "--ref", "{bad}"], "duplicate utterance id", 2,
                 id="data-inspect-ref-duplicate-id"),
    pytest.param("ref-ids-missing", "refs.txt", "x9 a b\n", ["data", "convert", "{nbest}", "{out}", "--ref", "{bad}"],
                 "no reference", None, id="data-convert-ref-ids-missing"),
    pytest.param("missing-file", "absent.jsonl", None, INSPECT, "no such file or folder", None,
                 id="data-inspect-missing-file"),
    pytest.param("missing-hyp", "absent.trn", None, WER_HYP, "no such file or folder", None,
                 id="score-wer-missing-file"),
]


def _write(p: Path, content: str | bytes | Callable[[Path], None] | None) -> None:
    if content is None:
        return
    if callable(content):
        content(p)
    elif isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")


def _run(tmp_path: Path, fname: str, content, cmd: list[str], capsys) -> tuple[int, str, Path, Path]:
    work = tmp_path / "in"
    work.mkdir()
    bad = work / fname
    _write(bad, content)
    ref = tmp_path / "ref.trn"
    ref.write_text(_REF)
    good = tmp_path / "good.trn"
    good.write_text(_REF)
    out = tmp_path / "out" / ("o.json" if cmd[:2] == ["score", "wer"] else "o.jsonl" if "convert" in cmd
                              or "anonymize" in cmd else "run")
    nbest = tmp_path / "good.jsonl"
    nbest.write_text(_GOOD_NB)
    args = [a.format(bad=bad, ref=ref, good=good, out=out, nbest=nbest) for a in cmd]
    capsys.readouterr()
    code = main(args)
    return code, capsys.readouterr().err, bad, out


def _check(code: int, err: str, bad: Path, out: Path, needle: str, line: int | None) -> None:
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert needle in err, err
    assert bad.name in err, err
    if line == ANY:
        assert re.search(re.escape(bad.name) + r"(:[^:\s]+)?:\d+: ", err), err
    elif line is not None:
        assert re.search(re.escape(bad.name) + rf"(:[^:\s]+)?:{line}: ", err), err
    assert not out.exists() and not out.parent.exists(), f"{out} was written"


@pytest.mark.parametrize(("name", "fname", "content", "cmd", "needle", "line"), CASES + EXTRA)
def test_bad_input(tmp_path: Path, capsys, name: str, fname: str, content, cmd: list[str], needle: str,
                   line: int | None) -> None:
    code, err, bad, out = _run(tmp_path, fname, content, cmd, capsys)
    _check(code, err, bad, out, needle, line)


def test_suite_is_large_enough() -> None:
    assert len(CASES) + len(EXTRA) >= 80
    assert {fmt for *_, fmt, _, _ in [(b[0], b[1], b[2], b[3], b[4], b[5]) for b in BAD_FILES]} >= {
        "nbest-jsonl", "transcript-jsonl", "ami-tts", "ami-hmnet", "hyporadise", "srilm", "ctm", "trn", "an4",
        "conll", "kaldi-text", "earnings21", "text-lines"}


@pytest.mark.parametrize(("name", "fname", "content", "fmt", "needle", "line"),
                         [pytest.param(*b, id=b[0]) for b in BAD_FILES if b[3] is not None])
def test_detection_gives_the_named_readers_error(tmp_path: Path, name: str, fname: str, content, fmt: str,
                                                  needle: str, line: int | None) -> None:
    """Without a format the message starts with exactly what naming the format says (then the formats tried)."""
    from privasr.corpus.load import load_path
    from privasr.errors import InputError

    bad = tmp_path / fname
    _write(bad, content)
    with pytest.raises(InputError) as forced:
        load_path(bad, fmt)
    with pytest.raises(InputError) as auto:
        load_path(bad)
    assert needle in str(forced.value)
    assert str(auto.value).startswith(str(forced.value).rstrip(")")), (str(auto.value), str(forced.value))


def test_score_wer_reads_every_transcript_format(tmp_path: Path, capsys) -> None:
    """The same hypotheses as trn, Kaldi text, CTM, transcript JSON Lines and N-best JSON Lines score alike."""
    ref = tmp_path / "ref.trn"
    ref.write_text("a b c (spk1-u1)\nd e (spk1-u2)\n")
    hyps = {
        "h.trn": "a x c (spk1-u1)\nd (spk1-u2)\n",
        "h.txt": "spk1-u1 a x c\nspk1-u2 d\n",
        "h.ctm": "spk1-u1 A 0 1 a\nspk1-u1 A 1 1 x\nspk1-u1 A 2 1 c\nspk1-u2 A 0 1 d\n",
        "t.jsonl": '{"utt_id": "spk1-u1", "words": "a x c"}\n{"utt_id": "spk1-u2", "words": "d"}\n',
        "n.jsonl": '{"utt_id": "spk1-u1", "hyps": [{"words": "a x c"}, {"words": "a b c"}]}\n'
                   '{"utt_id": "spk1-u2", "hyps": [{"words": "d"}]}\n',
    }
    metrics = []
    for name, text in hyps.items():
        (tmp_path / name).write_text(text)
        js = tmp_path / f"{name}.json"
        assert main(["score", "wer", str(ref), str(tmp_path / name), "--json", str(js)]) == 0, capsys.readouterr()
        metrics.append(json.loads(js.read_text())["metrics"])
    assert all(m == metrics[0] for m in metrics)
    assert (metrics[0]["substitutions"], metrics[0]["deletions"], metrics[0]["ref_words"]) == (1, 1, 5)
