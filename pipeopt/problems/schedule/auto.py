"""``auto``: the schedule problem's default exact method - ``cpsat`` (:mod:`.free_order`) for
the free order (``schedule="free"``), ``milp`` (:mod:`.milp`, with free W placement
:mod:`.w_placement`) for a fixed order, ``exhaustive`` (:mod:`.exhaustive`) for a fixed order
with ``recompute`` other than ``"none"`` where the MILP does not model it (free W places).
``result.method`` names the method that ran and ``info["chosen"]`` says ``{"by": "auto", "method": ..., "rule": ...}``."""

from __future__ import annotations

import dataclasses

from ...result import Result
from .problem import ScheduleProblem

__all__ = ["choose", "solve_auto"]


def choose(problem: ScheduleProblem) -> tuple[str, str]:
    """``(method name, why)`` of the exact method ``auto`` runs on ``problem``."""
    if problem.is_free:
        return "cpsat", "free order: the CP-SAT model chooses the split and every rank's order"
    if problem.recompute != "none":
        from .milp import recompute_supported

        if recompute_supported(problem):
            return "milp", (f"fixed order ({problem.schedule.name}), recompute={problem.recompute!r}: the event-time"
                            " MILP chooses the split and each chunk's recompute set (its rerun seconds in its B / I)")
        return "exhaustive", (f"recompute={problem.recompute!r} with free W places: every split with its exact"
                              " recompute sets (small chains; the MILP models recomputation with the schedule's W"
                              " places only)")
    return "milp", f"fixed order ({problem.schedule.name}): the event-time MILP chooses the split"


def solve_auto(problem: ScheduleProblem, **kw) -> Result:
    """Solve ``problem`` exactly with the method :func:`choose` names (keyword arguments passed
    on: ``time_limit``, ``solver``, ``seed``, ``threads``).

    Raises
    ------
    InvalidProblemError, InfeasibleError
        As the chosen method raises them.
    """
    name, why = choose(problem)
    if name == "cpsat":
        from .free_order import solve_free_order as run
    elif name == "exhaustive":
        from .exhaustive import exhaustive as run
    else:
        from .milp import solve_milp as run
    res = run(problem, **kw)
    info = dict(res.info)
    info["chosen"] = {"by": "auto", "method": name, "rule": why}
    return dataclasses.replace(res, info=info)
