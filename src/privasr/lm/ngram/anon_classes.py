"""The class n-gram of paper 003 (M2) from anonymised transcripts, and the weights of its eq. 2 interpolation.

A training turn's entity words (spans found by an entity detector) are marked, the turn is normalised like the
N-best references with the marks kept (:func:`normalise_marked`), and the turn is written in three forms
(:func:`build_turn_texts`, :class:`TurnTexts`): the original text, the **surrogate** text (each entity word
replaced by its same-category surrogate, the anonymised data) and the **tagged** text (each entity word replaced
by its class token ``<PER>`` ...: the class n-gram's training text). :func:`entity_class_map` takes the class
members and their maximum-likelihood probabilities ``P(w|c)`` from the words at entity positions
(:class:`~privasr.lm.ngram.classes.ClassMap`). :func:`eq2_weights` writes the weights of a linear word + class
(+ neural) mixture as eq. 2 does: ``(1-ln)(lw P_word + lc P_class) + ln P_neural``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from privasr.errors import InputError
from privasr.lm.ngram.classes import ClassMap

__all__ = ["normalise_marked", "TurnTexts", "build_turn_texts", "entity_class_map", "eq2_weights"]

_PLACEHOLDER = re.compile(r"^zqx(per|org|loc|misc)(\d+)zqx(.*)$")


def normalise_marked(words: Sequence[str], labels: Sequence[str | None],
                     normalizer: Any) -> list[tuple[str, int | None, str]]:
    """Normalise a raw turn whose entity words are marked, keeping track of the entity words.

    ``labels[i]`` is word ``i``'s entity category or ``None``. Marked words with a letter or digit become
    placeholders that the normaliser keeps as one token; the result lists ``(token, None, "")`` for plain
    tokens and ``("", i, suffix)`` for entity word ``i`` (``suffix``: a clitic the normaliser glued to it).

    >>> from privasr.text.normalize import Normalizer
    >>> normalise_marked(["Ask", "John", "'s", "team", "."], [None, "PER", None, None, None],
    ...                  Normalizer.preset("ami"))
    [('ask', None, ''), ('', 1, "'s"), ('team', None, '')]
    """
    if len(words) != len(labels):
        raise InputError(f"{len(words)} words but {len(labels)} labels", expected="one label per word")
    marked = [w if lab is None or not any(c.isalnum() for c in w) else f"zqx{lab.lower()}{i}zqx"
              for i, (w, lab) in enumerate(zip(words, labels, strict=True))]
    out: list[tuple[str, int | None, str]] = []
    for tok in normalizer(marked):
        m = _PLACEHOLDER.match(tok)
        if m:
            out.append(("", int(m.group(2)), m.group(3)))
        else:
            out.append((tok, None, ""))
    return out


@dataclass(frozen=True)
class TurnTexts:
    """One training turn in every form (normalised like the N-best references).

    Attributes:
        meeting: the meeting (the anonymiser's client).
        original: the plain normalisation.
        surrogate: entity words replaced by surrogates.
        tagged: entity words replaced by their class tokens (same length as ``surrogate``).
        labels: per token of ``surrogate``/``tagged``, the entity category or ``None``.
        original_members: per entity token, the original (normalised) word.
    """

    meeting: str
    original: tuple[str, ...]
    surrogate: tuple[str, ...]
    tagged: tuple[str, ...]
    labels: tuple[str | None, ...]
    original_members: tuple[str, ...]


def build_turn_texts(turns: Sequence[Any], spans: Sequence[Sequence[Any]], anonymizer: Any,
                     normalizer: Any) -> list[TurnTexts]:
    """Every turn (records with ``words`` and ``client``) in its original, surrogate and tagged forms.

    Turns that normalise to nothing are left out.

    >>> from privasr.anon.transform import Anonymizer, EntitySpan
    >>> from privasr.corpus.records import Transcript
    >>> from privasr.text.normalize import Normalizer
    >>> t = Transcript("m_A_0", ("Hello", "Zorblax", "Inc", "."), client="m")
    >>> tt = build_turn_texts([t], [[EntitySpan(1, 3, "ORG")]], Anonymizer(seed=0), Normalizer.preset("ami"))[0]
    >>> tt.original, tt.tagged, tt.original_members
    (('hello', 'zorblax', 'inc'), ('hello', '<ORG>', '<ORG>'), ('zorblax', 'inc'))
    >>> tt.surrogate[0] == "hello" and "zorblax" not in tt.surrogate and len(tt.surrogate) == 3
    True
    """
    from privasr.anon.transform import check_spans

    out = []
    for t, sp in zip(turns, spans, strict=True):
        words = tuple(t.words)
        labels: list[str | None] = [None] * len(words)
        for s in check_spans(words, sp):
            for i in range(s.start, s.end):
                labels[i] = s.label
        original = tuple(normalizer(words))
        if not original:
            continue
        client = t.client or ""
        sur: list[str] = []
        tag: list[str] = []
        labs: list[str | None] = []
        members: list[str] = []
        for tok, idx, suffix in normalise_marked(words, labels, normalizer):
            if idx is None:
                sur.append(tok)
                tag.append(tok)
                labs.append(None)
                continue
            lab = labels[idx]
            assert lab is not None
            sur.append(anonymizer.surrogate(words[idx], lab, client) + suffix)
            tag.append(f"<{lab}>")
            labs.append(lab)
            members.append("".join(normalizer([words[idx]])) + suffix or words[idx].lower())
        out.append(TurnTexts(client, original, tuple(sur), tuple(tag), tuple(labs), tuple(members)))
    return out


def entity_class_map(turns: Sequence[TurnTexts], which: str = "surrogate") -> Any:
    """The entity classes of M2 with maximum-likelihood member probabilities (a :class:`ClassMap` with ``p``).

    Members are the words at entity positions (``which="surrogate"``: the surrogates, i.e. the anonymised
    data; ``"original"``: the original entity words), each in the class it fills most often (ties: the first
    label alphabetically), left out when it occurs more often as a plain word. P(w|c) is w's share of the
    class's member occurrences at entity positions.

    >>> tt = TurnTexts("m", ("a",), ("bob", "may", "go"), ("<PER>", "<PER>", "go"), ("PER", "PER", None), ())
    >>> plain = TurnTexts("m", ("a",), ("may",) * 3, ("may",) * 3, (None,) * 3, ())
    >>> cm = entity_class_map([tt, tt, plain])
    >>> cm.members("<PER>"), cm.file_probs("<PER>")
    (('bob',), {'bob': 1.0})
    """
    if which not in ("surrogate", "original"):
        raise InputError(f"member source {which!r}", expected="'surrogate' or 'original'")
    ent: Counter[tuple[str, str]] = Counter()
    plain: Counter[str] = Counter()
    for t in turns:
        if which == "surrogate":
            ws = [w for w, lab in zip(t.surrogate, t.labels, strict=True) if lab is not None]
        else:
            ws = list(t.original_members)
        labs = [lab for lab in t.labels if lab is not None]
        for w, lab in zip(ws, labs, strict=True):
            ent[(w, lab)] += 1
        plain.update(w for w, lab in zip(t.tagged, t.labels, strict=True) if lab is None)
    per_word: dict[str, Counter[str]] = {}
    for (w, lab), n in ent.items():
        per_word.setdefault(w, Counter())[lab] += n
    members: dict[str, dict[str, int]] = {}
    for w in sorted(per_word):
        c = per_word[w]
        lab = sorted(c, key=lambda x: (-c[x], x))[0]
        if plain[w] > sum(c.values()):
            continue
        members.setdefault(f"<{lab}>", {})[w] = c[lab]
    exp = {}
    for cls in sorted(members):
        total = sum(members[cls].values())
        exp[cls] = tuple((w, n / total) for w, n in sorted(members[cls].items()))
    return ClassMap(exp)


def eq2_weights(components: Sequence[float]) -> dict[str, float]:
    """Mixture weights ``[a_word, a_class(, a_neural)]`` as paper 003's eq. 2: ``lw, lc`` (and ``ln``).

    >>> eq2_weights([0.18, 0.42, 0.4])
    {'lw': 0.3, 'lc': 0.7, 'ln': 0.4}
    """
    w = [float(x) for x in components]
    ln = w[2] if len(w) > 2 else 0.0
    s = w[0] + w[1]
    out = {"lw": round(w[0] / s, 12) if s > 0 else 0.5, "lc": round(w[1] / s, 12) if s > 0 else 0.5}
    if len(w) > 2:
        out["ln"] = round(ln, 12)
    return out
