"""Exact joint and group methods against brute force (pipeopt.problems.resource.brute_force) on
small random instances: non-integral byte counts everywhere, memory binding at exactly the
capacity, memory that nothing fits, S = 1 and S = n, tight bandwidth; plus the search's own
mechanisms (no feasible start, certification of a solver's plan)."""

from __future__ import annotations

import math
import random

import pytest
from strategies import resource_splits

import pipeopt
from pipeopt.backends.bisection import FEASIBLE, INFEASIBLE, Probe
from pipeopt.backends.deadline import Deadline
from pipeopt.problems.resource import GroupProblem, JointProblem, brute_force, group, joint
from pipeopt.problems.resource.bounds import lower_bound, top_limit
from pipeopt.problems.resource.examples import random_chain
from pipeopt.problems.resource.formulation import MilpProbe
from pipeopt.problems.resource.intervals import IntervalProbe
from pipeopt.problems.resource.search import MIN_REL_GAP, certify, exact_search

KINDS = ("cpu", "gpu", "npu")
PROFILES = ({"cpu": 2.0, "gpu": 1.0, "npu": 1.0}, {"cpu": 4.0, "gpu": 2.0}, {"cpu": 1.0, "gpu": 4.0, "npu": 2.0},
            {"gpu": 3.0, "npu": 3.0}, {"cpu": 3.0, "gpu": 0.5})


def _stage_memories(problem, starts, groups) -> list[float]:
    bounds = [0, *starts, problem.n]
    return [problem.stage_memory(bounds[s], bounds[s + 1], s) for s in range(len(groups))]


def build(problem_name: str, seed: int, n: int, size: str, memory: str, bandwidth: str, devices: int = 3):
    """A small random joint or group problem (``size``: ``"one"`` S = 1, ``"all"`` S = n (or the
    devices), ``"mid"``; ``memory``: ``"inf"``, ``"exact"`` - the capacity equals the largest
    stage memory of a random plan, so that plan fits exactly -, ``"none"`` - just below what the
    leanest plan needs; ``bandwidth``: ``"fast"`` or ``"tight"`` - a cut costs about a stage)."""
    rng = random.Random(f"{problem_name}-{seed}")
    graph = random_chain(n, KINDS, seed=seed, act_bytes=rng.uniform(1e5, 1e7) + 0.37, param_bytes=rng.uniform(1e5, 1e7))
    joint_p = problem_name == "joint"
    top = n if joint_p else min(n, devices)
    S = 1 if size == "one" else top if size == "all" else rng.randint(1, top)
    count = S if joint_p else devices
    res = [dict(PROFILES[0])] * count if joint_p else [dict(rng.choice(PROFILES)) for _ in range(count)]
    work = sum(min(graph.nodes[v]["fwd"][k] + graph.nodes[v]["bwd"][k] for k in KINDS) for v in graph.nodes)
    bw = 1e13 if bandwidth == "fast" else 2e6 / (work / max(S, 1))
    make = (lambda inst: JointProblem(inst, S)) if joint_p else (lambda inst: GroupProblem(inst, S))
    free = make(pipeopt.Instance(graph, pipeopt.Cluster(tuple(pipeopt.Device(f"d{i}", r) for i, r in enumerate(res)), bw)))
    mem = [math.inf] * count
    if memory == "exact":  # a random plan fits at exactly its capacity
        starts = sorted(rng.sample(range(1, n), S - 1))
        if joint_p:
            groups = free.groups
            mem = [max(_stage_memories(free, starts, groups))] * count
        else:
            order = list(range(count))
            rng.shuffle(order)
            owner = {d: (i if i < S else rng.randrange(S)) for i, d in enumerate(order)}
            groups = [tuple(f"d{d}" for d in range(count) if owner[d] == s) for s in range(S)]
            need = _stage_memories(free, starts, groups)
            for d in range(count):
                mem[d] = need[owner[d]] / len(groups[owner[d]])
    elif memory == "none":  # just below what the leanest plan needs (all devices together, for group)
        need = min(max(_stage_memories(free, list(c), g)) for c, g in resource_splits(free))
        mem = [need * (1 - 1e-6) / (1 if joint_p else count)] * count
    devs = tuple(pipeopt.Device(f"d{i}", r, m) for i, (r, m) in enumerate(zip(res, mem)))
    return make(pipeopt.Instance(graph, pipeopt.Cluster(devs, bw), name=f"{problem_name}-{seed}"))


def check(problem, method, **kw):
    """Run one exact method and check every claim against brute force."""
    _, _, best = brute_force(problem)
    inst = problem.instance
    try:
        r = method(problem, time_limit=None, **kw)
    except pipeopt.InfeasibleError:
        assert not math.isfinite(best), f"InfeasibleError but brute force finds {best}"
        return None
    assert math.isfinite(best), f"a plan ({r.status}) although brute force finds none"
    assert r.plan is not None
    ev = pipeopt.evaluate(inst, r.plan)
    assert r.objective == ev.objective and ev.feasible
    assert r.objective >= best * (1 - 1e-12)
    assert r.lower_bound is not None and r.lower_bound <= best * (1 + 1e-12)
    assert str(r.status) == "optimal", (r.status, r.info)
    assert r.objective <= best * (1 + r.info.get("rel_gap_target", 1e-12))
    return r


CASES = [  # seed, n, size, memory, bandwidth
    (0, 4, "mid", "inf", "fast"),
    (1, 5, "mid", "exact", "fast"),
    (2, 4, "all", "exact", "tight"),
    (3, 4, "one", "exact", "fast"),
    (4, 5, "mid", "inf", "tight"),
    (5, 4, "mid", "none", "fast"),
    (6, 3, "all", "inf", "tight"),
    (7, 5, "one", "none", "tight"),
]


@pytest.mark.parametrize("seed,n,size,memory,bandwidth", CASES)
def test_joint_exact_methods_against_brute_force(seed, n, size, memory, bandwidth):
    p = build("joint", seed, n, size, memory, bandwidth)
    check(p, joint.solve_dp)
    check(p, joint.solve_cpsat, threads=1)
    check(p, joint.solve_milp, solver="cbc")
    check(p, joint.solve_milp, solver="highs")


@pytest.mark.parametrize("seed,n,size,memory,bandwidth", CASES)
def test_group_exact_methods_against_brute_force(seed, n, size, memory, bandwidth):
    p = build("group", seed, n, size, memory, bandwidth, devices=4 if seed % 2 else 3)
    check(p, group.solve_cpsat, threads=1)
    check(p, group.solve_milp, solver="cbc")
    check(p, group.solve_milp, solver="highs")


def test_cases_cover_what_they_claim():
    """The memory cases bind: "exact" has a plan at exactly its capacity, "none" has no plan."""
    p = build("joint", 1, 5, "mid", "exact", "fast")
    unlimited = build("joint", 1, 5, "mid", "inf", "fast")
    assert brute_force(p)[2] >= brute_force(unlimited)[2]
    assert not math.isfinite(brute_force(build("joint", 5, 4, "mid", "none", "fast"))[2])
    assert not math.isfinite(brute_force(build("group", 7, 5, "one", "none", "tight", devices=4))[2])
    g = build("group", 2, 4, "all", "exact", "tight")
    caps = [d.memory for d in g.instance.cluster.devices]
    assert all(math.isfinite(c) and c != round(c) for c in caps)  # non-integral capacities


@pytest.mark.parametrize("make,probe", [
    (lambda: build("joint", 1, 5, "mid", "exact", "fast"), lambda p: MilpProbe(p, solver="highs")),
    (lambda: build("group", 1, 5, "mid", "exact", "fast", devices=4), lambda p: MilpProbe(p, solver="cbc")),
    (lambda: build("group", 3, 4, "one", "exact", "fast", devices=4), lambda p: IntervalProbe(p, threads=1)),
])
def test_no_feasible_start_needed(make, probe):
    """Without any heuristic plan the search probes the top limit first and still proves the optimum."""
    p = make()
    _, _, best = brute_force(p)
    assert best <= top_limit(p)
    r = exact_search(p, "test", probe(p), Deadline(30), lambda d: [], {})
    assert r.info["start"] == "none fits" and str(r.status) == "optimal"
    assert best * (1 - 1e-12) <= r.objective <= best * (1 + MIN_REL_GAP) and r.lower_bound <= best


def test_top_limit_and_lower_bound_hold_for_every_plan():
    for seed in range(4):
        p = build("group", seed, 4, "mid", "inf", "tight", devices=4)
        values = [p.plan_value(list(c), g) for c, g in resource_splits(p)]
        finite = [v for v in values if math.isfinite(v)]
        assert max(finite) <= top_limit(p) and lower_bound(p) <= min(finite)


def test_certify_cuts_off_a_plan_over_T_and_solves_again():
    """A model whose first answer misses T under the cost model (as a solver's tolerance can)."""
    p = next(q for q in (build("joint", seed, 5, "mid", "inf", "fast") for seed in range(20)) if q.num_stages > 1)
    starts, groups, best = brute_force(p)
    worst = max(((list(c), g) for c, g in resource_splits(p)), key=lambda cg: p.plan_value(*cg))
    answers = [Probe(FEASIBLE, worst), Probe(FEASIBLE, (starts, groups))]
    cut = []
    out = certify(p, best, lambda: answers.pop(0), lambda *stage: cut.append(stage))
    assert cut and all(p.fit_time(a, b, g, s) > best for s, a, b, g in cut)
    assert out.outcome == FEASIBLE and out.value == best and out.plan == (starts, groups)
    assert certify(p, best, lambda: Probe(INFEASIBLE), lambda *stage: None).outcome == INFEASIBLE


def test_time_limit_reports_its_incumbent_and_a_valid_bound():
    p = build("group", 4, 5, "mid", "inf", "tight", devices=4)
    _, _, best = brute_force(p)
    r = group.solve_milp(p, time_limit=_expired())  # passed before the call: no race with a fast machine
    assert str(r.status) == "time_limit"
    assert r.lower_bound <= best and (r.plan is None or r.objective >= best * (1 - 1e-12))


def _expired():
    """A deadline that passed before the solve starts (a time-limit test that no machine's speed
    can turn into a proof)."""
    import time

    from pipeopt.backends.deadline import Deadline

    return Deadline(1e-3, clock=time.perf_counter() - 1.0)
