"""Language models from privacy-transformed transcripts (paper 003, Figure 1, Tables 2-4), behind
``privasr anon run --config configs/anon-ami.yaml --out DIR``.

**Data.** The AMI HMNet transcripts (``ami-transcripts/AMI_proprec``): the ``train`` split's meetings are split
by a seeded permutation into the **anonymised training set** and a **clean pool** (``pool.fraction`` of the
meetings, held out: never anonymised, never in the training text). The adaptation sets are drawn from the pool:
the pool's meetings in a seeded order, turns in meeting order, cut when the set reaches ``size`` times the
token count of the (normalised) anonymised training text (12%, 15%, 20%: nested sets, the last meeting cut
at a turn). The ``dev`` split's transcripts (clean) are the development text: early stopping of the LSTMs,
the FMA ``beta`` and the EM interpolation weights. N-best rescoring uses ``ami-tts-nbest`` (its dev and test
lists come from AMI dev and test meetings, so never from the pool or the training text): weights tuned on the
dev lists, WER on the test lists; perplexities are on the test lists' references.

**Privacy transformation (section 2.1).** An entity detector (``ner: {model: finetuned}`` or ``stock``, loaded
lazily with :func:`privasr.anon.ner_model.load_detector`; a test injects its own ``detector``) finds PER/ORG/LOC/MISC
spans on the **cased** raw tokens of every training turn, each meeting one document for the detector's
document-level passes (spans are cached in ``cache_dir``). Each entity word with a letter
or digit is then replaced by a placeholder token that survives the ``ami`` normaliser (lower-case, alphabetic,
with its word index), the turn is normalised exactly like the N-best references
(:func:`privasr.experiments.text.ami_sentences`), and the placeholders are resolved (:func:`normalise_marked`):

* **surrogate text** (M1, M3, M4): each entity word becomes its same-category surrogate
  (:class:`~privasr.anon.transform.Anonymizer`, ``"surrogate"``, consistent within a meeting, seeded);
* **tagged text** (the class n-gram of M2): each entity word becomes its class token ``<PER>`` ... (one tag per
  word, so the class n-gram predicts word positions exactly as the surrogate text has them; a clitic glued to an
  entity word, ``smith's``, stays with the member word and the tag takes its place);
* the **original text** is the plain normalisation (the "original data" columns).

**Models (Stage a, Figure 1).** M1: modified Kneser-Ney word n-gram (:func:`~privasr.lm.ngram.mkn.train_mkn`).
M2: class n-gram (:func:`~privasr.lm.ngram.class_lm.train_class_lm`): MKN over the tagged text, member
distributions P(w|c) by maximum likelihood from the **anonymised data** (the surrogate words at entity
positions; for the original-data column, the original entity words). A word joins the class it was most often
a surrogate (entity) of, unless it occurs more often as a plain word (so ``may`` or ``will`` stay words). M2 is
scored as a class model (class n-gram ARPA + member table, as the paper's FST composition): expanding it into
a word ARPA multiplies class n-grams by the member counts (hundreds of surrogate names per class), so it is not
expanded. M4: an LSTM LM (:func:`~privasr.lm.neural.train.train_lm`, a small preset with a class-factored
softmax). M3: the n-gram approximation of M4 on its training text: by default (``approx.method: overwrite``,
:func:`~privasr.lm.neural.approx.overwrite_ngram`) M1's n-gram set and vocabulary (the training text's n-grams)
with the averaged LSTM probabilities, the LSTM's ``<unk>`` shared among M1's words it does not know; ``approximate``
(:func:`~privasr.lm.neural.approx.approximate_ngram`) uses the LSTM's own vocabulary, whose ``<unk>`` (every
word below ``min_count``) then gets the whole averaged ``<unk>`` probability, which in rescoring rewards
hypotheses with unknown words (it gave 51.9% test WER against 47.8% for M1 in the first full run).

**Adaptation (Stage b).** FMA (eq. 1) of M1, M2 and M3 with the unigram of each adaptation set
(:func:`~privasr.lm.adapt.fma.adaptation_unigram`, Dirichlet prior ``fma.mu`` on the background unigram of the
training text), written with the exact ARPA rewrite (:func:`~privasr.lm.adapt.fma.fma_rewrite`); ``beta`` is
chosen per model and size from ``fma.betas`` by dev perplexity. ``<unk>`` is left alone (``P_A(<unk>) =
P_B(<unk>)``, adaptation words outside the base vocabulary not counted): the clean pool holds many words the
anonymised vocabulary lacks, and boosting ``<unk>`` for them lowered perplexity but raised WER by 1.5 points in
the first full run (hypotheses full of unknown words were rewarded). For M2 the rewrite is applied to the class
n-gram (adaptation words mapped to their classes), so a member's factor is its class's. FMA cannot add words:
entity names of the clean data that the anonymised vocabulary lacks stay ``<unk>``. M4 is fine-tuned on each
adaptation set from its checkpoint with frozen layers (``lstm.finetune.freeze: output``: only the
class-softmax output layer is trained, as the paper).

**Interpolation (eq. 2)** at size ``mix.size``: ``(1-ln)(lw P_word + lc P_class) + ln P_neural`` of the adapted
models, linear in probability (:class:`~privasr.lm.mix.LinearMix`); the weights are ``mix.weights`` or, when
null, EM on the dev text (:func:`~privasr.lm.mix.estimate_weights`, SRILM compute-best-mix), reported as
``lw, lc, ln``. The neural component is adapted M3 (``+M3``) or fine-tuned M4 (``+M4``).

**Evaluation.** Perplexity on the test references (OOVs scored as each model's ``<unk>``, ``</s>`` counted, as
``privasr rescore run``). WER by N-best rescoring: ``am + w * ln P_LM + wp * n`` with the first-pass LM score
**replaced** by the system's LM (M1-M3, FMA rows, interpolations); M4 rows are second-pass rescoring on top of
the word 3-gram (``am + w1 ln P_M1 + w4 ln P_M4 + wp``; adapted rows use the adapted M1 of the same size).
Weights by coordinate descent on dev WER (:func:`privasr.rescore.search.tune`). Every row gets MAPSSWE against
``wer_baseline`` (M1 on anonymised text, no adaptation). results.json: ``wer`` (the ``primary`` system: the
adapted, interpolated word + class + neural model), ``wer_baseline``, ``wer_original`` (M1 on the original text),
``wer_rel_change``, ``mapsswe_p``, ``ppl``, ``ppl_baseline``, ``recovered_fraction`` = (wer_baseline - wer) /
(wer_baseline - wer_original) (the target is >= 0.5), and ``tables`` (2, 3, 4).

Trained models are cached in ``cache_dir`` under names keyed by a hash of everything they depend on.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import math
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.errors import ConfigError, InputError

__all__ = ["AnonRunConfig", "load_anon_config", "run_anon", "normalise_marked", "TurnTexts", "build_turn_texts",
           "entity_class_map", "split_meetings", "draw_adaptation_sets", "eq2_weights", "SYSTEMS",
           "export_first_pass_arpa"]

_TOP = ("name", "seed", "data", "ner", "pool", "adaptation", "order", "fma", "lstm", "approx", "mix", "primary",
        "search", "eval", "cache_dir", "export_arpa")
SYSTEMS = ("wc", "wc_m3", "wc_m4")
"""The interpolated systems of Table 4: word + class, + adapted M3, + fine-tuned M4 (``primary`` is one)."""
_FALLBACK = (0.5, 1.0, 1.5)  # lmplz --discount_fallback: only where the closed-form discounts fail (tiny data)
_PLACEHOLDER = re.compile(r"^zqx(per|org|loc|misc)(\d+)zqx(.*)$")


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class AnonRunConfig:
    """A validated anonymised-LM experiment config (:func:`load_anon_config`); ``raw`` is the resolved dict."""

    name: str
    seed: int
    transcripts: Path
    dev: Path
    test: Path
    ner: str
    pool_fraction: float
    sizes: tuple[float, ...]
    mix_size: float
    order: int
    betas: tuple[float, ...]
    mu: float
    lstm: dict[str, Any]
    approx_topk: int
    mix_weights: dict[str, float] | None
    primary: str
    search: Any
    bootstrap_resamples: int
    cache_dir: Path | None
    raw: Mapping[str, Any] = field(repr=False)
    approx_method: str = "overwrite"
    export_arpa: bool = False


def _fraction(v: Any, where: str, *, closed: bool = True) -> float:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and 0 < v and (
        v <= 1 if closed else v < 1)
    if not ok:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a fraction in (0, 1" + ("]" if closed else ")"))
    return float(v)


def load_anon_config(config: Mapping[str, Any], *, check_files: bool = True) -> AnonRunConfig:
    """Validate a config (see ``configs/anon-ami.yaml``) before any work starts; unknown keys are errors.

    >>> cfg = load_anon_config({"data": {"transcripts": "t", "dev": "d", "test": "x"}}, check_files=False)
    >>> cfg.sizes, cfg.mix_size, cfg.primary, cfg.lstm["preset"]
    ((0.12, 0.15, 0.2), 0.12, 'wc_m4', 'small-lstm-class')
    >>> load_anon_config({"data": {"transcripts": "t", "dev": "d", "test": "x"}, "pool": {"fraction": 2}},
    ...                  check_files=False)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'pool.fraction' is 2 (expected a fraction in (0, 1))
    """
    from privasr.lm.neural.train import FREEZE_CHOICES
    from privasr.rescore.run import (
        SearchConfig,
        _int,
        _mapping,
        _path,
        _ranges,
        _str,
        _train_options,
        expand_vars,
    )

    raw = _mapping(copy.deepcopy(dict(config)), "config", _TOP)
    name = _str(raw.get("name", "anon"), "name")
    seed = _int(raw.get("seed", 0), "seed", 0)
    data = _mapping(raw.get("data"), "data", ("transcripts", "dev", "test"))
    for k in ("transcripts", "dev", "test"):
        if k not in data:
            raise ConfigError(f"config key 'data.{k}' is missing",
                              expected="{transcripts: AMI_proprec folder, dev: N-best, test: N-best}")
    transcripts = _path(data["transcripts"], "data.transcripts", check_files, kind="folder")
    dev = _path(data["dev"], "data.dev", check_files)
    test = _path(data["test"], "data.test", check_files)
    ner = _mapping(raw.get("ner", {}), "ner", ("model",))
    ner_model = _str(ner.get("model", "stock"), "ner.model")
    pool = _mapping(raw.get("pool", {}), "pool", ("fraction",))
    pool_fraction = _fraction(pool.get("fraction", 0.2), "pool.fraction", closed=False)
    ad = _mapping(raw.get("adaptation", {}), "adaptation", ("sizes",))
    sizes_raw = ad.get("sizes", [0.12, 0.15, 0.2])
    if not isinstance(sizes_raw, list | tuple) or not sizes_raw:
        raise ConfigError(f"config key 'adaptation.sizes' is {sizes_raw!r}", expected="a non-empty list of fractions")
    sizes = tuple(sorted({_fraction(s, "adaptation.sizes") for s in sizes_raw}))
    order = _int(raw.get("order", 3), "order", 1, 6)
    fma = _mapping(raw.get("fma", {}), "fma", ("betas", "mu"))
    betas_raw = fma.get("betas", [0.25, 0.5, 0.75, 1.0])
    if not isinstance(betas_raw, list | tuple) or not betas_raw:
        raise ConfigError(f"config key 'fma.betas' is {betas_raw!r}", expected="a non-empty list of numbers >= 0")
    betas = []
    for b in betas_raw:
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b < 0:
            raise ConfigError(f"config key 'fma.betas' holds {b!r}", expected="numbers >= 0")
        betas.append(float(b))
    mu = fma.get("mu", 1000.0)
    if isinstance(mu, bool) or not isinstance(mu, int | float) or not math.isfinite(mu) or mu <= 0:
        raise ConfigError(f"config key 'fma.mu' is {mu!r}", expected="a number > 0")
    lstm = _mapping(raw.get("lstm", {}), "lstm", ("preset", "model", "options", "seed", "finetune", "device",
                                                  "batch_tokens"))
    try:
        from privasr.lm.neural.models import PRESETS, NeuralLMConfig
    except ImportError:  # pragma: no cover - torch missing
        raise ConfigError("config key 'lstm': neural LMs need torch", expected="pip install privasr[neural]") from None
    preset = _str(lstm.get("preset", "small-lstm-class"), "lstm.preset", sorted(PRESETS))
    model = _mapping(lstm.get("model", {}), "lstm.model")
    try:
        arch = NeuralLMConfig.preset(preset).replace(**model).arch
    except ConfigError as e:
        raise ConfigError(f"config key 'lstm.model': {e.message}", expected=e.expected) from None
    if arch != "lstm":
        raise ConfigError(f"config key 'lstm.preset' is {preset!r} ({arch})", expected="an LSTM preset")
    options = _mapping(lstm.get("options", {}), "lstm.options")
    _train_options(options, "lstm.options")
    ft = _mapping(lstm.get("finetune", {}), "lstm.finetune", ("freeze", "options"))
    freeze = _str(ft.get("freeze", "output"), "lstm.finetune.freeze", FREEZE_CHOICES)
    ft_options = _mapping(ft.get("options", {}), "lstm.finetune.options")
    _train_options(ft_options, "lstm.finetune.options")
    lstm_cfg = {"preset": preset, "model": model, "options": options, "seed": _int(lstm.get("seed", 0), "lstm.seed", 0),
                "freeze": freeze, "finetune_options": ft_options,
                "device": _str(lstm.get("device", "cpu"), "lstm.device"),
                "batch_tokens": _int(lstm.get("batch_tokens", 4096), "lstm.batch_tokens", 1)}
    approx = _mapping(raw.get("approx", {}), "approx", ("method", "topk"))
    approx_method = _str(approx.get("method", "overwrite"), "approx.method", ("overwrite", "approximate"))
    topk = _int(approx.get("topk", 0), "approx.topk", 0)
    mix = _mapping(raw.get("mix", {}), "mix", ("size", "weights"))
    mix_size = _fraction(mix.get("size", sizes[0]), "mix.size")
    if not any(abs(mix_size - s) < 1e-12 for s in sizes):
        raise ConfigError(f"config key 'mix.size' is {mix_size!r}", expected=f"one of adaptation.sizes {list(sizes)}")
    weights = mix.get("weights")
    mix_weights = None
    if weights is not None:
        w = _mapping(weights, "mix.weights", ("word", "class", "neural"))
        if set(w) != {"word", "class", "neural"}:
            raise ConfigError("config key 'mix.weights' needs word, class and neural",
                              expected="{word: 0.3, class: 0.7, neural: 0.4} (eq. 2), or null for EM on dev")
        mix_weights = {k: _fraction(v, f"mix.weights.{k}") if v != 0 else 0.0 for k, v in w.items()}
        if abs(mix_weights["word"] + mix_weights["class"] - 1.0) > 1e-9 or mix_weights["neural"] >= 1:
            raise ConfigError("config key 'mix.weights': word + class must be 1 and neural < 1",
                              expected="eq. 2: (1-ln)(lw P_w + lc P_c) + ln P_n")
    primary = _str(raw.get("primary", "wc_m4"), "primary", SYSTEMS)
    s = _mapping(raw.get("search", {}), "search", ("ranges", "max_rounds", "coarse_points", "restarts"))
    ranges = _ranges(s.get("ranges", {}))
    bad = sorted(set(ranges) - {"lm", "word_penalty"})
    if bad:
        raise ConfigError(f"config key 'search.ranges.{bad[0]}' is not a parameter",
                          expected="lm (every LM weight) and word_penalty")
    search = SearchConfig(method="coordinate", ranges=ranges,
                          max_rounds=_int(s.get("max_rounds", 20), "search.max_rounds", 1),
                          coarse_points=_int(s.get("coarse_points", 7), "search.coarse_points", 2),
                          restarts=_int(s.get("restarts", 3), "search.restarts", 0))
    ev = _mapping(raw.get("eval", {}), "eval", ("bootstrap_resamples",))
    resamples = _int(ev.get("bootstrap_resamples", 1000), "eval.bootstrap_resamples", 1)
    cache = raw.get("cache_dir")
    cache_dir = Path(expand_vars(_str(cache, "cache_dir"))) if cache is not None else None
    export = raw.get("export_arpa", False)
    if not isinstance(export, bool):
        raise ConfigError(f"config key 'export_arpa' is {export!r}", expected="true or false")
    return AnonRunConfig(name, seed, transcripts, dev, test, ner_model, pool_fraction, sizes, mix_size, order,
                         tuple(betas), float(mu), lstm_cfg, topk, mix_weights, primary, search, resamples, cache_dir,
                         raw, approx_method, export)


# ------------------------------------------------------------------------------------------------ texts


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
    from privasr.lm.ngram.classes import ClassMap

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


def split_meetings(meetings: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """``(training meetings, pool meetings)``: ``ceil(fraction * n)`` meetings of a seeded permutation of the
    sorted ids are the clean pool (at least one, at most ``n - 1``).

    >>> split_meetings(["a", "b", "c", "d", "e"], 0.2, 0)[1]
    ['d']
    """
    ms = sorted(set(meetings))
    if len(ms) < 2:
        raise InputError(f"{len(ms)} training meeting(s)", expected="at least 2 (training set and clean pool)")
    perm = np.random.default_rng([int(seed), 3]).permutation(len(ms))
    n_pool = min(len(ms) - 1, max(1, math.ceil(fraction * len(ms))))
    pool = sorted(ms[i] for i in perm[:n_pool])
    return [m for m in ms if m not in set(pool)], pool


def draw_adaptation_sets(pool: Mapping[str, Sequence[Sequence[str]]], train_tokens: int, sizes: Sequence[float],
                         seed: int) -> dict[float, list[tuple[str, ...]]]:
    """Nested adaptation sets from the clean pool: its meetings in a seeded order, each meeting's turns in order,
    cut when the set holds ``size * train_tokens`` tokens.

    Raises:
        InputError: the pool is smaller than the largest set.

    >>> pool = {"m1": [("a", "b"), ("c",)], "m2": [("d", "e", "f")]}
    >>> sets = draw_adaptation_sets(pool, 10, [0.2, 0.5], seed=0)
    >>> [sum(map(len, s)) for s in sets.values()]
    [3, 5]
    """
    order = sorted(pool)
    perm = np.random.default_rng([int(seed), 5]).permutation(len(order))
    stream = [tuple(s) for i in perm for s in pool[order[i]]]
    out: dict[float, list[tuple[str, ...]]] = {}
    total = sum(map(len, stream))
    for size in sorted(sizes):
        need = size * train_tokens
        if total < need:
            raise InputError(f"the clean pool has {total} tokens; the {size:g} adaptation set needs {need:.0f}",
                             expected="a larger pool.fraction or smaller adaptation.sizes")
        got, n = 0, 0
        while got < need:
            got += len(stream[n])
            n += 1
        out[size] = stream[:n]
    return out


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


# ------------------------------------------------------------------------------------------------ plumbing


class _Memo:
    """A :class:`~privasr.lm.base.LanguageModel` that remembers every sentence score of the one it wraps, so
    mixtures, perplexities and rescoring share the component scores."""

    def __init__(self, lm: Any) -> None:
        self.lm = lm
        self.order = lm.order
        self._c: dict[tuple[str, ...], Any] = {}

    def __contains__(self, word: object) -> bool:
        return word in self.lm

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> Any:
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True, eos: bool = True) -> list[Any]:
        if not (bos and eos):
            return self.lm.score_batch(sentences, bos=bos, eos=eos)
        keys = [tuple(s) for s in sentences]
        todo = list(dict.fromkeys(k for k in keys if k not in self._c))
        for i in range(0, len(todo), 4096):
            chunk = todo[i:i + 4096]
            for k, r in zip(chunk, self.lm.score_batch(chunk, bos=True, eos=True), strict=True):
                self._c[k] = r
        return [self._c[k] for k in keys]


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:16]


def _text_sha(sentences: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(" ".join(s).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()[:16]


def _load_detector(spec: str) -> tuple[Any, str]:
    """The config's detector and a name for the span cache; ``finetuned`` is resolved to its cached folder, whose
    name holds the key of the training data and config, so a retrained model never reuses stale spans."""
    from privasr.anon.ner_model import finetuned_model, load_detector

    if spec == "finetuned":
        folder = finetuned_model()
        return load_detector(str(folder)), f"privasr.anon.ner:finetuned:{folder.name}"
    return load_detector(spec), f"privasr.anon.ner:{spec}"


def _detect(detector: Any, det_name: str, turns: Sequence[Any], cache: Path | None) -> list[list[Any]]:
    from privasr.anon import ner
    from privasr.anon.ner import detect_grouped
    from privasr.anon.transform import EntitySpan

    sents = [list(t.words) for t in turns]
    groups = [t.client or "" for t in turns]  # a meeting is one document for the document-level passes
    path = None
    if cache is not None:
        # the detector module's source is part of the key: a changed rule never reuses stale spans
        code = hashlib.sha256(Path(ner.__file__).read_bytes()).hexdigest()
        path = cache / f"ner-{_sha([det_name, code, _text_sha(sents), *groups])}.json.gz"
        if path.is_file():
            data = json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
            return [[EntitySpan(a, b, c) for a, b, c in row] for row in data]
    spans = detect_grouped(detector, sents, groups)
    if len(spans) != len(sents):
        raise InputError(f"the entity detector returned {len(spans)} span lists for {len(sents)} turns",
                         expected="one list per turn")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [[[s.start, s.end, s.label] for s in row] for row in spans]
        path.write_bytes(gzip.compress(json.dumps(rows).encode("utf-8")))
    return [list(r) for r in spans]


class _Store:
    """Models cached in ``cache_dir`` by key (ARPA + JSON, or a neural checkpoint)."""

    def __init__(self, cache: Path | None) -> None:
        self.cache = cache
        self.info: dict[str, Any] = {}

    def ngram(self, name: str, key: Mapping[str, Any], build: Any) -> Any:
        from privasr.lm.ngram.arpa import read_arpa, write_arpa

        t0 = time.perf_counter()
        full = {**key, "version": __version__}
        path = self.cache / f"{name}-{_sha(full)}.arpa" if self.cache is not None else None
        if path is not None and path.is_file():
            lm = read_arpa(path)
            self.info[name] = {"cached": True, "arpa": str(path)}
        else:
            lm = build()
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                write_arpa(lm, tmp)
                tmp.replace(path)
                lm = read_arpa(path)
            self.info[name] = {"cached": False, "arpa": str(path) if path else None}
        self.info[name].update(seconds=time.perf_counter() - t0,
                               ngrams=[int(lm.num_ngrams(n)) for n in range(1, lm.order + 1)])
        return lm

    def neural(self, name: str, key: Mapping[str, Any], train: Any, device: str) -> Any:
        from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint

        t0 = time.perf_counter()
        full = {**key, "version": __version__}
        path = self.cache / f"{name}-{_sha(full)}.pt" if self.cache is not None else None
        if path is not None and path.is_file():
            ck = load_checkpoint(path, map_location=device)
            self.info[name] = {"cached": True, "checkpoint": str(path), "training": ck.extra.get("training")}
            return ck
        res = train()
        training = {k: json.loads(json.dumps(getattr(res, k, None), default=str))
                    for k in ("best_valid_ppl", "best_epoch", "initial_valid_ppl", "steps", "tokens_per_s",
                              "stopped_early")}
        training["train_s"] = time.perf_counter() - t0
        self.info[name] = {"cached": False, "training": training}
        if path is None:
            from privasr.lm.neural.checkpoint import Checkpoint

            return Checkpoint(res.model, res.vocab, res.config, {"training": training})
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, res.model, res.vocab, res.model.config, extra={"key": full, "training": training})
        self.info[name]["checkpoint"] = str(path)
        return load_checkpoint(path, map_location=device)


# ------------------------------------------------------------------------------------------------ the run


def _neutral_unk(pa: Mapping[str, float], pb: Mapping[str, float]) -> dict[str, float]:
    """``pa`` with ``P_A(<unk>) = P_B(<unk>)`` (so FMA leaves ``<unk>`` alone: alpha = 1) and the other words
    rescaled to fill the rest.

    >>> _neutral_unk({"<unk>": 0.5, "a": 0.25, "b": 0.25}, {"<unk>": 0.1, "a": 0.45, "b": 0.45})
    {'<unk>': 0.1, 'a': 0.45, 'b': 0.45}
    """
    from privasr.lm.base import UNK

    if UNK not in pa or UNK not in pb:
        return dict(pa)
    u = float(pb[UNK])
    rest = math.fsum(v for k, v in pa.items() if k != UNK)
    return {k: (u if k == UNK else v * (1.0 - u) / rest) for k, v in pa.items()}


def _pct_name(size: float) -> str:
    return f"{round(100 * size):d}"


def run_anon(cfg: AnonRunConfig, out: str | Path, *, detector: Any = None,
             argv: Sequence[str] | None = None, progress: Any = None) -> dict[str, Any]:
    """Run a validated config; write ``out/results.json`` and ``out/report.md``; return the metrics.

    ``detector`` (anything with ``detect(sentences) -> list[list[EntitySpan]]``) replaces the one the config's
    ``ner.model`` names; ``progress`` (a callable taking a string) hears about each stage.
    """

    def say(msg: str) -> None:
        if progress is not None:
            progress(f"[{time.perf_counter() - t_start:7.1f}s] {msg}")

    from privasr.anon.transform import Anonymizer
    from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
    from privasr.corpus.load import load_nbest
    from privasr.corpus.phonetics import load_cmudict
    from privasr.lm.adapt.fma import adaptation_unigram, fma_rewrite, text_unigram
    from privasr.lm.base import closed_vocab_perplexity
    from privasr.lm.mix import LinearMix, estimate_weights
    from privasr.lm.ngram.class_lm import ClassNgramModel, train_class_lm
    from privasr.lm.ngram.mkn import train_mkn
    from privasr.results import write_results
    from privasr.text.normalize import Normalizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    cache = cfg.cache_dir if cfg.cache_dir is not None else out / "cache"
    store = _Store(cache)

    # ---- data
    t0 = time.perf_counter()
    train_dir, dev_dir = cfg.transcripts / "train", cfg.transcripts / "dev"
    for d in (train_dir, dev_dir):
        if not d.is_dir():
            raise InputError("no such AMI_proprec split folder", path=d, expected="train/ and dev/ sub-folders")
    norm = Normalizer.preset("ami", vocabulary=frozenset(load_cmudict()))
    all_train = list(read_ami_hmnet(train_dir))
    meetings = [t.client or "" for t in all_train]
    train_meetings, pool_meetings = split_meetings(meetings, cfg.pool_fraction, cfg.seed)
    train_set = set(train_meetings)
    train_turns = [t for t in all_train if (t.client or "") in train_set]
    pool: dict[str, list[tuple[str, ...]]] = {}
    for t in all_train:
        if (t.client or "") not in train_set:
            w = norm(t.words)
            if w:
                pool.setdefault(t.client or "", []).append(w)
    dev_text = [w for w in (norm(t.words) for t in read_ami_hmnet(dev_dir)) if w]
    dev_nb = load_nbest(cfg.dev, None)
    test_nb = load_nbest(cfg.test, None)
    for name, recs in (("dev", dev_nb), ("test", test_nb)):
        for nb in recs:
            if nb.ref is None:
                raise InputError(f"{name} utterance {nb.utt_id} has no reference", path=cfg.dev if name == "dev"
                                 else cfg.test, expected="references (WER is tuned on dev and measured on test)")
            if any("am" not in h.scores for h in nb.hyps):
                raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without an am score",
                                 expected="am scores (the first-pass LM score is replaced by the new LMs)")
        clash = sorted({nb.client for nb in recs if nb.client} & set(meetings))
        if clash:
            raise InputError(f"the {name} N-best meetings include training meeting {clash[0]}",
                             expected="N-best sets from meetings outside the training split")
    test_refs = [tuple(nb.ref or ()) for nb in test_nb]
    timings["data_s"] = time.perf_counter() - t0

    say(f"data: {len(all_train)} train turns, {len(pool_meetings)} pool meetings; entity detection")
    # ---- entities and the transformed texts
    t0 = time.perf_counter()
    if detector is None:
        detector, det_name = _load_detector(cfg.ner)
    else:
        det_name = str(getattr(detector, "name", type(detector).__qualname__))
    spans = _detect(detector, det_name, train_turns, cache)
    timings["ner_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    turns = build_turn_texts(train_turns, spans, Anonymizer("surrogate", cfg.seed), norm)
    orig_text = [t.original for t in turns]
    sur_text = [t.surrogate for t in turns]
    tag_text = [t.tagged for t in turns]
    train_tokens = sum(map(len, sur_text))
    adapt = draw_adaptation_sets(pool, train_tokens, cfg.sizes, cfg.seed)
    ent_counts = Counter(lab for t in turns for lab in t.labels if lab is not None)
    entity_words = {w for t in turns for w in t.original_members}
    timings["texts_s"] = time.perf_counter() - t0
    data_info = {
        "train_meetings": len(train_meetings), "pool_meetings": pool_meetings, "train_turns": len(turns),
        "train_tokens": train_tokens, "original_tokens": sum(map(len, orig_text)),
        "entity_tokens": dict(sorted(ent_counts.items())), "entity_types": len(entity_words),
        "pool_tokens": sum(len(s) for v in pool.values() for s in v),
        "adaptation_tokens": {_pct_name(s): sum(map(len, a)) for s, a in adapt.items()},
        "adaptation_turns": {_pct_name(s): len(a) for s, a in adapt.items()},
        "dev_text_sentences": len(dev_text), "dev_text_tokens": sum(map(len, dev_text)),
        "dev_utterances": len(dev_nb), "test_utterances": len(test_nb), "detector": det_name,
        "entity_word_tokens": sum(ent_counts.values()),
    }

    say(f"texts built: {train_tokens} anonymised training tokens, entities {dict(ent_counts)}; n-grams")
    # ---- Stage (a): M1-M4 on the anonymised and on the original text
    t0 = time.perf_counter()
    texts = {"anon": sur_text, "orig": orig_text}
    lms: dict[str, Any] = {}
    bases: dict[str, Any] = {}  # n-gram models FMA rewrites (M2: the class n-gram)
    cmaps = {"anon": entity_class_map(turns, "surrogate"), "orig": entity_class_map(turns, "original")}
    for col, text in texts.items():
        m1 = store.ngram(f"m1_{col}", {"text": _text_sha(text), "order": cfg.order},
                         lambda text=text: train_mkn(text, cfg.order, discount_fallback=_FALLBACK))
        bases[f"m1_{col}"] = m1
        lms[f"m1_{col}"] = m1
        cm = cmaps[col]
        cls_key = {"text": _text_sha(tag_text), "classes": _sha({c: cm.expansions[c] for c in cm.classes}),
                   "order": cfg.order}
        c_ng = store.ngram(f"m2class_{col}", cls_key,
                           lambda cm=cm: train_class_lm(tag_text, cm, cfg.order, member_probs="file",
                                                            discount_fallback=_FALLBACK).class_lm)
        m2 = ClassNgramModel(c_ng, cm, {c: cm.file_probs(c) for c in cm.classes})
        bases[f"m2_{col}"] = c_ng
        lms[f"m2_{col}"] = m2
    timings["ngram_s"] = time.perf_counter() - t0

    say("LSTMs (M4)")
    t0 = time.perf_counter()
    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.neural.train import TrainOptions, set_num_threads, train_lm

    del set_num_threads  # threads follow OMP_NUM_THREADS / torch defaults
    lc = cfg.lstm
    ncfg = NeuralLMConfig.preset(lc["preset"]).replace(**lc["model"])
    opts = TrainOptions(**lc["options"])
    ft_opts = TrainOptions(**lc["finetune_options"])
    dev_sha = _text_sha(dev_text)
    ckpts: dict[str, Any] = {}

    def neural_lm(ck: Any) -> Any:
        return NeuralLM(ck.model, ck.vocab, device=lc["device"], batch_tokens=lc["batch_tokens"], spread_unk=True)

    for col, text in texts.items():
        key = {"text": _text_sha(text), "valid": dev_sha, "model": ncfg.to_dict(), "options": opts.to_dict(),
               "seed": lc["seed"]}
        ck = store.neural(f"m4_{col}", key, lambda text=text: train_lm(
            text, dev_text, ncfg, opts, seed=lc["seed"], device=lc["device"], progress=False), lc["device"])
        ckpts[f"m4_{col}"] = (ck, key)
        lms[f"m4_{col}"] = neural_lm(ck)
    timings["lstm_s"] = time.perf_counter() - t0
    say("n-gram approximations (M3)")
    t0 = time.perf_counter()
    from privasr.lm.neural.approx import approximate_ngram, overwrite_ngram

    for col, text in texts.items():
        m4 = lms[f"m4_{col}"]
        key = {"m4": ckpts[f"m4_{col}"][1], "text": _text_sha(text), "order": cfg.order,
               "method": cfg.approx_method}
        if cfg.approx_method == "overwrite":
            key["base"] = store.info[f"m1_{col}"].get("arpa")
            m3 = store.ngram(f"m3_{col}", key, lambda m4=m4, text=text, col=col: overwrite_ngram(
                m4, bases[f"m1_{col}"], text, batch_tokens=lc["batch_tokens"]))
        else:
            key["topk"] = cfg.approx_topk
            m3 = store.ngram(f"m3_{col}", key, lambda m4=m4, text=text: approximate_ngram(
                m4, text, cfg.order, topk=cfg.approx_topk, batch_tokens=lc["batch_tokens"]))
        bases[f"m3_{col}"] = m3
        lms[f"m3_{col}"] = m3
    timings["approx_s"] = time.perf_counter() - t0
    for k in list(lms):
        lms[k] = _Memo(lms[k])

    say("FMA")
    # ---- Stage (b): FMA of M1, M2, M3 and fine-tuning of M4 on each adaptation set
    t0 = time.perf_counter()
    fma_info: dict[str, Any] = {}
    m2a: ClassNgramModel = lms["m2_anon"].lm
    base_text = {"m1": sur_text, "m3": sur_text, "m2": [m2a.map_words(s) for s in tag_text]}
    base_uni = {m: text_unigram(base_text[m], bases[f"{m}_anon"], k=0.5) for m in ("m1", "m2", "m3")}
    for size, a_text in adapt.items():
        p = _pct_name(size)
        for m in ("m1", "m2", "m3"):
            base = bases[f"{m}_anon"]
            a_sents = [m2a.map_words(s) for s in a_text] if m == "m2" else a_text
            known = set(base.vocab)
            a_sents = [[w for w in s if w in known] for s in a_sents]
            pa = _neutral_unk(adaptation_unigram(a_sents, base, mu=cfg.mu, base_unigram=base_uni[m]), base_uni[m])
            trace = []
            for beta in cfg.betas:
                ad = fma_rewrite(base, pa, beta, base_unigram=base_uni[m])
                cand = ClassNgramModel(ad, m2a.classes, m2a.member_probs) if m == "m2" else ad
                trace.append({"beta": beta, "dev_ppl": closed_vocab_perplexity(cand, dev_text)})
            best = min(trace, key=lambda r: (r["dev_ppl"], r["beta"]))
            key = {"base": store.info[f"{m}class_anon" if m == "m2" else f"{m}_anon"].get("arpa"),
                   "adapt": _text_sha(a_text), "beta": best["beta"], "mu": cfg.mu, "unk": "neutral"}
            ad = store.ngram(f"{m}_fma{p}", key, lambda base=base, pa=pa, b=best["beta"], m=m:
                             fma_rewrite(base, pa, b, base_unigram=base_uni[m]))
            lms[f"{m}_fma{p}"] = _Memo(ClassNgramModel(ad, m2a.classes, m2a.member_probs) if m == "m2" else ad)
            fma_info[f"{m}_fma{p}"] = {"beta": best["beta"], "beta_trace": trace}
    timings["fma_s"] = time.perf_counter() - t0
    say("fine-tuning M4")
    t0 = time.perf_counter()
    ck_anon, key_anon = ckpts["m4_anon"]
    for size, a_text in adapt.items():
        p = _pct_name(size)
        key = {"init": key_anon, "adapt": _text_sha(a_text), "valid": dev_sha, "options": ft_opts.to_dict(),
               "freeze": lc["freeze"], "seed": lc["seed"]}
        ck = store.neural(f"m4_ft{p}", key, lambda a_text=a_text: train_lm(
            a_text, dev_text, None, ft_opts, init=ck_anon, freeze=lc["freeze"], seed=lc["seed"],
            device=lc["device"], progress=False), lc["device"])
        lms[f"m4_ft{p}"] = _Memo(neural_lm(ck))
    timings["finetune_s"] = time.perf_counter() - t0

    say("interpolation weights")
    # ---- interpolation (eq. 2) at mix.size
    t0 = time.perf_counter()
    p = _pct_name(cfg.mix_size)
    comps = {"wc": [f"m1_fma{p}", f"m2_fma{p}"], "wc_m3": [f"m1_fma{p}", f"m2_fma{p}", f"m3_fma{p}"],
             "wc_m4": [f"m1_fma{p}", f"m2_fma{p}", f"m4_ft{p}"]}
    mix_info: dict[str, Any] = {}
    for sysname, names in comps.items():
        models = [lms[n] for n in names]
        if cfg.mix_weights is not None:
            mw = cfg.mix_weights
            w = [mw["word"], mw["class"]] if len(names) == 2 else [
                (1 - mw["neural"]) * mw["word"], (1 - mw["neural"]) * mw["class"], mw["neural"]]
            mix_info[sysname] = {"weights": w, "eq2": eq2_weights(w), "source": "config"}
        else:
            em = estimate_weights(models, dev_text)
            w = list(em.weights)
            mix_info[sysname] = {"weights": w, "eq2": eq2_weights(w), "source": "EM on dev text",
                                 "dev_ppl": em.ppl, "iterations": len(em.iterations)}
        lms[f"mix_{sysname}"] = _Memo(LinearMix(models, w))
    timings["mix_s"] = time.perf_counter() - t0
    arpa_info = None
    if cfg.export_arpa:
        say("writing the word ARPA models for first-pass decoding")
        t0 = time.perf_counter()
        arpa_info = export_first_pass_arpa(Path(out) / "arpa", lms, bases, mix_info["wc_m3"]["weights"], p)
        timings["export_arpa_s"] = time.perf_counter() - t0

    say("perplexities")
    # ---- perplexities
    t0 = time.perf_counter()
    ppl = {n: closed_vocab_perplexity(m, test_refs) for n, m in lms.items()}
    oov = {n: float(np.mean(np.concatenate([s.oov for s in m.score_batch(test_refs)]))) for n, m in lms.items()}
    timings["ppl_s"] = time.perf_counter() - t0

    say("rescoring")
    # ---- rescoring: every system tuned on dev, applied to test
    t0 = time.perf_counter()
    systems: dict[str, tuple[str, ...]] = {}
    for col in ("anon", "orig"):
        for m in ("m1", "m2", "m3"):
            systems[f"{m}_{col}"] = (f"{m}_{col}",)
        systems[f"m4_{col}"] = (f"m1_{col}", f"m4_{col}")
    for size in cfg.sizes:
        q = _pct_name(size)
        for m in ("m1", "m2", "m3"):
            systems[f"{m}_fma{q}"] = (f"{m}_fma{q}",)
        systems[f"m4_ft{q}"] = (f"m1_fma{q}", f"m4_ft{q}")
    for sysname in SYSTEMS:
        systems[f"mix_{sysname}"] = (f"mix_{sysname}",)
    results = _rescore_all(cfg, dev_nb, test_nb, lms, systems)
    timings["rescore_s"] = time.perf_counter() - t0

    # ---- metrics and tables
    from privasr.metrics import mapsswe, paired_bootstrap

    base_words = results["m1_anon"]["words"]
    ids = [nb.utt_id for nb in test_nb]
    rows: dict[str, dict[str, Any]] = {}
    for sysname, r in results.items():
        mp = mapsswe(test_refs, r["words"], base_words, ids=ids)
        lm_name = systems[sysname][-1]
        rows[sysname] = {"system": sysname, "lms": list(systems[sysname]), "wer": r["wer"], "ppl": ppl[lm_name],
                         "oov_rate": oov[lm_name], "mapsswe_p_vs_baseline": mp.p,
                         "better": {"A": "system", "B": "baseline", "same": "same"}[mp.better],
                         "dev_wer": r["dev_wer"], "weights": r["weights"]}
    prim = f"mix_{cfg.primary}"
    w_new, w_base, w_orig = results[prim]["wer_obj"], results["m1_anon"]["wer_obj"], results["m1_orig"]["wer_obj"]
    bs = paired_bootstrap(w_new.utt_errors, w_base.utt_errors, w_new.utt_ref_words, seed=cfg.seed,
                          resamples=cfg.bootstrap_resamples)
    lost = w_base.wer - w_orig.wer
    recovered = (w_base.wer - w_new.wer) / lost if lost > 0 else None
    tables = {
        "table2": [{"model": m.upper(), "anonymised": rows[f"{m}_anon"], "original": rows[f"{m}_orig"]}
                   for m in ("m1", "m2", "m3", "m4")],
        "table3": [{"model": m.upper(), **{_pct_name(s): rows[f"{m}_fma{_pct_name(s)}" if m != "m4"
                                                             else f"m4_ft{_pct_name(s)}"] for s in cfg.sizes}}
                   for m in ("m1", "m2", "m3", "m4")],
        "table4": [{**rows[f"mix_{s}"], **mix_info[s],
                    "system": {"wc": "M1 + M2", "wc_m3": "M1 + M2 + M3", "wc_m4": "M1 + M2 + M4"}[s]}
                   for s in SYSTEMS],
    }
    metrics: dict[str, Any] = {
        "wer": w_new.wer, "wer_baseline": w_base.wer, "wer_original": w_orig.wer,
        "wer_rel_change": (w_new.wer - w_base.wer) / w_base.wer if w_base.wer > 0 else None,
        "mapsswe_p": rows[prim]["mapsswe_p_vs_baseline"], "mapsswe_better": rows[prim]["better"],
        "mapsswe_p_original_vs_baseline": rows["m1_orig"]["mapsswe_p_vs_baseline"],
        "ppl": ppl[prim], "ppl_baseline": ppl["m1_anon"], "ppl_original": ppl["m1_orig"],
        "wer_lost_to_anonymisation": lost, "recovered_fraction": recovered,
        "ppl_lost_to_anonymisation": ppl["m1_anon"] - ppl["m1_orig"],
        "ppl_recovered_fraction": ((ppl["m1_anon"] - ppl[prim]) / (ppl["m1_anon"] - ppl["m1_orig"])
                                   if ppl["m1_anon"] > ppl["m1_orig"] else None),
        "target_met": bool(recovered is not None and recovered >= 0.5),
        "primary": cfg.primary, "bootstrap_ci_low": bs.ci_low, "bootstrap_ci_high": bs.ci_high,
        "bootstrap_prob_improvement": bs.prob_a_better, "wer_first_pass": results["m1_anon"]["wer_first_pass"],
        "test_utterances": len(test_nb), "test_ref_words": w_new.ref_words,
    }
    timings["total_s"] = time.perf_counter() - t_start
    metrics.update(timings)
    extra = {"tables": tables, "systems": rows, "fma": fma_info, "mix": mix_info, "data_info": data_info,
             "models": store.info, "ppl_by_lm": ppl, "oov_rate_by_lm": oov, "first_pass_arpa": arpa_info,
             "command": list(argv) if argv is not None else None}
    write_results(out, config=dict(cfg.raw), seed=cfg.seed, metrics=metrics,
                  data={"dev": cfg.dev, "test": cfg.test}, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tables, data_info), encoding="utf-8")
    return metrics


FIRST_PASS_MAX_NGRAMS = 3_000_000
"""The largest word expansion of M2 written for a first-pass decoder (pocketsphinx loads a few million n-grams)."""
_TOP_MEMBERS = (None, 500, 200, 100, 50, 20, 10, 5, 2, 1)


def _fit_expansion(model: Any, limit: int) -> tuple[Any, int | None]:
    """The exact word expansion of a class LM if it has at most ``limit`` n-grams, else the one that keeps the
    most members per class (of :data:`_TOP_MEMBERS`) and fits; returns it and that member count (None: all)."""
    from privasr.lm.ngram.class_lm import expand_to_word_arpa

    for k in _TOP_MEMBERS:
        try:
            return expand_to_word_arpa(model, max_ngrams=limit, top_members=k), k
        except InputError as e:
            if "would have" not in e.message:
                raise
    raise InputError(f"even one member per class gives more than {limit:,} n-grams", expected="a smaller class LM")


def export_first_pass_arpa(dest: Path, lms: Mapping[str, Any], bases: Mapping[str, Any], mix_weights: Sequence[float],
                           size: str, *, max_ngrams: int = FIRST_PASS_MAX_NGRAMS) -> dict[str, Any]:
    """Write the word ARPA models a first-pass decoder can take (paper 003 decodes with them, too).

    ``m1_anon`` / ``m1_orig`` (M1 on anonymised / original text), ``m2_anon`` (the class n-gram expanded into
    words, :func:`~privasr.lm.ngram.class_lm.expand_to_word_arpa`), ``m3_anon`` and ``mix_wc_m3``: the adapted
    M1 + M2 + M3 at the mix size, merged into one backoff model with the EM weights (static interpolation,
    :func:`~privasr.lm.mix.merge_ngrams`). The exact expansion of M2 multiplies every class n-gram by its
    classes' member counts (billions of n-grams for AMI's surrogate classes), so when it exceeds
    ``max_ngrams`` each class keeps only its most probable members, renormalised (``m2_top_members`` in the
    returned info; the others become unknown words to the decoder). Returns each file's path and n-gram counts.
    """
    from privasr.lm.mix import merge_ngrams
    from privasr.lm.ngram.arpa import write_arpa

    dest.mkdir(parents=True, exist_ok=True)

    def inner(name: str) -> Any:
        lm = lms[name]
        return lm.lm if isinstance(lm, _Memo) else lm

    m2_anon, k_anon = _fit_expansion(inner("m2_anon"), max_ngrams)
    m2_fma, k_fma = _fit_expansion(inner(f"m2_fma{size}"), max_ngrams)
    models = {"m1_anon": bases["m1_anon"], "m1_orig": bases["m1_orig"], "m2_anon": m2_anon, "m3_anon": bases["m3_anon"],
              "mix_wc_m3": merge_ngrams([inner(f"m1_fma{size}"), m2_fma, inner(f"m3_fma{size}")], mix_weights)}
    info: dict[str, Any] = {}
    for name, lm in models.items():
        path = dest / f"{name}.arpa"
        write_arpa(lm, path)
        info[name] = {"path": str(path), "ngrams": [int(lm.num_ngrams(n)) for n in range(1, lm.order + 1)]}
    info["m2_anon"]["top_members"] = k_anon
    info["mix_wc_m3"].update(weights=list(mix_weights), m2_top_members=k_fma)
    return info


def _rescore_all(cfg: AnonRunConfig, dev: Sequence[Any], test: Sequence[Any], lms: Mapping[str, Any],
                 systems: Mapping[str, tuple[str, ...]]) -> dict[str, dict[str, Any]]:
    from privasr.metrics import wer
    from privasr.rescore.combine import Combination, LMScoreCache, score_table, select
    from privasr.rescore.run import default_ranges
    from privasr.rescore.search import SearchSpace, tune, value_grid

    used = sorted({n for names in systems.values() for n in names})
    caches = {n: LMScoreCache(lms[n]) for n in used}
    dev_table = score_table(dev, caches)
    test_table = score_table(test, caches)
    rng = {**default_ranges("am"), **cfg.search.ranges}
    refs = [tuple(nb.ref or ()) for nb in test]
    drefs = [tuple(nb.ref or ()) for nb in dev]
    first = wer(refs, [nb.best.words for nb in test], aligner="sclite").wer
    out: dict[str, dict[str, Any]] = {}
    for sysname, names in systems.items():
        comb = Combination(prior="am", lms=names, mode="loglinear")
        grids = {n: value_grid(*rng["lm"]) for n in names}
        grids["word_penalty"] = value_grid(*rng["word_penalty"])
        res = tune(dev, dev_table, comb, SearchSpace(grids), method="coordinate",
                   max_rounds=cfg.search.max_rounds, coarse_points=cfg.search.coarse_points,
                   restarts=cfg.search.restarts)
        choice = select(test_table, comb.totals(test_table, res.weights))
        words = [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(test, choice, strict=True)]
        dch = select(dev_table, comb.totals(dev_table, res.weights))
        dwords = [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(dev, dch, strict=True)]
        w = wer(refs, words, aligner="sclite")
        out[sysname] = {"words": words, "wer": w.wer, "wer_obj": w, "weights": dict(res.weights),
                        "dev_wer": wer(drefs, dwords, aligner="sclite").wer, "wer_first_pass": first}
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


def _cell(r: Mapping[str, Any]) -> str:
    return f"{_pct(r['wer'])} / {r['ppl']:.1f} (p {r['mapsswe_p_vs_baseline']:.3g})"


def _report(cfg: AnonRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any], d: Mapping[str, Any]) -> str:
    rec = m["recovered_fraction"]
    lines = [
        f"# {cfg.name}", "",
        f"privasr {__version__}, seed {cfg.seed}; detector {d['detector']}; {d['train_meetings']} anonymised training "
        f"meetings ({d['train_tokens']} tokens, entity tokens {d['entity_tokens']}), clean pool of "
        f"{len(d['pool_meetings'])} meetings ({d['pool_tokens']} tokens); adaptation sets {d['adaptation_tokens']} "
        "tokens.", "",
        "| system | test WER | PPL |", "|---|---|---|",
        f"| first pass | {_pct(m['wer_first_pass'])} | |",
        f"| M1 on anonymised text (`wer_baseline`) | {_pct(m['wer_baseline'])} | {m['ppl_baseline']:.1f} |",
        f"| M1 on original text (`wer_original`) | {_pct(m['wer_original'])} | {m['ppl_original']:.1f} |",
        f"| adapted + interpolated ({cfg.primary}, `wer`) | {_pct(m['wer'])} "
        f"({100 * (m['wer_rel_change'] or 0):+.2f}% rel., MAPSSWE p = {m['mapsswe_p']:.3g}) | {m['ppl']:.1f} |", "",
        f"WER lost to anonymisation: {100 * m['wer_lost_to_anonymisation']:.2f} points; recovered fraction: "
        + ("n/a (nothing lost)" if rec is None else f"{rec:.2f}") + f" (target >= 0.5: "
        f"{'met' if m['target_met'] else 'not met'}). Perplexity lost: {m['ppl_lost_to_anonymisation']:.1f}; "
        "recovered fraction: " + ("n/a" if m["ppl_recovered_fraction"] is None else f"{m['ppl_recovered_fraction']:.2f}")
        + ".", "",
        "Cells: test WER / test-reference perplexity (MAPSSWE p against `wer_baseline`).", "",
        "## Table 2: anonymised vs original training text", "",
        "| model | anonymised | original |", "|---|---|---|"]
    for r in tables["table2"]:
        lines.append(f"| {r['model']} | {_cell(r['anonymised'])} | {_cell(r['original'])} |")
    sizes = [_pct_name(s) for s in cfg.sizes]
    lines += ["", "## Table 3: adaptation on clean data (FMA for M1-M3, fine-tuning for M4)", "",
              "| model | " + " | ".join(f"{s}%" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for r in tables["table3"]:
        lines.append(f"| {r['model']} | " + " | ".join(_cell(r[s]) for s in sizes) + " |")
    lines += ["", f"## Table 4: interpolation of the adapted models ({_pct_name(cfg.mix_size)}% adaptation set)", "",
              "| system | eq. 2 weights | cell |", "|---|---|---|"]
    for r in tables["table4"]:
        lines.append(f"| {r['system']} | {', '.join(f'{k} {v:.3f}' for k, v in r['eq2'].items())} ({r['source']}) "
                     f"| {_cell(r)} |")
    return "\n".join(lines) + "\n"
