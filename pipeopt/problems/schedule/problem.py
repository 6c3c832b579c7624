"""The schedule problem: split the layers into the p·v chunks a fixed schedule runs.

A schedule (:mod:`pipeopt.schedules`: the per-rank order of F, B, I, W actions of p ranks
holding v stages each over m microbatches, and its placement of stages on ranks) is fixed; the
question is where to cut the layer chain into its ``S = p v`` contiguous chunks (chunk s on rank
``placement[s]``) so that the iteration of m microbatches ends soonest, with each rank's peak
memory (the schedule's memory rule, :meth:`pipeopt.schedules.Schedule.activation_profile`, and
``parameter_copies`` copies of its chunks' parameters) within its device's memory.

:class:`ScheduleProblem` checks the request once, holds the per-unit arrays the exact model
reads (prefix sums of F, B, I, W on one worker, the transfer at each boundary, activation and
parameter bytes: :meth:`prefixes`), and scores a split by **the single evaluation**,
:func:`pipeopt.schedules.run_schedule` (the executor: the longest path through the schedule's
operations). Every method of this folder returns a :class:`pipeopt.Result` whose evaluation
is that execution and whose objective is its iteration time (:meth:`ScheduleProblem.result`).

The workers are identical devices with one resource kind (like the partition problem); rank r
is the cluster's r-th device.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ...cost import CostTable, rules
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...cost.passes import weight_gradient_time
from ...errors import InfeasibleError, InvalidProblemError
from ...instance import Instance
from ...plan import Plan
from ...result import Result
from ...schedules import (FREE, TORCH_SCHEDULES, Execution, Schedule, chunk_plan, free_template, make_schedule,
                          run_schedule, schedule_name)
from ...schedules.free import placement_kind
from ...schedules.w_gaps import rank_gaps
from ..partition.model import stage_window

__all__ = ["SOLVER", "W_PLACEMENTS", "ChunkSpace", "ScheduleProblem", "ScheduleResult", "schedule_space",
           "uniform_starts"]

SOLVER = "highs"
"""The schedule problem's MILP backend by default (``solver="auto"`` in :func:`pipeopt.solve`, the CLI and
the bench; :func:`pipeopt.registry.default_solver`): HiGHS. On the event-time MILP (:mod:`.milp`) it
proves more within a time limit than CBC, measured side by side (one thread each,
``benchmarks/results/schedule_solvers.md``); the other problems keep CBC."""

W_PLACEMENTS = ("schedule", "free")
"""Values of :attr:`ScheduleProblem.w_placement`."""


@dataclass(frozen=True)
class ChunkSpace:
    """The split's shape for :class:`pipeopt.problems.partition.model.CumulativeSplit`: n units
    into S non-empty contiguous chunks (``window(t)``: where chunk t can start)."""

    n: int
    S: int

    def window(self, t: int) -> range:
        """Units where chunk ``t`` can start (:func:`~pipeopt.problems.partition.model.stage_window`)."""
        return stage_window(self.n, self.S, t)


@dataclass(frozen=True)
class ScheduleProblem:
    """Split an instance's layer chain into the chunks of one schedule.

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance` whose cluster has at least p identical devices with one usable
        resource kind (rank r runs on device r); ``settings.overlap`` decides whether transfers
        run beside compute.
    schedule
        A schedule name in any spelling :func:`pipeopt.schedules.schedule_name` accepts
        (torch's names and class names in any case, or a short alias: ``"1f1b"``, ``"zbv"``,
        ...; default ``"1F1B"``) or a :class:`pipeopt.schedules.Schedule` (then its p, m and v
        are read from it; ``stages``, ``microbatches``, ``stages_per_rank`` must be ``None`` or
        agree).
    stages
        p, the pipeline's ranks (one device each; the schedule runs ``p v`` chunks on them).
        Default: every device of the cluster. (The CLI's ``--stages``; :attr:`ranks` reads it.)
    microbatches
        m, 1 .. :data:`pipeopt.units.MAX_MICROBATCHES`. Default: the instance's
        ``settings.microbatches`` (the one rule of every command,
        :data:`pipeopt.units.DEFAULT_MICROBATCHES` when the instance was built without one).
    stages_per_rank
        v (default 1 for GPipe / 1F1B, 2 otherwise; :func:`pipeopt.schedules.make_schedule`).
    w_placement
        ``"schedule"`` (default): every rank runs its actions in the schedule's order.
        ``"free"`` (zero-bubble schedules): the non-W steps keep the schedule's order and each
        W (weight gradient) may run anywhere on its rank after its own I
        (:mod:`pipeopt.schedules.w_gaps`); the split and the W placement are chosen together
        (:mod:`.w_placement`), a deferred W keeping its microbatch's activations until it runs
        (the schedule's memory rule, :mod:`pipeopt.schedules.actions`).
    recompute
        Activation recomputation (:mod:`.recompute`): ``"none"`` (default: every layer keeps
        its activations), ``"full"`` (every layer of every chunk recomputed, full mode) or
        ``"auto"`` (per chunk, the recomputed layers chosen with the split:
        :func:`.recompute.best_recompute`). :func:`.exhaustive.exhaustive` models it, and
        :func:`.milp.solve_milp` with the schedule's W places.
    placement
        Only with ``schedule="free"`` (the free order, :mod:`pipeopt.schedules.free`: the
        split and every rank's order of F, I, W chosen together, :mod:`.free_order`):
        ``"looped"`` (default; with v = 1 one stage per rank) or ``"v"`` (v = 2).

    Raises
    ------
    InvalidProblemError
        Unknown schedule or a p, m, v it refuses (m above
        :data:`~pipeopt.units.MAX_MICROBATCHES`, more than
        :data:`~pipeopt.schedules.MAX_OPERATIONS` operations: checked before the schedule is
        built); fewer than p devices, devices that differ, several usable kinds; more chunks
        than splittable units; an unknown ``w_placement``, or ``"free"`` with a schedule
        without W actions; a Schedule with a p, m or v that differs from the one given;
        ``recompute`` unknown, or other than ``"none"`` with the free order.
    InfeasibleError
        A layer cannot run on the workers' kind.
    """

    instance: Instance
    schedule: Schedule | str = "1F1B"
    stages: int | None = None
    microbatches: int | None = None
    stages_per_rank: int | None = None
    w_placement: str = "schedule"
    placement: str | None = None
    recompute: str = "none"

    def __post_init__(self) -> None:
        from ..partition.recompute import check_recompute

        inst = self.instance
        check_recompute(self.recompute)
        if not isinstance(inst, Instance):
            raise InvalidProblemError(f"the schedule problem needs a pipeopt.Instance, got {type(inst).__name__}")
        refuse_ties(inst, "the schedule problem (its chunk memory rows and its MILPs)")
        refuse_transient(inst, "the schedule problem (its chunk memory rows and its MILPs)")
        sched = self.schedule
        if isinstance(sched, Schedule):
            for what, given, own in (("stages", self.stages, sched.ranks), ("microbatches", self.microbatches,
                                     sched.microbatches), ("stages_per_rank", self.stages_per_rank,
                                                           sched.stages_per_rank)):
                if given is not None and given != own:
                    raise InvalidProblemError(f"{what}={given!r} differs from the schedule {sched.name}'s {own}")
        else:
            name = schedule_name(sched, among=(*TORCH_SCHEDULES, FREE))  # the one vocabulary; choices listed
            p = len(inst.cluster.devices) if self.stages is None else self.stages
            m = inst.settings.microbatches if self.microbatches is None else self.microbatches
            if name == FREE:  # the order is chosen; its shape (p, v, m, placement) is fixed
                sched = free_template(p, m, self.stages_per_rank, self.placement or "looped")
            else:  # m, p and the size checked first
                sched = make_schedule(name, p, m, self.stages_per_rank)
        if self.placement is not None and sched.name != FREE:
            raise InvalidProblemError(
                f"placement={self.placement!r} is for the free order (schedule='free'); {sched.name} has its own"
            )
        object.__setattr__(self, "schedule", sched)
        object.__setattr__(self, "stages", sched.ranks)
        object.__setattr__(self, "microbatches", sched.microbatches)
        object.__setattr__(self, "stages_per_rank", sched.stages_per_rank)
        if self.w_placement not in W_PLACEMENTS:
            raise InvalidProblemError(f"unknown W placement {self.w_placement!r}; choose from {list(W_PLACEMENTS)}")
        if self.w_placement == "free" and sched.name == FREE:
            raise InvalidProblemError("w_placement='free' is part of the free order (schedule='free' places every action)")
        if self.w_placement == "free":
            rank_gaps(sched)  # raises if the schedule has no W to place
        if self.recompute != "none" and sched.name == FREE:
            raise InvalidProblemError(f"recompute={self.recompute!r} is not modelled for the free order"
                                      " (schedule='free'); use a fixed schedule with method 'exhaustive'")
        devices = inst.cluster.devices
        if len(devices) < sched.ranks:
            raise InvalidProblemError(f"{sched.name} on {sched.ranks} ranks needs {sched.ranks} devices;"
                                      f" {inst.name} has {len(devices)}")
        if not inst.cluster.is_homogeneous:
            raise InvalidProblemError("the schedule problem needs identical devices")
        if sched.stages > inst.chain.n:
            raise InvalidProblemError(
                f"{sched.name} on {sched.ranks} ranks x {sched.stages_per_rank} runs {sched.stages} chunks;"
                f" {inst.name} has {inst.chain.n} splittable units"
            )
        chain = inst.chain
        bad = np.flatnonzero(~np.isfinite(chain.fwd[self.kind]) | ~np.isfinite(chain.bwd[self.kind]))
        if bad.size:
            raise InfeasibleError(f"{inst.name}: layer(s) {chain.units[bad[0]]} cannot run on {self.kind!r}")

    @property
    def ranks(self) -> int:
        """p, the schedule's ranks (:attr:`stages`)."""
        return self.schedule.ranks

    @property
    def is_free(self) -> bool:
        """True for the free-order problem (``schedule="free"``: the order is a decision)."""
        return self.schedule.name == FREE

    @property
    def result_space(self) -> str:
        """The search space of this problem's results (:func:`schedule_space`)."""
        if self.is_free:
            return schedule_space(FREE, placement=placement_kind(self.schedule), stages_per_rank=self.stages_per_rank)
        return schedule_space(self.schedule.name, self.w_placement)

    # ---- data ------------------------------------------------------------------------
    @cached_property
    def kind(self) -> str:
        """The one resource kind the workers use."""
        dev = self.instance.cluster.devices[0]
        usable = [k for k, r in dev.resources.items() if r > 0 and k in self.instance.chain.kinds]
        if len(usable) != 1:
            raise InvalidProblemError(f"the schedule problem needs one usable resource kind; {dev.name!r} has {usable}")
        return usable[0]

    @property
    def n(self) -> int:
        """Units of the chain."""
        return self.instance.chain.n

    @property
    def S(self) -> int:
        """Chunks, p·v."""
        return self.schedule.stages

    @property
    def space(self) -> ChunkSpace:
        """The split's shape (:class:`ChunkSpace`)."""
        return ChunkSpace(self.n, self.S)

    @property
    def capacity(self) -> float:
        """Bytes of memory of one rank (its device)."""
        return float(self.instance.cluster.devices[0].memory)

    @property
    def memory(self) -> float:
        """Bytes of memory of one rank (:attr:`capacity`; the name the recompute frontiers of
        :mod:`pipeopt.problems.partition.recompute` read)."""
        return self.capacity

    def fits(self, memory):
        """True where ``memory`` bytes fit one rank (:func:`pipeopt.cost.rules.fits`; arrays broadcast)."""
        return rules.fits(memory, self.capacity)

    @property
    def act_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of activation bytes (:attr:`pipeopt.cost.CostTable.act_prefix`)."""
        return self.table.act_prefix

    @property
    def param_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of parameter bytes (:attr:`pipeopt.cost.CostTable.param_prefix`)."""
        return self.table.param_prefix

    @cached_property
    def recomputation(self):
        """:class:`.recompute.ChunkRecompute` of this problem (``None`` with ``recompute="none"``):
        each chunk's recompute choices as the partition problem's Pareto frontiers."""
        if self.recompute == "none":
            return None
        from .recompute import ChunkRecompute

        return ChunkRecompute(self)

    @cached_property
    def table(self) -> CostTable:
        """The cost table of the chain (:class:`pipeopt.cost.CostTable`)."""
        return CostTable(self.instance, self.S)

    @cached_property
    def prefixes(self) -> dict:
        """``dict[str, ndarray (n+1,)]``: prefix sums over the units of the seconds of F, B, I
        and W on one worker (``"F"``, ``"B"``, ``"I"``, ``"W"``; a chunk of units ``a..b-1``
        lasts ``X[b] - X[a]``), the transfer of one microbatch over the boundary before unit c
        in one direction (``"send"``, :attr:`pipeopt.cost.CostTable.send_time`) and the bytes
        (``"act"``, ``"param"``). W per layer is
        :func:`pipeopt.cost.passes.weight_gradient_time` (``bwd_w``, else B/2), I = B - W."""
        tab, kind = self.table, self.kind
        units = self.instance.cluster.devices[0].resources[kind]
        graph = self.instance.graph
        w = np.array([sum(weight_gradient_time(graph.nodes[v], kind) for v in unit)
                      for unit in self.instance.chain.units]) / units
        W = np.concatenate([[0.0], np.cumsum(w)])
        B = np.asarray(tab.pass_prefix("bwd", kind, units), dtype=float)
        return {"F": np.asarray(tab.pass_prefix("fwd", kind, units), dtype=float), "B": B, "W": W, "I": B - W,
                "send": np.asarray(tab.send_time, dtype=float),
                "act": np.asarray(tab.act_prefix, dtype=float), "param": np.asarray(tab.param_prefix, dtype=float)}

    # ---- splits -------------------------------------------------------------------------
    def check_starts(self, starts) -> list[int]:
        """``starts`` as ints if they start S - 1 non-empty chunks in order, else
        :class:`InvalidProblemError`."""
        starts = [int(c) for c in starts]
        if len(starts) != self.S - 1 or any(a >= b for a, b in zip([0, *starts], [*starts, self.n])):
            raise InvalidProblemError(f"{starts} are not the starts of {self.S} non-empty chunks over {self.n} units")
        return starts

    def chunks(self, starts) -> list[tuple]:
        """The layer tuples of the chunks whose 2nd..S-th start at units ``starts``."""
        return self.instance.chain.stages_from_cuts(self.check_starts(starts))

    def plan(self, starts, recompute=None, order: Schedule | None = None) -> Plan:
        """The :class:`pipeopt.Plan` of the split: chunk s on the device of rank
        ``placement[s]`` (:func:`pipeopt.schedules.chunk_plan`), chunk s recomputing the layers
        ``recompute[s]`` (``dict[layer, mode]`` or ``None``; default: the problem's
        ``recompute`` option for the split run in ``order``, :meth:`chunk_recompute`)."""
        plan = chunk_plan(self.instance, self.schedule, self.chunks(starts))
        if recompute is None:
            recompute = self.chunk_recompute(starts, order)
        if any(recompute):
            plan = dataclasses.replace(plan, stages=tuple(dataclasses.replace(st, recompute=rc or None)
                                                          for st, rc in zip(plan.stages, recompute, strict=True)))
        return plan

    def chunk_recompute(self, starts, order: Schedule | None = None) -> list:
        """Per chunk of the split ``starts`` run in ``order`` (default: the schedule's), the
        layers it recomputes (``dict[layer, mode]`` or ``None``) under the problem's ``recompute``
        option: ``None`` each for ``"none"``, every layer ``"full"`` for ``"full"``, and for
        ``"auto"`` the exact choice of :func:`.recompute.best_recompute` (cached per split and order)."""
        starts = self.check_starts(starts)
        if self.recompute == "none":
            return [None] * self.S
        if self.recompute == "full":
            return [dict.fromkeys(layers, "full") for layers in self.chunks(starts)]
        key = (tuple(starts), id(order))
        cache = self._recompute_cache
        if key not in cache:
            from .recompute import best_recompute

            cache[key] = best_recompute(self, starts, self.schedule if order is None else order)[1]
        return cache[key]

    @cached_property
    def _recompute_cache(self) -> dict:
        return {}

    def execute(self, starts, order: Schedule | None = None, recompute=None) -> Execution:
        """The split run by the schedule (or by ``order``, the same schedule with its W's
        placed elsewhere, :func:`pipeopt.schedules.w_gaps.place_w`), each chunk recomputing
        ``recompute`` (default: :meth:`chunk_recompute`):
        :func:`pipeopt.schedules.run_schedule` (the single evaluation of every method here)."""
        return run_schedule(self.instance, self.schedule if order is None else order,
                            self.plan(starts, recompute, order))

    def value(self, starts, order: Schedule | None = None, recompute=None) -> float:
        """The execution's iteration time if the split fits in memory, else ``inf``."""
        ex = self.execute(starts, order, recompute)
        return ex.time if ex.feasible else math.inf

    def result(self, method: str, starts, status: str, *, lower_bound: float | None = None,
               started: float | None = None, info: dict | None = None,
               order: Schedule | None = None, recompute=None) -> Result:
        """The :class:`pipeopt.Result` of the split ``starts`` (or ``None``) run in ``order``
        (default: the schedule's), chunk s recomputing ``recompute[s]`` (default:
        :meth:`chunk_recompute`).

        The plan is the chunk plan (:meth:`plan`); the evaluation is its
        :class:`~pipeopt.schedules.Execution` (:meth:`execute`, the single evaluation: the
        objective is the execution's iteration time), so :class:`~pipeopt.Result`'s claims
        check holds the method to it (a bound above the executor's time, or ``optimal`` /
        ``feasible`` over memory, raise :class:`~pipeopt.errors.ClaimError`); a heuristic's
        (``"feasible"``) split that breaks memory gets status ``"infeasible"``. The space is
        :attr:`result_space`; ``info`` gains ``schedule`` (canonical name), ``starts`` (units where
        chunks 1..S-1 start), ``ranks``, ``stages_per_rank``, ``microbatches``, ``chunks``,
        ``w_placement``, ``order`` (per rank, the actions run, when they differ from the
        schedule's: free W placement, the zero-bubble greedy), ``objective`` and
        ``assumptions``; a proven infeasible result without a split gains ``shortfall`` (bytes,
        starts, exact: :func:`.shortfall.least_overshoot`) and a ``note`` saying by how much the
        best split misses the limit.
        """
        ex = self.execute(starts, order, recompute) if starts is not None else None
        if ex is not None and not ex.feasible and status == "feasible":
            status = "infeasible"
        info = dict(info or {})
        if status == "infeasible" and starts is None and "shortfall" not in info:  # by how much no split fits
            from .shortfall import least_overshoot, shortfall_note

            short = least_overshoot(self)
            info["shortfall"] = {"bytes": short.bytes, "starts": short.starts, "exact": short.exact}
            note = shortfall_note(self, short)
            if note:
                info.setdefault("note", note)
        run = self.schedule if order is None else order
        info.setdefault("assumptions", list(ex.assumptions) if ex is not None else list(self.instance.assumptions))
        info.update(schedule=self.schedule.name, starts=None if starts is None else [int(c) for c in starts],
                    ranks=self.ranks, stages_per_rank=self.stages_per_rank, microbatches=self.microbatches,
                    chunks=self.S, w_placement=self.w_placement, recompute=self.recompute,
                    objective=f"iteration: {self.microbatches} microbatches under {run.name}"
                              f" ({self.ranks} ranks x {self.stages_per_rank} stages), by the schedule executor")
        plan = self.plan(starts, recompute, order) if starts is not None else None
        if order is not None and (order is not self.schedule or self.is_free):
            info["order"] = [[str(a) for a in order.actions(r)] for r in range(order.ranks)]
            if plan is not None:  # the plan carries the order it runs (export, run, simulate read it)
                plan = dataclasses.replace(plan, schedule=order.to_dict())
        return Result(method, plan, ex, status, lower_bound,
                      time.perf_counter() - started if started is not None else 0.0, self.result_space, info)

    def memory_free_bound(self) -> float:
        """Seconds: a valid lower bound without any solver - the busiest rank can do no better
        than ``m (F + B) / p`` of the whole chain, nor than one unit's m forwards and backwards."""
        P = self.prefixes
        work = np.diff(P["F"]) + np.diff(P["B"])
        m = self.microbatches
        return float(max(m * (P["F"][-1] + P["B"][-1]) / self.ranks, m * work.max(initial=0.0)))


def uniform_starts(n: int, S: int) -> list[int]:
    """Starts of S chunks of equal unit counts (the first ``n mod S`` one unit longer): torch's
    default split, ``pipeline(..., split_spec)`` left to equal layer counts."""
    q, r = divmod(n, S)
    sizes = [q + 1] * r + [q] * (S - r)
    return [int(x) for x in np.cumsum(sizes)[:-1]]


def schedule_space(schedule: str, w_placement: str = "schedule", placement: str | None = None,
                   stages_per_rank: int | None = None) -> str:
    """The search space of a schedule problem's results: ``"schedule:<name>"`` (the splits of
    the chunks of that schedule run in its order), ``"schedule:<name>+free-w"`` (with every
    W placed freely, :mod:`.w_placement`), or for the free order ``"schedule:free"`` (one stage
    per rank), ``"schedule:free-looped<v>"`` (v looped stages per rank) or ``"schedule:free-v"``
    (V placement): every split and every order of that shape, which holds the fixed orders of
    the same shape
    (:func:`pipeopt.problems.spaces.contains`). A gap is taken against a bound of the same
    p, v and m, never another's."""
    if schedule == FREE:
        if placement == "v":
            return "schedule:free-v"
        v = 1 if stages_per_rank is None else int(stages_per_rank)
        return "schedule:free" if v == 1 else f"schedule:free-looped{v}"
    return f"schedule:{schedule}" + ("+free-w" if w_placement == "free" else "")


ScheduleResult = Result
"""The schedule problem's results are :class:`pipeopt.Result` (the former ``ScheduleResult``:
its ``schedule``, ``starts`` and ``order`` are ``info["schedule"]``, ``info["starts"]`` and
``evaluation.schedule``; its ``execution`` is ``evaluation``)."""
