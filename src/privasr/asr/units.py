"""Output units of the acoustic model (paper 002): characters or sentencepiece unigram subwords.

Both tokenizers share the :class:`Tokenizer` interface, so a CTC or attention seq2seq model can use either:

* ids are deterministic; ``<blank>`` is id 0 (the CTC blank; a seq2seq model can use it as padding),
  then ``<sos>`` = 1, ``<eos>`` = 2 and ``<unk>`` = 3;
* ``encode(words) -> list[int]`` turns a transcript (a sequence of words, as in
  :class:`~privasr.corpus.records.Transcript`) into unit ids, without ``<sos>``/``<eos>`` (add them with
  ``sos_id``/``eos_id`` as the model needs); ``decode(ids) -> tuple[str, ...]`` gives the words back and
  ignores ``<blank>``, ``<sos>`` and ``<eos>`` (collapse CTC repeats before decoding);
* ``to_json()``/``save(path)`` and ``from_json()``/``load(path)`` (or :func:`load_tokenizer`) serialise as
  JSON text; the sentencepiece model is stored as base64 of its protobuf bytes (no pickle).

Paper 002 uses 16k unigram subwords for 960 h of LibriSpeech. AN4 has only ~100 word types (mostly letters,
digits and short commands), so a vocabulary of 64-128 pieces is the sensible scale there; sentencepiece
cannot build more pieces than the data supports (115 on the AN4 training transcripts).

>>> tok = CharTokenizer.train([("GO",), ("ERASE", "C")])
>>> tok.units[:6]
('<blank>', '<sos>', '<eos>', '<unk>', '▁', 'A')
>>> ids = tok.encode(("GO", "CASE"))
>>> tok.decode(ids)
('GO', 'CASE')
"""

from __future__ import annotations

import base64
import io
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from privasr.errors import ConfigError, InputError

__all__ = [
    "BLANK", "SOS", "EOS", "UNK", "WORD_BOUNDARY", "SPECIALS",
    "Tokenizer", "CharTokenizer", "SentencePieceTokenizer", "load_tokenizer", "tokenizer_from_json",
]

BLANK, SOS, EOS, UNK = "<blank>", "<sos>", "<eos>", "<unk>"
SPECIALS: tuple[str, ...] = (BLANK, SOS, EOS, UNK)
"""Special units, at ids 0-3 in every tokenizer."""
WORD_BOUNDARY = "\u2581"
"""``▁`` (U+2581), the word-boundary unit of :class:`CharTokenizer` (and sentencepiece's word prefix)."""

_FORMAT = 1


def _check_words(words: Sequence[str]) -> tuple[str, ...]:
    if isinstance(words, str):
        raise InputError(f"expected a sequence of words, got the string {words[:40]!r}",
                         expected="a tuple/list of words (split the text first)")
    out = tuple(words)
    for i, w in enumerate(out):
        if not isinstance(w, str) or not w or any(c.isspace() for c in w):
            raise InputError(f"word {i + 1} is {w!r}", expected="non-empty words without whitespace")
    return out


class Tokenizer(ABC):
    """Common interface of the output-unit tokenizers (see the module documentation).

    Subclasses provide :attr:`units` (the unit string of each id), :meth:`encode`, :meth:`decode` and the
    JSON form; this base class adds the special ids, lookups and file I/O.
    """

    kind: ClassVar[str]
    blank_id: ClassVar[int] = 0
    sos_id: ClassVar[int] = 1
    eos_id: ClassVar[int] = 2
    unk_id: ClassVar[int] = 3

    @property
    @abstractmethod
    def units(self) -> tuple[str, ...]:
        """The unit (character or piece) of every id, in id order."""

    @abstractmethod
    def encode(self, words: Sequence[str]) -> list[int]:
        """Unit ids of a word sequence (no ``<sos>``/``<eos>``)."""

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> tuple[str, ...]:
        """Words of a unit-id sequence (``<blank>``, ``<sos>``, ``<eos>`` ignored)."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with ``"type"`` and ``"format"`` keys."""

    @classmethod
    @abstractmethod
    def from_dict(cls, d: dict[str, Any]) -> Tokenizer:
        """Inverse of :meth:`to_dict`."""

    @property
    def vocab_size(self) -> int:
        """Number of units (the size of the model's output layer)."""
        return len(self.units)

    def __len__(self) -> int:
        return self.vocab_size

    def id_to_unit(self, i: int) -> str:
        """The unit of id ``i``."""
        if not 0 <= i < self.vocab_size:
            raise InputError(f"unit id {i} out of range", expected=f"0..{self.vocab_size - 1}")
        return self.units[i]

    def encode_batch(self, transcripts: Iterable[Sequence[str]]) -> list[list[int]]:
        """:meth:`encode` of each transcript."""
        return [self.encode(w) for w in transcripts]

    def _content_ids(self, ids: Iterable[int]) -> list[int]:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise InputError(f"unit id {i} out of range", expected=f"0..{self.vocab_size - 1}")
            if i not in (self.blank_id, self.sos_id, self.eos_id):
                out.append(i)
        return out

    def to_json(self) -> str:
        """JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Tokenizer:
        """Read a tokenizer from :meth:`to_json` text (of this class)."""
        return cls._from_dict_checked(_parse_json(text))

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (UTF-8)."""
        Path(path).write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a tokenizer written by :meth:`save`; errors name the file."""
        try:
            return cls.from_json(_read_text(path))
        except InputError as e:
            raise e.at(path) from None

    @classmethod
    def _from_dict_checked(cls, d: Any) -> Tokenizer:
        if not isinstance(d, dict):
            raise InputError("tokenizer JSON is not an object", expected='{"type": ..., "format": 1, ...}')
        kind = d.get("type")
        if cls is Tokenizer:
            sub = _KINDS.get(kind) if isinstance(kind, str) else None
            if sub is None:
                raise InputError(f"unknown tokenizer type {kind!r}", expected=" or ".join(map(repr, _KINDS)))
            return sub._from_dict_checked(d)
        if kind != cls.kind:
            raise InputError(f"tokenizer type is {kind!r}, not {cls.kind!r}", expected=repr(cls.kind))
        if d.get("format") != _FORMAT:
            raise InputError(f"unsupported tokenizer format {d.get('format')!r}", expected=str(_FORMAT))
        return cls.from_dict(d)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tokenizer):
            return NotImplemented
        return type(self) is type(other) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read the tokenizer file: {e}", path=path, expected="a UTF-8 JSON file") from None


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise InputError(f"invalid tokenizer JSON: {e}", expected="JSON written by Tokenizer.to_json") from None


class CharTokenizer(Tokenizer):
    """Character units plus the word boundary ``▁`` between words.

    Ids: the :data:`SPECIALS` (0-3), ``▁`` (4), then the characters of the training transcripts sorted by
    code point, so the same transcripts always give the same ids. A word ``GO`` ``TO`` is encoded as
    ``G O ▁ T O``. Characters not seen in training (and ``▁`` inside a word) become ``<unk>``, which
    decodes to the string ``<unk>``; everything else round-trips exactly.

    >>> tok = CharTokenizer.train([("YES",), ("NO", "GO")])
    >>> tok.encode(("NO", "YES"))
    [7, 8, 4, 10, 5, 9]
    >>> tok.decode([0, 7, 7, 8, 0, 4, 10, 5, 9]), tok.vocab_size
    (('NNO', 'YES'), 11)
    >>> CharTokenizer.from_json(tok.to_json()) == tok
    True
    """

    kind = "char"
    boundary_id: ClassVar[int] = 4

    def __init__(self, chars: Iterable[str]) -> None:
        chars = tuple(chars)
        for c in chars:
            if not isinstance(c, str) or len(c) != 1 or c.isspace() or c == WORD_BOUNDARY:
                raise InputError(f"invalid character unit {c!r}", expected="single non-space characters other than ▁")
        if len(set(chars)) != len(chars):
            raise InputError("duplicate character units", expected="distinct characters")
        self._units = (*SPECIALS, WORD_BOUNDARY, *chars)
        self._index = {c: i for i, c in enumerate(self._units) if i > self.unk_id}

    @classmethod
    def train(cls, transcripts: Iterable[Sequence[str]]) -> CharTokenizer:
        """Build the character set of ``transcripts`` (sequences of words)."""
        chars: set[str] = set()
        for n, words in enumerate(transcripts, 1):
            try:
                for w in _check_words(words):
                    chars.update(w)
            except InputError as e:
                raise e.at(line=n) from None
        chars.discard(WORD_BOUNDARY)
        return cls(sorted(chars))

    @property
    def units(self) -> tuple[str, ...]:
        return self._units

    def encode(self, words: Sequence[str]) -> list[int]:
        out: list[int] = []
        for w in _check_words(words):
            if out:
                out.append(self.boundary_id)
            out.extend(self._index.get(c, self.unk_id) if c != WORD_BOUNDARY else self.unk_id for c in w)
        return out

    def decode(self, ids: Iterable[int]) -> tuple[str, ...]:
        text = "".join(self._units[i] for i in self._content_ids(ids))
        return tuple(w for w in text.split(WORD_BOUNDARY) if w)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "format": _FORMAT, "units": list(self._units)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CharTokenizer:
        units = d.get("units")
        if not isinstance(units, list) or tuple(units[:5]) != (*SPECIALS, WORD_BOUNDARY):
            raise InputError("invalid char tokenizer units",
                             expected=f"a list starting with {[*SPECIALS, WORD_BOUNDARY]}")
        return cls(units[5:])


class SentencePieceTokenizer(Tokenizer):
    """Sentencepiece **unigram** subword units (paper 002 used 16k of them), trained in memory.

    The model reserves ``<blank>`` (sentencepiece's pad, id 0), ``<sos>``/``<eos>`` (bos/eos, 1/2) and
    ``<unk>`` (3). Training uses the ``identity`` normalisation (no NFKC, so text comes back unchanged),
    full character coverage and one thread, so the same transcripts and options give byte-identical models.
    Words whose characters all occur in training round-trip exactly, even unseen words (they are spelled
    with shorter pieces); unseen characters become ``<unk>``, which decodes as ``⁇``.

    >>> data = [("ERASE", "C"), ("GO",), ("ONE", "TWO", "THREE"), ("ENTER", "FOUR")] * 5
    >>> tok = SentencePieceTokenizer.train(data, vocab_size=30)
    >>> tok.units[:4], tok.vocab_size <= 30
    (('<blank>', '<sos>', '<eos>', '<unk>'), True)
    >>> tok.decode(tok.encode(("THREE", "TOGO")))
    ('THREE', 'TOGO')
    >>> SentencePieceTokenizer.from_json(tok.to_json()) == tok
    True
    """

    kind = "sentencepiece"

    def __init__(self, model_bytes: bytes) -> None:
        import sentencepiece as spm

        if not isinstance(model_bytes, bytes | bytearray) or not model_bytes:
            raise InputError("empty sentencepiece model", expected="serialised sentencepiece model bytes")
        sp = spm.SentencePieceProcessor()
        try:
            sp.load_from_serialized_proto(bytes(model_bytes))
        except (RuntimeError, OSError, TypeError, ValueError) as e:
            raise InputError(f"invalid sentencepiece model: {e}", expected="serialised sentencepiece model bytes") from None
        specials = (sp.pad_id(), sp.bos_id(), sp.eos_id(), sp.unk_id())
        if specials != (0, 1, 2, 3) or tuple(sp.id_to_piece(i) for i in range(4)) != SPECIALS:
            raise InputError("sentencepiece model does not reserve <blank>/<sos>/<eos>/<unk> as ids 0-3",
                             expected="a model from SentencePieceTokenizer.train")
        self._sp = sp
        self._bytes = bytes(model_bytes)
        self._units = tuple(sp.id_to_piece(i) for i in range(sp.get_piece_size()))

    @classmethod
    def train(cls, transcripts: Iterable[Sequence[str]], vocab_size: int = 64, *, seed: int = 0,
              hard_vocab_limit: bool = False, max_piece_length: int = 16) -> SentencePieceTokenizer:
        """Train a unigram model on ``transcripts`` (sequences of words), in memory.

        ``vocab_size`` counts every unit, the 4 specials included. With ``hard_vocab_limit=False`` (the
        default) it is an upper bound: small corpora get as many pieces as they support (115 for the AN4
        training transcripts) instead of an error. ``seed`` goes to ``sentencepiece.set_random_generator_seed``
        (process-global; unigram training on the full corpus, as here, does not sample anyway).
        """
        import sentencepiece as spm

        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 6:
            raise ConfigError(f"vocab_size must be an integer >= 6, got {vocab_size!r}")
        lines = []
        for n, words in enumerate(transcripts, 1):
            try:
                w = _check_words(words)
            except InputError as e:
                raise e.at(line=n) from None
            if w:
                lines.append(" ".join(w))
        if not lines:
            raise InputError("no non-empty transcripts to train sentencepiece on", expected="at least one word")
        buf = io.BytesIO()
        spm.set_random_generator_seed(int(seed))
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=buf, model_type="unigram", vocab_size=vocab_size,
                pad_id=0, pad_piece=BLANK, bos_id=1, bos_piece=SOS, eos_id=2, eos_piece=EOS,
                unk_id=3, unk_piece=UNK, normalization_rule_name="identity", character_coverage=1.0,
                num_threads=1, hard_vocab_limit=hard_vocab_limit,
                max_sentencepiece_length=max_piece_length, minloglevel=2)
        except (RuntimeError, OSError, ValueError) as e:
            raise ConfigError(f"sentencepiece training failed: {e}",
                              expected="a vocab_size the transcripts support (or hard_vocab_limit=False)") from None
        return cls(buf.getvalue())

    @property
    def units(self) -> tuple[str, ...]:
        return self._units

    @property
    def model_bytes(self) -> bytes:
        """The serialised sentencepiece model (a ``.model`` protobuf)."""
        return self._bytes

    def encode(self, words: Sequence[str]) -> list[int]:
        w = _check_words(words)
        return list(self._sp.encode(" ".join(w), out_type=int)) if w else []

    def decode(self, ids: Iterable[int]) -> tuple[str, ...]:
        return tuple(self._sp.decode(self._content_ids(ids)).split())

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "format": _FORMAT, "vocab_size": self.vocab_size,
                "model": base64.b64encode(self._bytes).decode("ascii")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SentencePieceTokenizer:
        try:
            raw = base64.b64decode(d["model"], validate=True)
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"invalid sentencepiece model field: {e}", expected='"model": base64 text') from None
        tok = cls(raw)
        if "vocab_size" in d and d["vocab_size"] != tok.vocab_size:
            raise InputError(f"vocab_size {d['vocab_size']!r} does not match the model's {tok.vocab_size}",
                             expected=str(tok.vocab_size))
        return tok


_KINDS: dict[str, type[Tokenizer]] = {"char": CharTokenizer, "sentencepiece": SentencePieceTokenizer}


def tokenizer_from_json(text: str) -> Tokenizer:
    """A :class:`CharTokenizer` or :class:`SentencePieceTokenizer` from its JSON (dispatch on ``"type"``).

    >>> type(tokenizer_from_json(CharTokenizer(["A"]).to_json())).__name__
    'CharTokenizer'
    """
    return Tokenizer._from_dict_checked(_parse_json(text))


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read any tokenizer written by :meth:`Tokenizer.save`; errors name the file."""
    try:
        return tokenizer_from_json(_read_text(path))
    except InputError as e:
        raise e.at(path) from None
