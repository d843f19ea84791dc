"""privasr.progress: bars on a terminal, nothing when quiet or piped, nested bars, notes; --quiet on the CLI."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import privasr.progress as progress


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """stderr replaced by a buffer that rich treats as a terminal."""
    buf = io.StringIO()
    monkeypatch.setattr(progress, "_make_console", lambda: Console(file=buf, force_terminal=True, width=100))
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    progress.set_quiet(None)
    yield buf
    progress.set_quiet(None)


def test_bars_on_a_terminal_nest_and_the_inner_ones_go(terminal: io.StringIO) -> None:
    with progress.task("rounds", total=2) as rounds:
        for r in range(2):
            assert list(progress.track([1, 2, 3], f"round {r + 1} clients")) == [1, 2, 3]
            rounds.advance()
        assert progress._depth == 1
    assert progress._progress is None and progress._depth == 0
    out = terminal.getvalue()
    assert "rounds" in out and "2/2" in out
    final = out.rsplit("\x1b[2K", 1)[-1]  # the display left on screen at the end
    assert "rounds" in final and "clients" not in final


@pytest.mark.parametrize("how", ["flag", "env"])
def test_quiet_prints_nothing(terminal: io.StringIO, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "flag":
        progress.set_quiet(True)
    else:
        monkeypatch.setenv(progress.QUIET_ENV, "1")
    items = [1, 2]
    assert progress.track(items, "x") is items  # no wrapper at all
    with progress.task("y", total=3) as t:
        t.advance()
        t.update(info="z")
    progress.note("resuming from round 2")
    assert terminal.getvalue() == ""


def test_not_a_terminal_no_bars_but_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(progress, "_make_console", lambda: Console(file=buf, force_terminal=False))
    progress.set_quiet(None)
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    items = [1]
    assert progress.track(items, "x") is items
    with progress.task("y", total=1) as t:
        t.advance()
    assert buf.getvalue() == ""
    progress.note("resuming from round 2 (checkpoint runs/x)")
    assert buf.getvalue() == "resuming from round 2 (checkpoint runs/x)\n"


def test_a_generator_abandoned_midway_closes_its_bar(terminal: io.StringIO) -> None:
    for x in progress.track(iter(range(10)), "partial", total=10):
        if x == 3:
            break
    assert progress._progress is None and progress._depth == 0


def test_root_quiet_option(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from privasr.cli import main

    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    assert main(["--quiet", "privacy", "epsilon", "-z", "1.0", "-T", "2"]) == 0
    assert progress.is_quiet()
    assert main(["privacy", "epsilon", "-z", "1.0", "-T", "2"]) == 0
    assert not progress.is_quiet()  # each invocation decides afresh
    assert "--quiet" in _help(capsys)


def _help(capsys: pytest.CaptureFixture[str]) -> str:
    from privasr.cli import main

    capsys.readouterr()
    main(["--help"])
    return capsys.readouterr().out


def test_a_resumed_federated_run_says_where_it_resumed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from privasr.federated.core import SumAccumulator, Update
    from privasr.federated.loop import run_federated
    from privasr.federated.sampling import AllClients

    class Mean:
        name = "mean"

        def init(self, rng):
            return {"x": 0.0}

        def broadcast(self, state, round):
            return state["x"]

        def client_update(self, payload, client, client_state, rng):
            return Update({"x": np.array([client - payload])}, weight=1.0), None

        def accumulate(self, acc, update):
            return (acc or SumAccumulator.empty()).add(update)

        def server_update(self, state, acc, round, rng):
            x = state["x"] + float(acc.mean()["x"][0])
            return {"x": x}, {"x": x}

    buf = io.StringIO()
    monkeypatch.setattr(progress, "_make_console", lambda: Console(file=buf, force_terminal=False, width=200))
    monkeypatch.delenv(progress.QUIET_ENV, raising=False)
    progress.set_quiet(None)
    run_federated(Mean(), [1.0, 2.0], rounds=2, sampler=AllClients(), checkpoint_dir=tmp_path, resume=True)
    assert buf.getvalue() == ""
    run_federated(Mean(), [1.0, 2.0], rounds=3, sampler=AllClients(), checkpoint_dir=tmp_path, resume=True)
    assert buf.getvalue() == f"resuming from round 2 (checkpoint {tmp_path})\n"
    progress.set_quiet(True)
    run_federated(Mean(), [1.0, 2.0], rounds=4, sampler=AllClients(), checkpoint_dir=tmp_path, resume=True)
    progress.set_quiet(None)
    assert buf.getvalue().count("resuming") == 1
