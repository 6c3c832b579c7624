"""Run methods on instances and collect tidy rows: the benchmark behind ``pipeopt bench``.

Rows (one per instance x size x method) form a :class:`pandas.DataFrame` with the columns of
:data:`COLUMNS`; :func:`save_rows` / :func:`load_rows` write and read CSV or Parquet, so a
notebook goes from a benchmark to a figure in a few lines.

The solves run in this process, in ``jobs`` local processes or on a Dask cluster
(:mod:`pipeopt.sweep`), with the same rows in the same order; with ``out`` the rows are
written as they finish, and ``resume`` picks up a sweep from its partial CSV
(:mod:`pipeopt.rowlog`).

Every row states its search space (:mod:`pipeopt.problems.spaces`), and a gap is taken only
against a bound of the same or a larger space: ``best_bound`` is the largest proven lower bound
of any exact method's row on the same (instance, problem, size) whose space contains the row's
(:func:`pipeopt.problems.spaces.contains`; a bound over a larger space bounds every smaller
one), and ``gap = (objective - best_bound) / objective`` in percent. A row whose space no exact
row's space contains (PipeDream's ``replicated-convex`` plans without an exact method of that
space) has no gap.
"""

from __future__ import annotations

import inspect
import logging
import math
import numbers
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from . import registry, rowlog, sweep
from .errors import InfeasibleError, InvalidProblemError, PipeoptError, ReadError, WriteError
from .instance import Instance
from .io import load
from .problems import spaces
from .result import optimality_gap
from .simulate import simulate
from .solve import check_solver_and_seed, solve
from .units import MAX_DEVICES

logger = logging.getLogger("pipeopt")
if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):  # a library's logger
    logger.addHandler(logging.NullHandler())

COLUMNS = [
    "instance",  # instance name
    "layers",  # layers in the graph
    "units",  # splittable units (inputs glued to the first layer)
    "problem",  # partition, allocate, joint, group, bipartition
    "stages",  # S (pipeline depth / workers of the partition problem)
    "workers",  # q for the group problem (else NaN)
    "method",  # method name
    "exact",  # True if the method proves bounds
    "space",  # search space of the row (pipeopt.problems.spaces; gaps use bounds of the same or a larger space)
    "status",  # optimal | feasible | time_limit | infeasible | skipped | error
    "objective_name",  # bottleneck (1F1B steady state, per microbatch) | iteration (1F1B-flush, M) | gpipe (M)
    "objective",  # seconds, evaluate(plan).objective (NaN without a plan)
    "simulated",  # seconds, the simulator's value of the same objective for the plan (NaN without one)
    "lower_bound",  # seconds, the method's own proven bound (NaN for heuristics)
    "best_bound",  # seconds, best proven bound of an exact row in the same or a larger space
    "gap",  # percent, (objective - best_bound) / objective * 100
    "runtime",  # seconds of wall time
    "note",  # why a row was skipped, solver details
]

DEFAULT_INSTANCE_DIR = "instances"


def default_instances() -> list[Path]:
    """The shipped instance files (``instances/**/*.json``), looked up in the current
    directory first, then next to the package source."""
    for root in (Path.cwd() / DEFAULT_INSTANCE_DIR, Path(__file__).resolve().parent.parent / DEFAULT_INSTANCE_DIR):
        files = sorted(root.glob("**/*.json"))
        if files:
            return files
    return []


def expand_paths(items: Iterable[Instance | str | Path]) -> Iterable[Instance | Path]:
    """Instances and files as given, with every directory replaced by the instance files under
    it (``**/*.json`` and ``**/*.txt``, sorted; licence and readme files left out).

    Raises
    ------
    ReadError
        If a path does not exist or a directory holds no instance file (before any work).
    """
    if isinstance(items, (str, Path, Instance)):
        items = [items]
    if items is None or not hasattr(items, "__iter__"):
        raise InvalidProblemError(f"instances must be a list of Instances or paths, got {items!r:.60}")
    out: list = []
    for item in items:
        if isinstance(item, Instance):
            out.append(item)
            continue
        if not isinstance(item, (str, Path)):
            raise InvalidProblemError(f"an instance must be an Instance or a path, got {type(item).__name__} {item!r:.60}")
        path = Path(item)
        if path.is_dir():
            files = sorted(
                f for f in path.rglob("*")
                if f.is_file() and f.suffix.lower() in (".json", ".txt")
                and not f.name.upper().startswith(("LICENSE", "README", "COPYING"))
            )
            if not files:
                raise ReadError(f"no instance file (.json or PipeDream .txt) in the directory {path}")
            out.extend(files)
        elif path.exists():
            out.append(path)
        else:
            raise ReadError(f"no such file or directory: {path}")
    return out


def _counts(values, what: str) -> list[int] | None:
    """``None``, or the given stage / worker counts, each an integer in 1 .. MAX_DEVICES."""
    if values is None:
        return None
    if isinstance(values, (int, str)) or not hasattr(values, "__iter__"):
        raise InvalidProblemError(f"{what} must be a list of integers (or None), got {values!r}")
    values = list(values)
    if not values:
        raise InvalidProblemError(f"{what} is an empty list; give at least one count, or None for the default")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= v <= MAX_DEVICES:
            raise InvalidProblemError(f"every count in {what} must be an integer in 1..{MAX_DEVICES}, got {v!r}")
    return [int(v) for v in values]


def _check_time_limit(limit) -> None:
    if isinstance(limit, bool) or not isinstance(limit, numbers.Real) or math.isnan(limit) or limit <= 0:
        raise InvalidProblemError(f"time limit must be a positive number of seconds, got {limit!r}")


def _spaces(problem: str, methods: Sequence[registry.Method], replication: bool) -> dict:
    """Which spaces each method runs in: 'auto' methods run in one-order, and also in
    replicated-one-order when asked or when a replicated-one-order baseline needs a bound; the
    partition problem's convex method runs in the convex counterpart of each (convex,
    replicated-convex)."""
    fixed = {m.space for m in methods if m.space != spaces.AUTO}
    auto_spaces = [spaces.REPLICATED_ONE_ORDER] if replication else [spaces.ONE_ORDER]
    replicated = spaces.REPLICATED_ONE_ORDER
    if problem == "partition" and replicated in fixed and replicated not in auto_spaces:
        auto_spaces.append(replicated)
    convex = {spaces.ONE_ORDER: spaces.CONVEX, spaces.REPLICATED_ONE_ORDER: spaces.REPLICATED_CONVEX}
    lifted = [convex[s] for s in auto_spaces]  # a convex method runs where the auto methods run, over the DAG
    return {m.name: (auto_spaces if m.space == spaces.AUTO else lifted if m.space == spaces.CONVEX and
                     problem == "partition" else [m.space]) for m in methods}


def _space_option(problem: str, space: str) -> dict:
    """``{"replication": ...}`` for a problem that takes it, else ``{}``."""
    return {"replication": spaces.replicated(space)} if "replication" in registry.options_of(problem) else {}


def run(
    instances: Iterable[Instance | str | Path],
    *,
    problem: str = "auto",
    stages: Sequence[int] | None = None,
    workers: Sequence[int] | None = None,
    methods: Sequence[str] | None = None,
    time_limit: float = 60.0,
    solver: str = "auto",
    replication: bool = False,
    bandwidth: float | None = None,
    memory: float | None = None,
    latency: float | None = None,
    seed: int = 0,
    progress: bool = True,
    every_method: bool = False,
    jobs: int = 1,
    dask: str | None = None,
    threads: int | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    schedule=None,
    microbatches: int | None = None,
    stages_per_rank: int | None = None,
    w_placement: str | None = None,
    placement: str | None = None,
) -> pd.DataFrame:
    """Run ``methods`` of ``problem`` on every instance and size; return tidy rows.

    Parameters
    ----------
    instances
        Instances, files (native JSON, PipeDream ``.txt``) or directories (walked for
        ``.json`` and ``.txt`` files, :func:`expand_paths`). A file that cannot be read is
        skipped with a logged warning (so a shell glob that catches a LICENSE file is
        harmless); a path that does not exist is an error.
    problem
        Problem name (:data:`pipeopt.registry.PROBLEMS`), or ``"auto"`` (default): each
        instance gets the problem it is made for (:func:`pipeopt.registry.auto_problem`).
    stages
        Pipeline depths S to try; default: the number of devices of each instance's
        cluster (for PipeDream profiles, 4 and 8).
    workers
        Worker counts q for the group problem (default :data:`pipeopt.registry.DEFAULT_WORKERS`).
    methods
        Method names; default: the registry's default methods of the problem.
    time_limit
        Seconds per exact solve.
    solver
        MILP backend, ``"cbc"``, ``"highs"`` or ``"auto"`` (default: each problem's own,
        :func:`pipeopt.registry.default_solver`).
    replication
        Run the partition DP in the replicated-one-order space instead of the one-order one.
    bandwidth, memory
        Override every instance's bandwidth (bytes/s) / memory per device (bytes).
    latency
        Override every file's per-message latency (seconds, :attr:`pipeopt.Cluster.latency`).
    seed
        Seed of randomised methods.
    progress
        Show a tqdm progress bar on stderr.
    every_method
        Without ``methods``: run every method of each instance's problem, not only the
        default ones.
    jobs
        Local worker processes (default 1: every solve in this process). The rows are the
        same as a sequential run's, in the same order, except the ``runtime`` column.
    dask
        A Dask scheduler address (``tcp://host:8786``) to run the solves on, or ``"local"``
        for a :class:`distributed.LocalCluster` (``jobs`` workers if ``jobs > 1``, else one per
        core); needs the ``dask`` extra (``pip install "pipeopt[dask]"``). Instances travel
        as native dicts: workers need pipeopt, not the instance files.
    threads
        Solver threads per solve (CP-SAT workers, HiGHS threads; CBC always runs serially).
        Default: 1 with ``jobs > 1`` or ``dask`` (one solve per core), else
        :func:`pipeopt.solve`'s default.
    out
        A ``.csv`` file that receives every row as its solve finishes (one flushed line each:
        a killed sweep leaves a valid partial file) and, at the end, all rows in task order
        with the gaps; or a ``.parquet`` file written at the end. ``None``: nothing written.
    resume
        Keep the rows already in ``out`` (a CSV) and run only the tasks that have none; the
        sweep must be the one that wrote them (same instances, sizes and methods).
    schedule, microbatches, stages_per_rank, w_placement, placement
        The schedule problem's options (``problem="schedule"``; refused for another problem):
        ``schedule`` a name in any spelling of :func:`pipeopt.schedules.schedule_name`, a list
        of them, or ``"auto"`` (every torch schedule; default ``"1F1B"``), each schedule its
        own rows (space ``schedule:<name>``, so a gap is taken to the same schedule's exact
        bound), ``stages`` being the ranks p; ``microbatches`` m (default: each instance's
        ``settings.microbatches``); ``stages_per_rank`` v (with ``"auto"``, for the schedules
        that take any v); ``w_placement`` ``"schedule"`` or ``"free"`` (with ``"auto"``, free
        applies to the zero-bubble schedules); ``placement`` ``"looped"`` or ``"v"`` for the free
        order (``schedule="free"``: its rows' space holds the fixed orders of that placement, so
        their gaps are to the free-order bound). ``time_limit`` is per solve, as for every
        problem (one schedule's exact solve is one row; ``pipeopt solve --schedule auto``
        shares one deadline among the schedules instead). The ``simulated`` column holds the
        simulator's iteration time for GPipe and 1F1B on one stage per rank (the schedules it
        plays), else NaN; ``objective_name`` is ``iteration``.

    A task that fails - a method that raises, a solver or worker process that dies - becomes
    a row with status ``error`` naming the failure, never the end of the sweep.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`.

    Raises
    ------
    ReadError
        A path does not exist, a directory holds no instance file, or no instance could be
        read at all.
    InvalidProblemError
        Unknown problem or method; a stage or worker count that is not an integer in
        1 .. :data:`pipeopt.units.MAX_DEVICES`; a time limit that is not positive; an option
        (``stages``, ``workers``, ``replication``) that the problem does not use (with
        ``problem="auto"``: that no instance's problem uses; the others get a note); bad
        ``jobs``, ``threads`` or ``dask``; ``resume`` without a CSV ``out``; an ``out`` to
        resume that holds rows of no task of this sweep.
    MissingExtraError
        ``dask`` given but the dask extra is not installed.
    ExecutorError
        The Dask scheduler does not answer (raised when the sweep starts).
    WriteError
        ``out`` cannot be written.
    """
    if progress:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm

    stages = _counts(stages, "stages")
    workers = _counts(workers, "workers")
    _check_arguments(problem, methods, time_limit, solver, seed)
    schedule_options = _schedule_options(schedule, microbatches, stages_per_rank, w_placement, placement)
    runner = sweep.executor(jobs=jobs, dask=dask)
    threads = _threads(threads, runner.parallel)
    out = _check_out(out, resume)
    loaded = _load_all(instances, devices=max(stages) if stages else None, bandwidth=bandwidth, memory=memory,
                        latency=latency)
    _refuse_unused(loaded, problem, stages=stages, workers=workers, replication=replication,
                   **{k: v for k, v in schedule_options.items() if k != "schedules"})
    tasks = [task for inst in loaded
             for task in _tasks(inst, problem, methods, every_method, stages, workers, replication, schedule_options)]
    options = {"time_limit": time_limit, "solver": solver, "seed": seed, "threads": threads}
    bar = tqdm(total=len(tasks), disable=not progress, desc="bench", unit="solve", leave=False)
    try:
        rows = _sweep(runner, loaded, tasks, options, out=out, resume=resume, bar=bar)
    finally:
        bar.close()
    df = add_gaps(pd.DataFrame(rows, columns=[c for c in COLUMNS if c not in ("best_bound", "gap")]))
    if out is not None and rows:
        try:
            save_rows(df, out)  # all rows in task order, with the gaps
        except OSError as exc:
            raise WriteError(f"cannot write the rows to {out}: {exc.strerror or exc}") from None
    return df


def _schedule_options(schedule, microbatches, stages_per_rank, w_placement, placement=None) -> dict:
    """The schedule problem's options as given (``None`` left out), checked before any work:
    ``{"schedule": ..., "schedules": [canonical names] | None (auto), ...}``."""
    from .problems.schedule.choose import schedule_name_or_auto

    given = {"schedule": schedule, "microbatches": microbatches, "stages_per_rank": stages_per_rank,
             "w_placement": w_placement, "placement": placement}
    out = {k: v for k, v in given.items() if v is not None}
    if schedule is not None:
        names = [schedule] if isinstance(schedule, str) else list(schedule)
        if not names:
            raise InvalidProblemError("schedule is an empty list; give a name, a list of names, or 'auto'")
        canon = [schedule_name_or_auto(n) for n in names]
        out["schedules"] = None if "auto" in canon else list(dict.fromkeys(canon))
    return out


def _schedule_sizes(size: dict, options: dict) -> list[tuple[dict, str]]:
    """``(problem options, space)`` of each schedule the schedule problem's rows run at one
    size (:func:`run`'s ``schedule``: one name, several, or every one with ``"auto"``)."""
    from .problems.schedule.choose import SPLITS_BACKWARD
    from .problems.schedule.problem import schedule_space
    from .schedules import TORCH_SCHEDULES
    from .schedules.torch_orders import STAGES_PER_RANK

    auto = "schedule" in options and options.get("schedules") is None
    names = list(TORCH_SCHEDULES) if auto else options.get("schedules") or ["1F1B"]
    out = []
    for name in names:
        opts = {**size, "schedule": name}
        if "microbatches" in options:
            opts["microbatches"] = options["microbatches"]
        if "stages_per_rank" in options and not (auto and name in STAGES_PER_RANK):
            opts["stages_per_rank"] = options["stages_per_rank"]
        if name == "free":  # the free order: its placement, no W option (it places every action)
            if options.get("placement") is not None:
                opts["placement"] = options["placement"]
            out.append((opts, schedule_space(name, placement=options.get("placement"),
                                             stages_per_rank=options.get("stages_per_rank"))))
            continue
        wp = options.get("w_placement", "schedule")
        if auto and name not in SPLITS_BACKWARD:
            wp = "schedule"
        if wp != "schedule":
            opts["w_placement"] = wp
        out.append((opts, schedule_space(name, wp)))
    return out


def _threads(threads, parallel: bool) -> int:
    """Solver threads per solve: as given (a positive integer), else 1 when solves run side
    by side, else :func:`pipeopt.solve`'s default."""
    if threads is None:
        return 1 if parallel else inspect.signature(solve).parameters["threads"].default
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise InvalidProblemError(f"threads must be a positive integer, got {threads!r}")
    return int(threads)


def _check_out(out, resume) -> Path | None:
    """``out`` as a Path; ``resume`` needs a CSV to resume from."""
    out = None if out is None else Path(out)
    if resume and (out is None or out.suffix == ".parquet"):
        raise InvalidProblemError(f"resume needs the CSV file of the sweep (out=...csv), got out={out}")
    return out


def _sweep(runner, loaded, tasks, options, *, out, resume, bar) -> list[dict]:
    """The row of every task, in task order: those kept from ``out`` (``resume``), the others
    run by ``runner``, each appended to ``out`` (a CSV) as it finishes."""
    rows: list = [None] * len(tasks)
    if resume:
        keys = [(rowlog.key(inst.name, name, size.get("stages"), size.get("workers"), spec.name), space)
                for inst, name, size, spec, space in tasks]
        for t, row in rowlog.resume(out, keys, load_rows).items():
            rows[t] = row
    todo = [t for t, row in enumerate(rows) if row is None]
    bar.update(len(tasks) - len(todo))
    where = {id(inst): k for k, inst in enumerate(loaded)}
    calls = [(where[id(tasks[t][0])], *tasks[t][1:], options) for t in todo]
    try:
        log = rowlog.RowLog(out, COLUMNS, append=resume) if out is not None and out.suffix != ".parquet" else None
    except OSError as exc:
        raise WriteError(f"cannot write the rows to {out}: {exc.strerror or exc}") from None
    try:
        for j, value in runner.run(_task_row, loaded, calls):
            t = todo[j]
            inst, name, size, spec, space = tasks[t]
            if isinstance(value, sweep.Failure):
                value = _failed_row(inst, name, size, spec, space, value.message)
            rows[t] = value
            if log is not None:
                try:
                    log.append(value)
                except OSError as exc:
                    raise WriteError(f"cannot write the rows to {out}: {exc.strerror or exc}") from None
            bar.set_postfix_str(f"{inst.name} {name} {spec.name}", refresh=False)
            bar.update()
    finally:
        if log is not None:
            log.close()
    return rows


def _check_arguments(problem, methods, time_limit, solver, seed) -> None:
    """Every argument checked before any file is read (errors name the bad value)."""
    _check_time_limit(time_limit)
    check_solver_and_seed(solver, seed)
    if isinstance(methods, str):
        raise InvalidProblemError(f"methods must be a list of method names, got the string {methods!r}")
    if problem != "auto":
        registry.problem_class(problem)  # unknown problem: say so before reading anything
        for m in methods or ():
            registry.method(problem, m)
    elif methods is not None:
        unknown = [m for m in methods if not any(spec.name == m for spec in registry.METHODS)]
        if unknown:
            raise InvalidProblemError(f"unknown method(s) {unknown}; known: {sorted({m.name for m in registry.METHODS})}")


def _load_all(instances, **overrides) -> list[Instance]:
    """Instances as given and every readable file (a file that cannot be read is skipped with
    a message); :class:`ReadError` if none is left."""
    items = list(expand_paths(instances))
    loaded: list[Instance] = []
    for item in items:
        if isinstance(item, Instance):
            loaded.append(item)
            continue
        try:
            loaded.append(load(item, **overrides))
        except PipeoptError as exc:
            logger.warning("skipped %s: %s", item, exc)
            print(f"skipped {item}: {exc}")
    if not loaded:
        raise ReadError(f"no instance could be read from {[str(x) for x in items] if items else 'the paths given'}")
    return loaded


def _refuse_unused(loaded, problem, **given) -> None:
    """An option no instance's problem uses is an error; one some instances' problems do not
    use gets a note naming them (with ``problem="auto"``)."""
    unused: dict = {option: [] for option in given}  # option -> (instance, problem) not using it
    for inst in loaded:
        name = registry.auto_problem(inst) if problem == "auto" else problem
        for option in registry.unused_options(name, **given):
            unused[option].append((inst.name, name))
    for option, where in unused.items():
        if not where:
            continue
        problems = sorted({p for _, p in where})
        if problem != "auto" or len(where) == len(loaded):
            raise InvalidProblemError(
                f"the {' and '.join(problems)} problem does not use {option}; pick the problem, or drop the option"
            )
        print(f"note: {option} not used by the {' and '.join(problems)} problem on {', '.join(i for i, _ in where)}")


def _tasks(inst, problem, methods, every_method, stages, workers, replication, schedule_options=None) -> list[tuple]:
    """``(instance, problem, size, method, space)`` of every solve to run on ``inst``."""
    name = registry.auto_problem(inst) if problem == "auto" else problem
    if methods is None:
        specs = [m for m in registry.methods(name) if m.default or every_method]
    elif problem == "auto":  # named methods, each where its problem has it
        specs = [m for m in registry.methods(name) if m.name in methods]
        if not specs:
            print(f"skipped {inst.name} for {name}: it has none of the methods {list(methods)}")
            return []
    else:
        specs = [registry.method(name, m) for m in methods]
    space_of = _spaces(name, specs, replication)
    takes = registry.options_of(name)
    tasks = []
    for size in registry.sizes(name, inst, stages=stages if "stages" in takes else None,
                               workers=workers if "workers" in takes else None):
        posed = [(size, None)]
        if name == "schedule":  # one set of rows per schedule, in its own space
            posed = _schedule_sizes(size, schedule_options or {})
        for opts, fixed_space in posed:
            try:  # can the problem be posed at all? (say so once, not once per method)
                registry.problem_class(name)(inst, **opts)
            except PipeoptError as exc:
                label = ", ".join(f"{'S' if k == 'stages' else 'q' if k == 'workers' else k}={v}"
                                  for k, v in opts.items())
                print(f"skipped {inst.name} ({label}) for {name}: {exc}")
                continue
            tasks.extend((inst, name, opts, spec, space) for spec in specs
                         for space in ([fixed_space] if fixed_space else space_of[spec.name]))
    return tasks


def _task_row(inst, name, size, spec, space, options) -> dict:
    """:func:`_row` as the executors call it (in a worker process: a module-level function)."""
    return _row(inst, name, size, spec, space, **options)


def _base_row(inst, name, size, spec, space) -> dict:
    """The columns of a task's row that do not depend on its solve."""
    return {
        "instance": inst.name,
        "layers": inst.num_layers,
        "units": inst.chain.n,
        "problem": name,
        "stages": size.get("stages", math.nan),
        "workers": size.get("workers", math.nan),
        "method": spec.name,
        "exact": spec.exact,
        "space": space,
        "objective_name": "iteration" if name == "schedule" else inst.settings.objective,
        "objective": math.nan,
        "simulated": math.nan,
        "lower_bound": math.nan,
        "note": "",
    }


def _failed_row(inst, name, size, spec, space, message: str) -> dict:
    """The row of a task that produced none (its worker process died): status ``error``."""
    return {**_base_row(inst, name, size, spec, space), "status": "error", "runtime": math.nan,
            "note": message[:200]}


def _row(inst, name, size, spec, space, **solve_options) -> dict:
    """One tidy row: the solve of ``spec`` on ``inst`` through :func:`pipeopt.solve`; a
    method that raises (a bug, a crashed solver process) gives a row with status ``error``."""
    row = _base_row(inst, name, size, spec, space)
    started = time.perf_counter()
    try:
        res = solve(inst, problem=name, method=spec.name, **solve_options, **size, **_space_option(name, space))
        row.update(
            status=str(res.status),
            objective=res.objective,
            lower_bound=res.lower_bound if res.lower_bound is not None else math.nan,
            space=res.space,
            runtime=res.runtime,
        )
        if name == "schedule":
            row["simulated"] = simulated_schedule(inst, res)
        elif res.plan is not None and math.isfinite(res.objective):
            row["simulated"] = simulated(inst, res.plan)
        if res.evaluation is not None and res.evaluation.violations:
            row["note"] = "; ".join(res.evaluation.violations)[:200]
    except InfeasibleError as exc:
        row.update(status="infeasible", runtime=time.perf_counter() - started, note=str(exc))
    except PipeoptError as exc:
        row.update(status="skipped", runtime=time.perf_counter() - started, note=str(exc))
    except Exception as exc:  # noqa: BLE001 - a crashed solver process (CBC killed by a signal), a bug: a row
        logger.warning("%s on %s: %s", spec.name, inst.name, exc, exc_info=not isinstance(exc, RuntimeError))
        row.update(status="error", runtime=time.perf_counter() - started, note=f"{type(exc).__name__}: {exc}"[:200])
    return row


def simulated(instance: Instance, plan) -> float:
    """The simulator's value of the instance's objective for ``plan`` (seconds):
    ``bottleneck`` - the steady-state time per microbatch of a long 1F1B run (split execution
    when every stage has a forward share); ``iteration`` - M microbatches under 1F1B with a
    flush; ``gpipe`` - M microbatches under GPipe (:func:`pipeopt.simulate.simulate`);
    ``max_load`` - none (Tarnawski et al.'s model is not a pipeline schedule the simulator
    runs): NaN."""
    objective = instance.settings.objective
    if objective == "max_load":
        return math.nan
    if objective == "gpipe":
        return simulate(instance, plan, schedule="gpipe").iteration_time
    split = all(st.beta is not None for st in plan.stages)
    sim = simulate(instance, plan, schedule="split" if split else "1f1b")
    return sim.time_per_microbatch if objective == "bottleneck" else sim.iteration_time


def simulated_schedule(instance: Instance, res) -> float:
    """The simulator's iteration time of a schedule problem's result when the simulator plays
    its schedule - GPipe or 1F1B on one stage per rank, in the schedule's own order - else NaN
    (the other schedules are played only by the schedule executor, the result's evaluation)."""
    info = res.info
    if (res.plan is None or info.get("schedule") not in ("GPipe", "1F1B") or info.get("stages_per_rank") != 1
            or "order" in info or not math.isfinite(res.objective)):
        return math.nan
    return simulate(instance, res.plan, schedule=info["schedule"], microbatches=info["microbatches"]).iteration_time


def add_gaps(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``best_bound`` and ``gap`` (percent) columns; returns a new frame with :data:`COLUMNS`.

    ``best_bound`` of a row is the largest proven lower bound of an exact method's row on the
    same instance, problem and size (stages, workers) whose space contains the row's space
    (:func:`pipeopt.problems.spaces.contains`: the same space or a larger one); NaN if there
    is none, and then the row has no gap.
    """
    df = df.copy()
    if df.empty:
        return df.reindex(columns=COLUMNS)
    df["best_bound"] = best_bounds(df)
    # a plan proven infeasible in its space has no gap
    gaps = [optimality_gap(o, None if math.isnan(b) else b) for o, b in zip(df["objective"], df["best_bound"])]
    df["gap"] = [math.nan if g is None else g * 100.0 for g in gaps]  # the one definition, in percent
    df.loc[df["status"] == "infeasible", "gap"] = math.nan
    return df.reindex(columns=COLUMNS)


def best_bounds(df: pd.DataFrame) -> pd.Series:
    """Per row of ``df`` (columns ``instance, problem, stages, workers, space, exact,
    lower_bound``): the largest ``lower_bound`` of an ``exact`` row of the same instance,
    problem, stages and workers whose space contains the row's
    (:func:`pipeopt.problems.spaces.contains`), else NaN."""
    space = df["space"].astype(str).to_numpy()
    bound = pd.to_numeric(df["lower_bound"], errors="coerce").to_numpy(dtype=float)
    proven = df["exact"].astype(bool).to_numpy() & ~np.isnan(bound)
    best = np.full(len(df), math.nan)
    keys = [df[k].astype(str) for k in ("instance", "problem", "stages", "workers")]
    for rows in df.groupby(keys, sort=False, dropna=False).indices.values():
        top: dict[str, float] = {}  # the best bound proven in each space of the group
        for i in rows:
            if proven[i]:
                top[space[i]] = max(top.get(space[i], -math.inf), bound[i])
        for i in rows:
            found = [b for s, b in top.items() if spaces.contains(s, space[i])]
            if found:
                best[i] = max(found)
    return pd.Series(best, index=df.index)


def _count(x) -> object:
    return "-" if pd.isna(x) else int(x)


def table(df: pd.DataFrame) -> str:
    """The human table: instance, (problem,) layers, stages, (workers,) method, space,
    objective name, its value (ms), the simulator's value (ms), lower bound (ms), gap (%),
    status, solve time (s)."""
    if df.empty:
        return "(no rows)"
    out = pd.DataFrame(
        {
            "instance": df["instance"],
            "layers": df["layers"],
            "stages": df["stages"],
            "method": df["method"],
            "space": df["space"],
            "objective": df["objective_name"],
            "value_ms": (df["objective"] * 1e3).round(3),
            "simulated_ms": (df["simulated"] * 1e3).round(3),
            "bound_ms": (df["lower_bound"] * 1e3).round(3),
            "gap_%": df["gap"].round(2),
            "status": df["status"],
            "time_s": df["runtime"].round(2),
        }
    )
    if "workers" in df and df["workers"].notna().any():
        out.insert(3, "workers", df["workers"].map(_count))
    if df["problem"].nunique() > 1:
        out.insert(1, "problem", df["problem"])
    out["stages"] = df["stages"].map(_count)
    return out.to_string(index=False, na_rep="-")


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per problem, method and space: rows, plans found, proven optima, mean and max gap (%)
    to the best bound, mean and max solve time (s)."""
    if df.empty:
        return pd.DataFrame()
    g = df.groupby(["problem", "method", "space"], sort=False)
    return pd.DataFrame(
        {
            "rows": g.size(),
            "plans": g["objective"].apply(lambda x: int((x < float("inf")).sum())),
            "optimal": g["status"].apply(lambda x: int((x == "optimal").sum())),
            "mean_gap_%": g["gap"].mean().round(2),
            "max_gap_%": g["gap"].max().round(2),
            "mean_time_s": g["runtime"].mean().round(2),
            "max_time_s": g["runtime"].max().round(2),
        }
    ).reset_index()


def save_rows(df: pd.DataFrame, path: str | Path) -> Path:
    """Write benchmark rows to ``.csv`` or ``.parquet`` (by suffix); returns the path. The
    file is replaced at once (written next to it first), so a partial sweep's CSV is never
    left half overwritten."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part")
    try:
        if path.suffix == ".parquet":
            df.to_parquet(part, index=False)
        else:
            df.to_csv(part, index=False)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return path


def load_rows(path: str | Path) -> pd.DataFrame:
    """Read rows written by :func:`save_rows` (columns :data:`COLUMNS`); the former space names
    ``straight`` and ``replicated`` are read as ``one-order`` and ``replicated-one-order``.

    Raises
    ------
    ReadError
        If the file is missing or lacks the benchmark columns.
    """
    path = Path(path)
    try:
        df = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path, keep_default_na=True)
    except (OSError, ValueError) as exc:
        raise ReadError(f"cannot read benchmark rows from {path}: {exc}") from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise ReadError(f"{path} lacks benchmark columns {missing}")
    df["note"] = df["note"].astype(object).where(df["note"].notna(), "").astype(str)
    df["space"] = df["space"].map(lambda s: spaces.canonical(s) if isinstance(s, str) else s)
    return df[COLUMNS]
