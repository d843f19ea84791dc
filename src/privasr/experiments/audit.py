"""The empirical privacy audit behind ``privasr audit`` (issue 22): measure what a release or a curious server
actually learns, beside what the accountant promises.

Stages (each runs when its config section is present):

1. :func:`audit_anonymisation` (section ``anon``): held-out text with gold entity spans (the Earnings-21 test
   calls, ASR-style, or the demo corpus's test transcripts), the configured detector, surrogate anonymisation;
   the share of gold mentions with a word left, per label (:func:`~privasr.anon.ner_metrics.leak_counts`), and
   person-name canaries planted in the same documents (:mod:`privasr.anon.canaries`: names a gazetteer lists
   and made-up ones it cannot), counted after anonymisation.

Then ``results.json`` (config, seed, version, data fingerprints, metrics) and ``report.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.config import Context, from_mapping, setting, to_dict
from privasr.errors import ConfigError

__all__ = ["AuditConfig", "AnonAuditSettings", "load_audit_config", "run_audit", "audit_anonymisation"]


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
class AuditConfig:
    """A ``privasr audit`` config (schema of :mod:`privasr.config`)."""

    name: str = "audit"
    seed: int = setting(0, min=0)
    anon: AnonAuditSettings | None = None

    def __config_check__(self, where: str, ctx: Any) -> None:
        if self.anon is None:
            raise ConfigError("the audit config has no section to run", expected="an `anon` section")


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


def run_audit(cfg: AuditConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the configured stages; write ``out/results.json`` and ``out/report.md``; return the metrics."""
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
    write_results(out, config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  extra={"sections": sections, "command": list(argv) if argv is not None else None})
    (out / "report.md").write_text(_report(cfg, sections), encoding="utf-8")
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
    return "\n".join(lines)
