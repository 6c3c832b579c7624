"""Memory measured: a layer's backward temporaries (for the profile) and a stage's peak under
torch's own pipeline runtime (to check the cost model against), both with torch's
``MemTracker`` (``torch.distributed._tools.mem_tracker``), which counts the bytes of every
tensor storage created under it, on CPU as on GPU, deterministically.

* :func:`backward_temporaries` - per layer, the peak bytes its backward allocates: the gradient
  it receives, the gradients it produces for its inputs and every temporary, at their peak
  (its parameters' gradients exist beforehand: they are training state, in ``param_bytes``).
* :func:`measure_stages` - the peak bytes each stage process holds in a steady-state iteration
  of torch's ``Schedule1F1B`` with an Adam optimizer: one process per stage (gloo), the stage
  module, its optimizer, runtime buffers and every tensor of the second iteration under one
  ``MemTracker`` (the first iteration allocates Adam's state; the peak is reset after it); the
  plan's recomputed layers (``Stage.recompute``) run under ``torch.utils.checkpoint`` as in
  ``pipeopt run``.

References
----------
PyTorch 2.13 ``torch/distributed/_tools/mem_tracker.py`` (``MemTracker``);
``torch/distributed/pipelining`` (``pipeline``, ``build_stage``, ``Schedule1F1B``).
"""

from __future__ import annotations

import torch

from .probe import _grad_outputs, _prepare, tensors
from .trace import Traced

TOTAL = "Total"
"""MemTracker's key of the total bytes in a snapshot."""


def tracker():
    """A ``MemTracker`` that keeps the totals only: its per-module statistics are off (they
    refuse a module called more than once per iteration, as a pipeline stage is, once per
    microbatch); the peak and the breakdown by kind of every storage are MemTracker's own."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Totals(MemTracker):
        def _pre_fw_hook(self, module, inputs) -> None:
            pass

        def _post_fw_hook(self, module, inputs, outputs) -> None:
            pass

        def _pre_bw_hook(self, module, args) -> None:
            pass

        def _post_bw_hook(self, module, args) -> None:
            pass

    return _Totals()


def _total(tracker, kind: str = "peak") -> int:
    snap = tracker.get_tracker_snapshot(kind)
    return int(sum(dev.get(TOTAL, 0) for dev in snap.values()))


def backward_temporaries(traced: Traced, inputs: list) -> list[int]:
    """Per layer (``traced.names`` order): the peak bytes of the tensors its backward creates.

    The layer runs alone on its recorded inputs (:func:`pipeopt.torch.probe.capture`); its
    parameters' gradients are allocated first (zeros), as in a training step after the first.
    Its forward runs under ``MemTracker`` (its output and saved tensors are tracked, so what the
    backward frees counts), then the gradient of its outputs (ones) is created and the backward
    runs: the tracker's peak during the backward less what it held before is what the backward
    needs on top of the layer's saved activations, its output and the training state.

    Returns
    -------
    list[int]
        Bytes per layer; 0 for a layer whose outputs need no gradient.
    """
    out = []
    for sub, args, sources in zip(traced.submods, inputs, traced.sources, strict=True):
        params = [p for p in sub.parameters() if p.requires_grad]
        before = [p.grad for p in params]
        for p in params:
            p.grad = torch.zeros_like(p)
        try:
            x = _prepare(args, sources)
            mt = tracker()
            with mt:
                y = sub(*x)  # its output and saved tensors are tracked: the backward frees some
                outs = _grad_outputs(y)
                if outs:
                    held = _total(mt, "current")
                    mt._peak_mem, mt._peak_mem_snap = {}, {}  # the backward's peak only
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            out.append(max(_total(mt) - held, 0) if outs else 0)
            del x, y, outs
        finally:
            for p, g in zip(params, before, strict=True):
                p.grad = g
    return out


def saved_twice(traced: Traced, inputs: list) -> dict:
    """The tensors two layers both save for their backward: ``{(producer, consumer): bytes}``
    (layer indices in ``traced.names`` order) for every argument of a consumer that it saves and
    whose producer saves it too, as its own output (a ReLU saves its result, the next
    convolution its input: one storage in a stage that holds both layers, counted in both
    layers' ``act_bytes`` as each is measured alone).

    Each layer runs alone on its recorded inputs under ``saved_tensors_hooks``, which name the
    storages it saves; its output and each argument are compared with them by storage.
    """
    saves_output, saves_arg = [], []
    for sub, args, sources in zip(traced.submods, inputs, traced.sources, strict=True):
        seen: set = set()

        def pack(t, seen=seen):
            seen.add(t.untyped_storage()._cdata)
            return t

        x = _prepare(args, sources)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = sub(*x)
        saves_output.append(any(t.untyped_storage()._cdata in seen for t in tensors(y)))
        saves_arg.append([sum(t.numel() * t.element_size() for t in tensors(a) if t.untyped_storage()._cdata in seen)
                          for a in x])
        del x, y
    out: dict = {}
    for j, srcs in enumerate(traced.sources):
        for k, src in enumerate(srcs):
            if src is not None and src != j and saves_output[src] and saves_arg[j][k]:
                out[src, j] = out.get((src, j), 0) + saves_arg[j][k]
    return out


def _stage_memory_run(rank: int, world: int, job: dict) -> dict:
    """One stage process of :func:`measure_stages` (called by :mod:`pipeopt.torch.runtime`'s
    worker, after the gloo group is up)."""
    from torch.distributed.pipelining import Schedule1F1B, build_stage

    from .runtime import (_factory, _sum_loss, apply_recompute, build_pipe, recompute_report, stage_membership,
                          stage_step)

    module, example = _factory(job)
    example = tuple(example)
    m = job["microbatches"]
    pipe = build_pipe(module, example, job["exported"])
    stage_mod = pipe.get_stage_module(rank)
    info = pipe.info()
    names = stage_membership(stage_mod, job["names"])
    modes = job["recompute"][rank]
    calls = apply_recompute(stage_mod, job["names"], modes) if any(job["recompute"]) else {}
    del module, pipe
    mt = tracker()
    mt.track_external(stage_mod)
    with mt:
        stage = build_stage(stage_mod, rank, info, torch.device("cpu"))
        sched = Schedule1F1B(stage, m, loss_fn=_sum_loss)
        opt = torch.optim.Adam(stage_mod.parameters(), lr=1e-6)
        batch = tuple(torch.cat([x] * m) if isinstance(x, torch.Tensor) else x for x in example)
        target = torch.zeros(m * (example[0].shape[0] if isinstance(example[0], torch.Tensor) else 1))
        peaks = []
        for _ in range(job["iterations"]):
            mt._peak_mem = {}  # the peak of this iteration only (MemTracker has no public reset)
            mt._peak_mem_snap = {}
            stage_step(sched, rank, world, batch, target)
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay allocated: training state
            peaks.append(_total(mt))
        snap = mt.get_tracker_snapshot("peak")
    parts = {k: int(v) for dev in snap.values() for k, v in dev.items()}
    return {"rank": rank, "stage": names, "peaks": peaks, "peak": peaks[-1], "parts": parts,
            **recompute_report(calls, modes, job["iterations"], m)}


def measure_stages(plan, model, *, model_kwargs=None, instance=None, microbatches: int = 8, iterations: int = 2,
                   timeout: float = 300.0) -> list[dict]:
    """The peak bytes of every stage of ``plan`` under torch's ``Schedule1F1B`` with Adam,
    measured with ``MemTracker`` in one CPU process per stage.

    Parameters
    ----------
    plan
        A :class:`pipeopt.Plan` without replication.
    model
        A shipped model name or a factory, as :func:`pipeopt.torch.runtime.run_plan` takes.
    model_kwargs
        Keyword arguments of the factory.
    instance
        The profiled instance (the layers' order for the export).
    microbatches
        M per iteration (the batch is M copies of the factory's microbatch).
    iterations
        Iterations run (at least 2: the first allocates Adam's state); the last one's peak is
        reported.

    Returns
    -------
    list[dict]
        Per stage: ``peak`` (bytes of the last iteration's peak), ``peaks`` (every iteration's),
        ``parts`` (MemTracker's breakdown at the peak: parameters, gradients, activations,
        temporaries, optimizer state, other), ``stage`` (the modules built), ``recomputed``
        (its layers run under ``torch.utils.checkpoint``: the plan's ``Stage.recompute``, applied
        as ``pipeopt run`` applies it, :func:`pipeopt.torch.runtime.apply_recompute`) and
        ``forward_runs`` (per layer of the stage, forward runs per microbatch: 2 where
        recomputed; ``{}`` when the plan recomputes nothing).

    Raises
    ------
    UnsupportedPlanError
        If the plan asks for a recomputation mode the run does not apply
        (:func:`pipeopt.torch.runtime.recompute_modes`).
    PipelineRunError
        If a process fails.
    """
    from .runtime import _export_for_run, _spawn, recompute_modes, stage_modes

    modes = recompute_modes(plan)
    exported, names = _export_for_run(plan, model, model_kwargs, instance)
    job = {"model": model, "model_kwargs": dict(model_kwargs or {}), "exported": exported, "names": names,
           "microbatches": int(microbatches), "iterations": max(int(iterations), 2), "timeout": timeout,
           "run": _stage_memory_run, "recompute": stage_modes(modes, exported["stages"])}
    return _spawn(exported["num_stages"], job, timeout)
