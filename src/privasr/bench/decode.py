"""First-pass decoding speed: Whisper (CTranslate2, :mod:`privasr.asr.whisper`) against pocketsphinx
(:mod:`privasr.asr.decode`) on the same audio, with 1 and 2 worker processes.

Audio: sentences spoken by espeak-ng (:func:`privasr.asr.tts.synthesize`, four speakers' voices as the TTS
testbeds make them): AMI test transcripts' utterances of 6-30 words when the shared data is there, else seeded
sentences of Faker words (``--quick``: 8 utterances, else 40). Each engine decodes every file with its default
model (pocketsphinx: the bundled en-us model and LM, 10-best; Whisper: tiny.en int8, beam 10, 10 hypotheses,
batches of 8) in 1 process, then in 2 (the files dealt round-robin, each process with its own decoder and one
thread). Figures:

* ``<engine>_cpu_per_audio_s_<n>p``: the workers' CPU seconds (``time.process_time`` inside each) per second of
  audio -- the cost of decoding, whatever the parallelism;
* ``<engine>_wall_per_audio_s_<n>p``: wall seconds per audio second (the real-time factor of the run);
* ``whisper_vs_pocketsphinx_cpu`` = Whisper's CPU per audio second / pocketsphinx's (1 process): the
  headline ratio; ``<engine>_speedup_2p`` = wall time with 1 process / with 2.

Model loading is outside the timings.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from privasr.results import write_results

__all__ = ["run", "QUICK_UTTERANCES", "UTTERANCES"]

QUICK_UTTERANCES = 8
UTTERANCES = 40


def _sentences(n: int, seed: int) -> tuple[str, list[tuple[str, str]]]:
    """(description, [(speaker, text)])."""
    from privasr.paths import data_dir

    d = data_dir()
    if d is not None and (d / "ami-transcripts").is_dir():
        from privasr.corpus.sources import ami_sentences

        recs = [s for s in ami_sentences("test", d) if 6 <= len(s) <= 30]
        pick = np.random.default_rng(seed).choice(len(recs), size=min(n, len(recs)), replace=False)
        return "AMI test utterances (6-30 words)", [(f"s{k % 4}", " ".join(recs[i])) for k, i in enumerate(pick)]
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(seed)
    return "Faker sentences", [(f"s{k % 4}", fake.sentence(nb_words=12)) for k in range(n)]


def _work(task: tuple[str, list[str], dict[str, Any]]) -> tuple[float, float]:
    """Decode ``files`` with one engine in this process; (CPU seconds, wall seconds) of the decoding."""
    engine, files, kw = task
    if engine == "whisper":
        from privasr.asr.whisper import WhisperDecoder

        dec: Any = WhisperDecoder(**kw)
        run = lambda: dec.decode_files(files)  # noqa: E731
    else:
        from privasr.asr.decode import Decoder, decode_files

        ps = Decoder(**kw)
        run = lambda: decode_files(files, decoder=ps)  # noqa: E731
    c0, t0 = time.process_time(), time.perf_counter()
    run()
    return time.process_time() - c0, time.perf_counter() - t0


def _timed(engine: str, files: list[str], procs: int, kw: dict[str, Any]) -> tuple[float, float]:
    """(CPU seconds summed over the workers, wall seconds) of decoding ``files`` in ``procs`` processes."""
    chunks = [files[i::procs] for i in range(procs) if files[i::procs]]
    with ProcessPoolExecutor(max_workers=procs) as ex:
        t0 = time.perf_counter()
        parts = list(ex.map(_work, [(engine, c, kw) for c in chunks]))
        wall = time.perf_counter() - t0
    return sum(c for c, _ in parts), max(w for _, w in parts) if procs > 1 else wall


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    from privasr.asr.decode import SAMPLE_RATE, read_audio
    from privasr.asr.tts import speaker_voice, synthesize
    from privasr.asr.whisper import WhisperDecoder

    out = Path(out)
    wav_dir = out / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    desc, sents = _sentences(QUICK_UTTERANCES if quick else UTTERANCES, seed)
    import soundfile as sf

    files = []
    for k, (spk, text) in enumerate(sents):
        f = wav_dir / f"u{k:03d}.wav"
        if not f.is_file():
            sf.write(f, synthesize(text, speaker_voice(spk), noise_seed=seed + k), SAMPLE_RATE, subtype="PCM_16")
        files.append(str(f))
    audio_s = sum(len(read_audio(f)) for f in files) / SAMPLE_RATE
    engines = {"pocketsphinx": {"nbest": 10}, "whisper": {"threads": 1}}
    WhisperDecoder(threads=1)  # fail early (and load the model files once) if the extra is missing
    metrics: dict[str, Any] = {"utterances": len(files), "audio_s": audio_s}
    for engine, kw in engines.items():
        _timed(engine, files[:2], 1, kw)  # warm the page cache and the imports
        for procs in (1, 2):
            cpu, wall = _timed(engine, files, procs, kw)
            metrics[f"{engine}_cpu_per_audio_s_{procs}p"] = cpu / audio_s
            metrics[f"{engine}_wall_per_audio_s_{procs}p"] = wall / audio_s
        metrics[f"{engine}_speedup_2p"] = metrics[f"{engine}_wall_per_audio_s_1p"] / metrics[
            f"{engine}_wall_per_audio_s_2p"]
    metrics["whisper_vs_pocketsphinx_cpu"] = metrics["whisper_cpu_per_audio_s_1p"] / metrics[
        "pocketsphinx_cpu_per_audio_s_1p"]
    write_results(out, runner="bench-decode", config={"audio": desc, "quick": quick, "engines": engines,
                                                      "whisper": "tiny.en int8, beam 10, 10 hypotheses, batch 8",
                                                      "pocketsphinx": "bundled en-us, 10-best"},
                  seed=seed, metrics=metrics)
    return metrics
