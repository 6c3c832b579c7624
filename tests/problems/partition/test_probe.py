"""The exact method for long chains (``probe``: a K-way search on the period over the exact
frontier probes of :mod:`pipeopt.problems.partition.chains`) against brute force, the dense DP
and the MILP, on random instances and on the cases where each term of the cost model binds;
and the probe itself, at arbitrary trial periods, against every split."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from brute_force import partition_optimum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_instance, instances

from pipeopt import Instance, evaluate
from pipeopt.errors import InfeasibleError, InvalidProblemError
from pipeopt.problems.partition import probe as probe_module
from pipeopt.problems.partition.chains import Memory, ReplicatedProbe, StraightProbe, _range_min, window_min
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.problems.partition.probe import solve_probe
from pipeopt.problems.partition.problem import PartitionProblem
from pipeopt.result import Status

REL = 1e-9  # the agreement: probe = DP to 1e-9 relative


def close(a: float, b: float, rel: float = REL) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-15


def optimum_or_inf(fn, problem) -> float:
    try:
        return fn(problem).objective
    except InfeasibleError:
        return math.inf


def chain(work, out, act=None, param=None, *, memory=math.inf, bandwidth=1e6, overlap=True, stashing=False,
          skips=()):
    """A chain l0 -> l1 -> ... (plus ``skips`` edges) with forward = backward time ``work``,
    output bytes ``out`` and activation / parameter bytes."""
    return chain_instance(work, work, out, act or 0.0, param or 0.0, memory=memory, bandwidth=bandwidth,
                          skips=skips, cast=float, overlap=overlap, weight_stashing=stashing,
                          name="probe-chain")


def random_chain(seed: int, n: int, *, memory=math.inf, bandwidth=1e9, overlap=True, stashing=False,
                 heavy: int = 0) -> Instance:
    """A random chain with skip edges (a tensor read two to six layers later), fractional bytes."""
    rng = np.random.default_rng(seed)
    work = rng.uniform(0.1, 1.0, n) * 1e-3
    if heavy:
        work[rng.choice(n, heavy, replace=False)] *= 30
    out = rng.uniform(1e5, 3e6, n) + 0.25
    act = list(out * rng.uniform(0.5, 2.0, n))
    param = list(rng.uniform(0, 4e6, n) + 0.5)
    skips = [(int(a), int(min(n - 1, a + rng.integers(2, 7)))) for a in rng.choice(n - 2, n // 10, replace=False)]
    return chain(list(work), list(out), act, param, memory=memory, bandwidth=bandwidth, overlap=overlap,
                 stashing=stashing, skips=[s for s in skips if s[0] + 1 < s[1]])


def test_replicated_probe_last_row_ends_the_chain_with_a_stage_overhead():
    """Found by hypothesis in CI (29 Nov): with a stage overhead the replicated probe's band put the
    last row's first end past the chain (a1[n] - b1[n] is the overhead, read as work left), so it
    refuted every limit and "proved" the 3-replica one-stage plan (0.0083125004 s) optimal while the
    DP's two stages on 2 + 1 replicas take 0.0083125 s."""
    import networkx as nx

    from pipeopt import Cluster, Settings

    g = nx.DiGraph(stage_overhead={"forward": 0.0, "backward": 0.001})
    for i, (bwd, param) in enumerate([(0.0, 0.0), (0.015625, 0.0), (0.0, 6234376.0)]):
        g.add_node(f"l{i}", fwd={"gpu": 0.0}, bwd={"gpu": bwd}, out_bytes=0.0, act_bytes=0.0, param_bytes=param)
    nx.add_path(g, ["l0", "l1", "l2"])
    inst = Instance(g, Cluster.homogeneous(8, bandwidth=1e9), Settings(microbatches=8), name="overhead")
    p = PartitionProblem(inst, 3, replication=True)
    res, dp = solve_probe(p), solve_dp(p)
    assert dp.objective == pytest.approx(0.0083125, rel=1e-12)
    assert close(res.objective, dp.objective) and res.lower_bound <= dp.objective * (1 + 1e-12)
    assert close(res.objective, partition_optimum(inst, 3, True).value)


# ---- the method against brute force, the DP and the MILP ---------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(inst=instances(max_layers=7, alpha=True), data=st.data())
def test_probe_equals_brute_force_and_dp(inst, data):
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 5)), label="S")
    replication = data.draw(st.booleans(), label="replication")
    if replication and inst.cluster.latency:  # the all-reduce's latency per stage: the DP only
        p = PartitionProblem(inst, S, replication=True)
        with pytest.raises(InvalidProblemError, match="does not model a message latency"):
            solve_probe(p)
        assert close(optimum_or_inf(solve_dp, p), partition_optimum(inst, S, True).value)
        return
    p = PartitionProblem(inst, S, replication=replication)
    brute = partition_optimum(inst, S, replication).value
    got = optimum_or_inf(solve_probe, p)
    assert close(got, brute), (got, brute)
    assert close(got, optimum_or_inf(solve_dp, p)), "probe and DP disagree"
    if math.isfinite(got):
        res = solve_probe(p, time_limit=None)
        assert res.status == Status.OPTIMAL and res.evaluation.feasible
        assert res.lower_bound <= res.objective and (res.gap is None or res.gap <= 1e-10)
        assert res.plan.num_stages == S or replication
        assert sum(s.replicas for s in res.plan.stages) == S


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(inst=instances(max_layers=8, alpha=True), data=st.data())
def test_probe_equals_milp(inst, data):
    S = data.draw(st.integers(1, min(inst.chain.n, 4)), label="S")
    p = PartitionProblem(inst, S)
    got = optimum_or_inf(solve_probe, p)
    milp = optimum_or_inf(lambda q: solve_milp(q, time_limit=None), p)
    assert close(got, milp, 1e-6), (got, milp)


@pytest.fixture
def no_tie_break(monkeypatch):
    """The second phase off in both methods (the primary optimum is what is compared)."""
    import pipeopt.problems.partition.dp as dp_module

    monkeypatch.setattr(probe_module, "TIE_BREAK_WORK", 0)
    monkeypatch.setattr(dp_module, "break_ties", lambda problem, starts, *a, **k: list(starts))


@pytest.mark.parametrize("replication", [False, True])
@pytest.mark.parametrize("case", ["plain", "memory", "tight-bandwidth", "no-overlap", "stashing", "heavy"])
def test_probe_equals_dp_on_random_chains(case, replication, no_tie_break):
    """Chains of 40 - 90 units with skip edges: the probe (bands, several trial periods, the
    galloping search) finds the DP's optimum whichever term binds."""
    for seed in range(2):
        n = 40 + 50 * seed
        kw = {"memory": {"memory": 1.6e8}, "tight-bandwidth": {"bandwidth": 2e8},
              "no-overlap": {"overlap": False, "bandwidth": 3e8},
              "stashing": {"stashing": True, "memory": 4e8}, "heavy": {"heavy": 2}}.get(case, {})
        inst = random_chain(seed, n, **kw)
        for S in (3, 9):
            p = PartitionProblem(inst, S, replication=replication)
            dp, got = optimum_or_inf(solve_dp, p), optimum_or_inf(solve_probe, p)
            assert close(got, dp), (case, seed, S, got, dp)


def test_rebuild_at_one_trial_period_when_the_keys_outgrow_the_limit(monkeypatch, no_tie_break):
    """With no room for the keys of every trial period the straight probe rebuilds its split by a
    second pass at the smallest feasible one: same optimum."""
    from pipeopt.problems.partition import chains

    inst = random_chain(6, 60, memory=1.6e8)
    p = PartitionProblem(inst, 7)
    want = solve_dp(p).objective
    monkeypatch.setattr(chains, "STORE_LIMIT", 0)
    assert close(solve_probe(p).objective, want)


def test_memory_binding_at_exactly_the_capacity():
    """Six units of 2 s busy and 10 activation bytes each, 60 bytes per worker: stage t keeps
    S - t microbatches, so the balanced split's first stage needs exactly 60 bytes (S = 2: three
    units x 2 microbatches; S = 3: two units x 3) and fits only at the capacity itself."""
    inst = chain([1.0, 1.0, 1.0, 1.0, 1.0, 1.0], [0.0] * 6, act=[10.0] * 6, memory=60.0)
    for S in (2, 3):
        p = PartitionProblem(inst, S)
        brute = partition_optimum(inst, S).value
        res = solve_probe(p)
        assert close(res.objective, brute) and res.evaluation.feasible
        assert max(m / c for m, c in zip(res.evaluation.memory, res.evaluation.memory_capacity)) == 1.0
        assert close(res.objective, solve_dp(p).objective)


def test_tight_bandwidth_cut_and_windows_bind():
    """A cut's one-way transfer and the window rows decide the optimum (not the stage times)."""
    work = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    out = [3e6, 0.5e6, 2.5e6, 0.25e6, 3e6, 0.0]
    inst = chain(work, out, bandwidth=1e6)
    binding = []
    for S in (2, 3, 4):
        p = PartitionProblem(inst, S)
        res = solve_probe(p)
        brute = partition_optimum(inst, S).value
        assert close(res.objective, brute), (S, res.objective, brute)
        assert close(res.objective, solve_dp(p).objective)
        binding.append(res.objective > max(res.evaluation.stage_time) * (1 + 1e-9))
    assert any(binding)  # a cut or a window row, not a stage's own time, sets the optimum


@pytest.mark.parametrize("replication", [False, True])
def test_one_stage_and_one_unit_per_stage(replication):
    inst = random_chain(3, 7, bandwidth=5e8)
    for S in (1, 7):
        p = PartitionProblem(inst, S, replication=replication)
        res = solve_probe(p)
        assert close(res.objective, partition_optimum(inst, S, replication).value)
        if not replication:
            assert res.plan.num_stages == S


@pytest.mark.parametrize("replication", [False, True])
@pytest.mark.parametrize("out", [0.0, 2e6])
def test_zero_compute(out, replication):
    """No compute at all (the lower bound is 0): the optimum is 0, or set by the cuts alone."""
    inst = chain([0.0] * 6, [out, 0.0, out, out, 0.0, 0.0], bandwidth=1e6)
    for S in (1, 3):
        p = PartitionProblem(inst, S, replication=replication)
        res = solve_probe(p, time_limit=None)
        assert res.status == Status.OPTIMAL
        assert close(res.objective, partition_optimum(inst, S, replication).value)


def test_no_split_fits_is_proven():
    inst = random_chain(1, 12, memory=1e6)
    for replication in (False, True):
        p = PartitionProblem(inst, 4, replication=replication)
        with pytest.raises(InfeasibleError):
            solve_probe(p)
        with pytest.raises(InfeasibleError):
            solve_dp(p)


def test_replication_only_fits_with_replicas():
    """No straight split fits (the first stage keeps S microbatches), one stage on all workers
    does (one microbatch per replica): the replicated search starts from its top probe."""
    inst = chain([1.0] * 4, [0.0] * 4, act=[10.0, 1.0, 1.0, 1.0], memory=20.0)
    p = PartitionProblem(inst, 4, replication=True)
    res = solve_probe(p)
    assert res.evaluation.feasible and close(res.objective, partition_optimum(inst, 4, True).value)
    with pytest.raises(InfeasibleError):
        solve_probe(PartitionProblem(inst, 4))


# ---- the probe at arbitrary trial periods ------------------------------------------------------
def _straight_splits(p):
    for cuts in itertools.combinations(range(1, p.n), p.stages - 1):
        yield list(cuts), None


def _replicated_splits(p):
    for k in range(1, min(p.n, p.stages) + 1):
        for cuts in itertools.combinations(range(1, p.n), k - 1):
            for reps in itertools.product(range(1, p.stages + 1), repeat=k):
                if sum(reps) == p.stages:
                    yield list(cuts), list(reps)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(inst=instances(max_layers=7), data=st.data())
def test_probe_answers_every_trial_period_exactly(inst, data):
    """At every T between two periods some split has, the probe says "feasible" iff a split
    that fits memory has period <= T, and its split then has period <= T."""
    n = inst.chain.n
    S = data.draw(st.integers(1, min(n, 4)), label="S")
    replication = data.draw(st.booleans(), label="replication")
    p = PartitionProblem(inst, S, replication=replication)
    probe = ReplicatedProbe(p) if replication else StraightProbe(p)
    splits = _replicated_splits(p) if replication else _straight_splits(p)
    values = []
    for starts, reps in splits:
        if evaluate(inst, p.plan(starts, reps)).feasible:
            values.append(p.period(starts, reps))
    values = sorted(set(values))
    if not values:
        return
    trials = [values[0] * 0.5] + [(a + b) / 2 for a, b in itertools.pairwise(values)] + [values[-1] * 1.5]
    Ts = np.array(sorted(set(trials)))
    out = probe.run(Ts, keep=True)
    want = int(np.searchsorted(Ts, values[0]))  # first trial period >= the optimum
    assert out.first == want
    if out.first < Ts.size:
        assert p.period(out.starts, out.replicas) <= Ts[out.first] * (1 + 1e-12)
        assert evaluate(inst, p.plan(out.starts, out.replicas)).feasible


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 3), width=st.integers(1, 12), data=st.data())
def test_window_min_is_the_minimum_over_each_window(rows, width, data):
    K = np.array(data.draw(st.lists(st.floats(-5, 5) | st.just(math.inf), min_size=rows * width,
                                    max_size=rows * width))).reshape(rows, width)
    q = data.draw(st.integers(1, 10))
    hi = np.sort(np.array(data.draw(st.lists(st.integers(-1, width - 1), min_size=q, max_size=q))))
    use_lo = data.draw(st.booleans())
    lo = np.sort(np.array(data.draw(st.lists(st.integers(0, width), min_size=q, max_size=q)))) if use_lo else None
    got = window_min(K, hi, lo)
    for t in range(q):
        a = 0 if lo is None else lo[t]
        seg = K[:, a:hi[t] + 1]
        want = seg.min(axis=1) if seg.shape[1] else np.full(rows, np.inf)
        assert np.array_equal(got[:, t], want)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 3), width=st.integers(1, 40), data=st.data())
def test_sparse_table_is_the_minimum_over_each_window(rows, width, data):
    """The sparse table the probes use for long windows (and the replicated probe under memory)."""
    K = np.array(data.draw(st.lists(st.floats(-5, 5) | st.just(math.inf), min_size=2 * rows * width,
                                    max_size=2 * rows * width))).reshape(rows, 2, width)
    q = data.draw(st.integers(1, 8))
    pairs = [sorted(data.draw(st.tuples(st.integers(-2, width - 1), st.integers(-2, width - 1)))) for _ in range(rows * q)]
    lo = np.array([p[0] for p in pairs]).reshape(rows, q)
    hi = np.array([p[1] for p in pairs]).reshape(rows, q)
    if data.draw(st.booleans()):
        lo, hi = hi, lo  # some empty windows
    got = _range_min(K, lo, hi)
    for m in range(rows):
        for t in range(q):
            a, b = max(lo[m, t], 0), hi[m, t]
            want = K[m, :, a:b + 1].min(axis=1) if b >= a else np.full(2, np.inf)
            assert np.array_equal(got[m, t], want)


def test_memory_lower_end_is_the_rule_itself():
    inst = random_chain(5, 30, memory=5e7, stashing=True)
    p = PartitionProblem(inst, 5)
    mem = Memory(p)
    j = np.arange(0, p.n + 1)
    for k in (1, 3, 5):
        for floor in (0, 7):
            lo = mem.lower_end(k, j[j >= floor], floor)
            for jj, got in zip(j[j >= floor], lo):
                fit = [i for i in range(floor, jj) if p.fits(p.stage_memory(i, jj, k))]
                assert got == (fit[0] if fit else jj)


# ---- the method's contract --------------------------------------------------------------------
def test_time_limit_keeps_a_valid_bound():
    inst = random_chain(2, 200)
    p = PartitionProblem(inst, 16)
    res = solve_probe(p, time_limit=1e-6)
    assert res.status == Status.TIME_LIMIT
    if res.plan is not None:
        assert res.lower_bound <= res.objective
    assert res.lower_bound <= solve_probe(p).objective * (1 + 1e-12)


def test_tie_break_skipped_beyond_its_size(monkeypatch):
    inst = random_chain(4, 30)
    p = PartitionProblem(inst, 4)
    monkeypatch.setattr(probe_module, "TIE_BREAK_WORK", 0)
    res = solve_probe(p, time_limit=None)
    assert res.status == Status.OPTIMAL and "skipped" in res.info["secondary"]
    assert close(res.objective, solve_dp(p).objective)


def test_other_objectives_are_refused():
    inst = random_chain(0, 10).with_settings(objective="iteration")
    with pytest.raises(InvalidProblemError, match="probe"):
        solve_probe(PartitionProblem(inst, 2))
