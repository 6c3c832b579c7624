"""Run a plan on torch's own pipeline runtime, on CPU processes, and time it.

:func:`run_plan` exports the plan to ``torch.distributed.pipelining``
(:mod:`pipeopt.export.torch_pipelining`), spawns one process per stage
(``torch.multiprocessing``, start method ``spawn``; ``gloo`` process group over a file store;
``torch.set_num_threads(1)`` in each, as the profile is measured), and in each process:

1. builds the model from its factory (same seed on every rank: equal weights);
2. ``pipeline(model, mb_args, split_spec=...)`` traces and splits it, ``build_stage`` makes
   the rank's stage, and the names of the plan's layers the stage module runs (the modules
   its fx graph calls, :func:`called_modules`) are the stage membership actually built; a
   module it holds without running it is a difference unless it holds a tied parameter the
   export shares onto that stage (:func:`tie_holders`); ``pipeopt run`` exits non-zero on a
   difference;
3. runs torch's ``Schedule1F1B`` or ``ScheduleGPipe`` over M microbatches: ``warmup``
   untimed iterations, then ``iterations`` timed ones, each between two barriers
   (``dist.barrier(); t0; schedule.step(...); dist.barrier(); t1``), so an iteration's time
   is the flush time of all stages. The barrier pair's own cost is timed alone and reported.
   A parameter the plan puts on two or more stages (a tied weight, which ``pipeline()``
   copies into each) has its gradient summed over those stages' ranks after the flush,
   inside the timed step (:func:`tie_syncs`, :func:`sync_ties`), as the cost model charges it
   and as a training step must before its optimizer step; in an action order's run the same,
   with a rank's copies (several chunks per rank) summed locally first (:func:`order_tie_syncs`).

**An action order** (a plan carrying ``plan.schedule`` - a free order of the schedule problem,
or any fixed one - or a torch compute-only CSV given as ``order=``, perhaps edited by hand):
the order is read and checked first (:mod:`pipeopt.export.torch_csv`: a broken or deadlocking
order is refused naming its first broken action, before any process starts); then one process
per **rank** builds every stage the order places on it (several chunks per rank where the plan
has them) and torch's ``_PipelineScheduleRuntime`` over them, which loads the order with its
own ``_load_csv`` (compute-only: the runtime adds the sends and receives) and runs it. Each
stage is a ``PipelineStage`` around the traced stage module (``pipe.get_stage_module(s)``),
not ``build_stage``'s ``_PipelineStage``: the latter's neighbour warm-up sends to its own rank
when two adjacent stages share one (the V placement), which gloo refuses. The
prediction is pipeopt's executor on the same order and split
(:func:`pipeopt.schedules.run_schedule`).

**Activation recomputation**: the layers of each stage's ``Stage.recompute`` run their forward
under ``torch.utils.checkpoint`` (``use_reentrant=False``; ``"selective"`` with torchtitan's
per-operator policy, :mod:`pipeopt.torch.recompute`) inside the stage module ``pipeline()``
built, under every schedule and order (:func:`apply_recompute`); each layer's forward runs are
counted and reported, so the report shows that the backward reran them
(:func:`recompute_report`). The stage modules run their generated code, not
``torch.fx.Interpreter`` (:func:`build_pipe`): a rerun costs what the profile measured for it
(node attribute ``recompute_fwd``, :mod:`pipeopt.torch.profile`). torch's split backward (I, W)
computes the weight gradients one parameter group at a time, and each such ``autograd.grad`` would rerun a checkpointed forward again (torch's
checkpoint keys its recomputed tensors by the backward call); in an order whose backward is
split, a ``"full"`` layer therefore reruns once per microbatch, before I, and keeps the rerun's
tensors until its W (:func:`pipeopt.torch.recompute.rerun_once`), as the cost model charges it.
A ``"selective"`` layer keeps torch's checkpoint (it reruns per parameter group of W). The
report says how many reruns per microbatch it measured.

The loss is ``output.sum()`` (a backward from gradients of ones, as the profiler of
:mod:`pipeopt.torch.probe` times the layers), so that the run and the profile time the same
work; no optimizer step (the cost model does not count one).

:func:`prediction` is pipeopt's value for the same plan: :func:`pipeopt.evaluate` with
objective ``iteration`` (1F1B with a flush) or ``gpipe`` and the same M.

References
----------
PyTorch 2.13 ``torch/distributed/pipelining``: ``pipeline``, ``build_stage``,
``Schedule1F1B``, ``ScheduleGPipe`` (docs.pytorch.org/docs/2.13/distributed.pipelining.html);
``torch/distributed/pipelining/schedules.py``: ``_PipelineScheduleRuntime._load_csv``.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import queue as queue_mod
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch

from ..errors import InvalidProblemError, PipelineRunError
from ..export import export
from ..export.torch_pipelining import split_spec_for_torch
from ..plan import Plan

SCHEDULES = ("1f1b", "gpipe")
OBJECTIVE = {"1f1b": "iteration", "gpipe": "gpipe"}
"""pipeopt's objective that models each schedule (M microbatches with a flush)."""

DEFAULT_TIMEOUT = 300.0
"""Seconds a run may take in all (spawn, tracing, warm-up, timed iterations)."""


# ---- reading a Pipe back ----------------------------------------------------------------------
def build_pipe(module: torch.nn.Module, example_inputs: tuple, exported: dict):
    """``torch.distributed.pipelining.pipeline`` on a copy of ``module`` with the export's split.

    ``pipeline`` annotates the module it is given in place (its split points stay on the
    module's ``forward``), hence the copy. Every stage module runs its generated code, not
    ``torch.fx.Interpreter`` (:func:`pipeopt.torch.probe.generated_code`: the profile's
    stage overhead is measured the same way).

    Raises
    ------
    PipelineRunError
        If torch builds another number of stages than the export has.
    """
    from torch.distributed.pipelining import pipeline

    from .probe import generated_code

    pipe = pipeline(copy.deepcopy(module), tuple(example_inputs), split_spec=split_spec_for_torch(exported))
    for i in range(pipe.num_stages):
        generated_code(pipe.get_stage_module(i))
    if pipe.num_stages != exported["num_stages"]:
        raise PipelineRunError(
            f"torch.distributed.pipelining built {pipe.num_stages} stages from a split spec of "
            f"{exported['num_stages']} stages ({exported['split_spec']})"
        )
    return pipe


def called_modules(stage_module: torch.nn.Module) -> set[str] | None:
    """The FQNs of the modules a stage module **runs**: the targets of the ``call_module`` nodes
    of its fx graph and, recursively, of the graphs of the modules they call (``pipeline()``'s
    stage modules are ``GraphModule`` objects whose submodules are ``InterpreterModule``
    objects, each with its graph); every descendant of a called module that has no graph (it
    runs its own ``forward``). ``None`` if the stage module has no fx graph.

    A stage module can hold modules it never calls: ``pipeline()`` replicates a tied parameter
    (GPT-2's ``lm_head.weight`` = ``transformer.wte.weight``) into every stage that uses it,
    and a stage that uses it as ``transformer.wte`` also gets a plain ``lm_head`` module
    holding the copy under its other name (torch 2.13, ``MultiUseParameterConfig.REPLICATE``).
    """
    if not isinstance(getattr(stage_module, "graph", None), torch.fx.Graph):
        return None
    out: set[str] = set()
    todo = [(stage_module, "")]
    while todo:
        mod, prefix = todo.pop()
        for node in mod.graph.nodes:
            if node.op != "call_module":
                continue
            fqn = prefix + str(node.target)
            sub = mod.get_submodule(str(node.target))
            out.add(fqn)
            if isinstance(getattr(sub, "graph", None), torch.fx.Graph):
                todo.append((sub, fqn + "."))
            else:
                out.update(f"{fqn}.{n}" for n, _ in sub.named_modules() if n)
    return out


def stage_membership(stage_module: torch.nn.Module, names) -> list[str]:
    """The names among ``names`` (module FQNs) that a stage module runs
    (:func:`called_modules`), in ``names``' order; every one it holds if it is not an fx graph.
    A module it holds without running it is in :func:`held_not_run`."""
    run = called_modules(stage_module)
    held = {n for n, _ in stage_module.named_modules()} if run is None else run
    return [n for n in names if n in held]


def held_not_run(stage_module: torch.nn.Module, names) -> list[str]:
    """The names among ``names`` that a stage module holds (``named_modules()``) but never runs
    (:func:`called_modules`), in ``names``' order: e.g. the holder of a tied parameter's copy."""
    run = called_modules(stage_module)
    if run is None:
        return []
    held = {n for n, _ in stage_module.named_modules()}
    return [n for n in names if n in held and n not in run]


def pipe_stages(pipe, names) -> list[list[str]]:
    """Stage membership of every stage of a ``Pipe``: :func:`stage_membership` of each."""
    return [stage_membership(pipe.get_stage_module(i), names) for i in range(pipe.num_stages)]


def module_ties(module: torch.nn.Module, stages) -> list[dict]:
    """The parameters that two or more of the stages' layers share, read off ``module``:
    ``[{"name", "aliases", "layers", "stages"}]`` as
    :func:`pipeopt.export.layout.shared_parameters` gives them from a profiled graph
    (``stages``: lists of layer FQNs; a layer is a module of ``module``)."""
    users: dict = {}
    names: dict = {}
    for s, layers in enumerate(stages):
        for layer in layers:
            for pname, p in module.get_submodule(str(layer)).named_parameters(remove_duplicate=False):
                full = f"{layer}.{pname}"
                if full not in names.setdefault(id(p), []):
                    names[id(p)].append(full)
                users.setdefault(id(p), {}).setdefault(str(layer), s)
    return [{"name": names[k][0], "aliases": names[k][1:], "layers": list(u), "stages": sorted(set(u.values()))}
            for k, u in users.items() if len(u) > 1]


def tie_holders(exported: dict) -> list[list[str]]:
    """Per stage of a torch export, the layers a stage may hold without running them: the
    layers of every tied parameter the export shares onto that stage
    (``exported["shared_parameters"]``, :func:`pipeopt.export.layout.shared_parameters`),
    whose modules ``pipeline()`` builds into each stage using the tie (:func:`called_modules`)."""
    out: list[set] = [set() for _ in range(int(exported["num_stages"]))]
    for tie in exported.get("shared_parameters") or ():
        for s in tie.get("stages", ()):
            if 0 <= s < len(out):
                out[s].update(str(n) for n in tie.get("layers", ()))
    return [sorted(s) for s in out]


# ---- activation recomputation ------------------------------------------------------------------
RECOMPUTE_RUNS = ("full", "selective")
"""The recomputation modes (:data:`pipeopt.plan.RECOMPUTE_MODES`) a run applies: ``"full"``,
the layer's forward under ``torch.utils.checkpoint``, and ``"selective"``, the same with
torchtitan's per-operator policy (:mod:`pipeopt.torch.recompute`, as the profile measures it)."""


def recompute_modes(plan: Plan) -> dict:
    """The plan's recompute set, ``{layer FQN: mode}`` over all its stages
    (:attr:`pipeopt.plan.Stage.recompute`), checked before any process starts.

    Raises
    ------
    InvalidPlanError
        If a stage recomputes a layer it does not run (naming both).
    UnsupportedPlanError
        If a layer's mode is not in :data:`RECOMPUTE_RUNS` (the message names the layers).
    """
    from ..errors import InvalidPlanError, UnsupportedPlanError

    modes: dict = {}
    for s, st in enumerate(plan.stages):
        for name, mode in (st.recompute or {}).items():
            if name not in st.layers:
                raise InvalidPlanError(f"stage {s} recomputes layer {name!r}, which it does not run")
            modes[str(name)] = mode
    other = sorted(n for n, m in modes.items() if m not in RECOMPUTE_RUNS)
    if other:
        raise UnsupportedPlanError(
            f"pipeopt run applies recomputation {RECOMPUTE_RUNS} only; layer(s) {_span(other)} ask for "
            f"{modes[other[0]]!r}: set them to one of those or drop them from the stage's recompute")
    return modes


def stage_modes(modes: dict, stages) -> list[dict]:
    """:func:`recompute_modes` split by stage: for each stage of ``stages`` (lists of layer
    FQNs, the export's ``stages``), the modes of its own layers. A stage process applies only
    its stage's: a module another stage also holds (a tied weight's) is not recomputed there."""
    return [{n: modes[n] for n in st if n in modes} for st in stages]


def apply_recompute(stage_module: torch.nn.Module, names, modes: dict, *, once: bool = False) -> dict:
    """Make the layers of ``modes`` that ``stage_module`` holds recompute their activations, and
    count every layer's forward runs.

    Each layer of ``names`` held by the stage module (:func:`stage_membership`) gets an
    instance ``forward`` that counts a run and calls the module's own; a layer of ``modes``
    runs that counting forward under ``torch.utils.checkpoint.checkpoint(...,
    use_reentrant=False)`` (:func:`pipeopt.torch.recompute.checkpointed`; ``"selective"`` with
    its per-operator policy): autograd keeps only the layer's inputs (and, selective, the
    outputs the policy saves), and the backward reruns the forward (a second count) before it
    needs the layer's saved tensors. torch's ``pipeline()`` keeps each module as a submodule the stage's
    graph calls (``call_module``), so the layer is wrapped where the stage calls it, its FQN
    unchanged (torchtitan likewise applies its ``apply_ac`` to each transformer block of each
    stage's model part, after the pipeline split: its ``parallelize_fn`` runs on every one of
    ``model_parts``). Wrapping the model's modules before ``pipeline()``
    does not work: its ``torch.export`` trace runs through the checkpoint, and the stage
    module holds plain ATen operators again (torch 2.13: nothing is recomputed).

    Parameters
    ----------
    stage_module
        A stage module (``Pipe.get_stage_module``), changed in place.
    names
        Layer FQNs (the plan's layers).
    modes
        ``{layer: mode}``: the stage's own (:func:`stage_modes`); layers the stage does not hold
        are ignored.
    once
        For an order whose backward is split into I and W: a ``"full"`` layer reruns its
        forward once per microbatch, before I, and keeps the rerun's tensors until its W
        (:func:`pipeopt.torch.recompute.rerun_once`), as the cost model charges it; torch's
        checkpoint would rerun it in I and again for every parameter group of W.

    Returns
    -------
    dict
        ``{layer: [calls, runs]}`` for the stage's layers: the times the stage called the layer
        and the times its forward ran (a recomputed one once more per backward that reruns it).
    """
    from .recompute import checkpointed

    calls: dict = {}
    for name in stage_membership(stage_module, names):
        sub = stage_module.get_submodule(name)
        count = calls[name] = [0, 0]

        def counted(*args, _own=sub.forward, _count=count, **kwargs):
            _count[1] += 1
            return _own(*args, **kwargs)

        if modes.get(name) in RECOMPUTE_RUNS:
            def forward(*args, _fn=checkpointed(counted, modes[name], once=once), _count=count, **kwargs):
                _count[0] += 1
                return _fn(*args, **kwargs)
        else:
            def forward(*args, _fn=counted, _count=count, **kwargs):
                _count[0] += 1
                return _fn(*args, **kwargs)
        sub.forward = forward
    return calls


def recompute_report(calls: dict, modes: dict, steps: int, microbatches: int) -> dict:
    """What a stage process reports of :func:`apply_recompute`'s counts over ``steps``
    iterations of ``microbatches``: ``recomputed`` (the stage's layers run under checkpoint, in
    stage order), ``forward_runs`` (per layer, its forward's runs per microbatch: 2 for a layer
    recomputed once, 1 for another) and ``recomputations`` (per layer, the runs beyond the
    stage's calls, per microbatch: 1 where the backward reran the forward once, 0 where nothing
    was recomputed)."""
    per = max(steps * microbatches, 1)
    return {"recomputed": [n for n in calls if modes.get(n) in RECOMPUTE_RUNS],
            "forward_runs": {n: c[1] / per for n, c in calls.items()},
            "recomputations": {n: (c[1] - c[0]) / per for n, c in calls.items()}}


# ---- the run ----------------------------------------------------------------------------------
@dataclass
class RunReport:
    """What a real run measured.

    Attributes
    ----------
    schedule, microbatches, iterations, warmup
        As run.
    stages
        ``list[list[str]]``: the layer names each rank's stage module runs (as built,
        :func:`stage_membership`).
    planned
        ``list[list[str]]``: the plan's stages (execution order).
    times
        ``list[float]``: seconds of each timed iteration (the slowest rank's, barriers
        included).
    barrier
        Median seconds of the barrier pair alone (the timing's own overhead).
    predicted
        pipeopt's iteration time for the plan (:func:`prediction`), seconds, or ``None``.
    wall
        Seconds of the whole run (spawn to join).
    """

    schedule: str
    microbatches: int
    iterations: int
    warmup: int
    stages: list
    planned: list
    times: list
    barrier: float
    predicted: float | None = None
    wall: float = 0.0
    info: dict = field(default_factory=dict)
    ranks: int | None = None
    """Processes (pipeline ranks); ``None``: one per stage."""
    recomputed: list | None = None
    """``list[list[str]]``: per stage, the layers run under ``torch.utils.checkpoint``
    (:func:`apply_recompute`); ``None``: the plan recomputes nothing. ``info["forward_runs"]``
    and ``info["recomputations"]`` hold, per stage, every layer's forward runs and reruns per
    microbatch (:func:`recompute_report`). ``info["per_rank_cpu"]`` (one stage per rank):
    each rank's process CPU seconds of every timed iteration (``time.process_time``; it does
    not grow while the process waits for a core, unlike the wall-clock times)."""
    held: list | None = None
    """``list[list[str]]``: per stage, the plan's layers its stage module holds but never runs
    (:func:`held_not_run`: a tied parameter's copy); ``None``: not recorded."""
    tied: list | None = None
    """``list[list[str]]``: per stage, the layers it may hold that way: those of the ties the
    export shares onto it (:func:`tie_holders`). Any other module held is a difference."""

    @property
    def iteration(self) -> float:
        """Median measured seconds per iteration."""
        return statistics.median(self.times)

    @property
    def per_microbatch(self) -> float:
        """Median seconds per iteration / M."""
        return self.iteration / self.microbatches

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured, or ``None`` without a prediction."""
        if self.predicted is None:
            return None
        return (self.predicted - self.iteration) / self.iteration

    @property
    def membership_matches(self) -> bool:
        """Whether the stages built are the plan's."""
        return not self.differing_stages

    @property
    def differing_stages(self) -> list[int]:
        """Indices of the stages whose built modules are not the plan's (every index of the
        longer list past the shorter one included when the stage counts differ)."""
        built, planned = [sorted(s) for s in self.stages], [sorted(s) for s in self.planned]
        return [i for i in range(max(len(built), len(planned)))
                if i >= len(built) or i >= len(planned) or built[i] != planned[i] or self._unexplained(i)]

    def _unexplained(self, i: int) -> list[str]:
        """The layers stage ``i`` holds without running them that no tie of the plan explains."""
        held = self.held[i] if self.held is not None and i < len(self.held) else []
        allowed = set(self.tied[i]) if self.tied is not None and i < len(self.tied) else set()
        return [n for n in held if n not in allowed]

    def membership_message(self) -> str:
        """What differs between the built stages and the plan, stage by stage ("" if nothing)."""
        parts = []
        for i in self.differing_stages:
            built = set(self.stages[i]) if i < len(self.stages) else set()
            planned = set(self.planned[i]) if i < len(self.planned) else set()
            extra, missing = sorted(built - planned), sorted(planned - built)
            stray = self._unexplained(i)
            parts.append(f"stage {i}" + (f" also built {_span(extra)}" if extra else "")
                         + (f" lacks {_span(missing)}" if missing else "")
                         + (f" holds {_span(stray)} without running it (no tie of the plan)" if stray else ""))
        return "; ".join(parts)

    def summary(self) -> str:
        """A few lines for the terminal."""
        lines = [
            f"{self.schedule}, M = {self.microbatches}, {len(self.stages)} stages on {self.ranks or len(self.stages)} CPU "
            f"processes (gloo, 1 thread each), {self.iterations} timed iterations after {self.warmup} warm-up",
            f"  measured  {self.iteration * 1e3:9.3f} ms per iteration (median; min {min(self.times) * 1e3:.3f}, "
            f"max {max(self.times) * 1e3:.3f}), {self.per_microbatch * 1e3:.3f} ms per microbatch; "
            f"barrier pair {self.barrier * 1e3:.3f} ms",
        ]
        if self.predicted is not None:
            how = self.info.get("predictor") or f"pipeopt.evaluate, objective {OBJECTIVE.get(self.schedule)}"
            lines.append(f"  predicted {self.predicted * 1e3:9.3f} ms per iteration ({how}), "
                         f"{self.predicted / self.microbatches * 1e3:.3f} ms per microbatch; error {self.error:+.1%}")
        cpu = [c for c in self.info.get("per_rank_cpu") or [] if c]
        if cpu:  # CPU time does not grow while a process waits for a core: a check on a loaded machine
            lines.append("  CPU time per iteration (process time, median) by rank: "
                         + ", ".join(f"{statistics.median(c) * 1e3:.3f} ms" for c in cpu))
        cores = self.info.get("cores")
        if cores:
            lines.append(f"  {cores['warning'] or cores['text']}")
        for i, st in enumerate(self.stages):
            held = self.held[i] if self.held is not None and i < len(self.held) else []
            lines.append(f"  stage {i} built: {_span(st)}"
                         + (f" (also holds {_span(held)} without running it)" if held else ""))
        if self.recomputed is not None:
            again = self.info.get("recomputations") or [{} for _ in self.recomputed]
            for i, rc in enumerate(self.recomputed):
                told = ", ".join(f"{n} ({again[i].get(n, 0):.2f})" for n in rc) if rc else "nothing"
                lines.append(f"  stage {i} recomputed (torch.utils.checkpoint; forward reruns per microbatch): {told}")
            idle = [n for i, rc in enumerate(self.recomputed) for n in rc if again[i].get(n, 0) == 0]
            if idle:
                lines.append(f"  WARNING: recomputed layer(s) {_span(idle)} never reran their forward: the stage does "
                             "not call them as modules, their recomputation did not apply")
            more = [n for i, rc in enumerate(self.recomputed) for n in rc if again[i].get(n, 0) > 1 + 1e-9]
            if more:
                lines.append(f"  NOTE: layer(s) {_span(more)} reran their forward more than once per microbatch: "
                             "torch's split backward computes the weight gradients (W) one parameter group at a "
                             "time, each rerunning the checkpointed forward; the prediction counts one rerun, "
                             "before I")
        synced = self.info.get("tie_sync") or []
        if any(synced):
            lines.append("  tied gradients all-reduced after each iteration's flush: "
                         + "; ".join(f"{'stage' if self.ranks is None else 'rank'} {i}: {', '.join(n)}"
                                   for i, n in enumerate(synced) if n))
        lines.append("  stage membership = plan" if self.membership_matches
                     else "  stage membership DIFFERS from the plan: " + self.membership_message())
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready dict (seconds)."""
        return {
            "schedule": self.schedule,
            "microbatches": self.microbatches,
            "iterations": self.iterations,
            "warmup": self.warmup,
            "measured_iteration": self.iteration,
            "measured_per_microbatch": self.per_microbatch,
            "times": list(self.times),
            "barrier": self.barrier,
            "predicted_iteration": self.predicted,
            "error": self.error,
            "stages": self.stages,
            "planned": self.planned,
            "membership_matches": self.membership_matches,
            "differing_stages": self.differing_stages,
            "held": self.held,
            "wall": self.wall,
            "ranks": self.ranks or len(self.stages),
            "recomputed": self.recomputed,
            "info": self.info,
        }


def _load() -> float | None:
    """The 1-minute load average (``os.getloadavg``), or ``None`` where the system has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


BUSY_WINDOW = 0.5
"""Seconds over which :func:`free_cores` samples the cores' busy time before a run."""


def _busy_now(cores, window: float = BUSY_WINDOW) -> float | None:
    """Cores busy now: the busy share of each of ``cores`` (CPU numbers) over ``window``
    seconds, summed, from two readings of Linux's ``/proc/stat`` (idle and iowait count as
    free; steal, a virtual machine's host running another guest, as busy); ``None`` where
    there is no ``/proc/stat`` or it names none of the cores."""
    def read() -> dict:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3:4].isdigit():
                    name, *vals = line.split()
                    v = [int(x) for x in vals[:8]]  # user nice system idle iowait irq softirq steal
                    out[int(name[3:])] = (sum(v), v[3] + v[4])
        return out

    try:
        first = read()
        time.sleep(window)
        second = read()
    except (OSError, ValueError, IndexError):
        return None
    busy, seen = 0.0, False
    for c in cores:
        if c in first and c in second and second[c][0] > first[c][0]:
            total, idle = second[c][0] - first[c][0], second[c][1] - first[c][1]
            busy += min(max(1.0 - idle / total, 0.0), 1.0)
            seen = True
    return busy if seen else None


def free_cores(processes: int) -> dict:
    """The cores a run of ``processes`` processes (one thread each) can expect, checked before
    it starts: the cores this process may run on (``os.sched_getaffinity``, else
    ``os.cpu_count``) less those busy now (:func:`_busy_now`: sampled over
    :data:`BUSY_WINDOW` seconds; where it cannot be sampled, the 1-minute load average,
    ``os.getloadavg``), rounded to the nearest whole core and at least 0. The cost model
    assumes one free core per stage process; fewer make the measured time longer than
    predicted, with no fault of the plan.

    Why a sample and not the load average: the load average trails by a minute, so right after
    a profile or another run (``pipeopt profile`` then ``pipeopt run``) it counted their
    finished processes, and an idle 2-core machine read "1 free for 2 stage processes".

    Returns
    -------
    dict
        ``cores`` (usable cores), ``busy`` (cores busy now, or ``None``), ``load`` (1-minute
        load average, or ``None``), ``free``, ``processes``, ``text`` (one line) and
        ``warning`` (the line to print when the processes outnumber the free cores, else ``""``).
    """
    try:
        usable = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = list(range(os.cpu_count() or 1))
    cores = len(usable)
    load = _load()
    busy = _busy_now(usable)
    taken = busy if busy is not None else load
    free = cores if taken is None else max(int(cores - taken + 0.5), 0)
    load_text = f"1-minute load average {'unknown' if load is None else f'{load:.2f}'}"
    text = (f"{cores} usable cores, "
            + (f"{busy:.2f} busy over {BUSY_WINDOW:g} s ({load_text})" if busy is not None else load_text)
            + f" before the run: {free} free for {processes} stage processes")
    warning = ""
    if processes > free:
        warning = (f"WARNING: {processes} stage processes but {free} free cores ({text}): the measured time includes "
                   "waiting for a core, which the prediction does not model")
    return {"cores": cores, "busy": busy, "load": load, "free": free, "processes": processes, "text": text,
            "warning": warning}


def _span(names: list) -> str:
    if len(names) <= 4:
        return ", ".join(names)
    return f"{len(names)} layers [{names[0]}, {names[1]} .. {names[-1]}]"


def prediction(instance, plan: Plan, schedule: str, microbatches: int) -> float:
    """pipeopt's predicted seconds per iteration of ``plan``: :func:`pipeopt.evaluate` with the
    schedule's objective (``iteration`` for 1F1B with a flush, ``gpipe``) and M microbatches.

    A plan without devices (an exported or hand-written one) is placed on the cluster's
    devices in order, one per stage, as the run places stage i on rank i (its recompute sets
    kept).
    """
    from ..cost import evaluate

    inst = instance.with_settings(objective=OBJECTIVE[_schedule(schedule)], microbatches=microbatches)
    if any(not st.devices for st in plan.stages):
        names = [d.name for d in inst.cluster.devices]
        plan = Plan(tuple(dataclasses.replace(st, devices=(names[i % len(names)],), replicas=1)
                          for i, st in enumerate(plan.stages)))
    return evaluate(inst, plan).objective


def _schedule(schedule: str) -> str:
    """``"1f1b"`` or ``"gpipe"`` for any spelling of those two schedules
    (:func:`pipeopt.schedules.schedule_name`); another schedule is refused with the choices."""
    from ..schedules.names import schedule_key

    return schedule_key(schedule, among=("GPipe", "1F1B"), where="by pipeopt run")


def _count(value, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidProblemError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def run_plan(
    plan: Plan,
    model: str | Callable,
    *,
    model_kwargs: dict | None = None,
    instance=None,
    schedule: str | None = None,
    microbatches: int | None = None,
    iterations: int = 5,
    warmup: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    order=None,
) -> RunReport:
    """Run ``plan`` on ``torch.distributed.pipelining`` with one CPU process per stage, or - for
    an action order - one per rank (module docstring).

    Parameters
    ----------
    plan
        A plan whose layers are the model's module FQNs (S stages: S processes).
    model
        A shipped model's name (:data:`pipeopt.torch.models.MODELS`), ``"package.module:factory"``
        (:func:`pipeopt.torch.models.load`), or a picklable factory (a module-level function)
        returning ``(module, example_inputs)``; ``example_inputs`` is one microbatch (the one
        the profile was measured with). Every process builds it with the same arguments.
    model_kwargs
        Keyword arguments of the factory.
    instance
        The profiled instance of the model, or ``None``: gives the execution order for the
        export and, if given, the prediction (:func:`prediction`).
    schedule
        ``"1f1b"`` (``Schedule1F1B``, the default) or ``"gpipe"`` (``ScheduleGPipe``), any
        spelling of :func:`pipeopt.schedules.schedule_name`; refused beside an order.
    order
        ``None``, a :class:`pipeopt.schedules.Schedule`, or the path of a torch compute-only
        CSV (:func:`pipeopt.export.torch_csv.read_csv`): the action order to run, instead of
        ``plan.schedule``. With an order (or ``plan.schedule``) the run is torch's
        ``_PipelineScheduleRuntime`` over that order, M is the order's microbatches, and the
        prediction is :func:`pipeopt.schedules.run_schedule`.
    microbatches
        M, microbatches per iteration (the batch is M copies of the example microbatch);
        default the instance's ``settings.microbatches``, else
        :data:`pipeopt.units.DEFAULT_MICROBATCHES` (the one rule).
    iterations, warmup
        Timed and untimed iterations.
    timeout
        Seconds for the whole run.

    Returns
    -------
    RunReport

    Raises
    ------
    InvalidProblemError
        Unknown schedule or model, counts out of range, a schedule named beside an order.
    InvalidPlanError
        A broken order (the first broken action named: a missing action, a backward before
        its forward, a cycle of waits between ranks), or one of another number of stages or
        microbatches than the plan's; checked before any process starts.
    ReadError
        An order CSV that cannot be read or holds a cell that is not an action.
    UnsupportedPlanError
        If torch.distributed.pipelining cannot express the plan (:mod:`pipeopt.export`), or it
        replicates stages (the run has no data-parallel dimension).
    PipelineRunError
        If a stage process raises or the run exceeds ``timeout`` (the message names the rank
        and quotes its error).
    """
    from ..errors import UnsupportedPlanError

    if order is not None or plan.schedule is not None:
        if schedule is not None:
            raise InvalidProblemError(f"the plan runs its own action order; drop the schedule {schedule!r}")
        return _run_order(plan, model, order, model_kwargs=model_kwargs, instance=instance,
                          microbatches=microbatches, iterations=iterations, warmup=warmup, timeout=timeout)
    schedule = _schedule("1f1b" if schedule is None else schedule)
    from ..export.layout import plan_ranks

    ranks = plan_ranks(plan)
    if ranks is not None and ranks < plan.num_stages:
        raise UnsupportedPlanError(
            f"the plan puts {plan.num_stages} stages (chunks) on {ranks} ranks; {schedule} runs one stage per "
            "process. Run it in its order: --order FILE.csv (pipeopt export PLAN --to torch-csv --schedule NAME "
            "--out FILE.json writes one)"
        )
    if microbatches is None:
        from ..units import DEFAULT_MICROBATCHES

        microbatches = instance.settings.microbatches if instance is not None else DEFAULT_MICROBATCHES
    microbatches = _count(microbatches, "microbatches", 1)
    iterations = _count(iterations, "iterations", 1)
    warmup = _count(warmup, "warmup", 0)
    modes = recompute_modes(plan)
    exported, names = _export_for_run(plan, model, model_kwargs, instance)
    predicted = prediction(instance, plan, schedule, microbatches) if instance is not None else None
    world = exported["num_stages"]
    job = {
        "model": model,
        "model_kwargs": dict(model_kwargs or {}),
        "exported": exported,
        "names": names,
        "schedule": schedule,
        "microbatches": microbatches,
        "iterations": iterations,
        "warmup": warmup,
        "timeout": timeout,
        "recompute": stage_modes(modes, exported["stages"]),
    }
    cores = free_cores(world)
    started = time.perf_counter()
    results = _spawn(world, job, timeout)
    wall = time.perf_counter() - started
    times = [max(r["times"][k] for r in results) for k in range(iterations)]
    return RunReport(
        schedule=schedule,
        microbatches=microbatches,
        iterations=iterations,
        warmup=warmup,
        stages=[r["stage"] for r in results],
        held=[r.get("held", []) for r in results],
        tied=tie_holders(exported),
        planned=[list(s) for s in exported["stages"]],
        times=times,
        barrier=statistics.median(max(r["barrier"][k] for r in results) for k in range(len(results[0]["barrier"]))),
        predicted=predicted,
        wall=wall,
        recomputed=[r["recompute"]["recomputed"] for r in results] if modes else None,
        info={"cores": {**cores, "load_after": _load()},
              "trace_seconds": max(r["trace"] for r in results), "split_spec": exported["split_spec"],
              "torch_version": torch.__version__, "per_rank_times": [r["times"] for r in results],
              "tie_sync": [r.get("tie_sync", []) for r in results],
              "per_rank_cpu": [r.get("cpu", []) for r in results],
              "pinned": pins(world),
              **_counts([r["recompute"] for r in results] if modes else [])},
    )


def _resolve_order(plan: Plan, order, microbatches):
    """The order to run: ``order`` (a Schedule or a CSV path) or the plan's own, checked
    against the plan (:func:`pipeopt.export.torch_csv.check_order`)."""
    from ..errors import InvalidPlanError
    from ..export.torch_csv import check_order, order_for, read_csv
    from ..schedules.actions import Schedule

    if order is None:
        out = order_for(plan, microbatches=microbatches)
    else:
        if isinstance(order, Schedule):
            check_order(order, label=order.name)
            out = order
        else:
            out = read_csv(order, name=os.path.basename(str(order)), microbatches=microbatches)
        if out.stages != plan.num_stages:
            raise InvalidPlanError(f"the order {out.name} runs {out.stages} stages on {out.ranks} ranks; the plan has "
                                   f"{plan.num_stages} stages")
    if microbatches is not None and microbatches != out.microbatches:
        raise InvalidPlanError(f"the order {out.name} runs {out.microbatches} microbatches, not {microbatches}")
    return out


def order_prediction(instance, plan: Plan, order) -> float:
    """pipeopt's predicted seconds per iteration of ``plan`` run in ``order``: the executor
    (:func:`pipeopt.schedules.run_schedule`). A plan without devices is placed as the run
    places it: the stages of rank r on the cluster's r-th device (recompute sets kept)."""
    from ..schedules import run_schedule

    if any(not st.devices for st in plan.stages):
        names = [d.name for d in instance.cluster.devices]
        plan = Plan(tuple(dataclasses.replace(st, devices=(names[order.placement[s] % len(names)],))
                          for s, st in enumerate(plan.stages)), plan.schedule)
    return run_schedule(instance, order, plan).time


def _run_order(plan: Plan, model, order, *, model_kwargs, instance, microbatches, iterations, warmup,
               timeout) -> RunReport:
    """:func:`run_plan` for an action order: checked, then one process per rank running torch's
    ``_PipelineScheduleRuntime`` over the order's CSV."""
    from ..export.torch_csv import to_csv

    order = _resolve_order(plan, order, microbatches)
    iterations = _count(iterations, "iterations", 1)
    warmup = _count(warmup, "warmup", 0)
    modes = recompute_modes(plan)
    exported, names = _export_for_run(plan, model, model_kwargs, instance)
    predicted = order_prediction(instance, plan, order) if instance is not None else None
    fd, csv_path = tempfile.mkstemp(prefix="pipeopt-order-", suffix=".csv")
    with os.fdopen(fd, "w") as fh:
        fh.write(to_csv(order))
    job = {
        "model": model,
        "model_kwargs": dict(model_kwargs or {}),
        "exported": exported,
        "names": names,
        "schedule": order.name,
        "microbatches": order.microbatches,
        "iterations": iterations,
        "warmup": warmup,
        "timeout": timeout,
        "csv": csv_path,
        "stages_on": [list(order.stages_on(r)) for r in range(order.ranks)],
        "recompute": stage_modes(modes, exported["stages"]),
        "once": order.splits_backward,  # a full recomputation reruns once per microbatch (apply_recompute)
    }
    cores = free_cores(order.ranks)
    started = time.perf_counter()
    try:
        results = _spawn(order.ranks, job, timeout)
    finally:
        os.unlink(csv_path)
    wall = time.perf_counter() - started
    times = [max(r["times"][k] for r in results) for k in range(iterations)]
    built: dict = {}
    held: dict = {}
    counted: dict = {}
    for r in results:
        built.update(zip(r["stage_ids"], r["stages"]))
        held.update(zip(r["stage_ids"], r.get("held") or [[] for _ in r["stage_ids"]]))
        counted.update(zip(r["stage_ids"], r["recompute"]))
    counted_list = [counted[s] for s in range(order.stages)] if modes else []
    return RunReport(
        schedule=order.name,
        microbatches=order.microbatches,
        iterations=iterations,
        warmup=warmup,
        stages=[built[s] for s in range(order.stages)],
        held=[held[s] for s in range(order.stages)],
        tied=tie_holders(exported),
        planned=[list(s) for s in exported["stages"]],
        times=times,
        barrier=statistics.median(max(r["barrier"][k] for r in results) for k in range(len(results[0]["barrier"]))),
        predicted=predicted,
        wall=wall,
        ranks=order.ranks,
        recomputed=[c["recomputed"] for c in counted_list] if modes else None,
        info={"cores": {**cores, "load_after": _load()},
              "trace_seconds": max(r["trace"] for r in results), "split_spec": exported["split_spec"],
              "torch_version": torch.__version__, "per_rank_times": [r["times"] for r in results],
              "tie_sync": [r.get("tie_sync", []) for r in results],
              "per_rank_cpu": [r.get("cpu", []) for r in results],
              "pinned": pins(order.ranks),
              **_counts(counted_list),
              "order": order.to_dict(), "placement": list(order.placement),
              "runtime": "torch.distributed.pipelining._PipelineScheduleRuntime (_load_csv, compute_only)",
              "predictor": "pipeopt.schedules.run_schedule, the executor, on the same order"},
    )


def _spawn(world: int, job: dict, timeout: float) -> list[dict]:
    """Start ``world`` stage processes, collect their results (rank order) or fail naming one."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results: queue_mod.Queue = ctx.Queue()
    fd, store = tempfile.mkstemp(prefix="pipeopt-run-")
    os.close(fd)
    os.unlink(store)  # the file store creates it
    procs = [ctx.Process(target=_worker, args=(rank, world, store, job, results), daemon=True)
             for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    out: dict = {}
    try:
        while len(out) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PipelineRunError(f"the pipeline run did not finish within {timeout:g} s "
                                       f"(ranks {sorted(set(range(world)) - set(out))} still running)")
            try:
                msg = results.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead:
                    raise PipelineRunError(f"stage process {dead[0]} died with exit code "
                                           f"{procs[dead[0]].exitcode} before reporting") from None
                continue
            if "error" in msg:
                raise PipelineRunError(f"stage process {msg['rank']} failed: {msg['error']}")
            out[msg["rank"]] = msg
    finally:
        for p in procs:
            p.join(timeout=5.0)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        if os.path.exists(store):
            os.unlink(store)
    return [out[r] for r in range(world)]


def _factory(job: dict):
    if isinstance(job["model"], str):
        from .models import load

        return load(job["model"], **job["model_kwargs"])
    return job["model"](**job["model_kwargs"])


def _worker(rank: int, world: int, store: str, job: dict, results) -> None:
    """One stage process (module-level: spawn pickles it by reference)."""
    import torch.distributed as dist

    try:
        torch.set_num_threads(1)
        pin_rank(rank, world)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=job["timeout"]))
        try:
            run = job.get("run") or (_order_run if "csv" in job else _stage_run)  # "run": another measurement
            results.put(run(rank, world, job))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises
        tb = traceback.format_exc(limit=6).strip().splitlines()
        results.put({"rank": rank, "error": f"{type(exc).__name__}: {exc}"[:500] + " | " + " / ".join(tb[-3:])})


PIN_ENV = "PIPEOPT_PIN_RANKS"
"""Environment variable choosing whether each stage process pins itself to one core
(:func:`pin_rank`): unset or ``auto`` (the default) pins when the run's processes are no more
than the cores this process may use, ``1`` always pins (core ``rank mod cores``), ``0`` never."""


def pins(world: int) -> bool:
    """Whether a run of ``world`` stage processes pins them (:data:`PIN_ENV`; Linux only)."""
    setting = os.environ.get(PIN_ENV, "auto")
    if setting == "0" or not hasattr(os, "sched_setaffinity"):
        return False
    return setting == "1" or world <= len(os.sched_getaffinity(0))


def pin_rank(rank: int, world: int) -> int | None:
    """Pin this stage process (of ``world``) to core ``rank mod cores`` when :func:`pins` says
    so (Linux ``sched_setaffinity``); returns the core, or ``None`` when not pinned.

    Why (measured, benchmarks/results/notes/torch_pipeline.md, "Where the S = 2 GPT runs lose
    time"): a stage process sleeps in gloo's receive between its actions and may wake on the
    other core, with its weights no longer in that core's cache; the layers' forward then costs
    10-30 % more CPU than profiled, which a whole model in one process (never waiting) does
    not pay. On the shipped GPT at S = 2 (quiet 2-core machine) pinning took the exact split's
    error from -12.4 % to -2.9 %.
    """
    if not pins(world):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def _order_run(rank: int, world: int, job: dict) -> dict:
    """One rank of an order run: its stages, torch's ``_PipelineScheduleRuntime`` loading the
    order's CSV, the timed iterations (as :func:`_stage_run`)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    module, example = _factory(job)
    example = tuple(example)
    m = job["microbatches"]
    t0 = time.perf_counter()
    pipe = build_pipe(module, example, job["exported"])
    trace_s = time.perf_counter() - t0
    mine = job["stages_on"][rank]
    mods = [pipe.get_stage_module(s) for s in mine]
    modes = [job["recompute"][s] for s in mine]
    counting = any(job["recompute"])  # every stage counts when the plan recomputes anything
    calls = [apply_recompute(mod, job["names"], md, once=job.get("once", False)) if counting else {}
             for mod, md in zip(mods, modes, strict=True)]
    stages = [PipelineStage(mod, s, pipe.num_stages, torch.device("cpu")) for s, mod in zip(mine, mods, strict=True)]
    sched = _PipelineScheduleRuntime(stages, m, loss_fn=_sum_loss)
    sched._load_csv(job["csv"])
    batch = tuple(torch.cat([x] * m) if isinstance(x, torch.Tensor) else x for x in example)
    target = torch.zeros(m * (example[0].shape[0] if isinstance(example[0], torch.Tensor) else 1))
    first, last = 0 in mine, pipe.num_stages - 1 in mine
    placement = {s: r for r, on in enumerate(job["stages_on"]) for s in on}
    syncs = order_tie_syncs(dict(zip(mine, mods, strict=True)), placement, rank,
                            job["exported"].get("shared_parameters") or ())
    cpu: list = []

    def step() -> None:
        c0 = time.process_time()
        args = batch if first else ()
        if last:
            sched.step(*args, target=target)
        else:
            sched.step(*args)
        sync_ties(syncs)
        cpu.append(time.process_time() - c0)

    def zero() -> None:
        for mod in mods:
            mod.zero_grad(set_to_none=True)

    times, barrier = _timed(step, zero, job, reset=lambda: _reset_counts(calls))
    steps = job["iterations"]  # the counts cover the timed iterations (_timed resets them after the warm-up)
    return {"rank": rank, "times": times, "barrier": barrier, "trace": trace_s, "stage_ids": mine,
            "stages": [stage_membership(mod, job["names"]) for mod in mods],
            "held": [held_not_run(mod, job["names"]) for mod in mods],
            "tie_sync": [name for name, _, _ in syncs], "cpu": cpu[len(cpu) - steps:],
            "recompute": [recompute_report(c, md, steps, m) for c, md in zip(calls, modes, strict=True)]}


def _reset_counts(calls) -> None:
    """Set :func:`apply_recompute`'s counts (a dict, or a list of them) back to 0 in place."""
    for c in calls if isinstance(calls, list) else [calls]:
        for count in c.values():
            count[0] = count[1] = 0


def _timed(step, zero, job: dict, reset=None) -> tuple[list, list]:
    """``warmup`` untimed steps, ``iterations`` timed ones between barriers, the barrier pair
    alone (module docstring). ``reset`` (if given) is called after the warm-up when there is
    one: the recompute counts then cover the timed iterations only, not torch's first step,
    which also runs a forward and an input-gradient backward of each stage to infer shapes
    (``_PipelineScheduleRuntime``'s ``_backward_metadata_inference``)."""
    import torch.distributed as dist

    for _ in range(job["warmup"]):
        step()
        zero()
    if reset is not None and job["warmup"]:
        reset()
    times, barrier = [], []
    for _ in range(job["iterations"]):
        dist.barrier()
        a = time.perf_counter()
        step()
        dist.barrier()
        times.append(time.perf_counter() - a)
        zero()
    for _ in range(max(3, job["iterations"])):
        dist.barrier()
        a = time.perf_counter()
        dist.barrier()
        barrier.append(time.perf_counter() - a)
    return times, barrier


def _stage_run(rank: int, world: int, job: dict) -> dict:
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, build_stage

    module, example = _factory(job)
    example = tuple(example)
    m = job["microbatches"]
    t0 = time.perf_counter()
    pipe = build_pipe(module, example, job["exported"])
    trace_s = time.perf_counter() - t0
    stage_mod = pipe.get_stage_module(rank)
    modes = job["recompute"][rank]
    calls = apply_recompute(stage_mod, job["names"], modes) if any(job["recompute"]) else {}
    stage = build_stage(stage_mod, rank, pipe.info(), torch.device("cpu"))
    cls = Schedule1F1B if job["schedule"] == "1f1b" else ScheduleGPipe
    sched = cls(stage, m, loss_fn=_sum_loss)
    batch = tuple(torch.cat([x] * m) if isinstance(x, torch.Tensor) else x for x in example)
    target = torch.zeros(m * (example[0].shape[0] if isinstance(example[0], torch.Tensor) else 1))

    syncs = tie_syncs(stage_mod, rank, job["exported"].get("shared_parameters") or ())
    cpu: list = []

    def step() -> None:
        c0 = time.process_time()
        stage_step(sched, rank, world, batch, target)
        sync_ties(syncs)
        cpu.append(time.process_time() - c0)

    times, barrier = _timed(step, lambda: stage_mod.zero_grad(set_to_none=True), job,
                            reset=lambda: _reset_counts(calls))
    return {"rank": rank, "times": times, "barrier": barrier, "trace": trace_s,
            "stage": stage_membership(stage_mod, job["names"]),
            "held": held_not_run(stage_mod, job["names"]),
            "tie_sync": [name for name, _, _ in syncs],
            "cpu": cpu[len(cpu) - job["iterations"]:],
            "recompute": recompute_report(calls, modes, job["iterations"], m)}


def tie_syncs(stage_module: torch.nn.Module, rank: int, shared) -> list[tuple]:
    """The all-reduces of tied gradients a stage process runs after every iteration's flush, as
    the cost model charges them (:func:`pipeopt.cost.rules.tie_sync_time`; Megatron-LM's
    embedding all-reduce), for one stage per rank (stage i on rank i): :func:`order_tie_syncs`
    with ``{rank: stage_module}`` and that placement.

    Returns
    -------
    list[tuple]
        ``(name, group, parameters)`` for the ties this rank takes part in
        (:func:`order_tie_syncs`).
    """
    stages = sorted({int(s) for tie in shared for s in tie.get("stages", ())} | {rank})
    return order_tie_syncs({rank: stage_module}, {s: s for s in stages}, rank, shared)


def order_tie_syncs(stage_modules: dict, placement: dict, rank: int, shared) -> list[tuple]:
    """The tied gradients' sums a rank runs after every iteration's flush, for any placement of
    stages on ranks (one stage per rank, or an action order's several chunks per rank).

    For each shared parameter (``shared``: the export's ``shared_parameters``) on two or more
    stages: the ranks of those stages (``placement``: stage -> rank) form a gloo group when
    there are two or more of them (made on every rank, in the same order:
    ``torch.distributed.new_group`` is collective); on a rank that holds some of the stages,
    the parameter of that name (or alias) each of its stage modules (``stage_modules``:
    stage -> module) runs (:func:`called_modules`: not a copy it only holds). :func:`sync_ties`
    sums the rank's copies, all-reduces the sum over the group (none for a group of one rank:
    the V placement puts stage 0 and stage S-1 on rank 0) and writes it back into every copy.

    Returns
    -------
    list[tuple]
        ``(name, group or None, [parameter, ...])`` for the ties this rank takes part in; the
        list is empty where none of its stages runs the names (its share is then zeros).
    """
    import torch.distributed as dist

    out = []
    for tie in shared:
        stages = sorted({int(s) for s in tie.get("stages", ())})
        if len(stages) < 2:
            continue
        ranks = sorted({int(placement[s]) for s in stages})
        group = dist.new_group(ranks) if len(ranks) >= 2 else None
        if rank not in ranks:
            continue
        names = [str(tie.get("name", "")), *(str(a) for a in tie.get("aliases", ()))]
        found, used = [], None
        for s in stages:
            if s not in stage_modules:
                continue
            mod = stage_modules[s]
            run = called_modules(mod)
            params = dict(mod.named_parameters(remove_duplicate=False))
            hit = [n for n in names if n in params and (run is None or n.rpartition(".")[0] in run)]
            if hit:
                found.append(params[hit[0]])
                used = used or hit[0]
        out.append((used or names[0], group, found))
    return out


def sync_ties(syncs: list[tuple]) -> None:
    """Sum each tied parameter's gradient over its copies on this rank and its group's ranks
    (:func:`order_tie_syncs`), in place: every copy then holds the sum.

    A rank holding one copy all-reduces that gradient in place (what the cost model charges,
    :func:`pipeopt.cost.rules.tie_sync_time`): no clone and no copy back. Measured on HF GPT-2's
    154 MB tied embedding at S = 2 (gloo, 2 local processes): the clone's fresh allocation and
    the copy back took about 65 ms per iteration beside the all-reduce's 77 ms."""
    import torch.distributed as dist

    for _, group, params in syncs:
        grads = [p.grad for p in params if p.grad is not None]
        if group is None and len(grads) < 2:
            continue
        if group is not None and len(grads) == 1:
            dist.all_reduce(grads[0], group=group)
            continue
        total = grads[0].clone() if grads else None
        for g in grads[1:]:
            total += g
        if group is not None:
            if total is None:  # a rank whose stages hold none of the copies' gradients: it adds zeros
                continue  # never happens for a stage that runs the tie's layer
            dist.all_reduce(total, group=group)
        for g in grads:
            g.copy_(total)


def _counts(reports: list) -> dict:
    """The stages' counts (:func:`recompute_report`, in stage order) as the report's ``info``
    holds them: ``forward_runs`` and ``recomputations``, one dict per stage (``{}`` when nothing
    was recomputed)."""
    if not reports:
        return {}
    return {key: [r[key] for r in reports] for key in ("forward_runs", "recomputations")}


def stage_step(sched, rank: int, world: int, batch: tuple, target) -> None:
    """One ``sched.step`` of a one-stage-per-rank schedule (``Schedule1F1B``, ``ScheduleGPipe``)
    on rank ``rank`` of ``world``: the first rank feeds the batch (a tuple of the model's
    inputs, M microbatches concatenated), the last the loss's target, a middle one neither, a
    single rank both."""
    if rank == 0 and world == 1:
        sched.step(*batch, target=target)
    elif rank == 0:
        sched.step(*batch)
    elif rank == world - 1:
        sched.step(target=target)
    else:
        sched.step()


def _sum_loss(output, target):
    """``output.sum()`` (the target is ignored): a backward from gradients of ones."""
    if isinstance(output, (tuple, list)):
        return sum(o.sum() for o in output if isinstance(o, torch.Tensor) and o.is_floating_point())
    return output.sum()


__all__ = ["RECOMPUTE_RUNS", "RunReport", "SCHEDULES", "apply_recompute", "build_pipe", "called_modules",
           "free_cores", "held_not_run", "module_ties", "order_prediction", "pipe_stages", "prediction",
           "recompute_modes", "recompute_report", "run_plan", "stage_membership", "stage_modes", "stage_step",
           "PIN_ENV", "order_tie_syncs", "pin_rank", "pins", "sync_ties", "tie_holders", "tie_syncs"]


def _export_for_run(plan, model, model_kwargs, instance) -> tuple[dict, list]:
    """Check the model loads (a bad name or size fails here, not in S processes) and that every
    layer of the plan is one of its modules, and export the plan for torch; returns
    ``(exported, layer names in stage order)``.

    Raises
    ------
    InvalidPlanError
        If a layer of the plan is not a module of the model (a plan made for another model),
        naming the first one.
    UnsupportedPlanError
        If the plan replicates stages (``pipeopt run`` has no data-parallel dimension).
    """
    from ..errors import UnsupportedPlanError

    if isinstance(model, str):
        from .models import load

        module = load(model, **dict(model_kwargs or {}))[0]
    else:
        module = model(**dict(model_kwargs or {}))[0]
    check_plan_modules(plan, module)
    exported = export(plan, "torch", graph=instance.graph if instance is not None else None)
    if not exported.get("shared_parameters"):  # no profiled graph: the ties read off the module
        exported["shared_parameters"] = module_ties(module, exported["stages"])
    if exported["data_parallel"] > 1:
        raise UnsupportedPlanError(
            f"pipeopt run has no data-parallel dimension: the plan replicates every stage "
            f"{exported['data_parallel']} times"
        )
    return exported, [n for st in exported["stages"] for n in st]


def check_plan_modules(plan: Plan, module: torch.nn.Module) -> None:
    """Refuse a plan whose layers are not modules of ``module`` (names as
    ``module.named_modules(remove_duplicate=False)`` gives them), before any process starts.

    Raises
    ------
    InvalidPlanError
        Naming the first layer (in stage order) that is not a module, its stage, and some of
        the model's top-level modules.
    """
    from ..errors import InvalidPlanError

    known = {n for n, _ in module.named_modules(remove_duplicate=False)}
    for s, stage in enumerate(plan.stages):
        for name in stage.layers:
            if str(name) not in known:
                top = [n for n, _ in module.named_children()][:8]
                raise InvalidPlanError(
                    f"layer {name!r} of the plan's stage {s} is not a module of {type(module).__name__} (its "
                    f"top-level modules: {top}): the plan was made for another model or granularity; profile "
                    "this model (pipeopt profile) and solve again")
