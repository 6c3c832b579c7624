"""The placement problem (Tarnawski et al., NeurIPS 2020, max-load): the DP over ideals and the
convex MILP against a brute force over every convex ordered split and device assignment.

* random small DAGs (hypothesis): brute force = dp = milp (CBC; HiGHS on a few), every
  method's objective is pipeopt.evaluate of its plan, one_order is never below dp;
* a hand-made DAG where the convex optimum is strictly better than one_order;
* memory bound exactly at capacity with non-integral bytes; infeasible memory raises;
* the authors' workloads: dp's max-load equals what their dp.exe prints.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import brute_force as bf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeopt
from pipeopt import Cluster, Device, Instance, Settings, evaluate
from pipeopt.errors import InfeasibleError
from pipeopt.graph import layer_order
from pipeopt.io.dnn_partitioning import read_dnn_partitioning
from pipeopt.problems.placement import PlacementProblem
from pipeopt.problems.placement.milp import solve_milp
from pipeopt.result import Status

BANDWIDTH = 1e9
EXACT = [("dp", {}), ("milp", {"solver": "cbc"}), ("milp", {"solver": "highs"})]
LAYER_GRAPHS = Path("/work/shared/data/dnn-partitioning/throughput-inputs/LayerGraphs")


# ---- instances ---------------------------------------------------------------------------------
def make_instance(layers: dict, edges, tensors, fpgas: int, memory: float, cpu: bool,
                  name: str = "placement", latency: float = 0.0) -> Instance:
    """``layers``: name -> (fpga seconds or None if unsupported, cpu seconds, param bytes, act bytes);
    fwd and bwd each get half of a time (so the sum is the given time)."""
    g = nx.DiGraph()
    for x, (tf, tc, pb, ab) in layers.items():
        fwd = {"cpu": tc / 2}
        bwd = {"cpu": tc - tc / 2}
        if tf is not None:
            fwd["fpga"] = tf / 2
            bwd["fpga"] = tf - tf / 2
        g.add_node(x, fwd=fwd, bwd=bwd, out_bytes=0.0, param_bytes=float(pb), act_bytes=float(ab))
    g.add_edges_from(edges)
    g.graph["tensors"] = [[s, list(r), float(b)] for s, r, b in tensors]
    devices = [Device(f"fpga{i}", {"fpga": 1.0}, memory) for i in range(fpgas)]
    if cpu:
        devices.append(Device("cpu0", {"cpu": 1.0}, host=True))
    settings_ = Settings(objective="max_load", overlap=False)  # as read_dnn_partitioning
    return Instance(g, Cluster(tuple(devices), BANDWIDTH, latency), settings_, name=name)


seconds = st.one_of(st.just(0.0), st.floats(min_value=1e-4, max_value=0.01, allow_nan=False))
byte_counts = st.one_of(st.just(0.0), st.floats(min_value=1.0, max_value=1e9, allow_nan=False),
                        st.integers(1, 10**9).map(float))
# a tensor's bytes: zero, or non-integral from a thousandth of a byte up (a subnormal count such as
# 5e-300 would put 290 decades between the times of one model, which no MILP solver resolves: the
# MILP then honestly reports FEASIBLE, not the OPTIMAL these tests assert)
tensor_bytes = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e7, allow_nan=False))


@st.composite
def placements(draw):
    """A random DAG of <= 8 layers (edges i -> j, i < j, possibly disconnected), 1-3 accelerators
    with a memory limit, maybe a host CPU; explicit tensors (forward ones to a subset of the
    successors, backward ones from a head to its tail, and some to any later or earlier layer)."""
    n = draw(st.integers(1, 8))
    cpu = draw(st.booleans())
    fpgas = draw(st.integers(1, 3))
    names = [f"l{i}" for i in range(n)]
    layers = {}
    for x in names:
        supported = not cpu or draw(st.integers(0, 4)) > 0  # without a CPU every layer runs on the fpga
        tf = draw(seconds) if supported else None
        # a layer that cannot run on the fpga takes time on the cpu (evaluate prices a stage
        # whose every named time is 0 at 0 on any device); one that can may be free (0 s
        # everywhere: the DP merges such a layer into its neighbour)
        tc = draw(st.floats(min_value=1e-4, max_value=0.03, allow_nan=False) if tf is None else
                  st.one_of(st.just(0.0), st.floats(min_value=1e-4, max_value=0.03, allow_nan=False)))
        layers[x] = (tf, tc, draw(byte_counts), draw(st.sampled_from([0.0, 0.5, 1234.25])))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = [(names[i], names[j]) for i, j in pairs if draw(st.integers(0, 2)) == 0]
    tensors = []
    g = nx.DiGraph(edges)
    for u in names:
        succ = sorted(g.successors(u)) if u in g else []
        if succ:
            readers = draw(st.lists(st.sampled_from(succ), min_size=1, unique=True))
            tensors.append((u, readers, draw(tensor_bytes)))
    for u, v in edges:  # gradients sent back by the head to the tail
        if draw(st.booleans()):
            tensors.append((v, [u], draw(tensor_bytes)))
    for _ in range(draw(st.integers(0, 2))):  # tensors between any two layers, either direction
        if n > 1:
            a, b = draw(st.permutations(range(n)))[:2]
            tensors.append((names[a], [names[b]], draw(tensor_bytes)))
    total = [layers[x][2] + layers[x][3] for x in names]
    mode = draw(st.sampled_from(["subset", "subset", "between", "loose"]))
    if mode == "subset":  # exactly the bytes of some layers: a plan can bind it exactly
        chosen = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        memory = sum(layers[x][2] + layers[x][3] for x in chosen)
    elif mode == "between":
        memory = draw(st.floats(min_value=max(total), max_value=max(sum(total), max(total)) + 1.0))
    else:
        memory = sum(total) * 2
    if not memory > 0:
        memory = math.inf
    latency = draw(st.sampled_from([0.0, 0.0, 1e-4, 3e-3]))  # alpha: one message per tensor and stage
    return make_instance(layers, edges, tensors, fpgas, memory, cpu, latency=latency)


def close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def solve(inst, method, **kw):
    return pipeopt.solve(inst, problem="placement", method=method, time_limit=None, **kw)


def solve_or_inf(inst, method, **kw):
    try:
        return solve(inst, method, **kw)
    except InfeasibleError:
        return None


def check_result(inst, r, reference: float, rel: float) -> None:
    """The result's objective is evaluate's of its plan, equals the reference, and its bound is
    at most the reference."""
    assert r.status == Status.OPTIMAL
    ev = evaluate(inst, r.plan)
    assert ev.feasible
    assert close(r.objective, ev.objective, 1e-9)
    assert close(r.objective, reference, rel), (r.method, r.objective, reference)
    assert r.lower_bound <= reference * (1 + 1e-9) + 1e-12


# ---- (a) random DAGs ---------------------------------------------------------------------------
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_dp_and_milp_equal_brute_force(inst):
    value, plan = bf.placement_optimum(inst)
    if not math.isfinite(value):
        for method in ("dp", "milp", "one_order"):
            with pytest.raises(InfeasibleError):
                solve(inst, method)
        return
    assert close(evaluate(inst, plan).objective, value, 1e-12)
    dp = solve(inst, "dp")
    check_result(inst, dp, value, 1e-9)
    # the MILP stops at a relative gap of 1e-7 (MILP_REL_GAP): a plan within 1e-6 of the optimum
    milp = solve(inst, "milp", solver="cbc")
    check_result(inst, milp, value, 1e-6)
    one = solve_or_inf(inst, "one_order")
    if one is not None:
        assert one.space == "one-order"
        assert close(one.objective, evaluate(inst, one.plan).objective, 1e-9)
        assert one.objective >= dp.objective * (1 - 1e-9)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_milp_proves_an_optimum_far_below_its_warm_start(solver):
    """The one-order warm start is 0.0156 s and the optimum 1e-9 s (one byte at 1 GB/s): the
    model measured in 1/100 of the warm start left the solver's absolute gap a large share of
    the optimum (the result said FEASIBLE); it is solved again against the optimum found."""
    inst = make_instance({"l0": (0.0, 0.0, 1, 0), "l1": (0.0, 0.015625, 1, 0), "l2": (0.0, 0.0, 1, 0)},
                         [("l0", "l1")], [("l0", ["l1"], 1.0)], fpgas=1, memory=1.0, cpu=True)
    value, _ = bf.placement_optimum(inst)
    assert value == pytest.approx(1e-9)
    check_result(inst, solve(inst, "milp", solver=solver), value, 1e-6)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_milp_highs_equals_brute_force(inst):
    value, _ = bf.placement_optimum(inst)
    if not math.isfinite(value):
        with pytest.raises(InfeasibleError):
            solve(inst, "milp", solver="highs")
        return
    check_result(inst, solve(inst, "milp", solver="highs"), value, 1e-6)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_an_optimum_far_below_a_class_compute_is_proven(solver):
    """Found by hypothesis: l0 runs in 0 s on the CPU host and 7.8 ms on an FPGA, l1 the other way
    round, one byte between them at 1 GB/s: the optimum is the 1 ns transfer the FPGA receives.
    With the load rows' big-M at the FPGA's whole compute (7.8e8 times T's unit) HiGHS accepted a
    load of half of it within its integrality tolerance, and the method said FEASIBLE (its bound
    half the optimum). Capped at the warm start's max-load, both solvers prove it."""
    g = nx.DiGraph()
    g.add_node("l0", fwd={"cpu": 0.0, "fpga": 2**-8}, bwd={"cpu": 0.0, "fpga": 2**-8}, out_bytes=0.0, param_bytes=0.0,
               act_bytes=0.0)
    g.add_node("l1", fwd={"cpu": 2**-7, "fpga": 0.0}, bwd={"cpu": 2**-7, "fpga": 0.0}, out_bytes=0.0, param_bytes=0.0,
               act_bytes=0.0)
    g.graph["tensors"] = [["l0", ["l1"], 1.0]]
    devices = (Device("fpga0", {"fpga": 1.0}), Device("fpga1", {"fpga": 1.0}), Device("cpu0", {"cpu": 1.0}, host=True))
    inst = Instance(g, Cluster(devices, bandwidth=1e9), Settings(objective="max_load"), name="placement")
    value, _ = bf.placement_optimum(inst)
    assert value == pytest.approx(1e-9)
    check_result(inst, pipeopt.solve(inst, method="milp", solver=solver), value, 1e-6)


def test_memory_binds_exactly_at_capacity():
    """0.1 + 0.2 bytes on a device of 0.3 (the float sum is 0.30000000000000004, within the cost
    model's slack): the only plan that fits puts a and b together and c alone."""
    layers = {"a": (1.0, 5.0, 0.1, 0.0), "b": (1.0, 5.0, 0.2, 0.0), "c": (2.0, 5.0, 0.3, 0.0)}
    tensors = [("a", ["b"], 0.0), ("b", ["c"], 0.0)]
    inst = make_instance(layers, [("a", "b"), ("b", "c")], tensors, 2, 0.3, False)
    value, plan = bf.placement_optimum(inst)
    assert value == 2.0 and [s.layers for s in plan.stages] == [("a", "b"), ("c",)]
    assert evaluate(inst, plan).memory[0] == 0.1 + 0.2 > 0.3
    for method, kw in EXACT:
        r = solve(inst, method, **kw)
        check_result(inst, r, 2.0, 1e-9)
        assert [s.layers for s in r.plan.stages] == [("a", "b"), ("c",)]


def _one_byte_beside_a_full_device():
    """l3 fills a device exactly and l1 holds 1 byte: with the memory rows scaled to the
    capacity (l1's coefficient 8e-7), HiGHS 1.14's presolve declared the model infeasible
    (without a start) or missed the optimum 0 (with one)."""
    b = [0.0, 1.0, 1714.0, 1249787.0, 0.0, 0.0, 0.0]
    layers = {f"l{i}": (0.0, 0.0, b[i], 1234.25 if i == 6 else 0.0) for i in range(7)}
    edges = [("l0", x) for x in ("l3", "l4", "l5", "l6")] + [("l1", x) for x in ("l2", "l3", "l4", "l5", "l6")]
    tensors = [("l0", ["l3"], 1.0), ("l1", ["l2", "l3", "l4"], 0.0)]
    return make_instance(layers, edges, tensors, 3, 1249787.0, False)


def _two_units_filling_the_big_m():
    """Both units together (on the cpu) fill the accelerators' memory row exactly when its big-M
    was the units' bytes less the capacity: CBC's preprocessing strengthened the row and then
    rejected every solution by 1.2e-7 on a row of 10^6, and said "proven infeasible"."""
    layers = {"l0": (0.0, 0.0, 0.0, 0.5), "l1": (0.0, 0.0, 1722.0, 1234.25)}
    tensors = [("l1", ["l0"], 4666803.769000848), ("l1", ["l0"], 1e-15)]
    return make_instance(layers, [], tensors, 3, 2956.25, True)


def _cpu_slot_meets_the_accelerator_row():
    """The same exactly-met big-M (the five units the accelerator can hold, all on the cpu): CBC
    and HiGHS both returned max-load 0.0169 / 0.0093 as proven optimal; the optimum is 0.0022
    (l2 alone on the accelerator)."""
    layers = {"l0": (0.0, 0.0, 672179778.0, 1234.25), "l1": (0.005381419910193443, 0.001389328536852497, 2.0, 0.0),
              "l2": (0.0, 0.015915823311249452, 0.0, 0.0), "l3": (0.0, 0.0, 672179778.0, 1234.25),
              "l4": (0.0, 0.0, 0.0, 1234.25), "l5": (0.0, 0.0001, 0.0, 1234.25)}
    edges = [("l0", "l1"), ("l0", "l3"), ("l0", "l4"), ("l0", "l5"), ("l2", "l5"), ("l3", "l5")]
    tensors = [("l0", ["l3"], 5738996.228975014), ("l2", ["l5"], 2206124.6696873466), ("l3", ["l5"], 0.0),
               ("l4", ["l0"], 8230107.453454225), ("l5", ["l0"], 9299101.303884458)]
    return make_instance(layers, edges, tensors, 1, 672181012.25, True)


@pytest.mark.parametrize("case", [_one_byte_beside_a_full_device, _two_units_filling_the_big_m,
                                  _cpu_slot_meets_the_accelerator_row], ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("solver", ["cbc", "highs"])
@pytest.mark.parametrize("warm_start", [True, False])
def test_milp_memory_rows_regressions(case, solver, warm_start):
    """Instances the random test found where the solvers' presolves went wrong on earlier forms
    of the memory rows (now in millionths of the capacity, big-M with a margin)."""
    inst = case()
    value, _ = bf.placement_optimum(inst)
    assert math.isfinite(value)
    r = solve_milp(PlacementProblem(inst), solver=solver, warm_start=warm_start)
    check_result(inst, r, value, 1e-6)
    assert close(solve(inst, "dp").objective, value, 1e-9)


# ---- (b) convex beats one order ----------------------------------------------------------------
def test_convex_strictly_better_than_one_order():
    """Two independent chains l0 -> l2 and l1 -> l3 on two accelerators, every layer 10 s, each
    chain sending a tensor of 5 s along its edge. pipeopt's layer order is l0, l1, l2, l3 (ties by
    name), and the contiguous splits of it are: one device, 40; {l0}|{l1,l2,l3} and
    {l0,l1,l2}|{l3}, 30 + 5 = 35 on the big stage; {l0,l1}|{l2,l3}, 20 + 5 + 5 = 30 on each
    stage (both tensors cut): the one-order optimum is 30. The convex split {l0,l2}|{l1,l3} (one
    chain per device; ordered either way, no edge joins them) cuts no tensor: max-load 20."""
    layers = {f"l{i}": (10.0, 50.0, 0.0, 0.0) for i in range(4)}
    edges = [("l0", "l2"), ("l1", "l3")]
    tensors = [("l0", ["l2"], 5.0 * BANDWIDTH), ("l1", ["l3"], 5.0 * BANDWIDTH)]
    inst = make_instance(layers, edges, tensors, 2, math.inf, False)
    assert layer_order(inst.graph) == ["l0", "l1", "l2", "l3"]
    one = solve(inst, "one_order")
    assert one.objective == pytest.approx(30.0, rel=1e-12)
    value, _ = bf.placement_optimum(inst)
    assert value == pytest.approx(20.0, rel=1e-12)
    for method, kw in EXACT:
        r = solve(inst, method, **kw)
        check_result(inst, r, 20.0, 1e-9)
        assert sorted(s.layers for s in r.plan.stages) == [("l0", "l2"), ("l1", "l3")]
        assert r.objective < one.objective


# ---- (c) infeasible memory ---------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(10.0, 10.0), (10.0, 20.0)], ids=["together-too-big", "one-layer-too-big"])
@pytest.mark.parametrize("method,kw", EXACT)
def test_infeasible_memory_raises(sizes, method, kw):
    """One accelerator of 15 bytes: two layers of 10 bytes each fit alone but not together (no
    second device); or one layer is larger than the device."""
    layers = {"a": (1.0, 1.0, sizes[0], 0.0), "b": (1.0, 1.0, sizes[1], 0.0)}
    inst = make_instance(layers, [("a", "b")], [("a", ["b"], 1.0)], 1, 15.0, False)
    assert bf.placement_optimum(inst)[0] == math.inf
    with pytest.raises(InfeasibleError):
        solve(inst, method, **kw)


def test_zero_time_layer_without_the_device_kind():
    """Found while writing the random test (which therefore gives every layer that cannot run on
    the fpga a positive cpu time). a1 and a2 run only on the cpu and take 0 s there. For the DP
    and the MILP they must both sit on the one cpu, so x (between them) joins them: 50 s on the
    cpu. Once a defect: pipeopt.evaluate (rules.load_time: "0 for an empty load", judged on the
    kinds the stage's layers name) accepted a1 alone on an fpga at load 0, and scored
    w | a1 | x | a2 | y on fpga0, fpga1, fpga2, cpu0, fpga3 at 1 s."""
    layers = {"w": (1.0, 50.0, 0.0, 0.0), "a1": (None, 0.0, 0.0, 0.0), "x": (1.0, 50.0, 0.0, 0.0),
              "a2": (None, 0.0, 0.0, 0.0), "y": (1.0, 50.0, 0.0, 0.0)}
    edges = [("w", "a1"), ("a1", "x"), ("x", "a2"), ("a2", "y")]
    inst = make_instance(layers, edges, [], 4, 100.0, True)
    value, _ = bf.placement_optimum(inst)
    assert value == 50.0
    assert solve(inst, "dp").objective == value


# ---- (d) the authors' workloads ----------------------------------------------------------------
@pytest.mark.parametrize("name,ms", [("bert24_inference", 17.789906), ("resnet50_inference", 33.774666)])
def test_dp_equals_dp_exe(name, ms):
    """Max-load printed by the authors' dp.exe on their workloads (ms, about 7 digits)."""
    path = LAYER_GRAPHS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"{path} is not present")
    inst = read_dnn_partitioning(path)
    r = solve(inst, "dp")
    assert r.status == Status.OPTIMAL
    assert r.objective * 1e3 == pytest.approx(ms, rel=1e-6)
    assert close(r.objective, evaluate(inst, r.plan).objective, 1e-9)
