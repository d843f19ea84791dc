"""Cross-validated federated NNLM fine-tuning behind ``privasr fedlm run --folds K`` (config ``folds: K``).

The dev and test N-best sets are pooled and their meetings cut into ``K`` folds
(:func:`privasr.corpus.folds.client_folds`, from ``seed``; ``fold_unit: series`` keeps AMI series whole). Fold
``k`` does what a plain run does with the other folds' meetings as dev and its own as test
(:func:`~privasr.experiments.fedlm.nbest_data`):

* the dev meetings are the clients: their first-pass 1-best, weighted by confidences from a classifier
  cross-fitted on the *dev* meetings' references (``confidence.folds`` folds by meeting);
* the federated run fine-tunes the pre-trained NNLM over them (the config's rounds, sampler and backend);
* the rescoring weights of the baseline (the unadapted NNLM) and of the system are tuned on the dev meetings;
* the test meetings' references give perplexity, their lists the rescoring WER.

With ``compare_all`` (and a loss other than ``all``) every fold also runs ``loss: all``, and the report compares
the two pooled: the confidence weighting's own effect, over every meeting. The NNLM is built once and the
unadapted NNLM scores every hypothesis once for all folds.

Every utterance is thus rescored once, by a model fine-tuned and weights tuned without its meeting. The report
gives every fold, the pooled figures (:func:`privasr.experiments._folds.pool`), their spread, the pooled
perplexities and the client updates the loop dropped (a logged, counted event).

Differential privacy is not taken with folds: each meeting is a client of ``K - 1`` folds, so the folds'
releases would compose over it; run DP configs on their single split.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.config import to_dict
from privasr.corpus.folds import client_folds, split_fold
from privasr.errors import ConfigError
from privasr.experiments._folds import pool, pooled_perplexity, pooled_records, report_lines
from privasr.experiments.fedlm import (
    BASELINE_NAME,
    FedLmRunConfig,
    _Variants,
    _WerEval,
    build_model,
    encode,
    load_nbest_sets,
    nbest_data,
    system_name,
)

__all__ = ["run_fedlm_folds"]


def _check(cfg: FedLmRunConfig) -> None:
    if cfg.folds is None:
        raise ConfigError("run_fedlm_folds needs folds", expected="folds: K (an integer >= 2)")
    if cfg.dp is not None:
        raise ConfigError("config key 'folds' with dp", expected="dp: null: each meeting is a client of K - 1 "
                                                                 "folds, whose releases would compose over it")
    if cfg.init != "pretrained":
        raise ConfigError(f"config key 'folds' with init {cfg.init!r}", expected="init: pretrained")


def _dropped(history: Sequence[Mapping[str, Any]]) -> int:
    """How many client updates the loop dropped over a run's rounds."""
    return sum(len(h.get("dropped") or {}) for h in history)


def _pooled_ppl(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The perplexity over every fold's test references (:func:`~privasr.experiments._folds.pooled_perplexity`
    of the folds' ``key`` and scored targets)."""
    return pooled_perplexity([(r[key], r["eval_targets"]) for r in rows if r.get(key) is not None])


def run_fedlm_folds(cfg: FedLmRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated fedlm config with ``folds: K`` (module docstring); write ``out/results.json``,
    ``out/report.md`` and plots. Returns the metrics written to ``results.json``.

    Raises:
        ConfigError: ``folds`` unset, ``dp`` set, ``init: scratch``, or fewer meetings than folds.
        InputError: an utterance in both sets, or without a reference or a client.
    """
    from privasr.plots import plots_section
    from privasr.rescore.combine import LMScoreCache
    from privasr.results import write_results

    _check(cfg)
    assert cfg.folds is not None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    dev, test = load_nbest_sets(cfg)
    recs = pooled_records(dev, test)
    folds = client_folds((str(nb.client) for nb in recs if nb.client is not None), cfg.folds, seed=cfg.seed,
                         unit=cfg.fold_unit)
    model = build_model(cfg, out)
    base_cache = LMScoreCache(model.lm)
    loss = cfg.fedlm.get("loss", "all")
    with_all = cfg.compare_all and loss != "all"
    rows: list[dict[str, Any]] = []
    pooled_test: list[Any] = []
    words: dict[str, list[Any]] = {"main": [], "all": [], "base": []}
    for f in folds:
        fdev, ftest = split_fold(recs, f, what="pooled dev and test sets")
        data = nbest_data(cfg, fdev, ftest)
        sets = encode(cfg, data, model)
        variants = _Variants(cfg, model, sets, out / f"fold{f.index}")
        ev = _WerEval(cfg, model, data, base_cache)
        runs = {"main": variants("main", cfg.fedlm, cfg.init, None)}
        if with_all:
            runs["all"] = variants("all", {**cfg.fedlm, "loss": "all"}, cfg.init, None)
        res = {k: ev(r["params"]) for k, r in runs.items()}
        pooled_test.extend(ftest)
        words["base"].extend(ev.base.words)
        row: dict[str, Any] = {
            "fold": f.index, "dev_clients": list(f.dev), "test_clients": list(f.test), "clients": len(sets.clients),
            "client_words": data.info["words"], "test_utterances": len(ftest), "dev_utterances": len(fdev),
            "wer_baseline": ev.w_base.wer, "ppl_baseline": sets.ppl_base,
            "eval_targets": sum(len(s) + 1 for s in sets.eval_ids),
            "weights_baseline": ev.base.weights, "dropped_updates": sum(_dropped(r["history"]) for r in runs.values()),
        }
        for k, r in res.items():
            words[k].extend(r["_words"])
            sfx = "" if k == "main" else "_all"
            row.update({f"wer{sfx}": r["wer"], f"wer_rel_change{sfx}": r["wer_rel_change"],
                        f"mapsswe_p{sfx}": r["mapsswe_p"], f"ppl{sfx}": runs[k]["ppl"], f"weights{sfx}": r["weights"]})
        if data.confidence_report is not None:
            row.update({k: data.confidence_report.get(k) for k in ("auc", "ece", "wrong_weight_share")})
        rows.append(row)
    opts = {"seed": cfg.seed, "resamples": cfg.eval.bootstrap_resamples, "confidence": 0.95}
    metrics, per_client = pool(folds, pooled_test, words["main"], words["base"],
                               [r["wer_rel_change"] for r in rows], **opts)
    metrics = dict(metrics)
    metrics.update(wer_system=system_name(cfg), wer_baseline_system=f"{BASELINE_NAME} (tuned per fold)",
                   loss=loss, rounds=cfg.rounds, ppl=_pooled_ppl(rows, "ppl"),
                   ppl_baseline=_pooled_ppl(rows, "ppl_baseline"),
                   dropped_updates=sum(r["dropped_updates"] for r in rows), total_s=time.perf_counter() - t_start)
    extra: dict[str, Any] = {"nnlm": model.info, "folds": rows, "fold_split": [f.to_dict() for f in folds],
                             "per_client": per_client, "command": list(argv) if argv is not None else None}
    if with_all:
        m_all, _ = pool(folds, pooled_test, words["all"], words["base"], [r["wer_rel_change_all"] for r in rows],
                        **opts)
        vs, _ = pool(folds, pooled_test, words["main"], words["all"],
                     [(r["wer"] - r["wer_all"]) / r["wer_all"] if r["wer_all"] else None for r in rows], **opts)
        metrics.update(wer_all=m_all["wer"], wer_all_rel_change=m_all["wer_rel_change"],
                       mapsswe_p_all=m_all["mapsswe_p"], ppl_all_utts=_pooled_ppl(rows, "ppl_all"),
                       all_meeting_ci_low=m_all["meeting_bootstrap_ci_low"],
                       all_meeting_ci_high=m_all["meeting_bootstrap_ci_high"],
                       all_folds_improved=m_all["folds_improved"],
                       vs_all_rel_change=vs["wer_rel_change"], vs_all_mapsswe_p=vs["mapsswe_p"],
                       vs_all_ci_low=vs["bootstrap_ci_low"], vs_all_ci_high=vs["bootstrap_ci_high"],
                       vs_all_meeting_ci_low=vs["meeting_bootstrap_ci_low"],
                       vs_all_meeting_ci_high=vs["meeting_bootstrap_ci_high"],
                       vs_all_folds_improved=vs["folds_improved"])
    d = cfg.data
    write_results(out, runner="fedlm-folds", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  data={"dev": d.dev, "test": d.test}, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, rows, per_client, argv) + plots_section(out),
                                   encoding="utf-8")
    return metrics


def _report(cfg: FedLmRunConfig, m: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
            per_client: Sequence[Mapping[str, Any]], argv: Sequence[str] | None) -> str:
    lines = [f"# Federated NNLM fine-tuning, {m['folds']}-fold cross-validation over meetings: {cfg.name}", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    lines += [f"Dev and test pooled: {m['test_utterances']:,} utterances of {m['test_clients']} meetings in "
              f"{m['folds']} folds (seed {cfg.seed}). In each fold the other folds' meetings are the clients "
              f"({m['rounds']} rounds, {m['loss']} loss) and tune both systems' rescoring weights; the fold's own "
              f"meetings are tested. System: {m['wer_system']}; baseline: {m['wer_baseline_system']}.", ""]
    extra = [("ppl", "ppl"), ("AUC", "auc"), ("weight on wrong words", "wrong_weight_share"),
             ("dropped", "dropped_updates")]
    if "wer_all" in m:
        extra.insert(0, ("all-utterances WER", "wer_all"))
    lines += report_lines(m, rows, per_client, extra)
    lines += [f"Perplexity of the test references, pooled over folds: {m['ppl_baseline']:.1f} unadapted, "
              f"{m['ppl']:.1f} adapted" + (f", {m['ppl_all_utts']:.1f} with all utterances"
                                            if m.get("ppl_all_utts") is not None else "") + ".", ""]
    if "wer_all" in m:
        lines += [f"All utterances (loss: all), pooled: {100 * m['wer_all']:.2f}% "
                  f"({100 * m['wer_all_rel_change']:+.2f}% against the baseline, MAPSSWE p {m['mapsswe_p_all']:.3g}). "
                  f"{m['loss']} loss against all utterances: {100 * m['vs_all_rel_change']:+.2f}% relative, MAPSSWE "
                  f"p {m['vs_all_mapsswe_p']:.3g}, bootstrap 95% CI in points over utterances "
                  f"[{100 * m['vs_all_ci_low']:+.2f}, {100 * m['vs_all_ci_high']:+.2f}], over meetings "
                  f"[{100 * m['vs_all_meeting_ci_low']:+.2f}, {100 * m['vs_all_meeting_ci_high']:+.2f}]; "
                  f"{m['vs_all_folds_improved']} of {m['folds']} folds ahead.", ""]
    lines += [f"Client updates dropped by the loop (non-finite or failed), all folds and runs: "
              f"{m['dropped_updates']}.", "", f"privasr {__version__}.", ""]
    return "\n".join(lines)
