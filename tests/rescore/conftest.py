"""Fixtures for the rescoring tests: a toy language model and a small generated N-best task."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest

from privasr.corpus.formats.nbest_jsonl import write_nbest
from privasr.corpus.records import Hypothesis, NBest
from privasr.lm.base import SentenceScore

GOOD = ("the", "cat", "sat", "on", "mat", "a", "dog", "ran", "to", "park")
BAD = ("tha", "cap", "set", "in", "map", "uh", "dig", "rang", "too", "bark")


class ToyLM:
    """A unigram LM (log10 probabilities per word, ``default`` for OOVs) that counts its calls."""

    order = 1

    def __init__(self, logprobs: dict[str, float], default: float = -3.0, eos: float = -0.5) -> None:
        self.logprobs = dict(logprobs)
        self.default = default
        self.eos = eos
        self.batch_calls = 0
        self.sentences_scored: list[tuple[str, ...]] = []

    def __contains__(self, word: object) -> bool:
        return word in self.logprobs

    def score(self, words: Sequence[str], *, bos: bool = True, eos: bool = True) -> SentenceScore:
        self.sentences_scored.append(tuple(words))
        toks = (*words, "</s>") if eos else tuple(words)
        lp = [self.logprobs.get(w, self.default) for w in words] + ([self.eos] if eos else [])
        oov = [w not in self.logprobs for w in words] + ([False] if eos else [])
        return SentenceScore(toks, np.array(lp, dtype=float), np.array(oov, dtype=bool))

    def score_batch(self, sentences: Sequence[Sequence[str]], *, bos: bool = True,
                    eos: bool = True) -> list[SentenceScore]:
        self.batch_calls += 1
        return [self.score(s, bos=bos, eos=eos) for s in sentences]

    def ln(self, words: Sequence[str]) -> float:
        """The natural-log sentence probability this LM gives (with </s>)."""
        return self.score(words).ln_total


@pytest.fixture()
def toy_lm() -> ToyLM:
    return ToyLM({w: -1.0 for w in GOOD} | {w: -2.5 for w in BAD})


def write_toy_arpa(path: Path) -> Path:
    """A unigram ARPA file preferring the GOOD words (what the toy task's new LM is)."""
    words = [("<unk>", -3.0), ("<s>", -99.0), ("</s>", -0.5)] + [(w, -1.0) for w in GOOD] + [(w, -2.5) for w in BAD]
    lines = ["", "\\data\\", f"ngram 1={len(words)}", "", "\\1-grams:"]
    lines += [f"{p}\t{w}" for w, p in words]
    lines += ["", "\\end\\", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def make_task(seed: int, n: int, *, prefix: str = "u", scores: bool = True, refs: bool = True,
              speakers: int = 4) -> list[NBest]:
    """N-best lists of 4 hypotheses: the reference and 3 corruptions (GOOD -> BAD words); noisy am scores
    often rank a corruption first, a first-pass lm score knows nothing; a new LM preferring GOOD words helps."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ref = tuple(rng.choice(GOOD) for _ in range(rng.randint(3, 7)))
        hyps = {ref}
        while len(hyps) < 4:
            h = list(ref)
            for _ in range(rng.randint(1, 2)):
                j = rng.randrange(len(h))
                h[j] = BAD[GOOD.index(h[j])] if h[j] in GOOD else h[j]
            hyps.add(tuple(h))
        cands = []
        for h in hyps:
            n_bad = sum(w in BAD for w in h)
            am = -10.0 * len(h) - 1.0 * n_bad + rng.gauss(0.0, 2.0)
            cands.append((am, h))
        cands.sort(key=lambda x: -x[0])
        hs = tuple(Hypothesis(h, scores={"am": am, "lm": -2.0 * len(h) * math.log(10), "total": am}
                              if scores else {}) for am, h in cands)
        out.append(NBest(f"spk{i % speakers}_{prefix}{i:04d}", hs, client=f"spk{i % speakers}",
                         speaker=f"spk{i % speakers}", order=i, ref=ref if refs else None))
    return out


@pytest.fixture()
def task() -> Callable[..., list[NBest]]:
    return make_task


@pytest.fixture()
def toy_files(tmp_path: Path) -> dict[str, Path]:
    """dev.jsonl, test.jsonl (generated toy task) and toy.arpa in tmp_path."""
    write_nbest(tmp_path / "dev.jsonl", make_task(1, 60, prefix="d"))
    write_nbest(tmp_path / "test.jsonl", make_task(2, 80, prefix="t"))
    write_toy_arpa(tmp_path / "toy.arpa")
    return {"dev": tmp_path / "dev.jsonl", "test": tmp_path / "test.jsonl", "arpa": tmp_path / "toy.arpa"}
