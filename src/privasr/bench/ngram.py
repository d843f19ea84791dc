"""N-gram benchmark: modified Kneser-Ney training and ARPA queries against KenLM and IRSTLM.

Measured in one run (``privasr bench ngram --out DIR``), each metric next to its baseline:

* ``max_abs_logprob_diff_vs_kenlm``: largest difference of a log10 probability or backoff between our AMI
  models (orders 3 and 5) and the golden ``lmplz`` ARPA files (the n-gram sets must be identical, or the metric
  is ``inf``); ``ppl_ratio_vs_kenlm``: our AMI dev perplexity (OOVs scored as ``<unk>``, as KenLM ``query``
  counts them) over the golden one, for the 3-gram (``_o5`` for the 5-gram);
* ``train_speed_vs_irstlm``: our training tokens/s over IRSTLM's (``tlm -lm=ikn``, its modified/"improved"
  Kneser-Ney, interpolated, no singleton pruning, after ``add-start-end.sh``), both from text file to ARPA file
  in a fresh process, on the Gutenberg corpus (3-gram; ``_o5`` too), else on AMI;
* ``train_speed_vs_lmplz``: our Gutenberg tokens/s over lmplz's from the golden timing anchors (lmplz was timed
  at nice 19 on a loaded machine, so its figure is an upper bound on its time: the ratio flatters us);
* ``query_speed_vs_kenlm``: words/s of :meth:`NgramModel.score_totals` (sentence totals, what rescoring needs)
  over all AMI dev sentences at once over the ``kenlm`` module's ``Model.score`` per sentence, on the same golden
  3-gram ARPA; ``_score_batch`` builds full :class:`SentenceScore` objects, ``_nbest10`` scores batches of 10
  sentences (an N-best list), ``_stateful`` uses :meth:`NgramModel.advance` word by word against ``kenlm``'s
  ``BaseScore`` with states. Every query path runs once per round, interleaved with KenLM's, for 7 rounds; each
  keeps its best round (a noisy machine slows rounds, not paths). ``query_engine`` names the query path
  measured (``compiled``: the C extension; ``numpy``: the fallback of installs without a C compiler); with the
  compiled engine, ``_numpy`` ratios give the fallback's speed on the same queries; ``query_first_call_s`` is
  the first query's time (it builds the engine's hash tables);
* absolute figures: training seconds, tokens/s and peak RSS (``VmHWM`` of the training process; ``/usr/bin/time %M`` for IRSTLM) for AMI and
  Gutenberg, 3- and 5-grams.

Any part whose tool or data is missing is left out and the reason is recorded under ``skipped``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from privasr.bench import best_of, best_of_interleaved
from privasr.paths import data_dir, golden_dir
from privasr.results import write_results

__all__ = ["run", "gutenberg_lines", "irstlm_bin"]

GUTENBERG_MD5 = "04259d64f4917f0130ae136d914eb740"

_TRAIN_CODE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from privasr.lm.ngram.arpa import write_arpa
from privasr.lm.ngram.counts import read_sentences
from privasr.lm.ngram.mkn import estimate_mkn
t1 = time.perf_counter()
def hwm():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
rss0 = hwm()
sents = list(read_sentences(sys.argv[1]))
t2 = time.perf_counter()
res = estimate_mkn(sents, int(sys.argv[2]))
t3 = time.perf_counter()
del sents
write_arpa(res.model, sys.argv[3])
t4 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "read_s": t2 - t1, "estimate_s": t3 - t2, "write_s": t4 - t3,
                  "text_to_arpa_s": t4 - t1, "tokens": res.tokens,
                  "ngrams": list(res.ngram_counts), "baseline_rss_kb": rss0,
                  "peak_rss_kb": hwm()}))
"""


def gutenberg_lines(archive: Path) -> list[str]:
    """The Gutenberg LM text exactly as the golden README's "timing anchors" describe it.

    17 books in file-name order; each book's first line (the title) dropped; every other line lowercased, split on
    whitespace, punctuation-only tokens (no alphanumeric character) dropped, kept if anything is left.
    """
    lines: list[str] = []
    with tarfile.open(archive) as tf:
        members = sorted((m for m in tf.getmembers() if m.isfile()), key=lambda m: m.name)
        for m in members:
            f = tf.extractfile(m)
            if f is None:
                continue
            for line in f.read().decode("utf-8").splitlines()[1:]:
                toks = [t for t in line.lower().split() if any(ch.isalnum() for ch in t)]
                if toks:
                    lines.append(" ".join(toks))
    return lines


def irstlm_bin() -> Path | None:
    """Folder of IRSTLM's binaries (``tlm``, ``add-start-end.sh``), or ``None`` when it is not installed."""
    for cand in [os.environ.get("IRSTLM", ""), "/usr/lib/irstlm"]:
        if cand and (Path(cand) / "bin" / "tlm").is_file():
            return Path(cand) / "bin"
    found = shutil.which("tlm")
    return Path(found).parent if found else None


def _vmhwm_kb(pid: int | str = "self") -> int:
    """Peak resident set (``VmHWM``, kB) of a live process; -1 where ``/proc`` has no such figure."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _run_child(cmd: list[str], **kw: Any) -> tuple[float, int]:
    """Run ``cmd`` (output discarded); return (wall seconds, peak RSS in kB of that program).

    The peak comes from GNU ``/usr/bin/time -f %M`` when it exists (``ru_maxrss`` seen from a parent that is
    itself small; a child forked straight from this big Python process would inherit its high-water mark across
    ``exec``), else from polling the child's ``VmHWM``.
    """
    gnu_time = Path("/usr/bin/time")
    with tempfile.TemporaryDirectory() as td:
        errf = Path(td) / "err"
        memf = Path(td) / "mem"
        use_time = gnu_time.is_file()
        full = [str(gnu_time), "-f", "%M", "-o", str(memf), *cmd] if use_time else cmd
        peak = -1
        with open(errf, "wb") as err:
            t0 = time.perf_counter()
            p = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=err, **kw)
            while p.poll() is None:
                if not use_time:
                    peak = max(peak, _vmhwm_kb(p.pid))
                time.sleep(0.01)
            wall = time.perf_counter() - t0
        if p.returncode:
            raise RuntimeError(f"{cmd[0]} failed ({p.returncode}): {errf.read_bytes().decode(errors='replace')[-500:]}")
        if use_time:
            try:
                peak = int(memf.read_text().split()[-1])
            except (OSError, ValueError, IndexError):
                peak = -1
    return wall, peak


def _ours(text: Path, order: int, arpa: Path, repeats: int) -> dict[str, Any]:
    """Train in a fresh process ``repeats`` times; the fastest run's figures (and the largest peak RSS)."""
    best: dict[str, Any] | None = None
    peak = 0
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    for _ in range(repeats):
        res = subprocess.run([sys.executable, "-c", _TRAIN_CODE, str(text), str(order), str(arpa)],
                             capture_output=True, text=True, env=env, check=False)
        if res.returncode:
            raise RuntimeError(f"training failed: {res.stderr[-1000:]}")
        r = json.loads(res.stdout.strip().splitlines()[-1])
        peak = max(peak, r["peak_rss_kb"])
        if best is None or r["text_to_arpa_s"] < best["text_to_arpa_s"]:
            best = r
    assert best is not None
    best["peak_rss_kb_max"] = peak
    best["tokens_per_s"] = best["tokens"] / best["text_to_arpa_s"]
    return best


def _irstlm(bindir: Path, text: Path, order: int, tmp: Path, repeats: int) -> dict[str, Any]:
    """``add-start-end.sh < text > se; tlm -tr=se -n=N -lm=ikn -bo=no -ps=no -o=out.arpa``: best wall time."""
    env = dict(os.environ, IRSTLM=str(bindir.parent))
    best = None
    peak = 0
    for _ in range(repeats):
        se = tmp / "irst_se.txt"
        out = tmp / f"irst.o{order}.arpa"
        out.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with open(text, "rb") as fin, open(se, "wb") as fout:
            subprocess.run([str(bindir / "add-start-end.sh")], stdin=fin, stdout=fout, env=env, check=True)
        t_se = time.perf_counter() - t0
        wall, rss = _run_child([str(bindir / "tlm"), f"-tr={se}", f"-n={order}", "-lm=ikn", "-bo=no", "-ps=no",
                                   f"-o={out}"], env=env)
        total = t_se + wall
        peak = max(peak, rss)
        if best is None or total < best["text_to_arpa_s"]:
            best = {"add_start_end_s": t_se, "tlm_s": wall, "text_to_arpa_s": total}
    assert best is not None
    best["peak_rss_kb"] = peak
    best["command"] = (f"IRSTLM={bindir.parent} add-start-end.sh < TEXT > SE; "
                       f"tlm -tr=SE -n={order} -lm=ikn -bo=no -ps=no -o=OUT.arpa")
    return best


def _max_diff(ours: Any, ref: Any) -> float:
    worst = 0.0
    for n in range(1, ref.order + 1):
        ia, pa, ba = ours.arrays(n)
        ib, pb, bb = ref.arrays(n)
        if ia.shape != ib.shape or not np.array_equal(ia, ib):
            return float("inf")
        worst = max(worst, float(np.abs(pa - pb).max()), float(np.abs(ba - bb).max()))
    return worst


_QUERY_ROUNDS = 7  # the query timings are short: every path runs once per round, interleaved, best round kept


def _query(metrics: dict[str, Any], skipped: dict[str, str], arpa: Path, dev: list[list[str]]) -> None:
    from privasr.lm.ngram import model as model_mod
    from privasr.lm.ngram.arpa import read_arpa

    model = read_arpa(arpa)
    words = sum(len(s) + 1 for s in dev)
    sub = dev[:1000]
    sub_words = sum(len(s) + 1 for s in sub)
    metrics["query_engine"] = model_mod.QUERY_ENGINE
    t0 = time.perf_counter()
    model.score_totals(dev[:1])  # builds the compiled engine's tables
    metrics["query_first_call_s"] = time.perf_counter() - t0

    def stateful() -> float:
        tot = 0.0
        for s in sub:
            st = model.begin_state()
            for w in [*s, "</s>"]:
                lp, st = model.advance(st, w)
                tot += lp
        return tot

    def nbest10(m: Any) -> list[Any]:
        return [m.score_totals(dev[i:i + 10]) for i in range(0, len(dev), 10)]

    paths: dict[str, Callable[[], Any]] = {
        "batch": lambda: model.score_totals(dev), "objs": lambda: model.score_batch(dev),
        "n10": lambda: nbest10(model), "state": stateful}
    if model_mod._Engine is not None:  # the fallback, for the record (what an install without a compiler gets)
        plain = model._numpy_twin()
        paths.update(numpy=lambda: plain.score_totals(dev), nbest10_numpy=lambda: nbest10(plain))
    try:
        import kenlm  # type: ignore[import-not-found]
    except ImportError as e:
        kenlm = None
        skipped["query_speed_vs_kenlm"] = f"the kenlm Python module is not importable ({e})"
    if kenlm is not None:
        km = kenlm.Model(str(arpa))
        lines = [" ".join(s) for s in dev]

        def k_state() -> float:
            tot = 0.0
            a, b = kenlm.State(), kenlm.State()
            for s in sub:
                km.BeginSentenceWrite(a)
                for w in [*s, "</s>"]:
                    tot += km.BaseScore(a, w, b)
                    a, b = b, a
            return tot

        paths.update(kenlm=lambda: [km.score(x, bos=True, eos=True) for x in lines], kenlm_state=k_state)
    best, out = best_of_interleaved(paths, _QUERY_ROUNDS)
    metrics.update(query_words=words, query_words_per_s=words / best["batch"],
                   query_score_batch_words_per_s=words / best["objs"], query_nbest10_words_per_s=words / best["n10"],
                   query_stateful_words_per_s=sub_words / best["state"])
    if kenlm is None:
        return
    t_k = best["kenlm"]
    metrics.update(kenlm_query_words_per_s=words / t_k, kenlm_stateful_words_per_s=sub_words / best["kenlm_state"],
                   query_speed_vs_kenlm=t_k / best["batch"], query_speed_score_batch_vs_kenlm=t_k / best["objs"],
                   query_speed_nbest10_vs_kenlm=t_k / best["n10"],
                   query_speed_stateful_vs_kenlm=best["kenlm_state"] / best["state"],
                   query_max_abs_sentence_diff_vs_kenlm_module=float(
                       np.abs(out["batch"][0] - np.asarray(out["kenlm"])).max()),
                   **{f"query_speed_{k}_vs_kenlm": t_k / best[k] for k in ("numpy", "nbest10_numpy") if k in best})


def _ami(kdir: Path, repeats: int, metrics: dict[str, Any], skipped: dict[str, str]) -> None:
    """AMI: our 3- and 5-gram against the golden lmplz ARPA files (exactness, perplexity, estimation speed),
    then the query speed (:func:`_query`)."""
    from privasr.lm.ngram.arpa import read_arpa
    from privasr.lm.ngram.counts import read_sentences
    from privasr.lm.ngram.mkn import estimate_mkn

    summary = json.loads((kdir / "summary.json").read_text())
    sents = list(read_sentences(kdir / "ami_train.txt.xz"))
    dev = list(read_sentences(kdir / "ami_dev.txt.xz"))
    diffs = {}
    for order in (3, 5):
        t_est, res = best_of(lambda o=order: estimate_mkn(sents, o), repeats)
        ref = read_arpa(kdir / f"ami_train.o{order}.arpa.xz")
        diffs[order] = _max_diff(res.model, ref)
        scores = res.model.score_batch(dev)
        tokens = sum(len(s.tokens) for s in scores)
        ppl = 10 ** (-sum(s.total() for s in scores) / tokens)
        gold_ppl = summary["models"][f"o{order}"]["dev"]["query_ppl_incl_oov"]
        sfx = "" if order == 3 else "_o5"
        metrics[f"ppl_ratio_vs_kenlm{sfx}"] = ppl / gold_ppl
        metrics[f"max_abs_logprob_diff_vs_kenlm_o{order}"] = diffs[order]
        metrics[f"ami_dev_ppl_incl_oov_o{order}"] = ppl
        metrics[f"ami_o{order}_estimate_s"] = t_est
        metrics[f"ami_o{order}_estimate_tokens_per_s"] = res.tokens / t_est
    metrics["max_abs_logprob_diff_vs_kenlm"] = max(diffs.values())
    _query(metrics, skipped, kdir / "ami_train.o3.arpa.xz", dev)


def _training_corpus(gold: Path | None, kdir: Path | None, tmp: Path, skipped: dict[str, str],
                     details: dict[str, Any], data: dict[str, Any]) -> tuple[Path | None, str, Any]:
    """The training-speed corpus written to ``tmp`` (Gutenberg, else AMI, else ``None``), its name, and the
    lmplz timing anchors (``None``: absent)."""
    ddir = data_dir()
    archive = ddir / "gutenberg" / "gutenberg17_tokenized.tar.xz" if ddir is not None else None
    if archive is not None and archive.is_file():
        lines = gutenberg_lines(archive)
        text = "\n".join(lines) + "\n"
        md5 = hashlib.md5(text.encode("utf-8")).hexdigest()
        details["gutenberg"] = {"lines": len(lines), "tokens": sum(len(x.split()) for x in lines), "md5": md5,
                                "md5_matches_golden": md5 == GUTENBERG_MD5}
        corpus = tmp / "gut_lm.txt"
        corpus.write_text(text, encoding="utf-8")
        data["gutenberg"] = archive
        if gold is not None and (gold / "kenlm-mkn" / "summary.json").is_file():
            return corpus, "gutenberg", \
                json.loads((gold / "kenlm-mkn" / "summary.json").read_text())["gutenberg_timing"]["results"]
        skipped["train_speed_vs_lmplz"] = "../shared/golden (lmplz timing anchors) is absent"
        return corpus, "gutenberg", None
    if kdir is not None:
        corpus = tmp / "ami_train.txt"
        corpus.write_bytes(__import__("lzma").open(kdir / "ami_train.txt.xz").read())
        skipped["train_speed_vs_lmplz"] = "the Gutenberg corpus (../shared/data/gutenberg) is absent"
        return corpus, "ami", None
    skipped["train_speed_vs_irstlm"] = "no training corpus (../shared absent)"
    skipped["train_speed_vs_lmplz"] = "no training corpus (../shared absent)"
    return None, "", None


def _training_speed(corpus: Path, name: str, lmplz: Any, bindir: Path | None, tmp: Path, repeats: int,
                    metrics: dict[str, Any], skipped: dict[str, str], details: dict[str, Any]) -> None:
    """Text file to ARPA file in a fresh process, 3- and 5-gram: ours against lmplz's anchors and IRSTLM."""
    for order in (3, 5):
        sfx = "" if order == 3 else "_o5"
        ours = _ours(corpus, order, tmp / f"ours.o{order}.arpa", repeats)
        details[f"{name}_o{order}_ours"] = ours
        metrics[f"{name}_o{order}_train_s"] = ours["text_to_arpa_s"]
        metrics[f"{name}_o{order}_train_tokens_per_s"] = ours["tokens_per_s"]
        metrics[f"{name}_o{order}_train_peak_rss_kb"] = ours["peak_rss_kb_max"]
        metrics[f"{name}_o{order}_python_baseline_rss_kb"] = ours["baseline_rss_kb"]
        if lmplz is not None:
            ref = lmplz[f"o{order}"]
            metrics[f"train_speed_vs_lmplz{sfx}"] = ours["tokens_per_s"] / ref["tokens_per_s_at_median_wall"]
            metrics[f"peak_rss_vs_lmplz{sfx}"] = ours["peak_rss_kb_max"] / ref["peak_rss_kb_max"]
        if bindir is None:
            skipped[f"train_speed_vs_irstlm{sfx}"] = "IRSTLM (tlm) is not installed (apt-get install irstlm)"
            continue
        irst = _irstlm(bindir, corpus, order, tmp, repeats)
        details[f"{name}_o{order}_irstlm"] = irst
        metrics[f"{name}_o{order}_irstlm_s"] = irst["text_to_arpa_s"]
        metrics[f"{name}_o{order}_irstlm_peak_rss_kb"] = irst["peak_rss_kb"]
        metrics[f"train_speed_vs_irstlm{sfx}"] = irst["text_to_arpa_s"] / ours["text_to_arpa_s"]
    details["train_corpus"] = name


def run(out: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Measure and write ``out/results.json``; return the metrics."""
    repeats = 1 if quick else 3
    metrics: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    details: dict[str, Any] = {}
    data: dict[str, Any] = {}
    gold = golden_dir()
    kdir = gold / "kenlm-mkn" if gold is not None else None
    if kdir is not None and not (kdir / "ami_train.txt.xz").is_file():
        kdir = None
    bindir = irstlm_bin()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        if kdir is None:
            for k in ("max_abs_logprob_diff_vs_kenlm", "ppl_ratio_vs_kenlm", "query_speed_vs_kenlm"):
                skipped[k] = "../shared/golden/kenlm-mkn is absent"
        else:
            data["ami_train"] = kdir / "ami_train.txt.xz"
            _ami(kdir, repeats, metrics, skipped)
        corpus, name, lmplz = _training_corpus(gold, kdir, tmp, skipped, details, data)
        if corpus is not None:
            _training_speed(corpus, name, lmplz, bindir, tmp, repeats, metrics, skipped, details)
    config = {"benchmark": "ngram", "repeats": repeats, "quick": quick,
              "ours": "privasr estimate_mkn in a fresh python process: read text, estimate, write ARPA",
              "irstlm": None if bindir is None else "add-start-end.sh + tlm -lm=ikn -bo=no -ps=no (interpolated "
              "improved/modified Kneser-Ney, no singleton pruning), text to ARPA",
              "kenlm_query": "kenlm.Model(arpa).score(line, bos=True, eos=True) per sentence"}
    write_results(out, config=config, seed=seed, metrics=metrics, data=data,
                  extra={"skipped": skipped, "details": details})
    return metrics
