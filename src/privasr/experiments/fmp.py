"""The FMP experiment (paper 000, section 3): generic-NNLM rescoring vs federated marginal personalisation.

``privasr fmp run --config configs/fmp-ami.yaml --out DIR`` does, on an N-best set with dev and test parts:

1. **The server's NNLM** is trained on generic background text only (``generic-train``: Gutenberg +
   Earnings-21, the first pass's own corpus; never the evaluation domain) or loaded from a checkpoint, exactly
   like a rescoring config's ``neural`` LM (:mod:`privasr.rescore.lms`), cached in ``cache_dir``. An n-gram LM
   works as the base model too (``nnlm: PATH.arpa``, ``{arpa: PATH}`` or ``{train: {text, order}}``, like a
   rescoring config's LM; its vocabulary is the ARPA file's). The background unigram ``u(w)`` is the add-one
   estimate over the LM's vocabulary from the ``background`` text (file(s) or a named source; default the LM's
   training text, else an ARPA base model's unigrams, else ``generic-train``), or the unigram probabilities of an ARPA file given as
   ``background``; which one is recorded in ``results.json`` (``background``, with the files' fingerprints
   under ``data``).
2. **The baseline** is generic-NNLM rescoring: ``am + w_lm * first-pass LM + w_nnlm * ln P_nnlm + wp * n`` with
   the weights tuned on dev WER (coordinate descent; paper 000 fixes the interpolation at 0.5, we tune it).
3. **FMP** (:mod:`privasr.federated.algorithms.fmp`) runs through the federated loop
   (:func:`privasr.federated.loop.run_federated`, any backend) with the clients' utterances (meetings or
   speakers) in time order, split into ``T + 1`` groups; group ``t`` is rescored in round ``t`` with the NNLM
   rescaled by the marginals known then. The adapted score of a hypothesis is the baseline score plus
   ``w_nnlm * lam * sum_w ln(g_i(w) / u(w))`` (eq. 1, unnormalised, scaled like the NNLM score; with
   ``normalize: true`` the rescaled NNLM is renormalised exactly at every history, :func:`~privasr.federated.algorithms.fmp_data.nnlm_normalizer`,
   which runs the NNLM on the device for every utterance). ``lam`` is
   tuned on the dev clients (the same FMP simulation, dev references only); everything else follows the config.
   With ``fmp.order: 2`` (or a ``tables.bigram`` row) the clients also keep personal bigram marginals on the
   device (:class:`~privasr.federated.algorithms.fmp.BackgroundBigram` from the same background text, smoothed
   with ``bigram_prior`` pseudo-counts); their exponent ``lam2`` is tuned on dev after ``lam`` (``lam2_grid``).
4. With ``dp``, the Laplace mechanism adds noise once per round to the summed counts
   (:class:`privasr.privacy.dp.mechanisms.LaplaceMechanism`) and the accountant reports ``epsilon`` / ``delta``.
5. Test WER of FMP vs the baseline, with MAPSSWE and a paired bootstrap; optional tables (paper Tables 2-4:
   rounds T, alpha/beta/sigma, epsilon) re-run the simulation on test with the dev-tuned ``lam``.

The WER of a client's choices is computed from the client states in simulation (a deployed device would not
send them anywhere); what crosses to the server is only the :class:`~privasr.federated.core.Update` of counts.

Config (YAML; every key optional unless marked; the schema is :class:`FmpRunConfig`, read with
:mod:`privasr.config`; strings may use ``${PRIVASR_DATA}``)::

    name: fmp                         # the report's title
    label: null                       # the system's human name (default: e.g. generic NNLM rescoring + FMP, T = 10)
    seed: 0                           # simulation, sampling and bootstrap seed
    data:                             # required: dev + test N-best sets, or one set split by key
      dev: PATH
      test: PATH
      nbest: PATH                     # instead of dev/test
      split: {key: speaker, dev: even}  # key: speaker | client; dev: even | odd positions of the sorted keys
    clients: {key: client}            # client (meeting) | speaker
    nnlm: {neural: {...}}             # required: the server's LM, an LM entry of privasr.rescore.lms: neural,
                                      # or an n-gram (PATH.arpa, {arpa: PATH}, {train: {text: .., order: 3}})
    cache_dir: null                   # where a trained NNLM is cached (default OUT/lm)
    background: null                  # u(w)'s source: a text file, a list of text files, a named text source
                                      # (privasr.corpus.sources: generic-train, gutenberg, ...) or one ARPA
                                      # file (its unigram probabilities; not with order 2 or tables.bigram);
                                      # default: the LM's training text (normalised as the LM's
                                      # training was: its normalize), else an ARPA base model's
                                      # unigrams (without bigrams), else generic-train
    combine: {prior: am, first_pass_lm: true}   # prior: am | rank | uniform
    search:                           # the baseline's weights, coordinate descent on dev
      ranges: {}                      # PARAM: [min, max, step] (privasr.rescore.search.default_ranges)
      max_rounds: 20                  # >= 1
      coarse_points: 7                # >= 2
      restarts: 3                     # >= 1
    fmp: {alpha: 0.5, beta: 0.25, sigma: 5.0, smoothing: 1.0, refresh: utterance, send: increment,
          rounds: 10, qbar_threshold: null, order: 1, beta2: 0.5, smoothing2: 1.0}
                                      # FmpConfig's settings (alpha + beta <= 1), rounds T >= 0; qbar_threshold
                                      # null: 0, or with dp the threshold of dp.threshold_sd noise deviations
    lam_grid: [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]   # lam tuned on dev (values >= 0)
    lam2_grid: [0.0, 0.1, 0.25, 0.5, 1.0, 2.0]                  # order 2: lam2 tuned on dev after lam
    bigram_prior: 10.0                # order 2: pseudo-counts of the background bigram
    normalize: false                  # exact renormalisation of the rescaled NNLM (not with oracle_cache)
    oracle_cache: false               # diagnostic: the caches hold the references
    dp: null                          # {epsilon: REQUIRED, unit: utterance | user, cap: 1.0, accountant: pld | rdp,
                                      #  delta: 1e-5, threshold_sd: 3.0}
    federated: {backend: local, backend_options: {}, sampler: all, min_clients: 1}
    tables: {rounds: [T, ...], hyper: [{alpha, beta, sigma}, ...], epsilon: [EPS, ...], bigram: [T, ...],
             epsilon_draws: 5}        # every epsilon row: the mean over 5 noise draws (seeds seed .. seed + 4)
    eval: {bootstrap_resamples: 1000}
    folds: null                       # K >= 2: cross-validation over meetings, dev and test pooled
                                      # (privasr.experiments.fmp_folds; privasr fmp run --folds K)
    fold_unit: meeting                # meeting | series: folds of single meetings or of whole AMI series
    dp_draws: 1                       # with folds and dp: R noise draws of every fold's test run (their mean)

:func:`load_fmp_config` validates everything (unknown keys, types, ranges, files) before any work; errors name
the key path.

>>> cfg = load_fmp_config({"data": {"nbest": "x.jsonl"}, "nnlm": {"neural": {"checkpoint": "m.pt"}},
...                        "fmp": {"rounds": 2}, "lam_grid": 0.5}, check_files=False)
>>> cfg.data.split, cfg.fmp.rounds, cfg.lam_grid
(SplitSettings(key='speaker', dev='even'), 2, (0.5,))
>>> load_fmp_config({"data": {"nbest": "x.jsonl"}, "nnlm": {"neural": {"checkpoint": "m.pt"}},
...                  "fmp": {"alpha": 0.8}}, check_files=False)
Traceback (most recent call last):
...
privasr.errors.ConfigError: config key 'fmp': alpha + beta = 1.05 (expected alpha + beta <= 1: 1 - alpha - beta is the background's weight)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import Context, check_int, check_number, from_mapping, setting, to_dict, unknown_keys
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.experiments._report import markdown_table
from privasr.experiments.rescore import SplitSettings, data_warnings
from privasr.federated.algorithms.fmp import REFRESH, SEND, FmpConfig
from privasr.federated.algorithms.fmp_data import (
    background_unigram,
    build_clients,
    dp_settings,
    nnlm_normalizer,
)
from privasr.federated.sampling import FederationSettings
from privasr.metrics.bootstrap import difference_interval
from privasr.rescore.lms import LMSettings
from privasr.rescore.search import CoordinateSettings

__all__ = ["FmpRunConfig", "FmpDataSettings", "ClientSettings", "FmpCombineSettings",
           "FmpSettings", "DpSettings", "HyperRow", "TablesSettings", "FmpEvalSettings", "load_fmp_config",
           "run_fmp", "simulate", "background", "background_text", "arpa_unigram", "is_arpa"]


# ---------------------------------------------------------------------------------------------- schema


def _as_list(value: Any) -> Any:
    """A single number stands for a one-value list (``lam_grid: 0.5``)."""
    return value if value is None or isinstance(value, list | tuple) else [value]


@dataclass(frozen=True)
class FmpDataSettings:
    """``data``: dev + test N-best sets, or one set split into dev and test by key (default speaker, even)."""

    dev: Path | None = setting(None, exists="file")
    test: Path | None = setting(None, exists="file")
    nbest: Path | None = setting(None, exists="file")
    split: SplitSettings | None = None

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """Either ``{dev, test}`` or ``{nbest, split}`` (checked before any file is looked at)."""
        if isinstance(value, Mapping):
            unknown_keys(value, [f.name for f in dataclasses.fields(cls)], where)
            if "nbest" in value and ("dev" in value or "test" in value):
                raise ConfigError("config key 'data' has nbest and dev/test", expected="either {dev, test} or "
                                                                                "{nbest, split: {key, dev}}")
        return value

    def __config_check__(self, where: str, ctx: Context) -> FmpDataSettings:
        if self.nbest is not None:
            return self if self.split is not None else dataclasses.replace(self, split=SplitSettings())
        if self.dev is None or self.test is None:
            raise ConfigError("config key 'data' needs dev and test (or nbest and split)",
                              expected="{dev: PATH, test: PATH} or {nbest: PATH, split: {key: speaker, dev: even}}")
        return self


@dataclass(frozen=True)
class ClientSettings:
    """``clients``: what a client is (``client``: a meeting; ``speaker``: meeting + speaker)."""

    key: str = setting("client", choices=("client", "speaker"))


@dataclass(frozen=True)
class FmpCombineSettings:
    """``combine``: the baseline's prior and whether the first-pass LM score is combined."""

    prior: str = setting("am", choices=("am", "rank", "uniform"))
    first_pass_lm: bool = True


_ALGORITHM_KEYS = ("alpha", "beta", "sigma", "smoothing", "refresh", "send", "order", "beta2", "smoothing2")


@dataclass(frozen=True)
class FmpSettings:
    """``fmp``: the algorithm's settings (:class:`~privasr.federated.algorithms.fmp.FmpConfig`, defaults from it)
    and the number of rounds ``T`` (the clients' utterances are split into ``T + 1`` groups).

    ``qbar_threshold: null`` leaves it to the run: 0, or with ``dp`` the threshold of
    :func:`~privasr.federated.algorithms.fmp_data.dp_settings`.
    """

    alpha: float = setting(FmpConfig.alpha, min=0.0)
    beta: float = setting(FmpConfig.beta, min=0.0)
    sigma: float = setting(FmpConfig.sigma, gt=0.0)
    smoothing: float = setting(FmpConfig.smoothing, min=0.0)
    refresh: str = setting(FmpConfig.refresh, choices=REFRESH)
    send: str = setting(FmpConfig.send, choices=SEND)
    rounds: int = setting(10, min=0)
    qbar_threshold: float | None = setting(None, min=0.0)
    order: int = setting(FmpConfig.order, min=1, max=2)
    beta2: float = setting(FmpConfig.beta2, min=0.0, max=1.0)
    smoothing2: float = setting(FmpConfig.smoothing2, min=0.0)

    def params(self) -> dict[str, Any]:
        """The :class:`FmpConfig` keys (all but ``rounds``; ``qbar_threshold`` only when set)."""
        out = {k: getattr(self, k) for k in _ALGORITHM_KEYS}
        if self.qbar_threshold is not None:
            out["qbar_threshold"] = self.qbar_threshold
        return out

    def check(self, where: str, extra: Mapping[str, Any] | None = None) -> None:
        """:class:`FmpConfig` accepts these settings (with ``extra`` on top); errors name ``where``."""
        try:
            FmpConfig.from_dict({**self.params(), **(extra or {}), "lam": 1.0})
        except ConfigError as e:
            raise ConfigError(f"config key {where!r}: {e.message}", expected=e.expected) from None

    def __config_check__(self, where: str, ctx: Context) -> None:
        self.check(where)


@dataclass(frozen=True)
class DpSettings:
    """``dp``: the Laplace mechanism on the summed counts and its accountant (``epsilon`` required)."""

    epsilon: float | None = setting(None, min=1e-9)
    unit: str = setting("utterance", choices=("utterance", "user"))
    cap: float = setting(1.0, min=1e-12)
    accountant: str = setting("pld", choices=("pld", "rdp"))
    delta: float = setting(1e-5, min=0.0)
    threshold_sd: float = setting(3.0, min=0.0)

    def __config_check__(self, where: str, ctx: Context) -> None:
        if self.epsilon is None:
            raise ConfigError("config key 'dp' needs epsilon", expected="{epsilon: 1.0, unit: utterance}")


@dataclass(frozen=True)
class HyperRow:
    """A ``tables.hyper`` row: FMP's ``alpha``, ``beta``, ``sigma`` for that row (others from ``fmp``)."""

    alpha: float | None = setting(None, min=0.0)
    beta: float | None = setting(None, min=0.0)
    sigma: float | None = setting(None, gt=0.0)

    def params(self) -> dict[str, float]:
        """The values the row sets."""
        return {k: v for k in ("alpha", "beta", "sigma") if (v := getattr(self, k)) is not None}

    def __config_dict__(self) -> dict[str, float]:
        return self.params()


@dataclass(frozen=True)
class TablesSettings:
    """``tables``: the test re-runs of paper Tables 2-4 (rounds T, alpha/beta/sigma, epsilon) and personal bigrams."""

    rounds: tuple[int, ...] | None = None
    hyper: tuple[HyperRow, ...] | None = None
    epsilon: tuple[float, ...] | None = None
    epsilon_draws: int = setting(5, min=1)
    bigram: tuple[int, ...] | None = None

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """``null`` lists are empty tables; one epsilon stands for a list."""
        if not isinstance(value, Mapping):
            return value
        d = dict(value)
        for k in ("rounds", "hyper", "bigram"):
            if k in d and d[k] is None:
                d[k] = []
        if "hyper" in d and not isinstance(d["hyper"], list | tuple):
            raise ConfigError("config key 'tables.hyper' must be a list", expected="[{alpha: .., beta: .., sigma: ..}]")
        if "epsilon" in d:
            if d["epsilon"] is None:
                raise ConfigError("config key 'tables.epsilon' holds None", expected="finite numbers >= 1e-09")
            d["epsilon"] = _as_list(d["epsilon"])
        return d

    def __config_check__(self, where: str, ctx: Context) -> None:
        for k in ("rounds", "bigram"):
            for i, t in enumerate(getattr(self, k) or ()):
                check_int(t, f"{where}.{k}[{i}]", 0)
        if self.epsilon is not None:
            _check_grid(self.epsilon, f"{where}.epsilon", 1e-9)

    def wanted(self) -> bool:
        """Whether any table is asked for."""
        return any(getattr(self, k) is not None for k in ("rounds", "hyper", "epsilon", "bigram"))


@dataclass(frozen=True)
class FmpEvalSettings:
    """``eval``: the paired bootstrap's resamples."""

    bootstrap_resamples: int = setting(1000, min=1)


def _check_grid(values: Sequence[float], where: str, lo: float) -> None:
    if not values:
        raise ConfigError(f"config key {where!r} is empty", expected="at least one value")
    for i, x in enumerate(values):
        check_number(x, f"{where}[{i}]", lo)


@dataclass(frozen=True)
class FmpRunConfig:
    """An FMP experiment config (module docstring): validated by :func:`load_fmp_config`.

    ``data`` and ``nnlm`` are required (never ``None`` once loaded).
    """

    name: str = "fmp"
    label: str | None = None
    seed: int = setting(0, min=0)
    data: FmpDataSettings | None = None
    clients: ClientSettings = field(default_factory=ClientSettings)
    nnlm: LMSettings | None = None
    background: tuple[str, ...] | None = None
    cache_dir: Path | None = None
    combine: FmpCombineSettings = field(default_factory=FmpCombineSettings)
    search: CoordinateSettings = field(default_factory=CoordinateSettings)
    oracle_cache: bool = False
    fmp: FmpSettings = field(default_factory=FmpSettings)
    lam_grid: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0)
    lam2_grid: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
    bigram_prior: float = setting(10.0, min=1e-12)
    normalize: bool = False
    dp: DpSettings | None = None
    federated: FederationSettings = field(default_factory=FederationSettings)
    tables: TablesSettings = field(default_factory=TablesSettings)
    eval: FmpEvalSettings = field(default_factory=FmpEvalSettings)
    folds: int | None = setting(None, min=2)
    fold_unit: str = setting("meeting", choices=("meeting", "series"))
    dp_draws: int = setting(1, min=1)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """One number stands for a one-value ``lam_grid`` / ``lam2_grid``."""
        if not isinstance(value, Mapping):
            return value
        return {k: _as_list(v) if k in ("lam_grid", "lam2_grid") or (k == "background" and isinstance(v, str))
                else v for k, v in value.items()}

    def __config_check__(self, where: str, ctx: Context) -> None:
        if self.dp_draws > 1 and (self.dp is None or self.folds is None):
            raise ConfigError(f"config key 'dp_draws' is {self.dp_draws} without dp and folds",
                              expected="dp_draws: 1, or a dp section and folds: K")
        if self.folds is not None and self.tables.wanted():
            raise ConfigError("config key 'folds' with tables", expected="tables: {} (a cross-validated run "
                                                                        "reports its folds, not the tables)")
        if self.data is None:
            raise ConfigError("config key 'data' needs dev and test (or nbest and split)",
                              expected="{dev: PATH, test: PATH} or {nbest: PATH, split: {key: speaker, dev: even}}")
        if self.nnlm is None:
            raise ConfigError("config key 'nnlm' is missing",
                              expected="{neural: {train: ...}} or {neural: {checkpoint: ...}}")
        if self.normalize and self.nnlm.neural is None:
            raise ConfigError("config key 'normalize' needs a neural LM in 'nnlm'",
                              expected="normalize: false with an n-gram base model")
        self._check_background(ctx)
        _check_grid(self.lam_grid, "lam_grid", 0.0)
        _check_grid(self.lam2_grid, "lam2_grid", 0.0)
        for k, h in enumerate(self.tables.hyper or ()):
            self.fmp.check(f"tables.hyper[{k}]", h.params())
        if self.normalize and self.oracle_cache:
            raise ConfigError("config keys 'normalize' and 'oracle_cache' cannot both be true",
                              expected="the exactly normalised variant on the decoded lists only")

    def _check_background(self, ctx: Context) -> None:
        from privasr.config import expand_vars
        from privasr.corpus.sources import TEXT_SOURCES

        if self.background is None:
            return
        if not self.background:
            raise ConfigError("config key 'background' is an empty list", expected="a text file, a list of text "
                              "files, a named text source or an ARPA file")
        arpas = []
        for i, src in enumerate(self.background):
            where = f"background[{i}]" if len(self.background) > 1 else "background"
            if not isinstance(src, str) or not src:
                raise ConfigError(f"config key {where!r} is {src!r}", expected="a file path or a text source name")
            if src in TEXT_SOURCES:
                continue
            path = Path(expand_vars(src))
            if ctx.check_files and not path.is_file():
                raise ConfigError(f"config key {where!r}: no such file", path=path,
                                  expected=f"a text or ARPA file, or one of the sources {sorted(TEXT_SOURCES)}")
            if is_arpa(path):
                arpas.append(path)
        if arpas and len(self.background) > 1:
            raise ConfigError("config key 'background' mixes an ARPA file with other sources",
                              expected="one ARPA file, or text files and sources")
        if arpas and (self.fmp.order == 2 or self.tables.bigram is not None):
            raise ConfigError("config key 'background' is an ARPA file, but personal bigrams need background text",
                              expected="text file(s) as background with fmp.order 2 or tables.bigram")

    def dp_mapping(self) -> dict[str, Any] | None:
        """The ``dp`` section as the mapping :func:`simulate` takes (``None`` without DP)."""
        return None if self.dp is None else to_dict(self.dp)


def load_fmp_config(config: Mapping[str, Any], *, check_files: bool = True) -> FmpRunConfig:
    """Validate an FMP config (module docstring; see ``configs/fmp-ami.yaml``) before any work starts; unknown
    keys, wrong types and bad values are errors naming the key path; with ``check_files`` every input must exist."""
    return from_mapping(FmpRunConfig, config, "", Context(check_files))


# ---------------------------------------------------------------------------------------------- stages


@dataclass
class _Prepared:
    """What the FMP simulations need: the N-best sets, the NNLM's vocabulary and ``u(w)``, the tuned baseline's
    total scores (flat, with per-utterance offsets) and dev hypothesis errors, and the optional bigram."""

    dev: list[NBest]
    test: list[NBest]
    vocab: Any
    u: np.ndarray
    dev_totals: np.ndarray
    test_totals: np.ndarray
    dev_offsets: np.ndarray
    test_offsets: np.ndarray
    dev_hyp_errors: np.ndarray
    weights: dict[str, Any]
    info: dict[str, Any]
    bigram: Any = None
    lm: Any = None

    @property
    def bias_weight(self) -> float:
        """The weight of FMP's log-factor: the NNLM's tuned weight (eq. 1 rescales the NNLM), or the first-pass
        LM's when the NNLM got weight 0, or 1."""
        for k in ("nnlm", "lm"):
            if float(self.weights.get(k, 0.0)) > 0:
                return float(self.weights[k])
        return 1.0


@dataclass
class _Tuned:
    """The dev-tuned FMP settings: ``lam`` (and ``lam2`` in ``fmp``), their dev traces, the round-0 shift."""

    lam: float
    lam_trace: list[dict[str, Any]]
    lam2_trace: list[dict[str, Any]]
    fmp: dict[str, Any]
    shift: int
    seconds: float


def load_data(cfg: FmpRunConfig, info: dict[str, Any], *, test: bool = True) -> tuple[list[NBest], list[NBest]]:
    """Stage 1: the dev and test N-best sets (or one set split by key, recorded in ``info["split"]``), each
    utterance with a reference and the first-pass scores the combination needs. ``test=False`` (the operator's
    side of a deployment, :func:`operator_side`) never opens the test data: the devices hold it."""
    from privasr.corpus.load import load_nbest
    from privasr.corpus.partition import split_by_key

    d = cfg.data
    assert d is not None
    if d.nbest is not None:
        if not test:
            raise ConfigError("a deployment's operator cannot split one N-best set into dev and test: the test "
                              "half is the devices' data", expected="data.dev (the operator's) and data.test")
        assert d.split is not None
        dev, test_set, dev_keys, test_keys = split_by_key(load_nbest(d.nbest, None), d.split.key, d.split.dev)
        info["split"] = {"key": d.split.key, "dev": dev_keys, "test": test_keys}
        if not dev or not test_set:
            raise InputError(f"the {d.split.key} split leaves an empty dev or test set", path=d.nbest)
    else:
        assert d.dev is not None and d.test is not None
        dev = load_nbest(d.dev, None)
        test_set = load_nbest(d.test, None) if test else []
    needed = (["am"] if cfg.combine.prior == "am" else []) + (["lm"] if cfg.combine.first_pass_lm else [])
    for name, recs in (("dev", dev), ("test", test_set)):
        for nb in recs:
            if nb.ref is None:
                raise InputError(f"{name} utterance {nb.utt_id} has no reference",
                                 expected="references (WER is measured and lam is tuned on dev)")
            if any(k not in h.scores for h in nb.hyps for k in needed):
                raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without {'/'.join(needed)} scores",
                                 expected="those first-pass scores on every hypothesis, or combine.prior: rank "
                                          "and combine.first_pass_lm: false for rank-only lists")
    return dev, test_set


_ARPA_SUFFIXES = (".arpa", ".arpa.gz", ".arpa.xz", ".arpa.bz2", ".lm", ".lm.gz", ".lm.xz", ".lm.bz2")


def is_arpa(path: str | Path) -> bool:
    """Whether ``path`` is an ARPA file: its name ends in ``.arpa`` (or ``.lm``, compressed or not), or its first
    non-blank line is ``\\data\\``.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "bg.txt").write_text("\\n\\\\data\\\\\\nngram 1=1\\n")
    >>> _ = (d / "text.txt").write_text("the cat sat\\n")
    >>> is_arpa(d / "bg.txt"), is_arpa(d / "text.txt"), is_arpa("lm.arpa.gz")
    (True, False, True)
    """
    p = Path(path)
    if p.name.lower().endswith(_ARPA_SUFFIXES):
        return True
    if not p.is_file():
        return False
    from privasr.corpus.textio import iter_lines

    try:
        for k, (_, line) in enumerate(iter_lines(p)):
            if line.strip():
                return line.strip() == "\\data\\"
            if k > 100:
                break
    except (InputError, OSError, UnicodeDecodeError):
        return False
    return False


def background_text(cfg: FmpRunConfig) -> tuple[str, ...]:
    """The sources of ``u(w)`` and the background bigram: ``background``, else the LM's training text (neural
    or n-gram), else an ARPA base model itself (its unigrams), else ``generic-train``."""
    if cfg.background:
        return cfg.background
    assert cfg.nnlm is not None
    if cfg.nnlm.neural is not None and cfg.nnlm.neural.train is not None:
        return (cfg.nnlm.neural.train.text,)
    if cfg.nnlm.train is not None:
        return (cfg.nnlm.train.text,)
    if cfg.nnlm.arpa is not None and cfg.fmp.order == 1 and cfg.tables.bigram is None:
        return (str(cfg.nnlm.arpa),)
    return ("generic-train",)


def background_normalize(cfg: FmpRunConfig) -> Any:
    """The normaliser of the background text: the LM's training normaliser when the background is the LM's
    training text (so ``u(w)`` counts the words the LM was trained on, e.g. contractions expanded by ``neural``),
    else none (a named source keeps its own convention, a text file is read as it is)."""
    assert cfg.nnlm is not None
    if cfg.background:
        return None
    if cfg.nnlm.neural is not None and cfg.nnlm.neural.train is not None:
        return cfg.nnlm.neural.train.normalize
    if cfg.nnlm.train is not None:
        return cfg.nnlm.train.normalize
    return None


def arpa_unigram(model: Any, vocab: Any) -> np.ndarray:
    """``u(w)`` from an n-gram model's unigram probabilities over ``vocab``: each word's ``P(w)``, words the
    model lacks get its ``<unk>`` probability (or its smallest unigram probability), ``<s>`` the smallest;
    normalised to sum 1.

    >>> from privasr.lm.ngram.model import NgramModel
    >>> from privasr.federated.algorithms.fmp_data import WordIds
    >>> m = NgramModel.from_entries(1, {1: {("a",): (-0.3, 0.0), ("b",): (-0.6, 0.0), ("</s>",): (-0.6, 0.0)}})
    >>> arpa_unigram(m, WordIds(("<unk>", "<s>", "</s>", "a", "b"))).round(3).tolist()
    [0.167, 0.167, 0.167, 0.333, 0.167]
    """
    words = list(vocab.words) if hasattr(vocab, "words") else [vocab.decode([i])[0] for i in range(len(vocab))]
    uni = {w: model.logprob(w, ()) for w in model.vocab if w != "<s>"}
    finite = [lp for lp in uni.values() if np.isfinite(lp)]
    if not finite:
        raise InputError("the ARPA background has no unigram probabilities", expected="an ARPA file with 1-grams")
    floor = min(finite)
    unk = uni.get("<unk>", floor)
    unk = unk if np.isfinite(unk) else floor
    lps = np.array([floor if w == "<s>" else uni.get(w, unk) for w in words], dtype=np.float64)
    lps[~np.isfinite(lps)] = floor
    p = np.power(10.0, lps)
    return p / p.sum()


def background(cfg: FmpRunConfig, vocab: Any) -> tuple[np.ndarray, list[tuple[str, ...]] | None, dict[str, Any]]:
    """``u(w)`` over ``vocab`` from :func:`background_text`'s sources; the background sentences (``None`` for
    an ARPA background) for the bigram; and what to record in ``results.json`` (sources, kind, sizes)."""
    from privasr.config import expand_vars
    from privasr.corpus.sources import TEXT_SOURCES, load_text

    srcs = background_text(cfg)
    files = {f"background[{i}]" if len(srcs) > 1 else "background": Path(expand_vars(s))
             for i, s in enumerate(srcs) if s not in TEXT_SOURCES}
    if len(srcs) == 1 and srcs[0] not in TEXT_SOURCES and is_arpa(Path(expand_vars(srcs[0]))):
        from privasr.lm.ngram.arpa import read_arpa

        model = read_arpa(Path(expand_vars(srcs[0])))
        info = {"sources": list(srcs), "kind": "arpa unigrams", "words": len(model.vocab), "files": files}
        return arpa_unigram(model, vocab), None, info
    norm = background_normalize(cfg)
    sents: list[tuple[str, ...]] = []
    for s in srcs:
        sents.extend(load_text(s if s in TEXT_SOURCES else expand_vars(s), normalize=norm))
    if not sents:
        raise InputError("the background text is empty", path=", ".join(srcs),
                         expected="sentences for the background unigram u(w)")
    info = {"sources": list(srcs), "kind": "text", "sentences": len(sents), "tokens": sum(map(len, sents)),
            "files": files}
    return background_unigram(sents, vocab), sents, info


def _ngram_vocab(lm: Any) -> Any:
    """FMP's word ids over an n-gram LM's vocabulary (specials first, then the ARPA file's words in order)."""
    from privasr.federated.algorithms.fmp_data import WordIds

    return WordIds(("<unk>", "<s>", "</s>", *(w for w in lm.vocab if w not in ("<unk>", "<s>", "</s>"))))


@dataclass
class _Base:
    """What every split of one run shares: the NNLM, its vocabulary and score cache, ``u(w)``, the background
    bigram (when used) and the timings so far."""

    lm: Any
    vocab: Any
    u: np.ndarray
    cache: Any
    bigram: Any
    info: dict[str, Any]


def prepare_base(cfg: FmpRunConfig, out: Path) -> _Base:
    """Stages 2-3 without the data: build the NNLM (:func:`privasr.rescore.lms.build_lm`), estimate ``u(w)``,
    the background bigram when the run or a table uses personal bigrams."""
    from privasr.rescore.combine import LMScoreCache
    from privasr.rescore.lms import build_lm

    assert cfg.nnlm is not None
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    cache_dir = cfg.cache_dir if cfg.cache_dir is not None else out / "lm"
    lm, lm_info = build_lm(cfg.nnlm.spec("nnlm"), cache_dir)
    vocab = lm.vocab if cfg.nnlm.neural is not None else _ngram_vocab(lm)
    info["nnlm"] = lm_info
    info["nnlm_s"] = time.perf_counter() - t0
    u, bg_sents, info["background"] = background(cfg, vocab)
    bigram = None
    if cfg.fmp.order == 2 or cfg.tables.bigram is not None:
        from privasr.federated.algorithms.fmp import BackgroundBigram

        assert bg_sents is not None  # an ARPA background with bigrams is a config error
        unk = vocab.unk_id
        bigram = BackgroundBigram.from_sentences(
            [[i for i in vocab.encode(s) if i != unk] for s in bg_sents], len(vocab), prior=cfg.bigram_prior)
    return _Base(lm, vocab, u, LMScoreCache(lm), bigram, info)


def prepare_split(cfg: FmpRunConfig, base: _Base, dev: list[NBest], test_set: list[NBest],
                  info: dict[str, Any]) -> _Prepared:
    """Score a dev and a test set with the NNLM (shared cache: a hypothesis is scored once per run) and tune the
    baseline's weights on dev; timings go into ``info``."""
    from privasr.rescore.combine import Combination, score_table
    from privasr.rescore.search import DevObjective, build_space, tune_with

    t0 = time.perf_counter()
    dev_table = score_table(dev, {"nnlm": base.cache})
    test_table = score_table(test_set, {"nnlm": base.cache})
    info["score_s"] = info.get("score_s", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    comb = Combination(prior=cfg.combine.prior, lms=(("lm",) if cfg.combine.first_pass_lm else ()) + ("nnlm",))
    search = cfg.search.settings()
    res = tune_with(search, comb, build_space(comb, search), dev, dev_table)
    assert res is not None
    info["tune_s"] = time.perf_counter() - t0
    info["dev_errors_baseline"] = res.errors
    info["dev_errors_first_pass"] = res.baseline_errors
    obj = DevObjective.from_nbests(dev, dev_table)
    return _Prepared(dev, test_set, base.vocab, base.u, comb.totals(dev_table, res.weights),
                     comb.totals(test_table, res.weights), np.asarray(dev_table.offsets),
                     np.asarray(test_table.offsets), np.asarray(obj.hyp_errors), dict(res.weights), info,
                     base.bigram, base.lm)


def prepare(cfg: FmpRunConfig, out: Path, *, test: bool = True) -> _Prepared:
    """Stages 1-3: load the data, :func:`prepare_base` (the NNLM, ``u(w)``, the background bigram) and
    :func:`prepare_split` (both sets scored, the baseline's weights tuned on dev). Timings go into ``info``."""
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    dev, test_set = load_data(cfg, info, test=test)
    info["load_s"] = time.perf_counter() - t0
    base = prepare_base(cfg, out)
    info.update(base.info)
    return prepare_split(cfg, base, dev, test_set, info)


def _privacy(dp: Mapping[str, Any] | None, composition: str) -> Any:
    if dp is None:
        return None
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import LaplaceMechanism

    return PrivacySettings(LaplaceMechanism(sensitivity=dp["cap"], epsilon=dp["epsilon"]),
                           PrivacyAccountant(accountant=dp["accountant"], target_delta=dp["delta"]), composition)


def _algorithm(u: np.ndarray, fmp: Mapping[str, Any], lam: float, rounds: int, dp: Mapping[str, Any] | None,
               bigram: Any, normalizer: Any) -> tuple[Any, Any]:
    """The FMP algorithm of these settings and its privacy settings (``None`` without ``dp``)."""
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig

    cfg = dict(fmp) if dp is None else dp_settings(fmp, dp, rounds)
    conf = FmpConfig.from_dict({**cfg, "lam": lam})
    return FmpAlgorithm(conf, u, bigram, normalizer), _privacy(dp, conf.privacy_composition())


def simulate(clients: Sequence[Any], u: np.ndarray, fmp: Mapping[str, Any], lam: float, rounds: int, *, seed: int,
             dp: Mapping[str, Any] | None = None, sampler: Any = None, backend: Any = None, min_clients: int = 1,
             checkpoint_dir: Path | None = None, flower_options: Mapping[str, Any] | None = None,
             shift: int = 0, bigram: Any = None, normalizer: Any = None, secagg: Any = None
             ) -> tuple[dict[str, int], list[Any], dict[str, Any]]:
    """Run FMP over ``clients`` for ``rounds + 1`` rounds; return ``{utt_id: chosen index}``, the round history
    and privacy figures (``epsilon``, ``delta`` when ``dp`` is set). ``backend`` is a backend object, ``None``
    (local) or ``"flower"`` (:func:`~privasr.federated.backends.flower.run_flower` with ``flower_options``;
    ``secagg``: its secure aggregation settings)."""
    from privasr.federated.backends import run_on
    from privasr.federated.sampling import AllClients

    alg, privacy = _algorithm(u, fmp, lam, rounds, dp, bigram, normalizer)
    res = run_on(backend, alg, clients, options=flower_options if backend == "flower" else None,
                 checkpoint_dir=checkpoint_dir, rounds=rounds + 1, sampler=sampler or AllClients(), seed=seed,
                 min_clients=min_clients, privacy=privacy, secagg=secagg)
    chosen: dict[str, int] = {}
    for i, c in enumerate(clients):
        # groups a client has not rescored yet (it missed rounds under sampling) are rescored on the device
        # with the last global distribution it received; nothing more is sent
        st = alg.finish(c, res.client_states.get(i))
        chosen.update({k: int(v) - shift for k, v in st["chosen"].items()})
    priv: dict[str, Any] = {}
    if privacy is not None:
        priv = {"epsilon": float(privacy.accountant.epsilon()), "delta": float(privacy.accountant.target_delta)}
    return chosen, res.history, priv


def _errors(chosen: Mapping[str, int], nbests: Sequence[NBest], offsets: np.ndarray, hyp_errors: np.ndarray) -> int:
    total = 0
    for k, nb in enumerate(nbests):
        total += int(hyp_errors[offsets[k] + chosen.get(nb.utt_id, 0)])
    return total


def _words(chosen: Mapping[str, int], nbests: Sequence[NBest]) -> list[tuple[str, ...]]:
    return [nb.hyps[chosen.get(nb.utt_id, 0)].words for nb in nbests]


def _select(totals: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.array([int(np.argmax(totals[offsets[k]:offsets[k + 1]])) for k in range(len(offsets) - 1)])


def tune_lam(cfg: FmpRunConfig, p: _Prepared, dev_clients: Sequence[Any], norm: Any) -> _Tuned:
    """Stage 4: ``lam`` on the dev clients (no DP: the tuning set stands for a small, consented validation set),
    then ``lam2`` with ``lam`` fixed when the run or a table uses personal bigrams. Ties go to the smaller value."""
    oc = cfg.oracle_cache
    shift = 1 if oc else 0
    fmp_cfg = {**cfg.fmp.params(), "sigma": 0.1} if oc else cfg.fmp.params()
    rounds = cfg.fmp.rounds
    t0 = time.perf_counter()
    lam_trace = []
    for lam in cfg.lam_grid:
        chosen, _, _ = simulate(dev_clients, p.u, {**fmp_cfg, "order": 1}, lam, rounds, seed=cfg.seed,
                                shift=shift, normalizer=norm)
        lam_trace.append({"lam": lam, "dev_errors": _errors(chosen, p.dev, p.dev_offsets, p.dev_hyp_errors)})
    best = min(lam_trace, key=lambda r: (r["dev_errors"], r["lam"]))
    lam = best["lam"]
    lam2_trace: list[dict[str, Any]] = []
    if p.bigram is not None:
        for lam2 in cfg.lam2_grid:
            chosen, _, _ = simulate(dev_clients, p.u, {**fmp_cfg, "order": 2, "lam2": lam2}, lam, rounds,
                                    seed=cfg.seed, shift=shift, bigram=p.bigram, normalizer=norm)
            lam2_trace.append({"lam2": lam2, "dev_errors": _errors(chosen, p.dev, p.dev_offsets, p.dev_hyp_errors)})
        lam2 = min(lam2_trace, key=lambda r: (r["dev_errors"], r["lam2"]))["lam2"]
        fmp_cfg = {**fmp_cfg, "lam2": lam2}
    return _Tuned(lam, lam_trace, lam2_trace, fmp_cfg, shift, time.perf_counter() - t0)


def run_test(cfg: FmpRunConfig, p: _Prepared, test_clients: Sequence[Any], tuned: _Tuned, norm: Any,
             out: Path) -> tuple[dict[str, int], list[Any], dict[str, Any]]:
    """Stage 5: FMP on the test clients with the dev-tuned settings, DP and the configured backend and sampler
    (:func:`simulate`)."""
    from privasr.federated.backends import make_backend

    fed = cfg.federated
    backend = make_backend(fed.backend, **fed.backend_options) if fed.backend != "flower" else "flower"
    try:
        return simulate(test_clients, p.u, tuned.fmp, tuned.lam, cfg.fmp.rounds, seed=cfg.seed, dp=cfg.dp_mapping(),
                        sampler=fed.make_sampler(), backend=backend, min_clients=fed.min_clients,
                        checkpoint_dir=out / "checkpoint", flower_options=fed.backend_options, shift=tuned.shift,
                        bigram=p.bigram, normalizer=norm, secagg=fed.secagg)
    finally:
        if backend != "flower":
            backend.close()


def evaluate(cfg: FmpRunConfig, p: _Prepared, tuned: _Tuned, chosen: Mapping[str, int], n_clients: tuple[int, int]
             ) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """Stage 6: test WER of FMP, the baseline and the first pass; MAPSSWE and a paired bootstrap against the
    baseline; which reference words changed. ``n_clients`` is ``(dev, test)``. Returns the metrics and the
    baseline's test words."""
    from privasr.metrics import mapsswe, paired_bootstrap, wer, word_hit_changes

    refs = [nb.ref for nb in p.test]
    ids = [nb.utt_id for nb in p.test]
    base_choice = _select(p.test_totals, p.test_offsets)
    base_words = [nb.hyps[int(c)].words for nb, c in zip(p.test, base_choice, strict=True)]
    fmp_words = _words(chosen, p.test)
    w_new = wer(refs, fmp_words)
    w_base = wer(refs, base_words)
    w_first = wer(refs, [nb.best.words for nb in p.test])
    mp = mapsswe(refs, fmp_words, base_words, ids=ids)
    bs = paired_bootstrap(w_new.utt_errors, w_base.utt_errors, w_new.utt_ref_words, seed=cfg.seed,
                          resamples=cfg.eval.bootstrap_resamples)
    metrics: dict[str, Any] = {
        "wer": w_new.wer, "wer_baseline": w_base.wer, "wer_system": system_name(cfg),
        "wer_baseline_system": baseline_name(cfg),
        "wer_rel_change": (w_new.wer - w_base.wer) / w_base.wer if w_base.wer else 0.0,
        "mapsswe_p": mp.p, "mapsswe_z": mp.z, "mapsswe_better": {"A": "fmp", "B": "baseline", "same": "same"}[mp.better],
        "rounds": cfg.fmp.rounds, "lam": tuned.lam, "wer_first_pass": w_first.wer,
        "bootstrap_ci_low": bs.ci_low, "bootstrap_ci_high": bs.ci_high,
        "bootstrap_prob_improvement": bs.prob_a_better,
        "test_utterances": len(p.test), "test_clients": n_clients[1], "dev_clients": n_clients[0],
        "changed_vs_baseline": int(sum(a != b for a, b in zip(fmp_words, base_words, strict=True))),
        "weights_baseline": p.weights, "lam_trace": tuned.lam_trace, "fmp_score_weight": p.bias_weight,
        "oracle_cache": cfg.oracle_cache, "order": cfg.fmp.order, "normalized": cfg.normalize,
        # which reference words FMP gets right more / less often than the baseline (what the WER change is made of)
        "word_changes": word_hit_changes(refs, fmp_words, base_words).to_dict(),
    }
    if tuned.lam2_trace:
        metrics.update(lam2=tuned.fmp["lam2"], lam2_trace=tuned.lam2_trace)
    return metrics, base_words


def federation(cfg: FmpRunConfig, out: str | Path) -> Any:
    """The federated run :func:`run_fmp`'s test stage would make (a :class:`~privasr.federated.loop.Federation`):
    the stages before it (:func:`prepare`, the clients, :func:`tune_lam` on dev), then the test clients and the
    dev-tuned algorithm with the config's DP, sampler and secure aggregation, for ``privasr fed split``."""
    from privasr.federated.loop import Federation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    p = prepare(cfg, out)
    key, rounds, bw, oc = cfg.clients.key, cfg.fmp.rounds, p.bias_weight, cfg.oracle_cache
    dev_clients = build_clients(p.dev, p.dev_totals, p.dev_offsets, p.vocab, key, rounds, bw, oc)
    test_clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, key, rounds, bw, oc)
    norm = nnlm_normalizer(p.lm, [*p.dev, *p.test]) if cfg.normalize else None
    tuned = tune_lam(cfg, p, dev_clients, norm)
    alg, privacy = _algorithm(p.u, tuned.fmp, tuned.lam, rounds, cfg.dp_mapping(), p.bigram, norm)
    fed = cfg.federated
    return Federation(alg, test_clients, rounds + 1, fed.make_sampler(), cfg.seed, fed.min_clients, privacy,
                      fed.secagg, key={"experiment": "fmp", "name": cfg.name}, name=cfg.name)


def operator_side(cfg: FmpRunConfig, out: str | Path, devices: int, *, nnlm_format: str = "torch"
                  ) -> tuple[Any, Callable[..., str]]:
    """The operator's half of a deployment (``privasr serve fmp``): the stages before the federated run on the
    operator's own data only -- the NNLM (trained on its background text), the baseline's weights and ``lam``
    tuned on ``data.dev`` -- never opening ``data.test`` (the devices' lists).

    Returns:
        The server's :class:`~privasr.federated.loop.Federation` over ``devices`` clients (each ``None``: the
        devices hold them) and ``write(folder, run) -> hash``, which writes the devices' bundle
        (:func:`~privasr.device.fmp.write_fmp_bundle`).

    Raises:
        ConfigError: a config whose test set is cut out of one N-best file with dev (the operator would read it).
    """
    from privasr.device.fmp import write_fmp_bundle
    from privasr.federated.loop import Federation
    from privasr.rescore.combine import Combination

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    p = prepare(cfg, out, test=False)
    key, rounds, bw, oc = cfg.clients.key, cfg.fmp.rounds, p.bias_weight, cfg.oracle_cache
    dev_clients = build_clients(p.dev, p.dev_totals, p.dev_offsets, p.vocab, key, rounds, bw, oc)
    norm = nnlm_normalizer(p.lm, p.dev) if cfg.normalize else None
    tuned = tune_lam(cfg, p, dev_clients, norm)
    alg, privacy = _algorithm(p.u, tuned.fmp, tuned.lam, rounds, cfg.dp_mapping(), p.bigram, norm)
    fed = cfg.federated
    comb = Combination(prior=cfg.combine.prior, lms=(("lm",) if cfg.combine.first_pass_lm else ()) + ("nnlm",))
    federation = Federation(alg, [None] * int(devices), rounds + 1, fed.make_sampler(), cfg.seed, fed.min_clients,
                            privacy, fed.secagg, key={"experiment": "fmp", "name": cfg.name}, name=cfg.name)

    def write(folder: str | Path, run: Mapping[str, Any]) -> str:
        return write_fmp_bundle(folder, algorithm=alg, lm=p.lm, weights=p.weights, combination=comb,
                                bias_weight=bw, rounds=rounds + 1, run=run, nnlm_format=nnlm_format)

    return federation, write


def _read_one_best(path: Path) -> dict[str, tuple[str, ...]]:
    """``utt_id words...`` lines (what ``privasr device rescore`` writes) as ``{utt_id: words}``."""
    from privasr.corpus.textio import iter_lines

    out: dict[str, tuple[str, ...]] = {}
    for k, line in iter_lines(path):
        parts = line.split()
        if not parts:
            continue
        if parts[0] in out:
            raise InputError(f"utterance {parts[0]!r} appears twice", path=path, line=k,
                             expected="one line per utterance")
        out[parts[0]] = tuple(parts[1:])
    return out


def compare_deployment(cfg: FmpRunConfig, hyp: str | Path, out: str | Path, *, state: str | Path | None = None,
                       argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Check a deployment against the simulation of the same config: the simulation (:func:`federation` on
    this machine, which reads ``data.test``: a check, not a deployment) run locally (with SecAgg+ configured:
    Flower's SecAgg+ protocol in one process, :func:`~privasr.federated.backends.flower_inprocess.run_inprocess`,
    the deployment's seeds, quantisation and noise shares), then the test WER of its
    choices and of the devices' 1-best ``hyp`` (``privasr device rescore``, concatenated) with the same scorer,
    the utterances whose words differ and, with ``state`` (the deployment's final server state), the largest
    difference of the server's sums. Writes ``out/results.json`` and ``out/report.md``.

    Raises:
        InputError: a 1-best file missing a test utterance or holding another.
    """
    from privasr.federated.loop import run_federated
    from privasr.federated.tree import load_tree
    from privasr.metrics import wer
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {}
    _, test = load_data(cfg, info)
    dep = _read_one_best(Path(hyp))
    ids = [nb.utt_id for nb in test]
    missing = [u for u in ids if u not in dep]
    extra = sorted(set(dep) - set(ids))
    if missing or extra:
        raise InputError(f"{len(missing)} test utterance(s) missing (e.g. {missing[:3]}), {len(extra)} not in the "
                         f"test set (e.g. {extra[:3]})", path=hyp, expected="one line per test utterance")
    fed = federation(cfg, out / "simulation")
    if fed.secagg is not None and fed.secagg.enabled:  # the same SecAgg+ protocol, seeds and noise shares
        from privasr.federated.backends.flower_inprocess import run_inprocess

        res = run_inprocess(fed.algorithm, fed.clients, rounds=fed.rounds, sampler=fed.sampler,
                            workdir=out / "simulation", seed=fed.seed, min_clients=fed.min_clients,
                            privacy=fed.privacy, secagg=fed.secagg, client_states=True)
    else:
        res = run_federated(fed.algorithm, fed.clients, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed,
                            min_clients=fed.min_clients, privacy=fed.privacy)
    chosen: dict[str, int] = {}
    for i, c in enumerate(fed.clients):
        chosen.update(fed.algorithm.finish(c, res.client_states.get(i))["chosen"])
    refs = [nb.ref for nb in test]
    sim_words = _words(chosen, test)
    dep_words = [dep[u] for u in ids]
    w_sim, w_dep = wer(refs, sim_words), wer(refs, dep_words)
    metrics: dict[str, Any] = {
        "wer_simulation": w_sim.wer, "wer_deployment": w_dep.wer, "errors_simulation": int(w_sim.errors),
        "errors_deployment": int(w_dep.errors), "ref_words": int(w_sim.ref_words),
        "utterances": len(ids), "utterances_differing": int(sum(a != b for a, b in zip(sim_words, dep_words,
                                                                                     strict=True))),
        "clients": len(fed.clients), "rounds": fed.rounds}
    if state is not None:
        dstate = load_tree(state)
        metrics["sum_max_abs_diff"] = float(np.max(np.abs(np.asarray(dstate["sum"]) - res.state["sum"])))
        metrics["sum_max_abs"] = float(np.max(np.abs(res.state["sum"])))
    write_results(out, runner="fmp-compare-deployment", config={**to_dict(cfg), "argv": list(argv or [])},
                  seed=cfg.seed, metrics=metrics,
                  data={"hyp": Path(hyp), **({"state": Path(state)} if state is not None else {})})
    lines = [f"# {cfg.name}: the deployment against the simulation", "",
             "| | test WER | errors |", "|---|---:|---:|",
             f"| simulation (this machine, local backend) | {100 * w_sim.wer:.2f}% | {w_sim.errors} |",
             f"| deployment (the devices' 1-best) | {100 * w_dep.wer:.2f}% | {w_dep.errors} |", "",
             f"{metrics['utterances_differing']} of {len(ids)} utterances differ."]
    if state is not None:
        lines.append(f"Server sums: largest difference {metrics['sum_max_abs_diff']:.3g} "
                     f"(largest value {metrics['sum_max_abs']:.3g}).")
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return metrics


def run_fmp(cfg: FmpRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated FMP config; write ``out/results.json`` and ``out/report.md``; return the metrics.

    The stages: :func:`prepare` (data, NNLM, ``u(w)``, the tuned baseline), the clients of both sets
    (:func:`~privasr.federated.algorithms.fmp_data.build_clients`), :func:`tune_lam` on dev, :func:`run_test`,
    :func:`evaluate`, the optional :func:`run_tables`, then the results and the report.
    """
    from privasr.plots import plots_section
    from privasr.results import write_results

    if cfg.folds is not None:
        raise ConfigError("config key 'folds' is set: a cross-validated run is "
                          "privasr.experiments.fmp_folds.run_fmp_folds", expected="folds: null here")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    p = prepare(cfg, out)
    key, rounds, bw, oc = cfg.clients.key, cfg.fmp.rounds, p.bias_weight, cfg.oracle_cache
    dev_clients = build_clients(p.dev, p.dev_totals, p.dev_offsets, p.vocab, key, rounds, bw, oc)
    test_clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, key, rounds, bw, oc)
    norm = nnlm_normalizer(p.lm, [*p.dev, *p.test]) if cfg.normalize else None
    tuned = tune_lam(cfg, p, dev_clients, norm)
    t0 = time.perf_counter()
    chosen, history, priv = run_test(cfg, p, test_clients, tuned, norm, out)
    fmp_s = time.perf_counter() - t0
    metrics, base_words = evaluate(cfg, p, tuned, chosen, (len(dev_clients), len(test_clients)))
    metrics.update(priv)
    tabs: dict[str, Any] = {}
    if cfg.tables.wanted():
        t1 = time.perf_counter()
        tabs = run_tables(cfg, p, tuned.lam, tuned.fmp.get("lam2"), base_words, norm)
        if cfg.dp is None:
            metrics["tables_s"] = time.perf_counter() - t1
    metrics.update(nnlm_s=p.info["nnlm_s"], score_s=p.info["score_s"], tune_baseline_s=p.info["tune_s"],
                   tune_lam_s=tuned.seconds)
    if cfg.dp is None:  # a DP run publishes no time of its federated stage: it grows with the clients' data
        metrics.update(fmp_s=fmp_s, total_s=time.perf_counter() - t_start)
    d = cfg.data
    assert d is not None
    data: dict[str, Any] = {"nbest": d.nbest} if d.nbest is not None else {"dev": d.dev, "test": d.test}
    bg = dict(p.info["background"])
    data.update(bg.pop("files"))
    metrics["warnings"] = data_warnings(p.dev, p.test, dev_path=d.dev, test_path=d.test)
    extra = {"nnlm": p.info["nnlm"], "background": bg, "split": p.info.get("split"),
             "history": [h.to_dict() for h in history],
             "tables": tabs, "command": list(argv) if argv is not None else None}
    write_results(out, runner="fmp", config=to_dict(cfg), seed=cfg.seed, metrics=metrics, data=data, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tabs, bg) + plots_section(out), encoding="utf-8")
    return metrics


def run_tables(cfg: FmpRunConfig, p: _Prepared, lam: float, lam2: float | None, base_words: Any,
           norm: Any = None) -> dict[str, Any]:
    """The optional tables (paper Tables 2-4 and personal bigrams): FMP re-run on test with the dev-tuned ``lam``
    (and ``lam2``) for each number of rounds, hyper-parameter row, epsilon (DP) and bigram row; each row's test
    WER, MAPSSWE p and paired-bootstrap interval (``ci_low``, ``ci_high``: row minus baseline, as a fraction)
    against the baseline's ``base_words``."""
    from privasr.metrics import draw_mean_bootstrap, mapsswe, wer

    refs = [nb.ref for nb in p.test]
    ids = [nb.utt_id for nb in p.test]
    w_base = wer(refs, base_words)

    def row(fmp: Mapping[str, Any], rounds: int, dp: Mapping[str, Any] | None, draws: int = 1) -> dict[str, Any]:
        """One row; with ``draws > 1`` (DP rows) the mean over noise seeds ``seed .. seed + draws - 1``: mean WER,
        the draws' range, the median MAPSSWE p, and the bootstrap interval of the draw-mean's change."""
        fmp = {**fmp, "sigma": 0.1} if cfg.oracle_cache else fmp
        if lam2 is not None and "lam2" not in fmp:
            fmp = {**fmp, "lam2": lam2}
        wers, ps, errors, priv = [], [], [], {}
        for d in range(draws):
            clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, cfg.clients.key, rounds,
                                    p.bias_weight, cfg.oracle_cache)
            chosen, _, priv = simulate(clients, p.u, fmp, lam, rounds, seed=cfg.seed + d, dp=dp,
                                       shift=1 if cfg.oracle_cache else 0, bigram=p.bigram, normalizer=norm)
            words = _words(chosen, p.test)
            w = wer(refs, words)
            mp = mapsswe(refs, words, base_words, ids=ids)
            wers.append(w.wer)
            ps.append(mp.p)
            errors.append(w.utt_errors)
            better = mp.better
        bs = draw_mean_bootstrap(errors, w_base.utt_errors, w.utt_ref_words, seed=cfg.seed,
                                 resamples=cfg.eval.bootstrap_resamples)
        out = {"wer": float(np.mean(wers)), "mapsswe_p": float(np.median(ps)),
               "better": better if draws == 1 else None, "ci_low": bs.ci_low, "ci_high": bs.ci_high, **priv}
        if draws > 1:
            out.update(draws=draws, wer_min=min(wers), wer_max=max(wers), mapsswe_p_draws=ps)
        return out

    t, params, rounds = cfg.tables, cfg.fmp.params(), cfg.fmp.rounds
    out: dict[str, Any] = {}
    if t.rounds is not None:
        out["rounds"] = [{"T": r, **row(params, r, None)} for r in t.rounds]
    if t.hyper is not None:
        out["hyper"] = [{**h.params(), **row({**params, **h.params()}, rounds, None)} for h in t.hyper]
    if t.bigram is not None:
        out["bigram"] = [{"T": r, "lam2": lam2, **row({**params, "order": 2, "lam2": lam2}, r, None)}
                         for r in t.bigram]
    if t.epsilon is not None:
        base_dp = cfg.dp if cfg.dp is not None else DpSettings(epsilon=1.0)
        out["epsilon"] = [{"epsilon_target": e, **row(params, rounds, to_dict(dataclasses.replace(base_dp, epsilon=e)),
                                                      t.epsilon_draws)} for e in t.epsilon]
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def baseline_name(cfg: FmpRunConfig) -> str:
    """The baseline's human name: the generic LM rescoring FMP personalises."""
    kind = "NNLM" if cfg.nnlm is not None and cfg.nnlm.neural is not None else "n-gram LM"
    return f"generic {kind} rescoring"


def system_name(cfg: FmpRunConfig) -> str:
    """The system's human name, e.g. ``generic NNLM rescoring + FMP, T = 10, DP epsilon 1``."""
    if cfg.label:
        return cfg.label
    dp = f", DP epsilon {cfg.dp.epsilon:g}" if cfg.dp is not None and cfg.dp.epsilon is not None else ""
    return f"{baseline_name(cfg)} + FMP, T = {cfg.fmp.rounds}{dp}"


def _report(cfg: FmpRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any],
            bg: Mapping[str, Any] | None = None) -> str:
    lines = [f"# {cfg.name}", ""]
    lines += [f"**Warning:** {w}." for w in m.get("warnings", [])] + ([""] if m.get("warnings") else [])
    lines += [f"privasr {__version__}, seed {cfg.seed}, clients by {cfg.clients.key}, "
              f"T = {cfg.fmp.rounds}, lam = {m['lam']:g} (tuned on dev)", ""]
    if bg:
        lines += [f"Background unigram u(w): {bg['kind']} of {', '.join(bg['sources'])}.", ""]
    lines += ["| system | test WER |", "|---|---|",
              f"| first-pass 1-best | {_pct(m['wer_first_pass'])} |",
              f"| {baseline_name(cfg)} (baseline) | {_pct(m['wer_baseline'])} |",
              f"| {system_name(cfg)} | {_pct(m['wer'])} ({100 * m['wer_rel_change']:+.2f}% rel., MAPSSWE p = "
              f"{m['mapsswe_p']:.3g}) |",
              "", difference_interval(m.get("bootstrap_ci_low"), m.get("bootstrap_ci_high")) + ".", ""]
    if m.get("oracle_cache"):
        lines += ["**Diagnostic run (`oracle_cache: true`): the clients' caches hold the reference text, not the "
                  "decoded N-best lists. This is the ceiling of unigram marginals, not a system.**", ""]
    if "epsilon" in m:
        lines += [f"Differential privacy: epsilon = {m['epsilon']:.4g}, delta = {m['delta']:.3g}.", ""]
    wc = m.get("word_changes")
    if wc and wc["words_changed"]:
        lines += [f"Reference words recognised correctly more often than by the baseline (net {wc['net']:+d}): "
                  + ", ".join(f"{w} +{n}" for w, n in wc["gained"]) + "; less often: "
                  + ", ".join(f"{w} -{n}" for w, n in wc["lost"]) + ".", ""]
    def cell(k: str, v: Any) -> str:
        if k in ("wer", "wer_min", "wer_max"):
            return _pct(v)
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    if any(r.get("draws") for r in tables.get("epsilon", ())):
        lines += [f"The epsilon rows are means over {cfg.tables.epsilon_draws} noise draws (seeds {cfg.seed} to "
                  f"{cfg.seed + cfg.tables.epsilon_draws - 1}): `wer_min` to `wer_max` is the draws' range, "
                  "`mapsswe_p` their median, the interval that of the draw-mean's change. Epsilon is per draw: the "
                  "draws are repeated simulations of one release.", ""]
    return "\n".join(lines) + "\n" + "".join(markdown_table(name, rows, cell, skip=("better", "mapsswe_p_draws"))
                                             for name, rows in tables.items())
