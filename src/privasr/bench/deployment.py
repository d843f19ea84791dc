"""What a round of a real deployment costs per device: devices serving their SuperNodes with privasr's long-lived
ClientApp process (``privasr serve`` kits, ``--isolation process``) against the ``fed split`` kits' SuperNodes,
which start a ``flwr-clientapp`` process for every message (``--isolation subprocess``), in the same run.

Both are real processes on loopback: a SuperLink with TLS and registered keys, one SuperNode per device, SecAgg+
(four protocol stages a round), FMP on the synthetic corpus (``tiny``: 3 devices, ``small`` otherwise), the same
config. The ``privasr serve`` devices take their files round by round from replay folders and score them
with the bundle's NNLM themselves; the ``fed split`` clients were prepared on the operator's machine.

Metrics: ``round_s`` (mean seconds between the ends of consecutive rounds: the round log's ``seconds``),
``per_device_round_s`` (``round_s`` / devices; the target is at most 2 s), ``startup_s`` (the launcher's wall time
less the rounds), and ``speedup_per_round`` = the ``fed split`` kit's ``round_s`` / the ``serve`` kit's. The run
fails unless both end in the same server sums within SecAgg+'s quantisation.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from privasr.results import write_results

__all__ = ["run"]


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure (see the module docstring); write ``out/results.json`` and ``out/report.md``; the metrics."""
    from privasr.bench.device_round import synthetic_fmp_config
    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.device.folder import init_device, write_replay
    from privasr.experiments.fmp import federation, load_fmp_config, operator_side
    from privasr.federated.backends.flower_kit import run_kit, write_kit
    from privasr.federated.backends.flower_serve import run_serve_kit, write_serve_kit
    from privasr.synth import SynthConfig, generate

    corpus_preset = "tiny" if quick else "small"
    with tempfile.TemporaryDirectory(prefix="privasr-bench-deployment-") as tmp:
        root = Path(tmp)
        generate(SynthConfig.preset(corpus_preset, seed=1 + seed)).write(root / "corpus")
        raw = synthetic_fmp_config(root / "corpus", root / "cache", name="bench-deployment",
                                   rounds=2 if quick else 4)
        raw["federated"] = {"backend": "flower", "secagg": {"enabled": True}}
        cfg = load_fmp_config(raw)
        test = load_nbest(root / "corpus" / "nbest" / "test.jsonl")
        n = len(Population.group(test, key="client"))
        fed, write = operator_side(cfg, root / "prepare", n)
        kit = write_serve_kit(root / "serve", fed, write)
        info = json.loads((kit / "kit.json").read_text())
        reps = write_replay(test, root / "replay", key="client", rounds=fed.rounds - 1)
        devs = [init_device(root / f"d{i}", bundle=kit / "bundle", bundle_hash=info["bundle"], index=i, name=nm,
                            trusted_apps=(info["app"],)).root for i, (nm, _) in enumerate(reps)]
        t0 = time.perf_counter()
        served = run_serve_kit(kit, devs, run_timeout=1800, replays=[r for _, r in reps])
        serve_s = time.perf_counter() - t0
        sim = federation(cfg, root / "sim")
        split = write_kit(root / "split", sim)
        t0 = time.perf_counter()
        cut = run_kit(split, run_timeout=1800)
        split_s = time.perf_counter() - t0
    step = 2 * 4096 / 2 ** 22
    assert np.allclose(served.state["sum"], cut.state["sum"], rtol=0, atol=2 * fed.rounds * n * step), \
        "the two deployments ended in different server sums"

    def stats(result: Any, wall: float) -> dict[str, float]:
        secs = np.array([h.seconds for h in result.history], dtype=np.float64)
        return {"round_s": float(secs.mean()), "round_s_max": float(secs.max()),
                "per_device_round_s": float(secs.mean()) / n, "startup_s": wall - float(secs.sum()),
                "wall_s": wall}

    s, c = stats(served, serve_s), stats(cut, split_s)
    metrics = {"devices": n, "rounds": fed.rounds, "serve": s, "fed_split": c,
               "speedup_per_round": c["round_s"] / s["round_s"],
               "per_device_round_target_s": 2.0, "target_met": s["per_device_round_s"] <= 2.0}
    config = {"benchmark": "deployment", "corpus": f"synthetic {corpus_preset} (seed {1 + seed})",
              "secagg": True, "algorithm": "fmp", "fmp_rounds": raw["fmp"]["rounds"]}
    write_results(out, config=config, seed=seed, metrics=metrics)
    lines = ["# A deployment round per device: privasr device serve against per-message ClientApp processes", "",
             f"{n} devices, {fed.rounds} rounds of FMP with SecAgg+ over TLS on loopback (real processes), "
             f"{config['corpus']}. Command: `privasr bench deployment --out DIR`.", "",
             "| kit | round (s, mean) | per device per round (s) | start-up (s) | wall (s) |",
             "|---|---:|---:|---:|---:|",
             f"| `privasr serve` (`--isolation process`, `privasr device serve`) | {s['round_s']:.2f} | "
             f"{s['per_device_round_s']:.2f} | {s['startup_s']:.1f} | {s['wall_s']:.1f} |",
             f"| `fed split` (`--isolation subprocess`, a process per message) | {c['round_s']:.2f} | "
             f"{c['per_device_round_s']:.2f} | {c['startup_s']:.1f} | {c['wall_s']:.1f} |", "",
             f"Speed-up per round: {metrics['speedup_per_round']:.2f}x; per device per round "
             f"{s['per_device_round_s']:.2f} s against the target of 2 s "
             f"({'met' if metrics['target_met'] else 'missed'}).", ""]
    (Path(out) / "report.md").write_text("\n".join(lines), encoding="utf-8")
    return metrics
