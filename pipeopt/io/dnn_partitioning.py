"""Reader for Tarnawski et al.'s dnn-partitioning workloads (JSON), and for their splits.

File format (the authors' README): an object with ``maxSizePerFPGA`` (bytes of memory per
accelerator), ``maxFPGAs`` (k accelerators), ``maxCPUs`` (l CPUs), ``nodes`` and ``edges``.
A node has ``id``, ``cpuLatency`` and ``fpgaLatency`` (milliseconds), ``supportedOnFpga``,
``isBackwardNode``, ``size`` (bytes it takes on an accelerator) and optionally ``colorClass``
(nodes of one class are placed together; a forward operator and its gradient share a class)
and ``name``. An edge has ``sourceId``, ``destId`` and ``cost`` (milliseconds to move the
source's output between an accelerator and CPU memory; one cost per source).

The workload is read **as the authors' DP (``throughput-dp/dp.cpp``) reads it**, so that
:func:`pipeopt.solve` of the instance, with no further option, solves the problem their
``dp.exe`` solves, and :func:`pipeopt.evaluate` of their split gives their max-load:

* one **layer** per colour class (a node without ``colorClass`` is its own class): ``fwd`` sums
  the class's forward nodes' latencies and ``bwd`` its backward nodes' (seconds), on the kinds
  ``"fpga"`` and ``"cpu"`` (no ``"fpga"`` time if a node of the class is not
  ``supportedOnFpga``); ``param_bytes`` is the class's total ``size``, ``act_bytes`` 0;
* a class with backward nodes only (an *orphaned* backward class) gets an empty forward layer
  whose precedence mirrors its backward edges, as ``dp.cpp`` does (``createArtificialForwardNodes``);
  classes whose forward edges form a cycle are fused into one layer (they must share a device:
  ``fuseStronglyConnectedComponentsInForward``);
* the layer graph's **edges** are the forward edges between layers (the precedence a pipeline
  order respects); every node with out-edges, forward or backward, is a **tensor** (graph
  attribute ``tensors``) read by the layers of its heads, of ``cost`` seconds: the max-load
  objective charges it once to its layer's device and once to every other device that reads
  it (:func:`pipeopt.cost.rules.stage_transfers`);
* the **cluster**: ``maxFPGAs`` accelerators (``{"fpga": 1}``, memory ``maxSizePerFPGA``) and
  ``maxCPUs`` CPUs (``{"cpu": 1}``, no memory limit, ``host``: a CPU pays no transfer, as in
  ``dp.cpp``); a plan may leave devices unused;
* **bytes and bandwidth**: edges carry bytes = cost x B with B the median ``size / cost`` of the
  edges that give a ``size`` (2^31 B/s otherwise), so every transfer time is the file's cost.

The objective is ``max_load`` (their model). ``objective="bottleneck"`` reads the same graph for
pipeopt's pipeline model (1F1B steady state with window rows, overlap): there a tensor crosses
each cut between its layer and its last reader once per direction, an edge carrying the costs
of the tensors its tail sends its head (the assumptions printed with every result say so).

Reference: Tarnawski, Phanishayee, Devanur, Mahajan, Nina Paravecino, Efficient Algorithms for
Device Placement of DNN Graph Operators, NeurIPS 2020, arXiv:2006.16423; workloads from the
authors' repository msr-fiddle/dnn-partitioning (MIT licence).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import networkx as nx

from ..cluster import Cluster, Device
from ..errors import InvalidPlanError, ReadError
from ..graph import _natural_key as _natural
from ..instance import Instance, Settings
from ..plan import Plan, Stage
from ..units import MAX_DEVICES

_NODE_FIELDS = ("id", "cpuLatency", "fpgaLatency", "supportedOnFpga", "isBackwardNode", "size")
_EDGE_FIELDS = ("sourceId", "destId", "cost")
_COST_TOLERANCE = 1e-6
"""Two out-edges of one node whose costs differ by more than this (ms) are refused (``dp.cpp``)."""


def _count(value, path: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEVICES:
        raise ReadError(f"{path}: {where} must be an integer in 0..{MAX_DEVICES}, got {value!r}")
    return value


def _num(value, path: Path, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0 \
            or math.isinf(value):
        raise ReadError(f"{path}: {where} must be a non-negative number, got {value!r}")
    return float(value)


def _flag(value, path: Path, where: str) -> bool:
    if value not in (0, 1, True, False) or isinstance(value, float):
        raise ReadError(f"{path}: {where} must be true/false or 0/1, got {value!r}")
    return bool(value)


def _load_json(path) -> tuple[Path, dict]:
    if not isinstance(path, (str, Path)):
        raise ReadError(f"a workload path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReadError(f"cannot read dnn-partitioning file {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReadError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(d, dict):
        raise ReadError(f"{path}: expected a JSON object")
    return path, d


def read_dnn_partitioning(
    path: str | Path,
    *,
    accelerators: int | None = None,
    cpus: int | None = None,
    objective: str = "max_load",
    settings: Settings | None = None,
) -> Instance:
    """Read a dnn-partitioning workload as an :class:`~pipeopt.Instance` (module docstring).

    Parameters
    ----------
    path
        A workload file (``throughput-inputs/LayerGraphs/*.json``, ``OperatorGraphs/*.json``).
    accelerators, cpus
        Override the file's ``maxFPGAs`` / ``maxCPUs`` (devices in the cluster).
    objective
        ``"max_load"`` (default: Tarnawski et al.'s model, what ``dp.exe`` minimises) or
        another pipeopt objective (``"bottleneck"``: pipeopt's pipeline model on the same graph).
    settings
        Scoring settings; overrides ``objective`` (default ``Settings(objective=objective,
        overlap=objective != "max_load")``).

    Returns
    -------
    Instance
        Layers named ``c{colorClass}`` (``n{id}`` for a node without class; ``+`` joins fused
        classes), with node attributes ``op`` (member names), ``members`` (the file's node ids,
        forward and backward) and the data-model attributes; graph attribute ``tensors``.

    Raises
    ------
    ReadError
        If the file is missing or not JSON, misses a field, has a negative or non-numeric
        value, an edge naming an undeclared node, a cycle, an edge from a backward node to a
        forward node, a backward node without a forward node in its colour class and without
        an edge (nothing places it), two out-edges of one node with different costs, or no
        device.
    """
    path, d = _load_json(path)
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"):
        if key not in d:
            raise ReadError(f"{path}: missing field {key!r}")
    nodes, edges = d["nodes"], d["edges"]
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise ReadError(f"{path}: 'nodes' and 'edges' must be lists")

    byid: dict = {}
    cls_of: dict = {}
    classes: dict = {}
    backward: dict = {}
    for i, n in enumerate(nodes):
        for key in _NODE_FIELDS:
            if not isinstance(n, dict) or key not in n:
                raise ReadError(f"{path}: missing field 'nodes[{i}].{key}'")
        nid = n["id"]
        if isinstance(nid, bool) or not isinstance(nid, (int, str)):
            raise ReadError(f"{path}: field 'nodes[{i}].id' must be an integer or a string, got {nid!r:.40}")
        if nid in byid:
            raise ReadError(f"{path}: node id {nid!r} declared twice")
        byid[nid] = n
        bwd = backward[nid] = _flag(n["isBackwardNode"], path, f"nodes[{i}].isBackwardNode")
        if "colorClass" in n:
            cc = n["colorClass"]
            if isinstance(cc, bool) or not isinstance(cc, (int, str)):
                raise ReadError(f"{path}: field 'nodes[{i}].colorClass' must be an integer or a string, got {cc!r:.40}")
            c = f"c{cc}"
        else:
            c = f"n{nid}"
        cls_of[nid] = c
        e = classes.setdefault(c, {"cpu_f": 0.0, "fpga_f": 0.0, "cpu_b": 0.0, "fpga_b": 0.0, "fpga_ok": True,
                                   "size": 0.0, "members": [], "names": [], "fwd": 0})
        sfx = "b" if bwd else "f"
        e[f"cpu_{sfx}"] += _num(n["cpuLatency"], path, f"nodes[{i}].cpuLatency") / 1000.0
        e[f"fpga_{sfx}"] += _num(n["fpgaLatency"], path, f"nodes[{i}].fpgaLatency") / 1000.0
        e["size"] += _num(n["size"], path, f"nodes[{i}].size")
        e["fpga_ok"] = e["fpga_ok"] and _flag(n["supportedOnFpga"], path, f"nodes[{i}].supportedOnFpga")
        e["members"].append(nid)
        if not bwd:
            e["fwd"] += 1
            e["names"].append(str(n.get("name", nid)))
    if not nodes:
        raise ReadError(f"{path}: the workload has no nodes")

    out_cost: dict = {}
    readers: dict = {}
    ratios = []
    whole = nx.DiGraph()
    whole.add_nodes_from(byid)
    fwd_edges, mirrored = set(), set()
    for i, e in enumerate(edges):
        for key in _EDGE_FIELDS:
            if not isinstance(e, dict) or key not in e:
                raise ReadError(f"{path}: missing field 'edges[{i}].{key}'")
        u, v = e["sourceId"], e["destId"]
        for x in (u, v):
            if isinstance(x, (list, dict)) or x not in byid:
                raise ReadError(f"{path}: edges[{i}] names undeclared node {x!r}")
        if u == v:
            raise ReadError(f"{path}: edges[{i}] is a self-loop on node {u!r}")
        if backward[u] and not backward[v]:
            raise ReadError(f"{path}: edges[{i}] goes from backward node {u!r} to forward node {v!r}")
        cost = _num(e["cost"], path, f"edges[{i}].cost")
        if u in out_cost and abs(out_cost[u] - cost) > _COST_TOLERANCE:
            raise ReadError(f"{path}: node {u!r} has out-edges of different costs ({out_cost[u]} and {cost} ms)")
        out_cost.setdefault(u, cost)
        if "size" in e:
            size = _num(e["size"], path, f"edges[{i}].size")
            if cost > 0 and size > 0:
                ratios.append(size / (cost / 1000.0))
        whole.add_edge(u, v)
        cu, cv = cls_of[u], cls_of[v]
        readers.setdefault(u, set()).add(cv)
        if not backward[u] and not backward[v] and cu != cv:
            fwd_edges.add((cu, cv))
    if not nx.is_directed_acyclic_graph(whole):
        cyc = nx.find_cycle(whole)
        raise ReadError(f"{path}: the workload has a cycle: {' -> '.join(str(a) for a, _ in cyc)} -> {cyc[0][0]}")
    orphans = sorted(c for c, e in classes.items() if e["fwd"] == 0)
    orphan_set = set(orphans)
    for c in orphans:
        lone = [m for m in classes[c]["members"] if whole.degree(m) == 0]
        if len(lone) == len(classes[c]["members"]):
            raise ReadError(
                f"{path}: backward node {lone[0]!r} has no forward node (colour class) and no edge: nothing places it"
            )
    for u, v in whole.edges:  # dp.cpp: a backward edge with an orphaned end gets a mirrored forward edge
        if backward[u] and backward[v] and (cls_of[u] in orphan_set or cls_of[v] in orphan_set):
            if cls_of[u] != cls_of[v]:
                mirrored.add((cls_of[v], cls_of[u]))

    # fuse classes whose forward precedence forms a cycle (they must share a device)
    cg = nx.DiGraph()
    cg.add_nodes_from(classes)
    cg.add_edges_from(fwd_edges | mirrored)
    layer_of, fused = {}, 0
    for comp in nx.strongly_connected_components(cg):
        comp = sorted(comp, key=_natural)
        name = "+".join(comp)
        fused += len(comp) - 1
        for c in comp:
            layer_of[c] = name

    bandwidth = statistics.median(ratios) if ratios else 2.0**31
    g = nx.DiGraph()
    layers: dict = {}
    for c in sorted(classes, key=_natural):
        layers.setdefault(layer_of[c], []).append(c)
    for name, cs in layers.items():
        es = [classes[c] for c in cs]
        kinds = ["cpu"] + (["fpga"] if all(e["fpga_ok"] for e in es) else [])
        names = [x for e in es for x in e["names"]]
        g.add_node(
            name,
            op=", ".join(names[:4]) + (f", ... ({len(names)} operators)" if len(names) > 4 else ""),
            members=[m for e in es for m in e["members"]],
            fwd={k: sum(e[f"{k}_f"] for e in es) for k in kinds},
            bwd={k: sum(e[f"{k}_b"] for e in es) for k in kinds},
            out_bytes=0.0,
            act_bytes=0.0,
            param_bytes=sum(e["size"] for e in es),
        )
    edge_bytes: dict = {}
    for cu, cv in fwd_edges | mirrored:
        lu, lv = layer_of[cu], layer_of[cv]
        if lu != lv:
            edge_bytes.setdefault((lu, lv), 0.0)
    tensors = []
    for u in byid:  # in file order
        if u not in readers:
            continue
        b = out_cost[u] / 1000.0 * bandwidth
        src = layer_of[cls_of[u]]
        dst = sorted({layer_of[c] for c in readers[u]} - {src}, key=_natural)
        tensors.append([src, dst, b])
        if not backward[u]:
            for lv in dst:
                if (src, lv) in edge_bytes:
                    edge_bytes[(src, lv)] += b
    for (lu, lv), b in sorted(edge_bytes.items(), key=lambda kv: (_natural(kv[0][0]), _natural(kv[0][1]))):
        g.add_edge(lu, lv, bytes=b)
        g.nodes[lu]["out_bytes"] = max(g.nodes[lu]["out_bytes"], b)
    g.graph["name"] = path.stem
    g.graph["source"] = "dnn-partitioning workload (Tarnawski et al., NeurIPS 2020)"
    g.graph["tensors"] = tensors

    k = _count(d["maxFPGAs"] if accelerators is None else accelerators, path, "maxFPGAs (accelerators)")
    l_ = _count(d["maxCPUs"] if cpus is None else cpus, path, "maxCPUs (cpus)")
    if k + l_ == 0:
        raise ReadError(f"{path}: no device (maxFPGAs = maxCPUs = 0)")
    if k + l_ > MAX_DEVICES:
        raise ReadError(f"{path}: {k} accelerators and {l_} CPUs, more than {MAX_DEVICES} devices")
    mem = _num(d["maxSizePerFPGA"], path, "maxSizePerFPGA")
    devices = [Device(f"fpga{i}", {"fpga": 1.0}, mem) for i in range(k)]
    devices += [Device(f"cpu{i}", {"cpu": 1.0}, host=True) for i in range(l_)]
    settings = settings or Settings(objective=objective, overlap=objective != "max_load")
    assumptions = [
        "layers = colour classes (forward and backward nodes together); times: the file's ms in seconds",
        "memory: a layer's 'size' on an accelerator, counted once; CPUs have no memory limit",
        f"bandwidth {bandwidth:.6g} B/s ({'median edge size/cost' if ratios else 'no edge size given'}); "
        "bytes = cost x bandwidth, so every transfer takes the file's cost",
    ]
    if settings.objective == "max_load":
        assumptions.append(
            "max_load (Tarnawski et al.): a device's load = its compute + every tensor it sends or reads "
            "(once each; none on the CPU); devices may stay unused"
        )
    else:
        assumptions.append(
            f"pipeline model ({settings.objective}): a tensor crosses every cut between its layer and its "
            "readers once per direction (not Tarnawski et al.'s device-to-host transfers)"
        )
    if orphans:
        assumptions.append(f"{len(orphans)} backward-only colour class(es) got an empty forward layer (as dp.cpp)")
    if fused:
        assumptions.append(f"{fused} colour class(es) fused with others: their forward edges form cycles")
    return Instance(g, Cluster(tuple(devices), bandwidth), settings, name=path.stem, assumptions=tuple(assumptions))


def read_dnn_partitioning_split(path: str | Path, instance: Instance) -> Plan:
    """Read a split in the authors' output format as a :class:`~pipeopt.Plan` of ``instance``.

    The format is what ``dp.exe`` prints and what their ``human-experts/*.json`` hold:
    ``{"maxLoad": ..., "fpgas": [{"nodes": [ids]}, ...], "cpus": [{"nodes": [ids]}]}`` in the
    workload's node ids. Nodes a split leaves out (the backward nodes of a human-expert split
    of a training graph) go with the forward nodes of their colour class, as ``dp.exe
    -expert`` does. Empty devices are left out; the stages are put in a pipeline order (a
    topological order of the split's quotient graph).

    Parameters
    ----------
    path
        The split file.
    instance
        The workload read by :func:`read_dnn_partitioning`.

    Returns
    -------
    Plan
        One stage per non-empty device, on ``fpga{i}`` / ``cpu{i}`` in the file's order.

    Raises
    ------
    ReadError
        If the file is not such a split, names an unknown node, puts a node on two devices,
        leaves a node out that no colour class places, or splits a colour class.
    InvalidPlanError
        If the split is not convex (some path leaves a stage and comes back): it is outside
        the space of pipeline splits.
    """
    path, d = _load_json(path)
    for key in ("fpgas", "cpus"):
        if not isinstance(d.get(key), list) or not all(isinstance(x, dict) and isinstance(x.get("nodes"), list)
                                                        for x in d[key]):
            raise ReadError(f"{path}: field {key!r} must be a list of {{'nodes': [...]}} objects")
    layer_of = {m: name for name, ms in instance.graph.nodes(data="members") for m in (ms or ())}
    if not layer_of:
        raise ReadError(f"{path}: instance {instance.name} was not read from a dnn-partitioning workload")
    devices = [("fpga", i, x["nodes"]) for i, x in enumerate(d["fpgas"])]
    devices += [("cpu", i, x["nodes"]) for i, x in enumerate(d["cpus"])]
    where: dict = {}
    for j, (_, _, ids) in enumerate(devices):
        for nid in ids:
            if nid not in layer_of:
                raise ReadError(f"{path}: node {nid!r} is not in workload {instance.name}")
            layer = layer_of[nid]
            if where.setdefault(layer, j) != j:
                raise ReadError(f"{path}: layer {layer!r} (node {nid!r}) is split between two devices")
    missing = [x for x in instance.graph.nodes if x not in where]
    if missing:
        raise ReadError(f"{path}: {len(missing)} layer(s) on no device, e.g. {missing[:3]!r}")
    q = nx.DiGraph()
    used = sorted(set(where.values()))
    q.add_nodes_from(used)
    for u, v in instance.graph.edges:
        if where[u] != where[v]:
            q.add_edge(where[u], where[v])
    if not nx.is_directed_acyclic_graph(q):
        raise InvalidPlanError(f"{path}: the split is not convex (a path leaves a device and comes back)")
    names = {d.name for d in instance.cluster.devices}
    stages = []
    for j in nx.lexicographical_topological_sort(q):
        kind, i, _ = devices[j]
        dev = f"{kind}{i}"
        if dev not in names:
            raise ReadError(f"{path}: the split uses {dev}, the cluster has {sorted(names)}")
        stages.append(Stage(tuple(x for x in instance.graph.nodes if where[x] == j), (dev,)))
    return Plan(tuple(stages))
