"""Bi-Partition against same-cut plans: same_cut vs greedy vs exact MILP.

For each instance and each number of stages S it runs the three methods of the
``bipartition`` problem (:mod:`pipeopt.problems.bipartition.problem`) and prints a Markdown table:

* ``same-cut``: the best plan with equal forward and backward cuts (exact partition DP);
* ``greedy-backward``: the local search of :mod:`pipeopt.problems.bipartition.greedy` with
  ``move="backward"`` (backward cuts only), and ``greedy`` the ``greedy`` method itself (its
  default ``move="both"``: forward cuts, backward cuts and both together);
* ``MILP``: the plain exact model (:func:`pipeopt.problems.bipartition.milp.solve_milp` with
  ``dp_bound=False``), its status and solve time;
* ``bisection``: the memory relaxation solved exactly by bisection on T
  (:func:`pipeopt.problems.bipartition.milp.solve_bisection`; optimal when its plan fits memory),
  with the same time limit;
* ``bound``: the best proven lower bound of the two;
* ``gain``: ``(same-cut - method) / same-cut``, the time per microbatch saved;
* ``B/F`` total backward over forward time, and ``B/F CV`` the coefficient of variation of the
  per-unit ratio bwd/fwd (0 = every layer has the same ratio);
* ``moved MB``: bytes per microbatch the MILP plan ships because the cuts differ (stashed
  activations plus weights / M), summed over cuts, in the better exact plan; ``limit``: what
  sets that plan's bottleneck (a stage or a cut).

Instances: PipeDream's measured profiles in ``../shared/data/pipedream-profiles`` (default
bandwidth of the reader, no memory limit) and the model-zoo instances shipped in
``instances/homogeneous/*-x8.json`` and ``instances/memory/*-x8.json`` (8 identical GPUs, their
own memory and bandwidth).

Usage::

    python benchmarks/bipartition_compare.py [--time-limit 30] [--solver highs] [--stages 2 4 8]
                                             [--only NAME ...] [--csv out.csv] [--pd-bandwidth B]
"""

from __future__ import annotations

import argparse
import csv
import glob
import math
import sys
from pathlib import Path

import numpy as np

from pipeopt.errors import InfeasibleError
from pipeopt.io import read
from pipeopt.io.pipedream import read_pipedream
from pipeopt.problems.bipartition.greedy import greedy, same_cut
from pipeopt.problems.bipartition.milp import solve_bisection, solve_milp
from pipeopt.problems.bipartition.problem import BipartitionProblem

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "data" / "pipedream-profiles"
PIPEDREAM = ["alexnet", "vgg16", "resnet18", "squeezenet1_0", "gnmt", "resnet50"]


def instances(only: list[str] | None, pd_bandwidth: float | None = None):
    """``(label, loader)`` pairs: PipeDream profiles, then the shipped zoo instances."""
    out = []
    for m in PIPEDREAM:
        if (PROFILES / f"{m}.txt").exists():
            out.append((f"pd:{m}", lambda m=m: read_pipedream(PROFILES / f"{m}.txt", bandwidth=pd_bandwidth)))
    for f in sorted(glob.glob(str(ROOT / "instances" / "homogeneous" / "*-x8.json"))) + sorted(
        glob.glob(str(ROOT / "instances" / "memory" / "*-x8.json"))
    ):
        out.append((f"zoo:{Path(f).stem}", lambda f=f: read(f)))
    if only:
        out = [(label, load) for label, load in out if any(o in label for o in only)]
    return out


def moved_bytes(p: BipartitionProblem, a: list[int], b: list[int]) -> float:
    """Bytes per microbatch shipped because forward and backward cuts differ, over all cuts:
    what crosses each cut (:meth:`BipartitionProblem.cut_bytes`) less the edges' own bytes."""
    a, b = np.asarray(a, dtype=int), np.asarray(b, dtype=int)
    forward, backward = p.cut_bytes(a, b)
    bb = p.table.boundary_bytes
    return float((forward + backward - bb[a] - bb[b]).sum())


def limit_of(p: BipartitionProblem, a, b) -> str:
    s = p.score(a, b)
    i = int(np.argmax(s.stage_time))
    if p.overlap and len(s.comm_time) and s.comm_time.max() > s.stage_time[i]:
        return f"cut {int(np.argmax(s.comm_time))}"
    return f"stage {i}"


def row(label: str, inst, S: int, time_limit: float, solver: str) -> dict | None:
    p = BipartitionProblem(inst, S)
    ratio = p.bwd / np.where(p.fwd > 0, p.fwd, np.nan)
    ratio = ratio[np.isfinite(ratio)]
    r = {"instance": label, "n": p.n, "S": S, "B/F": p.bwd.sum() / p.fwd.sum(),
         "B/F CV": float(np.std(ratio) / np.mean(ratio)) if len(ratio) else math.nan}
    sc = same_cut(p, time_limit=time_limit)
    if sc.plan is None:
        r["note"] = "no same-cut plan fits memory, hence no Bi-Partition plan either"
        return r
    g = greedy(p, time_limit=time_limit, move="backward")  # the default moves both kinds of cut
    g2 = greedy(p, time_limit=time_limit, move="both")
    try:
        m = solve_milp(p, time_limit=time_limit, solver=solver, dp_bound=False)  # the plain MILP
        d = solve_bisection(p, time_limit=time_limit)
    except InfeasibleError as exc:  # pragma: no cover - excluded by same_cut above
        r["note"] = str(exc)
        return r
    for x in (m, d):
        assert x.evaluation.feasible and x.objective <= sc.objective * (1 + 1e-12)
    assert max(m.lower_bound, d.lower_bound) <= min(m.objective, d.objective) * (1 + 1e-9)
    base = sc.objective
    best = min((m, d), key=lambda x: x.objective)
    r.update({
        "same_cut_ms": base * 1e3,
        "greedy_ms": g.objective * 1e3, "greedy_gain": (base - g.objective) / base, "greedy_s": g.runtime,
        "greedy2_ms": g2.objective * 1e3, "greedy2_gain": (base - g2.objective) / base,
        "greedy2_s": g2.runtime,
        "milp_ms": m.objective * 1e3, "milp_gain": (base - m.objective) / base,
        "milp_status": str(m.status), "milp_s": m.runtime,
        "bisection_ms": d.objective * 1e3, "bisection_gain": (base - d.objective) / base,
        "bisection_status": str(d.status), "bisection_s": d.runtime,
        "bound_ms": max(m.lower_bound, d.lower_bound) * 1e3,
        "moved_MB": moved_bytes(p, best.info["fwd_cuts"], best.info["bwd_cuts"]) / 2**20,
        "limit": limit_of(p, best.info["fwd_cuts"], best.info["bwd_cuts"]),
    })
    return r


def markdown(rows: list[dict]) -> str:
    head = ("| instance | n | S | B/F | B/F CV | same-cut ms | greedy-backward ms (gain) | greedy ms (gain) | "
            "MILP ms (gain) | MILP status, s | bisection ms (gain) | bisection status, s | bound ms | "
            "moved MB | limit |")
    cols = head.count("|") - 1
    lines = [head, "|" + "---|" * cols]
    for r in rows:
        lead = f"| {r['instance']} | {r['n']} | {r['S']} | {r['B/F']:.2f} | {r['B/F CV']:.2f} | "
        if "note" in r:
            lines.append(lead + f"{r['note']} |" + " |" * (cols - 6))
            continue
        lines.append(
            lead + f"{r['same_cut_ms']:.4g} | {r['greedy_ms']:.4g} ({r['greedy_gain']:+.1%}) | "
            f"{r['greedy2_ms']:.4g} ({r['greedy2_gain']:+.1%}) | "
            f"{r['milp_ms']:.4g} ({r['milp_gain']:+.1%}) | {r['milp_status']}, {r['milp_s']:.1f} | "
            f"{r['bisection_ms']:.4g} ({r['bisection_gain']:+.1%}) | {r['bisection_status']}, "
            f"{r['bisection_s']:.1f} | {r['bound_ms']:.4g} | {r['moved_MB']:.1f} | {r['limit']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per MILP (default 30)")
    ap.add_argument("--solver", default="highs", choices=["cbc", "highs"])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--only", nargs="*", help="substrings of instance labels to run")
    ap.add_argument("--csv", type=Path, help="also write the rows as CSV")
    ap.add_argument("--pd-bandwidth", type=float, help="bytes/s between workers for the PipeDream profiles "
                    "(default: the reader's assumed 1.25e10)")
    args = ap.parse_args(argv)
    rows = []
    for label, load in instances(args.only, args.pd_bandwidth):
        inst = load()
        for S in args.stages:
            if S > min(inst.chain.n, len(inst.cluster.devices)):
                continue
            r = row(label, inst, S, args.time_limit, args.solver)
            rows.append(r)
            print(markdown([r]).splitlines()[-1], file=sys.stderr, flush=True)
    print(markdown(rows))
    if args.csv:
        keys = sorted({k for r in rows for k in r})
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=keys)
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
