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
   validation loss the baseline reaches in its ``rounds`` rounds; ``rounds_to_target`` is the first round
   (1-based) at which a run's validation loss is at or below it (``null`` if never).
6. ``centralised`` (optional): the lower bound (the same network trained centrally on every training speaker
   from scratch) and centralised online training of the seed model on the client speakers' data, each for
   ``centralised.epochs`` Adam epochs.

Only float32 parameter deltas with their unit counts and training losses cross to the server.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr import __version__
from privasr.asr.synth_an4 import synthetic_corpus
from privasr.errors import ConfigError, InputError

__all__ = ["FtlRunConfig", "load_ftl_config", "run_ftl", "split_speakers"]

_TOP = ("name", "seed", "data", "units", "model", "seed_model", "clients", "rounds", "federated", "ftl",
        "baseline", "target_loss", "tables", "centralised", "eval")
_BASELINE = {"server": "fedavg", "weighting": "count", "temperature": 1.0, "replay_steps": 0}
_DEFAULT_FTL = {"server": {"name": "adam", "lr": 0.001}, "weighting": "softmax", "temperature": 1.0,
                "client_optimizer": {"name": "sgd", "lr": 0.1}}


@dataclass(frozen=True)
class FtlRunConfig:
    """A validated FTL experiment config (:func:`load_ftl_config`); ``raw`` is the resolved dict."""

    name: str
    seed: int
    data: dict[str, Any]
    units: Any
    model: Any
    seed_epochs: int
    seed_lr: float
    seed_batch: int
    client_key: str
    groups: int
    rounds: int
    backend: str
    backend_options: dict[str, Any]
    sampler: Any
    min_clients: int
    ftl: Any
    baseline: Any
    target_loss: float | None
    variants: tuple[tuple[str, Any, str], ...]
    central_epochs: int | None
    eval_method: str
    eval_options: dict[str, Any]
    raw: dict[str, Any]
    seed_select: str = "last"


def _ftl_config(raw: Mapping[str, Any]) -> Any:
    """An FtlConfig whose temperature is 1.0 unless it weights by softmax (where alone it acts), so runs that
    differ only in an unused temperature share their checkpoints and cache keys."""
    from privasr.federated.algorithms.ftl import FtlConfig

    cfg = FtlConfig.from_dict(raw)
    return cfg if cfg.weighting == "softmax" else dataclasses.replace(cfg, temperature=1.0)


def load_ftl_config(config: Mapping[str, Any]) -> FtlRunConfig:
    """Validate an FTL experiment config (see the module docstring); errors name the key.

    >>> load_ftl_config({"data": {"kind": "an5"}})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: config key 'data.kind' is 'an5' (expected one of an4, synthetic)
    """
    from privasr.asr.models import AcousticConfig
    from privasr.rescore.run import _int, _mapping, _num, _str, federation_settings

    raw = _mapping(copy.deepcopy(dict(config)), "config", _TOP)
    name = _str(raw.get("name", "ftl"), "name")
    seed = _int(raw.get("seed", 0), "seed", 0)
    data = _mapping(raw.get("data", {}), "data", ("kind", "root", "cmvn", "seed_fraction", "valid_every",
                                                  "speakers", "utterances", "test_speakers"))
    data["kind"] = _str(data.get("kind", "an4"), "data.kind", ("an4", "synthetic"))
    data["cmvn"] = _str(data.get("cmvn", "speaker"), "data.cmvn", ("speaker", "global", "none"))
    frac = _num(data.get("seed_fraction", 0.5), "data.seed_fraction")
    if not 0 < frac < 1:
        raise ConfigError(f"data.seed_fraction={frac}", expected="a number in (0, 1)")
    data["seed_fraction"] = frac
    data["valid_every"] = _int(data.get("valid_every", 10), "data.valid_every", 2)
    for k, default in (("speakers", 16), ("utterances", 12), ("test_speakers", 4)):
        data[k] = _int(data.get(k, default), f"data.{k}", 2)
    units = raw.get("units", "char")
    if units != "char":
        u = _mapping(units, "units", ("sentencepiece",))
        units = {"sentencepiece": _int(u.get("sentencepiece"), "units.sentencepiece", 8)}
    m = _mapping(raw.get("model", {}), "model")
    preset = _str(m.pop("preset", "small"), "model.preset")
    try:
        model = AcousticConfig.preset(preset, **m)
    except TypeError as e:
        raise ConfigError(f"model: {e}", expected="AcousticConfig fields") from None
    sm = _mapping(raw.get("seed_model", {}), "seed_model", ("epochs", "lr", "batch_size", "select"))
    seed_select = _str(sm.get("select", "last"), "seed_model.select", ("last", "best"))
    seed_epochs = _int(sm.get("epochs", 10), "seed_model.epochs", 1)
    seed_lr = _num(sm.get("lr", 0.001), "seed_model.lr")
    seed_batch = _int(sm.get("batch_size", 16), "seed_model.batch_size", 1)
    cl = _mapping(raw.get("clients", {}), "clients", ("key", "groups"))
    key = _str(cl.get("key", "speaker"), "clients.key", ("speaker", "groups"))
    groups = _int(cl.get("groups", 7), "clients.groups", 1)
    rounds = _int(raw.get("rounds", 40), "rounds", 1)
    fed = dict(raw.get("federated", {}) or {})
    fed.setdefault("sampler", {"kind": "with_replacement", "n": 7})
    backend, backend_options, sampler, min_clients = federation_settings({"federated": fed})
    ftl_raw = {**_DEFAULT_FTL, **_mapping(raw.get("ftl", {}), "ftl")}
    ftl = _ftl_config(ftl_raw)
    base = _ftl_config({**ftl_raw, **_BASELINE, **_mapping(raw.get("baseline", {}), "baseline")})
    tl = raw.get("target_loss", "auto")
    target = None if tl == "auto" else _num(tl, "target_loss")
    tables = _mapping(raw.get("tables", {}), "tables", ("variants",))
    variants = []
    for i, v in enumerate(tables.get("variants", []) or []):
        v = _mapping(v, f"tables.variants[{i}]", ("name", "ftl", "clients"))
        vname = _str(v.get("name"), f"tables.variants[{i}].name")
        vkey = _str(v.get("clients", key), f"tables.variants[{i}].clients", ("speaker", "groups"))
        variants.append((vname, _ftl_config({**ftl_raw, **_mapping(v.get("ftl", {}), f"tables.variants[{i}].ftl")}),
                         vkey))
    cen = raw.get("centralised")
    central = None
    if cen is not None:
        central = _int(_mapping(cen, "centralised", ("epochs",)).get("epochs", seed_epochs), "centralised.epochs", 1)
    ev = _mapping(raw.get("eval", {}), "eval", ("method", "beam", "head"))
    method = _str(ev.get("method", "greedy"), "eval.method", ("greedy", "beam"))
    opts: dict[str, Any] = {"beam": _int(ev.get("beam", 8), "eval.beam", 1)} if method == "beam" else {}
    head = opts["head"] = _str(ev.get("head", "auto"), "eval.head", ("auto", "attention", "ctc", "joint"))
    if head in ("ctc", "joint") and model.arch == "seq2seq" and not model.ctc_weight:
        raise ConfigError(f"eval.head is '{head}' but the seq2seq model has no CTC head",
                          expected="model.ctc_weight > 0, or eval.head 'auto'/'attention'")
    if head in ("attention", "joint") and model.arch == "ctc":
        raise ConfigError(f"eval.head is '{head}' but model.arch is 'ctc'", expected="eval.head 'auto' or 'ctc'")
    if head == "joint" and method != "beam":
        raise ConfigError("eval.head is 'joint' with eval.method 'greedy'", expected="eval.method 'beam'")
    resolved = {**raw, "ftl": ftl.to_dict(), "baseline": base.to_dict(), "model": model.to_dict(),
                "data": data, "units": units}
    return FtlRunConfig(name, seed, data, units, model, seed_epochs, seed_lr, seed_batch, key, groups, rounds,
                        backend, backend_options, sampler, min_clients, ftl, base, target, tuple(variants),
                        central, method, opts, resolved, seed_select)


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


def _load(cfg: FtlRunConfig) -> tuple[list[Any], list[Any]]:
    if cfg.data["kind"] == "synthetic":
        return synthetic_corpus(cfg.data["speakers"], cfg.data["utterances"], cfg.data["test_speakers"], cfg.seed)
    from privasr.asr.features import an4_features

    root = cfg.data.get("root")
    return an4_features(root, "train"), an4_features(root, "test")


def _tokenizer(cfg: FtlRunConfig, transcripts: Sequence[Sequence[str]]) -> Any:
    from privasr.asr.units import CharTokenizer, SentencePieceTokenizer

    if cfg.units == "char":
        return CharTokenizer.train(transcripts)
    return SentencePieceTokenizer.train(transcripts, vocab_size=cfg.units["sentencepiece"], seed=cfg.seed)


def _groups(speakers: Sequence[str], n: int) -> list[list[str]]:
    names = sorted(speakers)
    n = min(n, len(names))
    return [names[i::n] for i in range(n)]


# ---------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------
def _cache_key(cfg: FtlRunConfig, what: str, **extra: Any) -> str:
    key = {"what": what, "data": cfg.data, "units": cfg.units, "model": cfg.model.to_dict(), "seed": cfg.seed,
           "version": __version__, **extra}
    return json.dumps(key, sort_keys=True, default=str)


def _central(cfg: FtlRunConfig, tok: Any, init: Mapping[str, np.ndarray] | None, examples: Sequence[Any],
             epochs: int, cache: Path, name: str, lr: float, batch: int,
             select: tuple[Sequence[Any], Callable[[Mapping[str, np.ndarray], Sequence[Any]], float]] | None = None
             ) -> tuple[dict[str, np.ndarray], float]:
    """Centralised Adam training (cached): the parameters and the seconds it took (0 when cached).

    ``select = (held-out examples, loss(params, examples))``: train epoch by epoch and keep the parameters of the
    epoch with the lowest held-out loss (the losses per epoch are saved beside the cached parameters)."""
    import torch

    from privasr.asr.models import build_model
    from privasr.asr.train import train
    from privasr.federated.algorithms._config import load_params, params_of

    key = _cache_key(cfg, name, epochs=epochs, lr=lr, batch=batch, init=init is not None,
                     n=len(examples), **({"select": "best", "held_out": len(select[0])} if select else {}))
    path = cache / f"{name}.npz"
    meta = cache / f"{name}.json"
    if path.is_file() and meta.is_file() and meta.read_text(encoding="utf-8") == key:
        with np.load(path) as z:
            return {k: z[k] for k in z.files}, 0.0
    model = build_model(cfg.model, tok, seed=cfg.seed)
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


def _hold_out(by_spk: Mapping[str, Sequence[Any]], speakers: Sequence[str], every: int
              ) -> tuple[list[Any], dict[str, list[Any]]]:
    """Every ``every``-th utterance of each speaker held out: (the held-out utterances, the rest per speaker)."""
    held = [e for s in speakers for i, e in enumerate(by_spk[s]) if i % every == every - 1]
    kept = {s: [e for i, e in enumerate(by_spk[s]) if i % every != every - 1] for s in speakers}
    return held, kept


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
    ev = evaluate(model, alg.tokenizer, test, method=cfg.eval_method, **cfg.eval_options)
    return {"wer": ev.wer.wer, "cer": ev.cer.wer, "test_loss": alg.loss(params, test),
            "hypotheses": [" ".join(nb.best.words) for nb in ev.nbest]}


def _significance(test: Sequence[Any], a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """MAPSSWE (sclite's segments, grouped by test speaker) of run ``a``'s 1-best against run ``b``'s."""
    from privasr.metrics.mapsswe import mapsswe

    r = mapsswe([e.words for e in test], [h.split() for h in a["hypotheses"]], [h.split() for h in b["hypotheses"]],
                ids=[f"{e.speaker}-{e.utt_id}" for e in test])
    return {"mapsswe_p": r.p, "mapsswe_z": r.z, "mapsswe_better": {"A": "system", "B": "baseline"}.get(r.better,
                                                                                                      r.better)}


def _training_key(cfg: FtlRunConfig) -> dict[str, Any]:
    """The parts of the resolved config a federated run's training depends on (its checkpoint key): not the
    name, the evaluation, the other table rows or the centralised rows, so a run can be re-evaluated, renamed
    or given more rows without retraining."""
    return {k: v for k, v in cfg.raw.items() if k not in ("name", "eval", "tables", "centralised")}


def _rounds_to(losses: Sequence[float], target: float) -> int | None:
    for i, v in enumerate(losses):
        if v <= target + 1e-12:
            return i + 1
    return None


def run_ftl(cfg: FtlRunConfig, out: str | Path, *, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the experiment; write ``out/results.json`` and ``out/report.md``; return the metrics."""
    import torch

    from privasr.asr.train import an4_examples
    from privasr.federated.algorithms.ftl import FtlAlgorithm, FtlClient
    from privasr.federated.backends import run_on
    from privasr.results import write_results

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    train_utts, test_utts = _load(cfg)
    server_spk, client_spk = split_speakers([u.speaker for u in train_utts], cfg.data["seed_fraction"])
    server_utts = [u for u in train_utts if u.speaker in set(server_spk)]
    tok = _tokenizer(cfg, [u.words for u in server_utts])
    model_cfg = cfg.model.replace(input_dim=3 * train_utts[0].features.shape[1])
    cfg = copy.copy(cfg)
    object.__setattr__(cfg, "model", model_cfg)
    cmvn = cfg.data["cmvn"]
    ex_all = an4_examples(train_utts, tok, cmvn=cmvn)
    test = an4_examples(test_utts, tok, cmvn=cmvn)
    by_spk: dict[str, list[Any]] = {}
    for e in ex_all:
        by_spk.setdefault(e.speaker, []).append(e)
    server_ex = [e for s in server_spk for e in by_spk[s]]
    every = cfg.data["valid_every"]
    valid, client_ex = _hold_out(by_spk, client_spk, every)
    if not valid or not any(client_ex.values()):
        raise InputError(f"{len(client_spk)} client speakers leave no validation or no training utterances",
                         expected="more utterances per speaker or a larger valid_every")

    cache = out / "cache"
    probe = FtlAlgorithm(cfg.ftl, model_cfg, tok)
    select = None
    seed_train = server_ex
    if cfg.seed_select == "best":
        server_held, server_kept = _hold_out(by_spk, server_spk, every)
        seed_train = [e for s in server_spk for e in server_kept[s]]
        if not server_held or not seed_train:
            raise InputError(f"{len(server_spk)} server speakers leave no held-out or no training utterances",
                             expected="more utterances per speaker or a larger valid_every")
        select = (server_held, probe.loss)
    seed_params, seed_s = _central(cfg, tok, None, seed_train, cfg.seed_epochs, cache, "seed", cfg.seed_lr,
                                   cfg.seed_batch, select)
    seed_eval = _evaluate(probe, seed_params, test, cfg)
    seed_valid = probe.loss(seed_params, valid)

    def clients_for(key: str) -> list[Any]:
        if key == "speaker":
            return [FtlClient(s, tuple(client_ex[s])) for s in client_spk if client_ex[s]]
        return [FtlClient(f"group{i}", tuple(e for s in g for e in client_ex[s]))
                for i, g in enumerate(_groups(client_spk, cfg.groups))]

    def federate(name: str, ftl_cfg: Any, key: str) -> dict[str, Any]:
        alg = FtlAlgorithm(ftl_cfg, model_cfg, tok, init_state=seed_params,
                           replay=server_ex if ftl_cfg.replay_steps else None)
        clients = clients_for(key)

        def on_round(entry: Any, state: Any) -> None:
            entry.metrics["valid_loss"] = alg.loss(state["params"], valid)

        t0 = time.perf_counter()
        res = run_on(cfg.backend, alg, clients, options=cfg.backend_options,
                     checkpoint_dir=out / "checkpoint" / name, on_round=on_round, rounds=cfg.rounds,
                     sampler=cfg.sampler, seed=cfg.seed, min_clients=cfg.min_clients,
                     key={"experiment": _training_key(cfg), "variant": name, "ftl": ftl_cfg.to_dict(),
                          "clients": key})
        losses = [float(h.metrics["valid_loss"]) for h in res.history]
        ev = _evaluate(alg, res.state["params"], test, cfg)
        return {"name": name, "clients": len(clients), "client_key": key, "config": ftl_cfg.to_dict(),
                "valid_loss": losses, "train_loss": [float(h.metrics.get("loss", float("nan")))
                                                     for h in res.history],
                "seconds": time.perf_counter() - t0, **ev}

    with torch.random.fork_rng(devices=[]):
        main = federate("ftl", cfg.ftl, cfg.client_key)
        base = federate("baseline", cfg.baseline, cfg.client_key)
        rows = [federate(n, c, k) for n, c, k in cfg.variants]
    target = cfg.target_loss if cfg.target_loss is not None else min(base["valid_loss"])
    for r in (main, base, *rows):
        r["rounds_to_target"] = _rounds_to(r["valid_loss"], target)

    central: dict[str, Any] = {}
    if cfg.central_epochs is not None:
        held = set(map(id, valid))
        lower, s1 = _central(cfg, tok, None, [e for e in ex_all if id(e) not in held], cfg.central_epochs, cache,
                             "central-all", cfg.seed_lr, cfg.seed_batch)
        online, s2 = _central(cfg, tok, seed_params, [e for v in client_ex.values() for e in v], cfg.central_epochs,
                              cache, "central-online", cfg.seed_lr, cfg.seed_batch)
        central = {"centralised_all": {**_evaluate(probe, lower, test, cfg), "valid_loss": probe.loss(lower, valid),
                                       "seconds": s1},
                   "seed_plus_centralised_online": {**_evaluate(probe, online, test, cfg),
                                                    "valid_loss": probe.loss(online, valid), "seconds": s2}}

    r_main, r_base = main["rounds_to_target"], base["rounds_to_target"]
    metrics: dict[str, Any] = {
        "wer": main["wer"], "cer": main["cer"], "rounds_to_target": r_main, "rounds_to_target_baseline": r_base,
        "rounds_ratio": (r_base / r_main) if (r_main and r_base) else None,
        "wer_baseline": base["wer"], "cer_baseline": base["cer"], **_significance(test, main, base),
        "target_loss": target,
        "valid_loss": main["valid_loss"][-1], "valid_loss_baseline": base["valid_loss"][-1],
        "wer_seed": seed_eval["wer"], "cer_seed": seed_eval["cer"], "valid_loss_seed": seed_valid,
        "rounds": cfg.rounds, "server_speakers": len(server_spk), "client_speakers": len(client_spk),
        "clients": main["clients"], "valid_utterances": len(valid), "test_utterances": len(test),
        "units": tok.vocab_size, "seed_model_s": seed_s, "total_s": time.perf_counter() - t_start,
        **_seed_selection(cache, cfg.seed_select),
    }
    runs = {"ftl": main, "baseline": base, **{r["name"]: r for r in rows}}
    write_results(out, config=cfg.raw, seed=cfg.seed, metrics=metrics,
                  extra={"runs": runs, "centralised": central, "argv": list(argv) if argv else None})
    (out / "report.md").write_text(_report(cfg, metrics, runs, central, seed_eval, seed_valid, argv),
                                   encoding="utf-8")
    return metrics


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.2f}%"


def _report(cfg: FtlRunConfig, m: Mapping[str, Any], runs: Mapping[str, Any], central: Mapping[str, Any],
            seed_eval: Mapping[str, Any], seed_valid: float, argv: Sequence[str] | None) -> str:
    cmd = " ".join(argv) if argv else f"privasr ftl run --config ... --out ... ({cfg.name})"
    lines = [f"# Federated transfer learning: {cfg.name}", "", f"Command: `{cmd}`", "",
             f"Data: {cfg.data['kind']}; {m['server_speakers']} server speakers (seed model, replay), "
             f"{m['client_speakers']} client speakers, {m['valid_utterances']} validation and "
             f"{m['test_utterances']} test utterances; {m['units']} output units. {cfg.rounds} rounds, "
             f"sampler {cfg.sampler}, backend {cfg.backend}. Target validation loss: {m['target_loss']:.4f}"
             + (" (the best the baseline reaches)" if cfg.target_loss is None else "") + ".", "",
             "| system | clients | valid loss | rounds to target | test WER | test CER |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, c in central.items():
        lines.append(f"| {name.replace('_', ' ')} | | {c['valid_loss']:.4f} | | {_pct(c['wer'])} | {_pct(c['cer'])} |")
    lines.append(f"| seed model | | {seed_valid:.4f} | | {_pct(seed_eval['wer'])} | {_pct(seed_eval['cer'])} |")
    for name, r in runs.items():
        rt = r["rounds_to_target"]
        lines.append(f"| {name} ({r['client_key']}; server {r['config']['server']['name']}, "
                     f"{r['config']['weighting']} weighting"
                     + (f", replay {r['config']['replay_steps']}" if r['config']['replay_steps'] else "")
                     + f") | {r['clients']} | {r['valid_loss'][-1]:.4f} | {'' if rt is None else rt} | "
                     f"{_pct(r['wer'])} | {_pct(r['cer'])} |")
    ratio = m["rounds_ratio"]
    lines += ["", f"Rounds to target: {m['rounds_to_target']} vs {m['rounds_to_target_baseline']} for the baseline"
              + (f" ({ratio:.2f}x fewer)." if ratio else "."),
              f"Test WER, system against baseline: MAPSSWE p = {m['mapsswe_p']:.3g} (better: {m['mapsswe_better']}).",
              "", f"Decoding: {cfg.eval_method}, {cfg.eval_options}. privasr {__version__}. WER on words, CER on "
              "characters with the word boundary as a character."]
    return "\n".join(lines) + "\n"
