"""How close fedlm's local training runs to divergence, behind ``privasr fedlm stability``.

Every client of a fedlm config trains locally for one round (``local_epochs`` of SGD, as in a federated round)
from the server's pre-trained NNLM, and optionally from other starting models (``--from``: a fedlm run's
``model.pt``), for every ``client_lr`` and ``grad_clip`` asked for and ``draws`` batch orders each. A cell of the
report counts the trained models that hold NaN or infinity (the updates a federated round would drop), the mean
and largest training loss (a diverging run's loss explodes before it overflows) and the share of mini-batches
whose gradient the clipping scaled down. Nothing is aggregated: this measures the clients' own step, the thing
``grad_clip`` bounds.

The clients are the config's (its confidences and weights included); the data, the NNLM and the clients are
built once by :mod:`privasr.experiments.fedlm`'s own stages.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.config import to_dict
from privasr.errors import InputError
from privasr.experiments.fedlm import FedLmRunConfig, build_model, encode, load_data

__all__ = ["run_stability"]


def _starts(model: Any, paths: Sequence[str | Path]) -> dict[str, dict[str, np.ndarray]]:
    """The starting parameters: the pre-trained NNLM's (``pretrained``) and each checkpoint's, by file name."""
    from privasr.lm.neural.checkpoint import load_checkpoint

    starts = {"pretrained": model.init_params}
    for p in paths:
        ck = load_checkpoint(p)
        params = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in ck.model.named_parameters()}
        if set(params) != set(model.init_params) or any(params[k].shape != model.init_params[k].shape
                                                         for k in params):
            raise InputError("the checkpoint's parameters are not the server NNLM's", path=p,
                             expected="a model of the config's NNLM (a fedlm run's model.pt)")
        if tuple(ck.vocab.words) != tuple(model.lm.vocab.words):
            raise InputError("the checkpoint's vocabulary is not the server NNLM's", path=p,
                             expected="a model of the config's NNLM (a fedlm run's model.pt)")
        starts[Path(p).parent.name or Path(p).stem] = params
    return starts


def run_stability(cfg: FedLmRunConfig, out: str | Path, *, lrs: Sequence[float], clips: Sequence[float | None],
                  draws: int = 3, starts: Sequence[str | Path] = (), argv: Sequence[str] | None = None
                  ) -> dict[str, Any]:
    """Train every client locally for each ``(client_lr, grad_clip)`` and start (module docstring); write
    ``out/results.json``, ``out/report.md`` and ``out/plots/stability.png``. Returns the metrics (``cells``: one row per lr, clip and start).

    Raises:
        ConfigError: a bad ``client_lr`` or ``grad_clip`` (:class:`~privasr.federated.algorithms.fedlm.FedLmConfig`).
        InputError: ``draws < 1``, no rates, or a starting checkpoint of another model.
    """
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
    from privasr.plots import plots_section
    from privasr.results import write_results

    if draws < 1 or not lrs or not clips:
        raise InputError(f"draws={draws}, {len(lrs)} learning rates, {len(clips)} clip settings",
                         expected="draws >= 1 and at least one --lr and one --grad-clip")
    confs = [(lr, clip, FedLmConfig.from_dict({**cfg.fedlm, "client_lr": lr, "grad_clip": clip}))
             for lr in lrs for clip in clips]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    data = load_data(cfg)
    model = build_model(cfg, out)
    sets = encode(cfg, data, model)
    start_params = _starts(model, starts)
    cells = []
    for lr, clip, conf in confs:
        alg = FedLmAlgorithm(conf, model.lm.model.config, model.lm.vocab, model.init_params)
        for name, params in start_params.items():
            bad, losses, steps, clipped = 0, [], 0, 0
            for d in range(draws):
                for i, client in enumerate(sets.clients):
                    trained, m = alg.local_train(params, client, np.random.default_rng([cfg.seed, d, i]))
                    bad += not (math.isfinite(m["loss"]) and all(np.all(np.isfinite(v)) for v in trained.values()))
                    losses.append(m["loss"])
                    steps += m["steps"]
                    clipped += m["clipped_steps"]
            fin = [x for x in losses if math.isfinite(x)]
            cells.append({"client_lr": lr, "grad_clip": clip, "start": name, "trainings": len(losses),
                          "non_finite": bad, "mean_loss": float(np.mean(fin)) if fin else None,
                          "max_loss": max(fin) if fin else None,
                          "clipped_share": clipped / steps if clip is not None and steps else None})
    metrics = {"cells": cells, "clients": len(sets.clients), "draws": draws, "seconds": time.perf_counter() - t0}
    write_results(out, runner="fedlm-stability", config=to_dict(cfg), seed=cfg.seed, metrics=metrics,
                  extra={"nnlm": model.info, "command": list(argv) if argv is not None else None})
    (out / "report.md").write_text(_report(cfg, metrics, argv) + plots_section(out), encoding="utf-8")
    return metrics


def _report(cfg: FedLmRunConfig, m: Mapping[str, Any], argv: Sequence[str] | None) -> str:
    lines = [f"# Local training stability: {cfg.name}", ""]
    if argv:
        lines += ["Command: `" + " ".join(argv) + "`", ""]
    lines += [f"Each of the {m['clients']} clients trained locally for one round, {m['draws']} batch orders per "
              "cell (seeds seed, draw, client): how many trained models hold NaN or infinity, the training loss "
              "(mean and largest over the finite ones) and the share of mini-batches whose gradient was clipped.",
              "", "| client_lr | grad_clip | start | non-finite | mean loss | largest loss | batches clipped |",
              "|---:|---|---|---:|---:|---:|---:|"]

    def num(v: Any) -> str:
        return "" if v is None else f"{v:.4g}"

    for c in m["cells"]:
        share = "" if c["clipped_share"] is None else f"{100 * c['clipped_share']:.1f}%"
        clip = "none" if c["grad_clip"] is None else f"{c['grad_clip']:g}"
        lines.append(f"| {c['client_lr']:g} | {clip} | "
                     f"{c['start']} | {c['non_finite']} / {c['trainings']} | {num(c['mean_loss'])} | "
                     f"{num(c['max_loss'])} | {share} |")
    lines += ["", f"privasr {__version__}.", ""]
    return "\n".join(lines)
