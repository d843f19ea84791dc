"""The end-to-end demo: generate the synthetic federated corpus and run every method privasr has on it.

Each capability adds its method here, as a row of the WER table in ``report.md`` and metrics in
``results.json``. Today the demo runs:

* corpus generation (``privasr data synth``), with its manifest;
* corpus statistics of the dev and test N-best sets (``privasr data inspect``);
* the first-pass 1-best and the N-best oracle on the test clients, with MAPSSWE and a paired bootstrap
  interval between them (``privasr score compare``);
* N-best rescoring with a modified Kneser-Ney trigram trained on the server's background text (the
  generic text, without any client's personal vocabulary), weights tuned on the dev clients only
  (``privasr lm train-ngram`` + ``privasr rescore run``), with MAPSSWE against the 1-best;
* federated marginal personalisation (``privasr fmp run``, paper 000) of that rescoring: the test clients'
  utterances in time order, T = 2 rounds through the federated loop, unigram caches from their N-best lists
  averaged on the server, each client rescaling the LM by its marginals (the background trigram stands in for
  the NNLM here, so the demo needs no torch); ``lam`` tuned on the dev clients; with and without Laplace DP
  (epsilon 1, utterance level);
* federated NNLM fine-tuning (``privasr fedlm run``, paper 001): a tiny transformer pre-trained on the
  background text, fine-tuned for 3 FedAdam rounds by the dev clients on their own 1-best with token-level
  confidence weights; test perplexity and rescoring WER against the unadapted model (skipped without torch);
* federated transfer learning of a tiny CTC acoustic model (``privasr ftl run``, paper 002) on a synthetic
  AN4-like corpus: seed model on the server's speakers, hierarchical optimisation with softmax weighting vs
  FedAvg on the client speakers (skipped without torch);
* anonymisation of the clients' transcripts (``privasr anonymize``, paper 003): NER quality against the gold
  personal entities, leak rate, surrogate and class-tag corpora, a trigram on original vs anonymised text;
* per-client WER, and the federated views of the test clients: time-ordered rounds (T = 2) and Zipf
  device simulation.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp())
>>> res = run_demo(out, seed=0, preset="tiny")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privasr import __version__
from privasr.corpus.partition import by_key, time_rounds, zipf_devices
from privasr.corpus.records import NBest
from privasr.plots import plots_section
from privasr.results import write_results

__all__ = ["run_demo", "systems_table"]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def systems_table(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown WER table from rows with ``system``, ``wer``, ``sub``, ``del``, ``ins``, ``words``.

    >>> print(systems_table([{"system": "1-best", "wer": 0.25, "sub": 1, "del": 0, "ins": 0, "words": 4}]))
    | system | WER % | sub | del | ins | ref words |
    |---|---:|---:|---:|---:|---:|
    | 1-best | 25.00 | 1 | 0 | 0 | 4 |
    """
    lines = ["| system | WER % | sub | del | ins | ref words |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['system']} | {_pct(r['wer'])} | {r['sub']} | {r['del']} | {r['ins']} | {r['words']} |")
    return "\n".join(lines)


def _ngram_rescoring(corpus: Path, dev: Sequence[NBest], test: Sequence[NBest]
                     ) -> tuple[list[NBest], dict[str, Any], Any]:
    """Rescore ``test`` with a background-text trigram; weights (first-pass LM, new LM, word penalty) tuned on ``dev``
    (the search result, with the dev errors, is returned too)."""
    from privasr.lm.ngram.mkn import train_mkn
    from privasr.rescore import Combination, SearchSpace, rescore, score_table, tune

    text = (corpus / "text" / "background.txt").read_text(encoding="utf-8").splitlines()
    # lmplz's fallback discounts for orders whose estimates are out of range (the tiny preset's small text)
    lm = train_mkn((line.split() for line in text if line.strip()), 3, discount_fallback=(0.5, 1.0, 1.5))
    combination = Combination(prior="am", lms=("lm", "bg3"))
    grid = tuple(round(0.5 * k, 1) for k in range(0, 41))
    space = SearchSpace({"lm": grid, "bg3": grid, "word_penalty": tuple(round(0.5 * k, 1) for k in range(-40, 41))})
    result = tune(dev, score_table(dev, {"bg3": lm}), combination, space, method="coordinate")
    return rescore(test, combination, result.weights, {"bg3": lm}), dict(result.weights), result


def _fmp(corpus: Path, dev: Sequence[NBest], test: Sequence[NBest], weights: dict[str, Any], seed: int,
         rounds: int = 2) -> dict[str, Any]:
    """FMP on top of the background-trigram rescoring: lam tuned on the dev clients, then test without and with
    Laplace DP. Returns the chosen test words and figures."""
    from privasr.experiments.fmp import simulate
    from privasr.federated.algorithms.fmp_data import WordIds, background_unigram, build_clients
    from privasr.lm.ngram.mkn import train_mkn
    from privasr.metrics import wer
    from privasr.rescore import Combination, score_table

    text = [tuple(line.split()) for line in (corpus / "text" / "background.txt").read_text(encoding="utf-8")
            .splitlines() if line.strip()]
    lm = train_mkn(text, 3, discount_fallback=(0.5, 1.0, 1.5))
    vocab = WordIds.build(text)
    u = background_unigram(text, vocab)
    comb = Combination(prior="am", lms=("lm", "bg3"))
    fmp = {"alpha": 0.5, "beta": 0.25, "sigma": 1.0, "smoothing": 1.0}
    bw = float(weights.get("bg3") or 1.0)
    out: dict[str, Any] = {}
    clients = {}
    for name, recs in (("dev", dev), ("test", test)):
        t = score_table(recs, {"bg3": lm})
        clients[name] = build_clients(recs, comb.totals(t, weights), t.offsets, vocab, "client", rounds, bw)
    trace = []
    dev_refs = [nb.ref or () for nb in dev]
    for lam in (0.25, 0.5, 1.0, 2.0):
        chosen, _, _ = simulate(clients["dev"], u, fmp, lam, rounds, seed=seed)
        trace.append((wer(dev_refs, [nb.hyps[chosen[nb.utt_id]].words for nb in dev]).errors, lam))
    out["dev_errors"], out["lam"] = min(trace)
    chosen, _, _ = simulate(clients["test"], u, fmp, out["lam"], rounds, seed=seed)
    out["words"] = [nb.hyps[chosen[nb.utt_id]].words for nb in test]
    out["rounds"] = rounds
    try:
        chosen_dp, _, priv = simulate(clients["test"], u, fmp, out["lam"], rounds, seed=seed,
                                      dp={"epsilon": 1.0, "unit": "utterance", "cap": 1.0, "accountant": "pld",
                                          "delta": 1e-5})
        out["words_dp"] = [nb.hyps[chosen_dp[nb.utt_id]].words for nb in test]
        out.update(priv)
    except ImportError:  # the federated extra (dp-accounting) is not installed
        out["words_dp"] = None
    return out


def _fedlm(out: Path, seed: int) -> dict[str, Any] | None:
    """Federated NNLM fine-tuning (paper 001) through :func:`privasr.experiments.fedlm.run_fedlm` into
    ``out/fedlm``: a tiny transformer pre-trained on the background text, fine-tuned for 3 rounds by the dev
    clients on their 1-best with token-level confidence weights (FedAdam), then test perplexity and rescoring
    WER against the unadapted model. ``None`` without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from privasr.experiments.fedlm import load_fedlm_config, run_fedlm

    corpus = out / "corpus"
    text = str(corpus / "text" / "background.txt")
    cfg = load_fedlm_config({
        "name": "demo-fedlm", "seed": seed,
        "data": {"kind": "nbest", "dev": str(corpus / "nbest" / "dev.jsonl"),
                 "test": str(corpus / "nbest" / "test.jsonl")},
        "nnlm": {"neural": {"train": {"text": text, "valid": text, "preset": "tiny-transformer", "seed": seed,
                                      "options": {"max_epochs": 2, "batch_size": 32, "lr": 0.01, "patience": 0,
                                                  "amp": False}}}},
        "cache_dir": str(out / "fedlm" / "lm"),
        "fedlm": {"loss": "token", "batch_size": 8, "client_lr": 0.5, "server": {"name": "adam", "lr": 0.01}},
        "rounds": 3, "compare_all": True,
        "rescore": {"ranges": {"lm": [0, 4, 0.5], "nnlm": [0, 4, 0.5], "word_penalty": [-4, 4, 1]},
                    "with_baseline": True},
        "eval": {"bootstrap_resamples": 200}})
    metrics = dict(run_fedlm(cfg, out / "fedlm"))
    rescored = json.loads((out / "fedlm" / "results.json").read_text(encoding="utf-8")).get("rescore") or {}
    metrics.update({k: rescored[k] for k in ("dev_errors_baseline", "dev_errors_adapted") if k in rescored})
    return metrics


def _anon(out: Path, seed: int) -> dict[str, Any]:
    """Anonymisation (paper 003) of the synthetic clients' reference transcripts into ``out/anon``.

    The detector is stock spaCy + patterns (:func:`privasr.anon.ner_model.load_detector`; patterns alone without
    the ``ner`` extra), run on the lower-case, punctuation-free references with clients as documents. It is
    scored against the corpus's gold personal-entity spans (exact-span P/R, token recall, leak rate of
    surrogate anonymisation), the dev and test transcripts are written anonymised (surrogates and class
    tags), and a trigram on background + dev transcripts, original vs anonymised, is scored on the test
    references (``<unk>`` included, so the vocabularies' different coverage counts).
    """
    from privasr.anon.apply import anonymize_records
    from privasr.anon.ner_metrics import leak_counts, span_prf, token_recall
    from privasr.anon.ner_model import load_detector
    from privasr.anon.transform import Anonymizer, EntitySpan, map_label
    from privasr.corpus.formats.nbest_jsonl import read_transcripts, write_transcripts
    from privasr.errors import ConfigError
    from privasr.lm.base import closed_vocab_perplexity
    from privasr.lm.ngram.mkn import train_mkn

    corpus = out / "corpus"
    try:
        detector, kind = load_detector("stock"), "stock spaCy + patterns"
    except (ImportError, ConfigError):
        detector, kind = load_detector("patterns"), "patterns only (no ner extra)"
    sets = {k: read_transcripts(corpus / "text" / f"transcripts_{k}.jsonl") for k in ("dev", "test")}
    test = sets["test"]
    words = [t.words for t in test]
    clients = [t.client or "" for t in test]
    gold = [[EntitySpan(s.start, s.end, lab) for s in t.entities if (lab := map_label(s.label))] for t in test]
    pred = detector.detect(words, groups=clients)
    prf = span_prf(gold, pred, ("PER", "ORG", "LOC"))
    leak = leak_counts(words, gold, pred, clients=clients, seed=seed)
    anon_dir = out / "anon"
    anonymized: dict[str, list[Any]] = {}
    for mode in ("surrogate", "tag"):
        anonymizer = Anonymizer(mode, seed=seed)
        for k, recs in sets.items():
            res, _ = anonymize_records(recs, anonymizer, detector)
            write_transcripts(anon_dir / f"transcripts_{k}.{mode}.jsonl", res)
            if mode == "surrogate":
                anonymized[k] = res
    names = {w for t in test for s in t.entities for w in t.words[s.start:s.end]}
    left = sum(w in names for t in anonymized["test"] for w in t.words)
    background = [line.split() for line in (corpus / "text" / "background.txt").read_text().splitlines()]

    def ppl(train_text: list[Any]) -> float:
        lm = train_mkn(background + train_text, 3, discount_fallback=(0.5, 1.0, 1.5))
        return closed_vocab_perplexity(lm, words)

    return {"detector": kind, "per_recall": prf["PER"]["recall"], "per_precision": prf["PER"]["precision"],
            "micro_f1": prf["micro"]["f1"], "token_recall": token_recall(gold, pred, ("PER", "ORG", "LOC")),
            "leak_rate": leak["all"]["leak_rate"], "mentions": leak["all"]["mentions"],
            "name_tokens_left": left, "name_tokens_before": sum(w in names for w in (x for t in test for x in t.words)),
            "ppl_original": ppl([t.words for t in sets["dev"]]),
            "ppl_anonymized": ppl([t.words for t in anonymized["dev"]])}


_FTL_TARGET = 0.8
"""The demo's FTL target validation loss, as a fraction of the seed model's (``target_from_seed``)."""


def _ftl(out: Path, seed: int) -> dict[str, Any] | None:
    """Federated transfer learning of a tiny CTC acoustic model (paper 002) through
    :func:`privasr.experiments.ftl.run_ftl` into ``out/ftl``, on a synthetic AN4-like corpus (40 training
    speakers of 20 utterances, half of them the server's; 8 test speakers): seed model, 15 rounds of 5 clients
    with hierarchical optimisation and softmax weighting against FedAvg. What FTL is for is reaching a model
    sooner: the report leads with rounds to a target validation loss 20% below the seed model's (a target neither
    run decides). ``None`` without torch."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    from privasr.experiments.ftl import load_ftl_config, run_ftl

    cfg = load_ftl_config({
        "name": "demo-ftl", "seed": seed,
        "data": {"kind": "synthetic", "speakers": 40, "utterances": 20, "test_speakers": 8},
        "model": {"preset": "tiny", "arch": "ctc"}, "seed_model": {"epochs": 8, "lr": 0.005, "batch_size": 8},
        "rounds": 15, "federated": {"sampler": {"kind": "with_replacement", "n": 5}}, "target_from_seed": _FTL_TARGET,
        "ftl": {"client_optimizer": {"name": "sgd", "lr": 0.3}, "server": {"name": "adam", "lr": 0.005},
                "weighting": "softmax"}})
    return run_ftl(cfg, out / "ftl", argv=["privasr", "demo", "--out", str(out), "--seed", str(seed)])


class _Clock:
    """Seconds per named stage: ``with clock("synth_s"): ...``."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.timings[name] = time.perf_counter() - t0


def _wer_row(system: str, r: Any) -> dict[str, Any]:
    """A :func:`systems_table` row of a :class:`~privasr.metrics.WerResult`."""
    return {"system": system, "wer": r.wer, "sub": r.substitutions, "del": r.deletions, "ins": r.insertions,
            "words": r.ref_words}


@dataclass
class _FirstPass:
    """The test clients' references, the first-pass 1-best and the N-best oracle, scored."""

    refs: list[Sequence[str]]
    ids: list[str]
    onebest: list[Sequence[str]]
    onebest_wer: Any
    oracle_wer: Any
    sig: Any  # MAPSSWE, 1-best vs oracle
    boot: Any  # paired bootstrap interval, 1-best vs oracle


@dataclass
class _Method:
    """A method's test words and scores: its WER, MAPSSWE against the system it improves on, its figures."""

    words: list[Sequence[str]]
    wer: Any
    sig: Any
    info: dict[str, Any]
    dp_wer: Any = None  # FMP with Laplace DP (None: not run)


def _read_corpus(corpus: Path) -> tuple[list[NBest], list[NBest], dict[str, Any]]:
    """The dev and test N-best lists read back from ``corpus`` (the demo exercises the same readers a user's
    data goes through) and their statistics."""
    from privasr.corpus.formats.nbest_jsonl import read_nbest
    from privasr.metrics.summary import nbest_stats

    dev = read_nbest(corpus / "nbest" / "dev.jsonl")
    test = read_nbest(corpus / "nbest" / "test.jsonl")
    return dev, test, {"dev": nbest_stats(dev), "test": nbest_stats(test)}


def _first_pass(test: Sequence[NBest], seed: int) -> _FirstPass:
    """1-best and oracle WER of ``test``, MAPSSWE and a paired bootstrap interval of WER(oracle) - WER(1-best)
    (system minus baseline, as every interval privasr prints)."""
    from privasr.metrics import mapsswe, oracle_indices, paired_bootstrap, wer

    refs = [nb.ref or () for nb in test]
    onebest = [nb.best.words for nb in test]
    oracle = [nb.hyps[i].words if i >= 0 else () for nb, i in zip(test, oracle_indices(test), strict=True)]
    a, b = wer(refs, onebest, aligner="sclite"), wer(refs, oracle, aligner="sclite")
    ids = [nb.utt_id for nb in test]
    sig = mapsswe(refs, onebest, oracle, ids=ids)
    boot = paired_bootstrap(b.utt_errors, a.utt_errors, a.utt_ref_words, seed=seed)  # oracle minus 1-best
    return _FirstPass(refs, ids, onebest, a, b, sig, boot)


def _ngram_stage(corpus: Path, dev: Sequence[NBest], test: Sequence[NBest], first: _FirstPass) -> _Method:
    """Background-trigram rescoring (:func:`_ngram_rescoring`), scored against the 1-best."""
    from privasr.metrics import mapsswe, wer

    rescored, tuned, search = _ngram_rescoring(corpus, dev, test)
    words = [nb.best.words for nb in rescored]
    return _Method(words, wer(first.refs, words, aligner="sclite"),
                   mapsswe(first.refs, words, first.onebest, ids=first.ids),
                   {"weights": tuned, "dev_errors": search.errors, "dev_errors_1best": search.baseline_errors,
                    "dev_ref_words": search.ref_words})


def _fmp_stage(corpus: Path, dev: Sequence[NBest], test: Sequence[NBest], first: _FirstPass, ngram: _Method,
               seed: int) -> _Method:
    """FMP of the n-gram rescoring (:func:`_fmp`), without and with DP, scored against that rescoring."""
    from privasr.metrics import mapsswe, wer

    fmp = _fmp(corpus, dev, test, ngram.info["weights"], seed)
    res = _Method(fmp["words"], wer(first.refs, fmp["words"], aligner="sclite"),
                  mapsswe(first.refs, fmp["words"], ngram.words, ids=first.ids), fmp)
    if fmp["words_dp"] is not None:
        res.dp_wer = wer(first.refs, fmp["words_dp"], aligner="sclite")
    return res


def _federated_views(test: Sequence[NBest], seed: int) -> dict[str, Any]:
    """Per-client 1-best WER, time-ordered rounds (T = 2) and a Zipf device simulation of the test clients."""
    from privasr.metrics import wer

    pop = by_key(test, "client")
    per_client = []
    for c in pop:
        cw = wer([u.ref or () for u in c], [u.best.words for u in c])
        per_client.append({"client": c.id, "utterances": len(c), "words": cw.ref_words, "wer_1best": cw.wer})
    n_devices = max(2, len(test) // 4)
    return {"clients": len(pop), "per_client": per_client,
            "rounds": [[len(g) for g in time_rounds(c.utterances, 2)] for c in pop],
            "device_ids": n_devices, "devices": zipf_devices(test, n_devices=n_devices, exponent=1.0, seed=seed)}


def _client_wers(per_client: list[dict[str, Any]], test: Sequence[NBest], systems: dict[str, Any]) -> None:
    """Add each system's WER per client (``wer_<system>``, from its per-utterance errors on ``test``) to the
    :func:`_federated_views` rows, for the plot of the spread over clients."""
    client_of = [nb.client for nb in test]
    for row in per_client:
        for name, w in systems.items():
            errs = sum(e for e, c in zip(w.utt_errors, client_of, strict=True) if str(c) == str(row["client"]))
            words = sum(n for n, c in zip(w.utt_ref_words, client_of, strict=True) if str(c) == str(row["client"]))
            row[f"wer_{name}"] = errs / words if words else None


_ONE_BEST = "first-pass 1-best"
_NGRAM = "n-gram rescoring (background 3-gram, tuned on dev)"
_NNLM = "tiny NNLM rescoring (background text, tuned on dev)"
_NNLM_ADAPTED = ("the same NNLM fine-tuned federatedly by the dev clients (3 rounds, token-confidence loss, FedAdam), "
                 "interpolated with it")


def _fmp_name(fmp: _Method) -> str:
    return f"FMP of that rescoring (T = {fmp.info['rounds']}, lam {fmp.info['lam']:g} tuned on dev)"


def _best_on_dev(first: _FirstPass, ngram: _Method, fmp: _Method, fedlm: dict[str, Any] | None) -> dict[str, Any]:
    """The system with the fewest dev errors (all are tuned and scored on the same dev clients; the first pass wins
    ties), with its dev and test WER. Systems without a dev figure (FMP with DP, which runs on the test clients
    only) are not candidates; the oracle is a bound, not a system."""
    words = ngram.info["dev_ref_words"]
    cands: list[tuple[int, int, str, float]] = [
        (ngram.info["dev_errors_1best"], 0, _ONE_BEST, first.onebest_wer.wer),
        (ngram.info["dev_errors"], 1, _NGRAM, ngram.wer.wer),
        (fmp.info["dev_errors"], 2, _fmp_name(fmp), fmp.wer.wer)]
    if fedlm is not None and "dev_errors_adapted" in fedlm:
        cands += [(fedlm["dev_errors_baseline"], 3, _NNLM, fedlm["wer_baseline"]),
                  (fedlm["dev_errors_adapted"], 4, _NNLM_ADAPTED, fedlm["wer"])]
    errors, order, name, test_wer = min(cands)
    return {"system": name, "dev_errors": errors, "dev_wer": errors / words if words else None, "test_wer": test_wer,
            "dev_ref_words": words, "index": order,
            "candidates": [{"system": c[2], "dev_errors": c[0]} for c in sorted(cands, key=lambda c: c[1])]}


def _systems_rows(first: _FirstPass, ngram: _Method, fmp: _Method, fedlm: dict[str, Any] | None,
                  ) -> list[dict[str, Any]]:
    """The WER table's rows: 1-best, the rescoring methods, the oracle."""
    rows = [_wer_row(_ONE_BEST, first.onebest_wer),
            _wer_row(_NGRAM, ngram.wer),
            _wer_row(_fmp_name(fmp), fmp.wer)]
    if fmp.dp_wer is not None:
        rows.append(_wer_row(f"FMP with Laplace DP (epsilon {fmp.info['epsilon']:.3g}, utterance level)",
                             fmp.dp_wer))
    if fedlm is not None:
        for name, w, c in ((_NNLM, fedlm["wer_baseline"], fedlm["wer_baseline_counts"]),
                           (_NNLM_ADAPTED, fedlm["wer"], fedlm["wer_counts"])):
            rows.append({"system": name, "wer": w, "sub": c["sub"], "del": c["del"], "ins": c["ins"],
                         "words": c["ref_words"]})
    rows.append(_wer_row("N-best oracle (upper bound)", first.oracle_wer))
    return rows


def _against_first_pass(first: _FirstPass, ngram: _Method, fmp: _Method, best: dict[str, Any]) -> Any:
    """MAPSSWE of the best system against the first pass: n-gram rescoring's own test, FMP's computed here; ``None``
    for the first pass itself and for the NNLM systems (their words stay in ``fedlm/``, their MAPSSWE there is
    against the tiny NNLM)."""
    from privasr.metrics import mapsswe

    if best["system"] == _NGRAM:
        return ngram.sig
    if best["system"] == _fmp_name(fmp):
        return mapsswe(first.refs, fmp.words, first.onebest, ids=first.ids)
    return None


def _metrics(first: _FirstPass, ngram: _Method, fmp: _Method, fedlm: dict[str, Any] | None,
             ftl: dict[str, Any] | None, anon: dict[str, Any], views: dict[str, Any], dev: Sequence[NBest],
             test: Sequence[NBest], timings: dict[str, float]) -> dict[str, Any]:
    """``results.json``'s metrics."""
    one = first.onebest_wer.wer
    per_client, devices = views["per_client"], views["devices"]
    best = _best_on_dev(first, ngram, fmp, fedlm)
    sig = _against_first_pass(first, ngram, fmp, best)
    return {
        # the shared metric names describe the system that is best on dev (wer_system) against the first pass
        "wer": best["test_wer"],
        "wer_system": best["system"],
        "wer_dev": best["dev_wer"],
        "wer_baseline": one,
        "wer_baseline_system": _ONE_BEST,
        "wer_rel_change": (best["test_wer"] - one) / one if one > 0 else None,
        "mapsswe_z": None if sig is None else sig.z,
        "mapsswe_p": None if sig is None else sig.p,
        "best_on_dev": best,
        "wer_1best": one,
        "wer_oracle": first.oracle_wer.wer,
        "wer_ngram_rescoring": ngram.wer.wer,
        "ngram_rescoring_weights": ngram.info["weights"],
        "wer_fmp": fmp.wer.wer,
        "wer_fmp_dp": fmp.dp_wer.wer if fmp.dp_wer is not None else None,
        "fmp_lam": fmp.info["lam"],
        "fmp_mapsswe_p_vs_ngram_rescoring": fmp.sig.p,
        "fmp_epsilon": fmp.info.get("epsilon"),
        "fmp_delta": fmp.info.get("delta"),
        "fedlm": None if fedlm is None else {k: fedlm[k] for k in (
            "ppl", "ppl_baseline", "ppl_all_utts", "wer", "wer_baseline", "wer_rel_change", "mapsswe_p", "rounds",
            "clients")},
        "ftl": None if ftl is None else {k: ftl[k] for k in (
            "wer", "cer", "wer_baseline", "cer_baseline", "wer_seed", "cer_seed", "test_utterances", "rounds_to_target",
            "rounds_to_target_baseline", "target_loss", "valid_loss", "valid_loss_baseline", "valid_loss_seed",
            "wer_system", "wer_baseline_system", "mapsswe_p", "mapsswe_better", "rounds", "server_speakers",
            "client_speakers")},
        "anon": anon,
        "oracle_mapsswe_z": first.sig.z,
        "oracle_mapsswe_p": first.sig.p,
        "oracle_bootstrap_ci": [first.boot.ci_low, first.boot.ci_high],
        "test_utterances": len(test),
        "test_clients": views["clients"],
        "dev_utterances": len(dev),
        "per_client_wer_range": [min(p["wer_1best"] for p in per_client), max(p["wer_1best"] for p in per_client)],
        "zipf_devices": len(devices),
        "zipf_largest_device": max(len(c) for c in devices),
        "timings": timings,
    }


def best_line(metrics: dict[str, Any]) -> str:
    """The demo's headline: the system best on the dev clients, its dev and test WER, against the first pass.

    >>> print(best_line({"wer_system": "n-gram rescoring", "wer_dev": 0.2, "wer": 0.15, "wer_baseline": 0.16,
    ...                  "wer_baseline_system": "first-pass 1-best"}))
    best on the dev clients: n-gram rescoring (dev WER 20.00%); test WER 15.00% against the first-pass 1-best's 16.00%
    """
    one, best = metrics["wer_baseline"], metrics["wer"]
    if metrics["wer_system"] == metrics["wer_baseline_system"]:
        return (f"no method beats the {metrics['wer_baseline_system']} on the dev clients (dev WER "
                f"{100 * metrics['wer_dev']:.2f}%); its test WER {100 * one:.2f}%")
    return (f"best on the dev clients: {metrics['wer_system']} (dev WER {100 * metrics['wer_dev']:.2f}%); test WER "
            f"{100 * best:.2f}% against the {metrics['wer_baseline_system']}'s {100 * one:.2f}%")


def _best_sentence(metrics: dict[str, Any]) -> str:
    """:func:`best_line` as a report sentence (the system chosen on dev, never on test)."""
    line = best_line(metrics)
    return line[0].upper() + line[1:] + ". The choice is made on the dev clients only; the test clients are scored once."


def _report(out: Path, seed: int, preset: str, stats: dict[str, Any], rows: list[dict[str, Any]],
            first: _FirstPass, ngram: _Method, fmp: _Method, fedlm: dict[str, Any] | None,
            ftl: dict[str, Any] | None, anon: dict[str, Any], views: dict[str, Any], metrics: dict[str, Any],
            ) -> str:
    """``report.md``: the corpus, the WER table with its significance tests, then one section per method."""
    sig, boot, sig_ngram, sig_fmp = first.sig, first.boot, ngram.sig, fmp.sig
    return "\n".join([
        "# privasr demo report",
        "",
        f"privasr {__version__}, seed {seed}, preset `{preset}`. Regenerate with "
        f"`privasr demo --out {out} --seed {seed} --preset {preset}`.",
        "",
        "## Corpus",
        "",
        f"Synthetic federated corpus in `{out / 'corpus'}`: {stats['dev']['utterances']} dev and "
        f"{stats['test']['utterances']} test utterances, {stats['dev']['clients']} dev and "
        f"{stats['test']['clients']} test clients, {stats['test']['hyps_per_utt']:.1f} hypotheses per utterance.",
        "",
        "## WER on the test clients",
        "",
        systems_table(rows),
        "",
        _best_sentence(metrics),
        "",
        f"MAPSSWE, 1-best vs oracle: {sig.n} segments, Z = {sig.z:.3f}, p = {sig.p:.3g}. "
        f"Paired bootstrap 95% interval of WER(N-best oracle) - WER(first-pass 1-best): "
        f"[{100 * boot.ci_low:+.2f}, {100 * boot.ci_high:+.2f}] points.",
        f"MAPSSWE, n-gram rescoring vs 1-best: Z = {sig_ngram.z:.3f}, p = {sig_ngram.p:.3g}; weights tuned on the dev "
        f"clients: {ngram.info['weights']}.",
        f"MAPSSWE, FMP vs n-gram rescoring: Z = {sig_fmp.z:.3f}, p = {sig_fmp.p:.3g} (clients send only sparse "
        "kernel-weighted word counts; the trigram stands in for the NNLM).",
        *([] if fedlm is None else _fedlm_report(out, fedlm)),
        *([] if ftl is None else _ftl_report(out, ftl)),
        *_anon_report(out, anon),
        "",
        "## Federated views of the test clients",
        "",
        f"- Time-ordered rounds (T = 2, three groups per client), group sizes of the first clients: "
        f"{views['rounds'][:5]}",
        f"- Zipf device simulation ({views['device_ids']} device ids, exponent 1.0): "
        f"{len(views['devices'])} non-empty devices, the largest holding {metrics['zipf_largest_device']} "
        "utterances.",
        f"- Per-client 1-best WER ranges from {_pct(metrics['per_client_wer_range'][0])}% to "
        f"{_pct(metrics['per_client_wer_range'][1])}%.",
        "",
        "## Timings",
        "",
        *[f"- {k}: {v:.2f}" for k, v in metrics["timings"].items()],
        "",
        "## Next: real data",
        "",
        "The main real N-best set is `../shared/data/ami-tts-nbest-adapted` (AMI meetings spoken by espeak-ng, "
        "decoded after MAP-adapting the acoustic model to the voices: 20.2% test 1-best WER, the papers' "
        "regime). Every paper's experiment has a config for it, `configs/*-adapted.yaml`, e.g. "
        "`privasr fmp run --config configs/fmp-ami-adapted.yaml --out runs/fmp-ami-adapted`; "
        "`privasr data tts-nbest` rebuilds such a set from your own transcripts and LM "
        "(docs/asr.md, docs/results.md).",
        "",
    ])


def _fedlm_report(out: Path, fedlm: dict[str, Any]) -> list[str]:
    return [
        f"Federated NNLM fine-tuning (`{out / 'fedlm'}`, paper 001): the dev clients fine-tune a tiny "
        f"transformer on their own 1-best weighted by the per-word confidences; test perplexity "
        f"{fedlm['ppl_baseline']:.1f} -> {fedlm['ppl']:.1f} (all utterances, unweighted: "
        f"{fedlm['ppl_all_utts']:.1f}); MAPSSWE fine-tuned vs tiny-NNLM rescoring: p = {fedlm['mapsswe_p']:.3g}."]


def _ftl_report(out: Path, ftl: dict[str, Any]) -> list[str]:
    long_system, long_baseline = ftl["wer_system"], ftl["wer_baseline_system"]
    # named in full once, then by the part before the parenthesis ("FTL", "FedAvg")
    system, baseline = long_system.split(" (")[0], long_baseline.split(" (")[0]
    r, rb = ftl["rounds_to_target"], ftl["rounds_to_target_baseline"]

    def when(k: int | None) -> str:
        return f"not within {ftl['rounds']} rounds" if k is None else f"at round {k}"

    sig = {"system": f"{system} is better", "baseline": f"{baseline} is better"}.get(
        str(ftl["mapsswe_better"]), "no significant difference")
    return [
        "",
        "## Federated acoustic-model training (paper 002)",
        "",
        f"`{out / 'ftl'}`: a tiny CTC model seeded on {ftl['server_speakers']} synthetic server speakers, then "
        f"trained by {ftl['client_speakers']} client speakers for {ftl['rounds']} rounds (5 sampled with replacement "
        f"per round), by {long_system} and by {long_baseline} from the same seed model.",
        "",
        f"What FTL is for is reaching a good model in fewer rounds. Target validation loss "
        f"{ftl['target_loss']:.4f} ({100 * (1 - _FTL_TARGET):.0f}% below the seed model's; neither run decides it): {system} reaches it "
        f"{when(r)}, {baseline} {when(rb)}. Validation loss {ftl['valid_loss_seed']:.4f} (seed model) -> "
        f"{ftl['valid_loss']:.4f} ({system}) vs {ftl['valid_loss_baseline']:.4f} ({baseline}).",
        "",
        f"Test ({ftl['test_utterances']} utterances of {ftl['test_speakers']} unseen speakers): WER "
        f"{_pct(ftl['wer_seed'])}% (seed model) -> {_pct(ftl['wer'])}% ({system}) vs {_pct(ftl['wer_baseline'])}% "
        f"({baseline}); CER {_pct(ftl['cer_seed'])}% -> {_pct(ftl['cer'])}% vs {_pct(ftl['cer_baseline'])}%. "
        f"MAPSSWE: {sig} (p = {ftl['mapsswe_p']:.3g}).",
        *([] if ftl["wer"] <= min(ftl["wer_baseline"], ftl["wer_seed"]) else [
            "",
            f"FTL does not help on test WER in this run: its WER is above "
            f"{baseline if ftl['wer'] > ftl['wer_baseline'] else 'the seed model'}'s. The demo shows the mechanics "
            "(seed model, client rounds, server optimiser, weighting) on synthetic speech; docs/results.md, "
            "\"Federated acoustic-model training\", has the runs on real speech."])]


def _anon_report(out: Path, anon: dict[str, Any]) -> list[str]:
    return [
        "",
        "## Anonymised transcripts (paper 003)",
        "",
        f"`{out / 'anon'}`: the dev and test clients' references with their named entities found by the NER "
        f"({anon['detector']}, clients as documents) and replaced by same-type surrogates (consistent within a "
        f"client) or class tags. Against the gold personal entities of the test clients ({anon['mentions']} "
        f"PER/ORG/LOC mentions): PER recall {anon['per_recall']:.3f}, precision {anon['per_precision']:.3f}; "
        f"leak rate {anon['leak_rate']:.3f}; {anon['name_tokens_left']} of the {anon['name_tokens_before']} "
        "occurrences of gold entity words are left in the anonymised text (some, such as company suffixes, are "
        "also ordinary words). Trigram on background + dev transcripts, perplexity of the test "
        f"references: {anon['ppl_original']:.1f} trained on the original text, {anon['ppl_anonymized']:.1f} on the "
        "anonymised text.",
    ]


def run_demo(out: str | Path, *, seed: int = 0, preset: str = "small") -> dict[str, Any]:
    """Generate the corpus into ``out/corpus`` and write ``out/results.json`` and ``out/report.md``.

    The stages (each timed): generate the corpus, read it back, score the first pass, n-gram rescoring, FMP,
    federated NNLM fine-tuning, federated transfer learning, anonymisation; then the federated views, the
    metrics and the report.
    """
    from privasr.synth import SynthConfig, generate

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    clock = _Clock()
    with clock("synth_s"):
        manifest = generate(SynthConfig.preset(preset, seed=seed)).write(out / "corpus")
    with clock("stats_s"):
        dev, test, stats = _read_corpus(out / "corpus")
    with clock("scoring_s"):
        first = _first_pass(test, seed)
    with clock("ngram_rescoring_s"):
        ngram = _ngram_stage(out / "corpus", dev, test, first)
    with clock("fmp_s"):
        fmp = _fmp_stage(out / "corpus", dev, test, first, ngram, seed)
    with clock("fedlm_s"):
        fedlm = _fedlm(out, seed)
    with clock("ftl_s"):
        ftl = _ftl(out, seed)
    with clock("anon_s"):
        anon = _anon(out, seed)
    views = _federated_views(test, seed)
    _client_wers(views["per_client"], test, {"ngram_rescoring": ngram.wer, "fmp": fmp.wer,
                                             "oracle": first.oracle_wer})
    metrics = _metrics(first, ngram, fmp, fedlm, ftl, anon, views, dev, test, clock.timings)
    rows = _systems_rows(first, ngram, fmp, fedlm)
    write_results(out, runner="demo", config={"preset": preset, "synth": manifest.get("config", {})}, seed=seed,
                  metrics=metrics, data={"corpus": out / "corpus"},
                  extra={"stats": stats, "per_client": views["per_client"], "systems": rows})
    report = _report(out, seed, preset, stats, rows, first, ngram, fmp, fedlm, ftl, anon, views, metrics)
    (out / "report.md").write_text(report + plots_section(out), encoding="utf-8")
    return metrics
