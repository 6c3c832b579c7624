"""Small synthetic multi-resource instances for tests, examples and benchmarks.

Until the model zoo ships multi-resource devices, these build layer chains whose per-kind
forward and backward times have *different* forward/backward ratios per kind (the case where
the split pays), and clusters of mobile-SoC-like devices (CPU, GPU, NPU). The numbers are
synthetic, not measurements; they are documented where used.

It also measures how much Duan & Wu's split execution gains on the model zoo's Jetson AGX Orin
workers (CPU + GPU + DLA) and how that gain depends on the one assumption behind it, the NPU's
backward efficiency (:func:`split_gain`, :func:`split_gain_sensitivity`,
:func:`split_gain_report`; ``python -m pipeopt.problems.resource.examples`` prints the report).
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


# ---- the split-execution gain and its sensitivity to the NPU's backward efficiency -----------

SENSITIVITY_EFFICIENCIES = (0.08, 0.16, 0.40)
"""NPU backward efficiencies of :func:`split_gain_sensitivity`: the zoo's assumption (0.08),
twice it, and the NPU's forward efficiency (0.40, no backward penalty)."""


def npu_efficiency() -> tuple[float, float]:
    """The zoo's assumed NPU (forward, backward) efficiency (:data:`pipeopt.zoo.KINDS`)."""
    from ...zoo import KINDS

    k = KINDS["npu"]
    return k.forward_efficiency, k.backward_efficiency


def split_gain(model: str = "alexnet", *, npu_backward: float | None = None, device: str = "jetson-agx-orin",
               stages: int = 1, bandwidth: str | float = "pcie4") -> dict:
    """Time per microbatch without and with split execution, and their ratio (the gain).

    The zoo's ``model`` on ``stages`` identical ``device`` workers (a joint problem), with
    the NPU's backward efficiency set to ``npu_backward`` (default: the zoo's assumption,
    :func:`npu_efficiency`) and every other efficiency the zoo's. ``sequential`` is the best
    plan without the split, ``split`` the best with each stage's optimal forward share (the
    allocation LP), both found by the min-max chain DP
    (:func:`pipeopt.problems.resource.problem.minmax_chain_dp`; with ``stages=1`` there is
    one plan) and scored by :func:`pipeopt.evaluate` (``.objective``). With ``stages=1``
    (the default) the gain is the device's own: compute only, no transfer, no window row,
    the case of the 1.31x claim. With more stages the DP balances stage times without the
    1F1B window rows, so its plans need not be the optima of the objective and the gain is
    indicative only.

    Returns
    -------
    dict
        ``model``, ``stages``, ``npu_backward``, ``sequential`` and ``split`` (seconds per
        microbatch) and ``gain`` = sequential / split.
    """
    from ... import zoo
    from ...cost import evaluate
    from .problem import JointProblem, minmax_chain_dp

    fwd, bwd = npu_efficiency()
    eff = bwd if npu_backward is None else float(npu_backward)
    inst = zoo.instance(model, device, max(stages, 1), bandwidth=bandwidth, efficiency={"npu": (fwd, eff)})
    p = JointProblem(inst, stages)
    out = {"model": model, "stages": stages, "npu_backward": eff}
    for mode in ("sequential", "split"):
        starts, _ = minmax_chain_dp(p, p.groups, mode)
        out[mode] = evaluate(inst, p.plan(starts, p.groups, mode)).objective
    out["gain"] = out["sequential"] / out["split"]
    return out


def split_gain_sensitivity(models=("alexnet", "googlenet"), efficiencies=SENSITIVITY_EFFICIENCIES, *,
                           stages: int = 1, **kw) -> list[dict]:
    """:func:`split_gain` for every model and NPU backward efficiency (rows, in that order)."""
    return [split_gain(m, npu_backward=e, stages=stages, **kw) for m in models for e in efficiencies]


def split_gain_report(models=("alexnet", "googlenet"), efficiencies=SENSITIVITY_EFFICIENCIES, *,
                      stages: int = 1, **kw) -> str:
    """The split-execution gain beside the assumption it rests on, as text.

    One line states the assumed NPU efficiency and the gain it gives (the 1.31x of Duan &
    Wu's claim as reproduced on Jetson AGX Orin workers); one line per model gives the gain at
    every efficiency of ``efficiencies`` (measured now, with the current cost model).
    """
    fwd, bwd = npu_efficiency()
    rows = split_gain_sensitivity(models, efficiencies, stages=stages, **kw)
    at_assumed = [r for r in rows if math.isclose(r["npu_backward"], bwd)]
    lines = [f"assumed NPU efficiency: forward {fwd:g}, backward {bwd:g} (pipeopt.zoo.KINDS['npu'])"]
    if at_assumed:
        gains = sorted(r["gain"] for r in at_assumed)
        span = f"{gains[0]:.3f}x" if round(gains[0], 3) == round(gains[-1], 3) else f"{gains[0]:.3f}-{gains[-1]:.3f}x"
        where = "one worker: compute only" if stages == 1 else f"S = {stages}, min-max DP plans"
        lines.append(f"split-execution gain at backward efficiency {bwd:g}: {span} ({where})")
    lines.append("sensitivity of the gain to the NPU backward efficiency:")
    for m in models:
        cells = ", ".join(f"{r['gain']:.3f}x at {r['npu_backward']:g}" for r in rows if r["model"] == m)
        lines.append(f"  {m}: {cells}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - a report, run by hand
    print(split_gain_report())

