"""Run each layer of a split model on its own: tensor sizes, FLOPs, saved activations, times.

:func:`capture` runs the split model (:class:`pipeopt.torch.trace.Traced`) once on the
example inputs and records what every layer receives. :func:`probe` then runs each layer
alone, forward and backward, as a pipeline stage would (inputs that come from other layers
require grad; the model's own inputs do not), and records

* the bytes of every value it receives and returns (``numel * element_size`` of each tensor,
  summed over nested tuples, lists and dicts; non-tensors count 0);
* forward and backward FLOPs (:class:`torch.utils.flop_counter.FlopCounterMode`: matrix
  products, convolutions and attention; element-wise ops, norms and embeddings count 0);
* the activation bytes kept for the backward pass: every distinct storage autograd saves
  during the forward (:func:`torch.autograd.graph.saved_tensors_hooks`), parameters and
  buffers excluded, the layer's own inputs included when autograd keeps them;
* with ``timing``: forward and backward seconds, median of ``repeats`` runs after ``warmup``;
* the split of the backward into the input gradient I and the weight gradient W (zero-bubble
  schedules run them apart; Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024), see
  below.

**The I/W split.** The *full* backward is the one above (:func:`torch.autograd.backward` from
the layer's outputs: gradients of its inputs and of its parameters). The *input-gradient-only*
backward is :func:`torch.autograd.grad` from the same outputs with respect to the layer's
floating inputs that require grad (``retain_graph=True``, as a zero-bubble I step keeps the
graph for its W step); autograd then skips the parameters' gradients (e.g. ``X^T dY`` of a
matrix product). W = full - I, per layer, by one of three rules (:attr:`LayerProbe.w_rule`):

* ``"difference"`` - the layer has trainable parameters and inputs that require grad:
  FLOP ``bwd_w_flop = bwd_flop - bwd_i_flop`` (both counted with FlopCounterMode) and, with
  ``timing``, ``bwd_w_s = bwd_s - bwd_i_s`` (medians of the two timed backwards, each after
  its own forward, in the same rounds) clamped to ``[0, bwd_s]``;
* ``"no-parameters"`` - no parameter requires grad: W = 0;
* ``"no-input-grad"`` - no input requires grad (the first layer, fed by the model's own
  inputs such as token ids): I = 0, W = the whole backward.

On the ``meta`` device (costs estimated from FLOPs) nothing is computed and no memory is
allocated: parameters are replaced by meta tensors of the same shapes through
:func:`torch.func.functional_call`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from .recompute import MODES, checkpointed, selective_saved_bytes
from .trace import Traced


def tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def nbytes(value) -> int:
    """Bytes of the tensors in ``value``: ``sum(t.numel() * t.element_size())``."""
    return sum(t.numel() * t.element_size() for t in tensors(value))


def _map(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple):
        return tuple(_map(v, fn) for v in value)
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


class _Binder:
    """Calls a sub-module on the probe device: the real parameters on ``cpu``, meta tensors of
    the same shapes on ``meta`` (one meta tensor per real tensor, so tied weights stay tied)."""

    def __init__(self, device: str) -> None:
        self.meta = device == "meta"
        self._cache: dict[int, torch.Tensor] = {}

    def _meta_of(self, t: torch.Tensor) -> torch.Tensor:
        if id(t) not in self._cache:
            m = torch.empty_like(t, device="meta")
            self._cache[id(t)] = m.requires_grad_(t.requires_grad) if t.is_floating_point() else m
        return self._cache[id(t)]

    def state(self, module: nn.Module) -> dict:
        """``dict[name, tensor]``: the tensors the module computes with (meta stand-ins on meta)."""
        named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
        return {k: (self._meta_of(v) if self.meta else v) for k, v in named}

    def __call__(self, module: nn.Module, args: tuple, state: dict | None = None):
        if not self.meta:
            return module(*args)
        return functional_call(module, self.state(module) if state is None else state, args)

    def inputs(self, value):
        """``value`` moved to the probe device (meta tensors keep shapes and dtypes)."""
        return _map(value, lambda t: t.to("meta")) if self.meta else value


def capture(traced: Traced, example_inputs: tuple, device: str) -> list[tuple]:
    """Run the split model once (no grad) and return the arguments each layer receives.

    Parameters
    ----------
    traced
        The split model.
    example_inputs
        One microbatch of the model's inputs (a tuple of positional arguments).
    device
        ``"cpu"`` (real tensors) or ``"meta"`` (shapes only).

    Returns
    -------
    list[tuple]
        Per layer (in ``traced.names`` order), its positional arguments, detached.
    """
    binder = _Binder(device)
    seen: dict[int, tuple] = {}
    hooks = []
    for i, sub in enumerate(traced.submods):
        def pre(_mod, args, i=i):
            seen[i] = _map(args, lambda t: t.detach())
        hooks.append(sub.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            binder(traced.top, tuple(binder.inputs(x) for x in example_inputs))
    finally:
        for h in hooks:
            h.remove()
    return [seen[i] for i in range(len(traced.submods))]


@dataclass
class LayerProbe:
    """What :func:`probe` measures for one layer (bytes, FLOP, seconds).

    Attributes
    ----------
    in_bytes
        ``list[int]``: bytes of each argument.
    out_bytes
        Bytes of everything the layer returns.
    flop, bwd_flop
        Forward and backward FLOP (FlopCounterMode).
    act_bytes
        Bytes of the distinct storages autograd saves in the forward (parameters and buffers
        excluded).
    fwd_s, bwd_s
        Median forward and backward seconds (``None`` without timing).
    fwd_samples, bwd_samples
        Every timed run, seconds.
    bwd_i_flop
        FLOP of the input-gradient-only backward as counted (module docstring; 0 if no input
        requires grad; equal to ``bwd_flop`` without parameters).
    w_rule
        How W is obtained: ``"difference"``, ``"no-parameters"`` or ``"no-input-grad"``
        (module docstring).
    bwd_i_s, bwd_w_s
        Median seconds of the input-gradient-only backward (``"difference"`` layers), and the
        weight-gradient seconds W in ``[0, bwd_s]`` by :attr:`w_rule` (``None`` without
        timing).
    bwd_i_samples
        Every timed input-gradient-only run, seconds (``"difference"`` layers).
    recompute_s, selective_s
        With ``timing``: the seconds a recomputation adds to one forward plus backward of the
        layer, ``"full"`` and ``"selective"`` (:mod:`pipeopt.torch.recompute`), the sum of three
        parts timed apart (:attr:`recompute_parts`): the checkpointed forward's excess over the
        plain forward of the same round (``torch.utils.checkpoint``'s own work: its saved-tensor
        hooks, the random-number state it keeps; under ``"selective"`` the policy asked for
        every operator), the rerun itself, timed around the layer's call that the backward
        makes (the forward again, up to torch's early stop; under ``"selective"`` only the
        operators the policy drops), and the checkpointed backward's excess beyond the rerun over
        the plain backward (unpacking the re-created tensors). Medians over the rounds; the first
        and the last at least 0 (on a layer whose backward takes far longer than its forward, e.g.
        a large gradient accumulation, the last difference is mostly noise and its median may
        fall below 0). ``None`` without timing, or where torch's
        checkpoint fails on the layer (:attr:`recompute_fails`). (The difference of the whole
        checkpointed forward + backward and the plain one, timed as one before, lost the rerun in
        the backward's noise on large layers: 1.6-6.8 ms for Hugging Face GPT-2's blocks, whose
        rerun alone takes 6.7-7.4 ms.)
    recompute_samples, selective_samples
        Per round, the sum of the three parts (each difference at least 0), seconds.
    recompute_parts
        ``{mode: {"forward": seconds, "rerun": seconds, "backward": seconds}}``: the three parts
        (medians, as summed into :attr:`recompute_s` / :attr:`selective_s`).
    recompute_fails
        ``{mode: error}``: the modes whose checkpointed backward raised (a layer that starts in
        place, ``ReLU(inplace=True)``, changes the input the checkpoint keeps for its rerun).
    selective_bytes
        Bytes the selective policy saves in the layer's forward
        (:func:`pipeopt.torch.recompute.selective_saved_bytes`; its inputs not included).
    """

    in_bytes: list
    out_bytes: int
    flop: float
    bwd_flop: float
    act_bytes: int
    fwd_s: float | None = None
    bwd_s: float | None = None
    fwd_samples: list = field(default_factory=list)
    bwd_samples: list = field(default_factory=list)
    bwd_i_flop: float = 0.0
    w_rule: str = "difference"
    bwd_i_s: float | None = None
    bwd_w_s: float | None = None
    bwd_i_samples: list = field(default_factory=list)
    recompute_s: float | None = None
    selective_s: float | None = None
    recompute_samples: list = field(default_factory=list)
    selective_samples: list = field(default_factory=list)
    selective_bytes: int = 0
    recompute_fails: dict = field(default_factory=dict)
    recompute_parts: dict = field(default_factory=dict)

    @property
    def bwd_w_flop(self) -> float:
        """FLOP of the weight gradient W, in ``[0, bwd_flop]``: ``bwd_flop - bwd_i_flop``
        (``"difference"``), 0 (``"no-parameters"``) or ``bwd_flop`` (``"no-input-grad"``)."""
        if self.w_rule == "no-parameters":
            return 0.0
        if self.w_rule == "no-input-grad":
            return self.bwd_flop
        return min(max(self.bwd_flop - self.bwd_i_flop, 0.0), self.bwd_flop)

    def _split_times(self) -> None:
        """Set ``bwd_w_s`` (and ``bwd_i_s``) from the timed medians by :attr:`w_rule`."""
        if self.w_rule == "no-parameters":
            self.bwd_w_s = 0.0
        elif self.w_rule == "no-input-grad":
            self.bwd_w_s = self.bwd_s
        else:
            self.bwd_i_s = statistics.median(self.bwd_i_samples)
            self.bwd_w_s = min(max(self.bwd_s - self.bwd_i_s, 0.0), self.bwd_s)


class _Inputs(tuple):
    """A layer's prepared arguments (:func:`_prepare`) and ``leaves``, the fresh leaf tensors
    their gradients go to."""

    leaves: list


def _prepare(args: tuple, sources: list) -> _Inputs:
    """Fresh inputs: a floating tensor that comes from another layer is a copy of a fresh leaf
    that requires grad (``.leaves``), so that a layer which starts in place (torchvision's
    ``ReLU(inplace=True)`` after a stage's first cut) changes the copy, as it changes the
    previous layer's output in the whole model, and the leaf gets the input gradient. The copy
    is made here, outside any timed or tracked region."""
    leaves: list = []

    def fresh(t, grad):
        t = t.detach()
        if not (grad and t.is_floating_point()):
            return t
        leaves.append(t.requires_grad_(True))
        return t.clone()
    out = _Inputs(_map(a, lambda t, g=src is not None: fresh(t, g)) for a, src in zip(args, sources, strict=True))
    out.leaves = leaves
    return out


def _grad_outputs(out) -> list[torch.Tensor]:
    """The floating outputs that require grad (the ones a backward starts from)."""
    return [t for t in tensors(out) if t.requires_grad and t.is_floating_point()]


def _grad_inputs(args: _Inputs) -> list[torch.Tensor]:
    """The leaves of the layer's inputs that require grad (:func:`_prepare`: floating, from
    another layer)."""
    return list(args.leaves)


def _backward(out) -> None:
    """Backward from every floating output that requires grad, with gradients of ones: the
    full backward (gradients of the inputs and of the parameters)."""
    outs = _grad_outputs(out)
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def _input_backward(out, args) -> None:
    """The input-gradient-only backward: :func:`torch.autograd.grad` from the same outputs
    (gradients of ones) with respect to the inputs ``args`` that require grad only; the graph
    is retained (a zero-bubble I step keeps it for W) and ``.grad`` is left untouched."""
    outs, ins = _grad_outputs(out), _grad_inputs(args)
    if outs and ins:
        torch.autograd.grad(outs, ins, [torch.ones_like(t) for t in outs], retain_graph=True, allow_unused=True)


def _w_rule(state: dict, args) -> str:
    """:attr:`LayerProbe.w_rule` of a layer with tensors ``state`` and prepared inputs ``args``."""
    if not any(t.requires_grad for t in state.values()):
        return "no-parameters"
    return "difference" if _grad_inputs(args) else "no-input-grad"


def probe(traced: Traced, inputs: list, device: str, *, timing: bool = False, repeats: int = 10,
          warmup: int = 3, microbatches: int = 1) -> list[LayerProbe]:
    """Run every layer alone, forward and backward, and measure it.

    Parameters
    ----------
    traced
        The split model.
    inputs
        Per layer, its arguments (:func:`capture`).
    device
        ``"cpu"`` or ``"meta"``.
    timing
        Also time forward and backward (``cpu`` only): ``warmup`` untimed runs, then the
        median of ``repeats`` timed runs (:func:`time.perf_counter`), in rounds that run every
        layer once. Gradients are reset outside the timed region every ``microbatches`` rounds
        and accumulate in between; ``bwd_s`` weighs the two kinds of backward as an iteration
        of M microbatches does (:func:`accumulated_backward`). Layers whose W is a difference
        also time the input-gradient-only backward in the same rounds, after a second, untimed
        forward (it leaves ``.grad`` untouched).
    repeats, warmup
        Runs, positive and non-negative.
    microbatches
        M, the microbatches over which a training iteration accumulates gradients (1: every
        backward allocates them).

    Returns
    -------
    list[LayerProbe]
        In ``traced.names`` order.
    """
    binder = _Binder(device)
    out: list[LayerProbe] = []
    for sub, args, sources in zip(traced.submods, inputs, traced.sources, strict=True):
        state = binder.state(sub)
        held = {t.untyped_storage()._cdata for t in state.values()}
        saved: dict[int, int] = {}

        def pack(t, saved=saved, held=held):
            st = t.untyped_storage()
            if st._cdata not in held:
                saved[st._cdata] = st.nbytes()
            return t

        x = _prepare(args, sources)
        with FlopCounterMode(display=False) as fwd_count, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = binder(sub, x, state)
        with FlopCounterMode(display=False) as in_count:
            _input_backward(y, x)
        with FlopCounterMode(display=False) as bwd_count:
            _backward(y)
        rule = _w_rule(state, x)
        sel = selective_saved_bytes(lambda *a: binder(sub, a, state), _prepare(args, sources)) if device == "cpu" else 0
        rec = LayerProbe(
            in_bytes=[nbytes(a) for a in args],
            out_bytes=nbytes(y),
            flop=float(fwd_count.get_total_flops()),
            bwd_flop=float(bwd_count.get_total_flops()),
            act_bytes=sum(saved.values()),
            bwd_i_flop=float(in_count.get_total_flops()),
            w_rule=rule,
            selective_bytes=int(sel),
        )
        del x, y
        out.append(rec)
    if timing:
        _time(traced, inputs, out, repeats, warmup, microbatches)
    return out


def _time(traced: Traced, inputs: list, records: list, repeats: int, warmup: int, microbatches: int = 1) -> None:
    """Time every layer's forward and backward in rounds: each round runs every layer once,
    so that a burst of load from other processes hits all layers alike instead of all the
    runs of one layer. Gradients are reset every ``microbatches`` rounds and accumulate in
    between, as in a training iteration of M microbatches (:func:`accumulated_backward`). A
    ``"difference"`` layer then runs a second forward (untimed) and its input-gradient-only
    backward (timed), so that both backwards follow their own forward.
    Then the layer runs forward and backward under each recomputation mode: the checkpointed
    forward's excess over the round's plain forward, and the rerun (the layer's call inside the
    backward, timed around it), are the two parts of a sample of
    :attr:`LayerProbe.recompute_s` / :attr:`LayerProbe.selective_s`."""
    params = [list(sub.parameters()) for sub in traced.submods]
    calls: list = []  # durations of the checkpointed layer's calls in the current run: forward, then rerun

    def timed_call(sub):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return sub(*a, **k)
            finally:
                calls.append(time.perf_counter() - t)
        return call

    redo = [{m: checkpointed(timed_call(sub), m) for m in MODES} for sub in traced.submods]
    parts = [{m: ([], [], []) for m in MODES} for _ in traced.submods]
    every = max(int(microbatches), 1)
    fresh_bwd: list[list] = [[] for _ in records]  # backward samples that allocated the gradients
    for r in range(warmup + repeats):
        fresh = r % every == 0  # as a training iteration: gradients reset, then accumulating
        for sub, args, sources, ps, rec, rc, first, part in zip(traced.submods, inputs, traced.sources, params,
                                                                records, redo, fresh_bwd, parts, strict=True):
            if fresh:
                for p in ps:
                    p.grad = None
            x = _prepare(args, sources)
            t0 = time.perf_counter()
            y = sub(*x)
            t1 = time.perf_counter()
            _backward(y)
            t2 = time.perf_counter()
            if r >= warmup:
                rec.fwd_samples.append(t1 - t0)
                (first if fresh else rec.bwd_samples).append(t2 - t1)
            del x, y
            for mode in MODES:
                if mode in rec.recompute_fails:
                    continue
                if fresh:
                    for p in ps:
                        p.grad = None
                x = _prepare(args, sources)
                calls.clear()
                t3 = time.perf_counter()
                try:
                    y = rc[mode](*x)
                    t4 = time.perf_counter()
                    _backward(y)
                except RuntimeError as exc:  # e.g. a layer that starts in place: its saved input changed
                    rec.recompute_fails[mode] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                    continue
                t5 = time.perf_counter()
                if r >= warmup:
                    rerun = sum(calls[1:])  # no rerun (nothing saved, e.g. no input needs a gradient): 0
                    part[mode][0].append((t4 - t3) - (t1 - t0))
                    part[mode][1].append(rerun)
                    part[mode][2].append((t5 - t4) - rerun - (t2 - t1))
                del x, y
            if rec.w_rule == "difference":
                x = _prepare(args, sources)
                y = sub(*x)
                t3 = time.perf_counter()
                _input_backward(y, x)
                t4 = time.perf_counter()
                if r >= warmup:
                    rec.bwd_i_samples.append(t4 - t3)
                del x, y
    for rec, first, part in zip(records, fresh_bwd, parts, strict=True):
        rec.fwd_s = statistics.median(rec.fwd_samples)
        rec.bwd_s = accumulated_backward(first, rec.bwd_samples, every)
        rec.bwd_samples = first + rec.bwd_samples
        for mode in MODES:
            if mode not in rec.recompute_fails and part[mode][0]:
                rec.recompute_parts[mode] = {"forward": max(statistics.median(part[mode][0]), 0.0),
                                             "rerun": statistics.median(part[mode][1]),
                                             "backward": max(statistics.median(part[mode][2]), 0.0)}
                (rec.recompute_samples if mode == "full" else rec.selective_samples)[:] = [
                    max(a, 0.0) + b + max(c, 0.0) for a, b, c in zip(*part[mode], strict=True)]
        full, sel = rec.recompute_parts.get("full"), rec.recompute_parts.get("selective")
        rec.recompute_s = None if full is None else sum(full.values())
        rec.selective_s = None if sel is None else sum(sel.values())
        rec._split_times()


def accumulated_backward(fresh: list, accumulating: list, microbatches: int) -> float:
    """Seconds of a layer's backward per microbatch of an iteration of ``microbatches``: the
    first microbatch's backward allocates the parameters' gradients (``fresh`` samples), the
    other M - 1 add into them (``accumulating`` samples: autograd's ``grad += new``, a read
    and a write of every gradient, which on GPT-2's 154 MB tied embedding costs more than the
    matrix products); ``(median(fresh) + (M - 1) median(accumulating)) / M``, the median of
    whichever list is given when the other is empty.

    Raises
    ------
    ValueError
        If both lists are empty.
    """
    if not fresh and not accumulating:
        raise ValueError("no backward samples")
    m = max(int(microbatches), 1)
    a = statistics.median(fresh) if fresh else statistics.median(accumulating)
    b = statistics.median(accumulating) if accumulating else a
    return (a + (m - 1) * b) / m


def gradient_sum_seconds(shape, dtype, *, repeats: int, warmup: int) -> float:
    """Median seconds of one out-of-place sum of two tensors of ``shape`` and ``dtype`` on the
    CPU, each into a fresh tensor (``repeats`` runs after ``warmup``, with the threads set by
    the caller): what autograd pays to sum two gradient contributions of a tied parameter used
    by two modules of one stage before accumulating them (``torch.autograd``'s input buffer adds
    them out of place), the graph attribute ``tied[i]["sum_s"]`` of :func:`pipeopt.torch.from_torch`
    (:func:`pipeopt.cost.rules.tie_sum_time`). The fresh tensor's pages are part of the cost."""
    a = torch.randn(tuple(shape)).to(dtype)
    b = torch.randn(tuple(shape)).to(dtype)
    times = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        c = a + b
        elapsed = time.perf_counter() - t0
        del c
        if i >= warmup:
            times.append(elapsed)
    return float(statistics.median(times))


def whole_model_time(module: nn.Module, example_inputs: tuple, *, repeats: int, warmup: int) -> float:
    """Median seconds of one forward plus backward of the whole model (backward from its
    floating outputs with gradients of ones), the check on the per-layer sum."""
    return whole_model_passes(module, example_inputs, repeats=repeats, warmup=warmup)[0]


def runtime_module(module: nn.Module, example_inputs: tuple) -> tuple[nn.Module, str]:
    """The whole model as ``pipeopt run`` executes it: torch.distributed.pipelining's
    ``pipeline()`` traces it (``torch.export``: ATen operators, which run slower than the eager
    modules the layers are timed as) into one stage, whose module is returned; where
    ``pipeline()`` cannot trace the model, the model itself.

    Returns
    -------
    (module, how)
        ``how`` names which was returned (and why the eager model, if so).
    """
    import warnings

    try:
        from torch.distributed.pipelining import pipeline

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stage = generated_code(pipeline(module, mb_args=tuple(example_inputs)).get_stage_module(0))
            with torch.no_grad():  # the traced stage must take the model's own inputs (T5's None
                stage(*example_inputs)  # positional argument is dropped by the trace: it does not)
        return stage, "torch.distributed.pipelining.pipeline() (one stage)"
    except Exception as exc:  # noqa: BLE001 - any tracing failure: fall back to the eager model
        reason = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
        return module, f"the eager model (pipeline() could not trace it: {type(exc).__name__}: {reason})"


def generated_code(module: nn.Module) -> nn.Module:
    """Make the ``InterpreterModule`` objects of a stage module that torch's ``pipeline()``
    built (``torch.export``'s unflatten: one per submodule of the model) run their graph's
    generated Python code instead of ``torch.fx.Interpreter`` node by node; returns ``module``.

    The interpreter is torch 2.13's default (``torch.export.unflatten.RUN_WITH_INTERPRETER``,
    copied into each module's ``_run_with_interpreter``; the generated code is what the module
    runs under ``torch.compile``): the same operators in the same order. Measured on the shipped
    ``gpt``'s block on one CPU thread: the interpreter's forward 1.55-1.62 ms, the generated
    code's 0.71-0.75 ms, the eager block's 0.71-0.72 ms; a recomputed block paid the
    interpreter on its rerun too. ``pipeopt run``, the memory measurement and the profile's
    :func:`runtime_module` all run the generated code."""
    for sub in module.modules():
        if hasattr(sub, "_run_with_interpreter"):
            sub._run_with_interpreter = False
    return module


def whole_model_passes(module: nn.Module, example_inputs: tuple, *, repeats: int,
                       warmup: int, microbatches: int = 1) -> tuple[float, float]:
    """``(forward + backward, forward)``: median seconds of one forward plus backward of the
    whole model (backward from its floating outputs with gradients of ones), and median
    seconds of its forward alone, from the same runs. The gradients are reset every
    ``microbatches`` runs and accumulate in between, as a training iteration of M microbatches
    accumulates them (``pipeopt run``). What the whole run takes beyond the sums of the layers'
    own times is the runtime's overhead per microbatch (:func:`pipeopt.cost.rules.stage_overhead`)."""
    samples, forward = [], []
    params = list(module.parameters())
    for r in range(warmup + repeats):
        if r % max(int(microbatches), 1) == 0:
            for p in params:
                p.grad = None
        t0 = time.perf_counter()
        out = module(*example_inputs)
        t1 = time.perf_counter()
        _backward(out)
        del out
        if r >= warmup:
            samples.append(time.perf_counter() - t0)
            forward.append(t1 - t0)
    return statistics.median(samples), statistics.median(forward)
