"""The one PuLP door: solve a :class:`pulp.LpProblem` with CBC or HiGHS under a :class:`Deadline`.

Every MILP and LP of pipeopt is built with PuLP (solver-free) and solved here, so the
solver set-up, the wall-clock limit, the warm start and the reading of status and dual bound
are written once.

How the deadline holds
----------------------
Neither solver stops exactly at its own time limit: CBC checks it only between phases (on
NASNet-A Large with S = 16 its preprocessing ran 6 s on a 1 s limit; 106 s was seen
inside PuLP), HiGHS's root cut loop overran a 1 s limit by 0.5 s. So the door runs every
solve in a **child process in its own process group** and ends the whole group at the
deadline plus a short grace (:func:`kill_grace`):

* the model is written once as free MPS (PuLP's ``writeMPS`` with normalised names, always
  as a minimisation);
* CBC: PuLP's bundled ``cbc`` binary is started directly (it is the child), with
  ``-sec`` set to the time left, wall-clock mode, the gap, threads, seed and a MIP start
  file; the solution file and the log are read back. A killed CBC leaves no solution, but
  its log still gives the dual bound it had reached;
* HiGHS: a small Python child (``python -c``; highspy only, about 0.3 s to start) reads the
  MPS, sets the MIP start, HiGHS's ``time_limit`` and interrupt callbacks at the deadline,
  and writes each improving solution to a file as it is found, so a killed HiGHS still
  hands back its incumbent and the bound of that moment. ``isolate=False`` runs the same
  code in this process instead (no start-up cost, no kill: for small LPs only).

The solver normally stops itself at the time left; the kill is the guarantee.

Status and bound
----------------
:class:`PulpOutcome` says ``"optimal"`` only when the solver proved optimality (within
``rel_gap``/``abs_gap``) and ``"infeasible"`` only when it proved infeasibility; a stop
without proof is ``"feasible"`` (an incumbent) or ``"no_solution"``. CBC 2.10 reports
"optimal" (the MIP start) or "infeasible" when its limit interrupts preprocessing or the root
LP; those runs are recognised from the log and carry no proof. The bound is the solver's
proven dual bound in the units of ``prob``'s objective (objective constant included): a
lower bound for a minimisation, an upper bound for a maximisation. A bound CBC prints with
few digits is rounded outwards by one unit in the last printed digit. The solver's own
feasibility tolerances (about 1e-6 on rows, 1e-9 relative here) still apply: a method that
quotes the bound as a proof takes its own relative slack off.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ..lazy import lazy_module
from ..errors import InvalidProblemError
from .deadline import Deadline

pulp = lazy_module("pulp")

__all__ = ["SOLVERS", "PulpOutcome", "kill_grace", "solve_pulp"]

SOLVERS = ("cbc", "highs")
"""The MILP/LP solvers the door drives."""

STATUSES = ("optimal", "feasible", "infeasible", "no_solution", "unbounded")
"""Values of :attr:`PulpOutcome.status`."""

CBC_INTERRUPTED = (
    "The LP relaxation is infeasible or too expensive",
    "Pre-processing says infeasible",
    "Cut generators found to be infeasible",
)
"""CBC's log lines when its time limit interrupts preprocessing or the root LP; its status
is then meaningless (CBC 2.10.3, the one bundled with PuLP): it says "optimal" about the MIP
start or "infeasible" without a proof."""

CBC_DEFAULT_ABS_GAP = 1e-10
HIGHS_DEFAULT_ABS_GAP = 1e-6
_HUGE = 1e30  # a printed bound beyond this is CBC's "infinity", not a bound
CBC_TINY = 1e-6
"""A MILP with a nonzero constraint coefficient below this (in absolute value) asked of CBC is
solved by HiGHS instead, said in the outcome's notes: CBC 2.10 is unreliable on such models. Its
integer preprocessing cut off the optimum of a 4-binary partition model whose window row carried
a coefficient of 7.8e-8 (148.65 claimed optimal against 132.49; 1e-7 still failed, 3e-7 did
not), and it claimed false optima of the event-time MILP on tied chains with backward times of
1e-12 s and below (0.4768 against 0.4736, 4 chains in 600 drawn); with preprocessing off a free-W
schedule test failed. HiGHS solves all of them right (tests/backends/test_pulp_door.py keeps the
partition model, tests/problems/partition/test_ties.py the chains)."""


def kill_grace(limit: float) -> float:
    """Seconds after the deadline at which the door ends a solver that has not stopped.

    ``0.3 + 0.02 * limit`` (0.32 s for a 1 s limit, 0.7 s for 20 s): long enough for a
    solver that stops itself at its limit to write its solution, short enough that a method
    using the door finishes inside ``max(limit + 1 s, 1.1 * limit)``.

    Parameters
    ----------
    limit
        The deadline's total limit, seconds (``math.inf``: no limit, no kill).

    Returns
    -------
    float
        Seconds.
    """
    return 0.3 + 0.02 * limit if math.isfinite(limit) else math.inf


@dataclass
class PulpOutcome:
    """What one PuLP solve produced.

    Attributes
    ----------
    status
        ``"optimal"`` (proven, within the gaps), ``"feasible"`` (stopped with an incumbent),
        ``"infeasible"`` (proven), ``"no_solution"`` (stopped without an incumbent, or the
        deadline had passed before the call) or ``"unbounded"``.
    values
        Variable name -> value of the solution (empty without one). Also written into the
        problem's variables (``var.varValue``) when ``assign`` is set.
    objective
        The solution's objective in ``prob``'s units and sense, computed from ``values``
        (constant included), or ``None``.
    bound
        The solver's proven dual bound on the optimum in the same units (a lower bound for a
        minimisation, an upper bound for a maximisation), or ``None`` when none is known.
        Never beyond ``objective``.
    runtime
        Wall seconds spent in the door (model writing included).
    killed
        ``True`` if the solver had to be ended at the deadline (it had not stopped itself).
    solver
        ``"cbc"`` or ``"highs"``.
    solver_status
        The solver's own status words (for ``Result.info``).
    start_accepted
        ``True`` if the solver accepted the warm start as a feasible solution, ``False`` if
        it rejected it, ``None`` if no start was given or it cannot be told.
    notes
        Remarks worth keeping in ``Result.info`` (e.g. why a solver's "optimal" is not taken
        as a proof).
    """

    status: str
    values: dict[str, float] = field(default_factory=dict)
    objective: float | None = None
    bound: float | None = None
    runtime: float = 0.0
    killed: bool = False
    solver: str = ""
    solver_status: str = ""
    start_accepted: bool | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def has_solution(self) -> bool:
        """``True`` if the outcome carries a solution (status optimal or feasible)."""
        return self.status in ("optimal", "feasible") and bool(self.values)

    @property
    def proven(self) -> bool:
        """``True`` if the solver proved optimality (status ``"optimal"``)."""
        return self.status == "optimal"

    def value(self, var: pulp.LpVariable | str) -> float | None:
        """Value of a variable (object or name) in the solution, ``None`` without one."""
        name = var if isinstance(var, str) else var.name
        return self.values.get(name)

    def info(self) -> dict:
        """The outcome's facts as a dict for ``Result.info`` (no values)."""
        return {
            "solver": self.solver,
            "solver_status": self.solver_status,
            "door_status": self.status,
            "solver_objective": self.objective,
            "solver_bound": self.bound,
            "solver_runtime": self.runtime,
            "solver_killed": self.killed,
            "start_accepted": self.start_accepted,
            **({"solver_notes": list(self.notes)} if self.notes else {}),
        }


@dataclass
class _Raw:
    """A solver's answer in the written (minimisation) form, before mapping back."""

    status: str
    columns: dict[str, float] | None = None  # MPS column name -> value
    objective: float | None = None  # solver's own objective (minimisation form, no constant)
    bound: float | None = None  # lower bound in the minimisation form, no constant
    killed: bool = False
    solver_status: str = ""
    start_accepted: bool | None = None
    notes: list[str] = field(default_factory=list)


def solve_pulp(
    prob: pulp.LpProblem,
    *,
    solver: str = "cbc",
    deadline: Deadline | None = None,
    rel_gap: float = 1e-9,
    abs_gap: float | None = None,
    threads: int = 1,
    seed: int = 0,
    warm_start: dict | None = None,
    grace: float | None = None,
    isolate: bool = True,
    assign: bool = True,
    log_path: str | os.PathLike | None = None,
    node_limit: int | None = None,
) -> PulpOutcome:
    """Solve ``prob`` with CBC or HiGHS, stopping at the deadline whatever the solver does.

    Parameters
    ----------
    prob
        A PuLP problem (MILP or LP; minimisation or maximisation; it is only read, and its
        variables receive the solution's values when ``assign`` is set).
    solver
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (highspy). A MILP asked of CBC whose
        smallest nonzero constraint coefficient is below :data:`CBC_TINY` is solved by HiGHS
        (the outcome's ``solver`` and notes say so).
    deadline
        The solve's clock (:class:`~pipeopt.backends.deadline.Deadline`); the solver gets
        what is left and is ended :func:`kill_grace` seconds after it. ``None``: no limit.
        If it has already passed, no solver runs and the outcome is ``"no_solution"``.
    rel_gap
        Relative optimality gap at which the solver stops and says optimal (>= 0).
    abs_gap
        Absolute gap in the objective's units (the solvers' default if ``None``: CBC 1e-10,
        HiGHS 1e-6).
    threads
        Solver threads (>= 1): HiGHS's ``threads``. CBC always runs its serial search: its
        threaded branch and bound (``-threads N``, even N = 1) now and then stalls until the
        time limit on small models (measured: 1 solve in 100-150 under load); a ``threads``
        above 1 with CBC is said in the outcome's notes.
    seed
        Solver random seed (>= 0).
    warm_start
        MIP start: variable (name or object) -> value. Partial starts are allowed (CBC and
        HiGHS complete them); every name must be a variable of ``prob``.
    grace
        Seconds after the deadline before the solver is ended (default :func:`kill_grace`).
    isolate
        HiGHS only: run it in a child process that can be ended (default). ``False`` runs it
        in this process, stopped by its own limit and interrupt callbacks only: for small
        LPs, where the child's 0.3 s start-up would dominate. CBC always runs as a child.
    assign
        Write the solution's values into ``prob``'s variables (``var.varValue``); without a
        solution they are left as they were (read :attr:`PulpOutcome.has_solution`, never
        ``prob.status``, which the door does not set).
    log_path
        Copy the solver's log to this file (for debugging).
    node_limit
        MILP only: stop after this many branch-and-bound nodes (CBC ``-maxNodes``, HiGHS
        ``mip_max_nodes``), an amount of work that does not depend on the machine's load, so a
        solve stopped by it returns the same incumbent on every run (single thread, same
        seed). The outcome is then ``"feasible"`` (or ``"no_solution"``) with
        ``"node limit"`` in its notes. ``None``: no limit.

    Returns
    -------
    PulpOutcome

    Raises
    ------
    InvalidProblemError
        If ``solver`` is unknown or unavailable, or a numeric option is out of range.
    ValueError
        If ``warm_start`` names a variable ``prob`` does not have (a programming error).
    RuntimeError
        If the solver crashed twice (CBC) or rejected the model (a programming error, not a
        time-out). A CBC crash with no time left to run it again is a ``"no_solution"``
        outcome whose notes name the signal.
    """
    entry = time.perf_counter()
    deadline = Deadline(None) if deadline is None else deadline
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    _check_options(rel_gap, abs_gap, threads, seed)
    if node_limit is not None and (isinstance(node_limit, bool) or not isinstance(node_limit, int) or node_limit < 1):
        raise InvalidProblemError(f"solve_pulp: node_limit must be an integer >= 1 or None, got {node_limit!r}")
    grace = kill_grace(deadline.limit) if grace is None else float(grace)
    if deadline.expired():
        return PulpOutcome("no_solution", runtime=time.perf_counter() - entry, solver=solver,
                           solver_status="not run", notes=["the deadline had passed before the solve"])
    sign = 1.0 if prob.sense == pulp.LpMinimize else -1.0
    workdir = tempfile.mkdtemp(prefix=f"pipeopt_{solver}_")
    try:
        mps = os.path.join(workdir, "model.mps")
        own = [v.name for v in prob.variables()]  # before PuLP adds a dummy to an empty objective
        vs, var_names, _, _ = prob.writeMPS(mps, mpsSense=pulp.LpMinimize, rename=True)
        columns = [var_names[v.name] for v in vs]  # MPS column order
        var_names = {name: var_names[name] for name in own}
        start = _start_columns(warm_start, var_names)
        mip = prob.isMIP()
        if deadline.expired():
            return PulpOutcome("no_solution", runtime=time.perf_counter() - entry, solver=solver,
                               solver_status="not run",
                               notes=["the deadline passed while the model was written"])
        rerouted = solver == "cbc" and mip and _smallest_coefficient(prob) < CBC_TINY
        if rerouted:
            solver = "highs"
        if solver == "cbc":
            cbc = (workdir, mps, mip, deadline, grace, rel_gap, abs_gap, threads, seed, start, node_limit)
            try:
                raw = _run_cbc(*cbc)
            except CbcCrashed as crash:  # CBC 2.10 segfaults now and then (about 1 solve in 2,000)
                if deadline.expired():  # no time to run it again: nothing proven, as at a deadline
                    return PulpOutcome("no_solution", runtime=time.perf_counter() - entry, solver=solver,
                                       solver_status=f"crashed ({crash.signal_name})",
                                       notes=[f"CBC crashed ({crash.signal_name}, exit code {crash.returncode}) "
                                              "with no time left to run it again: nothing proven"])
                raw = _run_cbc(*cbc)
                raw.notes.append(f"CBC crashed once ({crash.signal_name}) and was run again on the same model")
        else:
            raw = _run_highs(workdir, mps, columns, mip, deadline, grace, rel_gap, abs_gap, threads,
                             seed, start, isolate or rerouted, node_limit)
            if rerouted:
                raw.notes.append(f"solved by HiGHS instead of CBC: a constraint coefficient is below {CBC_TINY:g} "
                                 "(CBC_TINY), and CBC 2.10 is unreliable on such models")
        if log_path is not None and os.path.exists(os.path.join(workdir, "solver.log")):
            shutil.copyfile(os.path.join(workdir, "solver.log"), log_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _outcome(prob, raw, var_names, sign, solver, assign, entry)


def _check_options(rel_gap, abs_gap, threads, seed) -> None:
    def bad(what, value):
        return InvalidProblemError(f"solve_pulp: {what} must be {value}")

    if not (isinstance(rel_gap, (int, float)) and math.isfinite(rel_gap) and rel_gap >= 0):
        raise bad("rel_gap", f"a finite number >= 0, got {rel_gap!r}")
    if abs_gap is not None and not (isinstance(abs_gap, (int, float)) and math.isfinite(abs_gap)
                                    and abs_gap >= 0):
        raise bad("abs_gap", f"a finite number >= 0 or None, got {abs_gap!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise bad("threads", f"an integer >= 1, got {threads!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise bad("seed", f"an integer >= 0, got {seed!r}")


def _start_columns(warm_start: dict | None, var_names: dict[str, str]) -> dict[str, float]:
    """The warm start keyed by MPS column name."""
    if not warm_start:
        return {}
    out = {}
    for key, value in warm_start.items():
        name = key if isinstance(key, str) else key.name
        if name not in var_names:
            raise ValueError(
                f"warm start names {name!r}, which is not a variable of the problem (PuLP replaces "
                "the characters '-+[] ->/' in names by '_': key the start by the variable or var.name)"
            )
        if value is None:
            continue
        out[var_names[name]] = float(value)
    return out


def _outcome(prob, raw: _Raw, var_names, sign, solver, assign, entry) -> PulpOutcome:
    """Map a raw answer back to ``prob``'s names, sense and objective constant."""
    offset = float(prob.objective.constant) if prob.objective is not None else 0.0
    values: dict[str, float] = {}
    status = raw.status
    if raw.columns is not None and status in ("optimal", "feasible"):
        values = {name: raw.columns.get(col, 0.0) for name, col in var_names.items()}
    elif status in ("optimal", "feasible"):  # pragma: no cover - a solver that says so without values
        status = "no_solution"
    objective = None
    if values:
        objective = offset + sum(coef * values[v.name] for v, coef in prob.objective.items()) \
            if prob.objective is not None else offset
    bound = None
    if status in ("infeasible", "unbounded"):
        pass  # no bound to quote
    elif raw.bound is not None and math.isfinite(raw.bound):
        bound = sign * raw.bound + offset
        if objective is not None:  # a bound beyond the incumbent is a tolerance artefact
            bound = min(bound, objective) if sign > 0 else max(bound, objective)
    if assign and values:
        prob.assignVarsVals(values)
    return PulpOutcome(
        status=status,
        values=values,
        objective=objective,
        bound=bound,
        runtime=time.perf_counter() - entry,
        killed=raw.killed,
        solver=solver,
        solver_status=raw.solver_status,
        start_accepted=raw.start_accepted,
        notes=raw.notes,
    )


# ----------------------------------------------------------------------------- processes


def _wait(proc: subprocess.Popen, deadline: Deadline, grace: float) -> bool:
    """Wait for ``proc`` until the deadline plus ``grace``; end its process group then.

    Returns ``True`` if it had to be ended.
    """
    try:
        timeout = deadline.remaining() + grace if deadline.bounded else None
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        _end_group(proc)
        return True
    except BaseException:  # KeyboardInterrupt: never leave a solver running
        _end_group(proc)
        raise


def _end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it leads its own session) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _tail(path: str, chars: int = 2000) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-chars:]
    except OSError:
        return ""


# ----------------------------------------------------------------------------- CBC


def _cbc_path() -> str:
    for cmd in (pulp.PULP_CBC_CMD(msg=False), pulp.COIN_CMD(msg=False)):
        try:
            if cmd.available():
                return cmd.path
        except Exception:  # noqa: BLE001, S112 - an unusable install: try the next one
            continue
    raise InvalidProblemError("solver 'cbc' is not available (PuLP's bundled CBC cannot run here)")


def _printed_down(token: str) -> float:
    """A number CBC printed, less one unit in its last printed digit (a safe lower value)."""
    m = re.fullmatch(r"[-+]?(\d*)\.?(\d*)(?:[eE]([-+]?\d+))?", token)
    value = float(token)
    if not m:  # pragma: no cover - float() accepted it, the pattern covers float syntax
        return value - abs(value) * 1e-6
    decimals = len(m.group(2))
    exponent = int(m.group(3) or 0)
    return value - 10.0 ** (exponent - decimals)


_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_CBC_BOUNDS = {
    "lower": re.compile(r"^Lower bound:\s+" + _NUMBER, re.M),
    "possible": re.compile(r"best possible\s+" + _NUMBER),
    "objective": re.compile(r"^Objective value:\s+" + _NUMBER, re.M),
    "continuous": re.compile(r"^Continuous objective value is\s+" + _NUMBER, re.M),
}


def cbc_log_bound(log: str, *, optimal: bool = False, interrupted: bool = False) -> float | None:
    """The best dual bound a CBC log proves (minimisation form), rounded down as printed.

    Parameters
    ----------
    log
        CBC's output.
    optimal
        Accepted for compatibility and unused: CBC's final "Objective value:" is its incumbent,
        a bound only up to the allowed gap (the caller takes that off).
    interrupted
        CBC's limit interrupted preprocessing or the root LP: only the LP relaxation's value
        ("Continuous objective value is") is trusted.

    Returns
    -------
    float or None
        The largest valid lower bound printed, or ``None``.
    """
    keys = ["continuous"] if interrupted else ["continuous", "lower", "possible"]
    tokens = [m.group(1) for key in keys for m in _CBC_BOUNDS[key].finditer(log)]
    found = [_printed_down(t) for t in tokens if math.isfinite(float(t)) and abs(float(t)) < _HUGE]
    return max(found) if found else None


def _write_mipstart(path: str, start: dict[str, float]) -> None:
    """CBC's MIP start file (its solution-file format, as PuLP writes it)."""
    with open(path, "w") as fh:
        fh.write("Stopped on time - objective value 0\n")
        for i, (col, value) in enumerate(start.items()):
            fh.write(f"{i:>7} {col} {value!r:>23} 0\n")


class CbcCrashed(RuntimeError):
    """CBC's process died of a signal (a segfault, exit code -11) that pipeopt did not send.

    :func:`solve_pulp` runs the same model once more; a second crash is an error. A crash
    after the deadline has passed is a ``"no_solution"`` outcome (nothing proven, as when the
    deadline stops the solver), not an error."""

    def __init__(self, returncode: int, log: str):
        try:
            self.signal_name = signal.Signals(-returncode).name
        except ValueError:
            self.signal_name = f"signal {-returncode}"
        self.returncode = returncode
        super().__init__(f"CBC crashed ({self.signal_name}, exit code {returncode}); log tail:\n{log[-2000:]}")


def _smallest_coefficient(prob: pulp.LpProblem) -> float:
    """The smallest nonzero absolute coefficient of ``prob``'s constraints (``inf`` if none)."""
    return min((abs(a) for row in prob.constraints.values() for a in row.values() if a != 0), default=math.inf)


def _run_cbc(workdir, mps, mip, deadline, grace, rel_gap, abs_gap, threads, seed, start, node_limit=None) -> _Raw:
    sol = os.path.join(workdir, "model.sol")
    log_file = os.path.join(workdir, "solver.log")
    # line-buffered output (stdbuf, where present): a killed CBC's log still holds its bound
    stdbuf = shutil.which("stdbuf")
    args = ([stdbuf, "-oL"] if stdbuf else []) + [_cbc_path(), mps, "-timeMode", "elapsed"]
    limit = None
    if deadline.bounded:
        limit = max(deadline.remaining(), 0.01)
        args += ["-sec", f"{limit:.3f}"]
    args += ["-ratio", repr(float(rel_gap))]
    if abs_gap is not None:
        args += ["-allow", repr(float(abs_gap))]
    # always CBC's serial search: its threaded one ("-threads N", even N = 1) stalls now and then
    args += ["-randomSeed", str(seed + 1), "-randomCbcSeed", str(seed + 1)]
    if node_limit is not None and mip:
        args += ["-maxNodes", str(int(node_limit))]
    if start:
        mst = os.path.join(workdir, "start.mst")
        _write_mipstart(mst, start)
        args += ["-mips", mst]
    args += ["-solve" if mip else "-initialSolve", "-printingOptions", "all", "-solution", sol]
    t0 = time.perf_counter()
    with open(log_file, "w") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=workdir, start_new_session=True)
        killed = _wait(proc, deadline, grace)
    wall = time.perf_counter() - t0
    with open(log_file, errors="replace") as fh:
        log = fh.read()
    accepted = None
    if start and "MIPStart provided solution" in log:
        accepted = True
    elif start and "could not be used" in log.lower():
        accepted = False
    interrupted = any(s in log for s in CBC_INTERRUPTED) and (
        killed or (limit is not None and wall >= 0.9 * limit))
    if killed:
        return _Raw("no_solution", bound=cbc_log_bound(log, interrupted=interrupted) if mip else None,
                    killed=True, solver_status="killed at the deadline", start_accepted=accepted,
                    notes=[f"CBC ended at the deadline after {wall:.2f} s (its own limit did not stop it)"])
    if proc.returncode < 0:  # killed by a signal we did not send: a crash
        raise CbcCrashed(proc.returncode, log)
    if proc.returncode != 0 or not os.path.exists(sol):
        raise RuntimeError(f"CBC failed (exit code {proc.returncode}); log tail:\n{log[-2000:]}")
    with open(sol, errors="replace") as fh:
        header = fh.readline().strip()
        columns = {}
        for line in fh:
            parts = line.split()
            if len(parts) < 3:
                continue
            if parts[0] == "**":
                parts = parts[1:]
            try:
                columns[parts[1]] = float(parts[2])
            except (ValueError, IndexError):
                continue
    m = re.search(r"objective value\s+" + _NUMBER, header)
    objective = float(m.group(1)) if m else None
    head = header.split(" - ")[0].strip()
    notes: list[str] = [] if threads <= 1 else [f"CBC ran its serial search ({threads} threads asked: "
                                                "its threaded search stalls now and then)"]
    if mip:
        status = _cbc_mip_status(header, log, interrupted)
        if interrupted:
            notes.append("CBC's limit interrupted preprocessing / the root LP: its status is no proof")
        if node_limit is not None and header.startswith(("Stopped on node", "Stopped on iterations")):
            notes.append(f"stopped at the node limit ({int(node_limit)} nodes)")
    else:
        status = {"Optimal": "optimal", "Infeasible": "infeasible", "Primal infeasible": "infeasible",
                  "Unbounded": "unbounded", "Dual infeasible": "unbounded"}.get(head, "no_solution")
    bound = None
    if mip:
        bound = cbc_log_bound(log, optimal=status == "optimal", interrupted=interrupted)
    elif status == "optimal" and objective is not None:
        bound = objective  # LP duality
    if status == "optimal" and objective is not None:
        allow = max(CBC_DEFAULT_ABS_GAP if abs_gap is None else abs_gap,
                    rel_gap * max(abs(objective), 1.0) * (1 + 1e-9))
        # optimal means "within the allowed gap": the optimum is at least objective - allow, and
        # nothing CBC prints proves more (its final objective is the incumbent, not a bound)
        bound = objective - allow if mip else bound
    return _Raw(status, columns=columns if status in ("optimal", "feasible") else None,
                objective=objective, bound=bound, solver_status=header, start_accepted=accepted,
                notes=notes)


def _cbc_mip_status(head: str, log: str, interrupted: bool) -> str:
    """The door's status of a CBC MIP run from its solution file's first line and its log."""
    if head.startswith("Optimal"):
        if interrupted or "Result - Optimal solution found" not in log:
            return "feasible"  # CBC said optimal without finishing: the incumbent, no proof
        return "optimal"
    if head.startswith(("Infeasible", "Integer infeasible")):
        return "no_solution" if interrupted else "infeasible"
    if head.startswith("Unbounded"):
        return "no_solution" if interrupted else "unbounded"
    if head.startswith("Stopped"):
        return "no_solution" if "no integer solution" in head or "objective value" not in head else "feasible"
    return "no_solution"


# ----------------------------------------------------------------------------- HiGHS

_HIGHS_RUNNER = r'''
import json, math, os, sys, time


def _dump(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _num(x):
    x = float(x)
    return x if math.isfinite(x) else None


def run(args):
    import numpy as np
    import highspy

    h = highspy.Highs()
    h.setOptionValue("output_flag", True)
    h.setOptionValue("log_to_console", False)
    h.setOptionValue("log_file", args["log"])
    if h.readModel(args["mps"]) == highspy.HighsStatus.kError:
        return {"error": "HiGHS could not read the model"}
    for key, value in args["options"].items():
        h.setOptionValue(key, value)
    accepted = None
    if args["start"]:
        names = list(h.getLp().col_names_)
        index = {n: i for i, n in enumerate(names)}
        cols = np.array([index[c] for c in args["start"]], dtype=np.int32)
        vals = np.array(list(args["start"].values()), dtype=np.float64)
        accepted = h.setSolution(len(cols), cols, vals) != highspy.HighsStatus.kError
    wall_end = args["wall_end"]
    incumbent = args["incumbent"]

    def interrupt(e):
        if time.time() >= wall_end:
            e.interrupt()

    def improving(e):
        d = e.data_out
        _dump(incumbent, {"objective": _num(d.objective_function_value),
                          "bound": _num(d.mip_dual_bound),
                          "values": [float(x) for x in d.mip_solution]})

    if wall_end is not None:
        h.setOptionValue("time_limit", max(wall_end - time.time(), 1e-3))
        h.cbSimplexInterrupt.subscribe(interrupt)
        h.cbIpmInterrupt.subscribe(interrupt)
        h.cbMipInterrupt.subscribe(interrupt)
    if args["mip"] and incumbent:
        h.cbMipImprovingSolution.subscribe(improving)
    h.run()
    info = h.getInfo()
    st = h.getModelStatus()
    out = {"status": h.modelStatusToString(st), "code": st.name,
           "primal": int(info.primal_solution_status),
           "objective": _num(info.objective_function_value),
           "bound": _num(info.mip_dual_bound) if args["mip"] else None,
           "nodes": int(info.mip_node_count) if args["mip"] else 0,
           "accepted": accepted}
    if int(info.primal_solution_status) == 2:
        out["values"] = [float(x) for x in h.getSolution().col_value]
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        _args = json.load(fh)
    _dump(_args["out"], run(_args))
'''
_runner_namespace: dict | None = None


def _highs_in_process(args: dict) -> dict:
    global _runner_namespace  # noqa: PLW0603 - compiled once, on first use
    if _runner_namespace is None:
        ns: dict = {"__name__": "pipeopt_highs_runner"}
        exec(compile(_HIGHS_RUNNER, "<pipeopt HiGHS runner>", "exec"), ns)  # noqa: S102 - our own code
        _runner_namespace = ns
    return _runner_namespace["run"](args)


def _run_highs(workdir, mps, columns, mip, deadline, grace, rel_gap, abs_gap, threads, seed, start,
               isolate, node_limit=None) -> _Raw:
    out_path = os.path.join(workdir, "out.json")
    inc_path = os.path.join(workdir, "incumbent.json")
    options = {"mip_rel_gap": float(rel_gap), "threads": int(threads), "random_seed": int(seed)}
    if abs_gap is not None:
        options["mip_abs_gap"] = float(abs_gap)
    if node_limit is not None and mip:
        options["mip_max_nodes"] = int(node_limit)
    args = {
        "mps": mps,
        "out": out_path,
        "incumbent": inc_path,
        "log": os.path.join(workdir, "solver.log"),
        "options": options,
        "start": start,
        "mip": bool(mip),
        "wall_end": time.time() + deadline.remaining() if deadline.bounded else None,
    }
    killed = False
    if isolate:
        args_path = os.path.join(workdir, "args.json")
        with open(args_path, "w") as fh:
            json.dump(args, fh)
        err_path = os.path.join(workdir, "stderr.txt")
        with open(err_path, "w") as err:
            proc = subprocess.Popen([sys.executable, "-c", _HIGHS_RUNNER, args_path], stdout=subprocess.DEVNULL,
                                    stderr=err, stdin=subprocess.DEVNULL, cwd=workdir,
                                    start_new_session=True)
            killed = _wait(proc, deadline, grace)
        if not killed and (proc.returncode != 0 or not os.path.exists(out_path)):
            raise RuntimeError(f"the HiGHS child failed (exit code {proc.returncode}):\n{_tail(err_path)}")
        out = None
        if not killed:
            with open(out_path) as fh:
                out = json.load(fh)
    else:
        out = _highs_in_process(args)
    if out is not None and "error" in out:
        raise RuntimeError(out["error"])
    accepted = None
    if start:
        log = _tail(args["log"], 10**7)
        if "MIP start solution is feasible" in log:
            accepted = True
        elif (out is not None and out.get("accepted") is False) or "MIP start solution is infeasible" in log \
                or "setSolution: User solution" in log:
            accepted = False
    if killed:
        raw = _Raw("no_solution", killed=True, solver_status="killed at the deadline", start_accepted=accepted,
                   notes=["HiGHS ended at the deadline (its own limit did not stop it)"])
        if os.path.exists(inc_path):
            with open(inc_path) as fh:
                inc = json.load(fh)
            if len(inc["values"]) == len(columns):
                raw.status = "feasible"
                raw.columns = dict(zip(columns, inc["values"], strict=True))
                raw.objective = inc["objective"]
                raw.bound = inc["bound"]
        return raw
    raw = _highs_raw(out, columns, mip, rel_gap, abs_gap)
    raw.start_accepted = accepted
    if node_limit is not None and mip and raw.status != "optimal" and out.get("nodes", 0) >= int(node_limit):
        raw.notes.append(f"stopped at the node limit ({int(node_limit)} nodes)")
    return raw


def _highs_raw(out: dict, columns: list[str], mip: bool, rel_gap: float, abs_gap: float | None) -> _Raw:
    code = out["code"]
    has_values = "values" in out and len(out["values"]) == len(columns)
    if code == "kOptimal" and has_values:
        status = "optimal"
    elif code == "kInfeasible":
        status = "infeasible"
    elif code == "kUnbounded":
        status = "unbounded"
    elif code in ("kLoadError", "kModelError", "kPresolveError", "kSolveError", "kPostsolveError"):
        raise RuntimeError(f"HiGHS failed: {out['status']}")
    else:  # time limit, interrupt, iteration limit, unbounded-or-infeasible, ...
        status = "feasible" if has_values and mip else "no_solution"
    objective = out["objective"] if status in ("optimal", "feasible") else None
    bound = out["bound"] if mip else None
    if status == "optimal" and objective is not None:
        if mip:  # presolve may leave mip_dual_bound stale: the gap rule bounds the optimum too
            allow = max(HIGHS_DEFAULT_ABS_GAP if abs_gap is None else abs_gap,
                        rel_gap * max(abs(objective), 1.0) * (1 + 1e-9))
            # optimal means "within the allowed gap"; HiGHS's mip_dual_bound can sit at the
            # incumbent when it stops at the gap, so only objective - allow is a proof
            bound = objective - allow
        else:
            bound = objective  # LP duality
    notes = []
    if code == "kUnboundedOrInfeasible":
        notes.append("HiGHS: unbounded or infeasible (not proven which)")
    return _Raw(status, columns=dict(zip(columns, out["values"], strict=True)) if has_values else None,
                objective=objective, bound=bound, solver_status=out["status"], notes=notes)
