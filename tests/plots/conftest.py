"""Results dicts shaped as the runners write them (cut down from real runs), shared by the plot tests."""

from __future__ import annotations

import pytest

PNG = b"\x89PNG\r\n\x1a\n"


def history(rounds: int, start: float) -> list[dict]:
    return [{"round": r, "sampled": 4, "reported": 4, "dropped": {},
             "metrics": {"clients": 4.0, "loss": start - 0.1 * r, "update_norm": 2.0 - 0.05 * r,
                         "eval_ppl": 200.0 - 5 * r}} for r in range(rounds)]


@pytest.fixture()
def fedlm_results() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"wer": 0.169, "wer_baseline": 0.173, "wer_first_pass": 0.2,
                                                  "wer_rel_change": -0.02, "ppl": 145.0, "ppl_baseline": 218.0,
                                                  "ece": 0.02},
            "history": history(5, 5.0),
            "tables": {"loss": [{"loss": "none (unadapted)", "ppl": 218.0, "wer": 0.173, "ci_low": 0.0, "ci_high": 0.0},
                                {"loss": "token", "ppl": 145.0, "wer": 0.169, "ci_low": -0.007, "ci_high": -0.001}],
                       "noise": [{"noise_multiplier": 0.0, "ppl": 150.0, "wer": 0.1692, "epsilon": "inf"},
                                 {"noise_multiplier": 0.5, "ppl": 195.0, "wer": 0.1706, "epsilon": 27.8},
                                 {"noise_multiplier": 1.5, "ppl": 206.0, "wer": 0.1718, "epsilon": 3.8}]},
            "confidence": {"ece": 0.019, "auc": 0.79},
            "reliability": {"bin_lower": [0.0, 0.25, 0.5, 0.75], "bin_upper": [0.25, 0.5, 0.75, 1.0],
                            "bin_centre": [0.125, 0.375, 0.625, 0.875], "count": [0, 120, 300, 900],
                            "mean_confidence": [None, 0.4, 0.63, 0.9], "accuracy": [None, 0.45, 0.6, 0.91]}}


@pytest.fixture()
def fmp_results() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"wer": 0.1685, "wer_baseline": 0.1735,
                                                  "wer_baseline_system": "generic NNLM rescoring"},
            "history": [{"round": r, "metrics": {"clients": 16.0, "qbar_mass": 3000.0 * (r + 1),
                                                 "has_qbar": 1.0, "changed": 90.0 + r}} for r in range(4)],
            "tables": {"rounds": [{"T": t, "wer": 0.17 - 0.0005 * t, "mapsswe_p": 0.01, "ci_low": -0.0035 - 0.0005 * t,
                                   "ci_high": -0.0015 - 0.0005 * t} for t in (1, 2, 5, 10)],
                       "hyper": [{"alpha": 0.5, "beta": 0.25, "sigma": s, "wer": 0.168 + 0.0001 * s}
                                 for s in (0.1, 1.0, 5.0, 10.0)]
                       + [{"alpha": 0.0, "beta": 0.75, "sigma": 5.0, "wer": 0.1717}],
                       "epsilon": [{"epsilon_target": e, "epsilon": e, "delta": 1e-5, "wer": 0.172 - 0.0005 * e}
                                   for e in (0.1, 0.5, 1.0, 2.0)]}}


@pytest.fixture()
def audit_results() -> dict:
    return {"config": {}, "seed": 0, "metrics": {},
            "sections": {
                "fmp": {"games": {"aggregate": {"eps_lb": 2.59, "eps_lb_max": 2.59, "tpr": 1.0, "fpr": 0.0,
                                                "roc": {"fpr": [0.0, 0.0, 1.0], "tpr": [0.0, 1.0, 1.0]}},
                                  "dp_aggregate": {"eps_lb": 0.0, "eps_lb_max": 2.6, "epsilon_accountant": 1.0}}},
                "fmp_checkpoint": {"auc": 0.9, "roc": {"fpr": [0.0, 0.1, 0.5, 1.0], "tpr": [0.0, 0.6, 0.95, 1.0]}},
                "fedlm_checkpoint": {"attacks": {"loss": {"auc": 0.67, "roc": {"fpr": [0, 0.5, 1],
                                                                               "tpr": [0, 0.7, 1]}}}},
                "fedlm": {"exposure": {"repetitions": [1, 4, 16], "max_exposure": 10.97, "rows": [
                    {"setting": "no DP", "noise_multiplier": None, "epsilon": None,
                     "exposure": {"1": 1.3, "4": 3.1, "16": 7.9}, "baseline": 1.55},
                    {"setting": "DP", "noise_multiplier": 1.0, "epsilon": 9.0,
                     "exposure": {"1": 1.7, "4": 1.3, "16": 1.9}, "baseline": 1.6}]}}}}


@pytest.fixture()
def demo_like() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"wer": 0.155, "wer_baseline": 0.21},
            "systems": [{"system": "first-pass 1-best", "wer": 0.2102}, {"system": "n-gram rescoring", "wer": 0.155},
                        {"system": "N-best oracle (upper bound)", "wer": 0.1185}],
            "per_client": [{"client": f"c{k}", "wer_1best": 0.2 + 0.01 * k, "wer_ngram_rescoring": 0.15 + 0.01 * k}
                           for k in range(6)]}


@pytest.fixture()
def ftl_like() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"target_loss": 0.6, "wer_seed": 0.85, "cer_seed": 0.3},
            "runs": {"ftl": {"valid_loss": [0.7, 0.5, 0.45], "train_loss": [0.8, 0.6, 0.5], "wer": 0.8, "cer": 0.2,
                             "label": "FTL (client SGD + server Adam, softmax weighting)"},
                     "baseline": {"valid_loss": [0.7, 0.6, 0.55], "train_loss": [0.8, 0.7, 0.6], "wer": 0.82,
                                  "cer": 0.25, "label": "FedAvg (client SGD, count weighting)"}}}


@pytest.fixture()
def compare_like() -> dict:
    return {"config": {"a": "ftl", "b": "baseline"},
            "metrics": {"difference": -0.012, "ci_low": -0.02, "ci_high": -0.004,
                        "per_run": [{"run": f"seed{k}", "wer_a": 0.20 - 0.01 * k, "wer_b": 0.21 - 0.008 * k}
                                    for k in range(3)]}}


@pytest.fixture()
def names_like() -> dict:
    return {"config": {}, "seed": 0, "metrics": {"target": 0.02, "survival": 0.006, "by_shape": {
        s: {"names": 300, "survival": v, "collateral": 0.0} for s, v in (
            ("first_last", 0.003), ("particle", 0.01), ("initials", 0.017), ("apostrophe", 0.0))}}}
