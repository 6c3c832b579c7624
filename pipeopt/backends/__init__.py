"""Solver doors shared by every problem: one deadline, one PuLP door, one CP-SAT door, one bisection on T."""

from .cpsat import CpsatOutcome, solve_cpsat
from .deadline import Deadline, DeadlineReached
from .pulp import SOLVERS, PulpOutcome, kill_grace, solve_pulp

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
