"""``privasr privacy epsilon``."""

from __future__ import annotations

import json

import pytest

from privasr.cli import main


@pytest.fixture()
def dp():
    return pytest.importorskip("dp_accounting")


def _json(args: list[str], capsys) -> dict:
    assert main(["privacy", "epsilon", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_epsilon_of_poisson_rounds(dp, capsys):
    from privasr.privacy.dp.accounting import epsilon_for

    args = ["--noise-multiplier", "1.1", "--rounds", "100", "--sampler", "poisson", "--rate", "0.01",
            "--delta", "1e-5"]
    assert main(["privacy", "epsilon", *args]) == 0
    text = capsys.readouterr().out
    expected = epsilon_for(1.1, 100, "poisson", q=0.01, delta=1e-5)
    assert text.startswith(f"epsilon {expected:.4f} at delta 1e-05") and "rdp" in text
    out = _json(args, capsys)
    assert out["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert out["noise_multiplier"] == 1.1 and out["delta"] == 1e-5 and out["rounds"] == 100
    assert (out["mechanism"], out["accountant"], out["sampler"], out["rate"]) == ("gaussian", "rdp", "poisson", 0.01)
    assert out["target_epsilon"] is None and out["epsilon_per_round"] is None
    pld = _json([*args, "--accountant", "pld"], capsys)
    assert pld["accountant"] == "pld" and pld["epsilon"] < out["epsilon"]


def test_target_epsilon_prints_the_noise_needed(dp, capsys):
    from privasr.privacy.dp.accounting import epsilon_for

    args = ["--target-epsilon", "2.0", "--rounds", "30", "--sampler", "poisson", "--rate", "0.01"]
    assert main(["privacy", "epsilon", *args]) == 0
    assert capsys.readouterr().out.startswith("noise multiplier ")
    out = _json(args, capsys)
    assert out["target_epsilon"] == 2.0 and out["epsilon"] <= 2.0 and out["epsilon"] == pytest.approx(2.0, abs=1e-4)
    assert epsilon_for(out["noise_multiplier"], 30, "poisson", q=0.01) == pytest.approx(out["epsilon"])


def test_laplace_rounds_compose(dp, capsys):
    assert main(["privacy", "epsilon", "--mechanism", "laplace", "--epsilon-per-round", "0.5", "--rounds", "10"]) == 0
    text = capsys.readouterr().out
    assert "pld" in text and "pure DP: epsilon 5.0000 at delta 0" in text
    out = _json(["--mechanism", "laplace", "--epsilon-per-round", "0.5", "--rounds", "10", "--delta", "1e-12"],
                capsys)
    assert out["accountant"] == "pld" and out["noise_multiplier"] == 2.0 and out["epsilon_per_round"] == 0.5
    assert out["epsilon"] == pytest.approx(5.0, abs=1e-3) and out["pure_epsilon"] == 5.0
    target = _json(["--mechanism", "laplace", "--target-epsilon", "5", "--rounds", "10", "--delta", "1e-12"], capsys)
    assert target["epsilon_per_round"] == pytest.approx(0.5, abs=1e-3) and target["epsilon"] <= 5.0


def test_without_replacement_needs_replace_one(dp, capsys):
    args = ["--noise-multiplier", "1.1", "--rounds", "10", "--sampler", "without_replacement",
            "--sample-size", "10", "--population", "1000"]
    assert main(["privacy", "epsilon", *args]) == 2
    err = capsys.readouterr().err
    assert "neighboring='replace_one'" in err and "Traceback" not in err
    out = _json([*args, "--neighboring", "replace_one"], capsys)
    assert out["neighboring"] == "replace_one" and out["epsilon"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--noise-multiplier", "1", "--target-epsilon", "2", "--rounds", "3"], "exactly one of"),
    (["--rounds", "3"], "exactly one of"),
    (["--epsilon-per-round", "0.5", "--rounds", "3"], "--epsilon-per-round is for --mechanism laplace"),
    (["--noise-multiplier", "1", "--rounds", "3", "--sampler", "poisson"], "needs --rate"),
    (["--noise-multiplier", "1", "--rounds", "3", "--rate", "0.1"], "does not take --rate"),
    (["--noise-multiplier", "1", "--rounds", "3", "--sampler", "poisson", "--rate", "2"], "--rate is 2.0"),
    (["--noise-multiplier", "1", "--rounds", "0"], "--rounds is 0"),
    (["--noise-multiplier", "-1", "--rounds", "3"], "--noise-multiplier is -1.0"),
    (["--noise-multiplier", "1", "--rounds", "3", "--delta", "0"], "--delta is 0.0"),
    (["--noise-multiplier", "1", "--rounds", "3", "--sampler", "uniform"], "unknown --sampler"),
    (["--noise-multiplier", "1", "--rounds", "3", "--accountant", "moments"], "unknown --accountant"),
    (["--noise-multiplier", "1", "--rounds", "3", "--mechanism", "exponential"], "unknown --mechanism"),
    (["--noise-multiplier", "1", "--rounds", "3", "--sampler", "without_replacement", "--sample-size", "20",
      "--population", "10"], "--sample-size is 20"),
])
def test_bad_combinations_are_one_line_errors(args, message, capsys):
    assert main(["privacy", "epsilon", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_unsupported_accounting_is_an_error(dp, capsys):
    args = ["--mechanism", "laplace", "--noise-multiplier", "1", "--rounds", "3", "--sampler", "poisson",
            "--rate", "0.1", "--accountant", "rdp"]
    assert main(["privacy", "epsilon", *args]) == 2
    assert "accountant='pld', neighboring='add_or_remove_one'" in capsys.readouterr().err
    args = ["--noise-multiplier", "1", "--rounds", "3", "--sampler", "with_replacement", "--sample-size", "3",
            "--population", "10"]
    assert main(["privacy", "epsilon", *args]) == 2
    assert "no dp_accounting accountant supports it" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    assert main(["privacy", "epsilon", "--noise-multiplier", "1"]) == 2  # --rounds is required
    assert main(["privacy", "epsilon", "--rounds", "x", "--noise-multiplier", "1"]) == 2


def test_pld_at_a_tiny_noise_multiplier_is_refused_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from privasr.cli import main

    t0 = time.perf_counter()
    assert main(["privacy", "epsilon", "-z", "0.01", "-T", "100", "--accountant", "pld"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the PLD accountant would need") and "--accountant rdp" in err
    assert len(err.strip().splitlines()) == 1
    # chosen by default (laplace -> pld): one warning line, then the rdp answer
    assert main(["privacy", "epsilon", "--mechanism", "laplace", "--epsilon-per-round", "2000", "-T", "100"]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("warning: the PLD accountant would need") and out.out.startswith("epsilon ")
    assert "(rdp," in out.out
    assert time.perf_counter() - t0 < 10


def test_a_privacy_warning_is_one_warning_line_and_other_warnings_are_untouched(capsys):
    import warnings

    from privasr.cli import _warning_printer
    from privasr.errors import PrivacyWarning

    others: list[tuple] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _warning_printer(lambda *a: others.append(a))
        warnings.warn("fedlm: noise multiplier 0: epsilon is infinite", PrivacyWarning, stacklevel=1)
        warnings.warn("something else", UserWarning, stacklevel=1)
    err = capsys.readouterr().err
    assert "warning: fedlm: noise multiplier 0: epsilon is infinite" in err and "PrivacyWarning" not in err
    assert [(str(a[0]), a[1]) for a in others] == [("something else", UserWarning)]
