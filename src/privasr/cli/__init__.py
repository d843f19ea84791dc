"""The ``privasr`` command line (typer + rich).

Each command group lives in its own module and registers a ``typer.Typer`` here. Errors that come from
the user's input (:class:`~privasr.errors.InputError`) are printed as one line and exit with status 2,
never as a traceback.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import typer
from rich.text import Text

from privasr import __version__
from privasr.cli._console import make_console
from privasr.errors import InputWarning, PrivacyWarning, PrivasrError

__all__ = ["app", "main"]

console = make_console(stderr=True)

app = typer.Typer(
    name="privasr",
    help="Adapt speech recognition to its users without collecting their recordings or raw transcripts "
         "(docs/privacy.md says what does leave a device).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"privasr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars or notes on stderr (also "
                               "PRIVASR_QUIET=1; bars are never drawn when stderr is not a terminal)."),
) -> None:
    """privasr: federated, differentially private and anonymised adaptation for ASR."""
    from privasr.progress import set_quiet
    from privasr.results import source_revision

    set_quiet(True if quiet else None)
    source_revision()  # pinned now: a run records the commit it started from


def _register() -> None:
    from privasr.cli import (
        anon,
        anonymize,
        audit,
        bench,
        confidence,
        data,
        decode,
        demo,
        device,
        fed,
        fedlm,
        fmp,
        ftl,
        headlines,
        lm,
        privacy,
        report,
        rescore,
        score,
    )

    app.add_typer(data.app, name="data")
    app.add_typer(score.app, name="score")
    app.add_typer(lm.app, name="lm")
    app.add_typer(rescore.app, name="rescore")
    app.add_typer(privacy.app, name="privacy")
    app.add_typer(fmp.app, name="fmp")
    app.add_typer(fedlm.app, name="fedlm")
    app.add_typer(ftl.app, name="ftl")
    app.add_typer(fed.app, name="fed")
    app.add_typer(device.serve_app, name="serve")
    app.add_typer(device.device_app, name="device")
    app.add_typer(confidence.app, name="confidence")
    app.add_typer(anon.app, name="anon")
    app.command("demo")(demo.demo)
    app.command("bench")(bench.bench)
    app.command("decode")(decode.decode)
    app.command("adapt")(decode.adapt)
    app.command("anonymize")(anonymize.anonymize)
    app.command("audit")(audit.audit)
    app.command("report")(report.report)
    app.command("headlines")(headlines.headlines)


_register()


def _warning_printer(fallback: Any) -> Any:
    """A ``warnings.showwarning`` that prints a :class:`~privasr.errors.PrivacyWarning` or
    :class:`~privasr.errors.InputWarning` as one ``warning:`` line
    on stderr and hands every other warning to ``fallback`` (the one in force before)."""
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
             line: str | None = None) -> None:
        if issubclass(category, (PrivacyWarning, InputWarning)):
            console.print(Text.assemble(("warning: ", "bold yellow"), str(message)), highlight=False,
                          soft_wrap=True)
        else:
            fallback(message, category, filename, lineno, file, line)

    return show


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status instead of raising."""
    with warnings.catch_warnings():
        warnings.showwarning = _warning_printer(warnings.showwarning)
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        # standalone_mode=False: click returns a command's typer.Exit(code) instead of raising it
        code = app(args=argv, standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    except PrivasrError as e:
        console.print(Text.assemble(("error: ", "bold red"), str(e)), highlight=False, soft_wrap=True)
        return 2
    except (typer.Exit, SystemExit) as e:
        code = getattr(e, "exit_code", None) if isinstance(e, typer.Exit) else e.code
        return int(code or 0)
    except typer.Abort:
        console.print("aborted")
        return 1
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.ClickException):
            e.show()
            return e.exit_code
        raise
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
