"""The zero-bubble repository's greedy scheduler on a fixed split, as a pipeopt schedule.

Qi et al., *Zero Bubble Pipeline Parallelism* (ICLR 2024) order the F, B (input gradient, I
in pipeopt's terms) and W actions of p stages by an ILP, which their released code leaves
switched off: what runs is the greedy ``Graph.manual_order`` tried with its three flags in all
8 combinations, keeping the order of least estimated time (``initial_solution``), and each
stage's actions sorted by their estimated completion times (``create_scheduled_nodes``).
Source: sail-sg/zero-bubble-pipeline-parallelism, commit 39f2c186,
``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py`` (called by
``runtime.py``'s ``scheduler`` through ``zb.create_schedule``); BSD-3-Clause (NVIDIA's
Megatron-LM licence). :func:`manual_order` below is that function transcribed line by line
(names kept; ``torch`` and ``pulp`` dropped: they only carry the data).

Inputs as its code takes them, per stage: ``cost_f``, ``cost_b``, ``cost_w`` (seconds of F,
I, W), one ``cost_comm`` (seconds of a transfer), ``mem_f``, ``mem_b``, ``mem_w`` (memory each
action adds; they sum to zero) and ``max_mem`` (``None``: its default ``3 m mem_f``, no
limit). :func:`zb_greedy_schedule` fills them from a split's
:func:`pipeopt.cost.passes.pass_times` under pipeopt's memory rule (a microbatch's activations
stay from its F to its W: ``mem_f = act``, ``mem_b = 0``, ``mem_w = -act``; ``max_mem`` = the
rank's memory less its parameters), with ``cost_comm`` the dearest boundary's transfer
(its code has one number). Its runtime feeds the medians of the stages' times
(``f = [sorted(f)[len(f) // 2]] * len(f)``, "uniform f/b/w timing for now"); pipeopt feeds the
true per-stage times, which its greedy accepts (``median=True`` reproduces the runtime).

The order it returns is executed by pipeopt's executor like every other schedule
(:func:`pipeopt.schedules.execute`): the greedy's own time estimate is not used.
"""

from __future__ import annotations

import math

from ...cost import rules
from ...cost.passes import pass_times
from ...errors import InfeasibleError
from ...schedules import Action, Schedule
from .problem import ScheduleProblem

__all__ = ["SOURCE", "greedy_orders", "manual_order", "zb_greedy_schedule"]

SOURCE = ("sail-sg/zero-bubble-pipeline-parallelism@39f2c186 "
          "megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py: Graph.manual_order, initial_solution")


class _Graph:
    """``zb.Graph``: ids ``type * (S * m) + stage * m + mb`` for type 0 (F), 1 (B), 2 (W)."""

    def __init__(self, nstages, nmb, cost, mem, comm, max_mem):
        self.nstages, self.nmb = nstages, nmb
        self.nnodes = 3 * nstages * nmb
        self.cost, self.mem, self.comm, self.max_mem = cost, mem, comm, max_mem

    def get_id(self, type_, stage, mb):
        return type_ * (self.nstages * self.nmb) + stage * self.nmb + mb

    def get_cost(self, id_):
        return self.cost[id_ // (self.nstages * self.nmb)][(id_ // self.nmb) % self.nstages]

    def get_mem(self, id_):
        return self.mem[id_ // (self.nstages * self.nmb)][(id_ // self.nmb) % self.nstages]


def manual_order(g: _Graph, allow_bubble_before_first_b=False, prioritize_b=False, no_bubble_greedy=True):
    """``zb.Graph.manual_order``, transcribed: ``(order, t, best_time)`` - each node's index in
    its stage's order, its estimated completion time, and the estimated iteration time.

    Raises
    ------
    ValueError
        ``"Cannot fit memory"``, as its code does.
    """
    nstages, nmb = g.nstages, g.nmb
    order = [0] * g.nnodes
    f, b, w, o, m, e = ([0] * nstages for _ in range(6))
    t = [0] * g.nnodes
    max_mem = g.max_mem or [g.get_mem(g.get_id(0, stage, 0)) * nmb * 3 for stage in range(nstages)]
    comm = g.comm
    stage_bubble = [0] * nstages

    def get_max_bubble():
        return max(stage_bubble + [0])

    def put(stage_j, type_k):
        _i = (f, b, w)[type_k][stage_j]
        _j = stage_j
        _id = g.get_id(type_k, _j, _i)
        _mem, _cost = g.get_mem(_id), g.get_cost(_id)
        tmp = e[_j] + _cost
        no_bubble = tmp
        if _j > 0 and type_k == 0:
            tmp = max(tmp, t[g.get_id(0, _j - 1, _i)] + comm + _cost)
        if _j < nstages - 1 and type_k == 1:
            tmp = max(tmp, t[g.get_id(1, _j + 1, _i)] + comm + _cost)
        if f[_j] > 0:
            stage_bubble[_j] += tmp - no_bubble
        e[_j] = tmp
        t[_id] = tmp
        m[_j] += _mem
        order[_id] = o[_j]
        (f, b, w)[type_k][stage_j] += 1
        o[_j] += 1

    for i in range(nmb):
        if i == 0:
            for j in range(nstages):
                put(j, 0)
            f_required = [0] * nstages
            last_t = 0
            for j in range(nstages - 1, -1, -1):
                if j == nstages - 1:
                    last_t = t[g.get_id(0, j, i)] + g.get_cost(g.get_id(1, j, i))
                    continue
                mem = m[j]
                cost = e[j]
                while True:
                    f_id = g.get_id(0, j, f[j] + f_required[j])
                    if f[j] + f_required[j] < nmb and mem + g.get_mem(f_id) <= max_mem[j]:
                        if allow_bubble_before_first_b:
                            if cost + g.get_cost(f_id) > last_t + comm:
                                break
                        else:
                            if cost >= last_t + comm:
                                break
                        mem += g.get_mem(f_id)
                        cost += g.get_cost(f_id)
                        f_required[j] += 1
                    else:
                        break
                last_t = max(cost, last_t + comm) + g.get_cost(g.get_id(1, j, i))
            for j in range(nstages):
                while j > 0 and f_required[j] > 0 and f_required[j] >= f_required[j - 1] and f[j] + f_required[j] < nmb:
                    f_required[j] -= 1
            for j in range(nstages):
                for _ in range(f_required[j]):
                    put(j, 0)
            for j in range(nstages - 1, -1, -1):
                put(j, 1)
            continue
        f_required = [0] * nstages
        for j in range(nstages):
            if f[j] >= nmb:
                continue
            if j + 1 < nstages and f[j] >= f[j + 1] + 2 and prioritize_b:
                next_plus_fw = (e[j + 1] + g.get_cost(g.get_id(0, j + 1, f[j + 1]))
                                + g.get_cost(g.get_id(1, j + 1, b[j + 1])) + comm)
                if e[j] >= next_plus_fw:
                    continue
                f_id = g.get_id(0, j, f[j])
                f_mem = g.get_mem(f_id)
                w_cost, w_cnt = 0, 0
                mem_with_w = m[j] + f_mem
                while mem_with_w > max_mem[j] and w[j] + w_cnt < b[j]:
                    w_id = g.get_id(2, j, w[j] + w_cnt)
                    w_cost += g.get_cost(w_id)
                    mem_with_w += g.get_mem(w_id)
                    w_cnt += 1
                if e[j] + g.get_cost(f_id) + w_cost <= next_plus_fw:
                    f_required[j] = 1
                    continue
                w_cost, w_cnt = 0, 0
                if next_plus_fw - (e[j] + w_cost) <= get_max_bubble() - stage_bubble[j]:
                    continue
            f_required[j] = 1
        for j in range(nstages - 2, -1, -1):
            f_required[j] = min(f_required[j], f_required[j + 1])
        for j in range(nstages):
            if f_required[j] == 0:
                continue
            f_id = g.get_id(0, j, f[j])
            mem = g.get_mem(f_id)
            while m[j] + mem > max_mem[j]:
                if w[j] >= b[j]:
                    raise ValueError("Cannot fit memory")
                put(j, 2)
            if j > 0:
                while w[j] < b[j] and e[j] + g.get_cost(g.get_id(2, j, w[j])) <= t[g.get_id(0, j - 1, f[j])] + comm:
                    put(j, 2)
                if w[j] < b[j] and e[j] < t[g.get_id(0, j - 1, f[j])] + comm:
                    if t[g.get_id(0, j - 1, f[j])] + comm - e[j] <= get_max_bubble() - stage_bubble[j]:
                        if no_bubble_greedy:
                            put(j, 2)
                    else:
                        put(j, 2)
            put(j, 0)
        for j in range(nstages - 1, -1, -1):
            assert b[j] == i
            b_id = g.get_id(1, j, b[j])
            mem = g.get_mem(b_id)
            while m[j] + mem > max_mem[j]:
                if w[j] >= b[j]:
                    raise ValueError("Cannot fit memory")
                put(j, 2)
            if j + 1 < nstages:
                while w[j] < b[j] and e[j] + g.get_cost(g.get_id(2, j, w[j])) <= t[g.get_id(1, j + 1, i)] + comm:
                    put(j, 2)
                if w[j] < b[j] and e[j] < t[g.get_id(1, j + 1, i)] + comm:
                    if t[g.get_id(1, j + 1, i)] + comm - e[j] <= get_max_bubble() - stage_bubble[j]:
                        if no_bubble_greedy:
                            put(j, 2)
                    else:
                        put(j, 2)
            if j == 0 and f[j] == nmb:
                while w[j] < b[j]:
                    put(j, 2)
            put(j, 1)
    for i in range(nstages):
        while w[i] < nmb:
            put(i, 2)
    best_time = 0
    for i in range(nstages):
        best_time = max(best_time, t[g.get_id(2, i, nmb - 1)] - t[g.get_id(0, i, 0)] + g.get_cost(g.get_id(0, i, 0)))
    return order, t, best_time


def greedy_orders(cost_f, cost_b, cost_w, cost_comm, mem_f, mem_b, mem_w, max_mem, n_micro):
    """``zb.initial_solution`` + ``create_scheduled_nodes``: the best of the 8 flag
    combinations by the greedy's estimate, then each stage's (type, microbatch) in order of
    estimated completion (ties: F before B before W, lower microbatch first - its stable sort).

    Returns
    -------
    (orders, estimate, finish)
        ``list`` per stage of ``("F" | "B" | "W", microbatch)``; the greedy's estimated
        iteration time (its ``best_time``: the longest stage span from its first F); and the
        latest estimated completion time (with one stage per rank and no transfer queueing,
        the executor's iteration time of the order).
    """
    nstages = len(cost_f)
    g = _Graph(nstages, n_micro, (cost_f, cost_b, cost_w), (mem_f, mem_b, mem_w), cost_comm, max_mem)
    best_time, complete = None, None
    for allow in (True, False):
        for prioritize in (True, False):
            for greedy in (True, False):
                _, t, best = manual_order(g, allow, prioritize, greedy)
                if best_time is None or best < best_time:
                    best_time, complete = best, t
    orders = []
    for stage in range(nstages):
        nodes = [(typ, mb) for typ in range(3) for mb in range(n_micro)]
        nodes.sort(key=lambda n: complete[g.get_id(n[0], stage, n[1])])
        orders.append([("FBW"[typ], mb) for typ, mb in nodes])
    return orders, best_time, max(complete)


def zb_greedy_schedule(problem: ScheduleProblem, starts, median: bool = False) -> Schedule:
    """The greedy's order for the split ``starts`` of a one-stage-per-rank problem, as a
    :class:`pipeopt.schedules.Schedule` named ``"ZB-greedy"`` (its B is pipeopt's I).

    Parameters
    ----------
    problem
        :class:`ScheduleProblem` with v = 1 (e.g. on ``"1F1B"``: p chunks, one per rank).
    starts
        The split (units where chunks 1..p-1 start).
    median
        Feed the stages' median times, as its runtime does.

    Raises
    ------
    InfeasibleError
        If the greedy cannot fit the memory (its ``ValueError("Cannot fit memory")``).
    """
    plan = problem.plan(starts)
    pt = pass_times(problem.instance, plan)
    f, b, w = list(pt.forward), list(pt.input_grad), list(pt.weight_grad)
    for s in range(len(f)):  # without overlap the sender carries its transfer
        f[s], b[s] = rules.carried(s, len(f), f[s], b[s], pt.send_forward, pt.send_backward,
                                   problem.instance.settings.overlap)
    if median:
        f, b, w = ([sorted(x)[len(x) // 2]] * len(x) for x in (f, b, w))
    comm = float(max(pt.send_forward, default=0.0)) if problem.instance.settings.overlap else 0.0
    act = list(pt.act_bytes)
    cap = problem.capacity
    max_mem = None if not math.isfinite(cap) else [cap - prm * problem.schedule.parameter_copies
                                                   for prm in pt.param_bytes]
    try:
        orders, _, _ = greedy_orders([float(x) for x in f], [float(x) for x in b], [float(x) for x in w], comm,
                                         act, [0.0] * len(act), [-a for a in act], max_mem, problem.microbatches)
    except ValueError as exc:
        raise InfeasibleError(f"the zero-bubble greedy: {exc}") from None
    kind = {"F": "F", "B": "I", "W": "W"}
    steps = tuple(tuple((Action(kind[k], r, mb),) for k, mb in orders[r]) for r in range(len(orders)))
    p = len(orders)
    return Schedule("ZB-greedy", p, 1, problem.microbatches, tuple(range(p)), steps, source=SOURCE)
