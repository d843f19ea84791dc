"""``privasr rescore``: N-best rescoring with weights tuned on a dev set."""

import typer

app = typer.Typer(help="Rescore N-best lists with language models; tune weights on dev, report test WER.",
                  no_args_is_help=True)
