"""Tests of the synthetic federated ASR corpus: configuration, determinism, realism, usefulness."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import jiwer
import numpy as np
import pytest

from privasr.corpus.formats.nbest_jsonl import read_nbest, read_transcripts
from privasr.corpus.phonetics import load_cmudict
from privasr.errors import ConfigError
from privasr.synth import TOPICS, SynthConfig, SynthCorpus, generate, grammar_vocabulary


def edits(ref, hyp) -> int:
    """Word edit distance (independent of the generator's own helper)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i]
        for j, h in enumerate(hyp, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def wer(pairs) -> float:
    pairs = list(pairs)
    return sum(edits(r, h) for r, h in pairs) / sum(len(r) for r, _ in pairs)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[SynthCorpus, Path, float]:
    out = tmp_path_factory.mktemp("synth")
    t = time.perf_counter()
    corpus = generate(SynthConfig())
    corpus.write(out)
    return corpus, out, time.perf_counter() - t


@pytest.fixture(scope="module")
def corpus(written) -> SynthCorpus:
    return written[0]


def _files(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


# ---------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"num_clients": 1}, "num_clients"),
        ({"num_clients": 2.5}, "num_clients"),
        ({"seed": -1}, "seed"),
        ({"seed": True}, "seed"),
        ({"dev_fraction": 0.0}, "dev_fraction"),
        ({"dev_fraction": 1.5}, "dev_fraction"),
        ({"entity_rate": -0.1}, "entity_rate"),
        ({"acoustic_noise": float("nan")}, "acoustic_noise"),
        ({"acoustic_scale": 0}, "acoustic_scale"),
        ({"lm_weight": "1"}, "lm_weight"),
        ({"nbest": 0}, "nbest"),
        ({"beam": 5, "nbest": 10}, "beam"),
        ({"min_utterances": 10, "max_utterances": 5}, "max_utterances"),
        ({"min_entities": 9, "max_entities": 3}, "max_entities"),
        ({"utterances_per_client": 2.0}, "utterances_per_client"),
    ],
)
def test_config_validation_names_the_field(options, field):
    with pytest.raises(ConfigError, match=field):
        SynthConfig(**options)


def test_config_from_dict_and_presets():
    with pytest.raises(ConfigError, match="unknown option.*'nbests'"):
        SynthConfig.from_dict({"nbests": 5})
    with pytest.raises(ConfigError, match="unknown preset"):
        SynthConfig.from_dict({"preset": "huge"})
    with pytest.raises(ConfigError):
        SynthConfig.from_dict(["seed", 1])  # type: ignore[arg-type]
    cfg = SynthConfig.from_dict({"seed": 5, "nbest": 4, "beam": 20})
    assert (cfg.seed, cfg.nbest, cfg.beam, cfg.num_clients) == (5, 4, 20, 40)
    assert SynthConfig.from_dict(cfg.to_dict()) == cfg
    assert SynthConfig.preset("medium").num_clients > SynthConfig().num_clients
    assert SynthConfig(lm_weight=2).lm_weight == 2.0 and isinstance(SynthConfig(lm_weight=2).lm_weight, float)
    with pytest.raises(ConfigError):
        generate({"seed": 1})  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------- determinism

def test_same_seed_same_bytes_different_seed_different(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    generate(SynthConfig.preset("tiny", seed=11)).write(a)
    generate(SynthConfig.preset("tiny", seed=11)).write(b)
    generate(SynthConfig.preset("tiny", seed=12)).write(c)
    fa, fb, fc = _files(a), _files(b), _files(c)
    assert fa == fb
    assert set(fa) == set(fc)
    assert fa["nbest/test.jsonl"] != fc["nbest/test.jsonl"]
    assert fa["text/background.txt"] != fc["text/background.txt"]


def test_deterministic_across_processes(tmp_path):
    """Hash randomisation (set/dict order of strings) must not leak into the output."""
    code = ("import sys; from privasr.synth import generate, SynthConfig; "
            "generate(SynthConfig.preset('tiny', seed=3)).write(sys.argv[1])")
    outs = []
    for hs in ("1", "2"):
        out = tmp_path / hs
        env = {**os.environ, "PYTHONHASHSEED": hs}
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=env, timeout=120)
        outs.append(_files(out))
    assert outs[0] == outs[1]


def test_parts_use_independent_random_streams():
    a = generate(SynthConfig.preset("tiny", seed=4))
    b = generate(SynthConfig.preset("tiny", seed=4, background_sentences=300))
    assert [t.words for t in a.transcripts] == [t.words for t in b.transcripts]
    assert a.background != b.background


# ---------------------------------------------------------------------------------------------- content

def test_default_config_is_fast_and_sized(written):
    corpus, out, elapsed = written
    assert elapsed < 15.0, f"generate + write took {elapsed:.1f} s"
    assert len(corpus.clients) == 40
    assert {c.split for c in corpus.clients} == {"dev", "test"}
    assert sum(c.split == "dev" for c in corpus.clients) == 10
    assert 600 <= len(corpus.dev) + len(corpus.test) <= 2500
    assert len(corpus.background) == 3000


def test_words_are_real_english(corpus):
    lex = load_cmudict()
    assert all(w in lex for w in grammar_vocabulary())
    assert len(TOPICS) >= 6
    for name, t in TOPICS.items():
        assert len(t["N"]) >= 20 and len(t["V"]) >= 10 and len(t["A"]) >= 10, name
        others = {w for other, u in TOPICS.items() if other != name for w in u["N"]}
        assert len(set(t["N"]) - others) >= 15, name  # each topic has its own words
    personal = {w for c in corpus.clients for w in c.personal_words}
    assert sum(w in lex for w in personal) / len(personal) > 0.95
    for t in corpus.transcripts[:200]:
        assert all(w == w.lower() and w.replace("'", "").isalpha() for w in t.words)


def test_background_text_has_no_personal_vocabulary(corpus, written):
    _, out, _ = written
    bg_tokens = set((out / "text" / "background.txt").read_text().split())
    personal = {w for c in corpus.clients for w in c.personal_words}
    assert personal and bg_tokens.isdisjoint(personal)
    # ...while the clients do use their own entities, in their own utterances only
    ref_tokens = Counter(w for nb in corpus.dev + corpus.test for w in nb.ref)
    assert sum(ref_tokens[w] for w in personal) / sum(ref_tokens.values()) > 0.03
    own = {c.id: set(c.personal_words) for c in corpus.clients}
    for t in corpus.transcripts:
        for s in t.entities:
            assert set(t.words[s.start:s.end]) & own[t.client]
            assert s.label in ("PER", "LOC", "ORG")


def test_clients_time_order_and_splits(corpus):
    split = {c.id: c.split for c in corpus.clients}
    assert all(split[nb.client] == "dev" for nb in corpus.dev)
    assert all(split[nb.client] == "test" for nb in corpus.test)
    ids = [nb.utt_id for nb in corpus.dev + corpus.test]
    assert len(ids) == len(set(ids))
    by: dict[str, list] = {}
    for nb in corpus.dev + corpus.test:
        by.setdefault(nb.client, []).append(nb)
    sizes = [len(v) for v in by.values()]
    assert min(sizes) >= 8 and max(sizes) <= 120 and len(set(sizes)) > 5
    for nbs in by.values():
        assert [nb.order for nb in nbs] == list(range(len(nbs)))
        starts = [nb.meta["start"] for nb in nbs]
        assert starts == sorted(starts)
        assert all(nb.meta["end"] > nb.meta["start"] for nb in nbs)
    # topic mixes are client-specific (concentrated), not uniform
    top = [max(c.topic_mix.values()) for c in corpus.clients]
    assert np.mean(top) > 2.0 / len(TOPICS)


def test_nbest_lists_are_well_formed(corpus):
    cfg = corpus.config
    for nb in corpus.test[:300]:
        assert 1 <= len(nb.hyps) <= cfg.nbest
        totals = [h.scores["total"] for h in nb.hyps]
        assert totals == sorted(totals, reverse=True)
        assert len({h.words for h in nb.hyps}) == len(nb.hyps)
        for h in nb.hyps:
            s = h.scores
            assert s["total"] == pytest.approx(s["am"] + cfg.lm_weight * s["lm"] + cfg.word_penalty * len(h),
                                               abs=1e-3)
            assert s["lm"] < 0 and s["am"] < 0
            assert h.confidences is not None and len(h.confidences) == len(h.words)


def test_written_files_round_trip(written):
    corpus, out, _ = written
    assert read_nbest(out / "nbest" / "test.jsonl") == list(corpus.test)
    assert read_nbest(out / "nbest" / "dev.jsonl") == list(corpus.dev)
    trs = read_transcripts(out / "text" / "transcripts_dev.jsonl") + read_transcripts(
        out / "text" / "transcripts_test.jsonl")
    assert sorted(t.utt_id for t in trs) == sorted(t.utt_id for t in corpus.transcripts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 0 and manifest["config"] == corpus.config.to_dict()
    assert manifest["stats"]["test"]["utterances"] == len(corpus.test)
    assert all((out / f).is_file() for f in manifest["files"].values())
    clients = json.loads((out / "clients.json").read_text())
    assert [c["id"] for c in clients] == [c.id for c in corpus.clients]


# -------------------------------------------------------------------------------------------- realism

def test_wer_in_target_range_and_oracle_clearly_lower(corpus):
    for split in (corpus.dev, corpus.test):
        one = wer((nb.ref, nb.best.words) for nb in split)
        oracle = sum(min(edits(nb.ref, h.words) for h in nb.hyps) for nb in split) / sum(len(nb.ref) for nb in split)
        assert 0.12 <= one <= 0.32, one
        assert oracle <= 0.7 * one, (oracle, one)
    test = corpus.test
    one = wer((nb.ref, nb.best.words) for nb in test)
    assert 0.15 <= one <= 0.30
    # the manifest's numbers are the real ones (checked with jiwer)
    j = jiwer.wer([" ".join(nb.ref) for nb in test], [nb.best.text for nb in test])
    assert corpus.stats["test"]["wer_1best"] == pytest.approx(j, abs=1e-4)
    assert corpus.stats["test"]["wer_1best"] == pytest.approx(one, abs=1e-4)


def _ref_word_correct(ref, hyp):
    """Per reference word: matched in a minimum-edit alignment (jiwer's alignment)."""
    ok = [False] * len(ref)
    if not ref:
        return ok
    if not hyp:
        return ok
    out = jiwer.process_words(" ".join(ref), " ".join(hyp))
    for chunk in out.alignments[0]:
        if chunk.type == "equal":
            for i in range(chunk.ref_start_idx, chunk.ref_end_idx):
                ok[i] = True
    return ok


def test_personal_words_are_much_more_error_prone(corpus):
    own = {c.id: set(c.personal_words) for c in corpus.clients}
    n = Counter()
    for nb in corpus.test:
        for w, ok in zip(nb.ref, _ref_word_correct(nb.ref, nb.best.words), strict=True):
            kind = "personal" if w in own[nb.client] else "background"
            n[kind, ok] += 1
    err = {k: n[k, False] / (n[k, False] + n[k, True]) for k in ("personal", "background")}
    assert err["personal"] >= 2.0 * err["background"], err
    assert err["personal"] > 0.3


def _auc(pos, neg) -> float:
    pos, neg = np.asarray(pos), np.asarray(neg)
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def test_confidences_predict_correctness(corpus):
    pos, neg = [], []
    for nb in corpus.test:
        hyp = nb.best.words
        # a hypothesis word is correct when the alignment matches it to the reference
        ok = _ref_word_correct(hyp, nb.ref)
        for c, good in zip(nb.best.confidences, ok, strict=True):
            (pos if good else neg).append(c)
    assert len(neg) > 100
    assert _auc(pos, neg) > 0.7
    assert np.mean(pos) > np.mean(neg) + 0.1


def _rescored_wer(nbests, bonus) -> float:
    pairs = []
    for nb in nbests:
        best = max(nb.hyps, key=lambda h: h.scores["total"] + bonus(nb, h.words))
        pairs.append((nb.ref, best.words))
    return wer(pairs)


def test_personal_vocabulary_boost_reduces_wer(corpus):
    own = {c.id: set(c.personal_words) for c in corpus.clients}
    base = _rescored_wer(corpus.test, lambda nb, ws: 0.0)
    boosted = _rescored_wer(corpus.test, lambda nb, ws: 8.0 * sum(w in own[nb.client] for w in ws))
    ids = sorted(own)
    other = {cid: own[ids[(i + 1) % len(ids)]] for i, cid in enumerate(ids)}
    wrong = _rescored_wer(corpus.test, lambda nb, ws: 8.0 * sum(w in other[nb.client] for w in ws))
    assert boosted < base - 0.01, (base, boosted)
    assert wrong > boosted + 0.01


def test_client_cache_of_earlier_utterances_reduces_wer(corpus):
    """Personalisation in time order: a unigram cache of the client's own earlier utterances helps, a
    cache of another client's utterances helps less -- the signal federated personalisation exploits."""
    by: dict[str, list] = {}
    for nb in corpus.test:
        by.setdefault(nb.client, []).append(nb)
    ids = sorted(by)

    def run(source_of) -> float:
        pairs = []
        for cid in ids:
            cache: Counter[str] = Counter()
            src = by[source_of(cid)]
            for i, nb in enumerate(by[cid]):
                best = max(nb.hyps, key=lambda h: h.scores["total"] + 2.0 * sum(math.log1p(cache[w]) for w in h.words))
                pairs.append((nb.ref, best.words))
                if i < len(src):
                    cache.update(src[i].ref)
        return wer(pairs)

    base = wer((nb.ref, nb.best.words) for nb in corpus.test)
    own = run(lambda cid: cid)
    other = run(lambda cid: ids[(ids.index(cid) + 1) % len(ids)])
    assert own < base - 0.015, (base, own)
    assert own < other - 0.005, (own, other)


def test_a_stronger_in_domain_lm_reduces_wer(corpus):
    """A trigram trained on the background text plus dev-client transcripts beats the first-pass bigram."""
    sents = [s.split() for s in corpus.background] + [list(nb.ref) for nb in corpus.dev]
    c1: Counter = Counter()
    c2: Counter = Counter()
    c3: Counter = Counter()
    h1: Counter = Counter()
    h2: Counter = Counter()
    for s in sents:
        w = ["<s>", "<s>"] + s + ["</s>"]
        for i in range(2, len(w)):
            c1[w[i]] += 1
            c2[w[i - 1], w[i]] += 1
            h1[w[i - 1]] += 1
            c3[w[i - 2], w[i - 1], w[i]] += 1
            h2[w[i - 2], w[i - 1]] += 1
    total = sum(c1.values())

    def score(ws) -> float:
        w = ["<s>", "<s>"] + list(ws) + ["</s>"]
        lp = 0.0
        for i in range(2, len(w)):
            p1 = (c1[w[i]] + 0.1) / (total + 0.1 * 20000)
            p2 = (c2[w[i - 1], w[i]] + 2 * p1) / (h1[w[i - 1]] + 2)
            p3 = (c3[w[i - 2], w[i - 1], w[i]] + 2 * p2) / (h2[w[i - 2], w[i - 1]] + 2)
            lp += math.log(p3)
        return lp

    base = wer((nb.ref, nb.best.words) for nb in corpus.test)
    pairs = [(nb.ref, max(nb.hyps, key=lambda h: h.scores["am"] + 1.5 * score(h.words)).words) for nb in corpus.test]
    assert wer(pairs) < base - 0.02
