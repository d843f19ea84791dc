"""Language models: the common protocol, n-gram models (ARPA, modified Kneser-Ney, class LMs), adaptation
and interpolation; neural models come with the ``neural`` extra."""

from privasr.lm.base import LanguageModel, SentenceScore, perplexity_stats

__all__ = ["LanguageModel", "SentenceScore", "perplexity_stats"]
