"""What does free W placement gain over a zero-bubble schedule's own W places?

For one zoo instance, p ranks and m microbatches, each zero-bubble schedule (ZBVZeroBubble,
InterleavedZeroBubble with v = 2) gets its exact split twice with
:func:`pipeopt.problems.schedule.solve_milp`: with the schedule's W places
(``w_placement="schedule"``) and with every W placed anywhere after its I, together with the
split (``"free"``, :mod:`pipeopt.problems.schedule.w_placement`). Printed: status, iteration
time (the simulator's, of the returned order), bound, gap and solve time of each, and the gain
of free placement. The free model is warm-started with the schedule-placement optimum.

Usage::

    python benchmarks/w_placement.py                       # GPT-2 XL, p = 4, m = 8, 60 s per solve
    python benchmarks/w_placement.py --quick               # 10 s per solve
    python benchmarks/w_placement.py --instance bert-large --ranks 4 --microbatches 8 --time-limit 120
    python benchmarks/w_placement.py --instance instances/memory/bert-large-mb16-v100-16gb-x4.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pipeopt.io import load
from pipeopt.problems.schedule import ScheduleProblem, solve_milp

ROOT = Path(__file__).resolve().parents[1]
ZOO = {"gpt2-xl": "instances/homogeneous/gpt2-xl-a100-40gb-x8.json",
       "bert-large": "instances/homogeneous/bert-large-a100-40gb-x8.json"}
SCHEDULES = ("ZBVZeroBubble", "InterleavedZeroBubble")


def row(res) -> str:
    """One result as text."""
    gap = f"{res.gap:.2%}" if res.gap is not None else "-"
    lb = f"{res.lower_bound * 1e3:.3f}" if res.lower_bound is not None else "-"
    return f"{res.status:<10} {res.objective * 1e3:>10.3f} {lb:>10} {gap:>7} {res.runtime:>7.1f}"


def main(argv=None) -> int:
    """Run the comparison (module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instance", default="gpt2-xl", help=f"a zoo name {list(ZOO)} or an instance file")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--quick", action="store_true", help="10 s per solve")
    ap.add_argument("--schedules", nargs="*", default=list(SCHEDULES))
    args = ap.parse_args(argv)
    limit = 10.0 if args.quick else args.time_limit
    inst = load(ROOT / ZOO[args.instance] if args.instance in ZOO else Path(args.instance))
    print(f"{args.instance}: {inst.chain.n} units, p = {args.ranks}, m = {args.microbatches}, {limit:g} s per solve")
    print(f"{'schedule':<22} {'W places':<9} {'status':<10} {'iter ms':>10} {'bound ms':>10} {'gap':>7} {'solve s':>7}")
    for name in args.schedules:
        t0 = time.perf_counter()
        own = solve_milp(ScheduleProblem(inst, name, args.ranks, args.microbatches), time_limit=limit)
        print(f"{name:<22} {'schedule':<9} {row(own)}", flush=True)
        free = solve_milp(ScheduleProblem(inst, name, args.ranks, args.microbatches, w_placement="free"),
                          time_limit=limit, hint=own.info["starts"])
        print(f"{name:<22} {'free':<9} {row(free)}", flush=True)
        gain = (f"{1 - free.objective / own.objective:.2%} shorter than" if own.objective < float("inf")
                else "fits where no split fits with")
        print(f"  free W placement: {gain} the schedule's own W places"
              f" ({time.perf_counter() - t0:.1f} s for both); split binaries {free.info.get('binaries')}, gap binaries"
              f" {free.info.get('gap_binaries')},"
              f" ops {free.info.get('ops')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
