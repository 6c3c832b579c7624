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
  of the schedule problem, :mod:`pipeopt.problems.schedule`).

:func:`stage_modules` re-implements that keep/drop logic to read an export back.

Target: torchtitan v0.2.2 (2026-02-20), ``torchtitan/distributed/pipeline_parallel.py``
(``pipeline_module_split``, ``generate_llm_fqn_per_model_part``) and
``torchtitan/config/job_config.py`` (``Parallelism.module_fqns_per_model_part``); the main
branch of 2026-08 (commit b5bcd76) keeps the same logic under the private names
``_pipeline_module_split`` / ``_split_module`` and renames the LM head ``output`` to
``lm_head``. github.com/pytorch/torchtitan (BSD-3-Clause).
"""

from __future__ import annotations

from ..errors import UnsupportedPlanError
from ..plan import Plan
from .layout import ModelLayout, split_stages

RUNTIME = "torchtitan"
TARGET = "torchtitan v0.2.2 (torchtitan/distributed/pipeline_parallel.py: pipeline_module_split)"
SPLITTABLE = ("ModuleList", "ModuleDict")
"""Container classes whose entries ``pipeline_module_split`` keeps one by one."""


def export(plan: Plan, layout: ModelLayout, schedule: str = "1F1B") -> dict:
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

    Returns
    -------
    dict
        ``{"format": "torchtitan", "target": ..., "num_stages": S, "data_parallel": m,
        "module_fqns_per_model_part": [[fqn, ...], ...], "toml": "...", "notes": [...]}``.

    Raises
    ------
    UnsupportedPlanError
        A name below a ModuleList/ModuleDict entry or below a plain top-level module (a cut
        inside a module torchtitan cannot split), the entries of a non-splittable container
        (e.g. ``nn.Sequential``) in several stages, a schedule whose stages per rank differ
        from the plan's, and the rules every runtime shares.
    """
    split = split_stages(plan, layout, RUNTIME)
    degree = _degree(plan, schedule)
    notes = split.notes()
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
    return {
        "format": "torchtitan",
        "target": TARGET,
        "num_stages": split.num_stages,
        "data_parallel": split.data_parallel,
        "module_fqns_per_model_part": parts_,
        "toml": _toml(parts_, degree, schedule),
        "notes": notes + ["the model's forward must skip modules set to None (torchtitan's requirement)"],
    }


def _degree(plan: Plan, schedule: str) -> int:
    """The pipeline ranks of ``plan`` under ``schedule``: its distinct device lists (a chunk
    plan lists each rank's devices on every chunk of that rank), or one per stage without
    devices; refused if the schedule runs another number of stages per rank."""
    from ..schedules.torch_orders import STAGES_PER_RANK

    S = plan.num_stages
    ranks = len({tuple(st.devices) for st in plan.stages}) if all(st.devices for st in plan.stages) else S
    v, rest = divmod(S, ranks)
    fixed = STAGES_PER_RANK.get(schedule)
    if rest or (fixed is not None and v != fixed):
        raise UnsupportedPlanError(
            f"{RUNTIME}: {schedule} runs {fixed or 'a whole number of'} stage(s) per rank; the plan has {S} stages"
            f" on {ranks} ranks"
        )
    return ranks


def _toml(parts: list, degree: int, schedule: str = "1F1B") -> str:
    rows = ",\n".join("    [" + ", ".join(f'"{n}"' for n in p) + "]" for p in parts)
    return (
        "[parallelism]\n"
        f"pipeline_parallel_degree = {degree}\n"
        f'pipeline_parallel_schedule = "{schedule}"\n'
        f"module_fqns_per_model_part = [\n{rows},\n]\n"
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
