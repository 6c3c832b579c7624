"""Memory predicted vs measured: pipeopt's per-stage memory against torch's MemTracker (issue 24, 5).

For each model (the shipped ``gpt`` and ResNet-like ``cnn``, the ``gpt`` with its head tied to
its embedding, and, with transformers installed, Hugging Face GPT-2 and ResNet-50 from their
config classes at small sizes):

1. profile it with :func:`pipeopt.torch.from_torch` (measured costs: the layers' saved
   activations, their backward temporaries measured with MemTracker, Adam in fp32 as the
   training state, tied weights);
2. the exact plan at S = 2 (``milp`` on objective ``iteration``, M microbatches of 1F1B with a
   flush, what ``Schedule1F1B`` runs);
3. pipeopt's memory per stage (:func:`pipeopt.evaluate`): k activations + weights, gradients
   and Adam state (+ the tied weight's on every stage holding it) + the outputs the stage keeps
   (k; the last stage M) + its layers' largest backward temporaries;
4. the measurement: :func:`pipeopt.torch.memory.measure_stages` - one process per stage
   (gloo), torch's ``Schedule1F1B`` on the stage ``pipeline()`` builds, Adam, every tensor
   under one MemTracker; the peak of the second iteration (the first allocates Adam's state).
   MemTracker counts tensor storages, not the allocator's caching or the process's other
   memory, and on CPU it is deterministic.

Writes ``--out`` (Markdown): per model and stage, predicted and measured MiB, the error
(predicted - measured) / measured, and the prediction's parts.

    python benchmarks/memory.py              # benchmarks/results/memory.md
    python benchmarks/memory.py --quick      # gpt-tiny and cnn-tiny only
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CASES = [
    # (label, model spec, factory kwargs)
    ("gpt", "gpt", {}),
    ("gpt, tied head", "gpt", {"tie_weights": True}),
    ("cnn", "cnn", {}),
    ("HF GPT-2 (4 layers, d 256, seq 128)", "hf:GPT2LMHeadModel", {"n_layer": 4, "n_embd": 256, "n_head": 4}),
    ("HF ResNet-50 (image 64)", "hf:ResNetModel", {"image": 64}),
]
QUICK = [("gpt-tiny", "gpt-tiny", {}), ("gpt-tiny, tied head", "gpt-tiny", {"tie_weights": True}),
         ("cnn-tiny", "cnn-tiny", {})]


def _hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def run_case(label: str, spec: str, kwargs: dict, stages: int, microbatches: int) -> dict:
    """Profile, plan and measure one model; returns the rows of its table."""
    import pipeopt
    from pipeopt.torch import from_torch
    from pipeopt.torch.memory import measure_stages
    from pipeopt.torch.models import load

    module, inputs = load(spec, **kwargs)
    inst = from_torch(module, inputs, devices=stages, microbatches=microbatches, repeats=2, warmup=1,
                      name=label).with_settings(objective="iteration")
    res = pipeopt.solve(inst, method="milp", stages=stages, time_limit=120)
    ev = pipeopt.evaluate(inst, res.plan)
    t0 = time.perf_counter()
    measured = measure_stages(res.plan, spec, model_kwargs=kwargs, instance=inst, microbatches=microbatches)
    g = inst.graph
    rows = []
    for i, st in enumerate(res.plan.stages):
        act = sum(g.nodes[n]["act_bytes"] for n in st.layers) * ev.in_flight[i]
        params = sum(g.nodes[n]["param_bytes"] for n in st.layers)
        tie = sum(t["state_bytes"] for t, held in zip(g.graph.get("tied", []), ev.tied, strict=True)
                  if i in held["stages"])
        rows.append({"stage": i, "layers": f"{st.layers[0]} .. {st.layers[-1]} ({len(st.layers)})",
                     "k": ev.in_flight[i], "predicted": ev.memory[i], "measured": measured[i]["peak"],
                     "act": act, "params": params, "tie": tie, "transient": ev.transient[i] if ev.transient else 0.0,
                     "built": measured[i]["stage"]})
    return {"label": label, "spec": spec, "kwargs": kwargs, "rows": rows, "seconds": time.perf_counter() - t0,
            "status": str(res.status)}


def table(cases: list[dict], stages: int, microbatches: int) -> str:
    mib = 2**20
    out = ["# Memory: predicted vs MemTracker", "",
           f"S = {stages} stages, M = {microbatches} microbatches, torch's Schedule1F1B with Adam (fp32), one CPU "
           "process per stage; pipeopt's memory per stage (`pipeopt.evaluate`) against the peak MemTracker counts in "
           "the stage's process during a steady-state iteration (`pipeopt.torch.memory.measure_stages`, "
           "`benchmarks/memory.py`). Error = (predicted - measured) / measured. Parts of the prediction: k "
           "microbatches of saved activations, the stage's weights + gradients + Adam state, a tied weight's state "
           "on each stage holding it, and the transients (the outputs the stage keeps - k, the last stage M - "
           "and its layers' largest backward temporaries).", "",
           "| model | stage | layers | k | predicted MiB | measured MiB | error | activations | training state "
           "| tied | transients |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        for r in c["rows"]:
            err = (r["predicted"] - r["measured"]) / r["measured"]
            out.append(f"| {c['label']} | {r['stage']} | {r['layers']} | {r['k']} | {r['predicted'] / mib:.2f} "
                       f"| {r['measured'] / mib:.2f} | {err:+.1%} | {r['act'] / mib:.2f} | {r['params'] / mib:.2f} "
                       f"| {r['tie'] / mib:.2f} | {r['transient'] / mib:.2f} |")
    worst = max(abs((r["predicted"] - r["measured"]) / r["measured"]) for c in cases for r in c["rows"])
    out += ["", f"Largest error: {worst:.1%}."]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny shipped models only")
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory.md"))
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    cases = QUICK if args.quick else [c for c in CASES if not c[1].startswith("hf:") or _hf_available()]
    done = []
    for label, spec, kwargs in cases:
        c = run_case(label, spec, kwargs, args.stages, args.microbatches)
        for r in c["rows"]:
            print(f"{label:40s} stage {r['stage']}: predicted {r['predicted'] / 2**20:8.2f} MiB, measured "
                  f"{r['measured'] / 2**20:8.2f} MiB, error {(r['predicted'] - r['measured']) / r['measured']:+.1%}",
                  flush=True)
        done.append(c)
    text = table(done, args.stages, args.microbatches)
    if not args.quick:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
