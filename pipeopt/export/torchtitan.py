"""Export to torchtitan's ``module_fqns_per_model_part``.

torchtitan builds pipeline stages from ``[parallelism] module_fqns_per_model_part`` (one list
of module FQNs per model part) with ``pipeline_module_split``: for each part it deep-copies the
model and, for every top-level child, keeps it if its name is listed, or -- if the child is an
``nn.ModuleList`` / ``nn.ModuleDict`` -- keeps the listed entries ``<child>.<key>`` and drops
the others; every other top-level child becomes ``None`` (the model's ``forward`` must skip
``None`` modules). Hence what it can express:

* names are top-level modules (``tok_emb``, ``norm``) or entries of a top-level
  ModuleList/ModuleDict (``layers.3``); a deeper name (``layers.3.mlp``, a leaf-module plan)
  is a cut inside a module torchtitan cannot split ("Does not support nested moduledict and
  modulelist structures");
* the entries of any other container (an ``nn.Sequential``) cannot be spread over stages:
  such a container is kept or dropped whole;
* stages contiguous in execution order (model parts), one per rank for the single-stage
  schedules (1F1B, GPipe), ``S / p`` per rank for the multi-stage ones (``schedule=``: a plan
  of the schedule problem, :mod:`pipeopt.problems.schedule`); ``pipeline_parallel_degree`` is
  the number of **ranks** p, not of stages.

**An action order** (a plan carrying ``plan.schedule``, e.g. a free order): torchtitan runs it
from ``[parallelism] pipeline_parallel_schedule_csv``. ``build_pipeline_schedule`` then builds
torch's ``_PipelineScheduleRuntime`` over the rank's stages and calls its ``_load_csv(path)``
(the compute-only CSV of :mod:`pipeopt.export.torch_csv`), with ``n_microbatches =
local_batch_size // pipeline_parallel_microbatch_size``, which must equal the order's m. Which
stages a rank builds is not read from the CSV but from ``pipeline_parallel_schedule``:
``pipeline_module_split`` places stage s on rank ``s mod p`` ("loop"), or - for
``ZBVZeroBubble`` and ``DualPipeV`` - in a V with 2 stages per rank. So the export names a
schedule of the order's placement (the order's own name if it is one of torch's, else
``1F1B`` for one stage per rank, ``Interleaved1F1B`` for a looped placement,
``ZBVZeroBubble`` for a V) and refuses any other placement.

:func:`stage_modules` re-implements that keep/drop logic to read an export back.

**Activation recomputation** (a plan's ``Stage.recompute``, :func:`activation_checkpoint`): the
TOML gets an ``[activation_checkpoint]`` table, always (v0.2.2's default is ``mode =
"selective"``, ``selective_ac_option = "2"``: a plan that recomputes nothing says ``mode =
"none"``). torchtitan wraps whole blocks of ``layers`` (``apply_ac``, once per model part):

* nothing recomputed: ``mode = "none"``;
* every block ``full``: ``mode = "full"``;
* every block ``selective``: ``mode = "selective"``, ``selective_ac_option = "op"`` (the per-op
  policy; the plan's ``selective`` is what the profile measured for it);
* every k-th block of each rank ``full`` (k >= 2): ``mode = "selective"``,
  ``selective_ac_option = "k"`` - v0.2.2's ``_apply_layer_sac`` counts the blocks a process
  wraps, over its model parts in order, and wraps block c (1-based) iff ``c % k == 0``
  (:func:`pipeopt.problems.partition.recompute_baselines.torchtitan_layer_rule`). This option
  was removed from torchtitan's main branch on 2026-03-23 (commit 114151ad: "per-op SAC is now
  the only selective mode"), said in ``notes``;
* anything else (a per-layer set of another shape, ``full`` and ``selective`` mixed, a
  recomputed module that is not a block) is refused, naming why.

Target: torchtitan v0.2.2 (2026-02-20), ``torchtitan/distributed/pipeline_parallel.py``
(``pipeline_module_split``, ``generate_llm_fqn_per_model_part``) and
``torchtitan/config/job_config.py`` (``Parallelism.module_fqns_per_model_part``,
``pipeline_parallel_schedule_csv``); the CSV path and the placement by schedule name as read at
the main branch (commit 02ef790: ``build_pipeline_schedule``, ``pipeline_module_split``); the main
branch of 2026-08 (commit b5bcd76) keeps the same logic under the private names
``_pipeline_module_split`` / ``_split_module`` and renames the LM head ``output`` to
``lm_head``. github.com/pytorch/torchtitan (BSD-3-Clause).
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from .layout import ModelLayout, StageSplit, recomputed_blocks, shared_notes, shared_parameters, split_stages

RUNTIME = "torchtitan"
TARGET = "torchtitan v0.2.2 (torchtitan/distributed/pipeline_parallel.py: pipeline_module_split)"
SPLITTABLE = ("ModuleList", "ModuleDict")
"""Container classes whose entries ``pipeline_module_split`` keeps one by one."""


def export(plan: Plan, layout: ModelLayout, schedule: str = "1F1B", order=None, csv_path: str | None = None) -> dict:
    """The plan as torchtitan's ``module_fqns_per_model_part``.

    Parameters
    ----------
    plan
        A plan whose layer names are module FQNs.
    layout
        The model's layout; ``layout.container_type`` (from the graph's ``torch`` attribute or
        the module) says whether the container's entries can be split; unknown is taken as a
        ModuleList and said in ``notes``.
    schedule
        torch's (canonical) name of the schedule, ``pipeline_parallel_schedule``; its degree
        is the plan's ranks (stages listing the same devices share one; a plan without devices:
        one rank per stage), ``S / ranks`` model parts per rank.
    order
        The plan's action order (:class:`pipeopt.schedules.Schedule`, from ``plan.schedule``)
        or ``None``: with an order the degree is its ranks, the schedule name follows its
        placement (module docstring) and the output holds the CSV.
    csv_path
        The CSV's path written into the TOML (default ``schedule.csv``).

    Returns
    -------
    dict
        ``{"format": "torchtitan", "target": ..., "num_stages": S, "data_parallel": m,
        "module_fqns_per_model_part": [[fqn, ...], ...], "toml": "...", "notes": [...]}``;
        with an order also ``"csv"`` (its text), ``"pipeline_parallel_schedule_csv"`` (the
        path) and ``"pipeline_parallel_schedule"``.

    Raises
    ------
    UnsupportedPlanError
        A name below a ModuleList/ModuleDict entry or below a plain top-level module (a cut
        inside a module torchtitan cannot split), the entries of a non-splittable container
        (e.g. ``nn.Sequential``) in several stages, a schedule whose stages per rank differ
        from the plan's, an order whose placement torchtitan cannot build, and the rules
        every runtime shares.
    """
    split = split_stages(plan, layout, RUNTIME)
    notes = split.notes()
    if order is not None:
        degree, schedule = order.ranks, _schedule_for_order(order)
        if schedule != order.name:
            notes.append(f"pipeline_parallel_schedule = {schedule!r} only places the stages "
                         f"({'V' if schedule in V_SCHEDULES else 'looped'}); the order run is the CSV's ({order.name})")
        notes.append(f"set local_batch_size / pipeline_parallel_microbatch_size = {order.microbatches}, the order's "
                     "microbatches (torch's _load_csv checks that every stage runs each of them)")
    else:
        degree = _degree(plan, schedule)
    where = f"{RUNTIME} cannot express this plan"
    owner = {n: i for i, st in enumerate(split.stages) for n in st}
    entries: dict = {}
    for name in layout.order:
        parts = name.split(".")
        if len(parts) == 1:
            continue
        top = parts[0]
        if len(parts) > 2 or top != layout.container:
            inside = ".".join(parts[:2]) if top == layout.container else top
            raise UnsupportedPlanError(
                f"{where}: {name!r} is a module inside {inside!r}; pipeline_module_split keeps or drops "
                f"whole top-level modules and whole entries of a top-level ModuleList/ModuleDict "
                f"(profile at the granularity of {layout.container or 'the top-level modules'!r}'s children)"
            )
        entries.setdefault(top, set()).add(owner[name])
    for top, stages in entries.items():
        if layout.container_type is None:
            notes.append(f"assumed {top!r} is an nn.ModuleList (its class is not recorded)")
        elif layout.container_type not in SPLITTABLE and len(stages) > 1:
            raise UnsupportedPlanError(
                f"{where}: the entries of {top!r} (an nn.{layout.container_type}) sit in stages "
                f"{sorted(stages)}; pipeline_module_split splits only an nn.ModuleList or nn.ModuleDict "
                f"and keeps any other module whole"
            )
    parts_ = [list(s) for s in split.stages]
    ac = activation_checkpoint(plan, split, _rank_of(split.num_stages, degree, schedule))
    notes += ac.pop("notes")
    out = {
        "format": "torchtitan",
        "target": TARGET,
        "num_stages": split.num_stages,
        "data_parallel": split.data_parallel,
        "pipeline_parallel_degree": degree,
        "pipeline_parallel_schedule": schedule,
        "module_fqns_per_model_part": parts_,
        "activation_checkpoint": ac,
        "shared_parameters": (shared := shared_parameters(split)),
        "notes": notes + ["the model's forward must skip modules set to None (torchtitan's requirement)"]
        + shared_notes(shared, RUNTIME),
    }
    if order is not None:
        from .torch_csv import to_csv

        path = str(csv_path) if csv_path is not None else "schedule.csv"
        out["csv"] = to_csv(order)
        out["pipeline_parallel_schedule_csv"] = path
        out["toml"] = _toml(parts_, degree, schedule, csv=path, microbatches=order.microbatches)
    else:
        out["toml"] = _toml(parts_, degree, schedule)
    out["toml"] += "\n[activation_checkpoint]\n" + "".join(f'{k} = "{v}"\n' for k, v in ac.items())
    return out


def _rank_of(num_stages: int, degree: int, schedule: str) -> list[int]:
    """The rank ``pipeline_module_split`` builds each stage on: in a V (2 per rank) for
    :data:`V_SCHEDULES`, else looped (``s mod p``)."""
    if schedule in V_SCHEDULES:
        return [s if s < degree else 2 * degree - 1 - s for s in range(num_stages)]
    return [s % degree for s in range(num_stages)]


def activation_checkpoint(plan: Plan, split: StageSplit, rank_of: list[int] | None = None) -> dict:
    """The plan's recompute set as torchtitan v0.2.2's ``[activation_checkpoint]`` settings
    (module docstring).

    Parameters
    ----------
    plan
        The plan (``Stage.recompute``).
    split
        Its :func:`~pipeopt.export.layout.split_stages`.
    rank_of
        The rank of each stage (default: one stage per rank). A rank's model parts are wrapped
        in increasing stage order (``pipeline_module_split`` lists them so), so the every-k
        counter runs over them in that order.

    Returns
    -------
    dict
        ``{"mode": "none" | "full" | "selective", "selective_ac_option": "op" | "k" (with
        selective), "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        If no setting expresses the set: the reason (a module that is not a block recomputed,
        ``full`` and ``selective`` mixed, a per-layer set that is not every k-th block of each
        rank).
    """
    from ..problems.partition.recompute_baselines import torchtitan_layer_rule

    modes = recomputed_blocks(plan, split, RUNTIME)
    none_note = ("[activation_checkpoint] mode = \"none\": the plan recomputes nothing (torchtitan v0.2.2's default "
                 "is mode selective with selective_ac_option 2)")
    if modes is None or not any(m for st in modes for m in st):
        return {"mode": "none", "notes": [none_note]}
    where = f"{RUNTIME} cannot express this plan's recomputation"
    used = {m for st in modes for m in st}
    if used == {"selective"} and all(m == "selective" for st in modes for m in st):
        return {"mode": "selective", "selective_ac_option": "op",
                "notes": ["selective_ac_option = \"op\": torchtitan's per-op policy on every block; the plan's "
                          "'selective' is what the profile measured (node attribute selective), the same only where "
                          "the profile measured this policy"]}
    if "selective" in used:
        raise UnsupportedPlanError(
            f"{where}: it recomputes some blocks 'selective' and others 'full' or not at all; activation_checkpoint "
            "has one mode for every block (full, or selective per-op 'op', or every k-th block fully)")
    if all(m == "full" for st in modes for m in st):
        return {"mode": "full", "notes": []}
    ranks = list(range(len(modes))) if rank_of is None else list(rank_of)
    seq: dict = {}
    for s in sorted(range(len(modes)), key=lambda s: (ranks[s], s)):
        seq.setdefault(ranks[s], []).extend(m is not None for m in modes[s])
    counts = [len(v) for v in seq.values()]
    flags = list(seq.values())
    for k in range(2, max(counts) + 1):
        if flags == torchtitan_layer_rule(counts, k):
            return {"mode": "selective", "selective_ac_option": str(k),
                    "notes": [f"selective_ac_option = \"{k}\": every {k}-th block of each rank checkpointed (torchtitan "
                              "v0.2.2 _apply_layer_sac; the layer option was removed from torchtitan's main branch on "
                              "2026-03-23, commit 114151ad: use v0.2.2)"]}
    per_rank = {r: [j for j, f in enumerate(v) if f] for r, v in seq.items()}
    raise UnsupportedPlanError(
        f"{where}: it recomputes blocks {per_rank} (per rank, 0-based within the rank's blocks); torchtitan checkpoints "
        "every block (mode full), none, or every k-th block of each rank (selective_ac_option = k, counted from the "
        "rank's first block) - not a per-layer list")


V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
"""The schedules for which ``pipeline_module_split`` places stages in a V (2 per rank)."""


def _schedule_for_order(order) -> str:
    """A torch schedule name under which ``pipeline_module_split`` builds ``order``'s placement
    (module docstring); refused if there is none."""
    from ..schedules.actions import looped_placement, v_placement
    from ..schedules.names import TORCH_SCHEDULES
    from ..schedules.torch_orders import STAGES_PER_RANK

    p, v = order.ranks, order.stages_per_rank
    own = order.name if order.name in TORCH_SCHEDULES and STAGES_PER_RANK.get(order.name, v) == v else None
    if order.placement == looped_placement(p, v):
        if own is not None and own not in V_SCHEDULES:
            return own
        return "1F1B" if v == 1 else "Interleaved1F1B"
    if v == 2 and order.placement == v_placement(p, 2):
        return own if own in V_SCHEDULES else "ZBVZeroBubble"
    raise UnsupportedPlanError(
        f"{RUNTIME} cannot build this order's placement {list(order.placement)} (rank of each stage): "
        "pipeline_module_split puts stage s on rank s mod p, or in a V with 2 stages per rank "
        "(ZBVZeroBubble, DualPipeV)"
    )


def _degree(plan: Plan, schedule: str) -> int:
    """The pipeline ranks of ``plan`` under ``schedule``: its distinct device lists (a chunk
    plan lists each rank's devices on every chunk of that rank), or one per stage without
    devices; refused if the schedule runs another number of stages per rank."""
    from ..schedules.torch_orders import STAGES_PER_RANK

    S = plan.num_stages
    fixed = STAGES_PER_RANK.get(schedule)
    if all(st.devices for st in plan.stages):
        ranks = len({tuple(st.devices) for st in plan.stages})
    else:  # no devices: the schedule's stages per rank (2 for the multi-stage ones by default)
        ranks = S // (fixed or 2) if S % (fixed or 2) == 0 else S
    v, rest = divmod(S, ranks)
    if rest or (fixed is not None and v != fixed) or (fixed is None and v < 2):
        raise UnsupportedPlanError(
            f"{RUNTIME}: {schedule} runs {fixed or 'two or more'} stage(s) per rank; the plan has {S} stages"
            f" on {ranks} ranks (name the schedule its chunks run with --schedule, or export a plan that"
            " carries its order)"
        )
    return ranks


def _toml(parts: list, degree: int, schedule: str = "1F1B", csv: str | None = None,
          microbatches: int | None = None) -> str:
    import json

    rows = ",\n".join("    [" + ", ".join(f'"{n}"' for n in p) + "]" for p in parts)
    extra = ""
    if csv is not None:
        extra = (f"pipeline_parallel_schedule_csv = {json.dumps(csv)}\n"
                 f"# the CSV's order runs {microbatches} microbatches: "
                 f"local_batch_size / pipeline_parallel_microbatch_size must be {microbatches}\n")
    return (
        "[parallelism]\n"
        f"pipeline_parallel_degree = {degree}\n"
        f'pipeline_parallel_schedule = "{schedule}"\n'
        + extra
        + f"module_fqns_per_model_part = [\n{rows},\n]\n"
    )


def stage_modules(module_fqns_per_model_part: list, children: dict) -> list[list[str]]:
    """What ``pipeline_module_split`` keeps for each model part (pure Python re-implementation).

    Parameters
    ----------
    module_fqns_per_model_part
        The export's lists.
    children
        ``dict[str, list[str] | None]``: the model's top-level children in order; a
        ModuleList/ModuleDict maps to its entry keys (``["0", "1", ...]``), any other module
        to ``None``.

    Returns
    -------
    list[list[str]]
        Per part, the FQNs of the modules left in its copy of the model (``"layers.3"`` for a
        kept entry, ``"norm"`` for a kept top-level module), in model order. A listed name that
        matches nothing is silently dropped, as torchtitan does.
    """
    out = []
    for names in module_fqns_per_model_part:
        keep = set(names)
        kept = []
        for child, keys in children.items():
            if keys is not None:
                wanted = {n.split(".", 1)[1] for n in keep if n.startswith(child + ".")}
                kept.extend(f"{child}.{k}" for k in keys if k in wanted)
            elif child in keep:
                kept.append(child)
        out.append(kept)
    return out
