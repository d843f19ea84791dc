"""The federated NNLM fine-tuning experiment (paper 001): confidence-weighted client losses, FedAdam, DP.

``privasr fedlm run --config configs/fedlm-earnings21.yaml --out DIR`` does (and writes ``DIR/results.json``,
``DIR/report.md`` and the adapted model ``DIR/model.pt``, a neural checkpoint that rescoring configs load):

1. **The server's NNLM** is pre-trained on background text only (a rescoring config's ``neural`` LM spec,
   :mod:`privasr.rescore.run`, trained once and cached in ``cache_dir``), or -- ``init: scratch`` -- the same
   network and vocabulary freshly initialised (paper 001 Table 4).
2. **Clients** hold first-pass transcripts, never references:

   * ``data.kind: earnings21``: the words of one Kaldi system's CTMs (``data.ctm``, a tar of ``<call>.ctm``)
     with their per-word confidences, cut into utterances at pauses longer than ``data.split_gap`` seconds,
     lowercased (tokens without a letter or digit dropped, like the references); the calls listed in
     ``data.eval_calls`` (a CSV with a ``file_id`` column, e.g. ``eval10-file-metadata.csv``, or a list) are
     held out and evaluated on their *reference* transcripts (``data.references``, sentences as
     :func:`~privasr.corpus.sources.earnings21_reference_sentences`); the other calls are the clients. The
     CTM confidences are used as given, or -- ``confidence.calibrate_calls: N`` -- mapped by an isotonic
     regression fitted on the first ``N`` client calls with references (which then stop being clients: a
     small labelled set on the server side); with ``confidence.source: classifier`` those calls instead train
     a word-confidence classifier (``confidence.kind``, isotonic-calibrated) on CTM features
     (:mod:`privasr.confidence.ctm`: the decoder's confidences, durations, pauses, and word frequencies in
     ``confidence.background``, a text source or file the server holds; default the NNLM's training text),
     which then gives every client word its confidence (each client computes it on device). Their calibration
     (ECE, AUC; raw and calibrated or predicted) is measured on the evaluation calls' CTM words aligned to
     the references (jiwer, whole calls).
   * ``data.kind: nbest``: the 1-best of every ``data.dev`` N-best list is client text (``data.client_text:
     reference`` trains on the dev references instead: an oracle, the most the same amount of clean in-domain
     text could give, never a result of the method); ``data.test`` is
     evaluated (perplexity of its references, and N-best rescoring WER). Per-word confidences come from the
     data when it has them, otherwise from a :class:`~privasr.confidence.model.ConfidenceModel` trained on
     the dev lists' references and **cross-fitted by meeting** (``confidence.folds`` folds: a meeting's
     confidences come from a classifier that never saw its references); its held-out ECE/AUC are reported.

   ``confidence.source: oracle`` (both kinds) is the other diagnostic: every client word's confidence is 1 if
   the reference confirms it (a hit in the alignment of the first pass against the reference) and 0 if not --
   perfect confidences, the most any confidence classifier could give the weighted losses.

   ``clients.key`` groups utterances into clients: ``client`` (the call / meeting), ``speaker``, or
   ``zipf`` (``clients.devices`` simulated devices drawn from a Zipf law with ``clients.exponent``,
   :func:`~privasr.corpus.partition.zipf_devices`).
3. **Federated fine-tuning** (:class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm`) for ``rounds``
   rounds through :func:`~privasr.federated.loop.run_federated` (``local``/``ray`` backends, checkpointed
   every round in ``OUT/checkpoint/<variant>`` and resumed) or Flower's simulation engine. With ``dp``,
   every client's delta is clipped to ``fedlm.clip_norm`` and the loop adds Gaussian noise with
   ``dp.noise_multiplier`` once per round; ``epsilon`` comes from the accountant for the sampler used.
4. **Evaluation**: perplexity (natural-log cross entropy per target incl. ``</s>``, ``<unk>`` a word like any
   other: closed-vocabulary, identical vocabulary for every system; the OOV rate is reported) of the
   unadapted and adapted models. ``nbest`` data is also rescored: ``am + w_lm * first-pass LM + w_nnlm *
   NNLM + wp * n`` with the weights tuned on dev **for each model**, test WER, MAPSSWE against the unadapted
   model, paired bootstrap; ``rescore.with_baseline: true`` keeps the unadapted NNLM as a second feature of the
   adapted system (log-linear interpolation, both weights tuned on dev).
   With Earnings-21's labelled calls (``confidence.calibrate_calls``) their references are also a
   **development set** on the server: every model's ``ppl_dev`` is reported there, so settings such as the
   threshold are chosen without looking at the evaluation calls.
5. ``compare_all`` (default on) runs the same config with ``loss: all`` for ``ppl_all_utts``; ``tables``
   re-run the federation per row: ``loss`` (paper Tables 2/3), ``init`` (Table 4), ``noise`` (Table 5, DP
   with those noise multipliers; needs ``fedlm.clip_norm``), ``threshold`` (``loss: threshold`` at each
   utterance-confidence threshold, with the share of client words it keeps).

Only :class:`~privasr.federated.core.Update` objects of float32 parameter deltas cross to the server.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.corpus.formats.ctm import ctm_utterances
from privasr.corpus.formats.earnings21_calls import read_call_ids
from privasr.errors import ConfigError, InputError

__all__ = ["FedLmRunConfig", "load_fedlm_config", "run_fedlm", "MODEL_FILE"]

MODEL_FILE = "model.pt"
"""The adapted model's checkpoint inside a run's output folder."""

_TOP = ("name", "seed", "data", "clients", "confidence", "nnlm", "cache_dir", "init", "fedlm", "rounds", "dp",
        "federated", "compare_all", "tables", "rescore", "eval")
_DP_KEYS = ("noise_multiplier", "delta", "accountant", "neighboring")
_TABLE_KEYS = ("loss", "init", "noise", "threshold")


@dataclass(frozen=True)
class FedLmRunConfig:
    """A validated FedLM experiment config (:func:`load_fedlm_config`); ``raw`` is the resolved dict."""

    name: str
    seed: int
    kind: str
    data: dict[str, Any]
    client_key: str
    devices: int
    exponent: float
    confidence: dict[str, Any]
    nnlm: Any
    cache_dir: Path | None
    init: str
    fedlm: dict[str, Any]
    rounds: int
    dp: dict[str, Any] | None
    backend: str
    backend_options: dict[str, Any]
    sampler: Any
    min_clients: int
    compare_all: bool
    tables: dict[str, list[Any]]
    search: Any
    bootstrap_resamples: int
    eval_every: int
    raw: Mapping[str, Any] = field(repr=False)
    with_baseline: bool = False


def load_fedlm_config(config: Mapping[str, Any], *, check_files: bool = True) -> FedLmRunConfig:
    """Validate a FedLM config (see ``configs/fedlm-earnings21.yaml``) before any work; unknown keys are errors.

    >>> load_fedlm_config({"data": {"kind": "nbest"}}, check_files=False)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'data' (kind nbest) needs dev and test (expected {kind: nbest, dev: PATH, test: PATH})
    """
    from privasr.federated.algorithms.fedlm import LOSSES, FedLmConfig
    from privasr.rescore.run import (
        SearchConfig,
        _int,
        _mapping,
        _path,
        _ranges,
        _str,
        expand_vars,
        federation_settings,
        server_nnlm,
    )

    raw = _mapping(copy.deepcopy(dict(config)), "config", _TOP)
    name = _str(raw.get("name", "fedlm"), "name")
    seed = _int(raw.get("seed", 0), "seed", 0)
    d = _mapping(raw.get("data"), "data")
    kind = _str(d.get("kind"), "data.kind", ("nbest", "earnings21"))
    data: dict[str, Any] = {"kind": kind}
    if kind == "nbest":
        _mapping(d, "data", ("kind", "dev", "test", "client_text"))
        if "dev" not in d or "test" not in d:
            raise ConfigError("config key 'data' (kind nbest) needs dev and test",
                              expected="{kind: nbest, dev: PATH, test: PATH}")
        data["client_text"] = _str(d.get("client_text", "first_pass"), "data.client_text",
                                   ("first_pass", "reference"))
        data["dev"] = _path(expand_vars(str(d["dev"])), "data.dev", check_files)
        data["test"] = _path(expand_vars(str(d["test"])), "data.test", check_files)
    else:
        _mapping(d, "data", ("kind", "ctm", "references", "eval_calls", "split_gap"))
        for k in ("ctm", "references", "eval_calls"):
            if k not in d:
                raise ConfigError(f"config key 'data' (kind earnings21) needs {k}",
                                  expected="{kind: earnings21, ctm: PATH, references: PATH, eval_calls: CSV or list}")
        data["ctm"] = _path(expand_vars(str(d["ctm"])), "data.ctm", check_files)
        data["references"] = _path(expand_vars(str(d["references"])), "data.references", check_files)
        ev = d["eval_calls"]
        if isinstance(ev, list):
            if not ev or not all(isinstance(x, str | int) and not isinstance(x, bool) for x in ev):
                raise ConfigError("config key 'data.eval_calls' is an empty or non-string list",
                                  expected="call ids, or a CSV with a file_id column")
            data["eval_calls"] = [str(x) for x in ev]
        else:
            data["eval_calls"] = _path(expand_vars(str(ev)), "data.eval_calls", check_files)
        gap = d.get("split_gap", 1.0)
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0 or not math.isfinite(gap):
            raise ConfigError(f"config key 'data.split_gap' is {gap!r}", expected="seconds > 0")
        data["split_gap"] = float(gap)
    c = _mapping(raw.get("clients", {}), "clients", ("key", "devices", "exponent"))
    key = _str(c.get("key", "client"), "clients.key", ("client", "speaker", "zipf"))
    if key == "speaker" and kind == "earnings21":
        raise ConfigError("clients.key 'speaker' with Earnings-21 CTMs", expected="client (call) or zipf: the "
                                                                                  "CTMs have no speaker labels")
    devices = _int(c.get("devices", 8000), "clients.devices", 1)
    exponent = c.get("exponent", 1.0)
    if isinstance(exponent, bool) or not isinstance(exponent, int | float) or not 0 <= exponent < math.inf:
        raise ConfigError(f"config key 'clients.exponent' is {exponent!r}", expected="a number >= 0")
    conf = _mapping(raw.get("confidence", {}), "confidence", ("source", "kind", "folds", "calibrate_calls",
                                                             "background"))
    default_src = "data" if kind == "earnings21" else "auto"
    confidence = {"source": _str(conf.get("source", default_src), "confidence.source",
                                 ("auto", "data", "classifier", "none", "oracle")),
                  "kind": _str(conf.get("kind", "gbm"), "confidence.kind", ("gbm", "mlp")),
                  "folds": _int(conf.get("folds", 2), "confidence.folds", 2),
                  "calibrate_calls": _int(conf.get("calibrate_calls", 0), "confidence.calibrate_calls", 0)}
    if confidence["calibrate_calls"] and (kind != "earnings21" or confidence["source"] not in ("data", "classifier")):
        raise ConfigError("confidence.calibrate_calls needs Earnings-21 CTM confidences",
                          expected="data.kind: earnings21 with confidence.source: data or classifier")
    if confidence["source"] == "classifier" and kind == "earnings21" and not confidence["calibrate_calls"]:
        raise ConfigError("confidence.source 'classifier' on Earnings-21 CTMs needs labelled calls to train on",
                          expected="confidence.calibrate_calls >= 1")
    nnlm, cache_dir = server_nnlm(raw, check_files)
    if confidence["source"] == "classifier" and kind == "earnings21":
        default_bg = (nnlm.neural or {}).get("train", {}).get("text") if isinstance(
            (nnlm.neural or {}).get("train"), Mapping) else None
        bg = conf.get("background", default_bg)
        if bg is None:
            raise ConfigError("confidence.background is not set and the NNLM spec names no training text",
                              expected="a text source or file for the word-frequency features")
        confidence["background"] = expand_vars(str(bg))
    elif "background" in conf:
        raise ConfigError("confidence.background applies to the CTM classifier only",
                          expected="data.kind: earnings21 with confidence.source: classifier")
    init = _str(raw.get("init", "pretrained"), "init", ("pretrained", "scratch"))
    fed_cfg = _mapping(raw.get("fedlm", {}), "fedlm")
    try:
        FedLmConfig.from_dict(fed_cfg)
    except ConfigError as e:
        raise ConfigError(f"config key 'fedlm': {e.message}", expected=e.expected) from None
    rounds = _int(raw.get("rounds", 10), "rounds", 1)
    dp = None
    if raw.get("dp") is not None:
        dp = _mapping(raw["dp"], "dp", _DP_KEYS)
        if fed_cfg.get("clip_norm") is None:
            raise ConfigError("config key 'dp' needs fedlm.clip_norm", expected="fedlm: {clip_norm: 0.5, "
                                                                                "weighting: uniform}")
        z = dp.get("noise_multiplier")
        if isinstance(z, bool) or not isinstance(z, int | float) or not 0 <= z < math.inf:
            raise ConfigError(f"config key 'dp.noise_multiplier' is {z!r}", expected="a number >= 0")
        dp["noise_multiplier"] = float(z)
        delta = dp.get("delta", 1e-5)
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
            raise ConfigError(f"config key 'dp.delta' is {delta!r}", expected="a number in (0, 1)")
        dp["delta"] = float(delta)
        dp["accountant"] = _str(dp.get("accountant", "rdp"), "dp.accountant", ("rdp", "pld"))
        dp["neighboring"] = _str(dp.get("neighboring", "auto"), "dp.neighboring",
                                 ("auto", "add_or_remove_one", "replace_one"))
    backend, backend_options, sampler, min_clients = federation_settings(raw)
    compare_all = raw.get("compare_all", True)
    if not isinstance(compare_all, bool):
        raise ConfigError(f"config key 'compare_all' is {compare_all!r}", expected="true or false")
    t = _mapping(raw.get("tables", {}), "tables", _TABLE_KEYS)
    tables: dict[str, list[Any]] = {}
    if "loss" in t:
        tables["loss"] = [_str(x, "tables.loss", LOSSES) for x in (t["loss"] or [])]
    if "init" in t:
        tables["init"] = [_str(x, "tables.init", ("pretrained", "scratch")) for x in (t["init"] or [])]
    if "noise" in t:
        if fed_cfg.get("clip_norm") is None:
            raise ConfigError("config key 'tables.noise' needs fedlm.clip_norm", expected="fedlm: {clip_norm: 0.5, "
                                                                                        "weighting: uniform}")
        vals = t["noise"] or []
        if not isinstance(vals, list) or not all(isinstance(x, int | float) and not isinstance(x, bool) and x >= 0
                                                 for x in vals):
            raise ConfigError(f"config key 'tables.noise' is {vals!r}", expected="a list of noise multipliers >= 0")
        tables["noise"] = [float(x) for x in vals]
    if "threshold" in t:
        vals = t["threshold"] or []
        if not isinstance(vals, list) or not all(isinstance(x, int | float) and not isinstance(x, bool)
                                                 and 0 <= x <= 1 for x in vals):
            raise ConfigError(f"config key 'tables.threshold' is {vals!r}", expected="a list of thresholds in [0, 1]")
        tables["threshold"] = [float(x) for x in vals]
    r = _mapping(raw.get("rescore", {}), "rescore", ("ranges", "max_rounds", "coarse_points", "restarts",
                                                    "with_baseline"))
    with_baseline = r.get("with_baseline", False)
    if not isinstance(with_baseline, bool):
        raise ConfigError(f"config key 'rescore.with_baseline' is {with_baseline!r}", expected="true or false")
    search = SearchConfig(method="coordinate", ranges=_ranges(r.get("ranges", {})),
                          max_rounds=_int(r.get("max_rounds", 20), "rescore.max_rounds", 1),
                          coarse_points=_int(r.get("coarse_points", 7), "rescore.coarse_points", 2),
                          restarts=_int(r.get("restarts", 3), "rescore.restarts", 0))
    ev = _mapping(raw.get("eval", {}), "eval", ("bootstrap_resamples", "every"))
    resamples = _int(ev.get("bootstrap_resamples", 1000), "eval.bootstrap_resamples", 1)
    every = _int(ev.get("every", 0), "eval.every", 0)
    return FedLmRunConfig(name, seed, kind, data, key, devices, float(exponent), confidence, nnlm, cache_dir, init,
                          fed_cfg, rounds, dp, backend, backend_options, sampler, min_clients, compare_all, tables,
                          search, resamples, every, raw, with_baseline)


# ------------------------------------------------------------------------------------------------ data


@dataclass
class _Data:
    """Client utterances (words + confidences), evaluation text, and for N-best data the lists themselves."""

    clients: list[tuple[str, list[tuple[tuple[str, ...], np.ndarray | None]]]]
    eval_sentences: list[tuple[str, ...]]
    info: dict[str, Any]
    dev: list[Any] | None = None
    test: list[Any] | None = None
    confidence_report: dict[str, Any] | None = None
    reliability: Any = None
    dev_sentences: list[tuple[str, ...]] | None = None


def _group(utts: Sequence[Any], cfg: FedLmRunConfig) -> list[Any]:
    from privasr.corpus.partition import by_key, zipf_devices

    if cfg.client_key == "zipf":
        return list(zipf_devices(list(utts), n_devices=cfg.devices, exponent=cfg.exponent, seed=cfg.seed))
    return list(by_key(utts, cfg.client_key))


def _earnings21(cfg: FedLmRunConfig) -> _Data:
    from privasr.corpus.sources import earnings21_reference_sentences

    d = cfg.data
    utts = ctm_utterances(d["ctm"], d["split_gap"])
    evals = d["eval_calls"] if isinstance(d["eval_calls"], list) else read_call_ids(d["eval_calls"])
    refs = earnings21_reference_sentences(d["references"])
    missing = [c for c in evals if c not in refs]
    if missing:
        raise InputError(f"evaluation calls {missing[:5]} have no reference transcript", path=d["references"],
                         expected="every eval call in the references")
    held = set(evals)
    train = [u for u in utts if u.client not in held]
    n_cal = cfg.confidence["calibrate_calls"]
    report = curve = None
    calib: list[str] = []
    mapping = classifier = bg = None
    if n_cal:
        # the first n_cal client calls with a reference become a labelled calibration set (not clients)
        calib = sorted({u.client for u in train if u.client in refs})[:n_cal]
        if len(calib) < n_cal:
            raise InputError(f"confidence.calibrate_calls={n_cal} but only {len(calib)} client calls have "
                             "references", path=d["references"], expected="fewer calibration calls")
        if cfg.confidence["source"] == "classifier":
            classifier, bg = _ctm_classifier([u for u in train if u.client in calib], refs, calib, cfg)
        else:
            mapping = _isotonic(*_ctm_labels([u for u in train if u.client in calib], refs, calib))
        train = [u for u in train if u.client not in calib]
    if not train:
        raise InputError("no client call is left after holding out the evaluation (and calibration) calls",
                         path=d["ctm"])
    # the confidences' calibration, measured on the evaluation calls' CTM words against their references
    ev_conf, ev_hit = _ctm_labels([u for u in utts if u.client in held], refs, evals)
    from privasr.confidence.model import ConfidenceReport

    raw_rep = ConfidenceReport.compute(ev_conf, ev_hit, n_utterances=0, calibrated=False)
    report = {"ece_raw": raw_rep.ece, "auc_raw": raw_rep.auc, "base_rate": raw_rep.base_rate,
              "mean_confidence_raw": raw_rep.mean_confidence, "measured_on": "evaluation calls", "n_words":
              raw_rep.n_words}
    curve = raw_rep.reliability

    def conf_of(u: Any) -> np.ndarray:
        if classifier is not None:
            from privasr.confidence.ctm import ctm_word_features

            return classifier.predict_features(ctm_word_features(u, bg))
        c = np.asarray(u.confidences, dtype=np.float64)
        return np.interp(c, *mapping) if mapping is not None else c

    if mapping is not None or classifier is not None:
        ev_pred = np.concatenate([conf_of(u) for c in evals for u in utts if u.client == c] or [np.zeros(0)])
        cal_rep = ConfidenceReport.compute(ev_pred, ev_hit, n_utterances=0, calibrated=True)
        report.update(cal_rep.as_dict(), calibration_calls=calib,
                      method="ctm classifier" if classifier is not None else "isotonic map of the CTM confidences")
        if classifier is not None:
            report["classifier"] = classifier.info
        curve = cal_rep.reliability

    if cfg.confidence["source"] == "oracle":  # the diagnostic: 1 for a word the reference confirms, else 0
        missing = sorted({u.client for u in train} - set(refs))
        if missing:
            raise InputError(f"confidence.source 'oracle' needs every client call's reference; {missing[:5]} have "
                             "none", path=d["references"], expected="references for the client calls")
        train_conf = {}
        for call in sorted({u.client for u in train}):
            us = [u for u in train if u.client == call]
            train_conf.update({u.utt_id: h.astype(np.float64) for u, h in zip(us, _call_hits(us, refs[call]),
                                                                              strict=True)})
    else:
        train_conf = {u.utt_id: conf_of(u) for u in train}  # once per utterance (the classifier is not free)
    clients = [(c.id, [(u.words, train_conf[u.utt_id]) for u in c.utterances]) for c in _group(train, cfg)]
    eval_sents = [s for c in evals for s in refs[c]]
    conf = np.concatenate(list(train_conf.values()))
    info = {"eval_calls": evals, "client_calls": sorted({u.client for u in train}), "calibration_calls": calib,
            "utterances": len(train), "words": int(sum(len(u.words) for u in train)),
            "mean_confidence": float(conf.mean()), "low_confidence_share": float((conf < 0.9).mean()),
            "words_per_utterance": float(np.mean([len(u.words) for u in train]))}
    # the labelled calls' references: a development set on the server for choices such as the threshold
    dev_sents = [s for c in calib for s in refs[c]] or None
    return _Data(clients, eval_sents, info, confidence_report=report, reliability=curve, dev_sentences=dev_sents)


def _call_hits(us: Sequence[Any], ref_sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Per utterance of one call (in order), whether each CTM word is a hit in the Levenshtein alignment
    (jiwer) of the whole call's words against its reference tokens."""
    import jiwer

    hyp = [w for u in us for w in u.words]
    ref = [w for s in ref_sentences for w in s]
    hit = np.zeros(len(hyp), dtype=bool)
    if hyp and ref:
        for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
            if chunk.type == "equal":
                hit[chunk.hyp_start_idx:chunk.hyp_end_idx] = True
    return np.split(hit, np.cumsum([len(u.words) for u in us])[:-1]) if us else []


def _ctm_labels(utts: Sequence[Any], refs: Mapping[str, Sequence[Sequence[str]]],
                calls: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Confidences of the CTM words of ``calls`` and whether each is a hit (:func:`_call_hits`)."""
    confs, hits = [np.zeros(0)], [np.zeros(0, dtype=bool)]
    for call in calls:
        us = [u for u in utts if u.client == call]
        confs += [np.asarray(u.confidences, dtype=np.float64) for u in us]
        hits += _call_hits(us, refs[call])
    return np.concatenate(confs), np.concatenate(hits)


def _ctm_classifier(utts: Sequence[Any], refs: Mapping[str, Sequence[Sequence[str]]], calls: Sequence[str],
                    cfg: FedLmRunConfig) -> tuple[Any, Any]:
    """A word-confidence classifier on CTM features (:mod:`privasr.confidence.ctm`) trained on the labelled
    ``calls`` (isotonic calibration on 20% of their utterances), and the background frequencies it needs."""
    from privasr.confidence.ctm import CTM_FEATURE_NAMES, BackgroundFrequencies, ctm_features_many
    from privasr.confidence.model import ConfidenceModel
    from privasr.corpus.sources import load_text

    bg = BackgroundFrequencies.from_sentences(load_text(cfg.confidence["background"]))
    feats: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for call in calls:
        us = [u for u in utts if u.client == call]
        feats += ctm_features_many(us, bg)
        labels += _call_hits(us, refs[call])
    model = ConfidenceModel.fit_features(feats, labels, feature_names=CTM_FEATURE_NAMES, kind=cfg.confidence["kind"],
                                         seed=cfg.seed)
    return model, bg


def _isotonic(conf: np.ndarray, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An increasing map raw confidence -> P(correct) (scikit-learn's isotonic regression), as thresholds for
    ``np.interp``; one pseudo-word of the opposite class at each end keeps it inside (0, 1), as in
    :class:`~privasr.confidence.model.ConfidenceModel` (:func:`~privasr.confidence.calibration.fit_isotonic`)."""
    from privasr.confidence.calibration import fit_isotonic

    if conf.size == 0:
        raise InputError("the calibration calls have no CTM words", expected="calls with recognised words")
    return fit_isotonic(conf, hit)


def _nbest_data(cfg: FedLmRunConfig) -> _Data:
    from privasr.rescore.run import _load_nbest

    dev = _load_nbest(cfg.data["dev"], None)
    test = _load_nbest(cfg.data["test"], None)
    for name, recs in (("dev", dev), ("test", test)):
        for nb in recs:
            if nb.ref is None:
                raise InputError(f"{name} utterance {nb.utt_id} has no reference", path=cfg.data[name],
                                 expected="references (WER is measured, rescoring weights tuned on dev)")
    src = cfg.confidence["source"]
    has = all(nb.best.confidences is not None for nb in dev if nb.best.words)
    if src == "auto":
        src = "data" if has else "classifier"
    if src == "data" and not has:
        raise InputError("confidence.source is 'data' but some dev 1-best hypotheses have no confidences",
                         path=cfg.data["dev"], expected="per-word confidences, or confidence.source: classifier")
    report = curve = None
    if cfg.data.get("client_text") == "reference":
        # the oracle diagnostic: clients train on their utterances' references, every word weight 1
        kept = [nb for nb in dev if nb.ref]
        clients = [(c.id, [(tuple(nb.ref), None) for nb in c.utterances]) for c in _group(kept, cfg)]
        info = {"confidence_source": "none (reference text)", "client_text": "reference", "utterances": len(kept),
                "words": int(sum(len(nb.ref) for nb in kept))}
        return _Data(clients, [tuple(nb.ref) for nb in test if nb.ref], info, dev, test)
    kept = [nb for nb in dev if nb.best.words]
    if src == "classifier":
        confs, report, curve = _cross_fit(kept, cfg)
    elif src == "oracle":  # the diagnostic: 1 for a 1-best word the reference confirms, else 0
        from privasr.confidence.features import labels_many

        confs = {nb.utt_id: y.astype(np.float64) for nb, y in zip(kept, labels_many(kept), strict=True)}
    elif src == "data":
        confs = {nb.utt_id: np.asarray(nb.best.confidences, dtype=np.float64) for nb in kept}
    else:
        confs = {nb.utt_id: None for nb in kept}
    clients = [(c.id, [(nb.best.words, confs[nb.utt_id]) for nb in c.utterances]) for c in _group(kept, cfg)]
    eval_sents = [tuple(nb.ref) for nb in test if nb.ref]
    info = {"confidence_source": src, "utterances": len(kept), "words": int(sum(len(nb.best.words) for nb in kept))}
    return _Data(clients, eval_sents, info, dev, test, report, curve)


def _cross_fit(nbests: Sequence[Any], cfg: FedLmRunConfig) -> tuple[dict[str, np.ndarray], dict[str, Any], Any]:
    """Confidences of every 1-best from a classifier trained on the other meetings' references (k folds)."""
    from privasr.confidence.features import labels_many
    from privasr.confidence.model import ConfidenceModel, ConfidenceReport

    meetings = sorted({nb.client or nb.utt_id for nb in nbests})
    k = min(cfg.confidence["folds"], len(meetings))
    if k < 2:
        raise InputError("the dev set has one meeting: confidences cannot be cross-fitted",
                         expected="two or more meetings (clients) in data.dev, or confidence.source: none")
    fold = {m: i % k for i, m in enumerate(meetings)}
    confs: dict[str, np.ndarray] = {}
    all_c, all_y = [], []
    for f in range(k):
        train = [nb for nb in nbests if fold[nb.client or nb.utt_id] != f]
        held = [nb for nb in nbests if fold[nb.client or nb.utt_id] == f]
        model = ConfidenceModel.fit(train, kind=cfg.confidence["kind"], seed=cfg.seed + f)
        pred = model.predict_many(held)
        for nb, c in zip(held, pred, strict=True):
            confs[nb.utt_id] = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
        all_c.extend(pred)
        all_y.extend(labels_many(held))
    rep = ConfidenceReport.compute(np.concatenate(all_c), np.concatenate(all_y), n_utterances=len(nbests),
                                   calibrated=True)
    return confs, {**rep.as_dict(), "folds": k, "kind": cfg.confidence["kind"]}, rep.reliability


# --------------------------------------------------------------------------------------------- federation


@dataclass
class _Model:
    lm: Any
    info: dict[str, Any]
    init_params: dict[str, np.ndarray]


def _pretrained(cfg: FedLmRunConfig, out: Path) -> _Model:
    from privasr.rescore.run import build_lm

    lm, info = build_lm(cfg.nnlm, cfg.cache_dir if cfg.cache_dir is not None else out / "lm")
    params = {k: p.detach().cpu().numpy().astype(np.float32, copy=True) for k, p in lm.model.named_parameters()}
    return _Model(lm, info, params)


def _encode(data: _Data, vocab: Any) -> list[Any]:
    from privasr.federated.algorithms.fedlm import FedLmClient

    out = []
    for cid, utts in data.clients:
        sents = [tuple(vocab.encode(w)) for w, _ in utts]
        weights = None if any(c is None for _, c in utts) else tuple(c for _, c in utts)
        out.append(FedLmClient(str(cid), tuple(sents), weights))
    return out


def _privacy(dp: Mapping[str, Any] | None, clip: float | None, sampler: Any) -> Any:
    if dp is None:
        return None
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    neighboring = dp["neighboring"]
    if neighboring == "auto":  # sampling a fixed number without replacement is analysed under replace-one
        neighboring = "replace_one" if sampler.kind == "without_replacement" else "add_or_remove_one"
    assert clip is not None
    return PrivacySettings(GaussianMechanism(clip_norm=clip, noise_multiplier=dp["noise_multiplier"]),
                           PrivacyAccountant(accountant=dp["accountant"], target_delta=dp["delta"],
                                             neighboring=neighboring))


def _federate(cfg: FedLmRunConfig, model: _Model, clients: Sequence[Any], fedlm: Mapping[str, Any], init: str,
              dp: Mapping[str, Any] | None, ckpt: Path | None, eval_ids: Sequence[Sequence[int]] | None = None
              ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], dict[str, Any], float]:
    """One federated run; the final parameters, the round history, privacy figures and its seconds."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
    from privasr.federated.backends import run_on

    t0 = time.perf_counter()
    conf = FedLmConfig.from_dict(fedlm)
    alg = FedLmAlgorithm(conf, model.lm.model.config, model.lm.vocab,
                         model.init_params if init == "pretrained" else None)
    privacy = _privacy(dp, conf.clip_norm, cfg.sampler)
    curve: list[float] = []

    def on_round(log: Any, state: Any) -> None:
        if eval_ids is not None and cfg.eval_every and (log.round + 1) % cfg.eval_every == 0:
            curve.append(alg.perplexity(state["params"], eval_ids))
            log.metrics["eval_ppl"] = curve[-1]

    res = run_on(cfg.backend, alg, clients, options=cfg.backend_options,
                 checkpoint_dir=ckpt, on_round=on_round, rounds=cfg.rounds,
                 sampler=cfg.sampler, seed=cfg.seed, min_clients=cfg.min_clients, privacy=privacy)
    priv: dict[str, Any] = {}
    if privacy is not None:
        priv = {"epsilon": float(privacy.accountant.epsilon()), "delta": float(privacy.accountant.target_delta),
                "noise_multiplier": float(dp["noise_multiplier"]) if dp else 0.0, "clip_norm": conf.clip_norm,
                "accountant": privacy.accountant.accountant, "neighboring": privacy.accountant.neighboring}
    return dict(res.state["params"]), [h.to_dict() for h in res.history], priv, time.perf_counter() - t0


def _perplexity(model: _Model, params: Mapping[str, np.ndarray], eval_ids: Sequence[Sequence[int]]) -> float:
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    alg = FedLmAlgorithm(FedLmConfig(), model.lm.model.config, model.lm.vocab)
    return alg.perplexity(params, eval_ids)


# ---------------------------------------------------------------------------------------------- rescoring


def _neural_lm(model: _Model, params: Mapping[str, np.ndarray]) -> Any:
    import torch

    from privasr.lm.neural.models import build_model
    from privasr.lm.neural.scorer import NeuralLM

    net = build_model(model.lm.model.config, model.lm.vocab)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(params[k], dtype=np.float32)))
    return NeuralLM(net, model.lm.vocab, spread_unk=model.lm.spread_unk, batch_tokens=model.lm.batch_tokens)


@dataclass
class _Rescored:
    words: list[tuple[str, ...]]
    weights: dict[str, Any]
    dev_errors: int


def _rescore(cfg: FedLmRunConfig, lms: Mapping[str, Any], dev: Sequence[Any], test: Sequence[Any]) -> _Rescored:
    """``am + w_lm * first-pass LM + sum_k w_k * ln P_k + wp * n`` over the NNLMs ``lms`` (name -> LM or
    :class:`~privasr.rescore.combine.LMScoreCache`), weights tuned on ``dev``; the chosen ``test`` words."""
    from privasr.rescore.combine import Combination, score_table, select
    from privasr.rescore.run import build_space
    from privasr.rescore.search import tune

    dev_table = score_table(dev, lms)
    test_table = score_table(test, lms)
    comb = Combination(prior="am", lms=("lm", *lms))
    ranges = dict(cfg.search.ranges)
    if "nnlm" in ranges:  # every NNLM weight takes the configured NNLM range
        ranges.update({k: ranges["nnlm"] for k in lms if k not in ranges})
    space = build_space(comb, replace(cfg.search, ranges=ranges))
    res = tune(dev, dev_table, comb, space, method="coordinate",
               max_rounds=cfg.search.max_rounds, coarse_points=cfg.search.coarse_points, restarts=cfg.search.restarts)
    choice = select(test_table, comb.totals(test_table, res.weights))
    words = [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(test, choice, strict=True)]
    return _Rescored(words, dict(res.weights), int(res.errors))


# --------------------------------------------------------------------------------------------------- run


def run_fedlm(cfg: FedLmRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated FedLM config; write ``out/results.json`` and ``out/report.md``; return the metrics."""
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    data = _earnings21(cfg) if cfg.kind == "earnings21" else _nbest_data(cfg)
    data_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = _pretrained(cfg, out)
    nnlm_s = time.perf_counter() - t0
    vocab = model.lm.vocab
    clients = _encode(data, vocab)
    eval_ids = [tuple(vocab.encode(s)) for s in data.eval_sentences]
    eval_tokens = sum(len(s) for s in eval_ids)
    oov = sum(i == vocab.unk_id for s in eval_ids for i in s)
    scratch = _perplexity(model, _scratch_params(cfg, model), eval_ids) if cfg.init == "scratch" else None
    ppl_base = _perplexity(model, model.init_params, eval_ids)
    dev_ids = [tuple(vocab.encode(s)) for s in data.dev_sentences] if data.dev_sentences else None

    runs: dict[str, dict[str, Any]] = {}

    def variant(name: str, fedlm: Mapping[str, Any], init: str, dp: Mapping[str, Any] | None) -> dict[str, Any]:
        from privasr.federated.algorithms.fedlm import FedLmConfig

        # keyed by the resolved settings: a row spelling out a default is the same run
        key = (FedLmConfig.from_dict(fedlm).to_dict(), init, None if dp is None else dict(dp))
        for r in runs.values():
            if r["key"] == key:
                return r
        params, hist, priv, secs = _federate(cfg, model, clients, fedlm, init, dp, out / "checkpoint" / name,
                                             eval_ids if name == "main" else None)
        r = {"key": key, "params": params, "history": hist, "priv": priv, "seconds": secs,
             "ppl": _perplexity(model, params, eval_ids)}
        if dev_ids is not None:
            r["ppl_dev"] = _perplexity(model, params, dev_ids)
        runs[name] = r
        return r

    main = variant("main", cfg.fedlm, cfg.init, cfg.dp)
    metrics: dict[str, Any] = {
        "ppl": main["ppl"], "ppl_baseline": ppl_base, "ppl_rel_change": (main["ppl"] - ppl_base) / ppl_base,
        "loss": cfg.fedlm.get("loss", "all"), "init": cfg.init, "rounds": cfg.rounds, "clients": len(clients),
        "client_words": data.info["words"], "eval_sentences": len(eval_ids), "eval_tokens": eval_tokens,
        "eval_oov_rate": oov / eval_tokens if eval_tokens else 0.0, "vocab_size": len(vocab),
    }
    if scratch is not None:
        metrics["ppl_init"] = scratch
    if dev_ids is not None:
        metrics.update(ppl_dev=main["ppl_dev"], ppl_dev_baseline=_perplexity(model, model.init_params, dev_ids),
                       dev_sentences=len(dev_ids), dev_tokens=sum(len(s) for s in dev_ids))
    if cfg.fedlm.get("loss", "all") == "threshold":
        metrics["threshold_kept_words"] = _kept_share(data, float(cfg.fedlm.get("threshold", 0.5)))
    metrics.update(main["priv"])
    if cfg.kind == "nbest":
        metrics["rescore_with_baseline"] = cfg.with_baseline
    if cfg.compare_all and cfg.fedlm.get("loss", "all") != "all":
        metrics["ppl_all_utts"] = variant("all", {**cfg.fedlm, "loss": "all"}, cfg.init, cfg.dp)["ppl"]
    elif cfg.compare_all:
        metrics["ppl_all_utts"] = main["ppl"]
    if data.confidence_report is not None:
        metrics.update({k: data.confidence_report[k] for k in ("ece", "auc", "ece_raw", "auc_raw")
                        if k in data.confidence_report})
        data.reliability.write_csv(out / "reliability.csv")
    _save_model(out / MODEL_FILE, model, main["params"], {"name": cfg.name, "seed": cfg.seed, "ppl": main["ppl"],
                                                          "fedlm": dict(cfg.fedlm), "rounds": cfg.rounds})
    rescored: dict[str, Any] = {}
    ev = _WerEval(cfg, model, data) if cfg.kind == "nbest" else None
    if ev is not None:
        rescored = _wer(ev, main, metrics)
    tables = _tables(cfg, variant, ppl_base, ev, data)
    timing = {"data_s": data_s, "nnlm_s": nnlm_s, "federated_s": main["seconds"],
              "variants_s": sum(r["seconds"] for n, r in runs.items() if n != "main")}
    metrics.update(timing, total_s=time.perf_counter() - t_start)
    extra = {"nnlm": model.info, "data_info": data.info, "history": main["history"], "tables": tables,
             "confidence": data.confidence_report, "rescore": rescored,
             "command": list(argv) if argv is not None else None}
    data_paths = {k: v for k, v in cfg.data.items() if k != "kind"}
    write_results(out, config=dict(cfg.raw), seed=cfg.seed, metrics=metrics, data=data_paths, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tables, data.info, data.reliability), encoding="utf-8")
    return metrics


def _save_model(path: Path, model: _Model, params: Mapping[str, np.ndarray], extra: Mapping[str, Any]) -> None:
    """The adapted NNLM as a neural checkpoint (``privasr rescore``'s ``{neural: {checkpoint: PATH}}`` loads it)."""
    from privasr.lm.neural.checkpoint import save_checkpoint

    lm = _neural_lm(model, params)
    save_checkpoint(path, lm.model, lm.vocab, lm.model.config, extra=extra)


def _scratch_params(cfg: FedLmRunConfig, model: _Model) -> dict[str, np.ndarray]:
    """The from-scratch initialisation the federated run starts from (the algorithm's own ``init``)."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    alg = FedLmAlgorithm(FedLmConfig.from_dict(cfg.fedlm), model.lm.model.config, model.lm.vocab)
    return alg.init(np.random.default_rng([cfg.seed, 0, 3]))["params"]  # the generator run_federated gives init


class _WerEval:
    """N-best rescoring WER of a model's parameters against the unadapted NNLM's (rescored once)."""

    def __init__(self, cfg: FedLmRunConfig, model: _Model, data: _Data) -> None:
        from privasr.metrics import wer

        assert data.dev is not None and data.test is not None
        self.cfg, self.model, self.dev, self.test = cfg, model, data.dev, data.test
        self.refs = [nb.ref for nb in data.test]
        self.ids = [nb.utt_id for nb in data.test]
        from privasr.rescore.combine import LMScoreCache

        self.base_cache = LMScoreCache(model.lm)  # the unadapted NNLM's scores, computed once
        self.base = _rescore(cfg, {"nnlm": self.base_cache}, data.dev, data.test)
        self.w_base = wer(self.refs, self.base.words)
        self.w_first = wer(self.refs, [nb.best.words for nb in data.test])

    def __call__(self, params: Mapping[str, np.ndarray]) -> dict[str, Any]:
        from privasr.metrics import mapsswe, wer
        from privasr.rescore.combine import LMScoreCache

        adapted = LMScoreCache(_neural_lm(self.model, params))
        # alone it takes the unadapted model's place; with_baseline: log-linear interpolation with the unadapted
        # NNLM (both weights tuned on dev)
        lms = {"nnlm": self.base_cache, "nnlm_adapted": adapted} if self.cfg.with_baseline else {"nnlm": adapted}
        new = _rescore(self.cfg, lms, self.dev, self.test)
        w = wer(self.refs, new.words)
        mp = mapsswe(self.refs, new.words, self.base.words, ids=self.ids)
        base = self.w_base.wer
        return {"wer": w.wer, "wer_rel_change": (w.wer - base) / base if base else 0.0, "mapsswe_p": mp.p,
                "mapsswe_z": mp.z, "mapsswe_better": {"A": "adapted", "B": "baseline", "same": "same"}[mp.better],
                "weights": new.weights, "dev_errors": new.dev_errors, "_wer": w}


def _wer(ev: _WerEval, run: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    from privasr.metrics import paired_bootstrap

    t0 = time.perf_counter()
    r = run.setdefault("wer", ev(run["params"]))
    bs = paired_bootstrap(r["_wer"].utt_errors, ev.w_base.utt_errors, r["_wer"].utt_ref_words, seed=ev.cfg.seed,
                          resamples=ev.cfg.bootstrap_resamples)
    metrics.update({k: r[k] for k in ("wer", "wer_rel_change", "mapsswe_p", "mapsswe_z", "mapsswe_better")})
    metrics.update(wer_counts=_counts(r["_wer"]), wer_baseline_counts=_counts(ev.w_base))
    metrics.update(wer_baseline=ev.w_base.wer, wer_first_pass=ev.w_first.wer, bootstrap_ci_low=bs.ci_low,
                   bootstrap_ci_high=bs.ci_high, bootstrap_prob_improvement=bs.prob_a_better,
                   test_utterances=len(ev.test), rescore_s=time.perf_counter() - t0)
    return {"weights_baseline": ev.base.weights, "weights_adapted": r["weights"],
            "dev_errors_baseline": ev.base.dev_errors, "dev_errors_adapted": r["dev_errors"]}


def _counts(w: Any) -> dict[str, int]:
    """Substitutions, deletions, insertions and reference words of a WER result."""
    return {"sub": int(w.substitutions), "del": int(w.deletions), "ins": int(w.insertions),
            "ref_words": int(w.ref_words)}


def _row_wer(ev: _WerEval | None, run: dict[str, Any]) -> dict[str, Any]:
    if ev is None:
        return {}
    r = run.setdefault("wer", ev(run["params"]))
    return {"wer": r["wer"], "wer_rel_change": r["wer_rel_change"], "mapsswe_p": r["mapsswe_p"]}


def _kept_share(data: _Data, threshold: float) -> float:
    """The share of the clients' words in utterances whose mean confidence (eq. 3) reaches ``threshold``: what
    ``loss: threshold`` trains on (a simulation diagnostic, counted here, not reported by clients)."""
    kept = total = 0
    for _, utts in data.clients:
        for words, conf in utts:
            total += len(words)
            if conf is None or (len(words) and float(np.mean(conf)) >= threshold):
                kept += len(words)
    return kept / total if total else 0.0


def _dev(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"ppl_dev": r["ppl_dev"]} if "ppl_dev" in r else {}


def _tables(cfg: FedLmRunConfig, variant: Any, ppl_base: float, ev: _WerEval | None, data: _Data
            ) -> dict[str, list[dict[str, Any]]]:
    """The table rows (every row a federated run; a row equal to an earlier run reuses it); with N-best data
    each row also has its rescoring WER and MAPSSWE p against the unadapted NNLM; with a development set (the
    labelled calls of Earnings-21) its perplexity ``ppl_dev``."""
    tables: dict[str, list[dict[str, Any]]] = {}
    if "loss" in cfg.tables:
        rows: list[dict[str, Any]] = [{"loss": "none (unadapted)", "ppl": ppl_base}]
        if ev is not None:
            rows[0].update(wer=ev.w_base.wer, wer_rel_change=0.0, mapsswe_p=1.0)
        for loss in cfg.tables["loss"]:
            r = variant(f"loss-{loss}", {**cfg.fedlm, "loss": loss}, cfg.init, cfg.dp)
            rows.append({"loss": loss, "ppl": r["ppl"], **_dev(r), **_row_wer(ev, r), **r["priv"]})
        tables["loss"] = rows
    if "threshold" in cfg.tables:
        rows = []
        for c in cfg.tables["threshold"]:
            r = variant(f"threshold-{c:g}", {**cfg.fedlm, "loss": "threshold", "threshold": c}, cfg.init, cfg.dp)
            rows.append({"threshold": c, "kept_words": _kept_share(data, c), "ppl": r["ppl"], **_dev(r),
                         **_row_wer(ev, r)})
        tables["threshold"] = rows
    if "init" in cfg.tables:
        rows = []
        for i in cfg.tables["init"]:
            r = variant(f"init-{i}", cfg.fedlm, i, cfg.dp)
            rows.append({"init": i, "ppl": r["ppl"], **_dev(r), **_row_wer(ev, r)})
        tables["init"] = rows
    if "noise" in cfg.tables:
        base_dp = dict(cfg.dp or {"delta": 1e-5, "accountant": "rdp", "neighboring": "auto"})
        rows = []
        for z in cfg.tables["noise"]:
            r = variant(f"noise-{z:g}", cfg.fedlm, cfg.init, {**base_dp, "noise_multiplier": z})
            rows.append({"noise_multiplier": z, "ppl": r["ppl"], **_row_wer(ev, r),
                         "epsilon": r["priv"].get("epsilon"), "delta": r["priv"].get("delta")})
        tables["noise"] = rows
    return tables


def _reliability_lines(curve: Any) -> list[str]:
    """A reliability diagram as a Markdown table: per confidence bin, its words, mean confidence, accuracy and a
    bar of the accuracy (``#``) against the diagonal (``|`` at the bin's mean confidence)."""
    lines = ["| confidence bin | words | mean confidence | accuracy | accuracy (#) vs confidence (\\|) |",
             "|---|---:|---:|---:|---|"]
    for lo, hi, n, c, a in zip(curve.lower, curve.upper, curve.count, curve.mean_confidence, curve.accuracy,
                               strict=True):
        if n == 0:
            continue
        bar = list("#" * int(round(20 * a)) + " " * (20 - int(round(20 * a))))
        k = min(19, int(round(20 * c)))
        bar[k] = "\\|"
        lines.append(f"| {lo:.1f}-{hi:.1f} | {int(n):,} | {c:.3f} | {a:.3f} | `{''.join(bar)}` |")
    return lines


def _report(cfg: FedLmRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any], info: Mapping[str, Any],
            curve: Any = None) -> str:
    lines = [f"# {cfg.name}", "",
             f"privasr {__version__}, seed {cfg.seed}, {m['clients']} clients ({cfg.client_key}), "
             f"{m['rounds']} rounds, loss {m['loss']}, init {m['init']}", "",
             "| model | perplexity |", "|---|---|",
             f"| unadapted | {m['ppl_baseline']:.2f} |",
             f"| federated ({m['loss']}) | {m['ppl']:.2f} ({100 * m['ppl_rel_change']:+.2f}%) |"]
    if "ppl_all_utts" in m and m["loss"] != "all":
        lines.append(f"| federated (all utterances) | {m['ppl_all_utts']:.2f} |")
    lines += ["", f"Evaluation: {m['eval_sentences']:,} sentences, {m['eval_tokens']:,} words, OOV rate "
              f"{100 * m['eval_oov_rate']:.2f}%; clients' first-pass words: {m['client_words']:,}.", ""]
    if "ppl_dev" in m:
        lines += [f"Development set (the labelled calls' references, {m['dev_tokens']:,} tokens): perplexity "
                  f"{m['ppl_dev_baseline']:.2f} unadapted, {m['ppl_dev']:.2f} adapted.", ""]
    if "threshold_kept_words" in m:
        lines += [f"The threshold keeps {100 * m['threshold_kept_words']:.1f}% of the clients' words.", ""]
    if "wer" in m:
        lines += ["| system | test WER |", "|---|---|", f"| first pass | {100 * m['wer_first_pass']:.2f}% |",
                  f"| unadapted NNLM rescoring | {100 * m['wer_baseline']:.2f}% |",
                  f"| adapted NNLM rescoring{' (with the unadapted NNLM)' if m.get('rescore_with_baseline') else ''}"
                  f" | {100 * m['wer']:.2f}% ({100 * m['wer_rel_change']:+.2f}% rel., "
                  f"MAPSSWE p = {m['mapsswe_p']:.3g}) |", ""]
    if "epsilon" in m:
        lines += [f"Differential privacy: noise multiplier {m['noise_multiplier']:g}, clip {m['clip_norm']:g}, "
                  f"epsilon = {m['epsilon']:.4g} at delta = {m['delta']:.3g} ({m['accountant']}).", ""]
    if "ece_raw" in m:
        lines += [f"Confidences of the CTM words on the evaluation calls: ECE {m['ece_raw']:.4f}, AUC "
                  f"{m['auc_raw']:.4f} as given" + (f"; ECE {m['ece']:.4f}, AUC {m['auc']:.4f} after isotonic "
                                                    "calibration on the calibration calls" if "ece" in m else "")
                  + ".", ""]
    elif "ece" in m:
        lines += [f"Confidence classifier (cross-fitted, held-out words): ECE {m['ece']:.4f}, AUC {m['auc']:.4f}.",
                  ""]
    if curve is not None:
        lines += ["Reliability diagram of the clients' confidences (also `reliability.csv`):", "",
                  *_reliability_lines(curve), ""]
    for name, rows in tables.items():
        if not rows:
            continue
        keys = list(rows[0])
        lines += [f"## {name}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in rows:
            lines.append("| " + " | ".join(_cell(k, r.get(k)) for k in keys) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _cell(key: str, v: Any) -> str:
    if isinstance(v, float) and key in ("wer", "wer_rel_change"):
        return f"{100 * v:.2f}%" if key == "wer" else f"{100 * v:+.2f}%"
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
