r"""The fedlm stages of ``privasr audit`` (issue 22): what a curious server reads from federated NNLM fine-tuning.

The section (:class:`FedlmAuditSettings`, ``fedlm`` in an audit config) names a fedlm runner config
(``configs/fedlm-*.yaml`` or an inline mapping, with ``set`` overrides); :func:`prepare_fedlm` builds its main
federated run (:func:`privasr.experiments.fedlm.federation`: the clients, the pre-trained NNLM, the algorithm,
sampler and rounds). Two stages then attack it (SecAgg off: the server sees every upload):

1. :func:`audit_wordsets` -- **word-set reconstruction** from round 0 of the run without clipping or noise,
   recorded per client (:class:`~privasr.federated.audit.RecordingBackend` around the configured backend):

   * per client, the words read off the non-zero rows of its input-embedding delta against the words it trained
     on (:func:`~privasr.federated.audit.word_set_scores`): precision and recall;
   * per cohort of ``cohort`` clients, the same read off the **sum** of their deltas (what a secure-aggregation
     server unmasks, :func:`~privasr.federated.audit.cohort_word_set_scores`): the union's precision and recall,
     and the precision of attributing every found word to one member;
   * per noise multiplier ``z > 0``, each client's delta clipped to ``clip_norm`` and read after one draw of the
     Gaussian noise ``N(0, (z C)^2)`` (:func:`~privasr.federated.audit.noisy_word_set_scores`, a row is a word
     when a value exceeds 3 standard deviations): **what DP-FedAvg's noise does to a cohort of one** -- a lone
     client's single noisy release, without sampling amplification or other clients' words in the sum.

2. :func:`audit_exposure` -- **canary exposure** (Carlini et al., "The Secret Sharer"): ``canaries.n`` random
   canaries of ``canaries.template`` per repetition count are planted ``repetitions`` times each into the text
   of ``canaries.clients`` random clients (:func:`~privasr.federated.audit.plant_fedlm`); ``canaries.n`` more of
   the same format are never planted (the baseline). The planted federation is trained for the config's rounds
   once per privacy setting -- no DP (no clipping; ``no_dp``), clipping to ``clip_norm`` only (noise multiplier
   0) and each noise multiplier ``> 0`` -- and every canary's exposure is measured among ``canaries.candidates``
   random sentences of the format that nobody held, scored by log-perplexity under the final model
   (:func:`~privasr.federated.audit.sentence_log_perplexity`, :func:`~privasr.privacy.audit.exposure`). Each row
   has the accountant's epsilon (``inf`` for clipping only; ``null`` without DP). The clipped rows train with
   uniform client weights (the Gaussian mechanism's sensitivity needs them); the no-DP row with the config's.

The canary slots take the ten digit words when the model's vocabulary has them all (a PIN the client spoke);
otherwise (a vocabulary without them, e.g. the demo corpus's) ten random ordinary words of the vocabulary
(:func:`canary_format`). Canary text is encoded with the model's vocabulary (a template word it lacks is
``<unk>``, the same in every canary and candidate).

Every stage returns a JSON-able dict (non-finite floats as ``"inf"``/``null``, like ``results.json``);
:func:`wordsets_report` and :func:`exposure_report` render them as Markdown tables.

>>> s = load_fedlm_audit_settings({"config": {"data": {"kind": "nbest", "dev": "d", "test": "t"},
...                                           "nnlm": {"neural": {"checkpoint": "nnlm.pt"}}},
...                                "set": {"fedlm": {"clip_norm": 1.0, "weighting": "uniform"}}},
...                               check_files=False)
>>> s.clip_norm, s.canaries.repetitions, s.noise_multipliers
(1.0, (1, 4, 16), (0.0, 0.5, 1.0, 2.0))
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from privasr.config import Context, apply_overrides, expand_vars, from_mapping, read_config, setting, to_dict
from privasr.errors import ConfigError

__all__ = ["SECTION", "NOISE_THRESHOLD", "CanarySettings", "FedlmAuditSettings", "load_fedlm_audit_settings",
           "flatten_overrides", "fedlm_run_config", "prepare_fedlm", "canary_format", "audit_wordsets",
           "audit_exposure", "wordsets_report", "exposure_report"]

SECTION = "fedlm"
"""The audit config's section these settings are read from (errors found at run time name keys under it)."""

NOISE_THRESHOLD = 3.0
"""Standard deviations above which a noisy embedding value marks its row as a word (the noisy read-off)."""

DEFAULT_CLIP_NORM = 0.5
"""``clip_norm`` when neither the section nor the fedlm config's ``fedlm.clip_norm`` sets one."""

_ALPHABET = 10  # slot words: the ten digit words, or ten vocabulary words


# ---------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True)
class CanarySettings:
    """``fedlm.canaries``: the canaries of the exposure stage.

    ``template``: text with ``{}`` slots (:class:`~privasr.privacy.audit.CanaryFormat`), each slot one of 10 words;
    ``n``: canaries per repetition count (and unplanted baseline canaries); ``repetitions``: the copies of a
    canary each member client holds, one group of ``n`` canaries per count (distinct integers >= 1);
    ``clients``: the member clients, which hold every planted canary; ``candidates``: random sentences of the
    format, never planted, that each canary is ranked among.

    >>> from_mapping(CanarySettings, {"repetitions": [2, 1]}, "fedlm.canaries")
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'fedlm.canaries.repetitions' is [2, 1] (expected distinct increasing integers >= 1)
    """

    template: str = "my pin is {} {} {} {} {} {}"
    n: int = setting(5, min=1)
    repetitions: tuple[int, ...] = (1, 4, 16)
    clients: int = setting(1, min=1)
    candidates: int = setting(2000, min=1)

    def __config_check__(self, where: str, ctx: Context) -> None:
        from privasr.privacy.audit import CanaryFormat

        reps = list(self.repetitions)
        if not reps or any(r < 1 for r in reps) or any(b <= a for a, b in zip(reps, reps[1:], strict=False)):
            raise ConfigError(f"config key '{where}.repetitions' is {reps}",
                              expected="distinct increasing integers >= 1")
        try:
            fmt = CanaryFormat(self.template, tuple(f"w{i}" for i in range(_ALPHABET)))
        except ConfigError as e:
            raise ConfigError(f"config key '{where}.template': {e.message}", expected=e.expected) from None
        drawn = self.n * (len(reps) + 1)
        if fmt.size < drawn + self.candidates:
            raise ConfigError(f"config key '{where}.candidates' is {self.candidates}: the template's {fmt.slots} "
                              f"slot(s) of {_ALPHABET} words hold {fmt.size} sentences, {drawn} of them canaries",
                              expected=f"at most {fmt.size - drawn} candidates, or more slots")


@dataclass(frozen=True)
class FedlmAuditSettings:
    """The ``fedlm`` section of an audit config (module docstring).

    ``config``: a fedlm runner config (a YAML path, ``${PRIVASR_DATA}`` expanded, or an inline mapping; its
    ``seed`` is replaced by the audit's); ``set``: dotted overrides applied to it like ``--set`` (nested mappings
    are merged key by key: ``{fedlm: {clip_norm: 1}}`` is ``{fedlm.clip_norm: 1}``); ``backend``: where the
    clients run (``local``, ``ray`` or ``flower``'s simulation, with ``backend_options``; the recorded round of
    the word-set audit runs on local then, with the same client updates); ``noise_multipliers``: the DP rows (0: clipping
    only); ``no_dp``: also a row without clipping; ``clip_norm``: the DP clipping bound (default the config's
    ``fedlm.clip_norm``, else 0.5); ``cohort``: the clients summed in the aggregate word-set attack.

    The fedlm config is read and validated here (its errors name this section's ``config`` key, and the file).
    """

    config: Any = setting()
    set: dict[str, Any] = field(default_factory=dict)
    backend: str = setting("local", choices=("local", "ray", "flower"))
    backend_options: dict[str, Any] = field(default_factory=dict)
    canaries: CanarySettings = field(default_factory=CanarySettings)
    noise_multipliers: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
    no_dp: bool = True
    clip_norm: float | None = setting(None, gt=0.0)
    cohort: int = setting(4, min=1)

    def __config_check__(self, where: str, ctx: Context) -> FedlmAuditSettings:
        z = list(self.noise_multipliers)
        if any(not math.isfinite(v) or v < 0 for v in z) or len(set(z)) != len(z):
            raise ConfigError(f"config key '{where}.noise_multipliers' is {z}",
                              expected="distinct finite noise multipliers >= 0 (0: clipping only)")
        if not z and not self.no_dp:
            raise ConfigError(f"config key '{where}.noise_multipliers' is empty and no_dp is false",
                              expected="at least one privacy setting to train with")
        if self.backend_options and self.backend == "local":
            raise ConfigError(f"config key '{where}.backend_options': the local backend takes no options")
        cfg = fedlm_run_config(self, 0, where=where, check_files=ctx.check_files)
        if cfg is None or self.clip_norm is not None:
            return self
        return replace(self, clip_norm=float(cfg.fedlm.get("clip_norm") or DEFAULT_CLIP_NORM))


def load_fedlm_audit_settings(section: Any, *, check_files: bool = True, where: str = SECTION
                              ) -> FedlmAuditSettings:
    """Validate a ``fedlm`` audit section (errors name ``where.KEY``), reading its fedlm config.

    >>> load_fedlm_audit_settings({"config": {}, "cohort": 0}, check_files=False)
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'fedlm.cohort' is 0 (expected an integer >= 1)
    """
    return from_mapping(FedlmAuditSettings, section, where, Context(check_files))


def flatten_overrides(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted-key overrides from a possibly nested mapping (an empty mapping stays a value).

    >>> flatten_overrides({"fedlm": {"clip_norm": 1, "server": {"name": "fedavg"}}, "rounds": 2, "tables": {}})
    {'fedlm.clip_norm': 1, 'fedlm.server.name': 'fedavg', 'rounds': 2, 'tables': {}}
    """
    out: dict[str, Any] = {}
    for k, v in overrides.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten_overrides(v, key + "."))
        else:
            out[key] = v
    return out


def fedlm_run_config(settings: FedlmAuditSettings, seed: int, *, where: str = SECTION,
                     check_files: bool = True) -> Any:
    """The section's fedlm runner config, validated (:func:`~privasr.experiments.fedlm.load_fedlm_config`), with
    the ``set`` overrides applied and ``seed`` as its seed; ``None`` when ``check_files`` is off and the config
    file does not exist (nothing to validate).

    Raises:
        ConfigError: the config file is missing or not YAML (naming the file), or invalid (naming
            ``where.config`` and the fedlm config's key).
    """
    from privasr.experiments.fedlm import load_fedlm_config

    src = settings.config
    label = f"config key '{where}.config'"
    if isinstance(src, str | Path):
        path = Path(expand_vars(str(src)))
        if not check_files and not path.is_file():
            return None
        raw = read_config(path)
        label += f" ({path})"
    elif isinstance(src, Mapping):
        raw = dict(src)
    else:
        raise ConfigError(f"{label} is {src!r}", expected="a fedlm config file or an inline mapping")
    try:
        raw = apply_overrides(raw, {**flatten_overrides(settings.set), "seed": seed})
        return load_fedlm_config(raw, check_files=check_files)
    except ConfigError as e:
        raise ConfigError(f"{label}: {e.message}", path=e.path, line=e.line, expected=e.expected) from None


def prepare_fedlm(settings: FedlmAuditSettings, out: str | Path, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    """The fedlm config's main federated run with ``seed`` as its seed, built under ``out/fedlm-prepare`` (the
    pre-trained NNLM is cached in the config's ``cache_dir``, else there): the
    :class:`~privasr.federated.loop.Federation`, the model's vocabulary, and what the run is (for results.json).
    """
    from privasr.experiments.fedlm import federation

    cfg = fedlm_run_config(settings, seed)
    fed = federation(cfg, Path(out) / "fedlm-prepare")
    alg = fed.algorithm
    info = {"name": cfg.name, "config": str(settings.config) if isinstance(settings.config, str | Path) else "inline",
            "set": dict(settings.set), "seed": seed, "clients": len(fed.clients), "rounds": fed.rounds,
            "sampler": fed.sampler.to_dict(), "init": cfg.init, "vocab_size": len(alg.vocab),
            "model": alg.model_config.to_dict(), "algorithm": alg.config.to_dict(),
            "client_words": int(sum(len(s) for c in fed.clients for s in c.sentences)),
            "fedlm_config": to_dict(cfg)}
    return fed, alg.vocab, info


# ---------------------------------------------------------------------------------------------- helpers


def _rng(seed: int, stream: int) -> np.random.Generator:
    """The audit's independent random streams (the federated runs use the run's own seeding)."""
    return np.random.default_rng([seed, 22, 6, stream])


def _mean(xs: Sequence[float]) -> float:
    """The mean of the defined values (``nan`` when none is)."""
    a = np.asarray(xs, dtype=np.float64)
    return float(np.nanmean(a)) if a.size and not np.isnan(a).all() else math.nan


def _min(xs: Sequence[float]) -> float:
    """The least defined value (``nan`` when none is)."""
    a = np.asarray(xs, dtype=np.float64)
    return float(np.nanmin(a)) if a.size and not np.isnan(a).all() else math.nan


def _backend(settings: FedlmAuditSettings, *, recording: bool = False) -> Any:
    """The backend the runs use: a backend object (local, Ray), or ``"flower"`` (``run_on`` runs Flower's
    simulation with ``backend_options``). A run whose per-client uploads are recorded needs a backend object:
    with Flower it runs on local, where every client computes the same update (seeds are per round, client and
    slot)."""
    from privasr.federated.backends import make_backend

    if settings.backend == "flower":
        return make_backend("local") if recording else "flower"
    return make_backend(settings.backend, **settings.backend_options)


def _variant(fed: Any, clip_norm: float | None) -> Any:
    """The federation's algorithm without clipping (``None``) or clipped to ``clip_norm`` with uniform weights
    (what the Gaussian mechanism's sensitivity needs); the same model, vocabulary and starting weights."""
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm

    alg = fed.algorithm
    conf = replace(alg.config, clip_norm=None) if clip_norm is None else \
        replace(alg.config, clip_norm=float(clip_norm), weighting="uniform")
    return FedLmAlgorithm(conf, alg.model_config, alg.vocab, alg.init_state)


def _privacy(fed: Any, clip_norm: float, noise_multiplier: float) -> Any:
    """Fresh DP settings for one run: the Gaussian mechanism, and an accountant of the kind, delta and
    neighbouring relation of the fedlm config's ``dp`` (defaults rdp, 1e-5, and the relation its sampler needs)."""
    from privasr.federated.loop import PrivacySettings
    from privasr.privacy.dp.accounting import PrivacyAccountant
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    acct = fed.privacy.accountant if fed.privacy is not None else None
    if acct is not None:
        kind, delta, neighboring = acct.accountant, acct.target_delta, acct.neighboring
    else:  # sampling a fixed number without replacement is analysed under replace-one (as the fedlm runner)
        kind, delta = "rdp", 1e-5
        neighboring = "replace_one" if fed.sampler.kind == "without_replacement" else "add_or_remove_one"
    return PrivacySettings(GaussianMechanism(clip_norm=clip_norm, noise_multiplier=noise_multiplier),
                           PrivacyAccountant(accountant=kind, target_delta=delta, neighboring=neighboring))


def _clip(fed: Any, settings: FedlmAuditSettings) -> float:
    """The DP clipping bound: the section's, else the fedlm config's ``fedlm.clip_norm``, else 0.5."""
    clip = settings.clip_norm if settings.clip_norm is not None else fed.algorithm.config.clip_norm
    return float(clip if clip is not None else DEFAULT_CLIP_NORM)


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    from privasr.results import to_jsonable

    return to_jsonable(d)


# ---------------------------------------------------------------------------------------------- word sets


def audit_wordsets(fed: Any, settings: FedlmAuditSettings, seed: int) -> dict[str, Any]:
    """Stage 1 (module docstring): word sets read off round 0's uploads, per client, per cohort, and per noise
    multiplier after one draw of the Gaussian noise on a lone client's clipped delta.

    Returns ``{"clients", "per_client": {precision_mean, precision_min, recall_mean, recall_min,
    full_recall_share}, "cohort": {size, requested, cohorts, union_precision, union_recall,
    attribution_precision}, "noisy": [{noise_multiplier, clip_norm, threshold_sd, precision_mean, recall_mean}],
    "seconds"}``: means over clients or cohorts. The round runs without clipping (the deltas as trained); the
    noisy read-off clips each to ``clip_norm`` first, as a DP-FedAvg client would. The cohorts are disjoint
    random groups of ``cohort`` of the round's clients (all of them when fewer reported: ``size``); a found
    word attributed to a member is right with probability ``|W_i| / |union|``, the share of the union that is
    that member's words, so ``attribution_precision`` is what guessing from the sum gets.
    """
    from privasr.federated.audit import (
        RecordingBackend,
        cohort_word_set_scores,
        noisy_word_set_scores,
        sum_updates,
        word_set_scores,
    )
    from privasr.federated.backends import run_on
    from privasr.privacy.dp.clip import clip_by_norm
    from privasr.privacy.dp.mechanisms import GaussianMechanism

    t0 = time.perf_counter()
    alg = _variant(fed, None)  # the deltas as trained: clipping scales a delta, it never zeroes a row
    rec = RecordingBackend(_backend(settings, recording=True), rounds={0})
    try:
        run_on(rec, alg, fed.clients, rounds=1, sampler=fed.sampler, seed=fed.seed, min_clients=fed.min_clients)
    finally:
        rec.close()
    view = rec.views.get(0, {})
    idx = sorted(view)
    per = word_set_scores(view, fed.clients, config=alg.config)
    recalls = [r.recall for r in per]
    per_client = {"precision_mean": _mean([r.precision for r in per]), "precision_min": _min([r.precision for r in per]),
                  "recall_mean": _mean(recalls), "recall_min": _min(recalls),
                  "full_recall_share": float(np.mean([r == 1.0 for r in recalls])) if per else math.nan}

    k = min(settings.cohort, len(idx))
    order = _rng(seed, 5).permutation(idx).tolist()
    groups = [order[i:i + k] for i in range(0, len(order) - k + 1, k)] if k else []
    unions, attrib = [], []
    for g in groups:
        cs = cohort_word_set_scores(sum_updates(view[i] for i in g), [fed.clients[i] for i in g], config=alg.config)
        unions.append(cs.union)
        attrib.append(_mean([r.precision for r in cs.per_client]))
    cohort = {"size": k, "requested": settings.cohort, "cohorts": len(groups),
              "union_precision": _mean([u.precision for u in unions]), "union_recall": _mean([u.recall for u in unions]),
              "attribution_precision": _mean(attrib)}

    clip = _clip(fed, settings)
    clipped = {i: clip_by_norm(view[i].arrays, clip)[0] for i in idx}
    noisy = []
    for j, z in enumerate(v for v in settings.noise_multipliers if v > 0):
        mech = GaussianMechanism(clip_norm=clip, noise_multiplier=z)
        rng = _rng(seed, 100 + j)
        rs = [noisy_word_set_scores(clipped[i], fed.clients[i], mech, rng, threshold=NOISE_THRESHOLD,
                                    config=alg.config) for i in idx]
        noisy.append({"noise_multiplier": z, "clip_norm": clip, "threshold_sd": NOISE_THRESHOLD,
                      "precision_mean": _mean([r.precision for r in rs]), "recall_mean": _mean([r.recall for r in rs])})
    return _jsonable({"clients": len(idx), "per_client": per_client, "cohort": cohort, "noisy": noisy,
                      "seconds": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------- exposure


def canary_format(vocab: Any, template: str, rng: np.random.Generator) -> tuple[Any, str]:
    """The canary format of ``template`` for a model's vocabulary, and where its slot words come from.

    The ten digit words (:data:`~privasr.privacy.audit.DIGIT_WORDS`, ``"digits"``) when the vocabulary has all of
    them; otherwise (``"vocabulary"``) ten words drawn with ``rng`` from the vocabulary's ordinary words (not
    ``<unk>``, ``<s>``, ``</s>`` nor a word of the template), so every canary is in-vocabulary text.

    Raises:
        ConfigError: the vocabulary has fewer than ten such words.

    >>> from privasr.lm.neural.vocab import Vocabulary
    >>> from privasr.privacy.audit import DIGIT_WORDS
    >>> canary_format(Vocabulary.build([["my", "pin", *DIGIT_WORDS]]), "my pin {} {}", np.random.default_rng(0))[1]
    'digits'
    >>> fmt, source = canary_format(Vocabulary.build([list("abcdefghijkl")]), "{} {}", np.random.default_rng(0))
    >>> source, len(fmt.alphabet), set(fmt.alphabet) <= set("abcdefghijkl")
    ('vocabulary', 10, True)
    """
    from privasr.privacy.audit import DIGIT_WORDS, CanaryFormat

    if all(w in vocab for w in DIGIT_WORDS):
        return CanaryFormat(template, DIGIT_WORDS), "digits"
    literal = set(template.replace("{}", " ").split())
    special = {vocab.unk_id, vocab.bos_id, vocab.eos_id}
    words = [w for i, w in enumerate(vocab.decode(range(len(vocab)))) if i not in special and w not in literal]
    if len(words) < _ALPHABET:
        raise ConfigError(f"the model's vocabulary has neither the digit words nor {_ALPHABET} other words "
                          f"({len(words)}) for the canary slots", expected="a word-level model's vocabulary")
    pick = rng.choice(len(words), size=_ALPHABET, replace=False)
    return CanaryFormat(template, tuple(words[int(i)] for i in pick)), "vocabulary"


def _encode(vocab: Any, sentences: Sequence[str]) -> list[tuple[int, ...]]:
    return [tuple(vocab.encode(s.split())) for s in sentences]


def audit_exposure(fed: Any, settings: FedlmAuditSettings, seed: int) -> dict[str, Any]:
    """Stage 2 (module docstring): canary exposure after training, per repetition count and privacy setting.

    Returns ``{"format": {template, alphabet, source, space_size, oov_template_words}, "members", "canaries",
    "candidates", "max_exposure", "repetitions", "rows": [{setting, clip_norm, noise_multiplier, epsilon, delta,
    exposure: {REPS: mean}, baseline, extrapolated: {REPS: mean}, baseline_extrapolated, per_canary: {REPS:
    [...], "baseline": [...]}, seconds}], "seconds"}``. ``exposure`` is the rank estimate among the candidates
    (:func:`~privasr.privacy.audit.exposure`, at most ``max_exposure = log2(candidates + 1)`` bits),
    ``extrapolated`` the skew-normal extrapolation (:func:`~privasr.privacy.audit.extrapolated_exposure`);
    ``baseline`` the same for the canaries nobody held. ``epsilon``/``delta``: the accountant's after the run
    (``"inf"`` for clipping only, ``null`` without DP).
    """
    from privasr.federated.audit import plant_fedlm, sentence_log_perplexity
    from privasr.federated.backends import run_on
    from privasr.privacy.audit import exposure, extrapolated_exposure

    t0 = time.perf_counter()
    c = settings.canaries
    vocab = fed.algorithm.vocab
    n_clients = len(fed.clients)
    if c.clients > n_clients:
        raise ConfigError(f"config key '{SECTION}.canaries.clients' is {c.clients} but the federation has "
                          f"{n_clients} clients", expected=f"at most {n_clients}")
    fmt, source = canary_format(vocab, c.template, _rng(seed, 1))
    reps = list(c.repetitions)
    draw = _rng(seed, 2)
    canaries = fmt.sample(draw, c.n * (len(reps) + 1))
    candidates = fmt.random_candidates(draw, c.candidates, exclude=canaries)
    planted, baseline = canaries[:c.n * len(reps)], canaries[c.n * len(reps):]
    members = sorted(int(i) for i in _rng(seed, 3).choice(n_clients, size=c.clients, replace=False))
    clients = plant_fedlm(fed.clients, _encode(vocab, planted), members, [r for r in reps for _ in range(c.n)],
                          _rng(seed, 4))
    scored = _encode(vocab, [*planted, *baseline, *candidates])
    clip = _clip(fed, settings)
    plans: list[tuple[str, float | None, float | None]] = [("no DP", None, None)] if settings.no_dp else []
    plans += [("clipping only" if z == 0 else "DP", clip, float(z)) for z in settings.noise_multipliers]

    backend = _backend(settings)
    rows = []
    try:
        for name, clip_norm, z in plans:
            t1 = time.perf_counter()
            alg = _variant(fed, clip_norm)
            privacy = None if z is None or clip_norm is None else _privacy(fed, clip_norm, z)
            res = run_on(backend, alg, clients, options=settings.backend_options if backend == "flower" else None,
                         rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed,
                         min_clients=fed.min_clients, privacy=privacy)
            nll = sentence_log_perplexity(alg, res.state["params"], scored)
            k = len(planted) + len(baseline)
            cand = nll[k:]
            exp = np.asarray(exposure(nll[:k], cand, fmt.size))
            ext = np.asarray(extrapolated_exposure(nll[:k], cand, fmt.size))
            groups = {str(r): slice(g * c.n, (g + 1) * c.n) for g, r in enumerate(reps)}
            base = slice(len(planted), k)
            rows.append({
                "setting": name, "clip_norm": clip_norm, "noise_multiplier": z,
                "epsilon": None if privacy is None else float(privacy.accountant.epsilon()),
                "delta": None if privacy is None else float(privacy.accountant.target_delta),
                "exposure": {r: float(exp[s].mean()) for r, s in groups.items()},
                "baseline": float(exp[base].mean()),
                "extrapolated": {r: float(ext[s].mean()) for r, s in groups.items()},
                "baseline_extrapolated": float(ext[base].mean()),
                "per_canary": {**{r: exp[s].tolist() for r, s in groups.items()}, "baseline": exp[base].tolist()},
                "seconds": time.perf_counter() - t1})
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    literal = c.template.replace("{}", " ").split()
    return _jsonable({
        "format": {"template": c.template, "alphabet": list(fmt.alphabet), "source": source, "space_size": fmt.size,
                   "oov_template_words": [w for w in literal if w not in vocab]},
        "members": members, "canaries": c.n, "candidates": c.candidates,
        "max_exposure": math.log2(c.candidates + 1), "repetitions": reps, "rows": rows,
        "seconds": time.perf_counter() - t0})


# ---------------------------------------------------------------------------------------------- report


def _num(v: Any, fmt: str = ".3f") -> str:
    if v is None:
        return "-"
    return v if isinstance(v, str) else format(v, fmt)


def wordsets_report(w: Mapping[str, Any]) -> list[str]:
    """Markdown lines for :func:`audit_wordsets`'s result.

    >>> lines = wordsets_report({"clients": 3, "per_client": {"precision_mean": 1.0, "precision_min": 1.0,
    ...     "recall_mean": 1.0, "recall_min": 1.0, "full_recall_share": 1.0}, "cohort": {"size": 3, "requested": 4,
    ...     "cohorts": 1, "union_precision": 1.0, "union_recall": 1.0, "attribution_precision": 0.333},
    ...     "noisy": []})
    >>> print(lines[4])
    | each client's own delta (3 clients) | 1.000 (min 1.000) | 1.000 (min 1.000) | 1.000 |
    """
    p, co = w["per_client"], w["cohort"]
    lines = ["Word sets read off the non-zero input-embedding rows of round 0's deltas (secure aggregation off).",
             "", "| what the server reads | precision | recall | clients with recall 1 |", "|---|---:|---:|---:|",
             f"| each client's own delta ({w['clients']} clients) | {_num(p['precision_mean'])} "
             f"(min {_num(p['precision_min'])}) | {_num(p['recall_mean'])} (min {_num(p['recall_min'])}) | "
             f"{_num(p['full_recall_share'])} |",
             f"| the sum of a cohort of {co['size']} ({co['cohorts']} cohorts), against the union | "
             f"{_num(co['union_precision'])} | {_num(co['union_recall'])} | |",
             f"| the same sum, every found word attributed to one member | {_num(co['attribution_precision'])} "
             "| | |"]
    for r in w["noisy"]:
        lines.append(f"| one client's delta clipped to {r['clip_norm']:g} + Gaussian noise z = "
                     f"{r['noise_multiplier']:g} (a cohort of one, {r['threshold_sd']:g}-sd read-off) | "
                     f"{_num(r['precision_mean'])} | {_num(r['recall_mean'])} | |")
    return lines + [""]


def exposure_report(e: Mapping[str, Any]) -> list[str]:
    """Markdown lines for :func:`audit_exposure`'s result: mean exposure (bits) per repetition count and privacy
    setting, the unplanted baseline beside it.

    >>> lines = exposure_report({"format": {"template": "pin {} {}", "source": "digits", "space_size": 100},
    ...     "members": [0], "canaries": 2, "candidates": 50, "max_exposure": 5.67, "repetitions": [1, 4],
    ...     "rows": [{"setting": "no DP", "clip_norm": None, "noise_multiplier": None, "epsilon": None,
    ...               "delta": None, "exposure": {"1": 2.0, "4": 5.0}, "baseline": 1.1}]})
    >>> lines[-2]
    '| no DP | - | - | - | 2.00 | 5.00 | 1.10 |'
    """
    f = e["format"]
    reps = [str(r) for r in e["repetitions"]]
    lines = [f"Canary exposure (bits): {e['canaries']} canaries of `{f['template']}` ({f['source']} slot words, "
             f"|R| = {f['space_size']:,}) per repetition count, planted in {len(e['members'])} client(s); ranked "
             f"among {e['candidates']:,} random candidates (at most {e['max_exposure']:.2f} bits measurable). "
             "Baseline: canaries nobody held.", "",
             "| setting | clip | noise | epsilon | " + " | ".join(f"{r}x" for r in reps) + " | baseline |",
             "|---|---:|---:|---:|" + "---:|" * (len(reps) + 1)]
    for r in e["rows"]:
        eps = "-" if r["delta"] is None else f"{_num(r['epsilon'], '.3g')} (delta {r['delta']:.0e})"
        cells = [r["setting"], _num(r["clip_norm"], "g"), _num(r["noise_multiplier"], "g"), eps,
                 *(_num(r["exposure"][k], ".2f") for k in reps), _num(r["baseline"], ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
