"""Weight search: grids, dev objective, grid search vs coordinate descent, deterministic ties, dev only."""

from __future__ import annotations

import numpy as np
import pytest

from privasr.corpus.records import Hypothesis, NBest
from privasr.errors import ConfigError, InputError
from privasr.rescore.combine import Combination, score_table, select
from privasr.rescore.search import (
    DevObjective,
    SearchSpace,
    coordinate_descent,
    grid_search,
    simplex_grid,
    tune,
    value_grid,
)


def test_value_grid_and_simplex_grid():
    assert value_grid(0, 1, 0.1)[-1] == 1.0 and len(value_grid(0, 1, 0.1)) == 11
    assert value_grid(-30, 30, 0.5)[60] == 0.0
    with pytest.raises(ConfigError):
        value_grid(1, 0, 0.1)
    with pytest.raises(ConfigError):
        value_grid(0, 1, 0)
    pts = simplex_grid(["a", "b", "c"], 0.25)
    assert len(pts) == 15 and all(abs(sum(p.values()) - 1) < 1e-12 for p in pts)
    with pytest.raises(ConfigError, match="does not divide"):
        simplex_grid(["a", "b"], 0.3)


def test_dev_objective_counts_word_errors_of_the_chosen_hypotheses(task, toy_lm):
    dev = task(3, 30)
    table = score_table(dev, {"toy": toy_lm})
    obj = DevObjective.from_nbests(dev, table)
    comb = Combination(prior="am", lms=("toy",))
    for w in (0.0, 1.0, 10.0):
        tot = comb.totals(table, {"toy": w, "word_penalty": 0.0})
        ch = select(table, tot)
        # brute force: Levenshtein distance of each chosen hypothesis
        from rapidfuzz.distance import Levenshtein

        want = sum(Levenshtein.distance(nb.ref, nb.hyps[c].words) for nb, c in zip(dev, ch, strict=True))
        assert int(obj.errors(tot[None, :])[0]) == want
    assert obj.baseline_errors() == sum(Levenshtein.distance(nb.ref, nb.best.words) for nb in dev)


def test_dev_without_references_is_an_error(task):
    dev = task(3, 5, refs=False)
    with pytest.raises(InputError, match="has no reference"):
        DevObjective.from_nbests(dev, score_table(dev))


def test_grid_and_coordinate_find_the_same_optimum(task, toy_lm):
    dev = task(4, 80)
    table = score_table(dev, {"toy": toy_lm})
    comb = Combination(prior="am", lms=("lm", "toy"))
    space = SearchSpace({"lm": value_grid(0, 4, 1), "toy": value_grid(0, 10, 0.5), "word_penalty": value_grid(-4, 4, 1)})
    g = tune(dev, table, comb, space, method="grid")
    c = tune(dev, table, comb, space, method="coordinate")
    assert g.evaluations == space.size()
    assert g.errors < g.baseline_errors
    assert c.errors == g.errors  # an easy problem: coordinate descent reaches the grid optimum
    assert set(g.weights) == {"lm", "toy", "word_penalty"}


def test_ties_between_weight_vectors_are_deterministic():
    # every weight gives the same errors (one-hypothesis lists): the start point (nearest 0) must win
    dev = [NBest(f"u{i}", (Hypothesis.from_text("a b", scores={"am": -1.0}),), ref=("a", "c")) for i in range(3)]
    table = score_table(dev)
    obj = DevObjective.from_nbests(dev, table)
    comb = Combination(prior="am")
    space = SearchSpace({"word_penalty": value_grid(-2, 2, 0.5)})
    assert grid_search(obj, comb, space).weights == {"word_penalty": 0.0}
    assert coordinate_descent(obj, comb, space).weights == {"word_penalty": 0.0}
    assert grid_search(obj, comb, space, start={"word_penalty": 1.6}).weights == {"word_penalty": 1.5}
    # and repeated runs agree exactly
    r1 = coordinate_descent(obj, comb, SearchSpace({"word_penalty": value_grid(-2, 2, 0.5)}))
    r2 = coordinate_descent(obj, comb, SearchSpace({"word_penalty": value_grid(-2, 2, 0.5)}))
    assert r1 == r2


def test_coordinate_descent_only_moves_on_strict_improvement(task, toy_lm):
    dev = task(5, 40)
    table = score_table(dev, {"toy": toy_lm})
    obj = DevObjective.from_nbests(dev, table)
    comb = Combination(prior="am", lms=("toy",))
    space = SearchSpace({"toy": value_grid(0, 20, 0.5), "word_penalty": value_grid(-5, 5, 0.5)})
    r = coordinate_descent(obj, comb, space, coarse_points=0)
    errs = [t["errors"] for t in r.trace]
    assert all(b < a for a, b in zip(errs, errs[1:], strict=False))
    assert r.errors <= r.baseline_errors


def test_linear_mode_search_over_the_simplex(task, toy_lm):
    dev = task(6, 60)
    table = score_table(dev, {"toy": toy_lm})
    comb = Combination(prior="am", lms=("lm", "toy"), mode="linear")
    space = SearchSpace({"lm_scale": value_grid(0, 10, 1), "lambda": simplex_grid(["lm", "toy"], 0.25),
                         "word_penalty": value_grid(-2, 2, 1)})
    r = tune(dev, table, comb, space)
    assert r.errors < r.baseline_errors and r.weights["lambda"]["toy"] > 0


def test_search_space_is_checked_against_the_combination():
    comb = Combination(prior="am", lms=("lm",))
    with pytest.raises(ConfigError, match="no grid or value"):
        SearchSpace({"lm": (0.0,)}).check(comb)
    with pytest.raises(ConfigError, match="unknown search parameter"):
        SearchSpace({"lm": (0.0,), "word_penalty": (0.0,), "toy": (1.0,)}).check(comb)
    with pytest.raises(ConfigError, match="search method"):
        tune([], score_table([]), comb, SearchSpace({"lm": (0.0,), "word_penalty": (0.0,)}), method="random")


def test_tuning_sees_only_the_dev_set(task, toy_lm):
    """The search functions take only dev data; the weights do not depend on any other set."""
    dev = task(7, 50)
    comb = Combination(prior="am", lms=("lm", "toy"))
    space = SearchSpace({"lm": value_grid(0, 2, 1), "toy": value_grid(0, 10, 1), "word_penalty": value_grid(-2, 2, 1)})
    r1 = tune(dev, score_table(dev, {"toy": toy_lm}), comb, space)
    # a cache that has already scored some unrelated "test" lists gives the same dev features and weights
    from privasr.rescore.combine import LMScoreCache

    cache = LMScoreCache(toy_lm)
    score_table(task(8, 50), {"toy": cache})
    r2 = tune(dev, score_table(dev, {"toy": cache}), comb, space)
    assert r1.weights == r2.weights and r1.errors == r2.errors
    assert np.isfinite(r1.wer)


def test_an_extra_start_bounds_the_result_by_its_dev_errors(task, toy_lm):
    # a sub-system's point as an extra start: coordinate descent (no coarse grid) never ends worse than it
    dev = task(7, 60)
    table = score_table(dev, {"toy": toy_lm})
    obj = DevObjective.from_nbests(dev, table)
    comb = Combination(prior="am", lms=("lm", "toy"))
    space = SearchSpace({"lm": value_grid(0, 4, 1), "toy": value_grid(0, 10, 0.5), "word_penalty": value_grid(-4, 4, 1)})
    sub = grid_search(obj, Combination(prior="am", lms=("lm",)),
                      SearchSpace({"lm": value_grid(0, 4, 1), "word_penalty": value_grid(-4, 4, 1)}))
    point = {**sub.weights, "toy": 0.0}
    r = coordinate_descent(obj, comb, space, coarse_points=0, extra_starts=[point])
    assert r.errors <= sub.errors
    assert any(t["parameter"] == "start" and t["value"] == point for t in r.trace)
    with pytest.raises(ConfigError, match="lacks"):
        coordinate_descent(obj, comb, space, extra_starts=[{"lm": 1.0}])
