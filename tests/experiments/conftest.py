"""Fixtures of the runner tests: the rescoring runner uses the toy N-best task of the rescoring tests."""

from __future__ import annotations

from ..rescore.conftest import GOOD, make_task, task, toy_files, toy_lm, write_toy_arpa  # noqa: F401
