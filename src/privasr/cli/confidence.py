"""``privasr confidence``: train a calibrated word-confidence classifier on N-best lists, and apply it.

``privasr confidence train --nbest DEV.jsonl --out DIR`` holds out a seeded share of the utterances as a
test split, trains :class:`~privasr.confidence.model.ConfidenceModel` (classifier + isotonic calibration on
its own held-out share) on the rest, and writes ``DIR/results.json`` (``ece``, ``auc``, ``nce``, Brier
score and the reliability curve on the test split, calibrated and raw), ``DIR/reliability.csv`` and the
model ``DIR/model.npz``; ``--exclude decoder_confidence`` (any feature, repeatable) trains without a
feature, to measure what it adds. When the lists carry their own word confidences (a decoder's lattice word
posteriors), ``results.json`` also reports those as they are (``data_confidence``: AUC, ECE, NCE on the same
test split). ``privasr confidence apply --model DIR --nbest F --out F.jsonl`` writes the N-best
lists back with the model's confidences on each 1-best.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privasr.cli._console import make_console, print_table
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel

__all__ = ["app", "train_cmd", "apply_cmd", "MODEL_FILE"]

app = typer.Typer(help="Word confidences: train a calibrated confidence classifier on N-best lists, apply it.",
                  no_args_is_help=True)
out_console = make_console()

MODEL_FILE = "model.npz"
"""The model's file name inside a ``train`` output folder."""

_FORMAT_HELP = "Input format (default: detected from the content), e.g. nbest-jsonl or ami-tts."
_LM_HELP = ("ARPA language model for the lm_logprob feature (a model trained with one needs the same one to "
            "be applied).")


def _load_nbest(path: Path, fmt: str | None) -> list[NBest]:
    from privasr.corpus.load import load_nbest

    return load_nbest(path, fmt)


def _load_lm(path: Path | None) -> LanguageModel | None:
    if path is None:
        return None
    from privasr.lm.ngram.arpa import read_arpa

    return read_arpa(path)


def _fmt(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "n/a"


@app.command("train")
def train_cmd(
    nbest: Annotated[Path, typer.Option("--nbest", help="N-best lists with references (any N-best format).")],
    out: Annotated[Path, typer.Option("--out", help="Output folder: results.json, reliability.csv, model.npz.")],
    kind: Annotated[str, typer.Option("--kind", help="Classifier: 'gbm' (gradient-boosted trees) or 'mlp' "
                                      "(small feed-forward network).")] = "gbm",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the test split, the calibration split and the "
                                      "classifier.")] = 0,
    test_fraction: Annotated[float, typer.Option("--test-fraction", help="Share of the utterances held out "
                                                 "to report ECE/AUC on.")] = 0.2,
    calibration_fraction: Annotated[float, typer.Option("--calibration-fraction", help="Share of the training "
                                                        "utterances held out to fit the isotonic calibration.")] = 0.2,
    lm: Annotated[Path | None, typer.Option("--lm", help=_LM_HELP)] = None,
    bins: Annotated[int, typer.Option("--bins", help="Equal-width bins of the ECE and reliability curve.")] = 15,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help=_FORMAT_HELP)] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="A feature to leave out (repeatable), "
                                                      "e.g. decoder_confidence.")] = None,
) -> None:
    """Train a calibrated word-confidence classifier and report its calibration and AUC on a held-out split.

    Utterances (not words) are split, seeded: a test share for the report, and of the rest a calibration share for the isotonic regression; the classifier learns from the remainder. 1-best words are labelled correct when sclite's alignment against the reference marks them a hit.
    """
    from privasr.confidence.features import features_without
    from privasr.confidence.model import ConfidenceModel, ConfidenceReport
    from privasr.results import write_results

    _check_options(kind, test_fraction, calibration_fraction, seed, bins)
    features = list(features_without(exclude or (), "--exclude"))
    test, train = _split(_load_nbest(nbest, fmt), test_fraction, seed, nbest)
    language_model = _load_lm(lm)
    try:
        model = ConfidenceModel.fit(train, language_model, kind=kind, seed=seed,
                                    calibration_fraction=calibration_fraction, features=features)
    except InputError as e:
        raise e.at(nbest) from None
    report = model.evaluate(test, language_model, bins=bins)
    raw = model.evaluate(test, language_model, calibrated=False, bins=bins)
    out.mkdir(parents=True, exist_ok=True)
    model.save(out / MODEL_FILE)
    report.reliability.write_csv(out / "reliability.csv")
    metrics = {
        **report.as_dict(),
        **{f"{k}_uncalibrated": v for k, v in raw.as_dict().items() if k in ("auc", "ece", "nce", "brier",
                                                                                  "mean_confidence",
                                                                                  "wrong_weight_share")},
        "n_test_utterances": len(test),
        "n_train_utterances": model.info["n_train_utterances"],
        "n_train_words": model.info["n_train_words"],
        "n_calibration_utterances": model.info["n_calibration_utterances"],
        "n_calibration_words": model.info["n_calibration_words"],
        "reliability": report.reliability.as_dict(),
        "reliability_uncalibrated": raw.reliability.as_dict(),
    }
    own = ConfidenceReport.of_data(test, bins=bins)
    if own is not None:
        metrics["data_confidence"] = {k: v for k, v in own.as_dict().items() if k != "reliability"}
    config = {"nbest": str(nbest), "format": fmt, "kind": kind, "test_fraction": test_fraction,
              "features": features,
              "calibration_fraction": calibration_fraction, "lm": None if lm is None else str(lm), "bins": bins,
              "params": model.info["params"], "posterior_scale": model.posterior_scale}
    data = {"nbest": nbest, **({"lm": lm} if lm is not None else {})}
    write_results(out, config=config, seed=seed, metrics=metrics, data=data,
                  extra={"model": {"path": str(out / MODEL_FILE), "info": model.info}})
    _print_report(kind, nbest, report, raw, own)
    out_console.print(f"[bold]results:[/] {out / 'results.json'}  [bold]model:[/] {out / MODEL_FILE}")


def _check_options(kind: str, test_fraction: float, calibration_fraction: float, seed: int, bins: int) -> None:
    from privasr.confidence.model import KINDS

    if kind not in KINDS:
        raise ConfigError(f"unknown --kind {kind!r}", expected=" or ".join(KINDS))
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"--test-fraction is {test_fraction}", expected="a number in (0, 1)")
    if not 0.0 < calibration_fraction < 1.0:
        raise ConfigError(f"--calibration-fraction is {calibration_fraction}", expected="a number in (0, 1)")
    if seed < 0:
        raise ConfigError(f"--seed is {seed}", expected="an integer >= 0")
    if bins < 1:
        raise ConfigError(f"--bins is {bins}", expected="an integer >= 1")


def _split(records: list[NBest], test_fraction: float, seed: int, path: Path) -> tuple[list[NBest], list[NBest]]:
    """(test, train): a seeded share of the utterances (every one with a reference) held out for the report."""
    import numpy as np

    missing = [r.utt_id for r in records if r.ref is None]
    if missing:
        raise InputError(f"{len(missing)} utterance(s) have no reference (e.g. {', '.join(missing[:3])})",
                         path=path, expected="references on every utterance to train and evaluate")
    n = len(records)
    n_test = max(1, round(test_fraction * n))
    if n - n_test < 2:
        raise InputError(f"{n} utterance(s) leave {n - n_test} for training", path=path,
                         expected="enough utterances for a test, a calibration and a training split")
    perm = np.random.default_rng([seed, 2]).permutation(n)
    test_idx = set(perm[:n_test].tolist())
    return ([r for i, r in enumerate(records) if i in test_idx],
            [r for i, r in enumerate(records) if i not in test_idx])


def _print_report(kind: str, nbest: Path, report: Any, raw: Any, own: Any = None) -> None:
    """The test split's measures, calibrated and raw (and the data's own confidences, if any), as a table."""
    table = Table(title=f"{kind} confidence classifier, test split of {nbest.name} ({report.n_utterances:,} "
                        f"utterances, {report.n_words:,} words)")
    table.add_column("measure")
    table.add_column("calibrated", justify="right")
    table.add_column("raw", justify="right")
    if own is not None:
        table.add_column("the data's own", justify="right")
    for name in ("auc", "ece", "nce", "brier", "mean_confidence", "wrong_weight_share"):
        row = [_fmt(getattr(report, name)), _fmt(getattr(raw, name))]
        table.add_row(name.upper() if len(name) <= 5 else name, *row,
                      *([_fmt(getattr(own, name))] if own is not None else []))
    table.add_row("base rate (correct words)", _fmt(report.base_rate), "")
    print_table(out_console, table)

@app.command("apply")
def apply_cmd(
    model: Annotated[Path, typer.Option("--model", help="A 'train' output folder (its model.npz) or a model file.")],
    nbest: Annotated[Path, typer.Option("--nbest", help="N-best lists (references not needed).")],
    out: Annotated[Path, typer.Option("--out", help="Output N-best JSON Lines (.jsonl, .jsonl.gz, .jsonl.xz).")],
    lm: Annotated[Path | None, typer.Option("--lm", help=_LM_HELP)] = None,
    fmt: Annotated[str | None, typer.Option("--format", "-f", help=_FORMAT_HELP)] = None,
) -> None:
    """Write the N-best lists with the model's calibrated confidences on every 1-best word.

    Other hypotheses and all other fields are kept; confidences already on a 1-best are replaced.
    """
    from privasr.confidence.model import ConfidenceModel
    from privasr.corpus.formats.nbest_jsonl import write_nbest

    path = model / MODEL_FILE if model.is_dir() else model
    m = ConfidenceModel.load(path)
    records = _load_nbest(nbest, fmt)
    confs = m.predict_many(records, _load_lm(lm))
    outs = []
    replaced = 0
    for r, c in zip(records, confs, strict=True):
        if not r.hyps or not r.hyps[0].words:
            outs.append(r)
            continue
        replaced += r.hyps[0].confidences is not None
        best = replace(r.hyps[0], confidences=tuple(float(x) for x in c))
        outs.append(r.with_hyps((best, *r.hyps[1:])))
    written = write_nbest(out, outs)
    words = sum(len(c) for c in confs)
    mean = sum(float(c.sum()) for c in confs) / words if words else math.nan
    out_console.print(f"{written:,} utterances, {words:,} 1-best words, mean confidence {_fmt(mean)}"
                      + (f" ({replaced:,} utterances' own confidences replaced)" if replaced else "")
                      + f" -> {out}")
