"""group, method "types": the DP over device types (pipeopt.problems.resource.group_dp) against
brute force, the group MILP and CP-SAT, and its building blocks against the rules they read."""

from __future__ import annotations

import contextlib
import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import pipeopt
from pipeopt.backends.deadline import Deadline
from pipeopt.cost import rules
from pipeopt.problems.resource import GroupProblem, brute_force, group, group_dp
from pipeopt.problems.resource.examples import random_chain
from pipeopt.problems.resource.group_dp import DeviceTypes, TypesProbe, solve_dp
from pipeopt.problems.resource.search import MIN_REL_GAP
from pipeopt.problems.resource.kernels import fits, least_pairs, undominated
from pipeopt.problems.resource.split import best_split, least_busy
from strategies import DEVICE_PROFILES, device_instance, group_problems

REL = 2e-4

def _check(p: GroupProblem, r) -> None:
    assert r.plan is not None
    assert r.objective == pipeopt.evaluate(p.instance, r.plan).objective
    assert sorted(d for st_ in r.plan.stages for d in st_.devices) == sorted(p.device_names)
    assert r.lower_bound is not None and r.lower_bound <= r.objective * (1 + 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=group_problems())
def test_types_equals_brute_force(p):
    _, _, best = brute_force(p)
    if not math.isfinite(best):
        with pytest.raises(pipeopt.InfeasibleError):
            solve_dp(p, time_limit=None)
        return
    r = solve_dp(p, time_limit=None)
    _check(p, r)
    assert r.status == pipeopt.Status.OPTIMAL
    assert r.lower_bound <= best * (1 + 1e-9)
    assert r.objective <= best * (1 + REL)



@contextlib.contextmanager
def _small_chunks():
    """The pairing scans a few labels at a time (the least pair per key kept across the runs), with
    the menu items in groups by one test on their device counts."""
    old = group_dp.PAIRS_CHUNK, group_dp.GROUP_BITS
    group_dp.PAIRS_CHUNK, group_dp.GROUP_BITS = 5, 1
    try:
        yield
    finally:
        group_dp.PAIRS_CHUNK, group_dp.GROUP_BITS = old


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=group_problems())
def test_types_in_small_chunks_equals_brute_force(p):
    """The same cross-check with the pairs scanned for a few labels at a time and the menu items
    in groups by one test on their device counts (on these sizes the
    default scans every label in one go, in groups by up to 8 tests)."""
    _, _, best = brute_force(p)
    with _small_chunks():
        if not math.isfinite(best):
            with pytest.raises(pipeopt.InfeasibleError):
                solve_dp(p, time_limit=None)
            return
        r = solve_dp(p, time_limit=None)
    _check(p, r)
    assert r.status == pipeopt.Status.OPTIMAL
    assert r.objective <= best * (1 + REL) and r.lower_bound <= best * (1 + 1e-9)


@pytest.mark.parametrize("profiles", [[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 3, 4, 0, 3], [0, 1, 2, 3, 4]])
def test_chunked_pairing_keeps_every_label(profiles, monkeypatch):
    """On 8 units, 5-8 devices (repeated types, 5 types, 5 distinct devices), 3 workers, at limits
    from infeasible to generous: the labels of every boundary and the plan are the same whether the
    pairs are scanned in one go or a few labels at a time, with the menu items in groups by 2 tests
    on their device counts, against one group."""
    p = GroupProblem(device_instance(8, profiles, seed=4, bandwidth=1e8), 3)
    probe = TypesProbe(p)
    lo = probe.work_bound()
    for T in (lo, 1.2 * lo, 1.5 * lo, 2.5 * lo, 6 * lo):
        seen = {}
        for mode in ("one go", "chunks"):
            labels = []
            original = TypesProbe._pareto

            def record(self, parts, original=original, labels=labels):
                lab = original(self, parts)
                labels.append(sorted(zip(lab.u.tolist(), lab.G.tolist(), strict=True)))
                return lab

            TypesProbe._pareto = record
            try:
                if mode == "chunks":
                    monkeypatch.setattr(group_dp, "GROUP_BITS", 2)
                    with _small_chunks():
                        found = probe.solve(T)
                else:
                    monkeypatch.setattr(group_dp, "GROUP_BITS", 0)
                    found = probe.solve(T)
            finally:
                TypesProbe._pareto = original
            seen[mode] = (labels, None if found is None else p.plan_value(*found))
        assert seen["one go"] == seen["chunks"]


def _least_pairs_brute(ty, u, h, room, idx, p0, w, wp, block, floors, beam):
    """Per key ``end * size + u + c``: the least G over every valid pair, by loops."""
    want = {}
    for l in range(u.size):
        for b in range(room.shape[1]):
            taken = 0  # with a beam: the first ``beam`` items of the end that fit the label's devices
            for m in [m for m in range(idx.size) if block[m] == b]:
                if p0[m] > room[l, b] or (beam and taken == beam):
                    break
                if not (ty.comps[idx[m]] <= ty.counts - ty.comps[u[l]]).all():
                    continue
                taken += 1
                G = w[m] + h[l]
                if G <= 0.0 and wp[m] > floors[b] - h[l]:
                    key = b * ty.size + int(u[l] + idx[m])
                    want[key] = min(want.get(key, np.inf), G)
    return want


@pytest.mark.parametrize("profiles", [[0, 0, 0, 1, 1, 2, 3, 3], [0, 1, 2, 3, 4]])
@pytest.mark.parametrize("beam", [0, 3])
@pytest.mark.parametrize("bits", [2, 8])
def test_least_pairs_is_the_brute_force_least(profiles, beam, bits, monkeypatch):
    """least_pairs keeps, per (end, count vector), a valid pair of least window state - the least
    over every label x item pair within the power room that fits the devices and passes the window
    and clip tests - scanned in one run or in three runs of labels (offsets), with and without a
    beam; repeated types (packed fields) and distinct devices (bitmasks); without a beam the items
    are in groups by 2 tests on their device counts (the types the items use most) or 8 (with
    repeated types: thresholds on each type's count)."""
    monkeypatch.setattr(group_dp, "GROUP_BITS", bits)
    p = GroupProblem(device_instance(5, profiles, seed=1, bandwidth=1e9), 3)
    probe = TypesProbe(p)
    ty, first = probe.types, probe._order_key
    rng = np.random.default_rng(3)
    L, J, M = 30, 4, 200
    u = rng.integers(0, ty.size, L)
    idx = rng.integers(1, ty.size, M)
    block = np.sort(rng.integers(0, J, M))
    p0 = probe.power[idx, first]
    order = np.lexsort((p0, block))  # menus come sorted by end, then power
    idx, block, p0 = idx[order], block[order], p0[order]
    w = rng.uniform(0.0, 1.0, M)
    wp = np.where(rng.random(M) < 0.3, rng.uniform(0.0, 1.0, M), np.inf)
    h = np.round(rng.uniform(-1.5, -0.2, L), 1)  # ties in G
    floors = rng.uniform(-2.0, 0.0, J)
    room = rng.uniform(0, p0.max(), (L, J))
    room[rng.random((L, J)) < 0.1] = -np.inf
    want = _least_pairs_brute(ty, u, h, room, idx, p0, w, wp, block, floors, beam)
    assert len(want) > 5
    for runs in ([0, L], [0, 7, 19, L]):
        best, own_l, touched = (np.full(J * ty.size, np.inf), np.zeros(J * ty.size, np.int64),
                                np.zeros(J * ty.size, np.int64))
        n = np.zeros(1, np.int64)
        room_p = ty.pack(ty.full - u)
        perm, cells, lab_g = probe._item_groups(idx, block, ty.full - u, J, beam or None)
        perm = np.arange(idx.size) if perm is None else perm
        assert (cells.shape[1] > 2) == (not beam)
        for lo, hi in zip(runs[:-1], runs[1:]):
            least_pairs(u[lo:hi], h[lo:hi], room[lo:hi], room_p[lo:hi], lab_g[lo:hi], lo, idx[perm], ty.pack(idx[perm]),
                        p0[perm], w[perm], wp[perm], cells, floors, beam, np.int64(ty.guard), ty.size, best, own_l,
                        touched, n)
        keys = touched[:n[0]]
        assert sorted(keys.tolist()) == sorted(want)
        for key in keys:  # its label and an item of its end realise the least G
            l, b = own_l[key], key // ty.size
            assert best[key] == want[int(key)]
            assert any(idx[m] == key % ty.size - u[l] and w[m] + h[l] == best[key] and p0[m] <= room[l, b]
                       and (ty.comps[idx[m]] <= ty.counts - ty.comps[u[l]]).all()
                       for m in np.flatnonzero(block == b))


CROSS = [  # units, device profiles (repeats: identical devices), workers, seed, bandwidth, memory per device
    (6, [0, 0, 1, 2], 3, 1, 1e9, None),  # two identical devices
    (6, [0, 1, 2, 3], 2, 2, 1e6, None),  # tight bandwidth: cuts and window rows bind
    (5, [0, 0, 2, 2], 3, 3, 1e9, 0.25),  # binding memory (a fraction of the whole chain per device)
]


@pytest.mark.parametrize("n,profiles,q,seed,bandwidth,memory", CROSS)
def test_types_equals_brute_force_milp_and_cpsat(n, profiles, q, seed, bandwidth, memory):
    inst = device_instance(n, profiles, seed=seed, bandwidth=bandwidth)
    if memory is not None:
        per = GroupProblem(inst, q).stage_memory(0, n, 0) * memory
        inst = device_instance(n, profiles, seed=seed, bandwidth=bandwidth, memory=[per] * len(profiles))
    p = GroupProblem(inst, q)
    _, _, best = brute_force(p)
    if memory is not None:  # the memory binds: the optimum without it is better
        free = GroupProblem(device_instance(n, profiles, seed=seed, bandwidth=bandwidth), q)
        assert best > brute_force(free)[2] * (1 + 1e-6)
    r = solve_dp(p, time_limit=None)
    _check(p, r)
    assert r.status == pipeopt.Status.OPTIMAL and math.isclose(r.objective, best, rel_tol=REL)
    m = group.solve_milp(p, time_limit=None, solver="highs")
    c = group.solve_cpsat(p, time_limit=None, threads=1)
    for other in (m, c):
        _check(p, other)
        assert other.status == pipeopt.Status.OPTIMAL
        assert math.isclose(r.objective, other.objective, rel_tol=REL)
        assert other.lower_bound <= r.objective * (1 + 1e-9) and r.lower_bound <= other.objective * (1 + 1e-9)


def test_identical_devices_are_counted_not_named():
    """6 devices of 2 types: 12 count vectors (not 2^6 subsets), and the optimum of brute force
    over every naming."""
    inst = device_instance(5, [0, 0, 0, 0, 3, 3], seed=3, bandwidth=4e6)
    p = GroupProblem(inst, 2)
    types = DeviceTypes(p)
    assert list(types.counts) == [4, 2] and types.size == 15 and not types.subsets
    _, _, best = brute_force(p)
    r = solve_dp(p, time_limit=None)
    _check(p, r)
    assert r.status == pipeopt.Status.OPTIMAL and math.isclose(r.objective, best, rel_tol=REL)
    assert r.info["types"] == [4, 2] and r.info["count_vectors"] == 15


def test_count_vector_transforms():
    """prefix_min / below = the brute minimum over smaller count vectors; subsets index as bitmasks."""
    rng = random.Random(0)
    p = GroupProblem(device_instance(4, [0, 0, 1, 2, 2, 2], seed=1, bandwidth=1e9), 2)
    ty = DeviceTypes(p)
    vals = np.array([rng.uniform(0, 1) for _ in range(ty.size)])
    pm, below = ty.prefix_min(vals), ty.below(vals)
    for u in range(ty.size):
        le = [v for v in range(ty.size) if (ty.comps[v] <= ty.comps[u]).all()]
        assert pm[u] == min(vals[v] for v in le)
        assert below[u] == min((vals[v] for v in le if v != u), default=math.inf)
    # kernels.fits on packed count vectors (one subtraction) = the type-by-type comparison, every pair
    wide = DeviceTypes(GroupProblem(device_instance(4, [0] * 16 + [1] * 7 + [2], seed=1, bandwidth=1e9), 2))
    distinct = DeviceTypes(GroupProblem(device_instance(4, [0, 1, 2], seed=1, bandwidth=1e9), 2))
    for t in (ty, wide, distinct):
        packed = t.pack(np.arange(t.size))
        got = [[fits(packed[c], packed[r], np.int64(t.guard)) for c in range(t.size)] for r in range(t.size)]
        want = (t.comps[None, :, :] <= t.comps[:, None, :]).all(axis=-1)
        assert (np.array(got) == want).all()
    assert distinct.subsets and distinct.size == 8 and distinct.guard == 0
    assert all(int(distinct.comps[i] @ distinct.stride) == i for i in range(8))
    assert [fits(a, b, np.int64(0)) for a, b in ((2, 6), (4, 5), (1, 6))] == [True, True, False]  # bit 0 not in 6


@pytest.mark.parametrize("bandwidth", [2e8, 3e6])
@pytest.mark.parametrize("scan", [group_dp.LEAST_SCAN, 8])
def test_least_power_is_the_brute_force_least(scan, bandwidth, monkeypatch):
    """least_power(T)[s, j] = min over every way to cover units j..n-1 with s stages (ends where
    the cut passes) of the summed first-price power of each stage's least powerful passing count
    vector, by brute force, when the scan reaches every count vector; a lower bound on it when
    the scan stops early (8 of 162 here); and the cluster has that power whenever the DP finds a
    plan. Loose bandwidth, and tight (some cuts fail T: stages end elsewhere)."""
    p = GroupProblem(device_instance(7, [0, 0, 1, 1, 2, 3, 3, 4, 4], seed=6, bandwidth=bandwidth), 3)
    probe = TypesProbe(p)
    ty, first, n = probe.types, probe._order_key, p.n
    idx = np.arange(ty.size)
    lo = probe.work_bound()
    monkeypatch.setattr(group_dp, "LEAST_SCAN", scan)
    for T in (0.9 * lo, 1.3 * lo, 2.0 * lo, 4.0 * lo):
        cut_ok = p.cut_time <= T
        got = probe.least_power(T, cut_ok)
        one = {}
        for a in range(n):
            for b in range(a + 1, n + 1):
                ok = (probe.rate(a, b, idx) >= 1.0 / T) & (ty.ndev >= 1)
                one[a, b] = float(probe.power[idx[ok], first].min()) if ok.any() else math.inf
        for s_ in range(0, p.num_stages + 1):
            for j in range(n):
                want = math.inf
                for cuts in itertools.combinations(range(j + 1, n), s_ - 1) if s_ >= 1 else []:
                    if all(cut_ok[c] for c in cuts):
                        bounds = (j, *cuts, n)
                        want = min(want, sum(one[x, y] for x, y in itertools.pairwise(bounds)))
                if scan >= ty.size:
                    assert got[s_, j] == pytest.approx(want, rel=1e-9) or got[s_, j] == want == math.inf
                else:
                    assert got[s_, j] <= want * (1 + 1e-9)
        if probe.solve(T) is not None:
            assert probe.power[ty.full, first] >= got[p.num_stages, 0] * (1 - 1e-9)


def test_rules_read_per_composition():
    """The cover-row rate is 1 / best_split's stage time and busy is least_busy on the pooled
    worker, for every composition and a few ranges (the DP reads the rules, it does not redo them)."""
    p = GroupProblem(device_instance(6, [0, 0, 1, 2, 4], seed=7, bandwidth=1e9), 2)
    probe = TypesProbe(p)
    ty = probe.types
    idx = np.arange(1, ty.size)
    for a, b in ((0, 1), (0, 6), (2, 5)):
        F, B = p.load(a, b)
        rate = probe.rate(a, b, idx)
        T = 1.3 / float(np.median(rate))
        busy = probe.busy(a, b, idx, T)
        for i, c in zip(idx, ty.comps[idx], strict=True):
            res = {k: float(v) for k, v in zip(p.kinds, ty.R[i], strict=True)}
            tau = best_split(res, F, B)[1]
            assert math.isclose(rate[i - 1], 1.0 / tau, rel_tol=1e-9)
            _, f, bb = least_busy(res, F, B, T)
            assert (busy[i - 1] == math.inf) == (f == math.inf)
            if math.isfinite(f):
                assert math.isclose(busy[i - 1], f + bb, rel_tol=1e-9)


def test_window_bound_is_below_every_plan():
    """window_need(k, j, P) <= sum of the busy times and round trips of stages k..S-1 of any plan
    starting stage k at j (the DP prunes with it, so it must never exceed a real plan)."""
    p = GroupProblem(device_instance(5, [0, 1, 2, 3], seed=11, bandwidth=1e6), 3)
    probe = TypesProbe(p)
    first = probe._order_key
    T = 10.0  # generous: every stage passes, busy times are their unclipped least values
    names = p.device_names
    checked = 0
    for cuts in itertools.combinations(range(1, 5), 2):
        bounds = [0, *cuts, 5]
        for assign in itertools.product(range(3), repeat=4):
            groups = [tuple(names[d] for d in range(4) if assign[d] == s) for s in range(3)]
            if not all(groups):
                continue
            chk = p.check(list(cuts), groups, T)
            if chk.over:
                continue
            for k in (1, 2):
                total = sum(o[1] + o[2] for o in chk.ops[k:]) + sum(p.round_trip[bounds[s]] for s in range(k + 1, 3))
                power = sum(probe.power[p.class_counts(g) @ probe.types.stride, first] for g in groups[k:])
                need = probe.window_need(k, np.array([bounds[k]]), np.array([power]))[0]
                assert need <= total * (1 + 1e-9)
                checked += 1
    assert checked > 100


def test_probe_brackets_the_optimum():
    p = GroupProblem(device_instance(5, [0, 1, 2, 2], seed=5, bandwidth=4e6), 3)
    _, _, best = brute_force(p)
    probe = TypesProbe(p)
    assert probe(best * (1 - 1e-6), Deadline(None)).outcome == "infeasible"
    out = probe(best * (1 + 1e-9), Deadline(None))
    assert out.outcome == "feasible" and out.value <= best * (1 + 1e-6)
    assert probe.work_bound() <= best


def test_too_many_count_vectors_falls_back_to_the_milp(monkeypatch):
    devices = tuple(pipeopt.Device(f"x{i}", {"cpu": 1 + i}) for i in range(22))
    inst = pipeopt.Instance(random_chain(4, kinds=("cpu",), seed=0), pipeopt.Cluster(devices, 1e9), name="wide")
    with pytest.raises(pipeopt.InvalidProblemError, match="wide.*count vectors"):
        TypesProbe(GroupProblem(inst, 2))  # the DP itself refuses by name
    # The fallback on a cluster the MILP proves quickly: 6 distinct devices (64 count vectors)
    # past a lowered limit (22 devices into 2 workers cost the MILP 8 CPU-s).
    monkeypatch.setattr(group_dp, "MAX_COUNT_VECTORS", 63)
    inst = pipeopt.Instance(random_chain(4, kinds=("cpu",), seed=0),
                            pipeopt.Cluster(devices[:6], 1e9), name="wide")
    p = GroupProblem(inst, 2)
    with pytest.raises(pipeopt.InvalidProblemError, match="wide.*64 count vectors"):
        TypesProbe(p)
    r = solve_dp(p, time_limit=None)  # the default method answers anyway, through the MILP
    assert r.method == "types" and "count vectors" in r.info["fallback"]
    assert r.status == pipeopt.Status.OPTIMAL
    assert r.objective == pytest.approx(pipeopt.evaluate(inst, r.plan).objective, rel=1e-9)


def test_time_limit_is_honest():
    """Stopped by a short limit, the DP says what it has: a plan no better than the proven
    optimum, a bound no worse, and ``time_limit`` unless it did prove (no wall-clock figure is
    asserted: a loaded machine may stop anywhere)."""
    inst = pipeopt.Instance(random_chain(40, seed=2),
                            pipeopt.Cluster(tuple(pipeopt.Device(f"s{i}", dict(DEVICE_PROFILES[i % 5])) for i in range(10)), 5e7))
    r = solve_dp(GroupProblem(inst, 4), time_limit=0.3)
    exact = solve_dp(GroupProblem(inst, 4), time_limit=None)  # optimal within MIN_REL_GAP
    assert exact.status == pipeopt.Status.OPTIMAL
    assert r.lower_bound <= exact.objective * (1 + 1e-9)
    if r.plan is not None:
        assert exact.lower_bound <= r.objective * (1 + 1e-9)
    if r.status != pipeopt.Status.OPTIMAL:
        assert r.status in (pipeopt.Status.TIME_LIMIT, pipeopt.Status.FEASIBLE)
        assert r.plan is None or r.gap > 0
    else:
        assert r.objective == pytest.approx(exact.objective, rel=2 * MIN_REL_GAP)


def test_through_the_registry():
    inst = device_instance(5, [0, 0, 1, 2], seed=9, bandwidth=1e9)
    r = pipeopt.solve(inst, problem="group", method="types", workers=2, time_limit=None)
    assert r.status == pipeopt.Status.OPTIMAL and r.method == "types"


def _menu_brute(probe, k, j, j2s, T, lab, h, floors):
    """menus() by loops over every count vector and end (the conditions of its docstring), and how
    many pass them all but the devices test (distinct devices: no label leaves their devices)."""
    p, ty, first = probe.problem, probe.types, probe._order_key
    rooms = ty.comps[ty.full - lab.u]
    outside = 0
    S = p.num_stages
    least_rest = probe.least_power(T, p.cut_time <= T)  # T's own (the probe keeps the last one)
    out = {}
    for b, e in enumerate(j2s.tolist()):
        if (ty.comps[ty.full] @ probe.rows(j, e)).min() < 1.0 / T:
            break  # no worker reaches this end (nor a later one)
        need = (probe.work[e] - probe.work[j]) / T
        top = probe.power[ty.full] - (probe.work[j] - probe.work[0] + probe.work[-1] - probe.work[e]) / T
        top[first] = min(top[first], probe.power[ty.full, first] - probe.power[lab.u, first].min()
                         - least_rest[S - 1 - k, e])
        mem = p.table.memory(j, e, p.in_flight(k))
        theta = floors[b] - h.max()

        def passes(c):
            return (ty.ndev[c] >= 1 and probe.rate(j, e, np.array([c]))[0] >= 1.0 / T
                    and rules.fits(mem, ty.M[c]))

        for c in range(ty.size):
            pw = probe.power[c]
            if ty.ndev[c] < 1 or (pw < need * (1 - 1e-12)).any() or (pw > top * (1 + 1e-12) + 1e-300).any():
                continue
            if k + 1 < S:
                p0 = pw[first]
                w_low = probe._root(j, e) ** 2 / p0 if p0 > 0 else math.inf
                left = max(probe.power[ty.full - lab.u, first].max() - p0, 0.0)
                rest = probe.window_need(k + 1, np.array([e]), np.array([left]))[0]
                if max(-probe._D[k + 1] * T, w_low + h.min() + p.round_trip[e]) + rest > 1e-9 * T:
                    continue
            if not passes(c):
                continue
            preds = [c - ty.stride[t] for t in range(ty.tau) if ty.comps[c, t] > 0 and passes(c - ty.stride[t])]
            if any(2.0 / probe.rate(j, e, np.array([q]))[0] <= theta for q in preds):
                continue
            w = probe.busy(j, e, np.array([c]), T)[0]
            wp = min((probe.busy(j, e, np.array([q]), T)[0] for q in preds), default=math.inf)
            if math.isfinite(w) and wp > theta:
                if ty.subsets and not (ty.comps[c] <= rooms).all(axis=1).any():
                    outside += 1
                    continue
                out[(b, c)] = (w, wp)
    return out, outside


@pytest.mark.parametrize("profiles,memory", [([0, 0, 1, 1, 2, 3], None), ([0, 1, 2, 3, 4], 0.4)])
def test_menus_are_the_brute_force_menus(profiles, memory):
    """Every menu the exact DP computes (stages, start units, limits from infeasible to generous;
    repeated types, and distinct devices with binding memory) holds exactly the compositions the
    conditions of its docstring keep, by loops over every count vector, with the same busy times;
    with distinct devices, some that pass every other condition are left out because no label
    leaves their devices."""
    inst = device_instance(9, profiles, seed=8, bandwidth=3e8)
    if memory is not None:
        per = GroupProblem(inst, 4).stage_memory(0, 9, 0) * memory
        inst = device_instance(9, profiles, seed=8, bandwidth=3e8, memory=[per] * len(profiles))
    p = GroupProblem(inst, 4)
    probe = TypesProbe(p)
    calls = []
    original = TypesProbe.menus

    def record(self, k, j, j2s, T, lab, h, floors, beam=None, deadline=None):
        out = original(self, k, j, j2s, T, lab, h, floors, beam, deadline)
        calls.append((k, j, j2s.copy(), T, lab, h.copy(), floors.copy(), out))
        return out

    lo = probe.work_bound()
    TypesProbe.menus = record
    try:
        for T in (lo, 1.3 * lo, 2.0 * lo, 5.0 * lo):
            probe.solve(T)
    finally:
        TypesProbe.menus = original
    assert len(calls) > 10
    kept = outside = 0
    for k, j, j2s, T, lab, h, floors, (idx, w, wp, block, _) in calls:
        want, out = _menu_brute(probe, k, j, j2s, T, lab, h, floors)
        outside += out
        got = {(int(b), int(c)): (x, y) for b, c, x, y in zip(block, idx, w, wp, strict=True)}
        assert sorted(got) == sorted(want)
        for key, (x, y) in got.items():
            assert x == pytest.approx(want[key][0], rel=1e-12)
            assert y == want[key][1] or y == pytest.approx(want[key][1], rel=1e-12)
        kept += len(got)
    assert kept > 50 and (outside > 0) == probe.types.subsets


def test_undominated_is_the_pairwise_and_the_grid_test():
    """undominated (compiled, pairwise) keeps exactly the labels that no other label dominates
    (fewer devices of every type and no larger window state; ties in G), = the numpy pairwise
    formula = the prefix-minimum test on the grid of count vectors (_pareto's other path)."""
    ty = DeviceTypes(GroupProblem(device_instance(4, [0, 0, 0, 1, 1, 2, 3, 3], seed=1, bandwidth=1e9), 2))
    rng = np.random.default_rng(7)
    for _ in range(5):
        u = rng.choice(ty.size, 60, replace=False)
        G = rng.integers(0, 5, 60).astype(float)
        cu = ty.comps[u]
        le = (cu[:, None, :] <= cu[None, :, :]).all(axis=2) & (G[:, None] <= G[None, :])
        np.fill_diagonal(le, False)
        best = np.full(ty.size, np.inf)
        best[u] = G
        keep = undominated(cu, G)
        assert (keep == ~le.any(axis=0)).all() and (keep == (G < ty.below(best)[u])).all()
        assert 0 < keep.sum() < u.size


def test_top_clock_gives_a_probe_just_below_the_best_plan_the_time_left():
    """A probe just below the best plan seen runs on the solve's time left; any other probe on the
    share the bisection gave it; no clock (no limit) stays no clock; the answers are the probe's."""
    from pipeopt.backends.bisection import FEASIBLE, INFEASIBLE, Probe

    seen = []

    def fake(T, clock):
        seen.append(None if clock is None else clock.remaining())
        return Probe(FEASIBLE, "plan", 0.99 * T) if T > 2.0 else Probe(INFEASIBLE)

    solve = Deadline(1000.0)
    tc = group_dp._TopClock(fake, solve, 1e-4)
    tc.seen(3.0)
    assert tc(3.0 / (1 + 5e-5), solve.sub(seconds=1.0)).outcome == FEASIBLE and seen[-1] > 900
    assert tc.best == pytest.approx(0.99 * 3.0 / (1 + 5e-5))
    assert tc(2.5, solve.sub(seconds=1.0)).outcome == FEASIBLE and seen[-1] <= 1.0
    assert tc.best == pytest.approx(2.475)
    assert tc(1.5, solve.sub(seconds=1.0)).outcome == INFEASIBLE and seen[-1] <= 1.0
    assert tc(2.475 / (1 + 5e-5), None).outcome == FEASIBLE and seen[-1] is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=group_problems())
def test_types_with_a_clock_equals_brute_force(p):
    """The same cross-check on a bounded clock (the top probes' clock policy, :class:`_TopClock`,
    is active): every claim holds; OPTIMAL is within the gap of brute force."""
    _, _, best = brute_force(p)
    if not math.isfinite(best):
        with pytest.raises(pipeopt.InfeasibleError):
            solve_dp(p, time_limit=1000.0)
        return
    r = solve_dp(p, time_limit=1000.0)
    _check(p, r)
    assert r.lower_bound <= best * (1 + 1e-9)
    if r.status == pipeopt.Status.OPTIMAL:
        assert r.objective <= best * (1 + REL)


def test_a_device_the_first_price_does_not_count_can_take_a_stage():
    """A device with none of the first price's kind (d1: npu only, price (1, 0)) on a stage of no
    priced work (l3 runs on npu): the window bound read 0 / 0 as infinite and the DP proved a
    false infeasibility (crosscheck seed 16318); the optimum puts l3 alone on d1."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_node("l0", fwd={"cpu": 3.775883472813893e-05}, bwd={"cpu": 5.031911854169708e-05},
               out_bytes=1873.01, act_bytes=1873.01, param_bytes=2285.17)
    g.add_node("l1", fwd={"cpu": 3.9832463047004e-05, "npu": 9.36982728885177e-05},
               bwd={"cpu": 5.057905971274041e-05, "npu": 0.0002639088981523874},
               out_bytes=2787.9, act_bytes=1235.2, param_bytes=512.58)
    g.add_node("l2", fwd={"cpu": 4.483899009369561e-05}, bwd={"cpu": 4.512509383319954e-05},
               out_bytes=2162.5, act_bytes=2162.5, param_bytes=1160.21)
    g.add_node("l3", fwd={"cpu": 8.496456329164325e-06, "npu": 9.77110464256458e-06},
               bwd={"cpu": 2.6965353304367472e-05, "npu": 1.924147750241707e-05},
               out_bytes=2671.26, act_bytes=2616.9, param_bytes=2082.93)
    g.add_node("l4", fwd={"cpu": 3.5306374039508964e-05}, bwd={"cpu": 4.2220507086203674e-05},
               out_bytes=84.89, act_bytes=84.89, param_bytes=2020.31)
    g.add_edges_from([("l0", "l1"), ("l1", "l2"), ("l2", "l3"), ("l3", "l4")])
    devices = (pipeopt.Device("d0", {"cpu": 0.8165914618907102, "npu": 0.0}, math.inf),
               pipeopt.Device("d1", {"cpu": 0.0, "npu": 2.117599188984882}, math.inf),
               pipeopt.Device("d2", {"cpu": 2.2624429743904977, "npu": 0.8307745533003226}, math.inf),
               pipeopt.Device("d3", {"cpu": 2.2295738189464993, "npu": 0.0}, math.inf))
    inst = pipeopt.Instance(g, pipeopt.Cluster(devices, bandwidth=531224.5935617703),
                            pipeopt.Settings(overlap=True, weight_stashing=False, microbatches=3))
    p = GroupProblem(inst, 4)
    _, groups, best = brute_force(p)
    assert ("d1",) in [tuple(g_) for g_ in groups]
    r = solve_dp(p, time_limit=None)
    _check(p, r)
    assert r.status == "optimal"
    assert r.objective == pytest.approx(best, rel=REL)
