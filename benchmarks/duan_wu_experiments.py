"""Duan & Wu's experiments (ICPADS 2022), reproduced in shape with exact optima.

Run from the repository root::

    python benchmarks/duan_wu_experiments.py [--time-limit 60] [--out benchmarks/results/duan_wu.md]

1. Time per microbatch against pipeline depth S (joint problem, identical multi-resource
   workers): the sequential optimum (no split), the split optimum (exact DP), the paper's two
   steps (binary-search partition, then the LP split) and their gap; the gain of the split.
2. Time per microbatch against the number of heterogeneous devices grouped into q workers
   (group problem): Algorithm 2 and round-robin (both followed by binary search and the LP
   split) against the exact optimum (CP-SAT over stage intervals, bisected on T; its proven
   bound and gap when it stops at the time limit).

Instances: AlexNet and GoogLeNet from the model zoo (Jetson AGX Orin workers with CPU, GPU and
DLA; a mix of edge SoCs: Jetson AGX Orin, Apple M2, Apple M1, Snapdragon X Elite, over 10 GbE)
and PipeDream's measured AlexNet, ResNet-50 and GNMT profiles with a *synthetic* CPU kind (8x slower forward than
the GPU, backward = its forward; documented in :func:`pipeopt.problems.resource.examples.with_second_kind`)
on workers of 1 GPU + 4 CPU units.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pipeopt
from pipeopt import zoo
from pipeopt.problems.resource.duan_wu import algorithm2, round_robin, two_step
from pipeopt.problems.resource import group, joint
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.resource import GroupProblem, JointProblem
from pipeopt.problems.resource.examples import with_second_kind
from pipeopt.problems.resource.problem import minmax_chain_dp

PROFILES = Path("../shared/data/pipedream-profiles")
SOC_MIX = {"jetson-agx-orin": 4, "apple-m2": 4, "apple-m1": 4, "snapdragon-x-elite": 4}


def ms(x: float) -> str:
    return f"{x * 1e3:.3f}" if math.isfinite(x) else "inf"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def pipedream_profile(name: str, devices: int) -> pipeopt.Instance:
    base = read_pipedream(PROFILES / f"{name}.txt", devices=devices)
    graph = with_second_kind(base.graph, kind="cpu", slowdown=8.0, bwd_ratio=1.0)
    devs = tuple(pipeopt.Device(f"w{i}", {"gpu": 1, "cpu": 4}) for i in range(devices))
    return pipeopt.Instance(graph, pipeopt.Cluster(devs, base.cluster.bandwidth), name=f"{name}-pipedream+cpu",
                            assumptions=base.assumptions + ("synthetic cpu kind: forward 8x the GPU's, backward = forward",))


def depth_instances():
    out = []
    for m in ("alexnet", "googlenet"):
        for link in ("10gbe", "pcie4"):  # the shipped link (transfer-bound) and a fast one (compute-bound)
            inst = zoo.instance(m, "jetson-agx-orin", 8, bandwidth=link)
            out.append(inst.replace(name=f"{inst.name}-{link}"))
    for name in ("alexnet", "resnet50", "gnmt"):
        out.append(pipedream_profile(name, 8))
    return out


def depth_sweep(lines: list, max_depth: int = 8) -> None:
    lines += ["## 1. Time per microbatch vs pipeline depth (joint: identical workers)", "",
              ("sequential = best plan without the split (exact DP); split = exact joint optimum (DP, "
              "cross-checked by CP-SAT at S = 4); two-step = Duan & Wu (binary search, then LP split); "
              "gain = sequential / split; gap = (two-step - optimum) / two-step."), "",
              "| instance | S | sequential (ms) | split optimum (ms) | gain | two-step (ms) | two-step gap | CP-SAT (S=4) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for inst in depth_instances():
        for S in (1, 2, 3, 4, 6, 8):
            if S > min(max_depth, inst.chain.n, len(inst.cluster.devices)):
                continue
            p = JointProblem(inst, S)
            _, seq = minmax_chain_dp(p, p.groups, "sequential")
            opt = joint.solve_dp(p)
            ts = two_step(p)
            gap = (ts.objective - opt.objective) / ts.objective
            check = ""
            if S == 4:
                c = joint.solve_cpsat(p, time_limit=60, threads=2)
                check = f"{c.status}, {ms(c.objective)} ms, {c.runtime:.1f} s"
            lines.append(f"| {inst.name} | {S} | {ms(seq)} | {ms(opt.objective)} | {seq / opt.objective:.3f} | "
                         f"{ms(ts.objective)} | {pct(gap)} | {check} |")
            print(lines[-1], flush=True)
    lines.append("")


def soc_mix(model: str, count: int) -> pipeopt.Instance:
    """The first ``count`` devices of a 16-device edge mix, dealt one of each type in turn."""
    full = zoo.instance(model, SOC_MIX, bandwidth="10gbe")
    by_type: dict = {}
    for d in full.cluster.devices:
        by_type.setdefault(d.name.rsplit("-", 1)[0], []).append(d)
    order = [d for group_ in zip(*by_type.values()) for d in group_]
    cluster = pipeopt.Cluster(tuple(order[:count]), full.cluster.bandwidth)
    return full.replace(cluster=cluster, name=f"{model}-soc-mix{count}")


def device_sweep(lines: list, time_limit: float, workers: int = 4, counts=(4, 6, 8, 12, 16)) -> None:
    lines += [f"## 2. Time per microbatch vs number of heterogeneous devices (group: q = {workers} workers)", "",
              ("exact = CP-SAT over stage intervals bisected on T (time limit "
              f"{time_limit:.0f} s; status, proven lower bound and gap); gaps of the baselines are to the exact "
              "method's plan. Last column: Algorithm 2's workers (in its order) with the exact partition and split "
              "(min-max DP), separating the grouping's share of the gap from the partition's."), "",
              ("| instance | devices | Algorithm 2 (ms) | round-robin (ms) | exact (ms) | status | bound (ms) | exact gap | "
              "Alg. 2 gap | round-robin gap | exact time (s) | Alg. 2 groups + exact partition (ms) |"),
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model in ("alexnet", "googlenet"):
        for count in counts:
            inst = soc_mix(model, count)
            p = GroupProblem(inst, min(workers, count))
            a2, rr = algorithm2(p), round_robin(p)
            ex = group.solve_cpsat(p, time_limit=time_limit, threads=2)
            a2_groups = [tuple(st.devices) for st in a2.plan.stages]
            _, a2_exact_part = minmax_chain_dp(p, a2_groups, "split")
            g2 = (a2.objective - ex.objective) / a2.objective
            gr = (rr.objective - ex.objective) / rr.objective
            lines.append(f"| {inst.name} | {count} | {ms(a2.objective)} | {ms(rr.objective)} | {ms(ex.objective)} | "
                         f"{ex.status} | {ms(ex.lower_bound)} | {pct(ex.gap)} | {pct(g2)} | {pct(gr)} | "
                         f"{ex.runtime:.1f} | {ms(a2_exact_part)} |")
            print(lines[-1], flush=True)
    lines.append("")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", default="benchmarks/results/duan_wu.md")
    ap.add_argument("--skip-depth", action="store_true")
    ap.add_argument("--skip-devices", action="store_true")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    lines = ["# Duan & Wu's experiments, reproduced in shape (pipeopt)", "",
             ("Generated by `python benchmarks/duan_wu_experiments.py`. Bottleneck = steady-state time per "
             "microbatch (1F1B, communication overlapped); every objective is `pipeopt.evaluate` of the plan."), ""]
    if not args.skip_depth:
        depth_sweep(lines)
    if not args.skip_devices:
        device_sweep(lines, args.time_limit)
    lines.append(f"Total run time {time.perf_counter() - started:.0f} s on a shared 2-core machine.")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
