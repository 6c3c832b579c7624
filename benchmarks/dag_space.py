"""One layer order or every convex split? The gain of the convex space, and dp.exe beside it.

Two tables (written to ``benchmarks/results/dag_space_{workloads,profiles}.{md,csv}``, and both
in ``dag_space.md`` when both run):

1. **Tarnawski et al.'s 16 throughput workloads** (``../shared/data/dnn-partitioning``), in
   their own model (``max_load``, read by :func:`pipeopt.io.read_dnn_partitioning`): the
   one-order optimum (``placement``/``one_order``), the convex optimum (``placement``/``dp``,
   the DP over ideals), and - where the user has built ``dp.exe`` from the authors' repository
   (``g++ -O3 throughput-dp/dp.cpp -o dp.exe``; pipeopt never ships their code) and passes its
   path with ``--dp-exe`` - dp.exe's optimum and time, run unmodified on the same file, with a
   time limit.
2. **PipeDream's profiles** (``../shared/data/pipedream-profiles``), in pipeopt's pipeline model
   (1F1B steady state, window rows): the one-order optimum (``dp``) and the convex optimum at
   S = 4 and 8, straight and replicated: the DP over ideals (``convex``) and, for straight
   stages, the convex MILP (``convex_milp``, HiGHS), the proven one of the two.

Times are wall seconds inside one Python process after import (``--cli`` adds the wall time of
``pipeopt solve FILE`` with start-up). Each solve gets ``--time-limit`` seconds (default 120).

    python benchmarks/dag_space.py                      # both tables
    python benchmarks/dag_space.py --dp-exe /path/to/dp.exe --cli
    python benchmarks/dag_space.py --only workloads     # or: profiles
    python benchmarks/dag_space.py --perturb 3          # seeded random Inception-v3 variants
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

import pipeopt
from pipeopt.errors import PipeoptError
from pipeopt.io.dnn_partitioning import read_dnn_partitioning

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WORKLOADS = SHARED / "dnn-partitioning" / "throughput-inputs"
PROFILES = SHARED / "pipedream-profiles"
OUT = Path(__file__).resolve().parent / "results"


def _solve(inst, limit, **kw):
    t = time.perf_counter()
    try:
        r = pipeopt.solve(inst, time_limit=limit, **kw)
    except PipeoptError as exc:
        return None, time.perf_counter() - t, f"{type(exc).__name__}: {str(exc)[:80]}"
    return r, time.perf_counter() - t, ""


def _dp_exe(exe: str, path: Path, limit: float):
    t = time.perf_counter()
    try:
        run = subprocess.run([exe], stdin=path.open(), capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return math.nan, limit, f"no answer within {limit:.0f} s"
    dt = time.perf_counter() - t
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["?"])[-1]
        return math.nan, dt, f"exit {run.returncode}: {last[:60]}"
    return float(json.loads(run.stdout)["maxLoad"]), dt, ""


def workloads(args) -> pd.DataFrame:
    rows = []
    for path in sorted(WORKLOADS.glob("*/*.json")):
        inst = read_dnn_partitioning(path)
        one, t_one, err1 = _solve(inst, args.time_limit, problem="placement", method="one_order")
        cv, t_cv, err2 = _solve(inst, args.time_limit, problem="placement", method="dp")
        row = {
            "workload": f"{path.parent.name}/{path.stem}",
            "layers": inst.num_layers,
            "ideals": (cv.info.get("lattice", "").split(" ")[0] if cv else ""),
            "one_order_ms": one.objective * 1e3 if one else math.nan,
            "convex_ms": cv.objective * 1e3 if cv else math.nan,
            "status": str(cv.status) if cv else err2,
            "gain_%": (one.objective / cv.objective - 1) * 100 if one and cv else math.nan,
            "pipeopt_s": t_cv,
        }
        if args.cli:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pipeopt", "solve", str(path), "--json",
                            "--time-limit", str(args.time_limit)], capture_output=True, check=False)
            row["pipeopt_cli_s"] = time.perf_counter() - t
        if args.dp_exe:
            v, dt, err = _dp_exe(args.dp_exe, path, args.dp_exe_limit)
            row.update({"dp_exe_ms": v, "dp_exe_s": dt, "dp_exe_note": err,
                        "rel_diff": (row["convex_ms"] - v) / v if v == v else math.nan})
        rows.append(row)
        print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return pd.DataFrame(rows)


def profiles(args) -> pd.DataFrame:
    rows = []
    for path in sorted(p for p in PROFILES.glob("*.txt") if p.stem != "LICENSE"):
        inst = pipeopt.read(path)
        for S in args.stages:
            for rep in (False, True):
                one, t_one, _ = _solve(inst, args.time_limit, stages=S, method="dp", replication=rep)
                cv, t_cv, err = _solve(inst, args.time_limit, stages=S, method="convex", replication=rep)
                row = {
                    "profile": path.stem, "S": S, "replication": rep,
                    "ideals": (cv.info.get("lattice", "").split(" ")[0] if cv else ">400,000" if "Lattice" in err
                               else ""),
                    "one_order_ms": one.objective * 1e3 if one else math.nan,
                    "convex_dp_ms": cv.objective * 1e3 if cv else math.nan,
                    "convex_dp": str(cv.status) if cv else err.split(":")[0],
                    "convex_dp_s": t_cv,
                }
                best = cv if cv and str(cv.status) == "optimal" else None
                if not rep:  # the convex MILP (straight stages), HiGHS
                    mi, t_mi, err = _solve(inst, args.time_limit, stages=S, method="convex_milp", solver="highs")
                    row.update({"convex_milp_ms": mi.objective * 1e3 if mi else math.nan,
                                "convex_milp": str(mi.status) if mi else err.split(":")[0],
                                "convex_milp_bound_ms": (mi.lower_bound if mi and mi.lower_bound is not None
                                                         else math.nan) * 1e3,
                                "convex_milp_s": t_mi})
                    if best is None and mi and str(mi.status) == "optimal":
                        best = mi
                row["convex_optimum_ms"] = best.objective * 1e3 if best else math.nan
                row["gain_%"] = (one.objective / best.objective - 1) * 100 if one and best else math.nan
                rows.append(row)
                print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    return pd.DataFrame(rows)


def perturbed(args) -> pd.DataFrame:
    """Seeded random workloads of the same family: each node's latencies and each node's
    outgoing transfer cost scaled by a factor drawn uniformly in [0.8, 1.2] (one per node, so a
    node's out-edges keep one cost, as the format requires). Reports whether the convex optimum
    is proven within the time limit."""
    import random
    import tempfile

    rows = []
    names = args.perturb_workloads
    for seed in range(1, args.perturb + 1):
        for name in names:
            d = json.loads((WORKLOADS / f"{name}.json").read_text())
            rng = random.Random(f"{name}/{seed}")
            scale = {n["id"]: rng.uniform(0.8, 1.2) for n in d["nodes"]}
            for n in d["nodes"]:
                n["cpuLatency"] *= scale[n["id"]]
                n["fpgaLatency"] *= scale[n["id"]]
            cost = {n["id"]: rng.uniform(0.8, 1.2) for n in d["nodes"]}
            for e in d["edges"]:
                e["cost"] *= cost[e["sourceId"]]
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / f"{Path(name).name}-seed{seed}.json"
                path.write_text(json.dumps(d))
                inst = read_dnn_partitioning(path)
                cv, t, err = _solve(inst, args.time_limit, problem="placement", method="dp")
            row = {"workload": name, "seed": seed, "status": str(cv.status) if cv else err,
                   "convex_ms": cv.objective * 1e3 if cv else math.nan, "pipeopt_s": t,
                   "one_order_ms": cv.info["one_order"]["value"] * 1e3 if cv and "one_order" in cv.info else math.nan}
            rows.append(row)
            print(" ".join(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return pd.DataFrame(rows)


def _markdown(df: pd.DataFrame) -> str:
    """A GitHub table of the rows (floats to 6 significant digits)."""
    def cell(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(df.columns) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dp-exe", help="path to the authors' dp.exe, built from msr-fiddle/dnn-partitioning")
    ap.add_argument("--dp-exe-limit", type=float, default=600.0, help="seconds per dp.exe run (default 600)")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per pipeopt solve (default 120)")
    ap.add_argument("--stages", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--only", choices=["workloads", "profiles"])
    ap.add_argument("--cli", action="store_true", help="also time `pipeopt solve FILE` with start-up")
    ap.add_argument("--out", default=str(OUT / "dag_space"), help="path stem of the .md and .csv")
    ap.add_argument("--perturb", type=int, default=0, metavar="SEEDS",
                    help="only: solve SEEDS seeded perturbations of --perturb-workloads (latencies and costs x U[0.8, 1.2])")
    ap.add_argument("--perturb-workloads", nargs="+",
                    default=["LayerGraphs/inceptionv3_inference", "LayerGraphs/inceptionv3_training"])
    args = ap.parse_args(argv)
    if args.perturb:
        r = perturbed(args)
        r.to_csv(args.out + "_perturbed.csv", index=False)
        Path(args.out + "_perturbed.md").write_text(
            "## Seeded perturbations (latencies and costs x U[0.8, 1.2]), placement dp\n\n" + _markdown(r) + "\n")
        print(f"wrote {args.out}_perturbed.md")
        return
    parts = []
    if args.only in (None, "workloads"):
        w = workloads(args)
        parts.append("## Tarnawski et al.'s workloads, their model (max-load, ms)\n\n" + _markdown(w))
        w.to_csv(args.out + "_workloads.csv", index=False)
        Path(args.out + "_workloads.md").write_text(parts[-1] + "\n")
    if args.only in (None, "profiles"):
        p = profiles(args)
        parts.append("## PipeDream's profiles, pipeopt's model (1F1B period, ms)\n\n" + _markdown(p))
        p.to_csv(args.out + "_profiles.csv", index=False)
        Path(args.out + "_profiles.md").write_text(parts[-1] + "\n")
    if args.only is None:
        Path(args.out + ".md").write_text("# One order or every convex split (`benchmarks/dag_space.py`)\n\n"
                                          + "\n\n".join(parts) + "\n")
    print(f"wrote {args.out}*.md")


if __name__ == "__main__":
    main()
