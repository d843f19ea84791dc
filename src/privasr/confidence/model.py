"""A word-confidence classifier on decoding features, calibrated with isotonic regression.

Paper 001 (section 2.3 and 3) weights the federated NNLM loss by token confidences from "a confidence
classifier ... trained using feed-forward networks and handcrafted input features from decoding results;
isotonic regression is used for calibrating the model". :class:`ConfidenceModel` is that classifier for
N-best lists without per-word confidences:

1. **Features** of each 1-best word (:mod:`privasr.confidence.features`): N-best word posterior and
   agreement, first-pass scores per word, word length, LM log-probability, position, utterance length,
   N-best size, score gap, and the decoder's own word confidence (its lattice word posterior) where the data
   has one; ``features`` chooses a subset (e.g. all but ``decoder_confidence``, to measure what it adds).
2. **Labels**: the word is a hit in sclite's alignment of the 1-best against the reference.
3. **Split by utterance** (seeded): a fraction ``calibration_fraction`` (20 %) of the utterances is held
   out; the classifier -- scikit-learn's ``HistGradientBoostingClassifier`` (``kind="gbm"``, the default) or
   ``MLPClassifier`` (``kind="mlp"``, a small feed-forward network on standardised, mean-imputed features)
   -- is trained on the rest.
4. **Calibration**: ``IsotonicRegression(out_of_bounds="clip")`` from the classifier's probability to the
   held-out words' correctness, so that a confidence of 0.8 means 80 % of such words are right. The map
   is monotone (the AUC changes only through ties between its steps). One pseudo-word of the opposite
   class is added at each end (a correct one at the lowest probability, a wrong one at the highest), so
   no confidence is exactly 0 or 1: a correct word at confidence 0 (or a wrong one at 1) would cost
   unbounded cross entropy (NCE) and would silence a word completely in a confidence-weighted loss.

Storage without pickle: after training, the classifier is **exported to plain arrays** -- the boosted trees'
nodes (feature, threshold, missing-value direction, children, leaf values; read from scikit-learn's fitted
predictors) or the network's weights and biases -- and the isotonic map is kept as its threshold arrays.
Prediction always runs on these arrays with numpy (scikit-learn is only needed to *train*), the export is
checked against scikit-learn's own ``predict_proba`` on the training words, and :meth:`ConfidenceModel.save`
writes them with the hyper-parameters and training summary to one ``.npz`` file that :meth:`ConfidenceModel.load`
reads with ``allow_pickle=False``. A saved model therefore predicts exactly what the trained one did.

>>> from privasr.synth import SynthConfig, generate
>>> corpus = generate(SynthConfig.preset("tiny", seed=1))
>>> model = ConfidenceModel.fit(corpus.test, seed=0)
>>> conf = model.predict(corpus.dev[0])
>>> conf.shape == (len(corpus.dev[0].best),) and bool(((conf >= 0) & (conf <= 1)).all())
True
>>> report = model.evaluate(corpus.dev)
>>> sorted(report.as_dict())[:4]
['auc', 'base_rate', 'brier', 'calibrated']
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import warnings
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from privasr.confidence.calibration import (
    DEFAULT_BINS,
    ReliabilityCurve,
    brier_score,
    fit_isotonic,
    normalized_cross_entropy,
    reliability_curve,
    require_sklearn,
    roc_auc,
)
from privasr.confidence.ctm import CTM_FEATURE_NAMES
from privasr.confidence.features import FEATURE_NAMES, labels_many, stack, word_features_many
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.lm.base import LanguageModel

__all__ = ["ConfidenceModel", "ConfidenceReport", "word_confidences", "KINDS", "DEFAULT_PARAMS", "FORMAT"]

KINDS = ("gbm", "mlp")
"""Classifier kinds: gradient-boosted trees or a small feed-forward network."""

DEFAULT_PARAMS: Mapping[str, Mapping[str, Any]] = {
    "gbm": {"max_iter": 150, "learning_rate": 0.05, "max_leaf_nodes": 15, "min_samples_leaf": 20,
            "l2_regularization": 1.0},
    "mlp": {"hidden_layer_sizes": [32], "alpha": 1e-3, "learning_rate_init": 1e-3, "max_iter": 200,
            "batch_size": 256},
}
"""scikit-learn hyper-parameters of each kind (``params`` of :meth:`ConfidenceModel.fit` overrides them)."""

FORMAT = "privasr-confidence-model"
KNOWN_FEATURES = (list(FEATURE_NAMES), list(CTM_FEATURE_NAMES))
"""The feature sets a saved model may have been trained on (:meth:`ConfidenceModel.load` accepts these, and
any subset of the N-best features in their order)."""


def _known(names: Any) -> bool:
    if names in KNOWN_FEATURES:
        return True
    return (isinstance(names, list) and bool(names) and all(isinstance(n, str) for n in names)
            and _nbest_subset(names))


def _nbest_subset(names: Sequence[str]) -> bool:
    """Whether ``names`` are distinct N-best features in :data:`FEATURE_NAMES` order."""
    idx = [FEATURE_NAMES.index(n) for n in names if n in FEATURE_NAMES]
    return len(idx) == len(names) and idx == sorted(set(idx))
_FORMAT_VERSION = 1
_CHUNK = 4096


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # = 1 / (1 + exp(-z)), without overflow warnings


# ----------------------------------------------------------------------------------------- predictors


@dataclass(frozen=True)
class _Trees:
    """Boosted regression trees in flat arrays (all trees' nodes concatenated, children as global indices)."""

    feature: np.ndarray
    threshold: np.ndarray
    missing_left: np.ndarray
    left: np.ndarray
    right: np.ndarray
    leaf: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    baseline: float
    depth: int = field(init=False)

    def __post_init__(self) -> None:
        n = self.value.size
        arrays = (self.feature, self.threshold, self.missing_left, self.left, self.right, self.leaf)
        if any(a.ndim != 1 or a.size != n for a in arrays) or self.roots.ndim != 1 or n == 0:
            raise InputError("confidence model trees have inconsistent array sizes")
        if not math.isfinite(self.baseline) or not np.isfinite(self.value).all():
            raise InputError("confidence model trees hold non-finite values")
        inner = ~self.leaf
        idx = np.arange(n)
        ends = np.append(self.roots[1:], n)
        if self.roots.size == 0 or self.roots[0] != 0 or (np.diff(self.roots) <= 0).any() or self.roots[-1] >= n:
            raise InputError("confidence model trees have invalid roots")
        tree_end = np.repeat(ends, np.diff(np.append(self.roots, n)))
        for child in (self.left, self.right):  # children after their parent, inside its tree: no cycles
            if ((child[inner] <= idx[inner]) | (child[inner] >= tree_end[inner])).any():
                raise InputError("confidence model trees have invalid child indices")
        if (self.feature[inner] < 0).any():
            raise InputError("confidence model trees split on unknown features")
        depth = np.zeros(n, dtype=np.int64)
        for i in np.flatnonzero(inner):
            depth[self.left[i]] = depth[self.right[i]] = depth[i] + 1
        object.__setattr__(self, "depth", int(depth.max()))

    @classmethod
    def from_sklearn(cls, clf: Any) -> _Trees:
        nodes = [tree.nodes for trees in clf._predictors for tree in trees]
        if any(bool(nd["is_categorical"].any()) for nd in nodes):  # pragma: no cover - no categorical features
            raise RuntimeError("categorical splits cannot be exported")
        sizes = np.array([nd.size for nd in nodes], dtype=np.int64)
        roots = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        offset = np.repeat(roots, sizes)
        cat = np.concatenate(nodes)
        return cls(
            feature=cat["feature_idx"].astype(np.int64),
            threshold=cat["num_threshold"].astype(np.float64),
            missing_left=cat["missing_go_to_left"].astype(bool),
            left=cat["left"].astype(np.int64) + offset,
            right=cat["right"].astype(np.int64) + offset,
            leaf=cat["is_leaf"].astype(bool),
            value=cat["value"].astype(np.float64),
            roots=roots.astype(np.int64),
            baseline=float(np.asarray(clf._baseline_prediction).ravel()[0]),
        )

    def logit(self, x: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape[0])
        for lo in range(0, x.shape[0], _CHUNK):
            xb = x[lo:lo + _CHUNK]
            rows = np.arange(xb.shape[0])[:, None]
            node = np.broadcast_to(self.roots, (xb.shape[0], self.roots.size)).copy()
            for _ in range(self.depth):
                active = ~self.leaf[node]
                if not active.any():
                    break
                v = xb[rows, self.feature[node]]
                go_left = np.where(np.isnan(v), self.missing_left[node], v <= self.threshold[node])
                node = np.where(active, np.where(go_left, self.left[node], self.right[node]), node)
            out[lo:lo + _CHUNK] = self.baseline + self.value[node].sum(axis=1)
        return out

    def arrays(self) -> dict[str, np.ndarray]:
        return {"feature": self.feature, "threshold": self.threshold, "missing_left": self.missing_left,
                "left": self.left, "right": self.right, "leaf": self.leaf, "value": self.value,
                "roots": self.roots, "baseline": np.array(self.baseline)}

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> _Trees:
        return cls(feature=_ints(a["feature"]), threshold=_floats(a["threshold"]),
                   missing_left=_bools(a["missing_left"]), left=_ints(a["left"]), right=_ints(a["right"]),
                   leaf=_bools(a["leaf"]), value=_floats(a["value"]), roots=_ints(a["roots"]),
                   baseline=float(_floats(a["baseline"]).reshape(-1)[0]))


@dataclass(frozen=True)
class _Network:
    """A ReLU feed-forward network with a logistic output, on standardised, mean-imputed features."""

    mean: np.ndarray
    scale: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        f = self.mean.size
        if self.mean.shape != (f,) or self.scale.shape != (f,) or not self.weights:
            raise InputError("confidence model network has inconsistent array sizes")
        if len(self.weights) != len(self.biases):
            raise InputError("confidence model network has inconsistent array sizes")
        width = f
        for w, b in zip(self.weights, self.biases, strict=True):
            if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
                raise InputError("confidence model network has inconsistent array sizes")
            width = w.shape[1]
        if width != 1:
            raise InputError("confidence model network must have one output")
        for a in (self.mean, self.scale, *self.weights, *self.biases):
            if not np.isfinite(a).all():
                raise InputError("confidence model network holds non-finite values")
        if (self.scale <= 0).any():
            raise InputError("confidence model network has non-positive feature scales")

    @staticmethod
    def standardiser(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns (e.g. no LM)
            mean = np.nanmean(x, axis=0)
            sd = np.nanstd(x, axis=0)
        mean = np.where(np.isfinite(mean), mean, 0.0)
        sd = np.where(np.isfinite(sd) & (sd > 1e-12), sd, 1.0)
        return mean, sd

    def standardise(self, x: np.ndarray) -> np.ndarray:
        z = (x - self.mean) / self.scale
        return np.where(np.isnan(z), 0.0, z)

    def logit(self, x: np.ndarray) -> np.ndarray:
        z = self.standardise(x)
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            z = np.maximum(z @ w + b, 0.0)
        return (z @ self.weights[-1] + self.biases[-1])[:, 0]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {"mean": self.mean, "scale": self.scale, "layers": np.array(len(self.weights))}
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            out[f"w{i}"], out[f"b{i}"] = w, b
        return out

    @classmethod
    def from_arrays(cls, a: Mapping[str, np.ndarray]) -> _Network:
        layers = int(_ints(a["layers"]).reshape(-1)[0])
        if not 1 <= layers <= 64:
            raise InputError(f"confidence model network has {layers} layers")
        return cls(_floats(a["mean"]), _floats(a["scale"]),
                   tuple(_floats(a[f"w{i}"]) for i in range(layers)), tuple(_floats(a[f"b{i}"]) for i in range(layers)))


def _floats(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "fiu":
        raise InputError(f"confidence model array of type {a.dtype}", expected="numbers")
    return np.asarray(a, dtype=np.float64)


def _ints(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "iu":
        raise InputError(f"confidence model array of type {a.dtype}", expected="integers")
    return np.asarray(a, dtype=np.int64)


def _bools(a: np.ndarray) -> np.ndarray:
    if a.dtype.kind not in "biu":
        raise InputError(f"confidence model array of type {a.dtype}", expected="booleans")
    return np.asarray(a, dtype=bool)


# ----------------------------------------------------------------------------------------------- training


def _train(kind: str, x: np.ndarray, y: np.ndarray, seed: int, params: Mapping[str, Any]) -> _Trees | _Network:
    """Train scikit-learn's classifier on one thread, export it to arrays and check the export reproduces it.

    The models are small (thousands of words, a dozen features): OpenMP's thread start-up and spinning cost
    more than they save, by an order of magnitude on a loaded two-core machine.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _train_sklearn(kind, x, y, seed, params)


def _train_sklearn(kind: str, x: np.ndarray, y: np.ndarray, seed: int, params: Mapping[str, Any]) -> _Trees | _Network:
    if kind == "gbm":
        from sklearn.ensemble import HistGradientBoostingClassifier

        # scikit-learn cannot bin an all-NaN column (e.g. lm_logprob without an LM): a constant is never split on
        xf = np.where(np.isnan(x).all(axis=0), 0.0, x)
        clf = HistGradientBoostingClassifier(early_stopping=False, random_state=seed, **params)
        clf.fit(xf, y)
        model: _Trees | _Network = _Trees.from_sklearn(clf)
        ref = clf.predict_proba(xf)[:, list(clf.classes_).index(True)]
    else:
        from sklearn.exceptions import ConvergenceWarning
        from sklearn.neural_network import MLPClassifier

        mean, scale = _Network.standardiser(x)
        z = np.where(np.isnan((x - mean) / scale), 0.0, (x - mean) / scale)
        p = dict(params)
        p["hidden_layer_sizes"] = tuple(p.get("hidden_layer_sizes", (32,)))
        if isinstance(p.get("batch_size"), int):
            p["batch_size"] = min(p["batch_size"], y.size)  # scikit-learn would clip it with a warning
        clf = MLPClassifier(random_state=seed, **p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            clf.fit(z, y)
        if clf.activation != "relu" or clf.out_activation_ != "logistic":
            raise ConfigError("the confidence MLP must use ReLU hidden units", expected="activation='relu'")
        model = _Network(mean, scale, tuple(np.asarray(w, np.float64) for w in clf.coefs_),
                         tuple(np.asarray(b, np.float64) for b in clf.intercepts_))
        ref = clf.predict_proba(z)[:, list(clf.classes_).index(True)]
    got = _sigmoid(model.logit(x))
    if not np.allclose(got, ref, rtol=0, atol=1e-7):  # pragma: no cover - a scikit-learn layout change
        raise RuntimeError(f"exported {kind} classifier differs from scikit-learn's by {np.abs(got - ref).max():.3g}")
    return model


def _fingerprint(nbests: Sequence[NBest]) -> str:
    h = hashlib.sha256()
    for nb in nbests:
        h.update(f"{nb.utt_id}\t{' '.join(nb.best.words)}\t{' '.join(nb.ref or ())}\n".encode())
    return h.hexdigest()


def _check_params(kind: str, params: Mapping[str, Any] | None) -> dict[str, Any]:
    if kind not in KINDS:
        raise ConfigError(f"unknown confidence classifier kind {kind!r}", expected=" or ".join(KINDS))
    out = dict(DEFAULT_PARAMS[kind])
    if params:
        bad = {"random_state", "early_stopping", "categorical_features"} & set(params)
        if bad:
            raise ConfigError(f"confidence classifier parameter(s) {sorted(bad)} cannot be set",
                              expected="the seed argument for random_state")
        out.update(params)
    return out


def _check_features(features: Sequence[str] | None) -> tuple[str, ...]:
    """The N-best feature columns to train on: all of them, or a non-empty ordered subset.

    >>> _check_features(["posterior", "agreement"])
    ('posterior', 'agreement')
    >>> _check_features(["pitch"])
    Traceback (most recent call last):
    ...
    privasr.errors.ConfigError: confidence features ['pitch'] (expected distinct names from posterior, agreement, am_per_word, lm_per_word, total_per_word, word_length, lm_logprob, position, utt_length, nbest_size, score_gap, decoder_confidence, in that order)
    """
    if features is None:
        return FEATURE_NAMES
    names = list(features) if not isinstance(features, str) else [features]
    if not names or not all(isinstance(n, str) for n in names) or not _nbest_subset(names):
        raise ConfigError(f"confidence features {names!r}"[:200],
                          expected=f"distinct names from {', '.join(FEATURE_NAMES)}, in that order")
    return tuple(names)


# ------------------------------------------------------------------------------------------------ reports


@dataclass(frozen=True)
class ConfidenceReport:
    """How good a model's confidences are on words with references.

    Attributes:
        auc: ROC AUC of the confidences as a detector of correct words (NaN with one class only).
        ece: expected calibration error over ``bins`` equal-width bins.
        nce: normalised cross entropy (NaN with one class only).
        brier: Brier score.
        n_words: 1-best words evaluated.
        n_utterances: utterances evaluated.
        base_rate: fraction of those words that are correct.
        mean_confidence: the mean predicted confidence.
        reliability: the reliability curve (for a plot).
        calibrated: whether the isotonic calibration was applied.
        wrong_weight_share: the share of the confidence mass on incorrect words, ``sum(conf[wrong]) /
            sum(conf)``: in a confidence-weighted loss, the share of the training weight that falls on wrong
            words (``1 - base_rate`` with equal weights, 0 with perfect confidences).
    """

    auc: float
    ece: float
    nce: float
    brier: float
    n_words: int
    n_utterances: int
    base_rate: float
    mean_confidence: float
    reliability: ReliabilityCurve
    calibrated: bool
    wrong_weight_share: float = math.nan

    @classmethod
    def compute(cls, conf: np.ndarray, correct: np.ndarray, *, n_utterances: int, calibrated: bool,
                bins: int = DEFAULT_BINS) -> ConfidenceReport:
        """The report of confidences ``conf`` for words whose correctness is ``correct``.

        >>> r = ConfidenceReport.compute(np.array([0.9, 0.2]), np.array([True, False]), n_utterances=1,
        ...                              calibrated=False, bins=5)
        >>> r.auc, round(r.ece, 3), r.n_words, round(r.wrong_weight_share, 3)
        (1.0, 0.15, 2, 0.182)
        """
        curve = reliability_curve(conf, correct, bins)
        n = int(conf.size)
        mass = float(conf.sum()) if n else 0.0
        return cls(auc=roc_auc(conf, correct), ece=curve.ece, nce=normalized_cross_entropy(conf, correct),
                   brier=brier_score(conf, correct), n_words=n, n_utterances=n_utterances,
                   base_rate=float(correct.mean()) if n else math.nan,
                   mean_confidence=float(conf.mean()) if n else math.nan, reliability=curve, calibrated=calibrated,
                   wrong_weight_share=float(conf[~correct.astype(bool)].sum()) / mass if mass > 0 else math.nan)

    @classmethod
    def of_data(cls, nbests: Sequence[NBest], *, bins: int = DEFAULT_BINS) -> ConfidenceReport | None:
        """The report of the lists' own 1-best confidences as they are (e.g. a decoder's lattice word
        posteriors), against the references; ``None`` when a non-empty 1-best has none, or no list has words.

        >>> from privasr.corpus.records import Hypothesis
        >>> nb = NBest("u", (Hypothesis.from_text("a b", confidences=(0.9, 0.2)),), ref=("a", "c"))
        >>> ConfidenceReport.of_data([nb]).auc, ConfidenceReport.of_data([NBest("v", ())]) is None
        (1.0, True)
        """
        kept = [nb for nb in nbests if nb.hyps and nb.hyps[0].words]
        if not kept or any(nb.hyps[0].confidences is None for nb in kept):
            return None
        c = np.concatenate([np.asarray(nb.hyps[0].confidences, dtype=np.float64) for nb in kept])
        return cls.compute(c, np.concatenate(labels_many(kept)), n_utterances=len(kept), calibrated=False, bins=bins)

    def as_dict(self) -> dict[str, Any]:
        """The scalar figures (the curve is :meth:`ReliabilityCurve.as_dict`)."""
        return {"auc": self.auc, "ece": self.ece, "nce": self.nce, "brier": self.brier, "n_words": self.n_words,
                "n_utterances": self.n_utterances, "base_rate": self.base_rate,
                "mean_confidence": self.mean_confidence, "calibrated": self.calibrated,
                "wrong_weight_share": self.wrong_weight_share,
                "ece_bins": int(self.reliability.count.size)}


# -------------------------------------------------------------------------------------------------- model


class ConfidenceModel:
    """A trained, calibrated word-confidence classifier (build it with :meth:`fit` or :meth:`load`).

    Attributes:
        kind: ``"gbm"`` or ``"mlp"``.
        uses_lm: whether it was trained with the ``lm_logprob`` feature (then it needs the same LM to predict).
        info: hyper-parameters, seed, split sizes and a fingerprint of the training data.
    """

    def __init__(self, kind: str, predictor: _Trees | _Network, iso_x: np.ndarray | None, iso_y: np.ndarray | None,
                 *, uses_lm: bool, posterior_scale: float, info: Mapping[str, Any],
                 feature_names: Sequence[str] = FEATURE_NAMES) -> None:
        if kind not in KINDS:
            raise InputError(f"unknown confidence classifier kind {kind!r}", expected=" or ".join(KINDS))
        if (iso_x is None) != (iso_y is None):
            raise InputError("confidence model has half an isotonic calibration map")
        if iso_x is not None and iso_y is not None:
            if iso_x.ndim != 1 or iso_x.shape != iso_y.shape or iso_x.size == 0:
                raise InputError("confidence model's isotonic thresholds have inconsistent sizes")
            if not (np.isfinite(iso_x).all() and np.isfinite(iso_y).all()) or (np.diff(iso_x) < 0).any():
                raise InputError("confidence model's isotonic thresholds are not finite and sorted")
            if (np.diff(iso_y) < 0).any() or iso_y.min() < 0 or iso_y.max() > 1:
                raise InputError("confidence model's isotonic map is not increasing within [0, 1]")
        if not math.isfinite(posterior_scale) or posterior_scale < 0:
            raise InputError(f"confidence model posterior scale {posterior_scale!r}", expected="a number >= 0")
        names = tuple(feature_names)
        if isinstance(predictor, _Trees):
            inner = predictor.feature[~predictor.leaf]
            if inner.size and int(inner.max()) >= len(names):
                raise InputError("confidence model trees split on unknown features",
                                 expected=f"feature indices below {len(names)}")
        elif predictor.mean.size != len(names):
            raise InputError("confidence model network has inconsistent array sizes",
                             expected=f"{len(names)} input features")
        self.kind = kind
        self.feature_names = names
        self._predictor = predictor
        self._iso_x, self._iso_y = iso_x, iso_y
        self.uses_lm = bool(uses_lm)
        self.posterior_scale = float(posterior_scale)
        self.info = dict(info)

    @property
    def calibrated(self) -> bool:
        """Whether an isotonic calibration map was fitted."""
        return self._iso_x is not None

    def __repr__(self) -> str:
        return (f"ConfidenceModel(kind={self.kind!r}, calibrated={self.calibrated}, uses_lm={self.uses_lm}, "
                f"train_words={self.info.get('n_train_words')})")

    # ------------------------------------------------------------------ training

    @classmethod
    def fit(cls, nbests: Sequence[NBest], lm: LanguageModel | None = None, *, kind: str = "gbm", seed: int = 0,
            calibrate: bool = True, calibration_fraction: float = 0.2, posterior_scale: float = 1.0,
            params: Mapping[str, Any] | None = None, features: Sequence[str] | None = None) -> ConfidenceModel:
        """Train on N-best lists with references and calibrate on a held-out share of their utterances.

        Args:
            nbests: N-best lists, each with a reference (:class:`InputError` names one without).
            lm: a language model for the ``lm_logprob`` feature; predictions then need the same LM.
            kind: ``"gbm"`` (``HistGradientBoostingClassifier``) or ``"mlp"`` (``MLPClassifier``).
            seed: seeds the utterance split and the classifier; the same seed gives the same model.
            calibrate: fit the isotonic map on held-out utterances (else all utterances train the classifier
                and confidences are its raw probabilities).
            calibration_fraction: share of the utterances (with at least one 1-best word) held out for it.
            posterior_scale: scale of the ``total`` scores in the word posterior.
            params: scikit-learn hyper-parameters overriding :data:`DEFAULT_PARAMS`.
            features: the columns of :data:`~privasr.confidence.features.FEATURE_NAMES` to use, in that order
                (``None``: all of them).

        Raises:
            InputError: a list without a reference, or only correct (or only incorrect) training words.
            ConfigError: an unknown kind, parameter or feature, bad ``seed`` or ``calibration_fraction``.
        """
        nbests = list(nbests)
        _check_params(kind, params)
        names = _check_features(features)
        cols = [FEATURE_NAMES.index(n) for n in names]
        ys = labels_many(nbests)
        feats = word_features_many(nbests, lm, posterior_scale=posterior_scale)
        model = cls.fit_features([stack([f])[:, cols] for f in feats], ys, feature_names=names, kind=kind,
                                 seed=seed, calibrate=calibrate, calibration_fraction=calibration_fraction,
                                 params=params)
        model.uses_lm = lm is not None
        model.posterior_scale = float(posterior_scale)
        model.info.update(posterior_scale=float(posterior_scale), uses_lm=lm is not None,
                          data_sha256=_fingerprint(nbests))
        return model

    @classmethod
    def fit_features(cls, features: Sequence[np.ndarray], labels: Sequence[np.ndarray], *,
                     feature_names: Sequence[str], kind: str = "gbm", seed: int = 0, calibrate: bool = True,
                     calibration_fraction: float = 0.2, params: Mapping[str, Any] | None = None) -> ConfidenceModel:
        """Train on per-utterance feature matrices ``[words, len(feature_names)]`` and word labels (``True`` =
        correct), splitting utterances for calibration as :meth:`fit` does; for feature sets other than the
        N-best one (e.g. :mod:`privasr.confidence.ctm`). Predict with :meth:`predict_features`.

        >>> g = np.random.default_rng(0)
        >>> x = [g.normal(size=(5, 2)) for _ in range(60)]
        >>> y = [r[:, 0] + 0.5 * g.normal(size=5) > 0 for r in x]
        >>> m = ConfidenceModel.fit_features(x, y, feature_names=("a", "b"), params={"max_iter": 20})
        >>> m.feature_names, m.predict_features(np.array([[2.0, 0.0], [-2.0, 0.0]])).round(1).tolist()[0] > 0.5
        (('a', 'b'), True)
        """
        p = _check_params(kind, params)
        require_sklearn()
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"seed={seed!r}", expected="an integer >= 0")
        if calibrate and not 0.0 < calibration_fraction < 1.0:
            raise ConfigError(f"calibration_fraction={calibration_fraction!r}", expected="a number in (0, 1)")
        names = tuple(feature_names)
        feats = []
        for i, f in enumerate(features):
            f = np.asarray(f, dtype=np.float64)
            if f.size == 0:
                f = np.zeros((0, len(names)))
            if f.ndim != 2 or f.shape[1] != len(names):
                raise InputError(f"utterance {i}: feature matrix of shape {f.shape}",
                                 expected=f"[words, {len(names)}] (one column per feature name)")
            feats.append(f)
        ys = [np.asarray(y, dtype=bool) for y in labels]
        if len(feats) != len(ys) or any(len(f) != len(y) for f, y in zip(feats, ys, strict=False)):
            raise InputError("features and labels differ in utterances or words", expected="one label per word")
        usable = np.array([i for i, f in enumerate(feats) if len(f)], dtype=np.int64)
        if usable.size < (2 if calibrate else 1):
            raise InputError(f"{usable.size} utterance(s) with 1-best words",
                             expected="at least 2 to train and calibrate a confidence classifier")
        rng = np.random.default_rng([int(seed), 1])
        perm = usable[rng.permutation(usable.size)]
        n_cal = min(max(1, round(calibration_fraction * usable.size)), usable.size - 1) if calibrate else 0
        cal, train = np.sort(perm[:n_cal]), np.sort(perm[n_cal:])
        x_tr = np.concatenate([feats[i] for i in train])
        y_tr = np.concatenate([ys[i] for i in train])
        if y_tr.all() or not y_tr.any():
            raise InputError(f"all {y_tr.size} training words are {'correct' if y_tr.all() else 'incorrect'}",
                             expected="both correct and incorrect 1-best words to learn from")
        predictor = _train(kind, x_tr, y_tr, int(seed), p)
        iso_x = iso_y = None
        y_cal = np.zeros(0, dtype=bool)
        if calibrate:
            x_cal = np.concatenate([feats[i] for i in cal])
            y_cal = np.concatenate([ys[i] for i in cal])
            # one pseudo-word of the opposite class at each end keeps the map strictly inside (0, 1)
            iso_x, iso_y = fit_isotonic(_sigmoid(predictor.logit(x_cal)), y_cal)
        import sklearn

        info = {
            "kind": kind, "seed": int(seed), "params": p, "calibrate": bool(calibrate),
            "calibration_fraction": float(calibration_fraction) if calibrate else 0.0,
            "feature_names": list(names),
            "n_train_utterances": int(train.size), "n_train_words": int(y_tr.size),
            "train_base_rate": float(y_tr.mean()),
            "n_calibration_utterances": int(cal.size), "n_calibration_words": int(y_cal.size),
            "sklearn_version": sklearn.__version__,
        }
        return cls(kind, predictor, iso_x, iso_y, uses_lm=False, posterior_scale=1.0, info=info, feature_names=names)

    # ---------------------------------------------------------------- prediction

    def _check_lm(self, lm: LanguageModel | None) -> None:
        if self.uses_lm and lm is None:
            raise InputError("this confidence model was trained with LM features",
                             expected="the same language model to predict")
        if not self.uses_lm and lm is not None:
            raise InputError("this confidence model was trained without LM features", expected="no language model")

    def predict_features(self, x: np.ndarray, *, calibrated: bool = True) -> np.ndarray:
        """Confidences for a feature matrix ``[words, len(self.feature_names)]`` (raw probabilities if not
        calibrated)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.feature_names):
            raise InputError(f"feature matrix of shape {x.shape}", expected=f"[words, {len(self.feature_names)}]")
        p = _sigmoid(self._predictor.logit(x)) if x.shape[0] else np.zeros(0)
        if calibrated and self._iso_x is not None:
            p = np.interp(p, self._iso_x, self._iso_y)
        return np.clip(p, 0.0, 1.0)

    def predict_many(self, nbests: Sequence[NBest], lm: LanguageModel | None = None, *,
                     calibrated: bool = True) -> list[np.ndarray]:
        """:meth:`predict` for many N-best lists (features batched)."""
        if not _nbest_subset(self.feature_names):
            raise InputError("this confidence model was trained on other features than the N-best ones",
                             expected=f"a model of the features {', '.join(FEATURE_NAMES)} (or some of them)")
        self._check_lm(lm)
        feats = word_features_many(nbests, lm, posterior_scale=self.posterior_scale)
        cols = [FEATURE_NAMES.index(n) for n in self.feature_names]
        flat = self.predict_features(stack(feats)[:, cols], calibrated=calibrated)
        return np.split(flat, np.cumsum([len(f) for f in feats])[:-1]) if feats else []

    def predict(self, nb: NBest, lm: LanguageModel | None = None, *, calibrated: bool = True) -> np.ndarray:
        """Confidence of each word of ``nb``'s 1-best (calibrated unless told otherwise); no reference needed."""
        return self.predict_many([nb], lm, calibrated=calibrated)[0]

    def evaluate(self, nbests: Sequence[NBest], lm: LanguageModel | None = None, *, calibrated: bool = True,
                 bins: int = DEFAULT_BINS) -> ConfidenceReport:
        """AUC, ECE, NCE, Brier score and reliability curve of the confidences on N-best lists with references."""
        nbests = list(nbests)
        ys = labels_many(nbests)
        conf = self.predict_many(nbests, lm, calibrated=calibrated)
        c = np.concatenate(conf) if conf else np.zeros(0)
        y = np.concatenate(ys) if ys else np.zeros(0, dtype=bool)
        return ConfidenceReport.compute(c, y, n_utterances=len(nbests), calibrated=calibrated and self.calibrated,
                                        bins=bins)

    # ------------------------------------------------------------------- storage

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The model as ``(meta, arrays)``: a JSON-able header and plain numeric arrays (what :meth:`save` writes,
        and what a model bundle carries: :mod:`privasr.device`)."""
        meta = {"format": FORMAT, "version": _FORMAT_VERSION, "kind": self.kind, "uses_lm": self.uses_lm,
                "posterior_scale": self.posterior_scale, "feature_names": list(self.feature_names),
                "calibrated": self.calibrated, "info": self.info}
        arrays = {f"clf_{k}": v for k, v in self._predictor.arrays().items()}
        if self._iso_x is not None:
            arrays["iso_x"], arrays["iso_y"] = self._iso_x, self._iso_y
        return meta, arrays

    @classmethod
    def from_arrays(cls, meta: Any, arrays: Mapping[str, np.ndarray]) -> ConfidenceModel:
        """The model of :meth:`to_arrays`' output.

        Raises:
            InputError: a header of another format or version, features of another set, missing or bad arrays.
        """
        try:
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise InputError("not a confidence model", expected=f"a {FORMAT} model")
            if meta.get("version") != _FORMAT_VERSION:
                raise InputError(f"confidence model format version {meta.get('version')!r}",
                                 expected=f"version {_FORMAT_VERSION}")
            names = meta.get("feature_names")
            if not _known(names):
                raise InputError("confidence model was trained on other features",
                                 expected="the N-best or the CTM feature set")
            kind = meta["kind"]
            clf = {k[4:]: v for k, v in arrays.items() if k.startswith("clf_")}
            predictor: _Trees | _Network = _Trees.from_arrays(clf) if kind == "gbm" else _Network.from_arrays(clf)
            iso_x = _floats(arrays["iso_x"]) if meta["calibrated"] else None
            iso_y = _floats(arrays["iso_y"]) if meta["calibrated"] else None
            return cls(kind, predictor, iso_x, iso_y, uses_lm=bool(meta["uses_lm"]),
                       posterior_scale=float(meta["posterior_scale"]), info=dict(meta.get("info") or {}),
                       feature_names=names)
        except InputError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise InputError(f"corrupt confidence model ({type(e).__name__}: {e})"[:200],
                             expected=f"a {FORMAT} model") from None

    def save(self, path: str | Path) -> Path:
        """Write the model to one ``.npz`` file of plain arrays and a JSON header (no pickle); return the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        meta, arrays = self.to_arrays()
        buf = io.BytesIO()
        np.savez_compressed(buf, meta=np.array(json.dumps(meta, allow_nan=False)), **arrays)
        p.write_bytes(buf.getvalue())
        return p

    @classmethod
    def load(cls, path: str | Path) -> ConfidenceModel:
        """Read a model written by :meth:`save`; :class:`InputError` for a missing, corrupt or foreign file."""
        p = Path(path)
        if not p.is_file():
            raise InputError("no such confidence model file", path=p)
        try:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as e:
            raise InputError(f"not a confidence model ({type(e).__name__}: {e})"[:200], path=p,
                             expected=f"a {FORMAT} .npz file") from None
        try:
            meta = json.loads(str(arrays.pop("meta")[()]))
            return cls.from_arrays(meta, arrays)
        except InputError as e:
            raise e.at(p) from None
        except (KeyError, TypeError, ValueError, IndexError, json.JSONDecodeError) as e:
            raise InputError(f"corrupt confidence model ({type(e).__name__}: {e})"[:200], path=p,
                             expected=f"a {FORMAT} .npz file") from None


def word_confidences(nb: NBest, model: ConfidenceModel | None = None, lm: LanguageModel | None = None) -> np.ndarray:
    """The 1-best's per-word confidences: the data's own when it has them (e.g. CTMs), else ``model``'s.

    >>> from privasr.corpus.records import Hypothesis
    >>> word_confidences(NBest("u", (Hypothesis.from_text("a b", confidences=(0.9, 0.4)),))).tolist()
    [0.9, 0.4]
    """
    best = nb.best
    if best.confidences is not None:
        return np.asarray(best.confidences, dtype=np.float64)
    if model is None:
        raise InputError(f"utterance {nb.utt_id} has no word confidences",
                         expected="confidences in the data or a trained confidence model")
    return model.predict(nb, lm)
