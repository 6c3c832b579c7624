"""``pipeopt grade``: the split a user runs today, read in its framework's own format, scored by
the one evaluation and set against the proven optimum of the same problem.

The way back of :mod:`pipeopt.export`. Four inputs, each mapped onto the instance's layers
(:class:`Layout`; any mismatch is an :class:`~pipeopt.errors.InvalidPlanError` naming it):

* :func:`from_megatron` -- a Megatron-LM ``pipeline_model_parallel_layout`` string
  (``"Et*3|t*3L"``, ``"E|(tt|)*2L"``): read by :func:`pipeopt.export.megatron.parse_str_to_list`
  and checked by :func:`pipeopt.export.megatron.parse_layout`, transcriptions of Megatron-Core's
  ``PipelineParallelLayerLayout.parse_str_to_list`` / ``validate_layer_layout``
  (``megatron/core/transformer/pipeline_parallel_layer_layout.py``). ``E`` is the instance's
  layers before its blocks, the k-th ``t`` its k-th block, ``L`` the layers after the blocks. The
  blocks are the entries of the container a ``from_torch`` graph records (``layers.0``,
  ``layers.1``, ... and, at a finer granularity, the layers inside each), or on a model-zoo
  transformer the ``layer<i>_*`` layers of block i. ``m`` (multi-token prediction) is refused:
  no instance records MTP layers.
* :func:`from_torchtitan` -- torchtitan's ``module_fqns_per_model_part`` (a list of lists of
  FQNs): each FQN is a layer of the instance or a module holding several (``layers.3`` of a
  leaf-module profile).
* :func:`from_deepspeed` -- DeepSpeed's ``parts`` (``S + 1`` boundaries; stage s is
  ``layers[parts[s]:parts[s+1]]``) over the instance's layers in execution order, the list
  :func:`pipeopt.export.deepspeed.export` writes as ``layers``.
* :func:`from_split_spec` -- torch's ``split_spec`` (``{fqn: "beginning" | "end"}``, any case, with
  or without ``SplitPoint.``), cut as ``pipeline`` cuts it
  (:func:`pipeopt.export.torch_pipelining.stages_from_split_spec`).

Layers the layout cannot name because the model has none of them (a zoo graph's ``pin_first``
input node) join the first stage, as every planner puts them. Each layout must give every
layer exactly one stage, no stage empty, and stages that are contiguous runs of the execution
order (the order of a ``from_torch`` graph's nodes).

:func:`grade` then scores the split and solves the same problem exactly:

* without a schedule, the partition problem of the instance's objective (the one evaluation,
  :func:`pipeopt.evaluate`, with stage i on the cluster's i-th device) and its default exact
  method; a split that is not contiguous in the partition problem's layer order is set against
  the convex-split method (``convex``, a larger space), so the bound still bounds it;
* with a schedule (torch's names: ``1F1B``, ``GPipe``, ``Interleaved1F1B``, ``ZBVZeroBubble``,
  ...) and m microbatches, the schedule problem (:mod:`pipeopt.problems.schedule`): the split's
  iteration time by the schedule executor and the schedule problem's exact method.

The gap is :func:`pipeopt.result.optimality_gap` of the split's time against the solve's proven
lower bound: the distance to the proven optimum when the solve proved it (status ``optimal``),
else an upper bound on that distance (status ``time_limit``: the bound the solver reached), and
:class:`Grade` says which.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidPlanError, InvalidProblemError, ReadError

__all__ = ["Grade", "Layout", "from_deepspeed", "from_megatron", "from_split_spec", "from_torchtitan", "grade",
           "read_deepspeed_parts", "read_torchtitan"]

ZOO_BLOCK = re.compile(r"(layer\d+)_")
"""A model-zoo transformer's block of a layer name (``layer3_attn`` -> ``layer3``)."""


@dataclass(frozen=True)
class Layout:
    """A user's split mapped onto an instance's layers.

    Attributes
    ----------
    stages
        ``tuple[tuple[str, ...], ...]``: the layers of each stage, in execution order.
    source
        What was read (one line: the framework and the text or file).
    notes
        ``tuple[str, ...]``: what the mapping assumed.
    """

    stages: tuple
    source: str
    notes: tuple = ()

    @property
    def num_stages(self) -> int:
        """S."""
        return len(self.stages)


# ---- the instance as the layouts see it ------------------------------------------------------
def _layout(instance):
    from .export.layout import ModelLayout

    return ModelLayout.of(None, instance.graph)


def _pinned(instance) -> list[str]:
    return [str(n) for n, pin in instance.graph.nodes(data="pin_first") if pin]


def _finish(instance, owner: dict, source: str, num_stages: int, notes=()) -> Layout:
    """The :class:`Layout` of ``owner`` (layer -> stage), after the checks every input shares."""
    order = _layout(instance).order
    notes = list(notes)
    missed = [n for n in order if n not in owner]
    pinned = [n for n in missed if n in _pinned(instance)]
    for n in pinned:
        owner[n] = 0
    if pinned:
        notes.append(f"{', '.join(pinned)} (the model's input, in no framework's list) joined stage 0")
    missed = [n for n in missed if n not in pinned]
    if missed:
        raise InvalidPlanError(f"{source}: layer(s) {missed[:4]} of {instance.name} are in no stage "
                               f"({len(missed)} missing)")
    stages = [[n for n in order if owner[n] == s] for s in range(num_stages)]
    empty = [s for s, st in enumerate(stages) if not st]
    if empty:
        raise InvalidPlanError(f"{source}: stage {empty[0]} holds no layer of {instance.name}")
    stage_of = [owner[n] for n in order]
    for k in range(1, len(order)):
        if stage_of[k] < stage_of[k - 1]:
            raise InvalidPlanError(
                f"{source}: stage {stage_of[k]} is not contiguous: {order[k]!r} (stage {stage_of[k]}) runs after "
                f"{order[k - 1]!r} (stage {stage_of[k - 1]}) in {instance.name}'s execution order")
    return Layout(tuple(tuple(st) for st in stages), source, tuple(notes))


def _covered(fqn: str, order) -> list[str]:
    """The layers that module ``fqn`` is or holds."""
    return [n for n in order if n == fqn or n.startswith(fqn + ".")]


def _blocks(instance) -> tuple[list, list, list]:
    """``(before, blocks, after)``: layers before the blocks, the blocks' layers (a list per
    block, in order), layers after them (module docstring)."""
    from .problems.partition.frameworks import block_of

    lay = _layout(instance)
    order = list(lay.order)
    if lay.container:
        keys = [block_of(n, lay.container) for n in order]
    else:
        keys = [m.group(1) if (m := ZOO_BLOCK.match(n)) else None for n in order]
    inside = [i for i, k in enumerate(keys) if k is not None]
    if not inside:
        raise InvalidPlanError(f"{instance.name} has no blocks a Megatron layout can count (neither a container "
                               "recorded by from_torch nor model-zoo layer<i>_* layers)")
    lo, hi = inside[0], inside[-1]
    stray = [order[i] for i in range(lo, hi + 1) if keys[i] is None]
    if stray:
        raise InvalidPlanError(f"{stray[0]!r} runs between two blocks of {instance.name}: the model is not "
                               "'embedding, blocks, output' as a Megatron layout describes it")
    blocks: dict = {}
    for i in range(lo, hi + 1):
        blocks.setdefault(keys[i], []).append(order[i])
    return order[:lo], list(blocks.values()), order[hi + 1:]


# ---- the four inputs ---------------------------------------------------------------------------
def from_megatron(instance, text: str) -> Layout:
    """A Megatron-LM ``pipeline_model_parallel_layout`` string on ``instance`` (module docstring).

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance` of a decoder (``from_torch`` with a container of blocks, or a
        model-zoo transformer).
    text
        The layout (``"Et*3|t*3L"``; ``|`` between stages, ``x*n`` and ``(...)*n`` repeats,
        commas cosmetic). Its stages are the pipeline's stages in order (with virtual stages:
        Megatron's order, stage k on rank ``k mod p``).

    Raises
    ------
    InvalidPlanError
        A character Megatron does not know, what Megatron's checks refuse (``E`` not first or
        not once, ``L`` not last or not once), a count of ``t`` other than the instance's blocks,
        ``m`` layers, an empty stage.
    """
    from .export.megatron import parse_layout, parse_str_to_list

    source = f"Megatron layout {text!r}"
    if not isinstance(text, str) or not text.strip():
        raise InvalidPlanError("a Megatron pipeline_model_parallel_layout must be a non-empty string")
    before, blocks, after = _blocks(instance)
    try:
        stages = parse_str_to_list(text.strip())
        if any("m" in st for st in stages):
            raise InvalidPlanError(f"{source} has multi-token-prediction layers (m); {instance.name} has none")
        parse_layout(text.strip(), len(stages), len(blocks))
    except InvalidPlanError as exc:
        message = str(exc)
        if "must match num_layers" in message:
            message += f" (the transformer blocks of {instance.name})"
        raise InvalidPlanError(f"{source} does not fit {instance.name}: {message}") from None
    if not before or not after:
        raise InvalidPlanError(f"{source}: {instance.name} has no layers {'before' if not before else 'after'} "
                               "its blocks for " + ("E" if not before else "L"))
    owner, k = {}, 0
    for s, st in enumerate(stages):
        if not st:
            raise InvalidPlanError(f"{source}: stage {s} is empty (pipeopt's plans have no empty stage)")
        for ch in st:
            names = before if ch == "E" else after if ch == "L" else blocks[k]
            k += ch == "t"
            for n in names:
                owner[n] = s
    notes = [f"E = {', '.join(before)}; t = {len(blocks)} blocks ({blocks[0][0]} .. {blocks[-1][-1]}); "
             f"L = {', '.join(after)}"]
    return _finish(instance, owner, source, len(stages), notes)


def from_torchtitan(instance, parts) -> Layout:
    """torchtitan's ``module_fqns_per_model_part`` on ``instance``.

    Parameters
    ----------
    parts
        ``list[list[str]]``: per model part (stage, in pipeline order) its module FQNs; a FQN
        names a layer or a module holding layers.

    Raises
    ------
    InvalidPlanError
        Not a list of lists of strings, an FQN that is no module of the instance (or lies inside
        one of its layers), a layer in two parts or in none, a part without layers, parts that
        are not contiguous.
    """
    source = "torchtitan module_fqns_per_model_part"
    if not isinstance(parts, list) or not all(isinstance(p, list) and all(isinstance(f, str) for f in p)
                                              for p in parts) or not parts:
        raise InvalidPlanError(f"{source} must be a non-empty list of lists of module FQNs, got {parts!r:.100}")
    order = _layout(instance).order
    owner: dict = {}
    for s, fqns in enumerate(parts):
        for fqn in fqns:
            covered = _covered(fqn, order)
            if not covered:
                inside = next((n for n in order if fqn.startswith(n + ".")), None)
                raise InvalidPlanError(
                    f"{source}: {fqn!r} (part {s}) is no module of {instance.name}"
                    + (f"; it lies inside its layer {inside!r} (profile at a finer granularity)" if inside else
                       f" (its layers: {', '.join(order[:4])}, ...)"))
            for n in covered:
                if n in owner and owner[n] != s:
                    raise InvalidPlanError(f"{source}: layer {n!r} is in part {owner[n]} and part {s}")
                owner[n] = s
    return _finish(instance, owner, source, len(parts))


def from_deepspeed(instance, parts) -> Layout:
    """DeepSpeed's ``PipelineModule`` ``parts`` over ``instance``'s layers in execution order.

    Parameters
    ----------
    parts
        ``S + 1`` integers, ``0 = parts[0] < ... < parts[S] = n`` (n: the instance's layers,
        the ``layers`` list of :func:`pipeopt.export.deepspeed.export`).

    Raises
    ------
    InvalidPlanError
        Not integers, not starting at 0, not ending at the instance's layer count (the message
        names both), not rising (an empty stage: DeepSpeed allows it, a plan does not).
    """
    order = _layout(instance).order
    source = f"DeepSpeed parts {parts}"
    if not isinstance(parts, (list, tuple)) or len(parts) < 2 or not all(
            isinstance(p, int) and not isinstance(p, bool) for p in parts):
        raise InvalidPlanError(f"DeepSpeed parts must be S + 1 >= 2 integers, got {parts!r:.100}")
    n = len(order)
    if parts[0] != 0 or parts[-1] != n:
        raise InvalidPlanError(
            f"{source}: must run from 0 to {n}, the layers of {instance.name} ({order[0]} .. {order[-1]}); "
            f"got {parts[0]} .. {parts[-1]} (wrong layer count)")
    for s, (a, b) in enumerate(zip(parts, parts[1:])):
        if b <= a:
            raise InvalidPlanError(f"{source}: stage {s} = layers[{a}:{b}] is empty or reversed")
    owner = {order[i]: s for s, (a, b) in enumerate(zip(parts, parts[1:])) for i in range(a, b)}
    return _finish(instance, owner, source, len(parts) - 1,
                   [f"layers = {instance.name}'s {n} layers in execution order ({order[0]} .. {order[-1]})"])


def from_split_spec(instance, spec: dict) -> Layout:
    """torch's ``split_spec`` on ``instance``, cut as ``pipeline`` cuts it.

    Parameters
    ----------
    spec
        ``{fqn: point}``, point ``"beginning"`` or ``"end"`` (any case, ``SplitPoint.`` prefix
        allowed). A FQN names a layer or a module holding layers (its first layer begins, its
        last ends).

    Raises
    ------
    InvalidPlanError
        An unknown FQN, a FQN inside a layer (the instance's layers are coarser than the cut),
        another point, or a spec that makes an empty stage.
    """
    from .export.torch_pipelining import point_name, stages_from_split_spec

    source = f"split_spec {json.dumps(spec)[:120]}"
    if not isinstance(spec, dict) or not spec:
        raise InvalidPlanError(f"a split_spec must be a non-empty mapping of module FQNs to split points, got {spec!r:.100}")
    order = _layout(instance).order
    mapped: dict = {}
    for fqn, point in spec.items():
        member = point_name(point, fqn)
        covered = _covered(str(fqn), order)
        if not covered:
            inside = next((n for n in order if str(fqn).startswith(n + ".")), None)
            raise InvalidPlanError(
                f"{source}: {fqn!r} is no module of {instance.name}"
                + (f"; it lies inside its layer {inside!r}, so the cut is finer than the profile" if inside else ""))
        mapped[covered[0] if member == "BEGINNING" else covered[-1]] = f"SplitPoint.{member}"
    stages = stages_from_split_spec(mapped, order)
    owner = {n: s for s, st in enumerate(stages) for n in st}
    expected = 1 + sum(1 for n, p in mapped.items() if not (p.endswith("BEGINNING") and n == order[0])
                       and not (p.endswith("END") and n == order[-1]))
    if len(stages) != expected:
        raise InvalidPlanError(f"{source}: two split points fall at one place of {instance.name}'s layers "
                               "(an empty stage)")
    return _finish(instance, owner, source, len(stages))


# ---- reading the inputs from files or text ----------------------------------------------------
def _json(path, what: str):
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ReadError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReadError(f"the {what} {path} is not JSON: {exc}") from None


def read_torchtitan(path) -> list:
    """``module_fqns_per_model_part`` from a JSON file: the list of lists itself, or an object
    holding it (a ``pipeopt export --to torchtitan`` file, or ``{"parallelism": {...}}``); a
    ``.toml`` file's ``[parallelism]`` table (torchtitan's job config).

    Raises
    ------
    ReadError
        If the file cannot be read or holds no such list.
    """
    if str(path).endswith(".toml"):
        import tomllib

        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise ReadError(f"cannot read the torchtitan config {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ReadError(f"the torchtitan config {path} is not TOML: {exc}") from None
    else:
        data = _json(path, "torchtitan FQN lists")
    if isinstance(data, dict):
        data = data.get("parallelism", data)
        data = data.get("module_fqns_per_model_part") if isinstance(data, dict) else None
    if not isinstance(data, list):
        raise ReadError(f"{path} holds no module_fqns_per_model_part (a list of lists of module FQNs)")
    return data


def read_deepspeed_parts(text) -> list[int]:
    """DeepSpeed ``parts`` from ``"0,5,9,13"`` (commas or spaces, brackets allowed) or a JSON file
    holding the list or a ``pipeopt export --to deepspeed`` object.

    Raises
    ------
    ReadError
        If the text is neither integers nor a readable file holding them.
    """
    raw = str(text).strip()
    if Path(raw).suffix == ".json":
        data = _json(raw, "DeepSpeed parts")
        data = data.get("parts") if isinstance(data, dict) else data
        if not isinstance(data, list) or not all(isinstance(p, int) for p in data):
            raise ReadError(f"{raw} holds no DeepSpeed parts (a list of integers)")
        return data
    items = [t for t in re.split(r"[\s,]+", raw.strip("[]() ")) if t]
    try:
        return [int(t, 10) for t in items]
    except ValueError:
        raise ReadError(f"DeepSpeed parts must be integers such as 0,5,9,13, got {raw!r}") from None


def read_split_spec(path) -> dict:
    """A torch ``split_spec`` from a JSON file (the mapping, or a ``pipeopt export --to torch``
    object holding it): :func:`pipeopt.export.torch_pipelining.read_split_spec`."""
    from .export.torch_pipelining import read_split_spec as read

    return read(str(path))["split_spec"]


# ---- the grade --------------------------------------------------------------------------------
@dataclass
class Grade:
    """A user's split scored and set against the proven optimum.

    Attributes
    ----------
    layout
        The :class:`Layout` graded.
    plan
        The split as a :class:`pipeopt.Plan` (devices as the problem places them).
    time
        Seconds: the split's objective (``objective`` says which).
    feasible
        Whether the split fits every worker's memory.
    objective
        One line: what ``time`` is (the instance's objective, or the schedule's iteration).
    optimum
        The :class:`pipeopt.Result` of the exact solve of the same problem.
    gap
        :func:`pipeopt.result.optimality_gap` of ``time`` against ``optimum.lower_bound``
        (``None`` without a bound).
    proven
        True if the solve proved its optimum (``gap`` is the distance to it), False if it
        stopped at its limit (``gap`` bounds the distance from above).
    """

    layout: Layout
    plan: object
    time: float
    feasible: bool
    objective: str
    optimum: object
    gap: float | None
    proven: bool
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        """Lines for the terminal."""
        opt = self.optimum
        lines = [f"{self.layout.source}: {self.layout.num_stages} stages"]
        for i, st in enumerate(self.layout.stages):
            lines.append(f"  stage {i}: {_span(st)}")
        lines.append(f"time: {format_ms(self.time)} ({self.objective})"
                     + ("" if self.feasible else "; DOES NOT FIT the workers' memory"))
        how = f"({opt.method}, {opt.status}, space {opt.space}, {opt.runtime:.2f} s)"
        if self.proven:
            lines.append(f"proven optimum: {format_ms(opt.objective)} {how}")
        else:
            lines.append(f"no proven optimum: the solve stopped at its time limit with lower bound "
                         f"{format_ms(opt.lower_bound)}, best found {format_ms(opt.objective)} {how}")
        if self.gap is None:
            lines.append("gap: none (no bound)")
        else:
            lines.append(f"gap: {self.gap:.2%} " + ("to the proven optimum" if self.proven else
                                                    "at most, to the solver's lower bound (not proven optimal)"))
        lines += [f"  note: {n}" for n in [*self.layout.notes, *self.notes]]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready."""
        opt = self.optimum
        return {"source": self.layout.source, "stages": [list(s) for s in self.layout.stages], "time": self.time,
                "feasible": self.feasible, "objective": self.objective, "gap": self.gap, "proven": self.proven,
                "optimum": {"method": opt.method, "status": str(opt.status), "objective": opt.objective,
                            "lower_bound": opt.lower_bound, "space": opt.space, "runtime": opt.runtime,
                            "stages": [list(s.layers) for s in opt.plan.stages] if opt.plan is not None else None},
                "notes": [*self.layout.notes, *self.notes]}


def format_ms(seconds) -> str:
    """Seconds as milliseconds with 4 significant digits (``"1.234 ms"``)."""
    return f"{seconds * 1e3:.4g} ms" if seconds is not None and math.isfinite(seconds) else str(seconds)


def _span(names) -> str:
    names = list(names)
    return ", ".join(names) if len(names) <= 4 else f"{len(names)} layers [{names[0]} .. {names[-1]}]"


def grade(instance, layout: Layout, *, schedule: str | None = None, microbatches: int | None = None,
          stages_per_rank: int | None = None, method: str | None = None, time_limit: float | None = 60.0,
          solver: str = "auto", threads: int = 2) -> Grade:
    """Score ``layout`` on ``instance`` and solve the same problem exactly (module docstring).

    Parameters
    ----------
    instance
        :class:`pipeopt.Instance`.
    layout
        From :func:`from_megatron`, :func:`from_torchtitan`, :func:`from_deepspeed` or
        :func:`from_split_spec`.
    schedule
        ``None``: the partition problem under the instance's objective. Else a torch schedule
        (any spelling of :func:`pipeopt.schedules.schedule_name`): the schedule problem, the
        layout's S stages on ``S / stages_per_rank`` ranks.
    microbatches
        m of the schedule (default: the instance's).
    stages_per_rank
        v of the schedule (default: its own, 2 for the multi-stage ones).
    method
        The exact method (default: the problem's default).
    time_limit, solver, threads
        As :func:`pipeopt.solve`. A solve that stops at the limit gives its lower bound, and
        the grade says the gap is an upper bound.

    Returns
    -------
    Grade

    Raises
    ------
    InvalidPlanError
        If the split is not in the problem's space (a schedule's chunks must be contiguous
        runs of the instance's layer chain).
    InvalidProblemError
        An unknown schedule, S not divisible by v, fewer devices than stages or ranks, and
        what :func:`pipeopt.solve` refuses (e.g. tied parameters under a schedule).
    """
    from .result import optimality_gap
    from .solve import solve

    S = layout.num_stages
    notes: list = []
    if schedule is None:
        from .cost import evaluate
        from .plan import Plan, Stage

        devices = [d.name for d in instance.cluster.devices]
        if len(devices) < S:
            raise InvalidProblemError(f"the layout has {S} stages; {instance.name}'s cluster has {len(devices)} "
                                      f"devices (one per stage): profile with --devices {S} or use an instance "
                                      f"of {S} or more devices")
        plan = Plan(tuple(Stage(tuple(st), (devices[i],)) for i, st in enumerate(layout.stages)))
        ev = evaluate(instance, plan)
        in_order = _contiguous_in_chain(instance, layout.stages)
        if not in_order and method is None:
            method = "convex"
            notes.append("the split is not contiguous in the partition problem's layer order: set against every "
                         "convex split (method convex), a larger space")
        opt = solve(instance, problem="partition", method=method, stages=S, time_limit=time_limit,
                    solver=solver, threads=threads)
        time_, feasible = ev.objective, ev.feasible
        from .instance import OBJECTIVE_TEXT

        obj = instance.settings.objective
        text = OBJECTIVE_TEXT.get(obj, obj).replace(" M ", f" {instance.settings.microbatches} ")
        objective = f"{text}; pipeopt.evaluate"
    else:
        from .problems.schedule import ScheduleProblem
        from .schedules.names import schedule_name
        from .schedules.torch_orders import STAGES_PER_RANK

        name = schedule_name(schedule)
        v = stages_per_rank or STAGES_PER_RANK.get(name, 2)
        if S % v:
            raise InvalidProblemError(f"{name} runs {v} stages per rank; the layout has {S} stages")
        p = S // v
        options = dict(schedule=name, stages=p, microbatches=microbatches, stages_per_rank=v)
        prob = ScheduleProblem(instance, **options)
        starts = _chain_starts(instance, layout.stages)
        ex = prob.execute(starts)
        plan = prob.plan(starts)
        opt = solve(instance, problem="schedule", method=method, time_limit=time_limit, solver=solver,
                    threads=threads, **options)
        time_, feasible = ex.time, ex.feasible
        objective = (f"iteration of {prob.microbatches} microbatches under {name} on {p} ranks x {v} stages, "
                     "the schedule executor")
    proven = str(opt.status) == "optimal"
    gap = optimality_gap(time_, opt.lower_bound)
    return Grade(layout, plan, float(time_), bool(feasible), objective, opt, gap, proven, notes)


def _chain_units(instance) -> list[tuple]:
    chain = instance.chain
    return [tuple(str(x) for x in chain.layers(i, i + 1)) for i in range(chain.n)]


def _contiguous_in_chain(instance, stages) -> bool:
    try:
        _chain_starts(instance, stages)
    except InvalidPlanError:
        return False
    return True


def _chain_starts(instance, stages) -> list[int]:
    """Unit indices where stages 1..S-1 start on the instance's layer chain, or
    :class:`InvalidPlanError` if the stages are not contiguous runs of whole units."""
    units = _chain_units(instance)
    stage_of = {n: s for s, st in enumerate(stages) for n in st}
    starts, last = [], 0
    for i, unit in enumerate(units):
        owners = {stage_of.get(n) for n in unit}
        if len(owners) != 1 or None in owners:
            raise InvalidPlanError(f"the layout cuts inside the chain unit {list(unit)} of {instance.name}")
        s = owners.pop()
        if s == last + 1:
            starts.append(i)
            last = s
        elif s != last:
            raise InvalidPlanError(
                f"the layout's stages are not contiguous runs of {instance.name}'s layer chain (the schedule "
                f"problem's space): {unit[0]!r} of stage {s} follows stage {last}")
    if last != len(stages) - 1:
        raise InvalidPlanError(f"the layout's stages are not contiguous runs of {instance.name}'s layer chain")
    return starts
