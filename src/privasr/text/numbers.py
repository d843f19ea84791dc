"""Numbers written in digits, spelled out as people say them: what a neural recogniser writes ("1.4", "$12.50",
"21st", "50%", "1990") turned into the words a language model and a spoken reference use ("one point four",
"twelve dollars fifty cents", "twenty first", "fifty percent", "nineteen ninety").

The words come from ``num2words`` (cardinals, ordinals, years); this module finds the numbers in a token and
decides their reading:

* integers and decimals, with thousands separators (``1,000`` -> ``one thousand``; ``12.25`` -> ``twelve point
  two five``);
* currency before the amount, ``$ € £`` (``$12.50`` -> ``twelve dollars fifty cents``, ``€5`` -> ``five euros``);
* percentages (``50%`` -> ``fifty percent``);
* ordinals (``21st`` -> ``twenty first``);
* four-digit integers from 1100 to 2099 without separators read as years (``1990`` -> ``nineteen ninety``,
  ``2024`` -> ``twenty twenty four``, ``2000`` -> ``two thousand``);
* clock times (``10:30`` -> ``ten thirty``, ``9:05`` -> ``nine oh five``);
* digit strings with a leading zero, digit by digit (``007`` -> ``zero zero seven``).

Hyphens inside the words are spaces (``twenty-first`` -> ``twenty first``), as the CMU dictionary and the
AMI transcripts write them. Punctuation around a number stays around it; a token with digits and letters
(``mp3``, ``4k``) is left as it is.

>>> spell_numbers(["it", "costs", "$12.50,", "about", "1.4", "times", "the", "21st", "price"])
('it', 'costs', 'twelve', 'dollars', 'fifty', 'cents,', 'about', 'one', 'point', 'four', 'times', 'the', 'twenty', 'first', 'price')
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["spell_numbers", "spell_number_token"]

_EDGE = re.compile(r"^([\"'(\[]*)(.*?)([.,!?;:\"')\]]*)$")
_PLAIN = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
_CURRENCY = re.compile(r"^([$€£])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
_PERCENT = re.compile(r"^(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?%$")
_ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$", re.I)
_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_UNITS = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
          "£": ("pound", "pounds", "penny", "pence")}


def _n2w(value: int | float, **kw: str) -> str:
    from num2words import num2words  # a core dependency

    return str(num2words(value, lang="en", **kw))


def _words(text: str) -> list[str]:
    return text.replace("-", " ").replace(",", " ").split()


def _cardinal(integer: str, decimals: str | None = None) -> list[str]:
    out = _words(_n2w(int(integer.replace(",", ""))))
    if decimals:
        out += ["point", *(_words(_n2w(int(d)))[0] for d in decimals)]
    return out


def spell_number_token(token: str) -> list[str] | None:
    """The words of one token that is a number (see the module doc), its surrounding punctuation kept on the
    first and last word; ``None`` when the token is not one.

    >>> spell_number_token("(50%)")
    ['(fifty', 'percent)']
    >>> spell_number_token("1990"), spell_number_token("mp3"), spell_number_token("9:05")
    (['nineteen', 'ninety'], None, ['nine', 'oh', 'five'])
    """
    m = _EDGE.match(token)
    if m is None or not any(c.isdigit() for c in m.group(2)):
        return None
    lead, core, trail = m.groups()
    words = _spell(core)
    if words is None:
        return None
    words[0] = lead + words[0]
    words[-1] = words[-1] + trail
    return words


def _spell(core: str) -> list[str] | None:
    if m := _CURRENCY.match(core):
        sym, integer, dec = m.groups()
        one, many, cent, cents = _UNITS[sym]
        n = int(integer.replace(",", ""))
        out = [*_cardinal(integer), one if n == 1 else many]
        if dec and len(dec) == 2:
            c = int(dec)
            return out + ([*_cardinal(str(c)), cent if c == 1 else cents] if c else [])
        if dec:
            return [*_cardinal(integer, dec), many]
        return out
    if m := _PERCENT.match(core):
        return [*_cardinal(m.group(1), m.group(2)), "percent"]
    if m := _ORDINAL.match(core):
        return _words(_n2w(int(m.group(1)), to="ordinal"))
    if m := _TIME.match(core):
        h, mm = int(m.group(1)), int(m.group(2))
        minutes = [] if mm == 0 else (["oh", *_words(_n2w(mm))] if mm < 10 else _words(_n2w(mm)))
        return [*_words(_n2w(h)), *(minutes or ["o'clock"])]
    if m := _PLAIN.match(core):
        integer, dec = m.groups()
        if dec is None and "," not in integer and len(integer) == 4 and 1100 <= int(integer) <= 2099:
            return _words(_n2w(int(integer), to="year"))
        if dec is None and len(integer) > 1 and integer.startswith("0"):  # a code, read digit by digit
            return [_words(_n2w(int(d)))[0] for d in integer]
        return _cardinal(integer, dec)
    return None


def spell_numbers(tokens: Iterable[str]) -> tuple[str, ...]:
    """Every number token of ``tokens`` spelled out (:func:`spell_number_token`); other tokens unchanged."""
    out: list[str] = []
    for t in tokens:
        w = spell_number_token(t)
        out.extend(w if w is not None else [t])
    return tuple(out)
