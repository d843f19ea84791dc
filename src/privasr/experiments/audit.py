"""The empirical privacy audit behind ``privasr audit`` (issue 22): measure what a release or a curious server
actually learns, beside what the accountant promises.

Stages (each runs when its config section is present):

1. :func:`audit_anonymisation` (section ``anon``): held-out text with gold entity spans (the Earnings-21 test
   calls, ASR-style, or the demo corpus's test transcripts), the configured detector, surrogate anonymisation;
   the share of gold mentions with a word left, per label (:func:`~privasr.anon.ner_metrics.leak_counts`), and
   person-name canaries planted in the same documents (:mod:`privasr.anon.canaries`: names a gazetteer lists
   and made-up ones it cannot), counted after anonymisation.
2. :func:`audit_fmp` (section ``fmp``): FMP's clients and algorithm from an FMP runner config
   (:func:`privasr.experiments.fmp.federation`), rare words no client uses planted in clients
   (:func:`~privasr.federated.audit.plant_fmp`), and three membership games whose error rates become an
   empirical epsilon lower bound (:func:`~privasr.privacy.audit.threshold_attack`, Clopper-Pearson):

   * ``uploads``: the server without secure aggregation sees each client's round-0 upload; a random half of
     the clients carry the canary; each client is a trial (runs repeated until ``trials`` clients were scored);
   * ``aggregate``: with secure aggregation the server (and everyone after it) sees only the round's sum; one
     secret per trial: each trial is a fresh run in which a random target carries the canary with probability
     1/2, scored by the canary's count in the sum (computed on the configured backend: SecAgg+'s unmasked sum
     equals it within the quantisation error);
   * ``dp_aggregate`` (when the config has ``dp``): the same game on the noisy sum the DP run releases, the bound
     shown beside the accountant's epsilon of that release.
3. :func:`~privasr.experiments.audit_fedlm.audit_wordsets` and
   :func:`~privasr.experiments.audit_fedlm.audit_exposure` (section ``fedlm``, :mod:`privasr.experiments.audit_fedlm`):
   the word set a server reads from fedlm's embedding-row deltas (per client, a cohort's sum, with DP noise), and
   Secret Sharer canary exposure against repetitions for no DP, clipping only and each noise multiplier.
4. :func:`~privasr.experiments.audit_runs.audit_fmp_checkpoint` and
   :func:`~privasr.experiments.audit_runs.audit_fedlm_checkpoint` (sections ``fmp_checkpoint`` and
   ``fedlm_checkpoint``, :mod:`privasr.experiments.audit_runs`): a *finished* ``privasr fmp run``'s released
   sum and ``privasr fedlm run``'s released model against the run's own clients' words and sentences
   (membership attacks measured by AUC and TPR at low FPR; the members are not randomised, so no epsilon bound).
5. :func:`~privasr.experiments.audit_dp.audit_dp_games` (section ``dp_games``, :mod:`privasr.experiments.audit_dp`):
   every DP configuration (fedlm's Gaussian under each sampler, distributed noise under SecAgg+, FMP's Laplace)
   audited by a membership game through the real loop, each beside a planted leak the game must catch.

Then ``results.json`` (config, seed, version, data fingerprints, metrics) and ``report.md``.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr.config import Context, from_mapping, setting, to_dict
from privasr.errors import ConfigError
from privasr.experiments.audit_dp import DpGamesSettings
from privasr.experiments.audit_fedlm import FedlmAuditSettings
from privasr.experiments.audit_runs import (
    FedlmCheckpointSettings,
    FmpCheckpointSettings,
    audit_fedlm_checkpoint,
    audit_fmp_checkpoint,
    fedlm_checkpoint_report,
    fmp_checkpoint_report,
    roc_points,
)

__all__ = ["AuditConfig", "AnonAuditSettings", "FmpAuditSettings", "load_audit_config", "run_audit",
           "audit_anonymisation", "audit_fmp"]


@dataclass(frozen=True)
class AnonAuditSettings:
    """The ``anon`` section: what leaks through anonymisation.

    ``data``: ``earnings21`` (the 10 held-out test calls of the NER evaluation's split, from the shared data) or
    ``synth`` (the demo corpus's test transcripts, generated with the run's seed); ``detector``: a
    :func:`~privasr.anon.ner_model.load_detector` spec; ``canaries``: name canaries per source;
    ``sources``: ``unlisted`` and/or ``listed``.
    """

    data: str = setting("synth", choices=("earnings21", "synth"))
    detector: Any = "stock"
    canaries: int = setting(200, min=1)
    sources: tuple[str, ...] = ("unlisted", "listed")
    synth_preset: str = "small"

    def __config_check__(self, where: str, ctx: Any) -> None:
        from privasr.anon.canaries import SOURCES

        bad = [s for s in self.sources if s not in SOURCES]
        if bad or not self.sources:
            raise ConfigError(f"config key '{where}.sources': {list(self.sources)}",
                              expected=f"one or more of {', '.join(SOURCES)}")


@dataclass(frozen=True)
class FmpAuditSettings:
    """The ``fmp`` section: membership of planted rare words in what FMP's server sees.

    ``config``: an FMP runner config (a path, or the mapping itself) whose stages up to the federated run are
    run (:func:`~privasr.experiments.fmp.federation`); ``set``: overrides of it (dotted keys); ``backend``:
    ``local``, ``ray`` or ``flower`` (Flower's simulation, with the config's ``federated.secagg``: the aggregate
    games' sums are then SecAgg+'s; the uploads game records on local, where clients compute the same
    updates); ``population``: how many of its clients take part in the games (the first ones;
    ``null``: all); ``canary_words``: rare word ids planted; ``repeats``: planted utterances per member;
    ``trials``: trials per game; ``confidence``: of the Clopper-Pearson bounds.
    """

    config: Any = None
    set: dict[str, Any] = field(default_factory=dict)
    backend: str = setting("local", choices=("local", "ray", "flower"))
    population: int | None = setting(4, min=2)
    canary_words: int = setting(1, min=1)
    repeats: int = setting(1, min=1)
    trials: int = setting(200, min=10)
    confidence: float = setting(0.95, gt=0.0, lt=1.0)

    def __config_check__(self, where: str, ctx: Any) -> None:
        if not isinstance(self.config, str | dict):
            raise ConfigError(f"config key '{where}.config': {self.config!r}",
                              expected="the path of an FMP runner config, or the config itself")


@dataclass(frozen=True)
class AuditConfig:
    """A ``privasr audit`` config (schema of :mod:`privasr.config`)."""

    name: str = "audit"
    seed: int = setting(0, min=0)
    anon: AnonAuditSettings | None = None
    fmp: FmpAuditSettings | None = None
    fedlm: FedlmAuditSettings | None = None
    fmp_checkpoint: FmpCheckpointSettings | None = None
    fedlm_checkpoint: FedlmCheckpointSettings | None = None
    dp_games: DpGamesSettings | None = None

    def __config_check__(self, where: str, ctx: Any) -> None:
        if all(x is None for x in (self.anon, self.fmp, self.fedlm, self.fmp_checkpoint, self.fedlm_checkpoint,
                                   self.dp_games)):
            raise ConfigError("the audit config has no section to run",
                              expected="an `anon`, `fmp`, `fmp_checkpoint`, `fedlm`, `fedlm_checkpoint` or "
                                       "`dp_games` section")


def load_audit_config(config: Any, *, check_files: bool = True) -> AuditConfig:
    """Validate a config mapping into an :class:`AuditConfig` (errors name the key).

    >>> load_audit_config({"anon": {"data": "synth", "canaries": 10}}).anon.canaries
    10
    >>> load_audit_config({"anon": {"sources": ["phonebook"]}})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'anon.sources': ['phonebook'] (expected one or more of unlisted, listed)
    """
    return from_mapping(AuditConfig, config, "", Context(check_files))


def _documents(s: AnonAuditSettings, seed: int) -> tuple[list[list[tuple[str, ...]]], list[list[Any]], dict[str, Any]]:
    """Held-out documents (ASR-style tokens), their gold spans, and what the data is (for results.json)."""
    from privasr.anon.ner import asr_style

    if s.data == "earnings21":
        from privasr.anon.ner_data import load_ner_data
        from privasr.paths import data_dir

        root = data_dir()
        if root is None:
            raise ConfigError("anon.data: earnings21 needs the shared data folder",
                              expected="../shared/data beside the checkout, or $PRIVASR_DATA")
        data = load_ner_data(root, seed)
        by_call: dict[str, list[Any]] = {}
        for doc, call in zip(data.parts["earnings21"]["test"], data.clients["earnings21"]["test"], strict=True):
            by_call.setdefault(call, []).append(asr_style(*doc))
        info = {"data": "earnings21 test calls", "calls": sorted(by_call), "file": str(data.files["earnings21"])}
        docs = [[w for w, _ in v] for _, v in sorted(by_call.items())]
        gold = [[g for _, g in v] for _, v in sorted(by_call.items())]
        return docs, gold, info
    from privasr.anon.apply import gold_spans
    from privasr.synth import SynthConfig, generate

    corpus = generate(SynthConfig.preset(s.synth_preset, seed=seed))
    test_ids = {nb.utt_id for nb in corpus.test}
    by_client: dict[str, list[Any]] = {}
    for t in corpus.transcripts:
        if t.utt_id in test_ids:
            spans = gold_spans(t.entities, len(t.words), f"{t.utt_id}: ")
            by_client.setdefault(str(t.client), []).append(asr_style(t.words, spans))
    docs = [[w for w, _ in v] for _, v in sorted(by_client.items())]
    gold = [[g for _, g in v] for _, v in sorted(by_client.items())]
    return docs, gold, {"data": f"synth {s.synth_preset} test transcripts", "clients": len(docs)}


def _anonymise(detector: Any, docs: Sequence[Sequence[tuple[str, ...]]], seed: int
               ) -> tuple[list[list[Any]], list[list[tuple[str, ...]]]]:
    """Each document's detected spans (the document is the detector's group) and its surrogate anonymisation."""
    from privasr.anon.ner import detect_grouped
    from privasr.anon.transform import Anonymizer

    anon = Anonymizer("surrogate", seed=seed)
    spans, out = [], []
    for k, d in enumerate(docs):
        sp = detect_grouped(detector, list(d), [k] * len(d))
        spans.append(sp)
        out.append([anon.transform(s, p, client=str(k)) for s, p in zip(d, sp, strict=True)])
    return spans, out


def audit_anonymisation(s: AnonAuditSettings, seed: int) -> dict[str, Any]:
    """Stage 1 (see the module docstring): per-label leak of gold mentions, and canaries per source."""
    from privasr.anon.canaries import plant_names, surviving
    from privasr.anon.ner_metrics import leak_counts
    from privasr.anon.ner_model import load_detector

    t0 = time.perf_counter()
    docs, gold, info = _documents(s, seed)
    detector = load_detector(s.detector)
    flat_words = [w for d in docs for w in d]
    flat_gold = [g for d in gold for g in d]
    spans, _ = _anonymise(detector, docs, seed)
    clients = [str(k) for k, d in enumerate(docs) for _ in d]
    leak = leak_counts(flat_words, flat_gold, [p for d in spans for p in d], clients=clients, seed=seed)
    canaries: dict[str, Any] = {}
    for i, source in enumerate(s.sources):
        planted, placed = plant_names(docs, s.canaries, np.random.default_rng([seed, 22, i]), source=source)
        _, out = _anonymise(detector, planted, seed)
        canaries[source] = surviving(placed, planted, out)
    return {**info, "detector": s.detector, "sentences": len(flat_words), "leak": leak, "canaries": canaries,
            "seconds": time.perf_counter() - t0}


def _fmp_federation(s: FmpAuditSettings, out: Path) -> Any:
    """The FMP runner's federated run of ``s.config`` (its preparation stages run in ``out``)."""
    from privasr.config import apply_overrides, read_config
    from privasr.errors import InputError
    from privasr.experiments.fmp import federation, load_fmp_config

    raw = read_config(s.config) if isinstance(s.config, str) else dict(s.config)
    raw = apply_overrides(raw, dict(s.set))
    try:
        cfg = load_fmp_config(raw)
    except InputError as e:
        raise e.at(s.config) if isinstance(s.config, str) else e from None
    return federation(cfg, out)


def _bound(scores: Any, labels: Any, s: FmpAuditSettings, rng: np.random.Generator, delta: float = 0.0
           ) -> dict[str, Any]:
    """The attack's bound (threshold chosen on half the trials, counted on the other half) and the largest
    bound those evaluation trials could show at all (perfect separation), which limits what can be proven."""
    from privasr.privacy.audit import threshold_attack

    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    r = threshold_attack(scores[labels], scores[~labels], delta=delta, confidence=s.confidence, rng=rng)
    lo, hi = float(scores[labels].min()), float(scores[~labels].max())
    return {**r.to_dict(), "trials": int(scores.size), "members": int(labels.sum()), "eps_lb_max": r.eps_lb_max,
            "member_score_min": lo, "non_member_score_max": hi, "separable": lo > hi,
            "roc": roc_points(scores[labels], scores[~labels])}


def audit_fmp(s: FmpAuditSettings, seed: int, out: Path) -> dict[str, Any]:
    """Stage 2 (see the module docstring): the three membership games on FMP."""
    from privasr.federated.audit import (
        RecordingBackend,
        fmp_aggregate_trials,
        fmp_membership_scores,
        fmp_trial_runner,
        plant_fmp,
        unused_ids,
    )
    from privasr.federated.backends import make_backend, run_on
    from privasr.federated.sampling import AllClients

    t0 = time.perf_counter()
    fed = _fmp_federation(s, out / "fmp-prepare")
    clients = list(fed.clients)[: s.population] if s.population is not None else list(fed.clients)
    if len(clients) < 2:
        raise ConfigError(f"the FMP config gives {len(clients)} clients", expected="at least 2 for the games")
    alg = fed.algorithm
    free = unused_ids(clients, alg.vocab_size)
    if free.size < s.canary_words:
        raise ConfigError(f"fmp.canary_words={s.canary_words}", expected=f"at most {free.size} (words no client uses)")
    rng = np.random.default_rng([seed, 22, 2])
    canary = [int(i) for i in rng.choice(free, size=s.canary_words, replace=False)]
    flower = s.backend == "flower"
    backend = make_backend("local" if flower else s.backend)
    games_backend: Any = "flower" if flower else backend
    secagg = fed.secagg if flower and getattr(fed.secagg, "enabled", False) else None
    try:
        scores, labels = [], []
        while len(scores) < s.trials:  # uploads: each client of each run is a trial
            members = rng.random(len(clients)) < 0.5
            rec = RecordingBackend(backend)
            run_on(rec, alg, plant_fmp(clients, alg.vocab_size, canary, members, rng, s.repeats), rounds=1,
                   sampler=AllClients(), seed=int(rng.integers(2 ** 31 - 1)))
            t = fmp_membership_scores(rec.views, canary, members, round=0)
            scores += t.scores.tolist()
            labels += t.labels.tolist()
        games = {"uploads": _bound(scores, labels, s, rng)}
        run = fmp_trial_runner(alg, clients, canary, sampler=AllClients(), repeats=s.repeats, backend=games_backend,
                               secagg=secagg)
        t = fmp_aggregate_trials(run, s.trials, rng)
        games["aggregate"] = _bound(t.scores, t.labels, s, rng)
        if fed.privacy is not None:
            template = copy.deepcopy(fed.privacy)
            run = fmp_trial_runner(alg, clients, canary, sampler=AllClients(), repeats=s.repeats,
                                   backend=games_backend, secagg=secagg, privacy=lambda: copy.deepcopy(template))
            t = fmp_aggregate_trials(run, s.trials, rng)
            accountant = copy.deepcopy(template.accountant)
            accountant.step(template.mechanism.dp_event())  # one release: the round the game scores
            delta = float(accountant.target_delta)
            games["dp_aggregate"] = {**_bound(t.scores, t.labels, s, rng, delta),
                                     "epsilon_accountant": float(accountant.epsilon()), "delta_accountant": delta,
                                     "mechanism": template.mechanism.to_spec()}
    finally:
        backend.close()
    return {"clients": len(clients), "vocab_size": int(alg.vocab_size), "canary_ids": canary,
            "repeats": s.repeats, "backend": s.backend, "secagg": secagg is not None, "games": games,
            "seconds": time.perf_counter() - t0}


def _audit_fedlm(s: FedlmAuditSettings, seed: int, out: Path) -> dict[str, Any]:
    """Stage 3: fedlm's run prepared once, then the word-set and exposure audits."""
    from privasr.experiments.audit_fedlm import audit_exposure, audit_wordsets, prepare_fedlm

    fed, _, info = prepare_fedlm(s, out, seed)
    return {"run": info, "wordsets": audit_wordsets(fed, s, seed), "exposure": audit_exposure(fed, s, seed)}


def run_audit(cfg: AuditConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the configured stages; write ``out/results.json`` and ``out/report.md``; return the metrics."""
    from privasr.plots import plots_section
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    if cfg.anon is not None:
        sections["anon"] = audit_anonymisation(cfg.anon, cfg.seed)
        a = sections["anon"]
        metrics["anon_leak_rate"] = a["leak"]["all"]["leak_rate"]
        for source, r in a["canaries"].items():
            metrics[f"anon_canary_leak_rate_{source}"] = r["leak_rate_any"]
            metrics[f"anon_canary_full_leak_rate_{source}"] = r["leak_rate_full"]
    if cfg.fmp is not None:
        sections["fmp"] = audit_fmp(cfg.fmp, cfg.seed, out)
        for game, r in sections["fmp"]["games"].items():
            metrics[f"fmp_{game}_eps_lb"] = r["eps_lb"]
            metrics[f"fmp_{game}_tpr"] = r["tpr"]
            metrics[f"fmp_{game}_fpr"] = r["fpr"]
            if "epsilon_accountant" in r:
                metrics[f"fmp_{game}_epsilon"] = r["epsilon_accountant"]
    if cfg.fmp_checkpoint is not None:
        c = sections["fmp_checkpoint"] = audit_fmp_checkpoint(cfg.fmp_checkpoint, out)
        metrics.update(fmp_checkpoint_auc=c["auc"], fmp_checkpoint_tpr=c["tpr"], fmp_checkpoint_fpr=c["fpr"])
    if cfg.fedlm_checkpoint is not None:
        c = sections["fedlm_checkpoint"] = audit_fedlm_checkpoint(cfg.fedlm_checkpoint, out, cfg.seed)
        for attack, r in c["attacks"].items():
            metrics[f"fedlm_checkpoint_{attack}_auc"] = r["auc"]
            for fpr, tpr in r["tpr_at_fpr"].items():
                metrics[f"fedlm_checkpoint_{attack}_tpr_at_fpr_{fpr}"] = tpr
    if cfg.fedlm is not None:
        sections["fedlm"] = _audit_fedlm(cfg.fedlm, cfg.seed, out)
        w, e = sections["fedlm"]["wordsets"], sections["fedlm"]["exposure"]
        metrics["fedlm_wordset_recall"] = w["per_client"]["recall_mean"]
        metrics["fedlm_wordset_precision"] = w["per_client"]["precision_mean"]
        for row in e["rows"]:
            for reps, v in row["exposure"].items():
                key = "".join(c if c.isalnum() else "_" for c in str(row["setting"]).lower())
                if row["noise_multiplier"]:  # one row per noise multiplier
                    key += f"_z{row['noise_multiplier']:g}"
                metrics[f"fedlm_exposure_{key}_{reps}x"] = v
    if cfg.dp_games is not None:
        from privasr.experiments.audit_dp import audit_dp_games

        sections["dp_games"] = audit_dp_games(cfg.dp_games, cfg.seed)
        for game, g in sections["dp_games"]["games"].items():
            for run in ("release", "control"):
                if run in g:
                    metrics[f"dp_{game}_{run}_eps_lb"] = g[run]["eps_lb"]
                    metrics[f"dp_{game}_{run}_holds"] = g[run]["holds"]
            metrics[f"dp_{game}_epsilon"] = g["release"]["epsilon"]
    write_results(out, runner="audit", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  extra={"sections": sections, "command": list(argv) if argv is not None else None})
    (out / "report.md").write_text(_report(cfg, sections) + plots_section(out), encoding="utf-8")
    return metrics


def _report(cfg: AuditConfig, sections: dict[str, Any]) -> str:
    lines = [f"# Privacy audit: {cfg.name}", ""]
    a = sections.get("anon")
    if a is not None:
        lines += ["## Anonymisation", "",
                  f"{a['data']}, detector `{a['detector']}`, {a['sentences']} sentences, surrogate anonymisation.",
                  "", "| label | gold mentions | with a word left | leak rate |", "|---|---:|---:|---:|"]
        for label, r in a["leak"].items():
            lines.append(f"| {label} | {r['mentions']} | {r['leaked']} | {r['leak_rate']:.3f} |")
        lines += ["", "| canary names | planted | a word left | all words left |", "|---|---:|---:|---:|"]
        for source, r in a["canaries"].items():
            lines.append(f"| {source} | {r['canaries']} | {r['leaked_any']} ({r['leak_rate_any']:.3f}) | "
                         f"{r['leaked_full']} ({r['leak_rate_full']:.3f}) |")
        lines.append("")
    f = sections.get("fmp")
    if f is not None:
        lines += ["## FMP: membership of a planted rare word", "",
                  f"{f['clients']} clients, vocabulary {f['vocab_size']}, {len(f['canary_ids'])} canary word(s) in "
                  f"{f['repeats']} planted utterance(s) per member, backend {f['backend']}.", "",
                  "| what the attacker sees | trials | TPR | FPR | epsilon lower bound | provable at most | "
                  "accountant's epsilon |", "|---|---:|---:|---:|---:|---:|---:|"]
        names = {"uploads": "each client's upload (no SecAgg)", "aggregate": "the round's sum (SecAgg, no DP)",
                 "dp_aggregate": "the round's noisy sum (DP)"}
        for game, r in f["games"].items():
            eps = f"{r['epsilon_accountant']:.3g}" if "epsilon_accountant" in r else "none"
            lines.append(f"| {names[game]} | {r['trials']} | {r['tpr']:.3f} | {r['fpr']:.3f} | {r['eps_lb']:.3f} | "
                         f"{r['eps_lb_max']:.3f} | {eps} |")
        lines += ["", "TPR and FPR are counted on the half of the trials the threshold was not chosen on; the bound "
                  f"holds with confidence {cfg.fmp.confidence if cfg.fmp else 0.95:g} (Clopper-Pearson). "
                  "\"Provable at most\" is the bound a perfect attack would get from as many trials.", ""]
    if "fmp_checkpoint" in sections:
        lines += fmp_checkpoint_report(sections["fmp_checkpoint"])
    if "fedlm_checkpoint" in sections:
        lines += fedlm_checkpoint_report(sections["fedlm_checkpoint"])
    fl = sections.get("fedlm")
    if fl is not None:
        from privasr.experiments.audit_fedlm import exposure_report, wordsets_report

        lines += [*wordsets_report(fl["wordsets"]), "", *exposure_report(fl["exposure"]), ""]
    if "dp_games" in sections:
        from privasr.experiments.audit_dp import dp_games_report

        lines += dp_games_report(sections["dp_games"])
    return "\n".join(lines)
