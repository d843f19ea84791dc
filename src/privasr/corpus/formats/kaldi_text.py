"""Kaldi ``text`` files: one utterance per line, ``utt_id w1 w2 ...``.

Fields are separated by whitespace; an utterance with no words (a line holding only the id) is allowed.
Blank lines are skipped. Each transcript's ``order`` is its line number. The speaker is not in the file:
Kaldi keeps it in the data folder's ``utt2spk`` (``utt_id speaker_id`` per line). A file named ``text``
with a ``utt2spk`` beside it (a Kaldi data folder) takes every utterance's speaker from there, and every
utterance must be listed; otherwise the speaker is left unset. Writing a file named ``text`` whose
transcripts all have speakers writes the ``utt2spk`` beside it too.

>>> import tempfile, pathlib
>>> p = pathlib.Path(tempfile.mkdtemp()) / "text"
>>> write_kaldi_text(p, [Transcript("u1", ("hello", "world")), Transcript("u2", ())])
>>> print(p.read_text(), end="")
u1 hello world
u2
>>> [(t.utt_id, t.words, t.order, t.speaker) for t in read_kaldi_text(p)]
[('u1', ('hello', 'world'), 1, None), ('u2', (), 2, None)]
>>> _ = (p.parent / "utt2spk").write_text("u1 alice\\nu2 bob\\n")
>>> [t.speaker for t in read_kaldi_text(p)]
['alice', 'bob']
"""

from __future__ import annotations

from collections.abc import Iterable

from privasr.corpus.records import Transcript
from privasr.corpus.textio import PathLike, iter_lines, open_write_text, split_words
from privasr.errors import InputError

__all__ = ["read_kaldi_text", "write_kaldi_text", "read_utt2spk", "UTT2SPK", "KALDI_DATA_FILES"]

UTT2SPK = "utt2spk"
"""The speaker map of a Kaldi data folder, read beside a file named ``text``."""

KALDI_DATA_FILES = frozenset({"utt2spk", "spk2utt", "wav.scp", "segments", "reco2file_and_channel",
                              "spk2gender", "feats.scp", "cmvn.scp", "utt2dur", "utt2num_frames", "frame_shift",
                              "reco2dur", "utt2lang", "spk2warp", "utt2warp", "vad.scp"})
"""The other files of a Kaldi data folder: not transcripts (folder scans skip them)."""


def read_utt2spk(path: PathLike) -> dict[str, str]:
    """A Kaldi ``utt2spk`` file: utterance id -> speaker id.

    Raises :class:`InputError` naming the file and line for a line without exactly two fields or a
    repeated utterance id.
    """
    out: dict[str, str] = {}
    for n, line in iter_lines(path):
        fields = split_words(line)
        if not fields:
            continue
        if len(fields) != 2:
            raise InputError(f"line has {len(fields)} fields", path=path, line=n,
                             expected="'utterance-id speaker-id'")
        if fields[0] in out:
            raise InputError(f"duplicate utterance id {fields[0]!r}", path=path, line=n, expected="unique ids")
        out[fields[0]] = fields[1]
    return out


def read_kaldi_text(path: PathLike) -> list[Transcript]:
    """Read a Kaldi ``text`` file into :class:`Transcript` records.

    Raises :class:`InputError` naming the file and line for a duplicate id or an unreadable line, and
    naming ``utt2spk`` for an utterance it does not list (see the module docstring).
    """
    from pathlib import Path

    spk_path = Path(path).parent / UTT2SPK
    speakers = read_utt2spk(spk_path) if Path(path).name == "text" and spk_path.is_file() else None
    out: list[Transcript] = []
    seen: dict[str, int] = {}
    for n, line in iter_lines(path):
        fields = split_words(line)
        if not fields:
            continue
        utt_id, words = fields[0], tuple(fields[1:])
        try:
            if utt_id in seen:
                raise InputError(f"duplicate utterance id {utt_id!r} (first on line {seen[utt_id]})",
                                 expected="unique ids")
            seen[utt_id] = n
            speaker = None
            if speakers is not None:
                speaker = speakers.get(utt_id)
                if speaker is None:
                    raise InputError(f"utterance {utt_id!r} (line {n} of {path}) has no speaker", path=spk_path,
                                     expected="every utterance of the text file listed in utt2spk")
            out.append(Transcript(utt_id, words, speaker=speaker, order=n))
        except InputError as e:
            raise (e if e.path is not None else e.at(path, n)) from None
    return out


def write_kaldi_text(path: PathLike, transcripts: Iterable[Transcript]) -> None:
    """Write transcripts as ``utt_id w1 w2 ...`` lines (compressing by suffix).

    Raises :class:`InputError` for an id containing whitespace or a duplicate id.
    """
    from pathlib import Path

    lines = []
    spk_lines: list[str] | None = [] if Path(path).name == "text" else None
    seen: set[str] = set()
    for k, t in enumerate(transcripts, start=1):
        if any(c.isspace() for c in t.utt_id):
            raise InputError(f"utterance id {t.utt_id!r} contains whitespace", path=path, line=k,
                             expected="ids without whitespace")
        if t.utt_id in seen:
            raise InputError(f"duplicate utterance id {t.utt_id!r}", path=path, line=k, expected="unique ids")
        seen.add(t.utt_id)
        lines.append(" ".join((t.utt_id, *t.words)) + "\n")
        if spk_lines is not None:
            if t.speaker is None or any(c.isspace() for c in t.speaker):
                spk_lines = None
            else:
                spk_lines.append(f"{t.utt_id} {t.speaker}\n")
    with open_write_text(path) as f:
        f.writelines(lines)
    if spk_lines:
        with open_write_text(Path(path).parent / UTT2SPK) as f:
            f.writelines(spk_lines)
