"""``pipeopt`` command line: ``bench`` (the main job), ``solve``, ``simulate``, ``show``, ``zoo``."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from . import registry
from .errors import PipeoptError

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> float:
    """``"16GiB"``, ``"80e9"``, ``"1.5 GB"`` -> bytes (float); ``"inf"`` for no limit."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?|inf)\s*([kmgt]i?b|b)?\s*", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"not a byte amount: {text!r} (e.g. 16GiB, 80e9)")
    return float(m[1]) * _UNITS[m[2] or ""]


def parse_rate(text: str) -> float:
    """``"1.25e10"`` or ``"100Gbit"``/``"12.5GB"`` per second -> bytes/s."""
    t = text.lower().removesuffix("/s").removesuffix("ps")
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?\d+)?)\s*(gbit|mbit|gb|mb|b)?\s*", t)
    if not m:
        raise argparse.ArgumentTypeError(f"not a bandwidth: {text!r} (bytes/s, e.g. 1.25e10, 100Gbit, 12.5GB)")
    scale = {"gbit": 1e9 / 8, "mbit": 1e6 / 8, "gb": 1e9, "mb": 1e6, "b": 1, None: 1}[m[2]]
    value = float(m[1]) * scale
    if value <= 0:
        raise argparse.ArgumentTypeError("bandwidth must be > 0")
    return value


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--problem",
        default="auto",
        choices=["auto", *sorted(registry.PROBLEMS)],
        help="problem (default auto: partition on identical one-kind devices, joint on identical "
        "multi-kind devices, group on heterogeneous devices)",
    )
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve (default 60)")
    p.add_argument("--solver", default="cbc", choices=["cbc", "highs"], help="MILP backend (default cbc)")
    p.add_argument("--replication", action="store_true", help="allow PipeDream stage replication (partition)")
    p.add_argument("--bandwidth", type=parse_rate, help="bytes/s between workers (overrides the file)")
    p.add_argument("--memory", type=parse_bytes, help="memory per device, e.g. 16GiB (overrides the file)")
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the ``pipeopt`` command."""
    ap = argparse.ArgumentParser(prog="pipeopt", description="Exact pipeline-parallel planning and heuristic gaps.")
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="run methods on instances and print a table (default: shipped instances)")
    b.add_argument("paths", nargs="*", help="instance files (.json) or PipeDream profiles (.txt)")
    b.add_argument("--stages", type=int, nargs="+", help="pipeline depths S (default: the cluster size)")
    b.add_argument("--workers", type=int, nargs="+", help="worker counts q (group problem)")
    b.add_argument("--methods", nargs="+", help="methods (default: the problem's default set)")
    b.add_argument("--out", default="results/bench.csv", help="CSV (or .parquet) for the rows (default results/bench.csv)")
    b.add_argument("--full", action="store_true", help="full benchmark: every method, time limit 60 s")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(b)

    s = sub.add_parser("solve", help="solve one instance and print the plan stage by stage")
    s.add_argument("path")
    s.add_argument("--stages", type=int, help="S (default: the cluster size)")
    s.add_argument("--workers", type=int, help="q (group problem)")
    s.add_argument("--method", help="method (default: the problem's first exact method)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--save-plan", help="write the plan as JSON (for simulate/show --plan)")
    _common(s)

    m = sub.add_parser("simulate", help="simulate one training iteration of a plan")
    m.add_argument("path")
    m.add_argument("--stages", type=int)
    m.add_argument("--workers", type=int)
    m.add_argument("--method", help="method (default: the problem's first exact method)")
    m.add_argument("--plan", help="a plan JSON written by solve --save-plan (instead of solving)")
    m.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "async", "split"])
    m.add_argument("--microbatches", type=int, default=8)
    m.add_argument("--json", action="store_true")
    m.add_argument("--gantt", help="also write a Gantt chart PNG here")
    _common(m)

    w = sub.add_parser("show", help="draw a plan (per-stage loads) or its schedule to a PNG")
    w.add_argument("path")
    w.add_argument("--stages", type=int)
    w.add_argument("--workers", type=int)
    w.add_argument("--method", help="method (default: the problem's first exact method)")
    w.add_argument("--plan", help="a plan JSON written by solve --save-plan")
    w.add_argument("--out", default="plan.png")
    w.add_argument("--schedule", choices=["gpipe", "1f1b", "async", "split"], help="draw a Gantt chart of this schedule")
    w.add_argument("--microbatches", type=int, default=8)
    _common(w)

    z = sub.add_parser("zoo", help="regenerate the shipped instance files from the model zoo")
    z.add_argument("--out", default="instances")
    return ap


def _instance(args):
    from .bench import load_instance

    devices = max(getattr(args, "stages", None) or 0, getattr(args, "workers", None) or 0, 16)
    return load_instance(args.path, devices=devices, bandwidth=args.bandwidth, memory=args.memory)


def _solve(args, inst):
    from .bench import problem_options, auto_problem, sizes_of
    from .solve import solve

    problem = auto_problem(inst) if args.problem == "auto" else args.problem
    args.problem = problem
    cls = registry.problem_class(problem)
    sizes, qs = sizes_of(cls, inst, [args.stages] if args.stages else None, [args.workers] if args.workers else None)
    opts = problem_options(cls, sizes[0], qs[0], "replicated" if args.replication else "straight")
    method = args.method or next(m.name for m in registry.methods(problem) if m.exact)
    args.method = method
    return solve(inst, problem=problem, method=method, time_limit=args.time_limit, solver=args.solver, seed=args.seed, **opts)


def _plan(args, inst):
    from .plan import Plan

    if getattr(args, "plan", None):
        try:
            data = json.loads(Path(args.plan).read_text())
        except (OSError, ValueError) as exc:
            raise PipeoptError(f"cannot read plan {args.plan}: {exc}") from None
        return Plan.from_dict(data.get("plan", data))
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

    paths = args.paths or bench.default_instances()
    if not paths:
        raise PipeoptError("no instances given and none shipped in ./instances (run `pipeopt zoo`)")
    df = bench.run(
        paths,
        problem=args.problem,
        stages=args.stages,
        workers=args.workers,
        methods=args.methods or (None if not args.full else [m.name for m in registry.methods(args.problem)]),
        time_limit=60.0 if args.full else args.time_limit,
        solver=args.solver,
        replication=args.replication,
        bandwidth=args.bandwidth,
        memory=args.memory,
        seed=args.seed,
        progress=not args.no_progress,
    )
    print(bench.table(df))
    if not df.empty:
        print("\nper method (gaps to the best proven bound in the same space):")
        print(bench.summary(df).to_string(index=False, na_rep="-"))
    out = bench.save_rows(df, args.out)
    print(f"\n{len(df)} rows written to {out}")
    return 0


def cmd_solve(args) -> int:
    """``pipeopt solve``: solve one instance; print the plan stage by stage, or one JSON object."""
    inst = _instance(args)
    res = _solve(args, inst)
    if args.save_plan and res.plan is not None:
        Path(args.save_plan).write_text(json.dumps(res.plan.to_dict(), indent=1))
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
                    "time": res.evaluation.stage_time[i],
                    "memory": res.evaluation.memory[i],
                }
                for i, st in enumerate(res.plan.stages)
            ]
        print(json.dumps(_jsonable(d)))
    else:
        print(f"{inst.name}: {inst.num_layers} layers, {args.problem}")
        print(res.summary())
        for a in inst.assumptions:
            print(f"  assumed: {a}")
    return 0


def cmd_simulate(args) -> int:
    """``pipeopt simulate``: simulate one iteration of a solved or saved plan; text or JSON."""
    from .simulate import simulate

    inst = _instance(args)
    plan = _plan(args, inst)
    sim = simulate(inst, plan, schedule=args.schedule, microbatches=args.microbatches)
    if args.gantt:
        from .plot import plot_schedule

        plot_schedule(sim, path=args.gantt)
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

    inst = _instance(args)
    plan = _plan(args, inst)
    if args.schedule:
        from .simulate import simulate

        plot.plot_schedule(simulate(inst, plan, schedule=args.schedule, microbatches=args.microbatches), path=args.out)
    else:
        plot.plot_plan(inst, plan, path=args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_zoo(args) -> int:
    """``pipeopt zoo``: regenerate the shipped instance files from the model zoo."""
    from .zoo.__main__ import main as zoo_main

    return zoo_main([args.out])


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``pipeopt`` console script; returns the exit code (2 on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        return {"bench": cmd_bench, "solve": cmd_solve, "simulate": cmd_simulate, "show": cmd_show, "zoo": cmd_zoo}[
            args.command
        ](args)
    except PipeoptError as exc:
        print(f"pipeopt: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
