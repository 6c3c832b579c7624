"""The stage relaxation of the type DP (pipeopt/problems/resource/relax.py): never refutes a limit
some plan meets, so its bound never exceeds the brute-force optimum."""

from __future__ import annotations

import math

import numpy as np

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeopt
from pipeopt.problems.resource import GroupProblem, brute_force
from pipeopt.problems.resource.examples import random_chain
from pipeopt.problems.resource.group_dp import TypesProbe
from pipeopt.problems.resource.relax import StageRelaxation, relaxed_bound

PROFILES = ({"cpu": 1, "gpu": 2}, {"cpu": 4}, {"gpu": 3, "npu": 1}, {"npu": 4}, {"cpu": 2, "gpu": 1, "npu": 1})


@st.composite
def small_problems(draw):
    """2..7 units, 2..5 devices of up to 4 profiles (repeats: identical devices), 1..4 workers;
    memory unlimited, binding or loose; bandwidth loose or tight (cuts that dominate)."""
    seed = draw(st.integers(0, 10**6))
    n = draw(st.integers(2, 7))
    d = draw(st.integers(2, 5))
    profiles = draw(st.lists(st.integers(0, 3), min_size=d, max_size=d))
    q = draw(st.integers(1, min(4, n, d)))
    bandwidth = draw(st.sampled_from([1e9, 4e6, 1e6, 3e5]))
    memory = draw(st.sampled_from(["inf", "binding", "loose"]))

    def build(mem):
        devices = tuple(pipeopt.Device(f"d{i}", dict(PROFILES[k]), m) for i, (k, m) in enumerate(zip(profiles, mem)))
        return pipeopt.Instance(random_chain(n, seed=seed), pipeopt.Cluster(devices, bandwidth), name=f"relax-{seed}")

    inst = build([math.inf] * d)
    if memory != "inf":
        whole = GroupProblem(inst, q).stage_memory(0, n, 0)
        per = whole * (0.45 if memory == "binding" else 2.0) * (2 / q)
        inst = build([per] * d)
    return GroupProblem(inst, q)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=small_problems(), over=st.sampled_from([1.0, 1.001, 1.3]))
def test_relaxation_never_refutes_the_optimum(p, over):
    _, _, best = brute_force(p)
    if not math.isfinite(best):
        return
    probe = TypesProbe(p)
    relax = StageRelaxation(probe)
    assert relax.feasible(best * over)
    bound = relaxed_bound(probe, probe.work_bound() * 0.5, best * 2.0)
    assert bound <= best * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=small_problems(), bins=st.integers(1, 3), front=st.integers(1, 3), cells=st.sampled_from([1, 2, 8]))
def test_every_resolution_is_a_relaxation(p, bins, front, cells):
    """Coarse grids, fronts cut to one to three corners (:func:`relax._compress`) and a few
    cells: still never above the brute-force optimum."""
    _, _, best = brute_force(p)
    if not math.isfinite(best):
        return
    probe = TypesProbe(p)
    assert StageRelaxation(probe, bins, front, cells).feasible(best)
    level = ((bins, front, cells),)
    assert relaxed_bound(probe, probe.work_bound() * 0.5, best * 2.0, levels=level * 2) <= best * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=small_problems(), over=st.sampled_from([1.0, 1.3]))
def test_relaxed_split_is_a_split_of_the_chain(p, over):
    """Where the relaxation allows T (at the optimum it must), its relaxed plan's split has one
    start per stage after the first, increasing, inside the chain."""
    _, _, best = brute_force(p)
    if not math.isfinite(best):
        return
    split = StageRelaxation(TypesProbe(p)).split(best * over)
    assert split is not None
    assert len(split) == p.num_stages - 1
    bounds = [0, *split, p.n]
    assert all(a < b for a, b in zip(bounds, bounds[1:]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=small_problems(), data=st.data())
def test_restricted_type_dp_keeps_to_its_ends_and_the_guided_plans_to_their_limit(p, data):
    """The type DP with allowed stage ends (``ends_ok``) returns only plans that end each stage
    where allowed, within its limit, and never below the optimum; with every end allowed it
    answers as the whole DP. The guided search's plans are scored exactly and below its top."""
    from pipeopt.problems.resource.group_dp import _guided
    from pipeopt.backends.deadline import Deadline

    _, _, best = brute_force(p)
    if not math.isfinite(best):
        return
    n, S = p.n, p.num_stages
    probe = TypesProbe(p)
    T = best * data.draw(st.sampled_from([1.0, 1.2, 2.0]))
    assert (probe.solve(T, ends_ok=np.ones((S, n + 1), dtype=bool)) is None) == (probe.solve(T) is None)
    mask = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=n + 1, max_size=n + 1),
                                       min_size=S, max_size=S)), dtype=bool).reshape(S, n + 1)
    found = probe.solve(T, ends_ok=mask)
    if found is not None:
        starts, groups = found
        assert all(mask[k, e] for k, e in enumerate(starts))
        assert best * (1 - 1e-9) <= p.plan_value(starts, groups) <= T * (1 + 1e-9)
    top = best * 1.5
    for starts, groups in _guided(probe, probe.work_bound() * 0.5, top, Deadline.of(None)):
        assert best * (1 - 1e-9) <= p.plan_value(starts, groups) <= top * (1 + 1e-9)
