"""Weight search for N-best rescoring: grid search and coordinate descent minimising dev-set WER.

The objective is the word error count of the rescored 1-best on a **dev** set. Word errors of every
hypothesis against its reference are computed once (Levenshtein distance on words, the minimum number of
substitutions, deletions and insertions); a weight vector's dev errors are then the sum of the chosen
hypotheses' errors, so trying a weight vector costs one vectorised pass over the hypotheses and the
search can afford thousands of candidates. Final figures are computed separately with the sclite
aligner (:mod:`privasr.experiments.rescore`).

Tie-breaking is deterministic at both levels:

* within a list, equal totals go to the better first-pass rank (:func:`~privasr.rescore.combine.select`);
* between weight vectors with the same dev errors, the one closer (L1 distance in weight space) to the
  reference point wins (the starting point for :func:`grid_search`, the current point in
  :func:`coordinate_descent`, which only moves on a strict improvement), then the earlier one in the
  enumeration order (grids ascending, parameters in :meth:`~privasr.rescore.combine.Combination.parameters`
  order).

The search functions take only a dev :class:`DevObjective`: test data cannot influence the weights.

>>> from privasr.corpus.records import Hypothesis, NBest
>>> from privasr.rescore.combine import Combination, score_table
>>> dev = [NBest("u1", (Hypothesis.from_text("a x", scores={"am": -1.0, "lm": -9.0}),
...                     Hypothesis.from_text("a b", scores={"am": -2.0, "lm": -4.0})), ref=("a", "b"))]
>>> obj = DevObjective.from_nbests(dev, score_table(dev))
>>> comb = Combination(prior="am", lms=("lm",))
>>> space = SearchSpace({"lm": value_grid(0, 1, 0.5), "word_penalty": (0.0,)})
>>> r = coordinate_descent(obj, comb, space)
>>> r.weights, r.errors, r.baseline_errors
({'lm': 0.5, 'word_penalty': 0.0}, 0, 1)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rapidfuzz.distance import Levenshtein

from privasr.config import check_mapping, check_number, from_mapping, setting
from privasr.corpus.records import NBest
from privasr.errors import ConfigError, InputError
from privasr.metrics.wer import error_rate
from privasr.rescore.combine import Combination, ScoreTable, select_many

__all__ = [
    "DevObjective",
    "SearchSpace",
    "SearchResult",
    "value_grid",
    "simplex_grid",
    "grid_search",
    "coordinate_descent",
    "tune",
    "METHODS",
    "SearchSettings",
    "CoordinateSettings",
    "default_ranges",
    "build_space",
    "sub_system_start",
    "tune_with",
]

METHODS = ("grid", "coordinate")
"""Search methods."""

_CHUNK = 128  # candidates evaluated per numpy batch


def value_grid(lo: float, hi: float, step: float) -> tuple[float, ...]:
    """The grid ``lo, lo + step, ..., hi`` (inclusive, rounded to 10 decimals so values print cleanly).

    >>> value_grid(-1, 1, 0.5)
    (-1.0, -0.5, 0.0, 0.5, 1.0)
    >>> value_grid(2, 2, 1)
    (2.0,)
    """
    for name, v in (("min", lo), ("max", hi), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ConfigError(f"grid {name} is {v!r}", expected="a finite number")
    if hi < lo:
        raise ConfigError(f"grid [{lo}, {hi}] is empty", expected="min <= max")
    if step <= 0:
        raise ConfigError(f"grid step is {step}", expected="a positive number")
    n = int(math.floor((hi - lo) / step + 1e-9)) + 1
    if n > 100_000:
        raise ConfigError(f"grid [{lo}, {hi}] step {step} has {n} values", expected="at most 100,000 values")
    return tuple(round(lo + k * step, 10) + 0.0 for k in range(n))


def simplex_grid(names: Sequence[str], step: float) -> tuple[dict[str, float], ...]:
    """Every weight vector over ``names`` with entries in multiples of ``step`` summing to 1.

    >>> simplex_grid(["a", "b"], 0.5)
    ({'a': 0.0, 'b': 1.0}, {'a': 0.5, 'b': 0.5}, {'a': 1.0, 'b': 0.0})
    >>> len(simplex_grid(["a", "b", "c"], 0.1))
    66
    """
    if isinstance(step, bool) or not isinstance(step, int | float) or not 0 < step <= 1:
        raise ConfigError(f"lambda step is {step!r}", expected="a number in (0, 1]")
    k = round(1.0 / step)
    if abs(k * step - 1.0) > 1e-9:
        raise ConfigError(f"lambda step {step} does not divide 1", expected="e.g. 0.05, 0.1, 0.25")
    names = list(names)
    if not names:
        return ()
    out = []
    for combo in itertools.product(range(k + 1), repeat=len(names) - 1):
        if sum(combo) <= k:
            parts = [*combo, k - sum(combo)]
            out.append({n: round(p / k, 10) for n, p in zip(names, parts, strict=True)})
    return tuple(out)


@dataclass(frozen=True)
class DevObjective:
    """Dev-set word errors of any weight vector, from per-hypothesis errors computed once.

    Attributes:
        table: the dev set's score table.
        hyp_errors: word errors of every hypothesis against its reference (int64).
        empty_errors: errors of utterances with empty lists (all their reference words deleted).
        ref_words: reference words of the dev set.
    """

    table: ScoreTable
    hyp_errors: np.ndarray = field(repr=False)
    empty_errors: int
    ref_words: int

    @classmethod
    def from_nbests(cls, nbests: Sequence[NBest], table: ScoreTable) -> DevObjective:
        """Compute the per-hypothesis errors; every list needs a reference (else :class:`InputError`)."""
        if tuple(nb.utt_id for nb in nbests) != table.utt_ids:
            raise InputError("the dev lists are not the ones the score table was built from")
        errs: list[int] = []
        empty = ref_words = 0
        for nb in nbests:
            if nb.ref is None:
                raise InputError(f"dev utterance {nb.utt_id} has no reference",
                                 expected="a reference for every dev utterance (weights are tuned on dev WER)")
            ref_words += len(nb.ref)
            if not nb.hyps:
                empty += len(nb.ref)
            errs.extend(Levenshtein.distance(nb.ref, h.words) for h in nb.hyps)
        arr = np.asarray(errs, dtype=np.int64)
        arr.setflags(write=False)
        return cls(table, arr, empty, ref_words)

    def errors_of_choices(self, choices: np.ndarray) -> np.ndarray:
        """Total errors per row of chosen indices (candidates x utterances, ``-1`` = empty list)."""
        ch = np.atleast_2d(choices)
        flat = self.table.offsets[:-1][None, :] + ch
        valid = ch >= 0
        vals = np.where(valid, self.hyp_errors[np.where(valid, flat, 0)] if self.hyp_errors.size else 0, 0)
        return vals.sum(axis=1) + self.empty_errors

    def errors(self, totals: np.ndarray) -> np.ndarray:
        """Total dev errors for each row of a (candidates x hypotheses) matrix of totals."""
        return self.errors_of_choices(select_many(self.table, totals))

    def baseline_errors(self) -> int:
        """Errors of the first-pass 1-best (the first hypothesis of each list)."""
        ch = np.where(self.table.lengths > 0, 0, -1)
        return int(self.errors_of_choices(ch[None, :])[0])

    def wer(self, errors: int) -> float:
        """``errors / ref_words``."""
        return error_rate(int(errors), self.ref_words)


@dataclass(frozen=True)
class SearchSpace:
    """The candidate values of each searched parameter, and the values of fixed ones.

    Attributes:
        grids: parameter -> candidate values, ascending (``lambda``: simplex points, see :func:`simplex_grid`).
        fixed: parameter -> value, for parameters that are not searched.
    """

    grids: Mapping[str, tuple[Any, ...]]
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def check(self, combination: Combination) -> None:
        """:class:`ConfigError` unless every parameter of ``combination`` is searched or fixed, once."""
        params = set(combination.parameters())
        both = sorted(set(self.grids) & set(self.fixed))
        if both:
            raise ConfigError(f"parameter(s) {both} are both searched and fixed", expected="one or the other")
        unknown = sorted((set(self.grids) | set(self.fixed)) - params)
        if unknown:
            raise ConfigError(f"unknown search parameter(s) {unknown}", expected=f"some of {sorted(params)}")
        missing = sorted(params - set(self.grids) - set(self.fixed))
        if missing:
            raise ConfigError(f"no grid or value for parameter(s) {missing}")
        for p, g in self.grids.items():
            if not g:
                raise ConfigError(f"the grid of {p!r} is empty")

    def size(self) -> int:
        """Number of points of the full grid."""
        return math.prod(len(g) for g in self.grids.values())

    def default_start(self, combination: Combination) -> dict[str, Any]:
        """Each searched parameter at its grid value nearest zero (lambda: nearest the uniform mixture)."""
        start = dict(self.fixed)
        for p, g in self.grids.items():
            if p == "lambda":
                n = len(combination.lms)
                start[p] = min(g, key=lambda lam: sum(abs(v - 1.0 / n) for v in lam.values()))
            else:
                start[p] = min(g, key=lambda v: (abs(v), v))
        return start


@dataclass(frozen=True)
class SearchResult:
    """The tuned weights and how they were found.

    Attributes:
        weights: the chosen weights (every parameter of the combination).
        errors: dev word errors with them; wer: ``errors / ref_words``.
        baseline_errors: dev errors of the first-pass 1-best; baseline_wer likewise.
        ref_words: dev reference words.
        method: ``grid`` or ``coordinate``; evaluations: weight vectors tried.
        trace: coordinate descent's moves (``round``, ``parameter``, ``value``, ``errors``), or the grid's best.
    """

    weights: dict[str, Any]
    errors: int
    wer: float
    baseline_errors: int
    baseline_wer: float
    ref_words: int
    method: str
    evaluations: int
    trace: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"weights": self.weights, "errors": self.errors, "wer": self.wer,
                "baseline_errors": self.baseline_errors, "baseline_wer": self.baseline_wer,
                "ref_words": self.ref_words, "method": self.method, "evaluations": self.evaluations,
                "trace": list(self.trace)}


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    d = 0.0
    for k, v in a.items():
        w = b.get(k)
        if isinstance(v, Mapping):
            d += sum(abs(v[x] - (w or {}).get(x, 0.0)) for x in v)
        elif w is not None:
            d += abs(v - w)
    return d


def _evaluate(obj: DevObjective, comb: Combination, cands: Sequence[Mapping[str, Any]]) -> np.ndarray:
    out = np.empty(len(cands), dtype=np.int64)
    for i in range(0, len(cands), _CHUNK):
        chunk = cands[i : i + _CHUNK]
        tot = np.stack([comb.totals(obj.table, w) for w in chunk]) if obj.table.n_hyps else \
            np.zeros((len(chunk), 0))
        out[i : i + len(chunk)] = obj.errors(tot)
    return out


def _best(errs: np.ndarray, cands: Sequence[Mapping[str, Any]], ref: Mapping[str, Any]) -> int:
    """Index of the fewest errors; ties by distance to ``ref``, then enumeration order."""
    m = int(errs.min())
    tied = np.flatnonzero(errs == m)
    return int(min(tied, key=lambda i: (_distance(cands[i], ref), i)))


def _result(obj: DevObjective, comb: Combination, w: Mapping[str, Any], errors: int, method: str,
            evals: int, trace: list[dict[str, Any]]) -> SearchResult:
    base = obj.baseline_errors()
    weights = {p: w[p] for p in comb.parameters()}
    return SearchResult(weights, int(errors), obj.wer(errors), base, obj.wer(base), obj.ref_words, method, evals,
                        tuple(trace))


def grid_search(
    objective: DevObjective,
    combination: Combination,
    space: SearchSpace,
    *,
    start: Mapping[str, Any] | None = None,
    max_points: int = 2_000_000,
) -> SearchResult:
    """Try every point of the grid; ties go to the point nearest ``start`` (default: weights nearest 0).

    >>> from privasr.corpus.records import Hypothesis, NBest
    >>> from privasr.rescore.combine import score_table
    >>> dev = [NBest("u", (Hypothesis.from_text("a b c"), Hypothesis.from_text("a b")), ref=("a", "b"))]
    >>> obj = DevObjective.from_nbests(dev, score_table(dev))
    >>> r = grid_search(obj, Combination(prior="rank"), SearchSpace({"word_penalty": value_grid(-2, 2, 0.5)}))
    >>> r.weights, r.errors, r.evaluations
    ({'word_penalty': -1.5}, 0, 9)
    """
    space.check(combination)
    n = space.size()
    if n > max_points:
        raise ConfigError(f"the full grid has {n:,} points", expected=f"at most {max_points:,} (use coordinate descent)")
    ref = dict(start) if start is not None else space.default_start(combination)
    names = list(space.grids)
    best_err, best_w, evals = None, None, 0
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        nonlocal best_err, best_w, evals
        if not batch:
            return
        errs = _evaluate(objective, combination, batch)
        evals += len(batch)
        i = _best(errs, batch, ref)
        e = int(errs[i])
        if best_err is None or e < best_err or (e == best_err and _distance(batch[i], ref) < _distance(best_w, ref)):
            best_err, best_w = e, batch[i]
        batch.clear()

    for values in itertools.product(*(space.grids[p] for p in names)):
        batch.append({**space.fixed, **dict(zip(names, values, strict=True))})
        if len(batch) >= 4096:
            flush()
    flush()
    assert best_w is not None and best_err is not None
    return _result(objective, combination, best_w, best_err, "grid", evals,
                   [{"best": {p: best_w[p] for p in combination.parameters()}, "errors": best_err}])


def _coarse(grid: tuple[Any, ...], points: int) -> tuple[Any, ...]:
    if len(grid) <= points:
        return grid
    idx = np.unique(np.round(np.linspace(0, len(grid) - 1, points)).astype(int))
    return tuple(grid[i] for i in idx)


def _top_points(objective: DevObjective, combination: Combination, space: SearchSpace, ref: Mapping[str, Any],
                k: int) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The ``k`` best points of a (small) grid, ordered by errors, distance to ``ref``, enumeration order."""
    names = list(space.grids)
    cands = [{**space.fixed, **dict(zip(names, values, strict=True))}
             for values in itertools.product(*(space.grids[p] for p in names))]
    errs = _evaluate(objective, combination, cands)
    order = sorted(range(len(cands)), key=lambda i: (int(errs[i]), _distance(cands[i], ref), i))
    return [(int(errs[i]), cands[i]) for i in order[:k]], len(cands)


def coordinate_descent(
    objective: DevObjective,
    combination: Combination,
    space: SearchSpace,
    *,
    start: Mapping[str, Any] | None = None,
    max_rounds: int = 20,
    coarse_points: int = 7,
    restarts: int = 3,
    max_coarse: int = 50_000,
    extra_starts: Sequence[Mapping[str, Any]] = (),
) -> SearchResult:
    """Coordinate descent on the grid: optimise one parameter at a time over its whole grid, repeat.

    Starts: the ``restarts`` best points of a coarse grid (``coarse_points`` evenly spaced values per
    parameter, when that grid has at most ``max_coarse`` points; ``coarse_points=0`` skips it), else
    ``start`` (default: weights nearest 0); then each of ``extra_starts`` (complete points, e.g. a tuned
    sub-system's weights with the other LMs at 0, so that the result is never worse on dev than that
    sub-system). From each start a parameter only moves when the dev errors strictly drop; a descent stops
    after a round without a move or after ``max_rounds`` rounds. The best end point wins (ties: the earlier
    start).
    """
    space.check(combination)
    if isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1:
        raise ConfigError(f"max_rounds is {max_rounds!r}", expected="an integer >= 1")
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < 1:
        raise ConfigError(f"restarts is {restarts!r}", expected="an integer >= 1")
    first = dict(start) if start is not None else space.default_start(combination)
    for p in combination.parameters():
        if p not in first:
            raise ConfigError(f"the start point lacks {p!r}")
    evals = 0
    trace: list[dict[str, Any]] = []
    starts: list[tuple[int, dict[str, Any]]] = []
    if coarse_points and coarse_points > 1:
        coarse = SearchSpace({p: _coarse(g, coarse_points) for p, g in space.grids.items()}, space.fixed)
        if 1 < coarse.size() <= max_coarse:
            starts, n = _top_points(objective, combination, coarse, first, restarts)
            evals += n
    if not starts:
        starts = [(int(_evaluate(objective, combination, [first])[0]), first)]
        evals += 1
    for extra in extra_starts:
        point = {**space.fixed, **dict(extra)}
        missing = [p for p in combination.parameters() if p not in point]
        if missing:
            raise ConfigError(f"an extra start point lacks {missing}")
        if all(_distance(point, s) > 0 for _, s in starts):
            starts.append((int(_evaluate(objective, combination, [point])[0]), point))
            evals += 1
    best: tuple[int, dict[str, Any]] | None = None
    for s_idx, (cur_err, cur) in enumerate(starts):
        trace.append({"start": s_idx, "round": 0, "parameter": "start",
                      "value": {p: cur[p] for p in combination.parameters()}, "errors": cur_err})
        for rnd in range(1, max_rounds + 1):
            moved = False
            for p in combination.parameters():
                if p not in space.grids:
                    continue
                cands = [{**cur, p: v} for v in space.grids[p]]
                errs = _evaluate(objective, combination, cands)
                evals += len(cands)
                i = _best(errs, cands, cur)
                if int(errs[i]) < cur_err:
                    cur, cur_err, moved = cands[i], int(errs[i]), True
                    trace.append({"start": s_idx, "round": rnd, "parameter": p, "value": cur[p], "errors": cur_err})
            if not moved:
                break
        if best is None or cur_err < best[0]:
            best = (cur_err, cur)
    assert best is not None
    return _result(objective, combination, best[1], best[0], "coordinate", evals, trace)


def tune(
    dev: Sequence[NBest],
    table: ScoreTable,
    combination: Combination,
    space: SearchSpace,
    *,
    method: str = "coordinate",
    **options: Any,
) -> SearchResult:
    """Tune the weights on a dev set (lists with references) by ``grid`` search or ``coordinate`` descent.

    ``table`` must be the dev set's :func:`~privasr.rescore.combine.score_table`; ``options`` go to the
    search function. Nothing but the dev set is seen here.
    """
    if method not in METHODS:
        raise ConfigError(f"search method {method!r} is not valid", expected=f"one of {list(METHODS)}")
    obj = DevObjective.from_nbests(dev, table)
    if method == "grid":
        return grid_search(obj, combination, space, **options)
    return coordinate_descent(obj, combination, space, **options)


# ---------------------------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class SearchSettings:
    """A config's ``search`` section: how the combination weights are chosen (schema of :mod:`privasr.config`).

    ``method``: ``coordinate`` | ``grid`` | ``fixed``; ``weights``: the weights (fixed) or the start point;
    ``ranges``: ``PARAM: [min, max, step]`` (PARAM an LM name, ``lm``, ``word_penalty``, ``lm_scale``);
    ``lambda_step``: the simplex grid step of linear combinations; ``max_rounds``, ``coarse_points`` and
    ``restarts``: coordinate descent (:func:`coordinate_descent`).

    >>> from privasr.config import from_mapping
    >>> from_mapping(SearchSettings, {"ranges": {"lm": [0, 1, 0.5]}}, "search").ranges
    {'lm': (0.0, 1.0, 0.5)}
    """

    method: str = setting("coordinate", choices=("coordinate", "grid", "fixed"))
    weights: dict[str, Any] = field(default_factory=dict)
    ranges: dict[str, Any] = field(default_factory=dict)
    lambda_step: float = 0.05
    max_rounds: int = setting(20, min=1)
    coarse_points: int = setting(7, min=0)
    restarts: int = setting(3, min=1)

    def __config_check__(self, where: str, ctx: Any) -> SearchSettings:
        out = {}
        for k, r in check_mapping(self.ranges, f"{where}.ranges").items():
            key = f"{where}.ranges.{k}"
            if not isinstance(r, list | tuple) or len(r) != 3:
                raise ConfigError(f"config key {key!r} is {r!r}", expected="[min, max, step]")
            lo, hi, step = (check_number(x, key) for x in r)
            value_grid(lo, hi, step)  # validates
            out[str(k)] = (lo, hi, step)
        return SearchSettings(self.method, dict(self.weights), out, self.lambda_step, self.max_rounds,
                              self.coarse_points, self.restarts)

    def restricted(self, parameters: Sequence[str]) -> SearchSettings:
        """The same settings for a sub-system with only ``parameters`` (weights and ranges of the others dropped)."""
        keep = set(parameters)
        return SearchSettings(self.method, {k: v for k, v in self.weights.items() if k in keep},
                              {k: v for k, v in self.ranges.items() if k in keep}, self.lambda_step,
                              self.max_rounds, self.coarse_points, self.restarts)

    def coordinate_options(self) -> dict[str, Any]:
        """The options of :func:`coordinate_descent` (empty for the other methods)."""
        if self.method != "coordinate":
            return {}
        return {"max_rounds": self.max_rounds, "coarse_points": self.coarse_points, "restarts": self.restarts}


@dataclass(frozen=True)
class CoordinateSettings:
    """A runner's weight search when it is always coordinate descent on dev (``fmp``, ``fedlm``, ``anon``):
    ``ranges`` (checked as :class:`SearchSettings` checks them), ``max_rounds``, ``coarse_points`` (at least 2)
    and ``restarts``. :meth:`settings` gives the :class:`SearchSettings` it stands for.

    >>> from privasr.config import from_mapping
    >>> from_mapping(CoordinateSettings, {"ranges": {"lm": [0, 1, 0.5]}}, "search").settings().ranges
    {'lm': (0.0, 1.0, 0.5)}
    """

    ranges: dict[str, Any] = field(default_factory=dict)
    max_rounds: int = setting(20, min=1)
    coarse_points: int = setting(7, min=2)
    restarts: int = setting(3, min=1)

    def __config_check__(self, where: str, ctx: Any) -> CoordinateSettings:
        ranges = from_mapping(SearchSettings, {"ranges": self.ranges}, where, ctx).ranges
        return dataclasses.replace(self, ranges=ranges)

    def settings(self) -> SearchSettings:
        """The :class:`SearchSettings` these stand for (method ``coordinate``)."""
        return SearchSettings(method="coordinate", ranges=dict(self.ranges), max_rounds=self.max_rounds,
                              coarse_points=self.coarse_points, restarts=self.restarts)


def default_ranges(prior: str) -> dict[str, tuple[float, float, float]]:
    """Default ``[min, max, step]`` per parameter kind for a prior (``lm`` stands for every LM weight).

    With prior ``am``/``total`` (scores in nats of a real decoder) LM weights and ``lm_scale`` in ``[0, 30]``
    step 0.5 and ``word_penalty`` in ``[-30, 30]`` step 0.5; with ``rank``/``uniform`` LM weights in ``[0, 5]``
    step 0.05 and ``word_penalty`` in ``[-5, 5]`` step 0.05.

    >>> default_ranges("rank")["word_penalty"]
    (-5.0, 5.0, 0.05)
    """
    if prior in ("am", "total"):
        return {"lm": (0.0, 30.0, 0.5), "lm_scale": (0.0, 30.0, 0.5), "word_penalty": (-30.0, 30.0, 0.5)}
    return {"lm": (0.0, 5.0, 0.05), "lm_scale": (0.0, 5.0, 0.05), "word_penalty": (-5.0, 5.0, 0.05)}


def build_space(comb: Combination, search: SearchSettings) -> SearchSpace:
    """Grids for every parameter of ``comb`` not fixed by ``search`` (fixed: every parameter fixed).

    >>> sp = build_space(Combination(prior="rank", lms=("lm",)), SearchSettings(ranges={"lm": (0, 1, 0.5)}))
    >>> sp.grids["lm"], len(sp.grids["word_penalty"])
    ((0.0, 0.5, 1.0), 201)
    """
    params = comb.parameters()
    if search.method == "fixed":
        return SearchSpace({}, comb.check_weights(search.weights))
    defaults = default_ranges(comb.prior)
    unknown = sorted(set(search.ranges) - set(params) - {"lambda"})
    if unknown:
        raise ConfigError(f"search.ranges names unknown parameter(s) {unknown}", expected=f"some of {list(params)}")
    grids: dict[str, tuple[Any, ...]] = {}
    for p in params:
        if p == "lambda":
            grids[p] = simplex_grid(comb.lms, search.lambda_step)
            continue
        lo, hi, step = search.ranges.get(p, defaults.get(p, defaults["lm"]))
        grids[p] = value_grid(lo, hi, step)
    return SearchSpace(grids)


def sub_system_start(comb: Combination, space: SearchSpace, weights: Mapping[str, Any]) -> dict[str, Any] | None:
    """A tuned sub-system's weights as a point of the full log-linear search: its weights, and every other
    parameter at its value nearest 0 (an LM weight of 0 leaves that LM out). ``None`` for linear combinations
    (their interpolation weights do not nest).

    >>> c = Combination(prior="am", lms=("lm", "a", "b"))
    >>> sp = SearchSpace({"lm": (0.0, 1.0), "a": (0.0, 2.0), "b": (0.0, 3.0), "word_penalty": (-1.0, 0.0, 1.0)})
    >>> sub_system_start(c, sp, {"lm": 1.0, "a": 2.0, "word_penalty": -1.0})
    {'lm': 1.0, 'a': 2.0, 'b': 0.0, 'word_penalty': -1.0}
    """
    if comb.mode != "loglinear":
        return None
    point = space.default_start(comb)
    point.update({k: v for k, v in weights.items() if k in point})
    return point


def tune_with(search: SearchSettings, comb: Combination, space: SearchSpace, dev: Sequence[NBest] | None,
              dev_table: ScoreTable | None, extra_starts: Sequence[Mapping[str, Any]] = ()) -> SearchResult | None:
    """Tune ``comb`` on dev as ``search`` says (``None`` for ``fixed``: the weights are given).

    A start point in ``search.weights`` is used when it sets every parameter; coordinate descent also starts
    from ``extra_starts`` (e.g. tuned sub-systems, :func:`sub_system_start`).
    """
    if search.method == "fixed":
        return None
    assert dev is not None and dev_table is not None
    opts: dict[str, Any] = {}
    start = dict(search.weights) if search.weights else None
    if start is not None:
        start = {p: start[p] for p in comb.parameters() if p in start}
        if set(start) != set(comb.parameters()):
            start = None
    if start:
        opts["start"] = start
    if search.method == "coordinate":
        opts.update(search.coordinate_options(), extra_starts=list(extra_starts))
    return tune(dev, dev_table, comb, space, method=search.method, **opts)
