"""Personal identifiers as a speech recogniser writes them: read-out e-mail and web addresses, numbers spoken
digit by digit, full dates, street addresses and post codes.

A recogniser writes ``john dot smith at example dot com``, never ``john.smith@example.com``; ``five five five
double one two three``, never ``555-1123``. :func:`spoken_identifiers` finds these in one lower-case token
sequence (ASR-style: no punctuation) and returns labelled spans, which :class:`~privasr.anon.ner.PatternDetector`
adds to its strong patterns. What is covered (every kind has an example in docs/anonymisation.md):

================  =====  ==================================================================================
kind              label  the rule
================  =====  ==================================================================================
``email``         MISC   1-4 words (``dot``, ``underscore``, ``dash`` between them) ``at`` a domain of
                         1-3 words joined by ``dot`` ending in a top-level domain word (``com``, ``org``,
                         ``co uk``, ...)
``url``           MISC   ``www`` / ``w w w`` / ``double u double u double u`` (optional) and a domain as above,
                         ``slash`` words after it; or ``http(s) colon slash slash`` and a domain
``digits``       MISC   7 or more digits spoken one by one (``zero`` or ``oh`` .. ``nine``, ``double`` /
                         ``triple`` repeating the next one, digit tokens such as ``555``), ``plus`` before them
                         allowed: phone, card, account and social-security numbers
``date``          MISC   a day, a month and a year (``the fifth of march nineteen eighty four``, ``march
                         fifth twenty twenty``, ``fifth march two thousand and one``); a day and a month
                         after a birth cue (``born on``, ``date of birth``, ``birthday is``)
``address``       LOC    a house number (digits or number words) and 1-3 words before a street word
                         (``street``, ``road``, ``avenue``, ``lane``, ...): ``twenty two baker street``
``postcode``      MISC   the 3-8 letters and digits after ``post code``, ``postcode`` or ``zip code``
================  =====  ==================================================================================

>>> ws = "mail me at john dot smith at example dot com or call five five five double one two three".split()
>>> [(s.kind, " ".join(ws[s.start:s.end])) for s in spoken_identifiers(ws)]
[('email', 'john dot smith at example dot com'), ('digits', 'five five five double one two three')]
>>> [s.kind for s in spoken_identifiers("we meet at three in the dot com building".split())]
[]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SpokenSpan", "spoken_identifiers", "KINDS", "SPELLED_DIGITS"]

KINDS = {"email": "MISC", "url": "MISC", "digits": "MISC", "date": "MISC", "address": "LOC", "postcode": "MISC"}
"""Each kind of spoken identifier and the entity label its spans get."""

SPELLED_DIGITS = frozenset({"zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"})
"""The words a digit is read as, one by one."""
TLDS = frozenset({"com", "org", "net", "edu", "gov", "io", "ai", "co", "uk", "us", "de", "fr", "info", "biz", "me",
                  "eu", "ca", "au", "in"})
_LOCAL_JOINERS = frozenset({"dot", "underscore", "dash", "hyphen"})
MONTHS = frozenset({"january", "february", "march", "april", "may", "june", "july", "august", "september",
                    "october", "november", "december"})
_UNITS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
          "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
CARDINALS = frozenset((*_UNITS, *_TEENS, *_TENS, "hundred", "thousand", "and", "oh", "zero"))
_ORDINAL_UNITS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")
ORDINALS = frozenset((*_ORDINAL_UNITS, "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth",
                      "sixteenth", "seventeenth", "eighteenth", "nineteenth", "twentieth", "thirtieth"))
STREET_WORDS = frozenset({"street", "road", "avenue", "lane", "drive", "close", "way", "boulevard", "place",
                          "court", "crescent", "terrace", "gardens", "square", "grove", "parkway", "highway", "st",
                          "rd", "ave"})
_BIRTH_CUES = (("born", "on"), ("born",), ("date", "of", "birth"), ("birthday",), ("dob",))
_POSTCODE_CUES = (("post", "code"), ("postcode",), ("zip", "code"), ("zipcode",), ("zip",))
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class SpokenSpan:
    """Tokens ``[start, end)`` are a spoken identifier of ``kind`` (:data:`KINDS`), labelled ``label``."""

    start: int
    end: int
    kind: str

    @property
    def label(self) -> str:
        """The entity label of the kind."""
        return KINDS[self.kind]


_FUNCTION_WORDS = frozenset({"the", "a", "an", "this", "that", "these", "those", "my", "our", "your", "their",
                             "his", "her", "its", "down", "up", "of", "on", "in", "to", "at", "by", "for", "and"})


def _word(w: str) -> bool:
    return w.isalnum() and w not in ("at", "dot")


def _domain(ws: Sequence[str], i: int) -> int:
    """The end of a domain ``label (dot label)+`` starting at ``i`` whose last label is a top-level domain word
    (``example dot co dot uk``; 2-5 labels), or ``i`` if there is none."""
    n = len(ws)
    if not (i < n and _word(ws[i])):
        return i
    j, labels, best = i + 1, 1, i
    while j + 1 < n and ws[j] == "dot" and _word(ws[j + 1]) and labels < 5:
        labels += 1
        j += 2
        if ws[j - 1] in TLDS:
            best = j
    return best


def _emails(ws: Sequence[str]) -> list[SpokenSpan]:
    out = []
    for k, w in enumerate(ws):
        if w != "at" or k == 0 or not _word(ws[k - 1]) or ws[k - 1] in _FUNCTION_WORDS:
            continue
        end = _domain(ws, k + 1)
        if end == k + 1:
            continue
        a, words = k - 1, 1  # the local part: up to 4 words joined by dot / underscore / dash
        while a >= 2 and ws[a - 1] in _LOCAL_JOINERS and _word(ws[a - 2]) and words < 4:
            a -= 2
            words += 1
        out.append(SpokenSpan(a, end, "email"))
    return out


def _urls(ws: Sequence[str]) -> list[SpokenSpan]:
    out = []
    n = len(ws)
    k = 0
    while k < n:
        j = k
        if ws[j] in ("http", "https") and ws[j + 1:j + 4] == ["colon", "slash", "slash"]:
            j += 4
        elif ws[j:j + 4] == ["h", "t", "t", "p"]:
            j += 5 if ws[j + 4:j + 5] == ["s"] else 4
            if ws[j:j + 3] != ["colon", "slash", "slash"]:
                k += 1
                continue
            j += 3
        prefix = (3 if ws[j:j + 3] == ["w", "w", "w"] else 6 if ws[j:j + 6] == ["double", "u"] * 3
                  else 1 if ws[j:j + 1] == ["www"] else 0)
        if prefix:
            if ws[j + prefix:j + prefix + 1] != ["dot"]:
                k += 1
                continue
            j += prefix + 1
        end = _domain(ws, j)
        if end > j and (j > k or ws[j] not in _FUNCTION_WORDS):
            while end + 1 < n and ws[end] == "slash" and _word(ws[end + 1]):
                end += 2
            out.append(SpokenSpan(k, end, "url"))
            k = end
        else:
            k += 1
    return out


def _digit_value(w: str) -> int:
    """How many digits a token says (0 if it is not a digit token)."""
    if w in SPELLED_DIGITS:
        return 1
    if w.isdigit() and len(w) <= 4:
        return len(w)
    return 0


def _digit_runs(ws: Sequence[str]) -> list[SpokenSpan]:
    out = []
    n = len(ws)
    i = 0
    while i < n:
        j, digits = i, 0
        if ws[j] == "plus":
            j += 1
        while j < n:
            if ws[j] in ("double", "triple") and j + 1 < n and _digit_value(ws[j + 1]) == 1:
                digits += 2 if ws[j] == "double" else 3
                j += 2
            elif _digit_value(ws[j]):
                digits += _digit_value(ws[j])
                j += 1
            else:
                break
        if digits >= 7 and j - i >= 3:
            out.append(SpokenSpan(i, j, "digits"))
            i = j
        else:
            i += 1
    return out


def _year_end(ws: Sequence[str], i: int) -> int:
    """The end of a spoken year at ``i`` (``nineteen eighty four``, ``two thousand and five``, ``twenty twenty``,
    ``nineteen oh five``, 4-digit tokens), or ``i``."""
    n = len(ws)
    if i < n and ws[i].isdigit() and len(ws[i]) == 4:
        return i + 1
    if i + 1 < n and ws[i] == "two" and ws[i + 1] == "thousand":
        j = i + 2
        if j < n and ws[j] == "and":
            j += 1
        if j < n and ws[j] in (*_UNITS, *_TEENS, *_TENS):
            j += 1
            if ws[j - 1] in _TENS and j < n and ws[j] in _UNITS:
                j += 1
        return j
    if i + 1 < n and ws[i] in (*_TEENS, "twenty") and (ws[i + 1] in _TENS or ws[i + 1] in _TEENS
                                                        or ws[i + 1] == "oh"):
        j = i + 2
        if ws[i + 1] == "oh" or ws[i + 1] in _TENS:
            if j < n and ws[j] in _UNITS:
                j += 1
        return j
    return i


def _day_end(ws: Sequence[str], i: int) -> int:
    """The end of a spoken day of the month at ``i`` (``fifth``, ``twenty first``, ``the third``, ``21st``,
    ``twelve``), or ``i``."""
    n = len(ws)
    j = i + 1 if i < n and ws[i] == "the" else i
    if j < n and ws[j] in ("twenty", "thirty") and j + 1 < n and ws[j + 1] in (*_ORDINAL_UNITS, *_UNITS):
        return j + 2
    if j < n and (ws[j] in ORDINALS or ws[j] in _UNITS or ws[j] in _TEENS or ws[j] in ("twenty", "thirty")):
        return j + 1
    if j < n and ws[j][:-2].isdigit() and ws[j][-2:] in ("st", "nd", "rd", "th") and len(ws[j]) <= 4:
        return j + 1
    return i


def _dates(ws: Sequence[str]) -> list[SpokenSpan]:
    """``[the] DAY [of] MONTH [YEAR]`` or ``MONTH [the] DAY [YEAR]``, with a year or after a birth cue."""
    out = []
    for k, w in enumerate(ws):
        if w not in MONTHS:
            continue
        cands = []
        before = k - 1 if k >= 1 and ws[k - 1] == "of" else k
        for a in range(max(0, before - 3), before):
            if _day_end(ws, a) == before:
                cands.append((a, k + 1))
                break
        d = _day_end(ws, k + 1)
        if d > k + 1:
            cands.append((k, d))
        for a, e in cands:
            y = _year_end(ws, e)
            if y > e or _birth_cue_before(ws, a):
                out.append(SpokenSpan(a, y, "date"))
                break
    return out


def _birth_cue_before(ws: Sequence[str], i: int) -> bool:
    """Whether a birth cue ends right before token ``i`` (an ``is`` or ``was`` between them allowed)."""
    if i > 0 and ws[i - 1] in ("is", "was"):
        i -= 1
    return any(i >= len(c) and tuple(ws[i - len(c):i]) == c for c in _BIRTH_CUES)


def _addresses(ws: Sequence[str]) -> list[SpokenSpan]:
    out = []
    for k, w in enumerate(ws):
        if w not in STREET_WORDS or k < 2:
            continue
        # 1-3 name words before the street word, then a house number before them
        for names in (1, 2, 3):
            a = k - names
            if a < 1 or not all(ws[x].isalpha() and ws[x] not in CARDINALS and ws[x] not in _FUNCTION_WORDS
                                for x in range(a, k)):
                continue
            b = a
            while b > 0 and (ws[b - 1] in CARDINALS or (ws[b - 1].isdigit() and len(ws[b - 1]) <= 5)) \
                    and ws[b - 1] != "and":
                b -= 1
            if b < a:
                out.append(SpokenSpan(b, k + 1, "address"))
                break
    return out


def _postcodes(ws: Sequence[str]) -> list[SpokenSpan]:
    out = []
    n = len(ws)
    for k in range(n):
        for cue in _POSTCODE_CUES:
            if tuple(ws[k:k + len(cue)]) != cue:
                continue
            a = j = k + len(cue)
            if j < n and ws[j] == "is":
                a = j = j + 1
            count = 0
            while j < n and count < 8 and (ws[j] in _LETTERS or ws[j] in SPELLED_DIGITS or ws[j] in ("double", "triple")
                                           or (ws[j].isalnum() and len(ws[j]) <= 4 and any(c.isdigit()
                                                                                             for c in ws[j]))):
                j += 1
                count += 1
            if count >= 3:
                out.append(SpokenSpan(a, j, "postcode"))
            break
    return out


def spoken_identifiers(words: Sequence[str]) -> list[SpokenSpan]:
    """The spoken identifiers of one sentence (lower-case ASR-style tokens; other casings are lower-cased
    here), non-overlapping (the longest first), in order."""
    ws = [w.lower() for w in words]
    found = [*_emails(ws), *_urls(ws), *_digit_runs(ws), *_dates(ws), *_addresses(ws), *_postcodes(ws)]
    kept: list[SpokenSpan] = []
    for s in sorted(found, key=lambda s: (-(s.end - s.start), s.start)):
        if all(s.end <= k.start or s.start >= k.end for k in kept):
            kept.append(s)
    return sorted(kept, key=lambda s: s.start)
