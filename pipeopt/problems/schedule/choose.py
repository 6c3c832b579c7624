"""Which schedule? Every shipped schedule's exact split, side by side under one deadline, and
the least iteration time among them (``pipeopt solve ... --schedule auto``).

:func:`solve_schedules` runs one method of the schedule problem (default the exact ``milp``,
:func:`pipeopt.problems.schedule.milp.solve_milp`) for each schedule of
:data:`pipeopt.schedules.TORCH_SCHEDULES` (a schedule that refuses the request - e.g.
DualPipeV with m < 2p, or more chunks than layers - gets a row saying why). **One** deadline
covers them all: the k-th of K schedules gets ``1 / (K - k)`` of what is left when its turn
comes (time a schedule leaves unused passes to the next ones), so the call ends within the
time limit plus the last step's overrun; a schedule whose share ran out before a proof says
``time_limit`` with its incumbent and bound, never ``optimal``. :func:`best_schedule`
returns the least iteration time found, and says whether it is *proven* least: its time is at
most every other schedule's proven lower bound.
"""

from __future__ import annotations

import math

from ...backends.deadline import Deadline
from ...errors import InvalidProblemError, PipeoptError
from ...result import Result
from ...schedules import FREE, TORCH_SCHEDULES, schedule_name
from ...schedules.torch_orders import STAGES_PER_RANK
from .problem import SOLVER, ScheduleProblem

__all__ = ["SPLITS_BACKWARD", "best_schedule", "schedule_table", "solve_schedules"]

SPLITS_BACKWARD = ("InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""The schedules with W (weight-gradient) actions: those ``w_placement="free"`` applies to."""


def solve_schedules(instance, ranks: int | None = None, microbatches: int | None = None, names=None, *,
                    stages_per_rank: int | None = None, time_limit: float | Deadline | None = 60.0,
                    solver: str = "auto", seed: int = 0, threads: int = 1, w_placement: str = "schedule",
                    method: str = "milp") -> list:
    """Solve each schedule's split under one deadline (module docstring).

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance` (identical one-kind devices, at least ``ranks`` of them).
    ranks, microbatches
        p (default: every device) and m (default: the instance's ``settings.microbatches``).
    names
        Schedule names in any spelling of :func:`pipeopt.schedules.schedule_name` (default,
        or ``"auto"``: all of :data:`pipeopt.schedules.TORCH_SCHEDULES`).
    stages_per_rank
        v for the schedules that take any v (default 2); GPipe / 1F1B use 1, ZBV and
        DualPipeV 2 (with ``names`` given, a v they do not run is refused in their row).
    time_limit
        Seconds (or a :class:`~pipeopt.backends.deadline.Deadline`) for **all** the schedules
        together; ``None``: no limit.
    solver, seed, threads
        As :func:`pipeopt.solve`.
    w_placement
        :attr:`ScheduleProblem.w_placement`. ``"free"`` with ``names`` given: a named schedule
        without W actions is refused in its row; with every schedule it applies to the
        zero-bubble ones (:data:`SPLITS_BACKWARD`) and the others run their own order.
    method
        A method of the schedule problem (:data:`pipeopt.problems.schedule.METHODS`).

    Returns
    -------
    list[Result | tuple[str, str]]
        One entry per schedule: its :class:`pipeopt.Result` (``info["schedule"]`` its
        canonical name), or ``(name, why)`` if the schedule refuses the request.

    Raises
    ------
    InvalidProblemError
        An unknown schedule name or method, a bad time limit.
    """
    from . import METHODS  # the package's own table (importing the registry would go upwards)

    deadline = Deadline.of(time_limit)
    solver = SOLVER if solver == "auto" else solver
    spec = next((m for m in METHODS if m.name == method), None)
    if spec is None:
        raise InvalidProblemError(
            f"unknown method {method!r} for problem 'schedule'; choose from {[m.name for m in METHODS]}"
        )
    auto = names is None or (isinstance(names, str) and schedule_name_or_auto(names) == "auto")
    if auto:
        todo = list(TORCH_SCHEDULES)
    else:
        todo = [schedule_name(n) for n in ([names] if isinstance(names, str) else names)]
    out = []
    for k, name in enumerate(todo):
        # with every schedule, v applies to those that take any v; a named schedule is told it
        # (make_schedule refuses a v it does not run: an option is never silently ignored)
        v = None if auto and name in STAGES_PER_RANK else stages_per_rank
        wp = "schedule" if auto and name not in SPLITS_BACKWARD else w_placement
        try:
            problem = ScheduleProblem(instance, name, ranks, microbatches, v, w_placement=wp)
        except PipeoptError as exc:
            out.append((name, str(exc)))
            continue
        share = deadline.sub(fraction=1.0 / (len(todo) - k))
        out.append(spec.function(problem, time_limit=share, solver=solver, seed=int(seed), threads=threads))
    return out


def schedule_name_or_auto(text) -> str:
    """``"auto"`` (any case) or the canonical name of ``text``
    (:func:`pipeopt.schedules.schedule_name`)."""
    if isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    return schedule_name(text, among=(*TORCH_SCHEDULES, FREE))


def _fits(r) -> bool:
    return (isinstance(r, Result) and r.plan is not None and r.evaluation is not None and r.evaluation.feasible
            and math.isfinite(r.objective))


def best_schedule(results) -> tuple[Result | None, bool]:
    """The result of least iteration time among ``results`` (entries of
    :func:`solve_schedules`; ties: a proven one first), and whether it is proven least: its
    time is at most every other schedule's lower bound (and its own status is optimal).
    ``(None, False)`` if no schedule has a split that fits."""
    done = [r for r in results if _fits(r)]
    if not done:
        return None, False
    best = min(done, key=lambda r: (r.objective, r.status != "optimal"))
    proven = best.status == "optimal" and all(
        r is best or (r.lower_bound is not None and r.lower_bound >= best.objective * (1 - 1e-9))
        or r.status == "infeasible"
        for r in results if isinstance(r, Result))
    return best, proven


def schedule_table(results) -> str:
    """A text table: schedule, v, chunks, status, iteration time, bound, gap, solve time (ms /
    s), one row per entry of :func:`solve_schedules`."""
    head = (f"{'schedule':<22} {'v':>2} {'chunks':>6} {'status':<11} {'iteration ms':>13} {'bound ms':>11}"
            f" {'gap':>7} {'solve s':>8}")
    lines = [head, "-" * len(head)]
    for r in results:
        if not isinstance(r, Result):
            lines.append(f"{r[0]:<22} {'':>2} {'':>6} {'refused':<11} {r[1]}")
            continue
        v = r.info.get("stages_per_rank", "")
        chunks = r.info.get("chunks", "")
        it = f"{r.objective * 1e3:.4f}" if _fits(r) or (r.plan is not None and math.isfinite(r.objective)) else "-"
        lb = f"{r.lower_bound * 1e3:.4f}" if r.lower_bound is not None and math.isfinite(r.lower_bound) else "-"
        gap = f"{r.gap:.2%}" if r.gap is not None else "-"
        lines.append(f"{r.info.get('schedule', r.method):<22} {v!s:>2} {chunks!s:>6} {r.status!s:<11} {it:>13}"
                     f" {lb:>11} {gap:>7} {r.runtime:>8.2f}")
    return "\n".join(lines)
