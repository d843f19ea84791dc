"""The NER evaluation for anonymisation (paper 003, section 2.1), behind ``privasr anon eval-ner``.

Stages: load the NER data sets and their seeded splits (:mod:`privasr.anon.ner_data`; never evaluated on
training documents), get the fine-tuned model (trained or taken from the cache, :mod:`privasr.anon.ner_model`),
build the systems compared, score each on the held-out part, cased and ASR-style
(:func:`~privasr.anon.ner_metrics.evaluate_detector`), count the real Earnings-21 participant names that
survive surrogate anonymisation in all 44 calls (:func:`~privasr.anon.ner_metrics.names_leaked`), and report:
``results.json`` and ``report.md``. The metrics are described in :mod:`privasr.anon.ner_metrics`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from privasr.anon.ner import (
    CombinedDetector,
    PatternDetector,
    SpacyDetector,
    asr_style,
    common_words,
    detect_grouped,
    load_base,
)
from privasr.anon.ner_data import (
    EARNINGS21_TO_LABEL,
    Doc,
    NerData,
    clean_speaker_names,
    earnings21_docs,
)
from privasr.anon.ner_metrics import LEAK_LABELS, MENTION_OUTCOMES, evaluate_detector, names_leaked
from privasr.anon.ner_model import (
    NerTrainConfig,
    cached_model,
    gutenberg_cased_sentences,
    load_detector,
    recipe_data,
    user_cache_dir,
)
from privasr.anon.transform import LABELS, Anonymizer
from privasr.errors import ConfigError

__all__ = ["run_eval_ner", "run_eval_ner_file", "report"]


def run_eval_ner(data_dir: str | Path, out: str | Path, *, model: str = "finetuned", seed: int = 0,
                 train_config: NerTrainConfig | None = None, cache_root: str | Path = "runs/cache",
                 systems: Sequence[str] = ("stock", "stock+patterns", "patterns", "finetuned", "finetuned+patterns",
                                           "finetuned+recall"),
                 log: Any = None, part: str = "test", templates: bool = True) -> dict[str, Any]:
    """Evaluate, write ``out/results.json`` and ``out/report.md``; return the metrics.

    The data is the fine-tuned recipe's (:func:`~privasr.anon.ner_model.recipe_data`): with ``templates`` (the
    default) presidio-evaluator's filled templates too, which the fine-tuned model trains on and which are
    scored as their own set (``presidio-templates``, never pooled into ``all``).

    ``part``: ``"test"`` (the reported figures) or ``"dev"`` (where settings are chosen); the names-leaked
    counts always cover all 44 Earnings-21 calls.

    ``model``: the primary system: ``"finetuned"`` (``finetuned+recall``: the cached fine-tuned model +
    patterns + the recall passes of :class:`~privasr.anon.ner.CombinedDetector` -- truecasing union,
    propagation within each Wikigold document / Earnings-21 call, PER refinement -- as
    :func:`~privasr.anon.ner_model.load_detector` builds it), or any spec of :func:`~privasr.anon.ner_model.load_detector`. ``systems`` are compared beside it (the fine-tuned ones trained
    or taken from the cache). The contract metrics come from the primary system: ``per_recall_asr_style``
    (exact-span PER recall on the ASR-style test parts, pooled; ``per_precision_asr_style`` and
    ``per_token_recall_asr_style``, the fraction of gold PER tokens inside any span, beside it), ``leak_rate`` (ASR-style, PER/ORG/LOC
    mentions of the test parts, pooled) and ``earnings21_names_leaked`` (all 44 calls, ASR-style).
    """
    from privasr.corpus.formats.earnings21 import read_speaker_names
    from privasr.results import write_results

    data_dir = Path(data_dir)
    cfg = train_config or NerTrainConfig(seed=seed)
    data = recipe_data(data_dir, cache_root, seed, templates=templates)
    names_file = data_dir / "earnings21" / "speaker-metadata.csv"
    if not names_file.is_file():
        raise ConfigError("speaker metadata not found", path=names_file, expected="earnings21/speaker-metadata.csv")
    needs_ft = model == "finetuned" or any(s.startswith("finetuned") for s in systems)
    folder, info, trained = (cached_model(data, data_dir, cfg, Path(cache_root), seed, log) if needs_ft
                             else (None, {}, False))
    common = _common_words(folder, model, data_dir)
    builders, patterns = _systems(folder, common, model, systems)
    primary_name = "finetuned+recall" if model == "finetuned" else model
    primary = builders[primary_name]() if primary_name in builders else load_detector(model, common=common)
    results = _evaluate(builders, systems, primary_name, primary, data, seed, part, log)
    all_calls = earnings21_docs(data.files["earnings21"])
    names = clean_speaker_names(read_speaker_names(names_file).values())
    heldout = set(data.ids["earnings21"]["test"])
    compared = [x for x in systems if x in ("stock", "finetuned+patterns")]
    name_res = {s: _names_leaked(primary if s == primary_name else builders[s](), all_calls, heldout, names, common,
                                 seed)
                for s in dict.fromkeys([primary_name, *compared])}
    metrics = _metrics(results[primary_name], name_res[primary_name], primary_name, info, trained, folder)
    metrics.update(systems=results, names=name_res)
    config = {"model": model, "part": part, "systems": list(systems), "train": asdict(cfg), "split_seed": seed,
              "templates": templates,
              "splits": data.ids, "earnings21_label_map": dict(EARNINGS21_TO_LABEL), "leak_labels": list(LEAK_LABELS),
              "common_words": len(common), "gazetteer_names": len(patterns.gazetteer)}
    out = Path(out)
    write_results(out, runner="ner-eval", config=config, seed=seed, metrics=metrics,
                  data={**{k: str(p) for k, p in data.files.items()}, "speaker_names": str(names_file)})
    (out / "report.md").write_text(report(metrics), encoding="utf-8")
    return metrics


def run_eval_ner_file(path: str | Path, out: str | Path, *, model: str = "finetuned", seed: int = 0,
                      systems: Sequence[str] = ("stock", "patterns"), cache_root: str | Path | None = None,
                      log: Any = None) -> dict[str, Any]:
    """Evaluate on one annotated file that no training or tuning touched (:func:`~privasr.anon.ner_data.
    file_ner_data`: CoNLL, Earnings-21 ``.nlp``, transcript JSON Lines with entities, presidio-evaluator's
    synthetic JSON), cased and ASR-style;
    write ``out/results.json`` and ``out/report.md``; return the metrics.

    ``model`` is the primary detector (a :func:`~privasr.anon.ner_model.load_detector` spec; ``finetuned``: the
    fine-tuned model from ``cache_root``, default the user cache, + patterns + recall passes); ``systems`` (``stock``, ``patterns`` or any spec) are
    compared beside it. The metrics are those of :func:`run_eval_ner` without the Earnings-21 names, plus the
    file's counts (``sentences``, ``tokens``, ``gold_mentions`` per label).
    """
    from privasr.anon.ner_data import file_ner_data
    from privasr.results import write_results

    detectors = {spec: load_detector(spec, cache_root=cache_root) for spec in dict.fromkeys([*systems, model])}
    data = file_ner_data(path, seen_templates=_seen_templates(cache_root, seed))
    name = next(iter(data.parts))
    docs = data.parts[name]["test"]
    results: dict[str, Any] = {}
    for spec, detector in detectors.items():
        results[spec] = evaluate_detector(detector, data, seed=seed, part="test")
        if log is not None:
            r = results[spec]["asr"]["all"]
            log(f"{spec}: ASR-style PER recall {r['prf']['PER']['recall']:.4f}, leak rate "
                f"{r['leak']['all']['leak_rate']:.4f}")
    metrics = _detector_metrics(results[model], model)
    gold: dict[str, int] = {lab: 0 for lab in LABELS}
    for _, spans in docs:
        for sp in spans:
            gold[sp.label] += 1
    metrics.update(systems=results, sentences=len(docs), tokens=sum(len(w) for w, _ in docs), gold_mentions=gold,
                   left_out=data.left_out)
    out = Path(out)
    write_results(out, runner="ner-eval", config={"data": str(path), "model": model, "systems": list(systems),
                                                  "held_out": True, "leak_labels": list(LEAK_LABELS)},
                  seed=seed, metrics=metrics, data={"test": str(path)})
    (out / "report.md").write_text(report(metrics, title=f"NER for anonymisation on {Path(path).name} (held out, "
                                                         "exact spans)"), encoding="utf-8")
    return metrics


def _seen_templates(cache_root: str | Path | None, seed: int) -> tuple[frozenset[int], list[str]] | None:
    """The fine-tuned recipe's training and dev templates (:func:`~privasr.anon.ner_data.seen_templates`) when
    they are in the cache, else None."""
    from privasr.anon.ner_data import seen_templates
    from privasr.anon.ner_templates import presidio_templates

    try:
        folder = presidio_templates(cache_root if cache_root is not None else user_cache_dir(), download=False)
    except ConfigError:
        return None
    return seen_templates(folder, seed)


def _common_words(folder: Path | None, model: str, data_dir: Path) -> list[str]:
    """The common words of the pattern detectors: those the fine-tuned model (or a trained model folder given as
    ``model``) saved beside it, else those of the Gutenberg books."""
    own_folder = (Path(model) / "privasr-ner.json").is_file()  # a trained model keeps its own common words
    words_file = folder if folder is not None else (Path(model) if own_folder else None)
    return json.loads((words_file / "common-words.json").read_text()) if words_file is not None and (
        words_file / "common-words.json").is_file() else sorted(common_words(gutenberg_cased_sentences(data_dir)))


def _systems(folder: Path | None, common: list[str], model: str, systems: Sequence[str]
             ) -> tuple[dict[str, Callable[[], Any]], PatternDetector]:
    """A builder per named system (stock spaCy, the fine-tuned model, patterns, and their combinations) and the
    pattern detector they share."""
    stock = SpacyDetector(load_base()) if any(s.startswith("stock") for s in systems) or model == "stock" else None
    ft = load_detector({"model": str(folder), "patterns": False}) if folder is not None else None
    patterns = PatternDetector(common=common)
    recall = load_detector(str(folder), common=common) if folder is not None else None
    builders: dict[str, Callable[[], Any]] = {
        "stock": lambda: stock, "stock+patterns": lambda: CombinedDetector(stock, patterns),
        "finetuned": lambda: ft, "finetuned+patterns": lambda: CombinedDetector(ft, patterns),
        "patterns": lambda: patterns, "finetuned+recall": lambda: recall}
    return builders, patterns


def _evaluate(builders: Mapping[str, Callable[[], Any]], systems: Sequence[str], primary_name: str, primary: Any,
              data: NerData, seed: int, part: str, log: Any) -> dict[str, Any]:
    """:func:`~privasr.anon.ner_metrics.evaluate_detector` of every system compared and of the primary one."""
    results: dict[str, Any] = {}
    for s in systems:
        if s not in builders:
            raise ConfigError(f"system {s!r}", expected=f"one of {sorted(builders)}")
        results[s] = evaluate_detector(builders[s](), data, seed=seed, part=part)
        if log is not None:
            r = results[s]["asr"]["all"]
            log(f"{s}: ASR-style PER recall {r['prf']['PER']['recall']:.4f}, micro F1 {r['prf']['micro']['f1']:.4f}")
    if primary_name not in results:
        results[primary_name] = evaluate_detector(primary, data, seed=seed, part=part)
    return results


def _names_leaked(det: Any, all_calls: Mapping[str, list[Doc]], heldout: set[str], names: list[tuple[str, ...]],
                  common: list[str], seed: int) -> dict[str, Any]:
    """:func:`~privasr.anon.ner_metrics.names_leaked` after surrogate anonymisation with ``det``'s spans, over all
    Earnings-21 calls (ASR-style, each call one document) and over the ``heldout`` ones."""
    words, gold, outs, held = [], [], [], []
    anon = Anonymizer("surrogate", seed=seed)
    for call, docs in sorted(all_calls.items()):
        asr = [asr_style(w, sp) for w, sp in docs]
        ws = [w for w, _ in asr]
        pred = detect_grouped(det, ws, [call] * len(ws))
        for (w, g), p in zip(asr, pred, strict=True):
            words.append(w)
            gold.append(g)
            outs.append(anon.transform(w, p, client=call))
            held.append(call in heldout)
    r = names_leaked(words, gold, outs, names, common)
    idx = [i for i, h in enumerate(held) if h]
    rh = names_leaked([words[i] for i in idx], [gold[i] for i in idx], [outs[i] for i in idx], names, common)
    return {"all_calls": r, "test_calls": {k: rh[k] for k in ("leaked", "leaked_strict", "name_strings_found")}}


def _metrics(prim: Mapping[str, Any], names: Mapping[str, Any], primary_name: str, info: Mapping[str, Any],
             trained: bool, folder: Path | None) -> dict[str, Any]:
    """The contract metrics, from the primary system's scores and names leaked (see :func:`run_eval_ner`)."""
    nr = names["all_calls"]
    return {
        **_detector_metrics(prim, primary_name),
        "earnings21_names_leaked": len(nr["leaked"]),
        "earnings21_names_leaked_list": nr["leaked"],
        "earnings21_names_leaked_strict": len(nr["leaked_strict"]),
        "earnings21_names_leaked_strict_list": nr["leaked_strict"],
        "earnings21_name_strings_found": nr["name_strings_found"],
        "earnings21_names_leaked_test_calls": len(names["test_calls"]["leaked"]),
        "train_seconds": info.get("train_seconds"), "trained_now": trained,
        "model_dir": str(folder) if folder is not None else None, "best_epoch": info.get("best_epoch"),
    }


def _detector_metrics(prim: Mapping[str, Any], primary_name: str) -> dict[str, Any]:
    """The contract metrics of one detector's scores (pooled parts): PER recall, precision and coverage, micro
    F1, the leak rates (all labels and per label)."""
    return {
        "per_recall_asr_style": prim["asr"]["all"]["prf"]["PER"]["recall"],
        "per_recall_cased": prim["cased"]["all"]["prf"]["PER"]["recall"],
        "per_token_recall_asr_style": prim["asr"]["all"]["token_recall"]["PER"],
        "per_covered_recall_asr_style": prim["asr"]["all"]["mentions"]["PER"]["covered_recall"],
        "per_outcomes_asr_style": prim["asr"]["all"]["mentions"]["PER"],
        "per_precision_asr_style": prim["asr"]["all"]["prf"]["PER"]["precision"],
        "micro_f1_asr_style": prim["asr"]["all"]["prf"]["micro"]["f1"],
        "tagged_fraction_asr_style": prim["asr"]["all"]["tagged_fraction"],
        "per_recall_target": 0.95,
        "per_recall_target_met": prim["asr"]["all"]["prf"]["PER"]["recall"] >= 0.95,
        "leak_rate": prim["asr"]["all"]["leak"]["all"]["leak_rate"],
        "leak_rate_cased": prim["cased"]["all"]["leak"]["all"]["leak_rate"],
        "per_leak_rate_asr_style": (prim["asr"]["all"]["leak"].get("PER") or {}).get("leak_rate"),
        "leak_rate_by_label_asr_style": {lab: v["leak_rate"] for lab, v in prim["asr"]["all"]["leak"].items()},
        "primary_system": primary_name,
    }


def report(metrics: Mapping[str, Any], title: str = "NER for anonymisation (held-out test parts, exact spans)"
           ) -> str:
    """A Markdown table of P/R/F1 per system, style and label (pooled test parts) and the leak figures."""
    lines = [f"# {title}", "",
             "| system | text | label | P | R | F1 | token R | leak |", "|---|---|---|---|---|---|---|---|"]
    for s, r in metrics["systems"].items():
        for style in ("cased", "asr"):
            a = r[style]["all"]
            for lab in (*LABELS, "micro"):
                p = a["prf"][lab]
                tr = a["token_recall"].get(lab)
                tr_s = "" if tr is None else f"{tr:.3f}"
                lk = a["leak"].get(lab if lab != "micro" else "all")
                lk_s = "" if lk is None else f"{lk['leak_rate']:.3f}"
                lines.append(f"| {s} | {style} | {lab} | {p['precision']:.3f} | {p['recall']:.3f} | {p['f1']:.3f} | "
                             f"{tr_s} | {lk_s} |")
    lines += ["", "Gold PER mentions by outcome (exact span; same span, other label; covered with other boundaries; "
              "partly covered; missed):", "", "| system | text | " + " | ".join(MENTION_OUTCOMES)
              + " | covered recall |", "|---|---|" + "---:|" * (len(MENTION_OUTCOMES) + 1)]
    for s, r in metrics["systems"].items():
        for style in ("cased", "asr"):
            m = r[style]["all"].get("mentions", {}).get("PER")
            if m is not None:
                lines.append(f"| {s} | {style} | " + " | ".join(str(m[k]) for k in MENTION_OUTCOMES)
                             + f" | {m['covered_recall']:.3f} |")
    lines += ["", "| system | text | words in spans |", "|---|---|---|"]
    for s, r in metrics["systems"].items():
        for style in ("cased", "asr"):
            lines.append(f"| {s} | {style} | {r[style]['all'].get('tagged_fraction', 0.0):.4f} |")
    sets = [k for r in metrics["systems"].values() for k in r["asr"] if k != "all"]
    if len(dict.fromkeys(sets)) > 1:
        lines += ["", "Each data set apart, ASR-style (`all` above pools the human-annotated ones; a synthetic set such "
                  "as presidio-templates is scored only here):", "",
                  "| system | data set | sentences | PER P | PER R | leak (PER/ORG/LOC) |", "|---|---|---:|---|---|---|"]
        for s, r in metrics["systems"].items():
            for name in dict.fromkeys(sets):
                a = r["asr"].get(name)
                if a is not None:
                    lines.append(f"| {s} | {name} | {a['sentences']:,} | {a['prf']['PER']['precision']:.3f} | "
                                 f"{a['prf']['PER']['recall']:.3f} | {a['leak']['all']['leak_rate']:.3f} |")
    if metrics.get("left_out"):
        lines += ["", f"Held out: {metrics['left_out']}."]
    per_leak = metrics.get("per_leak_rate_asr_style")
    last = (f"primary system: {metrics['primary_system']}; PER recall (ASR-style) "
            f"{metrics['per_recall_asr_style']:.4f} (token recall {metrics['per_token_recall_asr_style']:.4f}, "
            f"mentions covered {metrics['per_covered_recall_asr_style']:.4f}, "
            f"precision {metrics['per_precision_asr_style']:.4f}); leak rate {metrics['leak_rate']:.4f}"
            + ("" if per_leak is None else f" (PER {per_leak:.4f})"))
    if "earnings21_names_leaked" in metrics:
        last += (f"; Earnings-21 names leaked {metrics['earnings21_names_leaked']} (strict "
                 f"{metrics['earnings21_names_leaked_strict']}): " + ", ".join(metrics["earnings21_names_leaked_list"]))
    lines += ["", last, ""]
    return "\n".join(lines)
