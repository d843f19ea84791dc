"""``privasr data inspect --json`` on every folder of ../shared/data with transcripts or N-best lists.

The expected counts are the ones each folder's SOURCE.txt states (or, where SOURCE.txt miscounts,
what the files hold, explained next to the number).
"""

import json

import pytest

from privasr.cli import main

pytestmark = pytest.mark.shared


def inspect(path, capsys, *extra):
    assert main(["data", "inspect", str(path), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def by_name(summary):
    return {d["name"]: d for d in summary["datasets"]}


def test_ami_tts_nbest(shared_data, capsys):
    s = inspect(shared_data / "ami-tts-nbest", capsys)
    d = by_name(s)
    dev, test = d["ami-tts-nbest/dev"], d["ami-tts-nbest/test"]
    assert (dev["utterances"], dev["clients"], dev["speakers"], dev["words"]) == (1121, 10, 40, 11727)
    assert (test["utterances"], test["clients"], test["speakers"], test["words"]) == (1954, 16, 64, 21128)
    assert round(100 * dev["wer_1best"], 1) == 50.1 and round(100 * dev["wer_oracle"], 1) == 38.3
    assert round(100 * test["wer_1best"], 1) == 53.5 and round(100 * test["wer_oracle"], 1) == 42.0
    assert dev["hyps_per_utt"] == pytest.approx(10.0)
    assert s["utterances"] == 3075 and s["clients"] == 26 and s["words"] == 32855


def test_ami_tts_nbest_adapted(shared_data, capsys):
    """The main N-best set: SOURCE.txt's counts, 1-best and oracle WER."""
    if not (shared_data / "ami-tts-nbest-adapted").is_dir():
        pytest.skip("ami-tts-nbest-adapted not present")
    s = inspect(shared_data / "ami-tts-nbest-adapted", capsys)
    d = by_name(s)
    dev, test = d["ami-tts-nbest-adapted/dev"], d["ami-tts-nbest-adapted/test"]
    assert (dev["utterances"], dev["clients"], dev["speakers"], dev["words"]) == (1121, 10, 40, 11727)
    assert (test["utterances"], test["clients"], test["speakers"], test["words"]) == (1954, 16, 64, 21128)
    assert round(100 * dev["wer_1best"], 2) == 20.37 and round(100 * dev["wer_oracle"], 2) == 12.83
    assert round(100 * test["wer_1best"], 2) == 20.15 and round(100 * test["wer_oracle"], 2) == 12.06


def test_ami_tts_nbest_indomain(shared_data, capsys):
    d = by_name(inspect(shared_data / "ami-tts-nbest-indomain", capsys))
    assert d["ami-tts-nbest-indomain/dev"]["utterances"] == 911
    assert d["ami-tts-nbest-indomain/test"]["utterances"] == 2215
    assert 0 < d["ami-tts-nbest-indomain/test"]["wer_oracle"] < d["ami-tts-nbest-indomain/test"]["wer_1best"]


def test_librispeech_whisper_5best(shared_data, capsys):
    s = inspect(shared_data / "librispeech-whisper-5best", capsys)
    assert (s["utterances"], s["clients"], s["words"]) == (2939, 33, 52343)
    assert round(100 * s["wer_1best"], 2) == 3.67
    assert round(100 * s["wer_oracle"], 2) == 2.27


def test_ami_transcripts(shared_data, capsys):
    d = by_name(inspect(shared_data / "ami-transcripts", capsys))
    counts = {k.rsplit("/", 1)[-1]: (v["clients"], v["utterances"], v["words"]) for k, v in d.items()}
    assert counts == {"train": (97, 28388, 475849), "dev": (20, 5783, 90184), "test": (20, 5393, 104621)}


def test_earnings21(shared_data, capsys):
    s = inspect(shared_data / "earnings21", capsys)
    d = by_name(s)
    refs = d["earnings21/references_nlp_wertags"]
    # 362,351 token lines, two of them empty tokens (call 4382825), so 362,349 words.
    assert (refs["clients"], refs["speakers"], refs["words"]) == (44, 467, 362349)
    rev = d["earnings21/asr_rev_kaldi_ctm_with_conf"]
    org = d["earnings21/asr_kaldiorg_librispeech_ctm_with_conf"]
    assert rev["utterances"] == 45 and rev["unmatched_references"] == 1  # 4396498 has no reference
    assert org["utterances"] == 44 and org["hyp_words"] == 374073
    # Upstream (fstalign with number verbalisations) reports 13.2% and 48.8%; plain normalisation leaves
    # written-out numbers as errors, so ours are a few points higher, in the same order.
    assert 0.13 < rev["wer_1best"] < 0.20
    assert 0.45 < org["wer_1best"] < 0.58


def test_ner_wikigold(shared_data, capsys):
    s = inspect(shared_data / "ner-wikigold", capsys)
    # SOURCE.txt's 1,841 counts blank lines, 145 of which close a -DOCSTART- line: 1,696 sentences.
    assert (s["utterances"], s["clients"], s["words"]) == (1696, 145, 39007)


def test_an4(shared_data, capsys):
    d = by_name(inspect(shared_data / "an4", capsys))
    assert {k: (v["utterances"], v["speakers"]) for k, v in d.items()} == {
        "an4/etc/an4_train": (948, 74), "an4/etc/an4_test": (130, 10)}


def test_fsdd_digits(shared_data, capsys):
    s = inspect(shared_data / "fsdd-digits", capsys)
    assert (s["utterances"], s["clients"], s["words"]) == (3000, 6, 3000)
