"""The tie-break every exact method shares: a second phase, its budget and its record.

Many plans often share the optimal primary objective (the bottleneck stage or window decides
it; the other cuts and shares are free within it), and they do not run equally well: a plan
whose last stage idles fills and drains the pipeline more slowly. So every exact method,
once its primary optimum is proven, runs a **second phase**: the least value of a documented
*secondary objective* over the plans whose primary value is at most the proven one (the
*cap*, with the relative slack :data:`CAP_REL` of float summation order). What the phase
minimises and how is the problem's (each the same for all exact methods of that problem):

* partition and Bi-Partition: the iteration time of M microbatches under 1F1B with a flush,
  by an event-time MILP (:mod:`pipeopt.problems.partition.tiebreak`,
  :mod:`pipeopt.problems.bipartition.tiebreak`); the partition's phase first lists the tied
  splits and scores them all on the run graph when they are few (an exact answer without a
  solver process);
* joint and group: the latency of one microbatch through the pipeline (the iteration time of
  M = 1), by an exact DP over the chain for each candidate worker assignment
  (:mod:`pipeopt.problems.resource.tiebreak`).

Peak memory is the next criterion in each, not optimised (the phase returns one of the plans
of least secondary value), and said so in the record.

This module holds what the phases share:

* the budget, which does **not** depend on the clock: a phase's work is limited by an amount
  that is the same on a quiet and on a loaded machine - :data:`SECONDARY_NODES` branch-and-bound
  nodes per solve of an event-time MILP, :data:`SECONDARY_WORK` table entries for the latency
  DP - so the same call returns the same plan on every run. A phase that ends at its work limit
  keeps the best tied plan it found and records ``proven=False`` (and why). The clock the phase
  runs on is the method's own (:func:`budget`: whatever the user's time limit leaves, not a
  share of it); if *that* stops the phase, the proven primary plan is returned unchanged with
  ``proven=False`` and ``stopped`` - the tie-break is then reported unfinished, never half
  done (an earlier version gave the phase a quarter of the clock, at most 1 s, and so returned
  another tied plan on a loaded machine: HiGHS, VGG-16, S = 4, 1 run in 4);
* the record ``info["secondary"]`` (:func:`open_record`, :func:`settle`), with the same keys
  in every problem;
* the guard (:func:`run`): a phase stopped by the deadline, or whose solver process crashed
  (CBC has segfaulted here), keeps the proven primary plan and records ``proven=False`` - the
  primary optimum is never lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from ..backends.deadline import Deadline, DeadlineReached
from ..cost.tolerance import SUM_ORDER

__all__ = ["CAP_REL", "SECONDARY_NODES", "SECONDARY_WORK", "budget", "open_record", "run", "settle"]

SECONDARY_NODES = 2000
"""Branch-and-bound nodes per solve of a second phase's MILP (the partition's and Bi-Partition's
event-time MILPs; :func:`pipeopt.backends.pulp.solve_pulp`'s ``node_limit``). A work limit, not
a time limit: with one thread and a fixed seed the solver's path to it is the same on every
run, so the plan returned does not depend on the machine's load. Whether the phase proved its
answer within it is in ``info["secondary"]["proven"]``."""

SECONDARY_WORK = 2 * 10**7
"""Most table entries the latency DP of the joint and group problems may touch
(:mod:`pipeopt.problems.resource.tiebreak`: stages x (count vector, worker) pairs x (n + 1)^2,
counted before it runs); above it the phase does not run and says so (``proven=False``).
Measured on a loaded 2-core machine at the loosest period: 8 SoCs in 4 classes, 30 layers,
S = 4 (3.5e6 entries) in 1.3 s; 16 SoCs in 5 classes, 20 layers, S = 4 (2.4e8) in 33 s."""

CAP_REL = SUM_ORDER
"""Relative slack of the cap: a plan ties with the proven one if its primary value is at most
``cap * (1 + CAP_REL)`` (plans tied on the primary objective differ by float summation order
only)."""

Plan = TypeVar("Plan")


def budget(deadline: Deadline) -> Deadline | None:
    """The second phase's clock: the method's own ``deadline`` (what the user's time limit
    leaves; the phase's work is bounded by :data:`SECONDARY_NODES` / :data:`SECONDARY_WORK`,
    not by a share of the clock); ``None`` if nothing is left."""
    left = deadline.remaining()
    if not left > 0:
        return None
    return deadline


def open_record(info: dict, objective: str, value: float, *, cap: float, evaluation=None) -> dict:
    """Start ``info["secondary"]`` for a phase about to run on the proven primary plan.

    Parameters
    ----------
    info
        The result's info dict (the record replaces any earlier one).
    objective
        What the phase minimises, in words (the problem's documented secondary objective).
    value
        The secondary value of the proven primary plan (seconds).
    cap
        The proven primary value (seconds): the phase admits plans of primary value at most
        ``cap * (1 + CAP_REL)``.
    evaluation
        :class:`pipeopt.cost.Evaluation` of the primary plan, or ``None``: its true iteration
        time of M microbatches (1F1B with a flush) and peak memory are recorded.

    Returns
    -------
    dict
        The record: ``objective``, ``value`` (of the plan returned), ``proven`` (False until
        the phase proves it), ``cap``, ``iteration_time``, ``peak_memory``; a phase adds
        ``bound``, ``status``, ``unique``, ``improved_from``, ``stopped``, ``error``, ``note``, and
        :func:`run` the phase's wall time ``seconds``.
    """
    record = {"objective": objective, "value": float(value), "proven": False, "cap": float(cap)}
    if evaluation is not None:
        _describe(record, evaluation)
    info["secondary"] = record
    return record


def _describe(record: dict, evaluation) -> None:
    record["iteration_time"] = float(evaluation.iteration_time)
    record["peak_memory"] = float(max(evaluation.memory, default=0.0))


def settle(record: dict, value: float, evaluation=None) -> None:
    """The phase returns another plan than the primary one: its secondary ``value`` (seconds)
    and, from its ``evaluation``, its iteration time and peak memory replace the primary
    plan's; ``improved_from`` keeps the primary plan's value."""
    if value != record["value"]:
        record.setdefault("improved_from", record["value"])
    record["value"] = float(value)
    if evaluation is not None:
        _describe(record, evaluation)


def run(phase: Callable[[Deadline, dict], Plan], keep: Plan, deadline: Deadline, record: dict) -> Plan:
    """Run ``phase(clock, record)`` on the second phase's :func:`budget` and return its plan.

    A phase returns the plan to report (``keep`` if nothing better) and sets
    ``record["proven"]``. If no time is left, or the phase raises
    :class:`~pipeopt.backends.deadline.DeadlineReached` (the clock ran out) or
    ``RuntimeError`` (the solver process crashed; :func:`pipeopt.backends.pulp.solve_pulp`
    raises it), or it returns unproven after the clock ran out (its solver stopped by the
    time limit rather than by its work limit), ``keep`` - the proven primary plan - is
    returned with ``proven=False`` and the reason in the record (``stopped`` or ``error``),
    and whatever the phase wrote into the record before it stopped is undone: a plan the
    clock chose is never reported.
    """
    clock = budget(deadline)
    if clock is None:
        record.update(proven=False, stopped="no time left for the second phase")
        return keep
    before = dict(record)
    started = time.perf_counter()
    try:
        out = phase(clock, record)
        if record.get("proven") or not clock.expired():
            record["seconds"] = time.perf_counter() - started
            return out
        why = {"stopped": "the method's time limit ended the second phase before its work limit"}
    except DeadlineReached as stop:
        why = {"stopped": str(stop)}
    except RuntimeError as exc:  # the solver process crashed: keep the proven plan
        why = {"error": f"{type(exc).__name__}: {exc}"[:200]}
    record.clear()
    record.update(before, proven=False, seconds=time.perf_counter() - started, **why)
    return keep
