"""The MILP of the joint and group problems at a fixed bottleneck limit T (PuLP).

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
* cuts (overlap): a boundary whose transfer exceeds T is no cut; memory: stage s's bytes,
  read from the cost table (:attr:`pipeopt.cost.CostTable.mem_prefix`: in-flight count and
  weight versions of stage s), at most :func:`pipeopt.cost.rules.memory_limit` of the
  worker's capacity.

Rows are scaled for the solver's tolerances: times are divided by T (a load row reads
"resources needed <= resources"), memory rows by the capacity. Plans are certified under the
cost model afterwards (:func:`pipeopt.problems.resource.search.certify`).
"""

from __future__ import annotations

import math

import pulp

from ...backends.bisection import FEASIBLE, INFEASIBLE, UNKNOWN, Probe
from ...backends.deadline import Deadline, DeadlineReached
from ...backends.pulp import solve_pulp
from ...cost import rules
from .problem import GroupProblem, ResourceProblem
from .search import certify

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
        self.usable = [[math.isfinite(self.fwd[i][j]) and math.isfinite(self.bwd[i][j]) for j in range(len(kinds))]
                       for i in range(n)]
        table = problem.table
        self.mem = [[float(table.mem_prefix[s, i + 1] - table.mem_prefix[s, i]) for i in range(n)] for s in range(S)]
        if self.group:  # one row per device class
            devices = problem.instance.cluster.devices
            self.classes = problem.device_classes
            rep = [devices[cls[0]] for cls in self.classes]
            self.res = [[d.resources.get(k, 0.0) for k in kinds] for d in rep]
            demand = float(table.mem_prefix[:, -1].max()) + 1.0  # more than any stage can need
            self.limit = [min(float(rules.memory_limit(d.memory)), demand) for d in rep]
            self.memory_limited = any(math.isfinite(d.memory) for d in devices)
        else:
            self.res = [[problem.pooled(g).get(k, 0.0) for k in kinds] for g in problem.groups]
            self.limit = [float(rules.memory_limit(problem.capacity(g))) for g in problem.groups]
            self.memory_limited = any(math.isfinite(c) for c in self.limit)

    def __call__(self, T: float, deadline: Deadline | None) -> Probe:
        """Is there a plan with bottleneck <= T seconds? (:class:`~pipeopt.backends.bisection.Probe`)."""
        try:
            model = self.build(T, deadline)
        except DeadlineReached:
            return Probe(UNKNOWN)
        return certify(self.problem, T, lambda: self.solve(model, deadline), lambda *st: self.forbid(model, *st))

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
                        if not self.usable[i][j]:
                            prob += phi + x[i, s] <= 1  # kind j cannot run unit i
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
        return {"prob": prob, "x": x, "g": g}

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
        at most ``group``'s devices of every class: valid when that stage exceeds T, since a
        stage's time only grows with its units and shrinks with its devices. Indicators
        ``z_c`` (``n[c, s] >= k_c + 1`` if set) say which class has more."""
        x, g, prob = model["x"], model["g"], model["prob"]
        lhs = (1 - x[a, s]) + (1 - x[b - 1, s]) if b - 1 != a else 1 - x[a, s]
        if g is not None:
            model["cuts"] = model.get("cuts", 0) + 1
            for c, k in enumerate(self.problem.class_counts(group)):
                if k < len(self.classes[c]):
                    z = pulp.LpVariable(f"z_{model['cuts']}_{c}", cat=pulp.LpBinary)
                    prob += g[c, s] >= (k + 1) * z
                    lhs = lhs + z
        prob += lhs >= 1
