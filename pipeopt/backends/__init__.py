"""Solver doors shared by every problem: one deadline, one PuLP door, one CP-SAT door, one bisection on T.

The names below are imported from their modules on first use (PEP 562): the deadline is read by
every method, the doors' modules only when a method solves a model.
"""

from __future__ import annotations

import importlib

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


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
