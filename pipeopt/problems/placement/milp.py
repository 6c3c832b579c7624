"""MILP (PuLP; CBC or HiGHS) of the placement problem over every convex ordered split: the
cross-check of the DP over ideals (:mod:`.dp`) and the method for a DAG with too many ideals.

Formulation, on the units of the problem's unit DAG (:attr:`PlacementProblem.dag` of the
*strict* problem, :meth:`PlacementProblem.strictly`: only free layers without bytes are merged,
so every unit's memory is exact). With n units, D devices (the cluster's; D stage slots
``s = 0 .. D-1`` in pipeline order), C device classes (:attr:`PlacementProblem.classes`) and
the tensors between units (a tensor ``t`` of ``sec_t`` seconds from unit ``src_t`` to the units
``R_t``, its readers in other units):

    minimise T  s.t.
      sum_s x[u, s] = 1                                  (each unit in one slot)
      sum_c y[s, c] <= 1,  sum_s y[s, c] <= |class c|    (a slot on one device; devices of c)
      x[u, s] <= sum_{c runs u} y[s, c]                  (a unit only on a device that runs it)
      sum_c y[s+1, c] <= sum_c y[s, c]                   (used slots first: no symmetry)
      sum_{s' <= s} x[v, s'] <= sum_{s' <= s} x[u, s']   (every unit edge u -> v, s < D-1)
      z[t, s] >= x[src_t, s] - x[r, s],  z[t, s] >= x[r, s] - x[src_t, s]   (r in R_t)
      sum_u time_c(u) x[u, s] + [c not host] sum_t sec_t z[t, s] - T <= M_c (1 - y[s, c])
      sum_{u fits c} bytes(u) x[u, s] <= limit_c + (B_c - limit_c) (1 - y[s, c])
      T >= simple lower bound

with x, y binary and z in [0, 1]. ``time_c(u)`` is the unit's forward + backward time on one
unit of the class's kind divided by its units of that kind (sequential execution,
:func:`pipeopt.cost.rules.stage_compute` on a single-kind device; a unit without a finite
time on that kind cannot run there and gets coefficient 0, the ``x <= sum y`` row keeping it
off); ``z[t, s]`` is 1 when slot s touches tensor t (holds its source and not some reader, or
some reader and not its source: :func:`pipeopt.cost.rules.stage_transfers`), which the minimised
T makes tight on the slot that sets T. ``M_c`` (the class's compute of every unit it runs plus
every tensor) is a valid big-M. With a plan known to fit (the warm start) every ``time_c(u)``
and ``sec_t`` is capped at its max-load U: the optimum is unchanged (a slot holding a capped term
loads at least U, in the model and in truth) and ``M_c`` stays within (n + tensors) U, where the
uncapped one, on a class much slower than the optimum, was so large that the solvers'
integrality tolerance on ``y`` (1e-6) relaxed a load row by half the optimum. ``limit_c`` is :func:`pipeopt.cost.rules.memory_limit` of the
class's memory; a unit larger than that cannot run on the class (so the units of the memory
row are those it can hold, and ``B_c``, their bytes, is a big-M of at most n ``limit_c``); a
class that can hold all of them at once needs no memory row. The cumulative
precedence rows are ``sum_s s x[u, s] <= sum_s s x[v, s]`` (stage(u) <= stage(v)) written per
slot: the same integer points, a tighter LP relaxation. Every edge going to the same or a later
slot is exactly the convex ordered space.

Times are scaled to units of 1/100 of the simple lower bound (T of about 100 in the solver,
away from its absolute tolerances). Memory rows count bytes in millionths of the capacity
(:data:`MEMORY_UNITS`), so that no coefficient is below 1e-6 for a unit of at least 10^-12 of
the device, and their big-M has a margin of one such unit, so that a slot on another device
never meets the row with equality. Without them the solvers' presolves went wrong on small
random instances (the regression tests keep them): scaled to the capacity, a 1-byte unit
beside one that fills a device exactly made HiGHS 1.14 declare a feasible model infeasible;
with an exactly met big-M, CBC 2.10 said "proven infeasible" of a feasible model and both
solvers returned a plan 4-8 times the optimum as optimal. The solver's
plan is scored by :func:`pipeopt.evaluate`; a plan the solver accepted within its feasibility
tolerance but that breaks a device's memory by the cost model's own rule
(:func:`pipeopt.cost.rules.fits`) is cut off by a no-good row on that stage's set of units on
that class (valid for every superset: memory only grows) and the model is solved again.

References
----------
Tarnawski, Phanishayee, Devanur, Mahajan, Nina Paravecino, Efficient Algorithms for Device
Placement of DNN Graph Operators, NeurIPS 2020 (arXiv:2006.16423). The authors'
``throughput-ip/ip.py`` in mode ``contig`` is a Gurobi IP of the same problem (per-device
binaries, contiguity of each device's forward subgraph, comm-in/comm-out variables like z
above, max-load objective); this model orders the stages (the space of their DP,
``throughput-dp/dp.cpp``) and states the device classes by slot.
"""

from __future__ import annotations

import math

import numpy as np

from ...lazy import lazy_module
from ...backends.scaling import model_unit
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.pulp import SOLVERS, solve_pulp
from ...cost import evaluate, rules
from ...cost.tolerance import SOLVER_CLAIM, SOLVER_GAP
from ...errors import InfeasibleError, InvalidProblemError
from ...result import Result, Status
from .dp import lattice_dp
from .problem import PlacementProblem

pulp = lazy_module("pulp")

__all__ = ["BOUND_SLACK", "MILP_ABS_GAP", "MILP_REL_GAP", "MILP_TOLERANCE", "PlacementMilp", "solve_milp"]

MILP_REL_GAP = SOLVER_GAP
"""Relative optimality gap at which the solvers stop (about zero)."""

MILP_ABS_GAP = SOLVER_GAP
"""Absolute gap in the model's time units (1/100 of the simple lower bound)."""

BOUND_SLACK = SOLVER_GAP
"""Relative amount taken off the solver's dual bound before it is quoted as proven (its
feasibility and integrality tolerances on these scaled rows)."""

MILP_TOLERANCE = SOLVER_CLAIM
"""Relative tolerance of an ``optimal`` claim: the evaluated objective of the plan is within it
of the quoted lower bound; otherwise the result says ``feasible``."""

HEURISTIC_SHARE = 0.25
"""At most this share of the time limit goes to the warm start (the one-order DP)."""

MEMORY_UNITS = 1e6
"""A memory row counts bytes in units of 1/MEMORY_UNITS of the device's capacity."""

MAX_CUTS = 50
"""At most this many memory no-good rounds (each cuts off a stage the solver's tolerance let
past the cost model's memory rule)."""


class PlacementMilp:
    """The arrays of the model (module docstring) for one placement problem.

    Attributes
    ----------
    problem
        The strict problem (:meth:`PlacementProblem.strictly`) whose unit DAG the model uses;
        :meth:`PlacementProblem.plan` of it turns the solution into a plan.
    n, D, C
        Units, stage slots (devices), device classes.
    time
        ``ndarray (C, n)``: seconds of each unit on a device of each class (``inf``: cannot
        run there, by kind or by memory).
    memory
        ``ndarray (n,)``: bytes of each unit.
    limit
        ``ndarray (C,)``: :func:`pipeopt.cost.rules.memory_limit` of each class's memory.
    tensors
        ``[(src unit, (reader units...), seconds)]``, tensors with the same source and readers
        summed, readers inside the source's unit left out (they never cross).
    lower
        Seconds: a lower bound on the optimum (the largest of the slowest unit on its fastest
        class and the total of every unit on its fastest class over D).

    Raises
    ------
    InvalidProblemError
        If a device class pools units of several resource kinds (its compute time is not
        linear in the units it holds: the DP prices it).
    """

    def __init__(self, problem: PlacementProblem) -> None:
        p = problem if problem.strict else problem.strictly()
        self.problem = p
        inst = p.instance
        self.n = p.dag.n
        self.D = len(inst.cluster.devices)
        self.C = len(p.classes)
        ut = p.unit_times  # (K, n)
        all_zero = (ut == 0).all(axis=0) if len(p.kinds) else np.ones(self.n, dtype=bool)
        self.memory = np.asarray(p.unit_memory, dtype=float)
        self.limit = np.array([rules.memory_limit(cl.memory) for cl in p.classes], dtype=float)
        time = np.full((self.C, self.n), np.inf)
        for c, cl in enumerate(p.classes):
            usable = [(k, cl.resources[kind]) for k, kind in enumerate(p.kinds)
                      if cl.resources.get(kind, 0.0) > 0]
            if len(usable) > 1:
                raise InvalidProblemError(
                    f"placement milp: device class {cl.names[0]!r} has several resource kinds"
                    f" ({sorted(cl.resources)}); its compute time is not linear in its layers (use the dp)"
                )
            if usable:
                k, r = usable[0]
                time[c] = ut[k] / r
            time[c] = np.where(all_zero, 0.0, time[c])
            time[c] = np.where(rules.fits(self.memory, cl.memory), time[c], np.inf)
        self.time = time
        uo = p.dag.unit_of
        bw, alpha = inst.cluster.bandwidth, inst.cluster.latency
        grouped: dict = {}
        for src, readers, b in p.tensors:
            su = uo[src]
            rd = tuple(sorted({uo[r] for r in readers} - {su}))
            if rd and b > 0:
                grouped[(su, rd)] = grouped.get((su, rd), 0.0) + float(rules.transfer_time(b, bw, 1, alpha))
        self.tensors = [(su, rd, sec) for (su, rd), sec in grouped.items()]
        best = np.where(np.isfinite(time), time, np.inf).min(axis=0) if self.C else np.full(self.n, np.inf)
        if self.n and np.isfinite(best).all():
            self.lower = float(max(best.max(), best.sum() / max(self.D, 1)))
        else:
            self.lower = 0.0

    def unrunnable(self) -> list:
        """Units that no class can run (by kind or memory): no plan exists."""
        return [u for u in range(self.n) if not np.isfinite(self.time[:, u]).any()]

    def time_unit(self, hint: float | None = None) -> float:
        """Seconds per model time unit: 1/100 of the lower bound, else of ``hint`` (a known
        plan's objective, seconds), else of the largest time.

        The scale keeps the max-load variable near 100 units, where the solver's absolute
        feasibility tolerance (about 1e-6) is a negligible fraction of the optimum.
        """
        scale = self.lower
        if not scale > 0 and hint is not None and math.isfinite(hint) and hint > 0:
            scale = hint
        if not scale > 0:
            vals = [float(v) for v in self.time[np.isfinite(self.time)] if v > 0]
            vals += [sec for _, _, sec in self.tensors]
            scale = max(vals) if vals else 1.0
        return model_unit(scale, 100.0)

    def build(self, deadline: Deadline | None = None, unit: float | None = None, upper: float | None = None):
        """The PuLP model. ``upper`` (seconds; optional): the max-load of a plan known to fit. A
        load row's coefficients (a unit's time on the class, a tensor's seconds) are then capped
        at it: a slot holding a capped term has a load of at least ``upper`` in the model and at
        least as much in truth, so no plan below ``upper`` changes and the model's optimum stays
        the true one (:func:`solve_milp` keeps the known plan when the solver's is not better);
        and the rows' big-M (the class's capped terms summed) stays a few hundred times T, not
        the class's whole compute: with times far above the optimum (a layer of 8 ms where the
        optimum is a 1 ns transfer) an integrality tolerance on ``y`` of 1e-6 times that big-M
        let HiGHS accept a load of half the optimum.

        Returns
        -------
        (lp, T, x, y, z)
            The problem, the max-load variable (in :meth:`time_unit`), ``x[u][s]``,
            ``y[s][c]`` (only the classes that run some unit) and ``z[i][s]`` (tensor i of
            :attr:`tensors`, only when some class pays transfers).

        Raises
        ------
        DeadlineReached
            If the deadline passes while building.
        """
        deadline = Deadline(None) if deadline is None else deadline
        p, n, D, C = self.problem, self.n, self.D, self.C
        unit = self.time_unit() if unit is None else unit
        lp = pulp.LpProblem("placement_convex", pulp.LpMinimize)

        def add(terms, constant, name, sense=pulp.LpConstraintLE):
            lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms, constant), sense), name)

        T = lp.add_variable("max_load", lowBound=self.lower / unit)
        lp += T, "max_load_objective"
        runs = np.isfinite(self.time)  # (C, n)
        live = [c for c in range(C) if runs[c].any()]
        x = {u: {s: lp.add_variable(f"x_{u}_{s}", cat=pulp.LpBinary) for s in range(D)} for u in range(n)}
        y = {s: {c: lp.add_variable(f"y_{s}_{c}", cat=pulp.LpBinary) for c in live} for s in range(D)}
        payers = [c for c in live if not p.classes[c].host]
        z = {}
        if payers:
            z = {i: {s: lp.add_variable(f"z_{i}_{s}", lowBound=0.0, upBound=1.0) for s in range(D)}
                 for i in range(len(self.tensors))}
        for u in range(n):
            add([(x[u][s], 1.0) for s in range(D)], -1.0, f"assign_{u}", pulp.LpConstraintEQ)
        for s in range(D):
            deadline.check("building the placement MILP")
            add([(y[s][c], 1.0) for c in live], -1.0, f"one_device_{s}")
            if s + 1 < D:
                add([(y[s + 1][c], 1.0) for c in live] + [(y[s][c], -1.0) for c in live], 0.0,
                    f"used_first_{s}")
            for u in range(n):
                add([(x[u][s], 1.0)] + [(y[s][c], -1.0) for c in live if runs[c, u]], 0.0, f"runs_{u}_{s}")
        for c in live:
            add([(y[s][c], 1.0) for s in range(D)], -float(len(p.classes[c].names)), f"devices_{c}")
        for v, preds in enumerate(p.dag.preds):
            deadline.check("building the placement MILP")
            for u in preds:
                for s in range(D - 1):
                    add([(x[v][q], 1.0) for q in range(s + 1)] + [(x[u][q], -1.0) for q in range(s + 1)], 0.0,
                        f"order_{u}_{v}_{s}")
        for i, (src, readers, _) in enumerate(self.tensors if z else ()):
            deadline.check("building the placement MILP")
            for s in range(D):
                for r in readers:
                    add([(x[src][s], 1.0), (x[r][s], -1.0), (z[i][s], -1.0)], 0.0, f"sends_{i}_{r}_{s}")
                    add([(x[r][s], 1.0), (x[src][s], -1.0), (z[i][s], -1.0)], 0.0, f"reads_{i}_{r}_{s}")
        cap = math.inf if upper is None or not math.isfinite(upper) or upper <= 0 else float(upper)
        for c in live:
            cl = p.classes[c]
            coef = np.minimum(np.where(runs[c], self.time[c], 0.0), cap) / unit
            comm = [] if cl.host else [min(sec, cap) / unit for _, _, sec in self.tensors]
            big = float(coef.sum() + sum(comm))
            for s in range(D):
                deadline.check("building the placement MILP")
                terms = [(x[u][s], float(coef[u])) for u in range(n) if coef[u] > 0]
                terms += [(z[i][s], w) for i, w in enumerate(comm) if w > 0]
                add(terms + [(T, -1.0), (y[s][c], big)], -big, f"load_{s}_{c}")
        for c in live:
            lim = float(self.limit[c])
            fit = runs[c] & (self.memory > 0)  # the units a device of c can hold (each fits alone)
            total = float(self.memory[fit].sum())
            if not total > lim:
                continue  # every unit it runs fits at once: no row
            # bytes in millionths of the capacity: no coefficient below 1e-6 unless a unit is
            # 10^-12 of the device (scaled to the capacity, a 1-byte unit beside one that fills
            # the device exactly made HiGHS 1.14's presolve declare a feasible model infeasible)
            k = MEMORY_UNITS / lim
            # at most (n - 1) MEMORY_UNITS (each unit fits alone), plus 1 so that a slot on another
            # device never meets the row exactly: CBC's and HiGHS's presolves, rounding a row met
            # with equality at 10^6, declared feasible models infeasible or cut off their optimum
            big = (total - lim) * k + 1.0
            for s in range(D):
                deadline.check("building the placement MILP")
                mem = [(x[u][s], float(self.memory[u] * k)) for u in np.flatnonzero(fit)]
                add(mem + [(y[s][c], big)], -(MEMORY_UNITS + big), f"memory_{s}_{c}")
        return lp, T, x, y, z

    def stages(self, values, x, y) -> list:
        """``[(unit indices, class index)]`` in slot order (empty slots skipped) from a solution
        (variable name -> value), each binary read with a 0.5 threshold.

        Raises
        ------
        RuntimeError
            If the solution places a unit in no slot or a slot on no device (a solver fault).
        """
        slot_units: dict = {}
        for u, row in x.items():
            s = max(row, key=lambda q: values.get(row[q].name) or 0.0)
            if not (values.get(row[s].name) or 0.0) > 0.5:
                raise RuntimeError(f"placement milp: the solution puts unit {u} in no slot")
            slot_units.setdefault(s, []).append(u)
        out = []
        for s in sorted(slot_units):
            row = y[s]
            c = max(row, key=lambda q: values.get(row[q].name) or 0.0) if row else None
            if c is None or not (values.get(row[c].name) or 0.0) > 0.5:
                raise RuntimeError(f"placement milp: the solution uses slot {s} without a device")
            out.append((sorted(slot_units[s]), c))
        return out

    def start(self, stages, x, y, z) -> dict:
        """A complete MIP start (binaries and z) from ``[(unit indices, class)]``."""
        vals: dict = {}
        slot_of = {u: s for s, (units, _) in enumerate(stages) for u in units}
        for u, row in x.items():
            for s, var in row.items():
                vals[var.name] = float(slot_of[u] == s)
        for s, row in y.items():
            for c, var in row.items():
                vals[var.name] = float(s < len(stages) and stages[s][1] == c)
        for i, (src, readers, _) in enumerate(self.tensors):
            if i not in z:
                continue
            for s, var in z[i].items():
                there = [slot_of[r] == s for r in readers]
                mine = slot_of[src] == s
                vals[var.name] = float((mine and not all(there)) or (not mine and any(there)))
        return vals


def _over_memory(ev) -> list[int]:
    """Stages of an evaluation whose memory breaks the device's (the cost model's rule)."""
    pairs = zip(ev.memory, ev.memory_capacity, strict=True)
    return [i for i, (m, cap) in enumerate(pairs) if not rules.fits(m, cap)]


def solve_milp(problem: PlacementProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
               seed: int = 0, threads: int = 2, warm_start: bool = True) -> Result:
    """Place the DAG optimally over every convex ordered split, as a MILP (module docstring).

    Parameters
    ----------
    problem
        The placement problem (objective ``max_load``).
    time_limit
        Seconds or the solve's :class:`~pipeopt.backends.deadline.Deadline`: one clock for the
        warm start (at most :data:`HEURISTIC_SHARE` of it), model building and the solver
        (:func:`pipeopt.backends.pulp.solve_pulp`, which ends the solver's process at the
        deadline plus a short grace).
    solver
        ``"cbc"`` (PuLP's bundled CBC) or ``"highs"`` (highspy).
    seed
        Solver random seed (an integer >= 0).
    threads
        Solver threads (HiGHS; CBC runs its serial search).
    warm_start
        Start the solver from the one-order DP's plan (the contiguous splits of pipeopt's
        layer order, :func:`pipeopt.problems.placement.dp.lattice_dp` on the chain).

    Returns
    -------
    Result
        Method ``"milp"``, space ``"convex"``; its objective is :func:`pipeopt.evaluate`'s
        max-load of the plan, seconds.

        * ``OPTIMAL``: the solver proved optimality (gap :data:`MILP_REL_GAP`) and the plan's
          evaluated objective is within :data:`MILP_TOLERANCE` of the lower bound (the
          solver's bound less :data:`BOUND_SLACK`, relative);
        * ``TIME_LIMIT``: the deadline passed (in the warm start, model building or the
          solver): the solver's incumbent, or the warm start's plan, or no plan; the lower
          bound is the solver's dual bound if it gave one, else the simple bound;
        * ``FEASIBLE`` (not expected; said in ``info["note"]``): the solver said optimal but its
          plan is not within the tolerance of its bound, or it said infeasible although the
          warm start's plan fits (its presolve erred: the best plan known and the simple bound).

        ``info``: the model's size, the solver's status, objective and bound (seconds), the
        memory cuts added, the warm start's value.

    Raises
    ------
    InvalidProblemError
        If the solver is unknown, ``seed``/``threads`` are out of range, or a device class has
        several resource kinds (:class:`PlacementMilp`).
    InfeasibleError
        Only when proven: a unit fits no device (by kind or memory), or the solver proved the
        model infeasible (then no placement fits the devices' memory).
    """
    deadline = Deadline.of(time_limit)
    if solver not in SOLVERS:
        raise InvalidProblemError(f"unknown MILP solver {solver!r}; choose from {list(SOLVERS)}")
    for name, value, least in (("threads", threads, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise InvalidProblemError(f"milp: {name} must be an integer >= {least}, got {value!r}")
    model = PlacementMilp(problem)
    p = model.problem
    name = problem.instance.name
    bad = model.unrunnable()
    if bad:
        raise InfeasibleError(
            f"milp: unit {p.dag.units[bad[0]]!r} of {name} fits no device of the cluster"
            " (resource kind or memory)"
        )
    info: dict = {"solver": solver, "units": model.n, "slots": model.D, "classes": model.C,
                  "tensors": len(model.tensors), "rel_gap": MILP_REL_GAP,
                  "model": "convex ordered slots (x, y binary; z in [0, 1]); cumulative precedence"}
    lower = model.lower
    incumbent = None  # (evaluation, stages)

    def keep(stages) -> None:
        nonlocal incumbent
        ev = evaluate(p.instance, p.plan(stages))
        if ev.feasible and (incumbent is None or ev.objective < incumbent[0].objective):
            incumbent = (ev, stages)

    def finish(status: Status, bound: float | None) -> Result:
        plan = p.plan(incumbent[1]) if incumbent is not None else None
        lb = bound if bound is not None else lower
        if incumbent is not None:
            lb = min(lb, incumbent[0].objective)
        return problem.result("milp", plan, status, lower_bound=lb, started=deadline.started, space="convex",
                              info=info)

    try:
        if warm_start and model.D > 0:
            share = deadline.sub(fraction=HEURISTIC_SHARE)
            value, stages, _ = lattice_dp(p, p.lattice("one-order"), deadline=share)
            info["warm_start"] = value if math.isfinite(value) else None
            if stages is not None:
                keep(stages)
    except DeadlineReached:
        info["warm_start"] = "stopped at its share of the time limit"
    def build(scale: float):
        """The model in units of ``scale`` seconds (its load terms capped at the best plan known,
        :meth:`PlacementMilp.build`), or ``None`` if the deadline passed."""
        info["time_unit"] = scale
        try:
            return model.build(deadline, scale, incumbent[0].objective if incumbent is not None else None)
        except DeadlineReached as stop:
            info["stopped"] = str(stop)
            return None

    unit = model.time_unit(incumbent[0].objective if incumbent is not None else None)
    built = build(unit)
    if built is None:
        return finish(Status.TIME_LIMIT, None)
    lp, T, x, y, z = built
    info["binaries"] = model.n * model.D + sum(len(r) for r in y.values())
    info["constraints"] = lp.numConstraints()
    cuts = 0
    bound = None
    rescaled = False
    while True:
        start = model.start(incumbent[1], x, y, z) if incumbent is not None else None
        if start is not None:
            start[T.name] = max(incumbent[0].objective, lower) / unit
        out = solve_pulp(lp, solver=solver, deadline=deadline, rel_gap=MILP_REL_GAP, abs_gap=MILP_ABS_GAP,
                         threads=int(threads), seed=int(seed), warm_start=start)
        info.update(out.info())
        info["solver_objective"] = out.objective * unit if out.objective is not None else None
        if out.bound is not None:
            b = max(out.bound * unit * (1 - BOUND_SLACK), lower)  # a printed bound may dip below 0
            bound = b if bound is None else max(bound, b)  # every run's model holds every plan that fits
        info["solver_bound"] = bound
        if out.status == "infeasible" or out.status == "unbounded":
            if incumbent is not None:  # a plan that fits is known: the solver's claim is no proof
                info["note"] = f"the solver said {out.status} although a plan that fits is known"
                return finish(Status.FEASIBLE, bound)
            raise InfeasibleError(
                f"milp: no placement of {name} on its devices fits their memory"
                f" (proven infeasible by {solver})"
            )
        if not out.has_solution:
            return finish(Status.TIME_LIMIT, bound)
        stages = model.stages(out.values, x, y)
        ev = evaluate(p.instance, p.plan(stages))
        over = _over_memory(ev)
        if over and cuts < MAX_CUTS and not deadline.expired():
            for i in over:  # memory only grows: no superset of this stage fits this class
                units, c = stages[i]
                for s in range(model.D):
                    lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(
                        [(x[u][s], 1.0) for u in units] + [(y[s][c], 1.0)], -float(len(units))),
                        pulp.LpConstraintLE), f"memory_cut_{cuts}_{s}")
                cuts += 1
            info["memory_cuts"] = cuts
            continue
        if ev.feasible:
            keep(stages)
        if out.proven and not over and incumbent is not None:
            obj = incumbent[0].objective
            lb = min(bound if bound is not None else lower, obj)
            if obj - lb > MILP_TOLERANCE * obj:  # relative: a tiny optimum gets no absolute slack
                if not rescaled and 0 < obj < 100 * unit * (1 - 1e-9):
                    # the optimum is far below the scale the unit was chosen for (a poor warm
                    # start), so the solver's absolute gap is a large share of it: measure the
                    # model against the optimum found and solve again (one time)
                    rescaled = True
                    unit = model.time_unit(obj)
                    built = build(unit)
                    if built is None:
                        return finish(Status.TIME_LIMIT, bound)
                    lp, T, x, y, z = built
                    continue
                info["note"] = "the solver's optimum is not within the tolerance of its bound"
                return finish(Status.FEASIBLE, bound)
            return finish(Status.OPTIMAL, bound)
        return finish(Status.TIME_LIMIT, bound)
