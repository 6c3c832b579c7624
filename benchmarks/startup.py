"""Whole-process time of pipeopt's command, side by side with PipeDream's own optimizer.

Each command runs as a fresh process (what a user pays: interpreter start, imports, reading the
profile, the solve, printing). Measured per run: wall seconds, CPU seconds (user + system of the
process and of the children it waited for, e.g. CBC: ``os.wait4``'s resource usage) and peak
resident memory; the median of ``--repeat`` runs is reported, after one untimed run of each
command. The children run without ``PYTHONDONTWRITEBYTECODE``, so both tools read their
bytecode (and pipeopt its compiled kernels) from ``__pycache__``, as after an ordinary install.
The runs of pipeopt and PipeDream on one case alternate, so that a change of load hits both
alike; a run past ``--timeout`` seconds is stopped and its command not run again.

Rows:

* ``python -c pass`` -- the interpreter alone (the floor);
* ``python -c "import pipeopt"`` and ``pipeopt --help``;
* for each PipeDream profile (``PROFILES/*.txt``, LICENSE.txt skipped) and each N in ``--stages``:
  ``pipeopt solve PROFILE --stages N`` and PipeDream's optimizer on the same profile,
  ``optimizer_graph_hierarchical.py -f PROFILE -n N -b 1.25e10 --activation_compression_ratio 1``,
  run unmodified from its repository (github.com/msr-fiddle/pipedream, folder ``optimizer``, with
  ``graph`` beside it; ``-b`` set to the bandwidth pipeopt assumes for these profiles; no ``-o``,
  which would also need Graphviz's ``dot`` program to draw the graph). Its ``graph`` package
  imports the ``graphviz`` Python package: install it (``pip install graphviz``) or name a folder
  holding it with ``--pipedream-pythonpath``.

The ratio is pipeopt's over PipeDream's (below 1: pipeopt is faster). Note that the two do not
solve the same problem: pipeopt's default is its exact DP over straight pipelines with its
tie-break (a least-latency plan among the optimal ones), PipeDream's is its DP over replicated
stages; the comparison is of what a user waits for.

Usage::

    python benchmarks/startup.py --pipedream /tmp/pipedream [--repeat 5] [--stages 4 8 16]
        [--profiles vgg16 resnet50] [--pipedream-pythonpath DIR] [--out benchmarks/results/startup]

Writes ``OUT.md`` and ``OUT.csv`` (default ``benchmarks/results/startup``).
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROFILE_DIR = HERE.parents[1] / "shared" / "data" / "pipedream-profiles"
BANDWIDTH = "12500000000"
"""Bytes/s given to PipeDream's ``-b``: what pipeopt assumes for a PipeDream profile (100 Gbit/s)."""

FIELDS = ["case", "profile", "stages", "tool", "runs", "failures", "wall_s", "cpu_s", "max_rss_mib", "wall_min_s",
          "wall_max_s"]


def run_once(cmd: list[str], cwd: Path | None = None, env: dict | None = None,
             timeout: float | None = None) -> tuple[float, float, float, int, str]:
    """One run of ``cmd``: ``(wall s, cpu s, peak RSS MiB, exit code, last line of stderr)``.

    The CPU and memory figures are ``os.wait4``'s resource usage of the child (its own and that of
    the children it waited for). A run past ``timeout`` seconds is killed (exit code -9, the
    message ``timeout``)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if timeout is not None and time.perf_counter() - start > timeout:
                proc.kill()
                _, status, ru = os.wait4(proc.pid, 0)
                proc.returncode = -9
                return time.perf_counter() - start, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, -9, "timeout"
            time.sleep(0.002)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, proc.returncode, tail[0]


def measure(commands: dict[str, tuple[list[str], Path | None, dict | None]], repeat: int,
            timeout: float | None = None) -> dict[str, dict]:
    """Run each command once untimed (bytecode and compiled kernels written), then ``repeat``
    times, the commands alternating; per command the medians. A command that timed out is not
    run again."""
    runs: dict[str, list] = {name: [] for name in commands}
    dead = set()
    for name, (cmd, cwd, env) in commands.items():
        if run_once(cmd, cwd, env, timeout)[4] == "timeout":
            dead.add(name)
            runs[name].append((timeout, math.nan, math.nan, -9, "timeout"))
    for _ in range(repeat):
        for name, (cmd, cwd, env) in commands.items():
            if name not in dead:
                runs[name].append(run_once(cmd, cwd, env, timeout))
    out = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r[3] == 0]
        fails = [r for r in rs if r[3] != 0]
        use = ok or rs
        out[name] = {
            "runs": len(rs),
            "failures": len(fails),
            "timed_out": name in dead,
            "wall_s": statistics.median(r[0] for r in use),
            "cpu_s": statistics.median(r[1] for r in use),
            "max_rss_mib": statistics.median(r[2] for r in use),
            "wall_min_s": min(r[0] for r in use),
            "wall_max_s": max(r[0] for r in use),
            "error": fails[0][4] if fails else "",
        }
    return out


def _secs(m: dict, key: str) -> str:
    return f"> {m['wall_s']:.0f}" if m["timed_out"] else f"{m[key]:.3f}"


def _ratio(a: dict, b: dict, key: str) -> str:
    if a["timed_out"] and b["timed_out"]:
        return "-"
    if b["timed_out"]:
        return f"< {a['wall_s'] / b['wall_s']:.2g}" if key == "wall_s" else "-"
    if a["timed_out"]:
        return f"> {a['wall_s'] / b['wall_s']:.2g}" if key == "wall_s" else "-"
    return f"{a[key] / b[key]:.2f}"


def _mib(m: dict) -> str:
    return "-" if m["timed_out"] else f"{m['max_rss_mib']:.0f}"


def pipeopt_command() -> list[str]:
    """The ``pipeopt`` console script beside this interpreter, else ``python -m pipeopt``."""
    script = Path(sys.executable).with_name("pipeopt")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipeopt"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pipedream", type=Path, required=True,
                    help="a checkout (or git archive) of msr-fiddle/pipedream holding optimizer/ and graph/")
    ap.add_argument("--pipedream-python", default=sys.executable, help="interpreter for PipeDream (default: this one)")
    ap.add_argument("--pipedream-pythonpath", default=None,
                    help="folder prepended to PYTHONPATH for PipeDream (e.g. where graphviz is installed)")
    ap.add_argument("--profile-dir", type=Path, default=PROFILE_DIR)
    ap.add_argument("--profiles", nargs="*", help="profile names (default: every *.txt but LICENSE.txt)")
    ap.add_argument("--stages", nargs="+", type=int, default=[4, 8, 16])
    ap.add_argument("--repeat", type=int, default=5, help="runs per command (median reported)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds per run; a command past it is killed and not run again (default 120)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "startup", help="writes OUT.md and OUT.csv")
    args = ap.parse_args(argv)

    optimizer = args.pipedream / "optimizer" / "optimizer_graph_hierarchical.py"
    if not optimizer.exists():
        ap.error(f"{optimizer} not found: --pipedream must hold PipeDream's optimizer/ and graph/")
    profiles = sorted(p for p in args.profile_dir.glob("*.txt") if p.name != "LICENSE.txt")
    if args.profiles:
        profiles = [p for p in profiles if p.stem in set(args.profiles)]
    if not profiles:
        ap.error(f"no profiles in {args.profile_dir}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a user runs them
    pd_env = dict(env)
    if args.pipedream_pythonpath:
        pd_env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.pipedream_pythonpath, pd_env.get("PYTHONPATH")]))
    pipeopt = pipeopt_command()
    py = sys.executable
    away = Path(tempfile.gettempdir())  # pipeopt's runs start outside the repository: its folder is not on sys.path
    load_start = os.getloadavg()
    t0 = time.time()

    rows = []
    solo = measure({"python -c pass": ([py, "-c", "pass"], away, env),
                    "python -c 'import pipeopt'": ([py, "-c", "import pipeopt"], away, env),
                    "pipeopt --help": ([*pipeopt, "--help"], away, env)}, args.repeat, args.timeout)
    for name, m in solo.items():
        rows.append({"case": name, "profile": "", "stages": "", "tool": name.split()[0], **m})
        print(f"{name:<28} wall {m['wall_s']:.3f} s  cpu {m['cpu_s']:.3f} s  rss {m['max_rss_mib']:.0f} MiB", flush=True)

    print(f"\n{'profile':<14} {'N':>3} {'pipeopt wall':>12} {'PipeDream wall':>14} {'ratio':>6} "
          f"{'pipeopt cpu':>11} {'PipeDream cpu':>13} {'ratio':>6}", flush=True)
    pairs = []
    for prof in profiles:
        for n in args.stages:
            cmds = {
                "pipeopt": ([*pipeopt, "solve", str(prof.resolve()), "--stages", str(n)], away, env),
                "pipedream": ([args.pipedream_python, optimizer.name, "-f", str(prof), "-n", str(n), "-b", BANDWIDTH,
                               "--activation_compression_ratio", "1"], optimizer.parent, pd_env),
            }
            m = measure(cmds, args.repeat, args.timeout)
            for tool, r in m.items():
                case = f"pipeopt solve {prof.name} --stages {n}" if tool == "pipeopt" else \
                    f"{optimizer.name} -f {prof.name} -n {n}"
                rows.append({"case": case, "profile": prof.stem, "stages": n, "tool": tool, **r})
            a, b = m["pipeopt"], m["pipedream"]
            pairs.append((prof.stem, n, a, b))
            note = "".join(f"  [{t} failed {r['failures']}/{r['runs']}: {r['error']}]" for t, r in m.items()
                           if r["failures"] and not r["timed_out"])
            print(f"{prof.stem:<14} {n:>3} {_secs(a, 'wall_s'):>12} {_secs(b, 'wall_s'):>14} "
                  f"{_ratio(a, b, 'wall_s'):>6} {_secs(a, 'cpu_s'):>11} {_secs(b, 'cpu_s'):>13} "
                  f"{_ratio(a, b, 'cpu_s'):>6}{note}", flush=True)
    load_end = os.getloadavg()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS + ["timed_out", "error"])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})

    timed = [(a, b) for _, _, a, b in pairs if not (a["timed_out"] or b["timed_out"])]
    wall_ratios = [a["wall_s"] / b["wall_s"] for a, b in timed] or [math.nan]
    cpu_ratios = [a["cpu_s"] / b["cpu_s"] for a, b in timed] or [math.nan]
    slower = [(p, n) for p, n, a, b in pairs if a["timed_out"] or (not b["timed_out"] and a["wall_s"] > b["wall_s"])]
    pd_timeouts = [(p, n) for p, n, _, b in pairs if b["timed_out"]]
    failed = [r for r in rows if r["failures"] and not r["timed_out"]]
    lines = [
        "# Start-up: whole-process time of `pipeopt solve` and PipeDream's optimizer",
        "",
        f"`python benchmarks/startup.py --repeat {args.repeat} --stages {' '.join(map(str, args.stages))}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(t0))}, {time.time() - t0:.0f} s; "
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load_start[0]:.2f} at the start and {load_end[0]:.2f} at the end. "
        f"Medians of {args.repeat} runs after one untimed run (which writes bytecode and compiled kernels, as a "
        "user's first run does); each command a fresh process (wall: seconds until it exited; CPU: "
        "user + system seconds of the process and the children it waited for; RSS: its peak resident memory). "
        "PipeDream: `optimizer/optimizer_graph_hierarchical.py` of github.com/msr-fiddle/pipedream run unmodified "
        f"(`-f PROFILE -n N -b {BANDWIDTH} --activation_compression_ratio 1`, from its `optimizer` folder). "
        "pipeopt: `pipeopt solve PROFILE --stages N` (its default exact method, with its tie-break). Ratio: "
        f"pipeopt / PipeDream (below 1: pipeopt faster). A run past {args.timeout:g} s is stopped (`> {args.timeout:g}`).",
        "",
        "| command | wall (s) | CPU (s) | peak RSS (MiB) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, m in solo.items():
        lines.append(f"| `{name}` | {m['wall_s']:.3f} | {m['cpu_s']:.3f} | {m['max_rss_mib']:.0f} |")
    lines += [
        "",
        "| profile | N | pipeopt wall (s) | PipeDream wall (s) | wall ratio | pipeopt CPU (s) | PipeDream CPU (s) | "
        "CPU ratio | pipeopt RSS (MiB) | PipeDream RSS (MiB) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for p, n, a, b in pairs:
        lines.append(f"| {p} | {n} | {_secs(a, 'wall_s')} | {_secs(b, 'wall_s')} | {_ratio(a, b, 'wall_s')} | "
                     f"{_secs(a, 'cpu_s')} | {_secs(b, 'cpu_s')} | {_ratio(a, b, 'cpu_s')} | "
                     f"{_mib(a)} | {_mib(b)} |")
    lines += [
        "",
        f"Over the {len(timed)} cases both finished: wall ratio median {statistics.median(wall_ratios):.2f}, worst "
        f"{max(wall_ratios):.2f}; CPU ratio median {statistics.median(cpu_ratios):.2f}, worst {max(cpu_ratios):.2f}. "
        f"pipeopt slower in wall time on {len(slower)} of {len(pairs)} cases"
        + (f": {', '.join(f'{p} N = {n}' for p, n in slower)}." if slower else ".")
        + (f" PipeDream stopped at {args.timeout:g} s on {len(pd_timeouts)}: "
           f"{', '.join(f'{p} N = {n}' for p, n in pd_timeouts)}." if pd_timeouts else ""),
    ]
    if failed:
        lines += ["", "Failed runs: " + "; ".join(f"{r['case']}: {r['failures']}/{r['runs']} ({r['error']})"
                                                  for r in failed)]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n" + "\n\n".join(lines[-3 if failed else -1:]))
    print(f"wrote {args.out.with_suffix('.md')} and {args.out.with_suffix('.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
