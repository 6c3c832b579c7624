"""The tie-break (secondary objective) of the exact joint, group and Bi-Partition methods: do
they agree, is it proven within its budget, and what does it gain?

Run from the repository root::

    python benchmarks/tiebreak_agreement.py [--time-limit 10] [--quick] [--only NAME ...] [--out FILE.md]

For every instance the exact methods of its problem run with the same time limit, and each row
shows the primary objective, the secondary value of the plan returned (``info["secondary"]``:
joint and group, the latency of one microbatch; Bi-Partition, the 1F1B-flush iteration time of
M microbatches), whether the second phase proved it (within its work limits,
:mod:`pipeopt.problems.secondary`), how much it lowered the secondary value of the proven plan, the phase's wall
time, and the plan's true iteration time of M microbatches (evaluate). The last column says
whether the methods of the instance agree on the secondary value (relative 1e-9) among those
that proved it with the same primary optimum.

Instances: joint and group - the shipped heterogeneous instances (``instances/heterogeneous``,
q = min(4, devices), the problem the bench picks); Bi-Partition - PipeDream's measured
profiles of AlexNet, VGG16, ResNet-18 and SqueezeNet (``../shared/data/pipedream-profiles``)
with S in {2, 4}. ``--quick``: the first two heterogeneous instances and AlexNet only.
"""

from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

from pipeopt.io import read
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.bipartition.milp import solve_bisection, solve_milp
from pipeopt.problems.bipartition.problem import BipartitionProblem
from pipeopt.problems.resource import GroupProblem, JointProblem, group, joint
from pipeopt.registry import auto_problem

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "data" / "pipedream-profiles"
PD = ("alexnet", "vgg16", "resnet18", "squeezenet1_0")


def cases(quick: bool):
    """``(label, problem, {method name: solve})`` per instance."""
    files = sorted(glob.glob(str(ROOT / "instances" / "heterogeneous" / "*.json")))
    for f in files[:2] if quick else files:
        inst = read(f)
        q = min(4, len(inst.cluster.devices))
        if auto_problem(inst) == "group":
            yield Path(f).stem, GroupProblem(inst, q), {"milp": group.solve_milp, "cpsat": group.solve_cpsat}
        else:
            yield Path(f).stem, JointProblem(inst, q), {"dp": joint.solve_dp, "milp": joint.solve_milp,
                                                        "cpsat": joint.solve_cpsat}
    for name in PD[:1] if quick else PD:
        if not (PROFILES / f"{name}.txt").exists():
            continue
        for S in (2, 4):
            inst = read_pipedream(PROFILES / f"{name}.txt", devices=S)
            yield f"pd:{name} S={S}", BipartitionProblem(inst, S), {"milp": solve_milp, "bisection": solve_bisection}


def rows(time_limit: float, quick: bool, only: list[str] | None) -> list[str]:
    head = ("| instance | problem | method | status | objective ms | secondary ms | proven | gain | phase s | "
            "iteration ms | agree |")
    out = [head, "|" + "---|" * 11]
    for label, problem, methods in cases(quick):
        if only and not any(o in label for o in only):
            continue
        kind = type(problem).__name__.replace("Problem", "").lower()
        results = {name: solve(problem, time_limit=time_limit) for name, solve in methods.items()}
        proven = [(r.objective, r.info["secondary"]["value"]) for r in results.values()
                  if r.info.get("secondary", {}).get("proven")]
        same = [v for o, v in proven if math.isclose(o, min(p[0] for p in proven), rel_tol=1e-9)] if proven else []
        agree = "yes" if same and max(same) <= min(same) * (1 + 1e-9) else "-"
        for name, r in results.items():
            rec = r.info.get("secondary", {})
            value, before = rec.get("value", math.nan), rec.get("improved_from")
            gain = f"{(before - value) / before:.1%}" if before else "0"
            out.append(f"| {label} | {kind} | {name} | {r.status} | {r.objective * 1e3:.4f} | {value * 1e3:.4f} | "
                       f"{rec.get('proven')} | {gain} | {rec.get('seconds', math.nan):.2f} | "
                       f"{rec.get('iteration_time', math.nan) * 1e3:.3f} | {agree} |")
        print(out[-1], file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds per method (default 10)")
    ap.add_argument("--quick", action="store_true", help="two heterogeneous instances and AlexNet only")
    ap.add_argument("--only", nargs="*", help="substrings of instance labels to run")
    ap.add_argument("--out", type=Path, help="also write the table to this Markdown file")
    args = ap.parse_args(argv)
    table = "\n".join(rows(args.time_limit, args.quick, args.only))
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
