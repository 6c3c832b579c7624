"""Tests of the partition baselines: binary search, PipeDream, uniform, parameter- and
time-balanced. Cross-checked against the exact DP of the same search space, against
hand-derived optima, against brute force in PipeDream's own cost model, and against the
numbers PipeDream's planner prints for VGG16."""

from __future__ import annotations

import math
import time

import networkx as nx
import numpy as np
import pytest
import brute_force as bf
import strategies
from conftest import PROFILE_DIR
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeopt.problems.partition import (
    binary_search,
    block_partition,
    block_parts,
    greedy_check,
    param_balanced,
    pipedream,
    pipedream_partition,
    spread_balanced_parts,
    time_balanced,
    uniform,
    uniform_parts,
)
from pipeopt.problems.partition.binary_search import plan_time
from pipeopt.backends.bisection import bisect_limit, bottleneck, complete_stages, greedy_starts
from pipeopt.cluster import Cluster
from pipeopt.cost import evaluate
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.instance import Instance
from pipeopt.io.pipedream import read_pipedream, read_pipedream_graph
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status

DATA = PROFILE_DIR
PROFILES = sorted(p for p in DATA.glob("*.txt") if p.name != "LICENSE.txt")
STRAIGHT = (binary_search, uniform, param_balanced, time_balanced)
REL = 1e-9


def chain_instance(work, out=None, act=None, param=None, *, bandwidth=1.0, memory=math.inf,
                   devices=None, overlap=True):
    """A chain of layers l0 -> l1 -> ... with forward times ``work`` (backward 0)."""
    return strategies.chain_instance(list(work), 0.0, out or 0.0, act or 0.0, param or 0.0, devices=devices,
                                     memory=memory, bandwidth=bandwidth, cast=float, overlap=overlap)


def assert_valid(problem, res, *, replicated=False):
    """The plan is scored by evaluate, uses exactly S workers and S stages (straight)."""
    assert res.plan is not None
    ev = evaluate(problem.instance, res.plan)  # raises InvalidPlanError if invalid
    assert res.objective == ev.objective
    assert res.lower_bound is None
    assert res.status in (Status.FEASIBLE, Status.INFEASIBLE)
    assert (res.status == Status.FEASIBLE) == ev.feasible
    if replicated:
        assert sum(s.replicas for s in res.plan.stages) == problem.stages
    else:
        assert res.plan.num_stages == problem.stages
        assert all(s.replicas == 1 for s in res.plan.stages)
    assert sorted(n for s in res.plan.stages for n in s.layers) == sorted(problem.instance.graph.nodes)


# ---------------------------------------------------------------------------------------
# PipeDream: its own printed predictions for VGG16 (docs/cost-model.md, "PipeDream's own cost model")
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vgg16_graph():
    return read_pipedream_graph(DATA / "vgg16.txt")


@pytest.mark.parametrize("machines, expected", [(4, 0.205520896), (8, 0.1038331703), (16, 0.0565297674)])
def test_pipedream_reproduces_its_vgg16_predictions(vgg16_graph, machines, expected):
    pd = pipedream_partition(vgg16_graph, machines, bandwidth=1e9, compression_ratio=1.0)
    assert pd.time_per_minibatch == pytest.approx(expected, rel=1e-9)
    assert sum(pd.replicas) == machines
    assert pd.state_space == "antichain"
    assert max(pd.stage_times) == pytest.approx(pd.time_per_minibatch, rel=1e-12)


def test_pipedream_vgg16_stage_structure(vgg16_graph):
    pd = pipedream_partition(vgg16_graph, 4, bandwidth=1e9)
    assert pd.replicas == (3, 1)
    assert pd.stages[0][0] == "node2" and pd.stages[0][-1] == "node18"
    assert pd.stages[1][0] == "node19" and pd.stages[1][-1] == "node41"
    assert "node1" in pd.removed  # the Input node is not planned over


def test_pipedream_fallback_equals_antichains_on_a_chain(vgg16_graph):
    # on a chain the antichains are the prefixes: the fallback state space must agree
    pd = pipedream_partition(vgg16_graph, 8, bandwidth=1e9, max_states=1)
    assert pd.state_space == "topological-order"
    assert pd.time_per_minibatch == pytest.approx(0.1038331703, rel=1e-9)


def test_pipedream_registry_records_its_own_prediction():
    inst = read_pipedream(DATA / "vgg16.txt", devices=4, bandwidth=1e9)
    problem = PartitionProblem(inst, 4, replication=True)
    res = pipedream(problem)
    assert_valid(problem, res, replicated=True)
    assert res.info["pipedream_predicted"] == pytest.approx(0.205520896, rel=1e-9)
    assert [s.replicas for s in res.plan.stages] == [3, 1]
    assert res.plan.stages[0].devices == ("gpu0", "gpu1", "gpu2")
    assert res.plan.stages[1].devices == ("gpu3",)
    assert res.info["contiguous"] and res.space == "replicated-one-order"
    # pipeopt's model charges the replicated stage a 2(m-1)/m all-reduce, PipeDream 4(m-1)/m:
    # the two predictions differ, and pipeopt's exact replicated DP is at least as good
    assert res.objective >= solve_dp(problem).objective * (1 - REL)


def test_pipedream_no_communication_without_compression_ratio(vgg16_graph):
    with_comm = pipedream_partition(vgg16_graph, 4, bandwidth=1e9, compression_ratio=1.0)
    without = pipedream_partition(vgg16_graph, 4, bandwidth=1e9, compression_ratio=None)
    assert without.time_per_minibatch <= with_comm.time_per_minibatch


def test_pipedream_bad_input(vgg16_graph):
    with pytest.raises(InvalidProblemError, match="machines"):
        pipedream_partition(vgg16_graph, 0)
    with pytest.raises(InvalidProblemError, match="bandwidth"):
        pipedream_partition(vgg16_graph, 2, bandwidth=0.0)
    with pytest.raises(InvalidProblemError, match="compression"):
        pipedream_partition(vgg16_graph, 2, compression_ratio=-1.0)


# ---------------------------------------------------------------------------------------
# PipeDream on a DAG: antichain states, augmented antichains, non-contiguous stages
# ---------------------------------------------------------------------------------------
def diamond():
    """a -> b -> d, a -> c -> d; compute a=1, b=1, c=4, d=3 s; replication made prohibitive.

    Antichain states: [a], [b], [c], [b, c], [d]. Two stages on 2 machines (B = 1e9, rho = 1):
      first = {a}:       max(1, 8)                                      = 8
      first = {a, b}:    max(2, 7, In = 2 (out_a + out_b) / B = 1)       = 7
      first = {a, c}:    max(5, 4, In = 2 (out_a + out_c) / B = 5)       = 5
      first = {a, b, c}: max(6, 1, In = 2 (out_b + out_c) / B = 4)       = 6
    Out of state [c] is its *augmented* antichain {a, c} (a still feeds b): In = 5, not 4.
    One stage on 2 replicas: (9 + 4 P_total / (2 B)) / 2, huge. Optimum 5, stages
    {a, c} | {b, d}: not contiguous in the layer order a, b, c, d.
    """
    g = nx.DiGraph()
    work = {"a": 1.0, "b": 1.0, "c": 4.0, "d": 3.0}
    out = {"a": 0.5e9, "b": 0.0, "c": 2e9, "d": 0.0}
    for n in "abcd":
        g.add_node(n, fwd={"gpu": work[n]}, bwd={"gpu": 0.0}, out_bytes=out[n], act_bytes=1.0,
                   param_bytes=1e10)
    g.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    return g


def test_pipedream_diamond_by_hand():
    pd = pipedream_partition(diamond(), 2, bandwidth=1e9)
    assert pd.time_per_minibatch == pytest.approx(5.0, rel=1e-12)
    assert pd.stage_times == pytest.approx((5.0, 5.0), rel=1e-12)
    assert pd.stages == (("a", "c"), ("b", "d"))
    assert pd.replicas == (1, 1)


def test_pipedream_noncontiguous_plan_is_valid_and_flagged():
    inst = Instance(diamond(), Cluster.homogeneous(2, bandwidth=1e9))
    res = pipedream(PartitionProblem(inst, 2, replication=True))
    assert_valid(PartitionProblem(inst, 2, replication=True), res, replicated=True)
    assert res.info["contiguous"] is False
    assert res.space == "replicated-convex"
    assert res.plan.layer_lists() == [["a", "c"], ["b", "d"]]


# ---------------------------------------------------------------------------------------
# PipeDream's DP = brute force in its own cost model (chains)
# ---------------------------------------------------------------------------------------
def pipedream_brute_force(work, out, act, param, N, B, memory=None):
    """min over every split into runs and every replica vector of PipeDream's time (docs/cost-model.md)."""
    n = len(work)
    best = math.inf
    for k in range(1, min(n, N) + 1):
        for bounds in bf.splits(n, k):
            for reps in bf.compositions(N, k):  # replica counts, each >= 1, adding up to N
                worst, used = 0.0, 0
                for s, r in enumerate(reps):
                    a, b = bounds[s], bounds[s + 1]
                    C, P, A = sum(work[a:b]), sum(param[a:b]), sum(act[a:b])
                    used += r
                    if memory is not None and math.ceil((N - used) / r) * (A + P) > memory:
                        worst = math.inf
                        break
                    t = (C + 4 * (r - 1) * P / (B * r)) / r
                    if s > 0:
                        t = max(t, 2 * out[a - 1] / (B * r))
                    if 0 < s < k - 1:
                        t = max(t, 2 * out[b - 1] / (B * r))
                    worst = max(worst, t)
                best = min(best, worst)
    return best


pos = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(st.tuples(pos, pos, pos, pos), min_size=1, max_size=6),
    N=st.integers(1, 4),
    mem=st.one_of(st.none(), st.floats(1.0, 40.0)),
)
def test_pipedream_dp_equals_brute_force_in_its_own_model(data, N, mem):
    work, out, act, param = (list(x) for x in zip(*data, strict=True))
    inst = chain_instance(work, out, act, param)
    pd = pipedream_partition(inst.graph, N, bandwidth=2.0, memory=mem)
    brute = pipedream_brute_force(work, out, act, param, N, 2.0, mem)
    if math.isinf(brute):
        assert math.isinf(pd.time_per_minibatch)
    else:
        assert pd.time_per_minibatch == pytest.approx(brute, rel=1e-12, abs=1e-12)
        assert sum(pd.replicas) == N
        assert max(pd.stage_times) == pytest.approx(pd.time_per_minibatch, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------
# Hand-derived small cases for the straight baselines
# ---------------------------------------------------------------------------------------
def test_uniform_six_units_three_stages():
    inst = chain_instance([1, 2, 3, 4, 5, 6])
    res = uniform(PartitionProblem(inst, 3))
    assert res.plan.layer_lists() == [["l0", "l1"], ["l2", "l3"], ["l4", "l5"]]
    assert res.objective == pytest.approx(11.0)  # stage times 3, 7, 11 (no communication)
    assert_valid(PartitionProblem(inst, 3), res)


def test_uniform_remainder_goes_to_the_first_stages():
    assert uniform_parts(7, 3) == [0, 3, 5, 7]  # DeepSpeed partition_uniform
    assert uniform_parts(3, 3) == [0, 1, 2, 3]
    with pytest.raises(InvalidProblemError):
        uniform_parts(2, 3)


def test_binary_search_four_layer_chain_by_hand():
    # works 3, 1, 1, 3 s; cuts after l0, l1, l2 carry 0.5, 3, 0.5 bytes at 1 byte/s: one way
    # 0.5, 3, 0.5 s (full duplex), a round trip 1, 6, 1 s. Two stages, period = max(own terms,
    # window row (tau0 + tau1 + round trip) / 2):
    #   {l0} | {l1 l2 l3}: max(3, 5, 0.5, 9/2) = 5;  {l0 l1} | {l2 l3}: max(4, 4, 3, 14/2) = 7;
    #   {l0 l1 l2} | {l3}: max(5, 3, 0.5, 9/2) = 5.  Optimum 5 (the balanced middle cut is too dear).
    inst = chain_instance([3, 1, 1, 3], out=[0.5, 3.0, 0.5, 0.0])
    p = PartitionProblem(inst, 2)
    assert solve_dp(p).objective == pytest.approx(5.0, rel=1e-12)
    # Duan & Wu's check knows each stage's and cut's own time, not the window rows: it accepts
    # the middle cut at T = 4, which runs at 7 s (the heuristic's gap is real)
    assert greedy_check(p, 4.0) == [2] and greedy_check(p, 3.999) is None
    res = binary_search(p)
    assert_valid(p, res)
    assert res.objective == pytest.approx(7.0, rel=1e-12)
    # without communication the middle cut wins: max(4, 4) = 4
    free = PartitionProblem(chain_instance([3, 1, 1, 3]), 2)
    assert binary_search(free).objective == pytest.approx(4.0, rel=1e-12)


def test_binary_search_memory_by_hand():
    # works 3, 1, 1, 3; 1 activation byte per layer, memory 4.5 bytes. Stage 0 keeps 2
    # microbatches (at most 2 layers), stage 1 keeps 1: {l0 l1} | {l2 l3} = 4 fits; optimum 4.
    inst = chain_instance([3, 1, 1, 3], act=[1, 1, 1, 1], memory=4.5)
    p = PartitionProblem(inst, 2)
    res = binary_search(p)
    assert res.status == Status.FEASIBLE
    assert res.objective == pytest.approx(4.0, rel=1e-12)
    # memory 1.5: stage 0 can hold no layer at all (2 x 1 byte > 1.5): nothing fits
    tight = PartitionProblem(chain_instance([3, 1, 1, 3], act=[1, 1, 1, 1], memory=1.5), 2)
    with pytest.raises(InfeasibleError):
        solve_dp(tight)
    res = binary_search(tight)
    assert res.status == Status.INFEASIBLE and res.info["memory_fit"] is False
    assert res.plan.num_stages == 2


def test_binary_search_splits_to_exactly_s_stages():
    # one heavy layer: the greedy needs 2 stages at the optimum 10, the plan must still have 4
    inst = chain_instance([10, 1, 1, 1, 1])
    p = PartitionProblem(inst, 4)
    res = binary_search(p)
    assert_valid(p, res)
    assert res.info["greedy_stages"] == 2
    assert res.objective == pytest.approx(10.0)


def _sum_stage_time(work, speeds=None):
    """stage_time(t, a, b) = work of units a..b-1 / speed of position t (no cuts, no memory)."""
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    speeds = speeds or [1.0] * len(work)
    return lambda t, a, b: (prefix[np.asarray(b)] - prefix[np.asarray(a)]) / speeds[t]


@pytest.mark.parametrize("seed", range(6))
def test_bisection_core_is_exact_on_monotone_stage_times(seed):
    """Without transfers and memory the greedy check is exact: bisection + completion reach
    the brute-force min-max partition."""
    rng = np.random.default_rng(seed)
    n, S = int(rng.integers(5, 10)), int(rng.integers(2, 5))
    work = rng.uniform(0.1, 3.0, n)
    stage_time = _sum_stage_time(work)
    best = min(bottleneck(n, stage_time, c) for c in strategies.compositions(n, S))
    lo, hi = max(work.sum() / S, work.max()), work.sum()
    found = bisect_limit(lambda T: greedy_starts(n, S, stage_time, T), lo, hi, [], rel_tol=1e-12)
    assert best <= found.limit * (1 + 1e-12) and found.limit <= best * (1 + 1e-9)
    starts = complete_stages(n, S, stage_time, found.starts)
    assert len(starts) == S - 1
    assert bottleneck(n, stage_time, starts) == pytest.approx(best, rel=1e-9)
    for insert in ("within", "shift"):  # both completions keep the optimum here
        assert bottleneck(n, stage_time, complete_stages(n, S, stage_time, found.starts, insert=insert)) \
            == pytest.approx(best, rel=1e-9)


def test_complete_stages_within_and_shift_differ_on_unequal_workers():
    # works 1 1 1 1, plan [0,2) [2,4) on positions 0, 1; a third worker at position 2 is 4x
    # slower. "within" splits stage 0 (halves 1, 1) but stage [2,4) then moves to the slow
    # worker (time 8); "shift" sees it and splits stage 1: [0,2) [2,3) [3,4) = 2, 1, 4.
    stage_time = _sum_stage_time([1.0, 1.0, 1.0, 1.0], speeds=[1.0, 1.0, 0.25])
    assert complete_stages(4, 3, stage_time, [2], insert="within") == [1, 2]
    assert complete_stages(4, 3, stage_time, [2], insert="shift") == [2, 3]
    assert bottleneck(4, stage_time, [1, 2]) == 8.0 and bottleneck(4, stage_time, [2, 3]) == 4.0
    with pytest.raises(InvalidProblemError, match="insert"):
        complete_stages(4, 3, stage_time, [2], insert="anywhere")


@pytest.mark.parametrize("seed", range(4))
def test_complete_stages_one_cut_against_enumeration(seed):
    """One missing stage: "shift" adds the cut of least plan bottleneck, "within" the cut of
    least two-halves time (both checked by enumerating every cut); shift is never worse."""
    rng = np.random.default_rng(seed)
    n, S = 8, 4
    inst = chain_instance(rng.uniform(0.5, 2.0, n).tolist(), out=rng.uniform(0.0, 2.0, n).tolist(),
                          act=[1.0] * n, memory=9.0)
    p = PartitionProblem(inst, S)
    stage_time = lambda t, a, b: p.stage_time(a, b, in_flight=S - t)
    starts = sorted(rng.choice(np.arange(1, n), S - 2, replace=False).tolist())
    bounds = [0, *starts, n]
    free = [c for c in range(1, n) if c not in starts]
    shift = complete_stages(n, S, stage_time, starts, insert="shift")
    assert bottleneck(n, stage_time, shift) == min(bottleneck(n, stage_time, sorted([*starts, c])) for c in free)

    def halves(c):
        t = max(i for i in range(len(bounds) - 1) if bounds[i] < c)
        return max(float(stage_time(t, bounds[t], c)), float(stage_time(t + 1, c, bounds[t + 1])))

    within = complete_stages(n, S, stage_time, starts, insert="within")
    (c,) = set(within) - set(starts)
    assert halves(c) == min(halves(d) for d in free)
    assert bottleneck(n, stage_time, shift) <= bottleneck(n, stage_time, within)


def test_bisect_limit_driver():
    def check(T):
        return [T] if T >= 3.7 else None  # accepts every limit from 3.7 up

    found = bisect_limit(check, 0.0, 10.0, [10.0], rel_tol=1e-9)
    assert 3.7 <= found.limit <= 3.7 * (1 + 2e-9) and found.starts == [found.limit]
    assert 25 <= found.iterations <= 40
    assert bisect_limit(check, 4.0, 10.0, [10.0]) == (([4.0]), 4.0, 0)  # lo passes: closed at lo
    capped = bisect_limit(check, 0.0, 10.0, [10.0], max_iter=3)  # mids 5, 2.5, 3.75
    assert capped == ([3.75], 3.75, 3)
    late = bisect_limit(check, 0.0, 10.0, [10.0], deadline=time.perf_counter() - 1.0)
    assert late == ([10.0], 10.0, 0)  # past the deadline: the given plan at hi
    # with a score the best-scoring accepted plan is kept, not the last one
    scored = bisect_limit(check, 0.0, 10.0, [10.0], score=lambda st: (st[0] - 6.0) ** 2)
    assert scored.starts == [5.0] and scored.limit < 3.7 * (1 + 2e-9)


def test_greedy_bound_scan_equals_vectorised_scan_on_a_resource_problem():
    """The resource adapter's early-stopping scan (bound = compute and memory) accepts the
    same plans as the full vectorised scan, and its stage time is the problem's."""
    from pipeopt.problems.resource.problem import WorkerStages
    from pipeopt.problems.resource import JointProblem
    from pipeopt.problems.resource.examples import soc_instance

    p = JointProblem(soc_instance(12, 4, seed=5, heterogeneous=False, memory=6e7, bandwidth=2e7), 4)
    for mode in ("split", "sequential"):
        ws = WorkerStages(p, p.groups, mode)
        for t, a, b in [(0, 0, 3), (1, 3, 7), (3, 9, 12), (2, 0, 12)]:
            assert float(ws.time(t, a, b)) == p.stage_time(a, b, p.groups[t], t, mode)
        top = bottleneck(p.n, ws.time, greedy_starts(p.n, 4, ws.time, math.inf, bound=ws.fit))
        assert 0 < top < math.inf
        for T in np.linspace(0.0, 1.5 * top, 25).tolist() + [math.inf]:
            assert greedy_starts(p.n, 4, ws.time, T, bound=ws.fit) == greedy_starts(p.n, 4, ws.time, T)


def test_param_balanced_minimises_the_spread_like_deepspeed():
    # split 4 1 1 | 1 1 4: both 6, spread 0
    assert spread_balanced_parts([4, 1, 1, 1, 1, 4], 2) == [0, 3, 6]
    # 1 | 0 1 and 1 0 | 1 have the same spread: DeepSpeed keeps the latest cut
    assert spread_balanced_parts([1, 0, 1], 2) == [0, 2, 3]
    inst = chain_instance([1, 1, 1, 1, 1, 1], param=[4, 1, 1, 1, 1, 4])
    res = param_balanced(PartitionProblem(inst, 2))
    assert res.plan.layer_lists() == [["l0", "l1", "l2"], ["l3", "l4", "l5"]]
    assert res.info["stage_param_bytes"] == [6.0, 6.0]


def test_time_balanced_matches_torchgpipe_examples():
    # torchgpipe's own tests: solve([1..6], 2) == [[1, 2, 3, 4], [5, 6]], solve([0, 0], 2)
    assert block_parts([1, 2, 3, 4, 5, 6], 2) == [0, 4, 6]
    assert block_parts([0, 0], 2) == [0, 1, 2]
    # by hand, 3 blocks of the normalised 0 .2 .4 .6 .8 1, in floats as torchgpipe adds them:
    # start [0 .2] [.4 .6] [.8 1] (.2, 1, 1.8), heaviest p = 3rd; move .4 to the 1st:
    # (.6000000000000001, .6, 1.8): the lightest is now the 2nd (exactly .6), so move .8 into
    # it: (.6, 1.4, 1) and p's neighbour moved: restart; 1.4 <= .6 + 1: stop
    assert block_parts([1, 2, 3, 4, 5, 6], 3) == [0, 3, 5, 6]  # [[1, 2, 3], [4, 5], [6]]
    inst = chain_instance([1, 2, 3, 4, 5, 6])
    res = time_balanced(PartitionProblem(inst, 2))
    assert res.plan.layer_lists() == [["l0", "l1", "l2", "l3"], ["l4", "l5"]]
    assert res.objective == pytest.approx(11.0)
    with pytest.raises(InvalidProblemError, match="times"):
        time_balanced(PartitionProblem(inst, 2), times="memory")


def test_time_balanced_where_torchgpipe_never_stops():
    # normalised 0 0 0 0 .2 1 in 5 blocks: the moves push a boundary past the end of the
    # sequence (torchgpipe's loop would run on forever); the plan is repaired to 5 stages
    bounds, converged = block_partition([0, 0, 0, 0, 1, 5], 5)
    assert not converged and max(bounds) > 6
    p = PartitionProblem(chain_instance([0, 0, 0, 0, 1, 5]), 5)
    res = time_balanced(p)
    assert_valid(p, res)
    assert res.info["converged"] is False and res.info["repaired_empty_stages"] is True


def test_time_balanced_repairs_an_empty_block():
    # normalised weights 0 0 1 .1 0 start as blocks [0] [0] [1 .1 0]; the moves towards the
    # lightest block empty the middle one (torchgpipe would return a balance with a 0)
    weights = [0, 0, 10, 1, 0]
    assert block_parts(weights, 3) == [0, 3, 3, 5]
    p = PartitionProblem(chain_instance(weights), 3)
    res = time_balanced(p)
    assert_valid(p, res)
    assert res.info["repaired_empty_stages"] is True
    # the repair splits the cheapest way: {l0 l1 l2} stays, {l3 l4} becomes {l3} | {l4}
    assert res.plan.layer_lists() == [["l0", "l1", "l2"], ["l3"], ["l4"]]
    assert res.objective == pytest.approx(10.0)


# ---------------------------------------------------------------------------------------
# Every profile, S in {2, 4, 8}: valid plans, >= the exact optimum of the same space
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=PROFILES, ids=lambda p: p.stem)
def profile(request):
    return read_pipedream(request.param, devices=8)


@pytest.mark.parametrize("S", [2, 4, 8])
def test_baselines_on_every_profile(profile, S):
    straight = PartitionProblem(profile, S)
    opt = solve_dp(straight).objective
    for fn in STRAIGHT:
        res = fn(straight)
        assert_valid(straight, res)
        assert res.space == "one-order"
        assert res.objective >= opt * (1 - REL), fn.__name__
        if fn is binary_search:
            own = plan_time(straight, straight.starts_of(res.plan))  # its stage time = evaluate's
            assert own == pytest.approx(res.objective, rel=1e-12)
    replicated = PartitionProblem(profile, S, replication=True)
    res = pipedream(replicated)
    assert_valid(replicated, res, replicated=True)
    assert math.isfinite(res.info["pipedream_predicted"])
    if res.info["contiguous"]:
        assert res.space == "replicated-one-order"
        assert res.objective >= solve_dp(replicated).objective * (1 - REL)
    else:
        assert res.space == "replicated-convex"


def test_pipedream_state_spaces():
    # ResNet's antichain DAG is small; Inception-v3's explodes and falls back (documented)
    assert pipedream_partition(read_pipedream_graph(DATA / "resnet18.txt"), 4).state_space == "antichain"
    inception = read_pipedream_graph(DATA / "inception_v3.txt")
    assert pipedream_partition(inception, 4).state_space == "topological-order"


def test_pipedream_places_inputs_and_getitem_sinks():
    g = read_pipedream_graph(DATA / "gnmt.txt")
    pd = pipedream_partition(g, 4)
    assert {"node1", "node2", "node3"} <= set(pd.removed)  # Input0..2
    assert any(g.nodes[n]["op"].startswith("__getitem__") for n in pd.removed)
    inst = read_pipedream(DATA / "gnmt.txt", devices=4)
    res = pipedream(PartitionProblem(inst, 4, replication=True))
    assert_valid(PartitionProblem(inst, 4, replication=True), res, replicated=True)
    assert {"node1", "node2", "node3"} <= set(res.plan.stages[0].layers)


# ---------------------------------------------------------------------------------------
# Random chains: every baseline >= the DP of its space, exactly S stages
# ---------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.lists(st.tuples(pos, pos, pos, pos), min_size=1, max_size=9),
    S=st.integers(1, 4),
    bandwidth=st.floats(0.5, 20.0),
    memory=st.one_of(st.just(math.inf), st.floats(5.0, 80.0)),
    overlap=st.booleans(),
)
def test_random_chains_baselines_at_least_dp(data, S, bandwidth, memory, overlap):
    work, out, act, param = (list(x) for x in zip(*data, strict=True))
    S = min(S, len(work))
    inst = chain_instance(work, out, act, param, bandwidth=bandwidth, memory=memory, devices=4,
                          overlap=overlap)
    straight = PartitionProblem(inst, S)
    try:
        opt = solve_dp(straight).objective
    except InfeasibleError:
        opt = None
    for fn in STRAIGHT:
        res = fn(straight)
        assert_valid(straight, res)
        if opt is None:
            assert res.status == Status.INFEASIBLE, fn.__name__
        elif res.status == Status.FEASIBLE:
            assert res.objective >= opt * (1 - REL) - 1e-12, fn.__name__
    replicated = PartitionProblem(inst, S, replication=True)
    res = pipedream(replicated)
    assert_valid(replicated, res, replicated=True)
    assert res.info["contiguous"]  # a chain: every PipeDream stage is a run of layers
    try:
        ropt = solve_dp(replicated).objective
    except InfeasibleError:
        assert res.status == Status.INFEASIBLE
    else:
        if res.status == Status.FEASIBLE:
            assert res.objective >= ropt * (1 - REL) - 1e-12


def test_replicated_dp_when_memory_leaves_no_prefix():
    # found by the random-chain test: layer l0 has 6 parameter bytes, memory 5 bytes: no plan
    # fits; the replicated DP must say so with InfeasibleError, and PipeDream's plan is INFEASIBLE
    inst = chain_instance([0, 0], param=[6, 0], memory=5.0, bandwidth=1.0, devices=4, overlap=False)
    problem = PartitionProblem(inst, 2, replication=True)
    assert pipedream(problem).status == Status.INFEASIBLE
    with pytest.raises(InfeasibleError):
        solve_dp(problem)


@st.composite
def random_dags(draw):
    """Small DAGs over l0..l{n-1} with edges i -> j (i < j), maybe in several components."""
    n = draw(st.integers(2, 7))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=12))
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(f"l{i}", fwd={"gpu": draw(pos)}, bwd={"gpu": draw(pos)}, out_bytes=draw(pos),
                   act_bytes=draw(pos), param_bytes=draw(pos))
    g.add_edges_from((f"l{a}", f"l{b}") for a, b in edges if a < b)
    return g


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=random_dags(), S=st.integers(1, 4), bandwidth=st.floats(0.5, 20.0))
def test_random_dags_baselines_valid_and_at_least_dp(graph, S, bandwidth):
    inst = Instance(graph, Cluster.homogeneous(4, bandwidth=bandwidth))
    S = min(S, inst.chain.n)
    straight = PartitionProblem(inst, S)
    opt = solve_dp(straight).objective
    for fn in STRAIGHT:
        res = fn(straight)
        assert_valid(straight, res)
        assert res.objective >= opt * (1 - REL) - 1e-12, fn.__name__
    replicated = PartitionProblem(inst, S, replication=True)
    res = pipedream(replicated)
    assert_valid(replicated, res, replicated=True)  # precedence-respecting, every layer once
    if res.info["contiguous"]:
        assert res.objective >= solve_dp(replicated).objective * (1 - REL) - 1e-12
    else:
        assert res.space == "replicated-convex"
