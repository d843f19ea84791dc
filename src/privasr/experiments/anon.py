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
(:func:`privasr.corpus.sources.ami_sentences`), and the placeholders are resolved (:func:`~privasr.lm.ngram.anon_classes.normalise_marked`):

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

**Config** (YAML; every key optional unless marked; the schema is :class:`AnonRunConfig`, read with
:mod:`privasr.config`, so ``--set a.b=c`` overrides and ``${PRIVASR_DATA}`` work; ``configs/anon-ami.yaml`` is
the full example)::

    name: anon
    label: null                       # the primary system's human name (default: its models and adaptation set)
    seed: 0                           # pool split, adaptation sets, surrogates, bootstrap
    data:                             # required, all three keys
      transcripts: DIR                # AMI_proprec: train/ (models, pool) and dev/ (dev text)
      dev: PATH                       # N-best lists with references and am scores: weights tuned here
      test: PATH                      # N-best lists: WER and perplexity
    ner: {model: stock}               # a privasr.anon.ner.load_detector spec, or finetuned
    pool: {fraction: 0.2}             # in (0, 1): training meetings held out as the clean pool
    adaptation: {sizes: [0.12, 0.15, 0.2]}   # in (0, 1]: fractions of the anonymised training tokens
    order: 3                          # 1 to 6
    fma: {betas: [0.25, 0.5, 0.75, 1.0], mu: 1000}   # betas >= 0 (chosen by dev perplexity), mu > 0
    lstm:
      preset: small-lstm-class        # an LSTM preset of privasr.lm.neural.models.PRESETS
      model: {}                       # NeuralLMConfig overrides of the preset
      options: {}                     # TrainOptions fields (privasr.lm.neural.train)
      seed: 0
      finetune: {freeze: output, options: {}}   # freeze: none | output
      device: cpu
      batch_tokens: 4096
    approx: {method: overwrite, topk: 0}        # method: overwrite | approximate (topk: approximate only)
    mix:
      size: null                      # one of adaptation.sizes (null: the smallest)
      weights: null                   # {word, class, neural} with word + class = 1, neural < 1; null: EM on dev
    primary: wc_m4                    # wc | wc_m3 | wc_m4: the system of results.json's wer
    search:                           # coordinate descent on dev WER
      ranges: {}                      # lm | word_penalty: [min, max, step] (default [0, 30, 0.5], [-30, 30, 0.5])
      max_rounds: 20
      coarse_points: 7                # >= 2
      restarts: 3                     # >= 1
    eval: {bootstrap_resamples: 1000}
    cache_dir: null                   # trained models and entity spans (null: OUT/cache)
    export_arpa: false                # write OUT/arpa/*.arpa for first-pass decoding
    normalize: null                   # a normaliser run after the ami preset on every text (training turns, pool,
                                      # dev text): neural for a neural recogniser's lists (Whisper's)
    folds: null                       # K >= 2: cross-validation over the N-best meetings, dev and test pooled
                                      # (privasr.experiments.anon_folds; privasr anon run --folds K)
    fold_unit: meeting                # meeting | series: folds of single meetings or of whole AMI series

:func:`load_anon_config` validates everything (unknown keys, types, ranges, files) before any work.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import Context, check_mapping, check_str, from_mapping, key_path, setting, to_dict
from privasr.errors import ConfigError, InputError
from privasr.lm.ngram.anon_classes import build_turn_texts, entity_class_map, eq2_weights
from privasr.rescore.search import CoordinateSettings

__all__ = ["AnonRunConfig", "DataSettings", "NerSettings", "PoolSettings", "AdaptationSettings", "FmaSettings",
           "LstmSettings", "FinetuneSettings", "ApproxSettings", "MixSettings", "CoordinateSearchSettings",
           "EvalSettings", "load_anon_config", "run_anon", "split_meetings", "draw_adaptation_sets", "SYSTEMS",
           "export_first_pass_arpa"]

SYSTEMS = ("wc", "wc_m3", "wc_m4")
"""The interpolated systems of Table 4: word + class, + adapted M3, + fine-tuned M4 (``primary`` is one)."""
MIX_NAMES = {"wc": "M1 + M2", "wc_m3": "M1 + M2 + M3", "wc_m4": "M1 + M2 + M4"}
"""Table 4's names of the interpolated systems."""


def model_name(model: str, order: int) -> str:
    """A model's human name, the paper's label first: ``model_name("m2", 3) == "M2 class 3-gram"``."""
    what = {"m1": f"word {order}-gram", "m2": f"class {order}-gram", "m3": f"LSTM as a {order}-gram",
            "m4": "LSTM"}[model]
    return f"{model.upper()} {what}"
_FALLBACK = (0.5, 1.0, 1.5)  # lmplz --discount_fallback: only where the closed-form discounts fail (tiny data)


# ------------------------------------------------------------------------------------------------ config


def _fraction(v: Any, where: str, *, closed: bool = True) -> float:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and 0 < v and (
        v <= 1 if closed else v < 1)
    if not ok:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a fraction in (0, 1" + ("]" if closed else ")"))
    return float(v)


def _open_fraction(v: Any, where: str) -> float:
    return _fraction(v, where, closed=False)


def _sizes(v: Any, where: str) -> list[float]:
    """The adaptation sizes: a non-empty list of fractions in (0, 1], sorted, duplicates dropped."""
    if not isinstance(v, list | tuple) or not v:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a non-empty list of fractions")
    return sorted({_fraction(s, where) for s in v})


def _betas(v: Any, where: str) -> list[float]:
    if not isinstance(v, list | tuple) or not v:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a non-empty list of numbers >= 0")
    for b in v:
        if isinstance(b, bool) or not isinstance(b, int | float) or not math.isfinite(b) or b < 0:
            raise ConfigError(f"config key {where!r} holds {b!r}", expected="numbers >= 0")
    return [float(b) for b in v]


def _mu(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a number > 0")
    return float(v)


def _mix_weights(v: Any, where: str) -> dict[str, float] | None:
    """eq. 2's ``lw``, ``lc``, ``ln`` as ``{word, class, neural}`` (``None``: EM on the dev text)."""
    if v is None:
        return None
    w = check_mapping(v, where, ("word", "class", "neural"))
    if set(w) != {"word", "class", "neural"}:
        raise ConfigError(f"config key {where!r} needs word, class and neural",
                          expected="{word: 0.3, class: 0.7, neural: 0.4} (eq. 2), or null for EM on dev")
    out = {k: _fraction(x, f"{where}.{k}") if x != 0 else 0.0 for k, x in w.items()}
    if abs(out["word"] + out["class"] - 1.0) > 1e-9 or out["neural"] >= 1:
        raise ConfigError(f"config key {where!r}: word + class must be 1 and neural < 1",
                          expected="eq. 2: (1-ln)(lw P_w + lc P_c) + ln P_n")
    return out


def _prechecked(value: Any, where: str, **checks: Callable[[Any, str], Any]) -> Any:
    """A section's raw mapping with the given keys (those present) checked and converted by their functions,
    for rules the field types cannot say (and their established messages); other values pass unchanged."""
    if not isinstance(value, Mapping):
        return value
    return {k: checks[k](v, key_path(where, k)) if k in checks else v for k, v in value.items()}


def _neural_models() -> Any:
    """:mod:`privasr.lm.neural.models` (:class:`ConfigError` naming ``lstm`` without torch)."""
    try:
        from privasr.lm.neural import models
    except ImportError:  # pragma: no cover - torch missing
        raise ConfigError("config key 'lstm': neural LMs need torch", expected="pip install privasr[neural]") from None
    return models


@dataclass(frozen=True)
class DataSettings:
    """``data`` (required): the AMI_proprec transcripts folder and the dev and test N-best sets."""

    transcripts: Path = setting(exists="folder")
    dev: Path = setting(exists="file")
    test: Path = setting(exists="file")

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        d = check_mapping(value, where, ("transcripts", "dev", "test"))
        for k in ("transcripts", "dev", "test"):
            if k not in d:
                raise ConfigError(f"config key {key_path(where, k)!r} is missing",
                                  expected="{transcripts: AMI_proprec folder, dev: N-best, test: N-best}")
        return d


@dataclass(frozen=True)
class NerSettings:
    """``ner``: the entity detector (a :func:`privasr.anon.ner.load_detector` spec, or ``finetuned``)."""

    model: str = "stock"


@dataclass(frozen=True)
class PoolSettings:
    """``pool``: the fraction of the training meetings held out, clean, as the adaptation pool."""

    fraction: float = setting(0.2, gt=0, lt=1)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        return _prechecked(value, where, fraction=_open_fraction)


@dataclass(frozen=True)
class AdaptationSettings:
    """``adaptation``: the adaptation set sizes, fractions of the anonymised training tokens (sorted)."""

    sizes: tuple[float, ...] = (0.12, 0.15, 0.2)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        return _prechecked(value, where, sizes=_sizes)


@dataclass(frozen=True)
class FmaSettings:
    """``fma``: the candidate ``beta`` values (chosen by dev perplexity) and the Dirichlet prior ``mu`` of P_A."""

    betas: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
    mu: float = setting(1000.0, gt=0)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        return _prechecked(value, where, betas=_betas, mu=_mu)


@dataclass(frozen=True)
class FinetuneSettings:
    """``lstm.finetune``: which layers stay frozen when M4 is fine-tuned on an adaptation set, and its options."""

    freeze: str = "output"
    options: dict[str, Any] = field(default_factory=dict)

    def __config_check__(self, where: str, ctx: Context) -> None:
        from privasr.lm.neural.train import FREEZE_CHOICES
        from privasr.rescore.lms import train_options

        check_str(self.freeze, f"{where}.freeze", FREEZE_CHOICES)
        train_options(self.options, f"{where}.options")


@dataclass(frozen=True)
class LstmSettings:
    """``lstm``: M4, an LSTM preset with model overrides, its training options and seed, fine-tuning, scoring."""

    preset: str = "small-lstm-class"
    model: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = setting(0, min=0)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)
    device: str = "cpu"
    batch_tokens: int = setting(4096, min=1)

    def __config_check__(self, where: str, ctx: Context) -> None:
        from privasr.rescore.lms import train_options

        check_str(self.preset, f"{where}.preset", sorted(_neural_models().PRESETS))
        try:
            arch = self.model_config().arch
        except ConfigError as e:
            raise ConfigError(f"config key '{where}.model': {e.message}", expected=e.expected) from None
        if arch != "lstm":
            raise ConfigError(f"config key '{where}.preset' is {self.preset!r} ({arch})", expected="an LSTM preset")
        train_options(self.options, f"{where}.options")

    def model_config(self) -> Any:
        """The :class:`~privasr.lm.neural.models.NeuralLMConfig`: the preset with ``model`` applied."""
        return _neural_models().NeuralLMConfig.preset(self.preset).replace(**self.model)

    def train_options(self) -> Any:
        """The :class:`~privasr.lm.neural.train.TrainOptions` of M4's training."""
        from privasr.lm.neural.train import TrainOptions

        return TrainOptions(**self.options)

    def finetune_options(self) -> Any:
        """The :class:`~privasr.lm.neural.train.TrainOptions` of the fine-tuning on an adaptation set."""
        from privasr.lm.neural.train import TrainOptions

        return TrainOptions(**self.finetune.options)


@dataclass(frozen=True)
class ApproxSettings:
    """``approx``: how M3 approximates M4 (``overwrite`` M1's n-grams, or ``approximate`` with ``topk``)."""

    method: str = setting("overwrite", choices=("overwrite", "approximate"))
    topk: int = setting(0, min=0)


@dataclass(frozen=True)
class MixSettings:
    """``mix``: the adaptation size of the eq. 2 interpolation (resolved: the smallest size by default) and its
    weights ``{word, class, neural}`` (``None``: EM on the dev text)."""

    size: float | None = setting(None, gt=0, max=1)
    weights: dict[str, float] | None = None

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        return _prechecked(value, where, size=_fraction, weights=_mix_weights)


@dataclass(frozen=True)
class CoordinateSearchSettings(CoordinateSettings):
    """``search``: coordinate descent of every system's weights on dev WER (ranges: ``lm``, ``word_penalty``)."""

    def __config_check__(self, where: str, ctx: Context) -> CoordinateSearchSettings:
        checked = super().__config_check__(where, ctx)
        bad = sorted(set(checked.ranges) - {"lm", "word_penalty"})
        if bad:
            raise ConfigError(f"config key '{where}.ranges.{bad[0]}' is not a parameter",
                              expected="lm (every LM weight) and word_penalty")
        return checked  # type: ignore[return-value]


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: the paired bootstrap of ``wer`` against ``wer_baseline``."""

    bootstrap_resamples: int = setting(1000, min=1)


@dataclass(frozen=True, kw_only=True)
class AnonRunConfig:
    """An anonymised-LM experiment config (module docstring), validated by :func:`load_anon_config`."""

    name: str = "anon"
    label: str | None = None
    seed: int = setting(0, min=0)
    data: DataSettings
    ner: NerSettings = field(default_factory=NerSettings)
    pool: PoolSettings = field(default_factory=PoolSettings)
    adaptation: AdaptationSettings = field(default_factory=AdaptationSettings)
    order: int = setting(3, min=1, max=6)
    fma: FmaSettings = field(default_factory=FmaSettings)
    lstm: LstmSettings = field(default_factory=LstmSettings)
    approx: ApproxSettings = field(default_factory=ApproxSettings)
    mix: MixSettings = field(default_factory=MixSettings)
    primary: str = setting("wc_m4", choices=SYSTEMS)
    search: CoordinateSearchSettings = field(default_factory=CoordinateSearchSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    cache_dir: Path | None = None
    export_arpa: bool = False
    normalize: Any = None
    folds: int | None = setting(None, min=2)
    fold_unit: str = setting("meeting", choices=("meeting", "series"))

    @property
    def system(self) -> str:
        """The primary system's human name: ``label``, else its models and adaptation set, e.g.
        ``M1 + M2 + M4 adapted on 12% clean text``."""
        return self.label or f"{MIX_NAMES[self.primary]} adapted on {_pct_name(self.mix_size)}% clean text"

    @property
    def baseline(self) -> str:
        """The baseline's human name: M1 (the word n-gram) trained on the anonymised text, not adapted."""
        return f"{model_name('m1', self.order)} on anonymised text"

    @property
    def original(self) -> str:
        """The reference point's human name: M1 trained on the original (not anonymised) text."""
        return f"{model_name('m1', self.order)} on original text"

    @property
    def mix_size(self) -> float:
        """The adaptation size of the interpolation: ``mix.size``, or the smallest of ``adaptation.sizes``."""
        return self.mix.size if self.mix.size is not None else self.adaptation.sizes[0]

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        if isinstance(value, Mapping) and "data" not in value:
            return {**value, "data": None}  # so the error names the missing data.transcripts
        return value

    def __config_check__(self, where: str, ctx: Context) -> AnonRunConfig:
        _neural_models()
        if self.normalize is not None:
            from privasr.text.normalize import Normalizer

            try:
                Normalizer.from_spec(self.normalize)
            except ConfigError as e:
                raise ConfigError(f"config key 'normalize': {e.message}", expected=e.expected) from None
        if self.folds is not None and self.export_arpa:
            raise ConfigError("config key 'folds' with export_arpa", expected="export_arpa: false (a cross-validated "
                                                                           "run trains one set of models per fold)")
        size, sizes = self.mix_size, self.adaptation.sizes
        if not any(abs(size - s) < 1e-12 for s in sizes):
            raise ConfigError(f"config key 'mix.size' is {size!r}", expected=f"one of adaptation.sizes {list(sizes)}")
        return dataclasses.replace(self, mix=dataclasses.replace(self.mix, size=size))


def load_anon_config(config: Mapping[str, Any], *, check_files: bool = True) -> AnonRunConfig:
    """Validate a config (module docstring; ``configs/anon-ami.yaml``) before any work starts; unknown keys,
    wrong types and bad values are :class:`ConfigError`\\ s naming the key; with ``check_files`` the inputs must
    exist.

    >>> cfg = load_anon_config({"data": {"transcripts": "t", "dev": "d", "test": "x"}}, check_files=False)
    >>> cfg.adaptation.sizes, cfg.mix.size, cfg.primary, cfg.lstm.preset
    ((0.12, 0.15, 0.2), 0.12, 'wc_m4', 'small-lstm-class')
    >>> load_anon_config({"data": {"transcripts": "t", "dev": "d", "test": "x"}, "pool": {"fraction": 2}},
    ...                  check_files=False)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'pool.fraction' is 2 (expected a fraction in (0, 1))
    """
    return from_mapping(AnonRunConfig, config, "", Context(check_files))


# ------------------------------------------------------------------------------------------------ texts


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



# ------------------------------------------------------------------------------------------------ stages


class _Clock:
    """The stage timings (the ``*_s`` metrics) and progress lines with the time since the start."""

    def __init__(self, progress: Callable[[str], Any] | None) -> None:
        self.progress = progress
        self.start = time.perf_counter()
        self.timings: dict[str, float] = {}

    def say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(f"[{time.perf_counter() - self.start:7.1f}s] {msg}")

    def timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        res = fn(*args)
        self.timings[name] = time.perf_counter() - t0
        return res


@dataclass
class _Data:
    """The training split's turns (the anonymised part) and the clean pool, the dev text, the N-best sets."""

    norm: Any
    all_turns: int
    train_meetings: list[str]
    pool_meetings: list[str]
    train_turns: list[Any]
    pool: dict[str, list[tuple[str, ...]]]
    dev_text: list[tuple[str, ...]]
    dev_nb: list[Any]
    test_nb: list[Any]
    test_refs: list[tuple[str, ...]]


@dataclass
class _Texts:
    """The transformed training texts (original, surrogate, tagged), the adaptation sets, the entity counts."""

    turns: list[Any]
    original: list[tuple[str, ...]]
    surrogate: list[tuple[str, ...]]
    tagged: list[tuple[str, ...]]
    adapt: dict[float, list[tuple[str, ...]]]
    entity_counts: Counter[str]
    detector: str

    @property
    def by_column(self) -> dict[str, list[tuple[str, ...]]]:
        """The training text of each column of Table 2: ``anon`` (surrogates) and ``orig``."""
        return {"anon": self.surrogate, "orig": self.original}


@dataclass
class _Models:
    """Every model by name (scored through :class:`_Memo` once built), the n-gram models FMA rewrites (M2: the
    class n-gram), M4's checkpoints with their cache keys, and what adaptation and interpolation chose."""

    store: _Store
    lms: dict[str, Any] = field(default_factory=dict)
    bases: dict[str, Any] = field(default_factory=dict)
    checkpoints: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    fma: dict[str, Any] = field(default_factory=dict)
    mix: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class _Then:
    """Two normalisers in turn (the ``ami`` preset, then ``normalize``); entity placeholders survive both."""

    first: Any
    then: Any

    def __call__(self, words: Sequence[str]) -> tuple[str, ...]:
        return tuple(self.then(self.first(words)))


def load_data(cfg: AnonRunConfig) -> _Data:
    """Stage 1: the AMI_proprec train split cut into training meetings and the clean pool, the dev text, and the
    dev and test N-best sets (references and am scores required, meetings outside the training split)."""
    from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
    from privasr.corpus.load import load_nbest
    from privasr.corpus.phonetics import load_cmudict
    from privasr.text.normalize import Normalizer

    transcripts = cfg.data.transcripts
    train_dir, dev_dir = transcripts / "train", transcripts / "dev"
    for d in (train_dir, dev_dir):
        if not d.is_dir():
            raise InputError("no such AMI_proprec split folder", path=d, expected="train/ and dev/ sub-folders")
    norm: Any = Normalizer.preset("ami", vocabulary=frozenset(load_cmudict()))
    if cfg.normalize is not None:
        norm = _Then(norm, Normalizer.from_spec(cfg.normalize))
    all_train = list(read_ami_hmnet(train_dir))
    meetings = [t.client or "" for t in all_train]
    train_meetings, pool_meetings = split_meetings(meetings, cfg.pool.fraction, cfg.seed)
    train_set = set(train_meetings)
    train_turns = [t for t in all_train if (t.client or "") in train_set]
    pool: dict[str, list[tuple[str, ...]]] = {}
    for t in all_train:
        if (t.client or "") not in train_set:
            w = norm(t.words)
            if w:
                pool.setdefault(t.client or "", []).append(w)
    dev_text = [w for w in (norm(t.words) for t in read_ami_hmnet(dev_dir)) if w]
    dev_nb = load_nbest(cfg.data.dev, None)
    test_nb = load_nbest(cfg.data.test, None)
    _check_nbest("dev", dev_nb, cfg.data.dev, meetings)
    _check_nbest("test", test_nb, cfg.data.test, meetings)
    return _Data(norm, len(all_train), train_meetings, pool_meetings, train_turns, pool, dev_text, dev_nb, test_nb,
                 [tuple(nb.ref or ()) for nb in test_nb])


def _check_nbest(name: str, recs: Sequence[Any], path: Path, meetings: Sequence[str]) -> None:
    for nb in recs:
        if nb.ref is None:
            raise InputError(f"{name} utterance {nb.utt_id} has no reference", path=path,
                             expected="references (WER is tuned on dev and measured on test)")
        if any("am" not in h.scores for h in nb.hyps):
            raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without an am score",
                             expected="am scores (the first-pass LM score is replaced by the new LMs)")
    clash = sorted({nb.client for nb in recs if nb.client} & set(meetings))
    if clash:
        raise InputError(f"the {name} N-best meetings include training meeting {clash[0]}",
                         expected="N-best sets from meetings outside the training split")


def detect_entities(cfg: AnonRunConfig, data: _Data, detector: Any, cache: Path) -> tuple[list[list[Any]], str]:
    """Stage 2: the entity spans of every training turn (``detector``, else the config's ``ner.model``) and the
    detector's name."""
    if detector is None:
        detector, det_name = _load_detector(cfg.ner.model)
    else:
        det_name = str(getattr(detector, "name", type(detector).__qualname__))
    return _detect(detector, det_name, data.train_turns, cache), det_name


def build_texts(cfg: AnonRunConfig, data: _Data, spans: Sequence[Sequence[Any]], det_name: str) -> _Texts:
    """Stage 3: the original, surrogate and tagged training texts, and the adaptation sets from the clean pool."""
    from privasr.anon.transform import Anonymizer

    turns = build_turn_texts(data.train_turns, spans, Anonymizer("surrogate", cfg.seed), data.norm)
    sur_text = [t.surrogate for t in turns]
    adapt = draw_adaptation_sets(data.pool, sum(map(len, sur_text)), cfg.adaptation.sizes, cfg.seed)
    ent_counts = Counter(lab for t in turns for lab in t.labels if lab is not None)
    return _Texts(turns, [t.original for t in turns], sur_text, [t.tagged for t in turns], adapt, ent_counts,
                  det_name)


def _data_info(data: _Data, texts: _Texts) -> dict[str, Any]:
    """results.json's ``data_info``: the sizes of the splits, texts and adaptation sets, the entity counts."""
    ent_counts, adapt = texts.entity_counts, texts.adapt
    return {
        "train_meetings": len(data.train_meetings), "pool_meetings": data.pool_meetings,
        "train_turns": len(texts.turns), "train_tokens": sum(map(len, texts.surrogate)),
        "original_tokens": sum(map(len, texts.original)),
        "entity_tokens": dict(sorted(ent_counts.items())),
        "entity_types": len({w for t in texts.turns for w in t.original_members}),
        "pool_tokens": sum(len(s) for v in data.pool.values() for s in v),
        "adaptation_tokens": {_pct_name(s): sum(map(len, a)) for s, a in adapt.items()},
        "adaptation_turns": {_pct_name(s): len(a) for s, a in adapt.items()},
        "dev_text_sentences": len(data.dev_text), "dev_text_tokens": sum(map(len, data.dev_text)),
        "dev_utterances": len(data.dev_nb), "test_utterances": len(data.test_nb), "detector": texts.detector,
        "entity_word_tokens": sum(ent_counts.values()),
    }


def train_ngrams(cfg: AnonRunConfig, texts: _Texts, models: _Models) -> None:
    """Stage 4 (Stage a): M1 (MKN word n-gram) and M2 (class n-gram) on the anonymised and the original text."""
    from privasr.lm.ngram.class_lm import ClassNgramModel, train_class_lm
    from privasr.lm.ngram.mkn import train_mkn

    store, tag_text = models.store, texts.tagged
    cmaps = {"anon": entity_class_map(texts.turns, "surrogate"), "orig": entity_class_map(texts.turns, "original")}
    for col, text in texts.by_column.items():
        m1 = store.ngram(f"m1_{col}", {"text": _text_sha(text), "order": cfg.order},
                         lambda text=text: train_mkn(text, cfg.order, discount_fallback=_FALLBACK))
        models.bases[f"m1_{col}"] = m1
        models.lms[f"m1_{col}"] = m1
        cm = cmaps[col]
        cls_key = {"text": _text_sha(tag_text), "classes": _sha({c: cm.expansions[c] for c in cm.classes}),
                   "order": cfg.order}
        c_ng = store.ngram(f"m2class_{col}", cls_key,
                           lambda cm=cm: train_class_lm(tag_text, cm, cfg.order, member_probs="file",
                                                        discount_fallback=_FALLBACK).class_lm)
        models.bases[f"m2_{col}"] = c_ng
        models.lms[f"m2_{col}"] = ClassNgramModel(c_ng, cm, {c: cm.file_probs(c) for c in cm.classes})


def _neural_lm(cfg: AnonRunConfig, ck: Any) -> Any:
    """A checkpoint as a scorer (the config's device and batch size, ``<unk>`` spread over unknown words)."""
    from privasr.lm.neural.scorer import NeuralLM

    return NeuralLM(ck.model, ck.vocab, device=cfg.lstm.device, batch_tokens=cfg.lstm.batch_tokens, spread_unk=True)


def train_lstms(cfg: AnonRunConfig, data: _Data, texts: _Texts, models: _Models) -> None:
    """Stage 5 (Stage a): M4, the LSTM, on each training text (early stopping on the dev text). Threads follow
    ``OMP_NUM_THREADS`` / torch's defaults."""
    from privasr.lm.neural.train import train_lm

    lc = cfg.lstm
    ncfg, opts, dev_text = lc.model_config(), lc.train_options(), data.dev_text
    dev_sha = _text_sha(dev_text)
    for col, text in texts.by_column.items():
        key = {"text": _text_sha(text), "valid": dev_sha, "model": ncfg.to_dict(), "options": opts.to_dict(),
               "seed": lc.seed}
        ck = models.store.neural(f"m4_{col}", key, lambda text=text: train_lm(
            text, dev_text, ncfg, opts, seed=lc.seed, device=lc.device, progress=False), lc.device)
        models.checkpoints[f"m4_{col}"] = (ck, key)
        models.lms[f"m4_{col}"] = _neural_lm(cfg, ck)


def approximate_lstms(cfg: AnonRunConfig, texts: _Texts, models: _Models) -> None:
    """Stage 6 (Stage a): M3, the n-gram approximation of M4 on its training text (``approx.method``)."""
    from privasr.lm.neural.approx import approximate_ngram, overwrite_ngram

    store, bases, batch_tokens = models.store, models.bases, cfg.lstm.batch_tokens
    for col, text in texts.by_column.items():
        m4 = models.lms[f"m4_{col}"]
        key = {"m4": models.checkpoints[f"m4_{col}"][1], "text": _text_sha(text), "order": cfg.order,
               "method": cfg.approx.method}
        if cfg.approx.method == "overwrite":
            key["base"] = store.info[f"m1_{col}"].get("arpa")
            m3 = store.ngram(f"m3_{col}", key, lambda m4=m4, text=text, col=col: overwrite_ngram(
                m4, bases[f"m1_{col}"], text, batch_tokens=batch_tokens))
        else:
            key["topk"] = cfg.approx.topk
            m3 = store.ngram(f"m3_{col}", key, lambda m4=m4, text=text: approximate_ngram(
                m4, text, cfg.order, topk=cfg.approx.topk, batch_tokens=batch_tokens))
        bases[f"m3_{col}"] = m3
        models.lms[f"m3_{col}"] = m3


def adapt_ngrams(cfg: AnonRunConfig, data: _Data, texts: _Texts, models: _Models) -> None:
    """Stage 7 (Stage b): FMA of M1, M2 and M3 on each adaptation set, ``beta`` chosen by dev perplexity."""
    from privasr.lm.adapt.fma import text_unigram

    m2a = models.lms["m2_anon"].lm
    sur_text = texts.surrogate
    base_text = {"m1": sur_text, "m3": sur_text, "m2": [m2a.map_words(s) for s in texts.tagged]}
    base_uni = {m: text_unigram(base_text[m], models.bases[f"{m}_anon"], k=0.5) for m in ("m1", "m2", "m3")}
    for size, a_text in texts.adapt.items():
        for m in ("m1", "m2", "m3"):
            _fma_one(cfg, data, models, m, _pct_name(size), a_text, base_uni[m])


def _fma_one(cfg: AnonRunConfig, data: _Data, models: _Models, m: str, p: str, a_text: Sequence[Sequence[str]],
             base_uni: Mapping[str, float]) -> None:
    """FMA of model ``m`` (``m1``, ``m2``, ``m3``) on the adaptation set ``a_text`` of size ``p`` (percent)."""
    from privasr.lm.adapt.fma import adaptation_unigram, fma_rewrite
    from privasr.lm.base import closed_vocab_perplexity
    from privasr.lm.ngram.class_lm import ClassNgramModel

    m2a: ClassNgramModel = models.lms["m2_anon"].lm
    base = models.bases[f"{m}_anon"]
    a_sents = [m2a.map_words(s) for s in a_text] if m == "m2" else a_text
    known = set(base.vocab)
    a_sents = [[w for w in s if w in known] for s in a_sents]
    pa = _neutral_unk(adaptation_unigram(a_sents, base, mu=cfg.fma.mu, base_unigram=base_uni), base_uni)
    trace = []
    for beta in cfg.fma.betas:
        ad = fma_rewrite(base, pa, beta, base_unigram=base_uni)
        cand = ClassNgramModel(ad, m2a.classes, m2a.member_probs) if m == "m2" else ad
        trace.append({"beta": beta, "dev_ppl": closed_vocab_perplexity(cand, data.dev_text)})
    best = min(trace, key=lambda r: (r["dev_ppl"], r["beta"]))
    key = {"base": models.store.info[f"{m}class_anon" if m == "m2" else f"{m}_anon"].get("arpa"),
           "adapt": _text_sha(a_text), "beta": best["beta"], "mu": cfg.fma.mu, "unk": "neutral"}
    ad = models.store.ngram(f"{m}_fma{p}", key, lambda: fma_rewrite(base, pa, best["beta"], base_unigram=base_uni))
    models.lms[f"{m}_fma{p}"] = _Memo(ClassNgramModel(ad, m2a.classes, m2a.member_probs) if m == "m2" else ad)
    models.fma[f"{m}_fma{p}"] = {"beta": best["beta"], "beta_trace": trace}


def finetune_lstms(cfg: AnonRunConfig, data: _Data, texts: _Texts, models: _Models) -> None:
    """Stage 8 (Stage b): M4 (anonymised) fine-tuned on each adaptation set with frozen layers."""
    from privasr.lm.neural.train import train_lm

    lc, dev_text = cfg.lstm, data.dev_text
    ft_opts = lc.finetune_options()
    ck_anon, key_anon = models.checkpoints["m4_anon"]
    for size, a_text in texts.adapt.items():
        p = _pct_name(size)
        key = {"init": key_anon, "adapt": _text_sha(a_text), "valid": _text_sha(dev_text),
               "options": ft_opts.to_dict(), "freeze": lc.finetune.freeze, "seed": lc.seed}
        ck = models.store.neural(f"m4_ft{p}", key, lambda a_text=a_text: train_lm(
            a_text, dev_text, None, ft_opts, init=ck_anon, freeze=lc.finetune.freeze, seed=lc.seed,
            device=lc.device, progress=False), lc.device)
        models.lms[f"m4_ft{p}"] = _Memo(_neural_lm(cfg, ck))


def interpolate(cfg: AnonRunConfig, data: _Data, models: _Models) -> None:
    """Stage 9: the eq. 2 systems at ``mix.size`` (word + class, + adapted M3, + fine-tuned M4), with the
    config's weights or EM on the dev text."""
    from privasr.lm.mix import LinearMix, estimate_weights

    p = _pct_name(cfg.mix_size)
    comps = {"wc": [f"m1_fma{p}", f"m2_fma{p}"], "wc_m3": [f"m1_fma{p}", f"m2_fma{p}", f"m3_fma{p}"],
             "wc_m4": [f"m1_fma{p}", f"m2_fma{p}", f"m4_ft{p}"]}
    for sysname, names in comps.items():
        lms = [models.lms[n] for n in names]
        if cfg.mix.weights is not None:
            mw = cfg.mix.weights
            w = [mw["word"], mw["class"]] if len(names) == 2 else [
                (1 - mw["neural"]) * mw["word"], (1 - mw["neural"]) * mw["class"], mw["neural"]]
            models.mix[sysname] = {"weights": w, "eq2": eq2_weights(w), "source": "config"}
        else:
            em = estimate_weights(lms, data.dev_text)
            w = list(em.weights)
            models.mix[sysname] = {"weights": w, "eq2": eq2_weights(w), "source": "EM on dev text",
                                   "dev_ppl": em.ppl, "iterations": len(em.iterations)}
        models.lms[f"mix_{sysname}"] = _Memo(LinearMix(lms, w))


def perplexities(models: _Models, refs: Sequence[Sequence[str]]) -> tuple[dict[str, float], dict[str, float]]:
    """Stage 10: every model's test-reference perplexity and OOV rate."""
    from privasr.lm.base import closed_vocab_perplexity

    lms = models.lms
    ppl = {n: closed_vocab_perplexity(m, refs) for n, m in lms.items()}
    oov = {n: float(np.mean(np.concatenate([s.oov for s in m.score_batch(refs)]))) for n, m in lms.items()}
    return ppl, oov


def _systems(cfg: AnonRunConfig) -> dict[str, tuple[str, ...]]:
    """Every rescoring system and its LMs (M4 rows on top of the word n-gram of the same column or size)."""
    systems: dict[str, tuple[str, ...]] = {}
    for col in ("anon", "orig"):
        for m in ("m1", "m2", "m3"):
            systems[f"{m}_{col}"] = (f"{m}_{col}",)
        systems[f"m4_{col}"] = (f"m1_{col}", f"m4_{col}")
    for size in cfg.adaptation.sizes:
        q = _pct_name(size)
        for m in ("m1", "m2", "m3"):
            systems[f"{m}_fma{q}"] = (f"{m}_fma{q}",)
        systems[f"m4_ft{q}"] = (f"m1_fma{q}", f"m4_ft{q}")
    for sysname in SYSTEMS:
        systems[f"mix_{sysname}"] = (f"mix_{sysname}",)
    return systems


def rescore(cfg: AnonRunConfig, data: _Data, models: _Models) -> tuple[dict[str, tuple[str, ...]],
                                                                        dict[str, dict[str, Any]]]:
    """Stage 11: every system tuned on the dev lists, applied to the test lists. Returns the systems (name ->
    LMs) and their results."""
    systems = _systems(cfg)
    return systems, _rescore_all(cfg, data.dev_nb, data.test_nb, models.lms, systems)


def evaluate(cfg: AnonRunConfig, data: _Data, models: _Models, systems: Mapping[str, tuple[str, ...]],
             results: Mapping[str, Mapping[str, Any]], ppl: Mapping[str, float],
             oov: Mapping[str, float]) -> tuple[dict[str, Any], dict[str, dict[str, Any]], dict[str, Any]]:
    """Stage 12: the rows (MAPSSWE of every system against ``wer_baseline``), the metrics (the bootstrap and the
    recovered fraction of the primary system) and Tables 2-4. Returns ``(metrics, rows, tables)``."""
    from privasr.metrics import mapsswe, paired_bootstrap

    base_words = results["m1_anon"]["words"]
    ids = [nb.utt_id for nb in data.test_nb]
    rows: dict[str, dict[str, Any]] = {}
    for sysname, r in results.items():
        mp = mapsswe(data.test_refs, r["words"], base_words, ids=ids)
        lm_name = systems[sysname][-1]
        rows[sysname] = {"system": sysname, "lms": list(systems[sysname]), "wer": r["wer"], "ppl": ppl[lm_name],
                         "oov_rate": oov[lm_name], "mapsswe_p_vs_baseline": mp.p,
                         "better": {"A": "system", "B": "baseline", "same": "same"}[mp.better],
                         "dev_wer": r["dev_wer"], "weights": r["weights"]}
    prim = f"mix_{cfg.primary}"
    w_new, w_base, w_orig = results[prim]["wer_obj"], results["m1_anon"]["wer_obj"], results["m1_orig"]["wer_obj"]
    bs = paired_bootstrap(w_new.utt_errors, w_base.utt_errors, w_new.utt_ref_words, seed=cfg.seed,
                          resamples=cfg.eval.bootstrap_resamples)
    lost = w_base.wer - w_orig.wer
    recovered = (w_base.wer - w_new.wer) / lost if lost > 0 else None
    metrics: dict[str, Any] = {
        "wer": w_new.wer, "wer_baseline": w_base.wer, "wer_original": w_orig.wer, "wer_system": cfg.system,
        "wer_baseline_system": cfg.baseline, "wer_original_system": cfg.original,
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
        "test_utterances": len(data.test_nb), "test_ref_words": w_new.ref_words,
    }
    return metrics, rows, _tables(cfg, rows, models.mix)


def _tables(cfg: AnonRunConfig, rows: Mapping[str, Any], mix_info: Mapping[str, Any]) -> dict[str, Any]:
    """Tables 2 (anonymised vs original), 3 (adaptation sizes) and 4 (interpolations) from the rows."""
    return {
        "table2": [{"model": m.upper(), "name": model_name(m, cfg.order), "anonymised": rows[f"{m}_anon"],
                    "original": rows[f"{m}_orig"]} for m in ("m1", "m2", "m3", "m4")],
        "table3": [{"model": m.upper(), "name": model_name(m, cfg.order), **{_pct_name(s): rows[f"{m}_fma{_pct_name(s)}" if m != "m4"
                                                             else f"m4_ft{_pct_name(s)}"]
                                           for s in cfg.adaptation.sizes}}
                   for m in ("m1", "m2", "m3", "m4")],
        "table4": [{**rows[f"mix_{s}"], **mix_info[s],
                    "system": MIX_NAMES[s]}
                   for s in SYSTEMS],
    }


def _build_models(cfg: AnonRunConfig, data: _Data, texts: _Texts, models: _Models, clock: _Clock) -> None:
    """Stages 4-9: M1-M4 on both texts, FMA and fine-tuning on every adaptation set, the interpolations."""
    say, timed = clock.say, clock.timed
    say(f"texts built: {sum(map(len, texts.surrogate))} anonymised training tokens, entities "
        f"{dict(texts.entity_counts)}; n-grams")
    timed("ngram_s", train_ngrams, cfg, texts, models)
    say("LSTMs (M4)")
    timed("lstm_s", train_lstms, cfg, data, texts, models)
    say("n-gram approximations (M3)")
    timed("approx_s", approximate_lstms, cfg, texts, models)
    for k in list(models.lms):
        models.lms[k] = _Memo(models.lms[k])
    say("FMA")
    timed("fma_s", adapt_ngrams, cfg, data, texts, models)
    say("fine-tuning M4")
    timed("finetune_s", finetune_lstms, cfg, data, texts, models)
    say("interpolation weights")
    timed("mix_s", interpolate, cfg, data, models)


def run_anon(cfg: AnonRunConfig, out: str | Path, *, detector: Any = None,
             argv: Sequence[str] | None = None, progress: Any = None) -> dict[str, Any]:
    """Run a validated config; write ``out/results.json`` and ``out/report.md``; return the metrics.

    ``detector`` (anything with ``detect(sentences) -> list[list[EntitySpan]]``) replaces the one the config's
    ``ner.model`` names; ``progress`` (a callable taking a string) hears about each stage. The stages:
    :func:`load_data`, :func:`detect_entities`, :func:`build_texts`, the models (:func:`train_ngrams`,
    :func:`train_lstms`, :func:`approximate_lstms`, :func:`adapt_ngrams`, :func:`finetune_lstms`,
    :func:`interpolate`), optionally :func:`export_first_pass_arpa`, :func:`perplexities`, :func:`rescore`,
    :func:`evaluate`, then the results and the report.
    """
    from privasr.plots import plots_section
    from privasr.results import write_results

    if cfg.folds is not None:
        raise ConfigError("config key 'folds' is set: a cross-validated run is "
                          "privasr.experiments.anon_folds.run_anon_folds", expected="folds: null here")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clock = _Clock(progress)
    cache = cfg.cache_dir if cfg.cache_dir is not None else out / "cache"
    models = _Models(_Store(cache))

    data = clock.timed("data_s", load_data, cfg)
    clock.say(f"data: {data.all_turns} train turns, {len(data.pool_meetings)} pool meetings; entity detection")
    spans, det_name = clock.timed("ner_s", detect_entities, cfg, data, detector, cache)
    texts = clock.timed("texts_s", build_texts, cfg, data, spans, det_name)
    _build_models(cfg, data, texts, models, clock)
    arpa_info = None
    if cfg.export_arpa:
        clock.say("writing the word ARPA models for first-pass decoding")
        arpa_info = clock.timed("export_arpa_s", export_first_pass_arpa, out / "arpa", models.lms, models.bases,
                                models.mix["wc_m3"]["weights"], _pct_name(cfg.mix_size))
    clock.say("perplexities")
    ppl, oov = clock.timed("ppl_s", perplexities, models, data.test_refs)
    clock.say("rescoring")
    systems, results = clock.timed("rescore_s", rescore, cfg, data, models)
    metrics, rows, tables = evaluate(cfg, data, models, systems, results, ppl, oov)
    clock.timings["total_s"] = time.perf_counter() - clock.start
    metrics.update(clock.timings)
    data_info = _data_info(data, texts)
    extra = {"tables": tables, "systems": rows, "fma": models.fma, "mix": models.mix, "data_info": data_info,
             "models": models.store.info, "ppl_by_lm": ppl, "oov_rate_by_lm": oov, "first_pass_arpa": arpa_info,
             "command": list(argv) if argv is not None else None}
    write_results(out, runner="anon", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  data={"dev": cfg.data.dev, "test": cfg.data.test}, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tables, data_info) + plots_section(out), encoding="utf-8")
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
    from privasr.rescore.search import SearchSpace, default_ranges, tune, value_grid

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
        f"| {m['wer_baseline_system']} (baseline, `wer_baseline`) | {_pct(m['wer_baseline'])} | "
        f"{m['ppl_baseline']:.1f} |",
        f"| {m['wer_original_system']} (`wer_original`) | {_pct(m['wer_original'])} | {m['ppl_original']:.1f} |",
        f"| {m['wer_system']} (interpolated, `wer`) | {_pct(m['wer'])} "
        f"({100 * (m['wer_rel_change'] or 0):+.2f}% rel., MAPSSWE p = {m['mapsswe_p']:.3g}) | {m['ppl']:.1f} |", "",
        f"WER lost to anonymisation: {100 * m['wer_lost_to_anonymisation']:.2f} points; recovered fraction: "
        + ("n/a (nothing lost)" if rec is None else f"{rec:.2f}") + f" (target >= 0.5: "
        f"{'met' if m['target_met'] else 'not met'}). Perplexity lost: {m['ppl_lost_to_anonymisation']:.1f}; "
        "recovered fraction: " + ("n/a" if m["ppl_recovered_fraction"] is None else f"{m['ppl_recovered_fraction']:.2f}")
        + ".", "",
        f"Cells: test WER / test-reference perplexity (MAPSSWE p against the baseline, {m['wer_baseline_system']}).",
        "",
        "## Table 2: anonymised vs original training text", "",
        "| model | anonymised | original |", "|---|---|---|"]
    for r in tables["table2"]:
        lines.append(f"| {r.get('name', r['model'])} | {_cell(r['anonymised'])} | {_cell(r['original'])} |")
    sizes = [_pct_name(s) for s in cfg.adaptation.sizes]
    lines += ["", "## Table 3: adaptation on clean data (FMA for M1-M3, fine-tuning for M4)", "",
              "| model | " + " | ".join(f"{s}%" for s in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for r in tables["table3"]:
        lines.append(f"| {r.get('name', r['model'])} | " + " | ".join(_cell(r[s]) for s in sizes) + " |")
    lines += ["", f"## Table 4: interpolation of the adapted models ({_pct_name(cfg.mix_size)}% adaptation set)", "",
              "| system | eq. 2 weights | cell |", "|---|---|---|"]
    for r in tables["table4"]:
        lines.append(f"| {r['system']} | {', '.join(f'{k} {v:.3f}' for k, v in r['eq2'].items())} ({r['source']}) "
                     f"| {_cell(r)} |")
    return "\n".join(lines) + "\n"
