"""Every problem and every method pipeopt offers, in one table that feeds the CLI, the bench
and the tests.

A *problem class* turns an :class:`~pipeopt.Instance` plus options into a problem object
(e.g. :class:`~pipeopt.problems.partition.PartitionProblem`). A *method*
(:class:`~pipeopt.problems.method.Method`) is a plain function of a problem object whose plan
is scored by :func:`~pipeopt.evaluate`. Each problem folder under :mod:`pipeopt.problems`
declares its own methods (its ``METHODS``); this module only gathers them.
"""

from __future__ import annotations

import dataclasses
import itertools

from .errors import InvalidProblemError
from .instance import Instance
from .problems import bipartition, partition, placement, resource, schedule
from .problems.method import Method

MethodSpec = Method
"""Alias kept for readers of older code: a method's declaration."""

PROBLEMS: dict[str, type] = {
    "partition": partition.PROBLEM,
    **resource.PROBLEMS,
    "bipartition": bipartition.PROBLEM,
    "placement": placement.PROBLEM,
    "schedule": schedule.PROBLEM,
}

METHODS: list[Method] = [*partition.METHODS, *resource.METHODS, *bipartition.METHODS, *placement.METHODS,
                         *schedule.METHODS]


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


DEFAULT_WORKERS = 4
"""Workers q of the group problem when none are given (capped by the devices)."""

SIZE_OPTIONS = ("stages", "workers")
"""The options that set a problem's size (each problem takes those its class declares)."""


def options_of(problem: str) -> tuple[str, ...]:
    """The options a problem takes: the fields of its problem class after ``instance``
    (e.g. ``("stages", "replication")`` for partition).

    Raises
    ------
    InvalidProblemError
        If ``problem`` is not a known problem name.
    """
    cls = problem_class(problem)
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name != "instance")


def auto_problem(instance: Instance) -> str:
    """The problem an instance is made for: ``"placement"`` under the ``max_load`` objective
    (Tarnawski et al.'s workloads), ``"partition"`` on identical single-kind devices,
    ``"joint"`` (partition and forward/backward split) on identical multi-kind devices,
    ``"group"`` on heterogeneous devices."""
    cluster = instance.cluster
    if instance.settings.objective == "max_load":
        return "placement"
    if not cluster.is_homogeneous:
        return "group"
    dev = cluster.devices[0]
    usable = [k for k, r in dev.resources.items() if r > 0 and k in instance.chain.kinds]
    return "partition" if len(usable) == 1 else "joint"


def sizes(problem: str, instance: Instance, *, stages=None, workers=None) -> list[dict]:
    """The size options to pose ``problem`` with on ``instance``, one dict per size.

    Given counts are used as they are; by default S is ``instance.default_stages`` or the
    cluster's device count, and q is :data:`DEFAULT_WORKERS` capped by the devices. A problem
    that takes neither gets ``[{}]``.

    Parameters
    ----------
    problem
        Problem name.
    instance
        The instance.
    stages, workers
        ``list[int]`` or ``None``.

    Returns
    -------
    list[dict]
        E.g. ``[{"stages": 4}, {"stages": 8}]``.

    Raises
    ------
    InvalidProblemError
        If counts are given for an option the problem does not take.
    """
    takes = options_of(problem)
    refuse_unused(problem, stages=stages, workers=workers)
    n_dev = len(instance.cluster.devices)
    axes = []
    if "stages" in takes:
        axes.append([("stages", s) for s in (stages or instance.default_stages or [n_dev])])
    if "workers" in takes:
        axes.append([("workers", q) for q in (workers or [min(DEFAULT_WORKERS, n_dev)])])
    return [dict(combo) for combo in itertools.product(*axes)]


def unused_options(problem: str, **given) -> list[str]:
    """Names of the options given (not ``None``/``False``) that ``problem`` does not take."""
    takes = options_of(problem)
    return [name for name, value in given.items() if value not in (None, False) and name not in takes]


def refuse_unused(problem: str, **given) -> None:
    """Raise :class:`InvalidProblemError` if an option is given (not ``None``/``False``) that
    ``problem`` does not take: an option is never silently ignored."""
    unused = unused_options(problem, **given)
    if unused:
        raise InvalidProblemError(
            f"the {problem} problem does not use {unused[0]}; its options are {list(options_of(problem))}"
        )
