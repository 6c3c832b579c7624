"""Time and peak memory of every exact partition method against the chain length n and the
stage count S, with fitted growth exponents and a log-log plot (issue 11, deliver 1 and 4).

Instances: synthetic chains (:func:`synthetic_instance`) of n layers - forward time uniform in
0.1 .. 1 ms, backward twice the forward, activation (= output) bytes uniform in 0.1 .. 4 MB,
parameters uniform in 0 .. 2 MB, and one skip edge (a tensor read 2 to 20 layers later) per
20 layers, so that the bytes at a cut come from the DAG, not from one layer - on S identical
GPUs with 10 GB/s links, overlap, no memory limit unless ``--memory`` is given. Synthetic:
numbers chosen to look like a deep network's layers, not measured.

Methods: ``probe`` (:func:`pipeopt.problems.partition.probe.solve_probe`), the dense ``dp``, the
MILP through PuLP with CBC and with HiGHS, and CP-SAT (2 threads) - one-order space; ``probe``
and ``dp`` also in the replicated-one-order space. Each run is a forked process with a wall-clock cap
(``--cap``, the methods' own time limit; killed at 1.5 x cap + 30 s) and an address-space cap
(``--mem-cap``). Time: the whole call, as ``pipeopt.solve`` makes it on a new
:class:`pipeopt.Instance` - the chain's layer order (cached on the instance), the cost table
(:class:`pipeopt.problems.partition.problem.PartitionProblem`), bounds, search and scoring;
``--warm`` builds the instance's chain and layer arrays before the clock starts. Building the
networkx graph is not timed. Peak memory: the growth of the run's resident set (``VmHWM``
after the run minus ``VmRSS`` before it; plus CBC's own process). A run that does not prove optimality
within the cap marks the same method as skipped for every larger (n, S); the dense DP is
skipped where its n x n matrices alone exceed the memory cap. Times include scoring the plan
with :func:`pipeopt.evaluate` (``probe_s``: the probe's search alone) and exclude the second
phase of the exact methods (ties broken by the 1F1B-flush iteration time, at most 1 s, only
where its dense check is affordable; ``--tie-break`` keeps it): the table measures the proof
of the primary optimum.

Usage (from the repository root)::

    python benchmarks/partition_scale.py --quick           # n <= 10^4, S <= 64, cap 10 s
    python benchmarks/partition_scale.py                   # the issue's grid, cap 60 s (long)
        [--n 100 1000 ...] [--S 4 16 ...] [--methods probe dp ...] [--spaces one-order replicated-one-order]
        [--cap 60] [--mem-cap 4] [--memory GiB] [--heavy K] [--warm] [--out benchmarks/results/partition_scale]

Writes ``<out>.csv``, ``<out>.md`` (the table and the exponents) and ``<out>.png``.

**Whole call** (``--whole-call``, issue 22): what a user's script costs, in a fresh Python
process per row: import pipeopt, build the chain from arrays (:meth:`pipeopt.Instance.from_chain`,
the same numbers as above) and ``pipeopt.solve(inst, stages=S)`` with no method (the default,
``auto``; the tie-break on, as a user gets it). Rows ``method = solve()``: ``time_s`` the
process's wall time from start to exit (interpreter start included), ``build_s`` and
``solve_s`` the two steps, ``cpu_s`` the process's CPU time (user + system,
``resource.getrusage``; on a shared machine the wall time also counts waiting for a core),
``peak_mb`` its peak resident set (``ru_maxrss``), ``note`` the method ``auto`` chose::

    python benchmarks/partition_scale.py --whole-call --n 10000 100000 1000000 --S 1024 --out /tmp/whole
    python benchmarks/partition_scale.py --from-csv benchmarks/results/partition_scale.csv /tmp/whole.csv
"""

from __future__ import annotations

import argparse
import csv
import gc
import importlib
import json
import math
import multiprocessing as mp
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipeopt import Cluster, Instance, Settings
from pipeopt.cost.arrays import CACHE_KEY as LAYER_ARRAYS
from pipeopt.errors import InfeasibleError, InvalidProblemError

RESULTS = Path(__file__).resolve().parent / "results"


def _method(module: str, function: str, **kw):
    """A run ``(problem, cap) -> Result`` of ``pipeopt.problems.partition.<module>.<function>``
    (imported when first run: a whole-call child imports only what pipeopt.solve imports)."""

    def run(p, cap):
        return getattr(importlib.import_module(f"pipeopt.problems.partition.{module}"), function)(
            p, time_limit=cap, **kw)

    return run


METHODS = {
    "probe": (_method("probe", "solve_probe"), ("one-order", "replicated-one-order")),
    "dp": (_method("dp", "solve_dp"), ("one-order", "replicated-one-order")),
    "milp-cbc": (_method("milp", "solve_milp", solver="cbc"), ("one-order",)),
    "milp-highs": (_method("milp", "solve_milp", solver="highs"), ("one-order",)),
    "cpsat": (_method("cpsat", "solve_cpsat", threads=2), ("one-order",)),
}

WHOLE = "solve()"
"""The ``method`` of a whole-call row (``--whole-call``, module docstring)."""

FIELDS = ["method", "space", "n", "S", "status", "objective_s", "lower_bound_s", "time_s", "probe_s",
          "peak_mb", "note", "build_s", "solve_s", "cpu_s"]


def synthetic_arrays(n: int, seed: int = 0, *, heavy: int = 0):
    """The synthetic chain's numbers (module docstring): ``(fwd, act, par, skips)``, seconds and
    bytes per layer and the skip edges ``(E, 2)`` (tail, head), sorted, each once; the backward
    time is twice the forward, ``out_bytes = act_bytes``. ``heavy`` layers (at random) get 100
    times the time, so that replicating their stage pays. Deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(0.1e-3, 1e-3, n)
    if heavy:
        fwd[rng.choice(n, min(heavy, n), replace=False)] *= 100
    act = rng.uniform(0.1e6, 4e6, n)
    par = rng.uniform(0.0, 2e6, n)
    k = n // 20
    skips = np.zeros((0, 2), dtype=np.int64)
    if n > 3 and k:
        tail = rng.integers(0, n - 2, k)
        head = np.minimum(tail + rng.integers(2, 21, k), n - 1)
        keep = head > tail + 1
        skips = np.unique(np.stack([tail[keep], head[keep]], axis=1), axis=0)
    return fwd, act, par, skips


def synthetic_instance(n: int, devices: int, seed: int = 0, *, memory: float = math.inf,
                       bandwidth: float = 1e10, heavy: int = 0) -> Instance:
    """A synthetic chain of n layers with skip edges (:func:`synthetic_arrays`) on ``devices``
    identical GPUs, built from its arrays (:meth:`pipeopt.Instance.from_chain`; layers named
    ``0 .. n-1``)."""
    fwd, act, par, skips = synthetic_arrays(n, seed, heavy=heavy)
    cluster = Cluster.homogeneous(devices, memory=memory, bandwidth=bandwidth)
    return Instance.from_chain(fwd, 2 * fwd, out_bytes=act, act_bytes=act, param_bytes=par, skips=skips,
                               cluster=cluster, settings=Settings(), name=f"synthetic-{n}")


ONE_CALL = """
import json, resource, sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[1])
import pipeopt
from partition_scale import synthetic_instance
n, S, space, cap = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
t1 = time.perf_counter()
inst = synthetic_instance(n, S)
t2 = time.perf_counter()
res = pipeopt.solve(inst, stages=S, replication=space == "replicated-one-order", time_limit=cap)
t3 = time.perf_counter()
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"status": str(res.status), "objective_s": res.objective, "lower_bound_s": res.lower_bound,
                  "import_s": t1 - t0, "build_s": t2 - t1, "solve_s": t3 - t2, "cpu_s": use.ru_utime + use.ru_stime,
                  "peak_mb": use.ru_maxrss / 1024, "probe_s": res.info.get("search_s", ""),
                  "chosen": res.info.get("chosen", {}).get("method", res.method)}))
"""
"""The child of a whole-call row: a fresh interpreter (module docstring)."""


def whole_call(n: int, S: int, space: str, cap: float) -> dict:
    """One whole-call row: import, build from arrays, ``pipeopt.solve`` with no method, in a fresh
    process (killed at 1.5 cap + 30 s)."""
    row = {"method": WHOLE, "space": space, "n": n, "S": S}
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", ONE_CALL, str(Path(__file__).resolve().parent), str(n), str(S),
                               space, str(cap)], capture_output=True, text=True, timeout=1.5 * cap + 30)
    except subprocess.TimeoutExpired:
        return {**row, "status": "killed", "note": "killed at the wall-clock cap", "time_s": time.perf_counter() - t0}
    row["time_s"] = time.perf_counter() - t0
    if done.returncode != 0:
        return {**row, "status": "error", "note": done.stderr.strip().splitlines()[-1][:120] if done.stderr else ""}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    row.update({k: out[k] for k in ("status", "objective_s", "lower_bound_s", "build_s", "solve_s", "cpu_s",
                                    "peak_mb", "probe_s")})
    row["note"] = f"auto chose {out['chosen']}; import {out['import_s']:.2f} s"
    return row


# ---- one run in its own process ------------------------------------------------------------
INSTANCES: dict = {}
TIE_BREAK = {"on": False}
COLD = {"on": True}


def _no_tie_break(problem, starts, deadline, info, **_):
    """Stand-in for the second phase (``--tie-break`` keeps the real one): the scale table
    measures the proof of the primary optimum; the tie-break adds at most 1 s where it runs."""
    info["secondary"] = {"objective": "off (benchmarks/partition_scale.py)"}
    return list(starts)


def _warm_up() -> None:
    """Load every solver library in the parent, so that a run's memory is its own work."""
    import pipeopt.problems.partition.cpsat as cpsat_mod
    import pipeopt.problems.partition.dp as dp_mod
    import pipeopt.problems.partition.milp as milp_mod
    import pipeopt.problems.partition.probe as probe_mod
    from pipeopt.problems.partition.problem import PartitionProblem

    if not TIE_BREAK["on"]:
        for mod in (dp_mod, probe_mod, milp_mod, cpsat_mod):
            mod.break_ties = _no_tie_break
    p = PartitionProblem(synthetic_instance(12, 2), 2)
    for fn, spaces in METHODS.values():
        for space in spaces:
            fn(PartitionProblem(p.instance, 2, replication=space == "replicated-one-order"), 10.0)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _child(conn, method: str, n: int, S: int, space: str, cap: float, mem_cap: float) -> None:
    from pipeopt.problems.partition.problem import PartitionProblem

    row = {"method": method, "space": space, "n": n, "S": S}
    try:
        if math.isfinite(mem_cap):
            lim = int(mem_cap * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
        inst = INSTANCES[n]
        if COLD["on"]:  # what the instance computes once and keeps: the chain, the layer arrays
            for key in ("chain", LAYER_ARRAYS):  # cached_property keys in the frozen dataclass
                inst.__dict__.pop(key, None)
        gc.collect()
        try:
            with open("/proc/self/clear_refs", "w") as fh:  # reset VmHWM to the current RSS
                fh.write("5")
        except OSError:
            pass
        before = _status_kb("VmRSS")
        t0 = time.perf_counter()
        p = PartitionProblem(inst, S, replication=space == "replicated-one-order")  # the cost table, as solve() does
        res = METHODS[method][0](p, cap)
        row["time_s"] = time.perf_counter() - t0
        grow = max(_status_kb("VmHWM") - before, 0) / 1024
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # CBC's own process
        row.update(status=str(res.status), objective_s=res.objective, lower_bound_s=res.lower_bound,
                   probe_s=res.info.get("search_s", ""), peak_mb=grow + kids)
    except InfeasibleError as exc:
        row.update(status="infeasible", note=str(exc)[:80])
    except InvalidProblemError as exc:  # the dense DP past its memory limit (dp.DENSE_LIMIT)
        row.update(status="refused", note=str(exc)[:120])
    except MemoryError:
        row.update(status="out of memory", note=f"> {mem_cap:g} GiB")
    except Exception as exc:  # noqa: BLE001 - a benchmark row, not a crash of the sweep
        row.update(status="error", note=f"{type(exc).__name__}: {exc}"[:120])
    conn.send(row)
    conn.close()


def run_one(method: str, n: int, S: int, space: str, cap: float, mem_cap: float) -> dict:
    """One (method, space, n, S) run in a forked process (killed at 1.5 cap + 30 s)."""
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, method, n, S, space, cap, mem_cap))
    t0 = time.perf_counter()
    proc.start()
    send.close()
    row = None
    if recv.poll(1.5 * cap + 30):
        try:
            row = recv.recv()
        except EOFError:
            row = None
    if proc.is_alive():
        proc.kill()
    proc.join()
    if row is None:
        why = "killed at the wall-clock cap" if time.perf_counter() - t0 >= 1.5 * cap + 30 else \
            f"process died (exit {proc.exitcode}; out of memory?)"
        row = {"method": method, "space": space, "n": n, "S": S, "status": "killed", "note": why,
               "time_s": time.perf_counter() - t0}
    return row


# ---- the sweep -----------------------------------------------------------------------------
def dp_matrix_gb(n: int) -> float:
    """GiB of one dense (n+1) x (n+1) float matrix of the DP (it holds a few)."""
    return (n + 1) ** 2 * 8 / 2**30


def sweep(ns, Ss, methods, cap: float, mem_cap: float, memory: float, out_csv: Path, log=print,
          heavy: int = 0, spaces=("one-order", "replicated-one-order")) -> list[dict]:
    rows: list[dict] = []
    failed: dict = {}  # (method, space) -> [(n, S)] that did not prove within the cap
    with open(out_csv, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        writer.writeheader()
        for n in ns:
            t0 = time.perf_counter()
            INSTANCES.clear()
            INSTANCES[n] = synthetic_instance(n, max(Ss), memory=memory, heavy=heavy)
            _ = INSTANCES[n].chain
            log(f"# n = {n}: instance built in {time.perf_counter() - t0:.1f} s")
            for S in Ss:
                if S > n:
                    continue
                for method in methods:
                    for space in (sp for sp in METHODS[method][1] if sp in spaces):
                        key = (method, space)
                        row = {"method": method, "space": space, "n": n, "S": S}
                        worse = [f for f in failed.get(key, []) if f[0] <= n and f[1] <= S]
                        if method == "dp" and 3 * dp_matrix_gb(n) > mem_cap:
                            row.update(status="skipped", note=f"dense n x n matrices: {3 * dp_matrix_gb(n):.1f} GiB")
                        elif worse:
                            row.update(status="skipped", note=f"not proven within the cap at n={worse[0][0]}, S={worse[0][1]}")
                        else:
                            row = run_one(method, n, S, space, cap, mem_cap)
                            if row["status"] != "optimal" and row["status"] != "infeasible":
                                failed.setdefault(key, []).append((n, S))
                        rows.append(row)
                        writer.writerow(row)
                        fh.flush()
                        log(_line(row))
    return rows


def _num(v):
    """A CSV cell as a float ('' stays '')."""
    return float(v) if v not in (None, "") else ""


def _fmt(v, spec: str) -> str:
    return "" if v is None or v == "" or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _line(r: dict) -> str:
    return (f"{r['method']:<11}{r['space']:<21}{r['n']:>7}{r['S']:>6}  {r.get('status', ''):<13}"
            f"{_fmt(r.get('time_s'), '9.3f'):>9} s{_fmt(r.get('peak_mb'), '9.1f'):>9} MB  {r.get('note', '')}")


def exponents(rows: list[dict]) -> dict:
    """Least squares ``log t = a + b log n + c log S`` per (method, space) over its proven runs of
    at least 0.05 s; ``(b, c, points)`` (also for the probe's search alone, runs of >= 0.01 s, and
    for the peak memory, runs of >= 1 MB)."""
    out = {}
    for key in sorted({(r["method"], r["space"]) for r in rows if r["method"] != WHOLE}):
        ok = [r for r in rows if (r["method"], r["space"]) == key and r.get("status") == "optimal"]
        fit = {}
        for what, floor in (("time_s", 0.05), ("probe_s", 0.01), ("peak_mb", 1.0)):
            pts = [r for r in ok if r.get(what) not in (None, "") and float(r[what]) >= floor]
            if len(pts) >= 3 and len({r["n"] for r in pts}) >= 2:
                X = np.column_stack([np.ones(len(pts)), np.log([r["n"] for r in pts]), np.log([r["S"] for r in pts])])
                y = np.log([float(r[what]) for r in pts])
                if len({r["S"] for r in pts}) < 2:
                    X = X[:, :2]
                coef = np.linalg.lstsq(X, y, rcond=None)[0]
                fit[what] = (float(coef[1]), float(coef[2]) if X.shape[1] == 3 else math.nan, len(pts))
        out[key] = fit
    return out


def _cell(r: dict | None) -> str:
    if r is None:
        return ""
    st = r.get("status", "")
    if st == "optimal":
        search = f" ({float(r['probe_s']):.2f})" if r.get("probe_s") not in (None, "") else ""
        return f"{float(r['time_s']):.2f}{search}"
    return {"time_limit": "limit", "skipped": "skip", "killed": "killed"}.get(st, st)


def pivot(rows: list[dict]) -> str:
    """Seconds to a proven optimum per (method, space, S) and n (the probe's search alone in
    parentheses); ``limit``: not proven within the cap; ``skip``: not run (see the long table)."""
    ns = sorted({r["n"] for r in rows if r["method"] != WHOLE})
    order = [(m, sp) for m, (_, spaces) in METHODS.items() for sp in spaces]
    head = "| method | space | S | " + " | ".join(f"n = {n:,}" for n in ns) + " |"
    lines = [head, "| --- | --- | ---: | " + " | ".join("---:" for _ in ns) + " |"]
    for key in order:
        for S in sorted({r["S"] for r in rows if (r["method"], r["space"]) == key}):
            cells = []
            for n in ns:
                hit = [r for r in rows if (r["method"], r["space"], r["S"], r["n"]) == (*key, S, n)]
                cells.append(_cell(hit[0] if hit else None))
            lines.append(f"| {key[0]} | {key[1]} | {S} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(rows: list[dict], fits: dict, args) -> str:
    lines = [(f"Cap {args.cap:g} s and {args.mem_cap:g} GiB per run; synthetic chains "
              f"(benchmarks/partition_scale.py); time includes scoring the plan, probe_s the probe's search alone."), "",
             "Seconds to a proven optimum (probe: its search alone in parentheses); limit = not proven within the cap.",
             "", pivot(rows), "",
             "| method | space | n | S | status | time (s) | probe_s | peak (MB) | note |",
             "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- |"]
    whole = [r for r in rows if r["method"] == WHOLE]
    if whole:
        section = [("Whole call (`--whole-call`): a fresh Python process imports pipeopt, builds the chain from "
                    "arrays (Instance.from_chain) and runs pipeopt.solve(inst, stages=S) with no method (the "
                    "default, auto; second phase on). Wall: the process from start to exit; CPU: its user + "
                    "system time (on a shared machine the wall time also counts waiting for a core); peak: its resident set "
                    "(ru_maxrss)."), "",
                   "| n | S | space | status | method chosen | wall (s) | build (s) | solve (s) | CPU (s) | "
                   "peak RSS (MB) |", "| ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in whole:
            chosen = str(r.get("note", "")).split(";")[0].replace("auto chose ", "")
            section.append(f"| {r['n']:,} | {r['S']} | {r['space']} | {r.get('status', '')} | {chosen} | "
                           f"{_fmt(r.get('time_s'), '.2f')} | {_fmt(_num(r.get('build_s')), '.2f')} | "
                           f"{_fmt(_num(r.get('solve_s')), '.2f')} | {_fmt(_num(r.get('cpu_s')), '.2f')} | "
                           f"{_fmt(r.get('peak_mb'), '.0f')} |")
        lines[2:2] = [*section, ""]
    for r in rows:
        if r["method"] == WHOLE:
            continue
        lines.append(f"| {r['method']} | {r['space']} | {r['n']} | {r['S']} | {r.get('status', '')} | "
                     f"{_fmt(r.get('time_s'), '.3f')} | {_fmt(r.get('probe_s'), '.3f')} | "
                     f"{_fmt(r.get('peak_mb'), '.1f')} | {r.get('note', '')} |")
    lines += ["", ("Fitted growth (least squares on log-log over the proven runs): time ~ n^b S^c (the probe's search "
                   "alone: its own b, c), peak memory ~ n^b S^c."), "",
              "| method | space | time: b | c | runs | search: b | c | runs | memory: b | c | runs |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]

    def cell(f):
        return ("", "", "") if f is None else (f"{f[0]:.2f}", _fmt(f[1], ".2f"), str(f[2]))

    for (m, sp), fit in fits.items():
        parts = [" | ".join(cell(fit.get(what))) for what in ("time_s", "probe_s", "peak_mb")]
        lines.append(f"| {m} | {sp} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [(m, sp) for m, (_, spaces) in METHODS.items() for sp in spaces]
    keys = [k for k in order if any((r["method"], r["space"]) == k for r in rows)]
    if not keys:  # whole-call rows only
        return
    Ss = sorted({r["S"] for r in rows})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(2, len(keys), figsize=(3.2 * len(keys), 6.4), squeeze=False, sharex=True,
                             sharey="row")
    for col, key in enumerate(keys):
        for row_i, (what, label) in enumerate((("time_s", "time (s)"), ("peak_mb", "peak memory (MB)"))):
            ax = axes[row_i][col]
            for k, S in enumerate(Ss):
                pts = sorted((r["n"], float(r[what])) for r in rows if (r["method"], r["space"]) == key
                             and r["S"] == S and r.get("status") == "optimal" and r.get(what) not in (None, "")
                             and float(r[what]) > 0)
                if pts:
                    ax.plot(*zip(*pts), "o-", color=cmap(k / max(len(Ss) - 1, 1)), label=f"S={S}", ms=3)
            ax.set_xscale("log")
            ax.set_yscale("log")
            if row_i == 0:
                ax.set_title(f"{key[0]} ({key[1]})", fontsize=9)
            if col == 0:
                ax.set_ylabel(label)
            if row_i == 1:
                ax.set_xlabel("n (units)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Exact partition methods on synthetic chains: proven runs only", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def read_rows(path: Path) -> list[dict]:
    """Rows of an earlier run's CSV (several files may be concatenated by the caller)."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    legacy = {"straight": "one-order", "replicated": "replicated-one-order"}  # the spaces' earlier names
    for r in rows:
        r["n"], r["S"] = int(r["n"]), int(r["S"])
        r["space"] = legacy.get(r["space"], r["space"])
        for key in ("objective_s", "lower_bound_s", "time_s", "probe_s", "peak_mb", "build_s", "solve_s", "cpu_s"):
            if r.get(key) not in (None, ""):
                r[key] = float(r[key])
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n <= 10^4, S <= 64, cap 10 s (for development)")
    ap.add_argument("--n", nargs="+", type=int, default=None)
    ap.add_argument("--S", nargs="+", type=int, default=None)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--spaces", nargs="+", default=["one-order", "replicated-one-order"],
                    choices=["one-order", "replicated-one-order"])
    ap.add_argument("--cap", type=float, default=None, help="seconds per run (default 60; --quick 10)")
    ap.add_argument("--mem-cap", type=float, default=4.0, help="GiB of address space per run")
    ap.add_argument("--memory", type=float, default=None, help="GiB per worker (default: no limit)")
    ap.add_argument("--heavy", type=int, default=0, help="layers with 100x the time (replication pays)")
    ap.add_argument("--from-csv", type=Path, nargs="+", default=None,
                    help="rebuild the table, exponents and plot from earlier runs' CSVs (no solving)")
    ap.add_argument("--tie-break", action="store_true",
                    help="keep the second phase (ties: the 1F1B-flush iteration time, <= 1 s); default off")
    ap.add_argument("--warm", action="store_true",
                    help="build the instance's chain and layer arrays before the clock starts (default: cold, as a "
                         "first pipeopt.solve on a new Instance)")
    ap.add_argument("--out", type=Path, default=None, help="output stem (default benchmarks/results/partition_scale)")
    ap.add_argument("--whole-call", action="store_true",
                    help="whole-call rows only: a fresh process per (n, S) builds the chain and runs pipeopt.solve "
                         "with no method (module docstring)")
    args = ap.parse_args(argv)
    ns = args.n or ([100, 1000, 10000] if args.quick else [100, 1000, 10000, 100000])
    Ss = args.S or ([4, 16, 64] if args.quick else [4, 16, 64, 256, 1024])
    args.cap = args.cap or (10.0 if args.quick else 60.0)
    out = args.out or RESULTS / ("partition_scale_quick" if args.quick else "partition_scale")
    out.parent.mkdir(parents=True, exist_ok=True)
    memory = math.inf if args.memory is None else args.memory * 2**30
    if args.from_csv is not None:
        rows = [r for path in args.from_csv for r in read_rows(path)]
        with open(out.with_suffix(".csv"), "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    elif args.whole_call:
        rows = []
        with open(out.with_suffix(".csv"), "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            writer.writeheader()
            for n in sorted(ns):
                for S in sorted(Ss):
                    for space in args.spaces:
                        if S > n:
                            continue
                        row = whole_call(n, S, space, args.cap)
                        rows.append(row)
                        writer.writerow(row)
                        fh.flush()
                        print(_line(row), f"build {_fmt(row.get('build_s'), '.2f')} s, solve "
                              f"{_fmt(row.get('solve_s'), '.2f')} s, cpu {_fmt(row.get('cpu_s'), '.2f')} s", flush=True)
    else:
        TIE_BREAK["on"] = args.tie_break
        COLD["on"] = not args.warm
        _warm_up()
        print(f"{'method':<11}{'space':<21}{'n':>7}{'S':>6}  {'status':<13}{'time':>9}  {'peak':>9}")
        rows = sweep(sorted(ns), sorted(Ss), args.methods, args.cap, args.mem_cap, memory, out.with_suffix(".csv"),
                     heavy=args.heavy, spaces=args.spaces)
    fits = exponents(rows)
    text = markdown(rows, fits, args)
    out.with_suffix(".md").write_text(text)
    plot(rows, out.with_suffix(".png"))
    print(text.split("\n\n", 2)[-1])
    print(f"wrote {out.with_suffix('.csv')}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
