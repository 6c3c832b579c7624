"""Predicted vs measured: pipeopt's exact plan and the frameworks' default splits, run on torch's
own pipeline runtime (issues 9 and 24).

For each model (the GPT-style decoder and the CNN of ``pipeopt.torch.models``; a Hugging Face
model with ``--models hf:GPT2LMHeadModel``):

1. profile it with :func:`pipeopt.torch.from_torch` (measured costs, one thread, as the run
   uses; its default granularity), which also measures the stage overhead (the whole model's
   run beyond the sum of its layers, graph attribute ``stage_overhead``); the link's latency
   and bandwidth are fitted on a gloo ping-pong (:func:`pipeopt.torch.network.measure_link`,
   ``--link measure``, the default) and set on the instance's cluster;
2. the exact plan: ``milp`` on objective ``iteration`` (M microbatches under 1F1B with a
   flush, what a run of ``Schedule1F1B`` takes) -- certified optimal for the profile;
3. the frameworks' default splits of the same model: torchtitan (``torchtitan``, first/last
   stage less layers = 1), PiPPy's examples (``pippy``, equal block counts), Megatron-LM
   (``megatron``, where L divides by S), DeepSpeed ``uniform`` (equal layer counts over the
   layer list) and DeepSpeed ``parameters`` (``partition_balanced`` on each layer's
   parameter bytes, buffers excluded as DeepSpeed counts trainable parameters);
4. the reference: the whole model in one process (S = 1, no pipeline, no communication):
   what the runtime adds to the profiled layer times by itself;
5. every distinct plan is run with :func:`pipeopt.torch.runtime.run_plan` (S spawned CPU
   processes, gloo, one thread each, ``Schedule1F1B``), ``--rounds`` times interleaved, and
   the median measured time per iteration is set beside pipeopt's prediction for the plan.

With ``--recompute full selective`` (the modes to try), the exact plan of each model also runs
with every layer of every stage recomputed in each mode (``Stage.recompute``; ``pipeopt run``
applies it with ``torch.utils.checkpoint``, selective with torchtitan's per-operator policy),
interleaved with the other plans; a second table per model sets their predicted and measured
times side by side, the prediction that charges a rerun the layer's profiled forward (the rule
without the profile's measured ``recompute_fwd``), and the forward reruns per microbatch the
run counted.

Prints one table per (model, S): predicted and measured ms per iteration, the prediction error,
the prediction of the cost model without the two issue-24 terms (latency 0, no stage overhead:
the bandwidth-only model), the 1-minute load average before each run (a ``*`` when the stage
processes outnumbered the free cores by ``pipeopt run``'s check, the cores busy just before it), and the exact plan's
predicted and measured speed-up over each default. Writes the tables to ``--out`` (Markdown).
S = 2 is the measured table (two cores); ``--oversubscribed`` adds S = 4 on the GPT once (four
processes on two cores).

    python benchmarks/torch_pipeline.py --quick          # tiny models, 1 round: a smoke run
    python benchmarks/torch_pipeline.py                  # docs/results/torch_pipeline.md's table (quiet machine!)
    python benchmarks/torch_pipeline.py --rounds 3 --oversubscribed
    python benchmarks/torch_pipeline.py --models gpt cnn hf:GPT2LMHeadModel --model-arg hf:GPT2LMHeadModel:seq=64
    python benchmarks/torch_pipeline.py --models gpt --recompute full selective --rounds 3   # issue 25's rows
    python benchmarks/torch_pipeline.py --models gpt --rounds 3 --pin 0   # stage processes not pinned
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from pipeopt import PartitionProblem, Plan, Stage, solve
from pipeopt.errors import PipeoptError
from pipeopt.problems.partition.simple import spread_balanced_parts
from pipeopt.result import Status
from pipeopt.torch import from_torch, models
from pipeopt.torch.runtime import BUSY_WINDOW, free_cores, prediction, run_plan

DEFAULTS = ("torchtitan", "pippy", "megatron", "uniform")
"""Registry methods run beside the exact plan (DeepSpeed ``parameters`` is built here)."""


def deepspeed_parameters(inst, stages: int):
    """DeepSpeed ``partition_method="parameters"``: ``partition_balanced`` on the trainable
    parameter bytes of each unit (node attribute ``weight_bytes``; buffers excluded)."""
    problem = PartitionProblem(inst, stages)
    weights = [sum(inst.graph.nodes[n].get("weight_bytes", inst.graph.nodes[n]["param_bytes"]) for n in unit)
               for unit in inst.chain.units]
    bounds = spread_balanced_parts(np.asarray(weights, dtype=float), stages)
    starts = sorted({b for b in bounds[1:-1] if 0 < b < problem.n})
    if len(starts) + 1 < stages:
        raise PipeoptError(f"DeepSpeed parameters leaves an empty stage ({bounds})")
    return problem.plan(starts)


def plans_for(inst, stages: int, time_limit: float) -> dict:
    """method -> plan (the exact one first); a default its framework refuses is left out."""
    out = {}
    exact = solve(inst, method="milp", stages=stages, time_limit=time_limit)
    out["exact (milp)"] = (exact.plan, str(exact.status))
    for m in DEFAULTS:
        try:
            res = solve(inst, method=m, stages=stages)
            out[m] = (res.plan, str(res.status))
        except PipeoptError as exc:
            print(f"  {m}: refused ({exc})")
    out["deepspeed parameters"] = (deepspeed_parameters(inst, stages), str(Status.FEASIBLE))
    return out


def blocks(plan) -> str:
    return " / ".join(f"{len(st.layers)}: {st.layers[0]}..{st.layers[-1]}" if len(st.layers) > 1 else st.layers[0]
                      for st in plan.stages)


def without_terms(inst):
    """The instance under the bandwidth-only cost model: latency 0, no stage overhead, and the
    layers' times as profiled alone (the fitted runtime scale, ``graph["torch"]["runtime_scale"]``,
    undone: :func:`pipeopt.torch.profile.scale_layers`)."""
    from pipeopt.torch.profile import scale_layers

    graph = inst.graph.copy()
    graph.graph.pop("stage_overhead", None)
    scale = graph.graph.get("torch", {}).get("runtime_scale")
    if scale:  # (scale_layers assigns new dicts to the copy's own node dicts: inst is unchanged)
        scale_layers(graph, {k: 1.0 / v for k, v in scale.items()})
    return inst.replace(graph=graph, cluster=inst.cluster.with_overrides(latency=0.0))


def with_recompute(plan, mode: str):
    """``plan`` with every layer of every stage recomputed in ``mode``."""
    return Plan(tuple(dataclasses.replace(st, recompute=dict.fromkeys(st.layers, mode)) for st in plan.stages),
                plan.schedule)


def fwd_rule(inst):
    """The instance whose full recomputation charges a rerun the layer's profiled forward (the
    rule without the profile's measured ``recompute_fwd``)."""
    graph = inst.graph.copy()
    for n in graph.nodes:
        graph.nodes[n].pop("recompute_fwd", None)
    return inst.replace(graph=graph)


def _key(plan):
    return tuple((tuple(st.layers), tuple(sorted((st.recompute or {}).items()))) for st in plan.stages)


def link_for(inst, args):
    """The measured link (latency, bandwidth) up to the largest edge of ``inst``, or ``None``."""
    if args.link != "measure":
        return None
    from pipeopt.torch.network import measure_link

    size = int(max((b for _, _, b in inst.graph.edges(data="bytes")), default=1 << 20))
    link = measure_link(largest=max(size, 64))
    print(f"  link: {link.describe()}")
    return link


def run_model(name: str, kwargs: dict, stages: int, args) -> list[dict]:
    module, inputs = models.load(name, **kwargs)
    t0 = time.perf_counter()
    inst = from_torch(module, inputs, devices=stages, repeats=args.repeats, warmup=args.profile_warmup,
                      microbatches=args.microbatches)
    inst = inst.with_settings(objective="iteration", microbatches=args.microbatches)
    meta = inst.graph.graph["torch"]
    over = inst.graph.graph.get("stage_overhead") or {}
    sums = {t["name"]: t["sum_s"]["cpu"] for t in inst.graph.graph.get("tied", []) if "sum_s" in t}
    print(f"{name} {kwargs or ''}: {inst.num_layers} layers profiled in {time.perf_counter() - t0:.1f} s; "
          f"sum of layers {meta['sum_of_layers_s'] * 1e3:.2f} ms vs whole model {meta['whole_model_s'] * 1e3:.2f} ms "
          f"per microbatch (fwd+bwd, 1 thread); stage overhead {over.get('forward', 0) * 1e3:.3f} ms forward, "
          f"{over.get('backward', 0) * 1e3:.3f} ms backward; "
          + "".join(f"tied {k}: one gradient sum {v * 1e3:.2f} ms; " for k, v in sums.items())
          + free_cores(stages)["text"])
    link = link_for(inst, args)
    if link is not None:
        inst = inst.replace(cluster=inst.cluster.with_overrides(bandwidth=link.bandwidth, latency=link.latency,
                                                                collective_bandwidth=link.collective_bandwidth))
    plans = plans_for(inst, stages, args.time_limit)
    exact_plan = plans["exact (milp)"][0]
    for mode in args.recompute or ():
        plans[f"exact, every layer recomputed ({mode})"] = (with_recompute(exact_plan, mode), "recompute")
    # the reference: the whole model in one process (what the runtime adds to the profile, no pipeline)
    whole = Plan((Stage(tuple(inst.graph.nodes), devices=(inst.cluster.devices[0].name,)),))
    plans["no pipeline (1 process)"] = (whole, "reference")
    distinct: dict = {}
    for method, (plan, status) in plans.items():
        distinct.setdefault(_key(plan), []).append(method)
    measured: dict = {key: [] for key in distinct}
    loads: dict = {key: [] for key in distinct}
    busy: dict = {key: False for key in distinct}
    built: dict = {}
    reruns: dict = {}
    for r in range(args.rounds):
        for key in distinct:
            plan = plans[distinct[key][0]][0]
            report = run_plan(plan, name, model_kwargs=kwargs, instance=inst, schedule="1f1b",
                              microbatches=args.microbatches, iterations=args.iterations, warmup=args.warmup)
            measured[key].append(report.iteration)
            built[key] = report.membership_matches
            if report.recomputed is not None:
                again = [v for st in report.info.get("recomputations") or [] for v in st.values()]
                reruns[key] = max(again, default=0.0)
            cores = report.info.get("cores") or {}
            loads[key].append(cores.get("load"))
            busy[key] = busy[key] or bool(cores.get("warning"))
            print(f"  round {r + 1}: {', '.join(distinct[key])}: measured {report.iteration * 1e3:.2f} ms, "
                  f"predicted {report.predicted * 1e3:.2f} ms ({report.wall:.0f} s; load {cores.get('load')})")
    rows = []
    for method, (plan, status) in plans.items():
        key = _key(plan)
        rows.append({
            "model": name, "S": stages, "method": method, "status": status, "split": blocks(plan),
            "predicted": prediction(inst, plan, "1f1b", args.microbatches),
            "bandwidth_only": prediction(without_terms(inst), plan, "1f1b", args.microbatches),
            "measured": statistics.median(measured[key]), "runs": measured[key], "built_as_planned": built[key],
            "loads": [x for x in loads[key] if x is not None], "busy": busy[key],
            "latency": inst.cluster.latency, "bandwidth": inst.cluster.bandwidth, "overhead": over, "tie_sums": sums,
            "recompute": status == "recompute", "reruns": reruns.get(key),
            "fwd_rule": (prediction(fwd_rule(inst), plan, "1f1b", args.microbatches)
                         if status == "recompute" and method.endswith("(full)") else None),
        })
    exact = rows[0]
    for row in rows:
        row["error"] = (row["predicted"] - row["measured"]) / row["measured"]
        row["error_bandwidth_only"] = (row["bandwidth_only"] - row["measured"]) / row["measured"]
        row["pred_speedup"] = row["predicted"] / exact["predicted"]
        row["meas_speedup"] = row["measured"] / exact["measured"]
    rows[-1]["S"] = 1
    return rows


def _loads(r) -> str:
    if not r["loads"]:
        return "?"
    lo, hi = min(r["loads"]), max(r["loads"])
    return (f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}") + ("*" if r["busy"] else "")


def recompute_table(rows: list[dict], microbatches: int) -> str:
    """The recomputation rows beside the exact plan without recomputation ("" if none)."""
    rc = [r for r in rows if r["recompute"]]
    if not rc:
        return ""
    lines = ["| model | S | plan | predicted ms/iter | measured ms/iter | error | rerun = profiled forward: predicted, "
             "error | forward reruns per microbatch (most) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in [rows[0], *rc]:
        fwd = (f"{r['fwd_rule'] * 1e3:.1f}, {(r['fwd_rule'] - r['measured']) / r['measured']:+.1%}"
               if r["fwd_rule"] is not None else "-")
        again = "-" if r["reruns"] is None else f"{r['reruns']:.2f}"
        lines.append(f"| {r['model']} | {r['S']} | {r['method']} | {r['predicted'] * 1e3:.1f} | "
                     f"{r['measured'] * 1e3:.1f} | {r['error']:+.1%} | {fwd} | {again} |")
    return ("\n".join(lines) + f"\n\n(M = {microbatches}, Schedule1F1B; the exact plan's split with every layer "
            "recomputed: full = torch.utils.checkpoint, selective = torchtitan's per-operator policy; the prediction "
            "charges the profile's measured recompute_fwd / selective.fwd per layer, the column beside it a rerun = "
            "the layer's profiled forward)")


def table(rows: list[dict], microbatches: int) -> str:
    head = ("| model | S | method | split (layers per stage) | predicted ms/iter | measured ms/iter | error | "
            "bandwidth-only model: predicted, error | load (1 min) | exact's speed-up, predicted | measured |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in rows:
        if r["recompute"]:
            continue
        lines.append(
            f"| {r['model']} | {r['S']} | {r['method']} | {r['split']} | {r['predicted'] * 1e3:.1f} | "
            f"{r['measured'] * 1e3:.1f} | {r['error']:+.1%} | {r['bandwidth_only'] * 1e3:.1f}, "
            f"{r['error_bandwidth_only']:+.1%} | {_loads(r)} | "
            + ("- | - |" if r["S"] == 1 else f"{r['pred_speedup']:.3f}x | {r['meas_speedup']:.3f}x |")
            + ("" if r["built_as_planned"] else " (stages NOT as planned)")
        )
    r = rows[0]
    over = r["overhead"] or {}
    return ("\n".join(lines) + f"\n\n(M = {microbatches} microbatches per iteration, Schedule1F1B, gloo, 1 thread per "
            f"stage; latency {r['latency'] * 1e3:.4g} ms per message and bandwidth {r['bandwidth']:.4g} B/s "
            f"{'fitted on a gloo ping-pong' if r['latency'] else 'assumed'}; stage overhead "
            f"{over.get('forward', 0) * 1e3:.3f} ms forward + {over.get('backward', 0) * 1e3:.3f} ms backward per "
            f"microbatch; "
            + "".join(f"a stage holding both users of the tied {k} sums their gradients, {v * 1e3:.2f} ms per "
                      "microbatch (measured); " for k, v in (r.get("tie_sums") or {}).items())
            + "load: the 1-minute load average before each run, * = the stage processes outnumbered the "
            f"free cores: pipeopt run's check, the cores busy over {BUSY_WINDOW:g} s before the run)")


def model_kwargs(name: str, items: list[str]) -> dict:
    """``--model-arg MODEL:KEY=VALUE`` items of model ``name`` as keyword arguments (values read as
    Python literals where they parse)."""
    import ast

    out = {}
    for item in items:
        model, sep, pair = item.rpartition(":")
        key, eq, value = pair.partition("=")
        if not sep or not eq:
            raise SystemExit(f"--model-arg needs MODEL:KEY=VALUE, got {item!r}")
        if model == name:
            try:
                out[key] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                out[key] = value
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models, 1 round, 3 iterations (a smoke run)")
    ap.add_argument("--models", nargs="+", help="shipped models or hf:ClassName (default gpt cnn; --quick: "
                                                "gpt-tiny cnn-tiny)")
    ap.add_argument("--model-arg", action="append", default=[], metavar="MODEL:KEY=VALUE",
                    help="keyword argument of one model's factory (repeatable), e.g. hf:GPT2LMHeadModel:seq=64")
    ap.add_argument("--link", choices=["measure", "assumed"], default="measure",
                    help="measure the link's latency and bandwidth (default) or keep the profile's assumed bandwidth")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--recompute", nargs="*", choices=["full", "selective"], default=[],
                    help="also run the exact plan with every layer recomputed in each of these modes")
    ap.add_argument("--oversubscribed", action="store_true", help="also S = 4 on the first model (2 cores!)")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="runs of every plan, interleaved (median)")
    ap.add_argument("--repeats", type=int, default=20, help="profile: timed runs per layer")
    ap.add_argument("--profile-warmup", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--pin", choices=["auto", "1", "0"], default="auto",
                    help="pin each stage process to one core: auto (pipeopt run's default: when the "
                         "processes fit the cores), 1 always, 0 never (pipeopt.torch.runtime.PIN_ENV)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "torch_pipeline.md"))
    args = ap.parse_args(argv)
    from pipeopt.torch.runtime import PIN_ENV

    os.environ[PIN_ENV] = args.pin
    if args.quick:
        args.models = args.models or ["gpt-tiny", "cnn-tiny"]
        args.rounds, args.iterations, args.warmup, args.repeats, args.profile_warmup = 1, 3, 1, 5, 2
    names = args.models or ["gpt", "cnn"]
    started = time.perf_counter()
    sections = []
    for name in names:
        rows = run_model(name, model_kwargs(name, args.model_arg), args.stages, args)
        sections.append(table(rows, args.microbatches))
        print(sections[-1], "\n")
        extra = recompute_table(rows, args.microbatches)
        if extra:
            sections.append(extra)
            print(extra, "\n")
    if args.oversubscribed:
        rows = run_model(names[0], model_kwargs(names[0], args.model_arg), 4, args)
        sections.append("S = 4: four processes on two cores (oversubscribed)\n\n" + table(rows, args.microbatches))
        print(sections[-1], "\n")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    out.write_text(f"# torch_pipeline.py {' '.join(sys.argv[1:] if argv is None else argv)}\n\n"
                   f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores; load average "
                   f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1 / 5 / 15 min) at the end)\n\n"
                   + "\n\n".join(sections) + "\n")
    print(f"wrote {out} ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
