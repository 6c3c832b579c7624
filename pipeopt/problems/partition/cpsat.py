"""CP-SAT (OR-Tools) model of the partition problem in the one-order space.

The decision is the start unit ``p_t`` of each stage (integer variables over the stage
windows ``t .. n-S+t``, ``p_0 = 0``, ``p_S = n``, ``p_t < p_{t+1}``); every cost is an array
read at a start through an element constraint (arrays and windows from
:mod:`pipeopt.problems.partition.model`, read off the cost table):

    minimise T  s.t.
      end[p_{t+1}] - begin[p_t] <= T        (stage time, every stage)
      cut[p_t] <= T                         (overlapped communication, t >= 1)
      end[p_{l+1}] - begin[p_i] + sum_{c=i+1..l} mid[p_c] <= (l - i + 1) T
                                            (1F1B window rows, 0 <= i < l <= S-1)
      p_{t+1} <= reach_t[p_t]               (memory: the last end at which stage t fits)

With the window rows the max of the rows is the split's exact period, :func:`pipeopt.evaluate`'s
bottleneck (:mod:`pipeopt.problems.partition.model`). The O(S^2) window rows are written out
(each with its l - i mid elements: CP-SAT propagates these best) while they have at most
:data:`WINDOW_TERMS` mid terms (S <= 49); beyond, they are stated in O(S) constraints: with
the prefix sums ``M_l = sum_{c<=l} mid[p_c]`` (integer variables), row (i, l) is
``A_l <= B_i`` for ``A_l = end[p_{l+1}] + M_l - (l+1) T`` and ``B_i = begin[p_i] + M_i - i T``,
and all of them hold iff ``A_l <= min_{i<=l} B_i``, a running minimum (one variable per
stage, bounded above by the previous one and by ``B_l``).

Element constraints on monotone arrays propagate like the classic "probe" of
chains-on-chains partitioning: once T is bounded, each p_t's domain shrinks to the positions
a stage of time <= T can reach, which is how CP-SAT proves optimality.

**Memory is exact**: ``reach_t`` (:func:`~pipeopt.problems.partition.model.memory_reach`) holds
unit indices decided by the cost model's own ``fits``; no byte count enters the model, so
nothing is rounded and nothing can overflow CP-SAT's 64-bit integers whatever the sizes.

**Integer time scale**: CP-SAT needs integers, so times are counted in ticks of
:attr:`StraightModel.tick` seconds (the largest time value is about 1e9 ticks), rounded in
the relaxing direction: every array is rounded down and window row (i, l) (k = l - i + 1; k = 1
is a stage row) reads ``end[p_{l+1}] - begin[p_i] + sum mid[p_c] - k <= k T`` (with overlap
``begin`` and ``end`` are one array, read by one element constraint per start). Its integer
left side is at least k - 1 ticks below the true one, so a split of true period P meets every
row at ``T = floor(P / tick)``: the integer value of every split is at most its true value (so
CP-SAT's bound, in ticks, is a valid lower bound on the true optimum); and it is at least the
true value less two ticks (so a split optimal in ticks is within
:attr:`StraightModel.tolerance`, three ticks, of the true optimum).
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.cpsat import solve_cpsat as solve_cpsat_model
from ...backends.deadline import Deadline
from ...errors import InvalidProblemError
from ...result import Result
from .model import Attempt, StraightModel, check_options, solve_exact
from .problem import PartitionProblem
from .tiebreak import break_ties

cp_model = lazy_module("ortools.sat.python.cp_model")

__all__ = ["WINDOW_TERMS", "build_cpsat", "solve_cpsat"]

WINDOW_TERMS = 20_000
"""Most mid terms the window rows may have written out one by one (:func:`window_terms`);
beyond it (S above 49) they are stated through prefix sums and a running minimum."""


def window_terms(S: int) -> int:
    """Mid terms of the O(S^2) window rows written out: ``sum_{i<l} (l - i)``."""
    return (S - 1) * S * (S + 1) // 6


def build_cpsat(
    model: StraightModel, upper: float | None = None, deadline: Deadline | None = None
) -> tuple[cp_model.CpModel, cp_model.IntVar, list]:
    """Build the CP-SAT model of the straight partition problem.

    Parameters
    ----------
    model
        Arrays of the problem (its ``reach`` gives the memory constraints).
    upper
        Seconds: the bottleneck of a split known to fit, or ``None``. If given, T's domain
        ends one tick above it (only splits at least as good remain; that split's integer
        value is at most its true value, so it stays feasible).
    deadline
        The method's clock: building stops with
        :class:`~pipeopt.backends.deadline.DeadlineReached` when it passes.

    Returns
    -------
    (cp, T, p)
        The model, the bottleneck in ticks and the start variables ``p[1..S-1]`` (``p[0]``
        and ``p[S]`` are the constants 0 and n).
    """
    deadline = Deadline(None) if deadline is None else deadline
    n, S = model.n, model.S
    cp = cp_model.CpModel()
    end, cut, mid = model.ticks(model.end), model.ticks(model.cut), model.ticks(model.mid)
    shared = bool(np.array_equal(model.begin, model.end))  # with overlap: one element per start
    begin = end if shared else model.ticks(model.begin)
    windowed = model.windowed
    # a window row's left side over k is at most a stage's plus one inner cut's mid
    top = max(max(end) - min(begin) - 1 + (max(max(mid), 0) if windowed else 0), max(cut), 0)
    if upper is not None:
        top = min(top, math.ceil(upper / model.tick) + 1)
    lb = max(0, math.floor(model.lower_bound / model.tick) - 1)
    T = cp.new_int_var(min(lb, top), top, "bottleneck")
    p: list = [0]
    for t in range(1, S):
        win = model.window(t)
        p.append(cp.new_int_var(win[0], win[-1], f"start_{t}"))
    p.append(n)
    for t in range(1, S - 1):
        cp.add(p[t] < p[t + 1])

    elements: dict = {}

    def at(array, t, name):
        """Expression for ``array[p_t]`` (an element constraint unless p_t is constant)."""
        if t in (0, S):
            return int(array[p[t]])
        if (name, t) not in elements:
            v = cp.new_int_var(min(array), max(array), f"{name}_{t}")
            cp.add_element(p[t], array, v)
            elements[name, t] = v
        return elements[name, t]

    for t in range(S):
        deadline.check("building the CP-SAT model")
        # floor(end) - floor(begin) - 1 < end - begin: the integer value never exceeds the true one
        cp.add(at(end, t + 1, "end") - at(begin, t, "end" if shared else "begin") - 1 <= T)
        if 0 < t and max(cut) > 0:
            cp.add(at(cut, t, "cut") <= T)
    # window row (i, l), k = l - i + 1: floor(end) - floor(begin) + sum floor(mid) - k <= k T;
    # its left side is at least k - 1 ticks below the true one, so every split meets its rows at
    # T = floor(its true period / tick) (module docstring)
    if windowed and window_terms(S) <= WINDOW_TERMS:
        for i, l in model.windows():
            deadline.check("building the CP-SAT model")
            k = l - i + 1
            inner = sum(at(mid, c, "mid") for c in range(i + 1, l + 1))
            cp.add(at(end, l + 1, "end") - at(begin, i, "end" if shared else "begin") + inner - k <= k * T)
    elif windowed:
        # the same rows as A_l <= B_i with A_l = end[p_{l+1}] + M_l - (l+1)(T+1),
        # B_i = begin[p_i] + M_i - i(T+1), M_l = sum_{c=1..l} mid[p_c]: a running minimum of
        # the B_i keeps it O(S)
        span = S * (max(top, 0) + 1)
        m_lo, m_hi = S * min(min(mid), 0), S * max(max(mid), 0)
        M: list = [0]
        for c in range(1, S):
            deadline.check("building the CP-SAT model")
            v = cp.new_int_var(m_lo, m_hi, f"mid_sum_{c}")
            cp.add(v == M[-1] + at(mid, c, "mid"))
            M.append(v)
        low = int(begin[0])  # B_0
        for l in range(1, S):
            deadline.check("building the CP-SAT model")
            b_l = at(begin, l, "end" if shared else "begin") + M[l] - l * (T + 1)
            v = cp.new_int_var(min(begin) + m_lo - span - 1, max(begin) + m_hi + 1, f"window_min_{l}")
            cp.add(v <= low)
            cp.add(v <= b_l)
            cp.add(at(end, l + 1, "end") + M[l] - (l + 1) * (T + 1) <= v)
            low = v
    if model.memory_binding:
        for t in range(S):
            deadline.check("building the CP-SAT model")
            reach = [int(x) for x in model.reach[t]]
            cp.add(p[t + 1] <= at(reach, t, "reach"))
    cp.minimize(T)
    return cp, T, p


def solve_cpsat(
    problem: PartitionProblem,
    *,
    time_limit: float | Deadline = 60.0,
    solver: str = "cbc",
    seed: int = 0,
    threads: int = 2,
    warm_start: bool = True,
) -> Result:
    """Solve the straight partition problem with CP-SAT (OR-Tools).

    Parameters
    ----------
    problem
        The partition problem (``replication=False``).
    time_limit
        Seconds, or the solve's :class:`~pipeopt.backends.deadline.Deadline`: one clock for
        the warm start heuristic (at most a quarter of it), model building and CP-SAT, which
        gets what is left through :func:`pipeopt.backends.cpsat.solve_cpsat` (a watchdog stops
        it shortly after the deadline, presolve included).
    solver
        Ignored (the MILP backend choice of the common method signature).
    seed
        CP-SAT's ``random_seed``.
    threads
        CP-SAT's parallel search threads (``num_workers``).
    warm_start
        Hint a heuristic split (:func:`~pipeopt.problems.partition.model.heuristic_split`)
        and, if it fits in memory, cap T's domain at its value (``False``: bare model).

    Returns
    -------
    Result
        Method ``"cpsat"``.

        * ``OPTIMAL``: CP-SAT proved its integer model optimal, and the plan's objective by
          :func:`pipeopt.evaluate` is within ``info["tolerance_s"]`` seconds (three ticks,
          about 3e-9 of the single-stage time; see the module docstring) of the lower bound.
          S = 1 and S = n have one split only: it is scored directly.
        * ``TIME_LIMIT``: the solver stopped at its time limit (what was left of the
          deadline) or the deadline passed during the warm start or model building; the
          plan is the best one found that fits (CP-SAT's incumbent or the warm start), or
          ``None`` if none fits.
        * ``FEASIBLE``: CP-SAT's answer could not be taken as a proof (it said infeasible
          although a split that fits is known, or its optimum is not confirmed by the valid
          bound); the best plan that fits and the bound.

        ``lower_bound`` (seconds) = CP-SAT's objective bound x tick x (1 - 1e-12) (valid: the
        integer value of every split is at most its true value), and at least
        :meth:`PartitionProblem.simple_lower_bound`. Memory is exact, so a plan CP-SAT returns
        fits (checked by :func:`pipeopt.evaluate`; one that does not is removed and the model
        solved again). ``info["solver_objective"]`` and ``info["solver_bound"]`` are CP-SAT's
        integer objective and bound in seconds (the objective is within the tolerance below
        the plan's evaluation), ``info["solver_objective_ticks"]`` and
        ``info["solver_bound_ticks"]`` the integers; ``info["rounding_error_s"]`` bounds how far
        below its true value a split's integer value can be. ``info["bound_source"]`` says
        where the bound comes from.

    Raises
    ------
    InvalidProblemError
        If the objective is not ``"bottleneck"`` (the finite-M objectives are solved by
        ``milp``), if ``problem.replication`` is set (replication is solved by the DP only),
        ``threads`` < 1 or ``seed`` < 0, or the time limit is not a positive number.
    InfeasibleError
        Only when proven: the only split (S = 1 or S = n) breaks memory, or CP-SAT proves that
        no split fits in memory.

    References
    ----------
    Perron & Didier, CP-SAT, OR-Tools (Google); Pinar & Aykanat, JPDC 2004 (chains-on-chains
    partitioning); Narayanan et al., PipeDream, SOSP 2019 (1F1B memory).
    """
    problem.refuse_recompute("method 'cpsat'")
    deadline = Deadline.of(time_limit)
    if problem.instance.settings.objective != "bottleneck":
        raise InvalidProblemError(
            f"cpsat minimises the steady-state bottleneck; objective {problem.instance.settings.objective!r} "
            "is solved exactly by 'milp' (its event-time model)"
        )
    check_options("cpsat", threads, seed)
    problem.refuse_tie_sums("cpsat")  # its stage rows read the work as prefix sums

    def run(model: StraightModel, hint: list[int], upper: float | None, dl: Deadline) -> Attempt:
        cp, _T, p = build_cpsat(model, upper if warm_start else None, dl)
        out = solve_cpsat_model(cp, deadline=dl, threads=int(threads), seed=int(seed),
                                hint={p[t]: hint[t - 1] for t in range(1, model.S)} if hint else None)
        info = {**out.info(), "tick_s": model.tick, "rounding_error_s": model.tolerance, "threads": int(threads)}
        info["solver_objective_ticks"], info["solver_bound_ticks"] = out.objective, out.bound
        starts = None
        # 1e-12 relative covers the float error of seconds / tick (about 1e-16 of the values)
        bound = out.bound * model.tick * (1 - 1e-12) if out.bound is not None else None
        info["solver_bound"] = bound
        info["solver_objective"] = None
        if out.has_solution:
            starts = [int(out.value(p[t])) for t in range(1, model.S)]
            info["solver_objective"] = out.objective * model.tick
        return Attempt(out.status, starts, bound, info)

    return solve_exact(problem, "cpsat", deadline, run, rel_tol=0.0, abs_tol=lambda model: model.tolerance,
                       warm_start=warm_start, info={"solver": "cp-sat"},
                       phase2={"run": break_ties, "solver": solver, "threads": int(threads), "seed": int(seed)})
