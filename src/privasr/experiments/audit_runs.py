"""The audits of *finished* runs behind ``privasr audit`` (issue 22): what a run's released artefact tells anyone
who holds it about the data it was trained on.

* :func:`audit_fmp_checkpoint` (section ``fmp_checkpoint``): a finished ``privasr fmp run``'s released running
  sum (``checkpoint/state.npz``) against its clients' words. Words exactly one client used are members, words
  no client used are non-members, and the score is the word's released count.
* :func:`audit_fedlm_checkpoint` (section ``fedlm_checkpoint``): a finished ``privasr fedlm run``'s released
  model (``model.pt``) against its clients' sentences. The members are the distinct sentences the clients
  trained on; the non-members are the distinct sentences of the run's held-out data, of the same kind (the
  first pass's words of the test lists or evaluation calls; references with ``client_text: reference``), a
  sentence found in both sets dropped from both. Two loss attacks score each sentence:

  * ``loss``: its negative log-perplexity under the released model (Yeom et al.: members fit better);
  * ``loss_drop``: its log-perplexity under the model the server started from minus that under the released
    model (a reference-calibrated attack, as in Carlini et al.'s LiRA and Mireshghallah et al.'s
    likelihood-ratio attacks on LMs: the server holds the starting model, so this is what it can compute).
    It cancels how easy a sentence is for any model, leaving what fine-tuning did to it.

  Each gets its ROC AUC and the true-positive rate at 1% and 10% false positives.

In both, the members are the data's own, not randomised canaries: members and non-members differ in more than
membership (other meetings, other words), so these numbers measure the attack and are *not* an epsilon bound
(the randomised games of the ``fmp`` and ``fedlm`` sections are). A sentence a client repeated, or a word in k
of its utterances, is covered by the run's guarantee only at its unit (a client's whole data for fedlm's
client-level DP; k times an utterance-level epsilon for FMP).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from privasr.config import setting
from privasr.errors import InputError

__all__ = ["FmpCheckpointSettings", "FedlmCheckpointSettings", "audit_fmp_checkpoint", "audit_fedlm_checkpoint",
           "fmp_checkpoint_report", "fedlm_checkpoint_report", "roc_points", "roc_summary"]

FPR_POINTS = (0.01, 0.1)
"""The false-positive rates at which the true-positive rate of a loss attack is reported."""
ROC_POINTS = 100
"""The most points of a ROC curve that results.json keeps (for its plot)."""


@dataclass(frozen=True)
class FmpCheckpointSettings:
    """The ``fmp_checkpoint`` section: ``run``, the output folder of a finished ``privasr fmp run``
    (``results.json`` and ``checkpoint/state.npz``)."""

    run: str = setting("", exists=True)


@dataclass(frozen=True)
class FedlmCheckpointSettings:
    """The ``fedlm_checkpoint`` section: ``run``, the output folder of a finished ``privasr fedlm run``
    (``results.json`` and ``model.pt``); ``max_sentences``: at most this many members and as many non-members
    are scored (a seeded random subset; ``null``: all)."""

    run: str = setting("", exists=True)
    max_sentences: int | None = setting(5000, min=10)


def _drop_none(v: Any) -> Any:
    """A config as results.json wrote it, without its unset (``None``) keys: the schema's defaults again.

    >>> _drop_none({"a": None, "b": {"c": None, "d": 1}})
    {'b': {'d': 1}}
    """
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    return v


def _finished(run: Path, command: str, artefact: str) -> dict[str, Any]:
    """The run's results.json, after checking the run's artefact is there."""
    try:
        res = json.loads((run / "results.json").read_text(encoding="utf-8"))
        if not (run / artefact).is_file() or not isinstance(res.get("config"), dict):
            raise ValueError(f"no {artefact}")
    except (OSError, ValueError) as e:
        raise InputError(f"{run} is not a finished `{command}` ({e})",
                         expected=f"results.json and {artefact}") from None
    return res


def roc_summary(scores_in: Sequence[float], scores_out: Sequence[float]) -> dict[str, Any]:
    """The ROC AUC of scores where members score higher, and the TPR at each of :data:`FPR_POINTS` (the
    largest TPR of a threshold whose FPR is at most that).

    >>> r = roc_summary([3.0, 2.0, 0.5], [1.0, 0.0, -1.0])
    >>> round(r["auc"], 3), round(r["tpr_at_fpr"]["0.01"], 3), round(r["tpr_at_fpr"]["0.1"], 3)
    (0.889, 0.667, 0.667)
    """
    from sklearn.metrics import roc_auc_score, roc_curve

    s_in, s_out = np.asarray(scores_in, dtype=np.float64), np.asarray(scores_out, dtype=np.float64)
    labels = np.r_[np.ones(s_in.size), np.zeros(s_out.size)]
    scores = np.r_[s_in, s_out]
    fpr, tpr, _ = roc_curve(labels, scores)
    return {"auc": float(roc_auc_score(labels, scores)),
            "tpr_at_fpr": {f"{p:g}": float(tpr[fpr <= p].max()) for p in FPR_POINTS},
            "roc": roc_points(s_in, s_out)}


def roc_points(scores_in: Sequence[float], scores_out: Sequence[float], max_points: int = ROC_POINTS
               ) -> dict[str, list[float]]:
    """The ROC curve of scores where members score higher, from (0, 0) to (1, 1): its corners (the points where
    the curve turns; straight runs need only their ends), thinned when there are more than ``max_points`` to
    points evenly spaced by length along the curve (both ends kept), rounded to 6 digits: what results.json
    keeps for the ROC plot.

    >>> roc_points([3.0, 2.0, 0.5], [1.0, 0.0, -1.0])
    {'fpr': [0.0, 0.0, 0.333333, 0.333333, 1.0], 'tpr': [0.0, 0.666667, 0.666667, 1.0, 1.0]}
    >>> roc_points([3.0, 2.0, 1.0], [0.0, 0.0])  # separable: up the left edge, along the top
    {'fpr': [0.0, 0.0, 1.0], 'tpr': [0.0, 1.0, 1.0]}
    >>> len(roc_points(range(500), [x + 0.5 for x in range(500)])["fpr"])
    100
    """
    s_in, s_out = np.asarray(scores_in, dtype=np.float64), np.asarray(scores_out, dtype=np.float64)
    scores = np.r_[s_in, s_out]
    labels = np.r_[np.ones(s_in.size), np.zeros(s_out.size)]
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(scores)), scores.size - 1]  # the last index of each distinct score
    tp = np.cumsum(labels)[last]
    fp = (last + 1) - tp
    tpr = np.r_[0.0, tp / max(s_in.size, 1)]
    fpr = np.r_[0.0, fp / max(s_out.size, 1)]
    step = np.c_[np.diff(fpr), np.diff(tpr)]
    step /= np.maximum(np.abs(step).sum(axis=1, keepdims=True), 1e-300)  # the direction of each step
    turns = np.flatnonzero(np.abs(np.diff(step, axis=0)).sum(axis=1) > 1e-12) + 1
    corners = np.r_[0, turns, fpr.size - 1]
    fpr, tpr = fpr[corners], tpr[corners]
    if fpr.size > max_points:
        length = np.r_[0.0, np.cumsum(np.hypot(np.diff(fpr), np.diff(tpr)))]
        keep = np.unique(np.searchsorted(length, np.linspace(0.0, length[-1], max_points)).clip(0, fpr.size - 1))
        keep = np.unique(np.r_[0, keep, fpr.size - 1])
        fpr, tpr = fpr[keep], tpr[keep]
    return {"fpr": [round(float(x), 6) for x in fpr], "tpr": [round(float(x), 6) for x in tpr]}


# ----------------------------------------------------------------------------------------------- FMP


def audit_fmp_checkpoint(s: FmpCheckpointSettings, out: Path) -> dict[str, Any]:
    """A finished FMP run's released sum against its clients' words (module docstring)."""
    from privasr.experiments.fmp import federation, load_fmp_config
    from privasr.federated.tree import load_tree

    run = Path(s.run)
    res = _finished(run, "privasr fmp run", "checkpoint/state.npz")
    try:
        saved = load_tree(run / "checkpoint" / "state.npz")
        released = np.asarray(saved["state"]["sum"], dtype=np.float64)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(f"{run / 'checkpoint' / 'state.npz'} holds no FMP state ({e})",
                         expected="the running sum of a `privasr fmp run`") from None
    fed = federation(load_fmp_config(_drop_none(res["config"])), out / "fmp-checkpoint-prepare")
    users: dict[int, set[int]] = {}
    per_client_utts: dict[tuple[int, int], int] = {}
    for c, client in enumerate(fed.clients):
        for group in client.groups:
            for utt in group:
                words = {int(w) for hyp in utt.word_ids for w in np.asarray(hyp).ravel()}
                for w in words:
                    users.setdefault(w, set()).add(c)
                    per_client_utts[(c, w)] = per_client_utts.get((c, w), 0) + 1
    if released.shape != (fed.algorithm.vocab_size,):
        raise InputError(f"{run / 'checkpoint' / 'state.npz'} holds a sum of shape {released.shape}",
                         expected=f"({fed.algorithm.vocab_size},), the run's vocabulary")
    members = sorted(w for w, cs in users.items() if len(cs) == 1)
    non_members = sorted(set(range(released.size)) - set(users))
    if not members or not non_members:
        raise InputError(f"{run}: {len(members)} words used by one client, {len(non_members)} by none",
                         expected="both, to compare")
    scores_in, scores_out = released[members], released[non_members]
    utts = [per_client_utts[(next(iter(users[w])), w)] for w in members]
    thr = 0.5 * (np.median(scores_in) + np.median(scores_out))
    return {"run": str(run), "epsilon_run": res.get("metrics", {}).get("epsilon"), "member_words": len(members),
            "non_member_words": len(non_members), **roc_summary(scores_in, scores_out), "threshold": float(thr),
            "tpr": float(np.mean(scores_in > thr)), "fpr": float(np.mean(scores_out > thr)),
            "member_utterances_median": float(np.median(utts)), "rounds": int(saved["round"])}


def fmp_checkpoint_report(c: dict[str, Any]) -> list[str]:
    """The Markdown section of :func:`audit_fmp_checkpoint`'s result."""
    eps = "none" if c["epsilon_run"] is None else f"{c['epsilon_run']:.3g}"
    return ["## FMP: a finished run's release", "",
            f"`{c['run']}` after {c['rounds']} rounds (epsilon {eps}): its released count of each word one "
            f"client used ({c['member_words']} words, in a median of {c['member_utterances_median']:g} of "
            f"that client's utterances) against words no client used ({c['non_member_words']}).", "",
            "| AUC | TPR | FPR (threshold halfway between the medians) |", "|---:|---:|---:|",
            f"| {c['auc']:.3f} | {c['tpr']:.3f} | {c['fpr']:.3f} |", "",
            "The members are the data's own words, not randomised canaries: this measures the attack, it is "
            "not an epsilon bound. A word in k utterances is covered by k times an utterance-level epsilon.", ""]


# --------------------------------------------------------------------------------------------- fedlm


def _distinct(sentences: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """The distinct non-empty sentences, in first-seen order."""
    return list(dict.fromkeys(tuple(s) for s in sentences if len(s)))


def _subset(xs: list[tuple[str, ...]], n: int | None, rng: np.random.Generator) -> list[tuple[str, ...]]:
    if n is None or len(xs) <= n:
        return xs
    return [xs[i] for i in sorted(rng.choice(len(xs), size=n, replace=False))]


def audit_fedlm_checkpoint(s: FedlmCheckpointSettings, out: Path, seed: int) -> dict[str, Any]:
    """A finished fedlm run's released model against its clients' sentences (module docstring): the two loss
    attacks' AUC and TPR at low FPR, and the mean log-perplexities of members and non-members under both
    models (the generalisation gap the attacks exploit)."""
    from privasr.experiments.fedlm import (
        MODEL_FILE,
        build_model,
        load_data,
        load_fedlm_config,
        scratch_params,
    )
    from privasr.federated.algorithms.fedlm import FedLmAlgorithm, FedLmConfig
    from privasr.federated.audit import sentence_log_perplexity
    from privasr.lm.neural.checkpoint import load_checkpoint

    run = Path(s.run)
    res = _finished(run, "privasr fedlm run", MODEL_FILE)
    cfg = load_fedlm_config(_drop_none(res["config"]))
    released = load_checkpoint(run / MODEL_FILE)
    data = load_data(cfg)
    model = build_model(cfg, out / "fedlm-checkpoint-prepare")
    vocab = model.lm.vocab
    if released.vocab.words != vocab.words or released.config != model.lm.model.config:
        raise InputError(f"{run / MODEL_FILE} is not a fine-tuning of the run's NNLM (its vocabulary or network "
                         "differs from the one its config builds)", expected="the model the run wrote")
    start = model.init_params if cfg.init == "pretrained" else scratch_params(cfg, model)
    final = {k: p.detach().cpu().numpy().astype(np.float32) for k, p in released.model.named_parameters()}
    members = _distinct(w for _, utts in data.clients for w, _ in utts)
    heldout = _distinct(data.heldout or ())
    shared = set(members) & set(heldout)
    members = [x for x in members if x not in shared]
    heldout = [x for x in heldout if x not in shared]
    if len(members) < 2 or len(heldout) < 2:
        raise InputError(f"{run}: {len(members)} distinct client sentences and {len(heldout)} held-out ones "
                         "not found in both", expected="at least 2 of each, to compare")
    rng = np.random.default_rng([seed, 22, 7])
    members, heldout = _subset(members, s.max_sentences, rng), _subset(heldout, s.max_sentences, rng)
    alg = FedLmAlgorithm(FedLmConfig(), model.lm.model.config, vocab)
    ids_in = [tuple(vocab.encode(x)) for x in members]
    ids_out = [tuple(vocab.encode(x)) for x in heldout]
    nll = {name: (sentence_log_perplexity(alg, p, ids_in), sentence_log_perplexity(alg, p, ids_out))
           for name, p in (("start", start), ("released", final))}
    (start_in, start_out), (rel_in, rel_out) = nll["start"], nll["released"]
    m = res.get("metrics", {})
    return {"run": str(run), "epsilon_run": m.get("epsilon"), "delta_run": m.get("delta"),
            "clients": len(data.clients), "rounds": cfg.rounds, "init": cfg.init, "held_out_kind":
            "references" if cfg.data.client_text == "reference" else "first pass",
            "member_sentences": len(ids_in), "non_member_sentences": len(ids_out), "dropped_in_both": len(shared),
            "attacks": {"loss": roc_summary(-rel_in, -rel_out),
                        "loss_drop": roc_summary(start_in - rel_in, start_out - rel_out)},
            "nll": {"members_start": float(start_in.mean()), "members_released": float(rel_in.mean()),
                    "non_members_start": float(start_out.mean()), "non_members_released": float(rel_out.mean())}}


def fedlm_checkpoint_report(c: dict[str, Any]) -> list[str]:
    """The Markdown section of :func:`audit_fedlm_checkpoint`'s result."""
    eps = "none" if c["epsilon_run"] is None else f"{c['epsilon_run']:.3g} (delta {c['delta_run']:g})"
    n = c["nll"]
    lines = ["## fedlm: a finished run's released model", "",
             f"`{c['run']}`: {c['clients']} clients, {c['rounds']} rounds from the {c['init']} model, epsilon "
             f"{eps}. Members: {c['member_sentences']} distinct client sentences; non-members: "
             f"{c['non_member_sentences']} distinct held-out sentences ({c['held_out_kind']}); "
             f"{c['dropped_in_both']} sentences found in both are left out.", "",
             "| attack | AUC | TPR at 1% FPR | TPR at 10% FPR |", "|---|---:|---:|---:|"]
    names = {"loss": "loss under the released model", "loss_drop": "loss drop from the starting model"}
    for name, r in c["attacks"].items():
        t = r["tpr_at_fpr"]
        lines.append(f"| {names[name]} | {r['auc']:.3f} | {t['0.01']:.3f} | {t['0.1']:.3f} |")
    lines += ["", f"Mean log-perplexity (nats): members {n['members_start']:.3f} -> {n['members_released']:.3f}, "
              f"non-members {n['non_members_start']:.3f} -> {n['non_members_released']:.3f} (starting -> "
              "released model).", "",
              "The members are the clients' own sentences and the non-members other meetings' or calls': the "
              "two differ in more than membership, so this measures the attack, it is not an epsilon bound. "
              "An AUC of 0.5 and TPR equal to the FPR is an attack that learns nothing.", ""]
    return lines
