"""Plans: stages in pipeline order, each with its layers, its worker and its resource split."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    """One pipeline stage.

    Parameters
    ----------
    layers
        Layer names whose **forward** pass this stage runs (``tuple``).
    devices
        Names of the devices of the stage's worker(s). With ``replicas = m`` the devices are
        shared evenly by m identical data-parallel workers.
    replicas
        m >= 1, data-parallel copies of the stage (PipeDream's replication).
    beta
        ``dict[kind, float]`` forward share of each resource kind (split execution, Duan &
        Wu); ``None`` runs forward and backward one after the other on all resources.
    bwd_layers
        Layers whose **backward** pass this stage runs (Bi-Partition); ``None`` = ``layers``.
    """

    layers: tuple
    devices: tuple = ()
    replicas: int = 1
    beta: dict | None = None
    bwd_layers: tuple | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.bwd_layers is not None:
            object.__setattr__(self, "bwd_layers", tuple(self.bwd_layers))

    @property
    def backward_layers(self) -> tuple:
        """Layers whose backward pass runs here."""
        return self.layers if self.bwd_layers is None else self.bwd_layers

    def to_dict(self) -> dict:
        """JSON-ready dict."""
        d: dict = {"layers": list(self.layers), "devices": list(self.devices), "replicas": self.replicas}
        if self.beta is not None:
            d["beta"] = dict(self.beta)
        if self.bwd_layers is not None:
            d["bwd_layers"] = list(self.bwd_layers)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Stage:
        """Inverse of :meth:`to_dict`."""
        return cls(
            layers=tuple(d["layers"]),
            devices=tuple(d.get("devices", ())),
            replicas=int(d.get("replicas", 1)),
            beta=dict(d["beta"]) if d.get("beta") is not None else None,
            bwd_layers=tuple(d["bwd_layers"]) if d.get("bwd_layers") is not None else None,
        )


@dataclass(frozen=True)
class Plan:
    """Stages in pipeline order. Score it with :func:`pipeopt.evaluate`.

    Parameters
    ----------
    stages
        ``tuple[Stage, ...]``, first stage first.
    """

    stages: tuple = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))

    @property
    def num_stages(self) -> int:
        """S."""
        return len(self.stages)

    @property
    def num_devices(self) -> int:
        """Devices used by all stages."""
        return sum(len(s.devices) for s in self.stages)

    def layer_lists(self) -> list[list]:
        """Forward layer names per stage."""
        return [list(s.layers) for s in self.stages]

    def to_dict(self) -> dict:
        """JSON-ready dict ``{"stages": [...]}``."""
        return {"stages": [s.to_dict() for s in self.stages]}

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """Inverse of :meth:`to_dict`."""
        return cls(tuple(Stage.from_dict(s) for s in d["stages"]))
