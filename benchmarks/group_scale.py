"""Grouping at scale: the type DP's proven-optimal time against the number of devices and of
device types, and on 16 all-distinct devices into 4 workers (issue 11, deliver 2 and 4).

Method: ``types`` (:func:`pipeopt.problems.resource.group_dp.solve_dp`: a DP over stage,
layer prefix and the count of each device type used, bisected on T; one thread). Each row: the
optimum found, the proven lower bound, the gap, the wall time (bounds, starts, every probe and
the tie-break phase) and Algorithm 2's period for scale. ``optimal`` means the bracket closed
to a relative gap of 1e-4. ``--compare`` adds the group CP-SAT (2 threads) and MILP (HiGHS)
on the same instances, with the same time limit.

Instances (synthetic clusters over real model shapes; times per microbatch in ms):

* Types grid: GPT-2 XL (zoo, 98 units, fp16) on D devices of t types, the first t of the edge
  mix Jetson AGX Orin, Apple M2, Apple M1, Snapdragon X Elite (CPU + GPU + NPU each, 10 GbE),
  D/t devices of each type, into ``max(2, min(16, D/4))`` workers.
* All-distinct, 16 devices into 4 workers (16 types of one device each):
  GPT-2 XL on the four SoCs, each in four power modes scaling its every resource by 1.0, 0.85,
  0.7 and 0.55 (memory unchanged); ResNet-50 and GNMT from PipeDream's measured profiles with a
  synthetic CPU kind (:func:`pipeopt.problems.resource.examples.with_second_kind`), device i of
  the four synthetic worker types of ``benchmarks/group_times.py`` cycled, its resources scaled
  by ``1 - 0.03 i`` (InfiniBand EDR).

Usage (from the repository root)::

    python benchmarks/group_scale.py --quick       # 4-16 devices, 1-4 types, GPT-2 distinct; 20 s per solve
    python benchmarks/group_scale.py               # 4-64 devices, 1-4 types, the three distinct cases; 60 s
    (1, 2 and 4 types on 4, 8, 16, 32, 64 devices; 3 types on 12, 24, 48)
        [--devices 4 8 ...] [--types 1 2 ...] [--distinct gpt2-xl resnet50 gnmt] [--time-limit 60]
        [--compare] [--out benchmarks/results/group_scale]

Writes ``<out>.md``, ``<out>.csv`` and ``<out>.png`` (log-log: wall time against devices, one
line per number of types; unproven runs drawn hollow at the time limit), ``<out>_quick.*`` with
``--quick``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pipeopt
from pipeopt import zoo
from pipeopt.problems.resource import GroupProblem, group
from pipeopt.problems.resource.duan_wu import algorithm2
from pipeopt.problems.resource.group_dp import solve_dp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from group_times import profile_instance  # noqa: E402  (the PipeDream-profile clusters)

SOC_TYPES = ("jetson-agx-orin", "apple-m2", "apple-m1", "snapdragon-x-elite")
POWER_MODES = (1.0, 0.85, 0.7, 0.55)


def typed_instance(devices: int, types: int) -> pipeopt.Instance:
    """GPT-2 XL on ``devices`` SoCs of the first ``types`` types, equally many of each."""
    per = devices // types
    inst = zoo.instance("gpt2-xl", {t: per for t in SOC_TYPES[:types]}, bandwidth="10gbe")
    return inst.replace(name=f"gpt2-xl {types}x{per}")


def distinct_instance(model: str) -> pipeopt.Instance:
    """16 all-distinct devices (module docstring)."""
    if model == "gpt2-xl":
        full = zoo.instance("gpt2-xl", {t: 4 for t in SOC_TYPES}, bandwidth="10gbe")
        by_type: dict = {}
        for d in full.cluster.devices:
            by_type.setdefault(d.name.rsplit("-", 1)[0], []).append(d)
        devs = [pipeopt.Device(d.name, {k: v * POWER_MODES[m] for k, v in d.resources.items()}, d.memory)
                for ds in by_type.values() for m, d in enumerate(ds)]
        return full.replace(cluster=pipeopt.Cluster(tuple(devs), full.cluster.bandwidth),
                            name="gpt2-xl (zoo) distinct16")
    inst = profile_instance(model, 16)
    devs = [pipeopt.Device(d.name, {k: v * (1.0 - 0.03 * i) for k, v in d.resources.items()}, d.memory)
            for i, d in enumerate(inst.cluster.devices)]
    return inst.replace(cluster=pipeopt.Cluster(tuple(devs), inst.cluster.bandwidth),
                        name=f"{model} (PipeDream) distinct16")


def ms(x) -> str:
    return "-" if x is None else (f"{x * 1e3:.4f}" if math.isfinite(x) else "inf")


def run(problem: GroupProblem, label: str, time_limit: float) -> tuple:
    """(result, wall seconds) of one method."""
    t = time.perf_counter()
    if label == "types":
        r = solve_dp(problem, time_limit=time_limit)
    elif label == "cpsat":
        r = group.solve_cpsat(problem, time_limit=time_limit, threads=2)
    else:
        r = group.solve_milp(problem, time_limit=time_limit, solver="highs")
    return r, time.perf_counter() - t


def plot(rows: list[dict], path: Path, limit: float) -> None:
    """Log-log plot of the types rows: wall seconds against devices, a line per type count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    grid = [r for r in rows if r["method"] == "types" and r["types"] <= 4]
    for t in sorted({r["types"] for r in grid}):
        pts = sorted((r["devices"], r["time_s"], r["status"] == "optimal") for r in grid if r["types"] == t)
        line, = ax.plot([d for d, _, _ in pts], [s for _, s, _ in pts], marker="o", label=f"{t} type{'s' * (t > 1)}")
        for d, sec, proven in pts:
            if not proven:
                ax.plot([d], [sec], marker="o", markersize=11, markerfacecolor="none", color=line.get_color())
    distinct = [r for r in rows if r["method"] == "types" and r["types"] > 4]
    for r in distinct:
        ax.plot([r["devices"]], [r["time_s"]], marker="s" if r["status"] == "optimal" else "x", color="black")
        left = r["instance"].startswith("gnmt")  # GNMT and ResNet-50 land near the limit together
        ax.annotate(r["instance"].split()[0], (r["devices"], r["time_s"]), textcoords="offset points",
                    xytext=(-34 if left else 6, -3), fontsize=7)
    ax.axhline(limit, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("wall time of the whole solve (s)")
    ax.set_title("group 'types' DP on GPT-2 XL (hollow/x: not proven at the limit)", fontsize=9)
    ax.legend(fontsize=8, title="squares: 16 distinct devices", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4-16 devices, GPT-2 distinct only, 20 s per solve")
    ap.add_argument("--devices", nargs="*", type=int, default=None)
    ap.add_argument("--types", nargs="*", type=int, default=None)
    ap.add_argument("--distinct", nargs="*", default=None)
    ap.add_argument("--time-limit", type=float, default=None)
    ap.add_argument("--compare", action="store_true", help="also the group CP-SAT and MILP (HiGHS)")
    ap.add_argument("--out", default="benchmarks/results/group_scale")
    args = ap.parse_args(argv)
    # 1, 2 and 4 types on 4..64 devices; 3 types on 12, 24, 48 (equally many of each type)
    devices = args.devices or ([4, 8, 12, 16] if args.quick else [4, 8, 12, 16, 24, 32, 48, 64])
    types = args.types or [1, 2, 3, 4]
    distinct = args.distinct if args.distinct is not None else (["gpt2-xl"] if args.quick else
                                                                 ["gpt2-xl", "resnet50", "gnmt"])
    limit = args.time_limit or (20.0 if args.quick else 60.0)
    methods = ["types", "cpsat", "milp (highs)"] if args.compare else ["types"]
    out = Path(args.out + ("_quick" if args.quick else "") + ".md")
    rows: list[dict] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ["# Grouping at scale: the type DP", "",
             f"Generated by `python benchmarks/group_scale.py{' --quick' if args.quick else ''}` (time limit "
             f"{limit:.0f} s per solve). Periods per microbatch in ms; time = wall seconds of the whole solve.", "",
             "| instance | devices | types | count vectors | workers | units | method | status | objective | bound "
             "| gap | time (s) | Alg. 2 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    cases = []
    for d in devices:
        for t in types:
            if d % t == 0 and d >= t and (t == 3) == (d % 3 == 0):
                cases.append((typed_instance(d, t), max(2, min(16, d // 4)), t))
    for model in distinct:
        cases.append((distinct_instance(model), 4, 16))
    for inst, q, t in cases:
        p = GroupProblem(inst, q)
        vectors = math.prod(len(c) + 1 for c in p.device_classes)
        a2 = algorithm2(p)
        for label in methods:
            r, wall = run(p, label.split()[0], limit)
            gap = "-" if r.gap is None else f"{100 * r.gap:.3f}%"
            lines.append(f"| {inst.name} | {len(inst.cluster.devices)} | {t} | {vectors:,} | {q} | {inst.chain.n} | "
                         f"{label} | {r.status} | {ms(r.objective)} | {ms(r.lower_bound)} | {gap} | {wall:.1f} | "
                         f"{ms(a2.objective)} |")
            print(lines[-1], flush=True)
            out.write_text("\n".join(lines) + "\n")
            rows.append({"instance": inst.name, "devices": len(inst.cluster.devices), "types": t,
                         "count_vectors": vectors, "workers": q, "units": inst.chain.n, "method": label,
                         "status": str(r.status), "objective_ms": None if r.objective is None else r.objective * 1e3,
                         "bound_ms": None if r.lower_bound is None else r.lower_bound * 1e3,
                         "gap": r.gap, "time_s": wall, "algorithm2_ms": a2.objective * 1e3})
    out.write_text("\n".join(lines) + "\n")
    import pandas as pd

    pd.DataFrame(rows).to_csv(out.with_suffix(".csv"), index=False)
    plot(rows, out.with_suffix(".png"), limit)
    print(f"wrote {out}, {out.with_suffix('.csv')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
