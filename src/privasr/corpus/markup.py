"""sclite's transcript markup: alternations ``{ a / b / @ }``, the null word ``@``, optionally deletable ``(word)``.

The syntax of SCTK's trn documentation (``ALTERNATE :== "{" TEXT ("/" TEXT)+ "}"``, ``TEXT :== words | "@" |
ALTERNATE``), read by the trn reader where transcripts are scored (:func:`privasr.corpus.formats.trn.reading_markup`)
and aligned by :mod:`privasr.metrics.sclite`. Parsing, checking, counting and word-mapping live here, with the
formats; what the markup means for an alignment lives with the alignment.

>>> parse_markup("i've { um / uh / @ } as far".split())
("i've", (('um',), ('uh',), ('@',)), 'as', 'far')
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from privasr.errors import InputError

__all__ = ["NULL_WORD", "Item", "has_markup", "markup_tokens", "parse_markup", "check_markup", "map_words",
           "markup_counts", "is_optional"]

NULL_WORD = "@"
"""sclite's null word: inserted or deleted at (almost) no cost and never counted."""


def has_markup(words: Sequence[str]) -> bool:
    """Whether a token sequence uses sclite's alternation syntax (``{``, ``}``) or its null word ``@``.

    >>> has_markup(["a", "{", "b", "/", "@", "}"]), has_markup(["a", "and/or"]), has_markup(["@"])
    (True, False, True)
    """
    return any("{" in w or "}" in w or w == NULL_WORD for w in words)


def markup_tokens(words: Iterable[str]) -> list[str]:
    """The tokens of ``words`` that are sclite markup: alternation braces, ``@`` and optionally deletable ``(word)``
    (``()`` included, which :func:`parse_markup` refuses).

    >>> markup_tokens(["a", "{", "b", "/", "@", "}", "(c)", "and/or"])
    ['{', '@', '}', '(c)']
    """
    return [w for w in words if "{" in w or "}" in w or w == NULL_WORD or (len(w) >= 2 and w[0] == "(" and w[-1] == ")")]


# ------------------------------------------------------------------------------------------------ parsing

# A parsed transcript: words and alternations; an alternation is a tuple of alternatives, each a tuple of items.
Item = str | tuple[tuple["Item", ...], ...]


def parse_markup(words: Sequence[str]) -> tuple[Item, ...]:
    """The items of a transcript written with sclite's alternations (``ALTERNATE :== "{" TEXT ("/" TEXT)+ "}"``).

    Braces and slashes may be written apart or glued (``{um/uh/@}``); ``/`` outside braces is part of a word, as
    in sclite. Raises :class:`InputError` for the forms sclite would misread (see the module docstring).

    >>> parse_markup(["a", "{", "b", "c", "/", "@", "}", "d"])
    ('a', (('b', 'c'), ('@',)), 'd')
    >>> parse_markup("x {um/uh/@} y".split())
    ('x', (('um',), ('uh',), ('@',)), 'y')
    >>> parse_markup(["{", "a", "/", "}"])
    Traceback (most recent call last):
    ...
    privasr.errors.InputError: empty alternative in '{ a / }' (expected words or '@' between '/' separators; sclite would silently drop the empty alternative)
    """
    text = " ".join(words)
    pos = 0
    n = len(text)

    def snippet(start: int, end: int) -> str:
        s = text[start:end]
        return s if len(s) <= 60 else s[:57] + "..."

    def seq(depth: int, start: int) -> tuple[list[Item], str]:
        """Items up to a '/' or '}' (inside braces) or the end; returns them and the stop character."""
        nonlocal pos
        items: list[Item] = []
        while pos < n:
            c = text[pos]
            if c == " ":
                pos += 1
            elif c == "{":
                if pos > 0 and text[pos - 1] != " " and depth == 0:
                    raise InputError(f"'{{' glued to a word in {snippet(max(0, pos - 20), pos + 20)!r}",
                                     expected="a space before '{' (sclite misreads 'word{...}')")
                open_at = pos
                pos += 1
                alts: list[tuple[Item, ...]] = []
                while True:
                    alt, stop = seq(depth + 1, open_at)
                    if not alt:
                        raise InputError(f"empty alternative in {snippet(open_at, _close(text, open_at))!r}",
                                         expected="words or '@' between '/' separators; sclite would silently "
                                                  "drop the empty alternative")
                    alts.append(tuple(alt))
                    if stop == "}":
                        break
                if len(alts) > 1:
                    items.append(tuple(alts))
                else:  # '{ a b }' is its words, as in sclite
                    items.extend(alts[0])
            elif c == "}" or (c == "/" and depth > 0):
                if depth == 0:
                    raise InputError(f"'}}' closes no '{{' in {snippet(max(0, pos - 30), pos + 10)!r}",
                                     expected="balanced '{ ... / ... }' alternations")
                pos += 1
                return items, c
            else:
                end = pos
                while end < n and text[end] not in " {}" and not (depth > 0 and text[end] == "/"):
                    end += 1
                if end < n and text[end] == "{":
                    raise InputError(f"'{{' glued to a word in {snippet(pos, end + 20)!r}",
                                     expected="a space before '{' (sclite misreads 'word{...}')")
                word = text[pos:end]
                if word == "()":
                    raise InputError("the token '()'", expected="'(word)' with a word inside the parentheses")
                items.append(word)
                pos = end
        if depth > 0:
            raise InputError(f"'{{' is never closed in {snippet(start, n)!r}", expected="a '}' for every '{'")
        return items, ""

    out, _ = seq(0, 0)
    return tuple(out)


def _close(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        depth += text[k] == "{"
        depth -= text[k] == "}"
        if depth == 0:
            return k + 1
    return len(text)


def check_markup(words: Sequence[str]) -> None:
    """Raise :class:`InputError` if a token sequence's alternations are malformed (see :func:`parse_markup`)."""
    if any("{" in w or "}" in w or w == "()" for w in words):
        parse_markup(words)


def _tokens(items: Sequence[Item]) -> list[str]:
    out: list[str] = []
    for it in items:
        if isinstance(it, str):
            out.append(it)
        else:
            out.append("{")
            for k, alt in enumerate(it):
                if k:
                    out.append("/")
                out.extend(_tokens(alt))
            out.append("}")
    return out


def map_words(words: Sequence[str], fn: Callable[[Sequence[str]], Sequence[str]], *,
              optional_deletable: bool = False) -> tuple[str, ...]:
    """Apply a word-sequence function (a text normaliser) to the words of a transcript, not to its markup.

    Each run of words between markup tokens is mapped as one sequence; an alternative left without words becomes
    ``@``; with ``optional_deletable`` the inside of ``(word)`` is mapped and keeps its parentheses (dropped when
    the function drops the word). Braces and slashes come out as separate tokens.

    >>> map_words(["Uh", "{UM/Hmm}", "(Yes)", "OK"], lambda ws: [w.lower() for w in ws if w != "Hmm"])
    ('uh', '{', 'um', '/', '@', '}', '(yes)', 'ok')
    >>> map_words(["(Yes)"], lambda ws: [w.lower() for w in ws], optional_deletable=True)
    ('(yes)',)
    """
    def run(items: Sequence[Item]) -> list[Item]:
        out: list[Item] = []
        plain: list[str] = []

        def flush() -> None:
            out.extend(fn(plain) if plain else ())
            plain.clear()

        for it in items:
            if isinstance(it, str) and it != NULL_WORD and not (optional_deletable and is_optional(it)):
                plain.append(it)
                continue
            flush()
            if isinstance(it, str):
                if it == NULL_WORD:
                    out.append(it)
                else:
                    inner = list(fn([it[1:-1]]))
                    if len(inner) == 1:
                        out.append(f"({inner[0]})")
                    else:  # dropped, or split into several words (no longer one optional word)
                        out.extend(inner)
            else:
                out.append(tuple(tuple(run(alt)) or (NULL_WORD,) for alt in it))
        flush()
        return out

    return tuple(_tokens(run(parse_markup(words))))


def is_optional(w: str) -> bool:
    """Whether ``w`` is written as an optionally deletable word ``(word)``.

    >>> is_optional("(um)"), is_optional("()"), is_optional("um")
    (True, False, False)
    """
    return len(w) >= 3 and w[0] == "(" and w[-1] == ")"


def markup_counts(words: Sequence[str]) -> tuple[int, int, int]:
    """``(plain words, alternations, optionally deletable words)`` of a transcript: words outside alternations that
    are not ``@`` or ``(word)``, alternation groups (outermost), ``(word)`` tokens outside alternations.

    >>> markup_counts(["a", "{", "b", "/", "@", "}", "(c)", "@", "d"])
    (2, 1, 1)
    """
    if not any("{" in w or "}" in w or w == NULL_WORD or is_optional(w) for w in words):
        return len(words), 0, 0
    items = parse_markup(words)
    alts = sum(1 for it in items if not isinstance(it, str))
    opt = sum(1 for it in items if isinstance(it, str) and is_optional(it))
    plain = sum(1 for it in items if isinstance(it, str) and it != NULL_WORD and not is_optional(it))
    return plain, alts, opt
