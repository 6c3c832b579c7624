"""The free-order optimum against the orders people run: torch's schedules and the ZB greedy.

For each instance, p ranks and m microbatches (one chunk per rank, looped placement):

* ``free`` -- :func:`pipeopt.problems.schedule.solve_free_order` (CP-SAT over the split and
  every rank's order of F, I, W; ``--time-limit`` seconds; status, iteration time, proven
  bound, gap, solve seconds, model size), warm-started also from the fixed rows of its
  placement (their exact splits and orders), so it is never slower than they are;
* ``ZB-greedy`` -- the zero-bubble repository's greedy order (all 8 flag variants, the best of
  their estimates, as their code picks) on the free optimum's split and on the best split of
  the fixed-order rows below, executed by pipeopt's executor;
* torch's seven orders at their own exact splits (:func:`pipeopt.problems.schedule.solve_milp`,
  the same time limit; status and bound reported): ``GPipe``, ``1F1B``,
  ``InterleavedZeroBubble`` with v = 1 (ZB1P), and the two-chunk ones (v = 2)
  ``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``, ``ZBVZeroBubble``,
  ``DualPipeV``; the fastest of them is what ``--schedule auto`` returns (marked ``auto``);
* ``free looped v=2`` and ``free V v=2`` -- the free order of the two-chunk placements
  (:func:`pipeopt.problems.schedule.solve_free_order` with ``placement="looped"`` / ``"v"``),
  whose spaces hold the two-chunk rows above as the one-chunk free space holds GPipe, 1F1B and
  ZB1P.

Every time is the executor's (:func:`pipeopt.schedules.execute`). "vs free" is (row - free) /
free: how much slower the row's plan runs than the free-order plan.

Usage::

    python benchmarks/free_order.py              # GPT-2 XL, BERT-large (V100 16 GB), p = 4, m = 8, 60 s
    python benchmarks/free_order.py --full       # adds p = 8, m = 16 (x8 A100 instances)
    python benchmarks/free_order.py --markdown benchmarks/results/free_order.md
    python benchmarks/free_order.py --random 8   # the free solve only, on 8 seeded perturbations
                                                 # (layer times x U(0.7, 1.3)) of each instance
    python benchmarks/free_order.py --full --random 3 --shipped   # and on the shipped instances

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
from pipeopt.schedules import make_schedule
from pipeopt.schedules.free import placement_kind

ROOT = Path(__file__).resolve().parent.parent
QUICK = [("instances/homogeneous/gpt2-xl-a100-40gb-x4.json", 4, 8),
         ("instances/memory/bert-large-mb16-v100-16gb-x4.json", 4, 8)]
FULL = QUICK + [("instances/homogeneous/gpt2-xl-a100-40gb-x8.json", 8, 16),
                ("instances/homogeneous/bert-large-a100-40gb-x8.json", 8, 16)]
FIXED = (("GPipe", None), ("1F1B", None), ("InterleavedZeroBubble", 1), ("Interleaved1F1B", 2), ("LoopedBFS", 2),
         ("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2))
"""torch's seven orders (InterleavedZeroBubble with one and two chunks per rank) and v."""
FREE_MULTI = (("looped", "free looped v=2"), ("v", "free V v=2"))
"""The two-chunk free orders: placement and row label."""


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
    ap.add_argument("--shipped", action="store_true",
                    help="with --random: also the free solve on each shipped (unperturbed) instance, first")
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
        fixed_rows = []  # [label, result, seconds, placement kind, (starts, order) or None]
        for name, v in FIXED:
            t0 = time.perf_counter()
            try:
                res = solve_milp(ScheduleProblem(inst, name, p, m, v), time_limit=args.time_limit)
            except PipeoptError as exc:
                res = None
                print(f"  {name}: {exc}", file=sys.stderr)
            label = f"{name}{'' if v is None else f' v={v}'} (own exact split)"
            order = make_schedule(name, p, m, v)
            pair = (res.info["starts"], order) if res is not None and res.plan is not None else None
            fixed_rows.append([label, res, time.perf_counter() - t0, (order.stages_per_rank, placement_kind(order)), pair])
            print(row(case, label, res, None, fixed_rows[-1][2]), flush=True)

        def free_row(v, placement, label):
            """The free order of this placement, warm-started also from the fixed rows of the
            same placement (so it is never slower than them)."""
            problem = ScheduleProblem(inst, "free", p, m, v, placement=placement)
            shape = (problem.schedule.stages_per_rank, placement_kind(problem.schedule))
            warm = [r[4] for r in fixed_rows if r[4] is not None and r[3] == shape]
            t0 = time.perf_counter()
            try:
                res = solve_free_order(problem, time_limit=args.time_limit, warm=warm)
            except PipeoptError as exc:
                res = None
                print(f"  {label}: {exc}", file=sys.stderr)
            return res, time.perf_counter() - t0

        free, ft = free_row(None, "looped", "free")
        free_time = free.objective if free is not None and free.plan is not None else None
        out = [row(case, "free (cpsat)", free, free_time, ft)]
        print(out[-1], flush=True)
        solved = [r for r in fixed_rows if r[1] is not None and r[1].plan is not None]
        best_fixed = min(solved, key=lambda r: r[1].objective)[1] if solved else None
        one = [r for r in solved if r[3][0] == 1]
        best_one = min(one, key=lambda r: r[1].objective)[1] if one else None
        for label, res, secs, _, _ in fixed_rows:
            mark = " = auto" if res is not None and res is best_fixed else ""
            out.append(row(case, label + mark, res, free_time, secs))
        for placement, label in FREE_MULTI:
            res, secs = free_row(2, placement, label)
            out.append(row(case, f"{label} (cpsat)", res, free_time, secs))
            print(out[-1], flush=True)
        splits = {"free split": free.info.get("starts")} if free is not None and free.plan is not None else {}
        if best_one is not None:  # the ZB greedy places one chunk per rank
            splits[f"{best_one.info['schedule']} split"] = best_one.info["starts"]
        for label, starts in splits.items():
            t0 = time.perf_counter()
            try:
                res = zb_greedy(ScheduleProblem(inst, "1F1B", p, m), starts=starts)
            except PipeoptError as exc:
                res = None
                print(f"  ZB-greedy on the {label}: {exc}", file=sys.stderr)
            out.append(row(case, f"ZB-greedy (on the {label})", res, free_time, time.perf_counter() - t0))
            print(out[-1], flush=True)
        info = free.info if free is not None else {}
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
        for seed in ([-1] if args.shipped else []) + list(range(args.random)):
            inst = base if seed < 0 else perturbed(base, seed)
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
