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
(names kept; ``torch`` and ``pulp`` dropped: they only carry the data), with its closing
checks of the estimated times (asserts there: they fail, and its ``create_schedule`` stops,
where the loop leaves an F unplaced - it happens, e.g. p = 7, m = 21). Each of the 8 flag
variants (:data:`VARIANTS`) can be run alone (``variant=``, :func:`variant_flags`);
``variant=None`` is its own choice, the best of the 8 by its estimate.

Checked against the repository's code run unmodified (``benchmarks/zb_reference.py``): on its
example inputs and random ones (p 2..8, m p..3p) every variant's per-stage order and every
estimated time are identical; the reference's outputs are frozen in
``tests/data/zb_reference.json``.

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
from ...errors import InfeasibleError, InvalidProblemError
from ...schedules import Action, Schedule
from .problem import ScheduleProblem

__all__ = ["FLAGS", "SOURCE", "VARIANTS", "chosen_variant", "execute_orders", "greedy_inputs", "greedy_orders",
           "greedy_variants", "manual_order", "orders_schedule", "variant_flags", "zb_greedy_runs",
           "zb_greedy_schedule"]

SOURCE = ("sail-sg/zero-bubble-pipeline-parallelism@39f2c186 "
          "megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py: Graph.manual_order, initial_solution")

FLAGS = ("allow_bubble_before_first_b", "prioritize_b", "no_bubble_greedy")
"""The three flags of ``manual_order``, in its argument order."""

VARIANTS = tuple((a, b, c) for a in (True, False) for b in (True, False) for c in (True, False))
"""The 8 flag combinations ``(allow_bubble_before_first_b, prioritize_b, no_bubble_greedy)`` in
the order ``initial_solution`` tries them (its three nested loops over ``[True, False]``); the
index into this tuple is a variant's number (0: all True, 7: all False)."""


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
    AssertionError
        Where its closing checks of the estimated times fail (messages as its asserts'), as
        its code does (e.g. an F the loop never placed).
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
    # its final checks of the estimated times (plain asserts there, with these messages): they
    # fail where the loop above left an F unplaced (its time still 0), and then its
    # create_schedule stops with AssertionError
    for i in range(nstages):
        for j in range(nmb):
            f_id, b_id, w_id = g.get_id(0, i, j), g.get_id(1, i, j), g.get_id(2, i, j)
            f_cost, b_cost, w_cost = g.get_cost(f_id), g.get_cost(b_id), g.get_cost(w_id)
            if not t[b_id] >= t[f_id] + b_cost:
                raise AssertionError()
            if not t[w_id] >= t[b_id] + w_cost:
                raise AssertionError(f"{i}-{j}, {t[w_id]} >= {t[b_id]} + {w_cost}")
            if i > 0 and not t[f_id] >= t[g.get_id(0, i - 1, j)] + comm + f_cost:
                raise AssertionError(f"{i}-{j}")
            if i < nstages - 1 and not t[b_id] >= t[g.get_id(1, i + 1, j)] + comm + b_cost:
                raise AssertionError()
    best_time = 0
    for i in range(nstages):
        best_time = max(best_time, t[g.get_id(2, i, nmb - 1)] - t[g.get_id(0, i, 0)] + g.get_cost(g.get_id(0, i, 0)))
    return order, t, best_time


def variant_flags(variant) -> tuple:
    """The flags ``(allow_bubble_before_first_b, prioritize_b, no_bubble_greedy)`` of a variant.

    Parameters
    ----------
    variant
        Its number in :data:`VARIANTS` (0..7), a 3-tuple of bools, or a ``dict`` naming some of
        :data:`FLAGS` (the others take ``manual_order``'s defaults: False, False, True).

    Raises
    ------
    InvalidProblemError
        On anything else.
    """
    if isinstance(variant, dict):
        unknown = sorted(set(variant) - set(FLAGS))
        if unknown:
            raise InvalidProblemError(f"unknown zero-bubble greedy flag(s) {unknown}; the flags are {list(FLAGS)}")
        flags = {"allow_bubble_before_first_b": False, "prioritize_b": False, "no_bubble_greedy": True, **variant}
        variant = tuple(flags[k] for k in FLAGS)
    if isinstance(variant, int) and not isinstance(variant, bool):
        if not 0 <= variant < len(VARIANTS):
            raise InvalidProblemError(f"zero-bubble greedy variant must be 0..{len(VARIANTS) - 1}, got {variant}")
        return VARIANTS[variant]
    if isinstance(variant, (tuple, list)) and len(variant) == 3 and all(isinstance(x, bool) for x in variant):
        return tuple(variant)
    raise InvalidProblemError(f"a zero-bubble greedy variant is a number 0..7, three bools {FLAGS} or a dict of"
                              f" them, got {variant!r}")


def _stage_orders(g: _Graph, complete) -> list:
    """``zb.create_scheduled_nodes``: each stage's (type, microbatch) sorted by estimated
    completion time (a stable sort of F0..F(m-1), B0.., W0..: ties keep that order)."""
    orders = []
    for stage in range(g.nstages):
        nodes = [(typ, mb) for typ in range(3) for mb in range(g.nmb)]
        nodes.sort(key=lambda n: complete[g.get_id(n[0], stage, n[1])])
        orders.append([("FBW"[typ], mb) for typ, mb in nodes])
    return orders


def _error_text(exc: BaseException) -> str:
    """How a failed run is recorded: ``"Cannot fit memory"`` or ``"AssertionError: <its message>"``."""
    return f"AssertionError: {exc}" if isinstance(exc, AssertionError) else str(exc)


def greedy_variants(cost_f, cost_b, cost_w, cost_comm, mem_f, mem_b, mem_w, max_mem, n_micro, variants=VARIANTS) -> list:
    """The greedy's runs on one input, one per flag variant (the 8 runs of ``initial_solution``).

    Parameters as :func:`greedy_orders`; ``variants``: the flag triples to run (default all
    of :data:`VARIANTS`, in its order).

    Returns
    -------
    list
        Per variant, in order: a ``dict`` with ``flags``, ``orders`` (per stage, ``("F" | "B" |
        "W", microbatch)``, its ``create_scheduled_nodes``), ``estimate`` (its ``best_time``) and
        ``finish`` (latest estimated completion), or, where the run fails as its code does,
        ``{"flags", "error", "exception"}`` (``error`` ``"Cannot fit memory"`` or
        ``"AssertionError: <message>"``, its failed closing check; ``exception`` the exception).
    """
    g = _Graph(len(cost_f), n_micro, (cost_f, cost_b, cost_w), (mem_f, mem_b, mem_w), cost_comm, max_mem)
    out = []
    for flags in variants:
        try:
            _, t, best = manual_order(g, *flags)
        except (ValueError, AssertionError) as exc:
            out.append({"flags": tuple(flags), "error": _error_text(exc), "exception": exc})
            continue
        out.append({"flags": tuple(flags), "orders": _stage_orders(g, t), "estimate": best, "finish": max(t)})
    return out


def chosen_variant(runs) -> int:
    """``initial_solution``'s choice among the 8 runs of :func:`greedy_variants`: the first of
    least estimate (its ``best_time_t < best_time``).

    Raises
    ------
    ValueError, AssertionError
        The first failed run's exception, as its loop (which does not catch) raises it.
    """
    for run in runs:
        if "exception" in run:
            raise run["exception"]
    return min(range(len(runs)), key=lambda k: runs[k]["estimate"])


def greedy_orders(cost_f, cost_b, cost_w, cost_comm, mem_f, mem_b, mem_w, max_mem, n_micro, variant=None):
    """``zb.create_schedule``: ``initial_solution`` (the best of the 8 flag variants by the
    greedy's estimate, :func:`chosen_variant`) and ``create_scheduled_nodes`` (each stage's
    actions in order of estimated completion; ties: F before B before W, lower microbatch
    first - its stable sort). With ``variant``, the one ``manual_order`` run with those flags.

    Parameters
    ----------
    cost_f, cost_b, cost_w
        Per stage, seconds of F, B (pipeopt's I) and W of one microbatch.
    cost_comm
        Seconds of one transfer between neighbouring stages (one number, as its code has).
    mem_f, mem_b, mem_w
        Per stage, the memory each action adds (any unit; its config asserts they sum to 0).
    max_mem
        Per stage memory limit, or ``None`` (its default: ``3 m mem_f``).
    n_micro
        m.
    variant
        ``None``: the best of the 8, as its code does; else :func:`variant_flags`'s argument.

    Returns
    -------
    (orders, estimate, finish)
        ``list`` per stage of ``("F" | "B" | "W", microbatch)``; the greedy's estimated
        iteration time (its ``best_time``: the longest stage span from its first F); and the
        latest estimated completion time (with one stage per rank and no transfer queueing,
        the executor's iteration time of the order).

    Raises
    ------
    ValueError
        ``"Cannot fit memory"``, as its code does: with ``variant=None`` if any of the 8 runs
        cannot (its loop does not catch it).
    AssertionError
        Where a run's closing check fails (:func:`manual_order`), likewise.
    InvalidProblemError
        On a bad ``variant``.
    """
    args = (cost_f, cost_b, cost_w, cost_comm, mem_f, mem_b, mem_w, max_mem, n_micro)
    if variant is None:
        runs = greedy_variants(*args)
        run = runs[chosen_variant(runs)]
    else:
        run = greedy_variants(*args, variants=(variant_flags(variant),))[0]
        if "exception" in run:
            raise run["exception"]
    return run["orders"], run["estimate"], run["finish"]


def orders_schedule(orders, name: str = "ZB-greedy") -> Schedule:
    """Per-stage orders (as :func:`greedy_orders` returns them) as a one-stage-per-rank
    :class:`pipeopt.schedules.Schedule` (its B is pipeopt's I)."""
    kind = {"F": "F", "B": "I", "W": "W"}
    p = len(orders)
    m = sum(1 for k, _ in orders[0] if k == "F")
    steps = tuple(tuple((Action(kind[k], r, mb),) for k, mb in orders[r]) for r in range(p))
    return Schedule(name, p, 1, m, tuple(range(p)), steps, source=SOURCE)


def execute_orders(orders, cost_f, cost_b, cost_w, cost_comm):
    """Run per-stage orders (as :func:`greedy_orders` returns them) on the greedy's own inputs
    with pipeopt's executor (:func:`pipeopt.schedules.execute`): one stage per rank, every
    transfer ``cost_comm`` seconds on its own full-duplex link, no memory limit.

    Returns
    -------
    pipeopt.schedules.Execution
        Its ``time`` is the iteration time of the order, seconds.
    """
    from ...cost.passes import PassTimes
    from ...schedules import execute

    p = len(orders)
    times = PassTimes(forward=tuple(map(float, cost_f)),
                      backward=tuple(float(b) + float(w) for b, w in zip(cost_b, cost_w, strict=True)),
                      input_grad=tuple(map(float, cost_b)), weight_grad=tuple(map(float, cost_w)),
                      send_forward=(float(cost_comm),) * (p - 1), send_backward=(float(cost_comm),) * (p - 1),
                      act_bytes=(0.0,) * p, param_bytes=(0.0,) * p, memory_capacity=(math.inf,) * p)
    return execute(orders_schedule(orders), times)


def greedy_inputs(problem: ScheduleProblem, starts, median: bool = False) -> tuple:
    """The greedy's inputs for the split ``starts`` of a one-stage-per-rank problem:
    ``(cost_f, cost_b, cost_w, cost_comm, mem_f, mem_b, mem_w, max_mem, n_micro)`` as
    :func:`greedy_orders` takes them (module docstring: pipeopt's pass times and memory rule;
    ``median``: the stages' median times, as its runtime feeds)."""
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
    return ([float(x) for x in f], [float(x) for x in b], [float(x) for x in w], comm, act, [0.0] * len(act),
            [-a for a in act], max_mem, problem.microbatches)


def zb_greedy_runs(problem: ScheduleProblem, starts, median: bool = False, variant=None) -> tuple:
    """The greedy on the split ``starts``: ``(schedule, runs, k)`` - the chosen order as a
    :class:`pipeopt.schedules.Schedule` named ``"ZB-greedy"``, every variant's run
    (:func:`greedy_variants`) and the index of the chosen one (``variant=None``: its
    ``initial_solution``'s choice; else that variant). Arguments as :func:`zb_greedy_schedule`.

    Raises
    ------
    As :func:`zb_greedy_schedule`.
    """
    flags = None if variant is None else variant_flags(variant)  # a bad variant: its error, not "infeasible"
    runs = greedy_variants(*greedy_inputs(problem, starts, median))
    try:
        k = chosen_variant(runs) if flags is None else VARIANTS.index(flags)
        if "exception" in runs[k]:
            raise runs[k]["exception"]
    except AssertionError as exc:
        raise InvalidProblemError(f"the zero-bubble greedy fails its own closing check of the estimated times on this"
                                  f" split ({_error_text(exc)}: an action left unplaced), where its code stops too;"
                                  f" try another variant or split") from None
    except ValueError as exc:
        raise InfeasibleError(f"the zero-bubble greedy: {exc}") from None
    return orders_schedule(runs[k]["orders"]), runs, k


def zb_greedy_schedule(problem: ScheduleProblem, starts, median: bool = False, variant=None) -> Schedule:
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
    variant
        ``None``: the best of its 8 flag variants by its estimate, as its code does; else one
        variant (:func:`variant_flags`: a number 0..7 of :data:`VARIANTS`, three bools, a dict).

    Raises
    ------
    InvalidProblemError
        On a bad ``variant``, or if the greedy fails its closing check (its
        ``AssertionError``, see :func:`manual_order`).
    InfeasibleError
        If the greedy cannot fit the memory (its ``ValueError("Cannot fit memory")``).
    """
    return zb_greedy_runs(problem, starts, median, variant)[0]
