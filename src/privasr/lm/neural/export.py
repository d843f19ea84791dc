"""Exported neural LMs for devices: ONNX (onnxruntime) or TorchScript, fp32 or dynamic int8, and their scorers.

:func:`export_lm` writes a checkpoint's model (Transformer or LSTM, full or class-factored softmax,
character-aware embeddings included) into a folder::

    DIR/model.onnx  (or model.pt: TorchScript)   the scoring graph (below)
    DIR/vocab.json                               the vocabulary (:meth:`Vocabulary.to_json`)
    DIR/meta.json                                format, runtime, int8 settings, the model config, the source
                                                 checkpoint's fingerprint and the sha256 of every file

**The graph** returns ``logprob`` (float32 ``[P]``) = ``log_softmax(logits + bias)[target]`` for ``P`` (position,
target) pairs: ``rows`` (int64 ``[P]``, indices into the flattened ``[B, T]`` positions) and ``targets`` (int64
``[P]``), with ``bias`` (float32 ``[V]``, natural log); the output layer runs on those ``P`` states only. The
network's inputs are ``ids`` (int64 ``[B, T]``) and, for the Transformer, ``positions`` (int64 ``[B, T]``) and
``mask`` (bool ``[B, T, T]``, ``True`` = may attend): the scorer packs the prefix trie of the sentences into rows
with a tree attention mask, exactly as :class:`~privasr.lm.neural.scorer.NeuralLM` does, so every distinct
prefix is computed once. The LSTM reads padded sentences (``<s>`` then the words; the padding after a sentence
never reaches its positions). Batch, sequence and pair axes are dynamic. A class-factored softmax is exported
through its ``forward`` (the normalised log-probabilities over the whole vocabulary stand in for the logits, as
in :class:`~privasr.lm.neural.scorer.NeuralLM` when a renormalised bias needs every word). A character-aware
LSTM's word embeddings depend on the weights only, so the export computes the table of all ``V`` words once and
stores it as a plain embedding (exactly the vectors the character CNN gives). ONNX files are written by
``torch.onnx.export`` (the TorchScript-based exporter, opset 18: it keeps dynamic sequence lengths for every
architecture here), TorchScript files by ``torch.jit.trace``.

**int8** (``int8=True``): dynamic quantisation, the weights stored as int8 and the activations quantised on the
fly. ONNX: :func:`onnxruntime.quantization.quantize_dynamic` on the ``MatMul``/``Gemm`` (linear layers, the
output projection and the class softmax's layers), ``LSTM`` and, with ``quantize_embeddings`` (the default),
``Gather`` (the embedding tables) nodes; ``per_channel`` (the default) gives each output channel of a weight its own
scale (per tensor otherwise; on the AMI rescoring set per-channel int8 changed the WER by 0.1% relative, per
tensor by 0.35%: docs/device.md).
TorchScript: :func:`torch.ao.quantization.quantize_dynamic` on ``nn.Linear`` (per channel with ``per_channel``) and
``nn.LSTM`` (per tensor), and weight-only 8-bit ``nn.Embedding`` (per row) with ``quantize_embeddings``.

**Scoring** (:class:`OnnxNeuralLM`, :class:`TorchScriptNeuralLM`; :func:`load_exported` picks by the folder's
runtime) follows :class:`~privasr.lm.neural.scorer.NeuralLM`: log10 scores, OOV words scored as ``<unk>`` with
the ``spread_unk`` share taken off, and the FMP per-word log-bias of :meth:`NeuralLM.with_bias
<privasr.lm.neural.scorer.NeuralLM.with_bias>`: *unnormalised* by default (``ln p(w|h) + bias[w]``, added after
the graph) or, with ``renormalize=True``, added to the logits before the log-softmax inside the graph.
Calls hold at most ``batch_tokens`` positions and run on ``threads`` intra-op threads (onnxruntime's CPU
provider; ``torch.set_num_threads`` for TorchScript). Without an in-graph bias, :class:`OnnxNeuralLM` runs the
graph with its ``bias`` input replaced by a zero constant, which onnxruntime folds into the output layer.

>>> import tempfile, pathlib, torch
>>> from privasr.lm.neural.models import NeuralLMConfig, build_model
>>> from privasr.lm.neural.scorer import NeuralLM
>>> from privasr.lm.neural.vocab import Vocabulary
>>> v = Vocabulary.build([["a", "b", "c"]])
>>> _ = torch.manual_seed(0)
>>> m = build_model(NeuralLMConfig.preset("tiny-transformer"), v)
>>> d = pathlib.Path(tempfile.mkdtemp()) / "exp"
>>> info = export_lm(m, v, d, to="onnx")
>>> sorted(p.name for p in d.iterdir())
['meta.json', 'model.onnx', 'vocab.json']
>>> onnx_lm, torch_lm = load_exported(d), NeuralLM(m, v)
>>> sents = [["a", "b"], ["c", "zz", "a"], []]
>>> max(abs(o.total() - t.total()) for o, t in zip(onnx_lm.score_batch(sents), torch_lm.score_batch(sents))) < 1e-5
True
>>> bias = [0.0, 0.0, 0.0, 0.0, 0.0, 1.5]  # e**1.5 more "c", unnormalised
>>> o, t = onnx_lm.with_bias(bias).score(["c"]), torch_lm.with_bias(bias).score(["c"])
>>> bool(abs(o.total() - t.total()) < 1e-5)
True
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.errors import ConfigError, InputError
from privasr.lm.base import EOS, LN10, SentenceScore
from privasr.lm.neural.scoring_base import NeuralScorerBase, checked_log_bias, checked_sentences
from privasr.lm.neural.trie import PrefixTrie, pack_segments, target_pairs
from privasr.lm.neural.vocab import Vocabulary

__all__ = ["export_lm", "export_checkpoint", "ExportInfo", "ExportedNeuralLM", "OnnxNeuralLM",
           "TorchScriptNeuralLM", "load_exported", "read_export_meta", "RUNTIMES", "FORMAT", "VERSION",
           "OPSET"]

FORMAT = "privasr-nnlm-export"
VERSION = 1
RUNTIMES = ("onnx", "torchscript")
OPSET = 18
_MODEL_FILE = {"onnx": "model.onnx", "torchscript": "model.pt"}
_UNBOUNDED = 2**31 - 1


@dataclass(frozen=True)
class ExportInfo:
    """What :func:`export_lm` wrote.

    Attributes:
        folder: the export folder.
        runtime: ``"onnx"`` or ``"torchscript"``.
        int8: whether the weights were quantised to int8.
        model_bytes: size of the model file on disk.
        meta: the contents of ``meta.json``.
    """

    folder: Path
    runtime: str
    int8: bool
    model_bytes: int
    meta: dict[str, Any]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------------- export
def _scoring_module(model: Any) -> Any:
    """The graph to export: ``(ids[, positions, mask], rows, targets, bias) -> log_softmax(logits + bias)`` at
    ``(rows, targets)``, around a copy of ``model`` (eval, fp32, CPU), a character-aware embedding replaced by its
    table of all words."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from privasr.lm.neural.models import CharWordEmbedding

    m = copy.deepcopy(model).to(device="cpu", dtype=torch.float32).eval()
    if isinstance(getattr(m, "embed", None), CharWordEmbedding):
        with torch.no_grad():
            table = m.embed.embed_chars(m.embed.char_table)
        m.embed = nn.Embedding.from_pretrained(table, freeze=True)

    class Scoring(nn.Module):
        """``(ids[, positions, mask], rows, targets, bias) -> logprob``."""

        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.model = inner

        def score(self, h: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
                  bias: torch.Tensor) -> torch.Tensor:
            # kept 3-D ([1, P, H]) so that the linear layers export as MatMul, which dynamic int8 quantises
            h = h.reshape(-1, h.shape[-1]).index_select(0, rows).unsqueeze(0)
            out = self.model.output
            if isinstance(out, nn.Linear):  # the bias joins the layer's own: one addition over [P, V], not two
                b = bias if out.bias is None else out.bias + bias
                logits = F.linear(h, out.weight) + b
            else:
                logits = out(h).float() + bias
            lp = torch.log_softmax(logits, dim=-1)  # gathered in 3-D: indexing [0] first would copy [P, V]
            return lp.gather(2, targets.reshape(1, -1, 1)).reshape(-1)

    class TreeScoring(Scoring):
        def forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor,
                    targets: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            h, _ = self.model.hidden(ids, positions=positions, attn_mask=mask)
            return self.score(h, rows, targets, bias)

    class PaddedScoring(Scoring):
        def forward(self, ids: torch.Tensor, rows: torch.Tensor, targets: torch.Tensor,
                    bias: torch.Tensor) -> torch.Tensor:
            h, _ = self.model.hidden(ids)
            return self.score(h, rows, targets, bias)

    return (TreeScoring if m.config.arch == "transformer" else PaddedScoring)(m).eval()


def _inputs(arch: str) -> list[str]:
    """The graph's input names: the Transformer takes packed prefix-tree rows (positions, tree attention mask)."""
    return (["ids", "positions", "mask"] if arch == "transformer" else ["ids"]) + ["rows", "targets", "bias"]


def _example(vocab: Vocabulary, arch: str) -> tuple[Any, ...]:
    import torch

    w = min(len(vocab) - 1, 3)
    ids = torch.tensor([[vocab.bos_id, w, w, w], [vocab.bos_id, w, w, vocab.eos_id]], dtype=torch.long)
    rows = torch.tensor([0, 1, 2, 3, 6], dtype=torch.long)
    targets = torch.tensor([w, w, w, vocab.eos_id, vocab.eos_id], dtype=torch.long)
    bias = torch.zeros(len(vocab), dtype=torch.float32)
    if arch != "transformer":
        return ids, rows, targets, bias
    positions = torch.arange(4).expand(2, 4)
    mask = torch.tril(torch.ones(4, 4, dtype=torch.bool)).expand(2, 4, 4)
    return ids, positions, mask, rows, targets, bias


def _export_onnx(module: Any, vocab: Vocabulary, path: Path, arch: str) -> None:
    import torch

    axes = {"ids": {0: "rows", 1: "time"}, "positions": {0: "rows", 1: "time"},
            "mask": {0: "rows", 1: "time", 2: "time"}, "rows": {0: "pairs"}, "targets": {0: "pairs"},
            "logprob": {0: "pairs"}}
    names = _inputs(arch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about shape arithmetic, deprecation notes
        torch.onnx.export(module, _example(vocab, arch), str(path), dynamo=False, opset_version=OPSET,
                          input_names=names, output_names=["logprob"],
                          dynamic_axes={k: v for k, v in axes.items() if k in names or k == "logprob"})


def _quantize_onnx(src: Path, dst: Path, *, quantize_embeddings: bool, per_channel: bool) -> list[str]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    ops = ["MatMul", "Gemm", "LSTM"] + (["Gather"] if quantize_embeddings else [])
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # quantize_dynamic logs advice about pre-processing on the root logger
    try:
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel,
                         op_types_to_quantize=ops)
    finally:
        root.setLevel(level)
    return ops


def _export_torchscript(module: Any, vocab: Vocabulary, path: Path, arch: str, *, int8: bool,
                        quantize_embeddings: bool, per_channel: bool) -> list[str]:
    import torch
    from torch import nn

    quantized: list[str] = []
    if int8:
        from torch.ao.quantization import (
            default_dynamic_qconfig,
            float_qparams_weight_only_qconfig,
            per_channel_dynamic_qconfig,
            quantize_dynamic,
        )

        # nn.LSTM's dynamic quantisation takes per-tensor weights only
        spec: dict[Any, Any] = {nn.Linear: per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig,
                                nn.LSTM: default_dynamic_qconfig}
        if quantize_embeddings:
            spec[nn.Embedding] = float_qparams_weight_only_qconfig
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao's notes that eager-mode quantisation moves to torchao
            module = quantize_dynamic(module, spec, dtype=torch.qint8)
        quantized = [t.__name__ for t in spec]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module, _example(vocab, arch), check_trace=False)
    traced.save(str(path))
    return quantized


def export_lm(model: Any, vocab: Vocabulary, out: str | os.PathLike[str], *, to: str = "onnx", int8: bool = False,
              quantize_embeddings: bool = True, per_channel: bool = True,
              source: dict[str, Any] | None = None) -> ExportInfo:
    """Export ``model`` (a :class:`~privasr.lm.neural.models.TransformerLM` or
    :class:`~privasr.lm.neural.models.LstmLM`) with ``vocab`` into the folder ``out`` (see the module docstring).

    Args:
        model: the model (left unchanged: a copy is exported).
        vocab: its vocabulary.
        out: the export folder (created; existing files of the export are replaced).
        to: ``"onnx"`` or ``"torchscript"``.
        int8: dynamic int8 quantisation of the weights.
        quantize_embeddings: with ``int8``, the embedding tables too (ONNX ``Gather``, torch ``nn.Embedding``).
        per_channel: with ``int8``, one scale per output channel of each weight (else one per tensor).
        source: JSON facts of where the model came from (``meta.json``'s ``source``).
    """
    import torch

    if to not in RUNTIMES:
        raise ConfigError(f"export format {to!r}", expected=" or ".join(RUNTIMES))
    for name, value in (("int8", int8), ("quantize_embeddings", quantize_embeddings), ("per_channel", per_channel)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r}", expected="true or false")
    cfg = getattr(model, "config", None)
    out_layer = getattr(model, "output", None)
    if cfg is None or out_layer is None or getattr(out_layer, "out_features", None) != len(vocab):
        raise ConfigError(f"cannot export {type(model).__name__} with a vocabulary of {len(vocab)} words",
                          expected="a privasr neural LM and its vocabulary")
    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot make the export folder ({e.strerror})", path=folder,
                         expected="a folder you may write to") from None
    model_path = folder / _MODEL_FILE[to]
    module = _scoring_module(model)
    quantized: list[str] = []
    if to == "onnx":
        if int8:
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                fp32 = Path(tmp) / "fp32.onnx"
                _export_onnx(module, vocab, fp32, cfg.arch)
                quantized = _quantize_onnx(fp32, Path(tmp) / "int8.onnx", quantize_embeddings=quantize_embeddings,
                                           per_channel=per_channel)
                os.replace(Path(tmp) / "int8.onnx", model_path)
        else:
            _export_onnx(module, vocab, model_path, cfg.arch)
    else:
        quantized = _export_torchscript(module, vocab, model_path, cfg.arch, int8=int8,
                                        quantize_embeddings=quantize_embeddings, per_channel=per_channel)
    (folder / "vocab.json").write_text(vocab.to_json() + "\n", encoding="utf-8")
    from privasr import __version__

    meta: dict[str, Any] = {
        "format": FORMAT, "version": VERSION, "runtime": to, "model_file": model_path.name,
        "int8": int8, "quantized_ops": quantized, "per_channel": per_channel if int8 else False,
        "config": cfg.to_dict(), "arch": cfg.arch, "softmax": cfg.softmax,
        "max_len": int(cfg.max_len), "learned_positions": cfg.arch == "transformer" and cfg.positions == "learned",
        "input_names": _inputs(cfg.arch),
        "outputs": {"logprob": "float32 [pairs], natural log"},
        "opset": OPSET if to == "onnx" else None, "torch": torch.__version__, "privasr": __version__,
        "source": dict(source or {}),
        "files": {p.name: _sha256(p) for p in (model_path, folder / "vocab.json")},
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
    return ExportInfo(folder, to, int8, model_path.stat().st_size, meta)


def export_checkpoint(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *, to: str = "onnx",
                      int8: bool = False, quantize_embeddings: bool = True, per_channel: bool = True) -> ExportInfo:
    """Export a checkpoint file (:func:`~privasr.lm.neural.checkpoint.load_checkpoint`) with :func:`export_lm`;
    ``meta.json`` records its path and sha256."""
    from privasr.lm.neural.checkpoint import load_checkpoint

    ck = load_checkpoint(checkpoint)
    p = Path(checkpoint)
    return export_lm(ck.model, ck.vocab, out, to=to, int8=int8, quantize_embeddings=quantize_embeddings,
                     per_channel=per_channel, source={"checkpoint": str(p), "sha256": _sha256(p)})


# ------------------------------------------------------------------------------------------------------- loading
def read_export_meta(folder: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
    """``meta.json`` of an export folder, checked (format, version, files present and, with ``verify``, their
    sha256); every problem is an :class:`InputError` naming the file."""
    d = Path(folder)
    if not d.is_dir():
        raise InputError("no such folder" if not d.exists() else "not a folder", path=d,
                         expected="an export folder of privasr lm export (model, vocab.json, meta.json)")
    mp = d / "meta.json"
    if not mp.is_file():
        raise InputError("no meta.json in the folder", path=d, expected="an export folder of privasr lm export")
    try:
        meta = json.loads(mp.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"cannot read it ({type(e).__name__})", path=mp, expected="JSON written by privasr lm export") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"not a privasr export (no 'format': '{FORMAT}' entry)", path=mp)
    if meta.get("version") != VERSION:
        raise InputError(f"export format version {meta.get('version')!r} is not supported", path=mp,
                         expected=f"version {VERSION}")
    if meta.get("runtime") not in RUNTIMES or not isinstance(meta.get("files"), dict):
        raise InputError("bad metadata: runtime or files missing", path=mp, expected=f"runtime one of {RUNTIMES}")
    for name, digest in meta["files"].items():
        f = d / str(name)
        if not f.is_file():
            raise InputError(f"{name} is missing", path=d, expected="the files listed in meta.json")
        if verify and _sha256(f) != digest:
            raise InputError("the file does not match the sha256 in meta.json (changed or truncated)", path=f)
    return meta


class ExportedNeuralLM(NeuralScorerBase):
    """Scoring with an exported model: the :class:`~privasr.lm.base.LanguageModel` protocol of
    :class:`~privasr.lm.neural.scorer.NeuralLM` (see the module docstring). Use :func:`load_exported`, or
    :class:`OnnxNeuralLM` / :class:`TorchScriptNeuralLM` directly.

    Args:
        folder: the export folder.
        threads: intra-op threads.
        batch_tokens: most positions (Transformer: packed trie nodes; LSTM: sentences x longest length) per
            graph call.
        row_len: Transformer rows hold at most this many trie nodes (raised to the longest sentence).
        log_bias: natural-log bias per word id (length ``len(vocab)``), or ``None``.
        renormalize: renormalise the biased distribution (bias inside the graph) instead of the unnormalised
            rescaling.
        spread_unk: score an OOV word as ``p(<unk>|h) / (K + 1)`` (``K = vocab.unk_types``).
        verify: check the files' sha256 against ``meta.json`` on loading.
    """

    runtime = ""

    def __init__(self, folder: str | os.PathLike[str], *, threads: int = 1, batch_tokens: int = 1024,
                 row_len: int = 128, log_bias: Any = None, renormalize: bool = False, spread_unk: bool = True,
                 verify: bool = True) -> None:
        for name, value in (("threads", threads), ("batch_tokens", batch_tokens), ("row_len", row_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r}", expected="a positive integer")
        for name, value in (("renormalize", renormalize), ("spread_unk", spread_unk)):
            if not isinstance(value, bool):
                raise ConfigError(f"{name}={value!r}", expected="true or false")
        self.folder = Path(folder)
        meta = read_export_meta(self.folder, verify=verify)
        if meta["runtime"] != self.runtime:
            raise InputError(f"the export is {meta['runtime']}, not {self.runtime}", path=self.folder,
                             expected=f"load it with load_exported (or {type(self).__name__} for a "
                                      f"{self.runtime} export)")
        self.meta = meta
        try:
            self.vocab = Vocabulary.from_json((self.folder / "vocab.json").read_text(encoding="utf-8"))
        except InputError as e:
            raise InputError(e.message, path=self.folder / "vocab.json", expected=e.expected) from None
        self.model_path = self.folder / str(meta["model_file"])
        self.threads = threads
        self.batch_tokens = batch_tokens
        self.row_len = row_len
        self.renormalize = renormalize
        self.spread_unk = spread_unk
        self._unk_log10 = float(np.log10(self.vocab.unk_types + 1)) if spread_unk else 0.0
        self.arch = str(meta.get("arch", "transformer"))
        self._max_pos = int(meta["max_len"]) if meta.get("learned_positions") else None
        self._order = int(meta.get("max_len", _UNBOUNDED)) if self.arch == "transformer" else _UNBOUNDED
        self._load()
        self._set_bias(log_bias)

    # -- runtime hooks ---------------------------------------------------------------------------------------------
    def _load(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _run(self, feeds: dict[str, np.ndarray], bias: np.ndarray | None) -> np.ndarray:  # pragma: no cover
        """The graph's ``logprob`` for the inputs ``feeds`` (``bias``: the in-graph bias, ``None`` for none)."""
        raise NotImplementedError

    # -- bias --------------------------------------------------------------------------------------------------------
    def _set_bias(self, log_bias: Any) -> None:
        if log_bias is None:
            self.log_bias: np.ndarray | None = None
            self._graph_bias: np.ndarray | None = None
            return
        self.log_bias = checked_log_bias(log_bias, len(self.vocab))
        self._graph_bias = self.log_bias.astype(np.float32) if self.renormalize else None

    # -- protocol (order, in, len, score and with_bias: NeuralScorerBase) --------------------------------------------
    @property
    def model_bytes(self) -> int:
        """Size of the model file on disk."""
        return self.model_path.stat().st_size

    def __repr__(self) -> str:
        bias = "none" if self.log_bias is None else ("renormalised" if self.renormalize else "unnormalised")
        return (f"{type(self).__name__}(arch={self.arch}, vocab={len(self.vocab)}, int8={self.meta['int8']}, "
                f"bias={bias}, threads={self.threads})")

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        """Score many sentences (Transformer: packed prefix-tree rows; LSTM: padded batches sorted by length), each
        distinct (prefix, next word) pair once. ``bos`` must be true."""
        vocab = self.vocab
        sents = checked_sentences(sentences, bos)
        ids = [vocab.encode(s) for s in sents]
        n_tok = [len(x) + (1 if eos else 0) for x in ids]
        if self._max_pos is not None and n_tok and max(n_tok) > self._max_pos:
            raise InputError(f"a sentence of {max(n_tok) - 1} words is longer than the model's {self._max_pos} "
                             "positions")
        if self.arch == "transformer":
            ln = self._score_tree(ids, n_tok, eos)
        else:
            ln = self._score_padded(ids, n_tok, eos)
        eos_t = (EOS,) if eos else ()
        result = []
        for s, lp in zip(sents, ln, strict=True):
            oov = self._oov(s, eos)
            result.append(SentenceScore(s + eos_t, self._spread(lp / LN10, oov), oov))
        return result


    def _logprob(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The graph's natural-log scores (float64) with the bias: in the graph when renormalising, else added."""
        out = np.asarray(self._run(feeds, self._graph_bias), dtype=np.float64)
        if self.log_bias is not None and not self.renormalize:
            out = out + self.log_bias[feeds["targets"]]
        return out

    def _score_padded(self, ids: list[list[int]], n_tok: list[int], eos: bool) -> list[np.ndarray]:
        """LSTM: sentences sorted by length in padded batches; the output layer once per distinct (prefix, next
        word) pair, at the first position that has it."""
        vocab = self.vocab
        ln: list[np.ndarray] = [np.zeros(0) for _ in ids]
        order = sorted((i for i in range(len(ids)) if n_tok[i]), key=n_tok.__getitem__)
        lo = 0
        while lo < len(order):
            hi = lo + 1
            while hi < len(order) and (hi + 1 - lo) * n_tok[order[hi]] <= self.batch_tokens:
                hi += 1
            batch = order[lo:hi]
            width = n_tok[batch[-1]]
            inp = np.full((len(batch), width), vocab.eos_id, dtype=np.int64)
            # one (prefix, target) pair per distinct prefix and next word: the first position that has it
            node_of: dict[tuple[int, int], int] = {}
            pair_of: dict[tuple[int, int], int] = {}
            rows: list[int] = []
            targets: list[int] = []
            where: list[list[int]] = []
            for r, i in enumerate(batch):
                x = ids[i]
                tgt = [*x, vocab.eos_id] if eos else x
                inp[r, :n_tok[i]] = [vocab.bos_id, *tgt[:-1]]
                node, idx = -1, []
                for k, t in enumerate(tgt):
                    if k:
                        node = node_of.setdefault((node, tgt[k - 1]), len(node_of))
                    j = pair_of.setdefault((node, t), len(rows))
                    if j == len(rows):
                        rows.append(r * width + k)
                        targets.append(t)
                    idx.append(j)
                where.append(idx)
            tg = np.array(targets, dtype=np.int64)
            out = self._logprob({"ids": inp, "rows": np.array(rows, dtype=np.int64), "targets": tg})
            for i, idx in zip(batch, where, strict=True):
                ln[i] = out[idx]
            lo = hi
        return ln

    def _score_tree(self, ids: list[list[int]], n_tok: list[int], eos: bool) -> list[np.ndarray]:
        """Transformer: the sentences' prefix trie packed into rows with a tree attention mask (as
        :class:`~privasr.lm.neural.scorer.NeuralLM` does), every distinct prefix run once, the output layer once
        per distinct (prefix, next word) pair."""
        vocab = self.vocab
        out: list[np.ndarray] = [np.zeros(0) for _ in ids]
        live = [i for i, n in enumerate(n_tok) if n]
        if not live:
            return out
        trie = PrefixTrie.build([tuple(ids[i]) if eos else tuple(ids[i][:-1]) for i in live],
                                root_token=vocab.bos_id)
        eos_id = vocab.eos_id
        # each distinct (prefix, next word) pair once; the last target is </s>, or the last word without eos
        pair_node, pair_tgt, inverse = target_pairs(trie, [eos_id if eos else ids[i][-1] for i in live])
        row_len = max(min(self.row_len, self.batch_tokens), int(trie.depth.max()) + 1)
        packed = pack_segments(trie, *trie.segment_arrays(row_len), row_len)
        per_call = max(1, self.batch_tokens // row_len)
        fill = (packed.nodes >= 0).sum(axis=1)
        pair_ln = np.empty(len(pair_node), dtype=np.float64)
        for r0 in range(0, len(packed), per_call):
            r1 = min(len(packed), r0 + per_call)
            width = int(fill[r0:r1].max())
            nodes = packed.nodes[r0:r1, :width]
            own = packed.own[r0:r1, :width]
            at = np.full(len(trie), -1, dtype=np.int64)
            at[nodes[own]] = np.flatnonzero(own)  # each node's own position in these rows (flattened)
            sel = np.flatnonzero(at[pair_node] >= 0)
            if not sel.size:
                continue
            feeds = {"ids": np.where(nodes >= 0, trie.token[np.maximum(nodes, 0)], eos_id),
                     "positions": np.ascontiguousarray(packed.positions[r0:r1, :width]),
                     "mask": np.ascontiguousarray(packed.attention(slice(r0, r1))[:, :width, :width]),
                     "rows": at[pair_node[sel]], "targets": np.ascontiguousarray(pair_tgt[sel])}
            pair_ln[sel] = self._logprob(feeds)
        flat = pair_ln[inverse]
        lo = 0
        for i in live:
            out[i] = flat[lo:lo + n_tok[i]]
            lo += n_tok[i]
        return out

class OnnxNeuralLM(ExportedNeuralLM):
    """An ONNX export scored with onnxruntime on the CPU (``threads`` intra-op threads, one inter-op thread,
    ``graph_optimization``: ``"all"``, ``"extended"``, ``"basic"`` or ``"none"``); see :class:`ExportedNeuralLM`.
    """

    runtime = "onnx"

    def __init__(self, folder: str | os.PathLike[str], *, graph_optimization: str = "all", **kwargs: Any) -> None:
        if graph_optimization not in ("all", "extended", "basic", "none"):
            raise ConfigError(f"graph_optimization={graph_optimization!r}", expected="all, extended, basic or none")
        self.graph_optimization = graph_optimization
        super().__init__(folder, **kwargs)

    def _load(self) -> None:
        try:
            import onnx
            import onnxruntime  # noqa: F401 - checked here, used in _session
        except ImportError:  # pragma: no cover - the extra is missing
            raise ConfigError("scoring an ONNX export needs onnx and onnxruntime",
                              expected="pip install privasr[onnx]") from None
        try:
            proto = onnx.load(str(self.model_path))
        except Exception as e:  # noqa: BLE001 - protobuf raises its own types for bad files
            raise InputError(f"not an ONNX model ({type(e).__name__})", path=self.model_path,
                             expected="an ONNX file written by privasr lm export") from None
        # shared by the scorers with_bias makes: True -> the graph as written, False -> without the bias input
        self._sessions: dict[bool, Any] = {}
        self._session(False, proto)

    def _session(self, with_bias: bool, proto: Any = None) -> Any:
        """The onnxruntime session; ``with_bias=False``: the graph with its ``bias`` input replaced by a zero
        constant, which onnxruntime folds into the output layer's bias (one addition over ``[P, V]`` less)."""
        if with_bias in self._sessions:
            return self._sessions[with_bias]
        import onnx
        import onnxruntime as ort
        from onnx import numpy_helper

        if proto is None:
            proto = onnx.load(str(self.model_path))
        if not with_bias:
            inputs = [i for i in proto.graph.input if i.name == "bias"]
            if not inputs:
                raise InputError("the graph has no 'bias' input", path=self.model_path,
                                 expected="an ONNX file written by privasr lm export")
            proto.graph.input.remove(inputs[0])
            proto.graph.initializer.append(numpy_helper.from_array(np.zeros(len(self.vocab), np.float32), "bias"))
        so = ort.SessionOptions()
        so.intra_op_num_threads = self.threads
        so.inter_op_num_threads = 1
        so.graph_optimization_level = {
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[self.graph_optimization]
        so.log_severity_level = 3
        try:
            sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own exception types for bad files
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise InputError(f"onnxruntime cannot load the model ({first})", path=self.model_path,
                             expected="an ONNX file written by privasr lm export") from None
        self._sessions[with_bias] = sess
        return sess

    def _run(self, feeds: dict[str, np.ndarray], bias: np.ndarray | None) -> np.ndarray:
        if bias is not None:
            feeds = {**feeds, "bias": bias}
        return self._session(bias is not None).run(["logprob"], feeds)[0]


class TorchScriptNeuralLM(ExportedNeuralLM):
    """A TorchScript export run with ``torch.jit`` on the CPU (``torch.set_num_threads(threads)`` around each
    call); see :class:`ExportedNeuralLM`."""

    runtime = "torchscript"

    def _load(self) -> None:
        import torch

        try:
            self.module = torch.jit.load(str(self.model_path), map_location="cpu").eval()
        except Exception as e:  # noqa: BLE001 - torch.jit raises RuntimeError and others for bad files
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
            raise InputError(f"torch.jit cannot load the model ({first})", path=self.model_path,
                             expected="a TorchScript file written by privasr lm export") from None

    def _run(self, feeds: dict[str, np.ndarray], bias: np.ndarray | None) -> np.ndarray:
        import torch

        if bias is None:
            bias = np.zeros(len(self.vocab), dtype=np.float32)
        # torch refuses to alias read-only memory (the packed rows are read-only views)
        args = [torch.from_numpy(a if (a := feeds[n]).flags.writeable else a.copy())
                for n in self.meta["input_names"] if n != "bias"]
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            with torch.inference_mode():
                out = self.module(*args, torch.from_numpy(bias))
        finally:
            torch.set_num_threads(before)
        return out.numpy()


def load_exported(folder: str | os.PathLike[str], **kwargs: Any) -> ExportedNeuralLM:
    """The scorer of an export folder: :class:`OnnxNeuralLM` or :class:`TorchScriptNeuralLM` by its runtime;
    ``kwargs`` are their keyword arguments."""
    meta = read_export_meta(folder, verify=False)
    cls = OnnxNeuralLM if meta["runtime"] == "onnx" else TorchScriptNeuralLM
    if cls is TorchScriptNeuralLM and "graph_optimization" in kwargs:
        raise ConfigError("graph_optimization is an onnxruntime setting", expected="no graph_optimization for "
                          "a TorchScript export")
    return cls(folder, **kwargs)

