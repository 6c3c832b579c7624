"""Every split, scored by the executor: the exact answer on small chains (the tests' check of
the MILP), and nothing else."""

from __future__ import annotations

import itertools
import math
import time
from math import comb

from ...errors import InvalidProblemError
from .problem import ScheduleProblem, ScheduleResult

__all__ = ["MAX_SPLITS", "exhaustive"]

MAX_SPLITS = 20_000
"""The most splits :func:`exhaustive` agrees to score."""


def exhaustive(problem: ScheduleProblem) -> ScheduleResult:
    """The split of least iteration time over all ``C(n - 1, S - 1)`` splits, each run by
    :meth:`ScheduleProblem.execute` (ties: the first in lexicographic order of the starts).

    Returns
    -------
    ScheduleResult
        Method ``"exhaustive"``, status ``"optimal"`` (bound = its time) or ``"infeasible"``
        (no split fits).

    Raises
    ------
    InvalidProblemError
        If there are more than :data:`MAX_SPLITS` splits.
    """
    started = time.perf_counter()
    n, S = problem.n, problem.S
    count = comb(n - 1, S - 1)
    if count > MAX_SPLITS:
        raise InvalidProblemError(f"exhaustive: {count} splits of {n} units into {S} chunks (at most {MAX_SPLITS})")
    best, best_value = None, math.inf
    for starts in itertools.combinations(range(1, n), S - 1):
        value = problem.value(starts)
        if value < best_value:
            best, best_value = list(starts), value
    if best is None:
        return problem.result("exhaustive", None, "infeasible", lower_bound=math.inf, started=started,
                              info={"splits": count})
    return problem.result("exhaustive", best, "optimal", lower_bound=best_value, started=started,
                          info={"splits": count})
