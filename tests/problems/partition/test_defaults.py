"""The default exact partition method (``auto``), the dense DP's size limit, and long chains built
from arrays (:meth:`pipeopt.Instance.from_chain`)."""

from __future__ import annotations

import json
import math

import networkx as nx
import numpy as np
import pytest
from conftest import profile

import pipeopt
from pipeopt import Cluster, Instance, PartitionProblem, Settings, evaluate, registry
from pipeopt.cli import main
from pipeopt.cost import CostTable
from pipeopt.cost.arrays import LayerArrays, layer_arrays
from pipeopt.errors import InvalidClusterError, InvalidGraphError, InvalidProblemError
from pipeopt.graph import ChainGraph
from pipeopt.problems.partition import auto
from pipeopt.problems.partition.dp import DENSE_LIMIT, dense_bytes, solve_dp
from pipeopt.problems.partition.probe import solve_probe
from pipeopt.result import Status


def arrays(n: int, seed: int = 0, skips_per: int = 20):
    """A synthetic chain's arrays (times in seconds, bytes), with one skip edge per ``skips_per``
    layers: what ``benchmarks/partition_scale.py`` draws."""
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(0.1e-3, 1e-3, n)
    act = rng.uniform(0.1e6, 4e6, n)
    par = rng.uniform(0.0, 2e6, n)
    k = n // skips_per
    tail = rng.integers(0, max(n - 2, 1), k)
    head = np.minimum(tail + rng.integers(2, 21, k), n - 1)
    keep = head > tail + 1
    skips = np.unique(np.stack([tail[keep], head[keep]], axis=1), axis=0)
    return fwd, act, par, skips


def chain_instance(n: int, devices: int, seed: int = 0, **kw) -> Instance:
    fwd, act, par, skips = arrays(n, seed)
    return Instance.from_chain(fwd, 2 * fwd, out_bytes=act, act_bytes=act, param_bytes=par, skips=skips,
                               cluster=Cluster.homogeneous(devices, bandwidth=1e10), name=f"chain-{n}", **kw)


def graph_instance(n: int, devices: int, seed: int = 0) -> Instance:
    """The same chain as :func:`chain_instance`, as a networkx graph built node by node."""
    fwd, act, par, skips = arrays(n, seed)
    g = nx.DiGraph()
    g.add_nodes_from((i, {"fwd": {"gpu": float(fwd[i])}, "bwd": {"gpu": float(2 * fwd[i])}, "out_bytes": float(act[i]),
                          "act_bytes": float(act[i]), "param_bytes": float(par[i])}) for i in range(n))
    g.add_edges_from((i, i + 1) for i in range(n - 1))
    g.add_edges_from((int(a), int(b)) for a, b in skips)
    return Instance(g, Cluster.homogeneous(devices, bandwidth=1e10), name=f"chain-{n}")


# ---- auto --------------------------------------------------------------------------------------
def test_auto_is_the_default_and_names_what_ran():
    assert next(m.name for m in registry.methods("partition") if m.exact) == "auto"
    assert next(m.name for m in registry.methods("group") if m.exact) == "types"
    assert not registry.method("partition", "auto").default  # no bench row repeating dp or probe
    small = profile("vgg16")  # (n+1)^2 S small: the dense DP
    res = pipeopt.solve(small, stages=4, time_limit=None)
    assert res.method == "dp" == res.info["chosen"]["method"] and res.info["chosen"]["by"] == "auto"
    assert res.status == Status.OPTIMAL
    big = profile("resnet50")  # replicated, (n+1)^2 S^2 = 2e6: probe
    res = pipeopt.solve(big, stages=8, replication=True, time_limit=None)
    assert res.method == "probe" == res.info["chosen"]["method"] and "bottleneck" in res.info["chosen"]["rule"]
    dp = solve_dp(PartitionProblem(big, 8, replication=True), time_limit=None)
    assert res.objective == pytest.approx(dp.objective, rel=1e-9)


def test_auto_rule_follows_the_documented_thresholds():
    inst = profile("gnmt")  # n = 45
    n = inst.chain.n
    for S, rep in ((4, False), (16, False), (4, True), (8, True), (16, True)):
        p = PartitionProblem(inst, S, replication=rep)
        work = (n + 1) ** 2 * S * (S if rep else 1)
        assert auto.choose(p)[0] == ("dp" if work <= auto.AUTO_DP_WORK else "probe")
    it = inst.with_settings(objective="iteration")
    assert auto.choose(PartitionProblem(it, 4))[0] == "milp"


# ---- the dense DP's limit ------------------------------------------------------------------------
def test_dense_dp_refuses_what_it_cannot_hold_before_allocating():
    inst = chain_instance(20_000, 4)
    p = PartitionProblem(inst, 4)
    assert dense_bytes(p) > DENSE_LIMIT  # 5 + 1 matrices of 20,001^2 floats: 17.9 GiB
    with pytest.raises(InvalidProblemError, match="probe") as info:
        solve_dp(p, time_limit=None)
    assert "GiB" in str(info.value) and "DENSE_LIMIT" in str(info.value)
    rep = PartitionProblem(chain_instance(2_500, 64), 64, replication=True)  # S matrices kept: 64 + 5
    with pytest.raises(InvalidProblemError, match="probe"):
        solve_dp(rep, time_limit=None)
    ok = PartitionProblem(chain_instance(300, 4), 4)  # small: under the limit, solved
    assert dense_bytes(ok) <= DENSE_LIMIT
    assert solve_dp(ok, time_limit=None).status == Status.OPTIMAL


# ---- chains from arrays --------------------------------------------------------------------------
def test_chain_from_arrays_is_the_same_instance_as_its_graph():
    fast, slow = chain_instance(2_000, 16), graph_instance(2_000, 16)
    assert isinstance(fast.graph, ChainGraph) and not fast.graph.materialized
    assert fast.num_layers == 2_000 and 5 in fast.graph and "x" not in fast.graph and list(fast.graph)[:3] == [0, 1, 2]
    assert fast.chain.units == slow.chain.units
    for k in ("fwd", "bwd"):
        assert np.array_equal(getattr(fast.chain, k)["gpu"], getattr(slow.chain, k)["gpu"])
    a, b = layer_arrays(fast), LayerArrays(slow.graph)
    assert a.nodes == b.nodes and np.array_equal(a.tail, b.tail) and np.array_equal(a.head, b.head)
    assert np.array_equal(a.edge_bytes, b.edge_bytes) and np.array_equal(a.param, b.param)
    assert np.array_equal(a.fwd["gpu"], b.fwd["gpu"]) and np.array_equal(a.has_bwd["gpu"], b.has_bwd["gpu"])
    assert np.array_equal(CostTable(fast, 16).boundary_bytes, CostTable(slow, 16).boundary_bytes)
    assert not fast.graph.materialized  # all of the above read the arrays
    for S, rep in ((4, False), (16, True)):
        r1 = solve_probe(PartitionProblem(fast, S, replication=rep), time_limit=None)
        r2 = solve_probe(PartitionProblem(slow, S, replication=rep), time_limit=None)
        assert r1.objective == r2.objective and r1.plan == r2.plan
    assert evaluate(slow, r1.plan).objective == r1.objective
    # the networkx view, built on demand, is the graph itself
    assert fast.graph.nodes[7] == slow.graph.nodes[7] and list(fast.graph.edges) == list(slow.graph.edges)
    assert fast.graph.materialized and nx.is_directed_acyclic_graph(fast.graph)
    assert fast.replace(settings=Settings(overlap=False)).chain.n == 2_000


def test_chain_graph_copies_and_pickles():
    """networkx's copy/subgraph/reverse build ``ChainGraph()``: an ordinary graph; pickling keeps
    the arrays (a bench worker process gets the same instance)."""
    import pickle

    from pipeopt.graph import is_array_chain

    inst = chain_instance(300, 4)
    res = pipeopt.solve(inst, stages=4, time_limit=None)
    back = pickle.loads(pickle.dumps(inst))
    assert is_array_chain(back.graph) and not back.graph.materialized
    assert pipeopt.solve(back, stages=4, time_limit=None).objective == res.objective
    copy = inst.graph.copy()
    assert not is_array_chain(copy) and copy.number_of_nodes() == 300 and len(copy) == 300 and 299 in copy
    assert copy.number_of_edges() == inst.graph.number_of_edges()
    assert pipeopt.solve(Instance(copy, inst.cluster), stages=4, time_limit=None).objective == res.objective
    sub = inst.graph.subgraph(range(10))
    assert list(sub) == list(range(10)) and sub.number_of_edges() >= 9
    assert inst.graph.reverse().number_of_edges() == copy.number_of_edges()


def test_chain_from_arrays_refuses_bad_arrays():
    f, one = np.full(5, 1e-3), np.ones(5)

    def build(**kw):
        args = {"fwd": f, "bwd": 2 * f, "out_bytes": one, "act_bytes": one, "param_bytes": one,
                "cluster": Cluster.homogeneous(2)}
        args.update(kw)
        return Instance.from_chain(args.pop("fwd"), args.pop("bwd"), **args)

    for kw, needle in [
        ({"fwd": np.array([1e-3, -1.0, 1e-3, 1e-3, 1e-3])}, "negative or invalid fwd"),
        ({"bwd": np.array([1e-3, np.nan, 1e-3, 1e-3, 1e-3])}, "negative or invalid bwd"),
        ({"fwd": np.full(5, 1e10)}, "above the maximum"),
        ({"out_bytes": np.ones(4)}, "1-D array of 5"),
        ({"act_bytes": np.array([1, 1, -1, 1, 1.0])}, "act_bytes"),
        ({"param_bytes": np.full(5, 1e15)}, "add up to"),
        ({"fwd": {"gpu": f, "cpu": f}, "bwd": {"gpu": f}}, "forward times on"),
        ({"fwd": np.full(5, math.inf), "bwd": np.full(5, math.inf)}, "cannot run on any"),
        ({"skips": np.array([[0, 1]])}, "past the next layer"),
        ({"skips": np.array([[3, 9]])}, "past the next layer"),
        ({"skips": np.array([[0, 2], [0, 2]])}, "repeats"),
        ({"names": ["a", "b", "a", "c", "d"]}, "repeat"),
        ({"fwd": np.zeros(0), "bwd": np.zeros(0)}, "no layers"),
    ]:
        with pytest.raises(InvalidGraphError, match=needle):
            build(**kw)
    with pytest.raises(InvalidClusterError, match="runs only on"):
        build(fwd={"cpu": f}, bwd={"cpu": f})
    inst = build(names=list("abcde"), skips=np.array([[0, 3]]), skip_bytes=[7.0])
    assert inst.graph.edges["a", "d"]["bytes"] == 7.0 and "bytes" not in inst.graph.edges["a", "b"]


def test_default_solve_of_a_long_chain_is_the_proven_optimum():
    """``pipeopt.solve`` with no method on a 10^5-layer chain: ``probe`` runs and proves it."""
    inst = chain_instance(100_000, 16)
    res = pipeopt.solve(inst, stages=16, time_limit=None)
    assert res.status == Status.OPTIMAL and res.method == "probe" and res.info["chosen"]["by"] == "auto"
    assert not inst.graph.materialized  # no networkx dict was built
    assert res.lower_bound <= res.objective <= res.lower_bound * (1 + 1e-9)
    assert evaluate(inst, res.plan).objective == res.objective
    p = PartitionProblem(inst, 16)
    assert res.objective >= p.simple_lower_bound()  # total work / S, the largest layer
    # the split is a local optimum too: moving any cut by one layer is not better
    starts = p.starts_of(res.plan)
    for s in range(len(starts)):
        for d in (-1, 1):
            moved = list(starts)
            moved[s] += d
            if all(a < b for a, b in zip([0, *moved], [*moved, p.n], strict=True)):
                assert p.period(moved) >= res.objective * (1 - 1e-12)


@pytest.mark.slow  # 10^5 layers through JSON and a networkx graph: several seconds
def test_cli_solve_of_a_long_chain_without_method(tmp_path, capsys):
    """``pipeopt solve FILE`` with no ``--method`` on a 10^5-layer chain (native JSON): proven."""
    n = 100_000
    fwd, act, par, skips = arrays(n)
    nodes = [{"id": i, "fwd": {"gpu": f}, "bwd": {"gpu": 2 * f}, "out_bytes": a, "act_bytes": a, "param_bytes": w}
             for i, (f, a, w) in enumerate(zip(fwd.tolist(), act.tolist(), par.tolist(), strict=True))]
    edges = [{"source": i, "target": i + 1} for i in range(n - 1)]
    edges += [{"source": int(a), "target": int(b)} for a, b in skips]
    doc = {"format": "pipeopt-instance", "version": 1, "name": "chain-1e5",
           "cluster": {"bandwidth": 1e10, "devices": [{"name": f"gpu{i}", "resources": {"gpu": 1.0}, "memory": None}
                                                      for i in range(16)]},
           "graph": {"nodes": nodes, "edges": edges}}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(doc))
    assert main(["solve", str(path), "--stages", "16", "--time-limit", "600", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal" and out["method"] == "probe"
    ref = pipeopt.solve(chain_instance(n, 16), stages=16, method="probe", time_limit=None)
    assert out["objective"] == pytest.approx(ref.objective, rel=1e-12)
