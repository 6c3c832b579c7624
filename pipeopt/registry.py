"""Every problem and every method pipeopt offers, in one table that feeds the CLI, the bench
and the tests.

A *problem class* turns an :class:`~pipeopt.Instance` plus options into a problem object
(e.g. :class:`~pipeopt.problems.partition.PartitionProblem`). A *method*
(:class:`~pipeopt.problems.method.Method`) is a plain function of a problem object whose plan
is scored by :func:`~pipeopt.evaluate`. Each problem folder under :mod:`pipeopt.problems`
declares its own methods (its ``METHODS``); this module only gathers them.

The problems are declared by name (:data:`PACKAGES`); a problem's package, and with it its
methods' modules, is imported the first time the problem's class or methods are asked for, so
that reading the names (``pipeopt --help``) imports no problem.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from .errors import InvalidProblemError
from .problems.method import Method

if TYPE_CHECKING:
    from .instance import Instance

MethodSpec = Method
"""Alias kept for readers of older code: a method's declaration."""

PACKAGES: dict[str, str] = {
    "partition": "pipeopt.problems.partition",
    "allocate": "pipeopt.problems.resource",
    "joint": "pipeopt.problems.resource",
    "group": "pipeopt.problems.resource",
    "bipartition": "pipeopt.problems.bipartition",
    "placement": "pipeopt.problems.placement",
    "schedule": "pipeopt.problems.schedule",
}
"""Problem name -> the package that declares it, one line per problem: the package holds the
problem class (``PROBLEM``, or ``PROBLEMS[name]`` when it declares several problems) and the
methods (``METHODS``, each naming its problem). Names in table order."""


def _package(problem: str):
    """The package declaring ``problem`` (imported on first use)."""
    return importlib.import_module(PACKAGES[problem])


class _Problems(Mapping):
    """Problem name -> problem class; the names are read without importing any problem, a
    class imports its package."""

    def __getitem__(self, problem: str) -> type:
        if problem not in PACKAGES:
            raise KeyError(problem)
        pkg = _package(problem)
        many = getattr(pkg, "PROBLEMS", None)
        return many[problem] if many is not None else pkg.PROBLEM

    def __iter__(self) -> Iterator[str]:
        return iter(PACKAGES)

    def __len__(self) -> int:
        return len(PACKAGES)

    def __contains__(self, problem) -> bool:
        return problem in PACKAGES

    def __repr__(self) -> str:
        return f"<problems {list(PACKAGES)}>"


PROBLEMS: Mapping[str, type] = _Problems()
"""Problem name -> problem class (a read-only mapping; see :data:`PACKAGES`)."""


def _declared(packages) -> list[Method]:
    """The ``METHODS`` of the packages named, each package once, in order."""
    return [m for name in dict.fromkeys(packages) for m in importlib.import_module(name).METHODS]


def __getattr__(name: str):
    """``METHODS``: every method of every problem, a list built (every problem package imported)
    on first read and kept; code that adds methods (tests) extends or replaces this list, and
    :func:`methods` reads it from then on."""
    if name == "METHODS":
        globals()["METHODS"] = value = _declared(PACKAGES.values())
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    table = globals().get("METHODS")  # the full list once read (and maybe extended); else one package's
    if table is None:
        table = _declared([PACKAGES[problem]])
    return [m for m in table if m.problem == problem]


def default_method(problem: str, needs: tuple[str, ...] = ()) -> str:
    """The name of ``problem``'s default exact method: the first exact one in table order that
    models every cost term in ``needs`` (e.g. ``("zero",)`` for ``zero="auto"``), else the first
    exact one (which then refuses what it does not model, naming the methods that do).

    Raises
    ------
    InvalidProblemError
        If ``problem`` is not a known problem name.
    """
    exact = [m for m in methods(problem) if m.exact]
    return next((m.name for m in exact if set(needs) <= m.terms), exact[0].name)


def default_solver(problem: str) -> str:
    """The MILP backend ``solver="auto"`` stands for on ``problem`` (:func:`pipeopt.solve`, the CLI's
    ``--solver``, the bench): the problem package's ``SOLVER`` where it declares one (the schedule
    problem: HiGHS, :data:`pipeopt.problems.schedule.SOLVER`), else ``"cbc"``.

    Raises
    ------
    InvalidProblemError
        If ``problem`` is not a known problem name.
    """
    _check_problem(problem)
    return getattr(_package(problem), "SOLVER", "cbc")


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
