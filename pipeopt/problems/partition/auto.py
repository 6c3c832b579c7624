"""``auto``: the partition problem's default exact method, chosen per instance by one rule.

:func:`choose` names the exact method that proves the problem fastest at its size, and
:func:`solve_auto` runs it under the same clock. The rule (measured with
``benchmarks/partition_scale.py`` on synthetic chains of n = 10^2 .. 10^6 and on the nine
PipeDream profiles, S = 4 .. 1,024, both spaces):

1. objective ``"bottleneck"`` (the steady state; the default), with the dense DP's work
   ``w = (n + 1)^2 S`` (straight) or ``(n + 1)^2 S^2`` (replicated: a pass per replica count):

   * ``dp`` (the dense DP, :mod:`.dp`) when ``w <= AUTO_DP_WORK`` (10^5): short chains, where
     its few dense passes cost less than the search's start-up. On the nine PipeDream profiles
     (n = 22 .. 1,250 units, S = 4, 8, 16, both spaces; second phase off) this picks the DP
     on the five of at most 70 units (alexnet, vgg16, gnmt, squeezenet1_0, resnet18) straight
     and at S = 4 replicated, and on gnmt_large (93 units) straight at S <= 8, where both
     methods take 1-40 ms;
   * ``probe`` (:mod:`.probe`, the K-way search over exact frontier probes) otherwise: on the
     profiles with w > 10^5 it was 2-580 times faster than the DP (nasnetalarge S = 16
     replicated: 78 ms against 45 s); its memory grows with n, not n^2 (the dense DP refuses
     n >= 6,690 straight, :data:`.dp.DENSE_LIMIT`), and it proves n = 10^6, S = 1,024 in
     seconds (``benchmarks/partition_scale.py``).

   * ``dp`` when a tied parameter's gradient sums can differ between splits (one stage may hold
     two of its layers, :meth:`PartitionProblem.refuse_tie_sums`): the only bottleneck method
     that prices them (as long as its table fits);
   * ``dp`` whenever the problem's ``recompute`` is not ``"none"``: the method that chooses the
     recomputed layers exactly (:mod:`.recompute`; ``probe`` does not model them), and whenever
     the settings ask for data parallelism or ZeRO (``Settings.data_parallel``: the DP's stage
     terms hold them, :mod:`.dp`).
2. objective ``"iteration"`` or ``"gpipe"`` (M microbatches with a flush): ``milp``, the
   event-time MILP, the one exact method of these objectives (one-order space).

3. any other objective: ``milp`` too (it raises the problem's own error if it cannot).

The search space stays the problem's (``replication`` selects one-order or
replicated-one-order); ``auto`` never moves to the convex space of the ``convex`` method, which
answers another question on a DAG (on a chain graph the two spaces coincide, and ``probe`` is
faster). The result is the chosen method's: ``result.method`` is its name (``"probe"``,
``"dp"``, ``"milp"``) and ``info["chosen"]`` says ``{"by": "auto", "method": ..., "rule":
...}``.
"""

from __future__ import annotations

import dataclasses

from ...backends.deadline import Deadline
from ...result import Result
from .dp import DENSE_LIMIT, dense_bytes, solve_dp
from .problem import PartitionProblem

AUTO_DP_WORK = 1e5
"""The dense DP's work ``(n + 1)^2 S`` (replicated: ``(n + 1)^2 S^2``) up to which ``auto``
runs it instead of ``probe`` (bottleneck objective; module docstring)."""


def choose(problem: PartitionProblem) -> tuple[str, str]:
    """The exact method ``auto`` runs on ``problem`` and why (module docstring).

    Returns
    -------
    tuple[str, str]
        ``(method name, the rule that chose it)``, e.g. ``("probe", "bottleneck objective,
        dense DP work 1.02e+13 > 1e+05")``.
    """
    objective = problem.instance.settings.objective
    if problem.data_parallel:  # dp raises for another objective: no exact method models ZeRO there yet
        return "dp", "data parallelism / ZeRO (Settings.dp, zero, ratios): only the dense DP models them"
    if objective != "bottleneck":
        return "milp", f"objective {objective!r}: the event-time MILP is its exact method"
    n, S = problem.n, problem.stages
    if problem.recompute != "none":
        return "dp", f"recompute={problem.recompute!r}: the dense DP chooses the recomputed layers exactly"
    work = float(n + 1) ** 2 * S * (S if problem.replication else 1)
    if problem.replication and problem.latency:
        return "dp", "bottleneck objective, replication with a message latency: only the dense DP prices it"
    ties = problem.table.ties
    if ties and S >= 2 and ties.sums_bind(n, 1 if problem.replication else S) and dense_bytes(problem) <= DENSE_LIMIT:
        return "dp", ("bottleneck objective, a tied parameter's gradient sums (one stage may hold two of its "
                      "layers): the dense DP prices them")
    if work <= AUTO_DP_WORK and dense_bytes(problem) <= DENSE_LIMIT:
        return "dp", f"bottleneck objective, dense DP work {work:.3g} <= {AUTO_DP_WORK:.0e}"
    return "probe", f"bottleneck objective, dense DP work {work:.3g} > {AUTO_DP_WORK:.0e}"


def _milp(problem, **kw) -> Result:
    from .milp import solve_milp  # PuLP only where the MILP runs

    return solve_milp(problem, **kw)


def _probe(problem, **kw) -> Result:
    from .probe import solve_probe  # its frontier probes only where it runs

    return solve_probe(problem, **kw)


METHODS = {"dp": solve_dp, "probe": _probe, "milp": _milp}


def solve_auto(problem: PartitionProblem, *, time_limit: float | Deadline = 60.0, solver: str = "cbc",
               seed: int = 0, threads: int = 2) -> Result:
    """Solve the partition problem exactly with the method :func:`choose` names.

    Parameters
    ----------
    problem
        The partition problem (either space).
    time_limit, solver, seed, threads
        Passed on to the chosen method, under the one clock of the call.

    Returns
    -------
    Result
        The chosen method's result: ``method`` its name, ``info["chosen"]`` =
        ``{"by": "auto", "method": name, "rule": why}``.

    Raises
    ------
    InvalidProblemError, InfeasibleError
        As the chosen method raises them.
    """
    name, why = choose(problem)
    res = METHODS[name](problem, time_limit=Deadline.of(time_limit), solver=solver, seed=seed, threads=threads)
    info = dict(res.info)
    info["chosen"] = {"by": "auto", "method": name, "rule": why}
    return dataclasses.replace(res, info=info)
