"""Bi-Partition (Cui et al.): separate forward and backward cuts.

:class:`BipartitionProblem` poses the problem; :data:`METHODS` lists its methods (see
:class:`pipeopt.problems.method.Method`).
"""

from __future__ import annotations

from ..method import Method
from . import greedy, milp
from .problem import BipartitionProblem as BipartitionProblem

PROBLEM = BipartitionProblem

METHODS = (
    Method("bipartition", "milp", milp.solve_milp, True, "bipartition", True,
           "MILP with separate forward and backward cuts (PuLP; CBC or HiGHS); Cui et al., Bi-Partition"),
    Method("bipartition", "greedy", greedy.greedy, False, "bipartition", True,
           "forward/backward cut mover from the best same-cut plan, after Cui et al., Bi-Partition"),
    Method("bipartition", "same_cut", greedy.same_cut, False, "bipartition", True,
           "best plan with equal forward and backward cuts (exact partition DP)"),
    Method("bipartition", "bisection", milp.solve_bisection, True, "bipartition", True,
           "exact memory relaxation by bisection on T (a bound; optimal when its plan fits)"),
)
