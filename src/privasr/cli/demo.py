"""``privasr demo``: generate the synthetic corpus and run everything end to end."""

from pathlib import Path

import typer


def demo(out: Path = typer.Option(Path("demo-out"), "--out", help="Output folder.")) -> None:
    """Generate the synthetic federated corpus and run every method end to end."""
    raise NotImplementedError
