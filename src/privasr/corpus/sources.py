"""Language-model training text built from the shared corpora, tokenised like the hypotheses it will score.

Sources (:data:`TEXT_SOURCES`, the names a rescoring config's ``train.text`` may use):

* ``ami-train`` (and ``ami-dev``, ``ami-test``): the AMI HMNet transcripts of that split
  (``ami-transcripts/AMI_proprec/<split>``), every non-empty turn normalised with the ``ami``
  :class:`~privasr.text.normalize.Normalizer` preset and the CMU vocabulary, i.e. exactly as the
  references (and the first-pass LM text) of the ``ami-tts-nbest*`` sets: one turn per sentence, any
  length. Train gives 27,927 non-empty turns, 392,874 tokens. ``ami-train-fit`` / ``ami-train-valid`` split
  the train turns as :func:`held_out_part` does (every 50th turn held out): early stopping on AMI text whose
  meetings are neither dev nor test meetings (cross-validation over the dev and test meetings needs it).
* ``gutenberg``: the 17 NLTK Gutenberg books (``gutenberg/gutenberg17_tokenized.tar.xz``) normalised as
  ``../shared/golden/kenlm-mkn/README.md`` ("Gutenberg timing anchors") describes -- books in file-name
  order, the title line dropped, every line lowercased and split on whitespace, tokens without a letter or
  digit dropped, a line kept if anything is left -- and then, so that the tokens match LibriSpeech /
  Whisper hypotheses (lowercase, no punctuation, apostrophes kept: ``there's``, ``don't``), made
  ASR-like: split clitics re-attached (``alice 's`` -> ``alice's``, ``do n't`` -> ``don't``), characters
  other than letters, digits and apostrophes turned into word breaks (``to-day`` -> ``to day``),
  apostrophes at either end of a word (quotes) removed unless the token is a clitic, and the spoken forms
  LibriSpeech transcripts use for what the tokeniser split or abbreviated: ``mr`` -> ``mister``, ``mrs`` ->
  ``missus``, ``dr`` -> ``doctor``, ``can not`` -> ``cannot`` (:data:`SPOKEN_FORMS`). ``gutenberg-raw``
  stops after the README's rules (it reproduces the anchor text: 66,345 lines, 1,336,275 tokens, the
  README's md5); ``gutenberg`` keeps the same 66,345 lines with 1,331,020 tokens. The books' lines are
  already (nearly) one sentence each, so they are used as sentences.
* ``generic`` (and its deterministic split ``generic-train`` / ``generic-valid``, every 50th sentence held
  out): the generic background corpus of the ``ami-tts-nbest`` first pass, rebuilt with the rules of that
  set's SOURCE.txt -- the 17 Gutenberg books (title line dropped, one paragraph a line) plus the 44
  Earnings-21 reference transcripts (``.nlp`` first column, split into sentences at the punctuation column's
  ``. ? !``); lowercased, tokens without a letter or digit dropped, a token starting with an apostrophe or
  equal to ``n't`` glued to the previous one. The server-side NNLM of federated personalisation is trained on
  it: no AMI text. 85,669 sentences, 1,684,959 tokens (SOURCE.txt says 1,684,960). ``earnings21`` is the
  Earnings-21 part alone (19,324 sentences, 362,219 tokens).
* ``gutenberg-train`` / ``gutenberg-valid``: ``gutenberg`` with every 50th sentence held out (for early
  stopping a neural LM on the books).
* ``gutenberg-ami`` (and its split ``gutenberg-ami-train`` / ``gutenberg-ami-valid``, every 50th sentence held
  out): the background text of the Earnings-21 federated experiments, which must not contain Earnings-21 text:
  the Gutenberg books tokenised like ``generic`` (:func:`generic_tokens`, the rules of the Earnings-21
  references) followed by ``ami-train``.
* any other string: a text file (``.gz``/``.xz`` allowed), one sentence per line, whitespace tokens,
  optionally normalised with a normaliser spec.

>>> sorted(TEXT_SOURCES)
['ami-dev', 'ami-test', 'ami-train', 'ami-train-fit', 'ami-train-valid', 'earnings21', 'generic', 'generic-train', 'generic-valid', 'gutenberg', 'gutenberg-ami', 'gutenberg-ami-train', 'gutenberg-ami-valid', 'gutenberg-raw', 'gutenberg-train', 'gutenberg-valid']
>>> generic_tokens(["I", "do", "n't", "--", "Know", "."])
['i', "don't", 'know']
>>> asr_tokens(["`", "Alice", "'s", "daisy-chain", "''I'", "do", "n't", "'twas", "."])
["alice's", 'daisy', 'chain', 'i', "don't", 'twas']
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from privasr.corpus.textio import PathLike, iter_lines
from privasr.errors import ConfigError, InputError
from privasr.paths import data_dir
from privasr.text.normalize import CLITICS, Normalizer

__all__ = [
    "TEXT_SOURCES",
    "ami_sentences",
    "gutenberg_sentences",
    "generic_sentences",
    "earnings21_sentences",
    "earnings21_call_sentences",
    "earnings21_reference_sentences",
    "gutenberg_ami_sentences",
    "generic_tokens",
    "asr_tokens",
    "SPOKEN_FORMS",
    "file_sentences",
    "held_out_part",
    "load_text",
    "require_data_dir",
]

_BREAK = re.compile(r"[^\w']+", re.UNICODE)
_CLITIC_SET = frozenset(CLITICS)

SPOKEN_FORMS: dict[str, str] = {"mr": "mister", "mrs": "missus", "dr": "doctor"}
"""Abbreviations written out as LibriSpeech transcripts (and Whisper's normalised output) spell them."""


def require_data_dir(data: PathLike | None = None) -> Path:
    """``data`` or the shared data folder (:func:`privasr.paths.data_dir`); :class:`ConfigError` if absent."""
    if data is not None:
        p = Path(data)
        if not p.is_dir():
            raise ConfigError("the data folder does not exist", path=p)
        return p
    d = data_dir()
    if d is None:
        raise ConfigError("the shared data folder is not available", expected="../shared/data or $PRIVASR_DATA")
    return d


def ami_sentences(split: str = "train", data: PathLike | None = None) -> list[tuple[str, ...]]:
    """The AMI transcripts of ``split`` normalised like the AMI N-best references, one turn per sentence.

    Turns that normalise to nothing are left out. ``data`` defaults to the shared data folder.
    """
    from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
    from privasr.corpus.phonetics import load_cmudict

    if split not in ("train", "dev", "test"):
        raise ConfigError(f"AMI split {split!r} is not valid", expected="train, dev or test")
    folder = require_data_dir(data) / "ami-transcripts" / "AMI_proprec" / split
    if not folder.is_dir():
        raise ConfigError("AMI transcripts not found", path=folder)
    norm = Normalizer.preset("ami", vocabulary=frozenset(load_cmudict()))
    out = []
    for t in read_ami_hmnet(folder):
        words = norm(t.words)
        if words:
            out.append(words)
    return out


def asr_tokens(tokens: Sequence[str]) -> list[str]:
    """Tokenised book text -> ASR-style tokens (see the module docstring's ``gutenberg`` rules).

    >>> asr_tokens(["Do", "n't", "--", "o'", "clock", "'S", "Mr.", "Smith", "can", "not"])
    ["don't", 'o', "clock's", 'mister', 'smith', 'cannot']
    """
    out: list[str] = []
    for raw in tokens:
        low = raw.lower()
        if not any(c.isalnum() for c in low):
            continue
        if low in _CLITIC_SET:
            if out:
                out[-1] += low
            else:
                out.append(low)
            continue
        for part in _BREAK.split(low.replace("_", " ")):
            part = part.strip("'")
            if part and any(c.isalnum() for c in part):
                if part == "not" and out and out[-1] == "can":
                    out[-1] = "cannot"
                else:
                    out.append(SPOKEN_FORMS.get(part, part))
    return out


def _books(path: Path) -> Iterator[tuple[str, list[str]]]:
    try:
        with tarfile.open(path, "r:*") as tar:
            members = sorted((m for m in tar.getmembers() if m.isfile() and m.name.endswith(".txt")),
                             key=lambda m: Path(m.name).name)
            for m in members:
                f = tar.extractfile(m)
                if f is None:  # pragma: no cover - regular files always extract
                    continue
                try:
                    text = f.read().decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"{m.name} is not UTF-8: {e}", path=path) from None
                yield Path(m.name).name, text.split("\n")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise InputError(f"cannot read the archive: {e}", path=path) from None


def _gutenberg(data: PathLike | None, tokens: Callable[[list[str]], list[str]]) -> list[tuple[str, ...]]:
    """Every line of the Gutenberg books after its title line, tokenised by ``tokens``; empty lines dropped."""
    path = require_data_dir(data) / "gutenberg" / "gutenberg17_tokenized.tar.xz"
    if not path.is_file():
        raise ConfigError("Gutenberg archive not found", path=path)
    out: list[tuple[str, ...]] = []
    for _, lines in _books(path):
        for line in lines[1:]:
            words = tokens(line.split())
            if words:
                out.append(tuple(words))
    return out


def _raw_tokens(toks: list[str]) -> list[str]:
    return [t.lower() for t in toks if any(c.isalnum() for c in t.lower())]


def gutenberg_sentences(data: PathLike | None = None, *, style: str = "asr",
                        part: str = "all") -> list[tuple[str, ...]]:
    """The Gutenberg books as LM sentences (``style``: ``asr`` or ``raw``; see the module docstring); ``part``:
    ``all``, ``train`` or ``valid`` (every 50th sentence)."""
    if style not in ("asr", "raw"):
        raise ConfigError(f"gutenberg style {style!r} is not valid", expected="asr or raw")
    return held_out_part(_gutenberg(data, _raw_tokens if style == "raw" else asr_tokens), part)


def held_out_part(sentences: list[tuple[str, ...]], part: str) -> list[tuple[str, ...]]:
    """``all`` the sentences, the ``valid`` part (every 50th: indices 49, 99, ...) or the ``train`` rest.

    >>> s = [(str(i),) for i in range(100)]
    >>> [x[0] for x in held_out_part(s, "valid")], len(held_out_part(s, "train")), len(held_out_part(s, "all"))
    (['49', '99'], 98, 100)
    """
    if part not in ("all", "train", "valid"):
        raise ConfigError(f"part={part!r}", expected="all, train or valid")
    if part == "all":
        return sentences
    if part == "valid":
        return [x for i, x in enumerate(sentences) if i % 50 == 49]
    return [x for i, x in enumerate(sentences) if i % 50 != 49]


def generic_tokens(tokens: Sequence[str]) -> list[str]:
    """The first-pass corpus rules of ``ami-tts-nbest`` (its SOURCE.txt): lowercase, drop tokens without a letter
    or digit, glue a token starting with an apostrophe or equal to ``n't`` to the previous one.

    >>> generic_tokens(["We", "'re", "here", "!"])
    ["we're", 'here']
    """
    out: list[str] = []
    for t in tokens:
        low = t.lower()
        if not any(c.isalnum() for c in low):
            continue
        if out and (low.startswith("'") or low == "n't"):
            out[-1] += low
        else:
            out.append(low)
    return out


def earnings21_sentences(data: PathLike | None = None) -> list[tuple[str, ...]]:
    """The Earnings-21 reference transcripts as sentences (split at ``. ? !``), tokenised by :func:`generic_tokens`."""
    return [s for sents in earnings21_call_sentences(data).values() for s in sents]


def earnings21_call_sentences(data: PathLike | None = None) -> dict[str, list[tuple[str, ...]]]:
    """:func:`earnings21_sentences` per call: call id (the ``.nlp`` file's stem) -> its sentences, calls in
    natural order of their file names."""
    path = require_data_dir(data) / "earnings21" / "references_nlp_wertags.tar.xz"
    if not path.is_file():
        raise ConfigError("Earnings-21 references not found", path=path)
    return earnings21_reference_sentences(path)


def earnings21_reference_sentences(path: PathLike) -> dict[str, list[tuple[str, ...]]]:
    """Call id -> sentences of an Earnings-21 reference archive (a tar of ``<call>.nlp`` files): tokens split
    into sentences at the punctuation column's ``. ? !`` and tokenised by :func:`generic_tokens`.

    Raises:
        InputError: an unreadable archive, or a row with fewer than 5 columns (naming the file and line).
    """
    from privasr.corpus.formats._common import iter_tar_texts, natural_key

    path = Path(path)
    texts = sorted(((Path(n).name, t) for n, t in iter_tar_texts(path, (".nlp",))), key=lambda x: natural_key(x[0]))
    calls: dict[str, list[tuple[str, ...]]] = {}
    for name, text in texts:
        out = calls.setdefault(name[: -len(".nlp")], [])
        cur: list[str] = []
        for k, row in enumerate(text.splitlines()[1:], start=2):
            cols = row.split("|")
            if len(cols) < 5:
                raise InputError(f"{name} line {k} has {len(cols)} columns", path=path,
                                 expected="token|speaker|ts|endTs|punctuation|...")
            cur.append(cols[0])
            if any(p in cols[4] for p in ".?!"):
                words = generic_tokens(cur)
                if words:
                    out.append(tuple(words))
                cur = []
        words = generic_tokens(cur)
        if words:
            out.append(tuple(words))
    return calls


def generic_sentences(data: PathLike | None = None, *, part: str = "all") -> list[tuple[str, ...]]:
    """The generic background corpus (Gutenberg + Earnings-21; see the module docstring); ``part``: ``all``,
    ``train`` or ``valid`` (every 50th sentence)."""
    if part not in ("all", "train", "valid"):
        raise ConfigError(f"part={part!r}", expected="all, train or valid")
    out = _gutenberg(data, generic_tokens)
    out.extend(earnings21_sentences(data))
    return held_out_part(out, part)


def gutenberg_ami_sentences(data: PathLike | None = None, *, part: str = "all") -> list[tuple[str, ...]]:
    """The Earnings-21 experiments' background text: Gutenberg (:func:`generic_tokens`) + ``ami-train``;
    ``part``: ``all``, ``train`` or ``valid`` (every 50th sentence). No Earnings-21 text."""
    if part not in ("all", "train", "valid"):
        raise ConfigError(f"part={part!r}", expected="all, train or valid")
    out = _gutenberg(data, generic_tokens)
    out.extend(ami_sentences("train", data))
    return held_out_part(out, part)


def file_sentences(path: PathLike, normalize: Any = None) -> list[tuple[str, ...]]:
    """Sentences of a text file (one per line, whitespace tokens), optionally normalised; blank lines skipped.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "t.txt"
    >>> _ = p.write_text("We 're here .\\n\\nok\\n")
    >>> file_sentences(p, "asr")
    [("we're", 'here'), ('ok',)]
    """
    norm = None if normalize in (None, "none") else Normalizer.from_spec(normalize)
    out = []
    for _, line in iter_lines(path):
        words = tuple(line.split())
        if norm is not None:
            words = norm(words)
        if words:
            out.append(words)
    return out


TEXT_SOURCES: dict[str, Callable[..., list[tuple[str, ...]]]] = {
    "ami-train": lambda data=None, **kw: ami_sentences("train", data, **kw),
    "ami-dev": lambda data=None, **kw: ami_sentences("dev", data, **kw),
    "ami-test": lambda data=None, **kw: ami_sentences("test", data, **kw),
    "ami-train-fit": lambda data=None, **kw: held_out_part(ami_sentences("train", data, **kw), "train"),
    "ami-train-valid": lambda data=None, **kw: held_out_part(ami_sentences("train", data, **kw), "valid"),
    "gutenberg": lambda data=None, **kw: gutenberg_sentences(data, style="asr", **kw),
    "gutenberg-raw": lambda data=None, **kw: gutenberg_sentences(data, style="raw", **kw),
    "gutenberg-train": lambda data=None, **kw: gutenberg_sentences(data, style="asr", part="train", **kw),
    "gutenberg-valid": lambda data=None, **kw: gutenberg_sentences(data, style="asr", part="valid", **kw),
    "earnings21": lambda data=None, **kw: earnings21_sentences(data, **kw),
    "generic": lambda data=None, **kw: generic_sentences(data, part="all", **kw),
    "generic-train": lambda data=None, **kw: generic_sentences(data, part="train", **kw),
    "generic-valid": lambda data=None, **kw: generic_sentences(data, part="valid", **kw),
    "gutenberg-ami": lambda data=None, **kw: gutenberg_ami_sentences(data, part="all", **kw),
    "gutenberg-ami-train": lambda data=None, **kw: gutenberg_ami_sentences(data, part="train", **kw),
    "gutenberg-ami-valid": lambda data=None, **kw: gutenberg_ami_sentences(data, part="valid", **kw),
}
"""Named text sources -> function ``(data=None, **options) -> sentences``."""

_SOURCE_OPTIONS: dict[str, frozenset[str]] = {
    "ami-train": frozenset(), "ami-dev": frozenset(), "ami-test": frozenset(), "ami-train-fit": frozenset(),
    "ami-train-valid": frozenset(),
    "gutenberg": frozenset(), "gutenberg-raw": frozenset(), "gutenberg-train": frozenset(),
    "gutenberg-valid": frozenset(), "earnings21": frozenset(), "generic": frozenset(),
    "generic-train": frozenset(), "generic-valid": frozenset(), "gutenberg-ami": frozenset(),
    "gutenberg-ami-train": frozenset(), "gutenberg-ami-valid": frozenset(),
}


def load_text(source: str | PathLike, *, data: PathLike | None = None, normalize: Any = None,
              **options: Any) -> list[tuple[str, ...]]:
    """Sentences of a named source (:data:`TEXT_SOURCES`, in its own normalisation, with ``normalize`` applied on
    top when given) or of a text file (normalised with ``normalize``).

    >>> load_text("gutenberg", colour="red")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: text source 'gutenberg' has no option(s) ['colour'] (expected some of [])
    """
    if isinstance(source, str) and source in TEXT_SOURCES:
        allowed = _SOURCE_OPTIONS[source]
        bad = sorted(set(options) - allowed)
        if bad:
            raise ConfigError(f"text source {source!r} has no option(s) {bad}", expected=f"some of {sorted(allowed)}")
        sents = TEXT_SOURCES[source](data, **options)
        if normalize in (None, "none"):
            return sents
        # a named source is normalised already (its own convention); a normaliser given here runs on top of it,
        # e.g. "neural" to expand the contractions of ami-train as a neural recogniser's lists have them
        norm = Normalizer.from_spec(normalize)
        return [w for w in (norm(s) for s in sents) if w]
    if options:
        raise ConfigError(f"a text file takes no option(s) {sorted(options)}", expected="only normalize")
    p = Path(source)
    if not p.is_file():
        raise ConfigError("no such text file", path=p,
                          expected=f"a text file or one of the sources {sorted(TEXT_SOURCES)}")
    return file_sentences(p, normalize)
