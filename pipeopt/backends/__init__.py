"""Solver doors shared by every problem: one deadline, one PuLP door, one CP-SAT door, one bisection on T.

The names below are imported from their modules on first use (PEP 562): the deadline is read by
every method, the doors' modules only when a method solves a model.
"""

from __future__ import annotations

from ..lazy import lazy_attributes

_WHERE = {
    "CpsatOutcome": ".cpsat",
    "solve_cpsat": ".cpsat",
    "Deadline": ".deadline",
    "DeadlineReached": ".deadline",
    "SOLVERS": ".pulp",
    "PulpOutcome": ".pulp",
    "kill_grace": ".pulp",
    "solve_pulp": ".pulp",
}

__all__ = [
    "SOLVERS",
    "CpsatOutcome",
    "Deadline",
    "DeadlineReached",
    "PulpOutcome",
    "kill_grace",
    "solve_cpsat",
    "solve_pulp",
]


__getattr__, __dir__ = lazy_attributes(__name__, _WHERE)
