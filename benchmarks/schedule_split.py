"""What is each torch schedule worth on a model, and how much do the default splits leave?

For each instance, p ranks and m microbatches: every schedule torch.distributed.pipelining
ships (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble with v = 2,
ZBVZeroBubble, DualPipeV) gets its exact split (:func:`pipeopt.problems.schedule.solve_milp`:
the event-time MILP over the schedule's operations, p v chunks, rank memory by the schedule's
rule; ``--time-limit`` seconds, after which it reports its incumbent and the proven bound),
and the baselines of :mod:`pipeopt.problems.schedule.baselines` run under the same schedule:
the uniform split (torch's default), torchtitan's split (zoo transformers only) and the best
1F1B plan (partition DP into p v stages). Gaps are (baseline - bound) / baseline, the bound
being the exact method's (= its optimum when proven). One more row per (instance, p, m): the
zero-bubble repository's greedy scheduler on the uniform split into p chunks ("ZB-greedy"; its
"gap" is how much slower it is than the fastest split the exact solves found over the seven
schedules).
Every value is the executor's iteration time (:func:`pipeopt.schedules.execute`); W = B/2
where the profile does not split the backward.

Instances: the zoo's GPT-2 XL and BERT-large on A100-40GB (instances/homogeneous, memory
limit 40 GB less the catalogue's reserve) and PipeDream's measured profiles (VGG16, GNMT; no
memory limit, 12.5 GB/s).

Usage::

    python benchmarks/schedule_split.py                 # p in {4, 8}, m in {8, 32}, 60 s per solve
    python benchmarks/schedule_split.py --quick         # GPT-2 XL and VGG16, p = 4, m = 8, 10 s
    python benchmarks/schedule_split.py --csv out.csv --markdown out.md

Rows are appended to ``--csv`` as they finish (a long run can be read while it goes).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

from pipeopt.errors import PipeoptError
from pipeopt.io import load
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.schedule import ScheduleProblem, solve_milp
from pipeopt.problems.schedule.baselines import BASELINES, zb_greedy
from pipeopt.result import optimality_gap
from pipeopt.schedules import GENERATORS

ROOT = Path(__file__).resolve().parents[1]
PROFILE_DIR = ROOT.parent / "shared" / "data" / "pipedream-profiles"
ZOO = {"gpt2-xl": "instances/homogeneous/gpt2-xl-a100-40gb-x8.json",
       "bert-large": "instances/homogeneous/bert-large-a100-40gb-x8.json"}
PROFILES = ("vgg16", "gnmt")
FIELDS = ["instance", "units", "p", "m", "schedule", "v", "status", "optimum_ms", "bound_ms", "proof_gap",
          "uniform_ms", "uniform_gap", "torchtitan_ms", "torchtitan_gap", "best1f1b_ms", "best1f1b_gap",
          "solve_s", "binaries", "ops"]


def instance(name: str):
    """A zoo instance file or a PipeDream profile (8 devices, no memory limit)."""
    if name in ZOO:
        return load(ROOT / ZOO[name])
    return read_pipedream(PROFILE_DIR / f"{name}.txt", devices=8)


def ms(x) -> float | None:
    return None if x is None or not math.isfinite(x) else x * 1e3


def rows_for(name: str, inst, p: int, m: int, schedules, time_limit: float, solver: str | None = None):
    """The rows of one (instance, p, m): one per schedule, then the ZB greedy's (its "gap": how
    much slower it is than the fastest split the exact solves found over the seven schedules,
    proven or not - not a bound on the greedy's own space)."""
    best = math.inf
    for sched in schedules:
        try:
            pr = ScheduleProblem(inst, sched, p, m)
        except PipeoptError as exc:
            print(f"  {sched}: refused ({exc})", file=sys.stderr)
            continue
        res = solve_milp(pr, time_limit=time_limit, **({"solver": solver} if solver else {}))
        bound = res.lower_bound
        row = {"instance": name, "units": pr.n, "p": p, "m": m, "schedule": sched, "v": pr.stages_per_rank,
               "status": res.status, "optimum_ms": ms(res.objective), "bound_ms": ms(bound),
               "proof_gap": res.gap, "solve_s": round(res.runtime, 2), "binaries": res.info.get("binaries"),
               "ops": res.info.get("ops")}
        for key, method in (("uniform", "uniform"), ("torchtitan", "torchtitan"), ("best1f1b", "best_1f1b")):
            try:
                b = BASELINES[method](pr, time_limit=time_limit)
                value = b.objective if b.status != "infeasible" else math.inf  # a split over memory: no value
                row[f"{key}_ms"] = ms(value)
                row[f"{key}_gap"] = optimality_gap(value, bound) if bound else None
            except PipeoptError:
                row[f"{key}_ms"] = row[f"{key}_gap"] = None
        best = min(best, res.objective)
        yield row
    try:
        z = zb_greedy(ScheduleProblem(inst, "1F1B", p, m))
        yield {"instance": name, "units": inst.chain.n, "p": p, "m": m, "schedule": "ZB-greedy (uniform split)",
               "v": 1, "status": z.status, "uniform_ms": ms(z.objective), "solve_s": round(z.runtime, 2),
               "uniform_gap": optimality_gap(z.objective, best) if math.isfinite(best) else None}
    except PipeoptError as exc:
        print(f"  ZB-greedy: {exc}", file=sys.stderr)


def fmt(x, pct=False) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.1%}" if pct else f"{x:.1f}" if isinstance(x, float) else str(x)


def markdown(rows) -> str:
    """The results table (docs/results/schedule_split.md): exact split and baselines' gaps per schedule."""
    head = ("| instance | p | m | schedule | status | optimum ms | bound ms | uniform ms (gap) | torchtitan gap |"
            " best 1F1B gap | solve s |")
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        uni = f"{fmt(r.get('uniform_ms'))} ({fmt(r.get('uniform_gap'), True)})" if r.get("uniform_gap") is not None \
            else fmt(r.get("uniform_ms"))
        lines.append(f"| {r['instance']} | {r['p']} | {r['m']} | {r['schedule']} | {r['status']} |"
                     f" {fmt(r.get('optimum_ms'))} | {fmt(r.get('bound_ms'))} | {uni} |"
                     f" {fmt(r.get('torchtitan_gap'), True)} | {fmt(r.get('best1f1b_gap'), True)} |"
                     f" {fmt(r.get('solve_s'))} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", nargs="*", help=f"zoo names {list(ZOO)} or profile names (default: both zoo + {list(PROFILES)})")
    ap.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--microbatches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--schedules", nargs="*", help="schedule names (default: all seven)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve (default 60)")
    ap.add_argument("--quick", action="store_true", help="GPT-2 XL and VGG16, p = 4, m = 8, 10 s per solve")
    ap.add_argument("--solver", choices=("cbc", "highs"), help="the exact MILP's backend (default: solve_milp's)")
    ap.add_argument("--csv", help="append the rows to this CSV as they finish")
    ap.add_argument("--markdown", help="write the table to this file")
    args = ap.parse_args(argv)
    names = args.instances or [*ZOO, *PROFILES]
    ranks, mbs, limit = args.ranks, args.microbatches, args.time_limit
    if args.quick:
        names, ranks, mbs, limit = args.instances or ["gpt2-xl", "vgg16"], [4], [8], 10.0
    schedules = args.schedules or list(GENERATORS)
    writer = None
    if args.csv:
        fh = open(args.csv, "a", newline="")  # noqa: SIM115 - kept open for the run
        writer = csv.DictWriter(fh, FIELDS + ["uniform_ms"], extrasaction="ignore")
        if fh.tell() == 0:
            writer.writeheader()
    rows = []
    started = time.perf_counter()
    for name in names:
        inst = instance(name)
        for p in ranks:
            for m in mbs:
                for row in rows_for(name, inst, p, m, schedules, limit, args.solver):
                    rows.append(row)
                    print(markdown([row]).splitlines()[-1], flush=True)
                    if writer:
                        writer.writerow(row)
                        fh.flush()
    table = markdown(rows)
    print("\n" + table)
    proven = [r for r in rows if r.get("status") == "optimal"]
    stopped = [r for r in rows if r.get("status") == "time_limit"]
    print(f"\n{len(proven)} proven, {len(stopped)} stopped at {limit:g} s"
          + (": " + ", ".join(f"{r['instance']} p={r['p']} m={r['m']} {r['schedule']} (proof gap "
                                f"{fmt(r['proof_gap'], True)}, {r['binaries']} binaries, {r['ops']} ops)"
                                for r in stopped) if stopped else ""))
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
