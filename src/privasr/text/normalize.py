"""Text normalisation for WER scoring and LM training: one configurable normaliser used everywhere.

A :class:`Normalizer` maps a token sequence to a token sequence. Its steps run in a fixed order:

1. ``acronyms``: letter acronyms written with underscores (``T_V``, ``L_C_D``, as in AMI) become one word
   (``"join"``), separate letters (``"split"``), or one word only when the joined form is in
   ``vocabulary`` and letters otherwise (``"vocab"``, what the AMI N-best sets did with the CMU dictionary);
2. ``lowercase``;
3. ``contractions``: clitics written as separate tokens (``we 're``, ``do n't``, ``ca n't``, ``gon na``) are
   re-attached (``"join"``: ``we're``, ``don't``, ``can't``, ``gonna``), or attached clitics split off
   (``"split"``: ``we're`` -> ``we 're``), or left alone (``"keep"``);
4. ``punctuation``: tokens without any letter or digit are dropped and characters outside letters, digits
   and apostrophes are removed from the others (``"strip"``), or everything is kept (``"keep"``);
5. ``fragments``: word fragments marked with a trailing or leading hyphen (``wh-``) removed (``"remove"``) or
   kept;
6. ``fillers``: filler words (``um``, ``uh``, ``mm``, ``hmm``, ...) removed (``"remove"``) or kept;
7. ``tags``: bracketed non-speech tags (``[noise]``, ``<unk>``, ``(laugh)``) removed or kept.

Three more steps serve neural recognisers' output (Whisper writes digits, hyphens, British or American
spelling and full forms), following the conventions of Whisper's English normaliser:

* ``numbers`` (before everything else): ``"spell"`` spells digits out as people say them
  (:func:`privasr.text.numbers.spell_numbers`: ``1.4`` -> ``one point four``, ``$12.50`` -> ``twelve dollars
  fifty cents``, ``21st`` -> ``twenty first``; the ``ami`` preset too: AMI's transcripts hold no digits, so
  its sets are unchanged); ``"keep"`` leaves them to the punctuation step, which strips the separators inside
  them (``1.4`` -> ``14``: the default of the other presets, for reproducing the figures made with them; do
  not score text with digits that way);
* ``hyphens`` (after lower-casing): ``"split"`` makes each hyphen a word boundary (``lc-dsh`` -> ``lc dsh``,
  where stripping punctuation would glue them into ``lcdsh``); ``"keep"``;
* ``spelling`` (last): ``"american"`` maps British spellings to American ones with the table of
  Whisper's English normaliser (the ``whisper-normalizer`` package: ``colour`` -> ``color``); ``"keep"``;
* ``contractions="expand"`` writes contractions and informal forms out in full, as Whisper's normaliser does
  (``we're`` -> ``we are``, ``don't`` -> ``do not``, ``won't`` -> ``will not``, ``gonna`` -> ``going to``;
  ``'s`` is left, being ``is`` or a possessive).

Presets: ``"none"`` (identity), ``"asr"`` (lowercase, strip punctuation, join contractions, keep fillers: the
conventions of the project's data sets), ``"wer"`` (``asr`` plus removal of fillers, fragments and tags, for
scoring), ``"ami"`` (exactly the normalisation the AMI N-best sets used; pass the CMU vocabulary for the
acronym rule), ``"neural"`` (``asr`` with numbers spelled out, hyphens split, American spelling and
contractions expanded: for a neural recogniser's output and the references and LM text it is compared with).

>>> norm = Normalizer.preset("asr")
>>> norm.text("We 're going to the U_K , do n't worry .")
"we're going to the uk don't worry"
>>> Normalizer.preset("wer").text("um I think uh the wh- the [noise] design")
'i think the the design'
>>> Normalizer.from_spec("asr,fillers=remove").fillers
'remove'
>>> Normalizer.preset("neural").text("We're gonna pay $12.50 for 1.4 kilos of the LC-DSH colour.")
'we are going to pay twelve dollars fifty cents for one point four kilos of the lc dsh color'
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from privasr.errors import ConfigError

__all__ = ["Normalizer", "DEFAULT_FILLERS", "CLITICS"]

DEFAULT_FILLERS: frozenset[str] = frozenset(
    {"um", "uh", "uhm", "umm", "erm", "er", "ah", "eh", "hm", "hmm", "mm", "mhm", "mm-hmm", "uh-huh", "huh"}
)
"""Filler words removed by ``fillers="remove"`` (compared after lower-casing)."""

CLITICS: tuple[str, ...] = ("'s", "'re", "'ve", "'m", "'ll", "'d", "n't", "'em", "'t")
"""Clitics that tokenisers split off and ``contractions="join"`` re-attaches to the previous word."""

_JOIN_PAIRS = {("gon", "na"): "gonna", ("wan", "na"): "wanna", ("got", "ta"): "gotta"}
_SPLIT_RE = re.compile(r"^(.+?)(n't|'s|'re|'ve|'m|'ll|'d)$", re.IGNORECASE)
_KEEP_CHARS = re.compile(r"[^\w']", re.UNICODE)
_TAG_RE = re.compile(r"^(\[.*\]|<.*>|\(.*\))$")
_CHOICES: dict[str, tuple[str, ...]] = {
    "acronyms": ("keep", "join", "split", "vocab"),
    "contractions": ("keep", "join", "split", "expand"),
    "numbers": ("keep", "spell"),
    "hyphens": ("keep", "split"),
    "spelling": ("keep", "american"),
    "punctuation": ("keep", "strip"),
    "fragments": ("keep", "remove"),
    "fillers": ("keep", "remove"),
    "tags": ("keep", "remove"),
}


def _has_alnum(tok: str) -> bool:
    return any(c.isalnum() for c in tok)


def _is_fragment(tok: str) -> bool:
    """A word fragment marked by a leading or trailing hyphen (``wh-``), which the ``fragments`` step handles."""
    return len(tok) > 1 and (tok.endswith("-") or tok.startswith("-"))


_EXPAND_WORDS = {"won't": "will not", "can't": "can not", "cannot": "can not", "shan't": "shall not",
                 "ain't": "is not", "let's": "let us", "gonna": "going to", "wanna": "want to", "gotta": "got to",
                 "gimme": "give me", "y'all": "you all", "'cause": "because", "o'clock": "o'clock"}
_EXPAND_SUFFIX = (("n't", " not"), ("'re", " are"), ("'m", " am"), ("'ll", " will"), ("'ve", " have"),
                  ("'d", " would"))


def _expand(toks: list[str]) -> list[str]:
    """Contractions and informal forms written out (Whisper's English normaliser's standardisation)."""
    out: list[str] = []
    for t in toks:
        low = t.lower()
        full = _EXPAND_WORDS.get(low)
        if full is None:
            full = next((low[: -len(suf)] + rep for suf, rep in _EXPAND_SUFFIX if low.endswith(suf)
                         and len(low) > len(suf)), None)
        if full is None:
            out.append(t)
        else:
            out.extend(full.split() if low == t else [w if k else t[0] + w[1:] for k, w in enumerate(full.split())])
    return out


_SPELLING: dict[str, str] | None = None


def _american() -> dict[str, str]:
    """British -> American spellings: the table of Whisper's English normaliser (``whisper-normalizer``)."""
    global _SPELLING
    if _SPELLING is None:
        try:
            import json
            from importlib.resources import files

            _SPELLING = json.loads(files("whisper_normalizer").joinpath("normalizers/english.json").read_text())
        except (ImportError, ModuleNotFoundError, FileNotFoundError):
            raise ConfigError("spelling='american' needs the whisper-normalizer package",
                              expected="pip install 'privasr[whisper]'") from None
    return _SPELLING


def _respell(tok: str, table: Mapping[str, str]) -> str:
    return table.get(tok, tok)


@dataclass(frozen=True)
class Normalizer:
    """A configurable token normaliser (see the module docstring for the steps).

    Args:
        lowercase: lower-case every token.
        acronyms: ``keep`` | ``join`` | ``split`` | ``vocab`` (join only if the joined form is in ``vocabulary``).
        contractions: ``keep`` | ``join`` | ``split`` | ``expand``.
        numbers: ``keep`` | ``spell``.
        hyphens: ``keep`` | ``split``.
        spelling: ``keep`` | ``american``.
        punctuation: ``keep`` | ``strip``.
        fragments: ``keep`` | ``remove``.
        fillers: ``keep`` | ``remove``.
        tags: ``keep`` | ``remove``.
        filler_words: the filler list used by ``fillers="remove"``.
        vocabulary: words used by ``acronyms="vocab"``.

    >>> Normalizer(contractions="split").text("we're fine")
    "we 're fine"
    """

    lowercase: bool = True
    acronyms: str = "join"
    contractions: str = "join"
    punctuation: str = "strip"
    fragments: str = "keep"
    fillers: str = "keep"
    tags: str = "keep"
    numbers: str = "keep"
    hyphens: str = "keep"
    spelling: str = "keep"
    filler_words: frozenset[str] = field(default=DEFAULT_FILLERS, repr=False)
    vocabulary: frozenset[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.lowercase, bool):
            raise ConfigError(f"normaliser: lowercase must be true or false, got {self.lowercase!r}")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"normaliser: {name}={value!r} is not valid", expected=f"one of {list(choices)}")
        fillers = {w.lower() for w in self.filler_words}
        # Also match the fillers' punctuation-stripped forms ("mm-hmm" -> "mmhmm"), which step 4 produces.
        object.__setattr__(self, "filler_words", frozenset(fillers | {_KEEP_CHARS.sub("", w) for w in fillers}))
        if self.vocabulary is not None:
            object.__setattr__(self, "vocabulary", frozenset(self.vocabulary))
        if self.acronyms == "vocab" and self.vocabulary is None:
            raise ConfigError("normaliser: acronyms='vocab' needs a vocabulary")

    # ----------------------------------------------------------------------------------------- presets
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Normalizer:
        """One of ``none``, ``asr``, ``wer``, ``ami``, ``neural``; keyword overrides change single options."""
        presets: dict[str, dict[str, Any]] = {
            "none": dict(lowercase=False, acronyms="keep", contractions="keep", punctuation="keep"),
            "asr": {},
            "wer": dict(fillers="remove", fragments="remove", tags="remove"),
            "ami": dict(acronyms="vocab" if overrides.get("vocabulary") is not None else "split", numbers="spell"),
            "neural": dict(numbers="spell", hyphens="split", spelling="american", contractions="expand"),
        }
        if name not in presets:
            raise ConfigError(f"unknown normaliser preset {name!r}", expected=f"one of {sorted(presets)}")
        return cls(**{**presets[name], **overrides})

    @classmethod
    def from_spec(cls, spec: str | Mapping[str, Any] | Normalizer | None) -> Normalizer:
        """Build from a preset name with overrides (``"wer,fillers=keep"``), a mapping, or pass through.

        >>> Normalizer.from_spec({"preset": "wer", "lowercase": False}).lowercase
        False
        """
        if spec is None:
            return cls()
        if isinstance(spec, Normalizer):
            return spec
        if isinstance(spec, str):
            head, *rest = [p.strip() for p in spec.split(",") if p.strip()] or ["asr"]
            opts: dict[str, Any] = {}
            if "=" in head:
                rest.insert(0, head)
                head = "asr"
            for item in rest:
                if "=" not in item:
                    raise ConfigError(f"normaliser spec item {item!r} is not key=value", expected="e.g. wer,fillers=keep")
                k, v = (s.strip() for s in item.split("=", 1))
                opts[k] = {"true": True, "false": False}.get(v.lower(), v)
            return cls._checked(head, opts)
        if isinstance(spec, Mapping):
            opts = dict(spec)
            return cls._checked(str(opts.pop("preset", "asr")), opts)
        raise ConfigError(f"normaliser spec {spec!r} is not valid", expected="a preset name, a mapping or a Normalizer")

    @classmethod
    def _checked(cls, preset: str, opts: dict[str, Any]) -> Normalizer:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise ConfigError(f"unknown normaliser option(s) {unknown}", expected=f"some of {sorted(known)}")
        if "filler_words" in opts:
            opts["filler_words"] = frozenset(opts["filler_words"])
        return cls.preset(preset, **opts)

    def with_options(self, **changes: Any) -> Normalizer:
        """A copy with some options changed."""
        return replace(self, **changes)

    # ----------------------------------------------------------------------------------------- apply
    def __call__(self, words: Iterable[str]) -> tuple[str, ...]:
        """Normalise a token sequence (tokens may contain spaces only if produced by a step that splits)."""
        toks = [t for w in words for t in w.split()]
        if self.numbers == "spell":
            from privasr.text.numbers import spell_numbers

            toks = list(spell_numbers(toks))
        if self.acronyms != "keep":
            toks = self._acronyms(toks)
        if self.lowercase:
            toks = [t.lower() for t in toks]
        if self.hyphens == "split":
            toks = [p for t in toks for p in (t.split("-") if _has_alnum(t) and not _is_fragment(t) else [t]) if p]
        if self.tags == "remove":
            toks = [t for t in toks if not _TAG_RE.match(t)]
        if self.fragments == "remove":
            toks = [t for t in toks if not (len(t) > 1 and (t.endswith("-") or t.startswith("-")) and _has_alnum(t))]
        if self.punctuation == "strip":
            toks = [_KEEP_CHARS.sub("", t.replace("_", " ")) for t in toks if _has_alnum(t)]
            toks = [p for t in toks for p in t.split()]
            toks = [t for t in toks if _has_alnum(t)]
        if self.contractions == "join":
            toks = self._join(toks)
        elif self.contractions == "split":
            toks = self._split(toks)
        elif self.contractions == "expand":
            toks = _expand(self._join(toks))
        if self.spelling == "american":
            table = _american()
            toks = [_respell(t, table) for t in toks]
        if self.fillers == "remove":
            toks = [t for t in toks if t.lower() not in self.filler_words]
        return tuple(toks)

    def text(self, text: str) -> str:
        """Normalise whitespace-separated text and return it joined by single spaces."""
        return " ".join(self(text.split()))

    def _acronyms(self, toks: list[str]) -> list[str]:
        out: list[str] = []
        for t in toks:
            parts = t.split("_")
            if len(parts) > 1 and all(len(p) == 1 and p.isalpha() for p in parts):
                joined = "".join(parts)
                key = joined.lower()
                if self.acronyms == "join" or (self.acronyms == "vocab" and self.vocabulary and key in self.vocabulary):
                    out.append(joined)
                else:
                    out.extend(parts)
            else:
                out.append(t)
        return out

    @staticmethod
    def _join(toks: list[str]) -> list[str]:
        out: list[str] = []
        for t in toks:
            low = t.lower()
            if out and (low in CLITICS or (low.startswith("'") and len(low) > 1 and low[1:].isalpha())):
                out[-1] = out[-1] + t  # "ca n't" -> "can't", "wo n't" -> "won't", "we 're" -> "we're"
            elif out and (out[-1].lower(), low) in _JOIN_PAIRS:
                out[-1] = out[-1] + t
            else:
                out.append(t)
        return out

    @staticmethod
    def _split(toks: Sequence[str]) -> list[str]:
        out: list[str] = []
        for t in toks:
            m = _SPLIT_RE.match(t)
            if m:  # Penn Treebank style: "can't" -> "ca n't", "we're" -> "we 're"
                out.extend([m.group(1), m.group(2)])
            else:
                out.append(t)
        return out
