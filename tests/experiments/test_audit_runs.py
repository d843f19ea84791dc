"""The audits of finished runs: a fedlm run's released model against its clients' sentences."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from privasr.errors import InputError  # noqa: E402
from privasr.experiments.audit import load_audit_config, run_audit  # noqa: E402
from privasr.experiments.audit_runs import roc_summary  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished fedlm run on the small corpus that memorises its 10 dev clients' text (FedAvg, client step 1,
    two local epochs, 4 rounds, no DP); the test lists are the held-out data."""
    from privasr.experiments.fedlm import load_fedlm_config, run_fedlm
    from privasr.synth import SynthConfig, generate

    tmp = tmp_path_factory.mktemp("fedlm-run")
    generate(SynthConfig.preset("small", seed=1)).write(tmp / "synth")
    background = str(tmp / "synth" / "text" / "background.txt")
    raw = {"name": "audit-runs-test", "seed": 0,
           "data": {"kind": "nbest", "dev": str(tmp / "synth" / "nbest" / "dev.jsonl"),
                    "test": str(tmp / "synth" / "nbest" / "test.jsonl")},
           "clients": {"key": "client"},
           "nnlm": {"neural": {"train": {"text": background, "valid": background, "preset": "tiny-transformer",
                                         "seed": 0, "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                                "patience": 0, "amp": False}}}},
           "cache_dir": str(tmp / "cache"),
           "fedlm": {"loss": "all", "batch_size": 8, "client_lr": 1.0, "local_epochs": 5, "server": "fedavg"},
           "rounds": 6, "compare_all": False, "federated": {"backend": "local", "sampler": "all"},
           "rescore": {"ranges": {"lm": [0, 1, 1], "nnlm": [0, 1, 1], "word_penalty": [0, 0, 1]}, "max_rounds": 1},
           "eval": {"bootstrap_resamples": 10}}
    run_fedlm(load_fedlm_config(raw), tmp / "run")
    return tmp / "run"


def test_roc_summary_of_separable_and_identical_scores():
    r = roc_summary([2.0, 3.0], [0.0, 1.0])
    assert r["auc"] == 1.0 and r["tpr_at_fpr"] == {"0.01": 1.0, "0.1": 1.0}
    r = roc_summary([1.0] * 50, [1.0] * 50)
    assert r["auc"] == 0.5 and r["tpr_at_fpr"]["0.01"] == 0.0


def test_a_memorising_fedlm_run_gives_its_members_away(finished, tmp_path):
    m = run_audit(load_audit_config({"seed": 0, "fedlm_checkpoint": {"run": str(finished)}}), tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    c = res["sections"]["fedlm_checkpoint"]
    assert c["member_sentences"] >= 10 and c["non_member_sentences"] >= 10 and c["epsilon_run"] is None
    # the fine-tuned model fits its clients' sentences better than held-out ones: the calibrated attack sees it
    assert c["nll"]["members_released"] < c["nll"]["members_start"]
    assert m["fedlm_checkpoint_loss_drop_auc"] > 0.65  # under the null hypothesis 0.5 +- 0.02
    assert m["fedlm_checkpoint_loss_drop_tpr_at_fpr_0.1"] > 0.2
    report = (tmp_path / "out" / "report.md").read_text()
    assert "a finished run's released model" in report and "not an epsilon bound" in report


def test_a_release_equal_to_the_starting_model_gives_nothing_away(finished, tmp_path):
    """The audit never claims leakage the release cannot carry: released = starting model, every loss drop 0."""
    from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    cache = json.loads((finished / "results.json").read_text())["config"]["cache_dir"]
    start = next(Path(cache).rglob("*.pt"))
    ck = load_checkpoint(start)
    save_checkpoint(run / "model.pt", ck.model, ck.vocab, ck.config)
    m = run_audit(load_audit_config({"fedlm_checkpoint": {"run": str(run)}}), tmp_path / "out")
    assert m["fedlm_checkpoint_loss_drop_auc"] == 0.5
    assert m["fedlm_checkpoint_loss_drop_tpr_at_fpr_0.01"] == 0.0


def test_a_folder_that_is_not_a_finished_fedlm_run_is_refused(finished, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="not a finished `privasr fedlm run`"):
        run_audit(load_audit_config({"fedlm_checkpoint": {"run": str(tmp_path / "empty")}}), tmp_path / "o1")
    run = tmp_path / "other"
    shutil.copytree(finished, run)
    from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint
    from privasr.lm.neural.vocab import Vocabulary

    ck = load_checkpoint(run / "model.pt")
    words = list(ck.vocab.words)
    words[3], words[4] = words[4], words[3]
    save_checkpoint(run / "model.pt", ck.model, Vocabulary(tuple(words)), ck.config)
    with pytest.raises(InputError, match="not a fine-tuning of the run's NNLM"):
        run_audit(load_audit_config({"fedlm_checkpoint": {"run": str(run)}}), tmp_path / "o2")
