"""Privacy-transformed transcripts (paper 003): entity spans, surrogate / class-tag / redaction rewrites.

The named-entity detection that finds the spans on ASR-style text is still to come (issue 8); the
transformations here take spans from any detector or from gold annotations.
"""

from privasr.anon.transform import (
    LABELS,
    MODES,
    ONTONOTES_TO_LABEL,
    Anonymizer,
    EntitySpan,
    check_spans,
    map_label,
)

__all__ = ["LABELS", "MODES", "ONTONOTES_TO_LABEL", "Anonymizer", "EntitySpan", "check_spans", "map_label"]
