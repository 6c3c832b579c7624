"""Tarnawski et al.'s dnn-partitioning workloads, read as their ``dp.cpp`` reads them.

Every expectation here is derived from the raw JSON (or from the authors' ``dp.exe``
output), never from the reader: colour classes with their backward nodes, empty forward
layers of backward-only classes with mirrored precedence, forward cycles between classes
fused, one tensor per node with out-edges; the max-load of the human-expert splits and of
the DP optimum; the reader's refusals through the CLI (one error line, exit 2) and the API.

The workloads are read from ../shared/data/dnn-partitioning (never copied here).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from functools import lru_cache
from pathlib import Path

import networkx as nx
import pytest

import pipeopt
from pipeopt import Cluster, Instance
from pipeopt.cli import main
from pipeopt.errors import InvalidProblemError, ReadError
from pipeopt.io.dnn_partitioning import read_dnn_partitioning, read_dnn_partitioning_split

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "dnn-partitioning"
THROUGHPUT = sorted((DATA / "throughput-inputs").glob("*/*.json"))
LAYER_GRAPHS = DATA / "throughput-inputs" / "LayerGraphs"
EXPERTS = DATA / "human-experts"

pytestmark = pytest.mark.skipif(not THROUGHPUT, reason="../shared/data/dnn-partitioning is not present")

# the real process, as tests/test_bad_input.py runs it (the package has no __main__ module)
CLI = [sys.executable, "-c", "import sys; from pipeopt.cli import main; sys.exit(main())"]


def _wid(path: Path) -> str:
    return f"{path.parent.name}-{path.stem}"


# ---- expectations from the raw file ---------------------------------------------------------
def _reach(start, succ) -> set:
    seen, todo = {start}, [start]
    while todo:
        for b in succ[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def _expected(raw: dict) -> dict:
    """The layers, precedence and tensors dp.cpp makes of a raw workload, each layer named by
    the frozenset of the file's node ids it holds."""
    back = {n["id"]: bool(n["isBackwardNode"]) for n in raw["nodes"]}
    cls = {n["id"]: ("c", n["colorClass"]) if "colorClass" in n else ("own", n["id"]) for n in raw["nodes"]}
    classes = set(cls.values())
    orphans = classes - {cls[i] for i in cls if not back[i]}
    prec = set()
    for e in raw["edges"]:
        u, v = e["sourceId"], e["destId"]
        cu, cv = cls[u], cls[v]
        if cu == cv:
            continue
        if not back[u] and not back[v]:
            prec.add((cu, cv))  # a forward edge between classes
        elif back[u] and back[v] and (cu in orphans or cv in orphans):
            prec.add((cv, cu))  # createArtificialForwardNodes: the mirror image of a backward edge
    succ = defaultdict(set)
    for a, b in prec:
        succ[a].add(b)
    reach = {c: _reach(c, succ) for c in classes}
    # fuseStronglyConnectedComponentsInForward: classes that reach each other share a layer
    group = {c: frozenset(d for d in reach[c] if c in reach[d]) for c in classes}
    members = defaultdict(set)
    for i, c in cls.items():
        members[group[c]].add(i)
    layer_of_class = {c: frozenset(members[group[c]]) for c in classes}
    layer = {i: layer_of_class[c] for i, c in cls.items()}
    lc = layer_of_class
    edges = {(lc[a], lc[b]) for a, b in prec if lc[a] != lc[b]}
    heads = defaultdict(set)
    cost = {}
    for e in raw["edges"]:
        heads[e["sourceId"]].add(e["destId"])
        cost[e["sourceId"]] = e["cost"]
    tensors = [
        (layer[i], {layer[v] for v in heads[i]} - {layer[i]}, cost[i])
        for i in (n["id"] for n in raw["nodes"]) if i in heads
    ]
    return {
        "classes": len(classes),
        "orphans": len(orphans),
        "layers": set(layer_of_class.values()),
        "layer": layer,
        "edges": edges,
        "tensors": tensors,
        "without_class": sum("colorClass" not in n for n in raw["nodes"]),
    }


@lru_cache(maxsize=None)
def _raw(path: Path) -> dict:
    return json.loads(path.read_text())


@lru_cache(maxsize=None)
def _expected_of(path: Path) -> dict:
    return _expected(_raw(path))


# ---- 1. the reader against the raw files -----------------------------------------------------
@pytest.mark.parametrize("path", THROUGHPUT, ids=_wid)
def test_layers_edges_and_tensors_from_the_raw_file(path):
    raw, exp = _raw(path), _expected_of(path)
    inst = read_dnn_partitioning(path)
    g = inst.graph
    assert inst.settings.objective == "max_load"

    # layers: the colour classes after fusing; every node in exactly one layer
    members = {x: frozenset(ms) for x, ms in g.nodes(data="members")}
    assert inst.num_layers == len(exp["layers"])
    count = Counter(m for _, ms in g.nodes(data="members") for m in ms)
    assert count == Counter(n["id"] for n in raw["nodes"])
    assert set(count.values()) == {1}
    assert set(members.values()) == exp["layers"]

    # precedence: forward edges between distinct classes, plus the mirrored edges of orphans
    got = {(members[a], members[b]) for a, b in g.edges}
    assert len(got) == g.number_of_edges()
    assert got == exp["edges"]

    # tensors: one per node with an out-edge (file order), read by its heads' other layers,
    # moved in the file's cost
    with_out = {e["sourceId"] for e in raw["edges"]}
    tensors = g.graph["tensors"]
    assert len(tensors) == len(with_out) == len(exp["tensors"])
    bw = inst.cluster.bandwidth
    for (src, readers, nbytes), (esrc, ereaders, ecost) in zip(tensors, exp["tensors"]):
        assert members[src] == esrc
        assert len(readers) == len(set(readers)) and {members[r] for r in readers} == ereaders
        assert nbytes / bw * 1e3 == pytest.approx(ecost, rel=1e-9, abs=1e-15)

    # each layer's times (s) and bytes are its members' sums, forward and backward apart
    node = {n["id"]: n for n in raw["nodes"]}
    for x, a in g.nodes(data=True):
        ms = [node[m] for m in a["members"]]
        kinds = {"cpu", "fpga"} if all(n["supportedOnFpga"] for n in ms) else {"cpu"}
        assert set(a["fwd"]) == set(a["bwd"]) == kinds, x
        for key, fb in (("fwd", False), ("bwd", True)):
            part = [n for n in ms if bool(n["isBackwardNode"]) == fb]
            assert a[key]["cpu"] == pytest.approx(sum(n["cpuLatency"] for n in part) / 1e3, abs=1e-12)
            if "fpga" in kinds:
                assert a[key]["fpga"] == pytest.approx(sum(n["fpgaLatency"] for n in part) / 1e3, abs=1e-12)
        assert a["param_bytes"] == pytest.approx(sum(n["size"] for n in ms))

    # the cluster: maxFPGAs accelerators with maxSizePerFPGA, maxCPUs host CPUs
    fpgas = [d for d in inst.cluster.devices if d.resources == {"fpga": 1.0}]
    cpus = [d for d in inst.cluster.devices if d.resources == {"cpu": 1.0}]
    assert len(fpgas) == raw["maxFPGAs"] and len(cpus) == raw["maxCPUs"]
    assert len(fpgas) + len(cpus) == len(inst.cluster.devices)
    assert all(d.memory == raw["maxSizePerFPGA"] for d in fpgas) and all(d.host for d in cpus)

    # the assumptions name the orphaned and the fused classes
    text = " ".join(inst.assumptions)
    fused = exp["classes"] - len(exp["layers"])
    assert (f"{exp['orphans']} backward-only colour class" in text) == (exp["orphans"] > 0)
    assert (f"{fused} colour class(es) fused" in text) == (fused > 0)


def test_the_workloads_exercise_every_rule():
    """The counts above are not vacuous: some workload has backward-only classes, mirrored
    precedence, fused classes, nodes without a colour class, and backward tensors."""
    exps = {p: _expected_of(p) for p in THROUGHPUT}
    assert len(THROUGHPUT) == 16
    assert any(e["orphans"] for e in exps.values())
    assert any(e["classes"] > len(e["layers"]) for e in exps.values())
    assert any(e["without_class"] for e in exps.values())
    # training graphs: more tensors than forward nodes with out-edges
    p = LAYER_GRAPHS / "bert24_training.json"
    forward = {n["id"] for n in _raw(p)["nodes"] if not n["isBackwardNode"]}
    fwd_out = {e["sourceId"] for e in _raw(p)["edges"]} & forward
    assert len(exps[p]["tensors"]) > len(fwd_out)


# ---- a tiny workload, by hand ----------------------------------------------------------------
def _node(i, cc, backward=False, cpu=2.0, fpga=1.0):
    return {"id": i, "name": f"op{i}", "cpuLatency": cpu, "fpgaLatency": fpga, "supportedOnFpga": True,
            "isBackwardNode": backward, "colorClass": cc, "size": 1e6}


def _edge(u, v, cost):
    return {"sourceId": u, "destId": v, "cost": cost}


# forward 1 -> 2, backward 3 -> 4; classes {1, 4} and {2, 3}; 1 ms per node on an FPGA
BASE = {
    "maxSizePerFPGA": 1e9, "maxFPGAs": 2, "maxCPUs": 1,
    "nodes": [_node(1, 1), _node(2, 2), _node(3, 2, True), _node(4, 1, True)],
    "edges": [_edge(1, 2, 0.5), _edge(2, 3, 0.25), _edge(3, 4, 0.25)],
}


def _write(tmp_path: Path, name: str, mutate=None) -> Path:
    d = copy.deepcopy(BASE)
    if mutate is not None:
        mutate(d)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(d))
    return path


def test_tiny_workload_max_load_by_hand(tmp_path):
    """Two FPGAs, one class each: 2 ms of compute + tensor 1 (0.5 ms, sent or read) + tensor 3
    (0.25 ms, sent or read) = 2.75 ms on both; one FPGA alone takes 4 ms, the CPU 8 ms."""
    inst = read_dnn_partitioning(_write(tmp_path, "tiny"))
    assert sorted(map(sorted, (ms for _, ms in inst.graph.nodes(data="members")))) == [[1, 4], [2, 3]]
    assert pipeopt.registry.auto_problem(inst) == "placement"
    res = pipeopt.solve(inst, problem="placement", method="dp", time_limit=None)
    assert res.status.value == "optimal"
    assert res.objective * 1e3 == pytest.approx(2.75, rel=1e-12)
    assert sorted(len(s.layers) for s in res.plan.stages) == [1, 1]


def test_tiny_orphan_and_fused_classes(tmp_path):
    def orphan(d):  # backward node 5, alone in class 9, reads node 3's tensor
        d["nodes"].append(_node(5, 9, True))
        d["edges"].append(_edge(3, 5, 0.25))

    inst = read_dnn_partitioning(_write(tmp_path, "orphan", orphan))
    by_members = {frozenset(ms): x for x, ms in inst.graph.nodes(data="members")}
    assert set(by_members) == {frozenset({1, 4}), frozenset({2, 3}), frozenset({5})}
    a, b, c = by_members[frozenset({1, 4})], by_members[frozenset({2, 3})], by_members[frozenset({5})]
    assert set(inst.graph.edges) == {(a, b), (c, b)}  # the mirror of backward edge 3 -> 5
    assert inst.graph.nodes[c]["fwd"] == {"cpu": 0.0, "fpga": 0.0}
    assert any("1 backward-only colour class" in s for s in inst.assumptions)

    def cycle(d):  # forward 1 (class 1) -> 2 (class 2) -> 6 (class 1): classes 1 and 2 fused
        d["nodes"].append(_node(6, 1))
        d["edges"].append(_edge(2, 6, 0.25))  # node 2's other out-edge costs 0.25 ms too

    inst = read_dnn_partitioning(_write(tmp_path, "fused", cycle))
    assert [sorted(ms) for _, ms in inst.graph.nodes(data="members")] == [[1, 2, 3, 4, 6]]
    assert inst.graph.number_of_edges() == 0
    assert any("1 colour class(es) fused" in s for s in inst.assumptions)


# ---- 2. the human-expert splits: dp.exe -expert's max-load ----------------------------------
EXPERT_MS = {  # dp.exe -expert, 6 significant digits
    "bert24_inference": 20.084,
    "bert24_training": 49.4049,
    "gnmt_inference": 46.2085,
    "gnmt_training": 137.154,
    "resnet50_inference": 43.9183,
    "inceptionv3_inference": 102.482,
}


def _expert_file(workload: str) -> Path:
    own = EXPERTS / f"{workload}_expert.json"
    return own if own.exists() else EXPERTS / f"{workload.replace('_training', '_inference')}_expert.json"


@pytest.mark.parametrize("workload", sorted(EXPERT_MS))
def test_human_expert_split_max_load(workload):
    inst = read_dnn_partitioning(LAYER_GRAPHS / f"{workload}.json")
    split = _expert_file(workload)
    assert split.name == f"{workload}_expert.json"  # every workload here has its own split
    plan = read_dnn_partitioning_split(split, inst)
    raw = json.loads(split.read_text())
    used = [f"fpga{i}" for i, x in enumerate(raw["fpgas"]) if x["nodes"]]
    used += [f"cpu{i}" for i, x in enumerate(raw["cpus"]) if x["nodes"]]
    assert sorted(d for s in plan.stages for d in s.devices) == sorted(used)
    ev = pipeopt.evaluate(inst, plan)
    assert ev.feasible
    assert ev.objective * 1e3 == pytest.approx(EXPERT_MS[workload], rel=1e-5)
    assert max(ev.load) == pytest.approx(ev.objective, rel=1e-12)


# ---- 3. solve: the placement problem and dp.exe's optimum -----------------------------------
def test_bert24_training_placement_optimum():
    path = LAYER_GRAPHS / "bert24_training.json"
    inst = read_dnn_partitioning(path)
    assert pipeopt.registry.auto_problem(inst) == "placement"
    res = pipeopt.solve(inst, problem="placement", method="dp", time_limit=None)
    assert res.status.value == "optimal"
    assert res.space == "convex" and "convex" in res.info["lattice"]
    assert res.objective * 1e3 == pytest.approx(41.745812, rel=1e-6)  # dp.exe's optimum
    assert res.lower_bound == pytest.approx(res.objective, rel=1e-9)
    assert pipeopt.evaluate(inst, res.plan).objective == pytest.approx(res.objective, rel=1e-12)
    assert res.objective * 1e3 < EXPERT_MS["bert24_training"]


def test_cli_solves_a_workload_as_placement(capsys):
    path = LAYER_GRAPHS / "bert24_training.json"
    assert main(["solve", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "dp" and out["status"] == "optimal"
    assert out["objective"] * 1e3 == pytest.approx(41.745812, rel=1e-6)
    assert main(["solve", str(path)]) == 0
    assert "placement" in capsys.readouterr().out.splitlines()[0]


def test_bottleneck_objective_is_the_pipeline_model():
    path = LAYER_GRAPHS / "bert24_training.json"
    inst = read_dnn_partitioning(path, objective="bottleneck")
    assert inst.settings.objective == "bottleneck" and inst.settings.overlap
    assert any(a.startswith("pipeline model (bottleneck)") for a in inst.assumptions)
    assert not any(a.startswith("max_load") for a in inst.assumptions)
    # with the file's CPU the devices differ: the group problem; on the FPGAs alone, partition
    assert pipeopt.registry.auto_problem(inst) == "group"
    fpgas = read_dnn_partitioning(path, objective="bottleneck", cpus=0)
    assert pipeopt.registry.auto_problem(fpgas) == "partition"
    res = pipeopt.solve(fpgas, stages=4, time_limit=None)
    assert res.status.value == "optimal" and len(res.plan.stages) == 4


# ---- 4. bad input: one error line, exit 2, no traceback; ReadError through the API ----------
def _add(key, *items):
    return lambda d: d[key].extend(copy.deepcopy(items))


BAD = {
    "cycle": (_add("edges", _edge(2, 1, 0.25)), "the workload has a cycle: "),
    "node without cpuLatency": (lambda d: d["nodes"][1].pop("cpuLatency"),
                                "missing field 'nodes[1].cpuLatency'"),
    "file without maxFPGAs": (lambda d: d.pop("maxFPGAs"), "missing field 'maxFPGAs'"),
    "lone backward node": (_add("nodes", _node(5, 9, True)),
                           "backward node 5 has no forward node (colour class) and no edge"),
    "backward to forward": (lambda d: (_add("nodes", _node(5, 3))(d), _add("edges", _edge(4, 5, 0.25))(d)),
                            "goes from backward node 4 to forward node 5"),
    "two costs": (_add("edges", _edge(1, 4, 0.75)), "node 1 has out-edges of different costs"),
    "undeclared node": (_add("edges", _edge(1, 42, 0.5)), "names undeclared node 42"),
}


def _one_error_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-300:], proc.stderr[-600:])
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipeopt: error: "), proc.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_workload(case, tmp_path):
    mutate, needle = BAD[case]
    path = _write(tmp_path, "bad", mutate)
    proc = subprocess.run([*CLI, "solve", str(path)], capture_output=True, text=True, timeout=120)
    _one_error_line(proc, needle)
    assert str(path) in proc.stderr
    with pytest.raises(ReadError, match=re.escape(needle)):
        read_dnn_partitioning(path)
    with pytest.raises(ReadError, match=re.escape(needle)):
        pipeopt.io.read(path)


def test_base_of_the_bad_workloads_is_valid(tmp_path):
    """Each bad case differs from BASE only by its fault."""
    path = _write(tmp_path, "base")
    proc = subprocess.run([*CLI, "solve", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert "placement" in proc.stdout


def test_more_stages_than_layers(tmp_path):
    g = nx.DiGraph()
    for i in range(3):
        g.add_node(f"l{i}", fwd={"gpu": 0.01}, bwd={"gpu": 0.02},
                   out_bytes=1e6, act_bytes=1e6, param_bytes=1e6)
        if i:
            g.add_edge(f"l{i - 1}", f"l{i}")
    inst = Instance(g, Cluster.homogeneous(4, memory=1e10), name="three")
    path = pipeopt.io.write(inst, tmp_path / "three.json")
    proc = subprocess.run([*CLI, "solve", str(path), "--stages", "4"],
                          capture_output=True, text=True, timeout=120)
    _one_error_line(proc, "more stages (4) than layers")
    with pytest.raises(InvalidProblemError, match=re.escape("more stages (4) than layers")):
        pipeopt.solve(pipeopt.io.read(path), stages=4)
    # a workload's placement problem takes no stage count at all
    proc = subprocess.run([*CLI, "solve", str(_write(tmp_path, "base")), "--stages", "4"],
                          capture_output=True, text=True, timeout=120)
    _one_error_line(proc, "does not use --stages")
