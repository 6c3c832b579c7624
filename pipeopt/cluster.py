"""Devices, resource kinds and the network between workers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import InvalidClusterError


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
        Bytes of memory; ``inf`` (default) for no limit.
    """

    name: str
    resources: dict = field(default_factory=dict)
    memory: float = math.inf

    def __post_init__(self) -> None:
        if not self.resources or all(v == 0 for v in self.resources.values()):
            raise InvalidClusterError(f"device {self.name!r} has no resources")
        for kind, v in self.resources.items():
            if not isinstance(v, (int, float)) or math.isnan(v) or v < 0 or math.isinf(v):
                raise InvalidClusterError(f"device {self.name!r} has an invalid amount {v!r} of {kind!r}")
        if not isinstance(self.memory, (int, float)) or math.isnan(self.memory) or self.memory <= 0:
            raise InvalidClusterError(f"device {self.name!r} has an invalid memory {self.memory!r} (bytes, > 0)")


@dataclass(frozen=True)
class Cluster:
    """Devices and the bandwidth between workers.

    Parameters
    ----------
    devices
        ``tuple[Device, ...]``, names unique.
    bandwidth
        Bytes per second on the link between two consecutive workers (one number for
        every link), > 0.
    """

    devices: tuple
    bandwidth: float = 1.25e10

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        if not self.devices:
            raise InvalidClusterError("cluster has no devices")
        names = [d.name for d in self.devices]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise InvalidClusterError(f"duplicate device names: {sorted(dup)}")
        b = self.bandwidth
        if not isinstance(b, (int, float)) or math.isnan(b) or b <= 0:
            raise InvalidClusterError(f"bandwidth must be > 0 bytes/s, got {b!r}")

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
    ) -> Cluster:
        """``n`` identical single-kind devices named ``{prefix}0 .. {prefix}{n-1}``."""
        if n < 1:
            raise InvalidClusterError(f"a cluster needs at least one device, got {n}")
        return cls(
            tuple(Device(f"{prefix}{i}", {kind: units}, memory) for i in range(n)),
            bandwidth,
        )

    @property
    def kinds(self) -> tuple:
        """Sorted resource kinds present on any device."""
        return tuple(sorted({k for d in self.devices for k in d.resources}))

    def device(self, name: str) -> Device:
        """The device called ``name`` (``KeyError`` if absent)."""
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    @property
    def is_homogeneous(self) -> bool:
        """True if every device has the same resources and memory."""
        first = self.devices[0]
        return all(d.resources == first.resources and d.memory == first.memory for d in self.devices)
