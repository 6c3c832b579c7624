"""The placement problem (Tarnawski et al., NeurIPS 2020): a layer DAG on k accelerators and l
CPUs, one convex stage per device at most, minimising the max-load.

* :func:`solve_dp` -- exact over every convex ordered split: the DP over the ideals of the
  DAG (:mod:`.dp`, :mod:`pipeopt.problems.ideals`).
* :func:`solve_one_order` -- the same DP over the contiguous splits of one layer order (the
  restricted space, which its result names).
"""

from ..method import LATENCY, Method
from .dp import solve_dp, solve_one_order
from .milp import solve_milp
from .problem import PlacementProblem

PROBLEM = PlacementProblem

METHODS = (
    Method("placement", "dp", solve_dp, True, "convex", True,
           "DP over the ideals of the DAG (Tarnawski et al., NeurIPS 2020), pruned by the one-order optimum", terms=LATENCY),
    Method("placement", "milp", solve_milp, True, "convex", True,
           "MILP of the convex ordered slots (PuLP; cf. Tarnawski et al.'s throughput-ip/ip.py)", terms=LATENCY),
    Method("placement", "one_order", solve_one_order, True, "one-order", True,
           "the same DP over the prefixes of one layer order (contiguous splits of one order)", terms=LATENCY),
)

__all__ = ["METHODS", "PROBLEM", "PlacementProblem", "solve_dp", "solve_one_order"]
