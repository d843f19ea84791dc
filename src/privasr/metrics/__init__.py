"""Scoring: WER and oracle WER, sclite-compatible alignment, MAPSSWE, paired bootstrap, SRILM perplexity.

Every function returns a frozen dataclass and keeps no hidden state.

>>> from privasr.metrics import wer, mapsswe
>>> wer([["a", "b"]], [["a", "c"]]).wer
0.5
"""

from privasr.metrics.align import SCLITE_WEIGHTS, Alignment, align, align_many
from privasr.metrics.bootstrap import (
    BootstrapResult,
    bootstrap_wer_difference,
    difference_interval,
    draw_mean_bootstrap,
    paired_bootstrap,
)
from privasr.metrics.mapsswe import (
    MapssweResult,
    Segment,
    mapsswe,
    mapsswe_from_alignments,
    segment_sentence,
    z_test,
)
from privasr.metrics.oracle import onebest_wer, oracle_indices, oracle_wer
from privasr.metrics.perplexity import OOV, ZEROPROB, PplStats, corpus_stats, format_ppl, sentence_stats
from privasr.metrics.wer import WerResult, error_rate, wer, wer_from_alignments, wer_from_counts
from privasr.metrics.word_changes import ClassChanges, WordHitChanges, class_changes, word_hit_changes

__all__ = [
    "SCLITE_WEIGHTS", "Alignment", "align", "align_many",
    "BootstrapResult", "bootstrap_wer_difference", "difference_interval", "draw_mean_bootstrap", "paired_bootstrap",
    "MapssweResult", "Segment", "mapsswe", "mapsswe_from_alignments", "segment_sentence", "z_test",
    "onebest_wer", "oracle_indices", "oracle_wer",
    "OOV", "ZEROPROB", "PplStats", "corpus_stats", "format_ppl", "sentence_stats",
    "WerResult", "error_rate", "wer", "wer_from_alignments", "wer_from_counts",
    "WordHitChanges", "word_hit_changes", "ClassChanges", "class_changes",
]
