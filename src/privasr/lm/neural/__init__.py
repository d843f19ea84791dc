"""Neural language models (needs the ``neural`` extra: torch).

* :mod:`~privasr.lm.neural.vocab`: :class:`Vocabulary` (ids 0/1/2 = ``<unk>``/``<s>``/``</s>``);
* :mod:`~privasr.lm.neural.models`: :class:`NeuralLMConfig` with presets, :func:`build_model` giving a
  :class:`TransformerLM` or :class:`LstmLM` (character-aware embeddings optional; full or class-factored
  softmax);
* :mod:`~privasr.lm.neural.checkpoint`: :func:`save_checkpoint` / :func:`load_checkpoint`;
* :mod:`~privasr.lm.neural.train`: :func:`train_lm` (from scratch, fine-tuning, frozen layers) behind
  ``privasr lm train-neural``;
* :mod:`~privasr.lm.neural.scorer`: :class:`NeuralLM`, the LanguageModel for rescoring (prefix-shared,
  batched, optional per-word log-bias); :mod:`~privasr.lm.neural.approx`: neural -> ARPA approximation.

Every torch import of privasr lives in this package, so the rest of privasr imports without torch.
"""

from privasr.lm.neural.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from privasr.lm.neural.models import NeuralLMConfig, build_model
from privasr.lm.neural.scorer import NeuralLM
from privasr.lm.neural.train import TrainOptions, TrainResult, train_lm
from privasr.lm.neural.vocab import Vocabulary

__all__ = ["Vocabulary", "NeuralLMConfig", "build_model", "Checkpoint", "save_checkpoint", "load_checkpoint",
           "TrainOptions", "TrainResult", "train_lm", "NeuralLM"]
