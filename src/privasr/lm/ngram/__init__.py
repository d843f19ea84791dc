"""N-gram language models: the backoff model and its query engine (:mod:`.model`), ARPA files
(:mod:`.arpa`) and modified Kneser-Ney estimation that reproduces KenLM ``lmplz`` (:mod:`.mkn`)."""

from privasr.lm.ngram.arpa import read_arpa, write_arpa
from privasr.lm.ngram.model import NgramModel, NgramState

__all__ = ["NgramModel", "NgramState", "read_arpa", "write_arpa"]
