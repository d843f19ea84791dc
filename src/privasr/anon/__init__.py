"""Privacy-transformed transcripts (paper 003): entity spans, surrogate / class-tag / redaction rewrites.

* :mod:`~privasr.anon.transform`: entity spans and the rewrites (re-exported here);
* :mod:`~privasr.anon.ner`: named-entity detectors on cased or ASR-style text and their recall passes;
* :mod:`~privasr.anon.ner_model`: fine-tuning the NER, the project's fine-tuned model (trained and cached on
  the NER data of :mod:`~privasr.anon.ner_data`), detectors from a spec;
* :mod:`~privasr.anon.ner_metrics`: span, token, mention, leak and names-leaked scores of a detector;
* :mod:`~privasr.anon.apply`: whole corpora (transcripts and N-best lists) anonymised.
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
