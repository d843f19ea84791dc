"""Privacy accounting (privasr.privacy.dp.accounting) against dp_accounting itself as the oracle."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from privasr.errors import ConfigError

dp = pytest.importorskip("dp_accounting")

from privasr.privacy.dp.accounting import (  # noqa: E402 - after the importorskip
    SAMPLERS,
    SUPPORTED,
    PrivacyAccountant,
    epsilon_for,
    event_from_dict,
    event_to_dict,
    noise_for_epsilon,
    round_event,
)
from privasr.privacy.dp.mechanisms import GaussianMechanism, LaplaceMechanism  # noqa: E402

RO = dp.NeighboringRelation.REPLACE_ONE


def _sampling(sampler: str) -> dict:
    return {"all": {}, "poisson": {"sampling_probability": 0.01},
            "without_replacement": {"sample_size": 10, "population": 1000},
            "with_replacement": {"sample_size": 10, "population": 1000}}[sampler]


# ------------------------------------------------------------------------------------------ known values


def test_dpsgd_known_value_matches_dp_accounting_directly():
    # q = 0.01, sigma = 1.1, 10,000 steps, delta = 1e-5: the classic DP-SGD setting (RDP epsilon about 5.6)
    oracle = dp.rdp.RdpAccountant().compose(
        dp.PoissonSampledDpEvent(0.01, dp.GaussianDpEvent(1.1)), 10_000).get_epsilon(1e-5)
    ours = epsilon_for(1.1, 10_000, "poisson", q=0.01, delta=1e-5)
    assert ours == pytest.approx(oracle, rel=1e-12)
    assert 5.0 < ours < 6.5
    acct = PrivacyAccountant("rdp", target_delta=1e-5)
    acct.step(round_event(GaussianMechanism(0.7, 1.1).dp_event(), "poisson", sampling_probability=0.01), 10_000)
    assert acct.epsilon() == pytest.approx(oracle, rel=1e-12) and acct.steps == 10_000
    # PLD is tighter, and our wrapper again reproduces dp_accounting exactly
    pld_oracle = dp.pld.PLDAccountant().compose(
        dp.PoissonSampledDpEvent(0.01, dp.GaussianDpEvent(1.1)), 10_000).get_epsilon(1e-5)
    pld = epsilon_for(1.1, 10_000, "poisson", q=0.01, accountant="pld")
    assert pld == pytest.approx(pld_oracle, rel=1e-12)
    assert pld < ours


def test_stepping_round_by_round_equals_composing_at_once():
    event = round_event(dp.GaussianDpEvent(1.3), "poisson", sampling_probability=0.05)
    a, b = PrivacyAccountant(), PrivacyAccountant()
    for _ in range(4):
        a.step(event)
    b.step(event, count=4)
    assert a.epsilon() == pytest.approx(b.epsilon(), rel=1e-9) and a.steps == b.steps == 4
    # PLD composes lazily, merging repeats: 200 single steps cost one self-composition and equal it exactly
    c, d = PrivacyAccountant("pld"), PrivacyAccountant("pld")
    for i in range(200):
        c.step(event)
        if i == 99:
            assert c.epsilon() == pytest.approx(epsilon_for(1.3, 100, "poisson", q=0.05, accountant="pld"))
    d.step(event, count=200)
    assert c.epsilon() == d.epsilon() and c.steps == 200
    assert c.epsilon() < epsilon_for(1.3, 200, "poisson", q=0.05)  # tighter than RDP


def test_epsilon_is_monotone_in_rounds_noise_and_sampling_rate():
    by_rounds = [epsilon_for(1.1, t, "poisson", q=0.01) for t in (10, 100, 1000, 10_000)]
    assert by_rounds == sorted(by_rounds) and len(set(by_rounds)) == 4
    by_noise = [epsilon_for(s, 1000, "poisson", q=0.01) for s in (0.8, 1.1, 2.0, 4.0)]
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 4
    by_rate = [epsilon_for(1.1, 1000, "poisson", q=q) for q in (0.001, 0.01, 0.1, 1.0)]
    assert by_rate == sorted(by_rate) and len(set(by_rate)) == 4
    # no amplification is the same as sampling everyone
    assert epsilon_for(1.1, 100, "all") == pytest.approx(epsilon_for(1.1, 100, "poisson", q=1.0), rel=1e-9)
    assert epsilon_for(1.1, 0, "poisson", q=0.01) == 0.0


def test_laplace_composes_additively_under_pld():
    # T pure-DP releases at eps each: T * eps with delta ~ 0
    for rounds, eps in ((10, 0.5), (3, 1.0), (1, 0.2)):
        acct = PrivacyAccountant("pld", target_delta=1e-12)
        acct.step(LaplaceMechanism(sensitivity=2.0, epsilon=eps).dp_event(), count=rounds)
        assert acct.epsilon() == pytest.approx(rounds * eps, abs=1e-3)
        assert acct.epsilon() <= rounds * eps + 1e-3
        assert epsilon_for(1 / eps, rounds, "all", mechanism="laplace", accountant="pld", delta=1e-12) \
            == pytest.approx(rounds * eps, abs=1e-3)
    # RDP never reaches pure DP: at the same tiny delta it is looser than T * eps (hence pld for Laplace)
    rdp = epsilon_for(2.0, 10, "all", mechanism="laplace", accountant="rdp", delta=1e-12)
    assert rdp > 5.0 + 1e-3
    # beyond pure DP, at a larger delta both certify less than T * eps
    assert epsilon_for(2.0, 10, "all", mechanism="laplace", accountant="pld", delta=1e-5) < 5.0


def test_noise_for_epsilon_inverts_epsilon_for():
    eps = epsilon_for(1.7, 500, "poisson", q=0.02)
    found = noise_for_epsilon(eps, 500, "poisson", q=0.02)
    assert found == pytest.approx(1.7, abs=1e-4)
    assert epsilon_for(found, 500, "poisson", q=0.02) <= eps + 1e-12
    # no sampling, and Laplace through PLD
    for s in (0.6, 3.0, 40.0):
        eps = epsilon_for(s, 20, "all")
        assert noise_for_epsilon(eps, 20, "all") == pytest.approx(s, abs=1e-4)
    assert noise_for_epsilon(5.0, 10, "all", mechanism="laplace", accountant="pld", delta=1e-12) \
        == pytest.approx(2.0, abs=1e-3)


def test_noise_for_epsilon_with_pld_is_below_rdps_and_meets_the_target():
    rdp = noise_for_epsilon(2.0, 20, "all", tol=1e-4)
    pld = noise_for_epsilon(2.0, 20, "all", accountant="pld", tol=1e-3)
    assert pld < 0.95 * rdp  # the tighter accountant needs less noise for the same budget
    assert epsilon_for(pld, 20, "all", accountant="pld") <= 2.0
    assert epsilon_for(pld * 0.99, 20, "all", accountant="pld") > 2.0


def test_noise_for_epsilon_rejects_bad_targets():
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ConfigError, match="target_epsilon"):
            noise_for_epsilon(bad, 10, "all")
    with pytest.raises(ConfigError, match="rounds"):
        noise_for_epsilon(1.0, 0, "all")
    with pytest.raises(ConfigError, match="below 0.01"):
        noise_for_epsilon(1e6, 1, "all")


# ------------------------------------------------------------------------------- supported combinations


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_support_table_matches_dp_accounting(mechanism, sampler):
    base = dp.GaussianDpEvent(1.0) if mechanism == "gaussian" else dp.LaplaceDpEvent(1.0)
    event = round_event(base, sampler, **_sampling(sampler))
    for accountant in ("rdp", "pld"):
        for neighboring in ("add_or_remove_one", "replace_one"):
            acct = PrivacyAccountant(accountant, neighboring=neighboring)
            expected = (accountant, neighboring) in SUPPORTED[(mechanism, sampler)]
            assert acct.supports(event) is expected, (accountant, neighboring)
            if not expected:
                with pytest.raises(ConfigError, match="cannot account for") as err:
                    acct.step(event)
                assert acct.steps == 0 and acct.epsilon() == 0.0  # nothing was composed
                works = SUPPORTED[(mechanism, sampler)]
                if works:
                    assert f"accountant={works[0][0]!r}, neighboring={works[0][1]!r}" in str(err.value)
                else:
                    assert "no dp_accounting accountant supports it" in str(err.value)


def test_without_replacement_needs_rdp_with_replace_one():
    with pytest.raises(ConfigError, match="accountant='rdp', neighboring='replace_one'"):
        epsilon_for(1.1, 100, "without_replacement", sample_size=10, population=1000)
    with pytest.raises(ConfigError, match="cannot account for a gaussian mechanism with 'without_replacement'"):
        epsilon_for(1.1, 100, "without_replacement", sample_size=10, population=1000, accountant="pld",
                    neighboring="replace_one")
    eps = epsilon_for(1.1, 100, "without_replacement", sample_size=10, population=1000, neighboring="replace_one")
    assert 0 < eps < float("inf")


def test_rdp_replace_one_doubles_the_sensitivity():
    # noise multipliers are per contribution bound; replacing one contribution moves the sum by 2C, which PLD
    # accounts for itself and our RDP wrapper by halving the multiplier before dp_accounting sees it
    native_pld_ro = dp.pld.PLDAccountant(neighboring_relation=RO).compose(dp.GaussianDpEvent(2.0)).get_epsilon(1e-5)
    native_pld_aor = dp.pld.PLDAccountant().compose(dp.GaussianDpEvent(1.0)).get_epsilon(1e-5)
    assert native_pld_ro == pytest.approx(native_pld_aor, rel=1e-6)
    assert epsilon_for(2.0, 1, "all", neighboring="replace_one") == pytest.approx(epsilon_for(1.0, 1, "all"), rel=1e-12)
    assert epsilon_for(2.0, 1, "all", neighboring="replace_one", accountant="pld") \
        == pytest.approx(native_pld_ro, rel=1e-12)
    # sampling without replacement: exactly dp_accounting with sigma / 2, more than with sigma
    wor = epsilon_for(1.1, 100, "without_replacement", sample_size=10, population=1000, neighboring="replace_one")
    halved = dp.rdp.RdpAccountant(neighboring_relation=RO).compose(
        dp.SampledWithoutReplacementDpEvent(1000, 10, dp.GaussianDpEvent(0.55)), 100).get_epsilon(1e-5)
    naive = dp.rdp.RdpAccountant(neighboring_relation=RO).compose(
        dp.SampledWithoutReplacementDpEvent(1000, 10, dp.GaussianDpEvent(1.1)), 100).get_epsilon(1e-5)
    assert wor == pytest.approx(halved, rel=1e-12) and wor > naive
    # Laplace: one replace-one release costs 2 eps
    assert epsilon_for(2.0, 1, "all", mechanism="laplace", neighboring="replace_one", delta=1e-12) \
        == pytest.approx(epsilon_for(1.0, 1, "all", mechanism="laplace", delta=1e-12), rel=1e-12)


def test_round_event_builds_the_sampler_actually_used():
    g = dp.GaussianDpEvent(1.0)
    assert round_event(g, "all") is g
    assert round_event(g, "poisson", sampling_probability=0.2) == dp.PoissonSampledDpEvent(0.2, g)
    assert round_event(g, "without_replacement", sample_size=3, population=9) \
        == dp.SampledWithoutReplacementDpEvent(9, 3, g)
    assert round_event(g, "with_replacement", sample_size=3, population=9) == dp.SampledWithReplacementDpEvent(9, 3, g)
    bad = [
        ({"sampler_kind": "uniform"}, "unknown sampler"),
        ({"sampler_kind": "poisson"}, "lacks sampling_probability"),
        ({"sampler_kind": "poisson", "sampling_probability": 0.0}, r"\(0, 1\]"),
        ({"sampler_kind": "poisson", "sampling_probability": 1.5}, r"\(0, 1\]"),
        ({"sampler_kind": "poisson", "sampling_probability": 0.1, "population": 10}, "does not take population"),
        ({"sampler_kind": "all", "sampling_probability": 0.1}, "does not take sampling_probability"),
        ({"sampler_kind": "without_replacement", "sample_size": 3}, "lacks population"),
        ({"sampler_kind": "without_replacement", "sample_size": 30, "population": 10}, "sample_size must be"),
        ({"sampler_kind": "with_replacement", "sample_size": 3, "population": 0}, "population must be"),
        ({"sampler_kind": "without_replacement", "sample_size": 2.5, "population": 10}, "sample_size must be"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ConfigError, match=message):
            round_event(g, **kwargs)
    with pytest.raises(ConfigError, match="DpEvent"):
        round_event(1.0, "all")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- state and checks


def test_state_dict_round_trip_replays_to_the_same_epsilon():
    for accountant in ("rdp", "pld"):
        acct = PrivacyAccountant(accountant, target_delta=1e-6)
        acct.step(round_event(dp.GaussianDpEvent(2.0), "poisson", sampling_probability=0.05), count=30)
        acct.step(dp.GaussianDpEvent(8.0))
        acct.step(dp.SelfComposedDpEvent(dp.LaplaceDpEvent(20.0), 2))
        acct.step(dp.ComposedDpEvent([dp.GaussianDpEvent(5.0), dp.NoOpDpEvent()]), count=3)
        state = json.loads(json.dumps(acct.state_dict()))
        again = PrivacyAccountant.from_state_dict(state)
        assert again == acct and again.steps == acct.steps == 35
        assert again.epsilon() == acct.epsilon() and again.delta_for(2.0) == acct.delta_for(2.0)
        summary = acct.to_dict()
        assert summary["epsilon"] == acct.epsilon() and summary["steps"] == 35 and len(summary["events"]) == 4
        # [event, count] pairs work too, and replaying a prefix gives less epsilon
        pairs = dict(state, events=[[e["event"], e["count"]] for e in state["events"][:2]])
        assert PrivacyAccountant.from_state_dict(pairs).epsilon() < acct.epsilon()
    assert PrivacyAccountant("rdp", neighboring="replace_one") != PrivacyAccountant("rdp")


def test_state_dict_rejects_malformed_state():
    with pytest.raises(ConfigError, match="unknown keys"):
        PrivacyAccountant.from_state_dict({"accountant": "rdp", "history": []})
    with pytest.raises(ConfigError, match="malformed"):
        PrivacyAccountant.from_state_dict({"events": [{"event": {"type": "GaussianDpEvent"}}]})
    with pytest.raises(ConfigError, match="unknown DpEvent type"):
        PrivacyAccountant.from_state_dict({"events": [{"event": {"type": "Nope"}, "count": 1}]})
    with pytest.raises(ConfigError, match="unknown fields"):
        event_from_dict({"type": "GaussianDpEvent", "noise_multiplier": 1.0, "sigma": 2})
    # replaying still refuses unsupported events
    wor = event_to_dict(round_event(dp.GaussianDpEvent(1.0), "without_replacement", sample_size=2, population=5))
    with pytest.raises(ConfigError, match="replace_one"):
        PrivacyAccountant.from_state_dict({"events": [{"event": wor, "count": 1}]})


def test_event_dicts_round_trip_nested_events():
    event = dp.ComposedDpEvent([
        dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(1.0)), 5),
        dp.SampledWithoutReplacementDpEvent(100, 5, dp.LaplaceDpEvent(2.0)),
        dp.NoOpDpEvent(),
    ])
    d = event_to_dict(event)
    assert json.loads(json.dumps(d)) == d
    assert event_from_dict(d) == event


def test_accountant_configuration_and_arguments_are_checked():
    for kwargs in ({"accountant": "moments"}, {"neighboring": "replace_special"}, {"target_delta": 0},
                   {"target_delta": 1.0}, {"target_delta": "1e-5"}):
        with pytest.raises(ConfigError):
            PrivacyAccountant(**kwargs)
    acct = PrivacyAccountant()
    assert acct.epsilon() == 0.0 and acct.delta_for(1.0) == 0.0
    for count in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="count"):
            acct.step(dp.GaussianDpEvent(1.0), count)
    with pytest.raises(ConfigError, match="DpEvent"):
        acct.step("gaussian")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="epsilon must be"):
        acct.delta_for(-1.0)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        epsilon_for(0.0, 10, "all", mechanism="laplace")
    with pytest.raises(ConfigError, match="rounds"):
        epsilon_for(1.0, -1, "all")
    with pytest.raises(ConfigError, match="unknown mechanism"):
        epsilon_for(1.0, 1, "all", mechanism="exponential")


def test_delta_for_and_epsilon_agree():
    acct = PrivacyAccountant("pld", target_delta=1e-6)
    acct.step(round_event(dp.GaussianDpEvent(1.0), "poisson", sampling_probability=0.1), count=50)
    eps = acct.epsilon()
    assert acct.delta_for(eps) == pytest.approx(1e-6, rel=0.05)
    assert acct.delta_for(eps * 1.5) < 1e-6 < acct.delta_for(eps * 0.7)
    assert acct.epsilon(delta=1e-3) < eps
    no_noise = PrivacyAccountant()
    no_noise.step(dp.GaussianDpEvent(0.0))
    assert no_noise.epsilon() == float("inf") and no_noise.to_dict()["epsilon"] is None


def test_the_package_imports_without_dp_accounting():
    code = ("import sys; import privasr.privacy.dp, privasr.privacy.dp.accounting, privasr.cli.privacy;"
            "assert 'dp_accounting' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_unconverged_rdp_orders_are_dropped_quietly_and_the_bound_still_holds(caplog):
    import logging

    acct = PrivacyAccountant("rdp")
    with caplog.at_level(logging.WARNING, logger="absl"):
        acct.step(round_event(dp.GaussianDpEvent(0.5), "poisson", sampling_probability=0.1), count=20)
        eps = acct.epsilon()
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    # the same figure dp_accounting gives directly (the excluded orders do not change it)
    direct = dp.rdp.RdpAccountant().compose(
        dp.PoissonSampledDpEvent(0.1, dp.GaussianDpEvent(0.5)), 20).get_epsilon(1e-5)
    assert eps == pytest.approx(direct, rel=1e-12)


def test_rdp_evaluates_each_distinct_event_once_and_matches_dp_accounting():
    ev = round_event(dp.GaussianDpEvent(1.0), "without_replacement", sample_size=8, population=32)
    other = round_event(dp.GaussianDpEvent(2.0), "without_replacement", sample_size=8, population=32)
    acct = PrivacyAccountant("rdp", neighboring="replace_one")
    eps = []
    for r in range(6):
        acct.step(ev if r != 3 else other)
        eps.append(acct.epsilon())
    assert len(acct._curves) == 2  # one curve per distinct event, however many rounds
    direct = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE)
    half = round_event(dp.GaussianDpEvent(0.5), "without_replacement", sample_size=8, population=32)
    direct.compose(half, 3).compose(
        round_event(dp.GaussianDpEvent(1.0), "without_replacement", sample_size=8, population=32), 1).compose(half, 2)
    assert eps[-1] == pytest.approx(direct.get_epsilon(1e-5), rel=1e-12)
    assert eps == sorted(eps)


# -- the PLD cost guard (issue 23: a tiny noise multiplier ran 10 minutes and 6.6 GB) ---------------------------


def test_pld_guard_refuses_a_tiny_noise_multiplier_at_once() -> None:
    import time

    from privasr.privacy.dp.accounting import PldTooCostly, epsilon_for

    t0 = time.perf_counter()
    with pytest.raises(PldTooCostly, match=r"PLD accountant would need about \d+ minutes.*--accountant rdp"):
        epsilon_for(0.01, 100, "all", accountant="pld")
    with pytest.raises(PldTooCostly):
        epsilon_for(0.01, 100, "poisson", q=0.01, accountant="pld")
    assert time.perf_counter() - t0 < 5
    assert epsilon_for(0.01, 100, "all", accountant="rdp") > 0  # rdp stays available


def test_pld_cost_grows_as_the_noise_shrinks_and_ordinary_settings_pass() -> None:
    import dp_accounting

    from privasr.privacy.dp.accounting import PLD_MAX_SECONDS, PrivacyAccountant, pld_cost

    g = dp_accounting.GaussianDpEvent
    costs = [pld_cost(g(s), 100).seconds for s in (2.0, 1.0, 0.1, 0.01)]
    assert costs == sorted(costs) and costs[0] < costs[-1] / 50
    assert pld_cost(g(1.0), 100).seconds < PLD_MAX_SECONDS
    assert pld_cost(g(1.0), 100, "replace_one").points > pld_cost(g(1.0), 100).points
    acct = PrivacyAccountant("pld")
    acct.step(dp_accounting.LaplaceDpEvent(2.0), 4)
    acct.check_cost()  # cheap: passes
    acct.step(g(0.005), 10)
    with pytest.raises(ConfigError, match="to compose these 14 releases"):
        acct.epsilon()
