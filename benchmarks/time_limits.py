"""Do the exact methods keep their time limit? (issue 7, "One clock")

Runs every exact method of the partition and Bi-Partition problems through
:func:`pipeopt.solve` on NASNet-A Large and DenseNet-121 with S = 16, and every exact method of
the joint and group problems on shipped heterogeneous instances (joint: GoogLeNet on 4 Jetson
AGX Orin, S = 4; group: GoogLeNet on 16 edge SoCs and AlexNet on 8, q = 4 workers), with time
limits 1, 5 and 20 s (MILP methods on CBC and on HiGHS; the others once), and prints one row
per run: problem, instance, method, solver, limit, wall time measured around
the call, status, objective and bound (ms), and whether the wall time is inside the
contract ``max(limit + 1 s, 1.1 * limit)``.

Each run happens in a child process with a hard cap (``--hard-cap``, default
``5 * limit + 30`` s): a method that overruns badly is ended (with every process it started)
and reported as ``hung``, so the table always completes.

Usage::

    python benchmarks/time_limits.py [--limits 1 5 20] [--stages 16]
        [--instances nasnetalarge densenet121] [--problems partition bipartition]
        [--methods milp cpsat] [--solvers cbc highs] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing as mp
import os
import signal
import sys
import time
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
INSTANCES = ("nasnetalarge", "densenet121")
PROBLEMS = ("partition", "bipartition", "joint", "group")
INSTANCE_DIR = Path(__file__).resolve().parents[1] / "instances" / "heterogeneous"
RESOURCE_CASES = {  # problem -> (shipped instance, problem options)
    "joint": [("googlenet-jetson-agx-orin-x4", {"stages": 4})],
    "group": [("googlenet-soc-mix16", {"workers": 4}), ("alexnet-soc-mix8", {"workers": 4})],
}
LIMITS = (1.0, 5.0, 20.0)
MILP_SOLVERS = ("cbc", "highs")
SOLVER_METHODS = {"milp"}  # methods whose backend is chosen by ``solver``


def contract(limit: float) -> float:
    """The wall time an exact method must return within: ``max(limit + 1 s, 1.1 * limit)``."""
    return max(limit + 1.0, 1.1 * limit)


def runs(problems, methods, solvers):
    """(problem, method, solver) of every exact method to run; solver ``"-"`` if unused."""
    from pipeopt import registry

    out = []
    for problem in problems:
        for m in registry.methods(problem):
            if not m.exact or (methods and m.name not in methods):
                continue
            for solver in solvers if m.name in SOLVER_METHODS else ["-"]:
                out.append((problem, m.name, solver))
    return out


def _child(queue, path, problem, method, solver, limit, options):
    """Run one solve in this (child) process and put its row on ``queue``."""
    os.setpgrp()  # own process group: the parent can end everything this run starts
    import pipeopt

    # a profile gets one device per stage (its reader's default cluster is smaller than S = 400)
    devices = {"devices": options["stages"]} if Path(path).suffix == ".txt" and "stages" in options else {}
    inst = pipeopt.read(path, **devices)
    t0 = time.perf_counter()
    try:
        res = pipeopt.solve(inst, problem=problem, method=method, time_limit=limit,
                            solver=solver if solver != "-" else "cbc", **options)
        wall = time.perf_counter() - t0
        objective = res.objective if res.evaluation is not None else None
        queue.put({"wall": wall, "status": str(res.status), "objective": objective,
                   "bound": res.lower_bound, "runtime": res.runtime})
    except Exception as exc:  # noqa: BLE001 - reported in the table
        wall = time.perf_counter() - t0
        queue.put({"wall": wall, "status": f"error: {type(exc).__name__}: {str(exc)[:200]}",
                   "objective": None, "bound": None, "runtime": None})


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _end_all(proc) -> None:
    """End a child run and everything it started (also solvers in their own sessions)."""
    victims = _descendants(proc.pid)
    for pid in [proc.pid, *victims]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.join()


def run_one(path, problem, method, solver, limit, options, hard_cap) -> dict:
    """One row: the run's facts, or ``hung`` if it overran ``hard_cap`` seconds."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue, path, problem, method, solver, limit, options))
    t0 = time.perf_counter()
    proc.start()
    try:
        row = queue.get(timeout=hard_cap)
        proc.join()
    except Exception:  # noqa: BLE001 - queue.Empty: the run overran the hard cap
        _end_all(proc)
        row = {"wall": time.perf_counter() - t0, "status": f"hung (ended after {hard_cap:.0f} s)",
               "objective": None, "bound": None, "runtime": None}
    return row


def _ms(x):
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", type=float, nargs="+", default=list(LIMITS))
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--instances", nargs="+", default=list(INSTANCES))
    ap.add_argument("--problems", nargs="+", default=list(PROBLEMS))
    ap.add_argument("--methods", nargs="+", default=None, help="exact methods to run (default: all)")
    ap.add_argument("--solvers", nargs="+", default=list(MILP_SOLVERS))
    ap.add_argument("--hard-cap", type=float, default=None,
                    help="seconds before a run is ended as hung (default 5 * limit + 30)")
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args(argv)

    plan = runs(args.problems, args.methods, args.solvers)
    header = ("problem", "instance", "method", "solver", "limit_s", "wall_s", "status",
              "objective_ms", "bound_ms", "inside")
    print(f"partition/bipartition S = {args.stages}; joint/group as RESOURCE_CASES; contract: wall <= max(limit + 1 s, 1.1 * limit)")
    print(f"{'problem':<12}{'instance':<23}{'method':<10}{'solver':<7}{'limit':>6}{'wall':>8}  "
          f"{'status':<24}{'objective':>11}{'bound':>11}  inside")
    rows = []
    cases = []  # (instance name, path, problem, method, solver, options)
    for problem, method, solver in plan:
        if problem in RESOURCE_CASES:
            for name, options in RESOURCE_CASES[problem]:
                cases.append((name, INSTANCE_DIR / f"{name}.json", problem, method, solver, options))
        else:
            for name in args.instances:
                cases.append((name, PROFILE_DIR / f"{name}.txt", problem, method, solver, {"stages": args.stages}))
    for limit in args.limits:
        for name, path, problem, method, solver, options in cases:
            cap = args.hard_cap if args.hard_cap is not None else 5 * limit + 30
            r = run_one(path, problem, method, solver, limit, options, cap)
            failed = r["status"].startswith(("error", "hung"))
            inside = "yes" if r["wall"] <= contract(limit) else "NO"
            row = (problem, name, method, solver, limit, round(r["wall"], 3), r["status"],
                   _ms(r["objective"]), _ms(r["bound"]), "error" if failed else inside)
            rows.append(row)
            print(f"{problem:<12}{name[:22]:<23}{method:<10}{solver:<7}{limit:>6g}{r['wall']:>8.2f}  "
                  f"{r['status'][:24]:<24}{row[7]:>11}{row[8]:>11}  {row[9]}", flush=True)
            if len(r["status"]) > 24:
                print(f"    {r['status']}", flush=True)
    if args.csv is not None:
        with open(args.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(header)
            w.writerows(rows)
    inside = sum(r[-1] == "yes" for r in rows)
    failed = sum(r[-1] == "error" for r in rows)
    print(f"\n{inside} of {len(rows)} runs inside the contract ({failed} failed or hung)")
    return 0 if inside == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
