"""The one CP-SAT door: solve a :class:`~ortools.sat.python.cp_model.CpModel` under a :class:`Deadline`.

Every CP-SAT model of pipeopt is solved here, so the parameters (time left, threads, seed,
gap), the hint and the reading of status and bound are written once, in OR-Tools' snake_case
API. CP-SAT checks its time limit often, but a large model can spend long in loading and
presolve; a watchdog thread calls :meth:`CpSolver.stop_search` at the deadline plus
:func:`~pipeopt.backends.pulp.kill_grace`, which CP-SAT honours at its next check (presolve
included).

*threads* are CP-SAT's parallel search workers (``num_workers``); in pipeopt the word
*workers* means pipeline workers.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from ..errors import InvalidProblemError
from .deadline import Deadline
from .pulp import kill_grace

__all__ = ["CpsatOutcome", "solve_cpsat"]

_STATUS = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.UNKNOWN: "no_solution",
}


@dataclass
class CpsatOutcome:
    """What one CP-SAT solve produced.

    Attributes
    ----------
    status
        ``"optimal"`` (proven, within ``rel_gap``), ``"feasible"`` (stopped with an
        incumbent), ``"infeasible"`` (proven) or ``"no_solution"`` (stopped without one, or the
        deadline had passed before the call: then no solver ran).
    solver
        The :class:`CpSolver` after the solve (read values with :meth:`value`), ``None`` if
        none ran.
    objective
        The incumbent's objective in the model's integer units, or ``None`` (no solution or
        no objective).
    bound
        CP-SAT's proven bound (``best_objective_bound``: a lower bound when minimising, an
        upper bound when maximising) in the same units, or ``None`` if unknown (always
        ``None`` without a solution: CP-SAT's response then may hold a default 0). Never
        beyond ``objective``.
    runtime
        Wall seconds spent in the door.
    stopped
        ``True`` if the watchdog had to stop the search at the deadline (CP-SAT's own limit
        had not).
    solver_status
        CP-SAT's status name.
    notes
        Remarks for ``Result.info``.
    """

    status: str
    solver: cp_model.CpSolver | None = None
    objective: float | None = None
    bound: float | None = None
    runtime: float = 0.0
    stopped: bool = False
    solver_status: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def has_solution(self) -> bool:
        """``True`` if the outcome carries a solution (status optimal or feasible)."""
        return self.status in ("optimal", "feasible")

    @property
    def proven(self) -> bool:
        """``True`` if CP-SAT proved optimality (status ``"optimal"``)."""
        return self.status == "optimal"

    def value(self, expr) -> int:
        """Value of a variable or linear expression in the solution.

        Raises
        ------
        RuntimeError
            If the outcome has no solution.
        """
        if not self.has_solution or self.solver is None:
            raise RuntimeError(f"CP-SAT outcome {self.status!r} has no solution to read")
        return self.solver.value(expr)

    def boolean_value(self, literal) -> bool:
        """Value of a Boolean literal in the solution (see :meth:`value`)."""
        if not self.has_solution or self.solver is None:
            raise RuntimeError(f"CP-SAT outcome {self.status!r} has no solution to read")
        return bool(self.solver.boolean_value(literal))

    def info(self) -> dict:
        """The outcome's facts as a dict for ``Result.info``."""
        out = {
            "solver": "cp-sat",
            "solver_status": self.solver_status,
            "door_status": self.status,
            "solver_objective": self.objective,
            "solver_bound": self.bound,
            "solver_runtime": self.runtime,
            "solver_stopped": self.stopped,
        }
        if self.solver is not None:
            out["branches"] = int(self.solver.num_branches)
        if self.notes:
            out["solver_notes"] = list(self.notes)
        return out


def _maximises(model: cp_model.CpModel) -> bool:
    """``True`` if the model's objective is a maximisation."""
    proto = model.proto
    if proto.has_floating_point_objective():
        return bool(proto.floating_point_objective.maximize)
    return proto.objective.scaling_factor < 0


def solve_cpsat(
    model: cp_model.CpModel,
    *,
    deadline: Deadline | None = None,
    threads: int = 2,
    seed: int = 0,
    hint: dict | None = None,
    rel_gap: float = 0.0,
    log: bool = False,
    parameters: dict | None = None,
    grace: float | None = None,
    callback: cp_model.CpSolverSolutionCallback | None = None,
) -> CpsatOutcome:
    """Solve ``model`` with CP-SAT, stopping at the deadline.

    Parameters
    ----------
    model
        The CP-SAT model (with or without objective). If ``hint`` is given, the model's
        previous hints are cleared and replaced by it.
    deadline
        The solve's clock (:class:`~pipeopt.backends.deadline.Deadline`); CP-SAT gets what is
        left as ``max_time_in_seconds``. ``None``: no limit. If it has already passed, the
        solver is not called and the outcome is ``"no_solution"``.
    threads
        CP-SAT search threads (``num_workers``), >= 1. CP-SAT's portfolio is much weaker
        with one.
    seed
        ``random_seed`` (>= 0).
    hint
        Solution hint: variable -> value (Booleans as 0/1 or bool).
    rel_gap
        ``relative_gap_limit``: CP-SAT stops and reports optimal once the gap is within it.
    log
        Print CP-SAT's search log (``log_search_progress``).
    parameters
        Further :class:`SatParameters` fields by name (e.g. ``{"symmetry_level": 0}``); they
        cannot override the time limit, threads or seed.
    grace
        Seconds after the deadline before the watchdog stops the search (default
        :func:`~pipeopt.backends.pulp.kill_grace`).
    callback
        A solution callback passed to :meth:`CpSolver.solve`.

    Returns
    -------
    CpsatOutcome

    Raises
    ------
    InvalidProblemError
        If a numeric option is out of range or ``parameters`` names an unknown field.
    RuntimeError
        If CP-SAT says the model is invalid (a bug in the model, not in the input).
    """
    entry = time.perf_counter()
    deadline = Deadline(None) if deadline is None else deadline
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidProblemError(f"solve_cpsat: threads must be an integer >= 1, got {threads!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidProblemError(f"solve_cpsat: seed must be an integer >= 0, got {seed!r}")
    if not (isinstance(rel_gap, (int, float)) and math.isfinite(rel_gap) and rel_gap >= 0):
        raise InvalidProblemError(f"solve_cpsat: rel_gap must be a finite number >= 0, got {rel_gap!r}")
    if deadline.expired():
        return CpsatOutcome("no_solution", runtime=time.perf_counter() - entry, solver_status="not run",
                            notes=["the deadline had passed before the solve"])
    if hint is not None:
        model.clear_hints()
        for var, val in hint.items():
            model.add_hint(var, int(val))
    solver = cp_model.CpSolver()
    p = solver.parameters
    for key, val in (parameters or {}).items():
        if key in ("max_time_in_seconds", "num_workers", "num_search_workers", "random_seed"):
            raise InvalidProblemError(f"solve_cpsat: set {key!r} through the door's own arguments")
        try:
            setattr(p, key, val)
        except (AttributeError, TypeError, ValueError) as exc:
            raise InvalidProblemError(f"solve_cpsat: bad CP-SAT parameter {key}={val!r}: {exc}") from exc
    p.num_workers = threads
    p.random_seed = seed
    p.relative_gap_limit = float(rel_gap)
    p.log_search_progress = bool(log)
    watchdog = None
    fired = threading.Event()
    if deadline.bounded:
        p.max_time_in_seconds = max(deadline.remaining(), 1e-3)
        grace = kill_grace(deadline.limit) if grace is None else float(grace)

        def stop():
            fired.set()
            solver.stop_search()

        watchdog = threading.Timer(deadline.remaining() + grace, stop)
        watchdog.daemon = True
        watchdog.start()
    try:
        code = solver.solve(model, callback)
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {model.validate()}")
    status = _STATUS.get(code, "no_solution")
    has_objective = model.has_objective()
    objective = bound = None
    if status in ("optimal", "feasible") and has_objective:
        objective = float(solver.objective_value)
    if has_objective and status in ("optimal", "feasible"):  # without a solution CP-SAT's
        # response may hold the field's default 0, which is no bound
        b = float(solver.best_objective_bound)
        if math.isfinite(b):
            bound = b
            if objective is not None:  # clamp: never beyond the incumbent
                bound = max(bound, objective) if _maximises(model) else min(bound, objective)
    notes = []
    if fired.is_set():
        notes.append("CP-SAT stopped by the watchdog at the deadline (its own limit had not stopped it)")
    return CpsatOutcome(
        status=status,
        solver=solver,
        objective=objective,
        bound=bound,
        runtime=time.perf_counter() - entry,
        stopped=fired.is_set(),
        solver_status=solver.status_name(code),
        notes=notes,
    )
