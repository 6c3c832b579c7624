"""Which schedule? Every shipped schedule's exact split, side by side, and the least
iteration time among them (``pipeopt solve ... --schedule auto``).

:func:`solve_schedules` solves :func:`pipeopt.problems.schedule.milp.solve_milp` for each
schedule of :data:`pipeopt.schedules.GENERATORS` (a schedule that refuses the request - e.g.
DualPipeV with m < 2p, or more chunks than layers - gets a row saying why), each with its own
time limit; :func:`best_schedule` returns the least iteration time found, and says whether it
is *proven* least: its time is at most every other schedule's proven lower bound.
"""

from __future__ import annotations

import math

from ...errors import PipeoptError
from ...schedules import GENERATORS
from ...schedules.torch_orders import STAGES_PER_RANK
from .milp import solve_milp
from .problem import ScheduleProblem, ScheduleResult

__all__ = ["best_schedule", "schedule_table", "solve_schedules"]


def solve_schedules(instance, ranks: int, microbatches: int, names=None, *, stages_per_rank: int | None = None,
                    time_limit: float | None = 60.0, solver: str = "cbc", seed: int = 0,
                    w_placement: str = "schedule") -> list:
    """Solve each schedule's split exactly.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance` (identical one-kind devices, at least ``ranks`` of them).
    ranks, microbatches
        p and m.
    names
        Schedule names (default: all of :data:`pipeopt.schedules.GENERATORS`).
    stages_per_rank
        v for the schedules that take any v (default 2); GPipe / 1F1B use 1, ZBV and
        DualPipeV 2 (with ``names`` given, a v they do not run is refused in their row).
    time_limit, solver, seed
        Per schedule (:func:`~pipeopt.problems.schedule.milp.solve_milp`).
    w_placement
        :attr:`ScheduleProblem.w_placement`. ``"free"`` with ``names`` given: a named schedule
        without W actions is refused in its row; with every schedule (``names=None``) it applies
        to the zero-bubble ones (those with W actions) and the others run their own order.

    Returns
    -------
    list[ScheduleResult | tuple[str, str]]
        One entry per name: its result, or ``(name, why)`` if the schedule refuses the request.
    """
    out = []
    auto = names is None
    for name in names or list(GENERATORS):
        # with every schedule, v applies to those that take any v; a named schedule is told it
        # (make_schedule refuses a v it does not run: an option is never silently ignored)
        v = None if auto and name in STAGES_PER_RANK else stages_per_rank
        try:
            problem = ScheduleProblem(instance, name, ranks, microbatches, v)
            if w_placement != "schedule" and (not auto or problem.schedule.splits_backward):
                problem = ScheduleProblem(instance, problem.schedule, w_placement=w_placement)
        except PipeoptError as exc:
            out.append((name, str(exc)))
            continue
        out.append(solve_milp(problem, time_limit=time_limit, solver=solver, seed=seed))
    return out


def best_schedule(results) -> tuple[ScheduleResult | None, bool]:
    """The result of least iteration time among ``results`` (entries of
    :func:`solve_schedules`; ties: a proven one first), and whether it is proven least: its
    time is at most every other schedule's lower bound (and its own status is optimal).
    ``(None, False)`` if no schedule has a split that fits."""
    done = [r for r in results if isinstance(r, ScheduleResult) and math.isfinite(r.objective)]
    if not done:
        return None, False
    best = min(done, key=lambda r: (r.objective, r.status != "optimal"))
    proven = best.status == "optimal" and all(
        r is best or (r.lower_bound is not None and r.lower_bound >= best.objective * (1 - 1e-9))
        or (isinstance(r, ScheduleResult) and r.status == "infeasible")
        for r in results if isinstance(r, ScheduleResult))
    return best, proven


def schedule_table(results) -> str:
    """A text table: schedule, v, chunks, status, iteration time, bound, gap, solve time (ms /
    s), one row per entry of :func:`solve_schedules`."""
    head = f"{'schedule':<22} {'v':>2} {'chunks':>6} {'status':<11} {'iteration ms':>13} {'bound ms':>11} {'gap':>7} {'solve s':>8}"
    lines = [head, "-" * len(head)]
    for r in results:
        if not isinstance(r, ScheduleResult):
            lines.append(f"{r[0]:<22} {'':>2} {'':>6} {'refused':<11} {r[1]}")
            continue
        v = r.info.get("stages_per_rank", "")
        chunks = r.info.get("chunks", "")
        it = f"{r.objective * 1e3:.4f}" if math.isfinite(r.objective) else "-"
        lb = f"{r.lower_bound * 1e3:.4f}" if r.lower_bound is not None and math.isfinite(r.lower_bound) else "-"
        gap = f"{r.gap:.2%}" if r.gap is not None else "-"
        lines.append(f"{r.schedule:<22} {v!s:>2} {chunks!s:>6} {r.status:<11} {it:>13} {lb:>11} {gap:>7} {r.runtime:>8.2f}")
    return "\n".join(lines)
