"""``privasr demo``: generate the synthetic corpus and run everything end to end."""

from pathlib import Path

import typer
from rich.markdown import Markdown

from privasr.cli._console import make_console


def demo(
    out: Path = typer.Option(Path("demo-out"), "--out", help="Output folder (results.json, report.md, corpus/)."),
    seed: int = typer.Option(0, "--seed", help="Random seed for the corpus and every method."),
    preset: str = typer.Option("small", "--preset", help="Corpus size preset (small runs in seconds)."),
) -> None:
    """Generate the synthetic federated corpus and run every method end to end.

    Writes OUT/results.json (config, seed, version, data fingerprints, metrics) and OUT/report.md (a WER
    table and what each method did).
    """
    from privasr import progress
    from privasr.experiments.demo import best_line, run_demo
    from privasr.outputs import output_dir

    console = make_console()
    with output_dir(out), progress.task("running the demo", transient=True):  # the stages' bars nest in it
        metrics = run_demo(out, seed=seed, preset=preset)
    console.print(Markdown((out / "report.md").read_text(encoding="utf-8")))
    console.print(f"[bold]results:[/] {out / 'results.json'}  [bold]report:[/] {out / 'report.md'}",
                  highlight=False)
    console.print(best_line(metrics), highlight=False)
