"""Which MILP backend proves the schedule problem's splits: CBC and HiGHS side by side.

The rows are two runs of ``benchmarks/schedule_split.py`` (every torch schedule's exact split by
the event-time MILP, :func:`pipeopt.problems.schedule.solve_milp`, 60 s per solve, one solver
thread), one per backend, started together so that each has one of the two cores::

    python benchmarks/schedule_split.py --solver highs --csv benchmarks/results/schedule_split_highs.csv &
    python benchmarks/schedule_split.py --solver cbc --csv benchmarks/results/schedule_split_cbc.csv &
    wait
    python benchmarks/schedule_solvers.py benchmarks/results/schedule_split_cbc.csv \\
        benchmarks/results/schedule_split_highs.csv --out benchmarks/results/schedule_solvers.md

This script only sets the two CSVs side by side: per (instance, p, m, schedule) each backend's
status, its value, its proof gap (``(value - bound) / value``) and its seconds, then a summary
(solves proven, median and largest gap of the others, solves where one proves and the other does
not). Its figures chose the schedule problem's default backend
(:data:`pipeopt.problems.schedule.SOLVER`).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

KEY = ("instance", "p", "m", "schedule")


def read(path: str) -> dict:
    """The exact rows of one run (the ZB greedy's rows have no MILP), keyed by :data:`KEY`."""
    with open(path, newline="") as fh:
        return {tuple(r[k] for k in KEY): r for r in csv.DictReader(fh) if r.get("bound_ms") not in (None, "")
                or r.get("status") == "infeasible"}


def _f(x: str | None) -> float | None:
    try:
        return float(x) if x not in (None, "") else None
    except ValueError:
        return None


def cell(r: dict | None) -> list[str]:
    if r is None:
        return ["-", "-", "-", "-"]
    gap = _f(r.get("proof_gap"))
    value = _f(r.get("optimum_ms"))
    return [r["status"], "-" if value is None else f"{value:.1f}", "-" if gap is None else f"{gap:.2%}",
            f"{float(r['solve_s']):.1f}"]


def summary(name: str, rows: list[dict]) -> str:
    proven = sum(r["status"] in ("optimal", "infeasible") for r in rows)
    gaps = [_f(r.get("proof_gap")) for r in rows if r["status"] == "time_limit"]
    gaps = [g for g in gaps if g is not None]
    rest = (f"the other {len(gaps)} stopped at the limit, gap median {statistics.median(gaps):.2%}, "
            f"largest {max(gaps):.2%}") if gaps else "none stopped at the limit"
    return f"* {name}: **{proven} of {len(rows)} proven** (optimal or infeasible); {rest}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cbc", help="schedule_split.py's CSV with --solver cbc")
    ap.add_argument("highs", help="schedule_split.py's CSV with --solver highs")
    ap.add_argument("--out", help="write the Markdown here")
    args = ap.parse_args(argv)
    a, b = read(args.cbc), read(args.highs)
    keys = [k for k in a if k in b] + [k for k in b if k not in a]
    lines = ["| instance | p | m | schedule | CBC status | CBC ms | CBC gap | CBC s | HiGHS status | HiGHS ms |"
             " HiGHS gap | HiGHS s |", "|" + "---|" * 12]
    for k in keys:
        lines.append("| " + " | ".join([*k, *cell(a.get(k)), *cell(b.get(k))]) + " |")
    both = [k for k in keys if k in a and k in b]
    done = ("optimal", "infeasible")
    only_a = [k for k in both if a[k]["status"] in done and b[k]["status"] not in done]
    only_b = [k for k in both if b[k]["status"] in done and a[k]["status"] not in done]
    text = "\n".join([
        f"Event-time MILP of every torch schedule's split, CBC (`{args.cbc}`) and HiGHS (`{args.highs}`), "
        "each run by `benchmarks/schedule_split.py` (60 s per solve, one solver thread, the two runs side by "
        "side on the two cores); gap = (value - bound) / value.", "",
        summary("CBC", [a[k] for k in both]), summary("HiGHS", [b[k] for k in both]),
        f"* proven by HiGHS only: {len(only_b)}" + (f" ({', '.join(' '.join(k) for k in only_b)})" if only_b else ""),
        f"* proven by CBC only: {len(only_a)}" + (f" ({', '.join(' '.join(k) for k in only_a)})" if only_a else ""),
        "", *lines])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
