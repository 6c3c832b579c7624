"""The two recomputation baselines of issue 25 beyond the frameworks' settings: "no recompute,
more stages" (the exact no-recompute plan on the fewest stages that fit) and AdaPipe's
per-stage knapsack with its computation-balancing split, against the exact DP and brute force
over splits on small zoo-style chains."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest

from pipeopt import PartitionProblem, evaluate, solve
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition import recompute_baselines as rb
from pipeopt.problems.partition import solve_dp
from pipeopt.result import Status

sys.path.insert(0, str(Path(__file__).parent))
from test_recompute_baselines import problem, zoo_style  # noqa: E402


def heavy(layers=8):
    """zoo_style with parameters heavy enough that more stages make a split fit."""
    g = zoo_style(layers)
    for _, d in g.nodes(data=True):
        d["param_bytes"] = 2e5
    return g


@pytest.mark.parametrize("S, memory", [(2, 1e6), (2, 8e5), (3, 1.2e6), (2, 5e5), (4, math.inf)])
def test_more_stages_is_the_fewest_stages_that_fit(S, memory):
    g = heavy()
    p = problem(g, S, memory)
    r = rb.no_recompute_more_stages(p)
    fits = []
    for count in range(S, p.n + 1):
        try:
            solve_dp(PartitionProblem(rb.with_devices(p.instance, count), count), time_limit=None)
            fits.append(count)
            break
        except InfeasibleError:
            continue
    if not fits:
        assert r.status == Status.INFEASIBLE and r.plan is None and "no split fits" in r.info["note"]
        assert r.info["tried"] == list(range(S, p.n + 1))
        from pipeopt.problems.partition.dp import least_overshoot

        assert sorted(r.info["misses"]) == r.info["tried"] and min(r.info["misses"].values()) > 0
        assert r.info["misses"][S] == least_overshoot(p)[0]
        return
    count = fits[0]
    grown = rb.with_devices(p.instance, count)
    exact = solve_dp(PartitionProblem(grown, count), time_limit=None)
    assert r.status == Status.FEASIBLE and r.info["stages"] == count == r.plan.num_stages
    assert r.info["tried"] == list(range(S, count))
    ev = evaluate(grown, r.plan)
    assert ev.feasible and r.objective == ev.objective and math.isclose(r.objective, exact.objective, rel_tol=1e-12)
    assert not any(st.recompute for st in r.plan.stages)
    assert r.info["devices"] == count and r.info["added_devices"] == count - S
    assert math.isclose(r.info["per_device"], r.objective * count / S, rel_tol=1e-12)
    if count == S:
        assert r.objective == rb.no_recompute(p).objective


def test_with_devices_copies_the_first_device():
    p = problem(heavy(), 2, 1e6)
    grown = rb.with_devices(p.instance, 5)
    devs = grown.cluster.devices
    assert len(devs) == 5 and devs[:2] == p.instance.cluster.devices
    assert {d.memory for d in devs} == {1e6} and len({d.name for d in devs}) == 5
    assert rb.with_devices(p.instance, 2) is p.instance


def brute_adapipe(p: PartitionProblem) -> float:
    """AdaPipe's objective by brute force over every split: the least largest stage computation
    (forward + backward + the stage's least recompute seconds that fit)."""
    auto = PartitionProblem(p.instance, p.stages, recompute="auto")
    best = math.inf
    for starts in itertools.combinations(range(1, p.n), p.stages - 1):
        rc = auto.stage_recompute(list(starts))
        bounds = [0, *starts, p.n]
        comp = max(auto.work_prefix[b] - auto.work_prefix[a] + x
                   for a, b, (x, _) in zip(bounds, bounds[1:], rc))
        best = min(best, comp)
    return best


@pytest.mark.parametrize("memory", [1.2e5, 1.5e5, 2e5, 3e5, math.inf])
@pytest.mark.parametrize("bandwidth", [math.inf, 1e6])
def test_adapipe_is_its_min_max_over_splits_and_the_exact_dp_when_transfers_are_free(memory, bandwidth):
    from pipeopt.cluster import Cluster
    from pipeopt.instance import Instance

    g = zoo_style(6)
    S = 3
    p = PartitionProblem(Instance(g, Cluster.homogeneous(S, memory=memory, bandwidth=bandwidth)), S)
    r = rb.adapipe(p)
    want = brute_adapipe(p)
    if not math.isfinite(want):
        assert r.status == Status.INFEASIBLE and r.plan is None
        with pytest.raises(InfeasibleError):
            solve_dp(PartitionProblem(p.instance, S, recompute="auto"), time_limit=None)
        return
    assert math.isclose(r.info["computation"], want, rel_tol=1e-12)
    ev = evaluate(p.instance, r.plan)
    assert ev.feasible and r.objective == ev.objective and r.status == Status.FEASIBLE and r.lower_bound is None
    exact = solve_dp(PartitionProblem(p.instance, S, recompute="auto"), time_limit=None)
    assert r.objective >= exact.objective * (1 - 1e-12)  # a heuristic: never below the proven optimum
    if bandwidth == math.inf:  # no transfers: AdaPipe's objective is the exact DP's, the same optimum
        assert math.isclose(r.objective, exact.objective, rel_tol=1e-12)


def test_adapipe_misses_what_its_objective_leaves_out():
    """With transfers that dominate, balancing computation alone cuts where a large tensor
    crosses: the exact DP (which prices the cut) is strictly faster."""
    from pipeopt.cluster import Cluster
    from pipeopt.instance import Instance

    g = zoo_style(6)
    for u, v in g.edges:
        g.nodes[u]["out_bytes"] = 1e3 if u.endswith("_mlp") else 5e6  # only after a block is a cut cheap
    p = PartitionProblem(Instance(g, Cluster.homogeneous(4, bandwidth=1e9)), 4)
    r = rb.adapipe(p)
    exact = solve_dp(PartitionProblem(p.instance, 4, recompute="auto"), time_limit=None)
    assert r.objective > exact.objective * (1 + 1e-6)


def test_adapipe_refuses_replication_and_runs_through_solve():
    p = PartitionProblem(problem(zoo_style(6), 3, 2e5).instance, 3, replication=True)
    with pytest.raises(InvalidProblemError, match="one device per stage"):
        rb.adapipe(p)
    r = solve(p.instance, stages=3, method="adapipe")
    assert r.method == "adapipe" and any(st.recompute for st in r.plan.stages)


def test_adapipe_reaches_the_exact_optimum_on_the_shipped_gpt3():
    """On the shipped GPT-3 6.7B (8 A100 40 GB) the transfers do not decide the bottleneck:
    AdaPipe's plan is the exact DP's optimum (benchmarks/recompute.py shows all six instances)."""
    from pipeopt.io.native import read_instance

    inst = read_instance(Path(__file__).resolve().parents[3] / "instances" / "memory" / "gpt3-6.7b-a100-40gb-x8.json")
    r = rb.adapipe(PartitionProblem(inst, 8))
    exact = solve_dp(PartitionProblem(inst, 8, recompute="auto"), time_limit=None)
    assert exact.status == Status.OPTIMAL and any(st.recompute for st in r.plan.stages)
    assert math.isclose(r.objective, exact.objective, rel_tol=1e-12)
