"""Template sentences as NER training text: presidio-evaluator's sentence templates filled with Faker values.

Wikigold (encyclopaedia) and Earnings-21 (earnings calls) are the project's gold NER sets; neither has the
sentences people say about themselves and others on a call or to a service ("my name is ...", "can you put me
through to ...", "I'm travelling to ... with ..."). presidio-evaluator (Microsoft, MIT licence) ships 210 such
templates, with ``{{placeholder}}`` slots (``templates.txt`` of its wheel, version :data:`PRESIDIO_VERSION`).
:func:`fill_templates` fills each slot with a Faker value from many locales (names from 14 Latin-script
locales, so the names are of many shapes) and labels it (:data:`PLACEHOLDER_LABEL`); the project's fine-tuned
NER trains on the filled train-part templates (:func:`~privasr.anon.ner_data.load_ner_data` with
``templates=``), picks its epoch with the dev part among the other dev parts, and the test part is held out.

:func:`presidio_templates` finds the templates in the cache (``presidio-evaluator-0.3.2/``), or takes them from
the wheel: downloaded from PyPI with ``pip download`` (hash-checked: :data:`PRESIDIO_WHEEL_SHA256`) or given
as a file, for a machine without PyPI. The wheel's LICENSE is kept beside the extracted files.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr.anon.ner import resolve_overlaps
from privasr.anon.transform import EntitySpan
from privasr.errors import ConfigError, InputError

__all__ = ["PRESIDIO_VERSION", "PRESIDIO_WHEEL", "PRESIDIO_WHEEL_SHA256", "PLACEHOLDER_LABEL", "NAME_LOCALES",
           "read_templates", "fill_templates", "presidio_templates", "template_key", "tokenise_with_spans"]

PRESIDIO_VERSION = "0.3.2"
PRESIDIO_WHEEL = f"presidio_evaluator-{PRESIDIO_VERSION}-py3-none-any.whl"
PRESIDIO_WHEEL_SHA256 = "57614fe604e52b78e6de25b767c59265886b93bbcdc6c7e43ab2657d3f6302be"
"""The SHA-256 of :data:`PRESIDIO_WHEEL` on PyPI: a downloaded or given wheel must match it."""

_MEMBERS = {"templates.txt": "presidio_evaluator/data_generator/raw_data/templates.txt",
            "nationalities.csv": "presidio_evaluator/data_generator/raw_data/nationalities.csv"}
_LICENSE_SUFFIXES = ("LICENSE", "NOTICE")

_PER = ("person", "name", "first_name", "last_name", "name_male", "name_female", "first_name_male",
        "first_name_female", "first_name_nonbinary", "last_name_male", "last_name_female")
PLACEHOLDER_LABEL: Mapping[str, str | None] = {
    **{k: "PER" for k in _PER},
    "organization": "ORG",
    "city": "LOC", "country": "LOC", "address": "LOC", "street_name": "LOC", "state_abbr": "LOC",
    "nationality": "MISC", "nation_woman": "MISC", "nation_plural": "MISC",
    **{k: None for k in ("credit_card_number", "phone_number", "building_number", "age", "secondary_address",
                         "year", "postcode", "zipcode", "email", "url", "job", "prefix", "prefix_male",
                         "prefix_female", "iban", "date_time", "date_of_birth", "ssn", "ip_address", "day_of_week",
                         "us_driver_license")},
}
"""The placeholders a template may hold and the label of the filled value: people PER (first and last names,
no title: titles stay outside a name, as in the gold sets), organisations ORG, places LOC (an address is a
house number, a street, a town and a post code: only the street and the town are LOC, as the gold sets never
put numbers in a place), nationalities MISC (as Wikigold labels them); ``None``: filled but not an entity for
the NER (numbers, e-mail and web addresses, dates, titles, jobs: :class:`~privasr.anon.ner.PatternDetector`
and :mod:`privasr.anon.spoken` find the identifiers among them)."""

NAME_LOCALES = ("en_US", "en_GB", "en_IE", "en_IN", "en_NZ", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pl_PL",
                "pt_BR", "tr_TR", "sv_SE")
"""The Faker locales people's and organisations' names are drawn from (places and numbers: en_US, en_GB)."""

_SLOT = re.compile(r"\{\{\s*([A-Za-z_]+)\s*\}\}")
_TOKEN = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]")


def read_templates(path: str | Path) -> list[str]:
    """The templates of a presidio-style file, one per line (``{{placeholder}}`` slots; ``<placeholder>`` as
    presidio also writes them; a literal ``\\n`` is a line break), in file order: line ``k`` is template ``k - 1``.

    Raises:
        InputError: unreadable, empty, or a line with a placeholder not in :data:`PLACEHOLDER_LABEL` (naming
            the line).
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read it as UTF-8 text: {e}", path=p) from None
    out = []
    for k, line in enumerate(lines, 1):
        t = _canonical(line)
        for name in _SLOT.findall(t):
            if name.lower() not in PLACEHOLDER_LABEL:
                raise InputError(f"unknown placeholder {{{{{name}}}}}", path=p, line=k,
                                 expected=f"one of {', '.join(sorted(PLACEHOLDER_LABEL))}")
        out.append(t)
    if not any(_SLOT.search(t) for t in out):
        raise InputError("no template with a {{placeholder}}", path=p, expected="presidio-evaluator's templates.txt")
    return out


def _canonical(line: str) -> str:
    line = re.sub(r"<([A-Za-z_]+)>", r"{{\1}}", line).replace("\\n", "\n")
    return _SLOT.sub(lambda m: "{{" + m.group(1).lower() + "}}", line)


def template_key(text: str) -> str:
    """A template or a filled record's masked text reduced to compare templates: slots as ``{{}}``, lower case,
    white space collapsed.

    >>> template_key("My name is {{PERSON}}\\n") == template_key("my name  is {{name}}")
    True
    """
    return re.sub(r"\s+", " ", _SLOT.sub("{{}}", _canonical(text))).strip().lower()


def _fakers(seed: int) -> tuple[Any, Any]:
    from faker import Faker  # a core dependency

    names, places = Faker(list(NAME_LOCALES)), Faker(["en_US", "en_GB"])
    names.seed_instance(seed)
    places.seed_instance(seed + 1)
    return names, places


Filler = Callable[[], "str | list[tuple[str, str | None]]"]
"""A slot's value: a string (labelled with the slot's label), or pieces with their own labels."""


def _fillers(names: Any, places: Any, rng: np.random.Generator,
             nationalities: Sequence[tuple[str, str, str]]) -> dict[str, Filler]:
    us = places["en_US"]
    nat = nationalities or (("french", "french", "french"),)

    def pick(k: int) -> str:
        return nat[int(rng.integers(len(nat)))][k]

    def full(first: Callable[[], str]) -> Callable[[], str]:
        return lambda: f"{first()} {names.last_name()}"  # no "Dr." or "MD": titles stay outside a PER span

    def address() -> list[tuple[str, str | None]]:  # the street and the town are places; the numbers are not
        return [(places.building_number(), None), (" ", None), (places.street_name(), "LOC"), (", ", None),
                (places.city(), "LOC"), (" ", None), (places.postcode(), None)]

    return {
        "person": full(names.first_name), "name": full(names.first_name), "first_name": names.first_name,
        "last_name": names.last_name, "name_male": full(names.first_name_male),
        "name_female": full(names.first_name_female), "first_name_male": names.first_name_male,
        "first_name_female": names.first_name_female, "first_name_nonbinary": names.first_name,
        "last_name_male": names.last_name, "last_name_female": names.last_name,
        "organization": names.company, "city": places.city, "country": places.country,
        "address": address, "street_name": places.street_name,
        "state_abbr": us.state_abbr, "nationality": lambda: pick(0).title(), "nation_woman": lambda: pick(1).title(),
        "nation_plural": lambda: pick(2).title(), "credit_card_number": us.credit_card_number,
        "phone_number": places.phone_number, "building_number": places.building_number,
        "age": lambda: str(int(rng.integers(18, 91))), "secondary_address": us.secondary_address,
        "year": lambda: str(int(rng.integers(1950, 2026))), "postcode": places.postcode, "zipcode": us.zipcode,
        "email": places.email, "url": places.url, "job": places.job, "prefix": places.prefix,
        "prefix_male": places.prefix_male, "prefix_female": places.prefix_female, "iban": places.iban,
        "date_time": lambda: places.date_time().strftime("%B %d, %Y"),
        "date_of_birth": lambda: places.date_of_birth().strftime("%B %d, %Y"), "ssn": us.ssn,
        "ip_address": places.ipv4, "day_of_week": places.day_of_week,
        "us_driver_license": lambda: "".join(str(int(d)) for d in rng.integers(0, 10, 8)),
    }


def _nationalities(path: Path | None) -> list[tuple[str, str, str]]:
    """(nationality, woman, plural) rows of presidio's nationalities.csv (empty without it)."""
    if path is None or not path.is_file():
        return []
    import csv

    with path.open(encoding="utf-8-sig", newline="") as f:
        return [(r["nationality"], r["woman"], r["plural"]) for r in csv.DictReader(f)
                if r.get("nationality") and r.get("woman") and r.get("plural")]


def fill_templates(templates: Sequence[str], ids: Sequence[int], per_template: int, seed: int,
                   nationalities: Path | None = None
                   ) -> dict[str, list[tuple[tuple[str, ...], list[EntitySpan]]]]:
    """``per_template`` filled sentences of each template ``templates[i]`` for ``i`` in ``ids``, keyed ``"t<i>"``:
    tokens (words, contractions and hyphenated words whole, punctuation apart; line breaks become commas) and
    the spans of the labelled slots (:data:`PLACEHOLDER_LABEL`; every token a value's characters touch).
    Deterministic in ``seed``.

    >>> out = fill_templates(["My name is {{person}} and I live in {{city}}."], [0], 2, seed=0)
    >>> words, spans = out["t0"][0]
    >>> [(s.label, " ".join(words[s.start:s.end])) for s in spans][0][0], words[:3]
    ('PER', ('My', 'name', 'is'))

    Raises:
        ConfigError: ``per_template`` < 1.
    """
    if isinstance(per_template, bool) or not isinstance(per_template, int) or per_template < 1:
        raise ConfigError(f"per_template={per_template!r}", expected="a positive integer")
    names, places = _fakers(seed)
    rng = np.random.default_rng([seed, 5])
    fill = _fillers(names, places, rng, _nationalities(nationalities))
    out: dict[str, list[tuple[tuple[str, ...], list[EntitySpan]]]] = {}
    for i in ids:
        t = templates[i]
        docs = []
        for _ in range(per_template):
            text, slots = _fill_one(t, fill)
            docs.append(tokenise_with_spans(text, slots))
        out[f"t{i}"] = [d for d in docs if d[0]]
    return out


def _fill_one(template: str, fill: Mapping[str, Filler]) -> tuple[str, list[tuple[int, int, str]]]:
    parts: list[str] = []
    slots: list[tuple[int, int, str]] = []
    pos = 0
    at = 0
    for m in _SLOT.finditer(template):
        lit = template[at:m.start()].replace("\n", ", ")
        parts.append(lit)
        pos += len(lit)
        got = fill[m.group(1)]()
        pieces = [(got, PLACEHOLDER_LABEL[m.group(1)])] if isinstance(got, str) else got
        for text, label in pieces:
            value = " ".join(text.split()) if text.strip() else text
            if label is not None and value.strip():
                slots.append((pos, pos + len(value), label))
            parts.append(value)
            pos += len(value)
        at = m.end()
    parts.append(template[at:].replace("\n", ", "))
    return "".join(parts), slots


def tokenise_with_spans(text: str, char_spans: Iterable[tuple[int, int, str]]
                        ) -> tuple[tuple[str, ...], list[EntitySpan]]:
    """``text`` as tokens (words, contractions and hyphenated words whole, punctuation apart) and labelled
    character spans ``(start, end, label)`` as token spans (every token a span's characters touch; overlaps
    resolved, the longest kept).

    >>> tokenise_with_spans("Call Mary-Jane at 5.", [(5, 14, "PER")])
    (('Call', 'Mary-Jane', 'at', '5', '.'), [EntitySpan(start=1, end=2, label='PER')])
    """
    toks = [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(text)]
    spans = []
    for a, b, lab in char_spans:
        idx = [i for i, (s0, e0, _) in enumerate(toks) if s0 < b and e0 > a]
        if idx:
            spans.append(EntitySpan(idx[0], idx[-1] + 1, lab))
    return tuple(t for _, _, t in toks), resolve_overlaps(spans)


# ---------------------------------------------------------------------------------------------- the files


def presidio_templates(cache_root: str | Path, wheel: str | Path | None = None, *,
                       download: bool = True) -> Path:
    """The folder holding presidio-evaluator's ``templates.txt`` and ``nationalities.csv`` (with its LICENSE):
    ``cache_root/presidio-evaluator-0.3.2``, extracted first from ``wheel`` when given, else from the wheel
    ``pip download`` fetches from PyPI (``download=False``: never).

    Raises:
        ConfigError: not cached and no wheel (offline, ``download=False``, pip failing), naming the command that
            fetches it; InputError: a wheel whose SHA-256 is not :data:`PRESIDIO_WHEEL_SHA256`, or without the
            files.
    """
    folder = Path(cache_root) / f"presidio-evaluator-{PRESIDIO_VERSION}"
    if wheel is None and all((folder / k).is_file() for k in _MEMBERS):
        return folder
    if wheel is not None:
        _extract(Path(wheel), folder)
        return folder
    if not download:
        raise ConfigError("presidio-evaluator's templates are not in the cache", path=folder,
                          expected=f"`privasr anon fetch-templates` (PyPI), or `--wheel {PRESIDIO_WHEEL}` copied "
                                   "from a machine that has it")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", f"presidio-evaluator=={PRESIDIO_VERSION}", "--no-deps",
               "--only-binary", ":all:", "--quiet", "-d", tmp]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = Path(tmp) / PRESIDIO_WHEEL
        if run.returncode != 0 or not got.is_file():
            raise ConfigError(f"pip could not download presidio-evaluator {PRESIDIO_VERSION}: "
                              f"{(run.stderr or run.stdout).strip().splitlines()[-1:] or 'no wheel'}",
                              expected=f"PyPI reachable, or `privasr anon fetch-templates --wheel {PRESIDIO_WHEEL}`")
        _extract(got, folder)
    return folder


def _extract(wheel: Path, folder: Path) -> None:
    if not wheel.is_file():
        raise InputError("no such file", path=wheel, expected=PRESIDIO_WHEEL)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != PRESIDIO_WHEEL_SHA256:
        raise InputError(f"SHA-256 {digest[:16]}... is not that of {PRESIDIO_WHEEL}", path=wheel,
                         expected=f"the PyPI wheel, SHA-256 {PRESIDIO_WHEEL_SHA256}")
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            for dest, member in _MEMBERS.items():
                (tmp / dest).write_bytes(z.read(member))
            for n in names:
                if n.split("/")[-1] in _LICENSE_SUFFIXES and ".dist-info/" in n:
                    (tmp / n.split("/")[-1]).write_bytes(z.read(n))
    except (zipfile.BadZipFile, KeyError) as e:
        shutil.rmtree(tmp)
        raise InputError(f"not the expected wheel: {e}", path=wheel, expected=PRESIDIO_WHEEL) from None
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
