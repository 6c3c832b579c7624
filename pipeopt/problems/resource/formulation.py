"""The MILP of the joint and group problems at a fixed limit T on the period (PuLP).

Variables (S stages, n units, K resource kinds, D devices):

* ``x[i, s]`` binary: unit i runs in stage s (only the stages i can be in while leaving one
  unit per stage). The stage index ``sigma(i) = sum_s s x[i, s]`` rises by 0 or 1 from one
  unit to the next, from 0 to S - 1: stages are contiguous and none is empty.
* ``phi_f[s, k], phi_b[s, k]`` in [0, 1]: the fraction of stage s's forward (backward) work
  done by kind k, adding up to 1; a kind is usable only if it runs every unit of the stage
  and the worker has it. With loads ``L_{s,k} = phi_f F_{s,k} + phi_b B_{s,k}`` the stage's
  split time is <= T iff ``L_{s,k} <= T R_{s,k}`` for every kind (then
  ``beta_k = phi_f F_k / (T R_k)`` is a valid forward share, and conversely any split with
  stage time <= T gives such fractions): an exact reformulation of the split execution rule
  :func:`pipeopt.cost.stage_compute`.
* ``w = phi x`` (a share times a binary): ``w >= phi + x - 1``, ``w >= 0`` is exact here (the
  load rows only bound w from above). Then ``F_{s,k} phi_f[s,k] = sum_i fwd[i,k] w_f[i,s,k]``.
* group only: ``n[c, s]`` integer, the number of devices of class c (identical devices,
  :attr:`~pipeopt.problems.resource.GroupProblem.device_classes`) in worker s; every device
  in one worker, every worker non-empty; ``R_{s,k} = sum_c r[c,k] n[c,s]``. Counting
  identical devices removes their symmetry; workers are not interchangeable (worker s runs
  stage s), so no other symmetry remains.
* cuts (overlap): a boundary whose transfer exceeds T is no cut; memory: stage s's bytes
  with split execution's ``2 (S - s)`` microbatches in flight
  (:meth:`~pipeopt.problems.resource.ResourceProblem.stage_memory`), at most
  :func:`pipeopt.cost.rules.memory_limit` of the worker's capacity.
* window rows (:func:`pipeopt.cost.rules.steady_period`; split execution: ``D_i = 2 (S - i)``,
  ``U = 0``, so the rows ending at the last stage dominate), added on the first plan that
  breaks one (:meth:`MilpProbe._windows`; most limits never need them): ``t[s] >= 0`` is stage
  s's busy time ``f_s + b_s`` in units of T, ``e[c, s] >= x[c, s] - x[c-1, s]`` marks stage s
  starting at unit c (exact: the rows only bound e from above), and for every i
  ``sum_{s>=i} t[s] + sum_{s>i} sum_c trip_c / T e[c, s] <= 2 (S - i)``. The busy time is not
  linear in the stage's units or worker (:func:`~.split.least_busy`; it is superadditive in
  the units and convex in the worker's resources), so ``t`` is bounded below by cuts (outer
  approximation): the sum of its units' own busy times (on the strongest conceivable worker
  for grouping), and where a plan breaks a row (:meth:`MilpProbe.window`)
  ``t[s] >= (const - sum_c coef_c n[c, s]) / T`` whenever stage s holds units ``a`` and
  ``b - 1`` (:func:`~.split.busy_cut`, a supporting plane valid for every worker and, as the
  busy time grows with the units, every stage containing ``a..b-1``; fixed workers: the
  exact busy time), per-unit planes of the same kind, and a no-good for the failing stages.
  The model is a relaxation of the true constraints throughout: an infeasible answer is a
  proof.

Rows are scaled for the solver's tolerances: times are divided by T (a load row reads
"resources needed <= resources"), memory rows by the capacity. Plans are checked exactly
afterwards (:func:`pipeopt.problems.resource.search.certify`).
"""

from __future__ import annotations

import math

from ...lazy import lazy_module
from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.pulp import solve_pulp
from ...cost import rules
from .bounds import strongest_worker
from .problem import GroupProblem, ResourceProblem
from .search import certify
from .split import busy_cut, least_busy

pulp = lazy_module("pulp")

ISOLATE_VARIABLES = 2000
"""HiGHS runs in a child process that is ended at the deadline (the PuLP door's guarantee)
for models with more variables than this; smaller models run in this process (the child's
start-up, about 0.3 s, would dominate every bisection step) and stop at HiGHS's own limit."""


class MilpProbe:
    """``probe(T, deadline)`` for :func:`pipeopt.backends.bisection.bisect`: the MILP at fixed T.

    Parameters
    ----------
    problem
        A joint or group problem.
    solver
        ``"cbc"`` or ``"highs"`` (:func:`pipeopt.backends.pulp.solve_pulp`).
    seed
        Solver seed.
    """

    def __init__(self, problem: ResourceProblem, *, solver: str = "cbc", seed: int = 0):
        self.problem, self.solver, self.seed = problem, solver, seed
        self.group = isinstance(problem, GroupProblem)
        n, S, kinds = problem.n, problem.num_stages, problem.kinds
        self.fwd = [[float(problem.fwd[k][i]) for k in kinds] for i in range(n)]
        self.bwd = [[float(problem.bwd[k][i]) for k in kinds] for i in range(n)]
        # a kind serves a pass of a stage only if it runs that pass of every unit of the stage
        self.runs = {"f": [[math.isfinite(v) for v in row] for row in self.fwd],
                     "b": [[math.isfinite(v) for v in row] for row in self.bwd]}
        self.mem = [[problem.stage_memory(i, i + 1, s) for i in range(n)] for s in range(S)]  # split: 2 (S - s)
        self.strong = strongest_worker(problem)[0]
        self.pool: set = set()  # (s, a, b, group) of stages that broke a window row at some limit
        if self.group:  # one row per device class
            devices = problem.instance.cluster.devices
            self.classes = problem.device_classes
            rep = [devices[cls[0]] for cls in self.classes]
            self.res = [[d.resources.get(k, 0.0) for k in kinds] for d in rep]
            demand = max(problem.stage_memory(0, n, s) for s in range(S)) + 1.0  # more than any stage can need
            self.limit = [min(float(rules.memory_limit(d.memory)), demand) for d in rep]
            self.memory_limited = any(math.isfinite(d.memory) for d in devices)
        else:
            self.res = [[problem.pooled(g).get(k, 0.0) for k in kinds] for g in problem.groups]
            self.limit = [float(rules.memory_limit(problem.capacity(g))) for g in problem.groups]
            self.memory_limited = any(math.isfinite(c) for c in self.limit)

    def __call__(self, T: float, deadline: Deadline | None) -> Probe:
        """Is there a plan with period <= T seconds? (:class:`~pipeopt.backends.bisection.Probe`)."""
        try:
            model = self.build(T, deadline)
        except DeadlineReached:
            return Probe(UNKNOWN)
        return certify(self.problem, T, lambda: self.solve(model, deadline), lambda *st: self.forbid(model, *st),
                       lambda *w: self.window(model, *w))

    # ---- the model at T --------------------------------------------------------------------------
    def build(self, T: float, deadline: Deadline | None = None) -> dict:
        """The PuLP model at limit T: ``{"prob", "x", "g"}`` (``g[c, s]``: devices of class c in worker
        s; ``None`` for fixed workers).

        Raises
        ------
        DeadlineReached
            If ``deadline`` passes while the model is written.
        """
        p = self.problem
        n, S, K = p.n, p.num_stages, len(p.kinds)
        prob = pulp.LpProblem("resource_at_T", pulp.LpMinimize)
        # a feasibility model; PuLP's writeMPS would put a variable of its own into an empty objective
        prob.setObjective(pulp.LpVariable("zero", 0, 0))
        x = {(i, s): pulp.LpVariable(f"x_{i}_{s}", cat=pulp.LpBinary)
             for i in range(n) for s in range(max(0, S - n + i), min(i, S - 1) + 1)}
        stages_of = {i: [s for s in range(S) if (i, s) in x] for i in range(n)}
        units_of = {s: [i for i in range(n) if (i, s) in x] for s in range(S)}
        for i in range(n):
            prob += pulp.lpSum(x[i, s] for s in stages_of[i]) == 1
        sigma = {i: pulp.lpSum(s * x[i, s] for s in stages_of[i] if s) for i in range(n)}
        if S > 1:
            for i in range(n - 1):
                step = sigma[i + 1] - sigma[i]
                prob += step >= 0
                prob += step <= (0 if p.cut_time[i + 1] > T else 1)  # a cut's transfer must pass T
        g = None
        if self.group:
            C = len(self.classes)
            g = {(c, s): pulp.LpVariable(f"n_{c}_{s}", 0, len(self.classes[c]), cat=pulp.LpInteger)
                 for c in range(C) for s in range(S)}
            for c in range(C):
                prob += pulp.lpSum(g[c, s] for s in range(S)) == len(self.classes[c])
            for s in range(S):
                prob += pulp.lpSum(g[c, s] for c in range(C)) >= 1
        inv = 1.0 / T if T > 0 else 1.0  # load rows in units of T (T = 0: loads must vanish)
        on = 1.0 if T > 0 else 0.0
        for s in range(S):
            if deadline is not None:
                deadline.check(f"building the MILP (stage {s})")
            shares: dict = {"f": [], "b": []}
            for j in range(K):
                if self.group:
                    have = [c for c in range(len(self.res)) if self.res[c][j] > 0]
                    cap = pulp.lpSum(self.res[c][j] * on * g[c, s] for c in have)
                else:
                    have = None
                    cap = self.res[s][j] * on
                terms = []
                for name, costs in (("f", self.fwd), ("b", self.bwd)):
                    phi = pulp.LpVariable(f"phi{name}_{s}_{j}", 0, 1 if (self.group or self.res[s][j] > 0) else 0)
                    shares[name].append(phi)
                    if have is not None:  # only a kind the worker has
                        prob += phi <= pulp.lpSum(g[c, s] for c in have)
                    for i in units_of[s]:
                        if not self.runs[name][i][j]:
                            prob += phi + x[i, s] <= 1  # kind j cannot run this pass of unit i
                        elif costs[i][j] > 0:
                            w = pulp.LpVariable(f"w{name}_{i}_{s}_{j}", 0)
                            prob += w >= phi + x[i, s] - 1
                            terms.append(costs[i][j] * inv * w)
                if terms:
                    prob += pulp.lpSum(terms) <= cap
            for name in ("f", "b"):
                prob += pulp.lpSum(shares[name]) >= 1
        if self.memory_limited:
            for s in range(S):
                need = [(self.mem[s][i], x[i, s]) for i in units_of[s] if self.mem[s][i] > 0]
                if not need:
                    continue
                if self.group:
                    scale = 1.0 / max(self.limit)
                    prob += (pulp.lpSum(c * scale * v for c, v in need)
                             <= pulp.lpSum(self.limit[c] * scale * g[c, s] for c in range(len(self.res))))
                elif math.isfinite(self.limit[s]):
                    scale = 1.0 / self.limit[s] if self.limit[s] > 0 else 1.0
                    prob += pulp.lpSum(c * scale * v for c, v in need) <= self.limit[s] * scale
        model = {"prob": prob, "x": x, "g": g, "t": None, "T": T, "cuts": 0, "units_of": units_of}
        for stage in sorted(self.pool):  # the stages that broke window rows at other limits
            self._cut(model, *stage)
        return model

    def _windows(self, model: dict) -> list:
        """Add the window rows over busy-time variables ``t[s]`` (units of T) to the model - on the
        first plan that breaks one: most limits never need them - and return ``t``.

        Besides the cuts :meth:`window` adds, ``t[s] >= sum_i w_i x[i, s] / T`` from the start,
        ``w_i`` unit i's least busy time at T on stage s's worker (joint) or on the strongest
        conceivable worker (group): the least busy time is superadditive over the units (for
        fixed shares each pass's time ``1 / sum_k beta_k R_k / F_k`` is concave and
        homogeneous in the loads, hence superadditive, and the caps only tighten for the union)."""
        p, prob, x, units_of, T = self.problem, model["prob"], model["x"], model["units_of"], model["T"]
        S = p.num_stages
        t = [pulp.LpVariable(f"t_{s}", 0) for s in range(S)]
        for s in range(S):
            terms = []
            for i in units_of[s]:
                F, B = p.load(i, i + 1)
                if self.group:
                    _, f, b = least_busy(self.strong, F, B, T)
                else:
                    _, f, b = p.busy(i, i + 1, p.groups[s], s, T)
                if math.isfinite(f + b) and f + b > 0:
                    terms.append((f + b) / T * x[i, s])
            if terms:
                prob += t[s] >= pulp.lpSum(terms)
        trip = p.round_trip
        enter = {s: [] for s in range(S)}  # (round trip / T, e[c, s]) of stage s's start
        for s in range(1, S):
            for c in units_of[s]:
                if trip[c] <= 0:
                    continue
                e = pulp.LpVariable(f"e_{c}_{s}", 0)
                prob += e >= x[c, s] - (x[c - 1, s] if (c - 1, s) in x else 0)
                enter[s].append((float(trip[c]) / T, e))
        D = rules.windows(S, split=True)  # D_i = 2 (S - i): split execution, one replica
        for i in range(S - 1):  # row i = S - 1 (t <= 2) holds for every stage that passes T
            prob += (pulp.lpSum(t[i:]) + pulp.lpSum(v * e for s in range(i + 1, S) for v, e in enter[s])
                     <= D[i])
        model["t"] = t
        return t

    def window(self, model: dict, row: tuple, starts: list, groups: list, check) -> None:
        """A plan breaks window row ``row = (i, l)``: for each of its stages i..l add the cuts of
        :meth:`_cut`, and a no-good: not all of stages i..l containing their units on at most
        their devices (their busy times only grow then, and the row's round trips stay the
        same). The stages are remembered: the probes at other limits start with their cuts
        (valid at every T, recomputed there)."""
        p, prob, x, g = self.problem, model["prob"], model["x"], model["g"]
        bounds = [0, *starts, p.n]
        i, l = row
        nogood = []
        for s in range(i, l + 1):
            a, b = bounds[s], bounds[s + 1]
            self._cut(model, s, a, b, tuple(groups[s]))
            self.pool.add((s, a, b, tuple(groups[s])))
            nogood += [(1 - x[a, s]) + (1 - x[b - 1, s]) if b - 1 != a else 1 - x[a, s]]
            if g is not None:
                nogood += self._more(model, s, groups[s])
        prob += pulp.lpSum(nogood) >= 1

    def _cut(self, model: dict, s: int, a: int, b: int, group: tuple) -> None:
        """``t[s] >= (const - sum_c coef_c n[c, s]) / T`` when stage s holds units ``a..b-1``
        (:func:`~.split.busy_cut` at worker ``group``: tight there, valid for every worker and,
        the busy time growing with the units, every stage containing ``a..b-1``; fixed workers:
        the exact busy time), and grouping's per-unit cuts (:meth:`_unit_cuts`)."""
        p, prob, x, g, T = self.problem, model["prob"], model["x"], model["g"], model["T"]
        if T <= 0 or (a, s) not in x or (b - 1, s) not in x:
            return
        if model["t"] is None:
            self._windows(model)
        held = (1 - x[a, s]) + (1 - x[b - 1, s]) if b - 1 != a else 1 - x[a, s]
        F, B = p.load(a, b)
        if g is None:
            _, f, bb = p.busy(a, b, group, s, T)
            const, rhs = f + bb, 0
        else:
            coef, const = busy_cut(p.pooled(group), F, B, T)
            per = [min(const, sum(self.res[c][j] * coef.get(k, 0.0) for j, k in enumerate(p.kinds)
                                  if self.res[c][j] > 0)) for c in range(len(self.classes))]
            rhs = pulp.lpSum(per[c] / T * g[c, s] for c in range(len(per)) if per[c] > 0)
            if b - a > 1:
                self._unit_cuts(model, s, a, b, group)
        if 0 < const < math.inf:
            prob += model["t"][s] >= const / T - rhs - const / T * held

    def _unit_cuts(self, model: dict, s: int, a: int, b: int, group: tuple) -> None:
        """Grouping: per-unit cuts ``u[i, s] >= (const_i - sum_c coef_ic n[c, s]) / T`` when unit i
        is in stage s (:func:`~.split.busy_cut` of unit i alone at this worker), with
        ``t[s] >= sum_i u[i, s]`` (superadditivity, :meth:`_windows`): they hold for every stage
        containing the unit on every worker."""
        p, prob, x, g, T = self.problem, model["prob"], model["x"], model["g"], model["T"]
        u = model.setdefault("u", {})
        res = p.pooled(group)
        for i in range(a, b):
            F, B = p.load(i, i + 1)
            coef, const = busy_cut(res, F, B, T)
            if const <= 0:
                continue
            if (i, s) not in u:
                u[i, s] = pulp.LpVariable(f"u_{i}_{s}", 0)
                model.setdefault("u_rows", {}).setdefault(s, []).append(u[i, s])
            per = [min(const, sum(self.res[c][j] * coef.get(k, 0.0) for j, k in enumerate(p.kinds)
                                  if self.res[c][j] > 0)) for c in range(len(self.classes))]
            prob += (u[i, s] >= const / T - pulp.lpSum(per[c] / T * g[c, s] for c in range(len(per)) if per[c] > 0)
                     - const / T * (1 - x[i, s]))
        rows = model.setdefault("u_sum", {})
        if len(model["u_rows"].get(s, [])) > rows.get(s, 0):  # t[s] >= the sum over every unit with a cut
            prob += model["t"][s] >= pulp.lpSum(model["u_rows"][s])
            rows[s] = len(model["u_rows"][s])

    def _more(self, model: dict, s: int, group: tuple) -> list:
        """Indicators ``z_c``: worker s has more devices of class c than ``group`` (``n[c, s] >=
        k_c + 1`` if set)."""
        g, prob = model["g"], model["prob"]
        model["cuts"] += 1
        out = []
        for c, k in enumerate(self.problem.class_counts(group)):
            if k < len(self.classes[c]):
                z = pulp.LpVariable(f"z_{model['cuts']}_{c}", cat=pulp.LpBinary)
                prob += g[c, s] >= (k + 1) * z
                out.append(z)
        return out

    def solve(self, model: dict, deadline: Deadline | None) -> Probe:
        """One solve through :func:`pipeopt.backends.pulp.solve_pulp`: a plan ``(starts, groups)``
        if the solver found one, infeasible if it proved there is none, else unknown."""
        prob = model["prob"]
        isolate = self.solver != "highs" or len(prob.variables()) > ISOLATE_VARIABLES
        out = solve_pulp(prob, solver=self.solver, deadline=deadline, threads=1, seed=self.seed, isolate=isolate,
                         assign=False)
        if out.status == "infeasible":
            return Probe(INFEASIBLE)
        if not out.has_solution:
            return Probe(UNKNOWN)
        p = self.problem
        x, g = model["x"], model["g"]
        stage = [max((s for (i2, s) in x if i2 == i), key=lambda s: out.value(x[i, s]) or 0.0) for i in range(p.n)]
        starts = [i for i in range(1, p.n) if stage[i] != stage[i - 1]]
        if g is None:
            groups = [tuple(grp) for grp in p.groups]
        else:
            counts = [[round(out.value(g[c, s]) or 0.0) for s in range(p.num_stages)] for c in range(len(self.classes))]
            if any(sum(row) != len(cls) for row, cls in zip(counts, self.classes, strict=True)):
                return Probe(UNKNOWN)
            groups = p.groups_from_counts(counts)
        if len(starts) != p.num_stages - 1 or not all(groups):
            return Probe(UNKNOWN)  # not a plan: the solver's values are not integral enough
        return Probe(FEASIBLE, (starts, groups))

    def forbid(self, model: dict, s: int, a: int, b: int, group: tuple) -> None:
        """Cut off stage s holding units ``a`` and ``b - 1`` (so all of ``a..b-1``) on a worker with
        at most ``group``'s devices of every class: valid when that stage cannot pass T, since a
        stage's time only grows with its units and shrinks with its devices."""
        x, g, prob = model["x"], model["g"], model["prob"]
        lhs = [(1 - x[a, s]) + (1 - x[b - 1, s]) if b - 1 != a else 1 - x[a, s]]
        if g is not None:
            lhs += self._more(model, s, group)
        prob += pulp.lpSum(lhs) >= 1
