"""Speed of building a TTS N-best set: decode seconds per audio second, and 2 processes against 1.

Data: the first ``utterances`` (24; ``--quick``: 6) AMI dev turns of 4-25 words after the ``ami`` normaliser
(``../shared/data/ami-transcripts``), decoded with the shared set's generic trigram
(``ami-tts-nbest/lm/generic_3gram.arpa.xz``); without the shared data, sentences of the synthetic corpus's
background text and pocketsphinx's own en-us LM. The acoustic model is pocketsphinx's stock en-us (adapting
is a one-off cost, timed once as ``adapt_s`` over ``adapt_sentences`` sentences of the same source when not
``--quick``).

:func:`privasr.asr.tts_nbest.build_tts_nbest` runs the same utterances with ``jobs=1`` and ``jobs=2``, each in
a fresh folder (no cache). Reported:

* ``decode_s_per_audio_s``: pocketsphinx's search time per second of audio (one process; real-time factor of
  the decoder alone); ``cpu_s_per_audio_s``: all per-utterance work (synthesis, decoding, A* N-best, lattice
  scoring) per audio second; ``stage_share_*``: each stage's part of that work;
* ``utterances_per_s_1``, ``utterances_per_s_2`` and ``speedup_2_vs_1`` (their ratio; 2 is the limit on two
  free cores, ``fraction_of_ideal`` = speed-up / min(2, cores));
* ``same_output_1_vs_2``: the two runs wrote identical N-best lists (the benchmark fails otherwise).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from privasr.paths import data_dir
from privasr.results import write_results

__all__ = ["run", "UTTERANCES", "QUICK_UTTERANCES"]

UTTERANCES = 24
QUICK_UTTERANCES = 6


def _inputs(n: int, seed: int) -> tuple[str, list[Any], Path | None, Path | None]:
    from privasr.corpus.records import Transcript

    d = data_dir()
    if d is not None and (d / "ami-transcripts").is_dir() and (d / "ami-tts-nbest" / "lm").is_dir():
        from privasr.asr.adapt import dictionary_words
        from privasr.asr.decode import default_model
        from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
        from privasr.text.normalize import Normalizer

        norm = Normalizer.preset("ami", vocabulary=dictionary_words(default_model()["dict"]))
        recs = []
        for t in read_ami_hmnet(d / "ami-transcripts" / "AMI_proprec" / "dev"):
            w = norm(t.words)
            if 4 <= len(w) <= 25:
                recs.append(Transcript(t.utt_id, w, client=t.client, speaker=t.speaker, order=t.order))
            if len(recs) >= n:
                break
        return ("ami dev transcripts, generic trigram", recs, d / "ami-tts-nbest" / "lm" / "generic_3gram.arpa.xz",
                d / "ami-transcripts")
    from privasr.synth import SynthConfig, generate

    corpus = generate(SynthConfig.preset("tiny", seed=seed))
    recs = [Transcript(f"s{i}", tuple(s), speaker=f"spk{i % 4}") for i, s in enumerate(corpus.background[:n])]
    return "synthetic corpus background text, pocketsphinx en-us LM", recs, None, None


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    from privasr.asr.tts_nbest import TtsSettings, build_tts_nbest, expand_lm

    n = QUICK_UTTERANCES if quick else UTTERANCES
    source, recs, lm_src, _ = _inputs(n, seed)
    settings = TtsSettings(seed=seed)
    metrics: dict[str, Any] = {"utterances": len(recs), "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="privasr-bench-tts-") as tmp:
        root = Path(tmp)
        lm = expand_lm(lm_src, root)
        runs = {}
        for jobs in (1, 2):
            t0 = time.perf_counter()
            res = build_tts_nbest(recs, root / f"jobs{jobs}", lm=lm, settings=settings, jobs=jobs)
            runs[jobs] = (time.perf_counter() - t0, res)
        wall1, r1 = runs[1]
        wall2, r2 = runs[2]
        if r1.records != r2.records:
            raise AssertionError("1 and 2 processes wrote different N-best lists")
        audio = r1.audio_s
        stages: dict[str, float] = {}
        for t in r1.timing.values():
            for k, v in t.items():
                stages[k] = stages.get(k, 0.0) + v
        busy = sum(stages.values())
        metrics.update(
            audio_s=audio,
            decode_s_per_audio_s=stages.get("decode", 0.0) / audio,
            cpu_s_per_audio_s=busy / audio,
            **{f"stage_share_{k}": v / busy for k, v in sorted(stages.items())},
            wall_s_1=wall1,
            wall_s_2=wall2,
            utterances_per_s_1=len(recs) / wall1,
            utterances_per_s_2=len(recs) / wall2,
            speedup_2_vs_1=wall1 / wall2,
            fraction_of_ideal=(wall1 / wall2) / min(2, os.cpu_count() or 1),
            same_output_1_vs_2=True,
        )
        if not quick and lm_src is not None:
            from privasr.asr.tts_nbest import AdaptationSpec, build_adapted_model, select_adaptation_sentences
            from privasr.corpus.sources import earnings21_sentences

            spec = AdaptationSpec(sentences=50, pool=100)
            from privasr.asr.adapt import dictionary_words
            from privasr.asr.decode import default_model

            sents = select_adaptation_sentences(earnings21_sentences(data_dir()),
                                                dictionary_words(default_model()["dict"]), spec, seed=seed)
            t0 = time.perf_counter()
            model = build_adapted_model(sents, root / "model", settings=settings)
            metrics.update(adapt_s=time.perf_counter() - t0, adapt_sentences=len(sents),
                           adapt_audio_s=model.audio_s,
                           adapt_s_per_audio_s=(time.perf_counter() - t0) / model.audio_s)
    write_results(out, config={"benchmark": "tts-nbest", "quick": quick, "source": source,
                               "settings": settings.as_dict()}, seed=seed, metrics=metrics)
    return metrics
