"""The NER data sets of paper 003 (section 2.1): Wikigold and Earnings-21, sentence by sentence, with seeded
train / dev / test splits. The project's fine-tuned NER is trained on the train parts
(:mod:`privasr.anon.ner_model`) and evaluated on the held-out ones (:mod:`privasr.experiments.ner_eval`).

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

The real participant names of Earnings-21's ``speaker-metadata.csv`` (:func:`clean_speaker_names`: placeholders
such as "Speaker 3" or "Operator" removed) are what :func:`~privasr.anon.ner_metrics.names_leaked` looks for.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privasr.anon.ner import resolve_overlaps
from privasr.anon.transform import LABELS, EntitySpan, map_label
from privasr.errors import ConfigError, InputError

__all__ = ["Doc", "EARNINGS21_TO_LABEL", "SENTENCE_END", "DATA_VERSION", "NerData", "wikigold_docs",
           "earnings21_docs", "split_ids", "load_ner_data", "clean_speaker_names", "file_ner_data", "presidio_docs",
           "PRESIDIO_TO_LABEL", "TEMPLATES_SET", "TEMPLATE_FILLS", "TEMPLATE_SPLIT", "seen_templates"]

Doc = tuple[tuple[str, ...], list[EntitySpan]]
"""One training or evaluation sentence: its tokens and gold spans."""

EARNINGS21_TO_LABEL: Mapping[str, str] = {
    "PERSON": "PER", "ORG": "ORG", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC",
    "NORP": "MISC", "PRODUCT": "MISC", "EVENT": "MISC", "WORK_OF_ART": "MISC", "LAW": "MISC", "LANGUAGE": "MISC",
}
"""Earnings-21 entity types -> paper 003's categories (every other type is not an entity)."""

SENTENCE_END = frozenset({".", "?", "!", "…"})
DATA_VERSION = 3
"""Bumped when the data preparation changes (part of the fine-tuned model's cache key)."""


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
    """Cased sentences per data set and part (``train``/``dev``/``test``), with the ids behind them.

    ``synthetic`` names the sets that are generated (the filled templates): reported on their own, never pooled
    into an evaluation's ``all`` (:func:`~privasr.anon.ner_metrics.evaluate_detector`)."""

    parts: dict[str, dict[str, list[Doc]]]
    clients: dict[str, dict[str, list[str]]]
    ids: dict[str, dict[str, list[str]]]
    files: dict[str, Path]
    synthetic: frozenset[str] = frozenset()
    left_out: str = ""
    """What was left out of a held-out file and why (:func:`file_ner_data`; empty when nothing was)."""


TEMPLATES_SET = "presidio-templates"
"""The name of the filled-template set in :class:`NerData` (:mod:`privasr.anon.ner_templates`)."""

TEMPLATE_FILLS = 8
"""Sentences filled from each template (8 x 210 templates: 1,680 sentences, about 840 of them training)."""

TEMPLATE_SPLIT = (0.4, 0.1)
"""Fractions of the templates held out as test and dev (the rest train): whole templates, so a test sentence
never shares its wording with a training one."""


def load_ner_data(data: str | Path, seed: int = 0, templates: str | Path | None = None) -> NerData:
    """Wikigold (5 document folds: test fold 0, dev fold 1) and Earnings-21 (10 test, 4 dev calls) splits; with
    ``templates`` (the folder of :func:`~privasr.anon.ner_templates.presidio_templates`), also
    :data:`TEMPLATES_SET`: presidio-evaluator's templates split whole with the seed (:data:`TEMPLATE_SPLIT`),
    each filled :data:`TEMPLATE_FILLS` times (:func:`~privasr.anon.ner_templates.fill_templates`; a template is
    a document).

    Raises:
        ConfigError: a data file is missing (naming it); InputError: a malformed templates file.
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
    synthetic: frozenset[str] = frozenset()
    if templates is not None:
        from privasr.anon.ner_templates import fill_templates, read_templates

        files[TEMPLATES_SET] = Path(templates) / "templates.txt"
        texts = read_templates(files[TEMPLATES_SET])
        keep = [i for i, t in enumerate(texts) if t.strip()]
        ids[TEMPLATES_SET] = _template_ids(texts, seed)
        by_set[TEMPLATES_SET] = fill_templates(texts, keep, TEMPLATE_FILLS, seed,
                                               Path(templates) / "nationalities.csv")
        synthetic = frozenset({TEMPLATES_SET})
    parts: dict[str, dict[str, list[Doc]]] = {}
    clients: dict[str, dict[str, list[str]]] = {}
    for name, docs in by_set.items():
        parts[name], clients[name] = {}, {}
        for part, keys in ids[name].items():
            parts[name][part] = [x for k in keys for x in docs[k]]
            clients[name][part] = [k for k in keys for _ in docs[k]]
    return NerData(parts, clients, ids, files, synthetic)


def seen_templates(folder: str | Path, seed: int = 0) -> tuple[frozenset[int], list[str]]:
    """The template numbers of the train and dev parts :func:`load_ner_data` makes from the templates in
    ``folder`` with ``seed`` (those the fine-tuned model has seen), and the templates."""
    from privasr.anon.ner_templates import read_templates

    texts = read_templates(Path(folder) / "templates.txt")
    ids = _template_ids(texts, seed)
    return frozenset(int(k[1:]) for part in ("train", "dev") for k in ids[part]), texts


def _template_ids(texts: Sequence[str], seed: int) -> dict[str, list[str]]:
    keep = [i for i, t in enumerate(texts) if t.strip()]
    n_t = len(keep)
    return split_ids([f"t{i}" for i in keep], seed, n_test=round(TEMPLATE_SPLIT[0] * n_t),
                     n_dev=max(1, round(TEMPLATE_SPLIT[1] * n_t)))


PRESIDIO_TO_LABEL: Mapping[str, str] = {
    "PERSON": "PER", "ORGANIZATION": "ORG", "LOCATION": "LOC", "GPE": "LOC", "STREET_ADDRESS": "LOC",
    "NRP": "MISC", "PHONE_NUMBER": "MISC", "EMAIL_ADDRESS": "MISC", "CREDIT_CARD": "MISC", "IBAN_CODE": "MISC",
    "US_SSN": "MISC", "IP_ADDRESS": "MISC", "URL": "MISC", "DATE_TIME": "MISC", "US_DRIVER_LICENSE": "MISC",
    "US_PASSPORT": "MISC", "US_BANK_NUMBER": "MISC", "ZIP_CODE": "MISC", "AGE": "MISC", "TITLE": "MISC",
}
"""presidio-evaluator's entity types -> paper 003's categories (personal identifiers as MISC)."""

def presidio_docs(path: str | Path, seen_templates: tuple[Collection[int], Sequence[str]] | None = None
                  ) -> tuple[list[Doc], str]:
    """presidio-evaluator's synthetic PII sentences (a JSON list of ``{"full_text", "spans": [{"entity_type",
    "start_position", "end_position"}]}``, e.g. ``data/synth_dataset_v2.json`` of the ``presidio-evaluator``
    source package) as tokenised sentences (words, contractions and hyphenated words whole, punctuation
    apart) with token spans (every token a span's characters touch; :data:`PRESIDIO_TO_LABEL`), and what was left
    out.

    ``seen_templates`` (template numbers a model trained on, and the templates file's lines: presidio-evaluator's
    ``template_id`` counts them): records of those templates are left out, so that the rest is held out from
    that model. The numbers are trusted only when most records' ``masked`` text matches the template of their
    ``template_id`` (:func:`~privasr.anon.ner_templates.template_key`); otherwise nothing is left out and the
    returned note says the file may share templates with the training text.

    Raises:
        InputError: not such a list, naming the record and what it lacks.
    """
    import json

    from privasr.errors import InputError

    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read it as JSON: {e}", path=p) from None
    if not isinstance(data, list):
        raise InputError("not a JSON list", path=p, expected='[{"full_text": ..., "spans": [...]}, ...]')
    for k, rec in enumerate(data):
        if not (isinstance(rec, dict) and isinstance(rec.get("full_text"), str) and isinstance(rec.get("spans"),
                                                                                                list)):
            raise InputError(f"record {k} has no 'full_text' string and 'spans' list", path=p,
                             expected="presidio-evaluator's synthetic data records")
    from privasr.anon.ner_templates import tokenise_with_spans

    drop, note = _seen(data, seen_templates)
    out: list[Doc] = []
    for k, rec in enumerate(data):
        if k in drop:
            continue
        char_spans = []
        for sp in rec["spans"]:
            try:
                a, b, typ = int(sp["start_position"]), int(sp["end_position"]), str(sp["entity_type"])
            except (KeyError, TypeError, ValueError):
                raise InputError(f"record {k} has a span without start_position, end_position and entity_type",
                                 path=p) from None
            lab = PRESIDIO_TO_LABEL.get(typ)
            if lab is not None:
                char_spans.append((a, b, lab))
        words, spans = tokenise_with_spans(rec["full_text"], char_spans)
        if words:
            out.append((words, spans))
    return out, note



def _seen(data: list[dict], seen_templates: tuple[Collection[int], Sequence[str]] | None) -> tuple[set[int], str]:
    """The records of templates a model has seen, and a note on what was left out (or why nothing was)."""
    from privasr.anon.ner_templates import template_key

    if seen_templates is None:
        return set(), ""
    ids, lines = set(seen_templates[0]), seen_templates[1]
    tid = [r.get("template_id") if type(r.get("template_id")) is int else None for r in data]
    with_id = [(k, t) for k, t in enumerate(tid) if t is not None and 0 <= t < len(lines)]
    agree = sum(template_key(str(data[k].get("masked", ""))) == template_key(lines[t]) for k, t in with_id)
    if not with_id or agree < 0.5 * len(data):
        return set(), (f"not known to be held out: {agree} of {len(data)} records match the template of their "
                       "template_id, so their templates cannot be told apart from the training templates")
    drop = {k for k, t in with_id if t in ids}
    return drop, (f"{len(drop)} of {len(data)} records left out: their templates ({len(ids)} of {len(lines)}) "
                  "are among the fine-tuned NER's training and dev templates")


def _is_presidio(p: Path) -> bool:
    """Whether a file starts as presidio-evaluator's synthetic data does (a JSON list of ``full_text`` records)."""
    try:
        with p.open(encoding="utf-8") as f:
            head = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return False
    return head.lstrip().startswith("[") and '"full_text"' in head and '"spans"' in head


def file_ner_data(path: str | Path, fmt: str | None = None, *,
                  seen_templates: tuple[Collection[int], Sequence[str]] | None = None) -> NerData:
    """Any annotated file privasr reads (CoNLL in IOB1 or IOB2, Earnings-21 ``.nlp`` references, canonical
    transcript JSON Lines with ``entities``, presidio-evaluator's synthetic JSON: :func:`presidio_docs`) as one
    held-out ``test`` part named after the file, each document
    (a CoNLL ``-DOCSTART-`` section, a call, a ``client``) one client (``seen_templates``: see
    :func:`presidio_docs`; its note is ``left_out``). Labels are mapped to paper 003's
    categories (CoNLL's PER/ORG/LOC/MISC kept, OntoNotes' PERSON, GPE, ... mapped by
    :func:`~privasr.anon.transform.map_label`; numeric types dropped).

    Raises:
        InputError: the file cannot be read, holds no transcripts, or no sentence has an entity label this
            mapping knows (naming the labels it found).
    """
    from privasr.corpus.load import load_path

    p = Path(path)
    docs: list[Doc] = []
    clients: list[str] = []
    seen: set[str] = set()
    note = ""
    if p.is_file() and _is_presidio(p):
        docs, note = presidio_docs(p, seen_templates)
        clients = [f"s{k:05d}" for k in range(len(docs))]  # unrelated synthetic sentences: each its own document
        recs = []
    else:
        sets = load_path(p, fmt)
        recs = [r for d in sets if d.kind == "transcript" for r in d.records]
        if not recs:
            raise InputError("it holds no transcripts", path=p, expected="an annotated file: CoNLL, .nlp, "
                                                                          "transcript JSON Lines with entities, or "
                                                                          "presidio-evaluator's synthetic JSON")
    for r in recs:
        spans = []
        for e in r.entities or ():
            seen.add(e.label)
            lab = map_label(e.label)
            if lab is not None:
                spans.append(EntitySpan(e.start, e.end, lab))
        docs.append((tuple(r.words), spans))
        clients.append(r.client or r.utt_id)
    if not any(spans for _, spans in docs):
        raise InputError(f"no entity with a known label (labels found: {sorted(seen) or 'none'})", path=p,
                         expected="PER/ORG/LOC/MISC or OntoNotes labels (PERSON, ORG, GPE, ...)")
    name = p.name
    return NerData({name: {"test": docs}}, {name: {"test": clients}}, {name: {"test": sorted(set(clients))}},
                   {name: p}, left_out=note)


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
