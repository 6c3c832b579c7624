"""``solve``: one entry point for every problem and method."""

from __future__ import annotations

from . import registry
from .instance import Instance
from .result import Result


def solve(
    instance: Instance,
    *,
    problem: str = "partition",
    method: str = "dp",
    time_limit: float = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    **options,
) -> Result:
    """Pose ``problem`` on ``instance`` and solve it with ``method``.

    Parameters
    ----------
    instance
        The instance.
    problem
        ``"partition"`` (default) or another name in :data:`pipeopt.registry.PROBLEMS`.
    method
        A method of that problem (:func:`pipeopt.registry.methods`).
    time_limit
        Seconds for an exact solver; at the limit it returns its incumbent and bound with
        status ``time_limit``.
    solver
        MILP backend, ``"cbc"`` or ``"highs"``.
    seed
        Seed of randomised methods.
    **options
        Problem options, e.g. ``stages=4, replication=True`` for partition.

    Returns
    -------
    Result

    Raises
    ------
    InvalidProblemError
        Unknown problem, method or option, or a request the instance cannot meet.
    InfeasibleError
        An exact method proved that no plan fits.

    Examples
    --------
    >>> import pipeopt
    >>> from pipeopt.io.pipedream import read_pipedream
    >>> inst = read_pipedream("../shared/data/pipedream-profiles/vgg16.txt")  # doctest: +SKIP
    >>> pipeopt.solve(inst, stages=4).status  # doctest: +SKIP
    <Status.OPTIMAL: 'optimal'>
    """
    spec = registry.method(problem, method)
    cls = registry.problem_class(problem)
    prob = cls(instance, **options)
    return spec.function(prob, time_limit=time_limit, solver=solver, seed=seed)
