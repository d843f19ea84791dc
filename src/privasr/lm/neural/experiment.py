"""Perplexity comparisons of neural and n-gram LMs on the same tokens (for the experiments in docs/results.md).

Two figures per model, over the same sentences, each with ``</s>`` counted as a token:

* ``ppl_unk``: every token scored, words outside the model's vocabulary as its ``<unk>`` (what rescoring
  uses; depends on each model's vocabulary, so models with different vocabularies see different events);
* ``ppl_shared``: only the tokens whose word is in the **reference vocabulary** (normally the n-gram's, i.e.
  every training word) are counted, for every model alike, so all models are scored on exactly the same
  tokens. A neural model with a ``min_count`` cut-off still predicts its rarer in-reference words as
  ``<unk>`` (the probability of the whole class of rare words), which flatters it a little; the figure
  says so with ``neural_unk_tokens``.

>>> from privasr.lm.ngram.tables import synthetic_model
>>> m = synthetic_model(2, 4)
>>> r = compare_ppl({"ng": m}, [["w0", "w1"], ["w2", "zz"]], reference_vocab=m.vocab)
>>> r["ng"]["tokens_shared"], r["ng"]["tokens_all"]
(5, 6)
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from privasr.lm.base import EOS, LanguageModel

__all__ = ["compare_ppl"]


def compare_ppl(lms: Mapping[str, LanguageModel], sentences: Sequence[Sequence[str]],
                reference_vocab: Collection[str], *, batch: int = 2048) -> dict[str, dict[str, Any]]:
    """``{name: {ppl_unk, ppl_shared, tokens_all, tokens_shared, oov_tokens, neural_unk_tokens}}``
    (see the module docstring)."""
    sents = [tuple(s) for s in sentences]
    ref = set(reference_vocab)
    keep = np.array([w in ref for s in sents for w in (*s, EOS)], dtype=bool)
    out: dict[str, dict[str, Any]] = {}
    for name, lm in lms.items():
        lps = []
        oovs = []
        for i in range(0, len(sents), batch):
            for sc in lm.score_batch(sents[i:i + batch]):
                lps.append(sc.logprobs)
                oovs.append(sc.oov)
        lp = np.concatenate(lps) if lps else np.zeros(0)
        oov = np.concatenate(oovs) if oovs else np.zeros(0, dtype=bool)
        n_all = len(lp)
        n_sh = int(keep.sum())
        out[name] = {
            "ppl_unk": float(10.0 ** (-lp.sum() / n_all)) if n_all else math.nan,
            "ppl_shared": float(10.0 ** (-lp[keep].sum() / n_sh)) if n_sh else math.nan,
            "tokens_all": n_all, "tokens_shared": n_sh, "oov_tokens": int(oov.sum()),
            "neural_unk_tokens": int((oov & keep).sum()),
        }
    return out


def ami_approx_experiment(checkpoint: str, mkn_arpa: str, out_dir: str, *, order: int = 3,
                          topk: int = 0) -> dict[str, Any]:
    """The AMI perplexity table of docs/results.md: the MKN n-gram, the NNLM, its n-gram approximation on AMI
    train (:func:`~privasr.lm.neural.approx.approximate_ngram`) and the MKN n-gram set with neural probabilities
    (:func:`~privasr.lm.neural.approx.overwrite_ngram`), on the AMI test transcripts; writes ``approx.arpa``,
    ``overwrite.arpa`` and ``ppl.json`` to ``out_dir`` and returns the JSON.

    ``python -c "from privasr.lm.neural.experiment import ami_approx_experiment as e; e(CKPT, ARPA, OUT)"``
    """
    import json
    import time
    from pathlib import Path

    from privasr.corpus.sources import ami_sentences
    from privasr.lm.neural.approx import ApproxStats, approximate_ngram, check_normalised, overwrite_ngram
    from privasr.lm.neural.scorer import NeuralLM
    from privasr.lm.ngram.model import NgramModel

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = ami_sentences("train"), ami_sentences("test")
    nn = NeuralLM.from_checkpoint(checkpoint)
    mkn = NgramModel.from_arpa(mkn_arpa)
    res: dict[str, Any] = {"checkpoint": str(checkpoint), "mkn": str(mkn_arpa), "order": order, "topk": topk}
    st_a, st_o = ApproxStats(), ApproxStats()
    approx = approximate_ngram(nn, train, order, topk=topk, stats=st_a)
    approx.write_arpa(out / "approx.arpa")
    over = overwrite_ngram(nn, mkn, train, stats=st_o)
    over.write_arpa(out / "overwrite.arpa")
    for name, m, st in (("approx", approx, st_a), ("overwrite", over, st_o)):
        t0 = time.perf_counter()
        res[name] = {"ngrams": list(st.ngrams), "seconds": st.total_s, "neural_s": st.neural_s,
                     "max_norm_error": check_normalised(m), "check_s": 0.0}
        res[name]["check_s"] = time.perf_counter() - t0
    res["ppl_ami_test"] = compare_ppl({"mkn": mkn, "nnlm": nn, "approx": approx, "overwrite": over}, test,
                                      reference_vocab=mkn.vocab)
    (out / "ppl.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return res
