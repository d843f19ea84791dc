"""Neural LM training throughput on the CPU or a CUDA device, as a fraction of its measured matmul rate.

``privasr bench nnlm-train --out DIR`` trains the ``small-transformer`` and ``small-lstm`` presets with the
real trainer (:func:`privasr.lm.neural.train.train_lm`: padded sentence batches of 32, Adam, clipping) for a
fixed number of steps on the AMI training transcripts (``../shared/golden/kenlm-mkn/ami_train.txt.xz``, the
normalised text, full vocabulary) when present, else on synthetic Zipf-distributed sentences of AMI-like length
and vocabulary size. Each model's timed steps run in :data:`ROUNDS` rounds (resumed from the checkpoint of the
previous one; 2 with ``--quick``), and just before each round ``torch.matmul`` on 1024 x 1024 fp32 matrices is
measured (best of 3, the same thread count). A model's ``fraction_of_matmul`` is the median over its rounds of
the round's useful GFLOP/s over the matmul rate measured just before it: on a shared machine the matmul rate
swings by a third from one minute to the next, so each throughput is compared with a reference taken at the
same time (``*_fraction_of_matmul_rounds`` and ``*_matmul_gflop_per_s_rounds`` list the rounds;
``matmul_gflop_per_s`` is the median of all rounds' rates).

FLOPs per training token are counted as ``6 x`` the parameters used in matrix products (all linear layers,
LSTM gate matrices and the output softmax layer; embedding look-ups excluded) plus, for the Transformer,
``12 x layers x embed_dim x T`` for the attention scores and their weighted sums (forward and backward), with
``T`` the padded length of the batches (token-weighted mean over the timed batches). Padding tokens are
not counted as tokens. Everything is measured twice: with torch's default thread count and with one thread
(suffix ``_1thread``), because on a shared machine the multi-threaded figures suffer most from other load.

With ``--device cuda`` the paper-sized presets are measured too (``paper000_transformer_*``: d 256, 3 blocks;
``paper001_lstm_*``: 2 x 512), each in fp32 (no suffix; against an 8192 x 8192 fp32 matmul at torch's default
precision, no TF32) and with bf16 autocast (suffix ``_amp``; against a bf16 matmul of the same size), at
batches of 32 sentences (the size the experiments train with) and at the larger batches of
:data:`CUDA_BATCH_SIZES` (suffix ``_b256``, ``_b1024``, then ``_amp`` for bf16);
``*_best_fraction_of_matmul`` is the best fp32 fraction and ``*_best_fraction_setting`` its batch size.

On the CPU the run also times the trainer's dropout (:mod:`privasr.lm.neural.dropout`, torch's masks drawn by the
compiled module) against ``F.dropout`` on 2^20 elements: ``dropout_ns_per_element``,
``dropout_torch_ns_per_element``, ``dropout_speedup_vs_torch`` and ``dropout_compiled_masks`` (whether the
compiled masks are in use; without them both time torch's dropout). It also times the training loss's output
layer (512 rows, hidden size 128, 8,803 words; logits, softmax cross-entropy and gradients) with its softmax rows
computed by the compiled :mod:`privasr.lm.neural._nll` and with torch's operations: ``output_layer_ms``,
``output_layer_torch_rows_ms``, ``output_rows_speedup_vs_torch`` and ``output_rows_compiled`` (without the module
both time torch's operations).

The ``small-lstm-class`` preset (the same LSTM with a class-factored softmax of ``sqrt(V)`` frequency-binned
classes) is timed too: ``class_softmax_speedup_vs_full`` is its tokens/s over the full-softmax ``small-lstm``'s.
Its output FLOPs count the class layer and ``V / C`` word rows per token (frequency bins hold equal token mass).

Metrics per model (``transformer_*``, ``lstm_*``, ``lstm_class_*``): ``tokens_per_s``, ``gflop_per_s`` (useful FLOPs),
``fraction_of_matmul`` (the median of the rounds' fractions), ``flops_per_token``, ``parameters``, and
``ami_epoch_s`` (the training text's tokens, ``</s>`` included, / tokens_per_s: one epoch's training time,
validation excluded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of_interleaved, device_name, matmul_flops
from privasr.errors import ConfigError
from privasr.results import write_results

__all__ = ["run", "matmul_gflops", "flops_per_token", "load_text", "dropout_speed", "output_layer_speed"]


def matmul_gflops(n: int = 1024, repeats: int = 5, device: str = "cpu", dtype: str = "float32") -> float:
    """Best-of-``repeats`` ``torch.matmul`` rate of ``n x n`` matrices, in GFLOP/s.

    >>> matmul_gflops(64, repeats=1) > 0
    True
    """
    return matmul_flops(n, repeats, device=device, dtype=dtype) / 1e9


def flops_per_token(model: Any, mean_padded_len: float) -> float:
    """Training FLOPs per token of a :class:`TransformerLM` or :class:`LstmLM` (see the module docstring).

    >>> from privasr.lm.neural import NeuralLMConfig, Vocabulary, build_model
    >>> v = Vocabulary(("<unk>", "<s>", "</s>", "a"))
    >>> m = build_model(NeuralLMConfig.preset("tiny-lstm"), v)
    >>> flops_per_token(m, 10) == 6 * (4 * 24 * (16 + 24) + 4 * 24 * (24 + 24) + 24 * 4)
    True
    """
    from torch import nn

    from privasr.lm.neural.models import ClassSoftmax, LstmLM

    matmul = 0
    skip: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, ClassSoftmax):
            # the class layer, and the word rows of one class: frequency bins hold equal token mass, so a token's
            # class is about uniform over the C classes and its expected size is V / C
            matmul += mod.in_features * (mod.num_classes + mod.out_features / mod.num_classes)
            skip.update((id(mod.cls), id(mod.word)))
        elif isinstance(mod, nn.Linear) and id(mod) not in skip:
            matmul += mod.in_features * mod.out_features
        elif isinstance(mod, nn.LSTM):
            for layer in range(mod.num_layers):
                matmul += getattr(mod, f"weight_ih_l{layer}").numel() + getattr(mod, f"weight_hh_l{layer}").numel()
    flops = 6.0 * matmul
    if not isinstance(model, LstmLM):
        cfg = model.config
        flops += 12.0 * cfg.layers * cfg.embed_dim * mean_padded_len
    return flops


def load_text(seed: int) -> tuple[str, list[list[str]]]:
    """(description, sentences): the AMI training transcripts, or synthetic ones of the same shape."""
    from privasr.paths import golden_dir

    g = golden_dir()
    if g is not None and (g / "kenlm-mkn" / "ami_train.txt.xz").is_file():
        from privasr.lm.ngram.counts import read_sentences

        sents = [s for s in read_sentences(g / "kenlm-mkn" / "ami_train.txt.xz") if s]
        return "AMI train transcripts (golden kenlm-mkn/ami_train.txt.xz)", sents
    rng = np.random.default_rng(seed)
    vocab = 12000
    ranks = np.arange(1, vocab + 1)
    p = 1.0 / ranks
    p /= p.sum()
    lengths = np.clip(rng.geometric(1 / 14, size=28000), 1, 80)
    words = rng.choice(vocab, size=int(lengths.sum()), p=p)
    sents, i = [], 0
    for n in lengths:
        sents.append([f"w{k}" for k in words[i:i + n]])
        i += n
    return "synthetic Zipf sentences (AMI-like: 28k sentences, mean length 14, 12k word types)", sents


def dropout_speed(n: int = 1 << 20, rounds: int = 7) -> dict[str, Any]:
    """Dropout (p 0.1) of ``n`` float32 elements on the CPU: :func:`privasr.lm.neural.dropout.dropout` against
    ``F.dropout`` (which gives the same values), interleaved, best of ``rounds`` each, in ns per element.

    >>> m = dropout_speed(4096, rounds=1)
    >>> m["dropout_speedup_vs_torch"] > 0 and isinstance(m["dropout_compiled_masks"], bool)
    True
    """
    import torch
    import torch.nn.functional as F

    from privasr.lm.neural.dropout import dropout, fast_masks

    x = torch.ones(n)
    best, _ = best_of_interleaved({"ours": lambda: dropout(x, 0.1), "torch": lambda: F.dropout(x, 0.1, True)},
                                  rounds)
    return {"dropout_ns_per_element": best["ours"] / n * 1e9, "dropout_torch_ns_per_element": best["torch"] / n * 1e9,
            "dropout_speedup_vs_torch": best["torch"] / best["ours"], "dropout_compiled_masks": fast_masks()}


def output_layer_speed(rows: int = 512, dim: int = 128, vocab: int = 8803, rounds: int = 7) -> dict[str, Any]:
    """The CPU training loss's output layer (logits, softmax cross-entropy and all gradients; ``rows`` tokens,
    hidden size ``dim``, ``vocab`` words: the small Transformer's on AMI-sized batches) with its rows computed by
    the compiled :mod:`privasr.lm.neural._nll` against torch's operations, interleaved, best of ``rounds``, in ms.

    >>> m = output_layer_speed(8, 4, 50, rounds=1)
    >>> m["output_rows_speedup_vs_torch"] > 0 and isinstance(m["output_rows_compiled"], bool)
    True
    """
    import torch

    from privasr.lm.neural.train import _LinearNll, compiled_output_rows

    g = torch.Generator().manual_seed(0)
    h = torch.randn(rows, dim, generator=g, requires_grad=True)
    w = (torch.randn(vocab, dim, generator=g) * dim ** -0.5).requires_grad_()
    b = torch.zeros(vocab, requires_grad=True)
    t = torch.randint(0, vocab, (rows,), generator=g)
    best, _ = best_of_interleaved({"compiled": lambda: _LinearNll.apply(h, w, b, t, True).backward(),
                                   "torch": lambda: _LinearNll.apply(h, w, b, t, False).backward()}, rounds)
    return {"output_layer_ms": best["compiled"] * 1e3, "output_layer_torch_rows_ms": best["torch"] * 1e3,
            "output_rows_speedup_vs_torch": best["torch"] / best["compiled"],
            "output_rows_compiled": compiled_output_rows()}


_MODEL_KEYS = ("_preset", "_parameters", "_vocab_size")
_STATIC = (*_MODEL_KEYS, "_flops_per_token", "_padding_fraction", "_mean_padded_len")


def run(out: Path, quick: bool = False, seed: int = 0, device: str = "cpu") -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    import torch

    from privasr.lm.neural.train import TrainOptions

    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but torch sees no CUDA device", expected="cpu, or a machine with CUDA")
    desc, sents = load_text(seed)
    tokens_total = sum(len(s) + 1 for s in sents)
    rng = np.random.default_rng(seed)
    valid = [sents[i] for i in rng.choice(len(sents), size=64, replace=False)]
    steps = 15 if quick else 60
    warm = 3
    rounds = 2 if quick else ROUNDS
    opts = TrainOptions(batch_size=32, max_epochs=1, max_steps=steps + warm, patience=0, schedule="constant",
                        eval_batch_size=64, amp=False)
    models = _CPU_MODELS if not cuda else _CPU_MODELS + _CUDA_MODELS
    default_threads = torch.get_num_threads()
    metrics: dict[str, Any] = {"threads": default_threads, "text": desc, "text_tokens": tokens_total,
                               "text_sentences": len(sents), "steps": steps}
    if not cuda:
        # One thread and all threads: on a shared machine the multi-threaded figures suffer most from other load.
        for threads in sorted({1, default_threads}, reverse=True):
            torch.set_num_threads(threads)
            sfx = "" if threads == default_threads else f"_{threads}thread"
            try:
                measured = _measure(sents, valid, opts, warm, steps, seed, models, rounds=rounds)
                metrics.update({k if (sfx and k.endswith(_STATIC)) else k + sfx: v for k, v in measured.items()})
            finally:
                torch.set_num_threads(default_threads)
    else:
        # fp32 and mixed precision (bf16 autocast), each against the matmul rate of its own dtype; the paper-sized
        # models also at the larger batches a GPU user trains with (suffix _b<size>)
        for amp, sfx in ((False, ""), (True, "_amp")):
            measured = _measure(sents, valid, opts.replace(amp=amp), warm, steps, seed, models, device=device,
                                mm_dtype="bfloat16" if amp else "float32", rounds=rounds)
            metrics.update({k if (sfx and k.endswith(_STATIC)) else k + sfx: v for k, v in measured.items()})
            for bs in CUDA_BATCH_SIZES:
                big = opts.replace(amp=amp, batch_size=bs, max_epochs=10_000)  # max_steps ends it, not epochs
                measured = _measure(sents, valid, big, warm, steps, seed, _CUDA_MODELS, device=device,
                                    mm_dtype="bfloat16" if amp else "float32", rounds=rounds)
                # per batch size everything but the model's identity (padding and FLOPs/token change with it)
                metrics.update({f"{k}_b{bs}{sfx}": v for k, v in measured.items() if not k.endswith(_MODEL_KEYS)})
        for name, _ in _CUDA_MODELS:
            best = max((metrics[f"{name}_fraction_of_matmul{k}"], k) for k in
                       ["", *(f"_b{bs}" for bs in CUDA_BATCH_SIZES)])
            metrics[f"{name}_best_fraction_of_matmul"] = best[0]
            metrics[f"{name}_best_fraction_setting"] = f"fp32, batch {best[1][2:] or opts.batch_size}"
    if not cuda:
        metrics.update(dropout_speed())
        metrics.update(output_layer_speed())
    write_results(out, config={"benchmark": "nnlm-train", "quick": quick, "batch_size": opts.batch_size,
                               "steps": steps, "warmup_steps": warm, "rounds": rounds, "models": dict(models),
                               "device": device, "device_name": device_name(device)},
                  seed=seed, metrics=metrics)
    return metrics


ROUNDS = 4
"""Each model's timed steps are split into this many rounds, each paired with a matmul measurement just before it."""
CUDA_BATCH_SIZES = (256, 1024)
"""On CUDA, the paper-sized models are also timed at these batch sizes (sentences per batch)."""
_CPU_MODELS = (("transformer", "small-transformer"), ("lstm", "small-lstm"), ("lstm_class", "small-lstm-class"))
_CUDA_MODELS = (("paper000_transformer", "paper000-transformer"), ("paper001_lstm", "paper001-lstm"))


def _mean_padded_len(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """The padded length of ``batches`` (sentence indexes into ``lengths``) weighted by their tokens: what the
    attention FLOPs of a token scale with."""
    return float(sum(lengths[b].max() * lengths[b].sum() for b in batches) / sum(lengths[b].sum() for b in batches))


def _measure(sents: list[list[str]], valid: list[list[str]], opts: Any, warm: int, steps: int,
             seed: int, models: tuple[tuple[str, str], ...] = _CPU_MODELS, device: str = "cpu",
             mm_dtype: str = "float32", rounds: int = ROUNDS) -> dict[str, Any]:
    """The models' training throughput at the current thread count (or on ``device``), each against the matmul
    rate measured just before each of its ``rounds`` timed stretches (see the module docstring)."""
    import tempfile

    from privasr.lm.neural.models import NeuralLMConfig
    from privasr.lm.neural.train import _epoch_batches, encode_sentences, train_lm

    tokens_total = sum(len(s) + 1 for s in sents)
    n = 1024 if device == "cpu" else 8192
    metrics: dict[str, Any] = {}
    refs: list[float] = []
    bounds = [warm + (steps * r) // rounds for r in range(rounds + 1)]
    for name, preset in models:
        cfg = NeuralLMConfig.preset(preset)
        # warm-up steps (allocator, kernels) are trained but not timed: train `warm` steps, then resume a round of
        # steps at a time, each after a matmul measurement
        secs, toks, rates = [], [], []
        with tempfile.TemporaryDirectory() as tmp:
            done = train_lm(sents, valid, cfg, opts.replace(max_steps=warm), out_dir=tmp, seed=seed,
                            progress=False, device=device)
            for stop in bounds[1:]:
                rates.append(matmul_gflops(n, repeats=3, device=device, dtype=mm_dtype))
                res = train_lm(sents, valid, cfg, opts.replace(max_steps=stop), out_dir=tmp, seed=seed,
                               progress=False, resume=True, device=device)
                # training time and tokens accumulate over resumes: take this round's part
                secs.append(res.metrics["train_seconds"] - done.metrics["train_seconds"])
                toks.append(res.metrics["train_tokens"] - done.metrics["train_tokens"])
                done = res
        refs.extend(rates)
        seqs = encode_sentences(res.vocab, sents, res.config.max_len)
        lengths = np.array([len(s) - 1 for s in seqs])
        batches = _epoch_batches(lengths, opts.batch_size, seed, 0, opts.bucket)
        if len(batches) < bounds[-1]:  # max_steps beyond one epoch (large CUDA batches): the epochs in turn
            batches = [b for e in range(bounds[-1] // len(batches) + 1)
                       for b in _epoch_batches(lengths, opts.batch_size, seed, e, opts.bucket)]
        fractions = []
        for r in range(rounds):
            fpt_r = flops_per_token(res.model, _mean_padded_len(lengths, batches[bounds[r]:bounds[r + 1]]))
            fractions.append(toks[r] / secs[r] * fpt_r / 1e9 / rates[r])
        timed = batches[bounds[0]:bounds[-1]]
        padded = sum(len(b) * lengths[b].max() for b in timed)
        real = sum(lengths[b].sum() for b in timed)
        mean_t = _mean_padded_len(lengths, timed)
        tps = sum(toks) / sum(secs)
        fpt = flops_per_token(res.model, mean_t)
        metrics.update({
            f"{name}_preset": preset, f"{name}_parameters": res.metrics["parameters"],
            f"{name}_vocab_size": len(res.vocab), f"{name}_tokens_per_s": tps, f"{name}_flops_per_token": fpt,
            f"{name}_gflop_per_s": tps * fpt / 1e9, f"{name}_fraction_of_matmul": float(np.median(fractions)),
            f"{name}_fraction_of_matmul_rounds": fractions, f"{name}_matmul_gflop_per_s_rounds": rates,
            f"{name}_padding_fraction": float(1 - real / padded), f"{name}_mean_padded_len": mean_t,
            f"{name}_ami_epoch_s": tokens_total / tps,
        })
    metrics["matmul_gflop_per_s"] = float(np.median(refs))
    if "lstm_class_tokens_per_s" in metrics and "lstm_tokens_per_s" in metrics:
        metrics["class_softmax_speedup_vs_full"] = metrics["lstm_class_tokens_per_s"] / metrics["lstm_tokens_per_s"]
    return metrics
