"""Spoken-digit recordings named ``{digit}_{speaker}_{index}.wav`` (the Free Spoken Digit Dataset layout).

The transcript of each recording is the digit in its file name, spelled out (``0`` -> ``zero``). Each
recording becomes a :class:`~privasr.corpus.records.Transcript`: ``utt_id`` = the file stem, ``speaker``
and ``client`` = the speaker name, ``order`` = the index, ``meta`` = ``{"audio": file name, "digit": d}``.
The audio itself is not read here (``privasr decode`` does that).

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> for n in ("3_jackson_0.wav", "7_jackson_1.wav"):
...     _ = (d / n).write_bytes(b"RIFF")
>>> [(t.utt_id, t.words, t.speaker, t.order) for t in read_fsdd(d)]
[('3_jackson_0', ('three',), 'jackson', 0), ('7_jackson_1', ('seven',), 'jackson', 1)]
"""

from __future__ import annotations

import re
from pathlib import Path

from privasr.corpus.formats._common import natural_key
from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike
from privasr.errors import InputError

__all__ = ["read_fsdd", "looks_like_fsdd", "DIGITS", "FSDD_NAME"]

DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
FSDD_NAME = re.compile(r"^(\d)_([A-Za-z][\w-]*)_(\d+)\.wav$")
"""File names of the layout: digit, speaker, index."""


def looks_like_fsdd(folder: PathLike) -> bool:
    """Whether ``folder`` holds WAV files, all named ``{digit}_{speaker}_{index}.wav``."""
    p = Path(folder)
    if not p.is_dir():
        return False
    wavs = [q.name for q in p.iterdir() if q.suffix.lower() == ".wav"]
    return bool(wavs) and all(FSDD_NAME.match(n) for n in wavs)


def read_fsdd(folder: PathLike) -> list[Transcript]:
    """Transcripts of the recordings in ``folder`` (sorted by speaker, then digit, then index)."""
    p = Path(folder)
    if not p.is_dir():
        raise InputError("not a folder", path=p, expected="a folder of {digit}_{speaker}_{index}.wav files")
    out = []
    for q in sorted((q for q in p.iterdir() if q.suffix.lower() == ".wav"), key=lambda q: natural_key(q.name)):
        m = FSDD_NAME.match(q.name)
        if m is None:
            raise InputError("file name does not follow the digit layout", path=q,
                             expected="{digit}_{speaker}_{index}.wav")
        digit, speaker, index = m.group(1), m.group(2), int(m.group(3))
        out.append(Transcript(q.stem, (DIGITS[int(digit)],), client=speaker, speaker=speaker, order=index,
                              meta={"audio": q.name, "digit": int(digit)}))
    if not out:
        raise InputError("no .wav files", path=p, expected="a folder of {digit}_{speaker}_{index}.wav files")
    out.sort(key=lambda t: (t.speaker, t.meta["digit"], t.order))
    return out
