"""The configured N-best rescoring run behind ``privasr rescore run``: its config schema and its stages.

A run loads a dev and a test N-best set, loads or trains the language models, tunes the combination
weights on **dev** only (:mod:`privasr.rescore.search`), applies them to test, and writes ``results.json``
(metrics ``wer``, ``wer_baseline``, ``wer_rel_change``, ``mapsswe_p`` and more), ``report.md`` and the
rescored test N-best lists (canonical JSON Lines). Config (YAML; every key optional unless marked; the schema
is :class:`RescoreConfig`, read with :mod:`privasr.config`)::

    name: rescore-ami-ngram           # the run's name
    label: AMI trigram rescoring      # the system's human name in report.md, results.json and the plots
                                      # (default: "rescoring with" and the new LMs' names)
    seed: 0                           # bootstrap resampling seed
    data:
      dev: PATH                       # dev N-best (needs references unless search.method is fixed)
      test: PATH                      # required (or nbest + split): the N-best set to rescore and score
      nbest: PATH                     # instead of dev/test: one set split into dev and test by key
      split: {key: speaker, dev: even}  # key: speaker | client; dev: even | odd positions of the sorted keys
      format: null                    # reader format (privasr.corpus.load.FORMATS); default: detected
      ref: null                       # a reference file (Kaldi text, trn, transcript JSON Lines) for
                                      # reference-less N-best lists: privasr.corpus.references.attach_references
                                      # over dev + test (or nbest) together
    lms:                              # new language models, by name
      NAME: PATH.arpa                 # an ARPA file, or
      NAME: {arpa: PATH}              # the same, or
      NAME: {train: {text: SOURCE, order: 3, prune: null, normalize: null}}
                                      # trained with modified Kneser-Ney (privasr.lm.ngram.mkn.train_mkn) on a
                                      # text source of privasr.corpus.sources (ami-train, gutenberg, ...) or a
                                      # text file; written to OUT/lm/NAME.arpa and read back from it (so the
                                      # run uses exactly that file), reused by later runs while text and spec match
      NAME: {neural: {checkpoint: PATH, device: cpu, batch_tokens: 4096}}
                                      # a neural LM checkpoint (privasr lm train-neural), scored with
                                      # privasr.lm.neural.scorer.NeuralLM (OOVs as <unk>), or
      NAME: {neural: {train: {text: ami-train, valid: ami-dev, preset: small-lstm, model: {}, options: {},
                              seed: 0, max_sentences: null}}}
                                      # trained on the fly with privasr.lm.neural.train.train_lm (model: config
                                      # overrides of the preset; options: TrainOptions fields such as epochs),
                                      # cached as OUT/lm/NAME.pt + NAME.json and reused while the spec matches
    combine:
      mode: loglinear                 # loglinear | linear (in probability, lambdas on the simplex)
      prior: am                       # am | rank | uniform | total
      prior_weight: 1.0
      first_pass_lm: true             # combine the first-pass LM score ("lm") with the new LMs
    search:
      method: coordinate              # coordinate | grid | fixed
      weights: {}                     # fixed: the weights; coordinate/grid: the start point (optional)
      ranges: {}                      # PARAM: [min, max, step]; PARAM = an LM name, lm, word_penalty, lm_scale
      lambda_step: 0.05               # linear mode: grid step of the simplex
      max_rounds: 20                  # coordinate descent: rounds over the parameters at most
      coarse_points: 7                # coordinate descent: values per parameter of the coarse start grid
      restarts: 3                     # coordinate descent: descents from the best coarse-grid points
    eval:
      bootstrap_resamples: 1000
      confidence: 0.95
      first_pass_retuned: true        # also tune prior + first-pass LM + word penalty (no new LM), as a reference
      baseline_lms: null              # [NAME, ...]: the baseline system of wer_baseline / mapsswe_p is the
                                      # combination with only these new LMs (and the first-pass LM), tuned on
                                      # dev the same way; null: the first-pass 1-best (its WER is always in
                                      # wer_first_pass)
    output:
      nbest: test.rescored.jsonl.gz   # rescored test lists (null: not written)
      lm_cache: null                  # folder for trained LMs (default OUT/lm)
    lm_batch_size: 4096
    folds: null                       # K >= 2: cross-validation over meetings, dev and test pooled
                                      # (privasr.experiments.rescore_folds; privasr rescore run --folds K)
    fold_unit: meeting                # meeting | series: folds of single meetings or of whole AMI series

Strings may use ``${PRIVASR_DATA}`` (:func:`privasr.config.expand_vars`). Relative paths are relative to the
working directory. :func:`load_config` validates everything (unknown keys, types, ranges, files) before any
work. Default search ranges: :func:`privasr.rescore.search.default_ranges`.

>>> cfg = load_config({"data": {"test": "t.jsonl"}, "search": {"method": "fixed", "weights": {"word_penalty": 0}},
...                    "combine": {"prior": "rank", "first_pass_lm": False}}, check_files=False)
>>> cfg.combination.parameters(), cfg.search.method
(('word_penalty',), 'fixed')
>>> load_config({"data": {"test": "t.jsonl"}, "serach": {}}, check_files=False)
Traceback (most recent call last):
...
privasr.errors.ConfigError: unknown config key 'serach' (expected one of combine, data, eval, fold_unit, folds, label, lm_batch_size, lms, name, output, search, seed)
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import Context, from_mapping, setting, to_dict
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel
from privasr.rescore.combine import RESERVED_NAMES, Combination, LMScoreCache, ScoreTable, score_table, select
from privasr.rescore.lms import LMSettings, LMSpec, build_lm, ref_perplexity
from privasr.rescore.search import (
    SearchResult,
    SearchSettings,
    SearchSpace,
    build_space,
    sub_system_start,
    tune_with,
)

__all__ = ["RescoreConfig", "DataSettings", "SplitSettings", "CombineSettings", "EvalSettings", "OutputSettings",
           "load_config", "run_rescore", "data_warnings", "MIN_SIGNIFICANCE_UTTERANCES"]

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")
_NBEST_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.xz", ".jsonl.bz2")


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class SplitSettings:
    """``data.split``: one N-best set split into dev and test by speaker (or client), alternating sorted keys."""

    key: str = setting("speaker", choices=("speaker", "client"))
    dev: str = setting("even", choices=("even", "odd"))


@dataclass(frozen=True)
class DataSettings:
    """``data``: dev + test N-best sets, or one set and a split; the reader format (default: detected)."""

    dev: Path | None = setting(None, exists="file")
    test: Path | None = setting(None, exists="file")
    nbest: Path | None = setting(None, exists="file")
    split: SplitSettings | None = None
    format: str | None = None
    ref: Path | None = setting(None, exists="file")

    def __config_check__(self, where: str, ctx: Context) -> None:
        if self.format is not None:
            from privasr.config import check_str
            from privasr.corpus.load import FORMATS

            check_str(self.format, "data.format", sorted(FORMATS))
        if self.nbest is not None:
            if self.test is not None or self.dev is not None:
                raise ConfigError("data: give either nbest + split or test (+ dev)", expected="not both")
            if self.split is None:
                raise ConfigError("data.nbest needs data.split", expected="{key: speaker, dev: even}")
        elif self.split is not None:
            raise ConfigError("data.split is only used with data.nbest")


@dataclass(frozen=True)
class CombineSettings:
    """``combine``: how the scores are combined (:class:`~privasr.rescore.combine.Combination`)."""

    mode: str = "loglinear"
    prior: str = "am"
    prior_weight: float = 1.0
    first_pass_lm: bool = True


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: the bootstrap, the retuned-first-pass reference and the baseline system of the significance test."""

    bootstrap_resamples: int = setting(1000, min=1)
    confidence: float = setting(0.95, gt=0.0, lt=1.0)
    first_pass_retuned: bool = True
    baseline_lms: tuple[str, ...] | None = None


@dataclass(frozen=True)
class OutputSettings:
    """``output``: the rescored test lists' file name (``None``: not written) and the trained-LM cache folder."""

    nbest: str | None = "test.rescored.jsonl.gz"
    lm_cache: Path | None = None

    def __config_check__(self, where: str, ctx: Context) -> None:
        onb = self.nbest
        if onb is not None and ("/" in onb or "\\" in onb or not onb.endswith(_NBEST_SUFFIXES)):
            raise ConfigError(f"config key 'output.nbest' is {onb!r}",
                              expected="a file name in the output folder ending in .jsonl[.gz|.xz|.bz2]")


@dataclass(frozen=True)
class RescoreConfig:
    """A rescoring config (module docstring): validated by :func:`load_config`."""

    name: str = "rescore"
    label: str | None = None
    seed: int = setting(0, min=0)
    data: DataSettings = field(default_factory=DataSettings)
    lms: dict[str, LMSettings] = field(default_factory=dict)
    combine: CombineSettings = field(default_factory=CombineSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)
    output: OutputSettings = field(default_factory=OutputSettings)
    lm_batch_size: int = setting(4096, min=1)
    folds: int | None = setting(None, min=2)
    fold_unit: str = setting("meeting", choices=("meeting", "series"))

    @property
    def system(self) -> str:
        """The rescored system's human name: ``label``, else ``rescoring with`` and the new LMs' names."""
        return self.label or f"rescoring with {', '.join(self.lms) or 'the first-pass scores'}"

    @property
    def lm_specs(self) -> tuple[LMSpec, ...]:
        """The new LMs, in config order."""
        return tuple(s.spec(n) for n, s in self.lms.items())

    @property
    def combination(self) -> Combination:
        """The score combination: the first-pass LM (unless ``combine.first_pass_lm`` is false) and the new LMs."""
        c = self.combine
        names = (("lm",) if c.first_pass_lm else ()) + tuple(self.lms)
        return Combination(prior=c.prior, lms=names, mode=c.mode, prior_weight=c.prior_weight)

    def space(self) -> SearchSpace:
        """The search space: grids for searched parameters (fixed ones from ``search.weights``)."""
        return build_space(self.combination, self.search)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        lms = value.get("lms") if isinstance(value, Mapping) else None
        for name in lms if isinstance(lms, Mapping) else ():
            if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED_NAMES:
                raise ConfigError(f"language model name {name!r} is not allowed",
                                  expected=f"letters, digits, _ . - (starting with a letter), not "
                                           f"{sorted(RESERVED_NAMES)}")
        return value

    def __config_check__(self, where: str, ctx: Context) -> None:
        d = self.data
        if d.nbest is None and d.test is None:
            raise ConfigError("config key 'data.test' is missing", expected="the N-best set to rescore")
        comb, s = self.combination, self.search
        if s.method == "fixed" or s.weights:
            comb.check_weights(s.weights)  # a start point must be complete too
        if s.method != "fixed" and d.dev is None and d.nbest is None:
            raise ConfigError("weights are tuned on a dev set but data.dev is not given",
                              expected="data.dev, or search.method: fixed with search.weights")
        space = build_space(comb, s)
        space.check(comb)
        if s.method == "grid" and space.size() > 2_000_000:
            raise ConfigError(f"the full grid has {space.size():,} points",
                              expected="at most 2,000,000 (use coordinate)")
        self._check_baseline()

    def _check_baseline(self) -> None:
        bl = self.eval.baseline_lms
        if bl is None:
            return
        names = list(self.lms)
        bad = sorted(set(bl) - set(names))
        if bad:
            raise ConfigError(f"eval.baseline_lms names unknown LM(s) {bad}", expected=f"some of {names}")
        if set(bl) == set(names):
            raise ConfigError("eval.baseline_lms lists every LM", expected="a subset without the LM(s) under test")
        if self.search.method == "fixed":
            raise ConfigError("eval.baseline_lms needs tuned weights", expected="search.method coordinate or grid")


def load_config(config: Mapping[str, Any], *, check_files: bool = True) -> RescoreConfig:
    """Validate a config dict (see the module docstring); with ``check_files`` every input must exist."""
    return from_mapping(RescoreConfig, config, "", Context(check_files))


# ---------------------------------------------------------------------------------------------- stages


@dataclass
class _Data:
    """The loaded N-best sets, the split (if any) and the data fingerprints."""

    dev: list[NBest] | None
    test: list[NBest]
    split: dict[str, Any] | None = None
    fingerprints: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Scores:
    """The LMs' score caches and the dev / test score tables."""

    caches: dict[str, LMScoreCache]
    dev: ScoreTable | None
    test: ScoreTable


@dataclass
class _Tuning:
    """The dev-tuned systems: the full one, the retuned first pass and the baseline (each may be absent)."""

    result: SearchResult | None
    weights: dict[str, Any]
    retuned: SearchResult | None
    fp_comb: Combination
    baseline: SearchResult | None
    bl_comb: Combination | None


MIN_SIGNIFICANCE_UTTERANCES = 100
"""Fewer test utterances than this and a run warns that its significance tests (MAPSSWE, bootstrap) are unreliable."""


def data_warnings(dev: Sequence[NBest] | None, test: Sequence[NBest], *, dev_path: str | Path | None = None,
                  test_path: str | Path | None = None, significance: bool = True) -> list[str]:
    """Warnings about the evaluation data, one line each: dev and test are the same file (or identical files) or
    share utterance ids (the weights would be tuned on the test set), and, when ``significance`` tests run, a
    test set of fewer than :data:`MIN_SIGNIFICANCE_UTTERANCES` utterances.

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> nb = [NBest(f"u{i}", (Hypothesis(("a",)),), ref=("a",)) for i in range(3)]
    >>> for w in data_warnings(nb[:2], nb[1:]):
    ...     print(w)
    dev and test share 1 of 2 test utterance ids (e.g. u1): the tuning sees the test set
    the significance tests (MAPSSWE, paired bootstrap) run on only 2 test utterances (fewer than 100): their p-values and intervals are unreliable
    """
    from privasr.results import fingerprint

    out: list[str] = []
    if dev_path is not None and test_path is not None:
        a, b = Path(dev_path), Path(test_path)
        if a.resolve() == b.resolve():
            out.append(f"dev and test are the same file ({b}): the tuning sees the test set")
        elif a.is_file() and b.is_file() and fingerprint(a)["sha256"] == fingerprint(b)["sha256"]:
            out.append(f"dev ({a}) and test ({b}) are identical files: the tuning sees the test set")
    if dev and not out:
        dev_ids = {nb.utt_id for nb in dev}
        shared = [nb.utt_id for nb in test if nb.utt_id in dev_ids]
        if shared:
            out.append(f"dev and test share {len(shared)} of {len(test)} test utterance ids (e.g. "
                       f"{', '.join(shared[:3])}): the tuning sees the test set")
    if significance and len(test) < MIN_SIGNIFICANCE_UTTERANCES:
        out.append(f"the significance tests (MAPSSWE, paired bootstrap) run on only {len(test)} test utterances "
                   f"(fewer than {MIN_SIGNIFICANCE_UTTERANCES}): their p-values and intervals are unreliable")
    return out


def load_data(cfg: RescoreConfig) -> _Data:
    """Stage 1: read the N-best sets (or split one), check references and the scores the combination needs."""
    from privasr.corpus.load import load_nbest
    from privasr.corpus.partition import split_by_key

    d = cfg.data
    if d.nbest is not None:
        assert d.split is not None
        allrecs = load_nbest(d.nbest, d.format)
        dev, test, dev_keys, test_keys = split_by_key(allrecs, d.split.key, d.split.dev)
        data = _Data(dev, test, {"key": d.split.key, "dev": d.split.dev, "dev_keys": dev_keys,
                                 "test_keys": test_keys}, {"nbest": d.nbest})
        if not dev or not test:
            raise InputError(f"the {d.split.key} split leaves an empty dev or test set", path=d.nbest,
                             expected=f"at least two {d.split.key}s")
    else:
        assert d.test is not None
        data = _Data(load_nbest(d.dev, d.format) if d.dev is not None else None, load_nbest(d.test, d.format))
        data.fingerprints["test"] = d.test
        if d.dev is not None:
            data.fingerprints["dev"] = d.dev
    if d.ref is not None:
        _attach_refs(data, d.ref)
    _check_inputs(cfg, data)
    return data


def _attach_refs(data: _Data, ref: Path) -> None:
    """``data.ref``: the references of dev and test (one file for both) attached by utterance id."""
    from privasr.corpus.references import attach_references, read_references

    dev = data.dev or []
    both = attach_references([*dev, *data.test], read_references(ref), path=ref)
    data.dev = both[: len(dev)] if data.dev is not None else None
    data.test = both[len(dev):]
    data.fingerprints["ref"] = ref


def _check_inputs(cfg: RescoreConfig, data: _Data) -> None:
    """Dev references (when tuning) and the first-pass scores the combination needs, before any LM work."""
    comb = cfg.combination
    if cfg.search.method != "fixed" and data.dev is not None and any(nb.ref is None for nb in data.dev):
        bad = next(nb for nb in data.dev if nb.ref is None)
        raise InputError(f"dev utterance {bad.utt_id} has no reference",
                         expected="references on every dev utterance (weights are tuned on dev WER)")
    needed = ([comb.prior] if comb.prior in ("am", "total") else []) + (["lm"] if "lm" in comb.lms else [])
    for name, recs in (("dev", data.dev or []), ("test", data.test)):
        for sc in needed:
            for nb in recs:
                if any(sc not in h.scores for h in nb.hyps):
                    raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without a {sc!r} score",
                                     expected="that score on every hypothesis; for rank-only lists use "
                                              "combine.prior: rank (or uniform) and combine.first_pass_lm: false")


def build_lms(cfg: RescoreConfig, out: Path, data: _Data) -> tuple[dict[str, LanguageModel], dict[str, Any]]:
    """Stage 2: load or train every new LM (trained ones cached in ``output.lm_cache``, default ``OUT/lm``)."""
    cache_dir = cfg.output.lm_cache if cfg.output.lm_cache is not None else out / "lm"
    lms: dict[str, LanguageModel] = {}
    lm_info: dict[str, Any] = {}
    for spec in cfg.lm_specs:
        lms[spec.name], lm_info[spec.name] = build_lm(spec, cache_dir)
        if spec.arpa is not None:
            data.fingerprints[f"lm:{spec.name}"] = spec.arpa
    return lms, lm_info


def score(cfg: RescoreConfig, lms: Mapping[str, LanguageModel], data: _Data, lm_info: dict[str, Any]) -> _Scores:
    """Stage 3: score each distinct hypothesis once per LM, shared between dev and test."""
    caches = {n: LMScoreCache(lm, batch_size=cfg.lm_batch_size) for n, lm in lms.items()}
    dev_table = score_table(data.dev, caches) if data.dev is not None else None
    test_table = score_table(data.test, caches)
    for n, c in caches.items():
        lm_info[n]["distinct_hyps_scored"] = c.scored
        lm_info[n]["hyps"] = c.requests
    return _Scores(caches, dev_table, test_table)


def tune_weights(cfg: RescoreConfig, data: _Data, scores: _Scores, have_lms: bool) -> _Tuning:
    """Stage 4: tune on dev only. The sub-systems first (the retuned first pass, the baseline): their tuned
    weights (the other LMs at 0) are also starting points of the full search, so it is never worse on dev."""
    comb, s, dev, dev_table = cfg.combination, cfg.search, data.dev, scores.dev
    space = cfg.space()
    fp_comb = Combination(prior=comb.prior, lms=("lm",) if "lm" in comb.lms else (), mode="loglinear",
                          prior_weight=comb.prior_weight)
    retuned = None
    if cfg.eval.first_pass_retuned and s.method != "fixed" and dev is not None and dev_table is not None \
            and have_lms:
        fp_search = SearchSettings(method=s.method, ranges={k: v for k, v in s.ranges.items()
                                                            if k in fp_comb.parameters()},
                                   max_rounds=s.max_rounds, coarse_points=s.coarse_points, restarts=s.restarts)
        from privasr.rescore.search import tune

        retuned = tune(dev, dev_table, fp_comb, build_space(fp_comb, fp_search), method=s.method,
                       **fp_search.coordinate_options())
    baseline = bl_comb = None
    if cfg.eval.baseline_lms is not None and dev is not None and dev_table is not None:
        bl_comb = Combination(prior=comb.prior, lms=(("lm",) if "lm" in comb.lms else ()) + cfg.eval.baseline_lms,
                              mode=comb.mode, prior_weight=comb.prior_weight)
        bl_search = s.restricted(bl_comb.parameters())
        baseline = tune_with(bl_search, bl_comb, build_space(bl_comb, bl_search), dev, dev_table)
    extra = [sub_system_start(comb, space, r.weights) for r in (baseline, retuned) if r is not None]
    result = tune_with(s, comb, space, dev, dev_table, extra_starts=[e for e in extra if e is not None])
    weights = comb.check_weights(s.weights) if result is None else result.weights
    return _Tuning(result, weights, retuned, fp_comb, baseline, bl_comb)


def _choose_words(recs: Sequence[NBest], choice: np.ndarray) -> list[tuple[str, ...]]:
    return [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(recs, choice, strict=True)]


def apply_weights(cfg: RescoreConfig, out: Path, data: _Data, scores: _Scores,
                  tuning: _Tuning) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]], Path | None]:
    """Stage 5: rescore test with the tuned weights; write the rescored lists. Returns the rescored and the
    baseline 1-best words and the written file."""
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.rescore.combine import rerank

    test, table = data.test, scores.test
    totals = cfg.combination.totals(table, tuning.weights)
    rescored_words = _choose_words(test, select(table, totals))
    baseline_words = [nb.best.words for nb in test]
    if tuning.baseline is not None and tuning.bl_comb is not None:
        baseline_words = _choose_words(test, select(table, tuning.bl_comb.totals(table, tuning.baseline.weights)))
    nbest_path = None
    if cfg.output.nbest is not None:
        nbest_path = out / cfg.output.nbest
        write_nbest(nbest_path, rerank(test, table, totals))
    return rescored_words, baseline_words, nbest_path


def evaluate(cfg: RescoreConfig, data: _Data, scores: _Scores, tuning: _Tuning, rescored_words: Sequence[Any],
             baseline_words: Sequence[Any], lm_info: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stage 6: test WER, MAPSSWE and bootstrap against the baseline, dev WERs, perplexities. Returns
    ``(metrics, details)``."""
    metrics: dict[str, Any] = {"wer": None, "wer_baseline": None, "wer_rel_change": None, "mapsswe_p": None}
    details: dict[str, Any] = {}
    test = data.test
    if all(nb.ref is not None for nb in test):
        _test_metrics(cfg, data, scores, tuning, rescored_words, baseline_words, lm_info, metrics, details)
    metrics["test_utterances"] = len(test)
    metrics["test_hypotheses"] = scores.test.n_hyps
    metrics["test_changed_1best"] = int(sum(1 for a, b in zip(rescored_words, baseline_words, strict=True)
                                            if a != b))
    metrics["weights"] = tuning.weights
    if data.dev is not None and scores.dev is not None and all(nb.ref is not None for nb in data.dev):
        _dev_metrics(cfg, data.dev, scores, tuning, lm_info, metrics)
    if tuning.result is not None:
        metrics["search_evaluations"] = tuning.result.evaluations
        metrics["dev_errors_tuned"] = tuning.result.errors
        metrics["dev_errors_baseline"] = tuning.result.baseline_errors
    return metrics, details


def _test_metrics(cfg: RescoreConfig, data: _Data, scores: _Scores, tuning: _Tuning, rescored_words: Sequence[Any],
                  baseline_words: Sequence[Any], lm_info: dict[str, Any], metrics: dict[str, Any],
                  details: dict[str, Any]) -> None:
    from privasr.metrics import mapsswe, oracle_wer, paired_bootstrap, wer

    test, table, baseline, bl_comb = data.test, scores.test, tuning.baseline, tuning.bl_comb
    first_pass_words = [nb.best.words for nb in test]
    refs = [nb.ref or () for nb in test]
    w_new = wer(refs, rescored_words, aligner="sclite")
    w_base = wer(refs, baseline_words, aligner="sclite")
    w_first = w_base if baseline is None else wer(refs, first_pass_words, aligner="sclite")
    ids = [nb.utt_id for nb in test]
    mp = mapsswe(refs, rescored_words, baseline_words, ids=ids)
    bs = paired_bootstrap(w_new.utt_errors, w_base.utt_errors, w_new.utt_ref_words, seed=cfg.seed,
                          resamples=cfg.eval.bootstrap_resamples, confidence=cfg.eval.confidence)
    orc = oracle_wer(test, aligner="sclite")
    metrics.update(
        wer=w_new.wer, wer_baseline=w_base.wer,
        wer_rel_change=(w_new.wer - w_base.wer) / w_base.wer if w_base.wer > 0 else None,
        mapsswe_p=mp.p, mapsswe_log10_p=mp.log10_p, mapsswe_z=mp.z, mapsswe_segments=mp.n,
        mapsswe_better={"A": "rescored", "B": "baseline", "same": "same"}[mp.better],
        bootstrap_diff=bs.difference, bootstrap_ci_low=bs.ci_low, bootstrap_ci_high=bs.ci_high,
        bootstrap_confidence=bs.confidence, bootstrap_prob_improvement=bs.prob_a_better,
        bootstrap_resamples=bs.resamples, wer_oracle=orc.wer, test_ref_words=w_new.ref_words,
        wer_first_pass=w_first.wer, wer_system=cfg.system, wer_baseline_system="first-pass 1-best",
    )
    if baseline is not None:
        metrics["baseline"] = f"rescoring with {', '.join(bl_comb.lms) if bl_comb else ''} (tuned on dev)"
        metrics["wer_baseline_system"] = metrics["baseline"]
        metrics["wer_rel_change_vs_first_pass"] = ((w_new.wer - w_first.wer) / w_first.wer
                                                   if w_first.wer > 0 else None)
        metrics["mapsswe_p_vs_first_pass"] = mapsswe(refs, rescored_words, first_pass_words, ids=ids).p
    details["test_wer_rescored"] = w_new.as_dict()
    details["test_wer_baseline"] = w_base.as_dict()
    if tuning.retuned is not None:
        fp_tot = tuning.fp_comb.totals(table, tuning.retuned.weights)
        w_fp = wer(refs, _choose_words(test, select(table, fp_tot)), aligner="sclite")
        metrics["wer_first_pass_retuned"] = w_fp.wer
        mp2 = mapsswe(refs, rescored_words, _choose_words(test, select(table, fp_tot)), ids=ids)
        metrics["mapsswe_p_vs_first_pass_retuned"] = mp2.p
    lm_ppl = {n: {"ppl_test_refs": ref_perplexity(c, refs)} for n, c in scores.caches.items()}
    for n in lm_ppl:
        lm_info[n].update(lm_ppl[n])
    metrics["ppl_by_lm"] = {n: v["ppl_test_refs"] for n, v in lm_ppl.items()}
    # ``ppl`` (the shared metric name) is the test-reference perplexity of the LM under test: the one new LM
    # that is not part of the baseline system (absent when that is not a single LM).
    under_test = [n for n in lm_ppl if n not in (cfg.eval.baseline_lms or ())]
    if len(under_test) == 1:
        metrics["ppl"] = metrics["ppl_by_lm"][under_test[0]]


def _dev_metrics(cfg: RescoreConfig, dev: Sequence[NBest], scores: _Scores, tuning: _Tuning,
                 lm_info: dict[str, Any], metrics: dict[str, Any]) -> None:
    from privasr.metrics import wer

    assert scores.dev is not None
    dev_table, baseline, bl_comb = scores.dev, tuning.baseline, tuning.bl_comb
    drefs = [nb.ref or () for nb in dev]
    dch = select(dev_table, cfg.combination.totals(dev_table, tuning.weights))
    metrics["dev_wer"] = wer(drefs, _choose_words(dev, dch), aligner="sclite").wer
    metrics["dev_wer_first_pass"] = wer(drefs, [nb.best.words for nb in dev], aligner="sclite").wer
    metrics["dev_wer_baseline"] = metrics["dev_wer_first_pass"]
    if baseline is not None and bl_comb is not None:
        bch = select(dev_table, bl_comb.totals(dev_table, baseline.weights))
        metrics["dev_wer_baseline"] = wer(drefs, _choose_words(dev, bch), aligner="sclite").wer
        metrics["weights_baseline"] = baseline.weights
    metrics["dev_utterances"] = len(dev)
    if tuning.retuned is not None:
        metrics["dev_wer_first_pass_retuned"] = tuning.retuned.wer
        metrics["weights_first_pass_retuned"] = tuning.retuned.weights
    for n, c in scores.caches.items():
        lm_info[n]["ppl_dev_refs"] = ref_perplexity(c, drefs)


def run_rescore(cfg: RescoreConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated config; write ``out/results.json``, ``out/report.md`` and the rescored test lists.

    The stages: :func:`load_data`, :func:`build_lms`, :func:`score`, :func:`tune_weights`, :func:`apply_weights`,
    :func:`evaluate`, then the results and the report. Returns the metrics written to ``results.json``.
    """
    from privasr.plots import plots_section
    from privasr.results import write_results

    if cfg.folds is not None:
        raise ConfigError("config key 'folds' is set: a cross-validated run is "
                          "privasr.experiments.rescore_folds.run_rescore_folds", expected="folds: null here")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    def timed(name: str, fn: Any, *args: Any) -> Any:
        t0 = time.perf_counter()
        res = fn(*args)
        timings[name] = time.perf_counter() - t0
        return res

    data = timed("load_s", load_data, cfg)
    lms, lm_info = timed("lm_s", build_lms, cfg, out, data)
    scores = timed("score_s", score, cfg, lms, data, lm_info)
    tuning = timed("tune_s", tune_weights, cfg, data, scores, bool(lms))
    rescored_words, baseline_words, nbest_path = timed("apply_s", apply_weights, cfg, out, data, scores, tuning)
    metrics, details = timed("eval_s", evaluate, cfg, data, scores, tuning, rescored_words, baseline_words, lm_info)
    timings["total_s"] = time.perf_counter() - t_start
    metrics.update(timings)
    metrics["warnings"] = data_warnings(data.dev, data.test, dev_path=cfg.data.dev, test_path=cfg.data.test,
                                        significance=metrics.get("wer") is not None)
    extra = {"lms": lm_info, "search": tuning.result.to_dict() if tuning.result is not None else {"method": "fixed"},
             "baseline_search": tuning.baseline.to_dict() if tuning.baseline is not None else None,
             "first_pass_retuned": tuning.retuned.to_dict() if tuning.retuned is not None else None,
             "split": data.split, "details": details, "command": list(argv) if argv else None,
             "outputs": {"nbest": str(nbest_path) if nbest_path else None}}
    write_results(out, runner="rescore", config=to_dict(cfg), seed=cfg.seed, metrics=metrics, data=data.fingerprints, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, lm_info, tuning.result, tuning.retuned, data.split, argv,
                                           nbest_path) + plots_section(out), encoding="utf-8")
    return metrics


# ---------------------------------------------------------------------------------------------- report


def _pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.2f}%"


def _weights_str(w: Mapping[str, Any]) -> str:
    parts = []
    for k, v in w.items():
        if isinstance(v, Mapping):
            parts.append(f"{k}=(" + ", ".join(f"{a}: {b:g}" for a, b in v.items()) + ")")
        else:
            parts.append(f"{k}={v:g}")
    return ", ".join(parts)


def _report(cfg: RescoreConfig, m: Mapping[str, Any], lm_info: Mapping[str, Any], result: SearchResult | None,
            retuned: SearchResult | None, split: Mapping[str, Any] | None, argv: Sequence[str] | None,
            nbest_path: Path | None) -> str:
    c = cfg.combination
    lines = [f"# N-best rescoring: {cfg.name}", ""]
    lines += [f"**Warning:** {w}." for w in m.get("warnings", [])] + ([""] if m.get("warnings") else [])
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    src = f"`{cfg.data.nbest}` split by {split['key']}" if split else f"dev `{cfg.data.dev}`, test `{cfg.data.test}`"
    lines += [f"Data: {src}. Combination: {c.mode}, prior `{c.prior}` (weight {c.prior_weight:g}), "
              f"LMs {', '.join(c.lms) or 'none'}, word penalty. Weights tuned on dev only "
              f"({cfg.search.method}), applied unchanged to test.", ""]
    if split:
        lines += [f"Dev {split['key']}s ({len(split['dev_keys'])}): {' '.join(split['dev_keys'])}",
                  f"Test {split['key']}s ({len(split['test_keys'])}): {' '.join(split['test_keys'])}", ""]
    lines += ["| system | dev WER | test WER |", "|---|---:|---:|",
              f"| first-pass 1-best | {_pct(m.get('dev_wer_first_pass', m.get('dev_wer_baseline')))} | "
              f"{_pct(m.get('wer_first_pass', m.get('wer_baseline')))} |"]
    if m.get("baseline"):
        lines.append(f"| baseline: {m['baseline']} | {_pct(m.get('dev_wer_baseline'))} | "
                     f"{_pct(m.get('wer_baseline'))} |")
    if "wer_first_pass_retuned" in m or "dev_wer_first_pass_retuned" in m:
        what = "prior + first-pass LM + word penalty" if "lm" in c.lms else "prior + word penalty"
        lines.append(f"| {what}, retuned (no new LM) | "
                     f"{_pct(m.get('dev_wer_first_pass_retuned'))} | {_pct(m.get('wer_first_pass_retuned'))} |")
    lines.append(f"| **{cfg.system}** | {_pct(m.get('dev_wer'))} | **{_pct(m.get('wer'))}** |")
    if m.get("wer_oracle") is not None:
        lines.append(f"| N-best oracle (upper bound) | | {_pct(m.get('wer_oracle'))} |")
    lines.append("")
    if m.get("wer") is not None:
        rel = m.get("wer_rel_change")
        lines += [
            f"Test: {cfg.system} {_pct(m['wer'])} against the {m.get('wer_baseline_system', 'baseline')} "
            f"{_pct(m['wer_baseline'])}, relative change "
            f"{'n/a' if rel is None else f'{100 * rel:+.2f}%'} ({m['test_changed_1best']} of "
            f"{m['test_utterances']} 1-best changed). "
            f"MAPSSWE (sclite): Z = {m['mapsswe_z']:.3f}, p = {m['mapsswe_p']:.3g} "
            f"(log10 p = {m['mapsswe_log10_p']:.2f}), {m['mapsswe_segments']} segments, better: "
            f"{m['mapsswe_better']}. Paired bootstrap {100 * m['bootstrap_confidence']:.0f}% CI of "
            f"WER(system) - WER(baseline): "
            f"[{100 * m['bootstrap_ci_low']:+.2f}, "
            f"{100 * m['bootstrap_ci_high']:+.2f}] points ({m['bootstrap_resamples']} resamples, "
            f"P(improvement) = {m['bootstrap_prob_improvement']:.3f}).", ""]
        if "mapsswe_p_vs_first_pass_retuned" in m:
            lines += [f"Against the retuned first pass (no new LM): MAPSSWE p = "
                      f"{m['mapsswe_p_vs_first_pass_retuned']:.3g}.", ""]
    else:
        lines += ["The test set has no references: no WER; the rescored lists were written.", ""]
    wline = f"Weights: {_weights_str(m['weights'])}"
    if result is not None:
        wline += (f" (dev errors {result.errors} vs {result.baseline_errors} for the first pass, "
                  f"{result.evaluations} weight vectors tried).")
    lines.append(wline)
    if retuned is not None:
        lines += [f"Retuned first pass weights: {_weights_str(retuned.weights)}."]
    lines.append("")
    if lm_info:
        lines += ["| LM | source | order | n-grams | dev ref ppl | test ref ppl | distinct hyps scored | seconds |",
                  "|---|---|---:|---|---:|---:|---:|---:|"]
        for n, i in lm_info.items():
            if "neural" in i:
                nt = i["neural"].get("train")
                src = (f"neural {nt['preset']} trained on {nt['text']} ({i['tokens']:,} tokens)" if nt else
                       f"neural checkpoint {i['neural']['checkpoint']}") + (", cached" if i.get("cached") else "")
            elif "onnx" in i:
                src = f"ONNX export {i['onnx']['dir']} ({'int8' if i['int8'] else 'fp32'}, onnxruntime)"
            else:
                src = i.get("arpa") if "train" not in i else \
                    f"trained on {i['train']['text']} ({i['tokens']:,} tokens)" + (", cached" if i.get("cached") else "")
            ng = "/".join(f"{x:,}" for x in i.get("ngrams", []))
            lines.append(f"| {n} | {src} | {i['order']} | {ng} | {i.get('ppl_dev_refs', math.nan):.1f} | "
                         f"{i.get('ppl_test_refs', math.nan):.1f} | {i.get('distinct_hyps_scored', 0):,} | "
                         f"{i['seconds']:.1f} |")
        lines.append("")
    lines += ["Timings (s): " + ", ".join(f"{k[:-2]} {m[k]:.2f}" for k in
                                          ("load_s", "lm_s", "score_s", "tune_s", "apply_s", "eval_s", "total_s")), ""]
    if nbest_path is not None:
        lines += [f"Rescored test N-best: `{nbest_path.name}` (canonical JSON Lines; scores `rescore` and "
                  "`lm:<name>` added, `meta.first_pass_rank` kept).", ""]
    lines += [f"privasr {__version__}. WER with the sclite aligner; ppl includes OOVs (as `<unk>`) and `</s>`.", ""]
    return "\n".join(lines)
