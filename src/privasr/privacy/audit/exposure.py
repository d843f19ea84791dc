"""Canary exposure (Carlini et al. 2019, "The Secret Sharer"): how much a model has memorised a planted secret.

A *canary* is a random sentence of a fixed format (:class:`CanaryFormat`), e.g. ``"my pin is {} {} {} {} {}
{}"`` with each slot one of the ten digit words: the *randomness space* ``R`` holds ``10^6`` such sentences. After
training on text that contains the canary, the model scores every sentence (log-perplexity: lower = more
likely). The canary's *rank* is its position when ``R`` is sorted by score (1 = most likely), and

    exposure = log2 |R| - log2 rank,

between 0 (the canary is the least likely sentence) and ``log2 |R|`` (it is the most likely one). A canary the
model never saw has a rank uniform on ``1..|R|``: a median exposure of 1 bit (a mean of ``log2 e ~ 1.44``
bits); a memorised one approaches ``log2 |R|``.

Scoring all of ``R`` is rarely affordable, so the rank is estimated from ``n`` random candidates of ``R``
(:meth:`CanaryFormat.random_candidates`, other than the canaries):

* :func:`exposure` -- the canary's place among the ``n + 1`` sentences (the candidates and itself) scaled to
  ``R``: ``rank_est = |R| (1 + c) / (n + 1)``, ``c`` the number of candidates scoring *at most* the canary's
  score (ties count against the canary, so exposure is never overstated). Then ``exposure = log2 (n + 1) -
  log2 (1 + c)``: a sample of ``n`` resolves at most ``log2 (n + 1)`` bits, reached when the canary beats
  every candidate; with ``n = |R| - 1`` (all of ``R``) it is the exact exposure.
* :func:`extrapolated_exposure` -- Carlini et al.'s extrapolation beyond the sample: fit a skew-normal
  distribution to the candidates' scores and read ``exposure = -log2 CDF(canary score)`` (the fraction of
  ``R`` estimated to score below the canary), capped at ``log2 |R|``. It measures past ``log2 (n + 1)`` bits
  but rests on the fitted shape of the tail.

>>> import numpy as np
>>> fmt = CanaryFormat("my pin is {} {} {} {}")
>>> fmt.slots, fmt.size
(4, 10000)
>>> rng = np.random.default_rng(0)
>>> canaries = fmt.sample(rng, 3)
>>> candidates = fmt.random_candidates(rng, 999, exclude=canaries)
>>> len(candidates), set(candidates) & set(canaries)
(999, set())
>>> exposure(1.0, [2.0] * 999, fmt.size)     # below all 999 candidates: log2(1000) bits, the most measurable
9.965784284662087
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from privasr.errors import ConfigError, InputError

__all__ = ["DIGIT_WORDS", "CanaryFormat", "exposure", "estimated_rank", "extrapolated_exposure"]

DIGIT_WORDS: tuple[str, ...] = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
"""The default slot alphabet: the ten digit words (the words an ASR transcript has for spoken digits)."""

_INT64_LIMIT = 2**63 - 1


@dataclass(frozen=True)
class CanaryFormat:
    """A canary template with ``{}`` slots, each filled with a word of ``alphabet``.

    Args:
        template: text with at least one ``{}`` slot and no other replacement fields (``{{`` and ``}}`` are
            literal braces).
        alphabet: the words a slot can take: at least 2, distinct, non-empty (default :data:`DIGIT_WORDS`).

    Raises:
        ConfigError: a template without slots or with named/numbered/formatted fields, or a bad alphabet.

    >>> fmt = CanaryFormat("call {} {}", alphabet=("a", "b", "c"))
    >>> fmt.size, fmt.render([2, 0])
    (9, 'call c a')
    """

    template: str
    alphabet: tuple[str, ...] = DIGIT_WORDS

    def __post_init__(self) -> None:
        if not isinstance(self.template, str):
            raise ConfigError(f"canary template must be a string, got {type(self.template).__name__}")
        try:
            fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(self.template)
                      if f is not None]
        except ValueError as e:
            raise ConfigError(f"canary template {self.template!r} is not a valid format string ({e})",
                              expected="text with '{}' slots; '{{' and '}}' for literal braces") from None
        odd = [f"{{{f}{'!' + c if c else ''}{':' + s if s else ''}}}" for f, s, c in fields if f or s or c]
        if odd:
            raise ConfigError(f"canary template {self.template!r} has fields other than plain '{{}}' slots: {odd}",
                              expected="only '{}' slots")
        if not fields:
            raise ConfigError(f"canary template {self.template!r} has no '{{}}' slot",
                              expected="at least one '{}' slot, e.g. 'my pin is {} {} {} {}'")
        if isinstance(self.alphabet, str) or not isinstance(self.alphabet, Iterable):
            raise ConfigError(f"canary alphabet must be a list of words, got {self.alphabet!r}")
        alphabet = tuple(self.alphabet)
        bad = [w for w in alphabet if not isinstance(w, str) or not w]
        if bad or len(alphabet) < 2 or len(set(alphabet)) != len(alphabet):
            raise ConfigError(f"canary alphabet {list(alphabet)!r} is not at least 2 distinct non-empty words")
        object.__setattr__(self, "alphabet", alphabet)

    @property
    def slots(self) -> int:
        """The number of ``{}`` slots.

        >>> CanaryFormat("{} and {}").slots
        2
        """
        return sum(1 for _, f, _, _ in string.Formatter().parse(self.template) if f is not None)

    @property
    def size(self) -> int:
        """``|R| = len(alphabet) ** slots``, the number of possible canaries (a Python int, exact).

        >>> CanaryFormat("my pin is {} {} {} {} {} {}").size
        1000000
        """
        return len(self.alphabet) ** self.slots

    def render(self, choice: Sequence[int]) -> str:
        """The canary whose slot ``i`` is ``alphabet[choice[i]]``.

        Raises:
            ConfigError: not one index per slot, or an index outside the alphabet.

        >>> CanaryFormat("pin {} {}").render([4, 2])
        'pin four two'
        """
        idx = list(choice)
        if len(idx) != self.slots or not all(isinstance(i, int | np.integer) and 0 <= i < len(self.alphabet)
                                             for i in idx):
            raise ConfigError(f"choice {idx!r} does not pick one word per slot",
                              expected=f"{self.slots} indices in [0, {len(self.alphabet)})")
        return self.template.format(*(self.alphabet[int(i)] for i in idx))

    def __contains__(self, text: object) -> bool:
        """Whether ``text`` is one of the canaries of ``R``.

        >>> fmt = CanaryFormat("pin {} {}")
        >>> "pin one two" in fmt, "pin one ten" in fmt
        (True, False)
        """
        if not isinstance(text, str):
            return False
        word = "(?:" + "|".join(re.escape(w) for w in sorted(self.alphabet, key=len, reverse=True)) + ")"
        pattern = "".join(re.escape(lit) + (word if f is not None else "")
                          for lit, f, _, _ in string.Formatter().parse(self.template))
        return re.fullmatch(pattern, text) is not None

    def _draw(self, rng: np.random.Generator, n: int, exclude: frozenset[str]) -> list[str]:
        """``n`` distinct canaries not in ``exclude``, uniformly at random (a random subset, in random order)."""
        if not isinstance(rng, np.random.Generator):
            raise ConfigError(f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed)), "
                              f"got {type(rng).__name__}")
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise ConfigError(f"the number of canaries must be an integer >= 0, got {n!r}")
        n = int(n)
        if n > self.size - len(exclude):
            raise ConfigError(f"cannot draw {n} distinct canaries from {self.size} possible ones "
                              f"({len(exclude)} excluded) of {self.template!r}",
                              expected="fewer canaries, or more slots or words")
        a, k = len(self.alphabet), self.slots
        out: list[str] = []
        seen: set[str] = set(exclude)
        if self.size <= _INT64_LIMIT:
            # a uniform random subset of n + |exclude| indices; dropping the excluded ones leaves a uniform one
            idx = rng.choice(self.size, size=min(self.size, n + len(exclude)), replace=False, shuffle=True)
            powers = np.array([a ** (k - 1 - j) for j in range(k)], dtype=np.int64)
            digits = (idx[:, None] // powers[None, :]) % a
            for row in digits:
                text = self.template.format(*(self.alphabet[i] for i in row.tolist()))
                if text not in seen:
                    out.append(text)
                    seen.add(text)
                if len(out) == n:
                    break
            if len(out) < n:
                raise ConfigError(f"canary template {self.template!r} with alphabet {list(self.alphabet)!r} writes "
                                  "different slot choices as the same text, so its canaries are not all distinct",
                                  expected="words that cannot run into each other, e.g. slots separated by spaces")
            return out
        while len(out) < n:  # a space beyond int64: draws with replacement, repeats dropped (rare at this size)
            for row in rng.integers(0, a, size=(n - len(out), k)):
                text = self.template.format(*(self.alphabet[i] for i in row.tolist()))
                if text not in seen:
                    out.append(text)
                    seen.add(text)
        return out

    def sample(self, rng: np.random.Generator, n: int) -> list[str]:
        """``n`` distinct canaries drawn uniformly at random from ``R``.

        Raises:
            ConfigError: ``n`` larger than ``|R|``, negative, ``rng`` not a numpy Generator, or a format that
                writes different choices as the same text (e.g. words ``"a"`` and ``"aa"`` in ``"{}{}"``).

        >>> import numpy as np
        >>> CanaryFormat("pin {} {}").sample(np.random.default_rng(0), 3)
        ['pin six three', 'pin five one', 'pin eight three']
        """
        return self._draw(rng, n, frozenset())

    def random_candidates(self, rng: np.random.Generator, n: int, exclude: Iterable[str] = ()) -> list[str]:
        """``n`` distinct sentences of ``R`` drawn uniformly at random, none of them in ``exclude``.

        The reference sample against which :func:`exposure` ranks a canary: ``exclude`` holds the canaries
        that were planted (a candidate must be a sentence the model was not trained on); strings in it that are
        not canaries of this format are ignored.

        Raises:
            ConfigError: not enough sentences outside ``exclude``, ``n`` negative, or a bad ``rng``.

        >>> import numpy as np
        >>> fmt = CanaryFormat("{}", alphabet=("a", "b", "c"))
        >>> sorted(fmt.random_candidates(np.random.default_rng(0), 2, exclude=["b"]))
        ['a', 'c']
        """
        if isinstance(exclude, str):
            exclude = [exclude]
        return self._draw(rng, n, frozenset(e for e in exclude if e in self))


# ------------------------------------------------------------------------------------------------ exposure


def _score_array(name: str, values: Any, *, one_d: bool) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise InputError(f"{name} are not numbers ({e})", expected="log-perplexities (finite floats)") from None
    if one_d and arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.ndim > 1:
        raise InputError(f"{name} must be a number or a 1-D array, got shape {arr.shape}")
    if arr.size == 0:
        raise InputError(f"{name} is empty", expected="at least one score")
    bad = np.flatnonzero(~np.isfinite(arr.ravel()))
    if bad.size:
        where = f"[{bad[0]}]" if arr.ndim else ""
        raise InputError(f"{name}{where} is {arr.ravel()[bad[0]]} ({bad.size} non-finite)",
                         expected="finite log-perplexities")
    return arr


def _space(space_size: Any, n: int) -> int:
    if isinstance(space_size, bool) or not isinstance(space_size, int | np.integer) or space_size < 2:
        raise ConfigError(f"space_size must be an integer >= 2 (|R|, e.g. CanaryFormat.size), got {space_size!r}")
    if n > space_size - 1:
        raise InputError(f"{n} candidates, but a space of {space_size} holds only {space_size - 1} besides the canary",
                         expected="distinct candidates other than the canary")
    return int(space_size)


def _ahead(canary_score: Any, candidate_scores: Any) -> tuple[np.ndarray, int]:
    """The number of candidates scoring at most each canary score, and the number of candidates."""
    cand = np.sort(_score_array("candidate_scores", candidate_scores, one_d=True))
    canary = _score_array("canary_score", canary_score, one_d=False)
    return np.searchsorted(cand, canary, side="right"), cand.size


def estimated_rank(canary_score: Any, candidate_scores: Any, space_size: int) -> np.ndarray | float:
    """The canary's estimated rank in ``R``: ``|R| (1 + c) / (n + 1)``, ``c`` candidates scoring at most it.

    ``canary_score`` may be one score or a 1-D array of them (one rank each).

    >>> estimated_rank(5.0, [1.0, 2.0, 6.0, 7.0], space_size=100)   # 2 of 4 candidates ahead
    60.0
    >>> estimated_rank([0.0, 9.0], [1.0, 2.0, 6.0, 7.0], space_size=100)
    array([ 20., 100.])
    """
    c, n = _ahead(canary_score, candidate_scores)
    size = _space(space_size, n)
    rank = size * (1.0 + c) / (n + 1.0)
    return rank if rank.ndim else float(rank)


def exposure(canary_score: Any, candidate_scores: Any, space_size: int) -> np.ndarray | float:
    """Exposure ``log2 |R| - log2 rank_est`` of a canary, from the scores of ``n`` random candidates.

    Scores are log-perplexities (lower = more likely). ``rank_est = |R| (1 + c) / (n + 1)``, ``c`` the number of
    candidates scoring at most the canary (see :func:`estimated_rank`), so exposure ``= log2 (n + 1) - log2 (1 +
    c)``: 0 when every candidate scores at most the canary, ``log2 (n + 1)`` -- the most ``n`` candidates can
    measure -- when the canary scores below them all, and about 1 bit for a canary in the middle. Candidates
    must be distinct sentences of ``R`` other than the canary (``n <= |R| - 1``); with all of them the value
    is the exact exposure. ``canary_score`` may be one score or a 1-D array (one exposure each).

    Raises:
        InputError: empty or non-finite scores, more candidates than ``R`` holds.
        ConfigError: ``space_size`` not an integer >= 2.

    >>> exposure(0.5, [1.0, 2.0, 3.0], space_size=4)     # the most likely of all 4 sentences: log2(4) bits
    2.0
    >>> round(exposure(2.5, [1.0, 2.0, 3.0, 4.0], space_size=10**6), 4)   # the middle of 5: log2(5 / 3)
    0.737
    """
    c, n = _ahead(canary_score, candidate_scores)
    _space(space_size, n)
    bits = math.log2(n + 1) - np.log2(1.0 + c)
    return bits if bits.ndim else float(bits)


def extrapolated_exposure(canary_score: Any, candidate_scores: Any, space_size: int) -> np.ndarray | float:
    """Exposure by Carlini et al.'s extrapolation: ``-log2 CDF(canary score)`` under a skew-normal fit.

    The candidates' scores are fitted with :data:`scipy.stats.skewnorm` (maximum likelihood); the fitted CDF
    at the canary's score estimates the fraction of ``R`` that scores below it, i.e. ``rank / |R|``. The result
    is capped at ``log2 |R|`` (the exposure of the most likely sentence) and floored at 0. It can exceed the
    ``log2 (n + 1)`` bits that :func:`exposure` can measure from ``n`` candidates, at the price of assuming
    the fitted shape holds in the tail.

    Raises:
        InputError: fewer than 3 distinct candidate scores, non-finite scores.
        ConfigError: ``space_size`` not an integer >= 2.

    >>> import numpy as np
    >>> cand = np.random.default_rng(0).normal(100.0, 10.0, size=2000)
    >>> round(extrapolated_exposure(100.0, cand, space_size=10**6), 1)    # the median: 1 bit
    1.0
    >>> round(extrapolated_exposure(50.0, cand, space_size=10**6), 1)     # 5 sd below: beyond log2(2001) = 11
    19.9
    """
    cand = _score_array("candidate_scores", candidate_scores, one_d=True)
    canary = _score_array("canary_score", canary_score, one_d=False)
    size = _space(space_size, cand.size)
    if np.unique(cand).size < 3:
        raise InputError(f"candidate_scores have {np.unique(cand).size} distinct value(s); a skew-normal fit "
                         "needs at least 3", expected="scores of many random candidates")
    shape, loc, scale = stats.skewnorm.fit(cand)
    bits = -stats.skewnorm.logcdf(canary, shape, loc=loc, scale=scale) / math.log(2.0)
    bits = np.clip(bits, 0.0, math.log2(size))
    return bits if bits.ndim else float(bits)
