"""A seeded synthetic federated ASR corpus: clients, their speech (as N-best lists), and background text.

The demo must run on a fresh machine with nothing downloaded, and the project's methods must show their
effects on its data. :func:`generate` therefore simulates the whole chain, deterministically from a seed:

1. **A shared background language.** A small English grammar of conversational sentence templates, with
   nine topics (budget, travel, health, product design, sport, weather, food, software, family), each
   with its own nouns, verbs and adjectives; slots for people, places, organisations and times. Every
   word is a real English word from the CMU dictionary, so phonetic confusions are real ones
   (:mod:`privasr.corpus.phonetics`).
2. **Clients** (``num_clients``): each has a personal vocabulary of ``min_entities``..``max_entities``
   named entities -- people (Faker ``en_US`` first and last names), places (real city names) and
   companies (a Faker surname plus a suffix such as ``labs``) -- whose name tokens never occur in the
   background language; a topic mix drawn from ``Dirichlet(topic_concentration)``; and a speaking
   style: how often it names its own entities rather than generic ones (``entity_rate``), how often it
   starts with a filler (``filler_rate``), and how hard its audio is (log-normal ``client_noise_spread``).
   Its entities are mentioned with Zipf-like frequencies (a few very often). The number of utterances
   per client is ``min_utterances`` + Poisson(Gamma), with mean ``utterances_per_client``, capped at
   ``max_utterances``; utterances are in time order (``order`` 0, 1, ...; ``meta.start``/``meta.end`` in
   seconds since the client's first utterance).
3. **A split by client**, like meetings in AMI: a fraction ``dev_fraction`` of the clients are *dev*
   clients (tune hyper-parameters on them), the others *test* clients. Within each client the time
   order supports federated rounds (adapt on earlier utterances, evaluate on later ones).
4. **References**: the true word sequences, lowercase, no punctuation (ASR style).
5. **Background text** (``background_sentences``): sentences of the same grammar with a uniform topic mix
   and only generic people/places/organisations ("my manager", "the office") -- the server's generic
   LM training text. It never contains a client's personal name token.
6. **A simulated first pass** producing N-best lists:

   * a generic first-pass LM: a bigram with interpolated absolute discounting (D = 0.7) estimated on the
     background text only, over a lexicon of the background words, every client's personal tokens and
     the ``extra_lexicon`` most frequent general-English words (ranked by the English LM shipped with
     pocketsphinx). It backs off to add-1/2 background unigrams mixed with a general-English unigram
     prior (``general_prior_weight``), so names and other unseen words get small but non-zero
     probabilities -- as names do in a real generic first pass;
   * a simulated acoustic model: every reference word can be recognised as itself or one of
     ``confusions`` acoustically similar lexicon words (drawn from its ``2 * confusions`` nearest
     neighbours by weighted phone distance), or deleted; some gaps (``insertion_rate``) admit an
     inserted short function word. Each alternative's acoustic log-likelihood is
     ``-acoustic_scale * phone_distance(alternative, truth) + noise``, with Gaussian noise of standard
     deviation ``acoustic_noise`` times the client's and utterance's difficulty; deletions cost
     ``deletion_cost`` per unit of the word's phone-deletion distance, insertions ``insertion_cost`` per
     unit of theirs. A constant ``frame_cost`` per reference phone is added so that ``am`` has realistic
     magnitude (it is the same for all hypotheses of an utterance);
   * a beam search (``beam`` paths) over that confusion network with the decoder score
     ``total = am + lm_weight * lm + word_penalty * n_words``; distinct word sequences are kept, sorted
     by ``total``, and the best ``nbest`` written with scores ``am``, ``lm`` (natural log) and ``total``;
   * word confidences: the posterior of the word in its slot of the confusion network, over all the
     beam's distinct hypotheses with weights ``exp(confidence_scale * total)``.

The defaults give a 1-best WER around 20 %, an oracle WER about half of it, and much higher error rates
on clients' personal names than on background words (measured on every run: ``SynthCorpus.stats`` and
``manifest.json``).

>>> corpus = generate(SynthConfig.preset("tiny"))
>>> len(corpus.clients), len(corpus.dev) + len(corpus.test) > 0
(4, True)
>>> nb = corpus.test[0]
>>> sorted(nb.best.scores), nb.client == corpus.test[0].utt_id.split("-")[0]
(['am', 'lm', 'total'], True)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from privasr.corpus.phonetics import Confusions, load_cmudict, phone_distance
from privasr.corpus.records import Hypothesis, NBest, Span, Transcript
from privasr.errors import ConfigError
from privasr.metrics.align import align
from privasr.metrics.oracle import onebest_wer, oracle_wer

__all__ = [
    "SynthConfig",
    "ClientProfile",
    "SynthCorpus",
    "generate",
    "TOPICS",
    "TEMPLATES",
    "grammar_vocabulary",
    "general_english_unigrams",
]

# ------------------------------------------------------------------------------------------------ grammar

TOPICS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType({
    "budget": MappingProxyType({
        "N": ("budget", "invoice", "forecast", "report", "quarter", "contract", "payment", "account", "salary",
              "estimate", "spreadsheet", "receipt", "bill", "loan", "bonus", "deadline", "revenue", "price",
              "discount", "expense", "tax", "audit", "proposal", "deposit", "pension"),
        "V": ("approve", "review", "cut", "check", "sign", "pay", "send", "update", "finish", "discuss",
              "cancel", "submit", "lower", "raise", "double"),
        "A": ("quarterly", "annual", "total", "final", "overdue", "monthly", "tight", "extra", "expensive",
              "cheap", "accurate", "wrong", "signed", "unpaid"),
    }),
    "travel": MappingProxyType({
        "N": ("flight", "train", "hotel", "ticket", "airport", "passport", "luggage", "trip", "booking", "taxi",
              "station", "gate", "delay", "journey", "seat", "visa", "suitcase", "vacation", "conference",
              "reservation", "ferry", "bus", "map", "rental", "room"),
        "V": ("book", "cancel", "pack", "catch", "miss", "board", "change", "confirm", "reschedule", "visit",
              "upgrade", "rent", "find", "print", "collect"),
        "A": ("early", "late", "direct", "cheap", "delayed", "long", "short", "overnight", "crowded", "quiet",
              "comfortable", "busy", "empty", "nearby"),
    }),
    "health": MappingProxyType({
        "N": ("doctor", "appointment", "clinic", "medicine", "headache", "fever", "nurse", "prescription",
              "hospital", "exercise", "sleep", "diet", "pharmacy", "flu", "cough", "vitamin", "checkup",
              "insurance", "therapy", "injury", "knee", "shoulder", "allergy", "dentist", "vaccine"),
        "V": ("take", "see", "call", "rest", "recover", "stretch", "skip", "refill", "treat", "test", "cure",
              "avoid", "measure", "schedule", "walk"),
        "A": ("sick", "tired", "healthy", "sore", "better", "worse", "painful", "mild", "serious", "swollen",
              "normal", "weak", "careful", "stressed"),
    }),
    "design": MappingProxyType({
        "N": ("prototype", "sketch", "interface", "button", "screen", "layout", "feature", "remote", "control",
              "color", "shape", "material", "plastic", "rubber", "battery", "logo", "menu", "display", "model",
              "sample", "version", "drawing", "case", "cover", "speaker"),
        "V": ("draw", "build", "redesign", "present", "improve", "finalize", "paint", "attach", "choose",
              "simplify", "adjust", "polish", "copy", "sell", "compare"),
        "A": ("round", "curved", "bright", "simple", "modern", "small", "large", "ergonomic", "colorful",
              "flat", "solid", "smooth", "heavy", "light"),
    }),
    "sport": MappingProxyType({
        "N": ("match", "game", "team", "coach", "goal", "season", "training", "league", "score", "referee",
              "player", "ball", "stadium", "tournament", "race", "bike", "gym", "marathon", "practice",
              "championship", "swim", "pitch", "trophy", "defense", "helmet"),
        "V": ("win", "lose", "play", "watch", "train", "join", "beat", "cheer", "coach", "kick", "throw",
              "run", "practice", "score", "start"),
        "A": ("fit", "fast", "strong", "exciting", "close", "boring", "tough", "unbeaten", "injured", "fair",
              "lucky", "slow", "brilliant", "amazing"),
    }),
    "weather": MappingProxyType({
        "N": ("rain", "snow", "storm", "forecast", "sun", "wind", "umbrella", "temperature", "weekend",
              "cloud", "heat", "frost", "thunder", "fog", "coat", "jacket", "sky", "spring", "summer", "winter",
              "autumn", "shower", "breeze", "flood", "ice"),
        "V": ("expect", "bring", "wear", "stay", "clear", "drop", "shovel", "dry", "cover", "predict", "water",
              "open", "close", "enjoy", "hate"),
        "A": ("sunny", "rainy", "cloudy", "windy", "warm", "freezing", "humid", "dry", "wet", "chilly", "mild",
              "stormy", "foggy", "icy"),
    }),
    "food": MappingProxyType({
        "N": ("dinner", "lunch", "breakfast", "restaurant", "kitchen", "recipe", "pasta", "salad", "soup",
              "bread", "chicken", "rice", "coffee", "tea", "cake", "pizza", "fruit", "cheese", "oven", "menu",
              "dessert", "sandwich", "steak", "sauce", "cookie"),
        "V": ("cook", "order", "bake", "eat", "try", "buy", "taste", "share", "make", "grab", "fry", "slice",
              "heat", "serve", "mix"),
        "A": ("fresh", "spicy", "sweet", "delicious", "hot", "cold", "vegetarian", "tasty", "salty", "burnt",
              "crispy", "raw", "sour", "homemade"),
    }),
    "software": MappingProxyType({
        "N": ("server", "database", "code", "bug", "release", "update", "laptop", "password", "email", "app",
              "website", "backup", "network", "printer", "file", "folder", "browser", "script", "login",
              "account", "keyboard", "monitor", "router", "cable", "license"),
        "V": ("fix", "deploy", "install", "restart", "merge", "debug", "upload", "download", "reset", "share",
              "migrate", "delete", "rename", "encrypt", "configure"),
        "A": ("broken", "slow", "new", "latest", "secure", "stable", "offline", "urgent", "corrupt", "shared",
              "private", "public", "online", "outdated"),
    }),
    "family": MappingProxyType({
        "N": ("kids", "school", "birthday", "party", "present", "parents", "wedding", "garden", "dog", "house",
              "car", "holiday", "homework", "movie", "cousin", "baby", "puppy", "picnic", "anniversary",
              "grandma", "uncle", "aunt", "bedroom", "toy", "bicycle"),
        "V": ("visit", "clean", "celebrate", "invite", "wrap", "drive", "feed", "paint", "fix", "plan",
              "decorate", "babysit", "pick", "surprise", "hug"),
        "A": ("happy", "noisy", "messy", "lovely", "proud", "little", "funny", "cute", "sleepy", "excited",
              "grumpy", "old", "young", "special"),
    }),
})
"""The background language's topics: nouns ``N``, verbs (base form) ``V`` and adjectives ``A``."""

TEMPLATES: tuple[str, ...] = (
    "i think we should {V} the {N} {TIME}",
    "did you {V} the {N} yet",
    "can you {V} the {A} {N} for me",
    "{PER} said the {N} was {A}",
    "{PER} wants to {V} the {N} {TIME}",
    "we need to talk to {PER} about the {N}",
    "i will be in {LOC} {TIME}",
    "the {N} in {LOC} was really {A}",
    "let's meet at {ORG} {TIME}",
    "{ORG} sent us the {N} {TIME}",
    "i'm not sure the {N} is {A} enough",
    "have you heard from {PER} about the {N}",
    "the {A} {N} is ready",
    "we could {V} the {N} and then {V} the {N}",
    "maybe {PER} can {V} it {TIME}",
    "is the {N} {A} or not",
    "i have to {V} the {N} with {PER} {TIME}",
    "tell {PER} the {N} from {ORG} is {A}",
    "what time is the {N} {TIME}",
    "the {N} at {ORG} was a bit {A}",
    "i was talking to {PER} and {PRO} said the {N} is {A}",
    "do you know if {PER} is coming to {LOC}",
    "call {PER} and ask about the {N}",
    "we should probably {V} the {N} {TIME}",
    "it looks like the {N} will be {A}",
    "my {N} is {A} again",
    "there is a {A} {N} near {LOC}",
    "yeah the {N} was {A}",
    "okay so {PER} will {V} the {N}",
    "i'd rather {V} the {N} than {V} the {N}",
    "don't forget to {V} the {N} {TIME}",
    "{PRO} is going to {LOC} for the {N}",
    "how was the {N} in {LOC}",
    "the people at {ORG} want a {A} {N}",
    "could you ask {PER} to {V} the {N}",
    "i just got back from {LOC} and the {N} was {A}",
    "the {N} is too {A} for {PER}",
    "we still have to {V} the {N} before the {N}",
    "i can't {V} the {N} {TIME}",
    "the new {N} from {ORG} looks {A}",
    "what do you think about the {N}",
    "{PER} and i are going to {V} the {N}",
)
"""Sentence templates; ``{N}``, ``{V}``, ``{A}`` come from the utterance's topic, the rest from below."""

_TIMES: tuple[str, ...] = (
    "today", "tomorrow", "tonight", "this morning", "this afternoon", "this evening", "next week",
    "next month", "on monday", "on tuesday", "on wednesday", "on thursday", "on friday", "on the weekend",
    "later", "right now", "after lunch", "before noon", "by friday", "in an hour", "first thing tomorrow",
    "soon", "again",
)
_PRONOUNS: tuple[str, ...] = ("he", "she", "they")
_GENERIC: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "PER": ("my manager", "the team", "my sister", "my brother", "the doctor", "our client", "my friend",
            "the boss", "everyone", "my colleague", "the new guy", "my mom", "my dad", "the kids", "our neighbor",
            "my wife", "my husband", "the landlord"),
    "LOC": ("the city", "town", "the office", "the north", "the south", "the village", "the capital",
            "the suburbs", "the country", "the coast", "the mountains", "the island"),
    "ORG": ("the bank", "the agency", "head office", "the company", "the client", "the supplier", "the school",
            "the hospital", "the store", "the council", "the studio"),
})
_FILLERS: tuple[str, ...] = ("um", "uh", "so", "well", "okay", "yeah", "you know", "i mean", "like", "right")
_INSERTABLE: tuple[str, ...] = ("a", "the", "and", "uh", "um", "i", "to", "of", "in", "it", "is", "so", "oh")
_ORG_SUFFIXES: tuple[str, ...] = ("group", "labs", "systems", "partners", "consulting", "industries", "solutions",
                                  "logistics", "studios", "holdings", "media", "foods")
_PLACES: tuple[str, ...] = (
    "boston", "denver", "seattle", "portland", "chicago", "dallas", "phoenix", "atlanta", "miami", "detroit",
    "toronto", "vancouver", "montreal", "dublin", "london", "paris", "berlin", "madrid", "lisbon", "vienna",
    "prague", "warsaw", "budapest", "athens", "rome", "milan", "naples", "geneva", "zurich", "brussels",
    "amsterdam", "rotterdam", "oslo", "stockholm", "helsinki", "copenhagen", "edinburgh", "glasgow",
    "manchester", "liverpool", "leeds", "bristol", "cardiff", "belfast", "sydney", "melbourne", "brisbane",
    "perth", "auckland", "tokyo", "osaka", "seoul", "beijing", "shanghai", "bombay", "delhi", "bangkok",
    "singapore", "jakarta", "manila", "cairo", "nairobi", "lagos", "johannesburg", "houston", "austin",
    "nashville", "memphis", "orlando", "tampa", "baltimore", "pittsburgh", "cleveland", "cincinnati", "omaha",
    "tucson", "albuquerque", "sacramento", "oakland", "fresno", "boise", "spokane", "anchorage", "honolulu",
    "savannah", "charleston", "richmond", "raleigh", "hartford", "rochester", "syracuse", "albany", "newark",
    "trenton", "dayton", "toledo", "madison", "milwaukee", "minneapolis", "wichita", "tulsa", "lubbock",
    "santiago", "lima", "bogota", "caracas", "havana", "quebec", "ottawa", "calgary", "winnipeg", "halifax",
    "marseille", "lyon", "munich", "hamburg", "frankfurt", "cologne", "stuttgart", "florence", "venice",
    "seville", "valencia", "barcelona", "porto", "krakow", "kiev", "moscow", "istanbul", "ankara",
)


def _split(phrase: str) -> tuple[str, ...]:
    return tuple(phrase.split())


def grammar_vocabulary() -> tuple[str, ...]:
    """Every word the background language can produce (sorted).

    >>> v = grammar_vocabulary()
    >>> "budget" in v and "the" in v, len(v) > 500
    (True, True)
    """
    words: set[str] = set()
    for t in TEMPLATES:
        words.update(w for w in t.split() if not w.startswith("{"))
    for topic in TOPICS.values():
        for ws in topic.values():
            words.update(ws)
    for group in (_TIMES, _PRONOUNS, _FILLERS, _INSERTABLE, *_GENERIC.values()):
        for phrase in group:
            words.update(_split(phrase))
    return tuple(sorted(words))


_TEMPLATE_TOKENS: tuple[tuple[str, ...], ...] = tuple(tuple(t.split()) for t in TEMPLATES)
_SLOT = re.compile(r"^\{([A-Z]+)\}$")

# ------------------------------------------------------------------------------------------------- config


def _presets() -> dict[str, dict[str, Any]]:
    return {
        "small": {},
        "tiny": dict(num_clients=4, utterances_per_client=6.0, min_utterances=3, max_utterances=10,
                     background_sentences=200, dev_fraction=0.25),
        "medium": dict(num_clients=200, utterances_per_client=60.0, max_utterances=300,
                       background_sentences=20000),
    }


@dataclass(frozen=True)
class SynthConfig:
    """Every knob of the synthetic corpus (see the module docstring and ``docs/synth.md``).

    Attributes:
        seed: the random seed; the same seed gives byte-identical output files.
        num_clients: clients (speakers/devices) in the corpus.
        dev_fraction: fraction of clients in the dev split (at least one dev and one test client).
        utterances_per_client: mean utterances per client.
        min_utterances: fewest utterances per client.
        max_utterances: most utterances per client.
        min_entities: fewest personal named entities per client.
        max_entities: most personal named entities per client.
        topic_concentration: Dirichlet concentration of a client's topic mix (small: few topics per client).
        entity_rate: mean probability that a person/place/organisation slot names one of the client's own
            entities (else a generic phrase such as "my manager"); per client ~ Beta around it.
        filler_rate: mean probability that an utterance starts with a filler ("um", "you know"...).
        background_sentences: sentences of generic background text (the server's LM training text).
        extra_lexicon: most frequent general-English words (from the LM shipped with pocketsphinx) added to
            the recogniser's lexicon besides the background words and the clients' names: more words a
            reference word can be mistaken for.
        general_prior_weight: weight of the general-English unigram prior in the first-pass LM's unigram
            back-off distribution (gives unseen words realistic small probabilities).
        nbest: hypotheses kept per utterance.
        beam: paths kept by the first-pass beam search (also the hypotheses the confidences are computed on).
        confusions: acoustic substitution candidates per word.
        lm_weight: first-pass LM weight in ``total``.
        word_penalty: first-pass per-word score (positive favours longer hypotheses).
        acoustic_scale: acoustic log-likelihood lost per unit of phone distance from the truth.
        acoustic_noise: standard deviation of the acoustic score noise (per word alternative).
        client_noise_spread: sigma of the log-normal per-client acoustic difficulty.
        deletion_cost: acoustic cost of deleting a word, per unit of its phone deletion distance.
        insertion_rate: fraction of word gaps where a short word may be inserted.
        insertion_cost: acoustic cost of an insertion, per unit of its phone insertion distance.
        frame_cost: acoustic log-likelihood per reference phone common to all hypotheses (scale only).
        confidence_scale: scale of ``total`` in the posterior used for word confidences.

    >>> SynthConfig(num_clients=1)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: synth: num_clients=1 is not valid (expected an integer >= 2)
    >>> SynthConfig.from_dict({"seed": 3, "colour": 1})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: synth: unknown option(s) ['colour'] (expected some of ...)
    """

    seed: int = 0
    num_clients: int = 40
    dev_fraction: float = 0.25
    utterances_per_client: float = 30.0
    min_utterances: int = 8
    max_utterances: int = 120
    min_entities: int = 5
    max_entities: int = 15
    topic_concentration: float = 0.5
    entity_rate: float = 0.7
    filler_rate: float = 0.15
    background_sentences: int = 3000
    extra_lexicon: int = 5000
    general_prior_weight: float = 0.1
    nbest: int = 10
    beam: int = 48
    confusions: int = 6
    lm_weight: float = 1.0
    word_penalty: float = 0.0
    acoustic_scale: float = 3.0
    acoustic_noise: float = 4.0
    client_noise_spread: float = 0.3
    deletion_cost: float = 6.0
    insertion_rate: float = 0.3
    insertion_cost: float = 6.0
    frame_cost: float = 8.0
    confidence_scale: float = 0.5

    _INT_MIN = MappingProxyType({
        "seed": 0, "num_clients": 2, "min_utterances": 1, "max_utterances": 1, "min_entities": 1,
        "max_entities": 1, "background_sentences": 1, "extra_lexicon": 0, "nbest": 1, "beam": 1, "confusions": 0,
    })
    _POSITIVE = ("utterances_per_client", "topic_concentration", "acoustic_scale")
    _NON_NEGATIVE = ("acoustic_noise", "client_noise_spread", "deletion_cost",
                     "insertion_cost", "frame_cost", "confidence_scale", "lm_weight")
    _PROBABILITY = ("general_prior_weight", "dev_fraction", "entity_rate", "filler_rate", "insertion_rate")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in self._INT_MIN:
                if isinstance(v, bool) or not isinstance(v, int) or v < self._INT_MIN[f.name]:
                    raise ConfigError(f"synth: {f.name}={v!r} is not valid",
                                      expected=f"an integer >= {self._INT_MIN[f.name]}")
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ConfigError(f"synth: {f.name}={v!r} is not valid", expected="a finite number")
            if f.name in self._POSITIVE and v <= 0:
                raise ConfigError(f"synth: {f.name}={v!r} is not valid", expected="a number > 0")
            if f.name in self._NON_NEGATIVE and v < 0:
                raise ConfigError(f"synth: {f.name}={v!r} is not valid", expected="a number >= 0")
            if f.name in self._PROBABILITY and not 0.0 <= v <= 1.0:
                raise ConfigError(f"synth: {f.name}={v!r} is not valid", expected="a number in [0, 1]")
            object.__setattr__(self, f.name, float(v))
        if not 0.0 < self.dev_fraction < 1.0:
            raise ConfigError(f"synth: dev_fraction={self.dev_fraction!r} is not valid",
                              expected="a number strictly between 0 and 1")
        if self.max_utterances < self.min_utterances:
            raise ConfigError(f"synth: max_utterances={self.max_utterances} is below min_utterances",
                              expected=f"an integer >= {self.min_utterances}")
        if self.utterances_per_client < self.min_utterances:
            raise ConfigError(f"synth: utterances_per_client={self.utterances_per_client} is below "
                              "min_utterances", expected=f"a number >= {self.min_utterances}")
        if self.max_entities < self.min_entities:
            raise ConfigError(f"synth: max_entities={self.max_entities} is below min_entities",
                              expected=f"an integer >= {self.min_entities}")
        if self.beam < self.nbest:
            raise ConfigError(f"synth: beam={self.beam} is below nbest", expected=f"an integer >= {self.nbest}")

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> SynthConfig:
        """Build from a mapping; ``preset`` picks the base (default ``small``), unknown keys are errors.

        >>> SynthConfig.from_dict({"preset": "tiny", "seed": 7}).num_clients
        4
        """
        if not isinstance(options, Mapping):
            raise ConfigError("synth: options must be a mapping", expected="{option: value}")
        opts = dict(options)
        preset = opts.pop("preset", "small")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in opts if k not in known)
        if unknown:
            raise ConfigError(f"synth: unknown option(s) {unknown}", expected=f"some of {sorted(known)}")
        return cls.preset(preset, **opts)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SynthConfig:
        """A named configuration: ``small`` (the defaults), ``tiny`` (for doctests) or ``medium`` (benchmarks).

        >>> SynthConfig.preset("medium").num_clients
        200
        """
        presets = _presets()
        if name not in presets:
            raise ConfigError(f"synth: unknown preset {name!r}", expected=f"one of {sorted(presets)}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in overrides if k not in known)
        if unknown:
            raise ConfigError(f"synth: unknown option(s) {unknown}", expected=f"some of {sorted(known)}")
        return cls(**{**presets[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """All options as a plain dict (what ``manifest.json`` records).

        >>> SynthConfig().to_dict()["num_clients"]
        40
        """
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


# ------------------------------------------------------------------------------------------------ clients

@dataclass(frozen=True)
class ClientProfile:
    """Ground truth about one simulated client (never visible to a real server).

    Attributes:
        id: the client id (``c000``...).
        split: ``"dev"`` or ``"test"``.
        entities: its personal named entities as ``(phrase, label)`` with labels ``PER``, ``LOC``, ``ORG``.
        personal_words: the entity tokens that never occur in the background language (sorted).
        topic_mix: topic -> probability.
        entity_rate: probability that an entity slot names one of its own entities.
        filler_rate: probability that an utterance starts with a filler.
        noise: its acoustic difficulty (multiplies ``acoustic_noise``).
    """

    id: str
    split: str
    entities: tuple[tuple[str, str], ...]
    personal_words: tuple[str, ...]
    topic_mix: Mapping[str, float]
    entity_rate: float
    filler_rate: float
    noise: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict.

        >>> ClientProfile("c0", "dev", (("ann lee", "PER"),), ("lee",), {"sport": 1.0}, 0.5, 0.1, 1.0).to_json()["entities"]
        [['ann lee', 'PER']]
        """
        return {
            "id": self.id, "split": self.split, "entities": [list(e) for e in self.entities],
            "personal_words": list(self.personal_words), "topic_mix": dict(self.topic_mix),
            "entity_rate": self.entity_rate, "filler_rate": self.filler_rate, "noise": self.noise,
        }


@dataclass
class _Client:
    profile: ClientProfile
    entity_tokens: dict[str, list[tuple[str, ...]]]  # label -> entity token tuples (in Zipf rank order)
    entity_weights: dict[str, np.ndarray]
    topic_p: np.ndarray


def _entity_tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in (re.sub(r"[^a-z']", "", w.lower()) for w in text.split()) if t)


def _make_clients(cfg: SynthConfig, rng: np.random.Generator, background_vocab: frozenset[str],
                  lexicon: Mapping[str, Any]) -> list[_Client]:
    from faker import Faker

    fake = Faker("en_US")
    fake.seed_instance(int(rng.integers(0, 2**31 - 1)))
    places = [p for p in _PLACES if p in lexicon and p not in background_vocab]
    topics = list(TOPICS)
    n_dev = min(cfg.num_clients - 1, max(1, round(cfg.dev_fraction * cfg.num_clients)))
    dev_ids = set(rng.permutation(cfg.num_clients)[:n_dev].tolist())

    def fresh(draw: Any) -> str:
        for _ in range(100):
            name = _entity_tokens(draw())
            if len(name) == 1 and name[0] not in background_vocab and len(name[0]) > 1:
                return name[0]
        raise RuntimeError("could not draw a name outside the background vocabulary")  # pragma: no cover

    clients: list[_Client] = []
    for c in range(cfg.num_clients):
        n_ent = int(rng.integers(cfg.min_entities, cfg.max_entities + 1))
        labels = rng.choice(np.array(["PER", "LOC", "ORG"]), size=n_ent, p=[0.5, 0.25, 0.25]).tolist()
        if "PER" not in labels:
            labels[0] = "PER"
        entities: list[tuple[str, str]] = []
        seen: set[str] = set()
        for label in labels:
            for _ in range(20):
                if label == "PER":
                    first, last = fresh(fake.first_name), fresh(fake.last_name)
                    phrase = f"{first} {last}"
                elif label == "LOC":
                    phrase = str(places[int(rng.integers(len(places)))])
                else:
                    phrase = f"{fresh(fake.last_name)} {_ORG_SUFFIXES[int(rng.integers(len(_ORG_SUFFIXES)))]}"
                if phrase not in seen:
                    break
            seen.add(phrase)
            entities.append((phrase, label))
        ent_tokens: dict[str, list[tuple[str, ...]]] = {"PER": [], "LOC": [], "ORG": []}
        for phrase, label in entities:
            ent_tokens[label].append(_split(phrase))
        weights = {}
        for label, toks in ent_tokens.items():
            if toks:
                w = 1.0 / np.arange(1, len(toks) + 1) ** 1.1
                weights[label] = w / w.sum()
        personal = sorted({t for phrase, _ in entities for t in _split(phrase) if t not in background_vocab})
        topic_p = rng.dirichlet(np.full(len(topics), cfg.topic_concentration))
        topic_p = np.maximum(topic_p, 1e-12)
        topic_p /= topic_p.sum()
        ent_rate = float(rng.beta(8 * cfg.entity_rate + 1e-3, 8 * (1 - cfg.entity_rate) + 1e-3))
        fill_rate = float(rng.beta(8 * cfg.filler_rate + 1e-3, 8 * (1 - cfg.filler_rate) + 1e-3))
        noise = float(np.exp(rng.normal(0.0, cfg.client_noise_spread)))
        profile = ClientProfile(
            id=f"c{c:03d}", split="dev" if c in dev_ids else "test", entities=tuple(entities),
            personal_words=tuple(personal),
            topic_mix=MappingProxyType({t: round(float(p), 4) for t, p in zip(topics, topic_p, strict=True)}),
            entity_rate=round(ent_rate, 4), filler_rate=round(fill_rate, 4), noise=round(noise, 4),
        )
        clients.append(_Client(profile, ent_tokens, weights, topic_p))
    return clients


# --------------------------------------------------------------------------------------------- sentences

def _sentence(rng: np.random.Generator, topic: str, client: _Client | None, entity_rate: float,
              filler_rate: float) -> tuple[tuple[str, ...], tuple[Span, ...]]:
    """One sentence of the grammar: its words and the spans of personal entities in it."""
    words: list[str] = []
    spans: list[Span] = []
    if rng.random() < filler_rate:
        words.extend(_split(_FILLERS[int(rng.integers(len(_FILLERS)))]))
    tmpl = _TEMPLATE_TOKENS[int(rng.integers(len(_TEMPLATE_TOKENS)))]
    lex = TOPICS[topic]
    for tok in tmpl:
        m = _SLOT.match(tok)
        if m is None:
            words.append(tok)
            continue
        slot = m.group(1)
        if slot in lex:
            pool = lex[slot]
            # Zipf-like preference within a topic's word list
            r = int(min(len(pool) - 1, rng.zipf(1.6) - 1)) if rng.random() < 0.7 else int(rng.integers(len(pool)))
            words.append(pool[r])
        elif slot == "TIME":
            words.extend(_split(_TIMES[int(rng.integers(len(_TIMES)))]))
        elif slot == "PRO":
            words.append(_PRONOUNS[int(rng.integers(len(_PRONOUNS)))])
        else:  # PER, LOC, ORG
            own = client.entity_tokens[slot] if client is not None else []
            if own and rng.random() < entity_rate:
                toks = own[int(rng.choice(len(own), p=client.entity_weights[slot]))]  # type: ignore[union-attr]
                if slot == "PER":
                    u = rng.random()
                    toks = toks[:1] if u < 0.6 else (toks if u < 0.9 else toks[1:])
                spans.append(Span(len(words), len(words) + len(toks), slot))
                words.extend(toks)
            else:
                generic = _GENERIC[slot]
                words.extend(_split(generic[int(rng.integers(len(generic)))]))
    return tuple(words), tuple(spans)


# ---------------------------------------------------------------------------------------------- first-pass LM

_LOGMATH_BASE = 1.0001  # pocketsphinx's default log base: ln p = value * ln(1.0001)


@functools.lru_cache(maxsize=2)
def general_english_unigrams(n: int) -> tuple[tuple[str, float], ...]:
    """The ``n`` most frequent words of the general English LM shipped with pocketsphinx, with natural-log
    unigram probabilities (only plain lowercase words that are in the CMU dictionary).

    >>> [w for w, _ in general_english_unigrams(5)]
    ['the', 'to', 'i', 'and', 'a']
    """
    import pocketsphinx

    if n <= 0:
        return ()
    lm = pocketsphinx.NGramModel.readfile(
        str(Path(pocketsphinx.get_model_path()) / "en-us" / "en-us.lm.bin"))
    lex = load_cmudict()
    scale = math.log(_LOGMATH_BASE)
    scored = [(lm.prob([w]) * scale, w) for w in lex if _PLAIN_WORD.match(w)]
    scored.sort(key=lambda x: (-x[0], x[1]))
    return tuple((w, round(lp, 6)) for lp, w in scored[:n])


_PLAIN_WORD = re.compile(r"^[a-z]+(?:'[a-z]+)?$")


class _BigramLM:
    """Interpolated absolute-discounting bigram over a fixed lexicon.

    The unigram distribution it backs off to mixes add-1/2 background unigram counts with a general
    English unigram prior (weight ``prior_weight``) over the lexicon, so that words unseen in the
    background text -- clients' names, the extra lexicon -- get small but realistic probabilities.
    Log-probabilities are held as a dense matrix with one row per history seen in the background text
    plus one shared row (the unigram distribution) for every other history.
    """

    BOS = "<s>"
    EOS = "</s>"

    def __init__(self, sentences: Sequence[Sequence[str]], lexicon: Sequence[str],
                 prior: Mapping[str, float], prior_weight: float, discount: float = 0.7,
                 unigram_add: float = 0.5) -> None:
        self.words = list(lexicon) + [self.BOS, self.EOS]
        self.index = {w: i for i, w in enumerate(self.words)}
        V = len(self.words)
        bos, eos = self.index[self.BOS], self.index[self.EOS]
        hist: list[int] = []
        nxt: list[int] = []
        for s in sentences:
            ids = [bos] + [self.index[w] for w in s] + [eos]
            hist.extend(ids[:-1])
            nxt.extend(ids[1:])
        h, n = np.array(hist, dtype=np.int64), np.array(nxt, dtype=np.int64)
        uni = np.bincount(n, minlength=V).astype(np.float64) + unigram_add
        uni[bos] = 0.0
        p_uni = uni / uni.sum()
        if prior_weight > 0:
            lp = np.array([prior.get(w, -math.inf) for w in self.words])
            known = np.isfinite(lp)
            floor = lp[known].min() if known.any() else 0.0
            lp[~known] = floor - 2.0  # words the general LM lacks: a little below its rarest word
            g = np.exp(lp - lp.max())
            g[bos] = 0.0
            g[eos] = 0.0
            p_uni = (1 - prior_weight) * p_uni + prior_weight * g / g.sum()
        seen_h = np.unique(h)
        self.row = np.full(V, len(seen_h), dtype=np.int64)  # unseen histories -> the last (unigram) row
        self.row[seen_h] = np.arange(len(seen_h))
        counts = np.zeros((len(seen_h) + 1, V))
        np.add.at(counts, (self.row[h], n), 1.0)
        c_h = counts.sum(axis=1, keepdims=True)
        n1 = (counts > 0).sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            p = np.where(c_h > 0, np.maximum(counts - discount, 0.0) / c_h + discount * n1 / c_h * p_uni,
                         p_uni[None, :])
        p[:, bos] = 0.0
        p = p / p.sum(axis=1, keepdims=True)
        with np.errstate(divide="ignore"):
            logp = np.log(p)
        logp[:, bos] = -1e9  # never predicted; keeps the matrix finite
        self.logp = logp

    def logprob(self, history: np.ndarray, words: np.ndarray) -> np.ndarray:
        """log p(word | history) for broadcastable arrays of lexicon ids."""
        return self.logp[self.row[history], words]

    def score(self, words: Sequence[str]) -> float:
        """Log-probability of a sentence, with sentence boundaries."""
        ids = np.array([self.index[self.BOS]] + [self.index[w] for w in words] + [self.index[self.EOS]])
        return float(self.logprob(ids[:-1], ids[1:]).sum())


# ------------------------------------------------------------------------------------------------ decoding

@dataclass
class _Decoder:
    cfg: SynthConfig
    lm: _BigramLM
    conf: Confusions
    del_dist: dict[str, float] = field(default_factory=dict)
    ins_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ins_dist: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pools: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        ins = [w for w in _INSERTABLE if w in self.lm.index]
        self.ins_ids = np.array([self.lm.index[w] for w in ins], dtype=np.int64)
        self.ins_dist = np.array([phone_distance((), self.conf.pronunciations(w)[0]) for w in ins])

    def _pool(self, word: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lexicon ids, phone distances, sampling weights) of a word's candidate confusions."""
        got = self.pools.get(word)
        if got is None:
            ns = [n for n in self.conf.neighbours(word, 2 * self.cfg.confusions) if n.word in self.lm.index]
            ids = np.array([self.lm.index[n.word] for n in ns], dtype=np.int64)
            dist = np.array([n.distance for n in ns])
            w = np.array([n.similarity for n in ns]) ** 2 + 1e-6
            got = self.pools[word] = (ids, dist, w / w.sum() if len(w) else w)
            self.del_dist[word] = phone_distance(self.conf.pronunciations(word)[0], ())
        return got

    def decode(self, ref: Sequence[str], rng: np.random.Generator, noise: float) -> list[Hypothesis]:
        cfg = self.cfg
        sigma = cfg.acoustic_noise * noise * float(np.exp(rng.normal(0.0, 0.25)))
        EPS = -1
        # slots of the confusion network: (option lexicon ids, -1 = nothing; their relative acoustic scores)
        slots: list[tuple[np.ndarray, np.ndarray]] = []
        baseline = 0.0

        def gap() -> None:
            if len(self.ins_ids) and rng.random() < cfg.insertion_rate:
                k = min(2, len(self.ins_ids))
                pick = rng.choice(len(self.ins_ids), size=k, replace=False)
                opts = np.r_[EPS, self.ins_ids[pick]]
                am = np.r_[0.0, -cfg.insertion_cost * self.ins_dist[pick] + sigma * rng.standard_normal(k)]
                slots.append((opts, am))

        gap()
        for w in ref:
            ids, dist, wts = self._pool(w)
            k = min(cfg.confusions, len(ids))
            pick = rng.choice(len(ids), size=k, replace=False, p=wts) if k else np.zeros(0, dtype=np.int64)
            opts = np.r_[self.lm.index[w], ids[pick], EPS]
            rel = np.r_[0.0, -cfg.acoustic_scale * dist[pick], -cfg.deletion_cost * self.del_dist[w]]
            rel = rel + sigma * rng.standard_normal(len(rel))
            slots.append((opts.astype(np.int64), rel))
            baseline -= cfg.frame_cost * self.conf.num_phones(w)
            gap()
        return self._search(slots, baseline)

    def _search(self, slots: list[tuple[np.ndarray, np.ndarray]], baseline: float) -> list[Hypothesis]:
        cfg = self.cfg
        logprob = self.lm.logprob
        bos, eos = self.lm.index[_BigramLM.BOS], self.lm.index[_BigramLM.EOS]
        score = np.zeros(1)
        am = np.zeros(1)
        lmsc = np.zeros(1)
        last = np.array([bos], dtype=np.int64)
        back: list[tuple[np.ndarray, np.ndarray]] = []
        for opts, rel in slots:
            real = opts >= 0
            lm_inc = np.where(real[None, :], logprob(last[:, None], np.where(real, opts, 0)[None, :]), 0.0)
            cand = (score[:, None] + rel[None, :] + cfg.lm_weight * lm_inc + cfg.word_penalty * real[None, :])
            flat = cand.ravel()
            keep = np.argsort(-flat, kind="stable")[: cfg.beam]
            parent, opt = np.divmod(keep, len(opts))
            score = flat[keep]
            am = am[parent] + rel[opt]
            lmsc = lmsc[parent] + lm_inc[parent, opt]
            last = np.where(real[opt], opts[opt], last[parent])
            back.append((parent, opt))
        end = logprob(last, np.full_like(last, eos))
        score = score + cfg.lm_weight * end
        lmsc = lmsc + end
        # trace every surviving path back; keep distinct word sequences (the best path of each)
        n_paths = len(score)
        choice = np.zeros((len(slots), n_paths), dtype=np.int64)
        cur = np.arange(n_paths)
        for s in range(len(slots) - 1, -1, -1):
            parent, opt = back[s]
            choice[s] = opt[cur]
            cur = parent[cur]
        n_words = np.zeros(n_paths, dtype=np.int64)
        for s, (opts, _) in enumerate(slots):
            n_words += opts[choice[s]] >= 0
        total = score
        order = np.argsort(-total, kind="stable")
        words_of = self.lm.words
        seen: dict[tuple[str, ...], int] = {}
        hyps: list[tuple[tuple[str, ...], tuple[tuple[int, int], ...], int]] = []
        for p in order.tolist():
            toks: list[str] = []
            keys: list[tuple[int, int]] = []
            for s, (opts, _) in enumerate(slots):
                o = int(opts[choice[s, p]])
                if o >= 0:
                    toks.append(words_of[o])
                    keys.append((s, o))
            t = tuple(toks)
            if t in seen:
                continue
            seen[t] = p
            hyps.append((t, tuple(keys), p))
        tot = np.array([total[p] for _, _, p in hyps])
        post = np.exp(cfg.confidence_scale * (tot - tot.max()))
        post /= post.sum()
        mass: Counter[tuple[int, int]] = Counter()
        for (_, keys, _), q in zip(hyps, post.tolist(), strict=True):
            for key in keys:
                mass[key] += q
        out = []
        for words, keys, p in hyps[: cfg.nbest]:
            conf = tuple(min(1.0, round(mass[k], 4)) for k in keys)
            scores = {
                "am": round(baseline + float(am[p]), 4),
                "lm": round(float(lmsc[p]), 4),
                "total": round(baseline + float(total[p]), 4),
            }
            out.append(Hypothesis(words, scores=scores, confidences=conf))
        return out


# ------------------------------------------------------------------------------------------------- corpus

def _correct_mask(ref: Sequence[str], hyp: Sequence[str]) -> list[bool]:
    """For each reference word, whether the (sclite-style) minimum-edit alignment matches it exactly."""
    return [op == "C" for op in align(ref, hyp).ops if op != "I"]


def _measure(nbests: Sequence[NBest], personal: Mapping[str, frozenset[str]]) -> dict[str, Any]:
    ent_n = ent_ok = bg_n = bg_ok = 0
    one, orc = onebest_wer(nbests), oracle_wer(nbests)
    n_ref = one.ref_words
    for nb in nbests:
        ref = nb.ref or ()
        mine = personal.get(nb.client or "", frozenset())
        for w, ok in zip(ref, _correct_mask(ref, nb.best.words), strict=True):
            if w in mine:
                ent_n += 1
                ent_ok += ok
            else:
                bg_n += 1
                bg_ok += ok
    return {
        "utterances": len(nbests),
        "ref_words": n_ref,
        "wer_1best": round(one.errors / max(1, n_ref), 4),
        "wer_oracle": round(orc.errors / max(1, n_ref), 4),
        "personal_word_error": round(1 - ent_ok / ent_n, 4) if ent_n else None,
        "background_word_error": round(1 - bg_ok / bg_n, 4) if bg_n else None,
        "personal_words": ent_n,
    }


@dataclass(frozen=True)
class SynthCorpus:
    """A generated corpus (see :func:`generate`).

    Attributes:
        config: the configuration it was generated from.
        clients: ground truth about every client (personal entities, topic mix, style).
        dev: N-best lists of the dev clients (client by client, in time order).
        test: N-best lists of the test clients.
        transcripts: the references of all utterances as transcripts with personal-entity spans.
        background: the background text, one sentence per item.
        stats: sizes and measured WERs (1-best, oracle, on personal and background words) per split.
    """

    config: SynthConfig
    clients: tuple[ClientProfile, ...]
    dev: tuple[NBest, ...]
    test: tuple[NBest, ...]
    transcripts: tuple[Transcript, ...]
    background: tuple[str, ...]
    stats: Mapping[str, Any]

    def manifest(self) -> dict[str, Any]:
        """What ``manifest.json`` holds: generator, version, seed, config, files, counts and WERs."""
        import privasr

        return {
            "generator": "privasr.synth",
            "privasr_version": privasr.__version__,
            "seed": self.config.seed,
            "config": self.config.to_dict(),
            "files": {
                "nbest_dev": "nbest/dev.jsonl",
                "nbest_test": "nbest/test.jsonl",
                "background": "text/background.txt",
                "transcripts_dev": "text/transcripts_dev.jsonl",
                "transcripts_test": "text/transcripts_test.jsonl",
                "clients": "clients.json",
            },
            "stats": json.loads(json.dumps(dict(self.stats))),
        }

    def write(self, out_dir: str | Path) -> dict[str, Any]:
        """Write the corpus under ``out_dir`` (created if needed) and return the manifest.

        Files: ``nbest/dev.jsonl`` and ``nbest/test.jsonl`` (canonical N-best JSON Lines, with references),
        ``text/background.txt`` (one sentence per line), ``text/transcripts_dev.jsonl`` and
        ``text/transcripts_test.jsonl`` (references with personal-entity spans, for clients' own use and
        anonymisation experiments), ``clients.json`` (ground-truth client profiles) and ``manifest.json``.

        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> m = generate(SynthConfig.preset("tiny")).write(d)
        >>> sorted(p.name for p in d.rglob("*") if p.is_file())[:3]
        ['background.txt', 'clients.json', 'dev.jsonl']
        """
        from privasr.corpus.formats.nbest_jsonl import write_nbest, write_transcripts
        from privasr.corpus.textio import open_write_text

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_nbest(out / "nbest" / "dev.jsonl", self.dev)
        write_nbest(out / "nbest" / "test.jsonl", self.test)
        split = {c.id: c.split for c in self.clients}
        write_transcripts(out / "text" / "transcripts_dev.jsonl",
                          (t for t in self.transcripts if split[t.client or ""] == "dev"))
        write_transcripts(out / "text" / "transcripts_test.jsonl",
                          (t for t in self.transcripts if split[t.client or ""] == "test"))
        with open_write_text(out / "text" / "background.txt") as f:
            for line in self.background:
                f.write(line + "\n")
        with open_write_text(out / "clients.json") as f:
            f.write(json.dumps([c.to_json() for c in self.clients], indent=1) + "\n")
        manifest = self.manifest()
        with open_write_text(out / "manifest.json") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
        return manifest


def generate(config: SynthConfig | None = None) -> SynthCorpus:
    """Generate the synthetic corpus described in the module docstring (deterministic given the seed).

    The default configuration takes a few seconds; the parts (clients, background text, acoustics) use
    independent random streams, so e.g. changing ``background_sentences`` leaves the clients' utterances
    unchanged.

    >>> c = generate(SynthConfig.preset("tiny", seed=1))
    >>> c.stats["test"]["wer_oracle"] <= c.stats["test"]["wer_1best"]
    True
    """
    cfg = config if config is not None else SynthConfig()
    if not isinstance(cfg, SynthConfig):
        raise ConfigError("synth: config must be a SynthConfig", expected="SynthConfig(...)")
    ss = np.random.SeedSequence(cfg.seed)
    rng_clients, rng_utts, rng_bg, rng_am = (np.random.default_rng(s) for s in ss.spawn(4))
    lexicon = load_cmudict()
    bg_vocab = frozenset(grammar_vocabulary())
    topics = list(TOPICS)

    clients = _make_clients(cfg, rng_clients, bg_vocab, lexicon)
    utts = _utterances(cfg, clients, rng_utts, topics)
    background: list[tuple[str, ...]] = []
    for _ in range(cfg.background_sentences):
        topic = topics[int(rng_bg.integers(len(topics)))]
        background.append(_sentence(rng_bg, topic, None, 0.0, cfg.filler_rate)[0])

    personal_all = sorted({w for cl in clients for w in cl.profile.personal_words})
    general = dict(general_english_unigrams(max(cfg.extra_lexicon, 20000)))
    extra = list(general)[: cfg.extra_lexicon]
    decoder_vocab = sorted(bg_vocab | set(personal_all) | set(extra))
    lm = _BigramLM(background, decoder_vocab, general, cfg.general_prior_weight)
    conf = Confusions.for_vocabulary(decoder_vocab, k=2 * max(1, cfg.confusions))
    dev, test, transcripts = _first_pass(utts, _Decoder(cfg, lm, conf), rng_am)

    personal = {cl.profile.id: frozenset(cl.profile.personal_words) for cl in clients}
    stats = {
        "clients": {"dev": sum(c.profile.split == "dev" for c in clients),
                    "test": sum(c.profile.split == "test" for c in clients)},
        "background_sentences": len(background),
        "background_words": sum(len(s) for s in background),
        "lexicon_size": len(decoder_vocab),
        "personal_vocabulary": len(personal_all),
        "dev": _measure(dev, personal),
        "test": _measure(test, personal),
    }
    return SynthCorpus(
        config=cfg,
        clients=tuple(cl.profile for cl in clients),
        dev=tuple(dev),
        test=tuple(test),
        transcripts=tuple(transcripts),
        background=tuple(" ".join(s) for s in background),
        stats=MappingProxyType(stats),
    )


_Utterance = tuple[_Client, int, tuple[str, ...], tuple[Span, ...], str, float, float]
"""An utterance to decode: client, index, words, entity spans, topic, start and end (seconds)."""


def _utterances(cfg: SynthConfig, clients: Sequence[_Client], rng: np.random.Generator, topics: list[str]
                ) -> list[_Utterance]:
    """Every client's utterances, client by client, in time order."""
    mean_extra = cfg.utterances_per_client - cfg.min_utterances
    utts: list[_Utterance] = []
    for cl in clients:
        rate = rng.gamma(2.0, mean_extra / 2.0) if mean_extra > 0 else 0.0
        n = int(min(cfg.max_utterances, cfg.min_utterances + rng.poisson(rate)))
        t = 0.0
        for i in range(n):
            topic = topics[int(rng.choice(len(topics), p=cl.topic_p))]
            words, spans = _sentence(rng, topic, cl, cl.profile.entity_rate, cl.profile.filler_rate)
            t += float(rng.exponential(4.0)) + 0.5
            dur = 0.3 * len(words) + float(rng.uniform(0.1, 0.6))
            utts.append((cl, i, words, spans, topic, round(t, 2), round(t + dur, 2)))
            t += dur
    return utts


def _first_pass(utts: Sequence[_Utterance], decoder: _Decoder, rng: np.random.Generator
                ) -> tuple[list[NBest], list[NBest], list[Transcript]]:
    """The dev and test N-best lists the simulated first pass gives, and every utterance's reference transcript."""
    dev: list[NBest] = []
    test: list[NBest] = []
    transcripts: list[Transcript] = []
    for cl, i, words, spans, topic, start, end in utts:
        cid = cl.profile.id
        uid = f"{cid}-{i:04d}"
        hyps = decoder.decode(words, rng, cl.profile.noise)
        meta = {"topic": topic, "start": start, "end": end}
        nb = NBest(uid, tuple(hyps), client=cid, speaker=f"{cid}-spk", order=i, ref=words, meta=meta)
        (dev if cl.profile.split == "dev" else test).append(nb)
        transcripts.append(Transcript(uid, words, client=cid, speaker=f"{cid}-spk", order=i, entities=spans,
                                      meta={"topic": topic, "start": start, "end": end}))
    return dev, test, transcripts
