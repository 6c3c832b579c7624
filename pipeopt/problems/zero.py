"""The ZeRO stage chosen with the plan, for any problem whose exact method models ZeRO: one
exact solve per stage of :data:`ZERO_STAGES`, the least objective kept.

Each solve is a proven optimum (or a proven infeasibility) over the plans of its ZeRO stage, so
the least of them is a proven optimum over the union. Where a solve stops at its limit the
result says so: status ``TIME_LIMIT`` and the least of the stages' lower bounds (none if a stage
that was not proven infeasible has no bound). Used by :func:`pipeopt.solve` (``zero="auto"``),
the CLI's ``--zero auto`` and :func:`pipeopt.problems.partition.dp.solve_zero_auto`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from ..backends.deadline import Deadline
from ..errors import InfeasibleError
from ..result import Result, Status

__all__ = ["ZERO_STAGES", "best_zero_stage"]

ZERO_STAGES = (0, 1, 2, 3)
"""The ZeRO stages ``zero="auto"`` tries (``Settings.zero``): replicated training state, then the
optimizer state, the gradients and the weights sharded over the ``dp`` replicas."""


def best_zero_stage(solve_stage: Callable[[int, Deadline], Result], time_limit=None) -> Result:
    """The best of one exact solve per ZeRO stage.

    Parameters
    ----------
    solve_stage
        ``solve_stage(zero, deadline) -> Result``: the problem solved exactly on the instance with
        ``Settings.zero = zero``, under ``deadline`` (one clock for all four solves). It raises
        :class:`InfeasibleError` or returns status ``INFEASIBLE`` when it proves that no plan of
        that stage fits.
    time_limit
        Seconds for all four solves together, a :class:`Deadline`, or ``None`` (until proven).

    Returns
    -------
    Result
        The least-objective stage's result (ties: the lower stage, fewer collectives), its plan
        scored on the instance with that stage; ``info["zero_auto"]`` =
        ``{"stages": {stage: objective, "infeasible" or the status}, "chosen": stage}``. Status
        ``OPTIMAL`` only if every stage was solved to optimality or proven infeasible; otherwise
        ``TIME_LIMIT`` with the least of the stages' lower bounds (``None`` if a stage not proven
        infeasible has none), with or without a plan. A stage is proven infeasible when its solve
        raises :class:`InfeasibleError` or returns status ``INFEASIBLE``; if every stage is, the
        last such result (``chosen`` is ``None``).

    Raises
    ------
    InfeasibleError
        If every stage is proven infeasible by an exception (the message lists each stage's).
    InvalidProblemError
        As ``solve_stage`` raises it (a method that does not model ZeRO, a bad option).
    """
    deadline = Deadline.of(time_limit)
    seen: dict = {}
    best, chosen, last, refuted, proven, bounds, missed = None, None, None, None, True, [], []
    refuted_z = None
    for z in ZERO_STAGES:
        try:
            res = solve_stage(z, deadline)
        except InfeasibleError as exc:
            seen[z] = "infeasible"
            missed.append(f"ZeRO-{z}: {exc}")
            continue
        if res.status == Status.INFEASIBLE:  # an exact method's proof that no plan of this stage fits
            seen[z], refuted, refuted_z = "infeasible", res, z
            continue
        last = res
        if res.status != Status.OPTIMAL:
            proven = False
        bounds.append(res.lower_bound)
        seen[z] = res.objective if res.plan is not None else res.status.value
        if res.plan is not None and (best is None or res.objective < best.objective):
            best, chosen = res, z
    if last is None:  # every stage proven infeasible
        if refuted is None:
            raise InfeasibleError("no ZeRO stage gives a plan that fits: " + "; ".join(missed))
        info = {**refuted.info, "zero_auto": {"stages": seen, "chosen": None}}
        if info.get("note"):  # the shortfall said is the last stage's (ZeRO-3: the least memory)
            info["note"] = f"every ZeRO stage refuted; at ZeRO-{refuted_z}: {info['note']}"
        return dataclasses.replace(refuted, info=info, runtime=deadline.elapsed())
    out = best if best is not None else last
    info = {**out.info, "zero_auto": {"stages": seen, "chosen": chosen}}
    if proven:
        return dataclasses.replace(out, info=info, runtime=deadline.elapsed())
    bound = None if any(b is None for b in bounds) else min(bounds)
    return dataclasses.replace(out, status=Status.TIME_LIMIT, lower_bound=bound, info=info,
                               runtime=deadline.elapsed())
