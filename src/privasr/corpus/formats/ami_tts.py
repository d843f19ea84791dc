"""Reader for the AMI TTS N-best JSON Lines (``ami-tts-nbest``, ``ami-tts-nbest-indomain``).

One utterance per line::

    {"utt_id": "IS1005c_A_0", "meeting": "IS1005c", "speaker": "A", "role": "PM", "position": 0,
     "ref": "hello this meeting ...",
     "hyps": [{"words": "...", "score": -3104.3, "lm_score": -105.05, "am_score": -2083.5, "n_words": 16,
               "score_src": "hyp", "nbest_score": -3093.45}, ...],
     "tts": {...}, "audio_sec": 5.925, "onebest_in_nbest": true, "n_nbest_paths": 300,
     "n_nbest_unique": 164, "timing_sec": {...}}

Mapping onto :class:`~privasr.corpus.records.NBest`: ``client`` = meeting; ``speaker`` =
``f"{meeting}_{speaker}"`` (the letters are meeting-local); ``order`` = position; ``ref`` = ``ref.split()``;
hypothesis scores ``total`` = score, ``lm`` = lm_score, ``am`` = am_score and ``nbest`` = nbest_score (each
omitted when null; all natural log), hypothesis ``meta["score_src"]``; ``n_words`` is checked against the
words. Everything else (role, tts, audio_sec, onebest_in_nbest, n_nbest_paths, n_nbest_unique, timing_sec,
any other key) goes into ``NBest.meta``, with the meeting-local letter as ``meta["speaker_letter"]``, so the
canonical N-best format holds everything the source has.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "dev.jsonl"
>>> _ = p.write_text('{"utt_id": "M_A_3", "meeting": "M", "speaker": "A", "position": 3, "ref": "a b", '
...                  '"hyps": [{"words": "a c", "score": -9.5, "lm_score": -3.0, "am_score": null, '
...                  '"n_words": 2, "score_src": "hyp", "nbest_score": null}], "role": "PM"}\\n')
>>> nb = read_ami_tts(p)[0]
>>> nb.client, nb.speaker, nb.order, nb.ref, dict(nb.best.scores), nb.meta["role"]
('M', 'M_A', 3, ('a', 'b'), {'total': -9.5, 'lm': -3.0}, 'PM')
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from privasr.corpus.formats._common import (
    check_finite,
    iter_json_records,
    to_float,
)
from privasr.corpus.records import Hypothesis, NBest
from privasr.corpus.textio import PathLike, split_words
from privasr.errors import InputError

__all__ = ["read_ami_tts", "iter_ami_tts", "looks_like_ami_tts", "REQUIRED_KEYS", "HYP_KEYS"]

REQUIRED_KEYS = ("utt_id", "meeting", "speaker", "position", "ref", "hyps")
HYP_KEYS = ("words", "score", "lm_score", "am_score", "n_words", "score_src", "nbest_score")
_SCORE_NAMES = (("score", "total"), ("lm_score", "lm"), ("am_score", "am"), ("nbest_score", "nbest"))


def _str(obj: dict[str, Any], key: str, what: str) -> str:
    v = obj[key]
    if not isinstance(v, str) or not v.strip():
        raise InputError(f"{what} {key!r} is {v!r}"[:120], expected="a non-empty string")
    return v


def _hyp(h: Any, k: int) -> Hypothesis:
    what = f"hypothesis {k}"
    if not isinstance(h, dict):
        raise InputError(f"{what} is {type(h).__name__}", expected="a JSON object")
    for key in ("words", "score", "lm_score", "n_words"):
        if key not in h:
            raise InputError(f"{what} has no {key!r}", expected=f"keys {', '.join(HYP_KEYS)}")
    words = h["words"]
    if not isinstance(words, str):
        raise InputError(f"{what} words is {type(words).__name__}", expected="a string of words")
    toks = tuple(split_words(words))
    nw = h["n_words"]
    if isinstance(nw, bool) or not isinstance(nw, int) or nw != len(toks):
        raise InputError(f"{what} has n_words {nw!r} but {len(toks)} words", expected="n_words == len(words)")
    scores = {}
    for src, name in _SCORE_NAMES:
        v = h.get(src)
        if v is not None:
            scores[name] = to_float(v, f"{what} {src}", allow_neg_inf=True)
    meta = {k2: v for k2, v in h.items() if k2 not in ("words", "n_words", "score", "lm_score", "am_score",
                                                       "nbest_score")}
    check_finite(meta, f"{what} meta")
    return Hypothesis(toks, scores=scores, meta=meta)


def _record(obj: Any) -> NBest:
    if not isinstance(obj, dict):
        raise InputError(f"the line is a JSON {type(obj).__name__}", expected="one JSON object per line")
    for key in REQUIRED_KEYS:
        if key not in obj:
            raise InputError(f"utterance has no {key!r}", expected=f"keys {', '.join(REQUIRED_KEYS)}")
    meeting = _str(obj, "meeting", "utterance")
    letter = _str(obj, "speaker", "utterance")
    pos = obj["position"]
    if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
        raise InputError(f"position is {pos!r}"[:80], expected="a non-negative integer")
    ref = obj["ref"]
    if not isinstance(ref, str):
        raise InputError(f"ref is {type(ref).__name__}", expected="a string of words")
    hyps = obj["hyps"]
    if not isinstance(hyps, list):
        raise InputError(f"hyps is {type(hyps).__name__}", expected="a list of hypothesis objects")
    meta = {"speaker_letter": letter}
    meta.update((k, v) for k, v in obj.items() if k not in REQUIRED_KEYS)
    check_finite(meta, "utterance meta")
    return NBest(
        obj["utt_id"],
        tuple(_hyp(h, k) for k, h in enumerate(hyps)),
        client=meeting,
        speaker=f"{meeting}_{letter}",
        order=pos,
        ref=tuple(split_words(ref)),
        meta=meta,
    )


def iter_ami_tts(path: PathLike) -> Iterator[NBest]:
    """Yield the utterances of an AMI TTS N-best JSON Lines file (``.xz``/``.gz`` allowed), in file order.

    Blank lines are skipped; duplicate utterance ids and malformed lines raise
    :class:`~privasr.errors.InputError` with the line number.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "bad.jsonl"
    >>> _ = p.write_text('{"utt_id": "u", "meeting": "M", "speaker": "A", "position": 0, "ref": "",'
    ...                  ' "hyps": [{"words": "a b", "score": 0, "lm_score": 0, "n_words": 3}]}\\n')
    >>> next(iter_ami_tts(p))
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: ...bad.jsonl:1: hypothesis 0 has n_words 3 but 2 words (expected n_words == len(words))
    """
    yield from iter_json_records(path, _record)


def read_ami_tts(path: PathLike) -> list[NBest]:
    """Read an AMI TTS N-best JSON Lines file into a list of :class:`NBest` (see :func:`iter_ami_tts`).

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "e.jsonl"
    >>> _ = p.write_text("")
    >>> read_ami_tts(p)
    []
    """
    return list(iter_ami_tts(path))


def looks_like_ami_tts(obj: Any) -> bool:
    """Whether a decoded JSON object has the AMI TTS N-best keys (used for format detection).

    >>> looks_like_ami_tts({"utt_id": "u", "meeting": "m", "speaker": "A", "position": 0, "ref": "", "hyps": []})
    True
    """
    return isinstance(obj, dict) and all(k in obj for k in REQUIRED_KEYS)
