"""The language models of a rescoring config: their typed settings, and loading or training them.

An LM entry of a config (``lms: {NAME: ...}`` in ``privasr rescore run``, the server ``nnlm`` of ``fmp run``
and ``fedlm run``) is one of::

    NAME: PATH.arpa                 # an ARPA file, or
    NAME: {arpa: PATH}              # the same, or
    NAME: {train: {text: SOURCE, order: 3, prune: null, normalize: null}}
                                    # trained with modified Kneser-Ney (privasr.lm.ngram.mkn.train_mkn) on a
                                    # text source of privasr.corpus.sources (ami-train, gutenberg, ...) or a
                                    # text file; cached as CACHE/NAME.arpa and read back from it, reused by
                                    # later runs while text and spec match
    NAME: {neural: {checkpoint: PATH, device: cpu, batch_tokens: 4096, spread_unk: true}}
                                    # a neural LM checkpoint (privasr lm train-neural), or
    NAME: {neural: {train: {text: ami-train, valid: ami-dev, preset: small-lstm, model: {}, options: {},
                            seed: 0, max_sentences: null, normalize: null}}}
                                    # trained on the fly with privasr.lm.neural.train.train_lm (model: config
                                    # overrides of the preset; options: TrainOptions fields; normalize: a
                                    # normaliser run on top of both texts, e.g. neural), cached as
                                    # CACHE/NAME.pt + NAME.json and reused while the spec matches
    NAME: {onnx: DIR}               # an export folder of privasr lm export (ONNX, fp32 or int8; the `onnx`
    NAME: {onnx: {dir: DIR, threads: 1, batch_tokens: 1024, spread_unk: true, graph_optimization: all}}
                                    # extra), scored with onnxruntime on the CPU
                                    # (privasr.lm.neural.export.OnnxNeuralLM)

:class:`LMSettings` is that entry's schema (:mod:`privasr.config`); :meth:`LMSettings.spec` names it and
gives the :class:`LMSpec` that :func:`build_lm` loads or trains.

>>> from privasr.config import Context, from_mapping
>>> s = from_mapping(LMSettings, {"train": {"text": "ami-train", "order": 2}}, "lms.ami2", Context(False))
>>> s.spec("ami2").to_dict()
{'train': {'text': 'ami-train', 'order': 2, 'prune': None, 'normalize': None}}
>>> from_mapping(LMSettings, {"arpa": "x.arpa", "train": {"text": "ami-train"}}, "lms.x", Context(False))
Traceback (most recent call last):
...
privasr.errors.ConfigError: config key 'lms.x' needs exactly one of 'arpa' and 'train' (expected an ARPA path or {train: {text: ..., order: ...}})
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.config import Context, expand_vars, setting, to_dict
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel
from privasr.rescore.combine import LMScoreCache

__all__ = ["LMSpec", "LMSettings", "NgramTrainSettings", "NeuralSettings", "NeuralTrainSettings", "OnnxSettings",
           "build_lm", "train_options", "ref_perplexity"]


# ---------------------------------------------------------------------------------------------- settings


def _text_source(v: str, where: str, ctx: Context) -> str:
    """A text source name of :mod:`privasr.corpus.sources`, or an existing text file (``${VAR}`` expanded)."""
    from privasr.corpus.sources import TEXT_SOURCES

    if v in TEXT_SOURCES:
        return v
    p = Path(expand_vars(v))
    if ctx.check_files and not p.exists():
        raise ConfigError(f"config key {where!r}: no such file", path=p)
    return str(p)


@dataclass(frozen=True)
class NgramTrainSettings:
    """``{train: {...}}`` of an n-gram LM entry: the text it is trained on and the estimation settings."""

    text: str
    order: int = setting(3, min=1, max=10)
    prune: Any = None
    normalize: Any = None

    def __config_check__(self, where: str, ctx: Context) -> NgramTrainSettings:
        if self.normalize is not None:
            from privasr.text.normalize import Normalizer

            Normalizer.from_spec(self.normalize)  # validates
        return dataclasses.replace(self, text=_text_source(self.text, f"{where}.text", ctx))


@dataclass(frozen=True)
class NeuralTrainSettings:
    """``{neural: {train: {...}}}``: a neural LM trained on the fly (text, early-stopping text, preset, ...)."""

    text: str
    valid: str
    preset: str
    model: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    seed: int = setting(0, min=0)
    max_sentences: int | None = setting(None, min=1)
    normalize: Any = None

    def __config_check__(self, where: str, ctx: Context) -> NeuralTrainSettings:
        if self.normalize is not None:
            from privasr.text.normalize import Normalizer

            Normalizer.from_spec(self.normalize)  # validates
        text = _text_source(self.text, f"{where}.text", ctx)
        valid = _text_source(self.valid, f"{where}.valid", ctx)
        try:
            from privasr.lm.neural.models import PRESETS, NeuralLMConfig
        except ImportError:  # pragma: no cover - torch missing
            raise ConfigError(f"config key {where.rsplit('.', 1)[0]!r}: neural LMs need torch",
                              expected="pip install privasr[neural]") from None
        if self.preset not in PRESETS:
            raise ConfigError(f"config key {where}.preset is {self.preset!r}",
                              expected=f"one of {', '.join(sorted(PRESETS))}")
        try:
            NeuralLMConfig.preset(self.preset).replace(**self.model)
        except ConfigError as e:
            raise ConfigError(f"config key {where}.model: {e.message}", expected=e.expected) from None
        train_options(self.options, f"{where}.options")
        return dataclasses.replace(self, text=text, valid=valid)


@dataclass(frozen=True)
class NeuralSettings:
    """``{neural: {...}}``: a neural LM from a checkpoint or trained on the fly, and how it is scored."""

    checkpoint: Path | None = setting(None, exists="file")
    train: NeuralTrainSettings | None = None
    device: str = "cpu"
    batch_tokens: int = setting(4096, min=1)
    spread_unk: bool = True

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """Exactly one of ``checkpoint`` and ``train``."""
        if isinstance(value, Mapping) and ("checkpoint" in value) == ("train" in value):
            raise ConfigError(f"config key {where!r} needs exactly one of 'checkpoint' and 'train'",
                              expected="{checkpoint: PATH} or {train: {text: ..., preset: ...}}")
        return value

    def __config_check__(self, where: str, ctx: Context) -> None:
        if (self.checkpoint is None) == (self.train is None):
            raise ConfigError(f"config key {where!r} needs exactly one of 'checkpoint' and 'train'",
                              expected="{checkpoint: PATH} or {train: {text: ..., preset: ...}}")

    def __config_dict__(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device, "batch_tokens": self.batch_tokens,
                               "spread_unk": self.spread_unk}
        if self.checkpoint is not None:
            out["checkpoint"] = str(self.checkpoint)
        else:
            out["train"] = to_dict(self.train)
        return out


@dataclass(frozen=True)
class OnnxSettings:
    """``{onnx: {...}}`` (or ``{onnx: DIR}``): an exported model (``privasr lm export``) scored with onnxruntime.

    >>> from privasr.config import Context, from_mapping
    >>> from_mapping(LMSettings, {"onnx": "exp"}, "lms.x", Context(False)).spec("x").to_dict()["onnx"]["threads"]
    1
    """

    dir: Path = setting(exists="folder")
    threads: int = setting(1, min=1)
    batch_tokens: int = setting(1024, min=1)
    spread_unk: bool = True
    graph_optimization: str = setting("all", choices=("all", "extended", "basic", "none"))

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """A folder path is short for ``{dir: PATH}``."""
        return {"dir": value} if isinstance(value, str) else value

    def __config_dict__(self) -> dict[str, Any]:
        return {"dir": str(self.dir), "threads": self.threads, "batch_tokens": self.batch_tokens,
                "spread_unk": self.spread_unk, "graph_optimization": self.graph_optimization}


@dataclass(frozen=True)
class LMSettings:
    """One LM entry of a config (module docstring): exactly one of ``arpa``, ``train``, ``neural`` and ``onnx``."""

    arpa: Path | None = setting(None, exists="file")
    train: NgramTrainSettings | None = None
    neural: NeuralSettings | None = None
    onnx: OnnxSettings | None = None

    @classmethod
    def __config_value__(cls, value: Any, where: str) -> Any:
        """An ARPA path is short for ``{arpa: PATH}``; exactly one kind of LM per entry."""
        if isinstance(value, str):
            return {"arpa": value}
        if isinstance(value, Mapping):
            if "neural" in value or "onnx" in value:
                if len(value) > 1:
                    raise ConfigError(f"config key {where!r} needs exactly one of 'arpa', 'train', 'neural' and "
                                      "'onnx'", expected="an ARPA path, {train: {...}}, {neural: {...}} or "
                                      "{onnx: DIR}")
            elif ("arpa" in value) == ("train" in value) and set(value) <= {"arpa", "train"}:
                raise ConfigError(f"config key {where!r} needs exactly one of 'arpa' and 'train'",
                                  expected="an ARPA path or {train: {text: ..., order: ...}}")
        return value

    def spec(self, name: str) -> LMSpec:
        """The :class:`LMSpec` of this entry under ``name``."""
        if self.neural is not None:
            return LMSpec(name, neural=self.neural.__config_dict__())
        if self.onnx is not None:
            return LMSpec(name, onnx=self.onnx.__config_dict__())
        if self.arpa is not None:
            return LMSpec(name, arpa=self.arpa)
        assert self.train is not None
        t = self.train
        return LMSpec(name, text=t.text, order=t.order, prune=t.prune, normalize=t.normalize)

    def __config_dict__(self) -> dict[str, Any]:
        return self.spec("").to_dict()


@dataclass(frozen=True)
class LMSpec:
    """One language model to load or train: an ARPA file, an n-gram training spec, a neural spec or an ONNX
    export."""

    name: str
    arpa: Path | None = None
    text: str | None = None
    order: int = 3
    prune: Any = None
    normalize: Any = None
    neural: Mapping[str, Any] | None = None
    onnx: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description."""
        if self.neural is not None:
            return {"neural": copy.deepcopy(dict(self.neural))}
        if self.onnx is not None:
            return {"onnx": dict(self.onnx)}
        if self.arpa is not None:
            return {"arpa": str(self.arpa)}
        return {"train": {"text": self.text, "order": self.order, "prune": self.prune, "normalize": self.normalize}}


def train_options(options: Mapping[str, Any], where: str) -> Any:
    """``TrainOptions(**options)`` (unknown or invalid fields: :class:`ConfigError` naming ``where``)."""
    from privasr.lm.neural.train import TrainOptions

    names = {f.name for f in dataclasses.fields(TrainOptions)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown} in {where}", expected=f"some of {sorted(names)}")
    try:
        return TrainOptions(**options)
    except (ConfigError, InputError, TypeError, ValueError) as e:
        raise ConfigError(f"config key {where}: {e}") from None


# ---------------------------------------------------------------------------------------------- building


def _text_hash(sentences: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256()
    for s in sentences:
        h.update(" ".join(s).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _train_kwargs(prune: Any) -> dict[str, Any]:
    return {} if prune is None else {"prune": prune}


def build_lm(spec: LMSpec, cache_dir: Path | None, data: Path | None = None) -> tuple[LanguageModel, dict[str, Any]]:
    """Load or train one LM; a trained LM is cached as ``cache_dir/NAME.arpa`` with ``NAME.json`` (its key)."""
    from privasr.lm.ngram.arpa import read_arpa, write_arpa

    if spec.neural is not None:
        return _build_neural(spec, cache_dir, data)
    if spec.onnx is not None:
        return _build_onnx(spec)
    t0 = time.perf_counter()
    if spec.arpa is not None:
        lm = read_arpa(spec.arpa)
        info: dict[str, Any] = {"arpa": str(spec.arpa), "load_s": time.perf_counter() - t0}
    else:
        from privasr.corpus.sources import load_text

        assert spec.text is not None
        sents = load_text(spec.text, data=data, normalize=spec.normalize)
        if not sents:
            raise InputError(f"language model {spec.name}: the training text is empty", path=spec.text)
        key = {"text": spec.text, "text_sha256": _text_hash(sents), "order": spec.order, "prune": spec.prune,
               "normalize": spec.normalize, "trainer": "privasr.lm.ngram.mkn.train_mkn", "version": __version__}
        info = {"train": spec.to_dict()["train"], "sentences": len(sents), "tokens": sum(map(len, sents)),
                "text_s": time.perf_counter() - t0}
        arpa = meta = None
        if cache_dir is not None:
            arpa, meta = cache_dir / f"{spec.name}.arpa", cache_dir / f"{spec.name}.json"
        lm = None
        if arpa is not None and meta is not None and arpa.is_file() and meta.is_file():
            try:
                same = json.loads(meta.read_text(encoding="utf-8")) == key
            except (OSError, ValueError):
                same = False
            if same:
                t1 = time.perf_counter()
                lm = read_arpa(arpa)
                info.update(cached=True, arpa=str(arpa), load_s=time.perf_counter() - t1)
        if lm is None:
            from privasr.lm.ngram.mkn import train_mkn

            t1 = time.perf_counter()
            trained = train_mkn(sents, spec.order, **_train_kwargs(spec.prune))
            info.update(cached=False, train_s=time.perf_counter() - t1)
            if arpa is not None and meta is not None:
                # score with the model read back from the ARPA file, so that this run and every later one
                # (which reuses the file) use exactly the same probabilities
                t1 = time.perf_counter()
                arpa.parent.mkdir(parents=True, exist_ok=True)
                write_arpa(trained, arpa)
                lm = read_arpa(arpa)
                meta.write_text(json.dumps(key, indent=1) + "\n", encoding="utf-8")
                info.update(arpa=str(arpa), write_read_s=time.perf_counter() - t1)
            else:
                lm = trained
    info["order"] = lm.order
    if hasattr(lm, "num_ngrams"):
        info["ngrams"] = [int(lm.num_ngrams(n)) for n in range(1, lm.order + 1)]
    info["seconds"] = time.perf_counter() - t0
    return lm, info


def _build_neural(spec: LMSpec, cache_dir: Path | None, data: Path | None) -> tuple[LanguageModel, dict[str, Any]]:
    """Load a neural checkpoint, or train one (cached as ``cache_dir/NAME.pt`` + ``NAME.json``, its key)."""
    from privasr.lm.neural.scorer import NeuralLM

    assert spec.neural is not None
    t0 = time.perf_counter()
    nspec = spec.neural
    kw = {"device": nspec["device"], "batch_tokens": nspec["batch_tokens"], "spread_unk": nspec["spread_unk"]}
    info: dict[str, Any] = {"neural": copy.deepcopy(dict(nspec))}
    if "checkpoint" in nspec:
        lm = NeuralLM.from_checkpoint(nspec["checkpoint"], **kw)
        info.update(checkpoint=nspec["checkpoint"], load_s=time.perf_counter() - t0)
    else:
        from privasr.corpus.sources import load_text
        from privasr.lm.neural.checkpoint import load_checkpoint, save_checkpoint
        from privasr.lm.neural.models import NeuralLMConfig

        t = nspec["train"]
        norm = t.get("normalize")
        sents = load_text(t["text"], data=data, normalize=norm)
        if t["max_sentences"] is not None:
            sents = sents[: t["max_sentences"]]
        valid = load_text(t["valid"], data=data, normalize=norm)
        if not sents:
            raise InputError(f"language model {spec.name}: the training text is empty", path=t["text"])
        config = NeuralLMConfig.preset(t["preset"]).replace(**t["model"])
        key = {"text": t["text"], "text_sha256": _text_hash(sents), "valid": t["valid"],
               "valid_sha256": _text_hash(valid), "preset": t["preset"],
               "model": config.to_dict(), "options": t["options"], "seed": t["seed"],
               "max_sentences": t["max_sentences"], "trainer": "privasr.lm.neural.train.train_lm",
               "vocab_records_unk_types": True,
               "version": __version__}
        if norm is not None:  # only when set: the keys of models trained before the option stay valid
            key["normalize"] = norm
        info.update(sentences=len(sents), tokens=sum(map(len, sents)), text_s=time.perf_counter() - t0)
        ckpt = meta = None
        if cache_dir is not None:
            ckpt, meta = cache_dir / f"{spec.name}.pt", cache_dir / f"{spec.name}.json"
        loaded = None
        if ckpt is not None and meta is not None and ckpt.is_file() and meta.is_file():
            try:
                stored = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                stored = None
            if isinstance(stored, dict) and stored.get("key") == json.loads(json.dumps(key)):
                loaded = load_checkpoint(ckpt, map_location=nspec["device"])
                info.update(cached=True, checkpoint=str(ckpt), training=stored.get("training"))
        if loaded is None:
            from privasr.lm.neural.train import train_lm

            t1 = time.perf_counter()
            options = train_options(t["options"], f"lms.{spec.name}.neural.train.options")
            work = (cache_dir / f"{spec.name}.train") if cache_dir is not None else None
            # an interrupted training of this spec (up to max_epochs / max_steps / patience) is resumed
            resume = work is not None and _claim_training_folder(work, key)
            res = train_lm(sents, valid, config, options, out_dir=work, seed=t["seed"], device=nspec["device"],
                           progress=False, resume=resume)
            training = _train_summary(res)
            training["train_s"] = time.perf_counter() - t1
            info.update(cached=False, training=training)
            model, vocab = res.model, res.vocab
            if ckpt is not None and meta is not None:
                ckpt.parent.mkdir(parents=True, exist_ok=True)
                save_checkpoint(ckpt, model, vocab, model.config, extra={"key": key, "training": training})
                meta.write_text(json.dumps({"key": key, "training": training}, indent=1) + "\n", encoding="utf-8")
                loaded = load_checkpoint(ckpt, map_location=nspec["device"])
                info["checkpoint"] = str(ckpt)
                model, vocab = loaded.model, loaded.vocab
            lm = NeuralLM(model, vocab, **kw)
        else:
            lm = NeuralLM(loaded.model, loaded.vocab, **kw)
    info["order"] = "inf" if lm.arch == "lstm" else lm.order
    info["vocab_size"] = len(lm.vocab)
    info["parameters"] = int(sum(p.numel() for p in lm.model.parameters()))
    info["seconds"] = time.perf_counter() - t0
    return lm, info


def _build_onnx(spec: LMSpec) -> tuple[LanguageModel, dict[str, Any]]:
    """An export folder as an :class:`~privasr.lm.neural.export.OnnxNeuralLM` (files checked against meta.json)."""
    try:
        from privasr.lm.neural.export import OnnxNeuralLM
    except ImportError:  # pragma: no cover - torch missing
        raise ConfigError(f"language model {spec.name}: ONNX exports need the neural and onnx extras",
                          expected="pip install privasr[neural,onnx]") from None
    assert spec.onnx is not None
    t0 = time.perf_counter()
    o = spec.onnx
    lm = OnnxNeuralLM(o["dir"], threads=o["threads"], batch_tokens=o["batch_tokens"], spread_unk=o["spread_unk"],
                      graph_optimization=o["graph_optimization"])
    info: dict[str, Any] = {"onnx": dict(o), "int8": lm.meta["int8"], "source": lm.meta.get("source", {}),
                            "model_bytes": lm.model_bytes, "model_sha256": lm.meta["files"][lm.model_path.name],
                            "order": "inf" if lm.arch == "lstm" else lm.order, "vocab_size": len(lm.vocab),
                            "seconds": time.perf_counter() - t0}
    return lm, info


def _claim_training_folder(work: Path, key: Mapping[str, Any]) -> bool:
    """Whether ``work`` (a cache's ``NAME.train``) holds a training of the spec ``key`` to resume; otherwise the
    folder is cleared and made this spec's.

    The folder records the spec it trains in ``spec.json``: the cache key without the options a resume may change
    (:data:`~privasr.lm.neural.train.RESUMABLE_CHANGES`). A cache is keyed by the LM's name, so runs that share
    one (``make headlines`` does) can leave a ``last.pt`` of another model under the same name: resuming it
    would fail on another architecture, or continue another text's model with its vocabulary on this text. Such
    a folder, or one without ``spec.json``, is the cache's own scratch and is removed.

    >>> import tempfile
    >>> work = Path(tempfile.mkdtemp()) / "nn.train"
    >>> key = {"text": "a.txt", "options": {"lr": 0.01, "max_epochs": 3}}
    >>> _claim_training_folder(work, key)                   # nothing to resume; the folder is this spec's
    False
    >>> _ = (work / "last.pt").write_bytes(b"")               # what an interrupted training leaves
    >>> _claim_training_folder(work, {**key, "options": {"lr": 0.01, "max_epochs": 5}})
    True
    >>> _claim_training_folder(work, {**key, "text": "b.txt"})  # another model under the same name
    False
    >>> (work / "last.pt").exists()
    False
    """
    import shutil

    from privasr.lm.neural.train import RESUMABLE_CHANGES

    spec = json.loads(json.dumps({**key, "options": {k: v for k, v in key["options"].items()
                                                     if k not in RESUMABLE_CHANGES}}))
    marker = work / "spec.json"
    if (work / "last.pt").is_file():
        try:
            stored = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = None
        if stored == spec:
            return True
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    marker.write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    return False


def _train_summary(res: Any) -> dict[str, Any]:
    """JSON-ready facts of a :func:`~privasr.lm.neural.train.train_lm` result (what it exposes)."""
    out: dict[str, Any] = {}
    for k in ("best_valid_ppl", "best_epoch", "best_step", "initial_valid_ppl", "steps", "tokens_per_s",
              "stopped_early", "epochs"):
        v = getattr(res, k, None)
        if v is not None:
            out[k] = json.loads(json.dumps(v, default=str))
    return out


def ref_perplexity(cache: LMScoreCache, refs: Sequence[Sequence[str]]) -> float:
    """Perplexity incl. OOVs (as ``<unk>``) and ``</s>``, from the cached ln probabilities of the refs."""
    if not refs:
        return math.nan
    lnp = cache.ln_probs(refs)
    tokens = sum(len(r) + 1 for r in refs)
    return float(math.exp(-float(lnp.sum()) / tokens))
