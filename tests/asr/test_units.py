"""Tests of privasr.asr.units: character and sentencepiece output units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privasr.asr.units import (
    BLANK,
    EOS,
    SOS,
    UNK,
    WORD_BOUNDARY,
    CharTokenizer,
    SentencePieceTokenizer,
    Tokenizer,
    load_tokenizer,
    tokenizer_from_json,
)
from privasr.errors import ConfigError, InputError
from privasr.paths import data_dir

pytest.importorskip("sentencepiece")

TINY = [("ERASE", "C", "Q"), ("YES",), ("GO",), ("ENTER", "FIVE", "TWO"), ("RUBOUT", "G", "M", "E")] * 4


def _an4_transcripts():
    from privasr.corpus.formats.an4 import read_an4

    d = data_dir()
    if d is None or not (d / "an4" / "etc").is_dir():
        pytest.skip("AN4 data not available (../shared/data/an4 or $PRIVASR_DATA/an4)")
    return ([t.words for t in read_an4(d / "an4/etc/an4_train.transcription")],
            [t.words for t in read_an4(d / "an4/etc/an4_test.transcription")])


@pytest.fixture(scope="module")
def sp_tiny() -> SentencePieceTokenizer:
    return SentencePieceTokenizer.train(TINY, vocab_size=40)


# ------------------------------------------------------------------------------------------------ shared


@pytest.mark.parametrize("kind", ["char", "sp"])
def test_special_ids_and_interface(kind, sp_tiny):
    tok: Tokenizer = CharTokenizer.train(TINY) if kind == "char" else sp_tiny
    assert isinstance(tok, Tokenizer)
    assert (tok.blank_id, tok.sos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.units[:4] == (BLANK, SOS, EOS, UNK)
    assert len(tok) == tok.vocab_size == len(set(tok.units))
    ids = tok.encode(("ERASE", "C"))
    assert all(4 <= i < tok.vocab_size for i in ids)
    # specials are ignored by decode (CTC blanks, sos/eos framing)
    assert tok.decode([tok.sos_id, tok.blank_id, *ids, tok.blank_id, tok.eos_id]) == ("ERASE", "C")
    assert tok.encode(()) == [] and tok.decode([]) == ()
    assert tok.encode_batch([("YES",), ("GO",)]) == [tok.encode(("YES",)), tok.encode(("GO",))]
    with pytest.raises(InputError):
        tok.decode([tok.vocab_size])
    with pytest.raises(InputError):
        tok.encode("ERASE C")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        tok.encode(("A B",))
    with pytest.raises(InputError):
        tok.encode(("",))
    assert tok.id_to_unit(0) == BLANK


@pytest.mark.parametrize("kind", ["char", "sp"])
def test_save_load_roundtrip(kind, sp_tiny, tmp_path):
    tok: Tokenizer = CharTokenizer.train(TINY) if kind == "char" else sp_tiny
    p = tmp_path / "tok.json"
    tok.save(p)
    for back in (load_tokenizer(p), type(tok).load(p), Tokenizer.load(p), tokenizer_from_json(tok.to_json())):
        assert type(back) is type(tok) and back == tok and back.units == tok.units
        assert back.encode(("RUBOUT", "G")) == tok.encode(("RUBOUT", "G"))
    assert json.loads(p.read_text())["type"] == tok.kind


def test_load_errors(tmp_path, sp_tiny):
    p = tmp_path / "t.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="invalid tokenizer JSON") as e:
        load_tokenizer(p)
    assert e.value.path == str(p)
    p.write_text('{"type": "bpe", "format": 1}')
    with pytest.raises(InputError, match="unknown tokenizer type"):
        load_tokenizer(p)
    p.write_text(CharTokenizer(["A"]).to_json())
    with pytest.raises(InputError, match="not 'sentencepiece'"):
        SentencePieceTokenizer.load(p)
    d = sp_tiny.to_dict()
    with pytest.raises(InputError, match="invalid sentencepiece model"):
        tokenizer_from_json(json.dumps({**d, "model": "!!!"}))
    with pytest.raises(InputError, match="invalid sentencepiece model"):
        tokenizer_from_json(json.dumps({**d, "model": "AAAA"}))
    with pytest.raises(InputError, match="format"):
        tokenizer_from_json(json.dumps({**d, "format": 99}))
    with pytest.raises(InputError, match="invalid char tokenizer units"):
        tokenizer_from_json('{"type": "char", "format": 1, "units": ["A"]}')
    with pytest.raises(InputError, match="cannot read"):
        load_tokenizer(tmp_path / "missing.json")


# -------------------------------------------------------------------------------------------------- char


def test_char_ids_deterministic_and_layout():
    a = CharTokenizer.train(TINY)
    b = CharTokenizer.train(list(reversed(TINY)))
    assert a == b and a.units == b.units
    assert a.units[4] == WORD_BOUNDARY and list(a.units[5:]) == sorted(a.units[5:])
    ids = a.encode(("GO", "YES"))
    assert [a.units[i] for i in ids] == ["G", "O", WORD_BOUNDARY, "Y", "E", "S"]


def test_char_unknown_chars():
    tok = CharTokenizer.train([("AB",)])
    assert tok.encode(("AZ",)) == [tok.units.index("A"), tok.unk_id]
    assert tok.decode(tok.encode(("AZ",))) == ("A<unk>",)
    assert tok.encode((f"A{WORD_BOUNDARY}B",))[1] == tok.unk_id
    with pytest.raises(InputError) as e:
        CharTokenizer.train([("OK",), ("BAD WORD",)])
    assert e.value.line == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1, max_size=8)
                .filter(lambda w: not any(c.isspace() for c in w) and WORD_BOUNDARY not in w), max_size=6))
def test_char_roundtrip_property(words):
    words = tuple(words)
    tok = CharTokenizer.train([words])
    assert tok.decode(tok.encode(words)) == words


# ----------------------------------------------------------------------------------------- sentencepiece


def test_sp_deterministic_and_config_errors():
    a = SentencePieceTokenizer.train(TINY, vocab_size=40)
    b = SentencePieceTokenizer.train(TINY, vocab_size=40)
    assert a.model_bytes == b.model_bytes and a.units == b.units
    assert a.vocab_size <= 40
    with pytest.raises(ConfigError):
        SentencePieceTokenizer.train(TINY, vocab_size=3)
    with pytest.raises(ConfigError):
        SentencePieceTokenizer.train(TINY, vocab_size=500, hard_vocab_limit=True)
    with pytest.raises(InputError):
        SentencePieceTokenizer.train([(), ()])
    with pytest.raises(InputError):
        SentencePieceTokenizer(b"")


def test_sp_unseen_words_and_chars(sp_tiny):
    assert sp_tiny.decode(sp_tiny.encode(("REST", "GONE"))) == ("REST", "GONE")  # seen characters only
    ids = sp_tiny.encode(("XYZ",))
    assert sp_tiny.unk_id in ids  # unseen characters -> <unk>


# --------------------------------------------------------------------------------------------------- AN4


@pytest.mark.shared
def test_an4_char_roundtrip_exact():
    train, test = _an4_transcripts()
    tok = CharTokenizer.train(train)
    assert tok.units[5:] == tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ") and tok.vocab_size == 31
    for words in train + test:
        ids = tok.encode(words)
        assert tok.unk_id not in ids
        assert tok.decode(ids) == tuple(words)


@pytest.mark.shared
@pytest.mark.parametrize("vocab_size", [64, 128])
def test_an4_sentencepiece_lossless(vocab_size, tmp_path: Path):
    train, test = _an4_transcripts()
    tok = SentencePieceTokenizer.train(train, vocab_size=vocab_size)
    assert 32 <= tok.vocab_size <= vocab_size
    for words in train + test:  # test has 2 words unseen in training (NOVEMBER, THIRTEEN)
        ids = tok.encode(words)
        assert tok.unk_id not in ids and tok.blank_id not in ids
        assert tok.decode(ids) == tuple(words)
    n_units = sum(len(tok.encode(w)) for w in train)
    chars = CharTokenizer.train(train)
    n_chars = sum(len(chars.encode(w)) for w in train)
    assert n_units < n_chars  # subwords shorten the target sequences
    tok.save(tmp_path / "sp.json")
    assert load_tokenizer(tmp_path / "sp.json").model_bytes == tok.model_bytes  # type: ignore[attr-defined]
