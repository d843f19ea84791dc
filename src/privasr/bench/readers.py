"""Reader and writer throughput against the cost of merely parsing the same bytes.

Every reader must at least decompress its file and parse each JSON line; that is the baseline,
measured in the same run on the same file (``json.loads`` of every line of the decompressed text).
The ratios say what the validation and record building cost on top of it:

* ``ami_tts_read_vs_json_ratio``: :func:`read_ami_tts` on ``ami-tts-nbest/test.jsonl.xz`` (1,954 utterances,
  19,540 hypotheses) over decompress + ``json.loads`` of every line (only when ``../shared`` is present);
* ``canonical_read_vs_json_ratio``: :func:`read_nbest` on the canonical JSON Lines of the same records (or
  of the synthetic ``medium`` corpus when ``../shared`` is absent) over ``json.loads`` of every line;
* ``canonical_write_vs_json_ratio``: :func:`write_nbest` over ``json.dumps`` of the same objects;
* ``hyps_per_s_read``: absolute canonical reading speed, for scale.
"""

from __future__ import annotations

import json
import lzma
import tempfile
from pathlib import Path
from typing import Any

from privasr.bench import best_of
from privasr.corpus.formats.ami_tts import read_ami_tts
from privasr.corpus.formats.nbest_jsonl import nbest_to_json, read_nbest, write_nbest
from privasr.paths import data_dir
from privasr.results import write_results

__all__ = ["run"]


def _json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    repeats = 1 if quick else 3
    metrics: dict[str, Any] = {}
    source = data_dir() / "ami-tts-nbest" / "test.jsonl.xz" if data_dir() is not None else None
    if source is not None and source.is_file():
        t_ours, records = best_of(lambda: read_ami_tts(source), repeats)
        t_base, _ = best_of(lambda: _json_lines(lzma.open(source, "rt", encoding="utf-8").read()), repeats)
        metrics.update(ami_tts_read_s=t_ours, ami_tts_json_s=t_base, ami_tts_read_vs_json_ratio=t_ours / t_base)
        data = "ami-tts-nbest/test.jsonl.xz"
    else:
        from privasr.synth import SynthConfig, generate

        corpus = generate(SynthConfig.preset("tiny" if quick else "medium", seed=seed))
        records = list(corpus.dev) + list(corpus.test)
        data = "synthetic corpus (ami-tts-nbest absent)"
    n_hyps = sum(len(r) for r in records)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nbest.jsonl"
        objs = [nbest_to_json(r) for r in records]
        t_write, _ = best_of(lambda: write_nbest(path, records), repeats)

        def dump() -> None:
            with open(Path(tmp) / "plain.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps(o, ensure_ascii=False) + "\n" for o in objs)

        t_dump, _ = best_of(dump, repeats)
        t_read, back = best_of(lambda: read_nbest(path), repeats)
        t_parse, _ = best_of(lambda: _json_lines(path.read_text(encoding="utf-8")), repeats)
        assert back == list(records), "canonical round trip changed the records"
    metrics.update(
        utterances=len(records), hypotheses=n_hyps,
        canonical_read_s=t_read, canonical_json_s=t_parse, canonical_read_vs_json_ratio=t_read / t_parse,
        canonical_write_s=t_write, canonical_dump_s=t_dump, canonical_write_vs_json_ratio=t_write / t_dump,
        hyps_per_s_read=n_hyps / t_read,
    )
    write_results(out, config={"benchmark": "readers", "data": data, "repeats": repeats}, seed=seed, metrics=metrics)
    return metrics
