"""``pipeopt`` command line: ``bench`` (the main job), ``solve``, ``simulate``, ``show``, ``zoo``,
``export`` (a plan in a runtime's format), ``run`` (a plan on torch's pipeline runtime), ``grade``
(a framework's split: its time and its certified gap to the optimum)."""

from __future__ import annotations

import argparse
import math
import os
import sys

from . import registry, units
from .errors import InfeasibleError, InvalidProblemError, PipeoptError, WriteError
from .lazy import lazy_module

json = lazy_module("json")  # imported by the commands that read or print JSON (start-up of the others)
traceback = lazy_module("traceback")


def parse_bytes(text: str) -> float:
    """argparse type of ``--memory``: a size (:func:`pipeopt.units.parse_size`, ``"16GiB"``,
    ``"40GB"``, ``"80e9"``) in bytes, or ``inf`` for no limit."""
    try:
        return units.parse_size(text, unlimited=True)
    except PipeoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_rate(text: str) -> float:
    """argparse type of ``--bandwidth``: bytes/s (:func:`pipeopt.units.parse_bandwidth`,
    ``"100Gbps"`` = 1.25e10, ``"12.5GB/s"``, ``"1.25e10"``)."""
    try:
        return units.parse_bandwidth(text)
    except PipeoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_latency(text: str) -> float:
    """argparse type of ``--latency``: seconds per message (:func:`pipeopt.units.parse_latency`,
    ``"0.3ms"``, ``"300us"``, ``"3e-4"``)."""
    try:
        return units.parse_latency(text)
    except PipeoptError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _integer(what: str, low: int, high: int):
    """argparse type: an integer in ``low .. high`` (``what`` names it in the message)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} must be in {low}..{high}, got {value}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


COUNT = _integer("a count", 1, units.MAX_DEVICES)
"""argparse type of ``--stages`` and ``--workers``: 1 .. :data:`pipeopt.units.MAX_DEVICES`."""

MICROBATCHES = _integer("microbatches", 1, units.MAX_MICROBATCHES)
SEED = _integer("seed", 0, 2**31 - 1)
JOBS = _integer("--jobs", 1, 1024)


def parse_seconds(text: str) -> float | None:
    """argparse type of ``--time-limit``: positive, finite seconds, or ``none`` (no limit: the
    exact methods run until they prove their answer; ``bench`` refuses it, its search baselines
    need a budget)."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"time limit must be a number of seconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"time limit must be a positive finite number of seconds, got {text!r}")
    return value


BENCH_TIME_LIMIT = 5.0
"""``pipeopt bench``'s default seconds per solve (``--full``: 60): the exact methods prove the
shipped instances well within it, and the search baselines (MCMC) get the same budget."""


def _common(p: argparse.ArgumentParser, time_limit: float = 60.0) -> None:
    p.add_argument(
        "--problem",
        default="auto",
        choices=["auto", *sorted(registry.PROBLEMS)],
        help="problem (default auto: partition on identical one-kind devices, joint on identical "
        "multi-kind devices, group on heterogeneous devices)",
    )
    p.add_argument("--time-limit", type=parse_seconds, default=time_limit,
                   help=f"seconds per solve: the exact methods' limit and the search baselines' budget "
                        f"(default {time_limit:g}; solve: none for no limit)")
    p.add_argument("--solver", default="auto", choices=["auto", "cbc", "highs"],
                   help="MILP backend (default auto: HiGHS for the schedule problem, CBC for the others)")
    p.add_argument("--replication", action="store_true", help="allow PipeDream stage replication (partition)")
    p.add_argument(
        "--bandwidth",
        type=parse_rate,
        help="between workers, overrides the file: bytes/s (1.25e10) or with a unit: 100Gbps or "
        "100Gbit/s (bits), 12.5GB/s (bytes), 10GiB/s; inf: free communication (every transfer 0 s)",
    )
    p.add_argument(
        "--memory", type=parse_bytes, help="per device, overrides the file: bytes, 16GiB, 40GB, or inf (no limit)"
    )
    p.add_argument("--latency", type=parse_latency,
                   help="seconds per message between workers, overrides the file (alpha-beta: a transfer of n > 0 "
                        "bytes takes latency + n / bandwidth): 3e-4, 0.3ms, 300us; default the file's (0 if none)")
    p.add_argument("--seed", type=SEED, default=0, help="seed of randomised methods (0..2**31-1)")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")


def _data_parallel(p) -> None:
    """``--zero``, ``--dp`` and the training state's ratios (:class:`pipeopt.Settings`), for solve and simulate."""
    p.add_argument("--zero", type=lambda v: v if v == "auto" else int(v), choices=[0, 1, 2, 3, "auto"],
                   help="ZeRO stage over the --dp replicas: 0 replicate, 1 shard the optimizer state, 2 also the "
                        "gradients, 3 also the weights (FSDP); auto (solve: partition dp/auto, one named --schedule's "
                        "milp/exhaustive): the best of the four, each solved exactly; overrides the file (default "
                        "the file's, 0)")
    p.add_argument("--dp", type=COUNT, help="data-parallel replicas of the whole pipeline (default the file's, 1)")
    p.add_argument("--gradient-ratio", type=float,
                   help="gradient bytes per parameter byte held beside the weights (e.g. 1; default the file's, 0)")
    p.add_argument("--optimizer-ratio", type=float,
                   help="optimizer-state bytes per parameter byte (e.g. 2 for Adam in fp32; default the file's, 0)")


COMMANDS = ("bench", "solve", "simulate", "show", "zoo", "export", "run", "grade", "profile")
"""The subcommands, in the order ``pipeopt --help`` lists them."""


class _Skipped:
    """Stands in for the parser of a subcommand that :func:`build_parser` does not build: its
    option definitions are ignored (argparse builds a help formatter for every option, most of
    the ~3-6 ms a full parser takes)."""

    def add_argument(self, *args, **kwargs) -> None:
        return None

    def add_mutually_exclusive_group(self, *args, **kwargs) -> "_Skipped":
        return self


class _OnlySubparsers:
    """``add_subparsers()``'s action, adding the subcommand ``only`` alone (all when ``None``)."""

    def __init__(self, sub, only: str | None):
        self._sub, self._only = sub, only

    def add_parser(self, name: str, **kwargs):
        if self._only is None or name == self._only:
            return self._sub.add_parser(name, **kwargs)
        return _Skipped()  # never parses (the usage names it: build_parser's metavar)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argparse parser of the ``pipeopt`` command.

    ``command``: build only that subcommand's parser (one of :data:`COMMANDS`; its parsing,
    ``--help`` and error messages are the full parser's for a command line that starts with it);
    ``None`` (default): every subcommand, as ``pipeopt --help`` and a wrong command need.
    """
    ap = argparse.ArgumentParser(prog="pipeopt", description="Exact pipeline-parallel planning and heuristic gaps.")
    # with one command built, the usage names them all as the full parser's does (its choices)
    names = {} if command is None else {"metavar": "{" + ",".join(COMMANDS) + "}"}
    sub = _OnlySubparsers(ap.add_subparsers(dest="command", required=True, **names), command)

    b = sub.add_parser("bench", help="run methods on instances and print a table (default: shipped instances)")
    b.add_argument(
        "paths", nargs="*", help="instance files (.json), PipeDream profiles (.txt), or directories of them"
    )
    b.add_argument("--stages", type=COUNT, nargs="+", help="pipeline depths S (default: the cluster size)")
    b.add_argument("--workers", type=COUNT, nargs="+", help="worker counts q (group problem)")
    b.add_argument("--methods", nargs="+", help="methods (default: the problem's default set)")
    b.add_argument("--out", default="results/bench.csv", help="CSV (or .parquet) for the rows (default results/bench.csv)")
    b.add_argument("--full", action="store_true", help="full benchmark: every method, time limit 60 s")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.add_argument("--jobs", type=JOBS, default=1,
                   help="run the solves in N local processes, one solver thread each (default 1: in this process)")
    b.add_argument("--dask", metavar="ADDRESS",
                   help="run the solves on a Dask cluster: a scheduler address (tcp://host:8786), or 'local' "
                        "(a local cluster of --jobs workers); needs pip install \"pipeopt[dask]\"")
    b.add_argument("--schedule", nargs="+", metavar="NAME|auto",
                   help="the schedule problem (implies --problem schedule): the schedules whose chunks to split on "
                        "--stages ranks (torch's names, any case, or gpipe/1f1b/interleaved/looped/zb/zbv/dualpipev; "
                        "auto: every one), each its own rows")
    b.add_argument("--microbatches", type=MICROBATCHES, help="m with --schedule (default: each instance's)")
    b.add_argument("--stages-per-rank", type=COUNT, help="v with --schedule for the interleaved schedules (default 2)")
    b.add_argument("--placement", choices=["looped", "v"],
                   help="with --schedule free: the stages' placement on ranks (default looped; v: 2 per rank in a V)")
    b.add_argument("--w-placement", choices=["schedule", "free"],
                   help="with --schedule: the schedule's W places (default) or free W placement (zero-bubble schedules)")
    b.add_argument("--resume", action="store_true",
                   help="keep the rows already in --out (a CSV left by the same sweep) and run only the rest")
    _common(b, time_limit=BENCH_TIME_LIMIT)

    s = sub.add_parser("solve", help="solve one instance and print the plan stage by stage")
    s.add_argument("path")
    s.add_argument("--stages", type=COUNT, help="S (default: the cluster size)")
    s.add_argument("--workers", type=COUNT, help="q (group problem)")
    s.add_argument("--method", help="method (default: the problem's first exact method)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--save-plan", help="write the plan as JSON (for simulate/show --plan)")
    s.add_argument("--schedule", metavar="NAME|auto",
                   help="the schedule problem: split the layers into the chunks of a torch.distributed.pipelining "
                        "schedule (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, "
                        "DualPipeV; any case, class names, or gpipe/1f1b/interleaved/looped/zb/zbv/dualpipev) on "
                        "--stages ranks, exactly; auto: every schedule under one --time-limit, a table of their "
                        "optima and the least iteration time; free: the split and every rank's order of F, I, W "
                        "chosen together (CP-SAT), the order saved with --save-plan")
    s.add_argument("--microbatches", type=MICROBATCHES, help="m with --schedule (default: the instance's)")
    s.add_argument("--stages-per-rank", type=COUNT, help="v with --schedule for the interleaved schedules (default 2)")
    s.add_argument("--placement", choices=["looped", "v"],
                   help="with --schedule free (every rank's order of F, I, W chosen with the split): the stages' "
                        "placement on ranks (default looped, one stage per rank unless --stages-per-rank; v: 2 per "
                        "rank in a V)")
    s.add_argument("--recompute", choices=["none", "full", "auto"],
                   help="activation recomputation (partition: dp, auto; --schedule NAME: exhaustive, auto): none (every "
                        "layer keeps its activations), "
                        "full (every layer recomputed), auto (the exact choice per layer with the split); "
                        "default: not modelled")
    s.add_argument("--w-placement", choices=["schedule", "free"], default="schedule",
                   help="with a zero-bubble --schedule: keep the schedule's W (weight-gradient) places, or place each W "
                        "anywhere after its I, exactly with the split (free; refused for a schedule without W)")
    _data_parallel(s)
    _common(s)

    m = sub.add_parser("simulate", help="simulate one training iteration of a plan")
    m.add_argument("path")
    m.add_argument("--stages", type=COUNT)
    m.add_argument("--workers", type=COUNT)
    m.add_argument("--method", help="method (default: the problem's first exact method)")
    m.add_argument("--plan", help="a plan JSON written by solve --save-plan (instead of solving)")
    m.add_argument("--schedule", default="1F1B",
                   help="the schedule: 1F1B (default; also Schedule1F1B, 1f1b), GPipe, async (PipeDream's), "
                        "split (Duan & Wu); any case")
    m.add_argument("--microbatches", type=MICROBATCHES, help="M (default: the instance's)")
    m.add_argument("--json", action="store_true")
    m.add_argument("--gantt", help="also write a Gantt chart PNG here")
    _data_parallel(m)
    _common(m)

    w = sub.add_parser("show", help="draw a plan (per-stage loads) or its schedule to a PNG")
    w.add_argument("path")
    w.add_argument("--stages", type=COUNT)
    w.add_argument("--workers", type=COUNT)
    w.add_argument("--method", help="method (default: the problem's first exact method)")
    w.add_argument("--plan", help="a plan JSON written by solve --save-plan")
    w.add_argument("--out", default="plan.png")
    w.add_argument("--schedule", help="draw a Gantt chart of this schedule (1F1B, GPipe, async, split; any case)")
    w.add_argument("--microbatches", type=MICROBATCHES, help="M with --schedule (default: the instance's)")
    _common(w)

    z = sub.add_parser("zoo", help="regenerate the shipped instance files from the model zoo")
    z.add_argument("--out", default="instances")
    z.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")

    x = sub.add_parser("export", help="a plan in a pipeline runtime's format (torch, torch-csv, torchtitan, megatron, "
                                      "deepspeed)")
    x.add_argument("plan", help="a plan JSON (solve --save-plan) or a solve --json result")
    x.add_argument("--to", required=True, choices=["torch", "torch-csv", "torchtitan", "megatron", "deepspeed"],
                   help="torch-csv: the plan's action order as the CSV torch's _PipelineScheduleRuntime loads")
    x.add_argument("--instance", help="the instance the plan was made for (its graph gives the execution order)")
    x.add_argument("--model", help="the PyTorch model (as for profile), to read its container's class (torchtitan)")
    x.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help="as for profile")
    x.add_argument("--schedule", help="the torch schedule the plan's chunks run (default 1F1B; torch's names any case, "
                                      "or gpipe/1f1b/interleaved/looped/zb/zbv/dualpipev): torchtitan's "
                                      "pipeline_parallel_schedule; torch-csv: the order to write for a plan that "
                                      "carries none")
    x.add_argument("--microbatches", type=MICROBATCHES, help="m of the order built from --schedule (torch-csv; "
                                                             "default pipeopt.units.DEFAULT_MICROBATCHES = 8)")
    x.add_argument("--out", help="write the JSON here, and the CSV (torch-csv, or torchtitan with an order) and "
                                 "TOML (torchtitan) beside it with suffixes .csv and .toml (default: print the JSON)")
    x.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")

    r = sub.add_parser("run", help="run a plan on torch.distributed.pipelining (one CPU process per stage) and time it")
    r.add_argument("plan", help="a plan JSON (solve --save-plan) or a solve --json result; its stages' recompute "
                                "layers (full) run under torch.utils.checkpoint and are reported")
    r.add_argument("--model", required=True,
                   help="the PyTorch model the plan splits, as for profile (gpt, cnn, ..., or package.module:factory)")
    r.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of the model factory, as given to profile (repeatable)")
    r.add_argument("--instance", help="its profiled instance: execution order and the prediction to compare with")
    r.add_argument("--schedule", help="torch's Schedule1F1B (default) or ScheduleGPipe (any case), for a plan "
                                      "without an action order")
    r.add_argument("--order", metavar="FILE.csv",
                   help="run this action order (torch's compute-only CSV, e.g. from export --to torch-csv, edited or "
                        "not; checked before anything runs) on _PipelineScheduleRuntime, one process per rank; a plan "
                        "that carries its order (solve --schedule free --save-plan) runs it without this")
    r.add_argument("--microbatches", type=MICROBATCHES,
                   help="M (default: the --instance's, else pipeopt.units.DEFAULT_MICROBATCHES = 8)")
    r.add_argument("--iterations", type=_integer("iterations", 1, 10**6), default=5)
    r.add_argument("--warmup", type=_integer("warmup", 0, 10**6), default=2)
    r.add_argument("--json", action="store_true")
    r.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    g = sub.add_parser("grade", help="the split you run today (Megatron layout, torchtitan FQN lists, DeepSpeed parts, "
                                     "torch split_spec): its time and its certified gap to the optimum")
    g.add_argument("path", metavar="INSTANCE", help="the profiled model's instance file (pipeopt profile, a shipped "
                                                    "instance, any file pipeopt reads)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--megatron-layout", metavar="LAYOUT", help="Megatron-LM pipeline_model_parallel_layout, e.g. "
                                                                 "'Et*3|t*3L' (E embedding, t block, L output + loss)")
    src.add_argument("--torchtitan", metavar="FILE", help="torchtitan module_fqns_per_model_part: a JSON list of lists "
                                                          "of FQNs (or an export --to torchtitan JSON, or a TOML)")
    src.add_argument("--deepspeed-parts", metavar="PARTS", help="DeepSpeed PipelineModule parts over the instance's "
                                                                "layers in execution order, e.g. 0,5,9,13 (or a JSON)")
    src.add_argument("--split-spec", metavar="FILE", help="torch split_spec: a JSON {fqn: beginning|end} (or an export "
                                                          "--to torch JSON)")
    g.add_argument("--schedule", help="grade under this torch schedule (1F1B, GPipe, Interleaved1F1B, ZBVZeroBubble, "
                                      "...; any case): the schedule executor and the schedule problem; default: the "
                                      "instance's objective (partition problem)")
    g.add_argument("--microbatches", type=MICROBATCHES, help="m with --schedule (default: the instance's)")
    g.add_argument("--stages-per-rank", type=_integer("stages per rank", 1, 64),
                   help="v with --schedule (default: the schedule's own, 2 for the multi-stage ones)")
    g.add_argument("--method", help="the exact method (default: the problem's default)")
    g.add_argument("--time-limit", type=parse_seconds, default=60.0,
                   help="seconds for the exact solve (default 60; none: until proven); at the limit the gap is "
                        "taken to the solver's lower bound and said so")
    g.add_argument("--solver", default="auto", choices=["auto", "cbc", "highs"],
                   help="MILP backend (default auto: HiGHS for the schedule problem, CBC for the others)")
    g.add_argument("--json", action="store_true")
    g.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")
    _add_profile(sub)
    return ap


def _instance(args):
    from .io import load

    devices = max(getattr(args, "stages", None) or 0, getattr(args, "workers", None) or 0, 16)
    inst = load(args.path, devices=devices, bandwidth=args.bandwidth, memory=args.memory,
                latency=getattr(args, "latency", None))
    given = {k: getattr(args, k, None) for k in ("zero", "dp", "gradient_ratio", "optimizer_ratio")}
    given = {k: v for k, v in given.items() if v is not None}  # --zero, --dp, ... (solve, simulate)
    if given.get("zero") == "auto":  # chosen by _solve (partition dp / auto), one exact solve per stage
        if args.command != "solve":
            raise InvalidProblemError("--zero auto chooses the ZeRO stage with the split (pipeopt solve); give 0..3")
        del given["zero"]
    return inst.with_settings(**given) if given else inst


def _solve(args, inst):
    """Solve the problem the arguments name (``auto``: the one the cluster is made for) with
    its first exact method unless ``--method`` names one, through :func:`pipeopt.solve`."""
    from .solve import solve

    problem = registry.auto_problem(inst) if args.problem == "auto" else args.problem
    args.problem = problem
    stages, workers = getattr(args, "stages", None), getattr(args, "workers", None)
    replication = getattr(args, "replication", False)
    recompute = getattr(args, "recompute", None)
    unused = [f"--{name}" for name in
              registry.unused_options(problem, stages=stages, workers=workers, replication=replication,
                                      recompute=recompute)]
    if unused:  # an option is never silently ignored
        raise InvalidProblemError(
            f"the {problem} problem does not use {' or '.join(unused)}; pick the problem with --problem, or drop the option"
        )
    size = registry.sizes(problem, inst, stages=[stages] if stages is not None else None,
                          workers=[workers] if workers is not None else None)[0]
    if "replication" in registry.options_of(problem):
        size["replication"] = replication
    if recompute is not None:
        size["recompute"] = recompute
    zero = _zero_option(args)
    args.method = args.method or registry.default_method(problem, ("zero",) if zero else ())
    return solve(inst, problem=problem, method=args.method, zero=zero, time_limit=args.time_limit, solver=args.solver,
                 seed=args.seed, **size)


def _plan(args, inst):
    from .errors import ReadError
    from .plan import Plan

    if getattr(args, "plan", None):
        try:
            with open(args.plan, encoding="utf-8") as fh:
                data = json.loads(fh.read())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ReadError(f"cannot read plan {args.plan}: {exc}") from None
        if isinstance(data, dict) and "plan" in data:  # a solve --json output
            data = data["plan"]
        try:
            return Plan.from_dict(data)
        except PipeoptError as exc:
            raise ReadError(f"plan file {args.plan}: {exc}") from None
    res = _solve(args, inst)
    if res.plan is None:
        raise PipeoptError(f"{args.method} found no plan ({res.status})")
    return res.plan


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def cmd_bench(args) -> int:
    """``pipeopt bench``: run methods on instances, print the table and the per-method summary, write the rows."""
    from . import bench

    if args.time_limit is None and not args.full:
        raise InvalidProblemError(
            "pipeopt bench needs a finite --time-limit: it is also the search baselines' budget (MCMC)"
        )
    paths = args.paths or bench.default_instances()
    if not paths:
        raise PipeoptError("no instances given and none shipped in ./instances (run `pipeopt zoo`)")
    _check_writable(args.out)
    problem = "schedule" if args.schedule and args.problem == "auto" else args.problem
    df = bench.run(  # writes each row to --out as it finishes, then all rows in order
        paths,
        problem=problem,
        stages=args.stages,
        workers=args.workers,
        methods=args.methods or None,
        every_method=args.full,
        time_limit=60.0 if args.full else args.time_limit,
        solver=args.solver,
        replication=args.replication,
        bandwidth=args.bandwidth,
        memory=args.memory,
        latency=args.latency,
        seed=args.seed,
        progress=not args.no_progress,
        jobs=args.jobs,
        dask=args.dask,
        out=args.out,
        resume=args.resume,
        schedule=args.schedule,
        microbatches=args.microbatches,
        stages_per_rank=args.stages_per_rank,
        w_placement=args.w_placement,
        placement=args.placement,
    )
    if df.empty:
        raise InvalidProblemError("no rows: every instance or size was skipped (see the messages above)")
    out = args.out
    print(bench.table(df))
    print("\nper method (gaps to the best proven bound in the same or a larger space):")
    print(bench.summary(df).to_string(index=False, na_rep="-"))
    print(f"\n{len(df)} rows written to {out}")
    return 0


def _zero_option(args) -> str | None:
    """``"auto"`` if ``--zero auto`` was given (the solve chooses the stage), else ``None`` (a
    ``--zero 0..3`` is already in the instance's settings, :func:`_instance`)."""
    return "auto" if getattr(args, "zero", None) == "auto" else None


def _with_chosen_zero(inst, res):
    """``(instance, zero_auto)``: with ``--zero auto`` the instance with the ZeRO stage ``res``
    chose (the one its plan runs on) and ``res.info["zero_auto"]``; else ``(inst, None)``."""
    zero_auto = res.info.get("zero_auto") if res is not None else None
    return (inst.with_settings(zero=zero_auto["chosen"]) if zero_auto else inst), zero_auto


def _zero_auto_line(zero_auto: dict) -> str:
    """The line that says which ZeRO stage ``--zero auto`` chose and each stage's result."""
    tried = ", ".join(f"ZeRO-{z} {v * 1e3:.4f} ms" if isinstance(v, float) else f"ZeRO-{z} {v}"
                      for z, v in zero_auto["stages"].items())
    return f"  ZeRO stage chosen: {zero_auto['chosen']} (each solved exactly: {tried})"


def _solve_schedule(args, inst) -> int:
    """``pipeopt solve --schedule NAME|auto`` (or ``--problem schedule``): the schedule problem
    through the one door - :func:`pipeopt.solve` for one schedule,
    :func:`pipeopt.problems.schedule.choose.solve_schedules` (every schedule under one
    deadline, ``--time-limit`` for all of them) for ``auto`` - a table of the results and the
    least iteration time."""
    from .problems.schedule.choose import best_schedule, schedule_name_or_auto, schedule_table, solve_schedules
    from .solve import solve

    if args.workers or args.replication:
        raise InvalidProblemError("--schedule splits a schedule's chunks on --stages ranks;"
                                  " drop --workers, --replication")
    if args.problem not in ("auto", "schedule"):
        raise InvalidProblemError(f"--schedule poses the schedule problem; drop --problem {args.problem}")
    recompute = getattr(args, "recompute", None)
    registry.refuse_unused("schedule", recompute=recompute)  # never silently ignored
    which = schedule_name_or_auto(args.schedule or "1F1B")
    options = {"stages_per_rank": args.stages_per_rank, "w_placement": args.w_placement}
    if recompute is not None:  # one named schedule: its methods exhaustive / auto choose the recompute sets
        if which == "auto":
            raise InvalidProblemError("--recompute needs one named --schedule (--schedule auto compares schedules by"
                                      " their MILPs, which do not model recomputation)")
        options["recompute"] = recompute
    if args.placement is not None:
        if which != "free":
            raise InvalidProblemError(f"--placement is for --schedule free; {which} has its own placement")
        options["placement"] = args.placement
    zero = _zero_option(args)
    if which == "auto":
        if zero:
            raise InvalidProblemError("--zero auto needs one named --schedule (each schedule's ZeRO stage is chosen"
                                      " by its own four exact solves); or give --zero 0..3")
        results = solve_schedules(inst, args.stages, args.microbatches, None, time_limit=args.time_limit,
                                  solver=args.solver, seed=args.seed, method=args.method or "milp", **options)
    else:
        results = [solve(inst, problem="schedule", method=args.method, zero=zero, time_limit=args.time_limit,
                         solver=args.solver, seed=args.seed, schedule=which, stages=args.stages,
                         microbatches=args.microbatches, **options)]
    best, proven = best_schedule(results)
    inst, zero_auto = _with_chosen_zero(inst, best)
    if args.save_plan and best is not None:
        _write(args.save_plan, lambda path: path.write_text(json.dumps(best.plan.to_dict(), indent=1)))
    if args.json:
        rows = [{"schedule": r.info["schedule"], "method": r.method, "status": str(r.status),
                 "iteration_time": r.objective if r.plan is not None else None, "lower_bound": r.lower_bound,
                 "starts": r.info["starts"], "runtime": r.runtime, "w_placement": r.info.get("w_placement"),
                 "space": r.space,
                 "recompute": None if r.plan is None else [st.recompute for st in r.plan.stages],
                 "zero_auto": r.info.get("zero_auto"),
                 "order": None if r.evaluation is None else [[str(a) for a in r.evaluation.schedule.actions(k)]
                                                             for k in range(r.evaluation.schedule.ranks)]}
                if not isinstance(r, tuple) else {"schedule": r[0], "refused": r[1]}
                for r in results]
        print(json.dumps(_jsonable({"best": best.info["schedule"] if best else None, "proven_best": proven,
                                    "schedules": rows})))
        return 0
    ranks = args.stages or len(inst.cluster.devices)
    m = args.microbatches or inst.settings.microbatches
    print(f"{inst.name}: {inst.num_layers} layers, {ranks} ranks, {m} microbatches")
    print(schedule_table(results))
    if best is None:
        done = [r for r in results if not isinstance(r, tuple)]
        if done and all(str(r.status) == "infeasible" for r in done):  # proven: an error that says by how much
            raise InfeasibleError("no schedule has a split that fits: " + "; ".join(
                f"{r.info['schedule']}: {r.info.get('note') or 'proven infeasible'}" for r in done))
        print("no schedule has a split that fits (none proven infeasible: see the statuses)")
        return 0
    how = "proven least" if proven else "least found (not proven: see the bounds)"
    print(f"\nbest: {best.info['schedule']}, iteration {best.objective * 1e3:.4f} ms ({how})")
    if zero_auto:
        print(_zero_auto_line(zero_auto))
    print(best.evaluation.summary())
    if best.info.get("schedule") == "free":
        print("action order (chosen with the split):\n" + "\n".join(str(best.evaluation.schedule).splitlines()[1:]))
    elif best.info.get("w_placement") == "free":
        print("action order (W's placed with the split):\n" + "\n".join(str(best.evaluation.schedule).splitlines()[1:]))
    print("\n".join(best.evaluation.chunk_lines(best.plan)))
    return 0


def cmd_solve(args) -> int:
    """``pipeopt solve``: solve one instance; print the plan stage by stage, or one JSON object."""
    if args.save_plan:
        _check_writable(args.save_plan)
    inst = _instance(args)
    if getattr(args, "schedule", None) or args.problem == "schedule":
        return _solve_schedule(args, inst)
    res = _solve(args, inst)
    inst, zero_auto = _with_chosen_zero(inst, res)
    if args.save_plan and res.plan is not None:
        _write(args.save_plan, lambda path: path.write_text(json.dumps(res.plan.to_dict(), indent=1)))
    if args.json:
        d = res.to_dict()
        if res.evaluation is not None:
            d["stage_details"] = [
                {
                    "layers": list(st.layers),
                    "bwd_layers": list(st.backward_layers),
                    "devices": list(st.devices),
                    "replicas": st.replicas,
                    "beta": st.beta,
                    "recompute": st.recompute,
                    "time": res.evaluation.stage_time[i],
                    **({"load": res.evaluation.load[i]} if res.evaluation.load else {}),
                    "memory": res.evaluation.memory[i],
                }
                for i, st in enumerate(res.plan.stages)
            ]
        print(json.dumps(_jsonable(d)))
    else:
        print(f"{inst.name}: {inst.num_layers} layers, {args.problem}")
        print(res.summary())
        if zero_auto:
            print(_zero_auto_line(zero_auto))
        for a in inst.assumptions + inst.cost_terms:
            print(f"  assumed: {a}")
    return 0


def cmd_simulate(args) -> int:
    """``pipeopt simulate``: simulate one iteration of a solved or saved plan; text or JSON."""
    from .simulate import simulate

    if args.gantt:
        _check_writable(args.gantt)
    inst = _instance(args)
    plan = _plan(args, inst)
    sim = simulate(inst, plan, schedule=args.schedule, microbatches=args.microbatches)
    if args.gantt:
        from .plot import plot_schedule

        _write(args.gantt, lambda path: plot_schedule(sim, path=path))
    if args.json:
        d = sim.to_dict()
        d.pop("events", None)
        print(json.dumps(_jsonable(d)))
    else:
        print(sim.summary() if hasattr(sim, "summary") else sim)
    return 0


def cmd_show(args) -> int:
    """``pipeopt show``: draw a plan (per-stage loads) or the Gantt chart of its schedule to a PNG."""
    from . import plot

    _check_writable(args.out)
    inst = _instance(args)
    plan = _plan(args, inst)
    if args.schedule:
        from .simulate import simulate

        sim = simulate(inst, plan, schedule=args.schedule, microbatches=args.microbatches)
        _write(args.out, lambda path: plot.plot_schedule(sim, path=path))
    else:
        _write(args.out, lambda path: plot.plot_plan(inst, plan, path=path))
    print(f"wrote {args.out}")
    return 0


def cmd_zoo(args) -> int:
    """``pipeopt zoo``: regenerate the shipped instance files from the model zoo."""
    from .zoo.__main__ import main as zoo_main

    _check_writable(os.path.join(args.out, "README.md"))
    try:
        return zoo_main([args.out])
    except OSError as exc:
        raise WriteError(f"cannot write the instances to {args.out}: {exc}") from None


def _add_profile(sub) -> None:
    """The ``profile`` subcommand's options (torch is imported only when it runs)."""
    p = sub.add_parser("profile", help="profile a PyTorch model into an instance file (needs torch)")
    p.add_argument("model", help="a shipped model (gpt, cnn, gpt-tiny, cnn-tiny), hf:ClassName (a Hugging Face "
                                 "transformers model from its config class, random weights: hf:GPT2LMHeadModel), "
                                 "tv:name (a torchvision model, random weights: tv:resnet50, tv:vit_b_16), "
                                 "or package.module:factory returning (nn.Module, example_inputs); the current "
                                 "folder is searched for package")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword argument of the model factory (repeatable), e.g. --model-arg layers=4; for hf: a "
                        "config field (n_layer=12) or an input size: batch (default 2), seq (tokens, default 128), "
                        "image (pixels); for tv: batch, image (default 224) or a builder argument (num_classes=10)")
    p.add_argument("--granularity", default="auto",
                   help="auto (default: the longest list of repeated blocks, found in the model), container:NAME "
                        "(the children of module NAME plus the modules around it; NAME1,NAME2 for several), "
                        "children, or leaves")
    p.add_argument("--tracing", default="auto", choices=["auto", "fx", "hooks"],
                   help="how the layer graph is obtained: torch.fx, module hooks (one run of the model), or auto "
                        "(default: fx, hooks where fx cannot trace)")
    p.add_argument("--costs", default="measured", choices=["measured", "estimated"],
                   help="measured on this CPU (default) or estimated from FLOPs for --device")
    p.add_argument("--device", help="catalogue device for estimated costs (e.g. a100-40gb)")
    p.add_argument("--devices", type=COUNT, default=2, help="S identical devices in the cluster (default 2)")
    p.add_argument("--bandwidth", type=_profile_rate,
                   help="bytes/s between workers (1e9, 10Gbps, a link name for estimated costs), or 'measure': "
                        "the latency and the bandwidth fitted on a gloo ping-pong between two local processes at "
                        "sizes up to the largest edge, and the collectives' bus bandwidth on a gloo all-reduce")
    p.add_argument("--latency", type=parse_latency,
                   help="seconds per message between workers (0.3ms, 3e-4; default 0, or measured with "
                        "--bandwidth measure)")
    p.add_argument("--memory", type=parse_bytes, help="per device: bytes, 16GiB, or inf")
    p.add_argument("--repeats", type=_integer("repeats", 1, 10**6), default=10,
                   help="timed runs per layer (default 10)")
    p.add_argument("--warmup", type=_integer("warmup", 0, 10**6), default=3,
                   help="untimed runs per layer first (default 3)")
    p.add_argument("--threads", type=_integer("threads", 1, 1024), default=1,
                   help="torch threads while measuring (default 1)")
    p.add_argument("--optimizer", default="adam-fp32", choices=["adam-fp32", "adam-mixed", "sgd", "weights"],
                   help="training state folded into param_bytes (default adam-fp32)")
    p.add_argument("--microbatches", type=MICROBATCHES,
                   help="M per iteration written into the instance (default pipeopt.units.DEFAULT_MICROBATCHES = 8)")
    p.add_argument("--out", default="instance.json", help="instance file to write (default instance.json)")
    p.add_argument("--debug", action="store_true", help="print the traceback of an unexpected error")


def _profile_rate(text: str):
    """argparse type of ``profile --bandwidth``: ``measure``, a link name, or a rate."""
    if text == "measure":
        return text
    from .zoo.devices import LINKS

    return text if text in LINKS else parse_rate(text)


def _factory_kwargs(items: list[str]) -> dict:
    """``--model-arg KEY=VALUE`` pairs; values read as Python literals (``4``, ``0.1``, ``(2, 2)``,
    ``True``; also ``true``/``false``), else strings."""
    import ast

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise InvalidProblemError(f"--model-arg needs KEY=VALUE with KEY a Python name, got {item!r}")
        if value.strip().lower() in ("true", "false"):
            out[key] = value.strip().lower() == "true"
            continue
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


SHIPPED_MODELS = ("cnn", "cnn-tiny", "gpt", "gpt-tiny")
"""The names of :data:`pipeopt.torch.models.MODELS` (checked equal by the tests), known here so
that a misspelt name is reported before torch is imported."""


def _check_model(spec) -> None:
    """Refuse an unknown shipped model name before anything imports torch.

    Raises
    ------
    InvalidProblemError
        If ``spec`` is neither a shipped name, ``hf:ClassName``, ``tv:name`` nor
        ``package.module:factory``.
    """
    if isinstance(spec, str) and ":" not in spec and spec not in SHIPPED_MODELS:
        raise InvalidProblemError(f"unknown shipped model {spec!r}; pipeopt ships {list(SHIPPED_MODELS)} (or give "
                                  "hf:ClassName, a Hugging Face transformers model, tv:name, a torchvision model, or "
                                  "package.module:factory)")


def cmd_profile(args) -> int:
    """``pipeopt profile``: :func:`pipeopt.torch.from_torch` on a shipped or importable model,
    written as a native instance file."""
    _check_model(args.model)
    kwargs = _factory_kwargs(args.model_arg)
    from .io.native import write_instance
    from .torch import from_torch
    from .torch.models import load

    out = _check_writable(args.out)
    module, inputs = load(args.model, **kwargs)
    measure = args.bandwidth == "measure"
    inst = from_torch(module, inputs, granularity=args.granularity, tracing=args.tracing, costs=args.costs,
                      device=args.device,
                      devices=args.devices, bandwidth=None if measure else args.bandwidth, memory=args.memory,
                      repeats=args.repeats, warmup=args.warmup, threads=args.threads, optimizer=args.optimizer,
                      microbatches=args.microbatches)
    if measure:
        from .torch.network import measure_link

        size = int(max((b for _, _, b in inst.graph.edges(data="bytes")), default=1 << 20))
        link = measure_link(largest=max(size, 64))
        latency = link.latency if args.latency is None else args.latency
        inst = inst.replace(
            cluster=inst.cluster.with_overrides(bandwidth=link.bandwidth, latency=latency,
                                                collective_bandwidth=link.collective_bandwidth),
            assumptions=tuple(a for a in inst.assumptions if not a.startswith("bandwidth "))
            + (f"measured: {link.describe()}"
               + ("" if args.latency is None else f"; latency given: {latency * 1e3:.4g} ms"),),
        )
    elif args.latency is not None:
        inst = inst.replace(cluster=inst.cluster.with_overrides(latency=args.latency))
    _write(out, lambda path: write_instance(inst, path))
    from .cost.rules import load_time

    g, dev = inst.graph, inst.cluster.devices[0]
    f, b = ({k: sum(d.get(k, math.inf) for _, d in g.nodes(data=key)) for k in dev.resources} for key in ("fwd", "bwd"))
    meta = g.graph["torch"]
    state = sum(p for _, p in g.nodes(data="param_bytes")) + sum(t["state_bytes"] for t in g.graph.get("tied", ()))
    print(f"{inst.name}: {g.number_of_nodes()} layers ({meta['granularity']}, by {meta['tracing']}), "
          f"{g.number_of_edges()} edges; "
          f"forward {load_time(dev.resources, f) * 1e3:.4g} ms, backward {load_time(dev.resources, b) * 1e3:.4g} ms "
          f"per microbatch on one device ({dev.name}); "
          f"{state / 2**20:.4g} MiB of training state")
    for a in inst.assumptions + inst.cost_terms:
        print(f"  assumed: {a}")
    print(f"wrote {out}")
    return 0


def _read_plan_and_instance(args):
    """The plan of ``args.plan`` and the instance of ``args.instance`` (or ``None``)."""
    from .io import load

    plan = _plan(argparse.Namespace(plan=args.plan), None)
    inst = load(args.instance) if args.instance else None
    return plan, inst


def cmd_export(args) -> int:
    """``pipeopt export``: a saved plan in a runtime's format (:mod:`pipeopt.export`), as JSON."""
    from .export import export

    if args.model:
        _check_model(args.model)
    if args.out:
        _check_writable(args.out)
    plan, inst = _read_plan_and_instance(args)
    module = None
    if args.model:
        from .torch.models import load

        module = load(args.model, **_factory_kwargs(args.model_arg))[0]
    from pathlib import Path

    csv_path = str(Path(args.out).with_suffix(".csv").resolve()) if args.out else None
    out = export(plan, args.to, graph=inst.graph if inst is not None else None, module=module, schedule=args.schedule,
                 microbatches=args.microbatches, csv_path=csv_path)
    text = json.dumps(out, indent=1)
    if args.out:
        from .export import write

        written = []
        _write(args.out, lambda path: written.extend(write(out, path)))
        print("wrote " + ", ".join(map(str, written)))
    else:
        print(text)
    return 0


RUN_DIFFERS = 3
"""Exit code of ``pipeopt run`` when the run finished but the stages torch built are not the
plan's (e.g. a tied weight's layer built into two stages)."""


def cmd_run(args) -> int:
    """``pipeopt run``: run a saved plan on torch.distributed.pipelining and compare with the prediction."""
    _check_model(args.model)
    from .torch.runtime import run_plan

    plan, inst = _read_plan_and_instance(args)
    report = run_plan(plan, args.model, model_kwargs=_factory_kwargs(args.model_arg), instance=inst,
                      schedule=args.schedule, microbatches=args.microbatches, iterations=args.iterations,
                      warmup=args.warmup, order=args.order)
    print(json.dumps(_jsonable(report.to_dict())) if args.json else report.summary())
    if not report.membership_matches:  # the time measured is not the plan's
        print(f"pipeopt: error: the stages built differ from the plan ({report.membership_message()}): the measured "
              "time is not the plan's", file=sys.stderr)
        return RUN_DIFFERS
    return 0


def cmd_grade(args) -> int:
    """``pipeopt grade``: a user's split in its framework's format, scored and set against the proven
    optimum (:mod:`pipeopt.grade`)."""
    from . import grade as g
    from .io import load

    inst = load(args.path)
    if args.megatron_layout is not None:
        layout = g.from_megatron(inst, args.megatron_layout)
    elif args.torchtitan is not None:
        layout = g.from_torchtitan(inst, g.read_torchtitan(args.torchtitan))
    elif args.deepspeed_parts is not None:
        layout = g.from_deepspeed(inst, g.read_deepspeed_parts(args.deepspeed_parts))
    else:
        layout = g.from_split_spec(inst, g.read_split_spec(args.split_spec))
    if args.schedule is None and (args.microbatches is not None or args.stages_per_rank is not None):
        raise InvalidProblemError("--microbatches and --stages-per-rank go with --schedule")
    result = g.grade(inst, layout, schedule=args.schedule, microbatches=args.microbatches,
                     stages_per_rank=args.stages_per_rank, method=args.method, time_limit=args.time_limit,
                     solver=args.solver)
    print(json.dumps(_jsonable(result.to_dict()), indent=1) if args.json else result.summary())
    return 0


def _check_writable(path):
    """Fail before any work if ``path`` cannot be written (its folder is created if missing).

    Raises
    ------
    WriteError
        If the folder cannot be created, ``path`` is a folder, or either is read-only.
    """
    from pathlib import Path  # not at import: a solve of a profile never writes

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: cannot create its folder: {exc.strerror or exc}") from None
    if path.is_dir():
        raise WriteError(f"cannot write {path}: it is a folder")
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise WriteError(f"cannot write {path}: permission denied")
    return path


def _write(path, write) -> None:
    """Call ``write(path)``; an ``OSError`` becomes a :class:`WriteError` naming the file."""
    from pathlib import Path

    try:
        write(Path(path))
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None


BLAS_THREADS = {"OPENBLAS_NUM_THREADS": "1"}
"""Set (unless already set) by the planning commands before numpy is first imported: numpy's
OpenBLAS starts a pool of threads when it loads, about 0.03 CPU-s of a command's 0.15-0.2 s
on a 2-core machine, and planning does no matrix product large enough to use it. The Python
API and the torch commands (``run``, ``profile``) are left as they are."""


def _one_blas_thread(command: str) -> None:
    """:data:`BLAS_THREADS` for a planning command, if numpy is not imported yet."""
    if command not in ("run", "profile") and "numpy" not in sys.modules:
        for key, value in BLAS_THREADS.items():
            os.environ.setdefault(key, value)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pipeopt`` console script; returns the exit code.

    Exit codes: 0 done (also when the reader of the output stops early, as ``| head`` does);
    2 bad input or an impossible request (``pipeopt: error: <message>`` on stderr: a usage
    error, or any :class:`~pipeopt.errors.PipeoptError`); 1 an unexpected exception, a bug in
    pipeopt (one line naming it; ``--debug`` prints the traceback); 3 ``pipeopt run`` finished but
    the stages built differ from the plan (:data:`RUN_DIFFERS`); 130 interrupted.
    """
    try:
        words = sys.argv[1:] if argv is None else argv
        only = words[0] if words and words[0] in COMMANDS else None  # the command first: build only its parser
        args = build_parser(only).parse_args(argv)
    except SystemExit as exc:  # argparse: usage error (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else 2
    _one_blas_thread(args.command)
    debug = getattr(args, "debug", False)
    handler = {"bench": cmd_bench, "solve": cmd_solve, "simulate": cmd_simulate, "show": cmd_show, "zoo": cmd_zoo,
               "export": cmd_export, "run": cmd_run}
    handler["profile"] = cmd_profile
    handler["grade"] = cmd_grade
    try:
        return handler[args.command](args)
    except PipeoptError as exc:
        if debug:
            traceback.print_exc()
        print(f"pipeopt: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 0
    except KeyboardInterrupt:
        print("pipeopt: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback for users
        if debug:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
        print(
            f"pipeopt: internal error (a bug in pipeopt; please report it with the output of --debug): "
            f"{type(exc).__name__}: {first}",
            file=sys.stderr,
        )
        return 1


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so that the final flush at exit does
    not raise again (Python's documented recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout replaced (tests) or already closed
        pass


if __name__ == "__main__":
    sys.exit(main())
