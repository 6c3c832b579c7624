"""FlexFlow-style MCMC on the PipeDream profiles: the five chains' gaps, median and range.

The ``mcmc`` baseline (:mod:`pipeopt.problems.partition.mcmc`) runs five chains (seeds
``seed .. seed + 4``) that share the wall-clock budget the exact methods get, and reports the
median chain's plan; ``info`` keeps every chain's objective. For every profile and S this
script solves the one-order partition exactly (DP, the certified optimum of the ``bottleneck``
objective: 1F1B steady state with the window rows) and runs ``mcmc`` with the same budget as
``pipeopt bench`` (5 s), then prints each chain's gap to the optimum, the median chain's gap
(the bench's) and the range (best and worst chain). Gap = (objective - optimum) / objective.

The budget is wall-clock: on a loaded machine each chain makes fewer proposals, so gaps are
larger than on a quiet one (the proposal counts are printed).

Usage::

    python benchmarks/mcmc_seeds.py [--stages 4 8] [--time-limit 5] [--profiles alexnet vgg16]
        [--seed 0] [--quick] [--csv out.csv]

``--quick``: AlexNet, VGG16, ResNet-18 and SqueezeNet, S = 4, 1 s budget.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from pipeopt import solve
from pipeopt.io.pipedream import read_pipedream
from pipeopt.result import optimality_gap

PROFILE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "pipedream-profiles"
QUICK = ("alexnet", "vgg16", "resnet18", "squeezenet1_0")


def row(name: str, S: int, time_limit: float, seed: int) -> dict:
    """One profile at depth S: the DP optimum and the five MCMC chains' gaps to it."""
    inst = read_pipedream(PROFILE_DIR / f"{name}.txt")
    opt = solve(inst, method="dp", stages=S)
    mc = solve(inst, method="mcmc", stages=S, time_limit=time_limit, seed=seed)
    gaps = [optimality_gap(v, opt.objective) for v in mc.info["objectives"]]
    return {
        "profile": name,
        "S": S,
        "optimum_ms": opt.objective * 1e3,
        "median_gap": optimality_gap(mc.objective, opt.objective),
        "min_gap": min(gaps),
        "max_gap": max(gaps),
        "chain_gaps": gaps,
        "proposals": mc.info["proposals"],
        "runtime": mc.runtime,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", nargs="*", help="profile names (default: all)")
    ap.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--time-limit", type=float, default=5.0, help="MCMC budget, seconds (default 5, the bench's)")
    ap.add_argument("--seed", type=int, default=0, help="first chain's seed")
    ap.add_argument("--quick", action="store_true", help="four profiles, S = 4, 1 s")
    ap.add_argument("--csv", type=Path, default=None)
    args = ap.parse_args(argv)
    every = sorted(f.stem for f in PROFILE_DIR.glob("*.txt") if not f.name.upper().startswith(("LICENSE", "README")))
    names = args.profiles or (list(QUICK) if args.quick else every)
    stages = [4] if args.quick else args.stages
    limit = 1.0 if args.quick else args.time_limit
    print("| profile | S | optimum (ms) | median chain gap | range (best - worst chain) | chain gaps | proposals |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name in names:
        for S in stages:
            r = row(name, S, limit, args.seed)
            rows.append(r)
            print(f"| {name} | {S} | {r['optimum_ms']:.3f} | {100 * r['median_gap']:.2f} % | "
                  f"{100 * r['min_gap']:.2f}-{100 * r['max_gap']:.2f} % | "
                  f"{' '.join(f'{100 * g:.2f}' for g in r['chain_gaps'])} | "
                  f"{' '.join(str(p) for p in r['proposals'])} |", flush=True)
    med = [r["median_gap"] for r in rows]
    spread = [r for r in rows if r["max_gap"] - r["min_gap"] > 1e-9]
    print(f"\n{len(rows)} rows, budget {limit:g} s: median-chain gap mean {100 * statistics.mean(med):.2f} %, "
          f"max {100 * max(med):.2f} %; worst single chain {100 * max(r['max_gap'] for r in rows):.2f} %; "
          f"chains disagree on {len(spread)} rows")
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
