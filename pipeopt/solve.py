"""``solve``: one entry point for every problem and method; the CLI and the bench call it."""

from __future__ import annotations

import dataclasses
import numbers
from typing import TYPE_CHECKING

from . import registry
from .backends.deadline import Deadline
from .errors import InvalidProblemError

if TYPE_CHECKING:  # imported where used: ``import pipeopt`` imports this module
    from .instance import Instance
    from .result import Result

SOLVERS = ("cbc", "highs")
"""MILP backends (PuLP's CBC, HiGHS through highspy)."""


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise InvalidProblemError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def check_solver_and_seed(solver, seed) -> None:
    """Raise :class:`InvalidProblemError` unless ``solver`` is one of :data:`SOLVERS` or ``"auto"`` and
    ``seed`` an integer (shared by :func:`solve` and the bench, which checks before any work)."""
    if solver not in (*SOLVERS, "auto"):
        raise InvalidProblemError(f"unknown solver {solver!r}; choose from {[*SOLVERS, 'auto']}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InvalidProblemError(f"seed must be an integer, got {seed!r}")


def check_options(problem: str, options: dict) -> None:
    """Raise :class:`InvalidProblemError` if ``options`` holds a name the problem does not take
    (an option is never silently ignored).

    Parameters
    ----------
    problem
        Problem name (:data:`pipeopt.registry.PROBLEMS`).
    options
        ``dict[str, object]``: the problem options given, e.g. ``{"stages": 4}``.
    """
    cls = registry.problem_class(problem)
    accepted = registry.options_of(problem)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidProblemError(
            f"the {problem} problem takes no option {', '.join(map(repr, unknown))}; "
            f"its options are {list(accepted)}"
        )
    missing = [
        f.name for f in dataclasses.fields(cls)
        if f.init and f.name != "instance" and f.name not in options
        and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise InvalidProblemError(f"the {problem} problem needs the option(s) {missing}, e.g. stages=4")


def solve(
    instance: Instance,
    *,
    problem: str = "auto",
    method: str | None = None,
    time_limit: float | None = 60.0,
    solver: str = "auto",
    seed: int = 0,
    threads: int = 2,
    zero: int | str | None = None,
    **options,
) -> Result:
    """Pose ``problem`` on ``instance`` and solve it with ``method``, under one clock.

    The time limit starts here: a :class:`~pipeopt.backends.deadline.Deadline` is created at
    entry and everything the method does (start heuristics, bounds, bisection steps, solver
    calls) draws from it; ``Result.runtime`` is the wall time since entry.

    Parameters
    ----------
    instance
        The instance.
    problem
        A name in :data:`pipeopt.registry.PROBLEMS`, or ``"auto"`` (default): the problem the
        instance is made for (:func:`pipeopt.registry.auto_problem`: ``"placement"`` under the
        ``max_load`` objective, ``"partition"`` on identical single-kind devices, ...).
    method
        A method of that problem (:func:`pipeopt.registry.methods`); ``None`` (default): its
        first exact method, the one that proves fastest at the instance's size: for partition
        ``"auto"`` (:mod:`pipeopt.problems.partition.auto`: ``dp`` on short chains, ``probe``
        beyond, ``milp`` for the ``iteration``/``gpipe`` objectives; ``result.method`` names
        the method that ran and ``result.info["chosen"]`` the rule), for group ``"types"``,
        for placement ``"dp"``.
    time_limit
        Seconds of wall time for the whole call (positive; ``None`` for no limit). An exact
        method that reaches it returns its incumbent and its proven bound with status
        ``time_limit``.
    solver
        MILP backend, ``"cbc"``, ``"highs"`` or ``"auto"`` (default): the problem's own
        (:func:`pipeopt.registry.default_solver`: HiGHS for the schedule problem, CBC for the others).
    seed
        Seed of randomised methods and solvers (an integer).
    threads
        Search threads of CP-SAT (a positive integer).
    zero
        The ZeRO stage (optimizer sharding over the instance's ``Settings.dp`` data-parallel
        replicas): ``None`` (default) keeps the instance's ``Settings.zero``; ``0``..``3`` solves
        under that stage; ``"auto"`` chooses it with the plan, with any exact method that models
        ZeRO (the partition problem's ``dp`` / ``auto``, the schedule problem's methods): one exact
        solve per stage under this call's clock, the least objective kept,
        :func:`pipeopt.problems.zero.best_zero_stage`; ``info["zero_auto"]`` gives each stage's
        objective and the chosen one, and the result's evaluation is on the instance with that
        stage, ``instance.with_settings(zero=chosen)``. The CLI's ``--zero``.
    **options
        Problem options, e.g. ``stages=4, replication=True`` for partition,
        ``workers=3`` for group.

    Returns
    -------
    Result

    Raises
    ------
    InvalidProblemError
        Unknown problem, method, solver or option, a bad time limit, seed or thread count,
        or a request the instance cannot meet.
    InfeasibleError
        An exact method proved that no plan fits.

    Examples
    --------
    >>> import pipeopt
    >>> inst = pipeopt.read("../shared/data/pipedream-profiles/vgg16.txt")  # doctest: +SKIP
    >>> pipeopt.solve(inst, stages=4).status  # doctest: +SKIP
    <Status.OPTIMAL: 'optimal'>
    """
    from .instance import Instance

    deadline = Deadline(time_limit)
    if not isinstance(instance, Instance):
        raise InvalidProblemError(f"solve needs a pipeopt.Instance, got {type(instance).__name__}")
    check_solver_and_seed(solver, seed)
    threads = _positive_int(threads, "threads")
    if zero is not None and zero != "auto":
        if isinstance(zero, bool) or not isinstance(zero, numbers.Integral) or zero not in (0, 1, 2, 3):
            raise InvalidProblemError(f"zero must be 0, 1, 2, 3 or 'auto', got {zero!r}")
        instance = instance.with_settings(zero=int(zero))
    if problem == "auto":
        problem = registry.auto_problem(instance)
    if solver == "auto":
        solver = registry.default_solver(problem)
    if method is None:  # the problem's default exact method (with zero='auto': the first that models ZeRO)
        method = registry.default_method(problem, ("zero",) if zero == "auto" else ())
    spec = registry.method(problem, method)
    check_options(problem, options)
    if zero == "auto":  # the ZeRO stage chosen with the plan: one exact solve per stage, one clock
        if not spec.exact or "zero" not in spec.terms:
            able = [f"{problem}/{m.name}" for m in registry.methods(problem) if m.exact and "zero" in m.terms]
            raise InvalidProblemError(
                f"zero='auto' chooses the ZeRO stage by exact solves of a method that models ZeRO, not {problem}/{method}; "
                + (f"use {', '.join(able)}, or give zero=0..3" if able else "give zero=0..3"))
        from .problems.zero import best_zero_stage

        return best_zero_stage(lambda z, dl: _run(problem, spec, instance.with_settings(zero=z), options, dl,
                                                  solver, int(seed), threads), deadline)
    return _run(problem, spec, instance, options, deadline, solver, int(seed), threads)


def _run(problem: str, spec, instance: Instance, options: dict, deadline, solver: str, seed: int, threads: int):
    """Check that ``spec`` models what ``instance`` and ``options`` ask, then run it."""
    missing = spec.unmodelled(instance)
    if missing:
        able = [m.name for m in registry.methods(problem) if m.exact and not m.unmodelled(instance)]
        raise InvalidProblemError(
            f"the exact method {problem}/{spec.name} does not model {' or '.join(missing)}: it would claim an optimum "
            "of another cost model; set them to 0 or "
            + (f"use a method that models them ({', '.join(able)})" if able
               else f"use the partition problem (no exact {problem} method models them yet)" if problem != "partition"
               else "use a heuristic, scored by evaluate (no exact partition method models them yet)")
        )
    recompute = options.get("recompute", "none")
    if recompute != "none" and "recompute" not in spec.terms:  # never a plan that ignores what was asked
        able = [m.name for m in registry.methods(problem) if "recompute" in m.terms]
        raise InvalidProblemError(
            f"the method {problem}/{spec.name} does not model activation recomputation (recompute={recompute!r}); "
            f"use {' or '.join(able) or 'none of them'}, or recompute='none'"
        )
    prob = registry.problem_class(problem)(instance, **options)
    return spec.function(prob, time_limit=deadline, solver=solver, seed=seed, threads=threads)
