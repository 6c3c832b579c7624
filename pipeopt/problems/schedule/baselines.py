"""The splits users of the runtimes get without a planner, run under a schedule.

Each baseline returns a :class:`pipeopt.Result` scored by the executor
(:meth:`ScheduleProblem.execute`), with no bound; its gap is taken against the exact
method's bound (:func:`pipeopt.problems.schedule.milp.solve_milp`).

* :func:`uniform` -- equal layer (unit) counts per chunk, the first ``n mod S`` one longer:
  torch.distributed.pipelining's even split (``pipeline(...)`` with evenly placed
  ``split_spec`` points, as its examples do).
* :func:`torchtitan_split` -- torchtitan's ``generate_llm_fqn_per_model_part`` (v0.2.2,
  ``torchtitan/distributed/pipeline_parallel.py``) for ``p v`` model parts: the transformer
  blocks dealt evenly with the embedding and the head weighing one block each
  (:func:`pipeopt.problems.partition.frameworks.torchtitan_blocks`, reused). The blocks are
  a from_torch graph's container children, or the zoo's ``layer{i}_*`` units grouped by i.
* :func:`best_1f1b` -- the best 1F1B plan: the partition DP's split into ``p v`` stages
  (least steady-state period under 1F1B on ``p v`` workers of the rank's device, ties broken
  by the 1F1B iteration time: :func:`pipeopt.problems.partition.dp.solve_dp`), run under the
  schedule - what a user gets from a 1F1B planner asked for as many stages as the schedule
  has chunks. Under the problem's ``recompute`` option the DP chooses each stage's
  recomputed layers for 1F1B's in-flight counts and the plan carries them unchanged (under
  another schedule they may not fit: the result is then ``infeasible``).
* :func:`zb_greedy` -- the zero-bubble repository's greedy scheduler
  (:mod:`.zb_greedy`) on a fixed split (default: the uniform split into p chunks), its order
  executed by pipeopt's executor; p ranks, one chunk each. By default the best of its 8 flag
  variants by its own estimate, as its code chooses; any one variant with ``variant=``. Its
  order is its own, not the problem's schedule: its result lies in ``schedule:ZB-greedy``.
"""

from __future__ import annotations

import dataclasses
import re
import time

from ...cluster import Device
from ...errors import InfeasibleError, InvalidProblemError, PipeoptError
from ..partition.dp import solve_dp
from ..partition.frameworks import torch_parts, torchtitan_blocks
from ..partition.problem import PartitionProblem
from ...result import Result
from .problem import ScheduleProblem, uniform_starts
from .zb_greedy import FLAGS as ZB_FLAGS
from .zb_greedy import SOURCE as ZB_SOURCE
from .zb_greedy import orders_schedule, zb_greedy_runs

__all__ = ["BASELINES", "best_1f1b", "torchtitan_split", "uniform", "zb_greedy"]

_ZOO_BLOCK = re.compile(r"^layer(\d+)_")


def uniform(problem: ScheduleProblem, **_) -> Result:
    """Equal unit counts per chunk (module docstring)."""
    started = time.perf_counter()
    return problem.result("uniform", uniform_starts(problem.n, problem.S), "feasible", started=started)


def _blocks(instance) -> tuple[list, list, list]:
    """``(before, blocks, after)``: layer lists of the model's three parts, each block a list
    of layers (from_torch graphs: :func:`~pipeopt.problems.partition.frameworks.torch_parts`;
    zoo graphs: the ``layer{i}_*`` layers grouped by i)."""
    graph = instance.graph
    if (graph.graph.get("torch") or {}).get("container"):
        before, blocks, after = torch_parts(graph, "torchtitan")
        return before, [[b] for b in blocks], after
    order = [v for unit in instance.chain.units for v in unit]
    keys = [(_ZOO_BLOCK.match(str(v)).group(1) if _ZOO_BLOCK.match(str(v)) else None) for v in order]
    idx = [i for i, k in enumerate(keys) if k is not None]
    if not idx:
        raise InvalidProblemError("torchtitan's split counts transformer blocks; this model has none (no container,"
                                  " no zoo 'layer{i}_*' layers)")
    lo, hi = idx[0], idx[-1]
    if any(k is None for k in keys[lo:hi + 1]):
        raise InvalidProblemError("torchtitan: a layer outside the blocks runs between two blocks")
    blocks: list = []
    for v, k in zip(order[lo:hi + 1], keys[lo:hi + 1], strict=True):
        if not blocks or blocks[-1][0] != k:
            blocks.append((k, []))
        blocks[-1][1].append(v)
    return order[:lo], [b for _, b in blocks], order[hi + 1:]


def torchtitan_split(problem: ScheduleProblem, input_weight: int = 1, output_weight: int = 1, **_) -> Result:
    """torchtitan's default split into ``p v`` parts (module docstring).

    Raises
    ------
    InvalidProblemError
        On a model without transformer blocks, where torchtitan raises, or if a part is empty
        or not contiguous in pipeopt's unit order.
    """
    started = time.perf_counter()
    before, blocks, after = _blocks(problem.instance)
    S = problem.S
    counts = torchtitan_blocks(S, len(blocks), input_weight, output_weight)
    part = {v: 0 for v in before}
    k = 0
    for s, c in enumerate(counts):
        for blk in blocks[k:k + c]:
            part.update({v: s for v in blk})
        k += c
    part.update({v: S - 1 for v in after})
    seq = [part[u[0]] for u in problem.instance.chain.units]
    if sorted(set(seq)) != list(range(S)) or any(b < a for a, b in zip(seq, seq[1:])):
        raise InvalidProblemError(f"torchtitan's {counts} blocks per part leave a part empty or out of order")
    starts = [i for i in range(1, len(seq)) if seq[i] != seq[i - 1]]
    return problem.result("torchtitan", starts, "feasible", started=started,
                          info={"blocks_per_part": counts, "source": "torchtitan v0.2.2 generate_llm_fqn_per_model_part"})


def best_1f1b(problem: ScheduleProblem, time_limit: float = 60.0, **_) -> Result:
    """The partition DP's split into ``p v`` stages run under the schedule (module docstring).

    Raises
    ------
    InfeasibleError
        If no split into ``p v`` stages fits one device each under 1F1B.
    """
    started = time.perf_counter()
    inst = problem.instance
    dev = inst.cluster.devices[0]
    S = problem.S
    workers = dataclasses.replace(inst.cluster, devices=tuple(Device(f"{dev.name}#{s}", dict(dev.resources), dev.memory)
                                                              for s in range(S)))
    virtual = inst.replace(cluster=workers).with_settings(objective="bottleneck", microbatches=problem.microbatches)
    part = PartitionProblem(virtual, S, recompute=problem.recompute)
    res = solve_dp(part, time_limit=time_limit)
    if res.plan is None:
        raise InfeasibleError(f"best 1F1B plan: the DP found no split into {S} stages ({res.status})")
    starts, recompute = part.split_of(res.plan)  # the planner's recompute sets go with its split
    return problem.result("best_1f1b", starts, "feasible", started=started, recompute=recompute,
                          info={"dp_status": str(res.status), "dp_period": res.objective,
                                "recompute_from": "the 1F1B DP's choice per stage (recompute="
                                                  f"{problem.recompute!r}), run unchanged under the schedule"})


def zb_greedy(problem: ScheduleProblem, starts=None, median: bool = False, variant=None, **_) -> Result:
    """The zero-bubble greedy's order on a fixed split of p chunks (default: uniform),
    executed by pipeopt's executor. Needs a problem with v = 1 (its schedule is replaced by
    the greedy's order; the result's space is ``schedule:ZB-greedy``).

    Parameters
    ----------
    problem
        :class:`ScheduleProblem` with one chunk per rank.
    starts
        The split (default :func:`uniform_starts`).
    median
        Feed the stages' median times, as the repository's runtime does.
    variant
        ``None`` (default): the best of its 8 flag variants by the greedy's own estimate, as its
        ``initial_solution`` chooses; else one variant (a number 0..7 of
        :data:`.zb_greedy.VARIANTS`, three bools, or a dict of its flags).

    Returns
    -------
    Result
        Objective the executor's iteration time of the chosen order; ``info``: ``source``,
        ``variant`` (the chosen flags by name), ``variant_index``, and ``variants``: per variant
        of :data:`.zb_greedy.VARIANTS` its flags, the greedy's estimate (seconds) and the
        executor's time of its order (``None`` and the error where that variant fails).

    Raises
    ------
    InvalidProblemError
        If the problem has more than one chunk per rank, on a bad ``variant``, or where the
        greedy fails its own closing check (as its code stops).
    InfeasibleError
        If the greedy cannot fit the memory.
    """
    started = time.perf_counter()
    if problem.stages_per_rank != 1:
        raise InvalidProblemError("the zero-bubble greedy orders one chunk per rank (v = 1)")
    starts = uniform_starts(problem.n, problem.S) if starts is None else problem.check_starts(starts)
    schedule, runs, k = zb_greedy_runs(problem, starts, median=median, variant=variant)
    rows = []
    for run in runs:
        row = dict(zip(ZB_FLAGS, run["flags"], strict=True))
        if "error" in run:
            row.update(estimate=None, time=None, error=run["error"])
        else:
            executed = ScheduleProblem(problem.instance, orders_schedule(run["orders"])).execute(starts)
            row.update(estimate=float(run["estimate"]), time=float(executed.time))
        rows.append(row)
    greedy = ScheduleProblem(problem.instance, schedule)
    return greedy.result("zb_greedy", starts, "feasible", started=started,
                         info={"source": ZB_SOURCE, "variant": dict(zip(ZB_FLAGS, runs[k]["flags"], strict=True)),
                               "variant_index": k, "variants": rows, "median": bool(median)})


BASELINES = {"uniform": uniform, "torchtitan": torchtitan_split, "best_1f1b": best_1f1b}
"""The baselines that apply to every schedule (:func:`zb_greedy` has its own schedule)."""


def run_baselines(problem: ScheduleProblem, names=None, time_limit: float = 60.0) -> list:
    """Each baseline's result on ``problem``, or ``(name, why)`` where it does not apply."""
    out = []
    for name in names or list(BASELINES):
        try:
            out.append(BASELINES[name](problem, time_limit=time_limit))
        except PipeoptError as exc:
            out.append((name, str(exc)))
    return out
