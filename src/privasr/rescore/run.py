"""The configured N-best rescoring run behind ``privasr rescore run``: config schema, validation, runner.

A run loads a dev and a test N-best set, loads or trains the language models, tunes the combination
weights on **dev** only (:mod:`privasr.rescore.search`), applies them to test, and writes ``results.json``
(metrics ``wer``, ``wer_baseline``, ``wer_rel_change``, ``mapsswe_p`` and more), ``report.md`` and the
rescored test N-best lists (canonical JSON Lines). Config (YAML; every key optional unless marked)::

    name: rescore-ami-ngram           # a label for the report
    seed: 0                           # bootstrap resampling seed
    data:
      dev: PATH                       # dev N-best (needs references unless search.method is fixed)
      test: PATH                      # required (or nbest + split): the N-best set to rescore and score
      nbest: PATH                     # instead of dev/test: one set split into dev and test by key
      split: {key: speaker, dev: even}  # key: speaker | client; dev: even | odd positions of the sorted keys
      format: null                    # reader format (privasr.corpus.load.FORMATS); default: detected
    lms:                              # new language models, by name
      NAME: PATH.arpa                 # an ARPA file, or
      NAME: {arpa: PATH}              # the same, or
      NAME: {train: {text: SOURCE, order: 3, prune: null, normalize: null}}
                                      # trained with modified Kneser-Ney (privasr.lm.ngram.mkn.train_mkn) on a
                                      # text source of privasr.experiments.text (ami-train, gutenberg, ...) or a
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

Strings may use ``${PRIVASR_DATA}`` (the shared data folder: ``$PRIVASR_DATA``, else ``../shared/data``
beside the checkout, else the literal ``../shared/data``). Relative paths are relative to the working
directory. :func:`load_config` validates everything (unknown keys, types, ranges, files) before any work.

Default search ranges: with prior ``am``/``total`` (scores in nats of a real decoder) LM weights and
``lm_scale`` in ``[0, 30]`` step 0.5 and ``word_penalty`` in ``[-30, 30]`` step 0.5; with ``rank``/``uniform``
LM weights in ``[0, 5]`` step 0.05 and ``word_penalty`` in ``[-5, 5]`` step 0.05.

>>> cfg = load_config({"data": {"test": "t.jsonl"}, "search": {"method": "fixed", "weights": {"word_penalty": 0}},
...                    "combine": {"prior": "rank", "first_pass_lm": False}}, check_files=False)
>>> cfg.combination.parameters(), cfg.search.method
(('word_penalty',), 'fixed')
>>> load_config({"data": {"test": "t.jsonl"}, "serach": {}}, check_files=False)
Traceback (most recent call last):
...
privasr.errors.ConfigError: unknown config key 'serach' (expected one of combine, data, eval, lm_batch_size, lms, name, output, search, seed)
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel
from privasr.rescore.combine import RESERVED_NAMES, Combination, LMScoreCache, ScoreTable, score_table, select
from privasr.rescore.search import SearchResult, SearchSpace, simplex_grid, tune, value_grid

__all__ = [
    "RescoreConfig",
    "LMSpec",
    "SearchConfig",
    "load_config",
    "read_config",
    "apply_overrides",
    "expand_vars",
    "run_rescore",
    "split_by_key",
    "default_ranges",
]

_TOP = ("name", "seed", "data", "lms", "combine", "search", "eval", "output", "lm_batch_size")
_DATA = ("dev", "test", "nbest", "split", "format")
_SPLIT = ("key", "dev")
_COMBINE = ("mode", "prior", "prior_weight", "first_pass_lm")
_SEARCH = ("method", "weights", "ranges", "lambda_step", "max_rounds", "coarse_points", "restarts")
_EVAL = ("bootstrap_resamples", "confidence", "first_pass_retuned", "baseline_lms")
_OUTPUT = ("nbest", "lm_cache")
_LM = ("arpa", "train", "neural")
_NEURAL = ("checkpoint", "train", "device", "batch_tokens", "spread_unk")
_NEURAL_TRAIN = ("text", "valid", "preset", "model", "options", "seed", "max_sentences")
_TRAIN = ("text", "order", "prune", "normalize")
_VAR = re.compile(r"\$\{([^}]*)\}")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]*$")


# ---------------------------------------------------------------------------------------------- helpers


def expand_vars(value: str) -> str:
    """Expand ``${PRIVASR_DATA}`` (other ``${...}`` are an error).

    >>> os.environ["PRIVASR_DATA"] = "/data"
    >>> expand_vars("${PRIVASR_DATA}/ami/dev.jsonl")
    '/data/ami/dev.jsonl'
    >>> del os.environ["PRIVASR_DATA"]
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1) != "PRIVASR_DATA":
            raise ConfigError(f"unknown variable ${{{m.group(1)}}} in {value!r}", expected="only ${PRIVASR_DATA}")
        env = os.environ.get("PRIVASR_DATA")
        if env:
            return env
        from privasr.paths import data_dir

        d = data_dir()
        return str(d) if d is not None else "../shared/data"

    return _VAR.sub(sub, value)


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``config`` with dotted-key overrides applied (``search.method=grid``).

    >>> apply_overrides({"a": {"b": 1}}, {"a.b": 2, "a.c.d": 3})
    {'a': {'b': 2, 'c': {'d': 3}}}
    """
    out = copy.deepcopy(dict(config))
    for key, value in overrides.items():
        parts = key.split(".")
        if not all(parts):
            raise ConfigError(f"override key {key!r} is not valid", expected="dotted keys such as search.method")
        node = out
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"override {key}: {'.'.join(parts[:i + 1])} is not a mapping")
            node = nxt
        node[parts[-1]] = value
    return out


def read_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file into a dict (:class:`ConfigError` with the file on any problem)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError("no such config file", path=p)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', e)}", path=p,
                          line=None if line is None else line + 1) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"the config is a YAML {type(data).__name__}", path=p, expected="a mapping")
    return data


def _mapping(v: Any, where: str, keys: Sequence[str] | None = None) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"config key {where!r} is {type(v).__name__}", expected="a mapping")
    if keys is not None:
        for k in v:
            if k not in keys:
                name = f"{where}.{k}" if where else str(k)
                raise ConfigError(f"unknown config key {name!r}", expected=f"one of {', '.join(sorted(keys))}")
    return dict(v)


def _int(v: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"an integer {rng}")
    return v


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a finite number")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"config key {where!r} is {v!r}", expected="true or false")
    return v


def _str(v: Any, where: str, choices: Sequence[str] | None = None) -> str:
    if not isinstance(v, str) or not v:
        raise ConfigError(f"config key {where!r} is {v!r}", expected="a non-empty string")
    if choices is not None and v not in choices:
        raise ConfigError(f"config key {where!r} is {v!r}", expected=f"one of {', '.join(choices)}")
    return v


def _path(v: Any, where: str, check: bool, *, kind: str = "file") -> Path:
    p = Path(expand_vars(_str(v, where)))
    if check and not p.exists():
        raise ConfigError(f"config key {where!r}: no such {kind}", path=p)
    return p


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class LMSpec:
    """One new language model: an ARPA file, or a training spec (text source, order, prune, normalize)."""

    name: str
    arpa: Path | None = None
    text: str | None = None
    order: int = 3
    prune: Any = None
    normalize: Any = None
    neural: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        if self.neural is not None:
            return {"neural": copy.deepcopy(dict(self.neural))}
        if self.arpa is not None:
            return {"arpa": str(self.arpa)}
        return {"train": {"text": self.text, "order": self.order, "prune": self.prune, "normalize": self.normalize}}


@dataclass(frozen=True)
class SearchConfig:
    """How the weights are chosen."""

    method: str = "coordinate"
    weights: Mapping[str, Any] = field(default_factory=dict)
    ranges: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    lambda_step: float = 0.05
    max_rounds: int = 20
    coarse_points: int = 7
    restarts: int = 3


@dataclass(frozen=True)
class RescoreConfig:
    """A validated rescoring config (see the module docstring); :attr:`raw` is the resolved dict."""

    name: str
    seed: int
    dev: Path | None
    test: Path | None
    nbest: Path | None
    split_key: str | None
    split_dev: str | None
    format: str | None
    lms: tuple[LMSpec, ...]
    combination: Combination
    search: SearchConfig
    bootstrap_resamples: int
    confidence: float
    first_pass_retuned: bool
    output_nbest: str | None
    lm_cache: Path | None
    lm_batch_size: int
    raw: Mapping[str, Any] = field(repr=False)
    baseline_lms: tuple[str, ...] | None = None

    def space(self) -> SearchSpace:
        """The search space: grids for searched parameters (fixed ones from ``search.weights``)."""
        return build_space(self.combination, self.search)


def default_ranges(prior: str) -> dict[str, tuple[float, float, float]]:
    """Default ``[min, max, step]`` per parameter kind for a prior (``lm`` stands for every LM weight).

    >>> default_ranges("rank")["word_penalty"]
    (-5.0, 5.0, 0.05)
    """
    if prior in ("am", "total"):
        return {"lm": (0.0, 30.0, 0.5), "lm_scale": (0.0, 30.0, 0.5), "word_penalty": (-30.0, 30.0, 0.5)}
    return {"lm": (0.0, 5.0, 0.05), "lm_scale": (0.0, 5.0, 0.05), "word_penalty": (-5.0, 5.0, 0.05)}


def build_space(comb: Combination, search: SearchConfig) -> SearchSpace:
    """Grids for every parameter of ``comb`` not fixed by ``search`` (fixed: every parameter fixed)."""
    params = comb.parameters()
    if search.method == "fixed":
        return SearchSpace({}, comb.check_weights(search.weights))
    defaults = default_ranges(comb.prior)
    unknown = sorted(set(search.ranges) - set(params) - {"lambda"})
    if unknown:
        raise ConfigError(f"search.ranges names unknown parameter(s) {unknown}", expected=f"some of {list(params)}")
    grids: dict[str, tuple[Any, ...]] = {}
    for p in params:
        if p == "lambda":
            grids[p] = simplex_grid(comb.lms, search.lambda_step)
            continue
        lo, hi, step = search.ranges.get(p, defaults.get(p, defaults["lm"]))
        grids[p] = value_grid(lo, hi, step)
    return SearchSpace(grids)


def _lm_spec(name: Any, v: Any, check: bool) -> LMSpec:
    where = f"lms.{name}"
    if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED_NAMES:
        raise ConfigError(f"language model name {name!r} is not allowed",
                          expected=f"letters, digits, _ . - (starting with a letter), not {sorted(RESERVED_NAMES)}")
    if isinstance(v, str):
        return LMSpec(name, arpa=_path(v, where, check))
    d = _mapping(v, where, _LM)
    if "neural" in d:
        if len(d) > 1:
            raise ConfigError(f"config key {where!r} needs exactly one of 'arpa', 'train' and 'neural'",
                              expected="an ARPA path, {train: {...}} or {neural: {...}}")
        return LMSpec(name, neural=_neural_spec(d["neural"], f"{where}.neural", check))
    if ("arpa" in d) == ("train" in d):
        raise ConfigError(f"config key {where!r} needs exactly one of 'arpa' and 'train'",
                          expected="an ARPA path or {train: {text: ..., order: ...}}")
    if "arpa" in d:
        return LMSpec(name, arpa=_path(d["arpa"], f"{where}.arpa", check))
    t = _mapping(d["train"], f"{where}.train", _TRAIN)
    if "text" not in t:
        raise ConfigError(f"config key {where}.train needs 'text'", expected="a text source name or a text file")
    from privasr.experiments.text import TEXT_SOURCES

    text = _str(t["text"], f"{where}.train.text")
    if text not in TEXT_SOURCES:
        text = str(_path(text, f"{where}.train.text", check))
    order = _int(t.get("order", 3), f"{where}.train.order", 1, 10)
    norm = t.get("normalize")
    if norm is not None:
        from privasr.text.normalize import Normalizer

        Normalizer.from_spec(norm)  # validates
    return LMSpec(name, text=text, order=order, prune=t.get("prune"), normalize=norm)


def server_nnlm(raw: Mapping[str, Any], check: bool) -> tuple[LMSpec, Path | None]:
    """An experiment config's ``nnlm`` (a neural LM spec, required) and ``cache_dir`` (optional) keys.

    Raises:
        ConfigError: ``nnlm`` is missing or not a neural LM.
    """
    if "nnlm" not in raw:
        raise ConfigError("config key 'nnlm' is missing", expected="{neural: {train: ...}} or {neural: {checkpoint: ...}}")
    nnlm = _lm_spec("nnlm", raw["nnlm"], check)
    if nnlm.neural is None:
        raise ConfigError("config key 'nnlm' must be a neural LM", expected="{neural: {...}}")
    cache = raw.get("cache_dir")
    return nnlm, (Path(expand_vars(str(cache))) if cache is not None else None)


def federation_settings(raw: Mapping[str, Any]) -> tuple[str, dict[str, Any], Any, int]:
    """An experiment config's ``federated`` key: ``(backend, backend_options, sampler, min_clients)``.

    ``{backend: local | ray | flower, backend_options: {...}, sampler: all | {kind: ..., ...},
    min_clients: 1}``, every key optional.

    Raises:
        ConfigError: an unknown key or a bad value, naming it.

    >>> federation_settings({"federated": {"sampler": {"kind": "poisson", "rate": 0.2}}})
    ('local', {}, Poisson(rate=0.2), 1)
    """
    from privasr.federated.sampling import make_sampler

    fed = _mapping(raw.get("federated", {}), "federated", ("backend", "backend_options", "sampler", "min_clients"))
    backend = _str(fed.get("backend", "local"), "federated.backend", ("local", "ray", "flower"))
    backend_options = _mapping(fed.get("backend_options", {}), "federated.backend_options")
    sampler = make_sampler(fed.get("sampler", "all"))
    return backend, backend_options, sampler, _int(fed.get("min_clients", 1), "federated.min_clients", 1)


def _text_source(v: Any, where: str, check: bool) -> str:
    from privasr.experiments.text import TEXT_SOURCES

    text = _str(v, where)
    return text if text in TEXT_SOURCES else str(_path(text, where, check))


def _neural_spec(v: Any, where: str, check: bool) -> dict[str, Any]:
    """Validate a ``neural`` LM spec; return it resolved (paths expanded, defaults filled in)."""
    d = _mapping(v, where, _NEURAL)
    if ("checkpoint" in d) == ("train" in d):
        raise ConfigError(f"config key {where!r} needs exactly one of 'checkpoint' and 'train'",
                          expected="{checkpoint: PATH} or {train: {text: ..., preset: ...}}")
    out: dict[str, Any] = {"device": _str(d.get("device", "cpu"), f"{where}.device"),
                           "batch_tokens": _int(d.get("batch_tokens", 4096), f"{where}.batch_tokens", 1),
                           "spread_unk": _bool(d.get("spread_unk", True), f"{where}.spread_unk")}
    if "checkpoint" in d:
        out["checkpoint"] = str(_path(d["checkpoint"], f"{where}.checkpoint", check))
        return out
    t = _mapping(d["train"], f"{where}.train", _NEURAL_TRAIN)
    for k in ("text", "valid", "preset"):
        if t.get(k) is None:
            raise ConfigError(f"config key {where}.train needs {k!r}",
                              expected="{text: SOURCE, valid: SOURCE, preset: NAME} (presets: "
                                       "privasr.lm.neural.models.PRESETS)")
    train: dict[str, Any] = {"text": _text_source(t["text"], f"{where}.train.text", check)}
    train["valid"] = _text_source(t["valid"], f"{where}.train.valid", check)
    train["preset"] = _str(t["preset"], f"{where}.train.preset")
    train["model"] = _mapping(t.get("model"), f"{where}.train.model")
    train["options"] = _mapping(t.get("options"), f"{where}.train.options")
    train["seed"] = _int(t.get("seed", 0), f"{where}.train.seed", 0)
    ms = t.get("max_sentences")
    train["max_sentences"] = None if ms is None else _int(ms, f"{where}.train.max_sentences", 1)
    try:
        from privasr.lm.neural.models import PRESETS, NeuralLMConfig
    except ImportError:  # pragma: no cover - torch missing
        raise ConfigError(f"config key {where!r}: neural LMs need torch", expected="pip install privasr[neural]") \
            from None
    if train["preset"] not in PRESETS:
        raise ConfigError(f"config key {where}.train.preset is {train['preset']!r}",
                          expected=f"one of {', '.join(sorted(PRESETS))}")
    try:
        NeuralLMConfig.preset(train["preset"]).replace(**train["model"])
    except ConfigError as e:
        raise ConfigError(f"config key {where}.train.model: {e.message}", expected=e.expected) from None
    _train_options(train["options"], f"{where}.train.options")
    out["train"] = train
    return out


def _train_options(options: Mapping[str, Any], where: str) -> Any:
    """``TrainOptions(**options)`` (unknown or invalid fields: :class:`ConfigError` naming ``where``)."""
    import dataclasses

    from privasr.lm.neural.train import TrainOptions

    names = {f.name for f in dataclasses.fields(TrainOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} in {where}", expected=f"some of {sorted(names)}")
    try:
        return TrainOptions(**options)
    except (ConfigError, InputError, TypeError, ValueError) as e:
        raise ConfigError(f"config key {where}: {e}") from None


def _ranges(v: Any) -> dict[str, tuple[float, float, float]]:
    out = {}
    for k, r in _mapping(v, "search.ranges").items():
        where = f"search.ranges.{k}"
        if not isinstance(r, list | tuple) or len(r) != 3:
            raise ConfigError(f"config key {where!r} is {r!r}", expected="[min, max, step]")
        lo, hi, step = (_num(x, where) for x in r)
        value_grid(lo, hi, step)  # validates
        out[str(k)] = (lo, hi, step)
    return out


def load_config(config: Mapping[str, Any], *, check_files: bool = True) -> RescoreConfig:
    """Validate a config dict (see the module docstring); with ``check_files`` every input must exist."""
    top = _mapping(config, "", _TOP)
    name = _str(top.get("name", "rescore"), "name")
    seed = _int(top.get("seed", 0), "seed", 0)
    data = _mapping(top.get("data"), "data", _DATA)
    fmt = data.get("format")
    if fmt is not None:
        from privasr.corpus.load import FORMATS

        _str(fmt, "data.format", sorted(FORMATS))
    dev = test = nbest = None
    split_key = split_dev = None
    if "nbest" in data:
        if "test" in data or "dev" in data:
            raise ConfigError("data: give either nbest + split or test (+ dev)", expected="not both")
        nbest = _path(data["nbest"], "data.nbest", check_files)
        sp = _mapping(data.get("split"), "data.split", _SPLIT)
        if not sp:
            raise ConfigError("data.nbest needs data.split", expected="{key: speaker, dev: even}")
        split_key = _str(sp.get("key", "speaker"), "data.split.key", ("speaker", "client"))
        split_dev = _str(sp.get("dev", "even"), "data.split.dev", ("even", "odd"))
    else:
        if "split" in data:
            raise ConfigError("data.split is only used with data.nbest")
        if "test" not in data:
            raise ConfigError("config key 'data.test' is missing", expected="the N-best set to rescore")
        test = _path(data["test"], "data.test", check_files)
        if data.get("dev") is not None:
            dev = _path(data["dev"], "data.dev", check_files)
    lms = tuple(_lm_spec(k, v, check_files) for k, v in _mapping(top.get("lms"), "lms").items())
    comb_d = _mapping(top.get("combine"), "combine", _COMBINE)
    fp = comb_d.get("first_pass_lm", True)
    if not isinstance(fp, bool):
        raise ConfigError(f"config key 'combine.first_pass_lm' is {fp!r}", expected="true or false")
    prior = _str(comb_d.get("prior", "am"), "combine.prior")
    lm_names = (("lm",) if fp else ()) + tuple(s.name for s in lms)
    comb = Combination(prior=prior, lms=lm_names, mode=_str(comb_d.get("mode", "loglinear"), "combine.mode"),
                       prior_weight=_num(comb_d.get("prior_weight", 1.0), "combine.prior_weight"))
    s = _mapping(top.get("search"), "search", _SEARCH)
    method = _str(s.get("method", "coordinate"), "search.method", ("coordinate", "grid", "fixed"))
    weights = _mapping(s.get("weights"), "search.weights")
    search = SearchConfig(
        method=method, weights=weights, ranges=_ranges(s.get("ranges")),
        lambda_step=_num(s.get("lambda_step", 0.05), "search.lambda_step"),
        max_rounds=_int(s.get("max_rounds", 20), "search.max_rounds", 1),
        coarse_points=_int(s.get("coarse_points", 7), "search.coarse_points", 0),
        restarts=_int(s.get("restarts", 3), "search.restarts", 1),
    )
    if method == "fixed":
        comb.check_weights(weights)
    elif weights:
        comb.check_weights(weights)  # a start point must be complete too
    if method != "fixed" and dev is None and nbest is None:
        raise ConfigError("weights are tuned on a dev set but data.dev is not given",
                          expected="data.dev, or search.method: fixed with search.weights")
    space = build_space(comb, search)
    space.check(comb)
    if method == "grid" and space.size() > 2_000_000:
        raise ConfigError(f"the full grid has {space.size():,} points", expected="at most 2,000,000 (use coordinate)")
    ev = _mapping(top.get("eval"), "eval", _EVAL)
    resamples = _int(ev.get("bootstrap_resamples", 1000), "eval.bootstrap_resamples", 1)
    conf = _num(ev.get("confidence", 0.95), "eval.confidence")
    if not 0 < conf < 1:
        raise ConfigError(f"config key 'eval.confidence' is {conf}", expected="a number in (0, 1)")
    fpr = ev.get("first_pass_retuned", True)
    if not isinstance(fpr, bool):
        raise ConfigError(f"config key 'eval.first_pass_retuned' is {fpr!r}", expected="true or false")
    bl = ev.get("baseline_lms")
    baseline_lms: tuple[str, ...] | None = None
    if bl is not None:
        names = [x.name for x in lms]
        if not isinstance(bl, list | tuple) or not all(isinstance(x, str) for x in bl):
            raise ConfigError(f"config key 'eval.baseline_lms' is {bl!r}", expected="a list of LM names")
        bad = sorted(set(bl) - set(names))
        if bad:
            raise ConfigError(f"eval.baseline_lms names unknown LM(s) {bad}", expected=f"some of {names}")
        if set(bl) == set(names):
            raise ConfigError("eval.baseline_lms lists every LM", expected="a subset without the LM(s) under test")
        if method == "fixed":
            raise ConfigError("eval.baseline_lms needs tuned weights", expected="search.method coordinate or grid")
        baseline_lms = tuple(dict.fromkeys(bl))
    out = _mapping(top.get("output"), "output", _OUTPUT)
    onb = out.get("nbest", "test.rescored.jsonl.gz")
    if onb is not None:
        onb = _str(onb, "output.nbest")
        if "/" in onb or "\\" in onb or not onb.endswith((".jsonl", ".jsonl.gz", ".jsonl.xz", ".jsonl.bz2")):
            raise ConfigError(f"config key 'output.nbest' is {onb!r}",
                              expected="a file name in the output folder ending in .jsonl[.gz|.xz|.bz2]")
    cache = out.get("lm_cache")
    cache_p = Path(expand_vars(_str(cache, "output.lm_cache"))) if cache is not None else None
    resolved = {
        "name": name, "seed": seed,
        "data": {k: v for k, v in {"dev": dev, "test": test, "nbest": nbest, "format": fmt,
                                   "split": {"key": split_key, "dev": split_dev} if nbest else None}.items()
                 if v is not None},
        "lms": {sp_.name: sp_.to_dict() for sp_ in lms},
        "combine": comb.to_dict() | {"first_pass_lm": fp},
        "search": {"method": method, "weights": weights, "ranges": {k: list(v) for k, v in search.ranges.items()},
                   "lambda_step": search.lambda_step, "max_rounds": search.max_rounds,
                   "coarse_points": search.coarse_points, "restarts": search.restarts},
        "eval": {"bootstrap_resamples": resamples, "confidence": conf, "first_pass_retuned": fpr,
                 **({"baseline_lms": list(baseline_lms)} if baseline_lms is not None else {})},
        "output": {"nbest": onb, "lm_cache": cache_p},
        "lm_batch_size": _int(top.get("lm_batch_size", 4096), "lm_batch_size", 1),
    }
    return RescoreConfig(
        name=name, seed=seed, dev=dev, test=test, nbest=nbest, split_key=split_key, split_dev=split_dev,
        format=fmt, lms=lms, combination=comb, search=search, bootstrap_resamples=resamples, confidence=conf,
        first_pass_retuned=fpr, output_nbest=onb, lm_cache=cache_p, lm_batch_size=resolved["lm_batch_size"],
        raw=resolved, baseline_lms=baseline_lms,
    )


# ---------------------------------------------------------------------------------------------- data


def _load_nbest(path: Path, fmt: str | None) -> list[NBest]:
    from privasr.corpus.load import load_nbest

    return load_nbest(path, fmt)


def split_by_key(records: Sequence[NBest], key: str = "speaker", dev: str = "even") -> tuple[list[NBest], list[NBest],
                                                                                            list[str], list[str]]:
    """Split N-best lists by speaker (or client): sort the distinct keys (numbers numerically), the keys at
    even (``dev="even"``) or odd positions form dev, the others test. Returns ``(dev, test, dev_keys,
    test_keys)``; records keep their order.

    >>> from privasr.corpus.records import NBest
    >>> recs = [NBest(f"u{i}", (), speaker=s) for i, s in enumerate(["10", "9", "10", "2"])]
    >>> d, t, dk, tk = split_by_key(recs)
    >>> [r.utt_id for r in d], dk, tk
    (['u0', 'u2', 'u3'], ['2', '10'], ['9'])
    """
    from privasr.corpus.formats._common import natural_key

    vals = []
    for r in records:
        v = r.speaker if key == "speaker" else r.client
        if v is None:
            raise InputError(f"utterance {r.utt_id} has no {key}", expected=f"a {key} on every utterance to split by")
        vals.append(v)
    keys = sorted(set(vals), key=natural_key)
    want = 0 if dev == "even" else 1
    dev_keys = [k for i, k in enumerate(keys) if i % 2 == want]
    dk = set(dev_keys)
    d = [r for r, v in zip(records, vals, strict=True) if v in dk]
    t = [r for r, v in zip(records, vals, strict=True) if v not in dk]
    return d, t, dev_keys, [k for k in keys if k not in dk]


# ---------------------------------------------------------------------------------------------- LMs


def _text_hash(sentences: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(" ".join(s).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _train_kwargs(prune: Any) -> dict[str, Any]:
    return {} if prune is None else {"prune": prune}


def build_lm(spec: LMSpec, cache_dir: Path | None, data: Path | None = None) -> tuple[LanguageModel, dict[str, Any]]:
    """Load or train one LM; a trained LM is cached as ``cache_dir/NAME.arpa`` with ``NAME.json`` (its key)."""
    from privasr.lm.ngram.arpa import read_arpa, write_arpa

    if spec.neural is not None:
        return _build_neural(spec, cache_dir, data)
    t0 = time.perf_counter()
    if spec.arpa is not None:
        lm = read_arpa(spec.arpa)
        info: dict[str, Any] = {"arpa": str(spec.arpa), "load_s": time.perf_counter() - t0}
    else:
        from privasr.experiments.text import load_text

        assert spec.text is not None
        sents = load_text(spec.text, data=data, normalize=spec.normalize)
        if not sents:
            raise InputError(f"language model {spec.name}: the training text is empty", path=spec.text)
        key = {"text": spec.text, "text_sha256": _text_hash(sents), "order": spec.order, "prune": spec.prune,
               "normalize": spec.normalize, "trainer": "privasr.lm.ngram.mkn.train_mkn", "version": __version__}
        info = {"train": spec.to_dict()["train"], "sentences": len(sents), "tokens": sum(map(len, sents)),
                "text_s": time.perf_counter() - t0}
        arpa = meta = None
        if cache_dir is not None:
            arpa, meta = cache_dir / f"{spec.name}.arpa", cache_dir / f"{spec.name}.json"
        lm = None
        if arpa is not None and meta is not None and arpa.is_file() and meta.is_file():
            try:
                same = json.loads(meta.read_text(encoding="utf-8")) == key
            except (OSError, ValueError):
                same = False
            if same:
                t1 = time.perf_counter()
                lm = read_arpa(arpa)
                info.update(cached=True, arpa=str(arpa), load_s=time.perf_counter() - t1)
        if lm is None:
            from privasr.lm.ngram.mkn import train_mkn

            t1 = time.perf_counter()
            trained = train_mkn(sents, spec.order, **_train_kwargs(spec.prune))
            info.update(cached=False, train_s=time.perf_counter() - t1)
            if arpa is not None and meta is not None:
                # score with the model read back from the ARPA file, so that this run and every later one
                # (which reuses the file) use exactly the same probabilities
                t1 = time.perf_counter()
                arpa.parent.mkdir(parents=True, exist_ok=True)
                write_arpa(trained, arpa)
                lm = read_arpa(arpa)
                meta.write_text(json.dumps(key, indent=1) + "\n", encoding="utf-8")
                info.update(arpa=str(arpa), write_read_s=time.perf_counter() - t1)
            else:
                lm = trained
    info["order"] = lm.order
    if hasattr(lm, "num_ngrams"):
        info["ngrams"] = [int(lm.num_ngrams(n)) for n in range(1, lm.order + 1)]
    info["seconds"] = time.perf_counter() - t0
    return lm, info


def _build_neural(spec: LMSpec, cache_dir: Path | None, data: Path | None) -> tuple[LanguageModel, dict[str, Any]]:
    """Load a neural checkpoint, or train one (cached as ``cache_dir/NAME.pt`` + ``NAME.json``, its key)."""
    from privasr.lm.neural.scorer import NeuralLM

    assert spec.neural is not None
    t0 = time.perf_counter()
    nspec = spec.neural
    kw = {"device": nspec["device"], "batch_tokens": nspec["batch_tokens"], "spread_unk": nspec["spread_unk"]}
    info: dict[str, Any] = {"neural": copy.deepcopy(dict(nspec))}
    if "checkpoint" in nspec:
        lm = NeuralLM.from_checkpoint(nspec["checkpoint"], **kw)
        info.update(checkpoint=nspec["checkpoint"], load_s=time.perf_counter() - t0)
    else:
        from privasr.experiments.text import load_text
        from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint
        from privasr.lm.neural.models import NeuralLMConfig

        t = nspec["train"]
        sents = load_text(t["text"], data=data)
        if t["max_sentences"] is not None:
            sents = sents[: t["max_sentences"]]
        valid = load_text(t["valid"], data=data)
        if not sents:
            raise InputError(f"language model {spec.name}: the training text is empty", path=t["text"])
        config = NeuralLMConfig.preset(t["preset"]).replace(**t["model"])
        key = {"text": t["text"], "text_sha256": _text_hash(sents), "valid": t["valid"],
               "valid_sha256": _text_hash(valid), "preset": t["preset"],
               "model": config.to_dict(), "options": t["options"], "seed": t["seed"],
               "max_sentences": t["max_sentences"], "trainer": "privasr.lm.neural.train.train_lm",
               "vocab_records_unk_types": True,
               "version": __version__}
        info.update(sentences=len(sents), tokens=sum(map(len, sents)), text_s=time.perf_counter() - t0)
        ckpt = meta = None
        if cache_dir is not None:
            ckpt, meta = cache_dir / f"{spec.name}.pt", cache_dir / f"{spec.name}.json"
        loaded = None
        if ckpt is not None and meta is not None and ckpt.is_file() and meta.is_file():
            try:
                stored = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                stored = None
            if isinstance(stored, dict) and stored.get("key") == json.loads(json.dumps(key)):
                loaded = load_checkpoint(ckpt, map_location=nspec["device"])
                info.update(cached=True, checkpoint=str(ckpt), training=stored.get("training"))
        if loaded is None:
            from privasr.lm.neural.train import train_lm

            t1 = time.perf_counter()
            options = _train_options(t["options"], f"lms.{spec.name}.neural.train.options")
            work = (cache_dir / f"{spec.name}.train") if cache_dir is not None else None
            # an interrupted training (same spec up to max_epochs / max_steps / patience) is resumed
            resume = work is not None and (work / "last.pt").is_file()
            res = train_lm(sents, valid, config, options, out_dir=work, seed=t["seed"], device=nspec["device"],
                           progress=False, resume=resume)
            training = _train_summary(res)
            training["train_s"] = time.perf_counter() - t1
            info.update(cached=False, training=training)
            model, vocab = res.model, res.vocab
            if ckpt is not None and meta is not None:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                save_checkpoint(ckpt, model, vocab, model.config, extra={"key": key, "training": training})
                meta.write_text(json.dumps({"key": key, "training": training}, indent=1) + "\n", encoding="utf-8")
                loaded = load_checkpoint(ckpt, map_location=nspec["device"])
                info["checkpoint"] = str(ckpt)
                model, vocab = loaded.model, loaded.vocab
            lm = NeuralLM(model, vocab, **kw)
        else:
            lm = NeuralLM(loaded.model, loaded.vocab, **kw)
    info["order"] = "inf" if lm.arch == "lstm" else lm.order
    info["vocab_size"] = len(lm.vocab)
    info["parameters"] = int(sum(p.numel() for p in lm.model.parameters()))
    info["seconds"] = time.perf_counter() - t0
    return lm, info


def _train_summary(res: Any) -> dict[str, Any]:
    """JSON-ready facts of a :func:`~privasr.lm.neural.train.train_lm` result (what it exposes)."""
    out: dict[str, Any] = {}
    for k in ("best_valid_ppl", "best_epoch", "best_step", "initial_valid_ppl", "steps", "tokens_per_s",
              "stopped_early", "epochs"):
        v = getattr(res, k, None)
        if v is not None:
            out[k] = json.loads(json.dumps(v, default=str))
    return out


def _ppl(cache: LMScoreCache, refs: Sequence[Sequence[str]]) -> float:
    """Perplexity incl. OOVs (as ``<unk>``) and ``</s>``, from the cached ln probabilities of the refs."""
    if not refs:
        return math.nan
    lnp = cache.ln_probs(refs)
    tokens = sum(len(r) + 1 for r in refs)
    return float(math.exp(-float(lnp.sum()) / tokens))


# ---------------------------------------------------------------------------------------------- run


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


def _choose_words(recs: Sequence[NBest], choice: np.ndarray) -> list[tuple[str, ...]]:
    return [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(recs, choice, strict=True)]


def sub_system_start(comb: Combination, space: SearchSpace, weights: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tuned sub-system's weights as a point of the full log-linear search: its weights, and every other
    parameter at its value nearest 0 (an LM weight of 0 leaves that LM out). ``None`` for linear combinations
    (their interpolation weights do not nest).

    >>> c = Combination(prior="am", lms=("lm", "a", "b"))
    >>> sp = SearchSpace({"lm": (0.0, 1.0), "a": (0.0, 2.0), "b": (0.0, 3.0), "word_penalty": (-1.0, 0.0, 1.0)})
    >>> sub_system_start(c, sp, {"lm": 1.0, "a": 2.0, "word_penalty": -1.0})
    {'lm': 1.0, 'a': 2.0, 'b': 0.0, 'word_penalty': -1.0}
    """
    if comb.mode != "loglinear":
        return None
    point = space.default_start(comb)
    point.update({k: v for k, v in weights.items() if k in point})
    return point


def _tune_or_fix(cfg: RescoreConfig, comb: Combination, space: SearchSpace, dev: Sequence[NBest] | None,
                 dev_table: ScoreTable | None,
                 extra_starts: Sequence[Mapping[str, Any]] = ()) -> SearchResult | None:
    if cfg.search.method == "fixed":
        return None
    assert dev is not None and dev_table is not None
    opts: dict[str, Any] = {}
    start = dict(cfg.search.weights) if cfg.search.weights else None
    if start is not None:
        start = {p: start[p] for p in comb.parameters() if p in start}
        if set(start) != set(comb.parameters()):
            start = None
    if start:
        opts["start"] = start
    if cfg.search.method == "coordinate":
        opts.update(max_rounds=cfg.search.max_rounds, coarse_points=cfg.search.coarse_points,
                    restarts=cfg.search.restarts, extra_starts=list(extra_starts))
    return tune(dev, dev_table, comb, space, method=cfg.search.method, **opts)


def run_rescore(cfg: RescoreConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated config; write ``out/results.json``, ``out/report.md`` and the rescored test lists.

    Returns the metrics written to ``results.json``.
    """
    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.metrics import mapsswe, oracle_wer, paired_bootstrap, wer
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    # ---- data
    t0 = time.perf_counter()
    split_info: dict[str, Any] | None = None
    data_fp: dict[str, Any] = {}
    if cfg.nbest is not None:
        allrecs = _load_nbest(cfg.nbest, cfg.format)
        dev, test, dev_keys, test_keys = split_by_key(allrecs, cfg.split_key or "speaker", cfg.split_dev or "even")
        split_info = {"key": cfg.split_key, "dev": cfg.split_dev, "dev_keys": dev_keys, "test_keys": test_keys}
        data_fp["nbest"] = cfg.nbest
        if not dev or not test:
            raise InputError(f"the {cfg.split_key} split leaves an empty dev or test set", path=cfg.nbest,
                             expected=f"at least two {cfg.split_key}s")
    else:
        assert cfg.test is not None
        test = _load_nbest(cfg.test, cfg.format)
        dev = _load_nbest(cfg.dev, cfg.format) if cfg.dev is not None else None
        data_fp["test"] = cfg.test
        if cfg.dev is not None:
            data_fp["dev"] = cfg.dev
    timings["load_s"] = time.perf_counter() - t0
    comb = cfg.combination
    if cfg.search.method != "fixed" and dev is not None and any(nb.ref is None for nb in dev):
        bad = next(nb for nb in dev if nb.ref is None)
        raise InputError(f"dev utterance {bad.utt_id} has no reference",
                         expected="references on every dev utterance (weights are tuned on dev WER)")
    # cheap check of the first-pass scores the combination needs, before any LM work
    for name, recs in (("dev", dev or []), ("test", test)):
        needed = ([comb.prior] if comb.prior in ("am", "total") else []) + (["lm"] if "lm" in comb.lms else [])
        for sc in needed:
            for nb in recs:
                if any(sc not in h.scores for h in nb.hyps):
                    raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without a {sc!r} score",
                                     expected="that score on every hypothesis; for rank-only lists use "
                                              "combine.prior: rank (or uniform) and combine.first_pass_lm: false")

    # ---- LMs
    t0 = time.perf_counter()
    cache_dir = cfg.lm_cache if cfg.lm_cache is not None else out / "lm"
    lms: dict[str, LanguageModel] = {}
    lm_info: dict[str, Any] = {}
    for spec in cfg.lms:
        lms[spec.name], lm_info[spec.name] = build_lm(spec, cache_dir)
        if spec.arpa is not None:
            data_fp[f"lm:{spec.name}"] = spec.arpa
    timings["lm_s"] = time.perf_counter() - t0

    # ---- scores (each distinct hypothesis once per LM, shared between dev and test)
    t0 = time.perf_counter()
    caches = {n: LMScoreCache(lm, batch_size=cfg.lm_batch_size) for n, lm in lms.items()}
    dev_table = score_table(dev, caches) if dev is not None else None
    test_table = score_table(test, caches)
    for n, c in caches.items():
        lm_info[n]["distinct_hyps_scored"] = c.scored
        lm_info[n]["hyps"] = c.requests
    timings["score_s"] = time.perf_counter() - t0

    # ---- tune on dev only: the sub-systems first (the retuned first pass, the baseline), whose tuned weights
    # (the other LMs at 0) are also starting points of the full search, so it is never worse on dev than they are
    t0 = time.perf_counter()
    space = cfg.space()
    retuned: SearchResult | None = None
    fp_comb = Combination(prior=comb.prior, lms=("lm",) if "lm" in comb.lms else (), mode="loglinear",
                          prior_weight=comb.prior_weight)
    tuned = cfg.search.method != "fixed" and dev is not None and dev_table is not None
    if cfg.first_pass_retuned and tuned and lms:
        fp_search = SearchConfig(method=cfg.search.method, ranges={k: v for k, v in cfg.search.ranges.items()
                                                                   if k in fp_comb.parameters()},
                                 max_rounds=cfg.search.max_rounds, coarse_points=cfg.search.coarse_points,
                                 restarts=cfg.search.restarts)
        fp_cfg_space = build_space(fp_comb, fp_search)
        retuned = tune(dev, dev_table, fp_comb, fp_cfg_space, method=cfg.search.method,
                       **({"max_rounds": cfg.search.max_rounds, "coarse_points": cfg.search.coarse_points,
                           "restarts": cfg.search.restarts} if cfg.search.method == "coordinate" else {}))
    baseline: SearchResult | None = None
    bl_comb: Combination | None = None
    if cfg.baseline_lms is not None and dev is not None and dev_table is not None:
        bl_comb = Combination(prior=comb.prior, lms=(("lm",) if "lm" in comb.lms else ()) + cfg.baseline_lms,
                              mode=comb.mode, prior_weight=comb.prior_weight)
        bl_search = SearchConfig(method=cfg.search.method,
                                 weights={k: v for k, v in cfg.search.weights.items() if k in bl_comb.parameters()},
                                 ranges={k: v for k, v in cfg.search.ranges.items() if k in bl_comb.parameters()},
                                 lambda_step=cfg.search.lambda_step, max_rounds=cfg.search.max_rounds,
                                 coarse_points=cfg.search.coarse_points, restarts=cfg.search.restarts)
        bl_cfg = copy.copy(cfg)
        object.__setattr__(bl_cfg, "search", bl_search)
        baseline = _tune_or_fix(bl_cfg, bl_comb, build_space(bl_comb, bl_search), dev, dev_table)
    extra = [sub_system_start(comb, space, r.weights) for r in (baseline, retuned) if r is not None]
    result = _tune_or_fix(cfg, comb, space, dev, dev_table, extra_starts=[e for e in extra if e is not None])
    weights = comb.check_weights(cfg.search.weights) if result is None else result.weights
    timings["tune_s"] = time.perf_counter() - t0

    # ---- apply to test
    t0 = time.perf_counter()
    totals = comb.totals(test_table, weights)
    choice = select(test_table, totals)
    rescored_words = _choose_words(test, choice)
    first_pass_words = [nb.best.words for nb in test]
    baseline_words = first_pass_words
    if baseline is not None and bl_comb is not None:
        baseline_words = _choose_words(test, select(test_table, bl_comb.totals(test_table, baseline.weights)))
    from privasr.rescore.combine import rerank

    rescored = rerank(test, test_table, totals)
    nbest_path = None
    if cfg.output_nbest is not None:
        nbest_path = out / cfg.output_nbest
        write_nbest(nbest_path, rescored)
    timings["apply_s"] = time.perf_counter() - t0

    # ---- evaluate
    t0 = time.perf_counter()
    metrics: dict[str, Any] = {"wer": None, "wer_baseline": None, "wer_rel_change": None, "mapsswe_p": None}
    has_refs = all(nb.ref is not None for nb in test)
    details: dict[str, Any] = {}
    changed = int(sum(1 for a, b in zip(rescored_words, baseline_words, strict=True) if a != b))
    if has_refs:
        refs = [nb.ref or () for nb in test]
        w_new = wer(refs, rescored_words, aligner="sclite")
        w_base = wer(refs, baseline_words, aligner="sclite")
        w_first = w_base if baseline is None else wer(refs, first_pass_words, aligner="sclite")
        ids = [nb.utt_id for nb in test]
        mp = mapsswe(refs, rescored_words, baseline_words, ids=ids)
        bs = paired_bootstrap(w_new.utt_errors, w_base.utt_errors, w_new.utt_ref_words, seed=cfg.seed,
                              resamples=cfg.bootstrap_resamples, confidence=cfg.confidence)
        orc = oracle_wer(test, aligner="sclite")
        metrics.update(
            wer=w_new.wer, wer_baseline=w_base.wer,
            wer_rel_change=(w_new.wer - w_base.wer) / w_base.wer if w_base.wer > 0 else None,
            mapsswe_p=mp.p, mapsswe_log10_p=mp.log10_p, mapsswe_z=mp.z, mapsswe_segments=mp.n,
            mapsswe_better={"A": "rescored", "B": "baseline", "same": "same"}[mp.better],
            bootstrap_diff=bs.difference, bootstrap_ci_low=bs.ci_low, bootstrap_ci_high=bs.ci_high,
            bootstrap_confidence=bs.confidence, bootstrap_prob_improvement=bs.prob_a_better,
            bootstrap_resamples=bs.resamples, wer_oracle=orc.wer, test_ref_words=w_new.ref_words,
            wer_first_pass=w_first.wer,
        )
        if baseline is not None:
            metrics["baseline"] = f"rescoring with {', '.join(bl_comb.lms) if bl_comb else ''} (tuned on dev)"
            metrics["wer_rel_change_vs_first_pass"] = ((w_new.wer - w_first.wer) / w_first.wer
                                                       if w_first.wer > 0 else None)
            metrics["mapsswe_p_vs_first_pass"] = mapsswe(refs, rescored_words, first_pass_words, ids=ids).p
        details["test_wer_rescored"] = w_new.as_dict()
        details["test_wer_baseline"] = w_base.as_dict()
        if retuned is not None:
            fp_tot = fp_comb.totals(test_table, retuned.weights)
            w_fp = wer(refs, _choose_words(test, select(test_table, fp_tot)), aligner="sclite")
            metrics["wer_first_pass_retuned"] = w_fp.wer
            mp2 = mapsswe(refs, rescored_words, _choose_words(test, select(test_table, fp_tot)), ids=ids)
            metrics["mapsswe_p_vs_first_pass_retuned"] = mp2.p
        lm_ppl = {n: {"ppl_test_refs": _ppl(c, refs)} for n, c in caches.items()}
        for n in lm_ppl:
            lm_info[n].update(lm_ppl[n])
        metrics["ppl_by_lm"] = {n: v["ppl_test_refs"] for n, v in lm_ppl.items()}
        # ``ppl`` (the shared metric name) is the test-reference perplexity of the LM under test: the one new LM
        # that is not part of the baseline system (absent when that is not a single LM).
        under_test = [n for n in lm_ppl if n not in (cfg.baseline_lms or ())]
        if len(under_test) == 1:
            metrics["ppl"] = metrics["ppl_by_lm"][under_test[0]]
    metrics["test_utterances"] = len(test)
    metrics["test_hypotheses"] = test_table.n_hyps
    metrics["test_changed_1best"] = changed
    metrics["weights"] = weights
    if dev is not None and dev_table is not None and all(nb.ref is not None for nb in dev):
        drefs = [nb.ref or () for nb in dev]
        dch = select(dev_table, comb.totals(dev_table, weights))
        metrics["dev_wer"] = wer(drefs, _choose_words(dev, dch), aligner="sclite").wer
        metrics["dev_wer_first_pass"] = wer(drefs, [nb.best.words for nb in dev], aligner="sclite").wer
        metrics["dev_wer_baseline"] = metrics["dev_wer_first_pass"]
        if baseline is not None and bl_comb is not None:
            bch = select(dev_table, bl_comb.totals(dev_table, baseline.weights))
            metrics["dev_wer_baseline"] = wer(drefs, _choose_words(dev, bch), aligner="sclite").wer
            metrics["weights_baseline"] = baseline.weights
        metrics["dev_utterances"] = len(dev)
        if retuned is not None:
            metrics["dev_wer_first_pass_retuned"] = retuned.wer
            metrics["weights_first_pass_retuned"] = retuned.weights
        for n, c in caches.items():
            lm_info[n]["ppl_dev_refs"] = _ppl(c, drefs)
    if result is not None:
        metrics["search_evaluations"] = result.evaluations
        metrics["dev_errors_tuned"] = result.errors
        metrics["dev_errors_baseline"] = result.baseline_errors
    timings["eval_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    metrics.update(timings)

    extra = {"lms": lm_info, "search": result.to_dict() if result is not None else {"method": "fixed"},
             "baseline_search": baseline.to_dict() if baseline is not None else None,
             "first_pass_retuned": retuned.to_dict() if retuned is not None else None,
             "split": split_info, "details": details, "command": list(argv) if argv else None,
             "outputs": {"nbest": str(nbest_path) if nbest_path else None}}
    write_results(out, config=cfg.raw, seed=cfg.seed, metrics=metrics, data=data_fp, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, lm_info, result, retuned, split_info, argv, nbest_path),
                                   encoding="utf-8")
    return metrics


def _report(cfg: RescoreConfig, m: Mapping[str, Any], lm_info: Mapping[str, Any], result: SearchResult | None,
            retuned: SearchResult | None, split: Mapping[str, Any] | None, argv: Sequence[str] | None,
            nbest_path: Path | None) -> str:
    c = cfg.combination
    lines = [f"# N-best rescoring: {cfg.name}", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    src = f"`{cfg.nbest}` split by {split['key']}" if split else f"dev `{cfg.dev}`, test `{cfg.test}`"
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
    lines.append(f"| **rescored** | {_pct(m.get('dev_wer'))} | **{_pct(m.get('wer'))}** |")
    if m.get("wer_oracle") is not None:
        lines.append(f"| N-best oracle (upper bound) | | {_pct(m.get('wer_oracle'))} |")
    lines.append("")
    if m.get("wer") is not None:
        rel = m.get("wer_rel_change")
        lines += [
            f"Test: WER {_pct(m['wer'])} vs {'the baseline' if m.get('baseline') else 'first-pass'} "
            f"{_pct(m['wer_baseline'])}, relative change "
            f"{'n/a' if rel is None else f'{100 * rel:+.2f}%'} ({m['test_changed_1best']} of "
            f"{m['test_utterances']} 1-best changed). "
            f"MAPSSWE (sclite): Z = {m['mapsswe_z']:.3f}, p = {m['mapsswe_p']:.3g} "
            f"(log10 p = {m['mapsswe_log10_p']:.2f}), {m['mapsswe_segments']} segments, better: "
            f"{m['mapsswe_better']}. Paired bootstrap {100 * m['bootstrap_confidence']:.0f}% CI of "
            f"WER(rescored) - WER({'baseline' if m.get('baseline') else 'first pass'}): "
            f"[{100 * m['bootstrap_ci_low']:.2f}, "
            f"{100 * m['bootstrap_ci_high']:.2f}] points ({m['bootstrap_resamples']} resamples, "
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
