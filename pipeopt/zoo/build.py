"""Turn zoo architectures and catalogue devices into layer graphs, clusters and instances."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import networkx as nx

from ..cluster import Cluster, Device
from ..errors import InvalidClusterError, InvalidProblemError
from ..graph import validate_graph
from ..instance import Instance, Settings
from . import models as _m
from .devices import KINDS, PRECISIONS, REFERENCE_FLOPS, Kind, device, link_bandwidth

BACKWARD_FLOP_FACTOR = 2.0
"""Backward FLOP = 2 x forward FLOP for every layer (Kaplan et al. 2020; module
:mod:`pipeopt.zoo.shapes`)."""


@dataclass(frozen=True)
class ModelEntry:
    """A zoo model: its layer-list builder, default microbatch, sequence handling, citation."""

    name: str
    build: Callable
    microbatch: int
    citation: str
    sequence: bool = False
    seq_len: int | None = None


MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in [
        ModelEntry("alexnet", _m.alexnet, 64, "Krizhevsky, Sutskever, Hinton, NeurIPS 2012"),
        ModelEntry("googlenet", _m.googlenet, 32, "Szegedy et al., CVPR 2015, doi 10.1109/CVPR.2015.7298594"),
        ModelEntry("vgg16", _m.vgg16, 32, "Simonyan & Zisserman, ICLR 2015, arXiv:1409.1556"),
        ModelEntry("resnet50", _m.resnet50, 32, "He, Zhang, Ren, Sun, CVPR 2016, doi 10.1109/CVPR.2016.90"),
        ModelEntry(
            "bert-large", _m.bert_large, 8, "Devlin et al., NAACL 2019, doi 10.18653/v1/N19-1423", True, 512
        ),
        ModelEntry(
            "gpt2-xl",
            lambda seq_len: _m.gpt("gpt2-xl", seq_len),
            2,
            "Radford et al., Language Models are Unsupervised Multitask Learners, 2019",
            True,
            1024,
        ),
        ModelEntry(
            "gpt3-6.7b",
            lambda seq_len: _m.gpt("gpt3-6.7b", seq_len),
            2,
            "Brown et al., NeurIPS 2020, arXiv:2005.14165 (table 2.1)",
            True,
            2048,
        ),
        ModelEntry(
            "llama-7b",
            lambda seq_len: _m.llama("llama-7b", seq_len),
            2,
            "Touvron et al., LLaMA: Open and Efficient Foundation Language Models, arXiv:2302.13971 (table 2)",
            True,
            2048,
        ),
    ]
}
"""The zoo's models by name, with their default microbatch (and sequence length)."""


def _entry(name: str) -> ModelEntry:
    try:
        return MODELS[name]
    except KeyError:
        raise InvalidProblemError(f"unknown zoo model {name!r}; the zoo has {sorted(MODELS)}") from None


def _kinds(kinds, efficiency: dict | None) -> dict[str, Kind]:
    out = {}
    for k in kinds:
        if efficiency and k in efficiency:
            f, b = efficiency[k]
            out[k] = Kind(k, f, b, "given")
        elif k in KINDS:
            out[k] = KINDS[k]
        else:
            raise InvalidProblemError(f"unknown resource kind {k!r}; the catalogue has {sorted(KINDS)}")
    if not out:
        raise InvalidProblemError("a zoo model needs at least one resource kind")
    return out


def _positive_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidProblemError(f"{what} must be a positive integer, got {value!r}")
    return value


def model(
    name: str,
    *,
    microbatch: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp16",
    kinds: tuple = ("gpu",),
    efficiency: dict | None = None,
) -> nx.DiGraph:
    """The layer graph of a zoo model, with times per resource kind.

    Parameters
    ----------
    name
        A key of :data:`MODELS`: ``alexnet``, ``googlenet``, ``vgg16``, ``resnet50``,
        ``bert-large``, ``gpt2-xl``, ``gpt3-6.7b``, ``llama-7b``.
    microbatch
        Samples (images or sequences) per microbatch; default the model's
        (:attr:`ModelEntry.microbatch`).
    seq_len
        Tokens per sequence (transformers only; default 512 for BERT, the context for GPT).
    precision
        ``"fp16"`` (2 bytes per activation and parameter element) or ``"fp32"`` (4 bytes).
        Dropout masks take 1 byte per element, token ids 8.
    kinds
        Resource kinds to give times for (keys of :data:`pipeopt.zoo.devices.KINDS`).
    efficiency
        ``dict[kind, (forward, backward)]`` achieved/peak fractions overriding the catalogue's.

    Returns
    -------
    networkx.DiGraph
        Valid for :func:`pipeopt.graph.validate_graph`. Node attributes: ``fwd``/``bwd``
        (``dict[kind, seconds]`` on one reference unit = 1 TFLOP/s peak, i.e.
        ``FLOP / (1e12 * efficiency)``, backward FLOP = 2 x forward), ``out_bytes``,
        ``act_bytes``, ``param_bytes`` (bytes per microbatch / in total), ``op``, ``flop``
        (forward FLOP per microbatch), ``macs`` (per microbatch), ``shared_param_bytes``
        (tied weights the layer duplicates), ``pin_first`` on the input node. Graph
        attributes record the model, its citation, microbatch, sequence length, precision
        and the efficiencies used.

    Raises
    ------
    InvalidProblemError
        Unknown model, kind or precision; a non-positive microbatch or sequence length; a
        sequence length for a CNN or beyond the model's positions.
    """
    entry = _entry(name)
    b = entry.microbatch if microbatch is None else _positive_int(microbatch, "microbatch")
    if precision not in PRECISIONS:
        raise InvalidProblemError(f"unknown precision {precision!r}; choose from {sorted(PRECISIONS)}")
    bpe = PRECISIONS[precision]
    ks = _kinds(kinds, efficiency)
    if entry.sequence:
        s = entry.seq_len if seq_len is None else _positive_int(seq_len, "seq_len")
        try:
            specs = entry.build(seq_len=s)
        except ValueError as exc:
            raise InvalidProblemError(f"{name}: {exc}") from None
    else:
        if seq_len is not None:
            raise InvalidProblemError(f"{name} is a CNN; it takes no seq_len")
        s = None
        specs = entry.build()

    g = nx.DiGraph()
    for sp in specs:
        flop = sp.flop * b
        attrs = {
            "op": sp.op,
            "fwd": {k: flop / (REFERENCE_FLOPS * kd.forward_efficiency) for k, kd in ks.items()},
            "bwd": {
                k: BACKWARD_FLOP_FACTOR * flop / (REFERENCE_FLOPS * kd.backward_efficiency)
                for k, kd in ks.items()
            },
            "flop": float(flop),
            "macs": float(sp.macs * b),
            "param_bytes": float(sp.params * bpe),
        }
        if sp.is_input:
            out = float(sp.out * (sp.in_bytes_per_element or bpe) * b)
            attrs.update(out_bytes=out, act_bytes=out, pin_first=True)  # the first layer's input is kept
        else:
            attrs["out_bytes"] = float(sp.out * bpe * b)
            attrs["act_bytes"] = float((sp.saved * bpe + sp.mask) * b)
        if sp.shared:
            attrs["shared_param_bytes"] = float(sp.shared * bpe)
        g.add_node(sp.name, **attrs)
        for u in sp.inputs:
            g.add_edge(u, sp.name)
    g.graph.update(
        name=name,
        source=f"pipeopt model zoo: {entry.citation}",
        microbatch=b,
        precision=precision,
        efficiency={k: [kd.forward_efficiency, kd.backward_efficiency] for k, kd in ks.items()},
    )
    if s is not None:
        g.graph["seq_len"] = s
    validate_graph(g)
    return g


def cluster(
    devices: str | dict,
    n: int | None = None,
    *,
    bandwidth: str | float = "ib-hdr",
    precision: str = "fp16",
    memory: float | None = None,
) -> Cluster:
    """A cluster of catalogue devices.

    Parameters
    ----------
    devices
        A catalogue device name (with ``n``), or ``dict[name, count]`` for a mixed cluster
        (devices listed in the dict's order).
    n
        Number of identical devices when ``devices`` is a name.
    bandwidth
        Bytes/s between consecutive workers, or a link name of
        :data:`pipeopt.zoo.devices.LINKS` (default ``"ib-hdr"``, 25 GB/s).
    precision
        Precision of the peak rates used as units (must match the model's).
    memory
        Bytes per device overriding the catalogue's (``math.inf``: no limit).

    Returns
    -------
    Cluster
        Device ``i`` of catalogue type ``t`` is named ``f"{t}-{i}"``; its resources are its
        peak TFLOP/s per kind at ``precision`` (1 unit = 1 TFLOP/s, see
        :mod:`pipeopt.zoo.devices`).

    Raises
    ------
    InvalidClusterError
        Unknown device or link, a count below 1, a device without a kind at ``precision``.
    """
    if isinstance(devices, str):
        if n is None:
            raise InvalidClusterError("give the number of devices n with a device name")
        counts = {devices: n}
    else:
        if n is not None:
            raise InvalidClusterError("give either a device name and n, or a dict of counts")
        counts = dict(devices)
    bw = link_bandwidth(bandwidth)
    out = []
    for name, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidClusterError(f"number of {name!r} devices must be a positive integer, got {count!r}")
        spec = device(name)
        res = spec.resources(precision)
        mem = spec.memory if memory is None else memory
        out += [Device(f"{name}-{i}", dict(res), mem) for i in range(count)]
    return Cluster(tuple(out), bw)


def instance(
    model_name: str,
    devices: str | dict,
    n: int | None = None,
    *,
    microbatch: int | None = None,
    seq_len: int | None = None,
    precision: str = "fp16",
    bandwidth: str | float = "ib-hdr",
    memory: float | None = None,
    microbatches: int | None = None,
    settings: Settings | None = None,
    name: str | None = None,
    efficiency: dict | None = None,
) -> Instance:
    """A zoo model on a catalogue cluster, with its assumptions recorded.

    Parameters
    ----------
    model_name
        See :func:`model`.
    devices, n, bandwidth, precision, memory
        See :func:`cluster`. The graph gets times for every kind the cluster has.
    microbatch, seq_len
        See :func:`model`.
    microbatches
        M per iteration (default 4 x the number of devices, GPipe's advice M >= 4S).
    settings
        Scoring settings (default :class:`pipeopt.Settings` with ``microbatches``).
    efficiency
        ``dict[kind, (forward, backward)]`` overriding the catalogue's efficiencies (see
        :func:`model`).
    name
        Instance label (default ``"{model}-{device}-x{n}"``, or ``"{model}-mix{N}"`` for a
        mixed cluster of N devices).

    Returns
    -------
    Instance

    Raises
    ------
    InvalidProblemError, InvalidClusterError
        See :func:`model` and :func:`cluster`.
    """
    cl = cluster(devices, n, bandwidth=bandwidth, precision=precision, memory=memory)
    g = model(
        model_name,
        microbatch=microbatch,
        seq_len=seq_len,
        precision=precision,
        kinds=cl.kinds,
        efficiency=efficiency,
    )
    N = len(cl.devices)
    if settings is None:
        settings = Settings(microbatches=microbatches if microbatches is not None else 4 * N)
    elif microbatches is not None:
        raise InvalidProblemError("give either settings or microbatches, not both")
    if name is None:
        name = f"{model_name}-{devices}-x{n}" if isinstance(devices, str) else f"{model_name}-mix{N}"
    link = f"link {bandwidth}" if isinstance(bandwidth, str) else "given bandwidth"
    assumptions = [
        "layer times from FLOP: time = FLOP / (peak x efficiency); efficiencies (forward, backward) "
        + ", ".join(f"{k} {v[0]:g}/{v[1]:g}" for k, v in g.graph["efficiency"].items()),
        f"backward FLOP = {BACKWARD_FLOP_FACTOR:g} x forward FLOP",
        f"precision {precision}: {PRECISIONS[precision]} bytes per activation and parameter element",
        f"bandwidth {cl.bandwidth:.4g} B/s between consecutive workers ({link})",
        "memory holds weights and stashed activations only (no gradients, optimizer state or workspace)",
    ]
    if any(math.isinf(d.memory) for d in cl.devices):
        assumptions.append("no memory limit on some devices")
    return Instance(g, cl, settings, name=name, assumptions=tuple(assumptions))
