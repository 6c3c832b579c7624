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

Usage::

    python benchmarks/recompute.py                     # the six shipped instances
    python benchmarks/recompute.py --out results.md
"""

from __future__ import annotations

import argparse
import math
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", nargs="+", default=list(INSTANCES))
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
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
