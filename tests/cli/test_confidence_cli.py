"""``privasr confidence train`` and ``privasr confidence apply``."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from privasr.cli import main
from privasr.corpus.formats.nbest_jsonl import read_nbest, write_nbest
from privasr.corpus.records import Hypothesis, NBest

pytest.importorskip("sklearn")

VOCAB = [f"w{i}" for i in range(40)]


def make_nbests(n: int, seed: int = 0, refs: bool = True) -> list[NBest]:
    """N-best lists where the other hypotheses tend to agree with correct 1-best words and not with wrong ones."""
    rng = np.random.default_rng(seed)
    out = []
    for u in range(n):
        ref = [VOCAB[i] for i in rng.integers(0, len(VOCAB), rng.integers(3, 9))]
        wrong = rng.uniform(size=len(ref)) < 0.3
        best = [VOCAB[rng.integers(len(VOCAB))] + "x" if w else r for r, w in zip(ref, wrong, strict=True)]
        hyps = [best]
        for _ in range(4):
            keep = np.where(wrong, rng.uniform(size=len(ref)) < 0.3, rng.uniform(size=len(ref)) < 0.9)
            hyps.append([b if k else VOCAB[rng.integers(len(VOCAB))] + "y" for b, k in zip(best, keep, strict=True)])
        totals = -np.sort(rng.uniform(0, 3, len(hyps)))
        out.append(NBest(f"utt{u:03d}", tuple(Hypothesis(tuple(h), scores={"am": 10 * t - 5, "lm": -4.0 - t,
                                                                                "total": float(t)})
                                              for h, t in zip(hyps, totals, strict=True)),
                         client=f"c{u % 5}", ref=tuple(ref) if refs else None))
    return out


@pytest.fixture(scope="module")
def nbest_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("conf") / "train.jsonl"
    write_nbest(p, make_nbests(150))
    return p


@pytest.fixture(scope="module")
def trained(nbest_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    assert main(["confidence", "train", "--nbest", str(nbest_file), "--out", str(out), "--seed", "3"]) == 0
    return out


def test_train_writes_results_with_ece_and_auc(trained, nbest_file):
    res = json.loads((trained / "results.json").read_text())
    m = res["metrics"]
    assert res["seed"] == 3 and res["config"]["kind"] == "gbm" and res["data"]["nbest"]["sha256"]
    for k in ("ece", "auc", "nce", "brier", "ece_uncalibrated", "auc_uncalibrated"):
        assert isinstance(m[k], float) and math.isfinite(m[k]), k
    assert m["auc"] > 0.8 and m["ece"] < 0.15  # the agreement feature is strongly informative here
    assert m["n_test_utterances"] == 30
    assert m["n_train_utterances"] + m["n_calibration_utterances"] == 120
    rel = m["reliability"]
    assert len(rel["bin_centre"]) == 15 and sum(rel["count"]) == m["n_words"]
    lines = (trained / "reliability.csv").read_text().splitlines()
    assert len(lines) == 16 and lines[0].startswith("bin_lower,")
    assert (trained / "model.npz").is_file() and res["model"]["info"]["kind"] == "gbm"


def test_train_is_deterministic(trained, nbest_file, tmp_path):
    assert main(["confidence", "train", "--nbest", str(nbest_file), "--out", str(tmp_path), "--seed", "3"]) == 0
    a = json.loads((trained / "results.json").read_text())["metrics"]
    b = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert a == b


def test_train_mlp(nbest_file, tmp_path, capsys):
    assert main(["confidence", "train", "--nbest", str(nbest_file), "--out", str(tmp_path), "--kind", "mlp",
                 "--bins", "10"]) == 0
    assert "AUC" in capsys.readouterr().out
    m = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert m["auc"] > 0.8 and len(m["reliability"]["count"]) == 10


def test_apply_writes_one_best_confidences(trained, tmp_path):
    from privasr.confidence.model import ConfidenceModel

    recs = make_nbests(12, seed=9, refs=False)
    src = tmp_path / "clients.jsonl"
    write_nbest(src, recs)
    out = tmp_path / "with_conf.jsonl"
    assert main(["confidence", "apply", "--model", str(trained), "--nbest", str(src), "--out", str(out)]) == 0
    back = read_nbest(out)
    model = ConfidenceModel.load(trained / "model.npz")
    assert [r.utt_id for r in back] == [r.utt_id for r in recs]
    for r, b in zip(recs, back, strict=True):
        np.testing.assert_allclose(b.best.confidences, model.predict(r))
        assert b.hyps[1:] == r.hyps[1:] and b.best.words == r.best.words and b.client == r.client


@pytest.mark.parametrize("args,needle", [
    (["--kind", "svm"], "unknown --kind"),
    (["--test-fraction", "1.5"], "--test-fraction"),
])
def test_train_bad_options(nbest_file, tmp_path, capsys, args, needle):
    assert main(["confidence", "train", "--nbest", str(nbest_file), "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_train_bad_inputs(tmp_path, capsys):
    assert main(["confidence", "train", "--nbest", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)]) == 2
    assert "no such file" in capsys.readouterr().err
    noref = tmp_path / "noref.jsonl"
    write_nbest(noref, make_nbests(10, refs=False))
    assert main(["confidence", "train", "--nbest", str(noref), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "have no reference" in err and "utt000" in err and len(err.strip().splitlines()) == 1


def test_apply_bad_model(tmp_path, capsys, nbest_file):
    (tmp_path / "model.npz").write_bytes(b"garbage")
    assert main(["confidence", "apply", "--model", str(tmp_path), "--nbest", str(nbest_file),
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "not a confidence model" in capsys.readouterr().err


def test_train_without_a_feature_and_the_datas_own_confidences(nbest_file, tmp_path, capsys):
    # lists whose 1-best carries its own (decoder) confidences: 0.9 on right words, 0.2 on wrong ones
    recs = []
    for r in make_nbests(150):
        ok = [b == w for b, w in zip(r.best.words, r.ref, strict=True)]
        recs.append(r.with_hyps((replace(r.best, confidences=tuple(0.9 if k else 0.2 for k in ok)), *r.hyps[1:])))
    own = tmp_path / "own.jsonl"
    write_nbest(own, recs)
    assert main(["confidence", "train", "--nbest", str(own), "--out", str(tmp_path / "with")]) == 0
    assert main(["confidence", "train", "--nbest", str(own), "--out", str(tmp_path / "without"),
                 "--exclude", "decoder_confidence", "--exclude", "agreement"]) == 0
    assert "the data's own" in capsys.readouterr().out
    w, wo = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("with", "without"))
    assert "decoder_confidence" in w["config"]["features"]
    assert "decoder_confidence" not in wo["config"]["features"] and "agreement" not in wo["config"]["features"]
    assert w["metrics"]["data_confidence"]["auc"] == 1.0  # the data's own, as they are
    # the weight a confidence-weighted loss puts on wrong words: less than their share of the words
    own = w["metrics"]["data_confidence"]
    assert 0 < own["wrong_weight_share"] < 1 - own["base_rate"]
    assert w["metrics"]["auc"] > 0.999 and w["metrics"]["auc"] > wo["metrics"]["auc"]


def test_lists_without_their_own_confidences_report_none(trained):
    assert "data_confidence" not in json.loads((trained / "results.json").read_text())["metrics"]


@pytest.mark.parametrize("exclude", ["pitch", "posterior,agreement"])
def test_train_bad_exclude(nbest_file, tmp_path, capsys, exclude):
    assert main(["confidence", "train", "--nbest", str(nbest_file), "--out", str(tmp_path), "--exclude", exclude]) == 2
    err = capsys.readouterr().err
    assert "--exclude" in err and "Traceback" not in err
