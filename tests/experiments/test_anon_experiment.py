"""``privasr anon run`` (paper 003): tiny fabricated AMI-like data, a fake entity detector, tiny models; and the
real config on the shared data (slow, skipped without it)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from privasr.anon.transform import EntitySpan  # noqa: E402
from privasr.config import apply_overrides, read_config  # noqa: E402
from privasr.corpus.formats.nbest_jsonl import write_nbest  # noqa: E402
from privasr.corpus.records import Hypothesis, NBest  # noqa: E402
from privasr.errors import ConfigError, InputError  # noqa: E402
from privasr.experiments.anon import (  # noqa: E402
    draw_adaptation_sets,
    load_anon_config,
    run_anon,
    split_meetings,
)
from privasr.lm.ngram.anon_classes import build_turn_texts  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

# invented names: not in the surrogate pools, so a surrogate can never be one of them
ENTITIES = {"Zorblax": "PER", "Quentavia": "PER", "Blorpton": "LOC", "Xyloria": "LOC", "Fnordcorp": "ORG",
            "Wibbleco": "ORG", "Glimmerfest": "MISC"}
TEMPLATES = [
    "{p} said we should {v} the {n} in {l} .",
    "Okay , so the {n} is {a} .",
    "I think {p} from {o} likes the {a} {n} .",
    "We 're going to {v} the {n} before {m} .",
    "{p} and {p2} will {v} it in {l} .",
    "The {n} from {o} is really {a} , is n't it ?",
    "Um , yeah , the {a} {n} .",
]
WORDS = {"v": ["design", "test", "build", "sell", "change"], "n": ["remote", "button", "battery", "case", "screen"],
         "a": ["good", "cheap", "small", "yellow", "round"]}


class FakeDetector:
    """Tags the invented names (cased) with their categories."""

    name = "fake-list"

    def __init__(self) -> None:
        self.calls = 0

    def detect(self, sentences):
        self.calls += 1
        return [[EntitySpan(i, i + 1, ENTITIES[w]) for i, w in enumerate(s) if w in ENTITIES] for s in sentences]


def _sentence(rng: np.random.Generator) -> list[str]:
    pick = lambda xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    pers = [k for k, v in ENTITIES.items() if v == "PER"]
    t = pick(TEMPLATES).format(p=pick(pers), p2=pick(pers), l=pick(["Blorpton", "Xyloria"]),
                               o=pick(["Fnordcorp", "Wibbleco"]), m="Glimmerfest",
                               v=pick(WORDS["v"]), n=pick(WORDS["n"]), a=pick(WORDS["a"]))
    return t.split()


def _meeting(mid: str, rng: np.random.Generator, turns: int) -> dict:
    return {"id": mid, "meeting": [{"speaker": "AB"[k % 2], "role": "PM", "utt": {"word": _sentence(rng)}}
                                   for k in range(turns)]}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ami")
    rng = np.random.default_rng(0)
    for split, n, turns in (("train", 10, 30), ("dev", 2, 20)):
        folder = d / "AMI_proprec" / split
        folder.mkdir(parents=True)
        with gzip.open(folder / "split_0.jsonl.gz", "wt", encoding="utf-8") as f:
            for k in range(n):
                f.write(json.dumps(_meeting(f"{split.upper()}{k:02d}", rng, turns)) + "\n")
    from privasr.text.normalize import Normalizer

    norm = Normalizer.preset("ami")
    for split, meetings in (("dev", ["DV1"]), ("test", ["TS1", "TS2"])):
        recs = []
        for m in meetings:
            for k in range(15):
                ref = norm(_sentence(rng))
                hyps = [ref]
                for j in range(4):
                    h = list(ref)
                    h[int(rng.integers(len(h)))] = ["the", "a", "remote", "blue"][j]
                    hyps.append(tuple(h))
                uniq = list(dict.fromkeys(hyps))
                rng.shuffle(uniq)
                recs.append(NBest(f"{m}_A_{k}", tuple(Hypothesis(tuple(h), {"am": float(rng.normal(-50, 1)),
                                                                              "lm": -20.0}) for h in uniq),
                                  client=m, speaker=f"{m}_A", order=k, ref=tuple(ref)))
        write_nbest(d / f"{split}.jsonl", recs)
    return d


def _raw(data: Path, tmp: Path, **over) -> dict:
    raw = {"name": "anon-test", "seed": 0,
           "data": {"transcripts": str(data / "AMI_proprec"), "dev": str(data / "dev.jsonl"),
                    "test": str(data / "test.jsonl")},
           "ner": {"model": "stock"}, "pool": {"fraction": 0.3}, "adaptation": {"sizes": [0.12, 0.2]},
           "order": 3, "fma": {"betas": [0.5, 1.0], "mu": 100},
           "lstm": {"preset": "tiny-lstm-class", "seed": 0,
                    "options": {"max_epochs": 1, "batch_size": 16, "lr": 0.01, "patience": 0, "amp": False},
                    "finetune": {"freeze": "output", "options": {"max_epochs": 1, "batch_size": 16, "lr": 0.01,
                                                                 "patience": 0, "amp": False}}},
           "mix": {"size": 0.12, "weights": None}, "primary": "wc_m4",
           "search": {"ranges": {"lm": [0, 4, 1], "word_penalty": [-2, 2, 1]}, "max_rounds": 3, "restarts": 1,
                      "coarse_points": 3},
           "eval": {"bootstrap_resamples": 20}, "cache_dir": str(tmp / "cache"), "export_arpa": True}
    return apply_overrides(raw, over)


@pytest.fixture(scope="module")
def first_run(data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run1")
    det = FakeDetector()
    m = run_anon(load_anon_config(_raw(data, tmp)), tmp / "out", detector=det)
    return tmp, m, det


def test_results_have_the_contract_keys_and_tables(first_run):
    tmp, m, _ = first_run
    res = json.loads((tmp / "out" / "results.json").read_text())
    for k in ("wer", "wer_baseline", "wer_original", "wer_rel_change", "mapsswe_p", "ppl", "ppl_baseline",
              "recovered_fraction"):
        assert k in res["metrics"], k
    for k in ("wer", "wer_baseline", "wer_original"):
        assert 0.0 <= m[k] <= 1.0
    assert m["ppl"] > 1 and m["ppl_baseline"] > 1
    t = res["tables"]
    assert [r["model"] for r in t["table2"]] == ["M1", "M2", "M3", "M4"]
    assert set(t["table3"][0]) == {"model", "name", "12", "20"}
    assert [r["name"] for r in t["table2"]] == ["M1 word 3-gram", "M2 class 3-gram", "M3 LSTM as a 3-gram", "M4 LSTM"]
    assert m["wer_baseline_system"] == "M1 word 3-gram on anonymised text"
    assert m["wer_system"].startswith("M1 + M2 + M4 adapted on ")
    assert [r["system"] for r in t["table4"]] == ["M1 + M2", "M1 + M2 + M3", "M1 + M2 + M4"]
    eq2 = t["table4"][2]["eq2"]
    assert abs(eq2["lw"] + eq2["lc"] - 1) < 1e-9 and 0 <= eq2["ln"] <= 1
    assert res["data_info"]["adaptation_tokens"]["20"] >= res["data_info"]["adaptation_tokens"]["12"]
    assert "Table 2" in (tmp / "out" / "report.md").read_text()


def test_first_pass_arpa_models_are_exported(first_run):
    from privasr.lm.ngram.arpa import read_arpa

    tmp, _, _ = first_run
    info = json.loads((tmp / "out" / "results.json").read_text())["first_pass_arpa"]
    assert set(info) == {"m1_anon", "m1_orig", "m2_anon", "m3_anon", "mix_wc_m3"}
    models = {k: read_arpa(v["path"]) for k, v in info.items()}
    for k, m in models.items():
        assert [m.num_ngrams(n) for n in range(1, m.order + 1)] == info[k]["ngrams"]
    # the class n-gram expanded into words: no class token left, its members are words of the model
    assert not any(w.startswith("<") and w not in ("<s>", "</s>", "<unk>") for w in models["m2_anon"].vocab)
    # the merged model holds the union of its components' vocabularies
    assert set(models["m1_anon"].vocab) <= set(models["mix_wc_m3"].vocab)
    assert abs(sum(info["mix_wc_m3"]["weights"]) - 1) < 1e-9
    assert "top_members" in info["m2_anon"] and "m2_top_members" in info["mix_wc_m3"]


def test_a_class_expansion_too_large_keeps_the_top_members():
    from privasr.experiments.anon import _fit_expansion
    from privasr.lm.ngram.class_lm import ClassNgramModel
    from privasr.lm.ngram.classes import ClassMap
    from privasr.lm.ngram.tables import synthetic_model

    names = [f"n{i}" for i in range(30)]
    lm = synthetic_model(3, ["a", "b", "<PER>"], seed=0)
    m = ClassNgramModel(lm, ClassMap.from_members({"<PER>": names}),
                        {"<PER>": {w: (i + 1) / 465 for i, w in enumerate(names)}})
    full, k = _fit_expansion(m, 10**9)
    assert k is None and "n0" in full.vocab
    size = sum(full.num_ngrams(n) for n in (1, 2, 3))
    small, k = _fit_expansion(m, size // 4)
    assert k is not None and k < 30 and sum(small.num_ngrams(n) for n in (1, 2, 3)) <= size // 4
    assert "n29" in small.vocab and "n0" not in small.vocab  # the most probable members are kept


def test_anonymised_training_text_holds_no_detected_entity_word(data):
    from privasr.anon.transform import Anonymizer
    from privasr.corpus.formats.ami_hmnet import read_ami_hmnet
    from privasr.text.normalize import Normalizer

    turns = list(read_ami_hmnet(data / "AMI_proprec" / "train"))
    texts = build_turn_texts(turns, FakeDetector().detect([t.words for t in turns]), Anonymizer(seed=3),
                             Normalizer.preset("ami"))
    names = {w.lower() for w in ENTITIES}
    assert any(names & set(t.original) for t in texts)
    assert not any(names & set(t.surrogate) for t in texts)
    assert all(len(t.surrogate) == len(t.tagged) == len(t.labels) for t in texts)
    tags = {w for t in texts for w in t.tagged if re.fullmatch(r"<[A-Z]+>", w)}
    assert tags == {"<PER>", "<LOC>", "<ORG>", "<MISC>"}


def test_the_run_is_reproducible_with_its_seed(data, first_run, tmp_path):
    _, m1, _ = first_run
    m2 = run_anon(load_anon_config(_raw(data, tmp_path)), tmp_path / "out", detector=FakeDetector())
    for k in ("wer", "wer_baseline", "wer_original", "ppl", "ppl_baseline", "mapsswe_p"):
        assert m1[k] == m2[k], k


def test_cached_models_and_spans_are_reused(data, first_run):
    tmp, m, _ = first_run
    det = FakeDetector()
    again = run_anon(load_anon_config(_raw(data, tmp)), tmp / "out2", detector=det)
    assert det.calls == 0  # spans from the cache
    res = json.loads((tmp / "out2" / "results.json").read_text())
    assert all(v["cached"] for v in res["models"].values())
    assert again["wer"] == m["wer"]


def test_the_command_runs_a_config_file_with_overrides(data, first_run, monkeypatch):
    import typer
    import yaml
    from typer.testing import CliRunner

    import privasr.experiments.anon as anon_mod
    from privasr.cli.anon_run import run

    tmp, m, _ = first_run
    monkeypatch.setattr(anon_mod, "_load_detector", lambda spec: (FakeDetector(), FakeDetector.name))
    cfg = tmp / "anon.yaml"
    cfg.write_text(yaml.safe_dump(_raw(data, tmp)), encoding="utf-8")
    app = typer.Typer()
    app.command("run")(run)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, ["run", "--config", str(cfg), "--out", str(tmp / "cli"),
                                   "--set", "eval.bootstrap_resamples=10"])
    assert res.exit_code == 0, res.output
    out = json.loads((tmp / "cli" / "results.json").read_text())
    assert out["metrics"]["wer"] == m["wer"] and out["config"]["eval"]["bootstrap_resamples"] == 10


@pytest.mark.parametrize(("over", "key"), [
    ({"pool.fraction": 1.0}, "pool.fraction"),
    ({"adaptation.sizes": [0.1, 1.5]}, "adaptation.sizes"),
    ({"fma.betas": [-1]}, "fma.betas"),
    ({"fma.mu": 0}, "fma.mu"),
    ({"lstm.preset": "tiny-transformer"}, "lstm.preset"),
    ({"lstm.options.max_epochs": 0}, "lstm.options"),
    ({"lstm.finetune.freeze": "all"}, "lstm.finetune.freeze"),
    ({"mix.size": 0.5}, "mix.size"),
    ({"mix.weights": {"word": 0.5, "class": 0.2, "neural": 0.1}}, "mix.weights"),
    ({"primary": "m9"}, "primary"),
    ({"search.ranges": {"m1": [0, 1, 1]}}, "search.ranges.m1"),
    ({"order": 9}, "order"),
    ({"approx.method": "exact"}, "approx.method"),
    ({"bogus": 1}, "bogus"),
    ({"export_arpa": "yes"}, "export_arpa"),
    ({"normalize": "klingon"}, "normalize"),
])
def test_bad_config_values_name_the_key(data, tmp_path, over, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_anon_config(_raw(data, tmp_path, **over))


def test_normalize_runs_after_the_ami_preset_on_every_text(data, tmp_path):
    """``normalize: neural`` (for Whisper's lists): contractions expanded in the dev text, the pool and the
    anonymised training turns, with the entity placeholders intact."""
    from privasr.anon.transform import Anonymizer
    from privasr.experiments.anon import load_data

    plain = load_data(load_anon_config(_raw(data, tmp_path)))
    neural = load_data(load_anon_config(_raw(data, tmp_path, normalize="neural")))
    assert any("we're" in s for s in plain.dev_text)
    texts = [neural.dev_text, [s for ss in neural.pool.values() for s in ss]]
    for sents in texts:
        assert not any("we're" in s or "isn't" in s for s in sents)
        assert any(s[:4] == ("we", "are", "going", "to") for s in sents)
    turns = build_turn_texts(neural.train_turns, FakeDetector().detect([t.words for t in neural.train_turns]),
                             Anonymizer("surrogate", 0), neural.norm)
    assert not any("we're" in t.surrogate for t in turns)
    tagged = [t.tagged for t in turns if "<PER>" in t.tagged]
    assert tagged and all(len(t.surrogate) == len(t.tagged) for t in turns)


def test_missing_inputs_and_small_pools_are_clear_errors(data, tmp_path):
    with pytest.raises(ConfigError, match="data.test"):
        load_anon_config(_raw(data, tmp_path, **{"data.test": str(tmp_path / "nope.jsonl")}))
    with pytest.raises(InputError, match="clean pool"):
        draw_adaptation_sets({"m": [("a",)]}, 100, [0.2], seed=0)
    train, pool = split_meetings([f"m{i}" for i in range(10)], 0.2, seed=1)
    assert len(pool) == 2 and not set(train) & set(pool)


def test_the_shipped_config_validates():
    raw = read_config(CONFIGS / "anon-ami.yaml")
    cfg = load_anon_config(raw, check_files=False)
    assert cfg.adaptation.sizes == (0.12, 0.15, 0.2) and cfg.mix.size == 0.12 and cfg.primary == "wc_m4"
    whisper = load_anon_config(read_config(CONFIGS / "anon-ami-whisper.yaml"), check_files=False)
    assert whisper.normalize == "neural" and whisper.data.test.name == "nbest.jsonl"


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.timeout(3600)
def test_the_ami_config_on_the_shared_data(tmp_path):
    """configs/anon-ami.yaml with shorter LSTM training (entity spans reused from a real run's cache if any)."""
    import shutil

    from privasr.paths import data_dir

    d = data_dir()
    if d is None or not (d / "ami-transcripts" / "AMI_proprec" / "train").is_dir() or not (
            d / "ami-tts-nbest" / "test.jsonl.xz").is_file():
        pytest.skip("the shared AMI data is not available")
    raw = read_config(CONFIGS / "anon-ami.yaml")
    cache = tmp_path / "cache"
    cache.mkdir()
    real = Path(raw.get("cache_dir", "runs/cache/anon-ami"))
    if real.is_dir():
        for f in real.glob("ner-*.json.gz"):
            shutil.copy(f, cache / f.name)
    raw = apply_overrides(raw, {"lstm.options.max_epochs": 1, "lstm.options.max_steps": 200,
                                "lstm.finetune.options.max_epochs": 1, "lstm.finetune.options.max_steps": 20,
                                "fma.betas": [0.5, 1.0], "cache_dir": str(cache), "eval.bootstrap_resamples": 50})
    m = run_anon(load_anon_config(raw), tmp_path / "out")
    assert 0.0 < m["wer"] < 1.0 and m["ppl"] > 1
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["data_info"]["entity_word_tokens"] > 0


def test_detection_sees_each_meeting_as_one_document(tmp_path):
    from types import SimpleNamespace

    from privasr.experiments.anon import _detect

    class Grouped:
        def __init__(self) -> None:
            self.groups = None

        def detect(self, sentences, groups=None):
            self.groups = list(groups)
            return [[] for _ in sentences]

    turns = [SimpleNamespace(words=("hi",), client="m1"), SimpleNamespace(words=("yo",), client="m2"),
             SimpleNamespace(words=("so",), client="m1")]
    det = Grouped()
    assert _detect(det, "g", turns, tmp_path) == [[], [], []]
    assert det.groups == ["m1", "m2", "m1"]
    det2 = Grouped()
    _detect(det2, "g", turns, tmp_path)
    assert det2.groups is None  # the second call is served from the span cache
