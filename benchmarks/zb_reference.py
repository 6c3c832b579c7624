"""pipeopt's zero-bubble greedy against the zero-bubble repository's own scheduler, side by side.

The reference is ``zb.py`` of sail-sg/zero-bubble-pipeline-parallelism
(``megatron/core/pipeline_parallel/zerobubble/scheduler/zb.py`` with its ``graph.py``), run
unmodified from a folder outside this repository; pipeopt's is
:mod:`pipeopt.problems.schedule.zb_greedy`. On each input (their ``GraphConfig`` fields:
``cost_f``, ``cost_b``, ``cost_w``, ``cost_comm``, ``mem_f``, ``mem_b``, ``mem_w``,
``max_mem``, ``n_stages``, ``n_micro``) both run every flag variant their ``initial_solution``
tries (``allow_bubble_before_first_b`` x ``prioritize_b`` x ``no_bubble_greedy``, 8 runs of
``Graph.manual_order``) and the best of them (``create_schedule``). Printed per input and
variant: each side's estimate (its ``best_time``), the makespan of its order under pipeopt's
executor (every transfer ``cost_comm`` on its own link), and whether the per-stage orders and
the completion times are identical.

Inputs (seeded): their own examples - the runtime's first schedule before profiling
(``runtime.py``: F = B = W = 1000, ``c = 1``, ``mem_f = 34 h + 5 a s``, ``mem_w = -mem_f``,
limit ``p mem_f``), its manual limit ``--zero-bubble-max-pending-backward 2p``
(``examples/pretrain_zero_bubble.sh``) with the V schedule's memory split
(``mem_w = -32 h``, ``mem_b = -mem_f - mem_w``), and ``tests/unit_tests/pipeline_parallel/
test_pass.py``'s ``create_dummy_config`` on its ``TEST_SETTINGS`` - plus random ones: p in
2..8, m in p..3p, integer or non-integer per-stage costs, a transfer of 0, an integer or a
fraction, no limit or a limit of k activations (k in 0.5, 1, 2, p, p + 1, 2p).

Prepare the reference folder once (the repository's package ``__init__`` files import all of
Megatron; empty ones stand in for them, the two scheduler files are exported byte for byte)::

    python benchmarks/zb_reference.py --zb-path /tmp/zbref --export-from GIT_DIR   # git show HEAD:...
    python benchmarks/zb_reference.py --zb-path /tmp/zbref                          # the table
    python benchmarks/zb_reference.py --zb-path /tmp/zbref --fixture tests/data/zb_reference.json

``--fixture`` writes the reference's outputs (inputs -> per-variant orders, estimates and
finish times, the chosen variant) for ``tests/problems/schedule/test_zb_reference.py``.
Needs torch and pulp (``zb.py`` imports them).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from pipeopt.problems.schedule.zb_greedy import VARIANTS, _error_text, execute_orders, greedy_variants

SCHEDULER = "megatron/core/pipeline_parallel/zerobubble/scheduler"
FILES = ("zb.py", "graph.py")


def export_reference(git_dir: str, dest: Path) -> str:
    """Write the reference's ``zb.py`` and ``graph.py`` (HEAD of ``git_dir``) under ``dest``
    with empty ``__init__.py`` files on the way; returns the commit."""
    commit = subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    folder = dest / SCHEDULER
    folder.mkdir(parents=True, exist_ok=True)
    parts = Path(SCHEDULER).parts
    for k in range(1, len(parts) + 1):
        (dest.joinpath(*parts[:k]) / "__init__.py").touch()
    for name in FILES:
        blob = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"HEAD:{SCHEDULER}/{name}"], check=True,
                              capture_output=True).stdout
        (folder / name).write_bytes(blob)
    return commit


def load_reference(path: Path):
    """The reference's ``zb`` module, imported from ``path``."""
    sys.path.insert(0, str(path))
    from megatron.core.pipeline_parallel.zerobubble.scheduler import zb  # noqa: PLC0415

    return zb


def cases(seed: int, n_random: int) -> list[dict]:
    """The inputs of the module docstring, each a dict of ``GraphConfig`` fields and a name."""
    out = []
    h, a, s = 8192, 64, 4096  # examples/pretrain_zero_bubble.sh: hidden 8192, 64 heads; a 4k sequence
    f_mem = 34 * h + 5 * a * s
    w_mem = -32 * h
    for p, m in [(4, 4), (4, 8), (4, 16), (2, 2), (2, 4), (8, 4), (8, 8), (8, 16)]:  # test_pass.py TEST_SETTINGS
        out.append(dict(name=f"dummy-config p{p} m{m}", cost_f=[1.0] * p, cost_b=[1.0] * p, cost_w=[1.0] * p,
                        cost_comm=0.0, mem_f=[1000.0] * p, mem_b=[1000.0] * p, mem_w=[1000.0] * p, max_mem=None,
                        n_stages=p, n_micro=m))
    for p in (2, 4, 8):
        for m in (p, 2 * p, 3 * p):
            out.append(dict(name=f"runtime-initial p{p} m{m}", cost_f=[1000.0] * p, cost_b=[1000.0] * p,
                            cost_w=[1000.0] * p, cost_comm=1.0, mem_f=[f_mem] * p, mem_b=[0] * p,
                            mem_w=[-f_mem] * p, max_mem=[f_mem * p] * p, n_stages=p, n_micro=m))
            out.append(dict(name=f"pending-2p p{p} m{m}", cost_f=[1000.0] * p, cost_b=[1000.0] * p,
                            cost_w=[1000.0] * p, cost_comm=1.0, mem_f=[f_mem] * p, mem_b=[-f_mem - w_mem] * p,
                            mem_w=[w_mem] * p, max_mem=[2 * p * f_mem] * p, n_stages=p, n_micro=m))
    rnd = random.Random(seed)
    for k in range(n_random):
        p = rnd.randint(2, 8)
        m = rnd.randint(p, 3 * p)
        integer = k % 2 == 0
        def cost(lo, hi):  # noqa: E306
            return [float(rnd.randint(lo, hi)) if integer else round(rnd.uniform(lo, hi), 3) for _ in range(p)]
        comm = rnd.choice([0.0, 1.0, 2.0] if integer else [0.0, 0.05, 0.37])
        act = [float(rnd.choice([1, 2, 3])) for _ in range(p)]
        split_b = k % 3 == 0  # part of the activation freed by B, the rest by W (their V memory model)
        mem_b = [-round(x / 3, 6) if split_b else 0.0 for x in act]
        mem_w = [-(x + y) for x, y in zip(act, mem_b, strict=True)]
        limit = rnd.choice([None, 0.5, 1, 2, p, p + 1, 2 * p])  # 0.5: below one activation
        out.append(dict(name=f"random {k}", cost_f=cost(1, 4) if integer else cost(0.5, 2.0),
                        cost_b=cost(1, 4) if integer else cost(0.5, 2.0),
                        cost_w=cost(1, 3) if integer else cost(0.2, 1.5), cost_comm=comm, mem_f=act, mem_b=mem_b,
                        mem_w=mem_w, max_mem=None if limit is None else [limit * x for x in act], n_stages=p,
                        n_micro=m))
    return out


def reference_variants(zb, case: dict) -> list[dict]:
    """The reference's 8 ``manual_order`` runs (its ``initial_solution`` loop, one run each)
    and, last, its ``create_schedule`` (``flags`` None); orders from ``create_scheduled_nodes``."""
    fields = {k: v for k, v in case.items() if k != "name"}

    def config():
        if all(f + b + w == 0 for f, b, w in zip(fields["mem_f"], fields["mem_b"], fields["mem_w"], strict=True)):
            return zb.GraphConfig(**fields)
        # test_pass.py's create_dummy_config: basic_config, then memories that do not sum to 0
        cfg = zb.GraphConfig(**{**fields, "mem_f": [], "mem_b": [], "mem_w": []})
        cfg.mem_f, cfg.mem_b, cfg.mem_w = fields["mem_f"], fields["mem_b"], fields["mem_w"]
        return cfg

    cfg = config()
    graph = zb.Graph.build_graph(cfg.n_stages, cfg.n_micro, cfg)
    runs = []
    for flags in VARIANTS:
        started = time.perf_counter()
        try:
            _, t, best = graph.manual_order(*flags)
        except (ValueError, AssertionError) as exc:
            runs.append({"flags": flags, "error": _error_text(exc)})
            continue
        nodes = zb.create_scheduled_nodes(graph, t)
        runs.append({"flags": flags, "orders": [[(n.type.value, n.microbatch) for n in st] for st in nodes],
                     "estimate": best, "finish": max(t), "t": list(t), "seconds": time.perf_counter() - started})
    try:
        nodes = zb.create_schedule(config())
        best, _, t = zb.initial_solution(zb.Graph.build_graph(cfg.n_stages, cfg.n_micro, config()), False)
        runs.append({"flags": None, "orders": [[(n.type.value, n.microbatch) for n in st] for st in nodes],
                     "estimate": best, "finish": max(t), "t": list(t)})
    except (ValueError, AssertionError) as exc:
        runs.append({"flags": None, "error": _error_text(exc)})
    return runs


def ours(case: dict) -> list[dict]:
    """pipeopt's 8 variants and its best (flags None), with completion times."""
    from pipeopt.problems.schedule import zb_greedy as z

    args = [case[k] for k in ("cost_f", "cost_b", "cost_w", "cost_comm", "mem_f", "mem_b", "mem_w", "max_mem",
                              "n_micro")]
    runs = greedy_variants(*args)
    g = z._Graph(case["n_stages"], case["n_micro"], (case["cost_f"], case["cost_b"], case["cost_w"]),
                 (case["mem_f"], case["mem_b"], case["mem_w"]), case["cost_comm"], case["max_mem"])
    for run in runs:
        if "error" not in run:
            run["t"] = list(z.manual_order(g, *run["flags"])[1])
    try:
        orders, est, fin = z.greedy_orders(*args)
        first = next(r for r in runs if r["estimate"] == est)  # the first of the least, as greedy_orders keeps
        runs.append({"flags": None, "orders": orders, "estimate": est, "finish": fin, "t": first["t"]})
    except (ValueError, AssertionError) as exc:
        runs.append({"flags": None, "error": z._error_text(exc)})
    return runs


def makespan(case: dict, orders) -> float:
    """pipeopt's executor's iteration time of an order on the case's costs."""
    return execute_orders(orders, case["cost_f"], case["cost_b"], case["cost_w"], case["cost_comm"]).time


def label(flags) -> str:
    """``best`` or the variant's flags as ``A/P/G`` letters (lower case: False)."""
    return "best" if flags is None else "".join(c if f else c.lower() for c, f in zip("APG", flags, strict=True))


def fixture_entry(case: dict, ref: list[dict]) -> dict:
    """The reference's outputs on one input: distinct orders once, each variant by index."""
    distinct: list = []
    variants = []
    for run in ref[:-1]:
        if "error" in run:
            variants.append({"flags": list(run["flags"]), "error": run["error"]})
            continue
        text = [" ".join(f"{k}{mb}" for k, mb in st) for st in run["orders"]]
        if text not in distinct:
            distinct.append(text)
        variants.append({"flags": list(run["flags"]), "orders": distinct.index(text), "estimate": run["estimate"],
                         "finish": run["finish"]})
    best = ref[-1]
    if "error" in best:
        chosen = best["error"]
    else:
        chosen = distinct.index([" ".join(f"{k}{mb}" for k, mb in st) for st in best["orders"]])
    return {"input": {k: v for k, v in case.items()}, "orders": distinct, "variants": variants, "best": chosen}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zb-path", required=True, type=Path, help="folder holding megatron/.../scheduler/zb.py")
    ap.add_argument("--export-from", help="a git dir of the reference repository: export its HEAD there first")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--random", type=int, default=40, help="random inputs after their examples")
    ap.add_argument("--fixture", type=Path, help="write the reference's outputs to this JSON file")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    args = ap.parse_args(argv)
    if args.export_from:
        print(f"exported reference HEAD {export_reference(args.export_from, args.zb_path)} to {args.zb_path}")
    zb = load_reference(args.zb_path)
    todo = cases(args.seed, args.random)
    entries, rows, same_orders, same_times, runs_total, ref_s = [], 0, 0, 0, 0, 0.0
    if not args.quiet:
        print(f"{'input':26} {'p':>2} {'m':>3} {'variant':7} {'ref est':>10} {'ours est':>10} {'ref exec':>10} "
              f"{'ours exec':>10} orders  t")
    for case in todo:
        ref, mine = reference_variants(zb, case), ours(case)
        entries.append(fixture_entry(case, ref))
        for r, o in zip(ref, mine, strict=True):
            runs_total += 1
            ref_s += r.get("seconds", 0.0)
            if "error" in r or "error" in o:
                same = r.get("error") == o.get("error")
                same_orders += same
                same_times += same
                line = f"{r.get('error', '-'):>21} {o.get('error', '-'):>21}"
                ident, tsame = ("yes" if same else "NO"), ""
            else:
                ident = r["orders"] == [list(st) for st in o["orders"]]
                tsame = "t=" if r["t"] == o["t"] else "t!="
                same_orders += ident
                same_times += tsame == "t="
                ident = "yes" if ident else "NO"
                line = (f"{r['estimate']:10.4f} {o['estimate']:10.4f} {makespan(case, r['orders']):10.4f} "
                        f"{makespan(case, o['orders']):10.4f}")
            rows += 1
            if not args.quiet:
                print(f"{case['name']:26} {case['n_stages']:2d} {case['n_micro']:3d} {label(r['flags']):7} {line} "
                      f"{ident:6} {tsame}")
    print(f"\n{len(todo)} inputs, {rows} runs (8 variants + best each): identical orders {same_orders}/{rows}, "
          f"identical completion times {same_times}/{rows}; reference manual_order "
          f"{ref_s / max(1, runs_total - len(todo)):.4f} s per run on average")
    if args.fixture:
        args.fixture.parent.mkdir(parents=True, exist_ok=True)
        args.fixture.write_text(json.dumps({"source": "sail-sg/zero-bubble-pipeline-parallelism zb.py "
                                            "(Graph.manual_order x 8 flag variants, create_schedule), run unmodified",
                                            "seed": args.seed, "cases": entries}, separators=(",", ":")) + "\n")
        print(f"wrote {args.fixture} ({args.fixture.stat().st_size} bytes)")
    return 0 if same_orders == rows else 1


if __name__ == "__main__":
    sys.exit(main())
