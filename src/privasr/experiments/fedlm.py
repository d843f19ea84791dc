"""The federated NNLM fine-tuning experiment (paper 001): confidence-weighted client losses, FedAdam, DP.

``privasr fedlm run --config configs/fedlm-earnings21.yaml --out DIR`` does (and writes ``DIR/results.json``,
``DIR/report.md`` and the adapted model ``DIR/model.pt``, a neural checkpoint that rescoring configs load):

1. **The server's NNLM** is pre-trained on background text only (a rescoring config's ``neural`` LM spec,
   :mod:`privasr.rescore.lms`, trained once and cached in ``cache_dir``), or -- ``init: scratch`` -- the same
   network and vocabulary freshly initialised (paper 001 Table 4).
2. **Clients** hold first-pass transcripts, never references:

   * ``data.kind: earnings21``: the words of one Kaldi system's CTMs (``data.ctm``, a tar of ``<call>.ctm``)
     with their per-word confidences, cut into utterances at pauses longer than ``data.split_gap`` seconds,
     lowercased (tokens without a letter or digit dropped, like the references); the calls listed in
     ``data.eval_calls`` (a CSV with a ``file_id`` column, e.g. ``eval10-file-metadata.csv``, or a list) are
     held out and evaluated on their *reference* transcripts (``data.references``, sentences as
     :func:`~privasr.corpus.sources.earnings21_reference_sentences`); the other calls are the clients. The
     CTM confidences are used as given, or -- ``confidence.calibrate_calls: N`` -- mapped by an isotonic
     regression fitted on the first ``N`` client calls with references (which then stop being clients: a
     small labelled set on the server side); with ``confidence.source: classifier`` those calls instead train
     a word-confidence classifier (``confidence.kind``, isotonic-calibrated) on CTM features
     (:mod:`privasr.confidence.ctm`: the decoder's confidences, durations, pauses, and word frequencies in
     ``confidence.background``, a text source or file the server holds; default the NNLM's training text),
     which then gives every client word its confidence (each client computes it on device). Their calibration
     (ECE, AUC; raw and calibrated or predicted) is measured on the evaluation calls' CTM words aligned to
     the references (jiwer, whole calls).
   * ``data.kind: nbest``: the 1-best of every ``data.dev`` N-best list is client text (``data.client_text:
     reference`` trains on the dev references instead: an oracle, the most the same amount of clean in-domain
     text could give, never a result of the method); ``data.test`` is
     evaluated (perplexity of its references, and N-best rescoring WER). Per-word confidences come from the
     data when it has them, otherwise from a :class:`~privasr.confidence.model.ConfidenceModel` trained on
     the dev lists' references and **cross-fitted by meeting** (``confidence.folds`` folds: a meeting's
     confidences come from a classifier that never saw its references); its held-out ECE/AUC are reported.
     ``confidence.exclude_features`` leaves columns out of that classifier (e.g. ``[decoder_confidence]``,
     the decoder's lattice word posterior, to measure what it adds).

   ``confidence.source: oracle`` (both kinds) is the other diagnostic: every client word's confidence is 1 if
   the reference confirms it (a hit in the alignment of the first pass against the reference) and 0 if not --
   perfect confidences, the most any confidence classifier could give the weighted losses.

   ``clients.key`` groups utterances into clients: ``client`` (the call / meeting), ``speaker``, or
   ``zipf`` (``clients.devices`` simulated devices drawn from a Zipf law with ``clients.exponent``,
   :func:`~privasr.corpus.partition.zipf_devices`).
3. **Federated fine-tuning** (:class:`~privasr.federated.algorithms.fedlm.FedLmAlgorithm`) for ``rounds``
   rounds through :func:`~privasr.federated.loop.run_federated` (``local``/``ray`` backends, checkpointed
   every round in ``OUT/checkpoint/<variant>`` and resumed) or Flower's simulation engine. With ``dp``,
   every client's delta is clipped to ``fedlm.clip_norm`` and the loop adds Gaussian noise with
   ``dp.noise_multiplier`` once per round; ``epsilon`` comes from the accountant for the sampler used.
4. **Evaluation**: perplexity (natural-log cross entropy per target incl. ``</s>``, ``<unk>`` a word like any
   other: closed-vocabulary, identical vocabulary for every system; the OOV rate is reported) of the
   unadapted and adapted models. ``nbest`` data is also rescored: ``am + w_lm * first-pass LM + w_nnlm *
   NNLM + wp * n`` with the weights tuned on dev **for each model**, test WER, MAPSSWE against the unadapted
   model, paired bootstrap; ``rescore.with_baseline: true`` keeps the unadapted NNLM as a second feature of the
   adapted system (log-linear interpolation, both weights tuned on dev).
   With Earnings-21's labelled calls (``confidence.calibrate_calls``) their references are also a
   **development set** on the server: every model's ``ppl_dev`` is reported there, so settings such as the
   threshold are chosen without looking at the evaluation calls.
5. ``compare_all`` (default on) runs the same config with ``loss: all`` for ``ppl_all_utts``; ``tables``
   re-run the federation per row: ``loss`` (paper Tables 2/3), ``init`` (Table 4), ``noise`` (Table 5, DP
   with those noise multipliers; needs ``fedlm.clip_norm``; every row with noise is the mean of
   ``tables.noise_draws`` (5) runs that differ only in their noise draw, each a release of the row's epsilon),
   ``threshold`` (``loss: threshold`` at each
   utterance-confidence threshold, with the share of client words it keeps).

Only :class:`~privasr.federated.core.Update` objects of float32 parameter deltas cross to the server.

Config (YAML; every key optional unless marked; the schema is :class:`FedLmRunConfig`, read with
:mod:`privasr.config`, so unknown keys, wrong types and bad values are errors naming the key path, and
strings may use ``${PRIVASR_DATA}``)::

    name: fedlm
    label: null                       # the system's human name (default: from the loss and the rescoring)
    seed: 0
    data:                             # required; the keys of its kind only
      kind: nbest                     # nbest: dev (required), test (required), client_text: first_pass | reference
                                      # earnings21: ctm, references, eval_calls (required), split_gap: 1.0
    clients: {key: client, devices: 8000, exponent: 1.0}   # key: client | speaker | zipf
    confidence:
      source: null                    # auto | data | classifier | none | oracle (null: data for Earnings-21,
                                      # auto for N-best data)
      kind: gbm                       # gbm | mlp: the confidence classifier
      folds: 2                        # cross-fitting folds (N-best data), >= 2
      calibrate_calls: 0              # Earnings-21: labelled calls for the isotonic map or the classifier
      background: null                # Earnings-21 classifier: word-frequency text (default the NNLM's text)
    nnlm: {neural: {...}}             # required: a neural LM entry (privasr.rescore.lms)
    cache_dir: null                   # where the pre-trained NNLM is cached (default OUT/lm)
    init: pretrained                  # pretrained | scratch
    fedlm: {}                         # privasr.federated.algorithms.fedlm.FedLmConfig settings
    rounds: 10
    dp: null                          # {noise_multiplier (required), delta: 1e-5, accountant: rdp | pld,
                                      #  neighboring: auto | add_or_remove_one | replace_one, population: null
                                      #  (the declared N of the fixed denominator; null: the run's clients)};
                                      #  needs fedlm.clip_norm
    federated: {backend: local, backend_options: {}, sampler: all, min_clients: 1}
    compare_all: true
    folds: null                       # K >= 2: cross-validation over meetings, dev and test pooled (N-best data;
                                      # privasr.experiments.fedlm_folds; privasr fedlm run --folds K)
    fold_unit: meeting                # meeting | series: folds of single meetings or of whole AMI series
    tables: {}                        # loss: [LOSS, ...], init: [...], noise: [Z, ...], threshold: [C, ...],
                                      # noise_draws: 5 (every noise row with Z > 0: the mean of 5 noise draws)
    rescore: {ranges: {}, max_rounds: 20, coarse_points: 7, restarts: 3, with_baseline: false,
              first_pass_lm: true}
                                      # coordinate descent (coarse_points >= 2, restarts >= 1); ranges: PARAM:
                                      # [min, max, step] for lm, nnlm (every NNLM weight), word_penalty;
                                      # first_pass_lm: false for lists without an "lm" score (Whisper's)
    eval: {bootstrap_resamples: 1000, every: 0}   # every: the main run's perplexity every N rounds (0: never)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import Context, check_str, expand_vars, from_mapping, setting, to_dict, unknown_keys
from privasr.corpus.formats.ctm import ctm_utterances
from privasr.corpus.formats.earnings21_calls import read_call_ids
from privasr.errors import ConfigError, InputError
from privasr.experiments._report import markdown_table
from privasr.federated.sampling import FederationSettings
from privasr.metrics.bootstrap import difference_interval
from privasr.rescore.lms import LMSettings, LMSpec
from privasr.rescore.search import CoordinateSettings, SearchSettings

__all__ = ["FedLmRunConfig", "DataSettings", "ClientSettings", "ConfidenceSettings", "DPSettings", "TableSettings",
           "RescoreSettings", "EvalSettings", "load_fedlm_config", "run_fedlm", "MODEL_FILE"]

MODEL_FILE = "model.pt"
"""The adapted model's checkpoint inside a run's output folder."""

# ---------------------------------------------------------------------------------------------- schema

_DATA_KEYS = {"nbest": ("kind", "dev", "test", "client_text"),
              "earnings21": ("kind", "ctm", "references", "eval_calls", "split_gap")}


@dataclass(frozen=True)
class DataSettings:
    """``data``: the client and evaluation data, by ``kind`` (module docstring, step 2).

    ``nbest``: ``dev`` (the clients' N-best lists), ``test`` (evaluated), ``client_text`` (``first_pass`` or the
    ``reference`` oracle). ``earnings21``: ``ctm`` (a tar of CTMs), ``references``, ``eval_calls`` (a CSV with a
    ``file_id`` column, or a list of call ids) and ``split_gap`` (seconds). Each kind takes only its own keys.
    """

    kind: str = setting(choices=("nbest", "earnings21"))
    dev: Path | None = setting(None, exists="file")
    test: Path | None = setting(None, exists="file")
    client_text: str = setting("first_pass", choices=("first_pass", "reference"))
    ctm: Path | None = setting(None, exists="file")
    references: Path | None = setting(None, exists="file")
    eval_calls: Any = None
    split_gap: float = setting(1.0, gt=0.0)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """The keys of the given kind only, and the ones it needs."""
        if not isinstance(value, Mapping) or value.get("kind") not in _DATA_KEYS:
            return value
        kind = value["kind"]
        unknown_keys(value, _DATA_KEYS[kind], where)
        if kind == "nbest" and ("dev" not in value or "test" not in value):
            raise ConfigError("config key 'data' (kind nbest) needs dev and test",
                              expected="{kind: nbest, dev: PATH, test: PATH}")
        for k in ("ctm", "references", "eval_calls") if kind == "earnings21" else ():
            if k not in value:
                raise ConfigError(f"config key 'data' (kind earnings21) needs {k}",
                                  expected="{kind: earnings21, ctm: PATH, references: PATH, eval_calls: CSV or list}")
        return value

    def __config_check__(self, where: str, ctx: Context) -> DataSettings | None:
        ev = self.eval_calls
        if self.kind != "earnings21":
            return None
        if isinstance(ev, list | tuple):
            if not ev or not all(isinstance(x, str | int) and not isinstance(x, bool) for x in ev):
                raise ConfigError("config key 'data.eval_calls' is an empty or non-string list",
                                  expected="call ids, or a CSV with a file_id column")
            return replace(self, eval_calls=tuple(str(x) for x in ev))
        p = Path(expand_vars(check_str(ev, "data.eval_calls")))
        if ctx.check_files and not p.exists():
            raise ConfigError("config key 'data.eval_calls': no such file", path=p)
        return replace(self, eval_calls=p)

    def inputs(self) -> dict[str, Any]:
        """The kind's settings but ``kind`` (paths fingerprinted in results.json's ``data``)."""
        if self.kind == "nbest":
            return {"client_text": self.client_text, "dev": self.dev, "test": self.test}
        ev = list(self.eval_calls) if isinstance(self.eval_calls, tuple) else self.eval_calls
        return {"ctm": self.ctm, "references": self.references, "eval_calls": ev, "split_gap": self.split_gap}

    def __config_dict__(self) -> dict[str, Any]:
        return to_dict({"kind": self.kind, **self.inputs()})


@dataclass(frozen=True)
class ClientSettings:
    """``clients``: how utterances are grouped into clients (``key``), and the Zipf devices of ``key: zipf``."""

    key: str = setting("client", choices=("client", "speaker", "zipf"))
    devices: int = setting(8000, min=1)
    exponent: float = setting(1.0, min=0.0)


@dataclass(frozen=True)
class ConfidenceSettings:
    """``confidence``: where the clients' word confidences come from (module docstring, step 2).

    ``source`` defaults to ``data`` for Earnings-21 and ``auto`` for N-best data; ``background`` (the CTM
    classifier's word-frequency text) defaults to the NNLM's training text: both are resolved by
    :func:`load_fedlm_config`.
    """

    source: str | None = setting(None, choices=("auto", "data", "classifier", "none", "oracle"))
    kind: str = setting("gbm", choices=("gbm", "mlp"))
    folds: int = setting(2, min=2)
    calibrate_calls: int = setting(0, min=0)
    background: str | None = setting(None, expand=True)
    exclude_features: tuple[str, ...] = ()

    def features(self) -> tuple[str, ...] | None:
        """The N-best classifier's feature columns: all of them but ``exclude_features`` (``None``: all)."""
        if not self.exclude_features:
            return None
        from privasr.confidence.features import features_without

        return features_without(self.exclude_features, "confidence.exclude_features")


@dataclass(frozen=True)
class DPSettings:
    """``dp``: the Gaussian mechanism's noise multiplier and the accountant (needs ``fedlm.clip_norm``)."""

    noise_multiplier: float = setting(min=0.0)
    delta: float = setting(1e-5, gt=0.0, lt=1.0)
    accountant: str = setting("rdp", choices=("rdp", "pld"))
    neighboring: str = setting("auto", choices=("auto", "add_or_remove_one", "replace_one"))
    population: int | None = setting(None, min=1)


@dataclass(frozen=True)
class TableSettings:
    """``tables``: the rows re-run per table (``None``: no such table; an empty list: only the fixed rows)."""

    loss: tuple[str, ...] | None = None
    init: tuple[str, ...] | None = None
    noise: tuple[float, ...] | None = None
    threshold: tuple[float, ...] | None = None
    noise_draws: int = setting(5, min=1)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """A table given as ``null`` is an empty one (still a table)."""
        if isinstance(value, Mapping):
            return {k: [] if v is None else v for k, v in value.items()}
        return value

    def wanted(self) -> bool:
        """Whether any table is asked for."""
        return any(t is not None for t in (self.loss, self.init, self.noise, self.threshold))

    def __config_check__(self, where: str, ctx: Context) -> None:
        from privasr.federated.algorithms.fedlm import LOSSES

        for i, loss in enumerate(self.loss or ()):
            check_str(loss, f"tables.loss[{i}]", LOSSES)
        for i, init in enumerate(self.init or ()):
            check_str(init, f"tables.init[{i}]", ("pretrained", "scratch"))
        if any(z < 0 for z in self.noise or ()):
            raise ConfigError(f"config key 'tables.noise' is {list(self.noise or ())!r}",
                              expected="a list of noise multipliers >= 0")
        if any(not 0 <= c <= 1 for c in self.threshold or ()):
            raise ConfigError(f"config key 'tables.threshold' is {list(self.threshold or ())!r}",
                              expected="a list of thresholds in [0, 1]")


@dataclass(frozen=True)
class RescoreSettings(CoordinateSettings):
    """``rescore``: the coordinate-descent weight search of N-best rescoring, and ``with_baseline``.

    ``ranges``: ``PARAM: [min, max, step]`` (``lm``, ``nnlm`` -- every NNLM weight --, ``word_penalty``).
    ``first_pass_lm: false`` leaves the first-pass LM score out (lists of an end-to-end recogniser, e.g. Whisper's,
    carry none).
    """

    with_baseline: bool = False
    first_pass_lm: bool = True

    @property
    def search(self) -> SearchSettings:
        """The weight search: coordinate descent over :attr:`ranges`."""
        return self.settings()


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: bootstrap resamples of the WER interval; ``every``: evaluate perplexity every N rounds (0: never)."""

    bootstrap_resamples: int = setting(1000, min=1)
    every: int = setting(0, min=0)


@dataclass(frozen=True, kw_only=True)
class FedLmRunConfig:
    """A FedLM experiment config (module docstring, ``configs/fedlm-*.yaml``): validated by :func:`load_fedlm_config`.

    ``fedlm`` is the algorithm's settings as given (:class:`~privasr.federated.algorithms.fedlm.FedLmConfig`
    keys: the table rows override some of them).
    """

    name: str = "fedlm"
    label: str | None = None
    seed: int = setting(0, min=0)
    data: DataSettings
    clients: ClientSettings = field(default_factory=ClientSettings)
    confidence: ConfidenceSettings = field(default_factory=ConfidenceSettings)
    nnlm: LMSettings | None = None
    cache_dir: Path | None = None
    init: str = setting("pretrained", choices=("pretrained", "scratch"))
    fedlm: dict[str, Any] = field(default_factory=dict)
    rounds: int = setting(10, min=1)
    dp: DPSettings | None = None
    federated: FederationSettings = field(default_factory=FederationSettings)
    compare_all: bool = True
    folds: int | None = setting(None, min=2)
    fold_unit: str = setting("meeting", choices=("meeting", "series"))
    tables: TableSettings = field(default_factory=TableSettings)
    rescore: RescoreSettings = field(default_factory=RescoreSettings)
    eval: EvalSettings = field(default_factory=EvalSettings)

    @property
    def kind(self) -> str:
        """``data.kind``: ``nbest`` or ``earnings21``."""
        return self.data.kind

    @property
    def nnlm_spec(self) -> LMSpec:
        """The server NNLM's spec for :func:`~privasr.rescore.lms.build_lm` (named ``nnlm``)."""
        assert self.nnlm is not None
        return self.nnlm.spec("nnlm")

    def __config_check__(self, where: str, ctx: Context) -> FedLmRunConfig:
        if self.clients.key == "speaker" and self.kind == "earnings21":
            raise ConfigError("clients.key 'speaker' with Earnings-21 CTMs",
                              expected="client (call) or zipf: the CTMs have no speaker labels")
        if self.nnlm is None:
            raise ConfigError("config key 'nnlm' is missing",
                              expected="{neural: {train: ...}} or {neural: {checkpoint: ...}}")
        if self.nnlm.neural is None:
            raise ConfigError("config key 'nnlm' must be a neural LM", expected="{neural: {...}}")
        confidence = self._confidence()
        self._check_fedlm()
        if self.folds is not None:
            if self.kind != "nbest" or self.data.client_text != "first_pass":
                raise ConfigError("config key 'folds' with data.kind earnings21 or data.client_text reference",
                                  expected="N-best data whose clients train on their 1-best (folds: null otherwise)")
            if self.tables.wanted():
                raise ConfigError("config key 'folds' with tables", expected="tables: {} (a cross-validated run "
                                                                            "reports its folds, not the tables)")
        return replace(self, confidence=confidence)

    def _confidence(self) -> ConfidenceSettings:
        """``confidence`` with its defaults resolved (the source by data kind, the classifier's background text)."""
        c, e21 = self.confidence, self.kind == "earnings21"
        source = c.source if c.source is not None else ("data" if e21 else "auto")
        if c.calibrate_calls and (not e21 or source not in ("data", "classifier")):
            raise ConfigError("confidence.calibrate_calls needs Earnings-21 CTM confidences",
                              expected="data.kind: earnings21 with confidence.source: data or classifier")
        if source == "classifier" and e21 and not c.calibrate_calls:
            raise ConfigError("confidence.source 'classifier' on Earnings-21 CTMs needs labelled calls to train on",
                              expected="confidence.calibrate_calls >= 1")
        background = c.background
        if source == "classifier" and e21:
            assert self.nnlm is not None and self.nnlm.neural is not None
            train = self.nnlm.neural.train
            background = background if background is not None else (train.text if train is not None else None)
            if background is None:
                raise ConfigError("confidence.background is not set and the NNLM spec names no training text",
                                  expected="a text source or file for the word-frequency features")
        elif background is not None:
            raise ConfigError("confidence.background applies to the CTM classifier only",
                              expected="data.kind: earnings21 with confidence.source: classifier")
        if c.exclude_features and (e21 or source != "classifier"):
            raise ConfigError("confidence.exclude_features applies to the N-best classifier only",
                              expected="data.kind: nbest with confidence.source: classifier")
        c.features()
        return replace(c, source=source, background=background)

    def _check_fedlm(self) -> None:
        """``fedlm`` is a valid algorithm config; DP (``dp``, ``tables.noise``) needs its ``clip_norm``."""
        from privasr.federated.algorithms.fedlm import FedLmConfig

        try:
            FedLmConfig.from_dict(self.fedlm)
        except ConfigError as e:
            raise ConfigError(f"config key 'fedlm': {e.message}", expected=e.expected) from None
        if self.federated.secagg.enabled:  # before any work; the backend would refuse at round one
            from privasr.federated.compression import check_no_secagg

            check_no_secagg(FedLmConfig.from_dict(self.fedlm).compression, "fedlm")
        if self.fedlm.get("clip_norm") is None:
            if self.dp is not None:
                raise ConfigError("config key 'dp' needs fedlm.clip_norm",
                                  expected="fedlm: {clip_norm: 0.5, weighting: uniform}")
            if self.tables.noise is not None:
                raise ConfigError("config key 'tables.noise' needs fedlm.clip_norm",
                                  expected="fedlm: {clip_norm: 0.5, weighting: uniform}")
        if (self.tables.noise and self.tables.noise_draws > 1 and self.federated.secagg.enabled
                and getattr(self.federated.secagg, "noise", "server") == "distributed"):
            raise ConfigError("config key 'tables.noise_draws' with distributed noise (secagg.noise: distributed)",
                              expected="tables.noise_draws: 1, or the server's noise (draws repeat central noise)")


def load_fedlm_config(config: Mapping[str, Any], *, check_files: bool = True) -> FedLmRunConfig:
    """Validate a FedLM config (see ``configs/fedlm-earnings21.yaml``) before any work; unknown keys are errors.

    With ``check_files`` every input file must exist.

    >>> load_fedlm_config({"data": {"kind": "nbest"}}, check_files=False)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'data' (kind nbest) needs dev and test (expected {kind: nbest, dev: PATH, test: PATH})
    >>> cfg = load_fedlm_config({"data": {"kind": "nbest", "dev": "d.jsonl", "test": "t.jsonl"},
    ...                          "nnlm": {"neural": {"checkpoint": "nnlm.pt"}}, "dp": {"noise_multiplier": 1},
    ...                          "fedlm": {"clip_norm": 0.5, "weighting": "uniform"}}, check_files=False)
    >>> cfg.confidence.source, cfg.dp.noise_multiplier, cfg.rescore.search.coarse_points
    ('auto', 1.0, 7)
    """
    return from_mapping(FedLmRunConfig, config, "", Context(check_files))


# ------------------------------------------------------------------------------------------------ data


@dataclass
class _Data:
    """Client utterances (words + confidences), evaluation text, and for N-best data the lists themselves."""

    clients: list[tuple[str, list[tuple[tuple[str, ...], np.ndarray | None]]]]
    eval_sentences: list[tuple[str, ...]]
    info: dict[str, Any]
    dev: list[Any] | None = None
    test: list[Any] | None = None
    confidence_report: dict[str, Any] | None = None
    reliability: Any = None
    dev_sentences: list[tuple[str, ...]] | None = None
    heldout: list[tuple[str, ...]] | None = None
    """The held-out data's text of the kind the clients hold (first-pass words, or references with
    ``client_text: reference``): the non-members of a membership audit of the released model."""


def _group(utts: Sequence[Any], cfg: FedLmRunConfig) -> list[Any]:
    from privasr.corpus.partition import by_key, zipf_devices

    if cfg.clients.key == "zipf":
        return list(zipf_devices(list(utts), n_devices=cfg.clients.devices, exponent=cfg.clients.exponent, seed=cfg.seed))
    return list(by_key(utts, cfg.clients.key))


def _earnings21(cfg: FedLmRunConfig) -> _Data:
    """Stage 1 for Earnings-21 CTMs (module docstring, step 2): the evaluation calls held out, the labelled
    calibration calls (if any) turned into a confidence map or classifier, the clients' confidences, and the
    calibration of the confidences measured on the evaluation calls."""
    d = cfg.data
    assert d.ctm is not None and d.references is not None
    utts, evals, refs = _e21_calls(d)
    held = set(evals)
    train = [u for u in utts if u.client not in held]
    calib, conf_of = _e21_calibration(cfg, train, refs, d.references)
    train = [u for u in train if u.client not in calib]
    if not train:
        raise InputError("no client call is left after holding out the evaluation (and calibration) calls",
                         path=d.ctm)
    report, curve = _e21_confidence_report(utts, evals, refs, calib, conf_of)
    train_conf = _e21_client_confidences(cfg, train, refs, conf_of, d.references)
    clients = [(c.id, [(u.words, train_conf[u.utt_id]) for u in c.utterances]) for c in _group(train, cfg)]
    eval_sents = [s for c in evals for s in refs[c]]
    conf = np.concatenate(list(train_conf.values()))
    info = {"eval_calls": evals, "client_calls": sorted({u.client for u in train}), "calibration_calls": calib,
            "utterances": len(train), "words": int(sum(len(u.words) for u in train)),
            "mean_confidence": float(conf.mean()), "low_confidence_share": float((conf < 0.9).mean()),
            "words_per_utterance": float(np.mean([len(u.words) for u in train]))}
    # the labelled calls' references: a development set on the server for choices such as the threshold
    dev_sents = [s for c in calib for s in refs[c]] or None
    heldout = [u.words for u in utts if u.client in held and u.words]
    return _Data(clients, eval_sents, info, confidence_report=report, reliability=curve, dev_sentences=dev_sents,
                 heldout=heldout)


def _e21_calls(d: DataSettings) -> tuple[list[Any], list[str], dict[str, list[tuple[str, ...]]]]:
    """The CTM utterances, the evaluation call ids and the reference sentences by call (every evaluation call
    must have one)."""
    from privasr.corpus.sources import earnings21_reference_sentences

    assert d.ctm is not None and d.references is not None
    utts = ctm_utterances(d.ctm, d.split_gap)
    evals = list(d.eval_calls) if isinstance(d.eval_calls, tuple) else read_call_ids(d.eval_calls)
    refs = earnings21_reference_sentences(d.references)
    missing = [c for c in evals if c not in refs]
    if missing:
        raise InputError(f"evaluation calls {missing[:5]} have no reference transcript", path=d.references,
                         expected="every eval call in the references")
    return utts, evals, refs


@dataclass
class _CtmConfidence:
    """A CTM utterance's word confidences: as given, through an isotonic ``mapping``, or from a ``classifier``
    on CTM features (with its ``background`` word frequencies)."""

    mapping: tuple[np.ndarray, np.ndarray] | None = None
    classifier: Any = None
    background: Any = None

    @property
    def adjusted(self) -> bool:
        """Whether the confidences are mapped or predicted (not the CTM's own)."""
        return self.mapping is not None or self.classifier is not None

    def __call__(self, u: Any) -> np.ndarray:
        if self.classifier is not None:
            from privasr.confidence.ctm import ctm_word_features

            return self.classifier.predict_features(ctm_word_features(u, self.background))
        c = np.asarray(u.confidences, dtype=np.float64)
        return np.interp(c, *self.mapping) if self.mapping is not None else c


def _e21_calibration(cfg: FedLmRunConfig, train: Sequence[Any], refs: Mapping[str, Any], ref_path: Path
                     ) -> tuple[list[str], _CtmConfidence]:
    """The first ``confidence.calibrate_calls`` client calls with a reference (a labelled set on the server, no
    longer clients) and the confidences they give: an isotonic map of the CTM confidences, or a classifier."""
    n_cal = cfg.confidence.calibrate_calls
    if not n_cal:
        return [], _CtmConfidence()
    calib = sorted({u.client for u in train if u.client in refs})[:n_cal]
    if len(calib) < n_cal:
        raise InputError(f"confidence.calibrate_calls={n_cal} but only {len(calib)} client calls have "
                         "references", path=ref_path, expected="fewer calibration calls")
    labelled = [u for u in train if u.client in calib]
    if cfg.confidence.source == "classifier":
        classifier, bg = _ctm_classifier(labelled, refs, calib, cfg)
        return calib, _CtmConfidence(classifier=classifier, background=bg)
    return calib, _CtmConfidence(mapping=_isotonic(*_ctm_labels(labelled, refs, calib)))


def _e21_confidence_report(utts: Sequence[Any], evals: Sequence[str], refs: Mapping[str, Any], calib: list[str],
                           conf_of: _CtmConfidence) -> tuple[dict[str, Any], Any]:
    """The confidences' calibration (ECE, AUC, reliability curve), measured on the evaluation calls' CTM words
    against their references: the raw CTM confidences, and the mapped or predicted ones."""
    from privasr.confidence.model import ConfidenceReport

    held = set(evals)
    ev_conf, ev_hit = _ctm_labels([u for u in utts if u.client in held], refs, evals)
    raw_rep = ConfidenceReport.compute(ev_conf, ev_hit, n_utterances=0, calibrated=False)
    report = {"ece_raw": raw_rep.ece, "auc_raw": raw_rep.auc, "base_rate": raw_rep.base_rate,
              "mean_confidence_raw": raw_rep.mean_confidence, "measured_on": "evaluation calls", "n_words":
              raw_rep.n_words}
    curve = raw_rep.reliability
    if conf_of.adjusted:
        ev_pred = np.concatenate([conf_of(u) for c in evals for u in utts if u.client == c] or [np.zeros(0)])
        cal_rep = ConfidenceReport.compute(ev_pred, ev_hit, n_utterances=0, calibrated=True)
        report.update(cal_rep.as_dict(), calibration_calls=calib,
                      method="ctm classifier" if conf_of.classifier is not None else
                      "isotonic map of the CTM confidences")
        if conf_of.classifier is not None:
            report["classifier"] = conf_of.classifier.info
        curve = cal_rep.reliability
    return report, curve


def _e21_client_confidences(cfg: FedLmRunConfig, train: Sequence[Any], refs: Mapping[str, Any],
                            conf_of: _CtmConfidence, ref_path: Path) -> dict[str, np.ndarray]:
    """Every client utterance's word confidences (by utterance id): ``conf_of``, or the oracle diagnostic."""
    if cfg.confidence.source != "oracle":
        return {u.utt_id: conf_of(u) for u in train}  # once per utterance (the classifier is not free)
    # the diagnostic: 1 for a word the reference confirms, else 0
    missing = sorted({u.client for u in train} - set(refs))
    if missing:
        raise InputError(f"confidence.source 'oracle' needs every client call's reference; {missing[:5]} have "
                         "none", path=ref_path, expected="references for the client calls")
    train_conf = {}
    for call in sorted({u.client for u in train}):
        us = [u for u in train if u.client == call]
        train_conf.update({u.utt_id: h.astype(np.float64) for u, h in zip(us, _call_hits(us, refs[call]),
                                                                          strict=True)})
    return train_conf


def _call_hits(us: Sequence[Any], ref_sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Per utterance of one call (in order), whether each CTM word is a hit in the Levenshtein alignment
    (jiwer) of the whole call's words against its reference tokens."""
    import jiwer

    hyp = [w for u in us for w in u.words]
    ref = [w for s in ref_sentences for w in s]
    hit = np.zeros(len(hyp), dtype=bool)
    if hyp and ref:
        for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
            if chunk.type == "equal":
                hit[chunk.hyp_start_idx:chunk.hyp_end_idx] = True
    return np.split(hit, np.cumsum([len(u.words) for u in us])[:-1]) if us else []


def _ctm_labels(utts: Sequence[Any], refs: Mapping[str, Sequence[Sequence[str]]],
                calls: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Confidences of the CTM words of ``calls`` and whether each is a hit (:func:`_call_hits`)."""
    confs, hits = [np.zeros(0)], [np.zeros(0, dtype=bool)]
    for call in calls:
        us = [u for u in utts if u.client == call]
        confs += [np.asarray(u.confidences, dtype=np.float64) for u in us]
        hits += _call_hits(us, refs[call])
    return np.concatenate(confs), np.concatenate(hits)


def _ctm_classifier(utts: Sequence[Any], refs: Mapping[str, Sequence[Sequence[str]]], calls: Sequence[str],
                    cfg: FedLmRunConfig) -> tuple[Any, Any]:
    """A word-confidence classifier on CTM features (:mod:`privasr.confidence.ctm`) trained on the labelled
    ``calls`` (isotonic calibration on 20% of their utterances), and the background frequencies it needs."""
    from privasr.confidence.ctm import CTM_FEATURE_NAMES, BackgroundFrequencies, ctm_features_many
    from privasr.confidence.model import ConfidenceModel
    from privasr.corpus.sources import load_text

    bg = BackgroundFrequencies.from_sentences(load_text(cfg.confidence.background))
    feats: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    for call in calls:
        us = [u for u in utts if u.client == call]
        feats += ctm_features_many(us, bg)
        labels += _call_hits(us, refs[call])
    model = ConfidenceModel.fit_features(feats, labels, feature_names=CTM_FEATURE_NAMES, kind=cfg.confidence.kind,
                                         seed=cfg.seed)
    return model, bg


def _isotonic(conf: np.ndarray, hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An increasing map raw confidence -> P(correct) (scikit-learn's isotonic regression), as thresholds for
    ``np.interp``; one pseudo-word of the opposite class at each end keeps it inside (0, 1), as in
    :class:`~privasr.confidence.model.ConfidenceModel` (:func:`~privasr.confidence.calibration.fit_isotonic`)."""
    from privasr.confidence.calibration import fit_isotonic

    if conf.size == 0:
        raise InputError("the calibration calls have no CTM words", expected="calls with recognised words")
    return fit_isotonic(conf, hit)


def load_nbest_sets(cfg: FedLmRunConfig) -> tuple[list[Any], list[Any]]:
    """The dev and test N-best lists of ``data``, every utterance with a reference.

    Raises:
        InputError: naming the file and utterance without a reference.
    """
    from privasr.corpus.load import load_nbest

    assert cfg.data.dev is not None and cfg.data.test is not None
    dev = load_nbest(cfg.data.dev, None)
    test = load_nbest(cfg.data.test, None)
    for name, path, recs in (("dev", cfg.data.dev, dev), ("test", cfg.data.test, test)):
        for nb in recs:
            if nb.ref is None:
                raise InputError(f"{name} utterance {nb.utt_id} has no reference", path=path,
                                 expected="references (WER is measured, rescoring weights tuned on dev)")
    return dev, test


def nbest_data(cfg: FedLmRunConfig, dev: Sequence[Any], test: Sequence[Any]) -> _Data:
    """Stage 1 for N-best data (module docstring, step 2) of the lists ``dev`` and ``test`` (with references):
    the dev lists' 1-best (or references) as client text with their confidences, the test lists' references as
    evaluation text."""
    src = cfg.confidence.source
    has = all(nb.best.confidences is not None for nb in dev if nb.best.words)
    if src == "auto":
        src = "data" if has else "classifier"
    if src == "data" and not has:
        raise InputError("confidence.source is 'data' but some dev 1-best hypotheses have no confidences",
                         path=cfg.data.dev if cfg.folds is None else None,
                         expected="per-word confidences, or confidence.source: classifier")
    report = curve = None
    if cfg.data.client_text == "reference":
        # the oracle diagnostic: clients train on their utterances' references, every word weight 1
        kept = [nb for nb in dev if nb.ref]
        clients = [(c.id, [(tuple(nb.ref), None) for nb in c.utterances]) for c in _group(kept, cfg)]
        info = {"confidence_source": "none (reference text)", "client_text": "reference", "utterances": len(kept),
                "words": int(sum(len(nb.ref) for nb in kept))}
        refs = [tuple(nb.ref) for nb in test if nb.ref]
        return _Data(clients, refs, info, dev, test, heldout=refs)
    kept = [nb for nb in dev if nb.best.words]
    if src == "classifier":
        confs, report, curve = _cross_fit(kept, cfg)
    elif src == "oracle":  # the diagnostic: 1 for a 1-best word the reference confirms, else 0
        from privasr.confidence.features import labels_many

        confs = {nb.utt_id: y.astype(np.float64) for nb, y in zip(kept, labels_many(kept), strict=True)}
    elif src == "data":
        confs = {nb.utt_id: np.asarray(nb.best.confidences, dtype=np.float64) for nb in kept}
    else:
        confs = {nb.utt_id: None for nb in kept}
    clients = [(c.id, [(nb.best.words, confs[nb.utt_id]) for nb in c.utterances]) for c in _group(kept, cfg)]
    eval_sents = [tuple(nb.ref) for nb in test if nb.ref]
    info = {"confidence_source": src, "utterances": len(kept), "words": int(sum(len(nb.best.words) for nb in kept))}
    return _Data(clients, eval_sents, info, dev, test, report, curve,
                 heldout=[tuple(nb.best.words) for nb in test if nb.best.words])


def _cross_fit(nbests: Sequence[Any], cfg: FedLmRunConfig) -> tuple[dict[str, np.ndarray], dict[str, Any], Any]:
    """Confidences of every 1-best from a classifier trained on the other meetings' references (k folds)."""
    from privasr.confidence.features import labels_many
    from privasr.confidence.model import ConfidenceModel, ConfidenceReport

    meetings = sorted({nb.client or nb.utt_id for nb in nbests})
    k = min(cfg.confidence.folds, len(meetings))
    if k < 2:
        raise InputError("the dev set has one meeting: confidences cannot be cross-fitted",
                         expected="two or more meetings (clients) in data.dev, or confidence.source: none")
    fold = {m: i % k for i, m in enumerate(meetings)}
    confs: dict[str, np.ndarray] = {}
    all_c, all_y = [], []
    for f in range(k):
        train = [nb for nb in nbests if fold[nb.client or nb.utt_id] != f]
        held = [nb for nb in nbests if fold[nb.client or nb.utt_id] == f]
        model = ConfidenceModel.fit(train, kind=cfg.confidence.kind, seed=cfg.seed + f,
                                    features=cfg.confidence.features())
        pred = model.predict_many(held)
        for nb, c in zip(held, pred, strict=True):
            confs[nb.utt_id] = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
        all_c.extend(pred)
        all_y.extend(labels_many(held))
    rep = ConfidenceReport.compute(np.concatenate(all_c), np.concatenate(all_y), n_utterances=len(nbests),
                                   calibrated=True)
    return confs, {**rep.as_dict(), "folds": k, "kind": cfg.confidence.kind,
                   "features": list(model.feature_names)}, rep.reliability


# --------------------------------------------------------------------------------------------- federation


@dataclass
class _Model:
    lm: Any
    info: dict[str, Any]
    init_params: dict[str, np.ndarray]


def build_model(cfg: FedLmRunConfig, out: Path) -> _Model:
    """Stage 2: the server's pre-trained NNLM (trained once and cached in ``cache_dir``, default ``out/lm``)."""
    from privasr.rescore.lms import build_lm

    lm, info = build_lm(cfg.nnlm_spec, cfg.cache_dir if cfg.cache_dir is not None else out / "lm")
    params = {k: p.detach().cpu().numpy().astype(np.float32, copy=True) for k, p in lm.model.named_parameters()}
    return _Model(lm, info, params)


def _encode(data: _Data, vocab: Any) -> list[Any]:
    from privasr.federated.algorithms.fedlm import FedLmClient

    out = []
    for cid, utts in data.clients:
        sents = [tuple(vocab.encode(w)) for w, _ in utts]
        weights = None if any(c is None for _, c in utts) else tuple(c for _, c in utts)
        out.append(FedLmClient(str(cid), tuple(sents), weights))
    return out


def _privacy(dp: DPSettings | None, clip: float | None, sampler: Any, draw: int = 0) -> Any:
    if dp is None:
        return None
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    neighboring = dp.neighboring
    if neighboring == "auto":  # sampling a fixed number without replacement is analysed under replace-one
        neighboring = "replace_one" if sampler.kind == "without_replacement" else "add_or_remove_one"
    assert clip is not None
    return PrivacySettings(GaussianMechanism(clip_norm=clip, noise_multiplier=dp.noise_multiplier),
                           PrivacyAccountant(accountant=dp.accountant, target_delta=dp.delta,
                                             neighboring=neighboring), population=dp.population, noise_draw=draw)


def _algorithm(cfg: FedLmRunConfig, model: _Model, fedlm: Mapping[str, Any], init: str, dp: DPSettings | None,
               draw: int = 0) -> tuple[Any, Any, Any]:
    """The fedlm algorithm of these settings, the config's sampler and the privacy settings (``None`` without DP)."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    conf = FedLmConfig.from_dict(fedlm)
    alg = FedLmAlgorithm(conf, model.lm.model.config, model.lm.vocab,
                         model.init_params if init == "pretrained" else None)
    sampler = cfg.federated.make_sampler()
    return alg, sampler, _privacy(dp, conf.clip_norm, sampler, draw)


def operator_side(cfg: FedLmRunConfig, out: str | Path, devices: int) -> tuple[Any, Any]:
    """The operator's half of a deployment (``privasr serve fedlm``) for N-best data: the pre-trained NNLM and,
    with ``confidence.source: classifier`` (or ``auto`` on lists without confidences), a word-confidence
    classifier trained on ``data.dev``'s references (the operator's own labelled lists); ``data.test`` (the
    devices' lists) is never opened.

    Returns:
        The server's :class:`~privasr.federated.loop.Federation` over ``devices`` clients (``None`` each) and
        ``write(folder, run) -> hash`` for the devices' bundle (:func:`~privasr.device.fedlm.write_fedlm_bundle`).

    Raises:
        ConfigError: Earnings-21 data (its CTM devices are not built yet), ``confidence.source: oracle`` (it needs
            the devices' references), ``data.client_text: reference``.
    """
    from privasr.confidence.model import ConfidenceModel
    from privasr.corpus.load import load_nbest
    from privasr.device.fedlm import write_fedlm_bundle
    from privasr.federated.loop import Federation

    if cfg.kind != "nbest":
        raise ConfigError(f"privasr serve fedlm takes N-best data, not data.kind={cfg.kind!r}",
                          expected="data.kind: nbest (devices with CTM files are not built yet)")
    if cfg.data.client_text == "reference":
        raise ConfigError("data.client_text: reference trains on references, which devices do not have",
                          expected="data.client_text: first_pass")
    source = cfg.confidence.source or "auto"
    if source == "oracle":
        raise ConfigError("confidence.source: oracle needs the devices' references",
                          expected="data, classifier, none or auto")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    assert cfg.data.dev is not None
    dev = load_nbest(cfg.data.dev, None)
    if source == "auto":
        source = "data" if all(nb.best.confidences is not None for nb in dev if nb.best.words) else "classifier"
    classifier = None
    if source == "classifier":
        labelled = [nb for nb in dev if nb.best.words and nb.ref is not None]
        if not labelled:
            raise InputError("no dev list has a reference to train the confidence classifier on",
                             path=cfg.data.dev, expected="references in the operator's data.dev")
        classifier = ConfidenceModel.fit(labelled, kind=cfg.confidence.kind, seed=cfg.seed,
                                         features=cfg.confidence.features())
    model = build_model(cfg, out)
    alg, sampler, privacy = _algorithm(cfg, model, cfg.fedlm, cfg.init, cfg.dp)
    fed = cfg.federated
    federation = Federation(alg, [None] * int(devices), cfg.rounds, sampler, cfg.seed, fed.min_clients, privacy,
                            fed.secagg, key={"experiment": "fedlm", "name": cfg.name}, name=cfg.name)

    def write(folder: str | Path, run: Mapping[str, Any]) -> str:
        return write_fedlm_bundle(folder, algorithm=alg, confidence=source, classifier=classifier,
                                  rounds=cfg.rounds, run=run, split_gap=cfg.data.split_gap)

    return federation, write


def federation(cfg: FedLmRunConfig, out: str | Path) -> Any:
    """The main federated run of :func:`run_fedlm` (a :class:`~privasr.federated.loop.Federation`): the stages
    before it (:func:`load_data`, :func:`build_model`, :func:`encode`), then its clients and algorithm with the
    config's DP, sampler and secure aggregation, for ``privasr fed split``."""
    from privasr.federated.loop import Federation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = load_data(cfg)
    model = build_model(cfg, out)
    sets = encode(cfg, data, model)
    alg, sampler, privacy = _algorithm(cfg, model, cfg.fedlm, cfg.init, cfg.dp)
    fed = cfg.federated
    return Federation(alg, list(sets.clients), cfg.rounds, sampler, cfg.seed, fed.min_clients, privacy, fed.secagg,
                      key={"experiment": "fedlm", "name": cfg.name}, name=cfg.name)


def _federate(cfg: FedLmRunConfig, model: _Model, clients: Sequence[Any], fedlm: Mapping[str, Any], init: str,
              dp: DPSettings | None, ckpt: Path | None, eval_ids: Sequence[Sequence[int]] | None = None,
              draw: int = 0) -> tuple[dict[str, np.ndarray], list[dict[str, Any]], dict[str, Any], float]:
    """One federated run (``draw``: its DP noise draw); the final parameters, the round history, privacy figures
    and its seconds."""
    from privasr.federated.backends import run_on

    t0 = time.perf_counter()
    alg, sampler, privacy = _algorithm(cfg, model, fedlm, init, dp, draw)
    conf = alg.config
    fed = cfg.federated
    curve: list[float] = []

    def on_round(log: Any, state: Any) -> None:
        if eval_ids is not None and cfg.eval.every and (log.round + 1) % cfg.eval.every == 0:
            curve.append(alg.perplexity(state["params"], eval_ids))
            log.metrics["eval_ppl"] = curve[-1]

    res = run_on(fed.backend, alg, clients, options=fed.backend_options,
                 checkpoint_dir=ckpt, on_round=on_round, rounds=cfg.rounds,
                 sampler=sampler, seed=cfg.seed, min_clients=fed.min_clients, privacy=privacy, secagg=fed.secagg)
    priv: dict[str, Any] = {}
    if privacy is not None:
        from privasr.federated.loop import dp_denominator

        population = privacy.population if privacy.population is not None else len(clients)
        priv = {"epsilon": float(privacy.accountant.epsilon()), "delta": float(privacy.accountant.target_delta),
                "noise_multiplier": float(dp.noise_multiplier) if dp else 0.0, "clip_norm": conf.clip_norm,
                "accountant": privacy.accountant.accountant, "neighboring": privacy.accountant.neighboring,
                "population": population, "denominator": dp_denominator(sampler, population)}
    return dict(res.state["params"]), [h.to_dict() for h in res.history], priv, time.perf_counter() - t0


def _perplexity(model: _Model, params: Mapping[str, np.ndarray], eval_ids: Sequence[Sequence[int]]) -> float:
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    alg = FedLmAlgorithm(FedLmConfig(), model.lm.model.config, model.lm.vocab)
    return alg.perplexity(params, eval_ids)


# ---------------------------------------------------------------------------------------------- rescoring


def _neural_lm(model: _Model, params: Mapping[str, np.ndarray]) -> Any:
    import torch

    from privasr.lm.neural.models import build_model
    from privasr.lm.neural.scorer import NeuralLM

    net = build_model(model.lm.model.config, model.lm.vocab)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(torch.from_numpy(np.ascontiguousarray(params[k], dtype=np.float32)))
    return NeuralLM(net, model.lm.vocab, spread_unk=model.lm.spread_unk, batch_tokens=model.lm.batch_tokens)


@dataclass
class _Rescored:
    words: list[tuple[str, ...]]
    weights: dict[str, Any]
    dev_errors: int


def _rescore(cfg: FedLmRunConfig, lms: Mapping[str, Any], dev: Sequence[Any], test: Sequence[Any]) -> _Rescored:
    """``am + w_lm * first-pass LM + sum_k w_k * ln P_k + wp * n`` over the NNLMs ``lms`` (name -> LM or
    :class:`~privasr.rescore.combine.LMScoreCache`), weights tuned on ``dev``; the chosen ``test`` words."""
    from privasr.rescore.combine import Combination, score_table, select
    from privasr.rescore.search import build_space, tune

    dev_table = score_table(dev, lms)
    test_table = score_table(test, lms)
    comb = Combination(prior="am", lms=(("lm",) if cfg.rescore.first_pass_lm else ()) + tuple(lms))
    search = cfg.rescore.search
    ranges = dict(search.ranges)
    if "nnlm" in ranges:  # every NNLM weight takes the configured NNLM range
        ranges.update({k: ranges["nnlm"] for k in lms if k not in ranges})
    space = build_space(comb, replace(search, ranges=ranges))
    res = tune(dev, dev_table, comb, space, method="coordinate", **search.coordinate_options())
    choice = select(test_table, comb.totals(test_table, res.weights))
    words = [nb.hyps[int(c)].words if c >= 0 else () for nb, c in zip(test, choice, strict=True)]
    return _Rescored(words, dict(res.weights), int(res.errors))


# --------------------------------------------------------------------------------------------------- run


def load_data(cfg: FedLmRunConfig) -> _Data:
    """Stage 1: the clients' utterances and confidences, and the evaluation text (module docstring, step 2)."""
    return _earnings21(cfg) if cfg.kind == "earnings21" else nbest_data(cfg, *load_nbest_sets(cfg))


@dataclass
class _EvalSets:
    """The encoded clients and evaluation (and development) sentences, and the unadapted model's perplexities."""

    clients: list[Any]
    eval_ids: list[tuple[int, ...]]
    eval_tokens: int
    oov: int
    ppl_scratch: float | None
    ppl_base: float
    dev_ids: list[tuple[int, ...]] | None


def encode(cfg: FedLmRunConfig, data: _Data, model: _Model) -> _EvalSets:
    """Stage 3: the clients and evaluation sentences as word ids of the NNLM's vocabulary, the unadapted (and
    with ``init: scratch`` the freshly initialised) model's perplexity."""
    vocab = model.lm.vocab
    clients = _encode(data, vocab)
    eval_ids = [tuple(vocab.encode(s)) for s in data.eval_sentences]
    eval_tokens = sum(len(s) for s in eval_ids)
    oov = sum(i == vocab.unk_id for s in eval_ids for i in s)
    scratch = _perplexity(model, scratch_params(cfg, model), eval_ids) if cfg.init == "scratch" else None
    ppl_base = _perplexity(model, model.init_params, eval_ids)
    dev_ids = [tuple(vocab.encode(s)) for s in data.dev_sentences] if data.dev_sentences else None
    return _EvalSets(clients, eval_ids, eval_tokens, oov, scratch, ppl_base, dev_ids)


class _Variants:
    """The federated runs of an experiment by name (stage 4): a run is keyed by its resolved settings, so a
    table row equal to an earlier run (a row spelling out a default included) reuses it."""

    def __init__(self, cfg: FedLmRunConfig, model: _Model, sets: _EvalSets, out: Path) -> None:
        self.cfg, self.model, self.sets, self.out = cfg, model, sets, out
        self.runs: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str, fedlm: Mapping[str, Any], init: str, dp: DPSettings | None,
                 draw: int = 0) -> dict[str, Any]:
        """The run ``name`` (``main`` is evaluated every ``eval.every`` rounds; ``draw``: its DP noise draw):
        parameters, history, privacy figures, seconds and perplexities."""
        from privasr.federated.algorithms.fedlm import FedLmConfig

        key = (FedLmConfig.from_dict(fedlm).to_dict(), init, dp, draw if dp is not None else 0)
        for r in self.runs.values():
            if r["key"] == key:
                return r
        sets = self.sets
        params, hist, priv, secs = _federate(self.cfg, self.model, sets.clients, fedlm, init, dp,
                                             self.out / "checkpoint" / name,
                                             sets.eval_ids if name == "main" else None, draw)
        r = {"key": key, "params": params, "history": hist, "priv": priv, "seconds": secs,
             "ppl": _perplexity(self.model, params, sets.eval_ids)}
        if sets.dev_ids is not None:
            r["ppl_dev"] = _perplexity(self.model, params, sets.dev_ids)
        self.runs[name] = r
        return r


def evaluate(cfg: FedLmRunConfig, data: _Data, model: _Model, sets: _EvalSets, variants: _Variants,
             main: dict[str, Any], out: Path) -> dict[str, Any]:
    """Stage 5: the perplexity metrics of the main run against the unadapted model (on the development set
    too), its privacy figures, ``ppl_all_utts`` (``compare_all``) and the confidences' calibration (with
    ``reliability.csv``)."""
    loss = cfg.fedlm.get("loss", "all")
    ppl_base = sets.ppl_base
    metrics: dict[str, Any] = {
        "ppl": main["ppl"], "ppl_baseline": ppl_base, "ppl_rel_change": (main["ppl"] - ppl_base) / ppl_base,
        "loss": loss, "init": cfg.init, "rounds": cfg.rounds, "clients": len(sets.clients),
        "client_words": data.info["words"], "eval_sentences": len(sets.eval_ids), "eval_tokens": sets.eval_tokens,
        "eval_oov_rate": sets.oov / sets.eval_tokens if sets.eval_tokens else 0.0, "vocab_size": len(model.lm.vocab),
    }
    if sets.ppl_scratch is not None:
        metrics["ppl_init"] = sets.ppl_scratch
    if sets.dev_ids is not None:
        metrics.update(ppl_dev=main["ppl_dev"], ppl_dev_baseline=_perplexity(model, model.init_params, sets.dev_ids),
                       dev_sentences=len(sets.dev_ids), dev_tokens=sum(len(s) for s in sets.dev_ids))
    if loss == "threshold":
        metrics["threshold_kept_words"] = _kept_share(data, float(cfg.fedlm.get("threshold", 0.5)))
    metrics.update(main["priv"])
    if cfg.kind == "nbest":
        metrics["rescore_with_baseline"] = cfg.rescore.with_baseline
    if cfg.compare_all and loss != "all":
        metrics["ppl_all_utts"] = variants("all", {**cfg.fedlm, "loss": "all"}, cfg.init, cfg.dp)["ppl"]
    elif cfg.compare_all:
        metrics["ppl_all_utts"] = main["ppl"]
    if data.confidence_report is not None:
        metrics.update({k: data.confidence_report[k] for k in ("ece", "auc", "ece_raw", "auc_raw")
                        if k in data.confidence_report})
        data.reliability.write_csv(out / "reliability.csv")
    return metrics


def run_fedlm(cfg: FedLmRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated FedLM config; write ``out/results.json``, ``out/report.md`` and ``out/model.pt``; return
    the metrics.

    The stages: :func:`load_data`, :func:`build_model`, :func:`encode`, the federated main run
    (:class:`_Variants`), :func:`evaluate`, the adapted model saved, its rescoring WER (N-best data), the
    tables (:func:`_tables`), then the results and the report (:func:`write_report`).
    """
    if cfg.folds is not None:
        raise ConfigError("config key 'folds' is set: a cross-validated run is "
                          "privasr.experiments.fedlm_folds.run_fedlm_folds", expected="folds: null here")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    data = load_data(cfg)
    data_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = build_model(cfg, out)
    nnlm_s = time.perf_counter() - t0
    sets = encode(cfg, data, model)
    variants = _Variants(cfg, model, sets, out)
    main = variants("main", cfg.fedlm, cfg.init, cfg.dp)
    metrics = evaluate(cfg, data, model, sets, variants, main, out)
    _save_model(out / MODEL_FILE, model, main["params"], {"name": cfg.name, "seed": cfg.seed, "ppl": main["ppl"],
                                                          "fedlm": dict(cfg.fedlm), "rounds": cfg.rounds})
    wer_eval = _WerEval(cfg, model, data) if cfg.kind == "nbest" else None
    rescored = _wer(wer_eval, main, metrics) if wer_eval is not None else {}
    tables = _tables(cfg, variants, sets.ppl_base, wer_eval, data)
    metrics.update(data_s=data_s, nnlm_s=nnlm_s)
    if cfg.dp is None:  # a DP run publishes no time of its federated stage: it grows with the clients' data
        metrics.update(federated_s=main["seconds"],
                       variants_s=sum(r["seconds"] for n, r in variants.runs.items() if n != "main"),
                       total_s=time.perf_counter() - t_start)
    write_report(cfg, out, metrics, tables, data, model, main, rescored, argv)
    return metrics


def write_report(cfg: FedLmRunConfig, out: Path, metrics: Mapping[str, Any], tables: Mapping[str, Any],
                 data: _Data, model: _Model, main: Mapping[str, Any], rescored: Mapping[str, Any],
                 argv: Sequence[str] | None) -> None:
    """Stage 6: ``out/results.json`` (the resolved config, the metrics, the inputs' fingerprints, the NNLM,
    the round history, the tables) and ``out/report.md``."""
    from privasr.plots import plots_section
    from privasr.results import write_results

    extra = {"nnlm": model.info, "data_info": data.info, "history": main["history"], "tables": tables,
             "confidence": data.confidence_report, "rescore": rescored,
             "reliability": data.reliability.as_dict() if data.reliability is not None else None,
             "command": list(argv) if argv is not None else None}
    write_results(out, runner="fedlm", config=to_dict(cfg), seed=cfg.seed, metrics=metrics, data=cfg.data.inputs(), extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tables, data.info, data.reliability) + plots_section(out),
                                   encoding="utf-8")


def _save_model(path: Path, model: _Model, params: Mapping[str, np.ndarray], extra: Mapping[str, Any]) -> None:
    """The adapted NNLM as a neural checkpoint (``privasr rescore``'s ``{neural: {checkpoint: PATH}}`` loads it)."""
    from privasr.lm.neural.checkpoint import save_checkpoint

    lm = _neural_lm(model, params)
    save_checkpoint(path, lm.model, lm.vocab, lm.model.config, extra=extra)


def scratch_params(cfg: FedLmRunConfig, model: _Model) -> dict[str, np.ndarray]:
    """The from-scratch initialisation the federated run starts from (the algorithm's own ``init``)."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig

    alg = FedLmAlgorithm(FedLmConfig.from_dict(cfg.fedlm), model.lm.model.config, model.lm.vocab)
    return alg.init(np.random.default_rng([cfg.seed, 0, 3]))["params"]  # the generator run_federated gives init


class _WerEval:
    """N-best rescoring WER of a model's parameters against the unadapted NNLM's (rescored once)."""

    def __init__(self, cfg: FedLmRunConfig, model: _Model, data: _Data, base_cache: Any = None) -> None:
        from privasr.metrics import wer
        from privasr.rescore.combine import LMScoreCache

        assert data.dev is not None and data.test is not None
        self.cfg, self.model, self.dev, self.test = cfg, model, data.dev, data.test
        self.refs = [nb.ref for nb in data.test]
        self.ids = [nb.utt_id for nb in data.test]
        # the unadapted NNLM's scores, computed once (and shared by the folds of a cross-validated run)
        self.base_cache = base_cache if base_cache is not None else LMScoreCache(model.lm)
        self.base = _rescore(cfg, {"nnlm": self.base_cache}, data.dev, data.test)
        self.w_base = wer(self.refs, self.base.words)
        self.w_first = wer(self.refs, [nb.best.words for nb in data.test])

    def __call__(self, params: Mapping[str, np.ndarray]) -> dict[str, Any]:
        from privasr.metrics import mapsswe, wer
        from privasr.rescore.combine import LMScoreCache

        adapted = LMScoreCache(_neural_lm(self.model, params))
        # alone it takes the unadapted model's place; with_baseline: log-linear interpolation with the unadapted
        # NNLM (both weights tuned on dev)
        lms = {"nnlm": self.base_cache, "nnlm_adapted": adapted} if self.cfg.rescore.with_baseline else {"nnlm": adapted}
        new = _rescore(self.cfg, lms, self.dev, self.test)
        w = wer(self.refs, new.words)
        mp = mapsswe(self.refs, new.words, self.base.words, ids=self.ids)
        base = self.w_base.wer
        return {"wer": w.wer, "wer_rel_change": (w.wer - base) / base if base else 0.0, "mapsswe_p": mp.p,
                "mapsswe_z": mp.z, "mapsswe_better": {"A": "adapted", "B": "baseline", "same": "same"}[mp.better],
                "weights": new.weights, "dev_errors": new.dev_errors, "_wer": w, "_words": new.words}


def _wer(ev: _WerEval, run: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    from privasr.metrics import paired_bootstrap

    t0 = time.perf_counter()
    r = run.setdefault("wer", ev(run["params"]))
    bs = paired_bootstrap(r["_wer"].utt_errors, ev.w_base.utt_errors, r["_wer"].utt_ref_words, seed=ev.cfg.seed,
                          resamples=ev.cfg.eval.bootstrap_resamples)
    metrics.update({k: r[k] for k in ("wer", "wer_rel_change", "mapsswe_p", "mapsswe_z", "mapsswe_better")})
    metrics.update(wer_system=system_name(ev.cfg), wer_baseline_system=BASELINE_NAME)
    metrics.update(wer_counts=_counts(r["_wer"]), wer_baseline_counts=_counts(ev.w_base))
    metrics.update(wer_baseline=ev.w_base.wer, wer_first_pass=ev.w_first.wer, bootstrap_ci_low=bs.ci_low,
                   bootstrap_ci_high=bs.ci_high, bootstrap_prob_improvement=bs.prob_a_better,
                   test_utterances=len(ev.test), rescore_s=time.perf_counter() - t0)
    return {"weights_baseline": ev.base.weights, "weights_adapted": r["weights"],
            "dev_errors_baseline": ev.base.dev_errors, "dev_errors_adapted": r["dev_errors"]}


BASELINE_NAME = "unadapted NNLM rescoring"
"""The baseline's human name in report.md, results.json (``wer_baseline_system``) and the plots."""


def system_name(cfg: Any) -> str:
    """The system's human name, e.g. ``federatedly fine-tuned NNLM rescoring (token loss, with the unadapted NNLM,
    DP)``; the config's ``label`` when it has one."""
    if getattr(cfg, "label", ""):
        return str(cfg.label)
    loss = (cfg.fedlm or {}).get("loss") if isinstance(cfg.fedlm, dict) else None
    parts = [f"{loss} loss"] if loss else []
    if cfg.rescore.with_baseline:
        parts.append("with the unadapted NNLM")
    if getattr(cfg, "dp", None) is not None:
        parts.append("DP")
    return "federatedly fine-tuned NNLM rescoring" + (f" ({', '.join(parts)})" if parts else "")


def _counts(w: Any) -> dict[str, int]:
    """Substitutions, deletions, insertions and reference words of a WER result."""
    return {"sub": int(w.substitutions), "del": int(w.deletions), "ins": int(w.insertions),
            "ref_words": int(w.ref_words)}


def _row_wer(ev: _WerEval | None, run: dict[str, Any]) -> dict[str, Any]:
    from privasr.metrics import paired_bootstrap

    if ev is None:
        return {}
    r = run.setdefault("wer", ev(run["params"]))
    bs = paired_bootstrap(r["_wer"].utt_errors, ev.w_base.utt_errors, r["_wer"].utt_ref_words, seed=ev.cfg.seed,
                          resamples=ev.cfg.eval.bootstrap_resamples)
    return {"wer": r["wer"], "wer_rel_change": r["wer_rel_change"], "mapsswe_p": r["mapsswe_p"],
            "ci_low": bs.ci_low, "ci_high": bs.ci_high}


def _kept_share(data: _Data, threshold: float) -> float:
    """The share of the clients' words in utterances whose mean confidence (eq. 3) reaches ``threshold``: what
    ``loss: threshold`` trains on (a simulation diagnostic, counted here, not reported by clients)."""
    kept = total = 0
    for _, utts in data.clients:
        for words, conf in utts:
            total += len(words)
            if conf is None or (len(words) and float(np.mean(conf)) >= threshold):
                kept += len(words)
    return kept / total if total else 0.0


def _dev(r: Mapping[str, Any]) -> dict[str, Any]:
    return {"ppl_dev": r["ppl_dev"]} if "ppl_dev" in r else {}


def _tables(cfg: FedLmRunConfig, variant: _Variants, ppl_base: float, ev: _WerEval | None, data: _Data
            ) -> dict[str, list[dict[str, Any]]]:
    """The table rows (every row a federated run; a row equal to an earlier run reuses it); with N-best data
    each row also has its rescoring WER and MAPSSWE p against the unadapted NNLM; with a development set (the
    labelled calls of Earnings-21) its perplexity ``ppl_dev``."""
    tables: dict[str, list[dict[str, Any]]] = {}
    if cfg.tables.loss is not None:
        rows: list[dict[str, Any]] = [{"loss": "none (unadapted)", "ppl": ppl_base}]
        if ev is not None:
            rows[0].update(wer=ev.w_base.wer, wer_rel_change=0.0, mapsswe_p=1.0)
        for loss in cfg.tables.loss:
            r = variant(f"loss-{loss}", {**cfg.fedlm, "loss": loss}, cfg.init, cfg.dp)
            rows.append({"loss": loss, "ppl": r["ppl"], **_dev(r), **_row_wer(ev, r), **r["priv"]})
        tables["loss"] = rows
    if cfg.tables.threshold is not None:
        rows = []
        for c in cfg.tables.threshold:
            r = variant(f"threshold-{c:g}", {**cfg.fedlm, "loss": "threshold", "threshold": c}, cfg.init, cfg.dp)
            rows.append({"threshold": c, "kept_words": _kept_share(data, c), "ppl": r["ppl"], **_dev(r),
                         **_row_wer(ev, r)})
        tables["threshold"] = rows
    if cfg.tables.init is not None:
        rows = []
        for i in cfg.tables.init:
            r = variant(f"init-{i}", cfg.fedlm, i, cfg.dp)
            rows.append({"init": i, "ppl": r["ppl"], **_dev(r), **_row_wer(ev, r)})
        tables["init"] = rows
    if cfg.tables.noise is not None:
        base_dp = cfg.dp or DPSettings(noise_multiplier=0.0)  # delta, accountant, neighboring: the defaults
        tables["noise"] = [_noise_row(cfg, variant, ev, replace(base_dp, noise_multiplier=z))
                           for z in cfg.tables.noise]
    return tables


def _noise_row(cfg: FedLmRunConfig, variant: _Variants, ev: _WerEval | None, dp: DPSettings) -> dict[str, Any]:
    """A DP table row: the mean over ``tables.noise_draws`` noise draws (one run when the noise is 0), each draw a
    release of the row's epsilon: the draws' ranges (``ppl_min``.., ``wer_min``..), their MAPSSWE p values (the
    row's ``mapsswe_p`` is their median) and the bootstrap interval of the draw-mean's change against the
    unadapted NNLM."""
    from privasr.metrics import draw_mean_bootstrap

    z = dp.noise_multiplier
    draws = cfg.tables.noise_draws if z > 0 else 1
    runs = [variant(f"noise-{z:g}" + (f"-draw{d}" if d else ""), cfg.fedlm, cfg.init, dp, d) for d in range(draws)]
    ppls = [r["ppl"] for r in runs]
    row: dict[str, Any] = {"noise_multiplier": z, "draws": draws, "ppl": float(np.mean(ppls)), "ppl_min": min(ppls),
                           "ppl_max": max(ppls), "epsilon": runs[0]["priv"].get("epsilon"),
                           "delta": runs[0]["priv"].get("delta")}
    if ev is None:
        return row
    res = [r.setdefault("wer", ev(r["params"])) for r in runs]
    wers, ps = [r["wer"] for r in res], [r["mapsswe_p"] for r in res]
    bs = draw_mean_bootstrap([r["_wer"].utt_errors for r in res], ev.w_base.utt_errors,
                             res[0]["_wer"].utt_ref_words, seed=cfg.seed, resamples=cfg.eval.bootstrap_resamples)
    base = ev.w_base.wer
    row.update(wer=float(np.mean(wers)), wer_min=min(wers), wer_max=max(wers),
               wer_rel_change=(float(np.mean(wers)) - base) / base if base else 0.0, mapsswe_p=float(np.median(ps)),
               mapsswe_p_draws=ps, ci_low=bs.ci_low, ci_high=bs.ci_high)
    return row


def _reliability_lines(curve: Any) -> list[str]:
    """A reliability diagram as a Markdown table: per confidence bin, its words, mean confidence, accuracy and a
    bar of the accuracy (``#``) against the diagonal (``|`` at the bin's mean confidence)."""
    lines = ["| confidence bin | words | mean confidence | accuracy | accuracy (#) vs confidence (\\|) |",
             "|---|---:|---:|---:|---|"]
    for lo, hi, n, c, a in zip(curve.lower, curve.upper, curve.count, curve.mean_confidence, curve.accuracy,
                               strict=True):
        if n == 0:
            continue
        bar = list("#" * int(round(20 * a)) + " " * (20 - int(round(20 * a))))
        k = min(19, int(round(20 * c)))
        bar[k] = "\\|"
        lines.append(f"| {lo:.1f}-{hi:.1f} | {int(n):,} | {c:.3f} | {a:.3f} | `{''.join(bar)}` |")
    return lines


def _report(cfg: FedLmRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any], info: Mapping[str, Any],
            curve: Any = None) -> str:
    lines = [f"# {cfg.name}", "",
             f"privasr {__version__}, seed {cfg.seed}, {m['clients']} clients ({cfg.clients.key}), "
             f"{m['rounds']} rounds, loss {m['loss']}, init {m['init']}", "",
             "| model | perplexity |", "|---|---|",
             f"| unadapted | {m['ppl_baseline']:.2f} |",
             f"| federated ({m['loss']}) | {m['ppl']:.2f} ({100 * m['ppl_rel_change']:+.2f}%) |"]
    if "ppl_all_utts" in m and m["loss"] != "all":
        lines.append(f"| federated (all utterances) | {m['ppl_all_utts']:.2f} |")
    lines += ["", f"Evaluation: {m['eval_sentences']:,} sentences, {m['eval_tokens']:,} words, OOV rate "
              f"{100 * m['eval_oov_rate']:.2f}%; clients' first-pass words: {m['client_words']:,}.", ""]
    if "ppl_dev" in m:
        lines += [f"Development set (the labelled calls' references, {m['dev_tokens']:,} tokens): perplexity "
                  f"{m['ppl_dev_baseline']:.2f} unadapted, {m['ppl_dev']:.2f} adapted.", ""]
    if "threshold_kept_words" in m:
        lines += [f"The threshold keeps {100 * m['threshold_kept_words']:.1f}% of the clients' words.", ""]
    if "wer" in m:
        lines += ["| system | test WER |", "|---|---|", f"| first-pass 1-best | {100 * m['wer_first_pass']:.2f}% |",
                  f"| {m.get('wer_baseline_system', BASELINE_NAME)} (baseline) | {100 * m['wer_baseline']:.2f}% |",
                  f"| {m.get('wer_system', system_name(cfg))} | {100 * m['wer']:.2f}% ({100 * m['wer_rel_change']:+.2f}% "
                  f"rel., MAPSSWE p = {m['mapsswe_p']:.3g}) |", "",
                  difference_interval(m.get("bootstrap_ci_low"), m.get("bootstrap_ci_high")) + ".", ""]
    if "epsilon" in m:
        lines += [f"Differential privacy: noise multiplier {m['noise_multiplier']:g}, clip {m['clip_norm']:g}, "
                  f"epsilon = {m['epsilon']:.4g} at delta = {m['delta']:.3g} ({m['accountant']}); each round's "
                  f"noised sum is divided by the fixed denominator {m['denominator']:g} (the expected cohort of a "
                  f"population of {m['population']} clients), and the round history holds only the released "
                  "step's norm, epsilon and delta.", ""]
    if "ece_raw" in m:
        lines += [f"Confidences of the CTM words on the evaluation calls: ECE {m['ece_raw']:.4f}, AUC "
                  f"{m['auc_raw']:.4f} as given" + (f"; ECE {m['ece']:.4f}, AUC {m['auc']:.4f} after isotonic "
                                                    "calibration on the calibration calls" if "ece" in m else "")
                  + ".", ""]
    elif "ece" in m:
        lines += [f"Confidence classifier (cross-fitted, held-out words): ECE {m['ece']:.4f}, AUC {m['auc']:.4f}.",
                  ""]
    if curve is not None:
        lines += ["Reliability diagram of the clients' confidences (also `reliability.csv`):", "",
                  *_reliability_lines(curve), ""]
    if any(r.get("draws", 1) > 1 for r in tables.get("noise", ())):
        lines += [f"The noise rows are means over {cfg.tables.noise_draws} runs that differ only in their noise draw "
                  "(`ppl_min` to `ppl_max`, `wer_min` to `wer_max`: the draws' range; `mapsswe_p`: their median). "
                  "Epsilon is per draw: the draws are repeated simulations of one release, and publishing all of "
                  "them would compose.", ""]
    return "\n".join(lines) + "\n" + "".join(markdown_table(name, rows, _cell, skip=("mapsswe_p_draws",))
                                             for name, rows in tables.items())


def _cell(key: str, v: Any) -> str:
    if isinstance(v, float) and key in ("wer", "wer_min", "wer_max", "wer_rel_change"):
        return f"{100 * v:.2f}%" if key != "wer_rel_change" else f"{100 * v:+.2f}%"
    return f"{v:.4g}" if isinstance(v, float) else ("" if v is None else str(v))
