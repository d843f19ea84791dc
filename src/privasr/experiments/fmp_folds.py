"""Cross-validated FMP behind ``privasr fmp run --folds K`` (config ``folds: K``).

The dev and test sets are pooled and their meetings cut into ``K`` folds (:func:`privasr.corpus.folds.client_folds`,
from ``seed``). Fold ``k`` does what a plain run does with its other folds' meetings as dev and its own as test:
the baseline's weights and ``lam`` are tuned on the dev meetings (:func:`~privasr.experiments.fmp.prepare_split`,
:func:`~privasr.experiments.fmp.tune_lam`), then FMP runs federatedly over the test meetings
(:func:`~privasr.experiments.fmp.run_test`, with the config's DP, sampler and backend) and is scored against the
baseline (:func:`~privasr.experiments.fmp.evaluate`). The NNLM and ``u(w)`` are built once
(:func:`~privasr.experiments.fmp.prepare_base`) and every distinct hypothesis is scored once for all folds.

Every meeting is a test client of exactly one fold. With ``dp`` each fold's federated run is its own release over
its own meetings (disjoint data: parallel composition), so the run's guarantee per utterance (or user) is the
epsilon each fold reports, not their sum. With ``dp_draws: R`` (a DP config) every fold's test run is repeated
with ``R`` noise seeds (``seed``, ``seed + 1``, ...; the tuning is not repeated): each draw pools into its own
pooled figure, and the report gives their mean and range; the headline (``wer``) is the mean over draws, and the
epsilon of each draw is the configured one: draws are repeated simulations measuring the noise's spread, and
publishing all ``R`` releases of the same meetings would compose to ``R`` times it.
The report gives every fold, the pooled figures (:func:`privasr.experiments._folds.pool`) and their spread.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import to_dict
from privasr.corpus.folds import client_folds, split_fold
from privasr.errors import ConfigError
from privasr.experiments._folds import pool, pooled_records, report_lines
from privasr.experiments.fmp import (
    FmpRunConfig,
    _words,
    baseline_name,
    build_clients,
    evaluate,
    load_data,
    nnlm_normalizer,
    prepare_base,
    prepare_split,
    run_test,
    system_name,
    tune_lam,
)

__all__ = ["run_fmp_folds"]


def run_fmp_folds(cfg: FmpRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated FMP config with ``folds: K`` (module docstring); write ``out/results.json``, ``report.md``
    and plots. Returns the metrics written to ``results.json``.

    Raises:
        ConfigError: ``folds`` unset, fewer meetings than folds, or an option folds do not take
            (``oracle_cache``).
        InputError: an utterance in both sets, or without a reference or a client.
    """
    from privasr.plots import plots_section
    from privasr.results import write_results

    if cfg.folds is None:
        raise ConfigError("run_fmp_folds needs folds", expected="folds: K (an integer >= 2)")
    if cfg.oracle_cache:
        raise ConfigError("folds with oracle_cache: true", expected="oracle_cache: false (a diagnostic of one split)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    info: dict[str, Any] = {}
    dev, test = load_data(cfg, info)
    recs = pooled_records(dev, test)
    folds = client_folds((str(nb.client) for nb in recs if nb.client is not None), cfg.folds, seed=cfg.seed,
                         unit=cfg.fold_unit)
    base = prepare_base(cfg, out)
    norm = nnlm_normalizer(base.lm, recs) if cfg.normalize else None
    draws = cfg.dp_draws if cfg.dp is not None else 1
    rows: list[dict[str, Any]] = []
    pooled_test: list[Any] = []
    base_words: list[Any] = []
    draw_words: list[list[Any]] = [[] for _ in range(draws)]
    for f in folds:
        fdev, ftest = split_fold(recs, f, what="pooled dev and test sets")
        finfo: dict[str, Any] = {}
        p = prepare_split(cfg, base, fdev, ftest, finfo)
        key, rounds, bw = cfg.clients.key, cfg.fmp.rounds, p.bias_weight
        dev_clients = build_clients(p.dev, p.dev_totals, p.dev_offsets, p.vocab, key, rounds, bw, False)
        tuned = tune_lam(cfg, p, dev_clients, norm)
        fold_rows = []
        for d in range(draws):
            test_clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, key, rounds, bw, False)
            dcfg = replace(cfg, seed=cfg.seed + d)
            chosen, _, priv = run_test(dcfg, p, test_clients, tuned, norm, out / f"fold{f.index}" / f"draw{d}")
            m, bwords = evaluate(cfg, p, tuned, chosen, (len(dev_clients), len(test_clients)))
            draw_words[d].extend(_words(chosen, p.test))
            fold_rows.append({"wer": m["wer"], "wer_rel_change": m["wer_rel_change"], "mapsswe_p": m["mapsswe_p"],
                              **priv})
        pooled_test.extend(p.test)
        base_words.extend(bwords)
        mean = {k: float(np.mean([r[k] for r in fold_rows])) for k in ("wer", "wer_rel_change")}
        rows.append({"fold": f.index, "dev_clients": list(f.dev), "test_clients": list(f.test),
                     "test_utterances": len(p.test), "dev_utterances": len(p.dev), "wer_baseline": m["wer_baseline"],
                     **mean, "mapsswe_p": fold_rows[0]["mapsswe_p"] if draws == 1 else
                     float(np.median([r["mapsswe_p"] for r in fold_rows])),
                     "lam": tuned.lam, "weights_baseline": dict(p.weights),
                     "draws": fold_rows if draws > 1 else None,
                     **({"epsilon": fold_rows[0]["epsilon"], "delta": fold_rows[0]["delta"]}
                        if "epsilon" in fold_rows[0] else {})})
    fold_rel = [r["wer_rel_change"] for r in rows]  # each fold's mean over its draws
    per_draw = [pool(folds, pooled_test, draw_words[d], base_words, fold_rel, seed=cfg.seed,
                     resamples=cfg.eval.bootstrap_resamples, confidence=0.95) for d in range(draws)]
    metrics, per_client = per_draw[0]
    metrics = dict(metrics)
    if draws > 1:
        wers = [pm["wer"] for pm, _ in per_draw]
        rels = [pm["wer_rel_change"] for pm, _ in per_draw]
        metrics.update(dp_draws=draws, wer=float(np.mean(wers)), wer_rel_change=float(np.mean(rels)),
                       draw_wer_min=min(wers), draw_wer_max=max(wers), draw_rel_change_min=min(rels),
                       draw_rel_change_max=max(rels), draw_mapsswe_p=[pm["mapsswe_p"] for pm, _ in per_draw],
                       mapsswe_p=float(np.median([pm["mapsswe_p"] for pm, _ in per_draw])))
    if cfg.dp is not None:
        metrics.update(epsilon=rows[0].get("epsilon"), delta=rows[0].get("delta"))
    metrics.update(wer_system=system_name(cfg), wer_baseline_system=f"{baseline_name(cfg)} (tuned per fold)",
                   rounds=cfg.fmp.rounds, nnlm_s=base.info["nnlm_s"])
    if cfg.dp is None:
        metrics["total_s"] = time.perf_counter() - t_start
    d = cfg.data
    assert d is not None
    data: dict[str, Any] = {"nbest": d.nbest} if d.nbest is not None else {"dev": d.dev, "test": d.test}
    bg = dict(base.info["background"])
    data.update(bg.pop("files"))
    extra = {"nnlm": base.info["nnlm"], "background": bg, "folds": rows,
             "fold_split": [f.to_dict() for f in folds], "per_client": per_client,
             "command": list(argv) if argv is not None else None}
    write_results(out, runner="fmp-folds", config=to_dict(cfg), seed=cfg.seed, metrics=metrics, data=data,
                  extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, rows, per_client, argv) + plots_section(out),
                                   encoding="utf-8")
    return metrics


def _report(cfg: FmpRunConfig, m: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
            per_client: Sequence[Mapping[str, Any]], argv: Sequence[str] | None) -> str:
    lines = [f"# FMP, {m['folds']}-fold cross-validation over meetings: {cfg.name}", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    lines += [f"Dev and test pooled: {m['test_utterances']:,} utterances of {m['test_clients']} meetings in "
              f"{m['folds']} folds (seed {cfg.seed}). Each fold tunes the baseline ({m['wer_baseline_system']}) "
              f"and lam on the other folds' meetings and runs {m['wer_system']} over its own.", ""]
    extra = [("lam", "lam")] + ([("epsilon", "epsilon")] if cfg.dp is not None else [])
    lines += report_lines(m, rows, per_client, extra)
    if m.get("dp_draws"):
        lines += [f"DP noise draws: {m['dp_draws']} per fold (seeds {cfg.seed} to {cfg.seed + m['dp_draws'] - 1}); "
                  f"the fold rows and the pooled WER are means over draws. Pooled WER per draw from "
                  f"{100 * m['draw_wer_min']:.2f}% to {100 * m['draw_wer_max']:.2f}%, relative change from "
                  f"{100 * m['draw_rel_change_min']:+.2f}% to {100 * m['draw_rel_change_max']:+.2f}%; MAPSSWE p per "
                  f"draw: {', '.join(f'{p:.3g}' for p in m['draw_mapsswe_p'])} (the pooled row shows the median; "
                  "the bootstrap intervals are of draw 0).", ""]
    if cfg.dp is not None:
        lines += [f"Privacy: each fold's run is ({m['epsilon']:.3g}, {m['delta']:.3g})-DP for its meetings "
                  f"({cfg.dp.unit} level, {cfg.dp.accountant} accountant); the folds hold disjoint meetings.", ""]
    lines += [f"privasr {__version__}.", ""]
    return "\n".join(lines)
