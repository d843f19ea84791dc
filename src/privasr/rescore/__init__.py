"""N-best rescoring: score combination (:mod:`~privasr.rescore.combine`), weight search on a dev set
(:mod:`~privasr.rescore.search`) and the language models of a config (:mod:`~privasr.rescore.lms`). The
configured runner behind ``privasr rescore run`` is :mod:`privasr.experiments.rescore`."""

from privasr.rescore.combine import (
    Combination,
    LMScoreCache,
    ScoreTable,
    rerank,
    rescore,
    score_table,
    select,
)
from privasr.rescore.search import (
    DevObjective,
    SearchResult,
    SearchSpace,
    coordinate_descent,
    grid_search,
    tune,
)

__all__ = [
    "Combination", "LMScoreCache", "ScoreTable", "rerank", "rescore", "score_table", "select",
    "DevObjective", "SearchResult", "SearchSpace", "coordinate_descent", "grid_search", "tune",
]
