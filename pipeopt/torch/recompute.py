"""Activation recomputation as torch runs it: ``full`` (``torch.utils.checkpoint`` of a layer's
whole forward) and ``selective`` (the same checkpoint with a per-operator policy: the outputs of
the expensive operators are saved, every other operator is rerun in the backward), for the
profile to measure (:mod:`pipeopt.torch.probe`) and for ``pipeopt run`` to apply
(:func:`pipeopt.torch.runtime.apply_recompute`): one definition of both modes.

**The selective policy** is torchtitan's per-operator activation checkpointing (``mode =
"selective"``, ``selective_ac_option = "op"``): the outputs of the operators in
:data:`SAVE_OPS` are saved, except every second matrix product, which is recomputed with the
rest (torchtitan ``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``,
"Saves output of all compute ops, except every second mm"; its operator list
``_op_sac_save_list`` in ``torchtitan/models/llama3/infra/parallelize.py``: ``aten.mm``, the
scaled-dot-product attention kernels, ``reduce_scatter_tensor``, ``aten.max``). torchtitan
runs on GPUs and its linear layers have no bias; on CPU, and for a linear layer with a bias,
the same operations dispatch to ``aten.addmm`` and
``aten._scaled_dot_product_flash_attention_for_cpu``, which :data:`SAVE_OPS` adds (an ``addmm``
counts as a matrix product for the every-second rule).

References
----------
PyTorch 2.13 ``torch/utils/checkpoint.py`` (``checkpoint``, ``use_reentrant=False``,
``create_selective_checkpoint_contexts``, ``CheckpointPolicy``); pytorch/torchtitan (commit
cfb9326) ``torchtitan/distributed/activation_checkpoint.py`` and
``torchtitan/models/llama3/infra/parallelize.py``.
"""

from __future__ import annotations

from collections import defaultdict

import torch

_aten = torch.ops.aten


def _ops(*names: tuple) -> frozenset:
    out = []
    for ns, name, overload in names:
        packet = getattr(getattr(torch.ops, ns), name, None)
        op = getattr(packet, overload, None) if packet is not None else None
        if op is not None:
            out.append(op)
    return frozenset(out)


MATMUL_OPS = _ops(("aten", "mm", "default"), ("aten", "addmm", "default"))
"""The matrix products of the every-second rule: torchtitan's ``aten.mm``, and ``aten.addmm``
(a linear layer with a bias)."""

SAVE_OPS = MATMUL_OPS | _ops(
    ("aten", "_scaled_dot_product_efficient_attention", "default"),
    ("aten", "_scaled_dot_product_flash_attention", "default"),
    ("aten", "_scaled_dot_product_cudnn_attention", "default"),
    ("aten", "_scaled_dot_product_attention_math", "default"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable", "default"),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu", "default"),
    ("_c10d_functional", "reduce_scatter_tensor", "default"),
    ("aten", "max", "default"),
)
"""The operators whose outputs the selective policy saves (module docstring)."""

MODES = ("full", "selective")
"""The recomputation modes (:data:`pipeopt.plan.RECOMPUTE_MODES`) defined here."""


def selective_policy():
    """A fresh policy function for ``create_selective_checkpoint_contexts``: save the outputs of
    :data:`SAVE_OPS`, except every second matrix product (counted separately in the forward and
    in the recomputation, as torchtitan counts them); recompute every other operator."""
    from torch.utils.checkpoint import CheckpointPolicy

    counts: dict = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func in MATMUL_OPS:
            counts[key] += 1
        save = func in SAVE_OPS and not (func in MATMUL_OPS and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def checkpointed(fn, mode: str, *, once: bool = False):
    """``fn`` (a module or function) wrapped so that each call runs under
    ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: ``"full"`` keeps only its
    inputs, ``"selective"`` also the outputs :func:`selective_policy` saves.

    ``once`` (``"full"`` only): :func:`rerun_once` instead of torch's checkpoint, for a backward
    split into I and W (module docstring of :func:`rerun_once`).

    Raises
    ------
    InvalidPlanError
        If ``mode`` is not in :data:`MODES`.
    """
    from functools import partial

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    from ..errors import InvalidPlanError

    if mode == "full" and once:
        def run(*args, **kwargs):
            return rerun_once(fn, *args, **kwargs)
    elif mode == "full":
        def run(*args, **kwargs):
            return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    elif mode == "selective":
        def run(*args, **kwargs):
            ctx = partial(create_selective_checkpoint_contexts, selective_policy())
            return checkpoint(fn, *args, use_reentrant=False, context_fn=ctx, **kwargs)
    else:
        raise InvalidPlanError(f"unknown recompute mode {mode!r} (one of {MODES})")
    return run


def rerun_once(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` keeping none of the tensors autograd saves in it: the first
    backward that needs one reruns ``fn`` once (same inputs, same random-number state) and
    every later backward over the same graph reuses the rerun's tensors, until autograd frees
    the graph.

    Why: torch's ``checkpoint(use_reentrant=False)`` keys its recomputed tensors by the
    backward call (the autograd graph task) that asked for them, so a backward split into I
    (``autograd.grad`` for the stage's inputs, graph kept) and W (``autograd.grad`` for the
    weights, one call per parameter group: ``stage_backward_weight`` of
    ``torch.distributed.pipelining``) reruns the forward in I and again in every W call that
    reaches the layer (7.17 runs per microbatch measured for a ``gpt-tiny`` block under ZBV).
    Here it reruns once, before I, as the cost model charges it
    (:func:`pipeopt.cost.rules.recompute_terms`); the rerun's tensors then stay until the W
    that reads them (the layer's activations between its I and its W).

    The mechanism is torch's own non-reentrant one (``torch.autograd.graph.saved_tensors_hooks``:
    pack keeps an index, unpack reruns and returns the tensor of that index); the inputs are
    kept as detached aliases with their ``requires_grad``, the CPU random-number state is
    restored for the rerun (dropout draws the same mask).
    """
    state: dict = {"n": 0, "values": None}
    rng = torch.get_rng_state()
    kept = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args)

    def pack(_t):
        state["n"] += 1
        return state["n"] - 1

    def unpack(i):
        if state["values"] is None:
            values: list = []

            def keep(t):  # detached, as torch's checkpoint keeps them: no cycle through the rerun's graph
                values.append(t.detach())
                return len(values) - 1

            again = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                          for a in kept)
            with torch.random.fork_rng(devices=[]):
                torch.set_rng_state(rng)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(keep, lambda j: values[j]):
                    fn(*again, **kwargs)
            if len(values) != state["n"]:
                from ..errors import PipelineRunError

                raise PipelineRunError(f"the rerun of a recomputed layer saved {len(values)} tensors, its forward "
                                       f"{state['n']}: its forward is not deterministic in what it saves")
            state["values"] = values
        return state["values"][i]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return fn(*args, **kwargs)


def selective_saved_bytes(fn, args: tuple) -> int:
    """Bytes the selective policy saves in one forward of ``fn(*args)``: the distinct storages
    of the outputs of the operators it saves (:func:`selective_policy`), counted by a
    ``TorchDispatchMode`` that asks the same policy. The checkpoint also keeps the inputs
    (not counted here)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy

    policy = selective_policy()

    class _Ctx:
        is_recompute = False

    seen: dict = {}
    keep: list = []  # alive until the end: no address is reused by a later output

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if policy(_Ctx, func, *args, **kwargs) == CheckpointPolicy.MUST_SAVE:
                for t in (out if isinstance(out, (tuple, list)) else (out,)):
                    if isinstance(t, torch.Tensor):
                        keep.append(t)
                        st = t.untyped_storage()
                        seen[st.data_ptr(), st.nbytes()] = st.nbytes()
            return out

    with _Count():
        fn(*args)
    return int(sum(seen.values()))


__all__ = ["MATMUL_OPS", "MODES", "SAVE_OPS", "checkpointed", "rerun_once", "selective_policy",
           "selective_saved_bytes"]
