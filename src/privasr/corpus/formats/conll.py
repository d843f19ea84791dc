"""CoNLL named-entity files: one ``token [columns...] TAG`` per line, blank line between sentences.

``-DOCSTART-`` lines separate documents (before each document as in CoNLL-2003, or after each as in
Wikigold: both work; empty documents are not counted). The tag is the last column; IOB1 (``I-`` everywhere,
``B-`` only between adjacent same-type entities) and IOB2 (``B-`` on every entity start) are both read.
Each sentence becomes a :class:`~privasr.corpus.records.Transcript` with ``entities`` = spans labelled
without the ``B-``/``I-`` prefix, ``client`` = ``f"doc{d:04d}"`` (*d* = 0-based document index),
``utt_id = f"{client}_s{k:04d}"`` (*k* = sentence index within the document), ``order`` = *k*. Middle
columns (e.g. POS and chunk tags in CoNLL-2003), if any, are kept per token in ``meta["columns"]``.
The writer writes IOB2 with a ``-DOCSTART- O`` line before each document (a change of ``client``).

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "a.conll"
>>> _ = p.write_text("The I-ORG\\nMad I-ORG\\nCapsule I-ORG\\nrocks O\\n\\n-DOCSTART- O\\n\\nBob I-PER\\n")
>>> [(t.utt_id, t.client, t.entities) for t in read_conll(p)]
[('doc0000_s0000', 'doc0000', (Span(start=0, end=3, label='ORG'),)), ('doc0001_s0000', 'doc0001', (Span(start=0, end=1, label='PER'),))]
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from privasr.corpus.records import Span, Transcript
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["read_conll", "write_conll", "iob_spans", "DOCSTART"]

DOCSTART = "-DOCSTART-"


def iob_spans(tags: list[str]) -> list[Span]:
    """Entity spans of a tag sequence in IOB1 or IOB2 (labels without prefix).

    >>> iob_spans(["I-PER", "I-PER", "B-PER", "O", "B-LOC", "I-ORG"])
    [Span(start=0, end=2, label='PER'), Span(start=2, end=3, label='PER'), Span(start=4, end=5, label='LOC'), Span(start=5, end=6, label='ORG')]
    """
    spans: list[Span] = []
    start, label = -1, ""
    for i, t in enumerate(tags):
        if t == "O":
            if start >= 0:
                spans.append(Span(start, i, label))
            start = -1
            continue
        prefix, sep, lab = t.partition("-")
        if not sep or prefix not in ("B", "I") or not lab:
            raise InputError(f"tag {t[:40]!r} is not IOB", expected="O, B-LABEL or I-LABEL")
        if prefix == "B" or start < 0 or lab != label:
            if start >= 0:
                spans.append(Span(start, i, label))
            start, label = i, lab
    if start >= 0:
        spans.append(Span(start, len(tags), label))
    return spans


def read_conll(path: PathLike) -> list[Transcript]:
    """Read a CoNLL NER file into one transcript per sentence (see the module documentation).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "b.conll"
    >>> _ = p.write_text("a O\\nb X-PER\\n")
    >>> read_conll(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...b.conll:2: tag 'X-PER' is not IOB (expected O, B-LABEL or I-LABEL)
    """
    out: list[Transcript] = []
    doc, sent = 0, 0
    toks: list[str] = []
    tags: list[str] = []
    cols: list[list[str]] = []
    first = 0

    def flush() -> None:
        nonlocal sent
        if not toks:
            return
        try:
            spans = iob_spans(tags)
        except InputError as e:  # pragma: no cover - tags are validated line by line below
            raise e.at(path, first) from None
        meta: dict[str, Any] = {"columns": [list(c) for c in cols]} if any(cols) else {}
        client = f"doc{doc:04d}"
        out.append(Transcript(f"{client}_s{sent:04d}", tuple(toks), client=client, order=sent,
                              entities=tuple(spans), meta=meta))
        sent += 1
        toks.clear()
        tags.clear()
        cols.clear()

    for n, line in iter_lines(path):
        f = split_words(line)
        if not f:
            flush()
            continue
        if f[0] == DOCSTART:
            flush()
            if sent:
                doc, sent = doc + 1, 0
            continue
        if len(f) < 2:
            raise InputError(f"line has {len(f)} field", path=path, line=n, expected="token [columns...] TAG")
        tag = f[-1]
        if tag != "O":
            prefix, sep, lab = tag.partition("-")
            if not sep or prefix not in ("B", "I") or not lab:
                raise InputError(f"tag {tag[:40]!r} is not IOB", path=path, line=n,
                                 expected="O, B-LABEL or I-LABEL")
        if not toks:
            first = n
        toks.append(f[0])
        tags.append(tag)
        cols.append(f[1:-1])
    flush()
    return out


def _iob2(t: Transcript) -> list[str]:
    tags = ["O"] * len(t.words)
    for s in sorted(t.entities, key=lambda s: (s.start, s.end)):
        if any(x != "O" for x in tags[s.start:s.end]):
            raise InputError(f"transcript {t.utt_id!r} has overlapping entities",
                             expected="non-overlapping spans for CoNLL output")
        if any(c.isspace() for c in s.label):
            raise InputError(f"transcript {t.utt_id!r}: entity label {s.label!r} has whitespace",
                             expected="labels without whitespace")
        tags[s.start] = f"B-{s.label}"
        for i in range(s.start + 1, s.end):
            tags[i] = f"I-{s.label}"
    return tags


def write_conll(path: PathLike, records: Iterable[Transcript]) -> int:
    """Write transcripts as CoNLL (IOB2, ``token [columns...] TAG``); returns the number of sentences.

    A ``-DOCSTART- O`` line opens each document (each change of ``client``); sentences are separated by
    blank lines. Entities must not overlap.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "o.conll"
    >>> recs = [Transcript("s", ("Bob", "Smith", "left"), entities=(Span(0, 2, "PER"),), client="doc0000")]
    >>> write_conll(p, recs)
    1
    >>> print(p.read_text(), end="")
    -DOCSTART- O
    <BLANKLINE>
    Bob B-PER
    Smith I-PER
    left O
    <BLANKLINE>
    >>> [t.entities for t in read_conll(p)] == [recs[0].entities]
    True
    """
    n = 0
    last: Any = object()
    with open_write_text(path) as f:
        for t in records:
            if not isinstance(t, Transcript):
                raise InputError(f"record is {type(t).__name__}", path=path, expected="Transcript")
            if not t.words:
                continue
            with_path = _iob2_located(t, path)
            if t.client != last:
                f.write(f"{DOCSTART} O\n\n")
                last = t.client
            cols = t.meta.get("columns")
            for i, w in enumerate(t.words):
                mid = ""
                if cols is not None and i < len(cols) and cols[i]:
                    mid = " " + " ".join(str(c) for c in cols[i])
                f.write(f"{w}{mid} {with_path[i]}\n")
            f.write("\n")
            n += 1
    return n


def _iob2_located(t: Transcript, path: PathLike) -> list[str]:
    try:
        return _iob2(t)
    except InputError as e:
        raise e.at(path) from None
