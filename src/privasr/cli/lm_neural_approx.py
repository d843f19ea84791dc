"""``privasr lm approx-ngram``: an n-gram (ARPA) approximation of a neural LM (paper 003, section 2.4).

:func:`register` adds the command to the ``privasr lm`` typer app. Without ``--base`` the n-gram set is the
text's n-grams (``--order``; plus ``--topk`` neural next-word candidates per history occurrence); with
``--base`` it is that model's set and only the probabilities are replaced
(:mod:`privasr.lm.neural.approx`). Either way the backoff weights are recomputed so that every history sums
to 1, and the file loads in KenLM and SRILM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from privasr.cli._console import make_console
from privasr.errors import InputError

__all__ = ["register"]

out_console = make_console()
err_console = make_console(stderr=True)


def register(app: typer.Typer) -> None:
    """Add ``approx-ngram`` to ``app`` (the ``privasr lm`` group)."""

    @app.command("approx-ngram")
    def approx_ngram(
        checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Neural LM checkpoint (privasr lm "
                                                 "train-neural).")],
        text: Annotated[str, typer.Option("--text", help="Corpus whose n-grams and histories are used: a text "
                                          "file (one sentence per line, .gz/.xz ok) or a source name of "
                                          "privasr.corpus.sources (ami-train, gutenberg, ...).")],
        arpa: Annotated[Path, typer.Option("--arpa", help="Output ARPA file (compressed by suffix).")],
        order: Annotated[int, typer.Option("--order", "-o", help="N-gram order (ignored with --base).")] = 3,
        base: Annotated[Path | None, typer.Option("--base", help="Keep this ARPA model's n-gram set and "
                                                  "vocabulary, overwrite its probabilities.")] = None,
        topk: Annotated[int, typer.Option("--topk", help="Also list the k most probable neural next words after "
                                          "each history occurrence (not with --base).")] = 0,
        batch_tokens: Annotated[int, typer.Option("--batch-tokens", help="Input tokens per forward pass.")]
        = 4096,
        device: Annotated[str, typer.Option("--device", help="torch device.")] = "cpu",
        json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
        results: Annotated[Path | None, typer.Option("--results", help="Also write results.json to this file "
                                                     "(the options, version, the inputs' fingerprints, the "
                                                     "summary).")] = None,
    ) -> None:
        """Approximate a neural LM by a normalised backoff n-gram model and write it as ARPA."""
        from privasr.corpus.sources import TEXT_SOURCES, load_text
        from privasr.lm.neural.approx import ApproxStats, ModelSource, approximate_ngram, overwrite_ngram
        from privasr.lm.neural.checkpoint import load_checkpoint
        from privasr.lm.ngram.arpa import read_arpa, write_arpa
        from privasr.outputs import check_output_file

        for target in (arpa, results):
            if target is not None:
                check_output_file(target)
        if base is not None and topk:
            raise InputError("--topk with --base", expected="one of them: --base keeps the base n-gram set")
        if text not in TEXT_SOURCES and not Path(text).is_file():
            raise InputError("no such text file or text source", path=Path(text),
                             expected=f"a file or one of {', '.join(sorted(TEXT_SOURCES))}")
        ck = load_checkpoint(checkpoint, map_location=device)
        source = ModelSource(ck.model, ck.vocab, batch_tokens=batch_tokens, device=device)
        sents = load_text(text)
        stats = ApproxStats()
        if base is not None:
            model = overwrite_ngram(source, read_arpa(base), sents, stats=stats)
        else:
            model = approximate_ngram(source, sents, order, topk=topk, stats=stats)
        write_arpa(model, arpa)
        summary = {"arpa": str(arpa), "order": model.order, "ngrams": list(stats.ngrams),
                   "sentences": stats.sentences, "positions": stats.positions, "topk_added": list(stats.topk_added),
                   "kept_base": stats.kept_base, "neural_s": round(stats.neural_s, 3),
                   "total_s": round(stats.total_s, 3)}
        if results is not None:
            from privasr.results import write_results

            write_results(results.parent, filename=results.name, seed=None, metrics=summary,
                          config={"command": "lm approx-ngram", "checkpoint": str(checkpoint), "text": text,
                                  "arpa": str(arpa), "order": order, "base": None if base is None else str(base),
                                  "topk": topk, "batch_tokens": batch_tokens, "device": device},
                          data={"checkpoint": checkpoint, **({"text": Path(text)} if Path(text).is_file() else {}),
                                **({"base": base} if base is not None else {})})
        if json_out:
            print(json.dumps(summary))
        else:
            ng = ", ".join(f"{x:,}" for x in stats.ngrams)
            out_console.print(f"approximated {checkpoint} on {stats.sentences:,} sentences "
                              f"({stats.positions:,} positions): order {model.order}, n-grams [{ng}] -> {arpa} "
                              f"({stats.total_s:.1f} s, neural {stats.neural_s:.1f} s)")
