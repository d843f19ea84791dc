"""Summary statistics of a data set: counts, and 1-best/oracle WER where references exist.

This is what ``privasr data inspect`` prints. Error rates are fractions; substitutions, deletions and insertions
come from sclite's alignment (:mod:`privasr.metrics.align`), as in ``privasr score`` and every runner's table.

>>> from privasr.corpus.records import Hypothesis, NBest
>>> nbs = [NBest("u1", (Hypothesis(("a", "x")), Hypothesis(("a", "b"))), client="c1", ref=("a", "b")),
...        NBest("u2", (Hypothesis(("c",)),), client="c2", ref=("c",))]
>>> s = nbest_stats(nbs)
>>> s["utterances"], s["clients"], s["words"], s["hyps_per_utt"], round(s["wer_1best"], 3), s["wer_oracle"]
(2, 2, 3, 1.5, 0.333, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from privasr.corpus.markup import map_words, markup_counts
from privasr.corpus.records import Hypothesis, NBest, Transcript
from privasr.metrics.oracle import oracle_wer, ref_in_list
from privasr.metrics.sclite import Conventions
from privasr.metrics.wer import wer
from privasr.text.normalize import Normalizer

__all__ = ["nbest_stats", "transcript_stats", "dataset_stats", "combine_stats"]


def _ids(values: Sequence[str | None]) -> int:
    return len({v for v in values if v is not None})


def nbest_stats(nbests: Sequence[NBest], normalizer: Normalizer | None = None) -> dict[str, Any]:
    """Counts of an N-best set; ``wer_1best``/``wer_oracle`` and ``ref_in_list`` (the share of utterances whose
    non-empty reference is one of the hypotheses) when every utterance has a reference.

    ``words`` counts reference words when all references are known, else 1-best words. A
    ``normalizer`` is applied to references and hypotheses before scoring (not to the counts of
    utterances or clients).
    """
    norm = normalizer or Normalizer.preset("none")
    n = len(nbests)
    have_refs = n > 0 and all(nb.ref is not None for nb in nbests)
    out: dict[str, Any] = {
        "kind": "nbest",
        "utterances": n,
        "clients": _ids([nb.client for nb in nbests]),
        "speakers": _ids([nb.speaker for nb in nbests]),
        "hyps": sum(len(nb) for nb in nbests),
        "hyps_per_utt": (sum(len(nb) for nb in nbests) / n) if n else 0.0,
        "empty_lists": sum(1 for nb in nbests if len(nb) == 0),
        "score_names": sorted({k for nb in nbests for h in nb for k in h.scores}),
        "has_confidences": any(h.confidences is not None for nb in nbests for h in nb),
        "references": have_refs,
    }
    if have_refs:
        normed = [NBest(nb.utt_id, tuple(Hypothesis(norm(h.words)) for h in nb), ref=norm(nb.ref or ()))
                  for nb in nbests]
        out["words"] = sum(len(nb.ref or ()) for nb in normed)
        one = wer([nb.ref or () for nb in normed], [nb.best.words for nb in normed], aligner="sclite")
        orc = oracle_wer(normed)
        out["wer_1best"] = one.wer
        out["wer_oracle"] = orc.wer
        out["errors_1best"] = {"sub": one.substitutions, "del": one.deletions, "ins": one.insertions}
        # how often the reference itself is in the list (what a perfect LM could pick; non-empty references)
        out["ref_in_list"] = ref_in_list(normed)
    else:
        out["words"] = sum(len(nb.best) for nb in nbests)
    return out


def transcript_stats(
    transcripts: Sequence[Transcript],
    references: Mapping[str, Sequence[str]] | None = None,
    normalizer: Normalizer | None = None,
    *,
    sclite_markup: bool = False,
) -> dict[str, Any]:
    """Counts of a transcript set; ``wer_1best`` when ``references`` (utt_id -> words) are given.

    With references, the transcripts that have one are scored as 1-best output and ``words`` counts their
    reference words; transcripts without a reference are left out of the WER and counted in
    ``unmatched_references`` (scoring them against nothing would count every word as an insertion).

    With ``sclite_markup`` (a trn file, sclite's format), transcripts written with sclite's markup count their plain
    words in ``words`` and their alternations and optionally deletable words apart (``sclite_alternations``,
    ``sclite_optional_words``); with markup, WER is scored under sclite's conventions, case kept.

    >>> s = transcript_stats([Transcript("u", ("a", "{", "b", "/", "@", "}", "(c)"))], sclite_markup=True)
    >>> s["words"], s["sclite_alternations"], s["sclite_optional_words"]
    (1, 1, 1)
    """
    norm = normalizer or Normalizer.preset("none")
    # a trn file's markup was checked when it was read (privasr.corpus.formats.trn.reading_markup)
    counts = [markup_counts(t.words) if sclite_markup else (len(t), 0, 0) for t in transcripts]
    out: dict[str, Any] = {
        "kind": "transcript",
        "utterances": len(transcripts),
        "clients": _ids([t.client for t in transcripts]),
        "speakers": _ids([t.speaker for t in transcripts]),
        "words": sum(c[0] for c in counts),
        "has_confidences": any(t.confidences is not None for t in transcripts),
        "entities": sum(len(t.entities) for t in transcripts),
        "references": references is not None,
    }
    if any(c[1] or c[2] for c in counts):
        out["sclite_alternations"] = sum(c[1] for c in counts)
        out["sclite_optional_words"] = sum(c[2] for c in counts)
    if references is not None:
        scored = [t for t in transcripts if t.utt_id in references]
        R = [references[t.utt_id] for t in scored]
        markup = sclite_markup and "sclite_alternations" in out
        res = (wer([map_words(r, norm) for r in R], [map_words(t.words, norm) for t in scored], aligner="sclite",
                   conventions=Conventions(case_sensitive=True)) if markup
               else wer([norm(r) for r in R], [norm(t.words) for t in scored], aligner="sclite"))
        out["hyp_words"] = out["words"]
        out["words"] = res.ref_words
        out["wer_1best"] = res.wer
        out["errors_1best"] = {"sub": res.substitutions, "del": res.deletions, "ins": res.insertions}
        out["unmatched_references"] = len(transcripts) - len(scored)
    return out


def dataset_stats(dataset: Any, normalizer: Normalizer | str | None = "auto") -> dict[str, Any]:
    """Statistics of a :class:`privasr.corpus.load.Dataset` (N-best or transcript kind).

    ``normalizer="auto"`` scores N-best sets (whose references come with them, already normalised the
    same way) as they are, and hypotheses scored against references from another source (Earnings-21
    CTMs against the cased, punctuated references) with the ``wer`` preset; the choice is returned as
    ``normalizer``.
    """
    if normalizer == "auto":
        normalizer = "wer" if dataset.references is not None else "none"
    if isinstance(normalizer, str):
        spec = normalizer
        normalizer = Normalizer.from_spec(normalizer)
    else:
        spec = "custom" if normalizer is not None else "none"
    if dataset.kind == "nbest":
        s = nbest_stats(list(dataset.records), normalizer)
    else:
        s = transcript_stats(list(dataset.records), dataset.references, normalizer, sclite_markup=dataset.fmt == "trn")
    return {"name": dataset.name, "format": dataset.fmt, "normalizer": spec, **s}


def combine_stats(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over several disjoint datasets (e.g. dev and test): counts add up; WERs are pooled by words.

    A WER appears in the totals only when every part has it.

    >>> combine_stats([{"utterances": 2, "clients": 1, "words": 10, "wer_1best": 0.1},
    ...                {"utterances": 3, "clients": 2, "words": 30, "wer_1best": 0.3}])["wer_1best"]
    0.25
    """
    total: dict[str, Any] = {k: sum(p.get(k, 0) for p in parts) for k in ("utterances", "clients", "speakers", "words")}
    for key in ("wer_1best", "wer_oracle"):
        scored = [p for p in parts if key in p]
        if scored and len(scored) == len(parts):
            w = sum(p["words"] for p in scored)
            total[key] = sum(p[key] * p["words"] for p in scored) / w if w else 0.0
    return total
