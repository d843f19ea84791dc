"""``privasr anon``: language models from anonymised transcripts and the NER behind them (paper 003).

``privasr anon run --config configs/anon-ami.yaml --out DIR`` trains and evaluates LMs on anonymised text
(:mod:`privasr.experiments.anon`); ``privasr anon eval-ner [--data DIR] --out DIR [--model SPEC] [--seed N]``
evaluates NER on held-out Wikigold and Earnings-21 text, cased and ASR-style, and the anonymisation's leaks
(:mod:`privasr.experiments.ner_eval`); ``privasr anon train-ner [--data DIR] --out MODEL_DIR`` fine-tunes the NER
(:func:`privasr.anon.ner_model.train_ner`) on the same training split.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer

from privasr.cli._console import make_console
from privasr.errors import ConfigError

__all__ = ["app", "eval_ner", "train_ner_cmd", "fetch_templates"]

app = typer.Typer(help="Anonymisation (paper 003): evaluate and fine-tune the named-entity detection, and train "
                       "language models on anonymised transcripts (run).",
                  no_args_is_help=True)


def _data(data: Path | None) -> Path:
    from privasr.paths import data_dir

    d = data if data is not None else data_dir()
    if d is None:
        raise ConfigError("no data folder", expected="--data DIR, ../shared/data or $PRIVASR_DATA")
    if not d.is_dir():
        raise ConfigError("the data folder does not exist", path=d)
    return d


def _train_config(seed: int, epochs: int | None, name_augment: float | None) -> object:
    from privasr.anon.ner_model import NerTrainConfig

    kw: dict[str, object] = {"seed": seed}
    if epochs is not None:
        kw["epochs"] = epochs
    if name_augment is not None:
        kw["name_augment"] = name_augment
    return NerTrainConfig(**kw)  # type: ignore[arg-type]


@app.command("eval-ner")
def eval_ner(
    data: Path = typer.Option(None, "--data", help="Data folder with ner-wikigold/ and earnings21/ "
                                                   "(default: ../shared/data or $PRIVASR_DATA), or one annotated "
                                                   "file to evaluate on as held-out text (CoNLL, .nlp, transcript "
                                                   "JSON Lines with entities, presidio-evaluator's synthetic "
                                                   "JSON)."),
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md."),
    model: str = typer.Option("finetuned", "--model", help="Primary detector: finetuned (cached fine-tuned model "
                                                           "+ patterns + recall passes), stock, patterns, or a trained model folder."),
    seed: int = typer.Option(0, "--seed", help="Seed of the splits, training and surrogates."),
    epochs: int = typer.Option(None, "--epochs", help="Most training epochs (default: NerTrainConfig's)."),
    name_augment: float = typer.Option(None, "--name-augment", help="Faker-name augmentation fraction."),
    cache: Path = typer.Option(None, "--cache", help="Where fine-tuned models are cached (default: runs/cache "
                                                     "with a data folder, the user cache ~/.cache/privasr with "
                                                     "--data FILE)."),
    part: str = typer.Option("test", "--part", help="Which held-out part to score: test (the reported figures) "
                                                    "or dev (for choosing settings)."),
    compare: bool = typer.Option(True, "--compare/--no-compare",
                                 help="Also evaluate stock, stock+patterns, patterns and finetuned alone."),
    templates: bool = typer.Option(True, "--templates/--no-templates",
                                   help="Train (and score apart) with presidio-evaluator's filled templates, as the "
                                        "default fine-tuned model does; --no-templates: the gold sets only."),
) -> None:
    """Evaluate NER (P/R/F1 per label, cased and ASR-style) and the leaks of surrogate anonymisation."""
    from privasr.experiments.ner_eval import run_eval_ner, run_eval_ner_file
    from privasr.outputs import check_output_dir, output_dir

    console = make_console(stderr=True)
    if data is not None and data.is_file():
        if part != "test" or epochs is not None or name_augment is not None or not templates:
            raise ConfigError("--part, --epochs, --name-augment and --no-templates apply to a data folder's splits "
                              "and training",
                              path=data, expected="a file is evaluated whole, with an already trained model")
        check_output_dir(out)
        with output_dir(out):
            m = run_eval_ner_file(data, out, model=model, seed=seed, cache_root=cache,
                                  systems=("stock", "patterns") if compare else (),
                                  log=lambda s: console.print(s, highlight=False))
        make_console().print(f"{data.name}: {m['sentences']:,} sentences, gold mentions {m['gold_mentions']}; PER "
                             f"recall (ASR-style) {m['per_recall_asr_style']:.4f}; PER leak rate "
                             f"{m['per_leak_rate_asr_style']:.4f}; leak rate {m['leak_rate']:.4f}")
        make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")
        return
    cfg = _train_config(seed, epochs, name_augment)
    systems = ("stock", "stock+patterns", "patterns", "finetuned", "finetuned+patterns") if compare else ()
    m = run_eval_ner(_data(data), out, model=model, seed=seed, train_config=cfg,  # type: ignore[arg-type]
                     cache_root=cache if cache is not None else Path("runs/cache"),
                     systems=systems, log=lambda s: console.print(s, highlight=False), part=part,
                     templates=templates)
    make_console().print(f"PER recall (ASR-style) {m['per_recall_asr_style']:.4f}; leak rate {m['leak_rate']:.4f}; "
                    f"Earnings-21 names leaked {m['earnings21_names_leaked']}")
    make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


@app.command("eval-names")
def eval_names(
    out: Path = typer.Option(..., "--out", help="Output folder: results.json, report.md, plots/."),
    model: str = typer.Option("finetuned", "--model", help="Detector: finetuned, stock, patterns or a trained "
                                                           "model folder."),
    n: int = typer.Option(100, "--n", min=1, help="Names per shape and casing."),
    seed: int = typer.Option(0, "--seed", help="Seed of the planted names and the surrogates."),
) -> None:
    """Plant names of every shape (particles, apostrophes, hyphens, initials, titles) in every casing and count
    how many survive anonymisation, per shape."""
    from privasr.cli.rescore import _command_line
    from privasr.experiments.name_eval import run_eval_names
    from privasr.outputs import check_output_dir, output_dir

    check_output_dir(out)
    with output_dir(out), make_console(stderr=True).status(f"planting names ({model})"):
        m = run_eval_names(out, model=model, n=n, seed=seed, argv=_command_line())
    make_console().print(f"{m['names']:,} planted names: {100 * m['survival']:.2f}% survive; worst shape "
                         f"{100 * m['worst_shape_survival']:.2f}% (target {100 * m['target']:g}%: "
                         f"{'met' if m['target_met'] else 'not met'})")
    make_console().print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}")


@app.command("train-ner")
def train_ner_cmd(
    data: Path = typer.Option(None, "--data", help="Data folder (default: ../shared/data or $PRIVASR_DATA)."),
    out: Path = typer.Option(..., "--out", help="Model folder to write (spaCy pipeline + privasr-ner.json)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the splits and training."),
    epochs: int = typer.Option(None, "--epochs", help="Most training epochs."),
    name_augment: float = typer.Option(None, "--name-augment", help="Faker-name augmentation fraction."),
    cache: Path = typer.Option(Path("runs/cache"), "--cache", help="Where fine-tuned models are cached."),
    templates: bool = typer.Option(True, "--templates/--no-templates",
                                   help="Also train on presidio-evaluator's filled templates (the default recipe)."),
) -> None:
    """Fine-tune the NER on the Wikigold and Earnings-21 training split and presidio-evaluator's filled templates
    (cased and ASR-style) into --out."""
    from privasr.anon.ner_model import cached_model, recipe_data

    d = _data(data)
    console = make_console(stderr=True)
    folder, info, _ = cached_model(recipe_data(d, cache, seed, templates=templates), d,
                                   _train_config(seed, epochs, name_augment),  # type: ignore[arg-type]
                                   cache, seed, log=lambda s: console.print(s, highlight=False))
    if out.resolve() != folder.resolve():
        if out.exists():
            if not (out / "privasr-ner.json").is_file():
                raise ConfigError("--out exists and is not a trained NER model folder", path=out,
                                  expected="a new folder")
            shutil.rmtree(out)
        shutil.copytree(folder, out)
    make_console().print(f"best epoch {info['best_epoch']}, dev micro F1 {info['dev_micro_f1']:.4f}, "
                    f"{info['train_seconds']:.0f} s -> {out}")
    make_console().print_json(json.dumps({k: info[k] for k in ("best_epoch", "epochs_run", "dev_micro_f1")}))


@app.command("fetch-templates")
def fetch_templates(
    cache: Path = typer.Option(None, "--cache", help="Cache folder (default: the user cache ~/.cache/privasr, "
                                                     "or $PRIVASR_CACHE)."),
    wheel: Path = typer.Option(None, "--wheel", help="presidio-evaluator's wheel, for a machine without PyPI "
                                                     "(its SHA-256 is checked)."),
) -> None:
    """Put presidio-evaluator's sentence templates (MIT) in the cache: the fine-tuned NER trains on them."""
    from privasr.anon.ner_model import user_cache_dir
    from privasr.anon.ner_templates import presidio_templates, read_templates

    folder = presidio_templates(cache if cache is not None else user_cache_dir(), wheel)
    n = len(read_templates(folder / "templates.txt"))
    make_console().print(f"{n} templates in {folder}")


def _register_run() -> None:
    from privasr.cli import anon_run

    app.command("run")(anon_run.run)


_register_run()
