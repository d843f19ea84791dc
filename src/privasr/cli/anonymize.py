"""``privasr anonymize``: rewrite a corpus's named entities (paper 003 privacy transformations).

``privasr anonymize SRC DST [--mode surrogate|tag|redact] [--entities detect|gold] [--detector SPEC] [--seed N]``
reads any supported transcript or N-best corpus (format detected, or ``--from``), finds the entities with
the NER (``--detector``, alias ``--ner``, default ``finetuned``: the model for ASR-style text, trained once
into the user cache; see :func:`privasr.anon.ner_model.load_detector`; ``stock`` prints a warning) or takes
the corpus's own annotations
(``--entities gold``: CoNLL, Earnings-21), rewrites them (:func:`privasr.anon.apply.anonymize_records`) and
writes the result in ``--to`` format (canonical JSON Lines by default). The input is never written to. A
summary with counts only (no words) goes to ``DST.results.json`` (``DST/results.json`` for a folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.text import Text

from privasr import progress
from privasr.cli._console import make_console

__all__ = ["anonymize", "STOCK_WARNING"]

STOCK_WARNING = ("detector 'stock' (spaCy en_core_web_sm + patterns) learnt its entities from cased, punctuated "
                 "text and misses most names and organisations in lower-case ASR transcripts (docs/anonymisation.md); "
                 "the default --detector finetuned is trained for them")


def anonymize(
    src: Path = typer.Argument(..., help="Input corpus file or folder (transcripts or N-best lists)."),
    dst: Path = typer.Argument(..., help="Output file (one set) or folder (several sets)."),
    mode: str = typer.Option("surrogate", "--mode", help="surrogate (same-type random words, consistent per "
                                                          "client), tag (<PER>, <ORG>, <LOC>, <MISC>) or redact."),
    entities: str = typer.Option("detect", "--entities", help="detect (run the NER) or gold (the corpus's own "
                                                               "entity annotations)."),
    ner: str = typer.Option("finetuned", "--detector", "--ner", help=(
        "NER to detect with: finetuned (the default: the project's model for lower-case ASR-style text, trained "
        "once on first use, about 10 minutes, and cached in $PRIVASR_CACHE or ~/.cache/privasr), stock (spaCy "
        "en_core_web_sm + patterns: weaker on lower-case ASR text, says so), patterns, or a model folder from "
        "privasr anon train-ner.")),
    seed: int = typer.Option(0, "--seed", help="Seed of the surrogate draws."),
    fmt: str = typer.Option(None, "--from", help="Input format (detected when omitted)."),
    to: str = typer.Option("jsonl", "--to", help="Output format: jsonl or any format with a writer."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing output files."),
) -> None:
    """Anonymise the named entities of a corpus (surrogates, class tags or redaction)."""
    from privasr.anon.apply import anonymize_records
    from privasr.anon.transform import Anonymizer
    from privasr.cli.data import output_targets
    from privasr.cli.rescore import _command_line
    from privasr.corpus.load import Dataset, load_path, write_dataset
    from privasr.results import write_results

    anonymizer = Anonymizer(mode, seed)
    datasets = load_path(src, fmt)
    targets = output_targets(datasets, src, dst, to, force)
    detector = None
    if entities == "detect":
        from privasr.anon.ner_model import load_detector

        if ner == "stock":
            make_console(stderr=True).print(Text.assemble(("warning: ", "bold yellow"), STOCK_WARNING),
                                       highlight=False, soft_wrap=True)
        with progress.task(f"loading the NER ({ner})", transient=True):
            detector = load_detector(ner)
    summary: dict[str, Any] = {}
    for d, target in targets:
        with progress.task(f"anonymising {d.name}", transient=True):
            records, stats = anonymize_records(list(d.records), anonymizer, detector, entities=entities)
        out = Dataset(d.name, d.kind, d.fmt, tuple(records))
        target.parent.mkdir(parents=True, exist_ok=True)
        n = write_dataset(out, target, to)
        summary[d.name] = stats.to_dict()
        mentions = ", ".join(f"{k} {v:,}" for k, v in sorted(stats.mentions.items())) or "none"
        make_console().print(f"{d.name}: {n:,} records -> {target}; entities rewritten: {mentions} "
                        f"({stats.words_changed:,} of {stats.words_in:,} words changed)")
    report_dir, name = (dst, "results.json") if dst.is_dir() else (dst.parent, dst.name + ".results.json")
    write_results(report_dir, filename=name, seed=seed,
                  config={"mode": mode, "entities": entities, "ner": ner if entities == "detect" else None,
                          "from": fmt, "to": to, "src": str(src), "dst": str(dst)},
                  metrics={"sets": summary}, extra={"argv": _command_line()})
