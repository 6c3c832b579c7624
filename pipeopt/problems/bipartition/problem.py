"""The Bi-Partition problem: separate forward and backward cuts on identical workers.

Bi-Partition (Cui et al.) cuts the forward pass and the backward pass of a layer chain at
different positions, so that the stage loads even out when a layer's backward time is not a
fixed multiple of its forward time (the paper's figures assume backward ~ 2x forward). The
paper's body is not public here; pipeopt states the model precisely and scores every plan with
the one cost model, :func:`pipeopt.evaluate` (a :class:`~pipeopt.plan.Stage` with
``bwd_layers``).

The model
---------
The chain has n units (layers; pinned input layers are glued to the first one) and S
identical single-kind workers, one per stage. Two contiguous splits of the units, each into S
non-empty parts, are chosen: forward cut positions ``0 < a_1 < ... < a_{S-1} < n`` and backward
cut positions ``0 < b_1 < ... < b_{S-1} < n`` (``a_0 = b_0 = 0``, ``a_S = b_S = n``; a cut
position is the index of the first unit of the next stage).

* **Compute.** Worker i (0-based) runs the forward pass of units ``[a_i, a_{i+1})`` and the
  backward pass of units ``[b_i, b_{i+1})``, one after the other (sequential execution):
  ``load_i = sum fwd[u] over its forward units + sum bwd[u] over its backward units``
  (seconds per microbatch on one worker).
* **What travels across cut c** (between stages c and c+1), per microbatch:

  - forward: the activations crossing the forward split at ``a_{c+1}`` (a tensor crosses a
    cut once, :func:`rules.crossing_bytes <pipeopt.cost.rules.crossing_bytes>`);
  - backward: the gradients crossing the backward split at ``b_{c+1}`` (a gradient has as
    many bytes as its activation);
  - migrations -- **pipeopt's reading of the Bi-Partition abstract** (the paper's body is
    not public): a unit u whose forward runs on stage ``s_f(u)`` and backward on
    ``s_b(u) != s_f(u)`` crosses every cut c between the two stages -- these are exactly
    the units ``min(a_{c+1}, b_{c+1}) <= u < max(a_{c+1}, b_{c+1})`` -- and ships across it
    (a) its **input activation** (what its backward needs: the bytes on the in-edges of its
    layers, i.e. the tensors of their predecessors; a layer without predecessor, the first
    one, ships its own ``act_bytes``) from ``s_f`` to ``s_b``, every microbatch, and (b) its
    weights ``param_bytes[u]`` from ``s_b`` (where its weight gradient is computed and the
    update applied) back to ``s_f``, once per iteration of M microbatches, i.e.
    ``param_bytes / M`` per microbatch (:func:`rules.migration_bytes
    <pipeopt.cost.rules.migration_bytes>`). Recomputing the forward on ``s_b`` instead is
    not modelled.

  ``x_c`` and ``y_c``: the seconds of the forward and of the backward bytes over the link.
* **Time per microbatch: the steady state of 1F1B** (:func:`rules.steady_period
  <pipeopt.cost.rules.steady_period>`, what :func:`pipeopt.evaluate` reports and the
  simulator measures). Stage s is busy ``w_s = load_s`` per microbatch (without overlap plus
  what it sends: ``x_s`` at the cut after it and ``y_{s-1}`` at the cut before it). With
  overlap (default) T is the least value with

  - ``w_s <= T`` for every stage, ``x_c <= T`` and ``y_c <= T`` for every cut (links are full
    duplex: each direction on its own, :func:`rules.cut_time <pipeopt.cost.rules.cut_time>`);
  - **the window rows**: for every ``i <= l``,
    ``sum_{s=i..l} w_s + sum_{c=i..l-1} (x_c + y_c) <= (l - i + 1) T`` (stages i..l hold
    ``l - i + 1`` microbatches in flight under 1F1B, so one microbatch's round trip through
    them bounds the period). ``sum_{s=i..l} load_s`` telescopes into differences of the
    forward and backward prefix sums at ``a_i, a_{l+1}`` and ``b_i, b_{l+1}``, so every row is
    linear in the cut positions.

  Without overlap the transfers sit in the stages' ops (``x = y = 0`` on the links) and
  ``T = max_s w_s`` (the window rows are then implied).
* **Memory** (1F1B, no replication): stage i keeps ``k_i = S - i`` microbatches in flight and
  stores the activations of the units whose *backward* runs there (a migrated activation is
  shipped when produced and charged to the backward stage with that stage's ``k_i``; the
  transient extra copy of an activation made on an earlier stage that waits one slot before
  the backward stage's own forward of that microbatch is not counted), plus the weights of every unit it touches in either pass (the union of its forward
  and backward units), ``v_i = k_i`` versions with weight stashing, else 1:
  ``mem_i = k_i * act(backward units) + v_i * params(forward units U backward units)``.

Memory consequence: for a given backward split, the activation memory is fixed and ``a = b``
needs the fewest weights, so a Bi-Partition plan fits in memory only if the same-cut plan with
its backward split fits. Separate cuts therefore never rescue a memory-infeasible instance;
they balance compute (also when memory forces an uneven backward split: the forward split
can then still even out the loads).

**How far may the backward split move?** Any distance: the transfer terms above are the
price of a shift and the exact method weighs them. The option ``max_shift`` (units) restricts
``|a_c - b_c| <= max_shift`` for every cut when a user wants the two splits close (e.g. to
bound the weight duplication); ``max_shift=0`` gives back the classic same-cut problem.

With ``a = b`` the model is exactly the partition problem's (no migration, memory as before),
so the best same-cut plan is a feasible Bi-Partition plan: the exact optimum is never worse.

Where the rules live
--------------------
This module states the model; it applies no rule of its own. Loads are differences of
:meth:`CostTable.pass_prefix <pipeopt.cost.CostTable.pass_prefix>` (per pass, per kind, on
one worker); bytes per cut are :attr:`CostTable.boundary_bytes` plus
:func:`rules.migration_bytes <pipeopt.cost.rules.migration_bytes>` of the units between the
two cuts (:meth:`BipartitionProblem.cut_bytes`, the migrated input bytes per unit in
:attr:`BipartitionProblem.migrated`, which mirrors the Bi-Partition block of
:func:`pipeopt.evaluate`); seconds are :func:`rules.cut_time`, :func:`rules.round_trip` and
:func:`rules.transfer_time`; the time per microbatch is :func:`rules.steady_period`; in-flight
counts and weight versions are :attr:`CostTable.in_flight` / :attr:`CostTable.versions`; memory is :func:`rules.stage_memory`
and :func:`rules.fits` (the MILP's rows use :func:`rules.memory_limit`). The exact methods
(:mod:`.milp`) and the baselines (:mod:`.greedy`) read them through this class.

References
----------
Cui et al., *Bi-Partition*, Journal of Cloud Computing (Springer) -- as cited in docs/problems.md;
its abstract: different cut positions for the two passes, up to 1.9x faster than PipeDream.
Narayanan et al., *PipeDream*, SOSP 2019 (1F1B, weight stashing, the profiles).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from ...cost import CostTable, rules
from ...cost.ties import refuse_ties
from ...cost.transient import refuse_transient
from ...errors import InvalidPlanError, InvalidProblemError
from ...graph import edge_bytes
from ...instance import Instance
from ...plan import Plan, Stage
from ...result import Result, Status
from ..partition.problem import PartitionProblem

SPACE = "bipartition"


class Score(NamedTuple):
    """A Bi-Partition plan scored on its cut positions (times in seconds, sizes in bytes).

    Attributes
    ----------
    bottleneck
        Time per microbatch: the steady state of 1F1B, window rows included
        (:func:`rules.steady_period <pipeopt.cost.rules.steady_period>`; what
        :func:`pipeopt.evaluate` reports for the plan).
    stage_time
        ``ndarray (S,)``: busy time w_s of each stage per microbatch (its load, plus its sends
        without overlap).
    comm_time
        ``ndarray (S-1,)``: the busier direction of each cut (:func:`rules.cut_time
        <pipeopt.cost.rules.cut_time>`, full duplex).
    memory
        ``ndarray (S,)``: bytes per stage.
    excess
        Bytes above the capacity, summed over the stages that do not fit
        (:func:`pipeopt.cost.rules.fits`); 0 if the plan fits.
    """

    bottleneck: float
    stage_time: np.ndarray
    comm_time: np.ndarray
    memory: np.ndarray
    excess: float

    @property
    def fits(self) -> bool:
        """Every stage fits in its worker's memory."""
        return self.excess == 0


@dataclass(frozen=True)
class BipartitionProblem:
    """Split a layer chain with separate forward and backward cuts on S identical workers.

    Parameters
    ----------
    instance
        The instance; the same requirements as
        :class:`~pipeopt.problems.partition.problem.PartitionProblem` (identical devices, one
        usable resource kind) and the objective ``"bottleneck"``.
    stages
        S, the number of workers and of stages (each stage non-empty in both passes).
    max_shift
        ``None`` (default, no limit) or the largest allowed ``|a_c - b_c|`` in units.

    Raises
    ------
    InvalidProblemError
        As :class:`~pipeopt.problems.partition.problem.PartitionProblem` (S < 1, more stages
        than units or devices, heterogeneous devices, several kinds), if the objective is not
        ``"bottleneck"`` (the finite-M objectives ``iteration`` / ``gpipe`` are not modelled
        for Bi-Partition), or if ``max_shift`` is not ``None`` or a non-negative integer.

    Notes
    -----
    The model is stated in the module docstring; every rule it applies is read from
    :mod:`pipeopt.cost.rules` and the problem's :class:`~pipeopt.cost.CostTable`
    (:attr:`table`: prefix sums of activation and parameter bytes, boundary bytes, in-flight
    counts, weight versions). Arrays are per unit of the chain, times in seconds on one worker,
    sizes in bytes.
    """

    instance: Instance
    stages: int
    max_shift: int | None = None
    base: PartitionProblem = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        refuse_ties(self.instance, "the bipartition problem")
        refuse_transient(self.instance, "the bipartition problem")
        object.__setattr__(self, "base", PartitionProblem(self.instance, self.stages))
        objective = self.instance.settings.objective
        if objective != "bottleneck":
            raise InvalidProblemError(
                f"the Bi-Partition methods minimise the steady-state time per microbatch (objective "
                f"'bottleneck'); objective {objective!r} is not supported for Bi-Partition")
        k = self.max_shift
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0):
            raise InvalidProblemError(f"max_shift must be None or a non-negative integer (units), got {k!r}")

    # ---- data every method reads -------------------------------------------------------
    @property
    def n(self) -> int:
        """Number of units of the chain."""
        return self.base.n

    @property
    def space(self) -> str:
        """``"bipartition"``."""
        return SPACE

    @property
    def table(self) -> CostTable:
        """The cost model tabulated over the chain for S stages (shared with :attr:`base`)."""
        return self.base.table

    @cached_property
    def fwd_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of the forward seconds of the units on one worker."""
        kind = self.base.kind
        return self.table.pass_prefix("fwd", kind, self.instance.cluster.devices[0].resources[kind])

    @cached_property
    def bwd_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of the backward seconds of the units on one worker."""
        kind = self.base.kind
        return self.table.pass_prefix("bwd", kind, self.instance.cluster.devices[0].resources[kind])

    @cached_property
    def fwd(self) -> np.ndarray:
        """``ndarray (n,)``: forward seconds of each unit on one worker."""
        return np.diff(self.fwd_prefix)

    @cached_property
    def bwd(self) -> np.ndarray:
        """``ndarray (n,)``: backward seconds of each unit on one worker."""
        return np.diff(self.bwd_prefix)

    @cached_property
    def act(self) -> np.ndarray:
        """``ndarray (n,)``: stashed activation bytes per microbatch of each unit."""
        return np.asarray(self.instance.chain.act, dtype=float)

    @cached_property
    def migrated(self) -> np.ndarray:
        """``ndarray (n,)``: bytes per microbatch each unit ships from its forward stage to its
        backward stage when the two differ: the input activation of its layers (the bytes on
        their in-edges; a layer without predecessor: its own ``act_bytes``). pipeopt's reading of
        the Bi-Partition abstract; mirrors the Bi-Partition block of :func:`pipeopt.evaluate`."""
        graph, chain = self.instance.graph, self.instance.chain
        out = np.zeros(self.n)
        for i, unit in enumerate(chain.units):
            for layer in unit:
                preds = list(graph.predecessors(layer))
                out[i] += (sum(edge_bytes(graph, u, layer) for u in preds) if preds
                           else graph.nodes[layer]["act_bytes"])
        return out

    @cached_property
    def migrated_prefix(self) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of :attr:`migrated`."""
        return np.concatenate([[0.0], np.cumsum(self.migrated)])

    @cached_property
    def param(self) -> np.ndarray:
        """``ndarray (n,)``: parameter bytes of each unit."""
        return np.asarray(self.instance.chain.param, dtype=float)

    @property
    def microbatches(self) -> int:
        """M, microbatches per iteration (weights of a migrated unit travel once per M)."""
        return self.instance.settings.microbatches

    @property
    def bandwidth(self) -> float:
        """Bytes/s between consecutive workers."""
        return self.table.bandwidth

    @property
    def memory(self) -> float:
        """Bytes of memory per worker (``inf`` = no limit)."""
        return self.base.memory

    @property
    def overlap(self) -> bool:
        """Communication overlaps compute (see :class:`pipeopt.Settings`)."""
        return self.instance.settings.overlap

    # ---- the cost of a cut and of a stage ------------------------------------------------
    def cut_bytes(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """Bytes per microbatch crossing a cut whose forward split is at unit ``x`` and whose
        backward split is at unit ``y`` (arrays broadcast).

        Forward: the activations crossing the forward split, plus the weights of the units
        ``y <= u < x`` (backward before the cut, forward after it: :func:`rules.migration_bytes`);
        backward: the gradients crossing the backward split, plus the input activations
        (:attr:`migrated`) of the units ``x <= u < y``. The other pair of migration terms is zero.

        Returns
        -------
        (forward, backward)
            ``ndarray``\\ s shaped like ``x`` and ``y`` broadcast.
        """
        x, y = np.asarray(x), np.asarray(y)
        t = self.table
        mp = self.migrated_prefix
        act, par = rules.migration_bytes(mp[y] - mp[x],
                                         t.param_prefix[y] - t.param_prefix[x], self.microbatches)
        # act, par > 0: units x..y-1 run their forward after the cut and their backward before it
        bb = t.boundary_bytes
        forward = bb[x] + np.maximum(-act, 0.0) + np.maximum(par, 0.0)
        backward = bb[y] + np.maximum(act, 0.0) + np.maximum(-par, 0.0)
        return forward, backward

    def stage_memory(self, fwd_bounds, bwd_bounds) -> np.ndarray:
        """Bytes each stage needs (:func:`rules.stage_memory`): its in-flight count times the
        activations of its backward units, plus its weight versions times the parameters of the
        union of its forward and backward units.

        Parameters
        ----------
        fwd_bounds, bwd_bounds
            ``ndarray (S+1,)``: ``[0, *cuts, n]`` of each pass.

        Returns
        -------
        ndarray (S,)
        """
        A, B = np.asarray(fwd_bounds), np.asarray(bwd_bounds)
        t = self.table
        P = t.param_prefix
        lo = np.maximum(A[:-1], B[:-1])
        both = np.maximum(np.minimum(A[1:], B[1:]) - lo, 0)  # units in both ranges: lo .. lo+both-1
        params = np.diff(P[A]) + np.diff(P[B]) - (P[lo + both] - P[lo])
        return rules.stage_memory(np.diff(t.act_prefix[B]), params, t.in_flight, t.versions)

    # ---- cut positions -----------------------------------------------------------------
    def check_cuts(self, fwd_cuts, bwd_cuts) -> tuple[list[int], list[int]]:
        """Validate cut positions and return them as lists of ints.

        Parameters
        ----------
        fwd_cuts, bwd_cuts
            ``S - 1`` unit indices each: where stages 1..S-1 start in the forward / backward pass.

        Raises
        ------
        InvalidPlanError
            Wrong length, not strictly increasing inside ``[1, n-1]`` (an empty stage), or a
            shift larger than ``max_shift``.
        """
        out = []
        for name, cuts in (("forward", fwd_cuts), ("backward", bwd_cuts)):
            cuts = [int(c) for c in cuts]
            if len(cuts) != self.stages - 1:
                raise InvalidPlanError(
                    f"{self.stages} stages need {self.stages - 1} {name} cuts, got {len(cuts)}")
            bounds = [0, *cuts, self.n]
            for i in range(self.stages):
                if bounds[i + 1] <= bounds[i]:
                    raise InvalidPlanError(
                        f"{name} cuts {cuts} leave stage {i} empty "
                        f"(cuts must increase strictly within 1..{self.n - 1})"
                    )
            out.append(cuts)
        if self.max_shift is not None:
            for c, (a, b) in enumerate(zip(*out, strict=True)):
                if abs(a - b) > self.max_shift:
                    raise InvalidPlanError(
                        f"cut {c}: forward at unit {a}, backward at unit {b}, "
                        f"shift above max_shift={self.max_shift}")
        return out[0], out[1]

    def score(self, fwd_cuts, bwd_cuts) -> Score:
        """The cost model on cut positions (the module docstring), without building a plan.

        Equal to :func:`pipeopt.evaluate` on :meth:`plan` ``(fwd_cuts, bwd_cuts)`` up to float
        rounding (prefix differences instead of sums; a test checks a relative 1e-12). Reads
        the loads from :attr:`fwd_prefix` / :attr:`bwd_prefix`, the cut bytes from
        :meth:`cut_bytes`, transfers from :func:`rules.transfer_time`, the period from
        :func:`rules.steady_period` (window rows included), memory from :meth:`stage_memory`
        and :func:`rules.fits`.

        Parameters
        ----------
        fwd_cuts, bwd_cuts
            ``S - 1`` unit indices each (not validated here; see :meth:`check_cuts`).

        Returns
        -------
        Score
        """
        S, bw = self.stages, self.bandwidth
        A = np.array([0, *fwd_cuts, self.n], dtype=int)
        B = np.array([0, *bwd_cuts, self.n], dtype=int)
        stage = np.diff(self.fwd_prefix[A]) + np.diff(self.bwd_prefix[B])
        forward, backward = self.cut_bytes(A[1:-1], B[1:-1])
        x, y = rules.transfer_time(forward, bw), rules.transfer_time(backward, bw)
        comm = rules.cut_time(forward, backward, bw)
        if self.overlap:
            on_links = (x, y)
        else:  # each stage pays what it sends; nothing is left on the links
            stage[:-1] += x
            stage[1:] += y
            on_links = (np.zeros(S - 1), np.zeros(S - 1))
        ones = np.ones(S, dtype=int)
        bott = rules.steady_period(stage, np.zeros(S), ones, self.table.in_flight, np.zeros(S, dtype=bool),
                                   *on_links, ones[:-1])
        mem = self.stage_memory(A, B)
        cap = self.memory
        excess = float(np.where(rules.fits(mem, cap), 0.0, mem - cap).sum())
        return Score(float(bott), stage, comm, mem, excess)

    def plan(self, fwd_cuts, bwd_cuts) -> Plan:
        """The plan with forward cuts ``fwd_cuts`` and backward cuts ``bwd_cuts`` (unit indices).

        Stage i runs on device i and has ``layers`` = its forward layers and ``bwd_layers`` =
        its backward layers.

        Raises
        ------
        InvalidPlanError
            See :meth:`check_cuts`.
        """
        a, b = self.check_cuts(fwd_cuts, bwd_cuts)
        ch = self.instance.chain
        fsets, bsets = ch.stages_from_cuts(a), ch.stages_from_cuts(b)
        names = [d.name for d in self.instance.cluster.devices]
        return Plan(tuple(Stage(layers=f, devices=(names[i],), bwd_layers=g)
                          for i, (f, g) in enumerate(zip(fsets, bsets, strict=True))))

    def cuts_of(self, plan: Plan) -> tuple[list[int], list[int]]:
        """Inverse of :meth:`plan`: (forward cuts, backward cuts) of a contiguous plan.

        Raises
        ------
        InvalidPlanError
            If the plan has the wrong number of stages or a stage is not a contiguous run of units,
            or a stage recomputes a layer (the Bi-Partition problem scores cuts without
            recomputation: :func:`pipeopt.cost.table.refuse_recompute`).
        """
        from ...cost.table import refuse_recompute

        refuse_recompute(plan, "BipartitionProblem.cuts_of (Bi-Partition has no recomputation)")
        if plan.num_stages != self.stages:
            raise InvalidPlanError(f"plan has {plan.num_stages} stages, the problem {self.stages}")
        unit_of = self.instance.chain.unit_of
        cuts = []
        for name, get in (("forward", lambda s: s.layers), ("backward", lambda s: s.backward_layers)):
            starts = []
            for i, st in enumerate(plan.stages):
                units = sorted({unit_of[x] for x in get(st)})
                if units != list(range(units[0], units[-1] + 1)):
                    raise InvalidPlanError(f"stage {i} is not contiguous in the {name} pass")
                starts.append(units[0])
            cuts.append(starts[1:])
        return cuts[0], cuts[1]

    # ---- bounds and results ------------------------------------------------------------
    def simple_lower_bound(self) -> float:
        """``max(total work / S, largest forward, largest backward unit)``, seconds.

        Valid for every plan: the stage loads add up to the total work, and each unit's forward
        and backward run whole on some stage. Memory and transfers are ignored.
        """
        total = self.fwd_prefix[-1] + self.bwd_prefix[-1]
        return float(max(total / self.stages, self.fwd.max(initial=0.0), self.bwd.max(initial=0.0)))

    def result(self, method: str, plan: Plan | None, status: Status, **kw) -> Result:
        """Wrap a plan into a :class:`~pipeopt.result.Result` scored by :func:`pipeopt.evaluate`.

        :meth:`pipeopt.problems.partition.problem.PartitionProblem.result` (keywords
        ``lower_bound``, ``started``: the ``time.perf_counter()`` origin of the runtime, the
        method's :attr:`Deadline.started <pipeopt.backends.deadline.Deadline.started>`,
        ``info``) with the space ``"bipartition"``; a heuristic whose plan breaks memory becomes
        ``INFEASIBLE``.
        """
        return self.base.result(method, plan, status, space=SPACE, **kw)

    def same_cut_problem(self) -> PartitionProblem:
        """The classic partition problem (``a = b``) on the same instance."""
        return self.base
