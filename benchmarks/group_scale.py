"""Grouping at scale on random device mixes: how often the default group method proves the
optimum of 64 catalogue devices into 16 workers within 60 s (issue 22, deliver 3).

Method: ``types`` (:func:`pipeopt.problems.resource.group_dp.solve_dp`: a DP over stage, layer
prefix and the count of each device type used, bisected on T; one thread per solve; ``--jobs``
solves side by side). ``optimal`` means the bracket closed to a relative gap of 1e-4; the gap
of a solve stopped by the clock is ``objective / bound - 1`` with the bound the DP *proved*.
``--method milp`` / ``cpsat`` run the group MILP (HiGHS) or CP-SAT (2 threads) instead.

Instances: a model over 64 devices of the catalogue (:mod:`pipeopt.zoo.devices`) into 16 workers.
Each (model, family, seed) draws a mix with :func:`draw_mix` (``random.Random(seed)`` and the
names, so a row is reproduced by its seed alone): 4 device types drawn from the family, and a
random composition of 64 devices over them (each type at least 2, the cut points uniform).

* families: ``server`` (the catalogue's data-centre entries: V100 16/32 GB, A100 40/80 GB, H100,
  T4, EPYC 7763 and the A100+EPYC and T4+Xeon server slices; InfiniBand HDR, 25 GB/s),
  ``edge`` (Jetson AGX Orin, Apple M2, Apple M1, Snapdragon X Elite - all four, random counts;
  CPU + GPU + NPU each; 10 GbE) and ``mixed`` (two types of each; 10 GbE);
* models (fp16; zoo shapes, :mod:`pipeopt.zoo.models`): GPT-2 XL (98 units, microbatch 2),
  ResNet-50 and GoogLeNet (microbatch 32); GNMT from PipeDream's measured profile
  (``/work/shared/data/pipedream-profiles/gnmt.txt``, read in place): a layer's work is its
  measured time x 6.28 TFLOP/s (the profile read as a V100 at its fp32 peak 15.7 TFLOP/s times
  the catalogue's GPU efficiency 0.40 - an assumption), spread over the cluster's kinds with the
  catalogue's efficiencies (:data:`pipeopt.zoo.KINDS`) as the zoo's models are.

Memory per device is the catalogue's; microbatches per iteration 4 x devices (the zoo's default).

Usage (from the repository root)::

    python benchmarks/group_scale.py                   # 2 seeds per (model, family): 24 instances, 2 at a time
    python benchmarks/group_scale.py --full            # 8 seeds per (model, family): 96 instances
        [--seeds 0 1 ...] [--models gpt2-xl ...] [--families edge ...] [--time-limit 60]
        [--method types|milp|cpsat] [--clock wall|cpu] [--out benchmarks/results/group_scale]

``--clock cpu`` makes the solver's deadline count the solve's own CPU seconds instead of wall
seconds (``pipeopt.backends.deadline`` read through ``time.process_time``): on a machine shared
with other work it gives a single-threaded method (``types``) what a quiet machine would; not for
``cpsat`` (several threads).

Writes ``<out>.md`` and ``<out>.csv`` (one row per instance, then the summary: the fraction
proven within the limit, the largest gap, the fraction within 2 %), ``<out>_full.*`` with ``--full``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MODELS = ("gpt2-xl", "resnet50", "gnmt", "googlenet")
FAMILIES = ("server", "edge", "mixed")
SERVER = ("v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "h100-80gb", "t4", "epyc-7763",
          "server-a100-epyc", "server-t4-xeon")
EDGE = ("jetson-agx-orin", "apple-m2", "apple-m1", "snapdragon-x-elite")
LINK = {"server": "ib-hdr", "edge": "10gbe", "mixed": "10gbe"}
DEVICES, WORKERS, TYPES, MIN_COUNT = 64, 16, 4, 2
PROFILES = Path(os.environ.get("PIPEOPT_DATA", "/work/shared/data")) / "pipedream-profiles"
GNMT_RATE = 15.7e12 * 0.40
"""FLOP/s at which GNMT's profile is read as measured (a V100 at its fp32 peak x GPU efficiency)."""
DEFAULT_SEEDS, FULL_SEEDS = 2, 8


def draw_mix(family: str, seed: int) -> dict[str, int]:
    """``{catalogue name: count}``: :data:`TYPES` types of ``family`` and a random composition of
    :data:`DEVICES` devices over them, each at least :data:`MIN_COUNT` (seeded by family and seed)."""
    rng = random.Random(f"{family}-{seed}")
    if family == "server":
        names = rng.sample(SERVER, TYPES)
    elif family == "edge":
        names = list(EDGE)
    elif family == "mixed":
        names = rng.sample(SERVER, TYPES // 2) + rng.sample(EDGE, TYPES - TYPES // 2)
    else:
        raise ValueError(f"unknown family {family!r}; choose from {FAMILIES}")
    free = DEVICES - MIN_COUNT * TYPES
    cuts = sorted(rng.randint(0, free) for _ in range(TYPES - 1))
    counts = [b - a + MIN_COUNT for a, b in zip([0] + cuts, cuts + [free], strict=True)]
    return dict(zip(names, counts, strict=True))


def gnmt_graph(kinds):
    """GNMT's PipeDream profile with times for ``kinds`` (module docstring)."""
    from pipeopt.io.pipedream import read_pipedream_graph
    from pipeopt.zoo import KINDS

    g = read_pipedream_graph(PROFILES / "gnmt.txt")
    for _, a in g.nodes(data=True):
        f, b = a["fwd"]["gpu"], a["bwd"]["gpu"]
        a["fwd"] = {k: f * GNMT_RATE / (1e12 * KINDS[k].forward_efficiency) for k in kinds}
        a["bwd"] = {k: b * GNMT_RATE / (1e12 * KINDS[k].backward_efficiency) for k in kinds}
    return g


def build(model: str, family: str, seed: int):
    """``(GroupProblem, mix)`` of one row."""
    import pipeopt
    from pipeopt import zoo
    from pipeopt.problems.resource import GroupProblem

    mix = draw_mix(family, seed)
    name = f"{model} {family} s{seed}"
    if model == "gnmt":
        cl = zoo.cluster(mix, bandwidth=LINK[family])
        inst = pipeopt.Instance(gnmt_graph(cl.kinds), cl, pipeopt.Settings(microbatches=4 * DEVICES), name=name)
    else:
        inst = zoo.instance(model, mix, bandwidth=LINK[family], name=name)
    return GroupProblem(inst, WORKERS), mix


def solve_one(task: tuple) -> dict:
    """One row: build, solve, time (run in a worker process)."""
    model, family, seed, method, limit, clock = task
    if clock == "cpu":  # the solver's clock counts this process's CPU seconds (single-threaded methods)
        import types

        from pipeopt.backends import deadline

        deadline.time = types.SimpleNamespace(perf_counter=time.process_time)
    problem, mix = build(model, family, seed)
    t, cpu = time.perf_counter(), time.process_time()
    if method == "types":
        from pipeopt.problems.resource.group_dp import solve_dp

        r = solve_dp(problem, time_limit=limit)
    else:
        from pipeopt.problems.resource import group

        r = (group.solve_cpsat(problem, time_limit=limit, threads=2) if method == "cpsat"
             else group.solve_milp(problem, time_limit=limit, solver="highs"))
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    vectors = math.prod(c + 1 for c in mix.values())
    gap = None
    if r.objective is not None and r.lower_bound and r.lower_bound > 0:
        gap = r.objective / r.lower_bound - 1.0
    return {"model": model, "family": family, "seed": seed,
            "mix": " + ".join(f"{n} x{c}" for n, c in mix.items()), "count_vectors": vectors,
            "units": problem.n, "method": method, "status": str(r.status),
            "objective_ms": None if r.objective is None else r.objective * 1e3,
            "bound_ms": None if r.lower_bound is None else r.lower_bound * 1e3,
            "gap": gap, "time_s": wall, "cpu_s": cpu, "load1": os.getloadavg()[0]}


def summary(rows: list[dict], limit: float, clock: str = "wall") -> list[str]:
    """The summary lines: overall and per model and per family (proven: within the limit on ``clock``)."""
    key = "cpu_s" if clock == "cpu" else "time_s"

    def line(label, rs):
        proven = sum(r["status"] == "optimal" and r[key] <= limit + 1.0 for r in rs)
        gaps = [r["gap"] if r["gap"] is not None else math.inf for r in rs]
        within = sum(g <= 0.02 for g in gaps)
        worst = max(gaps, default=math.nan)
        times = sorted(r[key] for r in rs)
        return (f"| {label} | {len(rs)} | {proven}/{len(rs)} ({100 * proven / len(rs):.0f} %) | "
                f"{100 * worst:.3f}% | {within}/{len(rs)} ({100 * within / len(rs):.0f} %) | "
                f"{times[len(times) // 2]:.1f} | {times[-1]:.1f} |")
    out = [f"| instances | n | proven within the limit | max gap | gap <= 2 % | median {clock} (s) | max {clock} (s) |",
           "| --- | --- | --- | --- | --- | --- | --- |", line("all", rows)]
    for col in ("model", "family"):
        for v in dict.fromkeys(r[col] for r in rows):
            out.append(line(f"{col} {v}", [r for r in rows if r[col] == v]))
    return out


def fmt(r: dict) -> str:
    def ms(x):
        return "-" if x is None else f"{x:.4f}" if math.isfinite(x) else "inf"
    gap = "-" if r["gap"] is None else f"{100 * r['gap']:.3f}%"
    return (f"| {r['model']} | {r['family']} | {r['seed']} | {r['mix']} | {r['count_vectors']:,} | {r['status']} | "
            f"{ms(r['objective_ms'])} | {ms(r['bound_ms'])} | {gap} | {r['time_s']:.1f} | {r['cpu_s']:.1f} | {r['load1']:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help=f"{FULL_SEEDS} seeds per (model, family)")
    ap.add_argument("--seeds", nargs="*", type=int, default=None)
    ap.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    ap.add_argument("--families", nargs="*", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--method", default="types", choices=("types", "milp", "cpsat"))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=2, help="solves side by side (processes; default 2)")
    ap.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                    help="what the time limit counts: wall seconds, or the solve's CPU seconds (on a "
                         "shared machine, what a quiet one would give a single-threaded method)")
    ap.add_argument("--out", default="benchmarks/results/group_scale")
    args = ap.parse_args(argv)
    seeds = args.seeds if args.seeds is not None else list(range(FULL_SEEDS if args.full else DEFAULT_SEEDS))
    tasks = [(m, f, s, args.method, args.time_limit, args.clock)
             for m in args.models for f in args.families for s in seeds]
    out = Path(args.out + ("_full" if args.full else "") + ".md")
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/group_scale.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    head = [f"# Grouping at scale: {DEVICES} random catalogue devices into {WORKERS} workers", "",
            f"Generated by `{cmd}` (method `{args.method}`, time limit {args.time_limit:.0f} {args.clock} s per solve, "
            f"{args.jobs} solve(s) side by side on {os.cpu_count()} cores). Periods per microbatch in ms; "
            "time = wall seconds of the whole solve, CPU = its process CPU seconds (on a loaded machine the "
            "wall time the limit counts exceeds it); load = the 1-minute load average when the solve ended.", ""]
    table = ["| model | family | seed | mix | count vectors | status | objective | bound | gap | time (s) | CPU (s) "
             "| load |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    rows: list[dict] = []
    started = time.perf_counter()
    print(table[0], flush=True)

    def write():
        order = {t[:3]: i for i, t in enumerate(tasks)}
        done = sorted(rows, key=lambda r: order[(r["model"], r["family"], r["seed"])])
        body = head + ["## Summary", ""] + summary(done, args.time_limit, args.clock) + ["", "## Instances", ""] + table \
            + [fmt(r) for r in done] + ["", f"Total wall time {time.perf_counter() - started:.0f} s."]
        out.write_text("\n".join(body) + "\n")
        return done

    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for r in pool.map(solve_one, tasks):
                rows.append(r)
                print(fmt(r), flush=True)
                write()
    else:
        for task in tasks:
            rows.append(solve_one(task))
            print(fmt(rows[-1]), flush=True)
            write()
    done = write()
    import csv

    with out.with_suffix(".csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(done[0]))
        w.writeheader()
        w.writerows(done)
    print("\n".join([""] + summary(done, args.time_limit, args.clock)))
    print(f"wrote {out}, {out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
