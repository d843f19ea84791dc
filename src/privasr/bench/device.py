"""What a phone pays for personalisation: rescoring latency and model size of the NNLM on one core (PyTorch
fp32, ONNX fp32, ONNX int8 per channel and per tensor, TorchScript int8) and the peak memory of an FMP client
and a fedlm client round.

**Model**: the ``small-transformer`` NNLM the FMP and fedlm AMI configs share (``runs/cache/nnlm.pt`` under the
current folder, written by ``privasr fmp run --config configs/fmp-ami-adapted.yaml``) when it is there; else a
freshly initialised model of that preset (speed and size do not depend on the weights; the int8 score change
does) over the AMI-train vocabulary (at most 12,000 words) or, without ``../shared/data``, the synthetic corpus's
background text. ``config.model_source`` says which.

**Data**: the first 300 (``--quick``: 30) 10-best lists of ``ami-tts-nbest-adapted`` test (the real N-best
lists), else the synthetic corpus's dev + test lists.

**Latency**: one utterance = ``score_batch`` of its 10-best list, on one thread (``torch.set_num_threads(1)``,
onnxruntime ``intra_op_num_threads=1``); the systems take turns utterance by utterance (the order rotating), so
a busy machine slows them alike; p50 and p95 in milliseconds after 10 warm-up lists. PyTorch fp32 is
:class:`~privasr.lm.neural.scorer.NeuralLM` (prefix-shared trie scoring); the exports are scored by
:mod:`privasr.lm.neural.export` (padded batch, the output layer once per distinct prefix and next word).
**Size**: the bytes on disk of the checkpoint, and of each exported model file. **Agreement**: per-sentence
natural-log differences from PyTorch fp32 on every hypothesis timed (max and mean absolute).

**Memory** (each in a fresh Python process, its peak resident set: ``VmHWM`` of ``/proc/self/status``, else
``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which on Linux carries the parent's peak across fork and exec; an
import-only process is the baseline, and the increments over it are reported too):

* *FMP client*: the int8 ONNX scorer, then the client of the first test meeting (its lists in 11 time-ordered
  groups) runs all its FMP rounds (its cache of decoded words and their counts), the personal log-bias over the
  vocabulary is formed from its cache (eq. 2, ``log_factor``) and its lists are rescored with that bias;
  ``fmp_cache_bias_peak_bytes`` is the tracemalloc peak of the rounds, the bias and the biased scoring alone
  (numpy and Python allocations; onnxruntime's own buffers are in the process figure);
* *fedlm client round*: the PyTorch checkpoint, then one :meth:`FedLmAlgorithm.client_update
  <privasr.federated.algorithms.fedlm.FedLmAlgorithm.client_update>` (local SGD, default settings) on the
  first test meeting's 1-best hypotheses.

Metrics: ``latency_ms`` (p50/p95 per system), ``size_bytes``, ``int8_size_ratio`` (ONNX int8 / ONNX fp32 model
file; target <= 0.30), ``int8_size_vs_checkpoint``, ``speedup_int8_p50`` / ``_p95`` (PyTorch fp32 / ONNX int8
latency; target >= 2), ``speedup_onnx_fp32_p50``, ``speedup_int8_per_tensor_p50``, ``speedup_torchscript_int8_p50``,
``max_abs_diff_nats`` and
``mean_abs_diff_nats`` per export, ``memory_*`` (bytes).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from privasr.results import write_results

__all__ = ["run", "find_checkpoint"]

PRESET = "small-transformer"
CHECKPOINT = Path("runs") / "cache" / "nnlm.pt"


def find_checkpoint() -> Path | None:
    """``runs/cache/nnlm.pt`` under the current folder when it is a ``small-transformer`` checkpoint."""
    if not CHECKPOINT.is_file():
        return None
    from privasr.errors import InputError
    from privasr.lm.neural.checkpoint import load_checkpoint
    from privasr.lm.neural.models import NeuralLMConfig

    try:
        ck = load_checkpoint(CHECKPOINT)
    except InputError:
        return None
    want = NeuralLMConfig.preset(PRESET)
    same = all(getattr(ck.config, k) == getattr(want, k) for k in ("arch", "embed_dim", "ffn_dim", "layers", "heads"))
    return CHECKPOINT if same else None


def _task(seed: int, n: int) -> tuple[str, list[Any], list[tuple[str, ...]]]:
    """(description, N-best records, vocabulary text)."""
    from privasr.paths import data_dir

    d = data_dir()
    if d is not None and (d / "ami-tts-nbest-adapted" / "test.jsonl.xz").is_file() and (d / "ami-transcripts").is_dir():
        from privasr.corpus.formats.ami_tts import read_ami_tts
        from privasr.corpus.sources import ami_sentences

        return ("ami-tts-nbest-adapted test", read_ami_tts(d / "ami-tts-nbest-adapted" / "test.jsonl.xz")[:n],
                ami_sentences("train", d))
    from privasr.synth import SynthConfig, generate

    corpus = generate(SynthConfig.preset("small", seed=seed))
    return ("synthetic corpus (no ../shared/data)", [*corpus.dev, *corpus.test][:n],
            [tuple(s.split()) for s in corpus.background])


def _percentiles(ts: list[float]) -> dict[str, float]:
    a = np.asarray(ts) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "mean": float(a.mean())}


_MEM_COMMON = """
import json, resource, sys, time, tracemalloc
import numpy as np
import onnxruntime, torch
torch.set_num_threads(1)
from privasr.lm.neural import export, checkpoint
from privasr.federated.algorithms import fmp, fmp_data, fedlm
args = json.loads(sys.argv[1])
def rss():
    # VmHWM: this process's peak resident set (ru_maxrss would carry the parent's peak across fork + exec)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

_MEM_BASE = _MEM_COMMON + """
print(json.dumps({"maxrss": rss()}))
"""

_MEM_FMP = _MEM_COMMON + """
from privasr.corpus.formats.nbest_jsonl import read_nbest
nbests = read_nbest(args["nbest"])
lm = export.OnnxNeuralLM(args["export"], threads=1)
vocab = lm.vocab
totals = np.array([s.ln_total for nb in nbests for s in lm.score_batch([h.words for h in nb.hyps])])
offsets = np.cumsum([0] + [len(nb.hyps) for nb in nbests])
client = fmp_data.build_clients(nbests, totals, offsets, vocab, "client", rounds=10)[0]
u = fmp_data.background_unigram([h.words for nb in nbests for h in nb.hyps[:1]], vocab)
cfg = fmp.FmpConfig()
alg = fmp.FmpAlgorithm(cfg, u)
rng = np.random.default_rng(0)
tracemalloc.start()
st = None
for r in range(len(client.groups)):
    _, st = alg.client_update({"round": r, "qbar": np.zeros(0)}, client, st, rng)
ids = np.arange(len(vocab))
q = fmp.personal_unigram(ids, st["cache_ids"], st["cache_counts"], u, cfg.smoothing)
bias = fmp.log_factor(u, None, q, cfg)
biased = lm.with_bias(bias)
for nb in nbests:
    biased.score_batch([h.words for h in nb.hyps])
cur, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
print(json.dumps({"maxrss": rss(), "traced_peak": peak, "cache_words": int(len(st["cache_ids"])),
                  "utterances": sum(len(g) for g in client.groups), "client": client.id}))
"""

_MEM_FEDLM = _MEM_COMMON + """
from privasr.corpus.formats.nbest_jsonl import read_nbest
nbests = read_nbest(args["nbest"])
ck = checkpoint.load_checkpoint(args["checkpoint"])
vocab = ck.vocab
sents = tuple(tuple(vocab.encode(nb.hyps[0].words)) for nb in nbests if nb.hyps and nb.hyps[0].words)
client = fedlm.FedLmClient("client", sents)
params = {k: v.detach().cpu().numpy().copy() for k, v in ck.model.named_parameters()}
alg = fedlm.FedLmAlgorithm(fedlm.FedLmConfig(), ck.config, vocab, init_state=params)
rng = np.random.default_rng(0)
payload = alg.broadcast(alg.init(rng), 0)
t0 = time.perf_counter()
update, _ = alg.client_update(payload, client, None, rng)
print(json.dumps({"maxrss": rss(), "round_s": time.perf_counter() - t0, "sentences": len(sents),
                  "words": client.n_words, "upload_bytes": int(sum(a.nbytes for a in update.arrays.values()))}))
"""


def _measure(script: str, args: dict[str, Any]) -> dict[str, Any]:
    """Run ``script`` in a fresh interpreter (same ``sys.path``) and return the JSON it prints."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run([sys.executable, "-c", script, json.dumps(args)], capture_output=True, text=True,
                         env=env, timeout=1800, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"memory measurement failed: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json`` and ``out/report.md``; return the metrics."""
    import torch

    from privasr.corpus.formats.nbest_jsonl import write_nbest
    from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint
    from privasr.lm.neural.export import OnnxNeuralLM, TorchScriptNeuralLM, export_lm
    from privasr.lm.neural.models import NeuralLMConfig, build_model
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.neural.vocab import Vocabulary

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    n_lists = 30 if quick else 300
    data, recs, text = _task(seed, n_lists)
    lists = [[h.words for h in nb.hyps[:10]] for nb in recs]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        found = find_checkpoint()
        if found is not None:
            ck_path = found
            ck = load_checkpoint(ck_path)
            model, vocab = ck.model, ck.vocab
            source = f"trained checkpoint {found} (the FMP/fedlm AMI configs' NNLM)"
        else:
            vocab = Vocabulary.build(text, max_size=12_000)
            model = build_model(NeuralLMConfig.preset(PRESET), vocab)
            ck_path = tmp / "nnlm.pt"
            save_checkpoint(ck_path, model, vocab, model.config)
            source = f"freshly initialised {PRESET} (no runs/cache/nnlm.pt here)"
        systems: dict[str, Any] = {"pytorch_fp32": NeuralLM(model, vocab)}
        sizes = {"checkpoint": ck_path.stat().st_size}
        export_s = {}
        for name, to, int8, per_channel in (("onnx_fp32", "onnx", False, True), ("onnx_int8", "onnx", True, True),
                                            ("onnx_int8_per_tensor", "onnx", True, False),
                                            ("torchscript_int8", "torchscript", True, True)):
            t0 = time.perf_counter()
            info = export_lm(model, vocab, tmp / name, to=to, int8=int8, per_channel=per_channel)
            export_s[name] = time.perf_counter() - t0
            sizes[name] = info.model_bytes
            systems[name] = (OnnxNeuralLM if to == "onnx" else TorchScriptNeuralLM)(tmp / name, threads=1)

        # agreement with PyTorch fp32, every hypothesis timed
        hyps = [h for lst in lists for h in lst]
        ref = np.array([s.ln_total for s in systems["pytorch_fp32"].score_batch(hyps)])
        agree = {}
        for name in list(systems)[1:]:
            d = np.abs(np.array([s.ln_total for s in systems[name].score_batch(hyps)]) - ref)
            agree[name] = {"max_abs_diff_nats": float(d.max()), "mean_abs_diff_nats": float(d.mean())}

        # latency: systems take turns per utterance, rotating the order
        names = list(systems)
        for lst in lists[:10]:
            for name in names:
                systems[name].score_batch(lst)
        times: dict[str, list[float]] = {n: [] for n in names}
        for k, lst in enumerate(lists):
            for name in names[k % len(names):] + names[:k % len(names)]:
                t0 = time.perf_counter()
                systems[name].score_batch(lst)
                times[name].append(time.perf_counter() - t0)
        latency = {n: _percentiles(t) for n, t in times.items()}

        # memory, each in a fresh process: the first test meeting as the client
        first = recs[0].client
        client_recs = [r for r in recs if r.client == first] if first is not None else recs[:30]
        nbest_file = tmp / "client.jsonl"
        write_nbest(nbest_file, [r if r.client is not None else dataclasses.replace(r, client="client")
                                 for r in client_recs])
        margs = {"nbest": str(nbest_file), "export": str(tmp / "onnx_int8"), "checkpoint": str(ck_path)}
        base = _measure(_MEM_BASE, margs)
        fmp_mem = _measure(_MEM_FMP, margs)
        fedlm_mem = _measure(_MEM_FEDLM, margs)
    from privasr.bench.device_round import measure as measure_rounds

    rounds = measure_rounds(quick=quick)

    p50 = {n: latency[n]["p50"] for n in names}
    p95 = {n: latency[n]["p95"] for n in names}
    metrics: dict[str, Any] = {
        "lists": len(lists), "hypotheses": len(hyps), "vocab_size": len(vocab),
        "parameters": int(sum(p.numel() for p in model.parameters())), "threads": 1,
        "latency_ms": latency, "size_bytes": sizes,
        "int8_size_ratio": sizes["onnx_int8"] / sizes["onnx_fp32"],
        "int8_size_vs_checkpoint": sizes["onnx_int8"] / sizes["checkpoint"],
        "torchscript_int8_size_ratio": sizes["torchscript_int8"] / sizes["onnx_fp32"],
        "speedup_int8_p50": p50["pytorch_fp32"] / p50["onnx_int8"],
        "speedup_int8_p95": p95["pytorch_fp32"] / p95["onnx_int8"],
        "speedup_onnx_fp32_p50": p50["pytorch_fp32"] / p50["onnx_fp32"],
        "speedup_torchscript_int8_p50": p50["pytorch_fp32"] / p50["torchscript_int8"],
        "speedup_int8_per_tensor_p50": p50["pytorch_fp32"] / p50["onnx_int8_per_tensor"],
        "agreement": agree, "export_s": export_s,
        "memory_baseline_maxrss_bytes": base["maxrss"],
        "memory_fmp_client_maxrss_bytes": fmp_mem["maxrss"],
        "memory_fmp_client_over_baseline_bytes": fmp_mem["maxrss"] - base["maxrss"],
        "fmp_cache_bias_peak_bytes": fmp_mem["traced_peak"],
        "fmp_client": {k: fmp_mem[k] for k in ("client", "utterances", "cache_words")},
        "memory_fedlm_round_maxrss_bytes": fedlm_mem["maxrss"],
        "memory_fedlm_round_over_baseline_bytes": fedlm_mem["maxrss"] - base["maxrss"],
        "fedlm_round": {k: fedlm_mem[k] for k in ("round_s", "sentences", "words", "upload_bytes")},
        "device_round": rounds,
    }
    config = {"benchmark": "device", "data": data, "model_source": source, "model": model.config.to_dict(),
              "systems": names, "onnxruntime_threads": 1, "torch_threads": 1,
              "int8": "dynamic, the export's defaults: ONNX MatMul/Gemm/LSTM/Gather (onnxruntime quantize_dynamic, "
                      "QInt8 per channel); TorchScript nn.Linear (per channel), nn.LSTM, nn.Embedding (torch.ao "
                      "quantize_dynamic)"}
    write_results(out, config=config, seed=seed, metrics=metrics)
    (out / "report.md").write_text(_report(config, metrics), encoding="utf-8")
    return metrics


def _report(config: dict[str, Any], m: dict[str, Any]) -> str:
    mb = 1e6
    lines = [f"# On-device cost of the NNLM ({config['model_source']})", "",
             f"Data: {config['data']}, {m['lists']} 10-best lists ({m['hypotheses']} hypotheses); vocabulary "
             f"{m['vocab_size']:,} words, {m['parameters']:,} parameters; one thread. Command: "
             "`privasr bench device --out DIR`.", "",
             "| system | size on disk (MB) | p50 ms / utterance | p95 ms | speed-up vs PyTorch (p50) | "
             "max / mean abs diff (nats / sentence) |", "|---|---:|---:|---:|---:|---:|"]
    lat = m["latency_ms"]
    for n in config["systems"]:
        size = m["size_bytes"]["checkpoint" if n == "pytorch_fp32" else n] / mb
        ag = m["agreement"].get(n)
        diff = "-" if ag is None else f"{ag['max_abs_diff_nats']:.2g} / {ag['mean_abs_diff_nats']:.2g}"
        lines.append(f"| {n} | {size:.2f} | {lat[n]['p50']:.2f} | {lat[n]['p95']:.2f} | "
                     f"{lat['pytorch_fp32']['p50'] / lat[n]['p50']:.2f} | {diff} |")
    lines += ["", f"int8 / fp32 ONNX size: {m['int8_size_ratio']:.3f} (target <= 0.30); int8 / checkpoint: "
              f"{m['int8_size_vs_checkpoint']:.3f}. PyTorch fp32 / ONNX int8 latency: p50 {m['speedup_int8_p50']:.2f}x, "
              f"p95 {m['speedup_int8_p95']:.2f}x (target >= 2).", "",
              "| client process (peak RSS) | MB | over an import-only process (MB) |", "|---|---:|---:|",
              f"| import only (numpy, torch, onnxruntime, privasr) | {m['memory_baseline_maxrss_bytes'] / mb:.1f} | - |",
              f"| FMP client: int8 scorer, {m['fmp_client']['utterances']} utterances, cache + bias | "
              f"{m['memory_fmp_client_maxrss_bytes'] / mb:.1f} | {m['memory_fmp_client_over_baseline_bytes'] / mb:.1f} |",
              f"| fedlm client round: {m['fedlm_round']['sentences']} sentences of local SGD | "
              f"{m['memory_fedlm_round_maxrss_bytes'] / mb:.1f} | {m['memory_fedlm_round_over_baseline_bytes'] / mb:.1f} |",
              "", f"FMP cache + bias + biased scoring (tracemalloc peak): {m['fmp_cache_bias_peak_bytes'] / 1e3:.0f} kB "
              f"({m['fmp_client']['cache_words']} cached words). fedlm upload: {m['fedlm_round']['upload_bytes'] / mb:.1f} MB "
              f"(fp32 delta), round {m['fedlm_round']['round_s']:.1f} s.", ""]
    r = m["device_round"]
    d, s = r["device"], r["simulation"]
    lines += ["## A device round against the simulation's client (FMP, the same data, one process)", "",
              f"{r['devices']} devices of the {r['corpus']} synthetic corpus, {r['rounds']} rounds, Flower's message "
              "path in process (privasr.bench.device_round).", "",
              "| | device | simulation | device / simulation |", "|---|---:|---:|---:|",
              f"| round, mean (ms) | {d['round_s_mean'] * 1e3:.1f} | {s['round_s_mean'] * 1e3:.1f} | "
              f"{r['round_ratio']:.2f} |",
              f"| round, p95 (ms) | {d['round_s_p95'] * 1e3:.1f} | {s['round_s_p95'] * 1e3:.1f} | "
              f"{r['round_ratio_p95']:.2f} |",
              f"| bytes down per round | {d['bytes_down_round']:.0f} | {s['bytes_down_round']:.0f} | "
              f"{r['bytes_down_ratio']:.2f} |",
              f"| bytes up per round | {d['bytes_up_round']:.0f} | {s['bytes_up_round']:.0f} | "
              f"{r['bytes_up_ratio']:.2f} |",
              f"| peak traced memory (kB) | {r['peak_bytes']['device'] / 1e3:.0f} | "
              f"{r['peak_bytes']['simulation'] / 1e3:.0f} | {r['peak_ratio']:.2f} |", "",
              f"The device's own preparation (files, NNLM scores, ids) is {r['prepare_share']:.0%} of its round time "
              f"(mean {r['prepare_s_mean'] * 1e3:.1f} ms a round); without it, a device round takes "
              f"{r['round_ratio_without_prepare']:.2f}x the simulation's. The bundle, downloaded once: "
              f"{r['bundle_bytes'] / 1e3:.0f} kB, {r['bundle_vs_rounds']:.1f}x the run's per-round traffic of a "
              "device.", ""]
    return "\n".join(lines)
