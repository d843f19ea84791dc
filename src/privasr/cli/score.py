"""``privasr score``: WER, oracle WER and significance tests between systems."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privasr.cli._console import make_console, print_table
from privasr.corpus.records import NBest, Transcript
from privasr.errors import InputError
from privasr.results import write_results

app = typer.Typer(help="Score recognition output: WER, and compare two systems (MAPSSWE, bootstrap).",
                  no_args_is_help=True)
out_console = make_console()

_ALIASES = {"kaldi": "kaldi-text"}
_FORMAT_HELP = ("Format of every input: 'auto' (detected from the content like 'privasr data inspect': JSON Lines "
                "N-best lists or transcripts, CTM, trn, Kaldi text, SRILM, HyPoradise...; a file that fits none "
                "better is read as Kaldi text), 'trn', 'kaldi' (Kaldi text, 'id words...' per line), 'nbest' (N-best "
                "lists in any supported N-best format: the 1-best of each list, or its 'ref' when the file is the "
                "reference), or any format name of docs/formats.md (e.g. ctm, transcript-jsonl).")


def detect_format(path: Path) -> str:
    """The format ``privasr score`` reads ``path`` in with ``--format auto`` (a name of :data:`FORMATS`).

    Detection is :func:`privasr.corpus.load.detect_format`'s, with Kaldi text for files no format fits better.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "hyp"
    >>> _ = p.write_text("hello world (spk1-u1)\\n")
    >>> detect_format(p)
    'trn'
    """
    from privasr.corpus.load import detect_format as detect

    return detect(path, fallback="kaldi-text") or "kaldi-text"


_NORM_HELP = ("Normaliser applied to references and hypotheses before scoring: a preset (none, asr, wer, ami, neural) "
              "with optional overrides, e.g. 'wer,fillers=keep' (see privasr.text.normalize).")


_CONV_HELP = ("Transcript conventions: 'sclite' (sclite's: alternations '{ um / uh / @ }' and the null word '@' "
              "are read, case is folded unless --case-sensitive) or 'plain' (every token is a word, compared exactly: "
              "Kaldi compute-wer's and jiwer's). See docs/formats.md.")


def conventions(name: str, case_sensitive: bool, optional_deletable: bool, fragments: bool) -> Any:
    """The :class:`~privasr.metrics.sclite.Conventions` of the ``score`` options (``name``: sclite or plain)."""
    from privasr.metrics.sclite import Conventions

    if name == "plain":
        if optional_deletable or fragments:
            raise InputError("--optional-deletable and --fragments are sclite conventions",
                             expected="--conventions sclite with them")
        return Conventions(case_sensitive=True, markup=False)
    if name != "sclite":
        raise InputError(f"unknown conventions {name!r}", expected="sclite or plain")
    return Conventions(case_sensitive=case_sensitive, optional_deletable=optional_deletable, fragments=fragments)


def normalized(transcripts: list[Transcript], spec: str, conv: Any = None, path: Path | None = None
               ) -> list[Transcript]:
    """The transcripts with their words normalised by the ``spec`` normaliser (``none`` returns them as they are).

    Under sclite's conventions (``conv`` with ``markup``) the markup of every transcript is checked first (an
    :class:`InputError` names ``path``, the utterance and its line) and the normaliser maps the words, not the
    markup (:func:`privasr.corpus.markup.map_words`).
    """
    from dataclasses import replace

    from privasr.corpus.markup import check_markup, map_words
    from privasr.text.normalize import Normalizer

    markup = conv is not None and conv.markup
    if markup:
        for t in transcripts:
            try:
                check_markup(t.words)
            except InputError as e:
                raise InputError(f"utterance {t.utt_id!r}: {e.message}", path=path,
                                 line=t.order if isinstance(t.order, int) else None, expected=e.expected) from None
    if spec == "none":
        return transcripts
    norm = Normalizer.from_spec(spec)
    return [replace(t, words=map_words(t.words, norm, optional_deletable=conv.optional_deletable) if markup
                    else norm(t.words), confidences=None, times=None, entities=()) for t in transcripts]


def read_transcripts(path: Path, fmt: str = "auto", *, role: str = "hyp") -> list[Transcript]:
    """Read the transcripts of a file in any supported format (``fmt``: auto, trn, kaldi, nbest or a format name).

    From N-best lists, ``role="hyp"`` takes each list's 1-best (``hyps[0]``) and ``role="ref"`` its reference
    (every list must have one). A file that holds no utterances is an :class:`InputError`.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "h.jsonl"
    >>> _ = p.write_text('{"utt_id": "u1", "ref": "a b", "hyps": [{"words": "a c"}, {"words": "a b"}]}\\n')
    >>> [(t.utt_id, t.words) for t in read_transcripts(p)], [t.words for t in read_transcripts(p, role="ref")]
    ([('u1', ('a', 'c'))], [('a', 'b')])
    """
    from privasr.corpus.formats.trn import reading_markup
    from privasr.corpus.load import FORMATS, load_nbest, load_path, no_utterances

    fmt = _ALIASES.get(fmt, fmt)
    if fmt not in ("auto", "nbest") and fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}", expected=f"auto, trn, kaldi, nbest or one of {', '.join(FORMATS)}")
    if fmt == "nbest":
        records: list[Any] = load_nbest(path)
    else:
        with reading_markup():  # sclite's markup: interpreted (or refused) by the scoring conventions
            sets = load_path(path, None if fmt == "auto" else fmt, fallback="kaldi-text")
        if len(sets) != 1:
            raise InputError(f"holds {len(sets)} sets ({', '.join(d.name for d in sets[:4])})", path=path,
                             expected="one file or folder of transcripts or N-best lists")
        records = list(sets[0].records)
    if not records:
        raise no_utterances(path)
    if not isinstance(records[0], NBest):
        return records
    if role == "ref":
        missing = [nb.utt_id for nb in records if nb.ref is None]
        if missing:
            raise InputError(f"{len(missing)} N-best lists have no reference (e.g. {', '.join(missing[:3])})",
                             path=path, expected="a 'ref' in every list of the reference file")
        return [Transcript(nb.utt_id, tuple(nb.ref or ())) for nb in records]
    return [Transcript(nb.utt_id, nb.best.words) for nb in records]


def _where(t: Transcript) -> str:
    """An id as a person can compare it (``repr``: invisible characters show), with its line when known."""
    return f"{t.utt_id!r}" + (f" (line {t.order})" if isinstance(t.order, int) else "")


def match_ids(ref: list[Transcript], hyp: list[Transcript], ref_path: Path, hyp_path: Path) -> list[Transcript]:
    """The hypotheses in reference order; :class:`InputError` (listing a few ids, with their lines) if the id sets
    differ.

    >>> r, h = [Transcript("utt1", ("a",), order=1)], [Transcript("utt2", ("a",), order=1)]
    >>> match_ids(r, h, Path("ref.trn"), Path("hyp.trn"))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: hyp.trn: utterance ids do not match the reference: 1 reference ids missing from it (e.g. 'utt1' (line 1)); 1 ids not in the reference ref.trn (e.g. 'utt2' (line 1)) (expected the same utterance ids as the reference)
    """
    by_id = {t.utt_id: t for t in hyp}
    ref_ids = {t.utt_id for t in ref}
    missing = [t for t in ref if t.utt_id not in by_id]
    extra = [t for t in hyp if t.utt_id not in ref_ids]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{len(missing)} reference ids missing from it (e.g. {', '.join(map(_where, missing[:5]))})")
        if extra:
            parts.append(f"{len(extra)} ids not in the reference {ref_path} (e.g. {', '.join(map(_where, extra[:5]))})")
        raise InputError("utterance ids do not match the reference: " + "; ".join(parts), path=hyp_path,
                         expected="the same utterance ids as the reference")
    return [by_id[t.utt_id] for t in ref]


def by_speaker(ids: list[str], r: Any, *, fold_case: bool = False) -> dict[str, dict[str, Any]]:
    """Per-speaker counts (sclite's ``-i spu_id`` speakers, in order of appearance) of a :class:`WerResult`.

    ``fold_case``: speakers are lower-cased, as sclite does when it folds case (it folds the whole line, ids too).
    """
    from privasr.corpus.formats.trn import spu_id

    groups: dict[str, list[int]] = {}
    for k, u in enumerate(ids):
        groups.setdefault(spu_id(u.lower() if fold_case else u), []).append(k)
    return {spk: r.subset(ks).as_dict() for spk, ks in groups.items()}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%" if math.isfinite(x) else "n/a"


def _num(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _check_outputs(json_out: Path | None = None, out_dir: Path | None = None) -> None:
    """The output paths can be written (checked before the inputs are read; nothing is created)."""
    from privasr.outputs import check_output_dir, check_output_file

    if json_out is not None:
        check_output_file(json_out)
    if out_dir is not None:
        check_output_dir(out_dir)


@app.command("wer")
def wer_cmd(
    ref: Annotated[Path, typer.Argument(help="Reference transcripts (trn, Kaldi text, or N-best lists with 'ref').")],
    hyp: Annotated[Path, typer.Argument(help="Hypothesis transcripts (or N-best lists: their 1-best), same utterance ids as the reference.")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the counts to this JSON file.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help=_FORMAT_HELP)] = "auto",
    aligner: Annotated[str, typer.Option("--aligner", help="'sclite' (NIST sclite's weighted alignment: sub 4, "
                                         "ins 3, del 3; its Corr/Sub/Del/Ins) or 'jiwer' (plain Levenshtein).")] = "sclite",
    normalize: Annotated[str, typer.Option("--normalize", help=_NORM_HELP)] = "none",
    conv_name: Annotated[str, typer.Option("--conventions", help=_CONV_HELP)] = "sclite",
    case_sensitive: Annotated[bool, typer.Option("--case-sensitive", help="Compare words exactly (sclite -s); "
                                                 "by default both sides are lower-cased, as sclite does.")] = False,
    optional_deletable: Annotated[bool, typer.Option("--optional-deletable", help="A '(word)' may be left out or "
                                                     "added at no error (sclite -D).")] = False,
    fragments: Annotated[bool, typer.Option("--fragments", help="A fragment 'th-' or '-at' matches a word it begins "
                                            "or ends (sclite -F).")] = False,
    speakers: Annotated[bool, typer.Option("--by-speaker", help="Also print the counts per speaker (sclite's "
                                           "-i spu_id speakers, as in its sum report).")] = False,
) -> None:
    """Word error rate of HYP against REF, utterances matched by id.

    Prints sentences, reference words, correct/substituted/deleted/inserted words (counts and % of reference words), WER and sentence error rate, like sclite's summary, under sclite's transcript conventions (alternations, '@', case folding; see --conventions). Both files must hold the same utterance ids.
    """
    from privasr.metrics.wer import wer

    if aligner not in ("sclite", "jiwer"):
        raise InputError(f"unknown aligner {aligner!r}", expected="sclite or jiwer")
    conv = conventions(conv_name, case_sensitive, optional_deletable, fragments)
    _check_outputs(json_out=json_out)
    refs = normalized(read_transcripts(ref, fmt, role="ref"), normalize, conv, ref)
    hyps = match_ids(refs, normalized(read_transcripts(hyp, fmt), normalize, conv, hyp), ref, hyp)
    r = wer([t.words for t in refs], [t.words for t in hyps], aligner=aligner, conventions=conv)  # type: ignore[arg-type]
    n = r.ref_words
    opts = conv.options() if conv.markup else "plain words"
    table = Table(title=f"WER of {hyp.name} against {ref.name} ({aligner} alignment{', ' + opts if opts else ''})")
    table.add_column("measure")
    table.add_column("count", justify="right")
    table.add_column("% of ref words", justify="right")

    def share(k: int) -> str:
        return f"{100 * k / n:.2f}%" if n else "n/a"

    table.add_row("sentences", f"{r.sentences:,}", "")
    table.add_row("reference words", f"{n:,}", "")
    table.add_row("correct", f"{r.hits:,}", share(r.hits))
    table.add_row("substitutions", f"{r.substitutions:,}", share(r.substitutions))
    table.add_row("deletions", f"{r.deletions:,}", share(r.deletions))
    table.add_row("insertions", f"{r.insertions:,}", share(r.insertions))
    table.add_row("WER", f"{r.errors:,}", _pct(r.wer), style="bold")
    table.add_row("sentence errors", f"{r.sentence_errors:,}", f"{_pct(r.ser)} of sentences")
    print_table(out_console, table)
    per_spk = (by_speaker([t.utt_id for t in refs], r, fold_case=conv.markup and not conv.case_sensitive)
               if speakers or json_out is not None else {})
    if speakers:
        st = Table(title="by speaker (sclite's -i spu_id)")
        for col in ("speaker", "sentences", "words", "correct", "sub", "del", "ins", "WER", "sentence errors"):
            st.add_column(col, justify="left" if col == "speaker" else "right")
        for spk, d in per_spk.items():
            st.add_row(spk, f"{d['sentences']:,}", f"{d['ref_words']:,}", f"{d['hits']:,}", f"{d['substitutions']:,}",
                       f"{d['deletions']:,}", f"{d['insertions']:,}",
                       "n/a" if d["wer"] is None else f"{100 * d['wer']:.2f}%", f"{d['sentence_errors']:,}")
        print_table(out_console, st)
    if json_out is not None:
        write_results(json_out.parent, filename=json_out.name, seed=None, metrics={**r.as_dict(), "speakers": per_spk},
                      config={"command": "score wer", "ref": str(ref), "hyp": str(hyp), "format": fmt,
                              "aligner": aligner, "normalize": normalize, "conventions": conv_name,
                              "case_sensitive": conv.case_sensitive, "optional_deletable": optional_deletable,
                              "fragments": fragments},
                      data={"ref": ref, "hyp": hyp})


def _by_class(refs: Any, a: Any, b: Any, hyp_a: Path, hyp_b: Path) -> Any:
    """Print and return :func:`~privasr.metrics.word_changes.class_changes` over the references' word classes."""
    from privasr.metrics.word_changes import class_changes
    from privasr.text.word_class import WORD_CLASSES, word_classes

    rows = class_changes(refs, a, b, word_classes(refs), WORD_CLASSES)
    table = Table(title=f"by word class of the reference words: A = {hyp_a.name}, B = {hyp_b.name}")
    for col in ("class", "ref words", "errors A", "errors B", "fixed by A", "broken by A", "net (B - A)"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for c in rows:
        table.add_row(c.word_class, f"{c.ref_words:,}", f"{c.errors_a:,}", f"{c.errors_b:,}", f"{c.fixed:,}",
                      f"{c.broken:,}", f"{c.net:+,}")
    print_table(out_console, table)
    return rows


@app.command("compare")
def compare_cmd(
    ref: Annotated[Path, typer.Argument(help="Reference transcripts (trn, Kaldi text, or N-best lists with 'ref').")],
    hyp_a: Annotated[Path, typer.Argument(help="System A, the system being judged: its hypotheses (or N-best lists: "
                                         "their 1-best).")],
    hyp_b: Annotated[Path, typer.Argument(help="System B, the baseline: its hypotheses (or N-best lists: their "
                                         "1-best). Every difference is A minus B.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write DIR/results.json (config, seed, version, metrics).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the bootstrap's random generator.")] = 0,
    resamples: Annotated[int, typer.Option("--resamples", help="Number of bootstrap resamples.")] = 1000,
    confidence: Annotated[float, typer.Option("--confidence", help="Coverage of the bootstrap interval.")] = 0.95,
    min_boundary: Annotated[int, typer.Option("--min-boundary", help="MAPSSWE: consecutive words correct in both "
                                              "systems that bound a segment (sc_stats default 2).")] = 2,
    alpha: Annotated[float, typer.Option("--alpha", help="Significance level of the MAPSSWE decision.")] = 0.05,
    fmt: Annotated[str, typer.Option("--format", "-f", help=_FORMAT_HELP)] = "auto",
    normalize: Annotated[str, typer.Option("--normalize", help=_NORM_HELP)] = "none",
    conv_name: Annotated[str, typer.Option("--conventions", help=_CONV_HELP)] = "sclite",
    case_sensitive: Annotated[bool, typer.Option("--case-sensitive", help="Compare words exactly (sclite -s).")] = False,
    optional_deletable: Annotated[bool, typer.Option("--optional-deletable", help="'(word)' may be left out or "
                                                     "added at no error (sclite -D).")] = False,
    fragments: Annotated[bool, typer.Option("--fragments", help="Fragments match the words they begin or end "
                                            "(sclite -F).")] = False,
    by_class: Annotated[bool, typer.Option("--by-class", help="Also break the difference down by the word class "
                                           "of the reference words (spaCy part-of-speech tags grouped as "
                                           "privasr.text.word_class says; the ner extra): errors of A and B, "
                                           "words A fixed and broke.")] = False,
) -> None:
    """Compare systems A and B on the same utterances (matched by id).

    Aligns both with sclite's alignment, then reports both WERs, NIST's matched-pairs sentence-segment word error test (MAPSSWE, exactly as sc_stats: segments, mean and sd of the per-segment error difference A - B, Z, two-sided p, verdict) and a paired bootstrap confidence interval of WER(A) - WER(B) (Bisani & Ney 2004).

    Speakers for MAPSSWE's segment order are the id text before the first '-' or '_' (sclite's spu_id). With --out, writes DIR/results.json with the configuration, seed, version and all metrics.
    """
    from privasr.corpus.markup import has_markup
    from privasr.metrics.bootstrap import bootstrap_wer_difference
    from privasr.metrics.mapsswe import mapsswe_from_alignments
    from privasr.metrics.sclite import align_sclite
    from privasr.metrics.wer import wer_from_alignments

    if resamples < 1:
        raise InputError(f"--resamples is {resamples}", expected="an integer >= 1")
    if not 0 < confidence < 1:
        raise InputError(f"--confidence is {confidence}", expected="a number in (0, 1)")
    if min_boundary < 1:
        raise InputError(f"--min-boundary is {min_boundary}", expected="an integer >= 1")
    if not 0 < alpha < 1:
        raise InputError(f"--alpha is {alpha}", expected="a number in (0, 1)")
    conv = conventions(conv_name, case_sensitive, optional_deletable, fragments)
    _check_outputs(out_dir=out)
    refs = normalized(read_transcripts(ref, fmt, role="ref"), normalize, conv, ref)
    a = match_ids(refs, normalized(read_transcripts(hyp_a, fmt), normalize, conv, hyp_a), ref, hyp_a)
    b = match_ids(refs, normalized(read_transcripts(hyp_b, fmt), normalize, conv, hyp_b), ref, hyp_b)
    rw = [t.words for t in refs]
    ali_a = align_sclite(rw, [t.words for t in a], conv)
    ali_b = align_sclite(rw, [t.words for t in b], conv)
    wa, wb = wer_from_alignments(ali_a), wer_from_alignments(ali_b)
    branches = conv.markup and any(has_markup(w) for w in rw)  # each system may take another branch
    mp = mapsswe_from_alignments(ali_a, ali_b, [t.utt_id for t in refs], min_boundary=min_boundary, alpha=alpha,
                                 same_references=not branches)
    bs = bootstrap_wer_difference(wa, wb, resamples=resamples, confidence=confidence, seed=seed,
                                  same_references=not branches)

    verdict = {"A": f"A ({hyp_a.name}) is better", "B": f"B ({hyp_b.name}) is better",
               "same": "no significant difference"}[mp.better]
    table = Table(title=f"A = {hyp_a} (system)  vs  B = {hyp_b} (baseline); reference {ref}, {len(refs):,} utterances")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("WER A", f"{_pct(wa.wer)}  ({wa.errors:,} / {wa.ref_words:,})")
    table.add_row("WER B", f"{_pct(wb.wer)}  ({wb.errors:,} / {wb.ref_words:,})")
    table.add_row("MAPSSWE segments", f"{mp.n:,}  ({mp.segments_per_sentence:.3f} per sentence)")
    table.add_row("MAPSSWE segment errors A / B", f"{mp.errors_a:,} / {mp.errors_b:,} in {mp.ref_words:,} ref words")
    table.add_row("MAPSSWE mean d (A - B)", f"{mp.mean:.3f}")
    table.add_row("MAPSSWE sd d", f"{mp.sd:.3f}")
    table.add_row("MAPSSWE Z", f"{mp.z:.3f}")
    table.add_row("MAPSSWE p (two-sided)", f"{mp.p:.3g}" if mp.p > 0 else f"10^{mp.log10_p:.1f}")
    table.add_row(f"MAPSSWE verdict (alpha {alpha:g})", verdict, style="bold")
    table.add_row(f"WER(A: {hyp_a.name}) - WER(B: {hyp_b.name})", f"{100 * bs.difference:+.2f} points")
    table.add_row(f"bootstrap {100 * confidence:g}% CI of WER(A) - WER(B) ({resamples:,} resamples)",
                  f"[{100 * bs.ci_low:+.2f}, {100 * bs.ci_high:+.2f}] points")
    table.add_row("P(A better) over resamples", f"{bs.prob_a_better:.3f}")
    print_table(out_console, table)
    classes = _by_class(rw, [t.words for t in a], [t.words for t in b], hyp_a, hyp_b) if by_class else None
    if out is not None:
        config = {"ref": str(ref), "hyp_a": str(hyp_a), "hyp_b": str(hyp_b), "format": fmt, "aligner": "sclite", "normalize": normalize,
                  "conventions": conv_name, "case_sensitive": conv.case_sensitive,
                  "optional_deletable": optional_deletable, "fragments": fragments,
                  "min_boundary": min_boundary, "alpha": alpha, "resamples": resamples, "confidence": confidence}
        metrics = {
            "utterances": len(refs),
            "wer_a": _num(wa.wer), "wer_b": _num(wb.wer),
            "counts_a": wa.as_dict(), "counts_b": wb.as_dict(),
            "mapsswe_n": mp.n, "mapsswe_ref_words": mp.ref_words, "mapsswe_errors_a": mp.errors_a,
            "mapsswe_errors_b": mp.errors_b, "mapsswe_mean": mp.mean, "mapsswe_sd": mp.sd, "mapsswe_z": mp.z,
            "mapsswe_p": mp.p, "mapsswe_log10_p": mp.log10_p, "mapsswe_better": mp.better,
            "bootstrap_difference": _num(bs.difference), "bootstrap_ci_low": _num(bs.ci_low),
            "bootstrap_ci_high": _num(bs.ci_high), "bootstrap_prob_a_better": bs.prob_a_better,
        }
        if classes is not None:
            config["by_class"] = "privasr.text.word_class (spaCy en_core_web_sm POS)"
            metrics["by_class"] = [c.to_dict() for c in classes]
        write_results(out, config=config, seed=seed, metrics=metrics,
                      data={"ref": ref, "hyp_a": hyp_a, "hyp_b": hyp_b})
