"""The FMP experiment (paper 000, section 3): generic-NNLM rescoring vs federated marginal personalisation.

``privasr fmp run --config configs/fmp-ami.yaml --out DIR`` does, on an N-best set with dev and test parts:

1. **The server's NNLM** is trained on generic background text only (``generic-train``: Gutenberg +
   Earnings-21, the first pass's own corpus; never the evaluation domain) or loaded from a checkpoint, exactly
   like a rescoring config's ``neural`` LM (:mod:`privasr.rescore.run`), cached in ``cache_dir``. The
   background unigram ``u(w)`` is the add-one estimate over the NNLM's vocabulary from the same text.
2. **The baseline** is generic-NNLM rescoring: ``am + w_lm * first-pass LM + w_nnlm * ln P_nnlm + wp * n`` with
   the weights tuned on dev WER (coordinate descent; paper 000 fixes the interpolation at 0.5, we tune it).
3. **FMP** (:mod:`privasr.federated.algorithms.fmp`) runs through the federated loop
   (:func:`privasr.federated.loop.run_federated`, any backend) with the clients' utterances (meetings or
   speakers) in time order, split into ``T + 1`` groups; group ``t`` is rescored in round ``t`` with the NNLM
   rescaled by the marginals known then. The adapted score of a hypothesis is the baseline score plus
   ``w_nnlm * lam * sum_w ln(g_i(w) / u(w))`` (eq. 1, unnormalised, scaled like the NNLM score; with
   ``normalize: true`` the rescaled NNLM is renormalised exactly at every history, :func:`nnlm_normalizer`,
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
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.federated.algorithms.fmp_data import background_unigram, build_clients, dp_settings

__all__ = ["FmpRunConfig", "load_fmp_config", "run_fmp", "simulate", "nnlm_normalizer"]

_TOP = ("name", "seed", "data", "clients", "nnlm", "background", "cache_dir", "combine", "search", "oracle_cache",
        "fmp", "lam_grid", "lam2_grid", "bigram_prior", "normalize", "dp", "federated", "tables", "eval")
_FMP_KEYS = ("alpha", "beta", "sigma", "smoothing", "refresh", "send", "rounds", "qbar_threshold", "order", "beta2",
             "smoothing2")
_DP_KEYS = ("epsilon", "unit", "cap", "accountant", "delta", "threshold_sd")
_TABLE_KEYS = ("rounds", "hyper", "epsilon", "bigram")


@dataclass(frozen=True)
class FmpRunConfig:
    """A validated FMP experiment config (:func:`load_fmp_config`); ``raw`` is the resolved dict."""

    name: str
    seed: int
    dev: Path | None
    test: Path | None
    nbest: Path | None
    split: tuple[str, str] | None
    prior: str
    first_pass_lm: bool
    client_key: str
    nnlm: Any
    cache_dir: Path | None
    search: Any
    fmp: dict[str, Any]
    rounds: int
    lam_grid: tuple[float, ...]
    dp: dict[str, Any] | None
    backend: str
    backend_options: dict[str, Any]
    sampler: Any
    min_clients: int
    tables: dict[str, Any]
    bootstrap_resamples: int
    raw: Mapping[str, Any] = field(repr=False)
    oracle_cache: bool = False
    lam2_grid: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0)
    bigram_prior: float = 10.0
    normalize: bool = False


def _floats(v: Any, where: str, lo: float | None = None) -> tuple[float, ...]:
    vals = v if isinstance(v, list | tuple) else [v]
    out = []
    for x in vals:
        if isinstance(x, bool) or not isinstance(x, int | float) or not np.isfinite(x) or (lo is not None and x < lo):
            raise ConfigError(f"config key {where!r} holds {x!r}", expected="finite numbers" +
                              (f" >= {lo}" if lo is not None else ""))
        out.append(float(x))
    if not out:
        raise ConfigError(f"config key {where!r} is empty", expected="at least one value")
    return tuple(out)


def load_fmp_config(config: Mapping[str, Any], *, check_files: bool = True) -> FmpRunConfig:
    """Validate an FMP config (see ``configs/fmp-ami.yaml``) before any work starts; unknown keys are errors."""
    from privasr.federated.algorithms.fmp import FmpConfig
    from privasr.rescore.run import (
        SearchConfig,
        _int,
        _mapping,
        _path,
        _ranges,
        _str,
        expand_vars,
        federation_settings,
        server_nnlm,
    )

    raw = _mapping(copy.deepcopy(dict(config)), "config", _TOP)
    name = _str(raw.get("name", "fmp"), "name")
    seed = _int(raw.get("seed", 0), "seed", 0)
    data = _mapping(raw.get("data"), "data", ("dev", "test", "nbest", "split"))
    dev = test = nbest = None
    split = None
    if "nbest" in data:
        if "dev" in data or "test" in data:
            raise ConfigError("config key 'data' has nbest and dev/test", expected="either {dev, test} or "
                                                                            "{nbest, split: {key, dev}}")
        nbest = _path(expand_vars(str(data["nbest"])), "data.nbest", check_files)
        sp = _mapping(data.get("split", {}), "data.split", ("key", "dev"))
        split = (_str(sp.get("key", "speaker"), "data.split.key", ("speaker", "client")),
                 _str(sp.get("dev", "even"), "data.split.dev", ("even", "odd")))
    elif "dev" in data and "test" in data:
        dev = _path(expand_vars(str(data["dev"])), "data.dev", check_files)
        test = _path(expand_vars(str(data["test"])), "data.test", check_files)
    else:
        raise ConfigError("config key 'data' needs dev and test (or nbest and split)",
                          expected="{dev: PATH, test: PATH} or {nbest: PATH, split: {key: speaker, dev: even}}")
    comb = _mapping(raw.get("combine", {}), "combine", ("prior", "first_pass_lm"))
    prior = _str(comb.get("prior", "am"), "combine.prior", ("am", "rank", "uniform"))
    fpl = comb.get("first_pass_lm", True)
    if not isinstance(fpl, bool):
        raise ConfigError(f"config key 'combine.first_pass_lm' is {fpl!r}", expected="true or false")
    clients = _mapping(raw.get("clients", {}), "clients", ("key",))
    key = _str(clients.get("key", "client"), "clients.key", ("client", "speaker"))
    nnlm, cache_dir = server_nnlm(raw, check_files)
    s = _mapping(raw.get("search", {}), "search", ("ranges", "max_rounds", "coarse_points", "restarts"))
    search = SearchConfig(method="coordinate", ranges=_ranges(s.get("ranges", {})),
                          max_rounds=_int(s.get("max_rounds", 20), "search.max_rounds", 1),
                          coarse_points=_int(s.get("coarse_points", 7), "search.coarse_points", 2),
                          restarts=_int(s.get("restarts", 3), "search.restarts", 0))
    f = _mapping(raw.get("fmp", {}), "fmp", _FMP_KEYS)
    rounds = _int(f.pop("rounds", 10), "fmp.rounds", 0)
    try:
        FmpConfig.from_dict({**f, "lam": 1.0})
    except ConfigError as e:
        raise ConfigError(f"config key 'fmp': {e.message}", expected=e.expected) from None
    lam_grid = _floats(raw.get("lam_grid", [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0]), "lam_grid", 0.0)
    dp = None
    if raw.get("dp") is not None:
        dp = _mapping(raw["dp"], "dp", _DP_KEYS)
        dp["epsilon"] = _floats(dp.get("epsilon"), "dp.epsilon", 1e-9)[0] if "epsilon" in dp else None
        if dp["epsilon"] is None:
            raise ConfigError("config key 'dp' needs epsilon", expected="{epsilon: 1.0, unit: utterance}")
        dp["unit"] = _str(dp.get("unit", "utterance"), "dp.unit", ("utterance", "user"))
        dp["cap"] = _floats(dp.get("cap", 1.0), "dp.cap", 1e-12)[0]
        dp["accountant"] = _str(dp.get("accountant", "pld"), "dp.accountant", ("pld", "rdp"))
        dp["delta"] = _floats(dp.get("delta", 1e-5), "dp.delta", 0.0)[0]
        dp["threshold_sd"] = _floats(dp.get("threshold_sd", 3.0), "dp.threshold_sd", 0.0)[0]
    backend, backend_options, sampler, min_clients = federation_settings(raw)
    t = _mapping(raw.get("tables", {}), "tables", _TABLE_KEYS)
    tables: dict[str, Any] = {}
    if "rounds" in t:
        tables["rounds"] = [_int(x, "tables.rounds", 0) for x in (t["rounds"] or [])]
    if "hyper" in t:
        hyper = t["hyper"] or []
        if not isinstance(hyper, list):
            raise ConfigError("config key 'tables.hyper' must be a list", expected="[{alpha: .., beta: .., sigma: ..}]")
        for k, h in enumerate(hyper):
            hm = _mapping(h, f"tables.hyper[{k}]", ("alpha", "beta", "sigma"))
            try:
                FmpConfig.from_dict({**f, **hm, "lam": 1.0})
            except ConfigError as e:
                raise ConfigError(f"config key 'tables.hyper[{k}]': {e.message}", expected=e.expected) from None
        tables["hyper"] = hyper
    if "epsilon" in t:
        tables["epsilon"] = list(_floats(t["epsilon"], "tables.epsilon", 1e-9))
    if "bigram" in t:
        tables["bigram"] = [_int(x, "tables.bigram", 0) for x in (t["bigram"] or [])]
    lam2_grid = _floats(raw.get("lam2_grid", [0.0, 0.1, 0.25, 0.5, 1.0, 2.0]), "lam2_grid", 0.0)
    bigram_prior = _floats(raw.get("bigram_prior", 10.0), "bigram_prior", 1e-12)[0]
    ev = _mapping(raw.get("eval", {}), "eval", ("bootstrap_resamples",))
    resamples = _int(ev.get("bootstrap_resamples", 1000), "eval.bootstrap_resamples", 1)
    oracle = raw.get("oracle_cache", False)
    if not isinstance(oracle, bool):
        raise ConfigError(f"config key 'oracle_cache' is {oracle!r}", expected="true or false")
    normalize = raw.get("normalize", False)
    if not isinstance(normalize, bool):
        raise ConfigError(f"config key 'normalize' is {normalize!r}", expected="true or false")
    if normalize and oracle:
        raise ConfigError("config keys 'normalize' and 'oracle_cache' cannot both be true",
                          expected="the exactly normalised variant on the decoded lists only")
    return FmpRunConfig(name, seed, dev, test, nbest, split, prior, fpl, key, nnlm, cache_dir, search, f, rounds,
                        lam_grid, dp, backend, backend_options, sampler, min_clients, tables, resamples, raw, oracle,
                        lam2_grid, bigram_prior, normalize)


# ------------------------------------------------------------------------------------------- building blocks


@dataclass
class _Prepared:
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


def _prepare(cfg: FmpRunConfig, out: Path) -> _Prepared:
    from privasr.corpus.sources import load_text
    from privasr.rescore.combine import Combination, LMScoreCache, score_table
    from privasr.rescore.run import _load_nbest, build_lm, build_space, split_by_key
    from privasr.rescore.search import DevObjective, tune

    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    if cfg.nbest is not None:
        assert cfg.split is not None
        dev, test, dev_keys, test_keys = split_by_key(_load_nbest(cfg.nbest, None), *cfg.split)
        info["split"] = {"key": cfg.split[0], "dev": dev_keys, "test": test_keys}
        if not dev or not test:
            raise InputError(f"the {cfg.split[0]} split leaves an empty dev or test set", path=cfg.nbest)
    else:
        assert cfg.dev is not None and cfg.test is not None
        dev = _load_nbest(cfg.dev, None)
        test = _load_nbest(cfg.test, None)
    needed = (["am"] if cfg.prior == "am" else []) + (["lm"] if cfg.first_pass_lm else [])
    for name, recs in (("dev", dev), ("test", test)):
        for nb in recs:
            if nb.ref is None:
                raise InputError(f"{name} utterance {nb.utt_id} has no reference",
                                 expected="references (WER is measured and lam is tuned on dev)")
            if any(k not in h.scores for h in nb.hyps for k in needed):
                raise InputError(f"{name} utterance {nb.utt_id} has a hypothesis without {'/'.join(needed)} scores",
                                 expected="those first-pass scores on every hypothesis, or combine.prior: rank "
                                          "and combine.first_pass_lm: false for rank-only lists")
    info["load_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    cache_dir = cfg.cache_dir if cfg.cache_dir is not None else out / "lm"
    lm, lm_info = build_lm(cfg.nnlm, cache_dir)
    info["nnlm"] = lm_info
    info["nnlm_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    train = cfg.nnlm.neural.get("train")
    text_src = cfg.raw.get("background") or (train["text"] if train else "generic-train")
    u = background_unigram(load_text(text_src), lm.vocab)
    info["background_text"] = text_src
    cache = LMScoreCache(lm)
    dev_table = score_table(dev, {"nnlm": cache})
    test_table = score_table(test, {"nnlm": cache})
    info["score_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    comb = Combination(prior=cfg.prior, lms=(("lm",) if cfg.first_pass_lm else ()) + ("nnlm",))
    space = build_space(comb, cfg.search)
    res = tune(dev, dev_table, comb, space, method="coordinate", max_rounds=cfg.search.max_rounds,
               coarse_points=cfg.search.coarse_points, restarts=cfg.search.restarts)
    info["tune_s"] = time.perf_counter() - t0
    info["dev_errors_baseline"] = res.errors
    info["dev_errors_first_pass"] = res.baseline_errors
    obj = DevObjective.from_nbests(dev, dev_table)
    bigram = None
    if cfg.fmp.get("order", 1) == 2 or "bigram" in cfg.tables:
        from privasr.federated.algorithms.fmp import BackgroundBigram

        unk = lm.vocab.unk_id
        bigram = BackgroundBigram.from_sentences(
            [[i for i in lm.vocab.encode(s) if i != unk] for s in load_text(text_src)], len(lm.vocab),
            prior=cfg.bigram_prior)
    return _Prepared(dev, test, lm.vocab, u, comb.totals(dev_table, res.weights), comb.totals(test_table, res.weights),
                     np.asarray(dev_table.offsets), np.asarray(test_table.offsets), np.asarray(obj.hyp_errors),
                     dict(res.weights), info, bigram, lm)


def _privacy(dp: Mapping[str, Any] | None, composition: str) -> Any:
    if dp is None:
        return None
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import LaplaceMechanism

    return PrivacySettings(LaplaceMechanism(sensitivity=dp["cap"], epsilon=dp["epsilon"]),
                           PrivacyAccountant(accountant=dp["accountant"], target_delta=dp["delta"]), composition)


def simulate(clients: Sequence[Any], u: np.ndarray, fmp: Mapping[str, Any], lam: float, rounds: int, *, seed: int,
             dp: Mapping[str, Any] | None = None, sampler: Any = None, backend: Any = None, min_clients: int = 1,
             checkpoint_dir: Path | None = None, flower_options: Mapping[str, Any] | None = None,
             shift: int = 0, bigram: Any = None, normalizer: Any = None
             ) -> tuple[dict[str, int], list[Any], dict[str, Any]]:
    """Run FMP over ``clients`` for ``rounds + 1`` rounds; return ``{utt_id: chosen index}``, the round history
    and privacy figures (``epsilon``, ``delta`` when ``dp`` is set). ``backend`` is a backend object, ``None``
    (local) or ``"flower"`` (:func:`~privasr.federated.backends.flower.run_flower` with ``flower_options``)."""
    from privasr.federated.algorithms.fmp import FmpAlgorithm, FmpConfig
    from privasr.federated.backends import run_on
    from privasr.federated.sampling import AllClients

    cfg = dict(fmp) if dp is None else dp_settings(fmp, dp, rounds)
    conf = FmpConfig.from_dict({**cfg, "lam": lam})
    alg = FmpAlgorithm(conf, u, bigram, normalizer)
    privacy = _privacy(dp, conf.privacy_composition())
    res = run_on(backend, alg, clients, options=flower_options if backend == "flower" else None,
                 checkpoint_dir=checkpoint_dir, rounds=rounds + 1, sampler=sampler or AllClients(), seed=seed,
                 min_clients=min_clients, privacy=privacy)
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


def nnlm_normalizer(lm: Any, nbests: Sequence[NBest]) -> Any:
    """The ``normalizer`` of :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm` for a
    :class:`~privasr.lm.neural.scorer.NeuralLM`: per hypothesis ``sum_k ln Z(h_k)`` computed as
    ``ln P(s) + sum_k f(w_k) - ln P'(s)``, with ``P'`` the NNLM with the log-bias ``f`` renormalised exactly at
    every history (``NeuralLM.with_bias(f, renormalize=True)``). The special words (``<unk>``, ``<s>``, ``</s>``)
    keep factor 0, as in the unnormalised rescaling."""
    words = {nb.utt_id: [h.words for h in nb.hyps] for nb in nbests}
    specials = np.array([lm.vocab.unk_id, lm.vocab.bos_id, lm.vocab.eos_id])
    # the unbiased scores and the word ids of an utterance do not change between calls (rounds, lam values)
    fixed: dict[str, tuple[np.ndarray, list[np.ndarray]]] = {}

    def normalizer(utt: Any, f: np.ndarray) -> np.ndarray:
        g = np.array(f, dtype=np.float64)
        g[specials] = 0.0
        hyps = words[utt.utt_id]
        if utt.utt_id not in fixed:
            fixed[utt.utt_id] = (np.array([s.ln_total for s in lm.score_batch(hyps)]),
                                 [np.asarray(lm.vocab.encode(h), dtype=np.int64) for h in hyps])
        plain, ids = fixed[utt.utt_id]
        ren = np.array([s.ln_total for s in lm.with_bias(g, renormalize=True).score_batch(hyps)])
        bias = np.array([g[i].sum() for i in ids])
        return plain + bias - ren

    return normalizer


def _errors(chosen: Mapping[str, int], nbests: Sequence[NBest], offsets: np.ndarray, hyp_errors: np.ndarray) -> int:
    total = 0
    for k, nb in enumerate(nbests):
        total += int(hyp_errors[offsets[k] + chosen.get(nb.utt_id, 0)])
    return total


def _words(chosen: Mapping[str, int], nbests: Sequence[NBest]) -> list[tuple[str, ...]]:
    return [nb.hyps[chosen.get(nb.utt_id, 0)].words for nb in nbests]


def _select(totals: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return np.array([int(np.argmax(totals[offsets[k]:offsets[k + 1]])) for k in range(len(offsets) - 1)])


# ------------------------------------------------------------------------------------------------- the run


def run_fmp(cfg: FmpRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run a validated FMP config; write ``out/results.json`` and ``out/report.md``; return the metrics."""
    from privasr.federated.backends import make_backend
    from privasr.metrics import mapsswe, paired_bootstrap, wer, word_hit_changes
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    p = _prepare(cfg, out)
    bw = p.bias_weight
    oc = cfg.oracle_cache
    shift = 1 if oc else 0
    fmp_cfg = {**cfg.fmp, "sigma": 0.1} if oc else cfg.fmp
    dev_clients = build_clients(p.dev, p.dev_totals, p.dev_offsets, p.vocab, cfg.client_key, cfg.rounds, bw, oc)
    test_clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, cfg.client_key, cfg.rounds, bw, oc)

    norm = nnlm_normalizer(p.lm, [*p.dev, *p.test]) if cfg.normalize else None
    # lam on dev (no DP: the tuning set stands for a small, consented validation set)
    t0 = time.perf_counter()
    lam_trace = []
    for lam in cfg.lam_grid:
        chosen, _, _ = simulate(dev_clients, p.u, {**fmp_cfg, "order": 1}, lam, cfg.rounds, seed=cfg.seed,
                                shift=shift, normalizer=norm)
        lam_trace.append({"lam": lam, "dev_errors": _errors(chosen, p.dev, p.dev_offsets, p.dev_hyp_errors)})
    best = min(lam_trace, key=lambda r: (r["dev_errors"], r["lam"]))
    lam = best["lam"]
    # lam2 (personal bigrams) on dev with lam fixed, when the run or a table uses them
    lam2_trace: list[dict[str, Any]] = []
    if p.bigram is not None:
        for lam2 in cfg.lam2_grid:
            chosen, _, _ = simulate(dev_clients, p.u, {**fmp_cfg, "order": 2, "lam2": lam2}, lam, cfg.rounds,
                                    seed=cfg.seed, shift=shift, bigram=p.bigram, normalizer=norm)
            lam2_trace.append({"lam2": lam2, "dev_errors": _errors(chosen, p.dev, p.dev_offsets, p.dev_hyp_errors)})
        lam2 = min(lam2_trace, key=lambda r: (r["dev_errors"], r["lam2"]))["lam2"]
        fmp_cfg = {**fmp_cfg, "lam2": lam2}
    tune_s = time.perf_counter() - t0

    # test
    t0 = time.perf_counter()
    backend = make_backend(cfg.backend, **cfg.backend_options) if cfg.backend != "flower" else "flower"
    try:
        chosen, history, priv = simulate(test_clients, p.u, fmp_cfg, lam, cfg.rounds, seed=cfg.seed, dp=cfg.dp,
                                         sampler=cfg.sampler, backend=backend, min_clients=cfg.min_clients,
                                         checkpoint_dir=out / "checkpoint",
                                         flower_options=cfg.backend_options, shift=shift, bigram=p.bigram,
                                         normalizer=norm)
    finally:
        if backend != "flower":
            backend.close()
    fmp_s = time.perf_counter() - t0
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
                          resamples=cfg.bootstrap_resamples)
    metrics: dict[str, Any] = {
        "wer": w_new.wer, "wer_baseline": w_base.wer,
        "wer_rel_change": (w_new.wer - w_base.wer) / w_base.wer if w_base.wer else 0.0,
        "mapsswe_p": mp.p, "mapsswe_z": mp.z, "mapsswe_better": {"A": "fmp", "B": "baseline", "same": "same"}[mp.better],
        "rounds": cfg.rounds, "lam": lam, "wer_first_pass": w_first.wer,
        "bootstrap_ci_low": bs.ci_low, "bootstrap_ci_high": bs.ci_high,
        "bootstrap_prob_improvement": bs.prob_a_better,
        "test_utterances": len(p.test), "test_clients": len(test_clients), "dev_clients": len(dev_clients),
        "changed_vs_baseline": int(sum(a != b for a, b in zip(fmp_words, base_words, strict=True))),
        "weights_baseline": p.weights, "lam_trace": lam_trace, "fmp_score_weight": p.bias_weight,
        "oracle_cache": cfg.oracle_cache, "order": int(cfg.fmp.get("order", 1)), "normalized": cfg.normalize,
        # which reference words FMP gets right more / less often than the baseline (what the WER change is made of)
        "word_changes": word_hit_changes(refs, fmp_words, base_words).to_dict(),
    }
    if lam2_trace:
        metrics.update(lam2=fmp_cfg["lam2"], lam2_trace=lam2_trace)
    metrics.update(priv)
    tables: dict[str, Any] = {}
    if cfg.tables:
        t1 = time.perf_counter()
        tables = _tables(cfg, p, lam, fmp_cfg.get("lam2"), refs, base_words, ids, norm)
        metrics["tables_s"] = time.perf_counter() - t1
    metrics.update(nnlm_s=p.info["nnlm_s"], score_s=p.info["score_s"], tune_baseline_s=p.info["tune_s"],
                   tune_lam_s=tune_s, fmp_s=fmp_s, total_s=time.perf_counter() - t_start)
    data = {"nbest": cfg.nbest} if cfg.nbest is not None else {"dev": cfg.dev, "test": cfg.test}
    extra = {"nnlm": p.info["nnlm"], "split": p.info.get("split"), "history": [h.to_dict() for h in history], "tables": tables,
             "command": list(argv) if argv is not None else None}
    write_results(out, config=dict(cfg.raw), seed=cfg.seed, metrics=metrics, data=data, extra=extra)
    (out / "report.md").write_text(_report(cfg, metrics, tables), encoding="utf-8")
    return metrics


def _tables(cfg: FmpRunConfig, p: _Prepared, lam: float, lam2: float | None, refs: Any, base_words: Any,
            ids: Any, norm: Any = None) -> dict[str, Any]:
    from privasr.metrics import mapsswe, wer

    def row(fmp: Mapping[str, Any], rounds: int, dp: Mapping[str, Any] | None) -> dict[str, Any]:
        clients = build_clients(p.test, p.test_totals, p.test_offsets, p.vocab, cfg.client_key, rounds,
                                p.bias_weight, cfg.oracle_cache)
        fmp = {**fmp, "sigma": 0.1} if cfg.oracle_cache else fmp
        if lam2 is not None and "lam2" not in fmp:
            fmp = {**fmp, "lam2": lam2}
        chosen, _, priv = simulate(clients, p.u, fmp, lam, rounds, seed=cfg.seed, dp=dp,
                                   shift=1 if cfg.oracle_cache else 0, bigram=p.bigram, normalizer=norm)
        words = _words(chosen, p.test)
        w = wer(refs, words).wer
        mp = mapsswe(refs, words, base_words, ids=ids)
        return {"wer": w, "mapsswe_p": mp.p, "better": mp.better, **priv}

    tables: dict[str, Any] = {}
    if "rounds" in cfg.tables:
        tables["rounds"] = [{"T": t, **row(cfg.fmp, t, None)} for t in cfg.tables["rounds"]]
    if "hyper" in cfg.tables:
        tables["hyper"] = [{**h, **row({**cfg.fmp, **h}, cfg.rounds, None)} for h in cfg.tables["hyper"]]
    if "bigram" in cfg.tables:
        tables["bigram"] = [{"T": t, "lam2": lam2, **row({**cfg.fmp, "order": 2, "lam2": lam2}, t, None)}
                            for t in cfg.tables["bigram"]]
    if "epsilon" in cfg.tables:
        base_dp = dict(cfg.dp or {"unit": "utterance", "cap": 1.0, "accountant": "pld", "delta": 1e-5,
                                  "threshold_sd": 3.0})
        tables["epsilon"] = [{"epsilon_target": e, **row(cfg.fmp, cfg.rounds, {**base_dp, "epsilon": e})}
                             for e in cfg.tables["epsilon"]]
    return tables


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _report(cfg: FmpRunConfig, m: Mapping[str, Any], tables: Mapping[str, Any]) -> str:
    lines = [f"# {cfg.name}", "", f"privasr {__version__}, seed {cfg.seed}, clients by {cfg.client_key}, "
             f"T = {cfg.rounds}, lam = {m['lam']:g} (tuned on dev)", "",
             "| system | test WER |", "|---|---|",
             f"| first pass | {_pct(m['wer_first_pass'])} |",
             f"| generic NNLM rescoring (baseline) | {_pct(m['wer_baseline'])} |",
             f"| FMP | {_pct(m['wer'])} ({100 * m['wer_rel_change']:+.2f}% rel., MAPSSWE p = {m['mapsswe_p']:.3g}) |",
             ""]
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
    for name, rows in tables.items():
        if not rows:
            continue
        keys = [k for k in rows[0] if k not in ("better",)]
        lines += [f"## {name}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in rows:
            lines.append("| " + " | ".join(_pct(r[k]) if k == "wer" else (f"{r[k]:.3g}" if isinstance(r[k], float)
                                                                           else str(r[k])) for k in keys) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"
