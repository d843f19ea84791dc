"""Scores of named-entity detection for anonymisation (paper 003, section 2.1).

:func:`span_prf`: exact-span precision / recall / F1 per label and micro-averaged; :func:`token_recall`: the
fraction of gold tokens of a label inside any detected span (what anonymisation needs); :func:`mention_outcomes`:
each gold mention as exact / other label / covered with other boundaries / partly covered / missed, and
``covered_recall``, the fraction whose every token is inside detected spans. :func:`leak_counts`: a gold
PER/ORG/LOC mention *leaks* when at least one of its tokens is unchanged after surrogate anonymisation with the
detector's spans (:class:`~privasr.anon.transform.Anonymizer`). :func:`names_leaked`: real participant names
(:func:`~privasr.anon.ner_data.clean_speaker_names`) are looked for, as whole lower-case tokens, in ASR-style
text: each full name (as a token sequence) and each of its tokens of 2+ letters. A name string is *leaked* if it
is unchanged after anonymisation at any occurrence. Name tokens that are common English words
(:func:`~privasr.anon.ner.common_words`, e.g. "will", "mark", "grant") count only where the reference
annotates them as PERSON (elsewhere they are the common word, not the name); the strict count counts them
everywhere. :func:`evaluate_detector` scores a detector on a part of the NER data sets
(:mod:`privasr.anon.ner_data`), every held-out sentence twice: cased and ASR-style
(:func:`~privasr.anon.ner.asr_style`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from privasr.anon.ner import EntityDetector, asr_style, detect_grouped
from privasr.anon.ner_data import NerData
from privasr.anon.transform import LABELS, Anonymizer, EntitySpan
from privasr.errors import ConfigError, InputError

__all__ = ["LEAK_LABELS", "MENTION_OUTCOMES", "span_prf", "token_recall", "mention_outcomes", "leak_counts",
           "names_leaked", "evaluate_detector"]

LEAK_LABELS = ("PER", "ORG", "LOC")
"""The gold categories whose mentions the leak rate counts."""


def span_prf(gold: Sequence[Sequence[EntitySpan]], pred: Sequence[Sequence[EntitySpan]],
             labels: Sequence[str] = LABELS) -> dict[str, dict[str, float]]:
    """Exact-span precision, recall and F1 per label and ``micro`` (over ``labels``), with the counts.

    >>> g = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "LOC")]]
    >>> p = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "ORG")]]
    >>> r = span_prf(g, p)
    >>> r["PER"]["f1"], r["LOC"]["recall"], r["ORG"]["precision"], r["micro"]["f1"]
    (1.0, 0.0, 0.0, 0.5)
    """
    if len(gold) != len(pred):
        raise InputError(f"{len(gold)} gold sentences but {len(pred)} predicted", expected="as many")
    out: dict[str, dict[str, float]] = {}
    tot = [0, 0, 0]
    for lab in labels:
        tp = n_gold = n_pred = 0
        for g, p in zip(gold, pred, strict=True):
            gs = {s for s in g if s.label == lab}
            ps = {s for s in p if s.label == lab}
            tp += len(gs & ps)
            n_gold += len(gs)
            n_pred += len(ps)
        out[lab] = _prf(tp, n_gold, n_pred)
        tot = [tot[0] + tp, tot[1] + n_gold, tot[2] + n_pred]
    out["micro"] = _prf(*tot)
    return out


def _prf(tp: int, n_gold: int, n_pred: int) -> dict[str, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0, "tp": tp, "gold": n_gold,
            "pred": n_pred}


def token_recall(gold: Sequence[Sequence[EntitySpan]], pred: Sequence[Sequence[EntitySpan]],
                 labels: Sequence[str] = LABELS) -> dict[str, float]:
    """Per label: the fraction of gold entity tokens inside a detected span of any label.

    >>> token_recall([[EntitySpan(0, 2, "PER")]], [[EntitySpan(1, 3, "ORG")]], ["PER"])
    {'PER': 0.5}
    """
    out = {}
    for lab in labels:
        n = hit = 0
        for g, p in zip(gold, pred, strict=True):
            covered = {i for s in p for i in range(s.start, s.end)}
            for s in g:
                if s.label == lab:
                    n += s.end - s.start
                    hit += sum(i in covered for i in range(s.start, s.end))
        out[lab] = hit / n if n else 0.0
    return out


MENTION_OUTCOMES = ("exact", "other_label", "covered", "partial", "missed")
"""How a gold mention fares, best first (:func:`mention_outcomes`)."""


def mention_outcomes(gold: Sequence[Sequence[EntitySpan]], pred: Sequence[Sequence[EntitySpan]],
                     labels: Sequence[str] = LABELS) -> dict[str, dict[str, float]]:
    """Per label, each gold mention's outcome, counted, with ``covered_recall``: ``exact`` (a detected span with
    the same boundaries and label), ``other_label`` (same boundaries, another label), ``covered`` (every token
    inside detected spans, boundaries differ: a surrogate or a class tag still replaces the whole mention),
    ``partial`` (some tokens inside) and ``missed``. ``covered_recall`` = (exact + other_label + covered) /
    mentions: the detection recall anonymisation needs; exact-span recall (:func:`span_prf`) is ``exact`` /
    mentions.

    >>> g = [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "PER"), EntitySpan(5, 7, "PER")]]
    >>> p = [[EntitySpan(0, 3, "PER"), EntitySpan(3, 4, "LOC"), EntitySpan(6, 7, "PER")]]
    >>> r = mention_outcomes(g, p, ["PER"])["PER"]
    >>> r["covered"], r["other_label"], r["partial"], r["covered_recall"]
    (1, 1, 1, 0.6666666666666666)
    """
    if len(gold) != len(pred):
        raise InputError(f"{len(gold)} gold sentences but {len(pred)} predicted", expected="as many")
    out: dict[str, dict[str, float]] = {}
    for lab in labels:
        acc = dict.fromkeys(MENTION_OUTCOMES, 0)
        for g, p in zip(gold, pred, strict=True):
            bounds = {(s.start, s.end): s.label for s in p}
            covered = {i for s in p for i in range(s.start, s.end)}
            for s in g:
                if s.label != lab:
                    continue
                hit = sum(i in covered for i in range(s.start, s.end))
                if (s.start, s.end) in bounds:
                    acc["exact" if bounds[(s.start, s.end)] == lab else "other_label"] += 1
                elif hit == s.end - s.start:
                    acc["covered"] += 1
                else:
                    acc["partial" if hit else "missed"] += 1
        n = sum(acc.values())
        res: dict[str, float] = {"mentions": n, **acc}
        res["covered_recall"] = (acc["exact"] + acc["other_label"] + acc["covered"]) / n if n else 0.0
        out[lab] = res
    return out


def leak_counts(words: Sequence[Sequence[str]], gold: Sequence[Sequence[EntitySpan]],
                pred: Sequence[Sequence[EntitySpan]], *, clients: Sequence[str] | None = None, seed: int = 0,
                labels: Sequence[str] = LEAK_LABELS) -> dict[str, dict[str, float]]:
    """Leaked gold mentions per label and ``all``: a mention leaks when any of its tokens is unchanged after
    surrogate anonymisation with ``pred``. Returns ``{label: {"mentions", "leaked", "leak_rate"}}``.

    >>> w = [("john", "smith", "met", "acme")]
    >>> leak_counts(w, [[EntitySpan(0, 2, "PER"), EntitySpan(3, 4, "ORG")]], [[EntitySpan(1, 2, "PER")]])["all"]
    {'mentions': 2, 'leaked': 2, 'leak_rate': 1.0}
    """
    anon = Anonymizer("surrogate", seed=seed)
    acc = {lab: [0, 0] for lab in labels}
    for k, (ws, g, p) in enumerate(zip(words, gold, pred, strict=True)):
        out = anon.transform(ws, p, client=clients[k] if clients is not None else "")
        for s in g:
            if s.label in acc:
                acc[s.label][0] += 1
                acc[s.label][1] += any(out[i] == ws[i] for i in range(s.start, s.end))
    res = {lab: {"mentions": m, "leaked": x, "leak_rate": x / m if m else 0.0} for lab, (m, x) in acc.items()}
    m, x = sum(v[0] for v in acc.values()), sum(v[1] for v in acc.values())
    res["all"] = {"mentions": m, "leaked": x, "leak_rate": x / m if m else 0.0}
    return res


def names_leaked(words: Sequence[Sequence[str]], gold: Sequence[Sequence[EntitySpan]],
                 anonymised: Sequence[Sequence[str]], names: Iterable[tuple[str, ...]],
                 common: Iterable[str]) -> dict[str, Any]:
    """Which real names survive anonymisation (see the module docstring): per name string (full names of 2+
    tokens and single tokens) its occurrences and how many are unchanged; ``leaked`` / ``leaked_strict`` the
    sorted names with an unchanged occurrence (``strict``: common-word tokens counted everywhere).

    >>> w = [("thanks", "will", "smith"), ("we", "will", "grow")]
    >>> a = [("thanks", "bob", "smith"), ("we", "will", "grow")]
    >>> g = [[EntitySpan(1, 3, "PER")], []]
    >>> r = names_leaked(w, g, a, [("will", "smith")], common={"will"})
    >>> r["leaked"], r["leaked_strict"]
    (['smith'], ['smith', 'will'])
    """
    common = set(common)
    full = {n for n in names if len(n) > 1}
    toks = {t for n in names for t in n}
    by_first: dict[str, list[tuple[str, ...]]] = {}
    for n in sorted(full):
        by_first.setdefault(n[0], []).append(n)
    occ: dict[str, list[int]] = {}  # name -> [occurrences, unchanged, occurrences as PER, unchanged as PER]
    for ws, g, out in zip(words, gold, anonymised, strict=True):
        if len(out) != len(ws):
            raise InputError("an anonymised sentence has another length", expected="surrogate anonymisation")
        per = {i for s in g if s.label == "PER" for i in range(s.start, s.end)}
        for i, w in enumerate(ws):
            if w in toks:
                c = occ.setdefault(w, [0, 0, 0, 0])
                same = out[i] == w
                c[0] += 1
                c[1] += same
                c[2] += i in per
                c[3] += same and i in per
        for i, w in enumerate(ws):
            for n in by_first.get(w, ()):
                k = len(n)
                if tuple(ws[i:i + k]) == n:
                    c = occ.setdefault(" ".join(n), [0, 0, 0, 0])
                    same = tuple(out[i:i + k]) == n
                    c[0] += 1
                    c[1] += same
                    c[2] += 1
                    c[3] += same
    rows = []
    for name, (n, same, n_per, same_per) in sorted(occ.items()):
        is_common = " " not in name and name in common
        rows.append({"name": name, "common_word": is_common, "occurrences": n, "unchanged": same,
                     "occurrences_as_person": n_per, "unchanged_as_person": same_per,
                     "leaked": (same_per if is_common else same) > 0})
    return {"names": rows, "leaked": [r["name"] for r in rows if r["leaked"]],
            "leaked_strict": [r["name"] for r in rows if r["unchanged"] > 0],
            "name_strings_found": len(rows)}


def evaluate_detector(detector: EntityDetector, data: NerData, *, seed: int = 0, part: str = "test"
                      ) -> dict[str, Any]:
    """P/R/F1 (exact span) per label, token recall and leak counts of ``detector`` on the ``part`` (``test``, or
    ``dev`` for choosing settings) of every data set, cased and ASR-style, and pooled over the data sets that
    are not synthetic (``all``; ``data.synthetic`` sets are reported on their own); seconds taken."""
    if part not in ("test", "dev"):
        raise ConfigError(f"part={part!r}", expected="test or dev")
    res: dict[str, Any] = {}
    pooled: dict[str, list[list[Any]]] = {}
    t0 = time.perf_counter()
    n_tokens = 0
    for name in data.parts:
        test = data.parts[name][part]
        clients = data.clients[name][part]
        for style in ("cased", "asr"):
            docs = test if style == "cased" else [asr_style(w, s) for w, s in test]
            words = [w for w, _ in docs]
            gold = [s for _, s in docs]
            pred = detect_grouped(detector, words, clients)
            n_tokens += sum(map(len, words))
            res.setdefault(style, {})[name] = _scores(words, gold, pred, clients, seed)
            if name in data.synthetic:
                continue
            acc = pooled.setdefault(style, [[], [], [], []])
            for k, v in enumerate((words, gold, pred, clients)):
                acc[k].extend(v)
    for style, (w, g, p, c) in pooled.items():
        res[style]["all"] = _scores(w, g, p, c, seed)
    res["seconds"] = time.perf_counter() - t0
    res["tokens"] = n_tokens
    return res


def _scores(words: list[Any], gold: list[Any], pred: list[Any], clients: list[str], seed: int) -> dict[str, Any]:
    n_tok = sum(map(len, words))
    tagged = sum(s.end - s.start for p in pred for s in p)
    return {"prf": span_prf(gold, pred), "token_recall": token_recall(gold, pred),
            "mentions": mention_outcomes(gold, pred),
            "leak": leak_counts(words, gold, pred, clients=clients, seed=seed),
            "sentences": len(words), "tokens": n_tok, "tagged_fraction": tagged / n_tok if n_tok else 0.0}
