"""Bi-Partition (Cui et al.): separate forward and backward cuts.

:class:`BipartitionProblem` poses the problem (``problem``); :data:`METHODS` lists its methods
(see :class:`pipeopt.problems.method.Method`): the exact MILP and bisection (``milp``, whose
rows are in ``model``), the greedy and same-cut baselines (``greedy``). Both exact methods
break ties among plans of optimal period by the least 1F1B-flush iteration time (``tiebreak``,
``info["secondary"]``).
"""

from __future__ import annotations

from ..method import Method
from . import greedy, milp
from .problem import BipartitionProblem as BipartitionProblem

PROBLEM = BipartitionProblem

METHODS = (
    Method("bipartition", "milp", milp.solve_milp, True, "bipartition", True,
           "MILP with separate forward and backward cuts (PuLP; CBC or HiGHS); Cui et al., Bi-Partition; "
           "ties: least 1F1B-flush iteration time"),
    Method("bipartition", "greedy", greedy.greedy, False, "bipartition", True,
           "local search from the best same-cut plan moving forward cuts, backward cuts and both together "
           "(pipeopt's reading of Cui et al., Bi-Partition)"),
    Method("bipartition", "same_cut", greedy.same_cut, False, "bipartition", True,
           "best plan with equal forward and backward cuts (exact partition DP)"),
    Method("bipartition", "bisection", milp.solve_bisection, True, "bipartition", True,
           "exact memory relaxation by bisection on T (a bound; optimal when its plan fits); ties: least "
           "1F1B-flush iteration time"),
)
