"""Anonymise whole corpora: transcripts and N-best lists, with detected or gold entity spans.

:func:`anonymize_records` rewrites a sequence of :class:`~privasr.corpus.records.Transcript` or
:class:`~privasr.corpus.records.NBest` records with an :class:`~privasr.anon.transform.Anonymizer`. The spans
come from an entity detector (anything with ``detect(sentences) -> list[list[EntitySpan]]``, e.g.
:func:`privasr.anon.ner_model.load_detector`) or, with ``entities="gold"``, from the records' own annotations
(``Transcript.entities``, as read from CoNLL or Earnings-21 files; labels mapped with
:func:`~privasr.anon.transform.map_label`, numeric types such as CARDINAL are left alone).

What changes besides the words:

* **Per-word confidences and times** follow the words: surrogates keep them; a class tag takes the span's
  first start and last end time and its lowest confidence; redacted words lose theirs.
* **Entity spans** of a transcript become those of the output (the tag's single word; none after redaction).
* **N-best lists**: every hypothesis and the reference are anonymised with the same client's table, so the
  same name gets the same surrogate in every hypothesis; scores are kept.
* **meta is dropped**: the formats' extra fields (per-token case and punctuation, raw tag columns, prompts)
  can hold the original text, so nothing of it is copied; ``meta["anon"]`` records the mode.
* The client key is ``record.client`` (empty when unknown): surrogates are consistent within it, and it is
  the document id passed to the detector (``detect(sentences, groups=...)``, when its ``detect`` takes
  ``groups``): a detector with document-level propagation (:func:`privasr.anon.ner.propagate`) spreads a
  name found in one of a client's records to that client's other records.

Nothing given is modified: new records are returned.

>>> from privasr.anon.transform import Anonymizer
>>> from privasr.corpus.records import Span, Transcript
>>> t = Transcript("u1", ("call", "john", "smith", "now"), confidences=(0.9, 0.8, 0.7, 0.6),
...                client="c", entities=(Span(1, 3, "PERSON"),))
>>> out, stats = anonymize_records([t], Anonymizer("tag"), entities="gold")
>>> out[0].words, out[0].confidences, out[0].entities
(('call', '<PER>', 'now'), (0.9, 0.7, 0.6), (Span(start=1, end=2, label='PER'),))
>>> stats.mentions, stats.words_changed
({'PER': 1}, 2)
>>> t.words
('call', 'john', 'smith', 'now')
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from privasr.anon.ner import EntityDetector, detect_grouped
from privasr.anon.transform import Anonymizer, EntitySpan, check_spans, map_label
from privasr.corpus.records import Hypothesis, NBest, Span, Transcript
from privasr.errors import ConfigError, InputError

__all__ = ["AnonStats", "anonymize_records", "gold_spans", "realign"]

ENTITY_SOURCES = ("detect", "gold")


@dataclass
class AnonStats:
    """What an anonymisation pass did (counts only: no word of the input is kept here).

    Attributes:
        records: records processed.
        word_sequences: transcripts, hypotheses and references rewritten.
        mentions: entity mentions rewritten, per category.
        words_changed: input words replaced, tagged or removed.
        words_in: input words in total.
    """

    records: int = 0
    word_sequences: int = 0
    mentions: dict[str, int] = field(default_factory=dict)
    words_changed: int = 0
    words_in: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary.

        >>> AnonStats(records=1, words_in=4, words_changed=1).to_dict()["fraction_changed"]
        0.25
        """
        return {"records": self.records, "word_sequences": self.word_sequences, "mentions": dict(self.mentions),
                "words_in": self.words_in, "words_changed": self.words_changed,
                "fraction_changed": self.words_changed / self.words_in if self.words_in else 0.0}


def gold_spans(entities: Sequence[Span], n_words: int, where: str = "") -> list[EntitySpan]:
    """A record's annotated spans as anonymisable :class:`EntitySpan` (labels through ``map_label``).

    Spans whose label maps to no category (CARDINAL, MONEY, ...) are skipped; of overlapping spans the first
    (by start, then the longer) is kept.

    >>> gold_spans([Span(0, 1, "CARDINAL"), Span(1, 3, "GPE"), Span(2, 3, "ORG")], 3)
    [EntitySpan(start=1, end=3, label='LOC')]
    """
    out: list[EntitySpan] = []
    end = 0
    for s in sorted(entities, key=lambda s: (s.start, -s.end)):
        label = map_label(s.label)
        if label is None or s.start < end:
            continue
        if s.end > n_words:
            raise InputError(f"{where}entity span [{s.start}, {s.end}) goes past the {n_words} words",
                             expected="spans within the words")
        out.append(EntitySpan(s.start, s.end, label))
        end = s.end
    return out


def realign(values: Sequence[Any] | None, spans: Sequence[EntitySpan], mode: str, merge: Any) -> tuple[Any, ...] | None:
    """Per-word ``values`` (confidences, times) of the rewritten words: kept (surrogate), merged by ``merge``
    over each span (tag) or dropped with the words (redact). ``spans`` must be sorted and disjoint.

    >>> realign((1, 2, 3, 4), [EntitySpan(1, 3, "PER")], "tag", min)
    (1, 2, 4)
    >>> realign((1, 2, 3, 4), [EntitySpan(1, 3, "PER")], "redact", min)
    (1, 4)
    """
    if values is None or mode == "surrogate":
        return None if values is None else tuple(values)
    out: list[Any] = []
    pos = 0
    for s in spans:
        out.extend(values[pos:s.start])
        if mode == "tag":
            out.append(merge(values[s.start:s.end]))
        pos = s.end
    out.extend(values[pos:])
    return tuple(out)


def _merge_times(ts: Sequence[tuple[float, float]]) -> tuple[float, float]:
    return (ts[0][0], ts[-1][1])


def _out_spans(spans: Sequence[EntitySpan], mode: str) -> tuple[Span, ...]:
    if mode == "surrogate":
        return tuple(Span(s.start, s.end, s.label) for s in spans)
    if mode == "redact":
        return ()
    out, shift = [], 0
    for s in spans:
        out.append(Span(s.start - shift, s.start - shift + 1, s.label))
        shift += s.end - s.start - 1
    return tuple(out)


class _Rewriter:
    def __init__(self, anonymizer: Anonymizer, stats: AnonStats) -> None:
        self.anon = anonymizer
        self.stats = stats

    def words(self, words: Sequence[str], spans: Sequence[EntitySpan], client: str
              ) -> tuple[tuple[str, ...], list[EntitySpan]]:
        ordered = check_spans(words, spans)
        out = self.anon.transform(words, ordered, client)
        self.stats.word_sequences += 1
        self.stats.words_in += len(words)
        for s in ordered:
            self.stats.mentions[s.label] = self.stats.mentions.get(s.label, 0) + 1
            if self.anon.mode == "surrogate":
                self.stats.words_changed += sum(a != b for a, b in zip(words[s.start:s.end], out[s.start:s.end],
                                                                       strict=True))
            else:
                self.stats.words_changed += s.end - s.start
        return out, ordered

    def transcript(self, t: Transcript, spans: Sequence[EntitySpan]) -> Transcript:
        client = t.client or ""
        words, ordered = self.words(t.words, spans, client)
        mode = self.anon.mode
        return replace(t, words=words, confidences=realign(t.confidences, ordered, mode, min),
                       times=realign(t.times, ordered, mode, _merge_times), entities=_out_spans(ordered, mode),
                       meta={"anon": mode})

    def hypothesis(self, h: Hypothesis, spans: Sequence[EntitySpan], client: str) -> Hypothesis:
        words, ordered = self.words(h.words, spans, client)
        mode = self.anon.mode
        return replace(h, words=words, confidences=realign(h.confidences, ordered, mode, min),
                       times=realign(h.times, ordered, mode, _merge_times), meta={"anon": mode})


def _sequences(records: Sequence[Transcript | NBest]) -> tuple[list[tuple[str, ...]], list[str]]:
    seqs: list[tuple[str, ...]] = []
    groups: list[str] = []
    for r in records:
        if isinstance(r, Transcript):
            seqs.append(r.words)
        else:
            seqs.extend(h.words for h in r.hyps)
            if r.ref is not None:
                seqs.append(r.ref)
        groups.extend([r.client or ""] * (len(seqs) - len(groups)))
    return seqs, groups


def anonymize_records(records: Sequence[Transcript | NBest], anonymizer: Anonymizer,
                      detector: EntityDetector | None = None, *, entities: str = "detect",
                      ) -> tuple[list[Transcript | NBest], AnonStats]:
    """Anonymise transcripts or N-best lists (see the module docstring); returns new records and counts.

    Args:
        records: transcripts or N-best lists (one kind or both).
        anonymizer: the transformation (its per-client surrogate tables persist across calls).
        detector: finds the spans when ``entities="detect"``.
        entities: ``"detect"`` (run ``detector`` on every word sequence) or ``"gold"`` (the transcripts'
            own annotations; N-best lists have none, so they need ``"detect"``).

    Raises:
        ConfigError: an unknown ``entities`` source, or ``"detect"`` without a detector.
        InputError: a record of another type, gold spans requested for an N-best list, or spans from the
            detector that do not fit its words.
    """
    if entities not in ENTITY_SOURCES:
        raise ConfigError(f"entities={entities!r}", expected=f"one of {list(ENTITY_SOURCES)}")
    if entities == "detect" and detector is None:
        raise ConfigError("entities='detect' needs a detector", expected="a detector, or entities='gold'")
    for r in records:
        if not isinstance(r, Transcript | NBest):
            raise InputError(f"a record is a {type(r).__name__}", expected="Transcript or NBest records")
        if entities == "gold" and isinstance(r, NBest):
            raise InputError(f"utterance {r.utt_id}: N-best lists carry no entity annotations",
                             expected="entities='detect' for N-best lists")
    stats = AnonStats(records=len(records))
    rw = _Rewriter(anonymizer, stats)
    if entities == "gold":
        out: list[Transcript | NBest] = []
        for r in records:
            assert isinstance(r, Transcript)
            out.append(rw.transcript(r, gold_spans(r.entities, len(r.words), f"utterance {r.utt_id}: ")))
        return out, stats
    assert detector is not None
    seqs, groups = _sequences(records)
    found = detect_grouped(detector, seqs, groups)
    if len(found) != len(seqs):
        raise InputError(f"the detector returned spans for {len(found)} of {len(seqs)} word sequences",
                         expected="one list of spans per word sequence")
    it = iter(found)
    out = []
    for r in records:
        if isinstance(r, Transcript):
            out.append(rw.transcript(r, next(it)))
            continue
        client = r.client or ""
        hyps = tuple(rw.hypothesis(h, next(it), client) for h in r.hyps)
        ref = None
        if r.ref is not None:
            ref, _ = rw.words(r.ref, next(it), client)
        out.append(replace(r, hyps=hyps, ref=ref, meta={"anon": anonymizer.mode}))
    return out, stats
