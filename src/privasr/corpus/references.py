"""References for reference-less N-best lists, and the 1-best of N-best lists as transcripts.

Many N-best sources carry no reference (SRILM lists, HTK lattices, a decoder's own output); the reference
transcripts usually sit in a separate file keyed by utterance id: a Kaldi ``text`` file, a trn file or
transcript JSON Lines. :func:`read_references` reads such a file with the corpus readers and
:func:`attach_references` puts each reference on its N-best list, checking that both sides hold the same
utterances. :func:`one_best` goes the other way: the first-pass 1-best of each list as a
:class:`~privasr.corpus.records.Transcript` (what ``privasr data convert --to kaldi-text`` writes).

>>> from privasr.corpus.records import Hypothesis, NBest, Transcript
>>> nbs = [NBest("u1", (Hypothesis(("hi", "there")),)), NBest("u2", (Hypothesis(("yo",)),))]
>>> refs = [Transcript("u2", ("yo",)), Transcript("u1", ("hi", "their"))]
>>> [nb.ref for nb in attach_references(nbs, refs, path="text")]
[('hi', 'their'), ('yo',)]
>>> [(t.utt_id, t.text) for t in one_best(nbs)]
[('u1', 'hi there'), ('u2', 'yo')]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from privasr.corpus.records import NBest, Transcript
from privasr.corpus.textio import PathLike
from privasr.errors import InputError

__all__ = ["attach_references", "read_references", "one_best", "REFERENCE_FORMATS"]

REFERENCE_FORMATS = ("kaldi-text", "trn", "transcript-jsonl")
"""The formats a reference file may have (detected from its content)."""

_SHOW = 5


def _some(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOW])
    return shown + (f", ... ({len(ids) - _SHOW} more)" if len(ids) > _SHOW else "")


def attach_references(nbests: Iterable[NBest], transcripts: Iterable[Transcript], *,
                      path: PathLike | str | None = None) -> list[NBest]:
    """The N-best lists with ``ref`` set from the transcript of the same ``utt_id``.

    Every N-best list needs a transcript and every transcript an N-best list; a list that already has a
    reference keeps it if it is the same, and a different one is an error. A list without a ``client`` or
    ``speaker`` takes the transcript's (a Kaldi data folder's ``utt2spk`` gives speakers, transcript JSON
    Lines both). Utterance ids repeated in
    ``nbests`` (the same utterance in two sets) all get the same reference.

    Args:
        nbests: the N-best lists, in any order (the order is kept).
        transcripts: the references, one per utterance id.
        path: the reference file, for error messages.

    Raises:
        InputError: ids missing on either side (how many, and the first few), a repeated transcript id, or
            a reference that differs from the one a list already has.

    >>> from privasr.corpus.records import Hypothesis, NBest, Transcript
    >>> nbs = [NBest(f"u{i}", (Hypothesis(("a",)),)) for i in range(8)]
    >>> attach_references(nbs, [Transcript("u0", ("a",)), Transcript("x9", ())], path="ref.txt")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ref.txt: 7 of 8 N-best lists have no reference: u1, u2, u3, u4, u5, ... (2 more) (expected a reference for every utterance id)
    >>> attach_references(nbs[:1], [Transcript("u0", ("a",)), Transcript("x9", ())], path="ref.txt")
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ref.txt: 1 of 2 references match no N-best list: x9 (expected an N-best list for every reference)
    """
    nbs = list(nbests)
    refs: dict[str, Transcript] = {}
    for t in transcripts:
        if t.utt_id in refs:
            raise InputError(f"utterance id {t.utt_id!r} has two references", path=path, expected="unique ids")
        refs[t.utt_id] = t
    have = {nb.utt_id for nb in nbs}
    missing = list(dict.fromkeys(nb.utt_id for nb in nbs if nb.utt_id not in refs))
    if missing:
        raise InputError(f"{len(missing)} of {len(have)} N-best lists have no reference: {_some(missing)}",
                         path=path, expected="a reference for every utterance id")
    unused = [u for u in refs if u not in have]
    if unused:
        raise InputError(f"{len(unused)} of {len(refs)} references match no N-best list: {_some(unused)}",
                         path=path, expected="an N-best list for every reference")
    out = []
    for nb in nbs:
        t = refs[nb.utt_id]
        if nb.ref is not None and nb.ref != t.words:
            raise InputError(f"utterance {nb.utt_id} already has the reference {' '.join(nb.ref)[:60]!r}, the "
                             f"reference file says {t.text[:60]!r}", path=path,
                             expected="references that agree with those the N-best lists have")
        new = {"ref": t.words, "client": nb.client if nb.client is not None else t.client,
               "speaker": nb.speaker if nb.speaker is not None else t.speaker}
        out.append(nb if all(getattr(nb, k) == v for k, v in new.items()) else replace(nb, **new))
    return out


def read_references(path: PathLike, fmt: str | None = None) -> list[Transcript]:
    """The transcripts of a reference file: Kaldi ``text``, trn or transcript JSON Lines (detected unless ``fmt``).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "text"
    >>> _ = p.write_text("utt-1 hello world\\nutt-2\\n")
    >>> [(t.utt_id, t.words) for t in read_references(p)]
    [('utt-1', ('hello', 'world')), ('utt-2', ())]
    >>> _ = p.write_text('{"utt_id": "u1", "hyps": [{"words": "a"}]}\\n')
    >>> read_references(p)
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: .../text: holds N-best lists (nbest-jsonl), not references (expected a Kaldi text, trn or transcript JSON Lines file)
    """
    from privasr.corpus.load import load_path

    sets = load_path(path, fmt)
    expected = "a Kaldi text, trn or transcript JSON Lines file"
    if len(sets) != 1:
        raise InputError(f"holds {len(sets)} sets", path=path, expected=expected)
    d = sets[0]
    if d.kind != "transcript":
        raise InputError(f"holds N-best lists ({d.fmt}), not references", path=path, expected=expected)
    return list(d.records)  # type: ignore[arg-type]


def one_best(nbests: Iterable[NBest]) -> list[Transcript]:
    """The first-pass 1-best of each N-best list as a transcript (an empty list gives no words).

    The transcript keeps the list's ``utt_id``, ``client``, ``speaker`` and ``order``, and the 1-best's word
    confidences and times.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> t = one_best([NBest("u", (Hypothesis(("a",), confidences=(0.5,)),), client="c", order=3)])[0]
    >>> t.utt_id, t.words, t.confidences, t.client, t.order
    ('u', ('a',), (0.5,), 'c', 3)
    """
    return [Transcript(nb.utt_id, nb.best.words, confidences=nb.best.confidences, times=nb.best.times,
                       client=nb.client, speaker=nb.speaker, order=nb.order) for nb in nbests]
