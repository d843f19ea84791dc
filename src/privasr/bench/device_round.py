"""What a device round costs against the simulation's client on the same data (part of ``privasr bench device``).

One run, one process, the same FMP run two ways through Flower's real message path (an in-process grid:
every message serialised and parsed as between processes, :mod:`privasr.federated.backends.flower_inprocess`):

* **device**: each device holds its own raw N-best files (the synthetic corpus's test meetings, arriving round by
  round from replay folders) and its bundle; a round takes its new files, scores them with the bundle's NNLM,
  runs FMP's client update and replies (:class:`~privasr.device.node.Device`);
* **simulation**: the same clients prepared on the operator's machine (NNLM scores, totals and ids computed
  beforehand), served by the simulation's ClientApp from a pickled population.

Metrics (ratios device / simulation, measured in the same run):

* ``round_s`` (mean and p95 over every device round), ``round_ratio``; ``prepare_s``: the device's own
  preparation inside its rounds (reading the files, NNLM scores, ids), the work the simulation did beforehand,
  and ``round_ratio_without_prepare``: the rest of the device's round against the simulation's client;
* ``bytes_down_round`` / ``bytes_up_round``: the serialised message contents per round (mean), and their ratios
  (the same protocol: ~1); ``bundle_bytes``: the one-time download of the bundle, ``bundle_vs_rounds``: it against
  the run's whole per-device traffic;
* ``peak_bytes``: tracemalloc's peak over the whole run (Python and numpy allocations; torch's own buffers are
  not seen), and its ratio.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["measure", "synthetic_fmp_config"]


def synthetic_fmp_config(corpus: Path, cache: Path, *, name: str = "bench-device-round", rounds: int = 4
                         ) -> dict[str, Any]:
    """An FMP config of a synthetic corpus written in ``corpus`` (``privasr data synth``): a tiny transformer
    NNLM trained on its background text (one epoch, cached in ``cache``), ``fmp.rounds`` = ``rounds``."""
    return {"name": name, "seed": 0,
            "data": {"dev": str(corpus / "nbest" / "dev.jsonl"), "test": str(corpus / "nbest" / "test.jsonl")},
            "clients": {"key": "client"},
            "nnlm": {"neural": {"train": {"text": str(corpus / "text" / "background.txt"),
                                          "valid": str(corpus / "text" / "background.txt"),
                                          "preset": "tiny-transformer", "seed": 0,
                                          "options": {"max_epochs": 1, "batch_size": 32, "lr": 0.01,
                                                      "patience": 0, "amp": False}}}},
            "cache_dir": str(cache),
            "search": {"ranges": {"lm": [0, 2, 0.5], "nnlm": [0, 2, 0.5], "word_penalty": [-2, 2, 1]}},
            "fmp": {"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "rounds": rounds}, "lam_grid": [0.5, 1.0]}


def _serve(fed: Any, app: Any, n: int) -> tuple[Any, Any]:
    from privasr.federated.backends.flower_inprocess import serve_inprocess

    return serve_inprocess(app, n, fed.algorithm, rounds=fed.rounds, sampler=fed.sampler, seed=fed.seed,
                           min_clients=fed.min_clients, privacy=fed.privacy, key=fed.key)


def measure(quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """Run both ways (see the module docstring) on the ``tiny`` (``quick``) or ``small`` synthetic corpus; the
    metrics. Raises ``AssertionError`` if the two ways end in different server sums."""
    from privasr.corpus.load import load_nbest
    from privasr.corpus.records import Population
    from privasr.device.folder import init_device, write_replay
    from privasr.device.node import Device, dispatch
    from privasr.experiments.fmp import federation, load_fmp_config, operator_side
    from privasr.federated.backends.flower import make_client_app
    from privasr.federated.backends.flower_deploy import _dump
    from privasr.federated.backends.flower_serve import write_serve_kit
    from privasr.synth import SynthConfig, generate

    with tempfile.TemporaryDirectory(prefix="privasr-bench-device-") as tmp:
        root = Path(tmp)
        generate(SynthConfig.preset("tiny" if quick else "small", seed=seed)).write(root / "corpus")
        cfg = load_fmp_config(synthetic_fmp_config(root / "corpus", root / "cache"))
        test = load_nbest(root / "corpus" / "nbest" / "test.jsonl")
        n = len(Population.group(test, key="client"))
        fed, write = operator_side(cfg, root / "prepare", n)
        kit = write_serve_kit(root / "kit", fed, write)
        import json

        info = json.loads((kit / "kit.json").read_text())
        bundle_bytes = sum(p.stat().st_size for p in (kit / "bundle").iterdir())
        sim = federation(cfg, root / "sim")
        pkl = root / "population.pkl"
        _dump(pkl, (sim.algorithm, list(sim.clients)))
        sim_app = make_client_app(pkl, None)

        def devices(tag: str) -> list[Any]:
            reps = write_replay(test, root / f"replay-{tag}", key="client", rounds=fed.rounds - 1)
            return [Device(init_device(root / f"{tag}-{i}", bundle=kit / "bundle", bundle_hash=info["bundle"],
                                       index=i, name=name, trusted_apps=(info["app"],)).root, replay=r)
                    for i, (name, r) in enumerate(reps)]

        prep: list[float] = []

        def timed(dev: Any) -> Any:
            inner = dev.source

            def source(context: Any, epoch: int) -> Any:
                t0 = time.perf_counter()
                out = inner(context, epoch)
                prep.append(time.perf_counter() - t0)
                return out

            dev.source = source
            return dev

        devs = [timed(d) for d in devices("a")]
        dres, dgrid = _serve(fed, dispatch(devs), n)
        sres, sgrid = _serve(sim, sim_app, n)
        assert np.allclose(dres.state["sum"], sres.state["sum"], rtol=1e-12, atol=1e-12)
        # the peaks, in second passes (tracemalloc slows what it watches)
        devs2 = devices("b")
        tracemalloc.start()
        _serve(fed, dispatch(devs2), n)
        dpeak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        tracemalloc.start()
        _serve(sim, sim_app, n)
        speak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()

    def stats(grid: Any) -> dict[str, float]:
        xs = [x for x in grid.exchanges if x.message_type == "train"]
        secs = np.array([x.node_s for x in xs])
        return {"round_s_mean": float(secs.mean()), "round_s_p95": float(np.percentile(secs, 95)),
                "bytes_down_round": float(np.mean([x.bytes_down for x in xs])),
                "bytes_up_round": float(np.mean([x.bytes_up for x in xs])), "rounds": len(xs)}

    d, s = stats(dgrid), stats(sgrid)
    per_device_rounds = d["rounds"] / n
    return {
        "corpus": "tiny" if quick else "small", "devices": n, "rounds": fed.rounds,
        "device": d, "simulation": s,
        "round_ratio": d["round_s_mean"] / s["round_s_mean"],
        "round_ratio_p95": d["round_s_p95"] / s["round_s_p95"],
        "prepare_s_mean": float(np.mean(prep)),
        "prepare_share": float(np.sum(prep)) / (d["round_s_mean"] * d["rounds"]),
        "round_ratio_without_prepare": (d["round_s_mean"] - float(np.sum(prep)) / d["rounds"]) / s["round_s_mean"],
        "bytes_down_ratio": d["bytes_down_round"] / s["bytes_down_round"],
        "bytes_up_ratio": d["bytes_up_round"] / s["bytes_up_round"],
        "bundle_bytes": bundle_bytes,
        "bundle_vs_rounds": bundle_bytes / (per_device_rounds * (d["bytes_down_round"] + d["bytes_up_round"])),
        "peak_bytes": {"device": dpeak, "simulation": speak}, "peak_ratio": dpeak / speak,
    }
