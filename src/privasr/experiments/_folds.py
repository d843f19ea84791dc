"""What every cross-validated runner shares (``rescore``, ``fmp``, ``fedlm`` and ``anon run --folds K``): pooling the folds'
test outputs into one test set, the figures over it (WER, MAPSSWE, bootstraps over utterances and over meetings),
the spread across folds, the per-meeting rows and the report's fold tables."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from privasr.corpus.folds import Fold
from privasr.corpus.records import NBest
from privasr.errors import InputError

__all__ = ["pooled_records", "pool", "pooled_perplexity", "report_lines"]


def pooled_records(dev: Sequence[NBest] | None, test: Sequence[NBest]) -> list[NBest]:
    """Dev and test together (every utterance once), each with a reference.

    Raises:
        InputError: an utterance id repeats, or an utterance has no reference.
    """
    recs = [*(dev or []), *test]
    seen: set[str] = set()
    for nb in recs:
        if nb.utt_id in seen:
            raise InputError(f"utterance {nb.utt_id} is in both dev and test (or twice)",
                             expected="disjoint dev and test sets to pool into folds")
        seen.add(nb.utt_id)
        if nb.ref is None:
            raise InputError(f"utterance {nb.utt_id} has no reference", expected="references on every utterance: "
                                                                               "each fold tunes and tests on them")
    return recs


def _per_client(test: Sequence[NBest], words: Sequence[Any], base: Sequence[Any], fold_of: Mapping[str, int],
                ) -> tuple[list[dict[str, Any]], float]:
    """Each meeting's errors and WER under both systems and its N-best oracle WER (its headroom); the pooled
    oracle WER."""
    from privasr.metrics import oracle_wer, wer

    rows: dict[str, list[int]] = {}
    refs = [nb.ref or () for nb in test]
    wa, wb = wer(refs, words, aligner="sclite"), wer(refs, base, aligner="sclite")
    wo = oracle_wer(test, aligner="sclite")
    for nb, ea, eb, eo, n in zip(test, wa.utt_errors, wb.utt_errors, wo.utt_errors, wa.utt_ref_words, strict=True):
        r = rows.setdefault(str(nb.client), [0, 0, 0, 0, 0])
        r[0] += int(ea)
        r[1] += int(eb)
        r[2] += int(n)
        r[3] += 1
        r[4] += int(eo)
    return [{"client": c, "fold": fold_of[c], "utterances": r[3], "ref_words": r[2], "errors_baseline": r[1],
             "errors_system": r[0], "wer_baseline": r[1] / r[2] if r[2] else None,
             "wer_system": r[0] / r[2] if r[2] else None, "wer_oracle": r[4] / r[2] if r[2] else None}
            for c, r in sorted(rows.items())], wo.wer


def pool(folds: Sequence[Fold], test: Sequence[NBest], words: Sequence[Any], base: Sequence[Any],
         fold_rel: Sequence[float | None], *, seed: int, resamples: int, confidence: float
         ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pooled figures of the folds' concatenated test outputs (``test`` records, the system's ``words`` and
    the baseline's ``base``, every utterance once) and the per-meeting rows.

    Metrics: ``wer``, ``wer_baseline``, ``wer_rel_change``, ``wer_oracle`` (the N-best oracle: the headroom; per
    meeting too), MAPSSWE over the pooled outputs, a paired bootstrap
    over utterances (``bootstrap_ci_low``/``_high``, points as fractions) and over meetings
    (``meeting_bootstrap_ci_low``/``_high``: meetings resampled with replacement), the folds' smallest and largest
    relative change (``fold_rel``) and how many improved.
    """
    from privasr.metrics import mapsswe, paired_bootstrap, wer

    refs = [nb.ref or () for nb in test]
    w, wb = wer(refs, words, aligner="sclite"), wer(refs, base, aligner="sclite")
    mp = mapsswe(refs, words, base, ids=[nb.utt_id for nb in test])
    bs = paired_bootstrap(w.utt_errors, wb.utt_errors, w.utt_ref_words, seed=seed, resamples=resamples,
                          confidence=confidence)
    fold_of = {c: f.index for f in folds for c in f.test}
    per_client, oracle = _per_client(test, words, base, fold_of)
    mb = paired_bootstrap([r["errors_system"] for r in per_client], [r["errors_baseline"] for r in per_client],
                          [r["ref_words"] for r in per_client], seed=seed, resamples=resamples, confidence=confidence)
    rels = [r for r in fold_rel if r is not None]
    metrics = {
        "folds": len(folds), "wer": w.wer, "wer_baseline": wb.wer,
        "wer_rel_change": (w.wer - wb.wer) / wb.wer if wb.wer > 0 else None,
        "mapsswe_p": mp.p, "mapsswe_log10_p": mp.log10_p, "mapsswe_z": mp.z,
        "bootstrap_diff": bs.difference, "bootstrap_ci_low": bs.ci_low, "bootstrap_ci_high": bs.ci_high,
        "bootstrap_confidence": bs.confidence, "bootstrap_resamples": bs.resamples,
        "meeting_bootstrap_ci_low": mb.ci_low, "meeting_bootstrap_ci_high": mb.ci_high,
        "meeting_bootstrap_prob_improvement": mb.prob_a_better,
        "fold_rel_change_min": min(rels) if rels else None, "fold_rel_change_max": max(rels) if rels else None,
        "folds_improved": sum(1 for r in rels if r < 0),
        "test_utterances": len(test), "test_clients": len(per_client), "test_ref_words": w.ref_words,
        "wer_oracle": oracle,
    }
    return metrics, per_client


def pooled_perplexity(parts: Sequence[tuple[float, int]]) -> float | None:
    """The perplexity of the folds' test texts together from each fold's ``(perplexity, scored tokens)``: ``exp``
    of the token-weighted mean log-perplexity; ``None`` without parts.

    >>> round(pooled_perplexity([(100.0, 10), (200.0, 30)]), 2), pooled_perplexity([])
    (168.18, None)
    """
    n = sum(t for _, t in parts)
    if not n:
        return None
    return math.exp(sum(t * math.log(p) for p, t in parts) / n)


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


def _rel(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"


def report_lines(m: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], per_client: Sequence[Mapping[str, Any]],
                 extra_cols: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The report's fold table (one row per fold and the pooled row; ``extra_cols``: ``(header, row key)`` pairs
    after MAPSSWE p), the spread sentence and the per-meeting table."""
    head = "| fold | test meetings | utterances | baseline WER | system WER | rel. change | MAPSSWE p |"
    lines = [head + "".join(f" {h} |" for h, _ in extra_cols),
             "|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(extra_cols)]
    for r in rows:
        lines.append(f"| {r['fold']} | {' '.join(r['test_clients'])} | {r['test_utterances']:,} | "
                     f"{_pct(r['wer_baseline'])} | {_pct(r['wer'])} | {_rel(r['wer_rel_change'])} | "
                     f"{r['mapsswe_p']:.3g} |" + "".join(f" {_cell(r.get(k), k)} |" for _, k in extra_cols))
    lines += [f"| **pooled** | all {m['test_clients']} | {m['test_utterances']:,} | {_pct(m['wer_baseline'])} | "
              f"**{_pct(m['wer'])}** | **{_rel(m['wer_rel_change'])}** | **{m['mapsswe_p']:.3g}** |"
              + " |" * len(extra_cols), "",
              f"Spread: the folds' relative change runs from {_rel(m['fold_rel_change_min'])} to "
              f"{_rel(m['fold_rel_change_max'])}; {m['folds_improved']} of {m['folds']} folds improve. "
              f"Bootstrap {100 * m['bootstrap_confidence']:.0f}% CI of WER(system) - WER(baseline), in points: over "
              f"utterances [{100 * m['bootstrap_ci_low']:+.2f}, {100 * m['bootstrap_ci_high']:+.2f}], over meetings "
              f"[{100 * m['meeting_bootstrap_ci_low']:+.2f}, {100 * m['meeting_bootstrap_ci_high']:+.2f}] "
              f"({m['bootstrap_resamples']} resamples).", "",
              "| meeting | fold | utterances | baseline WER | system WER | N-best oracle WER |",
              "|---|---:|---:|---:|---:|---:|"]
    for c in per_client:
        lines.append(f"| {c['client']} | {c['fold']} | {c['utterances']} | {_pct(c['wer_baseline'])} | "
                     f"{_pct(c['wer_system'])} | {_pct(c.get('wer_oracle'))} |")
    return lines + [""]


def _cell(v: Any, key: str = "") -> str:
    """A fold table cell: a WER (a key starting ``wer``) as a percentage, other numbers to 3 digits.

    >>> _cell(0.17612, "wer_all"), _cell(0.8331, "auc"), _cell(None)
    ('17.61%', '0.833', '')
    """
    if isinstance(v, float):
        return f"{100 * v:.2f}%" if key.startswith("wer") else f"{v:.3g}"
    return "" if v is None else str(v)
