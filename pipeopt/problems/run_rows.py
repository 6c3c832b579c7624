"""A flush run's longest path as rows of a MILP: one start time per operation.

With the order of the operations on every worker and link fixed by the schedule, a run of M
microbatches is a directed acyclic graph of operations (:func:`pipeopt.cost.schedule.run_graph`)
and its iteration time is the longest path through it (:func:`pipeopt.cost.schedule.makespan`,
what :func:`pipeopt.evaluate` reports). When the op *durations* are variables of a model (they
depend on the plan), the iteration time is the least ``Z`` of

    t_q >= t_a + d_a     for every dependency a -> q of the graph,
    Z   >= t_q + d_q     for every op q that nothing depends on,  t >= 0,

with no big-M: the order is the schedule's, only the durations vary (for fixed durations the
least Z is the longest path). :func:`add_run_rows` writes these rows;
:func:`run_start_values` gives a MIP start for known durations. The event-time models of the
partition problem (:mod:`pipeopt.problems.partition.events`) and of Bi-Partition's tie-break
(:mod:`pipeopt.problems.bipartition.tiebreak`) share them.
"""

from __future__ import annotations

from ..lazy import lazy_module
from ..backends.deadline import Deadline
from ..cost.schedule import RunGraph, makespan

pulp = lazy_module("pulp")

__all__ = ["add_run_rows", "run_start_values"]


def add_run_rows(lp: pulp.LpProblem, graph: RunGraph, durations: dict, Z: pulp.LpVariable,
                 deadline: Deadline | None = None) -> list:
    """Add one start-time variable per op of ``graph`` and the longest-path rows (module docstring).

    Parameters
    ----------
    lp
        The PuLP problem.
    graph
        The run's operations (:class:`pipeopt.cost.schedule.RunGraph`).
    durations
        ``{"F": [var per stage], "B": [...], "X": [var per cut], "Y": [...]}``: a
        ``pulp.LpVariable`` for the duration of each op kind and index (in the model's time unit).
    Z
        The iteration time variable (the caller makes it the objective).
    deadline
        Checked every 256 ops (:class:`~pipeopt.backends.deadline.DeadlineReached`).

    Returns
    -------
    list
        The start-time variables ``t``, one per op of ``graph.ops``.
    """
    deadline = Deadline(None) if deadline is None else deadline

    def row(terms, name):
        lp.addConstraint(pulp.LpConstraint(pulp.LpAffineExpression(terms, 0.0), pulp.LpConstraintLE), name)

    t = [pulp.LpVariable(f"t_{k}{i}_{j}", lowBound=0.0) for k, i, j in graph.ops]
    used = [False] * len(graph.ops)
    for q, after in enumerate(graph.after):
        if q % 256 == 0:
            deadline.check("building the event rows")
        for a in sorted(set(after)):  # an op may name one predecessor twice (lane and data)
            used[a] = True
            ka, ia, _ = graph.ops[a]
            row([(t[a], 1.0), (durations[ka][ia], 1.0), (t[q], -1.0)], f"dep_{q}_{a}")
    for q, (k, i, _) in enumerate(graph.ops):
        if not used[q]:
            row([(t[q], 1.0), (durations[k][i], 1.0), (Z, -1.0)], f"last_{q}")
    return t


def run_start_values(graph: RunGraph, t: list, Z: pulp.LpVariable, durations, unit: float) -> tuple[float, dict]:
    """The earliest start times when the ops last ``durations`` seconds (``ndarray`` over
    ``graph.ops``, :meth:`RunGraph.durations`), as a MIP start.

    Returns
    -------
    (total, values)
        The iteration time (seconds, the longest path) and ``{variable name: value}`` of the
        start times and of ``Z``, in the model's time ``unit`` (seconds per unit).
    """
    total, begin = makespan(graph, durations)
    values = {var.name: float(t0) / unit for var, t0 in zip(t, begin, strict=True)}
    values[Z.name] = total / unit
    return total, values
