"""pipeopt's native JSON instance format: a layer graph, a cluster and the settings in one file.

The format round-trips exactly: ``from_dict(to_dict(inst))`` has the same nodes in the same
order, the same edges in the same order, the same attribute values (floats bit for bit,
through Python's shortest ``repr``) and the same cluster and settings; ``to_dict(from_dict(d))
== d`` for every ``d`` this module writes.

Schema (version 1)
------------------
A JSON object with these fields (units as in docs/cost-model.md: seconds, bytes, bytes/s)::

    {
      "format": "pipeopt-instance",       # required, exactly this string
      "version": 1,                        # required, integer; newer versions are refused
      "name": "vgg16-a100x8",              # optional (default "instance"): label for tables
      "assumptions": ["..."],              # optional (default []): inputs that were assumed
      "default_stages": [4, 8],            # optional (default []): stage counts to benchmark
      "settings": {                        # optional; missing fields take Settings defaults
        "overlap": true,                   #   communication overlaps compute
        "weight_stashing": false,          #   S - i weight versions on stage i
        "microbatches": 8,                 #   M, microbatches per iteration
        "objective": "bottleneck",         #   "bottleneck" | "iteration" | "gpipe" | "max_load"
        "zero": 2, "dp": 4,                #   written only when not the default (0, 1, 0.0, 0.0):
        "gradient_ratio": 1.0,             #   ZeRO stage, data-parallel replicas, gradient and
        "optimizer_ratio": 2.0             #   optimizer bytes per parameter byte
      },
      "cluster": {                         # required
        "bandwidth": 2.5e10,               # required: bytes/s between consecutive workers,
                                           #   or a unit string read (never written) as in
                                           #   pipeopt.units: "200Gbps", "25GB/s"
        "latency": 3e-4,                   # optional (written when not 0): seconds per
                                           #   message (alpha-beta), or "0.3ms"
        "collective_bandwidth": 1e10,      # optional (written when set): bytes/s of the
                                           #   collectives' ring steps (bus bandwidth);
                                           #   absent = the link's bandwidth
        "devices": [                       # required, non-empty, in cluster order
          {"name": "gpu0",                 # required, unique
           "resources": {"gpu": 156.0},    # required: units of each resource kind
           "memory": 4.0e10,               # required: bytes; null = no limit (infinite);
                                           #   or a unit string ("40GB", "40GiB")
           "host": false}                  # optional (written when true): transfers go
                                           #   through its memory (max_load objective)
        ]
      },
      "graph": {                           # required: the layer graph (node-link style)
        "attributes": {"source": "..."},   # optional: networkx graph attributes (e.g.
                                           #   "stage_overhead": {"forward": s, "backward": s})
        "nodes": [                         # required, in node order (the order is kept)
          {"id": "conv1",                  # required: the layer name (string or integer)
           "fwd": {"gpu": 1.2e-4},         # seconds on ONE unit of each kind
           "bwd": {"gpu": 2.4e-4},         # seconds on ONE unit of each kind
           "bwd_w": {"gpu": 1.1e-4},       # optional: the weight-gradient part W of bwd
                                           #   (I = bwd - W); missing: W = bwd / 2 assumed
           "out_bytes": 1.6e7,             # activation bytes sent to each successor
           "act_bytes": 3.2e7,             # activation bytes stashed for the backward pass
           "param_bytes": 1.4e4,           # parameter bytes
           "pin_first": false,             # optional: must sit in the first stage
           "op": "Conv2d(3, 64, 11, 4)",   # optional and any further attributes
           ...}
        ],
        "edges": [                         # required, in edge order
          {"source": "conv1", "target": "relu1",   # required
           "bytes": 1.6e7}                 # optional: bytes per microbatch (default: the
        ]                                  #   tail's out_bytes) and any further attributes
      }
    }

Values of free attributes (node, edge and graph attributes) may be JSON scalars, lists,
tuples and string-keyed dicts. Two values JSON cannot hold are tagged so that they come back
unchanged: a non-finite float is written ``{"__float__": "inf"}`` (``"-inf"``, ``"nan"``) --
e.g. a ``fwd`` entry of a kind the layer cannot run on -- and a tuple is written
``{"__tuple__": [...]}``. Device memory is the one exception: ``null`` means no limit.
Numpy scalars are written as the Python numbers they equal.

Errors: an unreadable file, invalid JSON, a wrong header, a missing or ill-typed field raise
:class:`pipeopt.errors.ReadError` naming the file and the field; valid JSON with invalid
content (a cycle, a negative time, a device without resources, an unknown objective) raises
the typed error of the object that rejects it (:class:`~pipeopt.errors.InvalidGraphError`,
:class:`~pipeopt.errors.InvalidClusterError`, :class:`~pipeopt.errors.InvalidProblemError`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from pathlib import Path

import networkx as nx
import numpy as np

from ..cluster import Cluster, Device
from ..errors import InvalidGraphError, InvalidUnitError, ReadError
from ..instance import Instance, Settings
from ..units import parse_bandwidth, parse_latency, parse_size

FORMAT = "pipeopt-instance"
"""Value of the ``"format"`` header field."""

VERSION = 1
"""Schema version this module writes (and the newest it reads)."""

_ALWAYS_WRITTEN = ("overlap", "weight_stashing", "microbatches", "objective")
"""Settings fields every file carries; the others (data parallelism and ZeRO) only when they
differ from their defaults, so that a file of today's model reads as it always did."""

_FLOAT_TAG = "__float__"
_TUPLE_TAG = "__tuple__"


# ---- value encoding ------------------------------------------------------------------------
def _encode(value, where: str):
    """JSON-ready copy of an attribute value (see the module docstring for the tags)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isfinite(value):
            return value
        return {_FLOAT_TAG: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [_encode(v, where) for v in value]}
    if isinstance(value, (list, np.ndarray)):
        return [_encode(v, where) for v in list(value)]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidGraphError(
                    f"{where}: dict key {k!r} is not a string; the JSON format cannot store it"
                )
            out[k] = _encode(v, f"{where}[{k!r}]")
        return out
    raise InvalidGraphError(
        f"{where}: value {value!r} of type {type(value).__name__} cannot be stored in JSON"
    )


def _decode(value):
    """Inverse of :func:`_encode`."""
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _FLOAT_TAG in value and value[_FLOAT_TAG] in ("inf", "-inf", "nan"):
            return float(value[_FLOAT_TAG])
        if len(value) == 1 and _TUPLE_TAG in value and isinstance(value[_TUPLE_TAG], list):
            return tuple(_decode(v) for v in value[_TUPLE_TAG])
        return {k: _decode(v) for k, v in value.items()}
    return value


def _node_id(node, where: str):
    if isinstance(node, bool) or not isinstance(node, (str, int)):
        raise InvalidGraphError(
            f"{where}: layer name {node!r} must be a string or an integer for the JSON format"
        )
    return node


# ---- to / from dict ------------------------------------------------------------------------
def to_dict(instance: Instance) -> dict:
    """The JSON-ready dict of an instance (schema in the module docstring).

    Parameters
    ----------
    instance
        Any :class:`pipeopt.Instance`.

    Returns
    -------
    dict
        Plain JSON types only (no ``inf``/``nan`` floats), so ``json.dumps`` writes
        standard JSON.

    Raises
    ------
    InvalidGraphError
        If a layer name is not a string or integer, or an attribute value has a type the
        format cannot store (a set, an object, a dict with non-string keys).
    """
    g = instance.graph
    nodes = []
    for node, attrs in g.nodes(data=True):
        where = f"layer {node!r}"
        entry = {"id": _node_id(node, where)}
        for key, value in attrs.items():
            if key == "id":
                raise InvalidGraphError(f"{where}: attribute name 'id' is reserved by the JSON format")
            entry[key] = _encode(value, f"{where} attribute {key!r}")
        nodes.append(entry)
    edges = []
    for u, v, attrs in g.edges(data=True):
        where = f"edge {u!r} -> {v!r}"
        entry = {"source": u, "target": v}
        for key, value in attrs.items():
            if key in ("source", "target"):
                raise InvalidGraphError(f"{where}: attribute name {key!r} is reserved by the JSON format")
            entry[key] = _encode(value, f"{where} attribute {key!r}")
        edges.append(entry)
    devices = [
        {
            "name": d.name,
            "resources": _encode(dict(d.resources), f"device {d.name!r} resources"),
            "memory": None if d.memory == math.inf else _encode(d.memory, f"device {d.name!r} memory"),
            **({"host": True} if d.host else {}),
        }
        for d in instance.cluster.devices
    ]
    return {
        "format": FORMAT,
        "version": VERSION,
        "name": instance.name,
        "assumptions": list(instance.assumptions),
        **({"default_stages": list(instance.default_stages)} if instance.default_stages else {}),
        "settings": {f.name: getattr(instance.settings, f.name) for f in dataclasses.fields(Settings)
                     if f.name in _ALWAYS_WRITTEN or getattr(instance.settings, f.name) != f.default},
        "cluster": {
            "bandwidth": _encode(instance.cluster.bandwidth, "cluster bandwidth"),
            **({"latency": _encode(instance.cluster.latency, "cluster latency")} if instance.cluster.latency else {}),
            **({"collective_bandwidth": _encode(instance.cluster.collective_bandwidth, "cluster collective bandwidth")}
               if instance.cluster.collective_bandwidth is not None else {}),
            "devices": devices,
        },
        "graph": {
            "attributes": _encode(dict(g.graph), "graph attributes"),
            "nodes": nodes,
            "edges": edges,
        },
    }


def _field(obj, key: str, source: str, where: str, types, *, required: bool = True, default=None):
    """``obj[key]``, checked to be one of ``types``; ReadError naming ``source`` and the field."""
    if not isinstance(obj, dict):
        raise ReadError(
            f"{source}: {where or 'the top level'} must be a JSON object, got {type(obj).__name__}"
        )
    name = f"{where}.{key}" if where else key
    if key not in obj:
        if required:
            raise ReadError(f"{source}: missing field {name!r}")
        return default
    value = obj[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        expect = " or ".join(t.__name__ for t in _as_tuple(types))
        raise ReadError(
            f"{source}: field {name!r} must be {expect}, got {type(value).__name__} {value!r:.60}"
        )
    return value


def _unit(value, parse, source: str, name: str):
    """A unit string (``"100Gbps"``, ``"40GiB"``) read by ``parse``; other values unchanged."""
    if not isinstance(value, str):
        return value
    try:
        return parse(value) if parse in (parse_bandwidth, parse_latency) else parse(value, unlimited=True)
    except InvalidUnitError as exc:
        raise InvalidUnitError(f"{source}: field {name!r}: {exc}") from None


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def from_dict(d: dict, *, source: str = "<dict>") -> Instance:
    """Build an :class:`~pipeopt.Instance` from the dict :func:`to_dict` writes.

    Parameters
    ----------
    d
        The parsed JSON object (schema in the module docstring).
    source
        Where ``d`` came from (a file name), used in error messages.

    Returns
    -------
    Instance
        Validated.

    Raises
    ------
    ReadError
        Wrong ``format`` header, unsupported ``version``, a missing or ill-typed field, an
        unknown settings field, a duplicate layer, an edge naming an undeclared layer.
    InvalidGraphError, InvalidClusterError, InvalidProblemError
        If the content is well-formed but invalid (raised by the graph, cluster, settings
        and instance checks).
    """
    fmt = _field(d, "format", source, "", str)
    if fmt != FORMAT:
        raise ReadError(
            f"{source}: field 'format' is {fmt!r}, expected {FORMAT!r} (not a pipeopt instance file)"
        )
    version = _field(d, "version", source, "", int)
    if version < 1 or version > VERSION:
        raise ReadError(f"{source}: field 'version' is {version}; this pipeopt reads versions 1..{VERSION}")
    name = _field(d, "name", source, "", str, required=False, default="instance")
    assumptions = _field(d, "assumptions", source, "", list, required=False, default=[])
    for i, a in enumerate(assumptions):
        if not isinstance(a, str):
            raise ReadError(f"{source}: field 'assumptions[{i}]' must be a string, got {a!r}")

    raw_settings = _field(d, "settings", source, "", dict, required=False, default={})
    known = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(raw_settings) - known)
    if unknown:
        raise ReadError(f"{source}: unknown field 'settings.{unknown[0]}' (known: {sorted(known)})")
    settings = Settings(**raw_settings)

    raw_cluster = _field(d, "cluster", source, "", dict)
    bandwidth = _unit(
        _decode(_field(raw_cluster, "bandwidth", source, "cluster", (int, float, dict, str))),
        parse_bandwidth, source, "cluster.bandwidth",
    )
    latency = _unit(_decode(_field(raw_cluster, "latency", source, "cluster", (int, float, dict, str), required=False,
                                   default=0.0)), parse_latency, source, "cluster.latency")
    collective = _field(raw_cluster, "collective_bandwidth", source, "cluster", (int, float, dict, str, type(None)),
                        required=False, default=None)
    if collective is not None:
        collective = _unit(_decode(collective), parse_bandwidth, source, "cluster.collective_bandwidth")
    raw_devices = _field(raw_cluster, "devices", source, "cluster", list)
    devices = []
    for i, rd in enumerate(raw_devices):
        where = f"cluster.devices[{i}]"
        dname = _field(rd, "name", source, where, str)
        resources = _field(rd, "resources", source, where, dict)
        memory = _field(rd, "memory", source, where, (int, float, dict, str, type(None)))
        memory = math.inf if memory is None else _unit(_decode(memory), parse_size, source, f"{where}.memory")
        host = _field(rd, "host", source, where, bool, required=False, default=False)
        devices.append(Device(dname, _decode(resources), memory, host))
    cluster = Cluster(tuple(devices), bandwidth, latency, collective)

    raw_graph = _field(d, "graph", source, "", dict)
    graph = nx.DiGraph()
    graph.graph.update(
        _decode(_field(raw_graph, "attributes", source, "graph", dict, required=False, default={}))
    )
    raw_nodes = _field(raw_graph, "nodes", source, "graph", list)
    for i, rn in enumerate(raw_nodes):
        where = f"graph.nodes[{i}]"
        node = _field(rn, "id", source, where, (str, int))
        if node in graph:
            raise ReadError(f"{source}: {where}: layer {node!r} declared twice")
        graph.add_node(node, **{k: _decode(v) for k, v in rn.items() if k != "id"})
    raw_edges = _field(raw_graph, "edges", source, "graph", list)
    for i, re_ in enumerate(raw_edges):
        where = f"graph.edges[{i}]"
        u = _field(re_, "source", source, where, (str, int))
        v = _field(re_, "target", source, where, (str, int))
        for x in (u, v):
            if x not in graph:
                raise ReadError(f"{source}: {where}: edge {u!r} -> {v!r} names undeclared layer {x!r}")
        if graph.has_edge(u, v):
            raise ReadError(f"{source}: {where}: edge {u!r} -> {v!r} declared twice")
        graph.add_edge(u, v, **{k: _decode(x) for k, x in re_.items() if k not in ("source", "target")})
    default_stages = _field(d, "default_stages", source, "", list, required=False, default=[])
    return Instance(graph, cluster, settings, name=name, assumptions=tuple(assumptions),
                    default_stages=tuple(default_stages))


# ---- files ---------------------------------------------------------------------------------
def dumps(instance: Instance) -> str:
    """The file text :func:`write_instance` writes (indented, key order as in the schema,
    one trailing newline; deterministic)."""
    return json.dumps(to_dict(instance), indent=1, allow_nan=False) + "\n"


def write_instance(instance: Instance, path: str | Path) -> Path:
    """Write an instance as a native JSON file.

    Parameters
    ----------
    instance
        The instance.
    path
        Target file (parent directories are created).

    Returns
    -------
    Path
        The path written.

    Raises
    ------
    InvalidGraphError
        See :func:`to_dict`.
    """
    path = Path(path)
    text = dumps(instance)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def read_instance(path: str | Path) -> Instance:
    """Read a native JSON instance file.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    Instance

    Raises
    ------
    ReadError
        If the file is missing or unreadable, is not valid JSON (line and column given), or
        fails the schema (see :func:`from_dict`).
    InvalidGraphError, InvalidClusterError, InvalidProblemError
        If its content is invalid.
    """
    if not isinstance(path, (str, Path)):
        raise ReadError(f"an instance file path must be a str or Path, got {type(path).__name__} {path!r:.60}")
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReadError(f"cannot read instance file {path}: {exc}") from None
    try:
        d = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ReadError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except ValueError as exc:
        raise ReadError(f"{path}: invalid JSON: {exc}") from None
    return from_dict(d, source=str(path))


def _reject_constant(name: str):
    raise ValueError(f'non-standard constant {name} (write {{"{_FLOAT_TAG}": "inf"}} instead)')
