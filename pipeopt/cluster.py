"""Devices, resource kinds and the network between workers."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from .errors import InvalidClusterError
from .units import MAX_BYTES, MAX_DEVICES, as_bandwidth, as_latency, as_size


@dataclass(frozen=True)
class Device:
    """One device (a GPU, a CPU socket, a mobile SoC, ...).

    Parameters
    ----------
    name
        Unique name.
    resources
        ``dict[kind, float]``: amount of each resource kind, in units of that kind (a
        layer's ``fwd[kind]`` is the time on *one* unit; n units take 1/n of it).
    memory
        Bytes of memory, at most :data:`pipeopt.units.MAX_BYTES`, or a size string
        (``"40GiB"``, :func:`pipeopt.units.parse_size`); ``inf`` (default) for no limit.
    host
        The device holds the memory every transfer goes through (Tarnawski et al.'s CPU,
        whose DRAM the accelerators read and write): under the ``max_load`` objective a stage
        on it pays no transfer time (:func:`pipeopt.cost.rules.stage_transfers`). Default
        ``False``.

    Raises
    ------
    InvalidClusterError
        If the name is not a string, ``resources`` is not a dict of non-negative finite
        amounts with at least one positive, or the memory is not a positive size.
    """

    name: str
    resources: dict = field(default_factory=dict)
    memory: float = math.inf
    host: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.host, bool):
            raise InvalidClusterError(f"device {self.name!r}: host must be True or False, got {self.host!r}")
        if not isinstance(self.name, str) or not self.name:
            raise InvalidClusterError(f"a device name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.resources, dict):
            raise InvalidClusterError(
                f"device {self.name!r}: resources must be a dict kind -> units, got {type(self.resources).__name__}"
            )
        for kind, v in self.resources.items():
            if (isinstance(v, bool) or not isinstance(v, numbers.Real) or math.isnan(v) or v < 0
                    or math.isinf(v)):
                raise InvalidClusterError(f"device {self.name!r} has an invalid amount {v!r} of {kind!r}")
        if not self.resources or all(v == 0 for v in self.resources.values()):
            raise InvalidClusterError(f"device {self.name!r} has no resources")
        try:
            memory = as_size(self.memory, unlimited=True)
        except InvalidClusterError as exc:
            raise InvalidClusterError(f"device {self.name!r} has an invalid memory {self.memory!r}: {exc}") from None
        if math.isfinite(memory) and memory > MAX_BYTES:
            raise InvalidClusterError(
                f"device {self.name!r} has memory {self.memory!r}, above the maximum {MAX_BYTES:g} bytes"
                " (use inf for no limit)"
            )
        object.__setattr__(self, "memory", memory)


@dataclass(frozen=True)
class Cluster:
    """Devices and the network between workers: a bandwidth and a per-message latency.

    Parameters
    ----------
    devices
        ``tuple[Device, ...]``, names unique.
    bandwidth
        Bytes per second on the link between two consecutive workers (one number for
        every link), > 0 and finite; or a string with a unit (``"100Gbps"``, ``"12.5GB/s"``,
        :func:`pipeopt.units.parse_bandwidth`).
    latency
        Seconds every message takes on top of its bytes / bandwidth (alpha of the alpha-beta
        communication model: a transfer of n > 0 bytes takes ``latency + n / bandwidth``, a
        transfer of 0 bytes is no message, :func:`pipeopt.cost.rules.transfer_time`); finite
        and >= 0, or a string with a unit (``"0.3ms"``, :func:`pipeopt.units.parse_latency`).
        Default 0: bandwidth only, as the papers' profiles assume.
    collective_bandwidth
        Bytes per second of the collectives' ring steps, as nccl-tests report a collective's
        *bus bandwidth*: a ring all-reduce of n bytes over k workers takes
        ``2 (k - 1) / k * n / collective_bandwidth`` plus ``2 (k - 1)`` latencies
        (:func:`pipeopt.cost.rules.allreduce_time`; tied gradients, replicas, ZeRO). Default
        ``None``: the link's ``bandwidth`` (every worker sends and receives at once, on a full-duplex
        link). On two local gloo processes an all-reduce of 154 MB ran at 0.42 of the
        ping-pong's one-way rate (:func:`pipeopt.torch.network.measure_link` measures both).
        Read it as :attr:`bus_bandwidth`.

    Raises
    ------
    InvalidClusterError
        If there is no device, more than :data:`pipeopt.units.MAX_DEVICES`, an entry is not
        a :class:`Device`, two devices share a name, or a bandwidth or the latency is invalid.
    """

    devices: tuple
    bandwidth: float = 1.25e10
    latency: float = 0.0
    collective_bandwidth: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.devices, (str, bytes, dict)) or not hasattr(self.devices, "__iter__"):
            raise InvalidClusterError(f"devices must be a sequence of Device, got {type(self.devices).__name__}")
        object.__setattr__(self, "devices", tuple(self.devices))
        if not self.devices:
            raise InvalidClusterError("cluster has no devices")
        if len(self.devices) > MAX_DEVICES:
            raise InvalidClusterError(f"cluster has {len(self.devices)} devices, more than the maximum {MAX_DEVICES}")
        for d in self.devices:
            if not isinstance(d, Device):
                raise InvalidClusterError(f"devices must be Device objects, got {type(d).__name__} {d!r:.60}")
        names = [d.name for d in self.devices]
        seen: set = set()
        dup = {n for n in names if n in seen or seen.add(n)}
        if dup:
            raise InvalidClusterError(f"duplicate device names: {sorted(dup)}")
        object.__setattr__(self, "bandwidth", as_bandwidth(self.bandwidth))
        object.__setattr__(self, "latency", as_latency(self.latency))
        if self.collective_bandwidth is not None:
            object.__setattr__(self, "collective_bandwidth", as_bandwidth(self.collective_bandwidth))

    @property
    def bus_bandwidth(self) -> float:
        """Bytes/s every collective rule reads: :attr:`collective_bandwidth`, else :attr:`bandwidth`."""
        return self.bandwidth if self.collective_bandwidth is None else self.collective_bandwidth

    @classmethod
    def homogeneous(
        cls,
        n: int,
        *,
        kind: str = "gpu",
        units: float = 1.0,
        memory: float = math.inf,
        bandwidth: float = 1.25e10,
        prefix: str = "gpu",
        latency: float = 0.0,
    ) -> Cluster:
        """``n`` identical single-kind devices named ``{prefix}0 .. {prefix}{n-1}``.

        ``memory``, ``bandwidth`` and ``latency`` take numbers (bytes, bytes/s, seconds) or unit
        strings (``"40GiB"``, ``"100Gbps"``, ``"0.3ms"``).

        Raises
        ------
        InvalidClusterError
            If ``n`` is not an integer in 1 .. :data:`pipeopt.units.MAX_DEVICES` (checked
            before any device is built), or a device or the bandwidth is invalid.
        """
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= MAX_DEVICES:
            raise InvalidClusterError(f"a cluster needs an integer number of devices in 1..{MAX_DEVICES}, got {n!r}")
        n = int(n)
        return cls(
            tuple(Device(f"{prefix}{i}", {kind: units}, memory) for i in range(n)),
            bandwidth,
            latency,
        )

    @property
    def kinds(self) -> tuple:
        """Sorted resource kinds present on any device."""
        return tuple(sorted({k for d in self.devices for k in d.resources}))

    def device(self, name: str) -> Device:
        """The device called ``name``.

        Raises
        ------
        InvalidClusterError
            If no device has that name (the message lists a few names).
        """
        for d in self.devices:
            if d.name == name:
                return d
        names = [d.name for d in self.devices]
        raise InvalidClusterError(
            f"no device named {name!r} in the cluster (devices: {names[:8]}{' ...' if len(names) > 8 else ''})"
        )

    def with_overrides(self, *, bandwidth=None, memory=None, latency=None, collective_bandwidth=None) -> Cluster:
        """A copy with the bandwidth, the latency, the collective bandwidth and/or every
        device's memory replaced (``None``: kept).

        Parameters
        ----------
        bandwidth
            Bytes/s, or a string with a unit (``"100Gbps"``). A new link bandwidth without a
            ``collective_bandwidth`` also drops the collective one (the collectives then run at
            the new link's rate: a figure measured on the old link would not hold).
        collective_bandwidth
            Bytes/s of the collectives (:attr:`collective_bandwidth`).
        latency
            Seconds per message, or a string with a unit (``"0.3ms"``).
        memory
            Bytes per device, or a size string (``"16GiB"``).

        Raises
        ------
        InvalidClusterError
            If a value is invalid.
        """
        devices = self.devices
        if memory is not None:
            devices = tuple(dataclasses.replace(d, memory=memory) for d in devices)
        if collective_bandwidth is None:
            collective_bandwidth = self.collective_bandwidth if bandwidth is None else None
        return Cluster(devices, self.bandwidth if bandwidth is None else bandwidth,
                       self.latency if latency is None else latency, collective_bandwidth)

    @property
    def is_homogeneous(self) -> bool:
        """True if every device has the same resources and memory."""
        first = self.devices[0]
        return all(d.resources == first.resources and d.memory == first.memory and d.host == first.host
                   for d in self.devices)
