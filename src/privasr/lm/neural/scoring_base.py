"""What every neural-LM scorer shares, without torch: the :class:`~privasr.lm.base.LanguageModel` protocol over
a :class:`~privasr.lm.neural.vocab.Vocabulary`, the checks of sentences and of a per-word log-bias, bias swapping
and the ``<unk>`` share of OOV words.

:class:`~privasr.lm.neural.scorer.NeuralLM` (PyTorch) and the exported scorers of
:mod:`privasr.lm.neural.export` (onnxruntime, TorchScript) build on :class:`NeuralScorerBase`, which holds no
model and calls no torch function, so the exported scorers share it without depending on the PyTorch scorer.

>>> checked_log_bias([0.0, -1.5], 2).tolist()
[0.0, -1.5]
>>> checked_log_bias([0.0, float("nan")], 2)
Traceback (most recent call last):
...
privasr.errors.InputError: log_bias holds NaN or +inf (expected finite values (or -inf to forbid a word))
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from privasr.errors import ConfigError, InputError
from privasr.lm.base import SentenceScore
from privasr.lm.neural.vocab import Vocabulary

__all__ = ["NeuralScorerBase", "checked_log_bias", "checked_sentences"]

_S = TypeVar("_S", bound="NeuralScorerBase")


def checked_log_bias(log_bias: Any, size: int) -> np.ndarray:
    """``log_bias`` (a sequence, numpy array or torch tensor) as a read-only float64 vector of ``size`` finite
    values (``-inf`` allowed: a forbidden word), or :class:`~privasr.errors.InputError`."""
    if hasattr(log_bias, "detach"):  # a torch tensor
        log_bias = log_bias.detach().cpu().numpy()
    b = np.array(log_bias, dtype=np.float64)
    if b.shape != (size,):
        raise InputError(f"log_bias has shape {b.shape}", expected=f"one value per word: ({size},)")
    if np.isnan(b).any() or (b == np.inf).any():
        raise InputError("log_bias holds NaN or +inf", expected="finite values (or -inf to forbid a word)")
    b.setflags(write=False)
    return b


def checked_sentences(sentences: Sequence[Sequence[str]], bos: bool) -> list[tuple[str, ...]]:
    """The sentences as tuples; a neural LM always conditions on ``<s>`` (``bos`` must be true).

    >>> checked_sentences([["a", "b"], ("c",)], True)
    [('a', 'b'), ('c',)]
    """
    if not bos:
        raise InputError("a neural LM always conditions on <s>", expected="bos=True")
    if isinstance(sentences, str):
        raise InputError("sentences is a string", expected="a list of word lists")
    return [s if isinstance(s, tuple) else tuple(s) for s in sentences]


class NeuralScorerBase:
    """The protocol parts of a neural-LM scorer. Subclasses set ``vocab``, ``renormalize``, ``_order`` and
    ``_unk_log10`` (``log10(K + 1)`` with ``K = vocab.unk_types``, or 0 without the ``<unk>`` spread) and
    implement ``score_batch`` and ``_set_bias``."""

    vocab: Vocabulary
    renormalize: bool
    _order: int
    _unk_log10: float

    def _set_bias(self, log_bias: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def order(self) -> int:
        """A Transformer's trained context (``max_len``); unbounded (``2**31 - 1``) for an LSTM."""
        return self._order

    def __contains__(self, word: object) -> bool:
        return word in self.vocab

    def __len__(self) -> int:
        return len(self.vocab)

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        """Score one sentence (see :mod:`privasr.lm.base`); same as ``score_batch([words])[0]``."""
        return self.score_batch([words], bos=bos, eos=eos)[0]

    def with_bias(self: _S, log_bias: Any, *, renormalize: bool | None = None) -> _S:
        """A scorer sharing this one's model and vocabulary with another bias (``None``: none);
        ``renormalize`` defaults to this scorer's setting."""
        other = copy.copy(self)
        if renormalize is not None:
            if not isinstance(renormalize, bool):
                raise ConfigError(f"renormalize={renormalize!r}", expected="true or false")
            other.renormalize = renormalize
        other._set_bias(log_bias)
        return other

    def _oov(self, words: tuple[str, ...], eos: bool) -> np.ndarray:
        """OOV flags of ``words`` (and ``False`` for ``</s>`` with ``eos``)."""
        vocab = self.vocab
        flags = [w not in vocab for w in words]
        if eos:
            flags.append(False)
        return np.array(flags, dtype=bool)

    def _spread(self, lp: np.ndarray, oov: np.ndarray) -> np.ndarray:
        """log10 scores ``lp`` with the ``<unk>`` share taken off the OOV tokens."""
        if self._unk_log10 and oov.any():
            lp = lp - np.where(oov, self._unk_log10, 0.0)
        return lp
