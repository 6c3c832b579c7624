"""Plans: stages in pipeline order, each with its layers, its worker and its resource split."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

from .errors import InvalidPlanError

RECOMPUTE_MODES = ("full", "selective")
"""A layer's activation recomputation modes (:class:`Stage` ``recompute``): ``"full"`` keeps
its input only, ``"selective"`` what its profile says selective recomputation keeps."""


def _names(value, what: str) -> tuple:
    """``value`` as a tuple of names; a string or a non-iterable is refused (``"abc"`` is not
    three layers)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InvalidPlanError(f"{what} must be a list of names, got {type(value).__name__} {value!r:.60}")
    return tuple(value)


def _json_keys(recompute, layers):
    """``recompute`` read from JSON, whose object keys are strings: a key naming a layer of the
    stage by its ``str`` (an integer layer name) becomes that layer's name again."""
    if not isinstance(recompute, dict) or isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        return recompute
    try:
        names = set(layers)
        by_str = {str(x): x for x in layers}
    except TypeError:  # unhashable names: Stage refuses them
        return recompute
    return {(k if k in names else by_str.get(k, k)): v for k, v in recompute.items()}


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
    recompute
        ``dict[layer, mode]``: the stage's layers whose activations are recomputed (activation
        checkpointing), ``mode`` one of :data:`RECOMPUTE_MODES`: ``"full"`` keeps only the
        layer's input and reruns its forward before its backward, ``"selective"`` keeps what the
        profile measured as kept under selective recomputation and reruns the rest
        (:func:`pipeopt.cost.rules.recompute_terms`). ``None`` or ``{}``: nothing recomputed
        (stored as ``None``).

    Raises
    ------
    InvalidPlanError
        If ``layers``, ``devices`` or ``bwd_layers`` is not a list of names, ``replicas`` is
        not a positive integer, ``beta`` is not a dict of numbers, or ``recompute`` is not a
        dict of layer names to :data:`RECOMPUTE_MODES`. (Whether the names
        exist and the shares lie in [0, 1] is checked against an instance by
        :func:`pipeopt.cost.check_plan`; a plan read by :meth:`Plan.from_dict` has its
        shares checked as it is read.)
    """

    layers: tuple
    devices: tuple = ()
    replicas: int = 1
    beta: dict | None = None
    bwd_layers: tuple | None = None
    recompute: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", _names(self.layers, "a stage's layers"))
        object.__setattr__(self, "devices", _names(self.devices, "a stage's devices"))
        if self.bwd_layers is not None:
            object.__setattr__(self, "bwd_layers", _names(self.bwd_layers, "a stage's bwd_layers"))
        r = self.replicas
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 1:
            raise InvalidPlanError(f"a stage's replicas must be a positive integer, got {r!r}")
        if self.beta is not None and (
            not isinstance(self.beta, dict)
            or not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in self.beta.values())
        ):
            raise InvalidPlanError(f"a stage's beta must be a dict kind -> forward share, got {self.beta!r:.60}")
        rc = self.recompute
        if rc is not None:
            if not isinstance(rc, dict):
                raise InvalidPlanError(
                    f"a stage's recompute must be a dict layer -> mode {RECOMPUTE_MODES}, got {type(rc).__name__} {rc!r:.60}"
                )
            bad = {k: v for k, v in rc.items() if v not in RECOMPUTE_MODES}
            if bad:
                raise InvalidPlanError(f"recompute mode(s) {bad!r:.80} not among {RECOMPUTE_MODES}")
            object.__setattr__(self, "recompute", dict(rc) or None)

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
        if self.recompute:
            d["recompute"] = dict(self.recompute)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Stage:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        InvalidPlanError
            If ``d`` is not a dict, lacks ``layers``, has an unknown field, a field of the
            wrong type (the message names it), or a forward share (``beta``) outside [0, 1]
            -- checked here, as the plan is read, because a schedule that runs forward and
            backward one after the other drops the shares before scoring the plan
            (``pipeopt simulate --plan``).
        """
        if not isinstance(d, dict):
            raise InvalidPlanError(f"a plan stage must be a JSON object with 'layers', got {type(d).__name__} {d!r:.60}")
        if "layers" not in d:
            raise InvalidPlanError(f"a plan stage has no 'layers' field: {d!r:.80}")
        unknown = sorted(set(d) - {"layers", "devices", "replicas", "beta", "bwd_layers", "recompute"})
        if unknown:
            raise InvalidPlanError(f"a plan stage has unknown field(s) {unknown}")
        stage = cls(
            layers=d["layers"],
            devices=d.get("devices", ()),
            replicas=d.get("replicas", 1),
            beta=d.get("beta"),
            bwd_layers=d.get("bwd_layers"),
            recompute=_json_keys(d.get("recompute"), d["layers"]),
        )
        for kind, share in (stage.beta or {}).items():
            if not 0.0 <= share <= 1.0:  # NaN too
                raise InvalidPlanError(f"forward share (beta) of {kind!r} is {share!r}, outside [0, 1]")
        return stage


@dataclass(frozen=True)
class Plan:
    """Stages in pipeline order. Score it with :func:`pipeopt.evaluate`.

    Parameters
    ----------
    stages
        ``tuple[Stage, ...]``, first stage first.
    schedule
        ``dict`` or ``None``: the per-rank order of actions the stages run (a free or fixed
        order of the schedule problem), in the JSON form of
        :meth:`pipeopt.schedules.Schedule.to_dict` (read it back with
        :meth:`~pipeopt.schedules.Schedule.from_dict`, which checks it); ``None``: the plan's
        schedule is chosen where it is run or scored.
    """

    stages: tuple = field(default_factory=tuple)
    schedule: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", _names(self.stages, "a plan's stages"))
        if self.schedule is not None and not isinstance(self.schedule, dict):
            raise InvalidPlanError(f"a plan's schedule must be a dict (Schedule.to_dict()), got {type(self.schedule).__name__}")
        for st in self.stages:
            if not isinstance(st, Stage):
                raise InvalidPlanError(f"a plan's stages must be Stage objects, got {type(st).__name__} {st!r:.60}")

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
        """JSON-ready dict ``{"stages": [...]}`` (and ``"schedule"`` when the plan has one)."""
        d: dict = {"stages": [s.to_dict() for s in self.stages]}
        if self.schedule is not None:
            d["schedule"] = self.schedule
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """Inverse of :meth:`to_dict`.

        Raises
        ------
        InvalidPlanError
            If ``d`` is not a dict with a ``stages`` list, or a stage is malformed
            (:meth:`Stage.from_dict`; the message names the stage).
        """
        if not isinstance(d, dict) or not isinstance(d.get("stages"), list):
            raise InvalidPlanError(
                f"a plan must be a JSON object with a 'stages' list, got {type(d).__name__} {d!r:.60}"
            )
        stages = []
        for i, s in enumerate(d["stages"]):
            try:
                stages.append(Stage.from_dict(s))
            except InvalidPlanError as exc:
                raise InvalidPlanError(f"stage {i}: {exc}") from None
        unknown = sorted(set(d) - {"stages", "schedule"})
        if unknown:
            raise InvalidPlanError(f"a plan has unknown field(s) {unknown}")
        schedule = d.get("schedule")
        if schedule is not None and not isinstance(schedule, dict):
            raise InvalidPlanError(f"a plan's 'schedule' must be a JSON object, got {type(schedule).__name__}")
        return cls(tuple(stages), schedule)
