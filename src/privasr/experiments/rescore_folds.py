"""Cross-validated N-best rescoring behind ``privasr rescore run --folds K`` (config ``folds: K``).

A single dev/test split rests on one choice of meetings. With ``folds: K`` the dev and test sets are pooled and
their meetings (``client``) cut into ``K`` folds (:func:`privasr.corpus.folds.client_folds`, deterministic from
``seed``). Fold ``k`` tunes the system and its baseline on the other folds' meetings only, exactly as
:func:`privasr.experiments.rescore.tune_weights` does on a dev set, and rescores its own meetings with those
weights. The LMs are loaded or trained once (the cache of a plain run is reused) and every distinct hypothesis
is scored once per LM for all folds.

Every utterance is thus rescored once, by weights tuned without its meeting. The report gives:

* per fold: its meetings, test WER of the system and the baseline, relative change, MAPSSWE p, the weights;
* pooled over the folds (every utterance once): WER, relative change, MAPSSWE p (sclite's segments over the
  concatenated outputs) and a paired bootstrap over utterances;
* the spread: the folds' smallest and largest relative change, how many folds improved, and a bootstrap
  interval over **meetings** (meetings resampled with replacement: the interval a new set of meetings would
  see), plus each meeting's WER under both systems (``per_client``, plotted).

The baseline is the config's (``eval.baseline_lms``; else the first-pass 1-best). An LM whose training or early
stopping used the text of a meeting in these folds (e.g. an NNLM validated on ``ami-dev`` when the dev meetings
are pooled in) is the config's responsibility; the report lists the LMs' sources
(``configs/rescore-ami-nnlm-folds.yaml`` early-stops on ``ami-train-valid`` instead). The rescored lists are not
written (``output.nbest`` is for a single split); each meeting's figures are in ``per_client``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.config import to_dict
from privasr.corpus.folds import Fold, client_folds, split_fold
from privasr.corpus.records import NBest
from privasr.errors import ConfigError
from privasr.experiments._folds import pool, pooled_records, report_lines
from privasr.experiments.rescore import (
    RescoreConfig,
    _choose_words,
    _Data,
    _Scores,
    build_lms,
    load_data,
    tune_weights,
)
from privasr.rescore.combine import LMScoreCache, score_table, select

__all__ = ["run_rescore_folds"]


def _fold(cfg: RescoreConfig, fold: Fold, recs: Sequence[NBest], caches: Mapping[str, LMScoreCache],
          have_lms: bool) -> dict[str, Any]:
    """Tune on the fold's dev meetings, rescore its test meetings: the chosen words and the fold's figures."""
    from privasr.metrics import mapsswe, wer

    dev, test = split_fold(recs, fold, what="pooled dev and test sets")
    scores = _Scores(dict(caches), score_table(dev, caches), score_table(test, caches))
    tuning = tune_weights(cfg, _Data(dev, test), scores, have_lms)
    table = scores.test
    words = _choose_words(test, select(table, cfg.combination.totals(table, tuning.weights)))
    base = [nb.best.words for nb in test]
    if tuning.baseline is not None and tuning.bl_comb is not None:
        base = _choose_words(test, select(table, tuning.bl_comb.totals(table, tuning.baseline.weights)))
    refs = [nb.ref or () for nb in test]
    w, wb = wer(refs, words, aligner="sclite"), wer(refs, base, aligner="sclite")
    mp = mapsswe(refs, words, base, ids=[nb.utt_id for nb in test])
    return {"fold": fold.index, "dev_clients": list(fold.dev), "test_clients": list(fold.test),
            "test_utterances": len(test), "dev_utterances": len(dev), "wer": w.wer, "wer_baseline": wb.wer,
            "wer_rel_change": (w.wer - wb.wer) / wb.wer if wb.wer > 0 else None, "mapsswe_p": mp.p,
            "weights": dict(tuning.weights),
            "weights_baseline": dict(tuning.baseline.weights) if tuning.baseline is not None else None,
            "dev_errors_tuned": tuning.result.errors if tuning.result is not None else None,
            "_test": test, "_words": words, "_base": base}


def run_rescore_folds(cfg: RescoreConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated config with ``folds: K`` (module docstring); write ``out/results.json`` and
    ``out/report.md`` (and plots). Returns the metrics written to ``results.json``.

    Raises:
        ConfigError: ``folds`` unset, or fewer meetings than folds.
        InputError: overlapping dev and test, utterances without a reference or a client.
    """
    from privasr.plots import plots_section
    from privasr.results import write_results

    if cfg.folds is None:
        raise ConfigError("run_rescore_folds needs folds", expected="folds: K (an integer >= 2)")
    if cfg.search.method == "fixed":
        raise ConfigError("folds with search.method: fixed", expected="tuned weights (coordinate or grid)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = load_data(cfg)
    recs = pooled_records(data.dev, data.test)
    folds = client_folds((str(nb.client) for nb in recs if nb.client is not None), cfg.folds, seed=cfg.seed,
                         unit=cfg.fold_unit)
    lms, lm_info = build_lms(cfg, out, data)
    caches = {n: LMScoreCache(lm, batch_size=cfg.lm_batch_size) for n, lm in lms.items()}
    t_lm = time.perf_counter()
    rows = [_fold(cfg, f, recs, caches, bool(lms)) for f in folds]
    test = [nb for r in rows for nb in r.pop("_test")]
    words = [w for r in rows for w in r.pop("_words")]
    base = [w for r in rows for w in r.pop("_base")]
    pooled, per_client = pool(folds, test, words, base, [r["wer_rel_change"] for r in rows], seed=cfg.seed,
                              resamples=cfg.eval.bootstrap_resamples, confidence=cfg.eval.confidence)
    metrics: dict[str, Any] = {
        **pooled,
        "wer_system": cfg.system,
        "wer_baseline_system": (f"rescoring with {', '.join(('lm',) if 'lm' in cfg.combination.lms else ())}"
                                f"{', ' if 'lm' in cfg.combination.lms else ''}"
                                f"{', '.join(cfg.eval.baseline_lms)} (tuned per fold)"
                                if cfg.eval.baseline_lms else "first-pass 1-best"),
        "lm_s": t_lm - t0, "total_s": time.perf_counter() - t0,
    }
    extra = {"lms": lm_info, "folds": rows, "fold_split": [f.to_dict() for f in folds], "per_client": per_client,
             "command": list(argv) if argv else None}
    write_results(out, runner="rescore-folds", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  data=data.fingerprints, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, rows, per_client, lm_info, argv) + plots_section(out),
                                   encoding="utf-8")
    return metrics


def _report(cfg: RescoreConfig, m: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
            per_client: Sequence[Mapping[str, Any]], lm_info: Mapping[str, Any], argv: Sequence[str] | None) -> str:
    lines = [f"# N-best rescoring, {m['folds']}-fold cross-validation over meetings: {cfg.name}", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    lines += [f"Dev `{cfg.data.dev}` and test `{cfg.data.test or cfg.data.nbest}` pooled: {m['test_utterances']:,} "
              f"utterances of {m['test_clients']} meetings in {m['folds']} folds (seed {cfg.seed}). Each fold tunes "
              f"{cfg.system} and the baseline ({m['wer_baseline_system']}) on the other folds' meetings and "
              "rescores its own.", ""]
    lines += report_lines(m, rows, per_client)
    lines += ["Weights per fold: " + "; ".join(
        f"{r['fold']}: " + ", ".join(f"{k} {v:g}" for k, v in r["weights"].items() if isinstance(v, int | float))
        for r in rows), ""]
    if lm_info:
        lines += ["LMs: " + "; ".join(f"{n} ({_source(i)})" for n, i in lm_info.items()), ""]
    lines += [f"privasr {__version__}; {m['total_s']:.1f} s. WER with the sclite aligner.", ""]
    return "\n".join(lines)


def _source(info: Mapping[str, Any]) -> str:
    if "neural" in info:
        t = info["neural"].get("train")
        return f"neural, trained on {t['text']}, early stopping on {t['valid']}" if t else "neural checkpoint"
    if "train" in info:
        return f"trained on {info['train']['text']}"
    return str(info.get("arpa", "ARPA"))
