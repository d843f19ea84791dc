"""Tiny fabricated Wikigold and Earnings-21 files in the shared data layout, for the NER data, model and
evaluation tests."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

HEADER = "token|speaker|ts|endTs|punctuation|case|tags|wer_tags\n"


def fabricate_ner_data(root: Path, n_docs: int = 12, n_calls: int = 16) -> Path:
    """``n_docs`` Wikigold documents and ``n_calls`` Earnings-21 calls (one speaker list) under ``root``."""
    (root / "ner-wikigold").mkdir(parents=True)
    lines = []
    for d in range(n_docs):
        lines += ["-DOCSTART- O", "", f"Alice{d} I-PER", "Walker I-PER", "visited O", "Oslo I-LOC", ". O", ""]
    (root / "ner-wikigold" / "wikigold.conll.txt").write_text("\n".join(lines) + "\n")
    e = root / "earnings21"
    e.mkdir()
    with tarfile.open(e / "references_nlp_wertags.tar.xz", "w:xz") as tar:
        for c in range(n_calls):
            nlp = HEADER + "Thanks|0||||UC|[]|[]\nBob|0||||UC|[]|['1']\nKane|0|||.|UC|[]|['1']\n" \
                           "Revenue|1||||UC|[]|[]\nrose|1||||LC|[]|[]\nin|1||||LC|[]|[]\nTexas|1|||,|UC|[]|['2']\n" \
                           "next|1||||LC|[]|['3']\nyear|1|||.|LC|[]|['3']\n"
            tags = json.dumps({"1": {"entity_type": "PERSON"}, "2": {"entity_type": "GPE"},
                               "3": {"entity_type": "DATE"}})
            for name, text in ((f"nlp_references/{c}.nlp", nlp), (f"wer_tags/{c}.wer_tag.json", tags)):
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    (e / "speaker-metadata.csv").write_text("file_id,speaker_id,speaker_name\n0,0,Bob Kane\n0,1,Operator\n")
    return root
