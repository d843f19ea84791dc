"""Class-based n-gram language models (paper 003, section 2.2) and their expansion into word ARPA files.

A class LM is an n-gram model over a mixed token stream where every word of a class (a :class:`ClassMap`, e.g.
named-entity classes ``<PER>``, ``<LOC>``) is replaced by its class token, plus a member distribution
P(w|c) per class::

    P(w | h) = P(c(w) | C(h)) P(w | c(w))     for a class member w
    P(w | h) = P(w | C(h))                    for any other word

where C(h) maps the history's member words to their classes. It is a proper distribution over its vocabulary
(the plain words of the class n-gram plus the members with P(w|c) > 0) when the class n-gram is normalised and
each member distribution sums to 1 (member probabilities are renormalised per class on construction; SRILM
uses a classes file's probabilities as given).

Training (:func:`train_class_lm`): map the text's member words to their class tokens (tokens that already are
class names, as in anonymised text, count as occurrences of the class), train a modified Kneser-Ney n-gram on
the mapped text (:func:`privasr.lm.ngram.mkn.train_mkn`), and estimate P(w|c):

- from the classes file, for classes whose every expansion line gives ``p`` (``member_probs="auto"``, the
  default, or ``"file"`` to require it);
- otherwise from the training counts of the members, add-``k`` smoothed: P(w|c) = (n(w) + k) / (n(c) + k |c|),
  with n(c) the count of the class's members in the text (the maximum-likelihood estimate of paper 003 when
  ``k = 0``, the default; members never seen then get probability 0 and are out of the vocabulary). A class
  with no counted member at all gets the uniform distribution.

**Expansion into a word ARPA** (:func:`expand_to_word_arpa`, for first-pass decoders that cannot compose a
class map): every class n-gram is replaced by all its member n-grams (each class token by each member with
P(w|c) > 0), with log10 p = class n-gram log10 p + log10 P(w|c) for a class token in the predicted position
(members in the history add nothing); then every backoff weight is recomputed so each history's distribution
sums to 1. What is exact: the expanded word model gives **exactly** the class LM's probability for every word
and every history over the class LM's vocabulary. Its explicit n-grams carry the class LM's probability by
construction, and, because the member distributions sum to 1, the recomputed backoff weight of every word
history equals the class backoff weight of its class history (numerator and denominator are sums over whole
classes), so backed-off probabilities agree too. What is not: (1) size: a class n-gram with classes c_1..c_n
becomes |c_1| ... |c_n| word n-grams, so expansion is for small classes (named entities), not for classes that
cover the vocabulary (``max_ngrams`` guards this); (2) the file stores 9 significant digits; (3) words outside the
class LM's vocabulary (including members with P(w|c) = 0 and literal class tokens in test text) are unknown to
both and scored as ``<unk>`` or -inf, the same way but not as class members.

>>> from privasr.lm.ngram.classes import ClassMap
>>> cm = ClassMap.from_members({"<PER>": ["alice", "bob"]})
>>> text = [["alice", "says", "hi"], ["bob", "says", "hi"], ["alice", "says", "bye"]]
>>> lm = train_class_lm(text, cm, order=2, discounts=[(0.5, 1.0, 1.5)] * 2)
>>> round(10 ** lm.logprob("bob", ["<s>"]) / 10 ** lm.logprob("alice", ["<s>"]), 6)
0.5
>>> abs(expand_to_word_arpa(lm).logprob("bob", ["<s>"]) - lm.logprob("bob", ["<s>"])) < 1e-9
True
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from privasr.errors import InputError
from privasr.lm.base import EOS, SentenceScore, perplexity_stats
from privasr.lm.ngram.classes import ClassMap, frequency_bin_classes
from privasr.lm.ngram.tables import NgramTables, recompute_backoffs

if TYPE_CHECKING:
    from privasr.corpus.textio import PathLike
    from privasr.lm.ngram.model import NgramModel

__all__ = ["ClassNgramModel", "train_class_lm", "member_distributions", "expand_to_word_arpa",
           "class_vs_word_ppl", "ClassVsWord", "normalise_ami_tokens"]

MemberProbs = Mapping[str, Mapping[str, float]]


def member_distributions(sentences: Iterable[Sequence[str]], classes: ClassMap, *, k: float = 0.0,
                         source: Literal["auto", "counts", "file"] = "auto") -> dict[str, dict[str, float]]:
    """P(w|c) for every class: from the classes file (``"file"``; ``"auto"`` where a class gives every ``p``)
    or from member counts in ``sentences`` with add-``k`` smoothing (module docstring). Each is normalised.

    >>> cm = ClassMap.from_members({"<D>": ["mon", "tue", "wed"]})
    >>> member_distributions([["mon", "mon", "tue"]], cm)
    {'<D>': {'mon': 0.6666666666666666, 'tue': 0.3333333333333333, 'wed': 0.0}}
    >>> member_distributions([["mon", "mon", "tue"]], cm, k=1.0)["<D>"]["wed"]
    0.16666666666666666
    """
    if not (math.isfinite(k) and k >= 0):
        raise InputError(f"add-k constant {k!r}", expected="a finite number >= 0")
    if source not in ("auto", "counts", "file"):
        raise InputError(f"member probability source {source!r}", expected="'auto', 'counts' or 'file'")
    counts: Counter[str] = Counter()
    for s in sentences:
        counts.update(w for w in s if w in classes)
    out: dict[str, dict[str, float]] = {}
    for c in classes.classes:
        fp = classes.file_probs(c) if source != "counts" else None
        if source == "file" and fp is None:
            raise InputError(f"class {c!r} has expansions without a probability",
                             expected="'class p word' on every line (or member_probs='counts')")
        members = classes.members(c)
        if fp is not None:
            raw = [fp[w] for w in members]
        else:
            raw = [counts[w] + k for w in members]
        total = math.fsum(raw)
        if total <= 0:
            raw, total = [1.0] * len(members), float(len(members))
        out[c] = {w: r / total for w, r in zip(members, raw, strict=True)}
    return out


class ClassNgramModel:
    """A class n-gram LM (implements :class:`~privasr.lm.base.LanguageModel`; see the module docstring).

    Args:
        class_lm: the n-gram model over the class-mapped token stream.
        classes: the class map.
        member_probs: ``{class: {member: P(w|c)}}``; renormalised per class, members with 0 left out of the
            vocabulary. Classes without an entry get the uniform distribution.

    Raises:
        InputError: a class member is also a plain word of ``class_lm`` (it could never be predicted as one).

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> lm = synthetic_model(2, ["hi", "<PER>"], seed=0)
    >>> m = ClassNgramModel(lm, ClassMap.from_members({"<PER>": ["ann", "bo"]}), {"<PER>": {"ann": 3, "bo": 1}})
    >>> m.vocab
    ('<s>', '</s>', '<unk>', 'hi', 'ann', 'bo')
    >>> round(m.logprob("ann", ["hi"]) - lm.logprob("<PER>", ["hi"]), 6) == round(math.log10(0.75), 6)
    True
    >>> round(float((10 ** m.distribution(["ann"])).sum()), 12)
    1.0
    """

    def __init__(self, class_lm: NgramModel, classes: ClassMap, member_probs: MemberProbs | None = None) -> None:
        self.class_lm = class_lm
        self.classes = classes
        self._t = NgramTables.from_model(class_lm)
        lm_vocab = self._t.vocab
        both = [w for w in lm_vocab if w in classes]
        if both:
            raise InputError(f"{both[0]!r} is a class member and also a word of the class n-gram",
                             expected="class members replaced by their class in the class LM's text")
        probs: dict[str, dict[str, float]] = {}
        for c in classes.classes:
            given = (member_probs or {}).get(c)
            members = classes.members(c)
            raw = [float(given.get(w, 0.0)) if given is not None else 1.0 for w in members]
            if any(not math.isfinite(r) or r < 0 for r in raw):
                raise InputError(f"class {c!r} has a member probability that is not >= 0",
                                 expected="probabilities >= 0")
            total = math.fsum(raw)
            if total <= 0:
                if c in self._t.wid:
                    raise InputError(f"class {c!r} has no member with probability > 0",
                                     expected="a member distribution for every class of the n-gram")
                continue
            probs[c] = {w: r / total for w, r in zip(members, raw, strict=True) if r > 0}
        self.member_probs: dict[str, dict[str, float]] = probs
        # vocabulary: plain words of the class LM (class tokens excluded), then the members, in LM order
        vocab: list[str] = []
        lm_id: list[int] = []
        add: list[float] = []
        self._map: dict[str, str] = {}
        for i, tok in enumerate(lm_vocab):
            if classes.is_class(tok):
                for w, p in probs.get(tok, {}).items():
                    vocab.append(w)
                    lm_id.append(i)
                    add.append(math.log10(p))
                    self._map[w] = tok
            else:
                vocab.append(tok)
                lm_id.append(i)
                add.append(0.0)
        self._vocab = tuple(vocab)
        self._wid = {w: j for j, w in enumerate(vocab)}
        self._lm_id = np.array(lm_id, dtype=np.int64)
        self._add = np.array(add, dtype=np.float64)
        self._member_lp = {w: a for w, a in zip(vocab, add, strict=True) if w in self._map}

    @property
    def order(self) -> int:
        """The class n-gram's order."""
        return self._t.order

    @property
    def vocab(self) -> tuple[str, ...]:
        """The words of the model: the class LM's plain words (``<s>``, ``</s>``, ``<unk>`` included, class tokens
        not) and the members with P(w|c) > 0, each class's members where the class token was."""
        return self._vocab

    def __contains__(self, word: object) -> bool:
        return word in self._wid

    def map_words(self, words: Sequence[str]) -> list[str]:
        """The class-LM tokens for ``words`` (in-vocabulary members become their class; others unchanged)."""
        m = self._map
        return [m.get(w, w) for w in words]

    def member_logprob(self, word: str) -> float:
        """log10 P(word | its class), 0.0 for plain words, -inf for words outside the vocabulary."""
        if word in self._member_lp:
            return self._member_lp[word]
        return 0.0 if word in self._wid else -math.inf

    def logprob(self, word: str, history: Sequence[str]) -> float:
        """log10 P(word | history) (OOV words scored by the class n-gram as ``<unk>``, or -inf)."""
        lp = self.class_lm.logprob(self._map.get(word, word), self.map_words(history))
        return lp + self._member_lp.get(word, 0.0)

    def distribution(self, history: Sequence[str]) -> np.ndarray:
        """log10 P(w | history) for every word of :attr:`vocab` (``<s>``: -inf), vectorised."""
        dist = self._t.distribution(self.map_words(history))
        return dist[self._lm_id] + self._add

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence (conventions of :mod:`privasr.lm.base`)."""
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences: the class n-gram scores the mapped tokens, members add log10 P(w|c)."""
        mapped = [self.map_words(s) for s in sentences]
        scores = self.class_lm.score_batch(mapped, bos=bos, eos=eos)
        out = []
        for s, sc in zip(sentences, scores, strict=True):
            toks = (*s, EOS) if eos else tuple(s)
            add = np.fromiter((self._member_lp.get(w, 0.0) for w in toks), dtype=np.float64, count=len(toks))
            oov = np.fromiter((w not in self._wid for w in toks), dtype=bool, count=len(toks))
            out.append(SentenceScore(tuple(toks), sc.logprobs + add, oov))
        return out


def train_class_lm(sentences: Iterable[Sequence[str]], classes: ClassMap, order: int = 3, *,
                   member_probs: Literal["auto", "counts", "file"] = "auto", k: float = 0.0,
                   **mkn_options: Any) -> ClassNgramModel:
    """Train a class n-gram: map members to classes, train MKN on the mapped text, estimate P(w|c).

    ``mkn_options`` go to :func:`privasr.lm.ngram.mkn.estimate_mkn` (e.g. ``discounts``, ``discount_fallback``,
    ``prune``). See the module docstring for P(w|c).

    >>> cm = ClassMap.from_members({"<D>": ["mon", "tue"]})
    >>> lm = train_class_lm([["on", "mon"], ["on", "tue"], ["on", "mon"]], cm, 2, discounts=[(0.5, 1.0, 1.5)] * 2)
    >>> lm.class_lm.vocab, round(10 ** lm.member_logprob("mon"), 6)
    (('<unk>', '<s>', '</s>', 'on', '<D>'), 0.666667)
    """
    from privasr.lm.ngram.mkn import estimate_mkn

    sents = [tuple(s) for s in sentences]
    mapped = [list(classes.map_words(s)) for s in sents]
    class_lm = estimate_mkn(mapped, order, **mkn_options).model
    probs = member_distributions(sents, classes, k=k, source=member_probs)
    return ClassNgramModel(class_lm, classes, probs)


def expand_to_word_arpa(model: ClassNgramModel, *, max_ngrams: int = 20_000_000,
                        top_members: int | None = None) -> NgramModel:
    """Expand a class LM into a plain word backoff model (exact over the class LM's vocabulary; module docstring).

    ``top_members`` keeps only each class's ``top_members`` most probable members (ties by word), their
    P(w|c) renormalised over the kept ones: an approximation of the class LM (the other members become
    unknown words) whose size grows with ``top_members ** (classes per n-gram)`` instead of the full class
    sizes, for first-pass decoders that cannot take the exact expansion.

    Raises:
        InputError: the expansion would have more than ``max_ngrams`` n-grams.

    >>> from privasr.lm.ngram.tables import synthetic_model
    >>> lm = synthetic_model(2, ["hi", "<PER>"], seed=0)
    >>> m = ClassNgramModel(lm, ClassMap.from_members({"<PER>": ["ann", "bo"]}))
    >>> w = expand_to_word_arpa(m)
    >>> w.vocab, abs(w.logprob("bo", ["ann"]) - m.logprob("bo", ["ann"])) < 1e-12
    (('<s>', '</s>', '<unk>', 'hi', 'ann', 'bo'), True)
    """
    t = model._t
    members: dict[int, list[tuple[str, float]]] = {}
    if top_members is not None and (isinstance(top_members, bool) or not isinstance(top_members, int)
                                    or top_members < 1):
        raise InputError(f"top_members is {top_members!r}", expected="an integer >= 1 or None")
    for i, tok in enumerate(t.vocab):
        if model.classes.is_class(tok):
            probs = [(w, p) for w, p in model.member_probs.get(tok, {}).items() if p > 0]
            if top_members is not None and len(probs) > top_members:
                probs = sorted(probs, key=lambda wp: (-wp[1], wp[0]))[:top_members]
                z = sum(p for _, p in probs)
                probs = [(w, p / z) for w, p in probs]
            members[i] = [(w, math.log10(p)) for w, p in probs]
    sizes = np.array([len(members.get(i, [(None, 0.0)])) for i in range(len(t.vocab))], dtype=np.float64)
    total = 0.0
    for n in range(1, t.order + 1):
        if t.num_ngrams(n):
            keys = np.array(t.keys[n], dtype=np.int64).reshape(-1, n)
            total += float(np.prod(sizes[keys], axis=1).sum())
    if total > max_ngrams:
        raise InputError(f"the expanded model would have {int(total):,} n-grams (more than {max_ngrams:,})",
                         expected="smaller classes, or a larger max_ngrams")
    entries: dict[int, dict[tuple[str, ...], tuple[float, float]]] = {}
    for n in range(1, t.order + 1):
        ent: dict[tuple[str, ...], tuple[float, float]] = {}
        for key, lp, bo in zip(t.keys[n], t.lp[n].tolist(), t.bo[n].tolist(), strict=True):
            options = [members.get(i, [(t.vocab[i], 0.0)]) for i in key]
            for combo in itertools.product(*options):
                words = tuple(w for w, _ in combo)
                ent[words] = (lp + combo[-1][1], bo)
        entries[n] = ent
    tables = NgramTables.from_entries(t.order, entries)
    bo = recompute_backoffs(tables, tables.lp)
    return tables.to_model(bo=bo)


# =============================================================================================== experiment
def normalise_ami_tokens(words: Sequence[str]) -> list[str]:
    """The AMI normalisation of the golden KenLM corpus (``shared/golden/kenlm-mkn/README.md``).

    Lower-case, drop punctuation-only tokens, re-attach tokens starting with ``'`` and ``n't`` to the previous one.

    >>> normalise_ami_tokens(["We", "'re", "ca", "n't", ",", "OK", "."])
    ["we're", "can't", 'ok']
    """
    toks = [w.lower() for w in words]
    toks = [t for t in toks if any(ch.isalnum() for ch in t)]
    out: list[str] = []
    for t in toks:
        if out and (t.startswith("'") or t == "n't"):
            out[-1] += t
        else:
            out.append(t)
    return out


@dataclass(frozen=True)
class ClassVsWord:
    """Perplexities of a word n-gram and a frequency-binned class n-gram on the same test text.

    ``ppl`` counts ``</s>`` and leaves OOVs out (SRILM); both models share the training vocabulary, so they
    have the same OOVs.
    """

    order: int
    n_classes: int
    word_ppl: float
    class_ppl: float
    test_sentences: int
    test_words: int
    oovs: int


def class_vs_word_ppl(train_text: PathLike | Sequence[Sequence[str]], test_text: PathLike | Sequence[Sequence[str]],
                      n_classes: int, order: int = 3, **mkn_options: Any) -> ClassVsWord:
    """Train a word MKN n-gram and a class MKN n-gram (frequency-binned classes of the training words, P(w|c) by
    maximum likelihood) on ``train_text`` and compute both perplexities on ``test_text``.

    Texts are files (one sentence per line, whitespace-tokenised, ``.xz``/``.gz`` allowed) or token lists;
    ``mkn_options`` go to both MKN estimations. The class LM is estimated with lmplz's ``--discount_fallback``
    discounts (0.5, 1, 1.5) for orders whose discounts cannot be estimated: with few classes, no class unigram
    has a continuation count of 1 or 2, and lmplz itself would stop there.

    >>> train = [["a", "b", "c"], ["b", "c"], ["a", "c", "b"]] * 5
    >>> r = class_vs_word_ppl(train, [["a", "c"]], 2, order=2, discounts=[(0.5, 1.0, 1.5)] * 2)
    >>> r.n_classes, r.word_ppl < r.class_ppl
    (2, True)
    """
    from privasr.lm.ngram.mkn import train_mkn

    train = _read_sentences(train_text)
    test = _read_sentences(test_text)
    counts: Counter[str] = Counter()
    for s in train:
        counts.update(s)
    word_lm = train_mkn(train, order, **mkn_options)
    classes = frequency_bin_classes(counts, n_classes)
    class_options = {"discount_fallback": (0.5, 1.0, 1.5), **mkn_options}
    class_lm = train_class_lm(train, classes, order, **class_options)
    ws = perplexity_stats(word_lm.score_batch(test))
    cs = perplexity_stats(class_lm.score_batch(test))
    return ClassVsWord(order, len(classes.classes), ws.ppl, cs.ppl, ws.sentences, ws.words, ws.oovs)


def _read_sentences(text: PathLike | Sequence[Sequence[str]]) -> list[list[str]]:
    if isinstance(text, str) or hasattr(text, "__fspath__"):
        from privasr.corpus.textio import iter_lines

        return [line.split() for _, line in iter_lines(text) if line.split()]  # type: ignore[arg-type]
    return [list(s) for s in text]  # type: ignore[union-attr]

