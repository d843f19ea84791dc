"""FMP's model bundle: the operator writes it from public and operator-owned data; a device reads it and turns
its own raw N-best lists into FMP utterances with it.

What the bundle holds (:func:`write_fmp_bundle`):

* ``settings.json``: ``fmp`` (the :class:`~privasr.federated.algorithms.fmp.FmpConfig`, ``lam`` included, tuned
  on the operator's dev data), ``normalized``, ``rescoring`` (the first-pass combination: ``prior``, ``lms``,
  ``mode``, ``prior_weight``, the tuned ``weights`` and FMP's ``bias_weight``), ``nnlm`` (the neural LM's
  configuration and vocabulary), ``rounds`` and ``run`` (the run's public settings: devices, sampler, seed, DP,
  SecAgg; for the record, the server enforces them);
* ``arrays.npz``: ``background`` (``u(w)``, float64 ``[V]``), ``nnlm/<parameter>`` (the NNLM's weights, float32,
  as ``state_dict`` names them) or, with ``nnlm_format`` ``onnx``/``onnx-int8``, ``onnx/<file>`` (the exported
  model's files as bytes, :data:`NNLM_FORMATS`) and, for personal bigrams, ``bigram/keys``, ``bigram/counts``,
  ``bigram/history`` and ``bigram/prior``.

On the device (:class:`FmpDeviceModel`) the NNLM is rebuilt by the installed privasr
(:func:`~privasr.lm.neural.models.build_model`, then ``load_state_dict``): the device scores its own
hypotheses exactly as the simulation's operator-side client preparation does
(:func:`~privasr.rescore.combine.score_table` with the same combination and weights), so the same N-best lists
give the same FMP inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from privasr.corpus.records import NBest
from privasr.device.bundle import Bundle, write_bundle
from privasr.device.bundle import build_model as build_bundle_model
from privasr.errors import ConfigError, InputError

__all__ = ["write_fmp_bundle", "FmpDeviceModel", "FMP_BUNDLE", "NNLM_FORMATS"]

FMP_BUNDLE = "fmp"
"""The bundle kind of FMP."""


NNLM_FORMATS = ("torch", "onnx", "onnx-int8")
"""How the NNLM travels in FMP's bundle: its weights as arrays (``torch``, the device rebuilds it with PyTorch:
the simulation's scores exactly), or the exported ONNX model's files as byte arrays (``onnx``; ``onnx-int8``:
dynamic int8, about a quarter of the size; scored with onnxruntime, within 1e-4 / 0.2 nats a sentence of
PyTorch's, :mod:`privasr.lm.neural.export`)."""


def write_fmp_bundle(folder: str | os.PathLike[str], *, algorithm: Any, lm: Any, weights: Mapping[str, Any],
                     combination: Any, bias_weight: float, rounds: int,
                     run: Mapping[str, Any] | None = None, nnlm_format: str = "torch") -> str:
    """Write FMP's bundle into the new folder ``folder``; its hash.

    Args:
        algorithm: the server's :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm` (its config, ``u(w)`` and
            background bigram go into the bundle).
        lm: the NNLM, a :class:`~privasr.lm.neural.scorer.NeuralLM` (its weights go in as arrays).
        weights: the tuned combination weights; ``combination``: the
            :class:`~privasr.rescore.combine.Combination` they belong to.
        bias_weight: FMP's log-factor weight (the NNLM's tuned weight).
        rounds: the run's number of rounds.
        run: the run's public settings (devices, sampler, DP, SecAgg), recorded for the device.
        nnlm_format: one of :data:`NNLM_FORMATS`.

    Raises:
        ConfigError: an NNLM that is not a neural LM, a non-empty folder, an unknown format.
    """
    model = getattr(lm, "model", None)
    cfg = getattr(model, "config", None)
    if model is None or cfg is None or not hasattr(lm, "vocab"):
        raise ConfigError(f"FMP's bundle needs a neural NNLM, not a {type(lm).__name__}",
                          expected="nnlm.neural in the config (an n-gram NNLM stand-in cannot be bundled yet)")
    if nnlm_format not in NNLM_FORMATS:
        raise ConfigError(f"NNLM format {nnlm_format!r}", expected=f"one of {list(NNLM_FORMATS)}")
    arrays: dict[str, np.ndarray] = {"background": np.asarray(algorithm.background, dtype=np.float64)}
    if nnlm_format == "torch":
        for name, t in model.state_dict().items():
            arrays[f"nnlm/{name}"] = t.detach().cpu().numpy()
    else:
        import tempfile
        from pathlib import Path

        from privasr.lm.neural.export import export_lm

        with tempfile.TemporaryDirectory() as tmp:
            export_lm(model, lm.vocab, Path(tmp), to="onnx", int8=nnlm_format == "onnx-int8")
            for f in sorted(Path(tmp).iterdir()):
                arrays[f"onnx/{f.name}"] = np.frombuffer(f.read_bytes(), dtype=np.uint8)
    bg = algorithm.background_bigram if algorithm.config.order == 2 else None  # devices use it with order 2 only
    if bg is not None:
        arrays.update({"bigram/keys": bg.keys, "bigram/counts": bg.counts, "bigram/history": bg.history,
                       "bigram/prior": np.asarray([bg.prior])})
    comb = {"prior": combination.prior, "lms": list(combination.lms), "mode": combination.mode,
            "prior_weight": combination.prior_weight, "weights": dict(weights), "bias_weight": float(bias_weight)}
    settings = {"fmp": algorithm.config.to_dict(), "normalized": algorithm.normalizer is not None,
                "rescoring": comb, "rounds": int(rounds),
                "nnlm": {"config": cfg.to_dict(), "vocab": json.loads(lm.vocab.to_json()), "format": nnlm_format},
                "run": dict(run or {})}
    return write_bundle(folder, FMP_BUNDLE, settings, arrays)


def _onnx_lm(b: Bundle) -> Any:
    """The bundle's exported ONNX NNLM, scored with onnxruntime: its files written from the hash-checked arrays
    into ``<bundle>/onnx`` (rewritten when they differ), where the export's own checks read them."""
    from privasr.lm.neural.export import OnnxNeuralLM

    folder = b.folder / "onnx"
    folder.mkdir(exist_ok=True)
    for k, v in b.arrays.items():
        if k.startswith("onnx/"):
            p = folder / k[len("onnx/"):]
            data = np.asarray(v, dtype=np.uint8).tobytes()
            if not p.is_file() or p.read_bytes() != data:
                tmp = p.with_name(f".{p.name}.tmp")
                tmp.write_bytes(data)
                os.replace(tmp, p)
    return OnnxNeuralLM(folder, threads=1)


@dataclass
class FmpDeviceModel:
    """What a device builds from FMP's bundle: the NNLM, the combination and its weights, the algorithm's
    settings. Everything is made by installed code from arrays and JSON.

    Attributes:
        bundle: the read bundle.
        lm: the NNLM (:class:`~privasr.lm.neural.scorer.NeuralLM`, on the CPU).
        combination, weights, bias_weight: the first-pass combination, its tuned weights and FMP's weight.
        rounds: the run's number of rounds.
    """

    bundle: Bundle
    lm: Any
    combination: Any
    weights: dict[str, Any]
    bias_weight: float
    rounds: int

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | Bundle, *,
             expected: str | None = None) -> FmpDeviceModel:
        """Read FMP's bundle from ``folder`` (:func:`~privasr.device.bundle.read_bundle`) and build the model.

        Raises:
            InputError: a bundle that is not FMP's, has another hash than ``expected``, or whose settings or
                arrays do not make a model (naming the bundle's file).
        """
        def build(b: Bundle) -> FmpDeviceModel:
            import torch

            from privasr.lm.neural.models import NeuralLMConfig, build_model
            from privasr.lm.neural.scorer import NeuralLM
            from privasr.lm.neural.vocab import Vocabulary
            from privasr.rescore.combine import Combination

            s = b.settings
            fmt = s["nnlm"].get("format", "torch")
            if fmt not in NNLM_FORMATS:
                raise ValueError(f"NNLM format {fmt!r}")
            if fmt == "torch":
                config = NeuralLMConfig.from_dict(s["nnlm"]["config"])
                vocab = Vocabulary.from_json(s["nnlm"]["vocab"])
                with torch.random.fork_rng(devices=[]), torch.device("cpu"):
                    net = build_model(config, vocab)
                state = {k[len("nnlm/"):]: torch.from_numpy(np.array(v)) for k, v in b.arrays.items()
                         if k.startswith("nnlm/")}
                net.load_state_dict(state, strict=True)
                nnlm: Any = NeuralLM(net.eval(), vocab)
            else:
                nnlm = _onnx_lm(b)
            r = s["rescoring"]
            comb = Combination(prior=r["prior"], lms=tuple(r["lms"]), mode=r["mode"],
                               prior_weight=r["prior_weight"])
            weights = comb.check_weights(r["weights"])
            model = cls(b, nnlm, comb, weights, float(r["bias_weight"]), int(s["rounds"]))
            model.algorithm()  # the settings make an algorithm
            return model

        return build_bundle_model(folder, expected, FMP_BUNDLE, "FMP", build)  # type: ignore[no-any-return]

    @property
    def vocab(self) -> Any:
        """The NNLM's vocabulary (FMP's word ids)."""
        return self.lm.vocab

    def algorithm(self, nbests: Sequence[NBest] = ()) -> Any:
        """The device's :class:`~privasr.federated.algorithms.fmp.FmpAlgorithm`: the bundle's settings, holding
        the whole ``qbar`` between rounds (a device does not know which words it will decode next). A bundle with
        exact renormalisation normalises over ``nbests`` (the device's own lists) with its NNLM."""
        from privasr.federated.algorithms.fmp import BackgroundBigram, FmpAlgorithm, FmpConfig
        from privasr.federated.algorithms.fmp_data import nnlm_normalizer

        a, s = self.bundle.arrays, self.bundle.settings
        bigram = None
        if "bigram/keys" in a:
            bigram = BackgroundBigram(a["bigram/keys"], a["bigram/counts"], a["bigram/history"],
                                      float(a["bigram/prior"][0]))
        norm = nnlm_normalizer(self.lm, nbests) if s["normalized"] else None
        return FmpAlgorithm(FmpConfig.from_dict(s["fmp"]), a["background"], bigram, norm, hold_all=True)

    def utterances(self, nbests: Sequence[NBest]) -> list[Any]:
        """The device's lists as :class:`~privasr.federated.algorithms.fmp.FmpUtterance` objects (in the order
        given): each hypothesis's words as NNLM ids (``<unk>`` left out, as on the server) and its baseline total
        (first-pass scores, the NNLM's score and the word penalty with the bundle's weights).

        Raises:
            InputError: a hypothesis without a first-pass score the combination needs (naming the utterance).
        """
        from privasr.federated.algorithms.fmp import FmpUtterance
        from privasr.rescore.combine import LMScoreCache, score_table

        if not nbests:
            return []
        needed = [k for k in ("am", "lm") if (k == "am" and self.combination.prior == "am") or
                  (k == "lm" and "lm" in self.combination.lms)]
        for nb in nbests:
            for h in nb.hyps:
                miss = [k for k in needed if k not in h.scores]
                if miss:
                    raise InputError(f"utterance {nb.utt_id!r} has a hypothesis without a {'/'.join(miss)} score",
                                     expected="the first-pass scores the operator's rescoring uses")
        table = score_table(nbests, {"nnlm": LMScoreCache(self.lm)})
        totals = self.combination.totals(table, self.weights)
        off = np.asarray(table.offsets)
        unk = self.vocab.unk_id
        out = []
        for k, nb in enumerate(nbests):
            enc = (np.asarray(self.vocab.encode(h.words), dtype=np.int64) for h in nb.hyps)
            ids = tuple(e[e != unk] for e in enc)
            out.append(FmpUtterance(nb.utt_id, ids, totals[off[k]:off[k + 1]], self.bias_weight))
        return out
