"""CP-SAT (OR-Tools) model of the partition problem in the straight space.

The decision is the start unit ``p_t`` of each stage (integer variables over the stage
windows ``t .. n-S+t``, ``p_0 = 0``, ``p_S = n``, ``p_t < p_{t+1}``); every cost is a prefix
array read at a start through an element constraint (arrays and windows from
:mod:`pipeopt.problems.partition.model`):

    minimise T  s.t.
      end[p_{t+1}] - begin[p_t] <= T        (stage time, every stage)
      cut[p_t] <= T                         (overlapped communication, t >= 1)
      M_t[p_{t+1}] - M_t[p_t] <= capacity   (1F1B memory, if it can bind)

Element constraints on monotone prefix arrays propagate like the classic "probe" of
chains-on-chains partitioning: once T is bounded, each p_t's domain shrinks to the
positions a stage of time <= T can reach, which is how CP-SAT proves optimality.

Integer time scale: CP-SAT needs integers, so times are rounded to ticks of
:attr:`StraightModel.tick` seconds (the largest time value is about 1e9 ticks). The
model's value of any split is within one tick of its true bottleneck, so a split optimal
for the integer model is within **two ticks** (:attr:`StraightModel.tolerance`, about
2e-9 of the single-stage time) of the true optimum, and the reported lower bound is the
solver's bound minus one tick. Memory is modelled in whole bytes (exact for integral byte
counts, as in PipeDream profiles).
"""

from __future__ import annotations

import math
import time

from ortools.sat.python import cp_model

from .problem import PartitionProblem
from ...result import Result
from .model import StraightModel, finish, heuristic_split, infeasible_memory


def build_cpsat(
    model: StraightModel, upper: float | None = None
) -> tuple[cp_model.CpModel, cp_model.IntVar, list]:
    """Build the CP-SAT model of the straight partition problem.

    Parameters
    ----------
    model
        Arrays of the problem.
    upper
        Seconds: the bottleneck of a known memory-feasible split, or ``None``. If given, T's
        domain ends one tick above it (only splits at least as good remain; that split's
        integer value is within one tick of ``upper``, so it stays feasible).

    Returns
    -------
    (cp, T, p)
        The model, the bottleneck in ticks and the start variables ``p[1..S-1]`` (``p[0]``
        and ``p[S]`` are the constants 0 and n).
    """
    n, S = model.n, model.S
    cp = cp_model.CpModel()
    begin, end, cut = model.ticks(model.begin), model.ticks(model.end), model.ticks(model.cut_time)
    top = max(max(end) - min(begin), max(cut))
    if upper is not None:
        top = min(top, math.ceil(upper / model.tick) + 1)
    lb = max(0, math.floor(model.lower_bound / model.tick) - 1)  # valid for the rounded model
    T = cp.new_int_var(min(lb, top), top, "bottleneck")
    p: list = [0]
    for t in range(1, S):
        win = model.window(t)
        p.append(cp.new_int_var(win[0], win[-1], f"start_{t}"))
    p.append(n)
    for t in range(1, S - 1):
        cp.add(p[t] < p[t + 1])

    def at(array, t, name):
        """Expression for ``array[p_t]`` (an element constraint unless p_t is constant)."""
        if t in (0, S):
            return int(array[p[t]])
        v = cp.new_int_var(min(array), max(array), f"{name}_{t}")
        cp.add_element(p[t], array, v)
        return v

    begins = [at(begin, t, "begin") for t in range(S)]
    ends = [None] + [at(end, t, "end") if not model.overlap else begins[t] for t in range(1, S)] + [end[n]]
    for t in range(S):
        cp.add(ends[t + 1] - begins[t] <= T)
    if model.overlap:
        for t in range(1, S):
            cp.add(at(cut, t, "cut") <= T)
    units = model.memory_units()
    if units is not None:
        mem, cap = units
        for t in range(S):
            arr = [int(x) for x in mem[t]]
            cp.add(at(arr, t + 1, f"mem{t}_end") - at(arr, t, f"mem{t}_begin") <= cap)
    cp.minimize(T)
    return cp, T, p


def solve_cpsat(
    problem: PartitionProblem,
    *,
    time_limit: float = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    num_workers: int = 2,
    warm_start: bool = True,
    **_ignored,
) -> Result:
    """Solve the straight partition problem with CP-SAT (OR-Tools).

    Parameters
    ----------
    problem
        The partition problem (``replication=False``).
    time_limit
        Seconds (CP-SAT's ``max_time_in_seconds``).
    solver
        Ignored (the MILP backend choice of the common method signature).
    seed
        CP-SAT's ``random_seed``.
    num_workers
        CP-SAT's ``num_workers`` (parallel search threads).
    warm_start
        Hint a heuristic split (:func:`~pipeopt.problems.partition.model.heuristic_split`)
        and, if it fits in memory, cap T's domain at its value (``False``: bare model).

    Returns
    -------
    Result
        Method ``"cpsat"``. Status ``OPTIMAL`` if CP-SAT proved its integer-scaled model
        optimal: the plan is then within ``info["tolerance_s"]`` (two ticks, see the module
        docstring) of the true straight optimum; ``TIME_LIMIT`` otherwise, with the
        incumbent. ``lower_bound`` (seconds) = (CP-SAT's objective bound - 1 tick) x tick,
        a true bound on the straight optimum, and at least
        :meth:`PartitionProblem.simple_lower_bound`. ``info["solver_objective"]`` is the
        integer objective converted to seconds (within ``info["rounding_error_s"]`` of the
        plan's evaluation).

    Raises
    ------
    InvalidProblemError
        If ``problem.replication`` is set (replication is solved by the DP only).
    InfeasibleError
        If CP-SAT proves that no split fits in memory.

    References
    ----------
    Perron & Didier, CP-SAT, OR-Tools (Google); Pinar & Aykanat, JPDC 2004 (chains-on-chains
    partitioning); Narayanan et al., PipeDream, SOSP 2019 (1F1B memory).
    """
    started = time.perf_counter()
    model = StraightModel.of(problem, "cpsat")
    hint = heuristic_split(model)
    upper = model.bottleneck(hint) if (warm_start and model.fits(hint)) else None
    cp, _T, p = build_cpsat(model, upper)
    if warm_start:
        for t in range(1, model.S):
            cp.add_hint(p[t], hint[t - 1])
    sat = cp_model.CpSolver()
    sat.parameters.max_time_in_seconds = max(float(time_limit), 0.01)
    sat.parameters.num_workers = max(int(num_workers), 1)
    sat.parameters.random_seed = int(seed)
    status = sat.solve(cp)
    info: dict = {
        "solver": "cp-sat",
        "solver_status": sat.status_name(status),
        "tick_s": model.tick,
        "tolerance_s": model.tolerance,
        "rounding_error_s": model.rounding_error,
        "warm_start": hint,
        "warm_start_value": model.bottleneck(hint),
        "num_workers": int(num_workers),
        "branches": int(sat.num_branches),
    }
    if status == cp_model.INFEASIBLE:
        if not model.fits(hint):
            raise infeasible_memory(problem, "cpsat")
        # a split that fits is known: the integer model must have lost it (a modelling bug)
        info["solver_note"] = "CP-SAT claimed infeasibility although a split that fits is known (ignored)"
    if status == cp_model.MODEL_INVALID:  # a bug in the model, not in the input
        raise RuntimeError(f"CP-SAT rejected the partition model: {cp.validate()}")
    starts = None
    bound = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        starts = [int(sat.value(p[t])) for t in range(1, model.S)]
        info["solver_objective"] = sat.objective_value * model.tick
        bound = (sat.best_objective_bound - 1) * model.tick
    elif math.isfinite(sat.best_objective_bound):
        bound = (sat.best_objective_bound - 1) * model.tick
    return finish(model, "cpsat", starts, status == cp_model.OPTIMAL, bound, started, info)
