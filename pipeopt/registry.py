"""Every problem and every method pipeopt offers, in one table that feeds the CLI, the bench
and the tests.

A *problem class* turns an :class:`~pipeopt.Instance` plus options into a problem object
(e.g. :class:`~pipeopt.problems.partition.PartitionProblem`). A *method*
(:class:`~pipeopt.problems.method.Method`) is a plain function of a problem object whose plan
is scored by :func:`~pipeopt.evaluate`. Each problem folder under :mod:`pipeopt.problems`
declares its own methods (its ``METHODS``); this module only gathers them.
"""

from __future__ import annotations

from .errors import InvalidProblemError
from .problems import bipartition, partition, resource
from .problems.method import Method

MethodSpec = Method
"""Alias kept for readers of older code: a method's declaration."""

PROBLEMS: dict[str, type] = {
    "partition": partition.PROBLEM,
    **resource.PROBLEMS,
    "bipartition": bipartition.PROBLEM,
}

METHODS: list[Method] = [*partition.METHODS, *resource.METHODS, *bipartition.METHODS]


def _check_problem(problem: str) -> None:
    if problem not in PROBLEMS:
        raise InvalidProblemError(f"unknown problem {problem!r}; choose from {sorted(PROBLEMS)}")


def methods(problem: str = "partition") -> list[Method]:
    """Methods of a problem, exact ones first, in table order.

    Raises
    ------
    InvalidProblemError
        If ``problem`` is not a known problem name.
    """
    _check_problem(problem)
    return [m for m in METHODS if m.problem == problem]


def method(problem: str, name: str) -> Method:
    """The declaration of one method.

    Raises
    ------
    InvalidProblemError
        Naming the choices, if ``problem`` or ``name`` is unknown.
    """
    for m in methods(problem):
        if m.name == name:
            return m
    raise InvalidProblemError(
        f"unknown method {name!r} for problem {problem!r}; choose from {[m.name for m in methods(problem)]}"
    )


def problem_class(problem: str) -> type:
    """The problem class of ``problem`` (it accepts ``(instance, **options)``).

    Raises
    ------
    InvalidProblemError
        If ``problem`` is not a known problem name.
    """
    _check_problem(problem)
    return PROBLEMS[problem]
