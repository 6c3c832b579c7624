"""Reader for PipeDream's profile files (``graph.txt`` format of its profiler).

Each node line is ``nodeK -- Description -- forward_compute_time=F, backward_compute_time=B,
activation_size=A, parameter_size=P`` (times in milliseconds for the whole minibatch on one
GPU, sizes in bytes); each edge line is a tab followed by ``nodeI -- nodeJ``.

Reference: Narayanan et al., PipeDream: Generalized Pipeline Parallelism for DNN Training,
SOSP 2019, doi 10.1145/3341301.3359646; profiles from its repository (MIT licence).
"""

from __future__ import annotations

import math
import os
import re
from typing import TYPE_CHECKING

from ..cluster import Cluster
from ..errors import ReadError
from ..graph import LazyDiGraph, _natural_key
from ..instance import Instance, Settings
from ..units import as_size

if TYPE_CHECKING:
    from pathlib import Path

    import networkx as nx

_NODE = re.compile(
    r"^(?P<name>\S+) -- (?P<desc>.*) -- forward_compute_time=(?P<f>[^,]+), "
    r"backward_compute_time=(?P<b>[^,]+), activation_size=(?P<a>[^,]+), parameter_size=(?P<p>[^,\s]+)\s*$"
)
_EDGE = re.compile(r"^\s+(?P<u>\S+) -- (?P<v>\S+)\s*$")

DEFAULT_BANDWIDTH = 1.25e10
"""Bytes/s assumed between workers when none is given: 100 Gbit/s (InfiniBand EDR class)."""


DEFAULT_STAGES = (4, 8)
"""Stage counts a profile is benchmarked with by default: a profile carries no cluster of its own."""


def _stem(path: str) -> str:
    """The file name without its last suffix (``pathlib.Path(path).stem``)."""
    return os.path.splitext(os.path.basename(path))[0]


def _number(text: str, path: str, lineno: int, what: str) -> float:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):  # several outputs (GNMT's LSTMs): their sum
        return sum(_number(part, path, lineno, what) for part in text[1:-1].split(";"))
    try:
        value = float(text)
    except ValueError:
        raise ReadError(f"{path}:{lineno}: {what} {text!r} is not a number") from None
    if math.isnan(value) or value < 0:
        raise ReadError(f"{path}:{lineno}: {what} {value!r} is negative or not a number")
    return value


def read_pipedream_graph(path: str | Path, *, count_input_time: bool = False, kind: str = "gpu") -> nx.DiGraph:
    """Read a PipeDream profile into a layer graph.

    Parameters
    ----------
    path
        The profile file.
    count_input_time
        PipeDream's ``Input`` nodes (``Input``, ``Input0``, ...) carry data-loading time in
        their forward time. By default it is left out of stage compute (kept in the node
        attribute ``load_time``, seconds); ``True`` counts it as forward time. Input nodes are
        always pinned to the first stage (``pin_first``).
    kind
        Resource kind the measured times belong to.

    Returns
    -------
    networkx.DiGraph
        Nodes in natural name order with ``fwd``/``bwd`` = ``{kind: seconds}``, ``out_bytes`` =
        ``act_bytes`` = the activation size, ``param_bytes``, ``op`` (the description).

    Raises
    ------
    ReadError
        If the file is missing or unreadable, a line is malformed, a number is invalid, or an
        edge names an undeclared node.
    """
    return _read_graph(path, count_input_time=count_input_time, kind=kind).to_networkx()


def _read_graph(path, *, count_input_time: bool, kind: str) -> LazyDiGraph:
    """:func:`read_pipedream_graph`'s graph as a :class:`pipeopt.graph.LazyDiGraph` (the same
    dicts, built without importing networkx; :func:`read_pipedream` keeps it so)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ReadError(f"a PipeDream profile path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    path = os.fspath(path)  # os.path, not pathlib: on the start-up path
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReadError(f"cannot read PipeDream profile {path}: {exc}") from None
    nodes: dict = {}
    edges: list = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if m := _EDGE.match(line):
            edges.append((m["u"], m["v"], lineno))
            continue
        m = _NODE.match(line)
        if m is None:
            raise ReadError(f"{path}:{lineno}: not a PipeDream node or edge line: {line[:80]!r}")
        name = m["name"]
        if name in nodes:
            raise ReadError(f"{path}:{lineno}: node {name!r} declared twice")
        f = _number(m["f"], path, lineno, "forward_compute_time") / 1000.0
        b = _number(m["b"], path, lineno, "backward_compute_time") / 1000.0
        a = _number(m["a"], path, lineno, "activation_size")
        p = _number(m["p"], path, lineno, "parameter_size")
        desc = m["desc"].strip()
        is_input = re.fullmatch(r"Input\d*", desc) is not None
        attrs = {
            "op": desc,
            "fwd": {kind: f if (count_input_time or not is_input) else 0.0},
            "bwd": {kind: b},
            "out_bytes": a,
            "act_bytes": a,
            "param_bytes": p,
        }
        if is_input:
            attrs["pin_first"] = True
            attrs["load_time"] = f
        nodes[name] = attrs
    if not nodes:
        raise ReadError(f"{path}: no layers found (is this a PipeDream profile?)")
    graph = LazyDiGraph()
    for name in sorted(nodes, key=_natural_key):
        graph.add_node(name, **nodes[name])
    for u, v, lineno in edges:
        for x in (u, v):
            if x not in nodes:
                raise ReadError(f"{path}:{lineno}: edge {u} -- {v} names undeclared node {x!r}")
        graph.add_edge(u, v)
    graph.graph["name"] = _stem(path)
    graph.graph["source"] = "PipeDream profile (Narayanan et al., SOSP 2019)"
    return graph


def read_pipedream(
    path: str | Path,
    *,
    devices: int = 16,
    bandwidth: float | None = None,
    memory: float = math.inf,
    count_input_time: bool = False,
    settings: Settings | None = None,
) -> Instance:
    """Read a PipeDream profile as an :class:`Instance` on identical GPUs.

    Parameters
    ----------
    path
        The profile file.
    devices
        Number of identical GPUs in the cluster (each one unit of ``"gpu"``, the device the
        profile was measured on).
    bandwidth
        Bytes/s between workers, or a unit string (``"100Gbps"``, ``"12.5GB/s"``,
        :func:`pipeopt.units.parse_bandwidth`); ``None`` assumes :data:`DEFAULT_BANDWIDTH`
        and records the assumption in ``Instance.assumptions`` (a lower bandwidth makes cuts
        dearer and pushes the optimum towards cuts with small activations).
    memory
        Bytes per GPU, or a size string (``"16GiB"``); ``inf``: no memory limit.
    count_input_time
        See :func:`read_pipedream_graph`.
    settings
        Scoring settings (default :class:`Settings`).

    Raises
    ------
    ReadError
        See :func:`read_pipedream_graph`.
    InvalidClusterError
        If ``devices`` is not an integer in 1 .. :data:`pipeopt.units.MAX_DEVICES`, or the
        bandwidth or memory is invalid (:class:`~pipeopt.errors.InvalidUnitError`).
    """
    graph = _read_graph(path, count_input_time=count_input_time, kind="gpu")
    memory = as_size(memory, unlimited=True)
    assumptions = []
    if bandwidth is None:
        bandwidth = DEFAULT_BANDWIDTH
        assumptions.append(f"bandwidth {bandwidth:.3g} B/s between workers (assumed; pass bandwidth= to change)")
    if not count_input_time:
        assumptions.append("Input nodes' data-loading time left out of stage compute")
    if math.isinf(memory):
        assumptions.append("no memory limit per GPU")
    cluster = Cluster.homogeneous(devices, memory=memory, bandwidth=bandwidth)
    return Instance(graph, cluster, settings or Settings(), name=_stem(os.fspath(path)), assumptions=tuple(assumptions),
                    default_stages=DEFAULT_STAGES)
