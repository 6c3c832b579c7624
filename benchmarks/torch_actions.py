"""Where a pipeline run's time goes: per-action and per-layer CPU times of each stage process
inside torch's ``Schedule1F1B`` (issue 24's diagnosis of the shipped GPT's S = 2 runs).

Profiles the model (:func:`pipeopt.torch.from_torch`, one thread), splits it in two at
``--cut`` (the first ``cut`` layers on stage 0; the default 7 is the GPT's exact 7/5 split; a
cut at or beyond the layer count runs the whole model in one process) and runs the split with
the same stage processes as ``pipeopt run`` (:mod:`pipeopt.torch.runtime`), with timers around
torch's per-action calls (the stage's ``forward_one_chunk`` and ``backward_one_chunk``, the
schedule's loss, posting and waiting on the sends and receives) and forward hooks on every
layer. Thread CPU times are printed per microbatch beside the profile's: CPU times are what a
busy machine distorts least (wall times include the waits for the other jobs' processes).

    python benchmarks/torch_actions.py                 # GPT, 7/5 split
    python benchmarks/torch_actions.py --cut 12        # GPT, whole model in one process
    python benchmarks/torch_actions.py --pin 0         # stage processes not pinned
    python benchmarks/torch_actions.py --recompute full   # every layer recomputed (the backward reruns it)
    python benchmarks/torch_actions.py --model hf:GPT2LMHeadModel --model-arg seq=32 --model-arg batch=1 \
        --cut 11 --microbatches 4 --recompute full      # HF GPT-2 small, the exact 11/6 split
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time


def timed_run(rank: int, world: int, job: dict) -> dict:
    """:func:`pipeopt.torch.runtime._stage_run` with timers (module docstring); module-level:
    the spawned stage process unpickles it by reference."""
    import torch.distributed.pipelining as pipelining
    import torch.distributed.pipelining.schedules as schedules

    from pipeopt.torch import runtime

    acc: dict = collections.defaultdict(lambda: [0.0, 0.0, 0])

    def wrap(obj, name, key):
        orig = getattr(obj, name)

        def timed(*a, **k):
            w, c = time.perf_counter(), time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                e = acc[key]
                e[0] += time.perf_counter() - w
                e[1] += time.thread_time() - c
                e[2] += 1
        setattr(obj, name, timed)

    wrap(schedules, "_wait_batch_p2p", "wait send/recv")
    wrap(schedules, "_batch_p2p", "post send/recv")
    wrap(schedules.PipelineScheduleSingle, "_maybe_compute_loss", "loss")
    layer: dict = collections.defaultdict(lambda: [0.0, 0])
    real_build = pipelining.build_stage

    def build(mod, *a, **k):
        for n in job["names"]:
            try:
                sub = mod.get_submodule(n)
            except AttributeError:
                continue

            def pre(m, args):
                m._pipeopt_t0 = time.thread_time()

            def post(m, args, out, _n=n):
                e = layer[_n]
                e[0] += time.thread_time() - m._pipeopt_t0
                e[1] += 1
            sub.register_forward_pre_hook(pre)
            sub.register_forward_hook(post)
        stage = real_build(mod, *a, **k)
        wrap(stage, "forward_one_chunk", "forward")
        wrap(stage, "backward_one_chunk", "backward")
        return stage

    pipelining.build_stage = build
    real_reset = runtime._reset_counts

    def reset(calls) -> None:  # after the warm-up: the figures cover the timed iterations only
        real_reset(calls)
        acc.clear()
        layer.clear()
    runtime._reset_counts = reset
    out = runtime._stage_run(rank, world, job)
    out["actions"] = {k: list(v) for k, v in acc.items()}
    out["layers"] = {k: v[0] / max(v[1], 1) for k, v in layer.items()}
    out["microbatches_run"] = job["iterations"] * job["microbatches"]  # timed: reset after the warm-up
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt")
    ap.add_argument("--cut", type=int, default=7, help="layers on stage 0 (>= the layer count: one process)")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10, help="profile: timed runs per layer")
    ap.add_argument("--pin", choices=["auto", "1", "0"], default="auto",
                    help="pin each stage process to one core: auto (when the processes fit the cores), 1, 0 (PIN_ENV)")
    ap.add_argument("--recompute", choices=["full", "selective"], help="every layer recomputed in this mode")
    ap.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                    help="a keyword of the model (pipeopt.torch.models.load), e.g. seq=32; repeatable")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_actions  # the spawned processes find timed_run by this module's name

    from pipeopt import Plan, Stage
    from pipeopt.torch import from_torch, models
    from pipeopt.torch.runtime import PIN_ENV, _export_for_run, _spawn, prediction, recompute_modes, stage_modes

    os.environ[PIN_ENV] = args.pin
    m = args.microbatches
    from torch_pipeline import model_kwargs

    kwargs = model_kwargs(args.model, [f"{args.model}:{a}" for a in args.model_arg])
    module, inputs = models.load(args.model, **kwargs)
    inst = from_torch(module, inputs, devices=2, repeats=args.repeats, warmup=3, microbatches=m)
    inst = inst.with_settings(objective="iteration", microbatches=m)
    g = inst.graph
    names = list(g.nodes)
    devs = [d.name for d in inst.cluster.devices]
    if args.cut < len(names):
        plan = Plan((Stage(tuple(names[:args.cut]), devices=(devs[0],)),
                     Stage(tuple(names[args.cut:]), devices=(devs[1],))))
    else:
        plan = Plan((Stage(tuple(names), devices=(devs[0],)),))
    if args.recompute:
        import dataclasses

        plan = Plan(tuple(dataclasses.replace(st, recompute=dict.fromkeys(st.layers, args.recompute))
                          for st in plan.stages))
    print(f"{args.model}: stage overhead {g.graph.get('stage_overhead')}; predicted "
          f"{prediction(inst, plan, '1f1b', m) * 1e3:.1f} ms per iteration (M = {m}); load {os.getloadavg()[0]:.2f}")
    exported, nm = _export_for_run(plan, args.model, kwargs, inst)
    job = {"model": args.model, "model_kwargs": kwargs, "exported": exported, "names": nm, "schedule": "1f1b",
           "microbatches": m, "iterations": args.iterations, "warmup": args.warmup, "timeout": 600.0,
           "recompute": stage_modes(recompute_modes(plan), exported["stages"]), "run": torch_actions.timed_run}
    for r in _spawn(plan.num_stages, job, 600.0):
        n = r["microbatches_run"]
        st = plan.stages[r["rank"]].layers
        pf = sum(g.nodes[x]["fwd"]["cpu"] for x in st)
        pb = sum(g.nodes[x]["bwd"]["cpu"] for x in st)
        if args.recompute:
            from pipeopt.cost.rules import recompute_terms

            extra = sum(recompute_terms(g, x, args.recompute)[1].get("cpu", 0.0) for x in st)
            ff = sum(g.nodes[x]["fwd"]["cpu"] for x in st)
            parts = [g.nodes[x].get("recompute_parts", {}).get(args.recompute, {}) for x in st]
            print(f"rank {r['rank']}: the profile's recomputation adds {extra * 1e3:.3f} ms to the backward "
                  f"(the layers' profiled forward: {ff * 1e3:.3f} ms; of the term, unscaled: the checkpointed "
                  f"forward's excess {sum(p.get('forward', 0.0) for p in parts) * 1e3:.3f} ms, the reruns "
                  f"{sum(p.get('rerun', 0.0) for p in parts) * 1e3:.3f} ms)")
            pb += extra
        print(f"rank {r['rank']}: iterations {[round(t * 1e3, 1) for t in r['times']]} ms wall, "
              f"{[round(t * 1e3, 1) for t in r['cpu']]} ms process CPU; profile per microbatch: forward "
              f"{pf * 1e3:.3f} ms, backward {pb * 1e3:.3f} ms")
        excess = 0.0
        for x, v in r["layers"].items():
            p = g.nodes[x]["fwd"]["cpu"]
            excess += v - p
            print(f"   layer {x:12s} forward CPU {v * 1e3:7.3f} ms (profile {p * 1e3:7.3f}, {(v / p - 1) * 100:+.1f} %)")
        print(f"   the layers' forwards: {excess * 1e3:+.3f} ms per microbatch over the profile")
        for k, (w, c, cnt) in sorted(r["actions"].items()):
            print(f"   {k:15s} {cnt:4d} calls: per microbatch {w / n * 1e3:7.3f} ms wall, {c / n * 1e3:7.3f} ms CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
