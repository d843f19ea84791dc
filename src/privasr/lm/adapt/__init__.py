"""Language-model adaptation: fast marginal adaptation of backoff n-grams (:mod:`.fma`)."""

from privasr.lm.adapt.fma import FmaModel, adaptation_unigram, fma_rewrite, text_unigram

__all__ = ["FmaModel", "fma_rewrite", "adaptation_unigram", "text_unigram"]
