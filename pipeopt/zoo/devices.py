"""Device catalogue: real devices with their peak rates per resource kind, and the network links.

Units (the data-model convention of docs/cost-model.md)
----------------------------------------------
A layer's ``fwd[k]`` / ``bwd[k]`` is its time in seconds on **one unit** of kind ``k``, and a
device holds ``resources[k]`` units of kind ``k``. The zoo fixes one **reference unit** for
every kind: *1 unit = 1 TFLOP/s of peak arithmetic rate at the instance's precision*. A device
with a peak of P TFLOP/s on kind k therefore holds P units of k, and a layer of ``x`` forward
FLOP takes

    fwd[k] = x / (1e12 * forward_efficiency[k])   seconds on one unit,

so ``x / (P * 1e12 * forward_efficiency[k])`` seconds on the device (and likewise backward,
with 2x the FLOP and ``backward_efficiency[k]``). The efficiency is *achieved / peak* over a
whole training step; it belongs to the kind (the zoo's layer times are shared by every device
of a cluster), not to the device.

Kinds and their efficiencies (:data:`KINDS`)
---------------------------------------------
``gpu``  forward 0.40, backward 0.40 (F/B time ratio 0.50). Large-model training reaches 40-52 %
         of the A100's tensor-core peak (Megatron-LM: 163 of 312 TFLOP/s per GPU, Narayanan et
         al. SC 2021; PaLM: 46 % model FLOP utilisation, Chowdhery et al. 2022); CNN layers sit
         lower. 0.40 is the round middle; there is no kind-specific penalty for backward.
``cpu``  forward 0.35, backward 0.25 (F/B ratio 0.36). Vectorised convolution/GEMM libraries
         (oneDNN) reach 50-70 % of AVX peak on large GEMMs, less on whole networks; the
         backward pass (transposed GEMMs, weight-gradient reductions across threads) is more
         memory bound. An assumption, documented here; change it with ``efficiency=``.
``npu``  forward 0.40, backward 0.08 (F/B ratio 0.10). NPUs / DLAs (Apple Neural Engine,
         Qualcomm Hexagon, NVIDIA DLA) are inference engines: fixed dataflow for forward
         convolutions and GEMMs, no native support for the transposed and reduction patterns of
         the backward pass. This asymmetry is Duan & Wu's (ICPADS 2022) premise for splitting
         each kind between the forward and the backward pass; the factor 5 is an assumption.

Peak rates
----------
Each device lists its peak per kind and precision (``"fp32"``, ``"fp16"``) in TFLOP/s. Where
a vendor publishes only INT8 TOPS (NPUs, DLAs, tensor cores), the FP16 rate is taken as half
the dense INT8 rate (dense = half the "sparse" figure); CPU peaks are derived as cores x clock
x FLOP per cycle (vector width x FMA units x 2) from the vendor's core count and clock; CPUs
run FP16 training at their FP32 rate. Every entry records its source and which numbers are
derived. A kind a device lacks at a precision (an NPU at fp32) is left out of its resources.

Memory is the device's memory in bytes (10^9 bytes per GB as the vendors count); an SoC's
memory is shared by its kinds. A CPU+GPU server's memory is its GPU memory (the model lives
there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import InvalidClusterError, InvalidProblemError

GB = 1e9
"""Bytes per GB (decimal, as vendors count)."""

REFERENCE_FLOPS = 1e12
"""FLOP/s of peak of one reference unit of every kind: 1 TFLOP/s."""


@dataclass(frozen=True)
class Kind:
    """A resource kind and how much of its peak a training step achieves.

    Attributes
    ----------
    name
        ``"cpu"``, ``"gpu"`` or ``"npu"``.
    forward_efficiency, backward_efficiency
        Achieved / peak FLOP/s in the forward and the backward pass, in (0, 1].
    note
        Where the numbers come from.
    """

    name: str
    forward_efficiency: float
    backward_efficiency: float
    note: str = ""

    def __post_init__(self) -> None:
        for v in (self.forward_efficiency, self.backward_efficiency):
            if not isinstance(v, (int, float)) or not (0 < v <= 1):
                raise InvalidProblemError(f"kind {self.name!r}: efficiency {v!r} must be in (0, 1]")

    @property
    def fb_ratio(self) -> float:
        """Forward time / backward time of any layer on this kind (backward = 2x FLOP)."""
        return self.backward_efficiency / (2.0 * self.forward_efficiency)


KINDS: dict[str, Kind] = {
    "gpu": Kind(
        "gpu",
        0.40,
        0.40,
        "Megatron-LM 52 % (Narayanan et al. 2021), PaLM 46 % MFU (Chowdhery et al. 2022); 0.40 for whole networks",
    ),
    "cpu": Kind("cpu", 0.35, 0.25, "assumption: oneDNN GEMM/conv efficiency, backward more memory bound"),
    "npu": Kind(
        "npu", 0.40, 0.08, "assumption: inference-oriented NPU/DLA, poor at backward (Duan & Wu 2022 premise)"
    ),
}
"""The resource kinds of the catalogue with their efficiencies (module docstring)."""


@dataclass(frozen=True)
class DeviceSpec:
    """A catalogue device.

    Attributes
    ----------
    name
        Catalogue key (``"a100-40gb"``).
    title
        Full product name.
    peak
        ``dict[kind, dict[precision, TFLOP/s]]``: peak rates (dense).
    memory
        Bytes.
    source
        Citation of the numbers; ``derived`` says which were computed and how.
    derived
        What was computed rather than read off the source.
    """

    name: str
    title: str
    peak: dict
    memory: float
    source: str
    derived: str = ""
    kinds: tuple = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", tuple(sorted(self.peak)))

    def resources(self, precision: str = "fp16") -> dict:
        """``dict[kind, units]`` at ``precision`` (1 unit = 1 TFLOP/s peak); kinds without a
        rate at that precision are left out.

        Raises
        ------
        InvalidProblemError
            If the precision is unknown.
        InvalidClusterError
            If the device has no kind at that precision.
        """
        if precision not in PRECISIONS:
            raise InvalidProblemError(f"unknown precision {precision!r}; choose from {sorted(PRECISIONS)}")
        res = {k: float(r[precision]) for k, r in sorted(self.peak.items()) if precision in r}
        if not res:
            raise InvalidClusterError(f"device {self.name!r} has no resource kind at {precision}")
        return res

    def rate(self, kind: str, precision: str = "fp16", direction: str = "fwd") -> float:
        """Effective FLOP/s of the device's ``kind`` in the forward (``"fwd"``) or backward
        (``"bwd"``) pass: peak x the kind's efficiency (0 if the kind is absent)."""
        peak = self.peak.get(kind, {}).get(precision, 0.0) * REFERENCE_FLOPS
        k = KINDS[kind]
        return peak * (k.forward_efficiency if direction == "fwd" else k.backward_efficiency)


PRECISIONS = {"fp32": 4, "fp16": 2}
"""Bytes per element of activations and parameters at each precision."""


def _cpu(cores: int, ghz: float, flop_per_cycle: int) -> float:
    """Peak TFLOP/s of a CPU: cores x clock x FLOP per cycle per core."""
    return round(cores * ghz * flop_per_cycle / 1000.0, 6)


_EPYC_7763 = _cpu(64, 2.45, 32)  # Zen 3: 2 x 256-bit FMA = 16 fp32 FMA = 32 FLOP/cycle
_XEON_8380 = _cpu(40, 2.3, 64)  # Ice Lake SP: 2 x 512-bit FMA = 32 fp32 FMA = 64 FLOP/cycle
_A78AE_12 = _cpu(12, 2.2, 16)  # Cortex-A78AE: 2 x 128-bit NEON FMA = 16 FLOP/cycle
_M2_CPU = _cpu(4, 3.49, 32) + _cpu(4, 2.42, 16)  # Avalanche 4 x 128-bit FMA; Blizzard 2 x 128-bit
_M1_CPU = _cpu(4, 3.2, 32) + _cpu(4, 2.06, 16)  # Firestorm 4 x 128-bit FMA; Icestorm 2 x 128-bit
_ORYON_12 = _cpu(12, 3.8, 32)  # Oryon: 4 x 128-bit FMA = 32 FLOP/cycle, 3.8 GHz all-core

_DEVICES = [
    DeviceSpec(
        "v100-32gb",
        "NVIDIA Tesla V100 SXM2 32GB",
        {"gpu": {"fp32": 15.7, "fp16": 125.0}},
        32 * GB,
        "NVIDIA V100 Tensor Core GPU datasheet (2020): FP32 15.7 TFLOPS, tensor 125 TFLOPS (SXM2)",
    ),
    DeviceSpec(
        "v100-16gb",
        "NVIDIA Tesla V100 SXM2 16GB",
        {"gpu": {"fp32": 15.7, "fp16": 125.0}},
        16 * GB,
        "NVIDIA V100 Tensor Core GPU datasheet (2020): FP32 15.7 TFLOPS, tensor 125 TFLOPS (SXM2)",
    ),
    DeviceSpec(
        "a100-40gb",
        "NVIDIA A100 SXM4 40GB",
        {"gpu": {"fp32": 19.5, "fp16": 312.0}},
        40 * GB,
        "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, FP16 tensor 312 TFLOPS (dense)",
    ),
    DeviceSpec(
        "a100-80gb",
        "NVIDIA A100 SXM4 80GB",
        {"gpu": {"fp32": 19.5, "fp16": 312.0}},
        80 * GB,
        "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, FP16 tensor 312 TFLOPS (dense)",
    ),
    DeviceSpec(
        "h100-80gb",
        "NVIDIA H100 SXM5 80GB",
        {"gpu": {"fp32": 67.0, "fp16": 989.4}},
        80 * GB,
        "NVIDIA H100 Tensor Core GPU datasheet (2023): FP32 67 TFLOPS, FP16 tensor 1,979 TFLOPS with sparsity",
        "fp16 dense = half the sparse figure",
    ),
    DeviceSpec(
        "t4",
        "NVIDIA T4 16GB",
        {"gpu": {"fp32": 8.1, "fp16": 65.0}},
        16 * GB,
        "NVIDIA T4 Tensor Core GPU datasheet (2019): FP32 8.1 TFLOPS, mixed precision 65 TFLOPS",
    ),
    DeviceSpec(
        "epyc-7763",
        "AMD EPYC 7763 (64 cores, 2.45 GHz), 256 GB",
        {"cpu": {"fp32": _EPYC_7763, "fp16": _EPYC_7763}},
        256 * GB,
        "AMD EPYC 7763 product page: 64 cores, 2.45 GHz base; Zen 3 core: two 256-bit FMA pipes",
        "peak = 64 cores x 2.45 GHz x 32 FLOP/cycle; fp16 runs at the fp32 rate",
    ),
    DeviceSpec(
        "server-a100-epyc",
        "server slice: 1 x A100 SXM4 40GB + 1 x AMD EPYC 7763",
        {"gpu": {"fp32": 19.5, "fp16": 312.0}, "cpu": {"fp32": _EPYC_7763, "fp16": _EPYC_7763}},
        40 * GB,
        "NVIDIA A100 datasheet (2021); AMD EPYC 7763 product page (64 cores, 2.45 GHz)",
        "CPU peak = 64 x 2.45 GHz x 32 FLOP/cycle; memory = the GPU's 40 GB",
    ),
    DeviceSpec(
        "server-t4-xeon",
        "server slice: 1 x T4 16GB + 1 x Intel Xeon Platinum 8380",
        {"gpu": {"fp32": 8.1, "fp16": 65.0}, "cpu": {"fp32": _XEON_8380, "fp16": _XEON_8380}},
        16 * GB,
        "NVIDIA T4 datasheet (2019); Intel Xeon Platinum 8380 ark page (40 cores, 2.3 GHz, 2 AVX-512 FMA units)",
        "CPU peak = 40 x 2.3 GHz x 64 FLOP/cycle; memory = the GPU's 16 GB",
    ),
    DeviceSpec(
        "jetson-agx-orin",
        "NVIDIA Jetson AGX Orin 64GB (CPU + GPU + 2 DLA)",
        {
            "cpu": {"fp32": _A78AE_12, "fp16": _A78AE_12},
            "gpu": {"fp32": 5.3, "fp16": 42.5},
            "npu": {"fp16": 26.25},
        },
        64 * GB,
        "NVIDIA Jetson AGX Orin Series Technical Brief v1.2 (2022): 2048 CUDA cores = 5.3 FP32 TFLOPS, "
        "64 tensor cores = 170 sparse INT8 TOPS, 2 x NVDLA v2 = 105 sparse INT8 TOPS, 12 x Cortex-A78AE at 2.2 GHz, "
        "64 GB LPDDR5",
        "GPU fp16 = 170/2/2 (dense, half of INT8); DLA (kind npu) fp16 = 105/2/2; CPU = 12 x 2.2 GHz x 16 FLOP/cycle",
    ),
    DeviceSpec(
        "apple-m2",
        "Apple M2 (8-core CPU, 10-core GPU, 16-core Neural Engine), 24 GB",
        {
            "cpu": {"fp32": _M2_CPU, "fp16": _M2_CPU},
            "gpu": {"fp32": 3.6, "fp16": 3.6},
            "npu": {"fp16": 15.8},
        },
        24 * GB,
        "Apple newsroom, 'Apple unveils M2' (6 June 2022): GPU up to 3.6 TFLOPS, Neural Engine 15.8 TOPS, "
        "up to 24 GB unified memory",
        "CPU = 4 x 3.49 GHz x 32 + 4 x 2.42 GHz x 16 FLOP/cycle; GPU fp16 = fp32 rate; Neural Engine ops taken as fp16",
    ),
    DeviceSpec(
        "apple-m1",
        "Apple M1 (8-core CPU, 8-core GPU, 16-core Neural Engine), 16 GB",
        {
            "cpu": {"fp32": _M1_CPU, "fp16": _M1_CPU},
            "gpu": {"fp32": 2.6, "fp16": 2.6},
            "npu": {"fp16": 11.0},
        },
        16 * GB,
        "Apple newsroom, 'Apple unleashes M1' (10 Nov 2020): GPU 2.6 TFLOPS, Neural Engine 11 trillion "
        "operations per second, up to 16 GB unified memory",
        "CPU = 4 x 3.2 GHz x 32 + 4 x 2.06 GHz x 16 FLOP/cycle; GPU fp16 = fp32 rate; Neural Engine ops taken as fp16",
    ),
    DeviceSpec(
        "snapdragon-x-elite",
        "Qualcomm Snapdragon X Elite (12 Oryon cores, Adreno GPU, Hexagon NPU), 32 GB",
        {
            "cpu": {"fp32": _ORYON_12, "fp16": _ORYON_12},
            "gpu": {"fp32": 4.6, "fp16": 4.6},
            "npu": {"fp16": 22.5},
        },
        32 * GB,
        "Qualcomm Snapdragon X Elite announcement (Snapdragon Summit, Oct 2023): 12 Oryon cores up to 3.8 GHz "
        "all-core, Adreno GPU 4.6 TFLOPS, Hexagon NPU 45 TOPS (INT8)",
        "CPU = 12 x 3.8 GHz x 32 FLOP/cycle; NPU fp16 = 45/2; GPU fp16 taken at the fp32 rate",
    ),
]

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in _DEVICES}
"""The catalogue, by name."""


@dataclass(frozen=True)
class Link:
    """A network link between consecutive workers.

    Attributes
    ----------
    name
        Catalogue key.
    bandwidth
        Bytes/s in one direction.
    source
        Citation.
    """

    name: str
    bandwidth: float
    source: str


LINKS: dict[str, Link] = {
    link.name: link
    for link in [
        Link(
            "nvlink3",
            300e9,
            "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (both directions) = 300 GB/s each way; DGX A100 NVSwitch",
        ),
        Link(
            "nvlink2",
            150e9,
            "NVIDIA V100 datasheet: NVLink 300 GB/s per GPU (both directions) = 150 GB/s each way",
        ),
        Link("pcie4", 32e9, "PCI Express 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s each way"),
        Link("ib-hdr", 25e9, "InfiniBand HDR 200 Gb/s (one HDR port per GPU, as in DGX A100) = 25 GB/s"),
        Link("ib-edr", 12.5e9, "InfiniBand EDR 100 Gb/s = 12.5 GB/s"),
        Link("10gbe", 1.25e9, "10 Gigabit Ethernet (Jetson AGX Orin's on-board 10GbE) = 1.25 GB/s"),
        Link("1gbe", 0.125e9, "Gigabit Ethernet = 125 MB/s"),
    ]
}
"""Bandwidths of common links, bytes/s one way (nominal line rate)."""


def device(name: str) -> DeviceSpec:
    """The catalogue entry ``name``.

    Raises
    ------
    InvalidClusterError
        Naming the known devices if ``name`` is not one.
    """
    try:
        return DEVICES[name]
    except KeyError:
        raise InvalidClusterError(f"unknown device {name!r}; the catalogue has {sorted(DEVICES)}") from None


def link_bandwidth(link: str | float) -> float:
    """Bytes/s of a link given by catalogue name (:data:`LINKS`) or as a number.

    Raises
    ------
    InvalidClusterError
        If the name is unknown or the number is not positive and finite.
    """
    if isinstance(link, str):
        try:
            return LINKS[link].bandwidth
        except KeyError:
            raise InvalidClusterError(f"unknown link {link!r}; known: {sorted(LINKS)}") from None
    if isinstance(link, bool) or not isinstance(link, (int, float)) or not (link > 0) or math.isinf(link):
        raise InvalidClusterError(f"bandwidth must be a positive number of bytes/s, got {link!r}")
    return float(link)
