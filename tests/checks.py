"""Shared assertions: one exact method's answer against another's on the same problem object.
(References built from the problems' definitions alone are in ``tests/brute_force.py``; random
instances in ``tests/strategies.py``.)"""

from __future__ import annotations

import math


def assert_milp_equals_exhaustive(problem) -> None:
    """The schedule MILP (:func:`pipeopt.problems.schedule.solve_milp`, no time limit) and
    :func:`pipeopt.problems.schedule.exhaustive` on ``problem`` (a
    :class:`pipeopt.problems.schedule.ScheduleProblem`): both infeasible, or the MILP optimal with
    exhaustive's objective (relative 1e-6), a bound at or below it, and a claim equal to the
    executor's time of its plan."""
    from pipeopt.problems.schedule import exhaustive, solve_milp
    from pipeopt.schedules import run_schedule

    ex, mi = exhaustive(problem), solve_milp(problem, time_limit=None)
    if ex.status == "infeasible":
        assert mi.status == "infeasible", mi.info
        return
    assert mi.status == "optimal", mi.info
    assert math.isclose(mi.objective, ex.objective, rel_tol=1e-6, abs_tol=1e-12), (
        problem.recompute, mi.objective, ex.objective)
    assert mi.lower_bound <= mi.objective * (1 + 1e-9)
    assert mi.objective == run_schedule(problem.instance, problem.schedule, mi.plan).time
