"""Memory that decides: the exact split with per-layer activation recomputation against the
frameworks' recomputation settings, on the shipped instances where memory binds.

For each instance (S = its device count, one device per stage, 1F1B: stage i keeps S - i
microbatches in flight) the partition problem is solved

* exactly with ``recompute="auto"`` (the DP: the split and each stage's recomputed layers
  together, :mod:`pipeopt.problems.partition.recompute`), and with ``"none"`` and ``"full"``
  (every layer recomputed, split exact);
* by the baselines of :mod:`pipeopt.problems.partition.recompute_baselines`: Megatron-LM's full
  uniform recomputation and its ``block`` method with the fewest layers that fit, both on
  Megatron's split; torchtitan's every-k-th block on its split; AdaPipe's per-stage knapsack with
  its computation-balancing split; no recomputation on the fewest stages S' >= S that fit (more
  devices: its gap is taken per device, its time x S' / S).

Each row gives the objective (the 1F1B bottleneck: seconds per microbatch, shown in ms), the
gap to the exact ``auto`` optimum ((value - optimum) / value), the layers per stage (the
split), each stage's recomputed layers (compact: the zoo's ``layer{i}_attn`` as ``attn i``,
numbers as ranges), every stage's memory against the limit, the ZeRO stage and the solve time.
Every value is ``pipeopt.evaluate``'s of the returned plan.

With ``--schedules``, also the schedule problem (torch's orders, one or two chunks per rank) on GPT-2 XL
(mb 16, 8 A100-40GB, where no split fits without recomputation): per schedule the exact split
with each chunk's recompute set (``recompute="auto"``, the event-time MILP, time-limited: a
stopped solve gives its bound), every layer recomputed on its best split, and torch's uniform
split with its exact sets and with every layer recomputed (iteration time by the executor).

Usage::

    python benchmarks/recompute.py                     # the six shipped instances
    python benchmarks/recompute.py --schedules --out results.md
    python benchmarks/recompute.py --schedules-from benchmarks/results/recompute.md --out new.md
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
    ("adapipe", "adapipe", None),
    ("no recompute, more stages", "no-recompute-more-stages", None),
)
GIB = 2**30
_NUMBERED = re.compile(r"^(.*?)(\d+)(\D*)$")


def ranges(numbers) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    nums, out = sorted(numbers), []
    for x in nums:
        if out and x == out[-1][1] + 1:
            out[-1][1] = x
        else:
            out.append([x, x])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def compact(recompute) -> str:
    """One stage's recompute set in a compact form: layers named ``<prefix><i><suffix>`` grouped
    by their name without the number, the numbers as ranges (the zoo's ``layer1_attn``,
    ``layer2_attn``, ``layer2_mlp`` -> ``attn 1-2, mlp 2``); other names as they are; a mode other
    than full in brackets. ``-`` for nothing recomputed."""
    if not recompute:
        return "-"
    groups: dict = {}
    plain = []
    for name, mode in recompute.items():
        tag = "" if mode == "full" else f" [{mode}]"
        m = _NUMBERED.match(str(name))
        if m:
            key = (m.group(1), m.group(3).lstrip("_"), tag)
            groups.setdefault(key, []).append(int(m.group(2)))
        else:
            plain.append(f"{name}{tag}")
    parts = plain + [f"{suffix or prefix} {ranges(nums)}{tag}" for (prefix, suffix, tag), nums in groups.items()]
    return ", ".join(parts)


def per_stage(plan) -> tuple[str, str]:
    """``(layers per stage "10/8/...", recompute sets per stage "a / b / ...")``."""
    return ("/".join(str(len(st.layers)) for st in plan.stages),
            " / ".join(compact(st.recompute) for st in plan.stages))


def memory_cell(ev) -> str:
    """Every stage's memory in GiB, ``a/b/.../z of LIMIT`` (the limit once if all stages share it)."""
    caps = {round(c / GIB, 1) for c in ev.memory_capacity}
    limit = f"{caps.pop():.1f}" if len(caps) == 1 else "/".join(f"{c / GIB:.1f}" for c in ev.memory_capacity)
    return "/".join(f"{m / GIB:.1f}" for m in ev.memory) + f" of {limit}"


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
    """Recomputed layers per stage, ``a:b / ...`` (a of the stage's b layers)."""
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
           "state 6x the fp16 weights' bytes); exact DP, ms per microbatch; every stage's GiB (the fullest stage's "
           "training state in brackets)",
           "",
           "| instance | ZeRO | recompute | status | ms per microbatch | layers per stage | recomputed per stage "
           "| GiB per stage of the limit [state] |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in ZERO_INSTANCES:
        base = load(ROOT / path)
        S, name = len(base.cluster.devices), Path(path).stem
        for z in (0, 1, 2, 3):
            inst = base.with_settings(zero=z, dp=dp, **ADAM_MIXED)
            for rc in ("none", "auto"):
                res, msg, _ = run(inst, S, "dp", rc, time_limit)
                if res is None:
                    miss = re.search(r"misses the limit by ([0-9.]+ GiB)", msg)
                    why = f"no split fits (the best misses by {miss.group(1)})" if miss else msg[:90]
                    out.append(f"| {name} | {z} | {rc} | - | - | - | - | {why} |")
                    continue
                ev = evaluate(inst, res.plan)
                f = max(range(S), key=lambda s: ev.memory[s] / ev.memory_capacity[s])
                layers, sets = per_stage(res.plan)
                out.append(f"| {name} | {z} | {rc} | {res.status.value} | {res.objective * 1e3:.2f} | {layers} | "
                           f"{sets} | {memory_cell(ev)} [{ev.state[f] / GIB:.2f}] |")
        for rc in ("none", "auto"):
            try:
                best = solve_zero_auto(base.with_settings(dp=dp, **ADAM_MIXED), stages=S, recompute=rc,
                                       time_limit=time_limit)
                out.append(f"| {name} | auto: ZeRO-{best.info['zero_auto']['chosen']} | {rc} | {best.status.value} | "
                           f"{best.objective * 1e3:.2f} | | | |")
            except PipeoptError as exc:
                out.append(f"| {name} | auto | {rc} | {type(exc).__name__} | | | | |")
    return out


SCHEDULE_INSTANCE = "instances/memory/gpt2-xl-mb16-a100-40gb-x8.json"
SCHEDULES = (("1F1B", 1), ("InterleavedZeroBubble", 1), ("ZBVZeroBubble", 2), ("DualPipeV", 2), ("Interleaved1F1B", 2))
"""(schedule, chunks per rank v) of the schedule rows."""


SCHEDULE_PLANS = (("exact, recompute auto", "auto", "milp"), ("exact, no recompute", "none", "milp"),
                  ("exact split, every layer recomputed", "full", "milp"),
                  ("uniform split, exact sets", "auto", "uniform"),
                  ("uniform split, every layer recomputed", "full", "uniform"))
"""(label, recompute, how) of each schedule's rows; with ``memory=True`` (the per-instance tables)
every row also gives each rank's memory."""


def schedule_rows(time_limit: float, ranks: int = 8, microbatches: int = 32, schedules=SCHEDULES,
                  instance: str = SCHEDULE_INSTANCE, memory: bool = False) -> list[str]:
    """The schedule problem's rows (module docstring) on ``instance``. With two chunks per rank
    the uniform split's exact sets may need more than the exact check's combinations
    (:data:`pipeopt.problems.schedule.recompute.MAX_COMBINATIONS`): then its sets are the budget
    heuristic's (:func:`pipeopt.problems.schedule.recompute.budget_recompute`), and the row says so.
    With ``memory`` a row "exact, no recompute" (an infeasible one says by how much the best split
    misses the limit) and a column of each rank's GiB against the limit are added."""
    from pipeopt.problems.schedule import ScheduleProblem, solve_milp
    from pipeopt.problems.schedule.baselines import uniform
    from pipeopt.problems.schedule.problem import uniform_starts
    from pipeopt.problems.schedule.recompute import budget_recompute

    inst = load(ROOT / instance)
    out = [f"Schedule problem: {Path(instance).stem}, p = {ranks} ranks (v chunks each), "
           f"m = {microbatches}; seconds per iteration (the executor); gap = (value - exact bound) / value",
           "",
           "| schedule | v | plan | status | s per iteration | gap to exact bound | recomputed:layers per chunk | "
           + ("GiB per rank of the limit | " if memory else "") + "solve s |",
           "| --- | --- | --- | --- | --- | --- | --- | " + ("--- | " if memory else "") + "--- |"]
    plans = SCHEDULE_PLANS if memory else tuple(x for x in SCHEDULE_PLANS if x[1] != "none")
    for sched, v in schedules:
        bound = None
        for label, rc, how in plans:
            t0 = time.perf_counter()
            try:
                pr = ScheduleProblem(inst, sched, ranks, microbatches, stages_per_rank=v, recompute=rc)
                try:
                    res = solve_milp(pr, time_limit=time_limit) if how == "milp" else uniform(pr)
                except PipeoptError:
                    if how != "uniform" or v == 1:
                        raise
                    starts = uniform_starts(pr.n, pr.S)  # too many combinations to check: the budget heuristic's sets
                    res = pr.result("uniform", starts, "feasible", recompute=budget_recompute(pr, starts),
                                    started=t0)
                    label = "uniform split, budget sets (heuristic)"
            except PipeoptError as exc:
                out.append(f"| {sched} | {v} | {label} | - | - | - | {type(exc).__name__}: {str(exc)[:160]} | "
                           + ("- | " if memory else "") + f"{time.perf_counter() - t0:.1f} |")
                continue
            secs = time.perf_counter() - t0
            if label.startswith("exact, recompute auto"):
                bound = res.lower_bound
            if res.plan is None:  # no plan: the status, and why (an infeasible result says by how much)
                why = str(res.info.get("note") or "-")
                out.append(f"| {sched} | {v} | {label} | {res.status.value} | - | - | {why} | "
                           + ("- | " if memory else "") + f"{secs:.1f} |")
                print(f"{sched} {label}: {res.status} {why} ({secs:.1f} s)", file=sys.stderr)
                continue
            gap = "-" if bound is None else f"{(res.objective - bound) / res.objective * 100:.1f}%"
            ranks_mem = ("/".join(f"{m_ / GIB:.1f}" for m_ in res.evaluation.memory)
                         + f" of {res.evaluation.memory_capacity[0] / GIB:.1f} | ") if memory else ""
            out.append(f"| {sched} | {v} | {label} | {res.status.value} | {res.objective:.4f} | {gap} | "
                       f"{recomputed(res.plan)} | {ranks_mem}{secs:.1f} |")
            print(f"{sched} {label}: {res.status} {res.objective:.4f} s ({secs:.1f} s)", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", nargs="+", default=list(INSTANCES))
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--schedules", action="store_true", help="also the schedule problem on GPT-2 XL (minutes)")
    ap.add_argument("--schedules-from", default=None,
                    help="without --schedules: copy the schedule section of this earlier output unchanged")
    ap.add_argument("--out", default=None, help="write the Markdown table here (default: print)")
    ap.add_argument("--only-schedules", nargs="*", default=None, metavar="INSTANCE",
                    help="only the schedule problem, on these instances (default: the memory instances at "
                         "8 devices), each with its per-rank memory and the no-recompute row")
    ap.add_argument("--schedule-names", nargs="+", default=None, metavar="SCHEDULE",
                    help="with --only-schedules: these schedules only (default: all five)")
    args = ap.parse_args(argv)
    if args.only_schedules is not None:
        chosen = SCHEDULES if not args.schedule_names else tuple(x for x in SCHEDULES if x[0] in args.schedule_names)
        lines = []
        for path in args.only_schedules or [p for p in INSTANCES if p.endswith("-x8.json")]:
            lines += [*schedule_rows(args.time_limit, schedules=chosen, instance=path, memory=True), ""]
            if args.out:  # a long run: what is done so far is on disk
                Path(args.out).write_text("# python benchmarks/recompute.py --only-schedules\n\n" + "\n".join(lines))
        text = "\n".join(lines)
        if args.out:
            Path(args.out).write_text(f"# python benchmarks/recompute.py --only-schedules\n\n{text}")
        else:
            print(text)
        return 0
    lines = ["| instance | S | method | status | ms per microbatch | gap to exact | layers per stage "
             "| recomputed per stage | GiB per stage of the limit | ZeRO | solve s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in args.instances:
        inst = load(ROOT / path)
        S = len(inst.cluster.devices)
        name = Path(path).stem
        zero = inst.settings.zero if inst.settings.data_parallel else 0
        best = None
        for label, method, rc in ROWS:
            res, msg, secs = run(inst, S, method, rc, args.time_limit)
            if res is None or res.plan is None:
                misses = {} if res is None else res.info.get("misses") or {}
                if misses:  # no recompute on more stages: no S' fits
                    close = min(misses, key=misses.get)
                    msg = (f"no S' in {min(res.info['tried'])}..{max(res.info['tried'])} fits; the closest, S' = "
                           f"{close}, misses by {misses[close] / GIB:.2f} GiB (at S' = {S}: "
                           f"{misses.get(S, math.nan) / GIB:.2f} GiB)")
                msg = msg or str(res.info.get("note", res.status.value))[:200]
                lines.append(f"| {name} | {S} | {label} | - | - | - | - | {msg} | - | {zero} | {secs:.1f} |")
                print(f"{name} {label}: {msg}", file=sys.stderr)
                continue
            ev = res.evaluation  # pipeopt.evaluate's, on the instance the plan runs on
            if method != "no-recompute-more-stages":
                check = evaluate(inst, res.plan)
                assert math.isclose(res.objective, check.objective, rel_tol=1e-9), (label, res.objective, check.objective)
            if label.startswith("exact, recompute auto") and res.status.value == "optimal":
                best = res.objective
            value, shown = res.objective, f"{res.objective * 1e3:.2f}"
            if method == "no-recompute-more-stages":  # compared per device: T' S' / S
                value = res.info["per_device"]
                shown = (f"{res.objective * 1e3:.2f} on S' = {res.info['stages']} ({res.info['devices']} devices; "
                         f"per {S} devices {value * 1e3:.2f})")
            gap = "-" if best is None else f"{(value - best) / value * 100:+.1f}%"
            status = res.status.value + ("" if ev.feasible else " (breaks memory)")
            layers, sets = per_stage(res.plan)
            lines.append(f"| {name} | {S} | {label} | {status} | {shown} | {gap} | {layers} | {sets} | "
                         f"{memory_cell(ev)} | {zero} | {secs:.1f} |")
            print(f"{name} {label}: {res.status} {shown} ms ({secs:.1f} s)", file=sys.stderr)
    lines += ["", *zero_rows(args.time_limit)]
    if args.schedules:
        lines += ["", *schedule_rows(args.time_limit)]
    elif args.schedules_from:  # the schedule section of an earlier run, copied unchanged
        old = Path(args.schedules_from).read_text().splitlines()
        start = next((i for i, x in enumerate(old) if x.startswith("Schedule problem:")), None)
        if start is not None:
            end = next((i for i in range(start + 1, len(old)) if old[i].startswith("(")), len(old))
            lines += ["", *[x for x in old[start:end] if x.strip() or x == ""]]
            while lines[-1] == "":
                lines.pop()
    lines.append("")
    lines.append("(1F1B bottleneck per microbatch, `pipeopt.evaluate`; gap = (value - exact auto optimum) / value, "
                 "for no recompute on more stages taken per device (its time x S' / S); S = the instance's devices, "
                 "one per stage; recomputed layers per stage: the zoo's layer{i}_attn / layer{i}_mlp as attn / mlp "
                 "with the block numbers i, '-' none; GiB per stage: pipeopt.evaluate's memory of each stage)")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(f"# python benchmarks/recompute.py\n\n{text}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
