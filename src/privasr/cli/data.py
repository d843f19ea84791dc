"""``privasr data``: inspect, convert and synthesise corpora."""

import typer

app = typer.Typer(help="Inspect, convert and synthesise ASR corpora.", no_args_is_help=True)
