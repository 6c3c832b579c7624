"""The free-order optimum against the orders people run: torch's schedules and the ZB greedy.

For each instance, p ranks and m microbatches (one chunk per rank, looped placement):

* ``free`` -- :func:`pipeopt.problems.schedule.solve_free_order` (CP-SAT over the split and
  every rank's order of F, I, W; ``--time-limit`` seconds; status, iteration time, proven
  bound, gap, solve seconds, model size);
* ``ZB-greedy`` -- the zero-bubble repository's greedy order (all 8 flag variants, the best of
  their estimates, as their code picks) on the free optimum's split and on the best split of
  the fixed-order rows below, executed by pipeopt's executor;
* ``GPipe``, ``1F1B``, ``InterleavedZeroBubble`` (v = 1: ZB1P) -- torch's orders of this
  placement at their own exact splits (:func:`pipeopt.problems.schedule.solve_milp`, the same
  time limit; status and bound reported).

Every time is the executor's (:func:`pipeopt.schedules.execute`). "vs free" is (row - free) /
free: how much slower the row's plan runs than the free-order plan.

Usage::

    python benchmarks/free_order.py              # GPT-2 XL, BERT-large (V100 16 GB), p = 4, m = 8, 60 s
    python benchmarks/free_order.py --full       # adds p = 8, m = 16 (x8 A100 instances)
    python benchmarks/free_order.py --markdown benchmarks/results/free_order.md
    python benchmarks/free_order.py --random 8   # the free solve only, on 8 seeded perturbations
                                                 # (layer times x U(0.7, 1.3)) of each instance

``--random`` reports the fraction of instances of the same family, not tuned on, that prove.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pipeopt
from pipeopt.errors import PipeoptError
from pipeopt.problems.schedule import ScheduleProblem, solve_free_order, solve_milp
from pipeopt.problems.schedule.baselines import zb_greedy

ROOT = Path(__file__).resolve().parent.parent
QUICK = [("instances/homogeneous/gpt2-xl-a100-40gb-x4.json", 4, 8),
         ("instances/memory/bert-large-mb16-v100-16gb-x4.json", 4, 8)]
FULL = QUICK + [("instances/homogeneous/gpt2-xl-a100-40gb-x8.json", 8, 16),
                ("instances/homogeneous/bert-large-a100-40gb-x8.json", 8, 16)]
FIXED = ("GPipe", "1F1B", "InterleavedZeroBubble")


def row(case, name, res, free_time, runtime):
    t = res.objective if res is not None and res.plan is not None else float("nan")
    lb = res.lower_bound if res is not None and res.lower_bound is not None else float("nan")
    gap = (t - lb) / t if t == t and lb == lb and t > 0 else float("nan")
    vs = (t - free_time) / free_time if free_time and t == t else float("nan")
    status = str(res.status) if res is not None else "refused"
    return (f"| {case} | {name} | {status} | {t * 1e3:.2f} | {lb * 1e3:.2f} | {gap * 100:.2f} % | "
            f"{vs * 100:+.2f} % | {runtime:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="add p = 8, m = 16")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per exact solve (default 60)")
    ap.add_argument("--markdown", help="also write the table to this file")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="instead: the free solve on N seeded perturbations of each instance (layer times x U(0.7, 1.3))")
    args = ap.parse_args(argv)
    if args.random:
        return random_family(args)
    load = os.getloadavg()[0]
    lines = [f"free-order optimum vs fixed orders; time limit {args.time_limit:g} s per solve; 2-core machine, load"
             f" average {load:.1f} at start",
             "",
             "| instance, p, m | order | status | iteration ms | bound ms | gap | vs free | solve s |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for path, p, m in (FULL if args.full else QUICK):
        inst = pipeopt.read(ROOT / path)
        case = f"{inst.name}, p={p}, m={m}"
        t0 = time.perf_counter()
        problem = ScheduleProblem(inst, "free", p, m)
        free = solve_free_order(problem, time_limit=args.time_limit)
        ft = time.perf_counter() - t0
        free_time = free.objective if free.plan is not None else None
        out = [row(case, "free (cpsat)", free, free_time, ft)]
        print(out[-1], flush=True)
        splits = {"free split": free.info.get("starts")} if free.plan is not None else {}
        best_fixed = None
        for name in FIXED:
            t0 = time.perf_counter()
            try:
                res = solve_milp(ScheduleProblem(inst, name, p, m, None if name != "InterleavedZeroBubble" else 1),
                                 time_limit=args.time_limit)
            except PipeoptError as exc:
                res = None
                print(f"  {name}: {exc}", file=sys.stderr)
            out.append(row(case, f"{name} (own exact split)", res, free_time, time.perf_counter() - t0))
            print(out[-1], flush=True)
            if res is not None and res.plan is not None and (best_fixed is None or res.objective < best_fixed.objective):
                best_fixed = res
        if best_fixed is not None:
            splits[f"{best_fixed.info['schedule']} split"] = best_fixed.info["starts"]
        for label, starts in splits.items():
            t0 = time.perf_counter()
            try:
                res = zb_greedy(ScheduleProblem(inst, "1F1B", p, m), starts=starts)
            except PipeoptError as exc:
                res = None
                print(f"  ZB-greedy on the {label}: {exc}", file=sys.stderr)
            out.append(row(case, f"ZB-greedy (on the {label})", res, free_time, time.perf_counter() - t0))
            print(out[-1], flush=True)
        info = free.info
        lines += out
        note = (f"free model: warm start {info.get('warm_start')}, CP-SAT {info.get('solver_status')},"
                f" branches {info.get('branches')}")
        print("  " + note, flush=True)
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
    return 0


def perturbed(inst, seed: int):
    """``inst`` with every layer's forward and backward times (and weight-gradient share) scaled
    by one factor drawn from U(0.7, 1.3) per layer, seeded."""
    import random

    rng = random.Random(seed)
    g = inst.graph.copy()
    for _, attrs in g.nodes(data=True):
        f = rng.uniform(0.7, 1.3)
        for key in ("fwd", "bwd", "bwd_w"):
            if isinstance(attrs.get(key), dict):
                attrs[key] = {k: v * f for k, v in attrs[key].items()}
    return inst.replace(graph=g, name=f"{inst.name}~{seed}")


def random_family(args) -> int:
    load = os.getloadavg()[0]
    lines = [f"free order on seeded perturbations (layer times x U(0.7, 1.3)); time limit {args.time_limit:g} s;"
             f" load average {load:.1f} at start", "",
             "| instance, p, m | status | iteration ms | bound ms | gap | solve s |", "|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    proven = total = 0
    for path, p, m in (FULL if args.full else QUICK):
        base = pipeopt.read(ROOT / path)
        for seed in range(args.random):
            inst = perturbed(base, seed)
            t0 = time.perf_counter()
            try:
                res = solve_free_order(ScheduleProblem(inst, "free", p, m), time_limit=args.time_limit)
            except PipeoptError as exc:
                print(f"| {inst.name}, p={p}, m={m} | {exc} | | | | |", flush=True)
                continue
            total += 1
            proven += res.status == "optimal"
            gap = (res.objective - res.lower_bound) / res.objective if res.plan is not None else float("nan")
            lines.append(f"| {inst.name}, p={p}, m={m} | {res.status} | {res.objective * 1e3:.2f} |"
                         f" {res.lower_bound * 1e3:.2f} | {gap * 100:.2f} % | {time.perf_counter() - t0:.1f} |")
            print(lines[-1], flush=True)
    lines += ["", f"proven within the limit: {proven} of {total}"]
    print(lines[-1])
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
