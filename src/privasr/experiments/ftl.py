"""The federated transfer learning experiment (paper 002, Table 1 at AN4 scale).

``privasr ftl run --config configs/ftl-an4.yaml --out DIR`` does (and writes ``DIR/results.json`` and
``DIR/report.md``):

1. **Data.** ``data.kind: an4``: the AN4 Sphinx MFCCs (:func:`~privasr.asr.features.an4_features`, per-speaker
   CMVN and 3-frame stacking, :func:`~privasr.asr.train.an4_examples`); the training speakers, sorted by name,
   are split: every ``1 / seed_fraction``-th one (``data.seed_fraction``, default 0.5: every other speaker)
   belongs to the **server**, which trains the seed model on them (and replays them, 3.2), the others are the
   **clients**. Every ``data.valid_every``-th utterance of each client speaker is held out as the validation
   set (never trained on; the loss that decides rounds-to-target). The 10 test speakers are the test set.
   ``data.kind: synthetic`` generates a small corpus of the same shape (:func:`~privasr.asr.synth_an4.synthetic_corpus`; the demo).
2. **Units**: ``units: char`` or ``{sentencepiece: N}`` (trained on the server speakers' transcripts).
3. **Seed model**: ``model`` (an :class:`~privasr.asr.models.AcousticConfig` preset plus overrides) trained
   centrally with Adam for ``seed_model.epochs`` on the server speakers (cached in ``OUT/cache``). With
   ``seed_model.select: best`` every ``data.valid_every``-th utterance of each server speaker is held out
   from that training (the server's own validation set; the clients' is never used) and the epoch with the
   lowest loss there is kept; ``last`` (the default) keeps the last epoch.
4. **Federated runs** from the seed model on the client speakers (:class:`~privasr.federated.algorithms.ftl.
   FtlAlgorithm`; ``clients.key``: ``speaker``, one client per speaker, or ``groups`` with ``clients.groups``
   clients of whole speakers): the system under test (``ftl``: by default hierarchical, client SGD + server
   Adam, softmax weighting) and the **baseline** (``baseline``: overrides of ``ftl``, by default FedAvg with a
   single optimiser: server SGD with learning rate 1, count weighting, no server replay; the client training
   is the system's), plus the rows of ``tables.variants``.
   ``rounds`` rounds of ``federated.sampler`` (default: 7 clients sampled with replacement) on
   ``federated.backend``; checkpointed per run in ``OUT/checkpoint/<name>`` and resumed.
5. **Evaluation**: the validation loss after every round; WER and CER of ``eval.method`` (``greedy`` or
   ``beam`` with ``eval.beam``) decoding on the test speakers after the last round, with ``eval.head``
   (:func:`privasr.asr.search.decode`: ``auto``; ``attention`` or ``ctc`` for a seq2seq model with a CTC head;
   ``joint``: the attention beam re-ranked with the CTC head's score), and MAPSSWE of the system's test 1-best
   against the baseline's (``mapsswe_p``). Evaluation settings, the name and the table rows are not part of a
   run's checkpoint key, so changing them re-evaluates the trained models. ``target_loss: auto`` is the best
   validation loss the baseline reaches in its ``rounds`` rounds (so the baseline reaches it by construction);
   ``target_from_seed: f`` makes it ``f`` times the seed model's validation loss instead, a target neither
   run decides; ``rounds_to_target`` is the first round (1-based) at which a run's validation loss is at or
   below it (``null`` if never).
6. ``centralised`` (optional): the lower bound (the same network trained centrally on every training speaker
   from scratch) and centralised online training of the seed model on the client speakers' data, each for
   ``centralised.epochs`` Adam epochs.

Only float32 parameter deltas with their unit counts and training losses cross to the server.

:func:`run_ftl` is these stages in turn: :func:`prepare_data` (1, 2), :func:`train_seed_model` (3),
:func:`federated_runs` (4, 5), :func:`centralised_rows` (6) and :func:`write_report`.

Config (YAML; every key optional; the schema is :class:`FtlRunConfig`, read with :mod:`privasr.config`, so
unknown keys, wrong types and bad values are errors naming the key path)::

    name: ftl
    label: null                       # the system's human name (default: from its ftl config, run_name)
    seed: 0
    data: {kind: an4, root: null, cmvn: speaker, seed_fraction: 0.5, valid_every: 10,
           speakers: 16, utterances: 12, test_speakers: 4}   # the last three: kind synthetic only
    units: char                       # or {sentencepiece: N}, N >= 8
    model: {preset: small, ...}       # an AcousticConfig preset plus AcousticConfig fields
    seed_model: {epochs: 10, lr: 0.001, batch_size: 16, select: last}   # select: last | best
    clients: {key: speaker, groups: 7}                      # key: speaker | groups
    rounds: 40
    federated: {backend: local, backend_options: {}, sampler: {kind: with_replacement, n: 7}, min_clients: 1}
    ftl: {...}                        # FtlConfig fields over {server: {name: adam, lr: 0.001},
                                      #   weighting: softmax, temperature: 1.0, client_optimizer: {name: sgd, lr: 0.1}}
    baseline: {...}                   # FtlConfig fields over ftl's and {server: fedavg, weighting: count,
                                      #   temperature: 1.0, replay_steps: 0}
    target_loss: auto                 # or a number
    target_from_seed: null            # or f in (0, 1): the target is f x the seed model's validation loss
    tables:
      variants: [{name: NAME, clients: speaker | groups, ftl: {...}}]   # ftl: over the system's; clients: clients.key
    centralised: null                 # or {epochs: N} (default seed_model.epochs): the centralised rows
    eval: {method: greedy, beam: 8, head: auto}   # beam: beam search only; head: auto | attention | ctc | joint

``ftl``, ``baseline`` and every row's ``ftl`` become :class:`~privasr.federated.algorithms.ftl.FtlConfig`\\ s whose
temperature is 1.0 unless they weight by softmax (where alone it acts), so runs that differ only in an unused
temperature share their checkpoints and cache keys. :func:`privasr.config.to_dict` of the config (every default
filled in) is the ``config`` of results.json, and :func:`load_ftl_config` reads it back.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.asr.models import PRESETS, AcousticConfig
from privasr.asr.synth_an4 import synthetic_corpus
from privasr.config import (
    Context,
    check_mapping,
    check_str,
    from_mapping,
    key_path,
    setting,
    to_dict,
    unknown_keys,
)
from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms.ftl import FtlAlgorithm, FtlClient, FtlConfig
from privasr.federated.sampling import FederationSettings

__all__ = ["FtlRunConfig", "DataSettings", "UnitsSettings", "SeedModelSettings", "ClientsSettings",
           "FtlFederationSettings", "VariantSettings", "TablesSettings", "CentralisedSettings", "EvalSettings",
           "load_ftl_config", "run_ftl", "split_speakers", "load_utterances", "prepare_data", "train_seed_model",
           "federated_runs", "centralised_rows", "write_report"]

_BASELINE = {"server": "fedavg", "weighting": "count", "temperature": 1.0, "replay_steps": 0}
_DEFAULT_FTL = {"server": {"name": "adam", "lr": 0.001}, "weighting": "softmax", "temperature": 1.0,
                "client_optimizer": {"name": "sgd", "lr": 0.1}}
_CLIENT_KEYS = ("speaker", "groups")


# ---------------------------------------------------------------------------------------------------------------
# config schema
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSettings:
    """``data``: the AN4 features (``root``: the AN4 folder, default ``<data>/an4``) or a synthetic corpus of
    ``speakers`` training and ``test_speakers`` test speakers with ``utterances`` each; the CMVN, the server's
    share of the training speakers and the validation hold-out."""

    kind: str = setting("an4", choices=("an4", "synthetic"))
    root: Path | None = setting(None, exists="dir")
    cmvn: str = setting("speaker", choices=("speaker", "global", "none"))
    seed_fraction: float = setting(0.5, gt=0.0, lt=1.0)
    valid_every: int = setting(10, min=2)
    speakers: int = setting(16, min=2)
    utterances: int = setting(12, min=2)
    test_speakers: int = setting(4, min=2)


@dataclass(frozen=True)
class UnitsSettings:
    """``units``: ``char`` (``sentencepiece`` is ``None``) or ``{sentencepiece: N}``, a unigram model of ``N``
    pieces trained on the server speakers' transcripts."""

    sentencepiece: int | None = setting(None, min=8)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        if value == "char":
            return {}
        if isinstance(value, Mapping):
            unknown_keys(value, ("sentencepiece",), where)
            if value.get("sentencepiece") is None:
                raise ConfigError(f"config key {key_path(where, 'sentencepiece')!r} is None",
                                  expected="an integer >= 8")
        return value

    def __config_dict__(self) -> Any:
        return "char" if self.sentencepiece is None else {"sentencepiece": self.sentencepiece}


@dataclass(frozen=True)
class SeedModelSettings:
    """``seed_model``: the server's central Adam training, keeping the ``last`` epoch or the ``best`` on held-out
    server utterances."""

    epochs: int = setting(10, min=1)
    lr: float = 0.001
    batch_size: int = setting(16, min=1)
    select: str = setting("last", choices=("last", "best"))


@dataclass(frozen=True)
class ClientsSettings:
    """``clients``: one client per ``speaker``, or ``groups`` clients of whole speakers."""

    key: str = setting("speaker", choices=_CLIENT_KEYS)
    groups: int = setting(7, min=1)


@dataclass(frozen=True)
class FtlFederationSettings(FederationSettings):
    """``federated``: as every runner's, but 7 clients sampled with replacement per round by default (3.1)."""

    sampler: Any = field(default_factory=lambda: {"kind": "with_replacement", "n": 7})


@dataclass(frozen=True)
class VariantSettings:
    """One row of ``tables.variants``: a name, its clients (default ``clients.key``) and its FTL config (the
    system's with the row's ``ftl`` keys over it)."""

    name: str
    clients: str | None = setting(None, choices=_CLIENT_KEYS)
    ftl: FtlConfig = field(default_factory=lambda: FtlConfig.from_dict(_DEFAULT_FTL))


@dataclass(frozen=True)
class TablesSettings:
    """``tables``: the extra federated runs of the table."""

    variants: tuple[VariantSettings, ...] = ()


@dataclass(frozen=True)
class CentralisedSettings:
    """``centralised``: the centralised rows' Adam epochs (default ``seed_model.epochs``)."""

    epochs: int | None = setting(None, min=1)


@dataclass(frozen=True)
class EvalSettings:
    """``eval``: greedy or beam decoding of the test speakers, and the seq2seq model's scoring head."""

    method: str = setting("greedy", choices=("greedy", "beam"))
    beam: int = setting(8, min=1)
    head: str = setting("auto", choices=("auto", "attention", "ctc", "joint"))

    @property
    def options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`privasr.asr.train.evaluate`: the beam (beam search only), the head."""
        return {**({"beam": self.beam} if self.method == "beam" else {}), "head": self.head}


@dataclass(frozen=True)
class FtlRunConfig:
    """An FTL experiment config (module docstring), validated by :func:`load_ftl_config`.

    ``model`` is the preset resolved to an :class:`~privasr.asr.models.AcousticConfig`; ``ftl``, ``baseline`` and
    the rows' ``ftl`` are resolved :class:`~privasr.federated.algorithms.ftl.FtlConfig`\\ s; ``target_loss``
    ``None`` is ``auto``.
    """

    name: str = "ftl"
    label: str | None = None
    seed: int = setting(0, min=0)
    data: DataSettings = field(default_factory=DataSettings)
    units: UnitsSettings = field(default_factory=UnitsSettings)
    model: AcousticConfig = field(default_factory=lambda: AcousticConfig.preset("small"))
    seed_model: SeedModelSettings = field(default_factory=SeedModelSettings)
    clients: ClientsSettings = field(default_factory=ClientsSettings)
    rounds: int = setting(40, min=1)
    federated: FtlFederationSettings = field(default_factory=FtlFederationSettings)
    ftl: FtlConfig = field(default_factory=lambda: FtlConfig.from_dict(_DEFAULT_FTL))
    baseline: FtlConfig = field(default_factory=lambda: FtlConfig.from_dict({**_DEFAULT_FTL, **_BASELINE}))
    target_loss: float | None = None
    target_from_seed: float | None = setting(None, gt=0, lt=1)
    tables: TablesSettings = field(default_factory=TablesSettings)
    centralised: CentralisedSettings | None = None
    eval: EvalSettings = field(default_factory=EvalSettings)

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """The shorthands: a model preset with overrides, ``ftl``/``baseline``/row ``ftl`` keys over their
        defaults, ``target_loss: auto``."""
        if value is not None and not isinstance(value, Mapping):
            return value
        d = dict(value or {})
        m = check_mapping(d.get("model"), "model")
        preset = check_str(m.pop("preset", "small"), "model.preset", sorted(PRESETS))
        d["model"] = {**PRESETS[preset], **m}
        ftl = d["ftl"] = {**_DEFAULT_FTL, **check_mapping(d.get("ftl"), "ftl")}
        d["baseline"] = {**ftl, **_BASELINE, **check_mapping(d.get("baseline"), "baseline")}
        tables = d.get("tables")
        if isinstance(tables, Mapping) and "variants" in tables:
            variants = tables["variants"] or []
            if isinstance(variants, list | tuple):
                variants = [{**v, "ftl": {**ftl, **check_mapping(v.get("ftl"), f"tables.variants[{i}].ftl")}}
                            if isinstance(v, Mapping) else v for i, v in enumerate(variants)]
            d["tables"] = {**tables, "variants": variants}
        if d.get("target_loss") == "auto":
            d["target_loss"] = None
        return d

    def __config_check__(self, where: str, ctx: Context) -> FtlRunConfig:
        self._check_eval()
        if self.target_loss is not None and self.target_from_seed is not None:
            raise ConfigError(f"config keys 'target_loss' ({self.target_loss!r}) and 'target_from_seed' "
                              f"({self.target_from_seed!r}) are both set",
                              expected="one target: a loss, a fraction of the seed model's, or target_loss auto")
        if self.federated.secagg.enabled:  # before any work; the backend would refuse at round one
            from privasr.federated.compression import check_no_secagg

            for what, c in (("ftl", self.ftl), ("baseline", self.baseline),
                            *((f"tables.variants[{i}].ftl", v.ftl) for i, v in enumerate(self.tables.variants))):
                check_no_secagg(c.compression, what)
        rows = tuple(dataclasses.replace(v, clients=v.clients or self.clients.key, ftl=_plain_temperature(v.ftl))
                     for v in self.tables.variants)
        central = self.centralised
        if central is not None and central.epochs is None:
            central = CentralisedSettings(self.seed_model.epochs)
        return dataclasses.replace(self, ftl=_plain_temperature(self.ftl), baseline=_plain_temperature(self.baseline),
                                   tables=TablesSettings(rows), centralised=central)

    def _check_eval(self) -> None:
        """The decoding head must exist on the model, and joint scoring needs beam search."""
        method, head, model = self.eval.method, self.eval.head, self.model
        if head in ("ctc", "joint") and model.arch == "seq2seq" and not model.ctc_weight:
            raise ConfigError(f"eval.head is '{head}' but the seq2seq model has no CTC head",
                              expected="model.ctc_weight > 0, or eval.head 'auto'/'attention'")
        if head in ("attention", "joint") and model.arch == "ctc":
            raise ConfigError(f"eval.head is '{head}' but model.arch is 'ctc'", expected="eval.head 'auto' or 'ctc'")
        if head == "joint" and method != "beam":
            raise ConfigError("eval.head is 'joint' with eval.method 'greedy'", expected="eval.method 'beam'")


def _plain_temperature(cfg: FtlConfig) -> FtlConfig:
    """``cfg`` with temperature 1.0 unless it weights by softmax (where alone the temperature acts)."""
    return cfg if cfg.weighting == "softmax" else dataclasses.replace(cfg, temperature=1.0)


def load_ftl_config(config: Mapping[str, Any], *, check_files: bool = True) -> FtlRunConfig:
    """Validate an FTL experiment config (see the module docstring); errors name the key path. With
    ``check_files`` the AN4 folder ``data.root`` (when given) must exist.

    >>> cfg = load_ftl_config({"model": {"preset": "tiny", "arch": "ctc"}, "baseline": {"replay_steps": 1}})
    >>> cfg.model.enc_layers, cfg.ftl.weighting, cfg.baseline.server, cfg.baseline.replay_steps
    (1, 'softmax', {'name': 'fedavg'}, 1)
    >>> load_ftl_config({"data": {"kind": "an5"}})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'data.kind' is 'an5' (expected one of an4, synthetic)
    """
    return from_mapping(FtlRunConfig, config, "", Context(check_files))


# ---------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------
def split_speakers(speakers: Sequence[str], seed_fraction: float) -> tuple[list[str], list[str]]:
    """(server speakers, client speakers): sorted, the server takes every ``1 / seed_fraction``-th by position.

    >>> split_speakers(["d", "a", "c", "b"], 0.5)
    (['a', 'c'], ['b', 'd'])
    """
    names = sorted(set(speakers))
    n_seed = max(1, min(len(names) - 1, round(len(names) * seed_fraction)))
    picks = {int(round(i * len(names) / n_seed)) for i in range(n_seed)}
    server = [s for i, s in enumerate(names) if i in picks]
    return server, [s for s in names if s not in picks and s not in server]


def load_utterances(cfg: FtlRunConfig) -> tuple[list[Any], list[Any]]:
    """The training and test utterances of ``data`` (AN4 features or the synthetic corpus)."""
    d = cfg.data
    if d.kind == "synthetic":
        return synthetic_corpus(d.speakers, d.utterances, d.test_speakers, cfg.seed)
    from privasr.asr.features import an4_features

    return an4_features(d.root, "train"), an4_features(d.root, "test")


def _tokenizer(cfg: FtlRunConfig, transcripts: Sequence[Sequence[str]]) -> Any:
    from privasr.asr.units import CharTokenizer, SentencePieceTokenizer

    if cfg.units.sentencepiece is None:
        return CharTokenizer.train(transcripts)
    return SentencePieceTokenizer.train(transcripts, vocab_size=cfg.units.sentencepiece, seed=cfg.seed)


def _groups(speakers: Sequence[str], n: int) -> list[list[str]]:
    names = sorted(speakers)
    n = min(n, len(names))
    return [names[i::n] for i in range(n)]


def _hold_out(by_spk: Mapping[str, Sequence[Any]], speakers: Sequence[str], every: int
              ) -> tuple[list[Any], dict[str, list[Any]]]:
    """Every ``every``-th utterance of each speaker held out: (the held-out utterances, the rest per speaker)."""
    held = [e for s in speakers for i, e in enumerate(by_spk[s]) if i % every == every - 1]
    kept = {s: [e for i, e in enumerate(by_spk[s]) if i % every != every - 1] for s in speakers}
    return held, kept


@dataclass
class _Data:
    """The prepared corpus: the units, the model config sized to the features, and the examples by role."""

    tok: Any
    model: AcousticConfig
    examples: list[Any]
    test: list[Any]
    by_speaker: dict[str, list[Any]]
    server_speakers: list[str]
    client_speakers: list[str]
    server_examples: list[Any]
    valid: list[Any]
    client_examples: dict[str, list[Any]]


def prepare_data(cfg: FtlRunConfig) -> _Data:
    """Stage 1: load the utterances, split the speakers, train the units on the server's transcripts, make the
    model inputs and hold out the clients' validation set."""
    from privasr.asr.train import an4_examples

    train_utts, test_utts = load_utterances(cfg)
    server_spk, client_spk = split_speakers([u.speaker for u in train_utts], cfg.data.seed_fraction)
    server_utts = [u for u in train_utts if u.speaker in set(server_spk)]
    tok = _tokenizer(cfg, [u.words for u in server_utts])
    model = cfg.model.replace(input_dim=3 * train_utts[0].features.shape[1])
    ex_all = an4_examples(train_utts, tok, cmvn=cfg.data.cmvn)
    test = an4_examples(test_utts, tok, cmvn=cfg.data.cmvn)
    by_spk: dict[str, list[Any]] = {}
    for e in ex_all:
        by_spk.setdefault(e.speaker, []).append(e)
    server_ex = [e for s in server_spk for e in by_spk[s]]
    valid, client_ex = _hold_out(by_spk, client_spk, cfg.data.valid_every)
    if not valid or not any(client_ex.values()):
        raise InputError(f"{len(client_spk)} client speakers leave no validation or no training utterances",
                         expected="more utterances per speaker or a larger valid_every")
    return _Data(tok, model, ex_all, test, by_spk, server_spk, client_spk, server_ex, valid, client_ex)


# ---------------------------------------------------------------------------------------------------------------
# centralised training and evaluation
# ---------------------------------------------------------------------------------------------------------------
def _cache_key(cfg: FtlRunConfig, model: AcousticConfig, what: str, **extra: Any) -> str:
    key = {"what": what, "data": to_dict(cfg.data), "units": to_dict(cfg.units), "model": model.to_dict(),
           "seed": cfg.seed, "version": __version__, **extra}
    return json.dumps(key, sort_keys=True, default=str)


def _central(cfg: FtlRunConfig, data: _Data, init: Mapping[str, np.ndarray] | None, examples: Sequence[Any],
             epochs: int, cache: Path, name: str,
             select: tuple[Sequence[Any], Callable[[Mapping[str, np.ndarray], Sequence[Any]], float]] | None = None
             ) -> tuple[dict[str, np.ndarray], float]:
    """Centralised Adam training (cached): the parameters and the seconds it took (0 when cached).

    ``select = (held-out examples, loss(params, examples))``: train epoch by epoch and keep the parameters of the
    epoch with the lowest held-out loss (the losses per epoch are saved beside the cached parameters)."""
    import torch

    from privasr.asr.models import build_model
    from privasr.asr.train import train
    from privasr.federated.algorithms._config import load_params, params_of

    lr, batch = cfg.seed_model.lr, cfg.seed_model.batch_size
    key = _cache_key(cfg, data.model, name, epochs=epochs, lr=lr, batch=batch, init=init is not None,
                     n=len(examples), **({"select": "best", "held_out": len(select[0])} if select else {}))
    path = cache / f"{name}.npz"
    meta = cache / f"{name}.json"
    if path.is_file() and meta.is_file() and meta.read_text(encoding="utf-8") == key:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}, 0.0
    model = build_model(data.model, data.tok, seed=cfg.seed)
    if init is not None:
        load_params(model, init)
    t0 = time.perf_counter()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    if select is None:
        train(model, opt, examples, epochs=epochs, batch_size=batch, seed=cfg.seed)
        params = params_of(model)
    else:
        held, loss = select
        best: tuple[float, int, dict[str, np.ndarray]] | None = None
        losses = []
        for ep in range(epochs):  # one epoch at a time, each with its own seeded batch order
            train(model, opt, examples, epochs=1, batch_size=batch, seed=cfg.seed * 1000 + ep)
            p = params_of(model)
            losses.append(float(loss(p, held)))
            if best is None or losses[-1] < best[0]:
                best = (losses[-1], ep + 1, {k: v.copy() for k, v in p.items()})
        assert best is not None
        params = best[2]
        cache.mkdir(parents=True, exist_ok=True)
        (cache / f"{name}-epochs.json").write_text(json.dumps({"held_out_loss": losses, "best_epoch": best[1]}),
                                                   encoding="utf-8")
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, **params)
    meta.write_text(key, encoding="utf-8")
    return params, time.perf_counter() - t0


def _seed_selection(cache: Path, select: str) -> dict[str, Any]:
    """``seed_model_epoch`` and the held-out losses per epoch when the seed model's epoch was selected."""
    f = cache / "seed-epochs.json"
    if select != "best" or not f.is_file():
        return {}
    d = json.loads(f.read_text(encoding="utf-8"))
    return {"seed_model_epoch": d["best_epoch"], "seed_model_held_out_loss": d["held_out_loss"]}


def _evaluate(alg: Any, params: Mapping[str, np.ndarray], test: Sequence[Any], cfg: FtlRunConfig) -> dict[str, Any]:
    from privasr.asr.train import evaluate

    model = alg.load(params)
    ev = evaluate(model, alg.tokenizer, test, method=cfg.eval.method, **cfg.eval.options)
    return {"wer": ev.wer.wer, "cer": ev.cer.wer, "test_loss": alg.loss(params, test),
            "hypotheses": [" ".join(nb.best.words) for nb in ev.nbest]}


def _significance(test: Sequence[Any], a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """MAPSSWE (sclite's segments, grouped by test speaker) of run ``a``'s 1-best against run ``b``'s."""
    from privasr.metrics.mapsswe import mapsswe

    r = mapsswe([e.words for e in test], [h.split() for h in a["hypotheses"]], [h.split() for h in b["hypotheses"]],
                ids=[f"{e.speaker}-{e.utt_id}" for e in test])
    return {"mapsswe_p": r.p, "mapsswe_z": r.z, "mapsswe_better": {"A": "system", "B": "baseline"}.get(r.better,
                                                                                                      r.better)}


@dataclass
class _Seed:
    """The seed model: the probe algorithm (the system's config; loss and decoding of any parameters), the
    parameters, the seconds its training took, its test evaluation and its validation loss."""

    probe: FtlAlgorithm
    params: dict[str, np.ndarray]
    seconds: float
    eval: dict[str, Any]
    valid_loss: float


def train_seed_model(cfg: FtlRunConfig, data: _Data, cache: Path) -> _Seed:
    """Stage 2: train the seed model centrally on the server speakers (cached in ``cache``; with
    ``seed_model.select: best`` keeping the epoch best on held-out server utterances) and evaluate it."""
    probe = FtlAlgorithm(cfg.ftl, data.model, data.tok)
    select = None
    seed_train = data.server_examples
    if cfg.seed_model.select == "best":
        server_held, server_kept = _hold_out(data.by_speaker, data.server_speakers, cfg.data.valid_every)
        seed_train = [e for s in data.server_speakers for e in server_kept[s]]
        if not server_held or not seed_train:
            raise InputError(f"{len(data.server_speakers)} server speakers leave no held-out or no training "
                             "utterances", expected="more utterances per speaker or a larger valid_every")
        select = (server_held, probe.loss)
    params, seconds = _central(cfg, data, None, seed_train, cfg.seed_model.epochs, cache, "seed", select)
    return _Seed(probe, params, seconds, _evaluate(probe, params, data.test, cfg), probe.loss(params, data.valid))


def centralised_rows(cfg: FtlRunConfig, data: _Data, seed: _Seed, cache: Path) -> dict[str, Any]:
    """Stage 4 (with ``centralised``): the lower bound (trained from scratch on every training speaker's
    utterances but the validation set) and the seed model trained further on the client speakers' data."""
    if cfg.centralised is None:
        return {}
    epochs = cfg.centralised.epochs
    assert epochs is not None
    held = set(map(id, data.valid))
    lower, s1 = _central(cfg, data, None, [e for e in data.examples if id(e) not in held], epochs, cache,
                         "central-all")
    online, s2 = _central(cfg, data, seed.params, [e for v in data.client_examples.values() for e in v], epochs,
                          cache, "central-online")
    probe = seed.probe
    return {"centralised_all": {**_evaluate(probe, lower, data.test, cfg), "valid_loss": probe.loss(lower, data.valid),
                                "seconds": s1},
            "seed_plus_centralised_online": {**_evaluate(probe, online, data.test, cfg),
                                             "valid_loss": probe.loss(online, data.valid), "seconds": s2}}


# ---------------------------------------------------------------------------------------------------------------
# federated runs
# ---------------------------------------------------------------------------------------------------------------
def _training_key(cfg: FtlRunConfig) -> dict[str, Any]:
    """The parts of the resolved config a federated run's training depends on (its checkpoint key): not the
    name, the evaluation, the other table rows or the centralised rows, so a run can be re-evaluated, renamed
    or given more rows without retraining."""
    return {k: v for k, v in to_dict(cfg).items() if k not in ("name", "eval", "tables", "centralised")}


def _rounds_to(losses: Sequence[float], target: float) -> int | None:
    for i, v in enumerate(losses):
        if v <= target + 1e-12:
            return i + 1
    return None


def _clients(cfg: FtlRunConfig, data: _Data, key: str) -> list[FtlClient]:
    """One client per client speaker with training utterances, or ``clients.groups`` groups of whole speakers."""
    if key == "speaker":
        return [FtlClient(s, tuple(data.client_examples[s])) for s in data.client_speakers if data.client_examples[s]]
    return [FtlClient(f"group{i}", tuple(e for s in g for e in data.client_examples[s]))
            for i, g in enumerate(_groups(data.client_speakers, cfg.clients.groups))]


def operator_side(cfg: FtlRunConfig, out: str | Path, devices: int) -> tuple[Any, Any]:
    """The operator's half of a deployment (``privasr serve ftl``): the units and the seed model trained on the
    server speakers only (cached in ``out/cache``; with ``seed_model.select: best`` the epoch best on held-out
    server utterances), the algorithm with server replay on the server speakers.

    Only synthetic data for now: an AN4 folder holds the operator's and the devices' speakers together, and the
    operator would read both. The synthetic corpus is generated whole from its seed (a test bed); only the server
    speakers' utterances are used here.

    Returns:
        The server's :class:`~privasr.federated.loop.Federation` over ``devices`` clients (``None`` each) and
        ``write(folder, run) -> hash`` for the devices' bundle (:func:`~privasr.device.ftl.write_ftl_bundle`).

    Raises:
        ConfigError: AN4 data, or a CMVN a device cannot apply (``global``).
    """
    from privasr.device.ftl import write_ftl_bundle
    from privasr.federated.loop import Federation

    if cfg.data.kind != "synthetic":
        raise ConfigError(f"privasr serve ftl takes synthetic data, not data.kind={cfg.data.kind!r}",
                          expected="data.kind: synthetic (an AN4 folder mixes the operator's and the devices' "
                                   "speakers)")
    if cfg.data.cmvn == "global":
        raise ConfigError("data.cmvn: global on devices", expected="speaker or none (a device normalises with "
                                                                    "its own statistics)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(cfg)
    probe = FtlAlgorithm(cfg.ftl, data.model, data.tok)
    seed_train, select = data.server_examples, None
    if cfg.seed_model.select == "best":
        held, kept = _hold_out(data.by_speaker, data.server_speakers, cfg.data.valid_every)
        seed_train = [e for s in data.server_speakers for e in kept[s]]
        select = (held, probe.loss)
    params, _ = _central(cfg, data, None, seed_train, cfg.seed_model.epochs, out / "cache", "seed", select)
    alg = FtlAlgorithm(cfg.ftl, data.model, data.tok, init_state=params,
                       replay=data.server_examples if cfg.ftl.replay_steps else None)
    fed = cfg.federated
    federation = Federation(alg, [None] * int(devices), cfg.rounds, fed.make_sampler(), cfg.seed, fed.min_clients,
                            None, fed.secagg, key={"experiment": "ftl", "name": cfg.name}, name=cfg.name)

    def write(folder: str | Path, run: Mapping[str, Any]) -> str:
        return write_ftl_bundle(folder, algorithm=alg, cmvn=cfg.data.cmvn, rounds=cfg.rounds, run=run)

    return federation, write


def federation(cfg: FtlRunConfig, out: str | Path) -> Any:
    """The system's federated run of :func:`run_ftl` (a :class:`~privasr.federated.loop.Federation`): the stages
    before it (:func:`prepare_data`, :func:`train_seed_model`), then its clients and algorithm with the config's
    sampler and secure aggregation, for ``privasr fed split``."""
    from privasr.federated.loop import Federation

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    data = prepare_data(cfg)
    seed = train_seed_model(cfg, data, out / "cache")
    alg = FtlAlgorithm(cfg.ftl, data.model, data.tok, init_state=seed.params,
                       replay=data.server_examples if cfg.ftl.replay_steps else None)
    fed = cfg.federated
    return Federation(alg, _clients(cfg, data, cfg.clients.key), cfg.rounds, fed.make_sampler(), cfg.seed,
                      fed.min_clients, None, fed.secagg, key={"experiment": "ftl", "name": cfg.name}, name=cfg.name)


def _federate(cfg: FtlRunConfig, data: _Data, seed: _Seed, out: Path, sampler: Any, name: str, ftl_cfg: FtlConfig,
              key: str) -> dict[str, Any]:
    """One federated run from the seed model (checkpointed in ``out/checkpoint/<name>``, resumed): the
    validation loss after every round and the test evaluation after the last."""
    from privasr.federated.backends import run_on

    alg = FtlAlgorithm(ftl_cfg, data.model, data.tok, init_state=seed.params,
                       replay=data.server_examples if ftl_cfg.replay_steps else None)
    clients = _clients(cfg, data, key)

    def on_round(entry: Any, state: Any) -> None:
        entry.metrics["valid_loss"] = alg.loss(state["params"], data.valid)

    fed = cfg.federated
    t0 = time.perf_counter()
    res = run_on(fed.backend, alg, clients, options=fed.backend_options, checkpoint_dir=out / "checkpoint" / name,
                 on_round=on_round, rounds=cfg.rounds, sampler=sampler, seed=cfg.seed, min_clients=fed.min_clients,
                 secagg=fed.secagg, key={"experiment": _training_key(cfg), "variant": name, "ftl": ftl_cfg.to_dict(), "clients": key})
    losses = [float(h.metrics["valid_loss"]) for h in res.history]
    ev = _evaluate(alg, res.state["params"], data.test, cfg)
    return {"name": name, "clients": len(clients), "client_key": key, "config": ftl_cfg.to_dict(),
            "valid_loss": losses, "train_loss": [float(h.metrics.get("loss", float("nan"))) for h in res.history],
            **_upload_figures(res.history), "seconds": time.perf_counter() - t0, **ev}


def _upload_lines(runs: Mapping[str, Any]) -> list[str]:
    """The report's line on upload sizes (mean over rounds, per client), when the runs recorded them."""
    parts = []
    for name, r in runs.items():
        sent = [v for v in r.get("upload_bytes", []) if v is not None]
        raw = [v for v in r.get("upload_raw_bytes", []) if v is not None]
        if sent and raw:
            mean_sent, mean_raw = float(np.mean(sent)), float(np.mean(raw))
            ratio = mean_raw / mean_sent
            size = ("the fp32 size: no compression" if abs(ratio - 1.0) < 0.05
                    else f"{ratio:.1f}x smaller than its fp32 size, {mean_raw:,.0f}")
            parts.append(f"{name} {mean_sent:,.0f} bytes ({size})")
    return [f"Upload per client per round: {'; '.join(parts)}."] if parts else []


def _upload_figures(history: Sequence[Any]) -> dict[str, Any]:
    """Per round, the mean bytes a client uploaded and their fp32 size (absent with DP or secure aggregation)."""
    out: dict[str, Any] = {}
    for k in ("upload_bytes", "upload_raw_bytes"):
        vals = [h.metrics.get(k) for h in history]
        if any(v is not None for v in vals):
            out[k] = [None if v is None else float(v) for v in vals]
    return out


@dataclass
class _Runs:
    """The federated runs (the system, the baseline, the table rows) and the target validation loss."""

    main: dict[str, Any]
    base: dict[str, Any]
    rows: list[dict[str, Any]]
    target: float

    @property
    def by_name(self) -> dict[str, Any]:
        """Every run by name, as results.json lists them (``ftl``, ``baseline``, then the rows)."""
        return {"ftl": self.main, "baseline": self.base, **{r["name"]: r for r in self.rows}}


def federated_runs(cfg: FtlRunConfig, data: _Data, seed: _Seed, out: Path) -> _Runs:
    """Stage 3: the system, the baseline and the table rows, federated from the seed model (torch's global
    random state is left as it was); then every run's rounds to the target validation loss."""
    import torch

    sampler = cfg.federated.make_sampler()
    with torch.random.fork_rng(devices=[]):
        main = _federate(cfg, data, seed, out, sampler, "ftl", cfg.ftl, cfg.clients.key)
        base = _federate(cfg, data, seed, out, sampler, "baseline", cfg.baseline, cfg.clients.key)
        rows = [_federate(cfg, data, seed, out, sampler, v.name, v.ftl, v.clients or cfg.clients.key)
                for v in cfg.tables.variants]
    if cfg.target_loss is not None:
        target = cfg.target_loss
    elif cfg.target_from_seed is not None:
        target = cfg.target_from_seed * seed.valid_loss
    else:
        target = min(base["valid_loss"])
    for r in (main, base, *rows):
        r["rounds_to_target"] = _rounds_to(r["valid_loss"], target)
    main["label"] = cfg.label or run_name(cfg.ftl, cfg.clients.key)
    base["label"] = run_name(cfg.baseline, cfg.clients.key)
    for r, v in zip(rows, cfg.tables.variants, strict=True):
        r["label"] = run_name(v.ftl, v.clients or cfg.clients.key)
    return _Runs(main, base, rows, target)


_OPTIMISERS = {"sgd": "SGD", "adam": "Adam", "adagrad": "Adagrad", "yogi": "Yogi", "lamb": "LAMB", "lars": "LARS"}


def run_name(ftl: FtlConfig, clients: str = "speaker") -> str:
    """A federated run's human name from its config: FedAvg when the server averages, else FTL with its
    optimiser pair; the weighting, server replay and client grouping when they are not the defaults.

    >>> run_name(FtlConfig.from_dict({"server": {"name": "adam", "lr": 0.001}, "weighting": "softmax"}))
    'FTL (client SGD + server Adam, softmax weighting)'
    >>> run_name(FtlConfig.from_dict({"server": "fedavg", "weighting": "count", "replay_steps": 2}), "groups")
    'FedAvg (client SGD, count weighting, server replay 2 steps, speaker groups as clients)'
    """
    def opt(spec: Any) -> str:
        name = spec["name"] if isinstance(spec, Mapping) else str(spec)
        return _OPTIMISERS.get(name, name)

    server = opt(ftl.server)
    client = opt(ftl.client_optimizer)
    head = f"FedAvg (client {client}" if server == "fedavg" else f"FTL (client {client} + server {server}"
    weighting = f"{ftl.weighting} weighting" + (f", T = {ftl.temperature:g}" if ftl.weighting == "softmax"
                                                 and ftl.temperature != 1.0 else "")
    parts = [weighting]
    if ftl.replay_steps:
        parts.append(f"server replay {ftl.replay_steps} steps")
    if ftl.delta_clip is not None:
        parts.append(f"delta clip {ftl.delta_clip:g}")
    if clients == "groups":
        parts.append("speaker groups as clients")
    return f"{head}, {', '.join(parts)})"


# ---------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------
def run_ftl(cfg: FtlRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; write ``out/results.json`` and ``out/report.md``; return the metrics."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data = prepare_data(cfg)
    cache = out / "cache"
    seed = train_seed_model(cfg, data, cache)
    runs = federated_runs(cfg, data, seed, out)
    central = centralised_rows(cfg, data, seed, cache)
    metrics = _metrics(cfg, data, seed, runs, t_start, cache)
    write_report(cfg, out, metrics, runs.by_name, central, seed, argv)
    return metrics


def _metrics(cfg: FtlRunConfig, data: _Data, seed: _Seed, runs: _Runs, t_start: float, cache: Path
             ) -> dict[str, Any]:
    """The metrics of results.json: the system against the baseline and the seed model, and the run's sizes."""
    main, base = runs.main, runs.base
    r_main, r_base = main["rounds_to_target"], base["rounds_to_target"]
    return {
        "wer": main["wer"], "cer": main["cer"], "wer_system": main["label"], "wer_baseline_system": base["label"],
        "rounds_to_target": r_main, "rounds_to_target_baseline": r_base,
        "rounds_ratio": (r_base / r_main) if (r_main and r_base) else None,
        "wer_baseline": base["wer"], "cer_baseline": base["cer"], **_significance(data.test, main, base),
        "target_loss": runs.target,
        "valid_loss": main["valid_loss"][-1], "valid_loss_baseline": base["valid_loss"][-1],
        "wer_seed": seed.eval["wer"], "cer_seed": seed.eval["cer"], "valid_loss_seed": seed.valid_loss,
        "rounds": cfg.rounds, "server_speakers": len(data.server_speakers),
        "client_speakers": len(data.client_speakers), "clients": main["clients"], "valid_utterances": len(data.valid),
        "test_utterances": len(data.test), "test_speakers": len({e.speaker for e in data.test}), "units": data.tok.vocab_size, "seed_model_s": seed.seconds,
        "total_s": time.perf_counter() - t_start, **_seed_selection(cache, cfg.seed_model.select),
    }


def write_report(cfg: FtlRunConfig, out: Path, metrics: Mapping[str, Any], runs: Mapping[str, Any],
                 central: Mapping[str, Any], seed: _Seed, argv: Sequence[str] | None) -> None:
    """Stage 5: ``out/results.json`` (the resolved config, the metrics, every run and the centralised rows) and
    ``out/report.md``."""
    from privasr.plots import plots_section
    from privasr.results import write_results

    write_results(out, runner="ftl", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  extra={"runs": runs, "centralised": central, "argv": list(argv) if argv else None})
    (out / "report.md").write_text(_report(cfg, metrics, runs, central, seed.eval, seed.valid_loss, argv)
                                   + plots_section(out), encoding="utf-8")


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.2f}%"


def _names(m: Mapping[str, Any]) -> tuple[str, str]:
    """The system's and the baseline's human names (``wer_system``, ``wer_baseline_system``)."""
    return str(m.get("wer_system") or "the system"), str(m.get("wer_baseline_system") or "the baseline")


def _rounds_sentence(m: Mapping[str, Any], rounds: int) -> str:
    """Rounds to the target, in words (a run that never reaches it says so).

    >>> _rounds_sentence({"rounds_to_target": None, "rounds_to_target_baseline": 6, "rounds_ratio": None,
    ...                   "wer_system": "FTL", "wer_baseline_system": "FedAvg"}, 6)
    'Rounds to the target: FTL does not reach it in 6 rounds; FedAvg reaches it at round 6.'
    """
    def when(r: int | None, who: str) -> str:
        return f"{who} does not reach it in {rounds} rounds" if r is None else f"{who} reaches it at round {r}"

    system, baseline = _names(m)
    ratio = m.get("rounds_ratio")
    return (f"Rounds to the target: {when(m['rounds_to_target'], system)}; "
            f"{when(m['rounds_to_target_baseline'], baseline)}"
            + (f" ({ratio:.2f}x as many rounds for the baseline)." if ratio else "."))


def _significance_sentence(m: Mapping[str, Any]) -> str:
    """MAPSSWE of the system's test 1-best against the baseline's, in words.

    >>> _significance_sentence({"mapsswe_p": 0.147, "mapsswe_better": "same"})
    'Test WER, the system against the baseline: no significant difference (MAPSSWE p = 0.147, alpha 0.05).'
    """
    system, baseline = _names(m)
    verdict = {"system": f"{system} is better", "baseline": f"{baseline} is better"}.get(
        str(m["mapsswe_better"]), "no significant difference")
    return (f"Test WER, {system} against {baseline}: {verdict} (MAPSSWE p = {m['mapsswe_p']:.3g}, "
            "alpha 0.05).")


def _helped(m: Mapping[str, Any]) -> list[str]:
    """A plain sentence when the system does not beat the baseline or the seed model on test WER.

    >>> print(*_helped({"wer": 0.5, "wer_baseline": 0.4, "wer_seed": 0.6, "test_utterances": 57,
    ...                 "wer_system": "FTL", "wer_baseline_system": "FedAvg"}))  # doctest: +NORMALIZE_WHITESPACE
    FTL did not help on this run: its test WER 50.00% is above the baseline FedAvg's 40.00%
    (57 test utterances; small test sets move by whole words).
    """
    system, baseline = _names(m)
    worse = [f"{who}'s {_pct(m[k])}" for who, k in ((f"the baseline {baseline}", "wer_baseline"),
                                                   ("the seed model", "wer_seed"))
             if m.get(k) is not None and m["wer"] > m[k]]
    if not worse:
        return []
    return [f"{system} did not help on this run: its test WER {_pct(m['wer'])} is above {' and '.join(worse)} "
            f"({m['test_utterances']} test utterances; small test sets move by whole words)."]


def _target_origin(cfg: FtlRunConfig) -> str:
    """Where the target validation loss comes from, in words."""
    if cfg.target_loss is not None:
        return "set in the config"
    if cfg.target_from_seed is not None:
        return (f"{cfg.target_from_seed:g} times the seed model's validation loss (target_from_seed; neither run's "
                "result decides it)")
    return (f"the best the baseline reaches in its {cfg.rounds} rounds: the baseline reaches it by construction, and "
            "the question is whether the system gets there sooner")


def _report(cfg: FtlRunConfig, m: Mapping[str, Any], runs: Mapping[str, Any], central: Mapping[str, Any],
            seed_eval: Mapping[str, Any], seed_valid: float, argv: Sequence[str] | None) -> str:
    cmd = (f"Command: `{' '.join(argv)}`" if argv else
           "Run by a caller without a command line; its resolved config is `config` in results.json "
           "(`privasr ftl run --config FILE --out DIR` runs it as a file).")
    lines = [f"# Federated transfer learning: {cfg.name}", "", cmd, "",
             f"Data: {cfg.data.kind}; {m['server_speakers']} server speakers (seed model, replay), "
             f"{m['client_speakers']} client speakers, {m['valid_utterances']} validation and "
             f"{m['test_utterances']} test utterances; {m['units']} output units. {cfg.rounds} rounds, "
             f"sampler {cfg.federated.make_sampler()}, backend {cfg.federated.backend}. "
             f"Target validation loss: {m['target_loss']:.4f}, {_target_origin(cfg)}.", "",
             "| system | clients | valid loss | rounds to target | test WER | test CER |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, c in central.items():
        lines.append(f"| {name.replace('_', ' ')} | | {c['valid_loss']:.4f} | | {_pct(c['wer'])} | {_pct(c['cer'])} |")
    lines.append(f"| seed model | | {seed_valid:.4f} | | {_pct(seed_eval['wer'])} | {_pct(seed_eval['cer'])} |")
    for name, r in runs.items():
        rt = r["rounds_to_target"]
        role = {"ftl": "system, `ftl`", "baseline": "baseline, `baseline`"}.get(name, f"`{name}`")
        lines.append(f"| {r.get('label', name)} ({role}) | {r['clients']} | {r['valid_loss'][-1]:.4f} | "
                     f"{'not reached' if rt is None else rt} | {_pct(r['wer'])} | {_pct(r['cer'])} |")
    lines += ["", _rounds_sentence(m, cfg.rounds), _significance_sentence(m), *_helped(m),
              *_upload_lines(runs),
              "", f"Decoding: {cfg.eval.method}, {cfg.eval.options}. privasr {__version__}. WER on words, CER on "
              "characters with the word boundary as a character."]
    return "\n".join(lines) + "\n"
