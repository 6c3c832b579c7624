"""Is the certified optimum the fastest plan when the pipeline runs? (issue 8's table, rerun)

For every PipeDream profile and S in {2, 4, 8, 16}: the DP's certified plan, the simulator's
steady-state time per microbatch under 1F1B divided by the optimised objective (must be
1.000), and the largest gain a simulator-scored local search finds over the certified plan,
started from the certified plan and from every baseline's plan (must be 0 %).

    python benchmarks/schedule_exact.py            # S in {2, 4, 8, 16}, every profile
    python benchmarks/schedule_exact.py --quick    # S in {2, 4}, four profiles

``--fixed-orders`` (issue 23): torch's two-chunk orders (Interleaved1F1B, LoopedBFS,
InterleavedZeroBubble v = 2, ZBVZeroBubble, DualPipeV) on GPT-2 XL and BERT-large x8 A100, p = 8,
m = 16, each split exactly by the event-time MILP (:func:`pipeopt.problems.schedule.solve_milp`,
``--solver``: the schedule problem's default, HiGHS, unless told, one thread) and by the split search (:mod:`pipeopt.problems.schedule.split_search`), each
``--time-limit`` seconds, with the MILP's LP relaxation (its root bound). Every time is the
executor's; the load average is printed with each row.

    python benchmarks/schedule_exact.py --fixed-orders --markdown benchmarks/results/schedule_exact_fixed.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from pipeopt import PartitionProblem, evaluate, registry, solve
from pipeopt.io import load
from pipeopt.problems.schedule import SOLVER
from pipeopt.simulate import simulate

PROFILES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "pipedream-profiles"
QUICK = ("alexnet", "vgg16", "squeezenet1_0", "resnet18")
NOISE = 1e-9
"""Relative differences below this are float rounding (two plans with the same period), not a gain."""


def simulated(inst, problem: PartitionProblem, starts) -> float:
    """The simulator's steady-state time per microbatch (1F1B) of a straight split."""
    return simulate(inst, problem.plan(starts), schedule="1f1b").time_per_microbatch


def local_search(inst, problem: PartitionProblem, starts, reach: int = 3, budget: int = 400):
    """First-improvement hill climbing on the simulated time: move one cut by up to ``reach``
    units (stages stay non-empty; a split over memory is skipped)."""
    n = problem.n
    best = list(starts)
    value = simulated(inst, problem, best)
    calls, improved = 1, True
    while improved and calls < budget:
        improved = False
        for c in range(len(best)):
            for d in [x for r in range(1, reach + 1) for x in (r, -r)]:
                cand = list(best)
                cand[c] += d
                lo = cand[c - 1] if c > 0 else 0
                hi = cand[c + 1] if c + 1 < len(cand) else n
                if not lo < cand[c] < hi:
                    continue
                plan = problem.plan(cand)
                if not evaluate(inst, plan).feasible:
                    continue
                v = simulate(inst, plan, schedule="1f1b").time_per_microbatch
                calls += 1
                if v < value * (1 - NOISE):
                    best, value, improved = cand, v, True
                    break
            if improved:
                break
    return best, value


def heuristic_starts(inst, S: int) -> dict:
    """Every partition baseline's straight split (MCMC with a 2 s budget)."""
    out = {}
    for spec in registry.methods("partition"):
        if spec.exact:
            continue
        try:
            res = solve(inst, problem="partition", method=spec.name, stages=S, time_limit=2.0)
        except Exception:  # noqa: BLE001 - a baseline that cannot run here is left out
            continue
        if res.plan is None or res.plan.num_stages != S or any(st.replicas > 1 or st.recompute
                                                                for st in res.plan.stages):
            continue  # (replication and recomputation are outside the plain split's space)
        out[spec.name] = PartitionProblem(inst, S).starts_of(res.plan)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="S in {2, 4} on four profiles")
    ap.add_argument("--fixed-orders", action="store_true",
                    help="instead: torch's two-chunk orders, p = 8, m = 16: MILP and split search (issue 23)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="with --fixed-orders: seconds per solve")
    ap.add_argument("--solver", choices=("cbc", "highs"), default=SOLVER,
                    help=f"with --fixed-orders: the MILP's backend (default {SOLVER}, the schedule problem's)")
    ap.add_argument("--markdown", help="with --fixed-orders: also write the table to this file")
    args = ap.parse_args(argv)
    if args.fixed_orders:
        return fixed_orders(args)
    names = QUICK if args.quick else sorted(p.stem for p in PROFILES.glob("*.txt") if p.stem != "LICENSE")
    sizes = (2, 4) if args.quick else (2, 4, 8, 16)
    rows = []
    for name in names:
        inst = load(PROFILES / f"{name}.txt")
        for S in sizes:
            if S > inst.chain.n:
                continue
            t0 = time.perf_counter()
            res = solve(inst, problem="partition", method="dp", stages=S)
            problem = PartitionProblem(inst, S)
            certified = problem.starts_of(res.plan)
            sim = simulated(inst, problem, certified)
            best = sim
            for label, starts in {"dp": certified, **heuristic_starts(inst, S)}.items():
                _, v = local_search(inst, problem, starts)
                best = min(best, v)
            rows.append({
                "profile": name, "S": S,
                "objective_ms": res.objective * 1e3,
                "simulated_ms": sim * 1e3,
                "simulated/objective": sim / res.objective,
                "search_gain_%": (sim - best) / sim * 100 if sim - best > NOISE * sim else 0.0,
                "time_s": time.perf_counter() - t0,
            })
            print(f"{name:16s} S={S:2d}  objective {res.objective * 1e3:10.4f} ms  simulated {sim * 1e3:10.4f} ms"
                  f"  ratio {sim / res.objective:.6f}  search gain {rows[-1]['search_gain_%']:.3f} %", flush=True)
    df = pd.DataFrame(rows)
    print()
    print(df.to_string(index=False, float_format=lambda x: f"{x:.6g}"))
    print(f"\nsimulated/objective: mean {df['simulated/objective'].mean():.6f}, max {df['simulated/objective'].max():.6f};"
          f" largest simulated-search gain {df['search_gain_%'].max():.4f} %")
    return 0


FIXED_CASES = ("instances/homogeneous/gpt2-xl-a100-40gb-x8.json",
               "instances/homogeneous/bert-large-a100-40gb-x8.json")
TWO_CHUNK = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")


def fixed_orders(args) -> int:
    """The ``--fixed-orders`` table (module docstring)."""
    import os

    import pipeopt
    from pipeopt.problems.schedule import ScheduleProblem, solve_milp
    from pipeopt.problems.schedule.split_search import lp_weights, solve_split_search

    root = Path(__file__).resolve().parents[1]
    lines = [f"torch's two-chunk orders, p = 8, m = 16, each split exactly; {args.time_limit:g} s per solve; MILP by "
             f"{args.solver};"
             f" 2-core machine, load average {os.getloadavg()[0]:.1f} at start", "",
             "| instance | order | LP root ms | MILP status | MILP ms | MILP bound ms | MILP gap | MILP s |"
             " split search status | ms | bound ms | gap | nodes | s | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)

    def cells(res, secs):
        if res is None or res.plan is None:
            return [str(res.status) if res is not None else "refused", "nan", "nan", "nan", f"{secs:.1f}"]
        gap = (res.objective - res.lower_bound) / res.objective
        return [str(res.status), f"{res.objective * 1e3:.2f}", f"{res.lower_bound * 1e3:.2f}",
                f"{gap * 100:.2f} %", f"{secs:.1f}"]

    for path in FIXED_CASES:
        inst = pipeopt.read(root / path)
        for name in TWO_CHUNK:
            problem = ScheduleProblem(inst, name, 8, 16, 2)
            lp = lp_weights(problem)
            t0 = time.perf_counter()
            milp = solve_milp(problem, time_limit=args.time_limit, solver=args.solver)
            m_cells = cells(milp, time.perf_counter() - t0)
            t0 = time.perf_counter()
            search = solve_split_search(ScheduleProblem(inst, name, 8, 16, 2), time_limit=args.time_limit)
            s_cells = cells(search, time.perf_counter() - t0)
            row = [inst.name, name, "nan" if lp is None else f"{lp[0] * 1e3:.2f}", *m_cells, *s_cells[:4],
                   str(search.info.get("nodes")), s_cells[4], f"{os.getloadavg()[0]:.1f}"]
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
