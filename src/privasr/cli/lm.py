"""``privasr lm``: train, score and adapt language models."""

import typer

app = typer.Typer(help="Train, score and adapt language models (ARPA n-grams, class LMs, interpolation, FMA).",
                  no_args_is_help=True)
