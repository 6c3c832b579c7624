"""The exact partition plan under each activation recomputation option, side by side.

:func:`compare` runs one exact method that models recomputation (:mod:`.recompute`) with
``recompute`` = ``"none"``, ``"full"`` and ``"auto"`` on one instance and returns a row per
option: the rows a benchmark or a README table prints (``pipeopt solve --recompute`` prints
one plan).
"""

from __future__ import annotations

from ...backends.deadline import Deadline
from ...errors import InfeasibleError, InvalidProblemError
from .auto import solve_auto
from .dp import solve_dp
from .problem import PartitionProblem
from .recompute import RECOMPUTE


def compare(instance, stages: int | None = None, *, method: str = "dp", modes=RECOMPUTE,
            time_limit: float | None = 60.0, solver: str = "cbc") -> list[dict]:
    """The exact plan of ``instance`` under each ``recompute`` option, side by side (a benchmark's
    rows; ``pipeopt solve --recompute`` prints one of them).

    Parameters
    ----------
    instance
        A partition instance (identical one-kind devices).
    stages
        S (default: the cluster's devices).
    method
        An exact partition method that models recomputation (``"dp"``, ``"milp"``, ``"auto"``),
        run directly on :class:`~pipeopt.problems.partition.problem.PartitionProblem`.
    modes
        The ``recompute`` options to run (default all of :data:`RECOMPUTE`).
    time_limit, solver
        Per solve: seconds (``None``: no limit) and the MILP backend.

    Returns
    -------
    list[dict]
        Per option: ``recompute``, ``status`` (``"infeasible"`` with ``error``, the message that
        says by how much the best split misses memory), ``objective`` and ``lower_bound``
        (seconds per microbatch), ``runtime`` (s), ``recomputed`` (layers recomputed in all) and
        ``stages``: per stage its first and last layer, layer count, ``recomputed`` (count),
        ``time`` (s) and ``memory`` (bytes, :func:`pipeopt.evaluate`'s).
    """
    from .milp import solve_milp  # PuLP only where the MILP runs

    run = {"dp": solve_dp, "milp": solve_milp, "auto": solve_auto}
    if method not in run:
        raise InvalidProblemError(f"compare runs an exact method that models recomputation: one of {list(run)}, "
                                  f"got {method!r}")
    S = len(instance.cluster.devices) if stages is None else stages
    rows = []
    for rc in modes:
        try:
            res = run[method](PartitionProblem(instance, S, recompute=rc), time_limit=Deadline(time_limit),
                              solver=solver)
        except InfeasibleError as err:
            rows.append({"recompute": rc, "status": "infeasible", "error": str(err)})
            continue
        ev = res.evaluation
        rows.append({
            "recompute": rc, "method": res.method, "status": str(res.status.value), "objective": res.objective,
            "lower_bound": res.lower_bound, "runtime": res.runtime,
            "recomputed": sum(len(st.recompute or {}) for st in res.plan.stages),
            "stages": [{"first": st.layers[0], "last": st.layers[-1], "layers": len(st.layers),
                        "recomputed": len(st.recompute or {}), "time": ev.stage_time[i], "memory": ev.memory[i]}
                       for i, st in enumerate(res.plan.stages)],
        })
    return rows
