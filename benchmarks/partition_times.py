"""Solve times of the exact partition methods on the PipeDream profiles.

Runs the DP, the MILP (CBC and HiGHS, through PuLP) and CP-SAT on every profile for each S,
in the one-order space (one worker per stage; bandwidth and memory as read by
:func:`pipeopt.io.pipedream.read_pipedream`), and prints a table - profile, units, S,
method, status, bottleneck (ms), lower bound (ms), gap (%), solve time (s), agreement with
the DP - and writes the rows to a CSV.

Target of issue 2: DP under 1 s for every profile and S <= 16; MILP and CP-SAT prove
optimality on every profile up to 400 layers for S <= 8 within 60 s each.

Usage::

    python benchmarks/partition_times.py [--time-limit 60] [--stages 2 4 8 16]
        [--max-units 400] [--profiles vgg16 resnet50] [--methods dp cbc highs cpsat]
        [--csv partition_times.csv] [--bare]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from pipeopt.errors import InfeasibleError
from pipeopt.problems.partition.cpsat import solve_cpsat
from pipeopt.problems.partition.dp import solve_dp
from pipeopt.problems.partition.milp import solve_milp
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.partition.problem import PartitionProblem

PROFILE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"

METHODS = {
    "dp": lambda p, tl, seed, warm: solve_dp(p),
    "milp-cbc": lambda p, tl, seed, warm: solve_milp(
        p, time_limit=tl, solver="cbc", seed=seed, warm_start=warm
    ),
    "milp-highs": lambda p, tl, seed, warm: solve_milp(
        p, time_limit=tl, solver="highs", seed=seed, warm_start=warm
    ),
    "cpsat": lambda p, tl, seed, warm: solve_cpsat(
        p, time_limit=tl, seed=seed, threads=2, warm_start=warm
    ),
}

FIELDS = [
    "profile",
    "units",
    "stages",
    "method",
    "status",
    "bottleneck_ms",
    "lower_bound_ms",
    "gap_pct",
    "time_s",
    "agrees_with_dp",
    "note",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile-dir", type=Path, default=PROFILE_DIR)
    ap.add_argument("--profiles", nargs="*", help="profile names (default: all)")
    ap.add_argument("--stages", nargs="+", type=int, default=[2, 4, 8, 16])
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per MILP/CP-SAT solve")
    ap.add_argument("--max-units", type=int, default=None, help="skip profiles with more units")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--bare",
        action="store_true",
        help="solve the bare formulations (no heuristic warm start, no rows derived from it)",
    )
    ap.add_argument("--csv", type=Path, default=Path("partition_times.csv"))
    args = ap.parse_args(argv)

    files = sorted(f for f in args.profile_dir.glob("*.txt") if f.stem != "LICENSE")
    if args.profiles:
        files = [f for f in files if f.stem in args.profiles]
    rows = []
    header = (
        f"{'profile':<15}{'units':>6}{'S':>4}  {'method':<11}{'status':<11}{'bottleneck ms':>14}"
        f"{'bound ms':>12}{'gap %':>9}{'time s':>9}  dp?"
    )
    print(header)
    print("-" * len(header))
    with open(args.csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        writer.writeheader()
        for f in files:
            inst = read_pipedream(f, devices=max(args.stages))
            n = inst.chain.n
            if args.max_units is not None and n > args.max_units:
                continue
            for S in args.stages:
                if S > n:
                    continue
                p = PartitionProblem(inst, S)
                dp_obj = None
                for name in ["dp", *[m for m in args.methods if m != "dp"]]:  # the DP is the reference
                    t0 = time.perf_counter()
                    try:
                        res = METHODS[name](p, args.time_limit, args.seed, not args.bare)
                    except InfeasibleError as exc:
                        row = {
                            "profile": f.stem,
                            "units": n,
                            "stages": S,
                            "method": name,
                            "status": "infeasible",
                            "time_s": round(time.perf_counter() - t0, 3),
                            "note": str(exc),
                        }
                    else:
                        wall = time.perf_counter() - t0
                        if name == "dp":
                            dp_obj = res.objective
                        tol = res.info.get("tolerance_s", 1e-6 * res.objective)
                        agree = (
                            ""
                            if dp_obj is None or name == "dp"
                            else (
                                "yes"
                                if abs(res.objective - dp_obj) <= tol + 1e-12
                                else ("worse" if res.objective > dp_obj else "BETTER?!")
                            )
                        )
                        gap = res.gap
                        row = {
                            "profile": f.stem,
                            "units": n,
                            "stages": S,
                            "method": name,
                            "status": str(res.status),
                            "bottleneck_ms": f"{res.objective * 1e3:.6f}",
                            "lower_bound_ms": ""
                            if res.lower_bound is None
                            else f"{res.lower_bound * 1e3:.6f}",
                            "gap_pct": "" if gap is None else f"{100 * gap:.4f}",
                            "time_s": f"{wall:.3f}",
                            "agrees_with_dp": agree,
                            "note": res.info.get("bound_source", ""),
                        }
                    writer.writerow(row)
                    fh.flush()
                    rows.append(row)
                    print(
                        f"{row['profile']:<15}{n:>6}{S:>4}  {name:<11}{row['status']:<11}"
                        f"{row.get('bottleneck_ms', ''):>14}{_short(row.get('lower_bound_ms', '')):>12}"
                        f"{row.get('gap_pct', ''):>9}{row['time_s']:>9}  {row.get('agrees_with_dp', '')}",
                        flush=True,
                    )
    bad = [r for r in rows if r.get("agrees_with_dp") == "BETTER?!"]
    unproven = [r for r in rows if r["method"] != "dp" and r["status"] != "optimal"]
    print(
        f"\n{len(rows)} rows written to {args.csv}; {len(unproven)} solves without a proof of optimality"
        f"{'; ' + str(len(bad)) + ' beat the DP (a bug)' if bad else ''}"
    )
    return 1 if bad else 0


def _short(x: str) -> str:
    try:
        return f"{float(x):.6f}"
    except ValueError:
        return x


if __name__ == "__main__":
    sys.exit(main())
