"""Native JSON instance format: exact round trips, the read()/write() dispatch, bad files."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import networkx as nx
import numpy as np
import pytest

from pipeopt import Cluster, Device, Instance, Plan, Settings, Stage, evaluate
from pipeopt.errors import InvalidClusterError, InvalidGraphError, InvalidProblemError, ReadError
from pipeopt.io import native, read, write
from pipeopt.io.pipedream import read_pipedream

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "pipedream-profiles"
PROFILES = sorted(p for p in DATA.glob("*.txt") if p.name != "LICENSE.txt")
SHIPPED = sorted((Path(__file__).resolve().parents[1] / "instances").glob("**/*.json"))


def _fixed_plan(inst: Instance, stages: int = 4) -> Plan:
    """Equal unit counts per stage, one device each (device i -> stage i); a forward share on
    the last stage when the cluster has several kinds, to exercise split execution."""
    chain = inst.chain
    S = min(stages, chain.n, len(inst.cluster.devices))
    cuts = [round(i * chain.n / S) for i in range(1, S)]
    layer_sets = chain.stages_from_cuts(cuts)
    out = []
    for i, layers in enumerate(layer_sets):
        dev = inst.cluster.devices[i]
        kinds = sorted(dev.resources)
        beta = {k: 0.3 + 0.1 * j for j, k in enumerate(kinds)} if (len(kinds) > 1 and i == S - 1) else None
        out.append(Stage(layers, devices=(dev.name,), beta=beta))
    return Plan(tuple(out))


def _same_graph(a: nx.DiGraph, b: nx.DiGraph) -> None:
    assert list(a.nodes(data=True)) == list(b.nodes(data=True))
    assert list(a.edges(data=True)) == list(b.edges(data=True))
    assert a.graph == b.graph


def _check_round_trip(inst: Instance, tmp_path: Path) -> None:
    d = native.to_dict(inst)
    assert native.to_dict(native.from_dict(d)) == d
    path = native.write_instance(inst, tmp_path / "x.json")
    back = native.read_instance(path)
    assert native.to_dict(back) == d
    _same_graph(inst.graph, back.graph)
    assert back.cluster == inst.cluster
    assert back.settings == inst.settings
    assert (back.name, back.assumptions) == (inst.name, inst.assumptions)
    # a second write gives the same bytes
    assert native.dumps(back) == path.read_text()
    plan = _fixed_plan(inst)
    e1, e2 = evaluate(inst, plan), evaluate(back, plan)
    assert e1 == e2  # every number bit for bit


@pytest.mark.parametrize("path", PROFILES, ids=lambda p: p.stem)
def test_round_trip_pipedream_profiles(path, tmp_path):
    inst = read_pipedream(path, devices=8, memory=16e9)
    _check_round_trip(inst, tmp_path)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_round_trip_shipped_instances(path, tmp_path):
    inst = native.read_instance(path)
    _check_round_trip(inst, tmp_path)
    assert native.dumps(inst) == path.read_text()


def _tiny(**node_extra) -> Instance:
    g = nx.DiGraph()
    g.add_node(
        "b",
        fwd={"gpu": 0.1, "npu": math.inf},
        bwd={"gpu": 0.2, "npu": math.inf},
        out_bytes=10,
        act_bytes=5.5,
        param_bytes=0,
        **node_extra,
    )
    g.add_node(
        "a",
        fwd={"gpu": 1e-300, "npu": 0.25},
        bwd={"gpu": 0.1 + 0.2, "npu": 1 / 3},
        out_bytes=1e15,  # the largest byte amount accepted (pipeopt.units.MAX_BYTES)
        act_bytes=0.0,
        param_bytes=7,
        pin_first=True,
    )
    g.add_node(3, fwd={"gpu": 0.0}, bwd={"gpu": 0.0}, out_bytes=0, act_bytes=0, param_bytes=0)
    g.add_edge("a", "b", bytes=2.5)
    g.add_edge("b", 3)
    g.graph["note"] = ("tuple", 1, [2.0, float("nan")])
    cluster = Cluster((Device("x", {"gpu": 2.0, "npu": 1}), Device("y", {"gpu": 1.5}, memory=3e9)), 1e9)
    return Instance(
        g,
        cluster,
        Settings(overlap=False, weight_stashing=True, microbatches=3, objective="gpipe"),
        name="tiny",
        assumptions=("one", "two"),
    )


def test_round_trip_special_values(tmp_path):
    inst = _tiny(extra=np.float64(0.1), count=np.int64(4), tags=["x", ("y", 1)])
    path = write(inst, tmp_path / "t.json")
    text = path.read_text()
    assert "Infinity" not in text and "NaN" not in text  # standard JSON only
    d = json.loads(text)
    assert d["format"] == "pipeopt-instance" and d["version"] == 1
    assert d["cluster"]["devices"][0]["memory"] is None  # inf memory -> null
    assert [n["id"] for n in d["graph"]["nodes"]] == ["b", "a", 3]  # node order kept, int id kept
    back = read(path)
    assert math.isinf(back.graph.nodes["b"]["fwd"]["npu"])
    assert back.graph.nodes["a"]["bwd"]["gpu"] == 0.1 + 0.2
    assert back.graph.nodes["a"]["fwd"]["gpu"] == 1e-300
    assert back.graph.nodes["b"]["tags"] == ["x", ("y", 1)]
    assert back.graph.nodes["b"]["count"] == 4 and type(back.graph.nodes["b"]["count"]) is int
    note = back.graph.graph["note"]
    assert note[:2] == ("tuple", 1) and math.isnan(note[2][1])
    assert math.isinf(back.cluster.devices[0].memory) and back.cluster.devices[1].memory == 3e9
    assert back.settings == inst.settings
    assert evaluate(back, _fixed_plan(inst, 2)) == evaluate(inst, _fixed_plan(inst, 2))


def test_round_trip_collective_bandwidth(tmp_path):
    """Written only when set; read back (a unit string too); a bad value names the field."""
    inst = _tiny()
    assert "collective_bandwidth" not in json.loads(write(inst, tmp_path / "a.json").read_text())["cluster"]
    slow = inst.replace(cluster=inst.cluster.with_overrides(collective_bandwidth=2.5e9))
    d = json.loads(write(slow, tmp_path / "b.json").read_text())
    assert d["cluster"]["collective_bandwidth"] == 2.5e9
    assert read(tmp_path / "b.json").cluster.bus_bandwidth == 2.5e9
    d["cluster"]["collective_bandwidth"] = "20Gbps"
    (tmp_path / "c.json").write_text(json.dumps(d))
    assert read(tmp_path / "c.json").cluster.collective_bandwidth == 2.5e9
    d["cluster"]["collective_bandwidth"] = -3
    (tmp_path / "d.json").write_text(json.dumps(d))
    with pytest.raises((ReadError, InvalidClusterError), match="collective_bandwidth|bandwidth"):
        read(tmp_path / "d.json")


def test_unstorable_attribute_is_named():
    with pytest.raises(InvalidGraphError, match=r"layer 'b' attribute 'bad'"):
        native.to_dict(_tiny(bad={1, 2}))


# ---- malformed files -> ReadError naming the file and the field ---------------------------
def _write(tmp_path: Path, d) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return path


def test_missing_file(tmp_path):
    with pytest.raises(ReadError, match="nope.json"):
        native.read_instance(tmp_path / "nope.json")
    with pytest.raises(ReadError, match="nope.json"):
        read(tmp_path / "nope.json")


def test_invalid_json(tmp_path):
    path = _write(tmp_path, '{"format": "pipeopt-instance",\n "version": 1,,}')
    with pytest.raises(ReadError, match=r"bad\.json:2:\d+: invalid JSON"):
        native.read_instance(path)
    with pytest.raises(ReadError, match="invalid JSON"):
        read(path)
    d = native.to_dict(_tiny())
    text = json.dumps(d).replace("1000000000000000.0", "Infinity")
    with pytest.raises(ReadError, match="Infinity"):
        native.read_instance(_write(tmp_path, text))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format="pipedream"), r"'format' is 'pipedream'"),
        (lambda d: d.update(version=2), r"'version' is 2"),
        (lambda d: d.update(version="1"), r"'version' must be int"),
        (lambda d: d.pop("format"), r"missing field 'format'"),
        (lambda d: d.pop("version"), r"missing field 'version'"),
        (lambda d: d.pop("graph"), r"missing field 'graph'"),
        (lambda d: d.pop("cluster"), r"missing field 'cluster'"),
        (lambda d: d["cluster"].pop("bandwidth"), r"missing field 'cluster.bandwidth'"),
        (lambda d: d["cluster"].pop("devices"), r"missing field 'cluster.devices'"),
        (lambda d: d["cluster"]["devices"][1].pop("memory"), r"missing field 'cluster.devices\[1\].memory'"),
        (
            lambda d: d["cluster"]["devices"][0].pop("resources"),
            r"missing field 'cluster.devices\[0\].resources'",
        ),
        (lambda d: d["graph"].pop("nodes"), r"missing field 'graph.nodes'"),
        (lambda d: d["graph"].pop("edges"), r"missing field 'graph.edges'"),
        (lambda d: d["graph"]["nodes"][2].pop("id"), r"missing field 'graph.nodes\[2\].id'"),
        (lambda d: d["graph"]["edges"][0].pop("target"), r"missing field 'graph.edges\[0\].target'"),
        (lambda d: d["graph"].update(nodes={"a": 1}), r"'graph.nodes' must be list"),
        (lambda d: d["graph"]["nodes"].append(dict(d["graph"]["nodes"][0])), r"layer 'b' declared twice"),
        (lambda d: d["graph"]["edges"].append({"source": "a", "target": "zz"}), r"undeclared layer 'zz'"),
        (lambda d: d["settings"].update(speed=3), r"unknown field 'settings.speed'"),
        (lambda d: d.update(assumptions=[1]), r"'assumptions\[0\]' must be a string"),
    ],
)
def test_malformed_files(tmp_path, mutate, message):
    d = copy.deepcopy(native.to_dict(_tiny()))
    mutate(d)
    path = _write(tmp_path, d)
    with pytest.raises(ReadError, match=message) as err:
        native.read_instance(path)
    assert "bad.json" in str(err.value)


def test_top_level_not_an_object(tmp_path):
    with pytest.raises(ReadError, match="must be a JSON object"):
        native.read_instance(_write(tmp_path, [1, 2]))


@pytest.mark.parametrize(
    ("mutate", "error", "message"),
    [
        (lambda d: d["graph"]["nodes"][0]["fwd"].update(gpu=-1.0), InvalidGraphError, r"negative"),
        (lambda d: d["graph"]["edges"].append({"source": 3, "target": "a"}), InvalidGraphError, r"cycle"),
        (lambda d: d["graph"]["nodes"][1].pop("act_bytes"), InvalidGraphError, r"'act_bytes'"),
        (lambda d: d["cluster"]["devices"][0].update(resources={}), InvalidClusterError, r"no resources"),
        (lambda d: d["cluster"].update(bandwidth=0), InvalidClusterError, r"bandwidth"),
        (lambda d: d["cluster"]["devices"][1].update(name="x"), InvalidClusterError, r"duplicate"),
        (lambda d: d["settings"].update(objective="fastest"), InvalidProblemError, r"fastest"),
        (lambda d: d["settings"].update(microbatches=0), InvalidProblemError, r"microbatches"),
    ],
)
def test_invalid_content_raises_the_instance_errors(tmp_path, mutate, error, message):
    d = copy.deepcopy(native.to_dict(_tiny()))
    mutate(d)
    with pytest.raises(error, match=message):
        native.read_instance(_write(tmp_path, d))


# ---- dispatch ------------------------------------------------------------------------------
def test_read_dispatches_on_content(tmp_path):
    prof = read(DATA / "alexnet.txt", devices=4, bandwidth=1e9)
    ref = read_pipedream(DATA / "alexnet.txt", devices=4, bandwidth=1e9)
    assert native.to_dict(prof) == native.to_dict(ref)
    # a native file without the .json suffix is still recognised by its content
    path = native.write_instance(ref, tmp_path / "alexnet.instance")
    assert native.to_dict(read(path)) == native.to_dict(ref)
    with pytest.raises(ReadError, match="takes no reader options"):
        read(path, devices=3)
    other = _write(tmp_path, {"hello": 1})
    with pytest.raises(ReadError, match="neither a pipeopt instance"):
        read(other)
    with pytest.raises(ReadError, match="not a PipeDream node"):
        read(DATA / "LICENSE.txt")
    with pytest.raises(ReadError, match=r"option\(s\) \['gpus'\] not taken by read_pipedream"):
        read(DATA / "alexnet.txt", gpus=4)


# ---- Tarnawski et al.'s dnn-partitioning workloads -----------------------------------------
TARNAWSKI = DATA.parent / "dnn-partitioning"
WORKLOADS = sorted(TARNAWSKI.glob("*-inputs/*/*.json"))


@pytest.mark.parametrize(
    "path", WORKLOADS, ids=lambda p: f"{p.parent.parent.name[:4]}-{p.parent.name[:5]}-{p.stem}"
)
def test_dnn_partitioning_workloads(path, tmp_path):
    from pipeopt.io.dnn_partitioning import read_dnn_partitioning

    raw = json.loads(path.read_text())
    inst = read(path)  # dispatched on content
    assert native.to_dict(inst) == native.to_dict(read_dnn_partitioning(path))
    cls = {n["id"]: n.get("colorClass", ("own", n["id"])) for n in raw["nodes"]}
    classes = set(cls.values())
    # a layer is a colour class, or several whose forward edges form a cycle, fused as dp.cpp
    # does (tests/test_dnn_partitioning.py derives which from the file); no class is split
    layer_classes = [{cls[m] for m in ms} for _, ms in inst.graph.nodes(data="members")]
    assert sum(map(len, layer_classes)) == len(classes)
    fused = re.search(r"(\d+) colour class\(es\) fused", " ".join(inst.assumptions))
    assert inst.num_layers == len(classes) - (int(fused.group(1)) if fused else 0)
    fwd = [n for n in raw["nodes"] if not n["isBackwardNode"]]
    bwd = [n for n in raw["nodes"] if n["isBackwardNode"]]
    g = inst.graph
    assert sum(f["cpu"] for _, f in g.nodes(data="fwd")) == pytest.approx(
        sum(n["cpuLatency"] for n in fwd) / 1e3
    )
    assert sum(b["cpu"] for _, b in g.nodes(data="bwd")) == pytest.approx(
        sum(n["cpuLatency"] for n in bwd) / 1e3
    )
    assert sum(f.get("fpga", 0) for _, f in g.nodes(data="fwd")) == pytest.approx(
        sum(n["fpgaLatency"] for n in fwd) / 1e3
    )
    assert sum(p for _, p in g.nodes(data="param_bytes")) == pytest.approx(
        sum(n["size"] for n in raw["nodes"])
    )
    kinds = [d.resources for d in inst.cluster.devices]
    assert kinds.count({"fpga": 1.0}) == raw["maxFPGAs"] and kinds.count({"cpu": 1.0}) == raw["maxCPUs"]
    assert all(d.memory == raw["maxSizePerFPGA"] for d in inst.cluster.devices if "fpga" in d.resources)
    assert sorted(m for _, ms in g.nodes(data="members") for m in ms) == sorted(n["id"] for n in raw["nodes"])
    _check_round_trip(inst, tmp_path)


def test_dnn_partitioning_malformed(tmp_path):
    from pipeopt.io.dnn_partitioning import read_dnn_partitioning

    raw = json.loads((TARNAWSKI / "throughput-inputs/LayerGraphs/bert24_training.json").read_text())
    del raw["nodes"][3]["cpuLatency"]
    with pytest.raises(ReadError, match=r"bad\.json: missing field 'nodes\[3\]\.cpuLatency'"):
        read(_write(tmp_path, raw))
    raw = json.loads((TARNAWSKI / "throughput-inputs/LayerGraphs/bert24_training.json").read_text())
    raw["edges"].append({"sourceId": 1, "destId": 99999, "cost": 0.0, "size": 0.0})
    with pytest.raises(ReadError, match="undeclared node 99999"):
        read_dnn_partitioning(_write(tmp_path, raw))
    raw.pop("maxFPGAs")
    with pytest.raises(ReadError, match="missing field 'maxFPGAs'"):
        read_dnn_partitioning(_write(tmp_path, raw))
