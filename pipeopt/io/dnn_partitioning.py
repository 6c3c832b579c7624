"""Reader for Tarnawski et al.'s dnn-partitioning workloads (JSON).

File format (the authors' README): an object with ``maxSizePerFPGA`` (bytes of memory per
accelerator), ``maxFPGAs`` (k accelerators), ``maxCPUs`` (l CPUs), ``nodes`` and ``edges``.
A node has ``id``, ``name``, ``cpuLatency`` and ``fpgaLatency`` (milliseconds),
``supportedOnFpga``, ``isBackwardNode``, ``colorClass`` (nodes of one class must be placed
together; a forward layer and its gradient share a class) and ``size`` (bytes of memory it
needs on an accelerator). An edge has ``sourceId``, ``destId``, ``cost`` (milliseconds to
transfer it between devices) and ``size`` (bytes).

How it maps to pipeopt's data model:

* one **layer** per colour class (a node without ``colorClass`` is its own class): ``fwd`` sums
  the class's forward nodes' latencies, ``bwd`` its backward nodes' (0 for inference graphs),
  in seconds, on two resource kinds: ``"cpu"`` and ``"fpga"`` (the accelerators; absent if a
  forward node of the class is not ``supportedOnFpga``);
* ``param_bytes`` = the class's total ``size`` (the memory the paper charges against an
  accelerator), ``act_bytes`` = 0 (the paper has no in-flight activation memory);
* **edges** between classes come from the forward edges (backward edges mirror them); an
  edge's ``bytes`` is the summed ``size`` of the forward edges it merges; ``out_bytes`` of a
  layer is its largest outgoing edge;
* the **cluster** has ``maxFPGAs`` accelerators (``{"fpga": 1}``, memory ``maxSizePerFPGA``)
  and ``maxCPUs`` CPUs (``{"cpu": 1}``, no memory limit); the bandwidth is the median of
  ``size / cost`` over the edges with a positive cost (2^31 B/s in the inference files).

What differs from the paper's model (recorded in ``Instance.assumptions``): pipeopt charges a
cut ``2 x bytes / bandwidth`` (activation forward, gradient back) where the paper charges each
forward and backward edge its own ``cost``; per-edge costs that are not proportional to size
(the training layer graphs) are replaced by bytes / one bandwidth.

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
from ..errors import ReadError
from ..instance import Instance, Settings
from ..units import MAX_DEVICES

_NODE_FIELDS = ("id", "cpuLatency", "fpgaLatency", "supportedOnFpga", "isBackwardNode", "size")
_EDGE_FIELDS = ("sourceId", "destId", "cost", "size")


def _count(value, path: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEVICES:
        raise ReadError(f"{path}: {where} must be an integer in 0..{MAX_DEVICES}, got {value!r}")
    return value


def _num(value, path: Path, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < 0:
        raise ReadError(f"{path}: {where} must be a non-negative number, got {value!r}")
    return float(value)


def read_dnn_partitioning(
    path: str | Path,
    *,
    accelerators: int | None = None,
    cpus: int | None = None,
    settings: Settings | None = None,
) -> Instance:
    """Read a dnn-partitioning workload as an :class:`~pipeopt.Instance`.

    Parameters
    ----------
    path
        A workload file (``*-inputs/LayerGraphs/*.json`` or ``OperatorGraphs/*.json``).
    accelerators, cpus
        Override the file's ``maxFPGAs`` / ``maxCPUs`` (devices in the cluster).
    settings
        Scoring settings (default :class:`pipeopt.Settings`).

    Returns
    -------
    Instance
        Layers named ``c{colorClass}`` (or ``n{id}`` for a node without class), with node
        attributes ``op`` (the member names), ``members`` (the file's node ids, forward and
        backward) as well as the data-model attributes (module docstring).

    Raises
    ------
    ReadError
        If the file is missing, not JSON, misses a field, has a negative number, an edge to
        an undeclared node, or classes whose forward edges form a cycle.
    """
    if not isinstance(path, (str, Path)):
        raise ReadError(f"a workload path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReadError(f"cannot read dnn-partitioning workload {path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ReadError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(d, dict):
        raise ReadError(f"{path}: expected a JSON object with 'nodes' and 'edges'")
    for key in ("maxSizePerFPGA", "maxFPGAs", "maxCPUs", "nodes", "edges"):
        if key not in d:
            raise ReadError(f"{path}: missing field {key!r}")
    nodes, edges = d["nodes"], d["edges"]
    if not isinstance(nodes, list) or not isinstance(edges, list):
        raise ReadError(f"{path}: 'nodes' and 'edges' must be lists")

    byid: dict = {}
    cls_of: dict = {}
    classes: dict = {}
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
        c = f"c{n['colorClass']}" if "colorClass" in n else f"n{nid}"
        cls_of[nid] = c
        entry = classes.setdefault(
            c,
            {
                "cpu_f": 0.0,
                "fpga_f": 0.0,
                "cpu_b": 0.0,
                "fpga_b": 0.0,
                "fpga_ok": True,
                "size": 0.0,
                "members": [],
                "names": [],
                "fwd_members": 0,
            },
        )
        backward = bool(n["isBackwardNode"])
        sfx = "b" if backward else "f"
        entry[f"cpu_{sfx}"] += _num(n["cpuLatency"], path, f"nodes[{i}].cpuLatency") / 1000.0
        entry[f"fpga_{sfx}"] += _num(n["fpgaLatency"], path, f"nodes[{i}].fpgaLatency") / 1000.0
        entry["size"] += _num(n["size"], path, f"nodes[{i}].size")
        entry["members"].append(nid)
        if not backward:
            entry["fwd_members"] += 1
            entry["names"].append(str(n.get("name", nid)))
            entry["fpga_ok"] = entry["fpga_ok"] and bool(n["supportedOnFpga"])

    edge_bytes: dict = {}
    ratios = []
    for i, e in enumerate(edges):
        for key in _EDGE_FIELDS:
            if not isinstance(e, dict) or key not in e:
                raise ReadError(f"{path}: missing field 'edges[{i}].{key}'")
        u, v = e["sourceId"], e["destId"]
        for x in (u, v):
            if isinstance(x, (list, dict)) or x not in byid:
                raise ReadError(f"{path}: edges[{i}] names undeclared node {x!r}")
        size = _num(e["size"], path, f"edges[{i}].size")
        cost = _num(e["cost"], path, f"edges[{i}].cost")
        if cost > 0 and size > 0:
            ratios.append(size / (cost / 1000.0))
        if byid[u]["isBackwardNode"] or byid[v]["isBackwardNode"]:
            continue
        cu, cv = cls_of[u], cls_of[v]
        if cu != cv:
            edge_bytes[(cu, cv)] = edge_bytes.get((cu, cv), 0.0) + size

    g = nx.DiGraph()
    for c, e in classes.items():
        kinds = ["cpu"] + (["fpga"] if e["fpga_ok"] else [])
        g.add_node(
            c,
            op=", ".join(e["names"][:4])
            + (f", ... ({len(e['names'])} operators)" if len(e["names"]) > 4 else ""),
            members=list(e["members"]),
            fwd={k: e[f"{k}_f"] for k in kinds},
            bwd={k: e[f"{k}_b"] for k in kinds},
            out_bytes=0.0,
            act_bytes=0.0,
            param_bytes=e["size"],
        )
    for (cu, cv), b in edge_bytes.items():
        g.add_edge(cu, cv, bytes=b)
        g.nodes[cu]["out_bytes"] = max(g.nodes[cu]["out_bytes"], b)
    if not nx.is_directed_acyclic_graph(g):
        raise ReadError(f"{path}: the colour classes' forward edges form a cycle: {nx.find_cycle(g)[:4]}")
    g.graph["name"] = path.stem
    g.graph["source"] = "dnn-partitioning workload (Tarnawski et al., NeurIPS 2020)"

    k = _count(d["maxFPGAs"] if accelerators is None else accelerators, path, "maxFPGAs (accelerators)")
    l_ = _count(d["maxCPUs"] if cpus is None else cpus, path, "maxCPUs (cpus)")
    if k + l_ > MAX_DEVICES:
        raise ReadError(f"{path}: {k} accelerators and {l_} CPUs, more than {MAX_DEVICES} devices")
    mem = _num(d["maxSizePerFPGA"], path, "maxSizePerFPGA")
    devices = [Device(f"fpga{i}", {"fpga": 1.0}, mem) for i in range(k)]
    devices += [Device(f"cpu{i}", {"cpu": 1.0}) for i in range(l_)]
    assumptions = [
        "layers = colour classes; times in the file's milliseconds converted to seconds",
        "memory: a layer's 'size' counted as parameter bytes; no in-flight activation memory",
        "CPUs have no memory limit",
    ]
    if ratios:
        bandwidth = statistics.median(ratios)
        assumptions.append(
            f"bandwidth {bandwidth:.4g} B/s = median edge size/cost; a cut costs 2 x bytes / bandwidth "
            "(the paper charges each forward and backward edge its own cost)"
        )
    else:
        bandwidth = 2.0**31
        assumptions.append(f"bandwidth {bandwidth:.4g} B/s assumed (no edge with a positive cost)")
    return Instance(
        g,
        Cluster(tuple(devices), bandwidth),
        settings or Settings(),
        name=path.stem,
        assumptions=tuple(assumptions),
    )
