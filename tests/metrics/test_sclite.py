"""sclite's transcript conventions, checked against NIST sclite itself (Debian ``sctk``; skipped without it).

The expected values written into the tests are sclite's own output (SCTK 2.4.10, ``sclite -r ref.trn trn -h
hyp.trn trn -i spu_id``); where sclite is installed the property tests run it on every generated case.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from privasr.bench.metrics import sclite_binary
from privasr.cli.score import by_speaker, read_transcripts
from privasr.corpus.markup import parse_markup
from privasr.errors import InputError
from privasr.metrics.sclite import Conventions, align_sclite
from privasr.metrics.wer import wer, wer_from_alignments

from ._sclite_oracle import run_sclite

needs_sclite = pytest.mark.skipif(sclite_binary() is None, reason="NIST sclite (Debian package sctk) is not installed")


def counts(a):
    return a.hits, a.substitutions, a.deletions, a.insertions


# --------------------------------------------------------------------------------- sclite's documented cases

# (options, reference, hypothesis, sclite's (C, S, D, I)) -- every row is sclite 2.4.10's output
SCLITE_CASES = [
    ((), "i've { um / uh / @ } as far as i'm concerned", "i've as far as i'm concerned", (6, 0, 0, 0)),
    ((), "i've { um / uh / @ } as far as i'm concerned", "i've uh as far as i'm concerned", (7, 0, 0, 0)),
    ((), "i've { um / uh / @ } as far as i'm concerned", "i've er as far as i'm concerned", (6, 0, 0, 1)),
    ((), "i've { um / uh } as far as i'm concerned", "i've as far as i'm concerned", (6, 0, 1, 0)),
    ((), "i've { um hm / uh } as far", "i've um hm as far", (5, 0, 0, 0)),
    ((), "i've { um hm / uh } as far", "i've hm as far", (4, 0, 1, 0)),
    ((), "i've (um) as far", "i've as far", (3, 0, 1, 0)),
    (("-D",), "i've (um) as far", "i've as far", (4, 0, 0, 0)),
    ((), "i've (um) as far", "i've um as far", (3, 1, 0, 0)),
    (("-D",), "i've (um) as far", "i've um as far", (4, 0, 0, 0)),
    (("-D",), "i've (um) as far", "i've uh as far", (3, 1, 0, 0)),
    ((), "i've as far", "i've { um / uh } as far", (3, 0, 0, 1)),
    ((), "i've um as far", "i've { uh / @ } as far", (3, 0, 1, 0)),
    ((), "{ a / @ }", "", (0, 0, 0, 0)),
    ((), "{ a / @ }", "b", (0, 0, 0, 1)),
    ((), "Hello World", "hello world", (2, 0, 0, 0)),
    (("-s",), "Hello World", "hello world", (0, 2, 0, 0)),
    ((), "the th- cat", "the then cat", (2, 1, 0, 0)),
    (("-F",), "the th- cat", "the then cat", (3, 0, 0, 0)),
    (("-F",), "the -at cat", "the bat cat", (3, 0, 0, 0)),
    (("-D",), "the (th-) cat", "the cat", (3, 0, 0, 0)),
    ((), "x { a { b / c } / d } y", "x c y", (3, 0, 1, 0)),
    ((), "x {um/uh/@} y", "x c y", (2, 0, 0, 1)),
    ((), "x { a } y", "x c y", (2, 1, 0, 0)),
    ((), "x @ y", "x c y", (2, 0, 0, 1)),
    ((), "x a / b y", "x c y", (2, 1, 2, 0)),
]


def _conv(options):
    return Conventions(case_sensitive="-s" in options, optional_deletable="-D" in options,
                       fragments="-F" in options)


@pytest.mark.parametrize(("options", "ref", "hyp", "want"), SCLITE_CASES)
def test_sclite_documented_cases(options, ref, hyp, want):
    a = align_sclite([ref.split()], [hyp.split()], _conv(options))[0]
    assert counts(a) == want
    assert "@" not in a.ref and "@" not in a.hyp


@needs_sclite
def test_documented_cases_against_the_installed_sclite(tmp_path):
    for k, (options, ref, hyp, want) in enumerate(SCLITE_CASES):
        d = tmp_path / str(k)
        d.mkdir()
        (d / "ref.trn").write_text(f"{ref} (spk1-1)\n")
        (d / "hyp.trn").write_text(f"{hyp} (spk1-1)\n")
        per_utt, _ = run_sclite(d / "ref.trn", d / "hyp.trn", d, options)
        assert per_utt["spk1-1"] == want, (options, ref, hyp)


def test_the_issue_alternation_case_through_score_wer(tmp_path, capsys):
    """The reported case: sclite counts 6 reference words and 0 errors (was: 13 words, 7 deletions)."""
    from privasr.cli import main

    (tmp_path / "ref.trn").write_text("i've { um / uh / @ } as far as i'm concerned (spk1-001)\n")
    (tmp_path / "hyp.trn").write_text("i've as far as i'm concerned (spk1-001)\n")
    out = tmp_path / "wer.json"
    assert main(["score", "wer", str(tmp_path / "ref.trn"), str(tmp_path / "hyp.trn"), "--json", str(out)]) == 0
    m = json.loads(out.read_text())["metrics"]
    assert (m["ref_words"], m["errors"], m["wer"]) == (6, 0, 0.0)
    assert m["speakers"]["spk1"]["ref_words"] == 6


@pytest.mark.parametrize("head", [b"\xef\xbb\xbf", b""])
@pytest.mark.parametrize("crlf", [False, True])
def test_a_byte_order_mark_or_crlf_changes_nothing(tmp_path, head, crlf):
    """The reported case: a BOM glued to the first word made identical transcripts score 25% WER."""
    nl = b"\r\n" if crlf else b"\n"
    (tmp_path / "ref.trn").write_bytes(head + b"hello world a b (s1-1)" + nl)
    (tmp_path / "hyp.trn").write_bytes(b"hello world a b (s1-1)\n")
    (tmp_path / "ref.txt").write_bytes(head + b"utt1 hello world" + nl)
    (tmp_path / "hyp.txt").write_bytes(b"utt1 hello world\n")
    for r, h in (("ref.trn", "hyp.trn"), ("ref.txt", "hyp.txt")):
        refs = read_transcripts(tmp_path / r, role="ref")
        hyps = read_transcripts(tmp_path / h)
        assert [t.utt_id for t in refs] == [t.utt_id for t in hyps]
        assert wer([t.words for t in refs], [t.words for t in hyps], aligner="sclite").wer == 0.0


def test_ids_that_differ_invisibly_are_shown_to_differ(tmp_path, capsys):
    from privasr.cli import main

    (tmp_path / "ref").write_text("utt1 a b\n")
    (tmp_path / "hyp").write_text("utt1\u00a0x a b\n")  # a no-break space glued into the id
    assert main(["score", "wer", str(tmp_path / "ref"), str(tmp_path / "hyp")]) == 2
    out = " ".join(capsys.readouterr().err.split())
    assert "U+00A0 NO-BREAK SPACE" in out and "hyp:1" in out
    (tmp_path / "hyp").write_text("utt2 a b\n")
    assert main(["score", "wer", str(tmp_path / "ref"), str(tmp_path / "hyp")]) == 2
    out = " ".join(capsys.readouterr().err.split())
    assert "'utt1' (line 1)" in out and "'utt2' (line 1)" in out


@pytest.mark.parametrize(("content", "needle"), [
    (b"\xff\xfeu\x00t\x00", "UTF-16 text"),
    (b"utt1 caf\xe9\n", "0xe9"),
    (b"utt1 a\xe2\x80\x8bb\n", "U+200B ZERO WIDTH SPACE"),
    (b"utt1 a\x00b\n", "U+0000"),
    (b"utt1 a \xef\xbb\xbfb\n", "U+FEFF"),
])
def test_byte_level_problems_are_refused_at_file_and_line(tmp_path, content, needle):
    p = tmp_path / "text"
    p.write_bytes(content)
    with pytest.raises(InputError, match=re.escape(needle)) as e:
        read_transcripts(p, "kaldi", role="ref")
    assert e.value.path is not None and e.value.line == 1


# --------------------------------------------------------------------------------- parsing and its refusals


def test_malformed_markup_is_located_in_score(tmp_path, capsys):
    (tmp_path / "ref").write_text("utt1 a b\nutt2 x { a / b\n")
    (tmp_path / "hyp").write_text("utt1 a b\nutt2 x a\n")
    from privasr.cli import main

    assert main(["score", "wer", str(tmp_path / "ref"), str(tmp_path / "hyp")]) == 2
    out = " ".join(capsys.readouterr().err.split())
    assert "ref:2" in out and "never closed" in out


def test_markup_outside_scoring_is_refused_at_its_line(tmp_path):
    from privasr.corpus.formats.trn import read_trn, reading_markup

    p = tmp_path / "ref.trn"
    p.write_text("plain words (s-1)\ni've { um / @ } far (s-2)\n")
    with pytest.raises(InputError, match="sclite markup") as e:
        read_trn(p)
    assert e.value.line == 2
    with reading_markup():
        assert len(read_trn(p)) == 2


def test_plain_conventions_make_every_token_a_word():
    r = wer([["a", "{", "b", "/", "@", "}"]], [["a"]], aligner="sclite", conventions=Conventions(markup=False))
    assert (r.ref_words, r.deletions) == (6, 5)
    with pytest.raises(InputError, match="sclite aligner"):
        wer([["a", "{", "b", "/", "@", "}"]], [["a"]], aligner="jiwer", conventions=Conventions())


# --------------------------------------------------------------------------------- property tests against sclite

_VOCAB = ["a", "b", "c", "the", "that", "bat", "um", "uh", "A", "Um", "THE", "(um)", "(a)", "th-", "-at", "(th-)"]


@st.composite
def _text(draw, depth: int = 0, alternations: bool = True) -> str:
    out = []
    for _ in range(draw(st.integers(0, 6 if depth == 0 else 2))):
        if alternations and depth < 2 and draw(st.integers(0, 9)) < 2:
            alts = [draw(_text(depth + 1)) or "@" for _ in range(draw(st.integers(2, 3)))]
            out.append("{ " + " / ".join(alts) + " }")
        elif depth == 0 and draw(st.integers(0, 19)) == 0:
            out.append("@")
        else:
            out.append(draw(st.sampled_from(_VOCAB)))
    return " ".join(out)


@st.composite
def _case(draw):
    n = draw(st.integers(1, 4))
    pairs = [(draw(_text()), draw(_text(alternations=draw(st.booleans())))) for _ in range(n)]
    speakers = [draw(st.sampled_from(["spkA", "spkB", "spkC"])) for _ in range(n)]
    options = tuple(o for o in ("-s", "-D", "-F") if draw(st.booleans()))
    bom, crlf = draw(st.booleans()), draw(st.booleans())
    return pairs, speakers, options, bom, crlf


@needs_sclite
@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(_case())
def test_sclite_agrees_on_generated_transcripts(tmp_path_factory, case):
    """500 generated cases: alternations (nested, with '@'), optionally deletable words, fragments, mixed case,
    sclite's options -s/-D/-F, a byte-order mark and CRLF line ends in privasr's copy of the reference (sclite
    reads a clean copy: it would glue the mark to the first word). Per sentence C/S/D/I and per speaker sums."""
    pairs, speakers, options, bom, crlf = case
    d = tmp_path_factory.mktemp("case")
    ids = [f"{s}-{k:03d}" for k, s in enumerate(speakers)]
    ref_lines = [f"{r} ({u})" for (r, _), u in zip(pairs, ids, strict=True)]
    hyp_lines = [f"{h} ({u})" for (_, h), u in zip(pairs, ids, strict=True)]
    (d / "ref.trn").write_text("\n".join(ref_lines) + "\n")
    (d / "hyp.trn").write_text("\n".join(hyp_lines) + "\n")
    nl = "\r\n" if crlf else "\n"
    (d / "ours.trn").write_bytes((b"\xef\xbb\xbf" if bom else b"") + (nl.join(ref_lines) + nl).encode())
    per_utt, per_spk = run_sclite(d / "ref.trn", d / "hyp.trn", d / "sclite", options)

    refs = read_transcripts(d / "ours.trn", role="ref")
    hyps = read_transcripts(d / "hyp.trn")
    alis = align_sclite([t.words for t in refs], [t.words for t in hyps], _conv(options))
    fold = "-s" not in options  # sclite folds the whole line, ids too
    for u, a in zip(ids, alis, strict=True):
        assert counts(a) == per_utt[u.lower() if fold else u], (options, u, pairs)
    spk = by_speaker(ids, wer_from_alignments(alis), fold_case=fold)
    for s, c in spk.items():
        want = per_spk[s]
        assert (c["sentences"], c["ref_words"], c["hits"], c["substitutions"], c["deletions"], c["insertions"],
                c["errors"], c["sentence_errors"]) == (want["sentences"], want["words"], want["corr"], want["sub"],
                                                       want["del"], want["ins"], want["err"],
                                                       want["sentence_errors"]), (options, s, pairs)


@needs_sclite
def test_score_wer_by_speaker_matches_sclites_sum_report(tmp_path):
    """One 600-utterance file pair through ``privasr score wer --by-speaker --json``, as a user would run it."""
    import random

    from privasr.cli import main

    rng = random.Random(7)
    vocab = ["a", "b", "c", "the", "cat", "Um", "uh"]

    def text(alts: bool) -> str:
        out = []
        for _ in range(rng.randint(0, 8)):
            if alts and rng.random() < 0.15:
                out.append("{ " + " / ".join(rng.choice(vocab + ["@"]) for _ in range(rng.randint(2, 3))) + " }")
            else:
                out.append(rng.choice(vocab))
        return " ".join(out)

    ids = [f"spk{rng.randint(1, 9)}-{k:04d}" for k in range(600)]
    (tmp_path / "ref.trn").write_text("".join(f"{text(True)} ({u})\n" for u in ids))
    (tmp_path / "hyp.trn").write_text("".join(f"{text(False)} ({u})\n" for u in ids))
    _, per_spk = run_sclite(tmp_path / "ref.trn", tmp_path / "hyp.trn", tmp_path / "sclite")
    assert main(["score", "wer", str(tmp_path / "ref.trn"), str(tmp_path / "hyp.trn"), "--by-speaker", "--json",
                 str(tmp_path / "w.json")]) == 0
    m = json.loads((tmp_path / "w.json").read_text())["metrics"]
    assert (m["ref_words"], m["hits"], m["substitutions"], m["deletions"], m["insertions"]) == (
        per_spk["Sum"]["words"], per_spk["Sum"]["corr"], per_spk["Sum"]["sub"], per_spk["Sum"]["del"],
        per_spk["Sum"]["ins"])
    for s, c in m["speakers"].items():
        assert (c["ref_words"], c["errors"], c["sentence_errors"]) == (
            per_spk[s]["words"], per_spk[s]["err"], per_spk[s]["sentence_errors"])


@needs_sclite
def test_mapsswe_with_alternations_matches_sc_stats(tmp_path):
    """Two systems that take different branches of the same alternations: sc_stats' MAPSSWE summary line
    ``(# segs: 4) (% Error: 14.29 14.29) (mean: 0.000) (std dev: 1.155) (Z Stat: 0.000)``."""
    from privasr.cli import main

    (tmp_path / "ref.trn").write_text("x { a / b c } y z w q (s-1)\none two three four five six (s-2)\n"
                                      "x { a / @ } y z w q (s-3)\nalpha beta gamma delta (s-4)\n")
    (tmp_path / "A.trn").write_text("x a y z w q (s-1)\none two tree four five six (s-2)\nx y z w q (s-3)\n"
                                    "alpha beta gama delta (s-4)\n")
    (tmp_path / "B.trn").write_text("x b c y z k q (s-1)\none two three four five six (s-2)\nx a y z w k (s-3)\n"
                                    "alpha beta gamma delta (s-4)\n")
    assert main(["score", "compare", *(str(tmp_path / f) for f in ("ref.trn", "A.trn", "B.trn")),
                 "--out", str(tmp_path / "cmp")]) == 0
    m = json.loads((tmp_path / "cmp" / "results.json").read_text())["metrics"]
    assert m["mapsswe_n"] == 4
    assert round(100 * m["mapsswe_errors_a"] / m["mapsswe_ref_words"], 2) == 14.29
    assert round(100 * m["mapsswe_errors_b"] / m["mapsswe_ref_words"], 2) == 14.29
    assert (round(m["mapsswe_mean"], 3), round(m["mapsswe_sd"], 3), m["mapsswe_z"]) == (0.0, 1.155, 0.0)


def test_conventions_name_sclites_options():
    assert Conventions(case_sensitive=True, optional_deletable=True, fragments=True).options() == "-s -D -F"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_text(), _text(), st.booleans(), st.booleans())
def test_compiled_dp_equals_the_python_dp(ref, hyp, opt, frag):
    """The C DP (privasr.metrics._netdp) and the Python loops give the same costs and back-pointers, bit for bit."""
    from privasr.metrics import sclite

    if sclite._netdp is None:
        pytest.skip("the compiled DP is not built")
    conv = Conventions(optional_deletable=opt, fragments=frag)
    ra = sclite._Net(parse_markup(ref.lower().split()), conv)
    hb = sclite._Net(parse_markup(hyp.lower().split()), conv)
    c1, a1, b1 = sclite._dp_python(ra, hb)
    c2, a2, b2 = sclite._dp_compiled(ra, hb)
    assert [list(r) for r in c1] == c2 and a1 == a2 and b1 == b2


def _error(fn) -> str:
    with pytest.raises(InputError) as e:
        fn()
    return e.value.message


def test_every_refused_convention_is_documented_with_its_error(tmp_path):
    """docs/formats.md lists each refusal with its message: the messages privasr gives are the ones written there."""
    from privasr.corpus.formats.ctm import parse_ctm_line
    from privasr.corpus.formats.trn import read_trn
    from privasr.corpus.load import load_path
    from privasr.corpus.records import check_words
    from privasr.lm.ngram.counts import check_training_text
    from privasr.lm.perplexity import check_markers

    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "formats.md").read_text().split())
    (tmp_path / "a.trn").write_text("i've { um / @ } far (s-1)\n")
    (tmp_path / "x.stm").write_text("2345 A 2345-a 0.10 2.03 uh huh\n")
    (tmp_path / "u16.txt").write_bytes("utt1 a\n".encode("utf-16"))
    messages = [
        _error(lambda: parse_markup("a { / b }".split())),
        _error(lambda: parse_markup("a { b / c".split())),
        _error(lambda: parse_markup("a } b".split())),
        _error(lambda: parse_markup(["c{a", "/", "b}"])),
        _error(lambda: parse_markup(["a", "()"])),
        _error(lambda: parse_ctm_line("r A * * <ALT_BEGIN>")),
        _error(lambda: load_path(tmp_path / "x.stm")),
        _error(lambda: read_trn(tmp_path / "a.trn")),
        _error(lambda: check_markers(["a", "<s>", "b"])),
        _error(lambda: check_training_text([["a"], ["<s>", "b"]], Path("t.txt"))),
        _error(lambda: check_words(["a\u200bb"], "reference")),
        _error(lambda: load_path(tmp_path / "u16.txt", "kaldi-text")),
    ]
    for m in messages:
        assert any(m[i:i + 20] in docs for i in range(max(1, len(m) - 19))), m  # 20 characters of it, verbatim


def test_data_inspect_counts_plain_words_and_markup_apart(tmp_path, capsys):
    from privasr.cli import main

    (tmp_path / "ref.trn").write_text("i've { um / uh / @ } as (far) (spk1-001)\nhello there (spk1-002)\n")
    assert main(["data", "inspect", str(tmp_path / "ref.trn"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["words"], d["sclite_alternations"], d["sclite_optional_words"]) == (4, 1, 1)
