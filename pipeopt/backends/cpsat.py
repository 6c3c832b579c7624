"""The one CP-SAT door: solve a :class:`~ortools.sat.python.cp_model.CpModel` under a :class:`Deadline`.

Every CP-SAT model of pipeopt is solved here, so the parameters (time left, threads, seed,
gap), the hint and the reading of status and bound are written once, in OR-Tools' snake_case
API.

How the deadline holds
----------------------
CP-SAT checks its time limit often, but not everywhere: loading and presolve of a large
model can run far past it, and :meth:`CpSolver.stop_search` is honoured only at the same
checkpoints (the partition model with S = 400 on NASNet-A Large, whose presolve expands
element constraints into about 600k Booleans, ran 14 s on a 5 s limit with a watchdog
calling ``stop_search``). So when the deadline is bounded the door solves in a **forked
child process** and ends it at the deadline plus :func:`~pipeopt.backends.pulp.kill_grace`:

* the parent sets the parameters (``max_time_in_seconds`` = the time left) and the hint,
  then forks (``os.fork``: the child shares the model, nothing is copied or serialised;
  a few milliseconds);
* the child runs :meth:`CpSolver.solve` with a solution callback that streams every
  incumbent (objective, bound, the values of all model variables) and every bound
  improvement through a pipe, sends the final response and exits;
* the parent reads the pipe until the final response arrives or the deadline plus the
  grace passes; then it ends the child (``SIGKILL``; reaped in a background thread) and
  reports the last incumbent it received (``"feasible"``, with the last proven bound) or
  ``"no_solution"``. On Linux the child also dies with its parent.

CP-SAT normally stops itself at its limit; the kill is the guarantee. An unbounded
deadline, a solution ``callback`` (it must run in this process), ``isolate=False`` and
platforms without ``fork`` solve in this process; with a bounded deadline a watchdog thread
then calls :meth:`CpSolver.stop_search` at the deadline plus the grace, which CP-SAT
honours at its next check only. Forking is safe while no other CP-SAT solve runs in
another thread of the parent; if one does, the child may hang, and the kill still ends it
at the deadline (``"no_solution"``).

*threads* are CP-SAT's parallel search workers (``num_workers``); in pipeopt the word
*workers* means pipeline workers.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field

from ..lazy import lazy_module
from ..errors import InvalidProblemError
from .deadline import Deadline
from .pulp import kill_grace

cp_model = lazy_module("ortools.sat.python.cp_model")
cmh = lazy_module("ortools.sat.python.cp_model_helper")

__all__ = ["CpsatOutcome", "solve_cpsat"]

_STATUS_NAMES = {"OPTIMAL": "optimal", "FEASIBLE": "feasible", "INFEASIBLE": "infeasible", "UNKNOWN": "no_solution"}
"""CP-SAT's statuses (``cp_model`` names; read when a solve ends, so that importing this module
does not import OR-Tools) and the door's names for them."""

CAN_ISOLATE = hasattr(os, "fork")
"""``True`` where the door can solve in a forked child (POSIX)."""


@dataclass
class CpsatOutcome:
    """What one CP-SAT solve produced.

    Attributes
    ----------
    status
        ``"optimal"`` (proven, within ``rel_gap``), ``"feasible"`` (stopped with an
        incumbent), ``"infeasible"`` (proven) or ``"no_solution"`` (stopped without one, or the
        deadline had passed before the call: then no solver ran).
    response
        CP-SAT's response (``cp_model_helper.CpSolverResponse``): the final one, or, when the
        child was ended at the deadline, one holding the last incumbent streamed (status
        ``FEASIBLE``, its objective, the last bound and the values of all model variables).
        ``None`` if no solver ran or the child was ended before any incumbent. Read the
        solution's values with :meth:`value` and :meth:`boolean_value` (only when
        :attr:`has_solution`).
    parameters
        The ``SatParameters`` the solve ran with (``None`` if none ran).
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
        ``True`` if the door had to stop CP-SAT at the deadline plus the grace (its own limit
        had not): the child was killed, or in this process the watchdog called
        ``stop_search``.
    isolated
        ``True`` if the solve ran in a forked child process.
    solver_status
        CP-SAT's status name (``"KILLED"`` when the child was ended before its answer).
    notes
        Remarks for ``Result.info``.
    """

    status: str
    response: cmh.CpSolverResponse | None = None
    parameters: object | None = None
    objective: float | None = None
    bound: float | None = None
    runtime: float = 0.0
    stopped: bool = False
    isolated: bool = False
    solver_status: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def has_solution(self) -> bool:
        """``True`` if the outcome carries a solution (status optimal or feasible)."""
        return self.status in ("optimal", "feasible") and self.response is not None

    @property
    def proven(self) -> bool:
        """``True`` if CP-SAT proved optimality (status ``"optimal"``)."""
        return self.status == "optimal"

    def _checked(self) -> cmh.CpSolverResponse:
        if not self.has_solution:
            raise RuntimeError(f"CP-SAT outcome {self.status!r} has no solution to read")
        return self.response

    def value(self, expr) -> int:
        """Value of an integer constant, a variable, a Boolean literal (or its negation) or a
        linear expression of the model in the solution.

        Raises
        ------
        RuntimeError
            If the outcome has no solution.
        """
        return cmh.ResponseHelper.value(self._checked(), expr)

    def boolean_value(self, literal) -> bool:
        """Value of a Boolean literal (a Boolean variable, its negation or a bool) in the
        solution (see :meth:`value`)."""
        return bool(cmh.ResponseHelper.boolean_value(self._checked(), literal))

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
            "solver_isolated": self.isolated,
        }
        if self.response is not None:
            out["branches"] = int(self.response.num_branches)
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
    isolate: bool | None = None,
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
        Print CP-SAT's search log (``log_search_progress``) on standard output.
    parameters
        Further :class:`SatParameters` fields by name (e.g. ``{"symmetry_level": 0}``); they
        cannot override the time limit, threads or seed.
    grace
        Seconds after the deadline before the door ends the solve (default
        :func:`~pipeopt.backends.pulp.kill_grace`); a finite number, negative to end it
        before CP-SAT's own limit (tests do).
    callback
        A solution callback passed to :meth:`CpSolver.solve`. It runs in this process, so
        the solve does too (see ``isolate``): only the watchdog stops it.
    isolate
        Solve in a forked child process that is killed at the deadline plus the grace (see
        the module docstring). ``None`` (default): when the deadline is bounded, no
        ``callback`` is given and the platform can fork. ``False``: in this process.

    Returns
    -------
    CpsatOutcome

    Raises
    ------
    InvalidProblemError
        If a numeric option is out of range or not finite, ``parameters`` names an unknown field, or
        ``isolate=True`` is asked with a ``callback`` or where ``fork`` is missing.
    RuntimeError
        If CP-SAT says the model is invalid (a bug in the model, not in the input), or the
        child process failed with a Python error.
    """
    entry = time.perf_counter()
    deadline = Deadline(None) if deadline is None else deadline
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InvalidProblemError(f"solve_cpsat: threads must be an integer >= 1, got {threads!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidProblemError(f"solve_cpsat: seed must be an integer >= 0, got {seed!r}")
    if not (isinstance(rel_gap, (int, float)) and math.isfinite(rel_gap) and rel_gap >= 0):
        raise InvalidProblemError(f"solve_cpsat: rel_gap must be a finite number >= 0, got {rel_gap!r}")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, (int, float))
                              or not math.isfinite(grace)):
        raise InvalidProblemError(f"solve_cpsat: grace must be a finite number of seconds, got {grace!r}")
    if isolate and (callback is not None or not CAN_ISOLATE):
        raise InvalidProblemError("solve_cpsat: isolate=True needs os.fork and no callback "
                                  "(a callback runs in this process)")
    if isolate is None:
        isolate = deadline.bounded and callback is None and CAN_ISOLATE
    if deadline.expired():
        return CpsatOutcome("no_solution", runtime=time.perf_counter() - entry, solver_status="not run",
                            notes=["the deadline had passed before the solve"])
    solver = cp_model.CpSolver()
    p = solver.parameters
    for key, val in (parameters or {}).items():
        if key in ("max_time_in_seconds", "num_workers", "num_search_workers", "random_seed"):
            raise InvalidProblemError(f"solve_cpsat: set {key!r} through the door's own arguments")
        try:
            setattr(p, key, val)
        except (AttributeError, TypeError, ValueError) as exc:
            raise InvalidProblemError(f"solve_cpsat: bad CP-SAT parameter {key}={val!r}: {exc}") from exc
    if hint is not None:
        model.clear_hints()
        for var, val in hint.items():
            model.add_hint(var, int(val))
    p.num_workers = threads
    p.random_seed = seed
    p.relative_gap_limit = float(rel_gap)
    p.log_search_progress = bool(log)
    if deadline.bounded:
        grace = kill_grace(deadline.limit) if grace is None else float(grace)
        p.max_time_in_seconds = max(deadline.remaining(), 1e-3)
    else:
        grace = math.inf
    end = deadline.end + grace  # perf_counter time at which the door ends the solve
    has_objective = model.has_objective()
    maximise = has_objective and _maximises(model)  # (reading proto.objective would create it)
    if isolate:
        response, stopped, notes = _solve_in_child(model, solver, end, maximise)
    else:
        response, stopped, notes = _solve_here(model, solver, end, callback)
    code = response.status if response is not None else cp_model.UNKNOWN
    if code == cp_model.MODEL_INVALID:
        raise RuntimeError(f"CP-SAT rejected the model: {model.validate()}")
    status = next((ours for name, ours in _STATUS_NAMES.items() if code == getattr(cp_model, name)), "no_solution")
    objective = bound = None
    if status in ("optimal", "feasible") and has_objective:
        objective = float(response.objective_value)
        # without a solution CP-SAT's response may hold the field's default 0, which is no bound
        b = float(response.best_objective_bound)
        if math.isfinite(b):  # clamp: never beyond the incumbent
            bound = max(b, objective) if maximise else min(b, objective)
    return CpsatOutcome(
        status=status,
        response=response,
        parameters=p,
        objective=objective,
        bound=bound,
        runtime=time.perf_counter() - entry,
        stopped=stopped,
        isolated=bool(isolate),
        solver_status="KILLED" if stopped and isolate else code.name,
        notes=notes,
    )


def _solve_here(model, solver, end: float, callback):
    """Solve in this process; a watchdog calls ``stop_search`` at ``end`` (perf_counter)."""
    fired = threading.Event()
    watchdog = None
    if math.isfinite(end):

        def stop():
            fired.set()
            solver.stop_search()

        watchdog = threading.Timer(max(0.0, end - time.perf_counter()), stop)
        watchdog.daemon = True
        watchdog.start()
    try:
        solver.solve(model, callback)
    finally:
        if watchdog is not None:
            watchdog.cancel()
    notes = ["CP-SAT stopped by the watchdog at the deadline (its own limit had not stopped it)"] \
        if fired.is_set() else []
    return solver.response_proto, fired.is_set(), notes


def _streamer(send):
    """In the child: a solution callback that sends every incumbent (objective, bound, all
    values) to the parent (its class is made here, so that importing this module does not
    import OR-Tools)."""

    class _Streamer(cp_model.CpSolverSolutionCallback):
        def __init__(self):
            super().__init__()

        def on_solution_callback(self) -> None:
            r = self.response_proto
            send(("sol", float(r.objective_value), float(r.best_objective_bound), list(r.solution)))

    return _Streamer()


def _die_with_parent(parent: int) -> None:
    """In the child (Linux): be killed if the parent dies (``PR_SET_PDEATHSIG``), so an
    ended parent leaves no solver running. Best effort; nothing elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # it died before the line above
        os._exit(1)


def _child(model, solver, reader, writer, parent: int) -> None:
    """The forked child: solve, stream, send the final response, exit. Never returns."""
    code = 0
    gc.disable()  # a collection would touch (and so copy) every object page shared with the parent
    try:
        _die_with_parent(parent)
        reader.close()
        lock = threading.Lock()

        def send(msg):
            with lock:
                writer.send(msg)

        solver.best_bound_callback = lambda b: send(("bound", float(b)))
        solver.solve(model, _streamer(send))
        send(("done", str(solver.response_proto)))
    except BaseException as exc:  # noqa: BLE001 - report anything, then leave
        code = 1
        try:
            send(("error", f"{type(exc).__name__}: {exc}"))
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)  # no atexit handlers, no flushing of the parent's buffers


def _solve_in_child(model, solver, end: float, maximise: bool):
    """Solve in a forked child ended at ``end`` (perf_counter); see the module docstring.

    Returns ``(response or None, stopped, notes)``.
    """
    reader, writer = multiprocessing.Pipe(duplex=False)
    parent = os.getpid()
    with warnings.catch_warnings():  # Python >= 3.12 warns about forking with threads alive
        # (numpy's BLAS pool, a reaper below): safe here, the child only runs CP-SAT
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; it leaves through os._exit
        _child(model, solver, reader, writer, parent)
    writer.close()
    best = None  # the last incumbent: (objective, bound, values)
    bound = None
    final = error = None

    def take(msg) -> None:
        nonlocal best, bound, final, error
        kind = msg[0]
        if kind == "sol":
            best = msg[1:]
            b = msg[2]
        elif kind == "bound":
            b = msg[1]
        elif kind == "done":
            final = msg[1]
            return
        else:
            error = msg[1]
            return
        if math.isfinite(b):
            bound = b if bound is None else (min(bound, b) if maximise else max(bound, b))

    gone = False
    try:
        while final is None and error is None:
            wait = end - time.perf_counter()
            if wait <= 0:
                break
            if not reader.poll(None if math.isinf(wait) else wait):
                continue
            try:
                take(reader.recv())
            except (EOFError, OSError):  # the child ended without its answer
                gone = True
                break
    finally:
        killed, exit_status = _end_child(pid, final is not None or error is not None, gone)
        if final is None and error is None and not gone:
            try:  # what the child had sent before it was killed (complete messages only)
                while final is None and error is None and reader.poll(0):
                    take(reader.recv())
            except (EOFError, OSError):
                pass
        reader.close()
    if error is not None:
        raise RuntimeError(f"CP-SAT failed in its child process: {error}")
    if final is not None:
        response = cmh.CpSolverResponse()
        response.parse_text_format(final)
        return response, False, []
    notes = []
    if killed:
        notes.append("CP-SAT's child process ended at the deadline (CP-SAT's own limit had not stopped it)")
    else:
        notes.append(f"CP-SAT's child process ended without an answer ({exit_status})")
    if best is None:
        return None, killed, notes
    response = cmh.CpSolverResponse()
    response.status = cp_model.FEASIBLE
    response.objective_value = best[0]
    b = best[1] if bound is None else bound
    if math.isfinite(b):
        response.best_objective_bound = b
    response.solution.extend(best[2])
    notes.append("the last incumbent streamed by the child is returned")
    return response, killed, notes


def _end_child(pid: int, answered: bool, exited: bool) -> tuple[bool, str]:
    """End the child: reap it if it has exited (``exited``: its pipe closed without an
    answer, so it is exiting), else kill it and reap it in a background thread (tearing
    down a large child takes a noticeable part of a second, which nobody needs to wait for).

    Returns ``(killed before answering, exit status text)``.
    """
    try:
        done, status = os.waitpid(pid, 0 if exited else os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return False, f"signal {os.WTERMSIG(status)}"
            return False, f"exit code {os.WEXITSTATUS(status)}"
        os.kill(pid, signal.SIGKILL)
    except (ChildProcessError, ProcessLookupError):  # reaped elsewhere (SIGCHLD ignored)
        return False, "exit status unknown"
    threading.Thread(target=_reap, args=(pid,), name=f"cpsat-reap-{pid}", daemon=True).start()
    return not answered, "killed"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
