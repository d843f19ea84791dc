"""The statistics of an empirical privacy audit: what an attack on the released artefacts proves.

* :mod:`~privasr.privacy.audit.bounds` -- Clopper-Pearson intervals and the epsilon lower bound an attack's
  error rates prove (Jagielski et al. 2020; Nasr et al. 2021); a threshold attack audited on held-out trials;
* :mod:`~privasr.privacy.audit.lrt` -- likelihood-ratio membership scores for a planted count behind Laplace
  or Gaussian noise, or behind none;
* :mod:`~privasr.privacy.audit.exposure` -- canary formats and the exposure of a planted canary (Carlini et
  al. 2019, "The Secret Sharer").

The functions work on plain numbers (scores, counts); extracting them from a run is the caller's business.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> members, others = 1.0 + rng.laplace(0, 1, 2000), rng.laplace(0, 1, 2000)   # a count behind eps=1 Laplace
>>> result = threshold_attack(laplace_llr(members, 1.0, 1.0), laplace_llr(others, 1.0, 1.0), rng=rng)
>>> 0.0 < result.eps_lb <= 1.0
True
"""

from __future__ import annotations

from privasr.privacy.audit.bounds import AuditResult, clopper_pearson, epsilon_lower_bound, threshold_attack
from privasr.privacy.audit.exposure import (
    DIGIT_WORDS,
    CanaryFormat,
    estimated_rank,
    exposure,
    extrapolated_exposure,
)
from privasr.privacy.audit.lrt import count_presence, gaussian_llr, laplace_llr

__all__ = [
    "clopper_pearson", "epsilon_lower_bound", "AuditResult", "threshold_attack",
    "laplace_llr", "gaussian_llr", "count_presence",
    "DIGIT_WORDS", "CanaryFormat", "exposure", "estimated_rank", "extrapolated_exposure",
]
