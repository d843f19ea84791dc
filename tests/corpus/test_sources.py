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
    # the fit / valid split of AMI train: every 50th turn held out, together exactly the train turns
    from privasr.corpus.sources import load_text

    fit, valid = load_text("ami-train-fit", data=shared_data), load_text("ami-train-valid", data=shared_data)
    assert len(valid) == 27_927 // 50 and valid[0] == train[49]
    assert sorted(fit + valid) == sorted(train)


def test_gutenberg_raw_reproduces_the_golden_anchor_text(shared_data):
    sents = gutenberg_sentences(shared_data, style="raw")
    text = "".join(" ".join(s) + "\n" for s in sents)
    assert (len(sents), sum(map(len, sents))) == (66_345, 1_336_275)
    assert hashlib.md5(text.encode()).hexdigest() == "04259d64f4917f0130ae136d914eb740"
    asr = gutenberg_sentences(shared_data)
    assert all("'" not in w or w.count("'") == 1 for s in asr[:2000] for w in s)
    assert not any(w in ("mr", "mrs") for s in asr for w in s)


def test_a_normaliser_runs_on_top_of_a_named_source(monkeypatch) -> None:
    """A named source keeps its own normalisation; ``normalize`` is applied after it (e.g. ``neural`` to expand
    the contractions AMI's text keeps), and sentences it empties are dropped."""
    pytest.importorskip("whisper_normalizer")
    from privasr.corpus import sources

    monkeypatch.setitem(sources.TEXT_SOURCES, "ami-train", lambda data=None: [("we're", "gonna", "see"), ("um",)])
    assert sources.load_text("ami-train") == [("we're", "gonna", "see"), ("um",)]
    assert sources.load_text("ami-train", normalize="neural") == [("we", "are", "going", "to", "see"), ("um",)]
    assert sources.load_text("ami-train", normalize="neural,fillers=remove") == [("we", "are", "going", "to", "see")]
