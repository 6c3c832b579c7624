"""Memory that decides: the exact split with per-layer activation recomputation against the
frameworks' recomputation settings, on the shipped instances where memory binds.

For each instance (S = its device count, one device per stage, 1F1B: stage i keeps S - i
microbatches in flight) the partition problem is solved

* exactly with ``recompute="auto"`` (the DP: the split and each stage's recomputed layers
  together, :mod:`pipeopt.problems.partition.recompute`), and with ``"none"`` and ``"full"``
  (every layer recomputed, split exact);
* by the baselines of :mod:`pipeopt.problems.partition.recompute_baselines`: Megatron-LM's full
  uniform recomputation and its ``block`` method with the fewest layers that fit, both on
  Megatron's split; torchtitan's every-k-th block on its split; the no-recompute optimum.

Each row gives the objective (the 1F1B bottleneck: seconds per microbatch, shown in ms), the
gap to the exact ``auto`` optimum ((value - optimum) / value), the recomputed layers per stage,
the fullest stage's memory against its capacity, and the solve time. Every value is
``pipeopt.evaluate``'s of the returned plan.

With ``--schedules``, also the schedule problem (torch's orders, one chunk per rank) on GPT-2 XL
(mb 16, 8 A100-40GB, where no split fits without recomputation): per schedule the exact split
with each chunk's recompute set (``recompute="auto"``, the event-time MILP, time-limited: a
stopped solve gives its bound), every layer recomputed on its best split, and torch's uniform
split with its exact sets and with every layer recomputed (iteration time by the executor).

Usage::

    python benchmarks/recompute.py                     # the six shipped instances
    python benchmarks/recompute.py --schedules --out results.md
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

from pipeopt import evaluate, solve
from pipeopt.errors import PipeoptError
from pipeopt.io import load

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = (
    "instances/memory/gpt3-6.7b-a100-40gb-x8.json",
    "instances/memory/gpt3-6.7b-a100-40gb-x16.json",
    "instances/memory/gpt2-xl-mb16-a100-40gb-x8.json",
    "instances/memory/gpt2-xl-mb16-a100-80gb-x8.json",
    "instances/memory/llama-7b-mb8-a100-40gb-x8.json",
    "instances/memory/llama-7b-mb8-a100-80gb-x8.json",
)
# (label, method, recompute option)
ROWS = (
    ("exact, recompute auto", "dp", "auto"),
    ("exact MILP, recompute auto", "milp", "auto"),
    ("exact, no recompute", "dp", "none"),
    ("exact split, every layer recomputed", "dp", "full"),
    ("megatron-full-uniform", "megatron-full-uniform", None),
    ("megatron-block", "megatron-block", None),
    ("torchtitan-every-k", "torchtitan-every-k", None),
)
GIB = 2**30


def run(inst, S: int, method: str, recompute, time_limit: float):
    """``(result or None, message, seconds)``."""
    kw = {} if recompute is None else {"recompute": recompute}
    t0 = time.perf_counter()
    try:
        res = solve(inst, stages=S, method=method, time_limit=time_limit, **kw)
    except PipeoptError as exc:
        msg = str(exc).splitlines()[0]
        if "misses the limit by" in msg:  # the exact DP's proof: how far the best split is from fitting
            msg = "no split fits; the best " + msg[msg.index("misses the limit by"):]
        return None, f"{type(exc).__name__}: {msg[:200]}", time.perf_counter() - t0
    return res, "", time.perf_counter() - t0


def recomputed(plan) -> str:
    """Recomputed layers per stage, ``a/b/...`` (of the stage's layers)."""
    return " / ".join(f"{len(st.recompute or {})}:{len(st.layers)}" for st in plan.stages)


ZERO_INSTANCES = ("instances/memory/gpt3-6.7b-a100-40gb-x8.json", "instances/memory/llama-7b-mb8-a100-40gb-x8.json")
ADAM_MIXED = {"gradient_ratio": 1.0, "optimizer_ratio": 6.0}
"""Adam in mixed precision over the zoo's fp16 weights: gradients 2 bytes and optimizer state 12
bytes (fp32 master weights, two moments) per parameter, the ZeRO paper's 2 + 2 + 12."""


def zero_rows(time_limit: float, dp: int = 8) -> list[str]:
    """Data parallelism with ZeRO stages 0-3: the exact plan (dp, bottleneck) with and without
    recomputation per stage, and the stage ``--zero auto`` picks."""
    from pipeopt.problems.partition.dp import solve_zero_auto

    out = [f"Data parallelism: {dp} replicas of the pipeline, Adam in mixed precision (gradients 1x, optimizer "
           "state 6x the fp16 weights' bytes); exact DP, ms per microbatch (recomputed layers; the fullest stage's "
           "GiB, its training state in brackets)",
           "",
           "| instance | ZeRO | recompute none | recompute auto |",
           "| --- | --- | --- | --- |"]
    for path in ZERO_INSTANCES:
        base = load(ROOT / path)
        S, name = len(base.cluster.devices), Path(path).stem
        for z in (0, 1, 2, 3):
            inst = base.with_settings(zero=z, dp=dp, **ADAM_MIXED)
            cells = []
            for rc in ("none", "auto"):
                res, msg, _ = run(inst, S, "dp", rc, time_limit)
                if res is None:
                    miss = re.search(r"misses the limit by ([0-9.]+ GiB)", msg)
                    cells.append(f"no split fits (the best misses by {miss.group(1)})" if miss else msg[:90])
                    continue
                ev = evaluate(inst, res.plan)
                f = max(range(S), key=lambda s: ev.memory[s] / ev.memory_capacity[s])
                n = sum(len(st.recompute or {}) for st in res.plan.stages)
                cells.append(f"{res.status.value} {res.objective * 1e3:.2f} ({n} recomputed; "
                             f"{ev.memory[f] / GIB:.2f} GiB [{ev.state[f] / GIB:.2f}])")
            out.append(f"| {name} | {z} | {cells[0]} | {cells[1]} |")
        for rc in ("none", "auto"):
            try:
                best = solve_zero_auto(base.with_settings(dp=dp, **ADAM_MIXED), stages=S, recompute=rc,
                                       time_limit=time_limit)
                out.append(f"| {name} | auto (recompute {rc}) | picks ZeRO-{best.info['zero_auto']['chosen']}: "
                           f"{best.status.value} {best.objective * 1e3:.2f} | |")
            except PipeoptError as exc:
                out.append(f"| {name} | auto (recompute {rc}) | {type(exc).__name__} | |")
    return out


SCHEDULE_INSTANCE = "instances/memory/gpt2-xl-mb16-a100-40gb-x8.json"
SCHEDULES = ("1F1B", "InterleavedZeroBubble")


def schedule_rows(time_limit: float, ranks: int = 8, microbatches: int = 32) -> list[str]:
    """The schedule problem's rows (module docstring)."""
    from pipeopt.problems.schedule import ScheduleProblem, solve_milp
    from pipeopt.problems.schedule.baselines import uniform

    inst = load(ROOT / SCHEDULE_INSTANCE)
    out = [f"Schedule problem: {Path(SCHEDULE_INSTANCE).stem}, p = {ranks} ranks (one chunk each), "
           f"m = {microbatches}; seconds per iteration (the executor); gap = (value - exact bound) / value",
           "",
           "| schedule | plan | status | s per iteration | gap to exact bound | recomputed:layers per chunk | solve s |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for sched in SCHEDULES:
        bound = None
        for label, rc, how in (("exact, recompute auto", "auto", "milp"), ("exact split, every layer recomputed", "full", "milp"),
                               ("uniform split, exact sets", "auto", "uniform"),
                               ("uniform split, every layer recomputed", "full", "uniform")):
            t0 = time.perf_counter()
            try:
                pr = ScheduleProblem(inst, sched, ranks, microbatches, stages_per_rank=1, recompute=rc)
                res = solve_milp(pr, time_limit=time_limit) if how == "milp" else uniform(pr)
            except PipeoptError as exc:
                out.append(f"| {sched} | {label} | - | - | - | {type(exc).__name__}: {str(exc)[:160]} | "
                           f"{time.perf_counter() - t0:.1f} |")
                continue
            secs = time.perf_counter() - t0
            if label.startswith("exact, recompute auto"):
                bound = res.lower_bound
            gap = "-" if bound is None else f"{(res.objective - bound) / res.objective * 100:.1f}%"
            out.append(f"| {sched} | {label} | {res.status.value} | {res.objective:.4f} | {gap} | "
                       f"{recomputed(res.plan)} | {secs:.1f} |")
            print(f"{sched} {label}: {res.status} {res.objective:.4f} s ({secs:.1f} s)", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", nargs="+", default=list(INSTANCES))
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--schedules", action="store_true", help="also the schedule problem on GPT-2 XL (minutes)")
    ap.add_argument("--out", default=None, help="write the Markdown table here (default: print)")
    args = ap.parse_args(argv)
    lines = ["| instance | S | method | status | ms per microbatch | gap to exact | recomputed:layers per stage "
             "| fullest stage GiB / capacity | solve s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in args.instances:
        inst = load(ROOT / path)
        S = len(inst.cluster.devices)
        name = Path(path).stem
        best = None
        for label, method, rc in ROWS:
            res, msg, secs = run(inst, S, method, rc, args.time_limit)
            if res is None:
                lines.append(f"| {name} | {S} | {label} | - | - | - | {msg} | - | {secs:.1f} |")
                print(f"{name} {label}: {msg}", file=sys.stderr)
                continue
            ev = evaluate(inst, res.plan)
            assert math.isclose(res.objective, ev.objective, rel_tol=1e-9), (label, res.objective, ev.objective)
            if label.startswith("exact, recompute auto") and res.status.value == "optimal":
                best = res.objective
            gap = "-" if best is None else f"{(res.objective - best) / res.objective * 100:+.1f}%"
            fullest = max(range(S), key=lambda s: ev.memory[s] / ev.memory_capacity[s])
            mem = f"{ev.memory[fullest] / GIB:.1f} / {ev.memory_capacity[fullest] / GIB:.1f}"
            status = res.status.value + ("" if ev.feasible else " (breaks memory)")
            lines.append(f"| {name} | {S} | {label} | {status} | {res.objective * 1e3:.2f} | {gap} | "
                         f"{recomputed(res.plan)} | {mem} | {secs:.1f} |")
            print(f"{name} {label}: {res.status} {res.objective * 1e3:.2f} ms ({secs:.1f} s)", file=sys.stderr)
    lines += ["", *zero_rows(args.time_limit)]
    if args.schedules:
        lines += ["", *schedule_rows(args.time_limit)]
    lines.append("")
    lines.append("(1F1B bottleneck per microbatch, `pipeopt.evaluate`; gap = (value - exact auto optimum) / value; "
                 "S = the instance's devices, one per stage)")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(f"# python benchmarks/recompute.py\n\n{text}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
