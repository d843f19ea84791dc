"""``privasr privacy``: differential privacy budgets -- epsilon of a run, or the noise a target epsilon needs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer

from privasr.errors import InputError

app = typer.Typer(help="Differential privacy: the epsilon of a training run, or the noise a target epsilon needs.",
                  no_args_is_help=True)

_SAMPLER_HELP = ("How each round's participants are chosen: 'all' (everyone, no amplification), 'poisson' (each "
                 "independently with probability --rate), 'without_replacement' / 'with_replacement' (--sample-size "
                 "of --population).")
_ACCOUNTANT_HELP = ("'rdp' (Renyi DP, fast, slightly loose) or 'pld' (privacy loss distributions, tight, slower; "
                    "refused when estimated to take minutes, e.g. at a tiny noise multiplier). Default: rdp for "
                    "gaussian, pld for laplace (rdp, with a warning, where pld would take minutes).")
_NEIGHBORING_HELP = ("'add_or_remove_one' or 'replace_one' (needed for sampling without replacement, which only the "
                     "rdp accountant supports).")


def _warn(message: str) -> None:
    """One ``warning:`` line on stderr."""
    from rich.text import Text

    from privasr.cli._console import make_console

    make_console(stderr=True).print(Text.assemble(("warning: ", "bold yellow"), message), highlight=False, soft_wrap=True)


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _ceil4(x: float) -> float:
    return math.ceil(x * 1e4) / 1e4


def _floor4(x: float) -> float:
    return math.floor(x * 1e4) / 1e4


def _check_names(mechanism: str, sampler: str, accountant: str | None, neighboring: str) -> str:
    """Check the named choices; returns the accountant (by default: pld for laplace, rdp for gaussian)."""
    from privasr.privacy.dp.accounting import ACCOUNTANTS, NEIGHBORING, SAMPLERS
    from privasr.privacy.dp.mechanisms import MECHANISMS

    if mechanism not in MECHANISMS:
        raise InputError(f"unknown --mechanism {mechanism!r}", expected=" or ".join(MECHANISMS))
    if sampler not in SAMPLERS:
        raise InputError(f"unknown --sampler {sampler!r}", expected=", ".join(SAMPLERS))
    if accountant is None:
        accountant = "pld" if mechanism == "laplace" else "rdp"
    if accountant not in ACCOUNTANTS:
        raise InputError(f"unknown --accountant {accountant!r}", expected=" or ".join(ACCOUNTANTS))
    if neighboring not in NEIGHBORING:
        raise InputError(f"unknown --neighboring {neighboring!r}", expected=" or ".join(NEIGHBORING))
    return accountant


def _check_budget(rounds: int, delta: float, mechanism: str, noise_multiplier: float | None,
                  target_epsilon: float | None, epsilon_per_round: float | None) -> None:
    """Rounds, delta, and exactly one of the noise multiplier, the target epsilon and epsilon per round."""
    if rounds < 1:
        raise InputError(f"--rounds is {rounds}", expected="an integer >= 1")
    if not 0 < delta < 1:
        raise InputError(f"--delta is {delta}", expected="a number in (0, 1)")
    if epsilon_per_round is not None and mechanism != "laplace":
        raise InputError("--epsilon-per-round is for --mechanism laplace",
                         expected="--noise-multiplier or --target-epsilon for the gaussian mechanism")
    given = [name for name, v in (("--noise-multiplier", noise_multiplier), ("--target-epsilon", target_epsilon),
                                  ("--epsilon-per-round", epsilon_per_round)) if v is not None]
    if len(given) != 1:
        options = "--noise-multiplier, --target-epsilon" + (" or --epsilon-per-round" if mechanism == "laplace" else "")
        raise InputError(f"{'both ' + ' and '.join(given) if given else 'none of them'} given",
                         expected=f"exactly one of {options}")


def _check_sampling(sampler: str, rate: float | None, sample_size: int | None, population: int | None) -> None:
    """The sampler's own options, and only them, with valid values."""
    needs = {"all": (), "poisson": ("--rate",), "without_replacement": ("--sample-size", "--population"),
             "with_replacement": ("--sample-size", "--population")}[sampler]
    passed = {"--rate": rate, "--sample-size": sample_size, "--population": population}
    missing = [k for k in needs if passed[k] is None]
    extra = [k for k, v in passed.items() if v is not None and k not in needs]
    if missing or extra:
        raise InputError(f"--sampler {sampler} " + (f"needs {' and '.join(missing)}" if missing else
                                                    f"does not take {' or '.join(extra)}"),
                         expected=" and ".join(needs) if needs else "no --rate, --sample-size or --population")
    if rate is not None and not 0 < rate <= 1:
        raise InputError(f"--rate is {rate}", expected="a probability in (0, 1]")
    if population is not None and population < 1:
        raise InputError(f"--population is {population}", expected="an integer >= 1")
    if sample_size is not None and population is not None and not 1 <= sample_size <= population:
        raise InputError(f"--sample-size is {sample_size}", expected=f"an integer in [1, --population={population}]")


def _given_noise(noise_multiplier: float | None, target_epsilon: float | None,
                 epsilon_per_round: float | None) -> float | None:
    """The noise multiplier given (directly or as 1 / epsilon per round; ``None`` with a target epsilon),
    after checking the given value."""
    if epsilon_per_round is not None:
        if not (math.isfinite(epsilon_per_round) and epsilon_per_round > 0):
            raise InputError(f"--epsilon-per-round is {epsilon_per_round}", expected="a finite number > 0")
        noise_multiplier = 1.0 / epsilon_per_round
    if noise_multiplier is not None and not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise InputError(f"--noise-multiplier is {noise_multiplier}", expected="a finite number > 0")
    if target_epsilon is not None and not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise InputError(f"--target-epsilon is {target_epsilon}", expected="a finite number > 0")
    return noise_multiplier


def _summary(eps: float, noise_multiplier: float, pure: float | None, *, mechanism: str, accountant: str,
             neighboring: str, sampler: str, rate: float | None, sample_size: int | None, population: int | None,
             rounds: int, delta: float, target_epsilon: float | None) -> str:
    """The one-line answer: the epsilon, or (with a target epsilon) the noise multiplier needed."""
    if sampler == "poisson":
        how = f"poisson sampling q={rate:g}"
    elif sampler == "all":
        how = "no sampling"
    else:
        how = f"{sampler.replace('_', ' ')} sampling of {sample_size} out of {population}"
    setting = f"{accountant}, {neighboring}, {rounds} rounds of {mechanism} noise, {how}"
    if target_epsilon is None:
        extra = f"; pure DP: epsilon {pure:.4f} at delta 0" if pure is not None else ""
        return f"epsilon {eps:.4f} at delta {delta:g} ({setting}, noise multiplier {noise_multiplier:g}){extra}"
    line = f"noise multiplier {_ceil4(noise_multiplier):.4f}"
    if mechanism == "laplace":
        line += f" (epsilon per round {_floor4(1.0 / noise_multiplier):.4f})"
    return f"{line} gives epsilon {eps:.4f} <= {target_epsilon:g} at delta {delta:g} ({setting})"


@app.command("epsilon")
def epsilon_cmd(
    rounds: Annotated[int, typer.Option("--rounds", "-T", help="Number of rounds (noisy releases).")],
    noise_multiplier: Annotated[float | None, typer.Option(
        "--noise-multiplier", "-z", help="Noise multiplier: Gaussian std / clip norm, or Laplace scale / "
                                         "sensitivity. Prints the epsilon.")] = None,
    target_epsilon: Annotated[float | None, typer.Option(
        "--target-epsilon", help="Instead of --noise-multiplier: print the smallest noise multiplier whose "
                                 "epsilon is at most this.")] = None,
    epsilon_per_round: Annotated[float | None, typer.Option(
        "--epsilon-per-round", help="Laplace only, instead of --noise-multiplier: each release is "
                                    "epsilon-per-round-DP (noise multiplier 1 / epsilon-per-round).")] = None,
    mechanism: Annotated[str, typer.Option("--mechanism", "-m", help="'gaussian' or 'laplace'.")] = "gaussian",
    sampler: Annotated[str, typer.Option("--sampler", help=_SAMPLER_HELP)] = "all",
    rate: Annotated[float | None, typer.Option("--rate", "-q", help="Poisson sampling probability.")] = None,
    sample_size: Annotated[int | None, typer.Option("--sample-size", help="Participants per round (fixed-size "
                                                                          "samplers).")] = None,
    population: Annotated[int | None, typer.Option("--population", help="Number of units sampled from "
                                                                        "(fixed-size samplers).")] = None,
    delta: Annotated[float, typer.Option("--delta", help="Target delta, in (0, 1).")] = 1e-5,
    accountant: Annotated[str | None, typer.Option("--accountant", help=_ACCOUNTANT_HELP)] = None,
    neighboring: Annotated[str, typer.Option("--neighboring", help=_NEIGHBORING_HELP)] = "add_or_remove_one",
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON object with every input and the "
                                                         "epsilon, delta and noise multiplier.")] = False,
    results: Annotated[Path | None, typer.Option(
        "--results", help="Also write results.json to this file (every input as config, version, and the "
                          "epsilon, delta and noise multiplier as metrics).")] = None,
) -> None:
    """Epsilon after --rounds noisy releases, or (with --target-epsilon) the noise multiplier needed.

    Examples: DP-SGD-style federated rounds, 'privasr privacy epsilon --noise-multiplier 1.1 --rounds 100 --sampler poisson --rate 0.01'; the noise for a budget, '--target-epsilon 2.0' instead of '--noise-multiplier'; pure-DP Laplace releases, '--mechanism laplace --epsilon-per-round 0.5 --rounds 10' (composes to about 5).
    """
    from privasr.outputs import check_output_file
    from privasr.privacy.dp.accounting import SUPPORTED, PldTooCostly, epsilon_for, noise_for_epsilon

    if results is not None:
        check_output_file(results)
    asked = accountant
    accountant = _check_names(mechanism, sampler, accountant, neighboring)
    _check_budget(rounds, delta, mechanism, noise_multiplier, target_epsilon, epsilon_per_round)
    _check_sampling(sampler, rate, sample_size, population)
    noise_multiplier = _given_noise(noise_multiplier, target_epsilon, epsilon_per_round)

    common: dict[str, Any] = {"q": rate, "sample_size": sample_size, "population": population, "delta": delta}
    kw: dict[str, Any] = {"mechanism": mechanism, "neighboring": neighboring}

    def solve(acct: str) -> tuple[float, float]:
        noise = noise_multiplier
        if target_epsilon is not None:
            noise = noise_for_epsilon(target_epsilon, rounds, sampler, **common, accountant=acct, **kw)
        assert noise is not None
        return noise, epsilon_for(noise, rounds, sampler, **common, accountant=acct, **kw)

    try:
        noise_multiplier, eps = solve(accountant)
    except PldTooCostly as e:  # refused before it ran; chosen by default: the rdp accountant instead, said aloud
        if asked is not None or ("rdp", neighboring) not in SUPPORTED[(mechanism, sampler)]:
            raise
        _warn(f"{e.args[0]}; the default accountant for this mechanism falls back to rdp")
        accountant = "rdp"
        noise_multiplier, eps = solve(accountant)

    # pure-DP Laplace without sampling: basic composition gives rounds * epsilon-per-round at delta 0
    pure = rounds / noise_multiplier if mechanism == "laplace" and sampler == "all" else None
    if results is not None:
        from privasr.results import write_results

        write_results(results.parent, filename=results.name, seed=None,
                      config={"command": "privacy epsilon", "mechanism": mechanism, "accountant": accountant,
                              "neighboring": neighboring, "sampler": sampler, "rate": rate,
                              "sample_size": sample_size, "population": population, "rounds": rounds,
                              "delta": delta, "target_epsilon": target_epsilon},
                      metrics={"noise_multiplier": noise_multiplier, "epsilon": _finite(eps), "delta": delta,
                               "epsilon_per_round": 1.0 / noise_multiplier if mechanism == "laplace" else None,
                               "pure_epsilon": pure})
    if as_json:
        out = {"mechanism": mechanism, "accountant": accountant, "neighboring": neighboring, "sampler": sampler,
               "rate": rate, "sample_size": sample_size, "population": population, "rounds": rounds,
               "delta": delta, "target_epsilon": target_epsilon,
               "noise_multiplier": noise_multiplier,
               "epsilon_per_round": 1.0 / noise_multiplier if mechanism == "laplace" else None,
               "epsilon": _finite(eps), "pure_epsilon": pure}
        typer.echo(json.dumps(out, indent=2, allow_nan=False))
        return
    typer.echo(_summary(eps, noise_multiplier, pure, mechanism=mechanism, accountant=accountant,
                        neighboring=neighboring, sampler=sampler, rate=rate, sample_size=sample_size,
                        population=population, rounds=rounds, delta=delta, target_epsilon=target_epsilon))
