"""Wall time of a bench sweep: sequential against ``--jobs N`` (and optionally a local Dask
cluster). Issue 11, Deliver 4: "a ``--jobs 2`` sweep's wall time against sequential".

Each executor runs the same task set through :func:`pipeopt.bench.run` (the default one:
every shipped instance, the default methods, 5 s per solve, as ``pipeopt bench`` runs it;
``--quick``: the six 4-GPU instances, no MCMC, 2 s per solve). Printed, one row per executor:
wall time, rows, the sum of the rows' solve times, speed-up over sequential, and how many
rows differ from the sequential run's in a column other than the timing ones and the proven
bounds (only rows that stopped at the time limit, or MCMC's wall-clock search, can differ).

Solver threads per solve are :func:`pipeopt.bench.run`'s defaults: 2 sequentially (CP-SAT
workers, HiGHS threads), 1 with ``--jobs`` / Dask (``--threads`` sets one value for all).
Run it on a quiet machine: the figures are wall times.

Usage::

    python benchmarks/sweep_jobs.py [--jobs 2] [--quick] [--dask] [--time-limit 5]
        [--threads N] [--out benchmarks/results/sweep_jobs.md] [paths ...]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import pandas as pd

from pipeopt import bench

ROOT = Path(__file__).resolve().parents[1]
QUICK = sorted((ROOT / "instances" / "homogeneous").glob("*-x4.json"))
QUICK_METHODS = ["dp", "milp", "cpsat", "binary_search", "pipedream", "uniform", "param_balanced", "time_balanced"]
COMPARED = [c for c in bench.COLUMNS if c not in ("runtime", "lower_bound", "best_bound", "gap", "note")]


def differing(a: pd.DataFrame, b: pd.DataFrame) -> int:
    """Rows of ``b`` that differ from ``a``'s in a :data:`COMPARED` column (NaN = NaN)."""
    if len(a) != len(b):
        return max(len(a), len(b))
    count = 0
    for (_, x), (_, y) in zip(a[COMPARED].iterrows(), b[COMPARED].iterrows()):
        same = all(u == v or (isinstance(u, float) and isinstance(v, float) and math.isnan(u) and math.isnan(v))
                   for u, v in zip(x, y))
        count += not same
    return count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="instances (default: the shipped ones, or the --quick subset)")
    ap.add_argument("--jobs", type=int, nargs="+", default=[2], help="local process counts to time (default 2)")
    ap.add_argument("--dask", action="store_true", help="also time a local Dask cluster of max(--jobs) workers")
    ap.add_argument("--quick", action="store_true", help="the six 4-GPU instances, no MCMC, 2 s per solve")
    ap.add_argument("--time-limit", type=float, help="seconds per solve (default 5; --quick: 2)")
    ap.add_argument("--threads", type=int, help="solver threads per solve for every executor")
    ap.add_argument("--out", help="also write the table (markdown) here")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = ap.parse_args(argv)

    paths = args.paths or (QUICK if args.quick else bench.default_instances())
    options = dict(time_limit=args.time_limit or (2.0 if args.quick else bench_default_limit()),
                   methods=QUICK_METHODS if args.quick else None, threads=args.threads, progress=False)
    runs = [("sequential", {})] + [(f"--jobs {j}", {"jobs": j}) for j in args.jobs if j > 1]
    if args.dask:
        runs.append((f"--dask local ({max(args.jobs)} workers)", {"dask": "local", "jobs": max(args.jobs)}))
    table, base = [], None
    for label, kw in runs:
        started = time.perf_counter()
        df = bench.run(paths, **options, **kw)
        wall = time.perf_counter() - started
        base = df if base is None else base
        table.append({"executor": label, "wall_s": round(wall, 1), "rows": len(df),
                      "solve_s": round(float(df["runtime"].sum()), 1),
                      "speed_up": round(table[0]["wall_s"] / wall, 2) if table else 1.0,
                      "rows_differing": differing(base, df)})
        print(f"{label}: {wall:.1f} s", flush=True)
    text = pd.DataFrame(table).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(table).to_string(index=False)
    print(f"\n{len(paths)} instance files, time limit {options['time_limit']:g} s, "
          f"threads {args.threads or 'default'}\n")
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"`python benchmarks/sweep_jobs.py {' '.join(argv)}`\n\n{text}\n")
    return 0


def bench_default_limit() -> float:
    from pipeopt.cli import BENCH_TIME_LIMIT

    return BENCH_TIME_LIMIT


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    raise SystemExit(main())
