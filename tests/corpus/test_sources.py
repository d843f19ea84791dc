"""Text sources of the shared corpora (privasr.corpus.sources) on the real data in ../shared (skipped without it)."""

from __future__ import annotations

import hashlib

import pytest

from privasr.corpus.load import load_path
from privasr.corpus.sources import ami_sentences, gutenberg_sentences

pytestmark = pytest.mark.shared


def test_ami_text_matches_the_nbest_references(shared_data):
    """The LM text uses the references' normalisation: every AMI dev reference is a normalised dev turn."""
    dev_turns = set(ami_sentences("dev", shared_data))
    refs = [nb.ref for nb in load_path(shared_data / "ami-tts-nbest" / "dev.jsonl.xz")[0].records]
    assert all(r in dev_turns for r in refs)
    train = ami_sentences("train", shared_data)
    assert len(train) == 27_927 and sum(map(len, train)) == 392_874


def test_gutenberg_raw_reproduces_the_golden_anchor_text(shared_data):
    sents = gutenberg_sentences(shared_data, style="raw")
    text = "".join(" ".join(s) + "\n" for s in sents)
    assert (len(sents), sum(map(len, sents))) == (66_345, 1_336_275)
    assert hashlib.md5(text.encode()).hexdigest() == "04259d64f4917f0130ae136d914eb740"
    asr = gutenberg_sentences(shared_data)
    assert all("'" not in w or w.count("'") == 1 for s in asr[:2000] for w in s)
    assert not any(w in ("mr", "mrs") for s in asr for w in s)
