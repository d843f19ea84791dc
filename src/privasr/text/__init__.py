"""Text normalisation and vocabularies."""

from privasr.text.normalize import Normalizer

__all__ = ["Normalizer"]
