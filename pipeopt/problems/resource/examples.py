"""Small synthetic multi-resource instances for tests, examples and benchmarks.

Until the model zoo ships multi-resource devices, these build layer chains whose per-kind
forward and backward times have *different* forward/backward ratios per kind (the case where
the split pays), and clusters of mobile-SoC-like devices (CPU, GPU, NPU). The numbers are
synthetic, not measurements; they are documented where used.
"""

from __future__ import annotations

import math
import random

import networkx as nx

from ...cluster import Cluster, Device
from ...instance import Instance

KIND_SPEED = {"cpu": 1.0, "gpu": 0.25, "npu": 0.15}
"""Synthetic seconds-per-layer scale of one unit of each kind (relative)."""

KIND_BWD_RATIO = {"cpu": 1.2, "gpu": 2.0, "npu": 3.5}
"""Synthetic backward/forward ratio per kind (different ratios make the split pay)."""


def random_chain(n: int, kinds=("cpu", "gpu", "npu"), *, seed: int = 0, act_bytes: float = 2e6,
                 param_bytes: float = 1e6, ratio_noise: float = 0.5) -> nx.DiGraph:
    """A chain of ``n`` layers with random per-kind forward and backward times.

    Parameters
    ----------
    n
        Number of layers.
    kinds
        Resource kinds every layer runs on.
    seed
        Random seed.
    act_bytes, param_bytes
        Mean activation (= output) and parameter bytes per layer.
    ratio_noise
        Spread of each layer's backward/forward ratio around :data:`KIND_BWD_RATIO`.

    Returns
    -------
    networkx.DiGraph
        Layers ``l0 .. l{n-1}`` (seconds per unit of kind; bytes).
    """
    rng = random.Random(seed)
    g = nx.DiGraph()
    for i in range(n):
        work = rng.uniform(0.2, 2.0)
        fwd = {k: work * KIND_SPEED.get(k, 1.0) * rng.uniform(0.7, 1.4) for k in kinds}
        bwd = {k: fwd[k] * KIND_BWD_RATIO.get(k, 2.0) * rng.uniform(1 - ratio_noise, 1 + ratio_noise) for k in kinds}
        a = act_bytes * rng.uniform(0.3, 1.7)
        g.add_node(f"l{i}", fwd=fwd, bwd=bwd, out_bytes=a, act_bytes=a,
                   param_bytes=param_bytes * rng.uniform(0.0, 2.0))
        if i:
            g.add_edge(f"l{i - 1}", f"l{i}")
    return g


def with_second_kind(graph: nx.DiGraph, *, base: str = "gpu", kind: str = "cpu", slowdown: float = 8.0,
                     bwd_ratio: float = 1.0) -> nx.DiGraph:
    """A copy of a single-kind graph with a synthetic second resource kind.

    Kind ``kind`` runs every layer's forward pass ``slowdown`` times slower than ``base`` and
    its backward pass in ``bwd_ratio`` times its own forward time (a CPU-like kind whose
    forward/backward ratio differs from the GPU's, so the split pays). Synthetic, for
    experiments on real single-kind profiles (e.g. PipeDream's).
    """
    g = graph.copy()
    for _, attrs in g.nodes(data=True):
        f = attrs["fwd"][base]
        b = attrs["bwd"][base]
        fk = (f if f > 0 else 0.5 * b) * slowdown
        attrs["fwd"] = {**attrs["fwd"], kind: fk if f > 0 else 0.0}
        attrs["bwd"] = {**attrs["bwd"], kind: fk * bwd_ratio if b > 0 else 0.0}
    return g


def soc_devices(count: int, *, seed: int = 0, memory: float = math.inf, heterogeneous: bool = True,
                prefix: str = "soc") -> tuple:
    """``count`` SoC-like devices with CPU, GPU and NPU units.

    Heterogeneous devices draw from four synthetic profiles (phone-, tablet-, board- and
    laptop-class units); homogeneous ones are all ``{"cpu": 2, "gpu": 2, "npu": 1}``.
    """
    profiles = [{"cpu": 2, "gpu": 1, "npu": 1}, {"cpu": 4, "gpu": 2}, {"cpu": 1, "gpu": 4, "npu": 2},
                {"cpu": 8, "gpu": 1}, {"gpu": 3, "npu": 3}]
    rng = random.Random(seed)
    out = []
    for i in range(count):
        res = dict(rng.choice(profiles)) if heterogeneous else {"cpu": 2, "gpu": 2, "npu": 1}
        out.append(Device(f"{prefix}{i}", res, memory))
    return tuple(out)


def soc_instance(layers: int, devices: int, *, seed: int = 0, heterogeneous: bool = True,
                 bandwidth: float = 1e9, memory: float = math.inf) -> Instance:
    """:func:`random_chain` on :func:`soc_devices` (synthetic; see the module docstring)."""
    return Instance(random_chain(layers, seed=seed),
                    Cluster(soc_devices(devices, seed=seed + 1, memory=memory, heterogeneous=heterogeneous), bandwidth),
                    name=f"soc-chain{layers}-d{devices}-s{seed}")
