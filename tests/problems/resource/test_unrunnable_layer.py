"""A layer whose only resource kind has 0 units on every device: no plan has a finite period.

Found by the cross-check (joint, HiGHS): the bisection probed at T = 1e-300 s and HiGHS refused
to read a model with coefficients of 1e297. Every exact method must say "infeasible" and why.
"""

import math

import networkx as nx
import pytest

import pipeopt
from pipeopt.errors import InfeasibleError


def _instance():
    g = nx.DiGraph()
    g.add_node("l0", fwd={"npu": 0.0020632272246346515}, bwd={"npu": 0.0018782344238712544},
               out_bytes=2937.52, act_bytes=2937.52, param_bytes=82.91)
    devices = tuple(pipeopt.Device(f"gpu{i}", {"npu": 0.0, "gpu": 2.8463243945321657}, 3020.43) for i in range(2))
    cluster = pipeopt.Cluster(devices, bandwidth=1e9)
    return pipeopt.Instance(g, cluster, pipeopt.Settings(overlap=True, weight_stashing=True, microbatches=7))


@pytest.mark.parametrize("method, solver", [("dp", None), ("cpsat", None), ("milp", "cbc"), ("milp", "highs")])
def test_joint_unrunnable_layer_is_infeasible_with_the_reason(method, solver):
    kw = {"solver": solver} if solver else {}
    with pytest.raises(InfeasibleError, match="0 units on every device"):
        pipeopt.solve(_instance(), problem="joint", method=method, time_limit=None, stages=1, **kw)


def test_every_plan_scores_infinite():
    inst = _instance()
    plan = pipeopt.Plan((pipeopt.Stage(("l0",), ("gpu0",)),))
    assert math.isinf(pipeopt.evaluate(inst, plan).objective)
