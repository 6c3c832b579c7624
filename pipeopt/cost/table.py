"""The cost model tabulated over the chain, once per (instance, stage count).

Every exact method (DP, MILP, CP-SAT) and every baseline reads the costs of a contiguous
stage from a :class:`CostTable`: a stage of units ``a .. b-1`` costs differences of prefix
arrays taken at ``a`` and ``b``. The table applies the rules of :mod:`pipeopt.cost.rules`, the
same ones :func:`pipeopt.evaluate` applies to a plan, so a method's claimed value and the
evaluation of its plan agree (the tests check it).

The table has no activation recomputation: every unit keeps its ``act_bytes`` and runs its
backward alone. A method that chooses recomputation (``Stage.recompute``) prices it itself
through :func:`pipeopt.cost.rules.recompute_terms` and :func:`pipeopt.cost.rules.backward_peak`;
code that turns a plan into cuts to score it on the table calls :func:`refuse_recompute` first,
so that a plan's recomputation is never silently dropped.

Data parallelism and ZeRO (``Settings.dp``, ``zero``, the training-state ratios) are not in
:attr:`CostTable.mem_prefix`, :meth:`CostTable.memory` or the work prefixes (the methods built on
them refuse these settings, ``Method.unmodelled``); :meth:`CostTable.sharded_state`,
:meth:`CostTable.zero_ops` and :meth:`CostTable.zero_sync` give a stage's terms by the rules
:func:`pipeopt.evaluate` applies, for a method that adds them (the partition problem's
``stage_memory`` and ``stage_work``, which its DP reads).
"""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np

from ..graph import Chain, is_array_chain
from . import rules
from .arrays import layer_arrays
from .ties import ChainTies, ties_of
from .transient import ChainTransient


def refuse_recompute(plan, what: str) -> None:
    """Raise unless ``plan`` recomputes nothing: for code that scores a plan by its cuts on a
    :class:`CostTable` (which has no recomputation, module docstring).

    Parameters
    ----------
    plan
        :class:`pipeopt.Plan`.
    what
        What would score it (named in the message).

    Raises
    ------
    InvalidPlanError
        If a stage of ``plan`` has a ``recompute``; the message names the stage and says to
        score the plan with :func:`pipeopt.evaluate`.
    """
    from ..errors import InvalidPlanError

    for i, st in enumerate(plan.stages):
        if st.recompute:
            raise InvalidPlanError(
                f"{what} scores a plan by its cuts on the cost table, which has no activation recomputation; "
                f"stage {i} recomputes {len(st.recompute)} layer(s): score the plan with pipeopt.evaluate"
            )


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(values)])


class CostTable:
    """Prefix sums, cut times, in-flight counts and memory terms of a chain split into
    ``stages`` stages (0-based stage t, units ``0 .. n-1``, boundary c = "before unit c").

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    stages
        S, the number of pipeline stages (the in-flight count of stage t is ``S - t``).

    Attributes
    ----------
    chain
        :class:`pipeopt.graph.Chain` of the instance.
    n, stages
        Units and stages.
    bandwidth, latency
        Bytes/s between workers, and seconds per message (:func:`rules.transfer_time`: a cut
        carries one message per direction and microbatch).
    overhead
        ``(forward, backward)`` seconds per microbatch a stage's runtime adds to its passes
        (:func:`rules.stage_overhead`; once per stage, not a prefix sum).
    act_prefix, param_prefix
        ``ndarray (n+1,)``: prefix sums of activation and parameter bytes.
    boundary_bytes
        ``ndarray (n+1,)``: bytes crossing the boundary before unit c (0 at both ends); the
        same amount of gradient travels back.
    cut_time
        ``ndarray (n+1,)``: seconds the busier direction of a cut at c is busy per microbatch
        on one link (:func:`rules.cut_time`; links are full duplex).
    round_trip
        ``ndarray (n+1,)``: seconds one microbatch's activations forward plus gradients back
        take over a cut at c on one link (:func:`rules.round_trip`; what a cut adds to the
        window rows, :func:`rules.steady_period`).
    send_time
        ``ndarray (n+1,)``: seconds one direction of the cut at c takes on one link (what a
        stage pays per transfer it sends without overlap).
    in_flight, versions
        ``ndarray (S,)``: microbatches in flight and weight versions of each stage under the
        objective's schedule without replication (1F1B: S - t; GPipe: M;
        :func:`rules.in_flight`, :func:`rules.weight_versions`).
    mem_prefix
        ``ndarray (S, n+1)``: ``in_flight[t] * act_prefix + versions[t] * param_prefix``, so
        that stage t of units ``a..b-1`` needs ``mem_prefix[t, b] - mem_prefix[t, a]`` bytes
        (plus its tied parameters, :attr:`ties`: :meth:`stage_memory` adds them).
    ties
        :class:`pipeopt.cost.ties.ChainTies`: the tied parameters on the chain (false if none);
        a stage holding a tie's unit keeps its ``state_bytes`` (:meth:`memory`).
    """

    def __init__(self, instance, stages: int) -> None:
        self.instance = instance
        self.chain: Chain = instance.chain
        self.n = self.chain.n
        self.stages = int(stages)
        self.settings = instance.settings
        self.bandwidth = float(instance.cluster.bandwidth)
        self.bus_bandwidth = float(instance.cluster.bus_bandwidth)  # the collectives' (Cluster.collective_bandwidth)
        self.latency = float(instance.cluster.latency)
        self.overhead = rules.stage_overhead(instance.graph)

    # ---- compute -------------------------------------------------------------------------
    @cached_property
    def _load_prefix(self) -> dict:
        out = {}
        for name, arrs in (("fwd", self.chain.fwd), ("bwd", self.chain.bwd)):
            for k, v in arrs.items():
                finite = np.isfinite(v)
                out[name, k] = (_prefix(np.where(finite, v, 0.0)), _prefix((~finite).astype(float)))
        return out

    def load(self, a: int, b: int, kinds=None) -> tuple[dict, dict]:
        """F_k and B_k of units ``a..b-1``: ``(dict[kind, s], dict[kind, s])`` on one unit of
        each kind (``inf`` if some unit cannot run on k). ``kinds`` defaults to the chain's."""
        out = []
        for name in ("fwd", "bwd"):
            d = {}
            for k in self.chain.kinds if kinds is None else kinds:
                s, bad = self._load_prefix[name, k]
                d[k] = math.inf if bad[b] - bad[a] else float(s[b] - s[a])
            out.append(d)
        return out[0], out[1]

    def work_prefix(self, kind: str, units: float = 1.0) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of forward + backward seconds on ``units`` units of
        ``kind`` (sequential execution on one kind, :func:`rules.stage_compute`); ``inf`` from
        the first unit that cannot run on the kind."""
        return _prefix((self.chain.fwd[kind] + self.chain.bwd[kind]) / units)

    def pass_prefix(self, which: str, kind: str, units: float = 1.0) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of the forward (``which="fwd"``) or backward
        (``"bwd"``) seconds of the units on ``units`` units of ``kind``, each pass alone (a
        Bi-Partition stage runs the two passes of different unit ranges; their sum over one
        range is :meth:`work_prefix`)."""
        return _prefix((self.chain.fwd if which == "fwd" else self.chain.bwd)[kind] / units)

    # ---- bytes and communication ---------------------------------------------------------
    @cached_property
    def act_prefix(self) -> np.ndarray:
        return _prefix(self.chain.act)

    @cached_property
    def param_prefix(self) -> np.ndarray:
        return _prefix(self.chain.param)

    @cached_property
    def boundary_bytes(self) -> np.ndarray:
        # the instance's layer arrays are read once and shared with evaluate (pipeopt.cost.arrays)
        arrays = layer_arrays(self.instance)
        if is_array_chain(self.instance.graph):  # its chain: unit i is layer i (ChainGraph.chain)
            units = np.arange(self.n, dtype=np.int64)
        else:
            units = arrays.unit_positions(self.chain.units)
        inner = rules.crossing_bytes(arrays, units, self.n)
        return np.concatenate([[0.0], inner, [0.0]])

    @cached_property
    def cut_time(self) -> np.ndarray:
        bb = self.boundary_bytes
        return rules.cut_time(bb, bb, self.bandwidth, 1, self.latency)

    @cached_property
    def round_trip(self) -> np.ndarray:
        bb = self.boundary_bytes
        return rules.round_trip(bb, bb, self.bandwidth, self.latency)

    @cached_property
    def send_time(self) -> np.ndarray:
        return rules.transfer_time(self.boundary_bytes, self.bandwidth, 1, self.latency)

    def allreduce_prefix(self, replicas: int) -> np.ndarray:
        """``ndarray (n+1,)``: prefix sums of the all-reduce seconds of each unit's parameters on
        ``replicas`` workers (:func:`rules.allreduce_time`; linear in the bytes, so without the
        per-message latency, which a stage pays once: see :attr:`latency`)."""
        return rules.allreduce_time(self.param_prefix, replicas, self.bus_bandwidth)

    # ---- memory --------------------------------------------------------------------------
    @cached_property
    def ties(self) -> ChainTies:
        return ChainTies(self.chain, ties_of(self.instance.graph))

    @cached_property
    def in_flight(self) -> np.ndarray:
        s = self.settings
        return np.array(
            [rules.in_flight(t, self.stages, gpipe=s.objective == "gpipe", microbatches=s.microbatches)
             for t in range(self.stages)],
            dtype=float,
        )

    @cached_property
    def versions(self) -> np.ndarray:
        return np.array([rules.weight_versions(k, self.settings.weight_stashing) for k in self.in_flight])

    @cached_property
    def mem_prefix(self) -> np.ndarray:
        return rules.stage_memory(self.act_prefix[None, :], self.param_prefix[None, :],
                                  self.in_flight[:, None], self.versions[:, None])

    def memory(self, a, b, in_flight):
        """Bytes units ``a..b-1`` need with ``in_flight`` microbatches (arrays broadcast), the
        tied parameters they hold included (:attr:`ties`)."""
        versions = rules.weight_versions(in_flight, self.settings.weight_stashing)
        params = self.param_prefix[b] - self.param_prefix[a]
        if self.ties:
            params = params + self.ties.state_bytes(a, b)
        out = rules.stage_memory(self.act_prefix[b] - self.act_prefix[a], params, in_flight, versions)
        if self.transient:
            out = out + self.transient_memory(a, b, in_flight)
        return out

    def stage_memory(self, a, b, stage: int):
        """Bytes stage ``stage`` of units ``a..b-1`` needs (arrays broadcast), the tied
        parameters it holds and the transient terms (:attr:`transient`) included."""
        out = self.mem_prefix[stage, b] - self.mem_prefix[stage, a]
        if self.ties:
            out = out + self.versions[stage] * self.ties.state_bytes(a, b)
        if self.transient:
            out = out + self.transient_memory(a, b, self.in_flight[stage])
        return out

    @cached_property
    def transient(self) -> ChainTransient:
        """:class:`pipeopt.cost.transient.ChainTransient` (false unless the graph attribute
        ``transient_memory`` is set): the outputs a stage keeps and its backward temporaries."""
        return ChainTransient(self.chain, self.instance.graph)

    def transient_memory(self, a, b, in_flight):
        """:func:`rules.transient_memory` of a stage of units ``a..b-1`` keeping ``in_flight``
        microbatches (arrays broadcast): the stage ending at ``n`` is the last."""
        b = np.asarray(b)
        last = b == self.n
        out = np.where(last, self.transient.final_out, self.boundary_bytes[b])
        kept = rules.outputs_kept(in_flight, last, self.settings.microbatches)
        a = np.asarray(a)
        start = self.act_prefix[a]
        excess = rules.backward_excess(self.transient.peak(a, b) - start, self.act_prefix[b] - start)
        merged = rules.merged_output(out, last, self.settings.microbatches)
        once = rules.saved_once(in_flight, self.transient.twice[a, b])  # (<= 0) tensors held once
        act = in_flight * (self.act_prefix[b] - start) + once  # the activations the stage holds
        return rules.transient_memory(out, kept, excess, merged, act) + once

    # ---- data parallelism and ZeRO ---------------------------------------------------------
    @cached_property
    def _largest(self) -> list:
        """Sparse table of the largest layer's ``param_bytes`` per unit (range maxima)."""
        g = self.instance.graph
        if is_array_chain(g):  # one layer per unit
            unit = np.asarray(self.chain.param, dtype=float)
        else:
            unit = np.array([max(float(g.nodes[x]["param_bytes"]) for x in layers) for layers in self.chain.units])
        levels, width = [unit], 1
        while 2 * width <= self.n:
            levels.append(np.maximum(levels[-1][:-width], levels[-1][width:]))
            width *= 2
        return levels

    def largest_layer(self, a, b):
        """The largest ``param_bytes`` of one layer in units ``a..b-1`` (0 if empty; arrays
        broadcast): what ZeRO-3 gathers at once (:func:`rules.sharded_state`)."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        k = np.floor(np.log2(np.maximum(b - a, 1))).astype(np.int64)
        out = np.zeros(np.broadcast(a, b).shape)
        levels = self._largest
        for lvl in np.unique(k):
            sel = np.broadcast_to(k == lvl, out.shape)
            arr = levels[int(lvl)]
            lo = np.clip(np.broadcast_to(a, out.shape)[sel], 0, arr.size - 1)
            hi = np.clip(np.broadcast_to(b, out.shape)[sel] - (1 << int(lvl)), 0, arr.size - 1)
            out[sel] = np.maximum(arr[lo], arr[hi])
        return np.where(b > a, out, 0.0)

    def _tie_weights(self, a, b):
        """Tie weight ``bytes`` units ``a..b-1`` hold (what data parallelism synchronises)."""
        if not self.ties:
            return 0.0
        total = np.zeros(np.broadcast(np.asarray(a), np.asarray(b)).shape)
        for h, t in zip(self.ties.held(a, b), self.ties.ties, strict=True):
            total = total + np.where(h, t.bytes, 0.0)
        return total

    def sharded_state(self, a, b):
        """Bytes a stage of units ``a..b-1`` keeps beyond one copy of its weights under the
        settings' data parallelism (:func:`rules.sharded_state` of its ``param_bytes`` and tied
        state; :attr:`pipeopt.cost.Evaluation.state`); 0 with the default settings."""
        s = self.settings
        params = self.param_prefix[b] - self.param_prefix[a]
        if self.ties:
            params = params + self.ties.state_bytes(a, b)
        return rules.sharded_state(params, self.largest_layer(a, b), gradient_ratio=s.gradient_ratio,
                                   optimizer_ratio=s.optimizer_ratio, zero=s.zero, dp=s.dp)

    @cached_property
    def _weighted_prefix(self) -> np.ndarray:
        """Prefix counts of the units with weights (``param_bytes > 0``)."""
        return _prefix((np.asarray(self.chain.param, dtype=float) > 0).astype(float))

    def _synced(self, a, b):
        """Weight bytes a stage's collectives move: its ``param_bytes`` and tied weights; a stage
        with some weights moves > 0 bytes whatever the prefix sums' rounding (its messages'
        latency counts exactly when evaluate's does)."""
        synced = self.param_prefix[b] - self.param_prefix[a] + self._tie_weights(a, b)
        some = (self._weighted_prefix[b] - self._weighted_prefix[a] > 0) | (np.asarray(self._tie_weights(a, b)) > 0)
        return np.where(some, np.maximum(synced, np.finfo(float).tiny), 0.0)

    def zero_ops(self, a, b):
        """``(forward, backward)`` seconds ZeRO adds per microbatch to the ops of a stage of
        units ``a..b-1`` (:func:`rules.zero_op_times`)."""
        s = self.settings
        return rules.zero_op_times(self._synced(a, b), zero=s.zero, dp=s.dp, bandwidth=self.bus_bandwidth,
                                   latency=self.latency)

    def zero_sync(self, a, b):
        """Seconds of a stage's data-parallel synchronisation after the flush
        (:func:`rules.zero_sync_time`; :attr:`pipeopt.cost.Evaluation.stage_sync`)."""
        s = self.settings
        return rules.zero_sync_time(self._synced(a, b), zero=s.zero, dp=s.dp, bandwidth=self.bus_bandwidth,
                                    latency=self.latency)

    @staticmethod
    def fits(memory, capacity):
        """:func:`rules.fits`: ``memory <= capacity`` up to the shared slack."""
        return rules.fits(memory, capacity)
