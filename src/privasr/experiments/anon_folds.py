"""Cross-validated LMs from anonymised transcripts behind ``privasr anon run --folds K`` (config ``folds: K``).

A plain run (:mod:`privasr.experiments.anon`) tunes on one set of meetings: the AMI dev transcripts are its
development text (the LSTMs' early stopping and learning-rate schedule, the FMA ``beta``, the EM interpolation
weights) and the dev N-best lists tune the rescoring weights. With ``folds: K`` the dev and test N-best sets are
pooled and their meetings cut into ``K`` folds (:func:`privasr.corpus.folds.client_folds`, from ``seed``;
``fold_unit: series`` keeps AMI series whole). Fold ``k`` runs every tuned stage again with its own tuning data:

* its **development text** is the AMI_proprec ``dev/`` and ``test/`` transcripts of every meeting the fold does
  not test (with ``fold_unit: series``, of no series it tests), normalised as in a plain run; transcripts of
  meetings without N-best lists (never tested by any fold) are in every fold's text;
* M4 is trained (both columns) and fine-tuned with that text for early stopping, M3 approximates the fold's M4,
  FMA chooses ``beta`` and EM the interpolation weights on it;
* every system's rescoring weights are tuned on the fold's dev N-best lists, and its test lists are rescored.

What does not depend on development text is built once: the pool split, the NER spans, the texts and the
adaptation sets; M1 and M2 are cached by key (``cache_dir``), so the folds after the first load them
(``cache_hits`` per fold counts every model a fold loaded instead of training).

Every utterance is thus rescored once, by models and weights tuned without its meeting. results.json has the
plain run's metrics over the pooled test outputs (``wer``, ``wer_baseline``, ``wer_original``,
``recovered_fraction``, perplexities pooled as ``exp`` of the token-weighted mean log-perplexity), the pooled
Tables 2-4, the spread (:func:`privasr.experiments._folds.pool`: per fold, the folds' smallest and largest change,
bootstrap intervals over utterances and over meetings) and each meeting's WER (``per_client``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import to_dict
from privasr.corpus.folds import Fold, client_folds, series_of, split_fold
from privasr.errors import ConfigError, InputError
from privasr.experiments._folds import pool, pooled_perplexity, pooled_records, report_lines
from privasr.experiments.anon import (
    SYSTEMS,
    AnonRunConfig,
    _build_models,
    _Clock,
    _Data,
    _data_info,
    _Models,
    _pct_name,
    _report,
    _Store,
    _text_sha,
    build_texts,
    detect_entities,
    evaluate,
    load_data,
    perplexities,
    rescore,
)

__all__ = ["run_anon_folds", "development_turns", "fold_development_text"]


def development_turns(cfg: AnonRunConfig, norm: Callable[[Sequence[str]], Sequence[str]]
                      ) -> dict[str, list[tuple[str, ...]]]:
    """Every meeting's normalised, non-empty turns of the AMI_proprec ``dev/`` and (when present) ``test/``
    splits: the text a fold's development text is cut from.

    Raises:
        InputError: ``dev/`` is missing, or a meeting is in both splits.
    """
    from privasr.corpus.formats.ami_hmnet import read_ami_hmnet

    out: dict[str, list[tuple[str, ...]]] = {}
    split_of: dict[str, str] = {}
    for split in ("dev", "test"):
        folder = cfg.data.transcripts / split
        if not folder.is_dir():
            if split == "dev":
                raise InputError("no such AMI_proprec split folder", path=folder, expected="a dev/ sub-folder")
            continue
        for t in read_ami_hmnet(folder):
            m = t.client or ""
            if split_of.setdefault(m, split) != split:
                raise InputError(f"meeting {m!r} is in both the dev and the test transcripts", path=folder,
                                 expected="each meeting in one split")
            w = tuple(norm(t.words))
            if w:
                out.setdefault(m, []).append(w)
    return out


def fold_development_text(turns: Mapping[str, Sequence[tuple[str, ...]]], fold: Fold, unit: str = "meeting"
                          ) -> tuple[list[tuple[str, ...]], list[str]]:
    """``(sentences, meetings)``: the development text of ``fold``, every meeting's turns in sorted meeting order
    except the meetings it tests (with ``unit="series"``, except every meeting of a series it tests).

    >>> f = Fold(0, ("ES2004a",), ("ES2004b", "IS1009a"))
    >>> turns = {"ES2004a": [("a",)], "ES2004b": [("b",)], "IS1009a": [("c",)], "TS3007a": [("d",)]}
    >>> fold_development_text(turns, f)
    ([('a',), ('d',)], ['ES2004a', 'TS3007a'])
    >>> fold_development_text(turns, f, "series")
    ([('d',)], ['TS3007a'])

    Raises:
        InputError: no development text is left for the fold.
    """
    tested = set(fold.test)
    if unit == "series":
        series = {series_of(m) for m in tested}
        keep = sorted(m for m in turns if series_of(m) not in series)
    else:
        keep = sorted(m for m in turns if m not in tested)
    text = [s for m in keep for s in turns[m]]
    if not text:
        raise InputError(f"fold {fold.index} has no development text: every transcript meeting is tested in it",
                         expected="AMI_proprec dev/ and test/ transcripts of meetings the fold does not test")
    return text, keep


def _check(cfg: AnonRunConfig) -> None:
    if cfg.folds is None:
        raise ConfigError("run_anon_folds needs folds", expected="folds: K (an integer >= 2)")
    if cfg.export_arpa:
        raise ConfigError("config key 'folds' with export_arpa", expected="export_arpa: false")


def _mix_summary(per_fold: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Table 4's weights pooled over folds: each eq. 2 weight's mean, and every fold's."""
    keys = list(per_fold[0]["eq2"])
    return {"eq2": {k: float(np.mean([f["eq2"][k] for f in per_fold])) for k in keys},
            "source": f"{per_fold[0]['source']} of each fold, mean over folds",
            "eq2_by_fold": [dict(f["eq2"]) for f in per_fold]}


def _fold_row(f: Fold, fdata: _Data, dev_meetings: Sequence[str], m: Mapping[str, Any], models: _Models
              ) -> dict[str, Any]:
    training = {n: (i.get("training") or {}) for n, i in models.store.info.items() if n.startswith("m4")}
    return {"fold": f.index, "dev_clients": list(f.dev), "test_clients": list(f.test),
            "test_utterances": len(fdata.test_nb), "dev_utterances": len(fdata.dev_nb),
            "dev_text_meetings": list(dev_meetings), "dev_text_sentences": len(fdata.dev_text),
            "dev_text_tokens": sum(map(len, fdata.dev_text)),
            **{k: m[k] for k in ("wer", "wer_baseline", "wer_original", "wer_rel_change", "mapsswe_p",
                                 "recovered_fraction", "ppl", "ppl_baseline", "ppl_original")},
            "fma_beta": {k: v["beta"] for k, v in models.fma.items()},
            "mix_eq2": {k: v["eq2"] for k, v in models.mix.items()},
            "m4_best_epoch": {n: t.get("best_epoch") for n, t in training.items()},
            "cache_hits": sorted(n for n, i in models.store.info.items() if i.get("cached")),
            "trained": sorted(n for n, i in models.store.info.items() if not i.get("cached"))}


def run_anon_folds(cfg: AnonRunConfig, out: str | Path, *, detector: Any = None,
                   argv: Sequence[str] | None = None, progress: Any = None) -> dict[str, Any]:
    """Run a validated config with ``folds: K`` (module docstring); write ``out/results.json``, ``out/report.md``
    and plots. ``detector`` and ``progress`` are :func:`~privasr.experiments.anon.run_anon`'s. Returns the
    metrics written to ``results.json``.

    Raises:
        ConfigError: ``folds`` unset, ``export_arpa`` set, or fewer meetings than folds.
        InputError: an utterance in both N-best sets or without a reference or a client; a fold without
            development text; the inputs :func:`~privasr.experiments.anon.run_anon` refuses.
    """
    from privasr.metrics import wer
    from privasr.plots import plots_section
    from privasr.results import write_results

    _check(cfg)
    assert cfg.folds is not None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clock = _Clock(progress)
    cache = cfg.cache_dir if cfg.cache_dir is not None else out / "cache"
    data = clock.timed("data_s", load_data, cfg)
    dev_turns = development_turns(cfg, data.norm)
    recs = pooled_records(data.dev_nb, data.test_nb)
    folds = client_folds((str(nb.client) for nb in recs if nb.client is not None), cfg.folds, seed=cfg.seed,
                         unit=cfg.fold_unit)
    clock.say(f"data: {data.all_turns} train turns, {len(recs)} N-best utterances in {len(folds)} folds; "
              "entity detection")
    spans, det_name = clock.timed("ner_s", detect_entities, cfg, data, detector, cache)
    texts = clock.timed("texts_s", build_texts, cfg, data, spans, det_name)

    rows: list[dict[str, Any]] = []
    test: list[Any] = []
    words: dict[str, list[Any]] = {}
    ppl_parts: dict[str, list[tuple[float, int]]] = {}
    oov_parts: dict[str, list[tuple[float, int]]] = {}
    fold_weights: dict[str, list[Any]] = {}
    fold_dev_wer: dict[str, list[float]] = {}
    mixes: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    systems: dict[str, tuple[str, ...]] = {}
    for f in folds:
        fdev, ftest = split_fold(recs, f, what="pooled dev and test sets")
        dev_text, dev_meetings = fold_development_text(dev_turns, f, cfg.fold_unit)
        fdata = dataclasses.replace(data, dev_text=dev_text, dev_nb=fdev, test_nb=ftest,
                                    test_refs=[tuple(nb.ref or ()) for nb in ftest])
        fclock = _Clock(None if progress is None else (lambda s, i=f.index: progress(f"fold {i + 1}/{len(folds)} {s}")))
        fclock.say(f"{len(dev_meetings)} development-text meetings ({sum(map(len, dev_text))} tokens), "
                   f"{len(fdev)} dev and {len(ftest)} test utterances")
        models = _Models(_Store(cache))
        _build_models(cfg, fdata, texts, models, fclock)
        fclock.say("perplexities and rescoring")
        ppl, oov = perplexities(models, fdata.test_refs)
        systems, results = rescore(cfg, fdata, models)
        m, _, _ = evaluate(cfg, fdata, models, systems, results, ppl, oov)
        rows.append({**_fold_row(f, fdata, dev_meetings, m, models), "timings": dict(fclock.timings)})
        n_tok = sum(len(r) + 1 for r in fdata.test_refs)
        for name in ppl:
            ppl_parts.setdefault(name, []).append((ppl[name], n_tok))
            oov_parts.setdefault(name, []).append((oov[name], n_tok))
        for sysname, r in results.items():
            words.setdefault(sysname, []).extend(r["words"])
            fold_weights.setdefault(sysname, []).append(r["weights"])
            fold_dev_wer.setdefault(sysname, []).append(r["dev_wer"])
        for s in SYSTEMS:
            mixes[s].append(models.mix[s])
        test.extend(ftest)
        clock.timings[f"fold{f.index}_s"] = time.perf_counter() - fclock.start

    # the pooled test set: every system's outputs over all folds, scored as one run's
    refs = [tuple(nb.ref or ()) for nb in test]
    first = wer(refs, [nb.best.words for nb in test], aligner="sclite").wer
    pooled_results = {s: {"words": w, "wer_obj": (wo := wer(refs, w, aligner="sclite")), "wer": wo.wer,
                          "weights": fold_weights[s], "dev_wer": fold_dev_wer[s], "wer_first_pass": first}
                      for s, w in words.items()}
    ppl_pooled = {n: pooled_perplexity(v) for n, v in ppl_parts.items()}
    oov_pooled = {n: sum(o * t for o, t in v) / sum(t for _, t in v) for n, v in oov_parts.items()}
    pdata = dataclasses.replace(data, dev_text=[], dev_nb=[], test_nb=test, test_refs=refs)
    pmodels = _Models(_Store(None), mix={s: _mix_summary(v) for s, v in mixes.items()})
    metrics, sys_rows, tables = evaluate(cfg, pdata, pmodels, systems, pooled_results, ppl_pooled, oov_pooled)
    prim = f"mix_{cfg.primary}"
    spread, per_client = pool(folds, test, words[prim], words["m1_anon"], [r["wer_rel_change"] for r in rows],
                              seed=cfg.seed, resamples=cfg.eval.bootstrap_resamples, confidence=0.95)
    metrics.update(spread)
    metrics["cache_hits"] = sum(len(r["cache_hits"]) for r in rows)
    clock.timings["total_s"] = time.perf_counter() - clock.start
    metrics.update(clock.timings)
    data_info = {**_data_info(dataclasses.replace(data, dev_text=[], dev_nb=[], test_nb=test), texts),
                 "dev_text_sentences": None, "dev_text_tokens": None, "dev_utterances": None,
                 "dev_text": "per fold (folds[].dev_text_*)", "dev_text_sha": {r["fold"]: _text_sha(
                     [s for m in r["dev_text_meetings"] for s in dev_turns[m]]) for r in rows}}
    extra = {"tables": tables, "systems": sys_rows, "mix": pmodels.mix, "data_info": data_info, "folds": rows,
             "fold_split": [f.to_dict() for f in folds], "per_client": per_client, "ppl_by_lm": ppl_pooled,
             "oov_rate_by_lm": oov_pooled, "command": list(argv) if argv is not None else None}
    write_results(out, runner="anon-folds", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  data={"dev": cfg.data.dev, "test": cfg.data.test}, extra=extra)
    (out / "report.md").write_text(_fold_report(cfg, metrics, tables, data_info, rows, per_client, argv)
                                   + plots_section(out), encoding="utf-8")
    return metrics


def _fold_report(cfg: AnonRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any], d: Mapping[str, Any],
                 rows: Sequence[Mapping[str, Any]], per_client: Sequence[Mapping[str, Any]],
                 argv: Sequence[str] | None) -> str:
    head = [f"# {cfg.name}: {m['folds']}-fold cross-validation over meetings", ""]
    if argv:
        head += ["Command: `" + " ".join(argv) + "`", ""]
    head += [f"Dev `{cfg.data.dev}` and test `{cfg.data.test}` pooled: {m['test_utterances']:,} utterances of "
             f"{m['test_clients']} meetings in {m['folds']} folds (seed {cfg.seed}, by {cfg.fold_unit}). Each fold "
             "trains and fine-tunes M4, approximates M3, chooses the FMA beta and the EM weights on the transcripts "
             "of the meetings it does not test, tunes every system's rescoring weights on the other folds' lists and "
             f"rescores its own. System: {m['wer_system']}; baseline: {m['wer_baseline_system']}.", ""]
    head += report_lines(m, rows, per_client, [("original-text M1 WER", "wer_original"), ("ppl", "ppl"),
                                               ("baseline ppl", "ppl_baseline")])
    head += ["Per fold: development text, FMA beta of the mixed size, M4's best epochs, models loaded from the "
             "cache:", ""]
    p = _pct_name(cfg.mix_size)
    for r in rows:
        betas = ", ".join(f"{k} {v:g}" for k, v in r["fma_beta"].items() if k.endswith(f"fma{p}"))
        head.append(f"- fold {r['fold']}: {len(r['dev_text_meetings'])} meetings, {r['dev_text_tokens']:,} tokens; "
                    f"beta {betas}; best epochs {r['m4_best_epoch']}; cached {', '.join(r['cache_hits']) or 'none'}")
    head += ["", "Below: the plain run's tables over the pooled test outputs (every utterance once).", ""]
    body = _report(cfg, m, tables, d).split("\n", 2)[2]  # the plain report without its title
    return "\n".join(head) + "\n" + body + f"\nprivasr {__version__}; {m['total_s']:.0f} s.\n"
