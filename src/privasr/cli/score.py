"""``privasr score``: WER, oracle WER and significance tests between systems."""

import typer

app = typer.Typer(help="Score recognition output: WER, and compare two systems (MAPSSWE, bootstrap).",
                  no_args_is_help=True)
