"""Evaluation of named-entity detection for anonymisation (paper 003, section 2.1), behind
``privasr anon eval-ner``.

**Data and splits** (never evaluated on training documents):

* Wikigold (``ner-wikigold/wikigold.conll.txt``, 145 documents, CoNLL labels): documents are shuffled with the
  seed and dealt into 5 folds; fold 0 is the test fold, fold 1 the dev fold, folds 2-4 train.
* Earnings-21 (``earnings21/references_nlp_wertags.tar.xz``, 44 calls): calls shuffled with the seed; the
  first 10 are test, the next 4 dev, the other 30 train. The cased text is rebuilt from the ``.nlp`` tokens
  (which keep their case) with each non-empty ``punctuation`` value as a token after its word; turns are
  split into sentences after ``. ? ! …`` (never inside an entity). Entity types are mapped by
  :data:`EARNINGS21_TO_LABEL`: PERSON -> PER, ORG -> ORG, GPE/LOC/FAC -> LOC, NORP/PRODUCT/EVENT/
  WORK_OF_ART/LAW/LANGUAGE -> MISC; **not entities**: DATE and TIME (Earnings-21's are mostly "the quarter",
  "next year", "good morning"; Wikigold, the other gold set, does not annotate dates, so one model could not
  learn both), the numeric types (CARDINAL, MONEY, PERCENT, YEAR, ORDINAL, QUANTITY, RANGE), and the
  normalisation classes CONTRACTION, ABBREVIATION, ALPHANUMERIC, WEBSITE, TWITTER, FALLBACK. Overlapping
  spans after the mapping: the longest is kept (:func:`~privasr.anon.ner.resolve_overlaps`).

Every held-out sentence is evaluated twice: cased (as above) and ASR-style (:func:`~privasr.anon.ner.asr_style`).

**Metrics.** :func:`span_prf`: exact-span precision / recall / F1 per label and micro-averaged;
``token_recall``: fraction of gold tokens of a label inside any detected span (what anonymisation needs);
:func:`mention_outcomes`: each gold mention as exact / other label / covered with other boundaries / partly
covered / missed, and ``covered_recall``, the fraction whose every token is inside detected spans.
:func:`leak_counts`: a gold PER/ORG/LOC mention *leaks* when at least one of its tokens is unchanged after
surrogate anonymisation with the detector's spans (:class:`~privasr.anon.transform.Anonymizer`).
:func:`names_leaked`: the real participant names of ``speaker-metadata.csv`` (placeholders such as "Speaker
3" or "Operator" removed) are looked for, as whole lower-case tokens, in the ASR-style reference text of all
44 calls: each full name (as a token sequence) and each of its tokens of 2+ letters. A name string is
*leaked* if it is unchanged after anonymisation at any occurrence. Name tokens that are common English words
(:func:`~privasr.anon.ner.common_words`, e.g. "will", "mark", "grant") count only where the reference
annotates them as PERSON (elsewhere they are the common word, not the name); the strict count, which counts
them everywhere, is reported too (``earnings21_names_leaked_strict``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.anon.ner import (
    CombinedDetector,
    EntityDetector,
    NerTrainConfig,
    PatternDetector,
    SpacyDetector,
    Truecaser,
    asr_style,
    common_words,
    detect_grouped,
    load_base,
    load_detector,
    resolve_overlaps,
    train_ner,
)
from privasr.anon.transform import LABELS, Anonymizer, EntitySpan
from privasr.errors import ConfigError, InputError

__all__ = ["EARNINGS21_TO_LABEL", "LEAK_LABELS", "MENTION_OUTCOMES", "NerData", "span_prf", "token_recall",
           "mention_outcomes", "leak_counts",
           "wikigold_docs", "earnings21_docs", "split_ids", "load_ner_data", "clean_speaker_names",
           "names_leaked", "evaluate_detector", "cached_model", "finetuned_model", "run_eval_ner"]

Doc = tuple[tuple[str, ...], list[EntitySpan]]

EARNINGS21_TO_LABEL: Mapping[str, str] = {
    "PERSON": "PER", "ORG": "ORG", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC",
    "NORP": "MISC", "PRODUCT": "MISC", "EVENT": "MISC", "WORK_OF_ART": "MISC", "LAW": "MISC", "LANGUAGE": "MISC",
}
"""Earnings-21 entity types -> paper 003's categories (every other type is not an entity)."""

LEAK_LABELS = ("PER", "ORG", "LOC")
"""The gold categories whose mentions the leak rate counts."""

SENTENCE_END = frozenset({".", "?", "!", "…"})
DATA_VERSION = 1
"""Bumped when the data preparation changes (part of the model cache key)."""


# -------------------------------------------------------------------------------------------------- metrics


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


# ----------------------------------------------------------------------------------------------------- data


def wikigold_docs(path: str | Path) -> dict[str, list[Doc]]:
    """Wikigold's sentences (cased, CoNLL labels) grouped by document id.

    Raises:
        InputError: a malformed file (from the CoNLL reader) or an unknown label.
    """
    from privasr.corpus.formats.conll import read_conll

    out: dict[str, list[Doc]] = {}
    for t in read_conll(path):
        spans = []
        for s in t.entities:
            if s.label not in LABELS:
                raise InputError(f"sentence {t.utt_id}: label {s.label!r}", path=path,
                                 expected=f"one of {list(LABELS)}")
            spans.append(EntitySpan(s.start, s.end, s.label))
        out.setdefault(t.client or "doc", []).append((tuple(t.words), spans))
    return out


def earnings21_docs(path: str | Path) -> dict[str, list[Doc]]:
    """Earnings-21 reference sentences (cased, punctuation tokens, mapped labels; see the module docs) by call.

    Raises:
        InputError: from the Earnings-21 reader.
    """
    from privasr.corpus.formats.earnings21 import read_earnings21

    out: dict[str, list[Doc]] = {}
    for t in read_earnings21(path):
        punct = t.meta.get("punctuation") or [""] * len(t.words)
        words: list[str] = []
        pos: list[int] = []
        for w, p in zip(t.words, punct, strict=True):
            pos.append(len(words))
            words.append(w)
            if p.strip():
                words.append(p.strip())
        spans = resolve_overlaps(EntitySpan(pos[s.start], pos[s.end - 1] + 1, EARNINGS21_TO_LABEL[s.label])
                                 for s in t.entities if s.label in EARNINGS21_TO_LABEL)
        inside = np.zeros(len(words) + 1, dtype=bool)
        for s in spans:
            inside[s.start + 1:s.end] = True  # a cut before token i is forbidden when i continues a span
        sents = out.setdefault(t.client or t.utt_id, [])
        a = 0
        for i, w in enumerate(words):
            if w in SENTENCE_END and not inside[i + 1]:
                sents.append(_cut(words, spans, a, i + 1))
                a = i + 1
        if a < len(words):
            sents.append(_cut(words, spans, a, len(words)))
    return out


def _cut(words: list[str], spans: list[EntitySpan], a: int, b: int) -> Doc:
    return tuple(words[a:b]), [EntitySpan(s.start - a, s.end - a, s.label) for s in spans if a <= s.start and s.end <= b]


def split_ids(ids: Iterable[str], seed: int, *, n_test: int, n_dev: int) -> dict[str, list[str]]:
    """Shuffle ``ids`` (sorted first) with ``seed``; the first ``n_test`` are test, the next ``n_dev`` dev.

    >>> s = split_ids([f"d{i}" for i in range(10)], 0, n_test=2, n_dev=2)
    >>> [len(s[k]) for k in ("train", "dev", "test")], set(s["test"]) & set(s["train"])
    ([6, 2, 2], set())
    """
    order = sorted(ids)
    if n_test + n_dev >= len(order):
        raise ConfigError(f"{len(order)} documents cannot give {n_test} test and {n_dev} dev ones and a train part",
                          expected="more documents")
    perm = [order[i] for i in np.random.default_rng([seed, 8]).permutation(len(order))]
    return {"test": sorted(perm[:n_test]), "dev": sorted(perm[n_test:n_test + n_dev]),
            "train": sorted(perm[n_test + n_dev:])}


@dataclass
class NerData:
    """Cased sentences per data set and part (``train``/``dev``/``test``), with the ids behind them."""

    parts: dict[str, dict[str, list[Doc]]]
    clients: dict[str, dict[str, list[str]]]
    ids: dict[str, dict[str, list[str]]]
    files: dict[str, Path]


def load_ner_data(data: str | Path, seed: int = 0) -> NerData:
    """Wikigold (5 document folds: test fold 0, dev fold 1) and Earnings-21 (10 test, 4 dev calls) splits.

    Raises:
        ConfigError: a data file is missing (naming it).
    """
    d = Path(data)
    files = {"wikigold": d / "ner-wikigold" / "wikigold.conll.txt",
             "earnings21": d / "earnings21" / "references_nlp_wertags.tar.xz"}
    for p in files.values():
        if not p.is_file():
            raise ConfigError("NER evaluation data not found", path=p, expected="the shared data folder layout")
    by_set = {"wikigold": wikigold_docs(files["wikigold"]), "earnings21": earnings21_docs(files["earnings21"])}
    n = len(by_set["wikigold"])
    fold = max(1, round(n / 5))
    ids = {"wikigold": split_ids(by_set["wikigold"], seed, n_test=fold, n_dev=fold),
           "earnings21": split_ids(by_set["earnings21"], seed, n_test=10, n_dev=4)}
    parts: dict[str, dict[str, list[Doc]]] = {}
    clients: dict[str, dict[str, list[str]]] = {}
    for name, docs in by_set.items():
        parts[name], clients[name] = {}, {}
        for part, keys in ids[name].items():
            parts[name][part] = [x for k in keys for x in docs[k]]
            clients[name][part] = [k for k in keys for _ in docs[k]]
    return NerData(parts, clients, ids, files)


# ---------------------------------------------------------------------------------------------------- names

_PLACEHOLDER = re.compile(r"^(speaker|operator|unknown|unidentified|moderator|participant|analyst|host)\b|\bhost$",
                          re.I)
_NOT_NAME = frozenset({"mr", "mrs", "ms", "dr", "jr", "sr", "ii", "iii", "iv"})


def clean_speaker_names(names: Iterable[str]) -> list[tuple[str, ...]]:
    """Distinct real names as lower-case token tuples (placeholders such as "Speaker 3", "Operator", "Meeting
    Host", names with digits, 1-letter tokens, titles and suffixes such as "Dr." or "IV" removed).

    >>> clean_speaker_names(["Speaker 3", "Operator", "James.", "Carolina Dybeck Happe", "Dr. J. Smith IV",
    ...                      "Meeting Host"])
    [('carolina', 'dybeck', 'happe'), ('james',), ('smith',)]
    """
    out = set()
    for n in names:
        if _PLACEHOLDER.search(n.strip()) or any(c.isdigit() for c in n):
            continue
        toks = tuple(t for t in (re.sub(r"[^\w'-]", "", w).lower() for w in n.split())
                     if len(t) > 1 and t not in _NOT_NAME)
        if toks:
            out.add(toks)
    return sorted(out)


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


# ----------------------------------------------------------------------------------------------- evaluation


def evaluate_detector(detector: EntityDetector, data: NerData, *, seed: int = 0, part: str = "test"
                      ) -> dict[str, Any]:
    """P/R/F1 (exact span) per label, token recall and leak counts of ``detector`` on the ``part`` (``test``, or
    ``dev`` for choosing settings) of every data set, cased and ASR-style, and pooled over the data sets
    (``all``); seconds taken."""
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


def _gutenberg_cased(data: Path) -> list[tuple[str, ...]]:
    from privasr.corpus.sources import _gutenberg

    try:
        return _gutenberg(data, lambda toks: toks)
    except (ConfigError, InputError):
        return []


def _write_truecaser(folder: Path, data: NerData, data_dir: Path,
                     cased: list[tuple[str, ...]] | None = None) -> None:
    if cased is None:
        cased = _gutenberg_cased(data_dir) + [w for name in data.parts for w, _ in data.parts[name]["train"]]
    tc = Truecaser.fit(cased)
    tmp = folder / "truecase.json.tmp"
    tmp.write_text(json.dumps(tc.to_json()) + "\n", encoding="utf-8")
    tmp.rename(folder / "truecase.json")


def cached_model(data: NerData, data_dir: Path, cfg: NerTrainConfig, cache_root: Path, split_seed: int,
                 log: Any = None) -> tuple[Path, dict[str, Any], bool]:
    """The fine-tuned model folder for ``cfg`` on ``data``'s train/dev parts: ``cache_root/ner-<key>`` (key: the
    config, the split seed, the data files' hashes, :data:`DATA_VERSION`), trained first when absent.
    Training uses every train sentence cased and ASR-style; the dev parts (both forms) pick the epoch.
    The folder also holds ``common-words.json``: :func:`~privasr.anon.ner.common_words` of the Gutenberg books
    (when present) and the cased training sentences, and ``truecase.json``: a
    :class:`~privasr.anon.ner.Truecaser` fitted on the same text (added to a cached folder that lacks it). Returns (folder, its privasr-ner.json, trained now)."""
    import hashlib

    from privasr.results import fingerprint

    fps = {k: fingerprint(p)["sha256"] for k, p in sorted(data.files.items())}
    key_src = json.dumps({"cfg": asdict(cfg), "split_seed": split_seed, "data": fps, "v": DATA_VERSION},
                         sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    folder = Path(cache_root) / f"ner-{key}"
    meta = folder / "privasr-ner.json"
    if meta.is_file() and (folder / "common-words.json").is_file():
        if not (folder / "truecase.json").is_file():  # added later: written without retraining
            _write_truecaser(folder, data, data_dir)
        return folder, json.loads(meta.read_text(encoding="utf-8")), False
    train = [d for name in data.parts for w, s in data.parts[name]["train"] for d in ((w, s), asr_style(w, s))]
    dev = [d for name in data.parts for w, s in data.parts[name]["dev"] for d in ((w, s), asr_style(w, s))]
    tmp = folder.with_name(folder.name + ".tmp")
    info = train_ner(train, dev, tmp, cfg, extra={"split_seed": split_seed, "data": fps, "key": key}, log=log)
    cased = _gutenberg_cased(data_dir) + [w for name in data.parts for w, _ in data.parts[name]["train"]]
    common = sorted(common_words(cased))
    (tmp / "common-words.json").write_text(json.dumps(common) + "\n", encoding="utf-8")
    _write_truecaser(tmp, data, data_dir, cased)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder, info, True


def finetuned_model(data_dir: str | Path | None = None, cache_root: str | Path = "runs/cache", *, seed: int = 0,
                    log: Any = None) -> Path:
    """The folder of the project's fine-tuned NER (the default :class:`~privasr.anon.ner.NerTrainConfig` on the
    ``seed`` split of ``data_dir``'s Wikigold and Earnings-21 training parts, :func:`cached_model`): taken from
    ``cache_root`` when present, trained there first otherwise (about 10 minutes on 2 CPU cores). This is what
    the detector spec ``"finetuned"`` of :func:`~privasr.anon.ner.load_detector` loads.

    Raises:
        ConfigError: no data folder (``$PRIVASR_DATA`` or ``../shared/data``) holds the NER data.
    """
    from privasr.paths import data_dir as default_data_dir

    d = Path(data_dir) if data_dir is not None else default_data_dir()
    if d is None:
        raise ConfigError("the fine-tuned NER needs the evaluation data to train on, and no data folder was found",
                          expected="$PRIVASR_DATA or ../shared/data with ner-wikigold and earnings21")
    folder, _, _ = cached_model(load_ner_data(d, seed), d, NerTrainConfig(seed=seed), Path(cache_root), seed, log)
    return folder


def run_eval_ner(data_dir: str | Path, out: str | Path, *, model: str = "finetuned", seed: int = 0,
                 train_config: NerTrainConfig | None = None, cache_root: str | Path = "runs/cache",
                 systems: Sequence[str] = ("stock", "stock+patterns", "patterns", "finetuned", "finetuned+patterns",
                                           "finetuned+recall"),
                 log: Any = None, part: str = "test") -> dict[str, Any]:
    """Evaluate, write ``out/results.json`` and ``out/report.md``; return the metrics.

    ``part``: ``"test"`` (the reported figures) or ``"dev"`` (where settings are chosen); the names-leaked
    counts always cover all 44 Earnings-21 calls.

    ``model``: the primary system: ``"finetuned"`` (``finetuned+recall``: the cached fine-tuned model +
    patterns + the recall passes of :class:`~privasr.anon.ner.CombinedDetector` -- truecasing union,
    propagation within each Wikigold document / Earnings-21 call, PER refinement -- as
    :func:`~privasr.anon.ner.load_detector` builds it), or any spec of :func:`~privasr.anon.ner.load_detector`. ``systems`` are compared beside it (the fine-tuned ones trained
    or taken from the cache). The contract metrics come from the primary system: ``per_recall_asr_style``
    (exact-span PER recall on the ASR-style test parts, pooled; ``per_precision_asr_style`` and
    ``per_token_recall_asr_style``, the fraction of gold PER tokens inside any span, beside it), ``leak_rate`` (ASR-style, PER/ORG/LOC
    mentions of the test parts, pooled) and ``earnings21_names_leaked`` (all 44 calls, ASR-style).
    """
    from privasr.corpus.formats.earnings21 import read_speaker_names
    from privasr.results import write_results

    data_dir = Path(data_dir)
    cfg = train_config or NerTrainConfig(seed=seed)
    data = load_ner_data(data_dir, seed)
    names_file = data_dir / "earnings21" / "speaker-metadata.csv"
    if not names_file.is_file():
        raise ConfigError("speaker metadata not found", path=names_file, expected="earnings21/speaker-metadata.csv")
    needs_ft = model == "finetuned" or any(s.startswith("finetuned") for s in systems)
    folder, info, trained = (cached_model(data, data_dir, cfg, Path(cache_root), seed, log) if needs_ft
                             else (None, {}, False))
    own_folder = (Path(model) / "privasr-ner.json").is_file()  # a trained model keeps its own common words
    words_file = folder if folder is not None else (Path(model) if own_folder else None)
    common = json.loads((words_file / "common-words.json").read_text()) if words_file is not None and (
        words_file / "common-words.json").is_file() else sorted(common_words(_gutenberg_cased(data_dir)))
    stock = SpacyDetector(load_base()) if any(s.startswith("stock") for s in systems) or model == "stock" else None
    ft = load_detector({"model": str(folder), "patterns": False}) if folder is not None else None
    patterns = PatternDetector(common=common)
    recall = load_detector(str(folder), common=common) if folder is not None else None
    builders = {"stock": lambda: stock, "stock+patterns": lambda: CombinedDetector(stock, patterns),
                "finetuned": lambda: ft, "finetuned+patterns": lambda: CombinedDetector(ft, patterns),
                "patterns": lambda: patterns, "finetuned+recall": lambda: recall}
    primary_name = "finetuned+recall" if model == "finetuned" else model
    primary = builders[primary_name]() if primary_name in builders else load_detector(model, common=common)
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
    # names over all 44 calls, ASR-style
    all_calls = earnings21_docs(data.files["earnings21"])
    names = clean_speaker_names(read_speaker_names(names_file).values())
    name_res = {}
    heldout = set(data.ids["earnings21"]["test"])
    for s in dict.fromkeys([primary_name, *(x for x in systems if x in ("stock", "finetuned+patterns"))]):
        det = primary if s == primary_name else builders[s]()
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
        name_res[s] = {"all_calls": r, "test_calls": {k: rh[k] for k in ("leaked", "leaked_strict",
                                                                          "name_strings_found")}}
    prim = results[primary_name]
    nr = name_res[primary_name]["all_calls"]
    metrics: dict[str, Any] = {
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
        "earnings21_names_leaked": len(nr["leaked"]),
        "earnings21_names_leaked_list": nr["leaked"],
        "earnings21_names_leaked_strict": len(nr["leaked_strict"]),
        "earnings21_names_leaked_strict_list": nr["leaked_strict"],
        "earnings21_name_strings_found": nr["name_strings_found"],
        "earnings21_names_leaked_test_calls": len(name_res[primary_name]["test_calls"]["leaked"]),
        "primary_system": primary_name,
        "train_seconds": info.get("train_seconds"), "trained_now": trained,
        "model_dir": str(folder) if folder is not None else None, "best_epoch": info.get("best_epoch"),
        "systems": results, "names": name_res,
    }
    config = {"model": model, "part": part, "systems": list(systems), "train": asdict(cfg), "split_seed": seed,
              "splits": data.ids, "earnings21_label_map": dict(EARNINGS21_TO_LABEL), "leak_labels": list(LEAK_LABELS),
              "common_words": len(common), "gazetteer_names": len(patterns.gazetteer)}
    out = Path(out)
    write_results(out, config=config, seed=seed, metrics=metrics,
                  data={**{k: str(p) for k, p in data.files.items()}, "speaker_names": str(names_file)})
    (out / "report.md").write_text(report(metrics), encoding="utf-8")
    return metrics


def report(metrics: Mapping[str, Any]) -> str:
    """A Markdown table of P/R/F1 per system, style and label (pooled test parts) and the leak figures."""
    lines = ["# NER for anonymisation (held-out test parts, exact spans)", "",
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
    lines += ["", f"primary system: {metrics['primary_system']}; PER recall (ASR-style) "
              f"{metrics['per_recall_asr_style']:.4f} (token recall {metrics['per_token_recall_asr_style']:.4f}, "
              f"mentions covered {metrics['per_covered_recall_asr_style']:.4f}, "
              f"precision {metrics['per_precision_asr_style']:.4f}); leak rate {metrics['leak_rate']:.4f}; Earnings-21 names "
              f"leaked {metrics['earnings21_names_leaked']} (strict {metrics['earnings21_names_leaked_strict']}): "
              + ", ".join(metrics["earnings21_names_leaked_list"]), ""]
    return "\n".join(lines)
