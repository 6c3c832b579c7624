"""``from_torch``: the layer graph of an ``nn.Module`` with measured or estimated costs, as a
pipeopt :class:`~pipeopt.Instance`.

The graph (:mod:`pipeopt.torch.trace`): one node per layer at the chosen granularity, named by
the module's FQN (attribute ``fqn`` holds the same string); an edge wherever a layer reads a
value another produced, with ``bytes`` = the bytes of the tensors it reads
(``numel * element_size`` of the traced tensors; a tensor read by several operations of one
layer counts once).

Node attributes (units as in docs/cost-model.md)
---------------------------------------
``fwd``, ``bwd``
    seconds per microbatch on one unit of each resource kind. *Measured*: on this machine's
    CPU with ``threads`` threads (kind ``"cpu"``, one unit = this CPU as profiled), median
    of ``repeats`` runs after ``warmup``, each layer run alone on the inputs it received in a
    run of the whole model (:mod:`pipeopt.torch.probe`; the backward with gradients
    accumulating over M microbatches, :func:`pipeopt.torch.probe.accumulated_backward`), then
    times the share of the runtime's overhead that grows with the layers' times
    (:func:`pipeopt.torch.overhead.fit`; the factors are ``g.graph["torch"]["runtime_scale"]``,
    the raw sum ``sum_of_layers_s``; the per-stage part is the graph attribute
    ``stage_overhead``). *Estimated*: FLOPs counted on the
    ``meta`` device (:class:`torch.utils.flop_counter.FlopCounterMode`, forward and backward
    separately) divided by the catalogue's reference unit and efficiency of each kind of the
    device, as the model zoo does (:mod:`pipeopt.zoo.devices`: 1 unit = 1 TFLOP/s of peak;
    ``fwd[k] = FLOP / (1e12 * forward_efficiency[k])``, ``bwd[k] = backward FLOP / (1e12 *
    backward_efficiency[k])``). Operations FlopCounterMode does not count (element-wise,
    normalisation, embedding look-ups) take no time in the estimate.
``out_bytes``
    bytes of everything the layer returns.
``act_bytes``
    activation bytes kept for the backward pass: the distinct storages autograd saves during
    the layer's forward (saved-tensor hooks), parameters and buffers excluded.
``bwd_temp_bytes`` (measured costs)
    the peak bytes the layer's backward allocates on top of what it held (its output's
    gradient, its inputs' gradients, temporaries), measured with MemTracker
    (:func:`pipeopt.torch.memory.backward_temporaries`); with it the graph attribute
    ``transient_memory`` makes a stage's memory add its backward's excess and the outputs it
    keeps (:mod:`pipeopt.cost.transient`). Edge attribute ``saved_twice_bytes``: a tensor both
    layers save (the producer its output, the consumer its input), counted once in a stage
    holding both (:func:`pipeopt.torch.memory.saved_twice`).
``recompute_fwd`` (measured costs)
    ``{"cpu": seconds}``: what recomputing the layer (``"full"``: ``torch.utils.checkpoint``
    of its forward, as ``pipeopt run`` applies it) adds to its forward plus backward, measured:
    the checkpointed forward's excess over the plain one plus the rerun, each timed apart
    (:attr:`pipeopt.torch.probe.LayerProbe.recompute_s`; the rerun stops once it has re-created
    the last tensor the backward needs, torch's early stop, so a linear layer that saves only its
    input reruns almost nothing); :func:`pipeopt.cost.rules.recompute_terms` charges it instead
    of ``fwd``.
``recompute_parts`` (measured costs; a record, the cost model does not read it)
    ``{mode: {"forward": seconds, "rerun": seconds}}``: the two parts of ``recompute_fwd`` and
    of ``selective["fwd"]`` (:attr:`pipeopt.torch.probe.LayerProbe.recompute_parts`), unscaled.
``selective`` (measured costs)
    ``{"act_bytes": bytes, "fwd": {"cpu": seconds}}``: the layer recomputed under torchtitan's
    per-operator policy (:mod:`pipeopt.torch.recompute`): the bytes it keeps per microbatch (its
    inputs, the bytes on its in-edges, plus the outputs of the operators the policy saves; at
    most ``act_bytes``) and the seconds it adds, measured as for ``recompute_fwd``. A layer on
    which torch's checkpoint fails (one that starts in place and so changes the input the
    checkpoint keeps) has neither attribute.
``param_bytes``
    weights, gradients and optimizer state plus buffers (:mod:`pipeopt.torch.state`).
``weight_bytes``, ``grad_bytes``, ``optimizer_bytes``, ``buffer_bytes``
    the parts (``weight_bytes = sum(p.numel() * p.element_size())`` over the layer's own
    parameters, as the module holds them; a tied parameter is in no layer's parts).
``bwd_w``
    the weight-gradient part W of ``bwd`` per kind (``0 <= bwd_w <= bwd``; the input gradient
    I = ``bwd - bwd_w``), by the rules of :mod:`pipeopt.torch.probe`: W = 0 for a layer
    without trainable parameters, W = ``bwd`` for a layer none of whose inputs requires grad
    (the first layer, fed by token ids or images), otherwise W = full backward -
    input-gradient-only backward (:func:`torch.autograd.grad` w.r.t. the layer's inputs).
    *Measured*: the difference of the two timed medians, clamped to ``[0, bwd]``.
    *Estimated*: ``bwd`` shared in the ratio of the FLOPs counted for the two backwards,
    ``bwd_w[k] = bwd[k] * bwd_w_flop / bwd_flop`` (0 when ``bwd_flop`` is 0): the same
    efficiency is assumed for I and W.
``flop``, ``bwd_flop``, ``bwd_w_flop``, ``op``, ``fqn``
    forward, backward and weight-gradient FLOP per microbatch, the module's class name, its
    FQN.

Tied parameters (one ``nn.Parameter`` used by the modules of two or more layers, e.g. GPT-2's LM
head and token embedding) go to ``g.graph["tied"]``: ``[{"name", "aliases", "bytes",
"state_bytes", "layers"}]``, their bytes in no layer's ``param_bytes``; the cost model charges
``state_bytes`` on every stage that holds one of ``layers`` and an all-reduce of ``bytes``
between those stages per iteration (:mod:`pipeopt.cost.ties`, docs/cost-model.md).

Provenance goes to ``g.graph["torch"]`` (model class, granularity as resolved, container or
``containers``, ``tracing``: ``"torch.fx"`` or ``"module hooks"``, costs
``"measured"`` or ``"estimated:<device>"``, torch version, inputs, threads, repeats, the whole
model's measured time next to the sum of the layers') and to ``Instance.assumptions``, which
pipeopt prints with every result.
"""

from __future__ import annotations

import math
import numbers
import os
import platform

import networkx as nx
import torch
from torch import nn

from ..cluster import Cluster
from ..errors import InvalidProblemError, PipeoptError
from ..instance import Instance, Settings
from ..units import DEFAULT_MICROBATCHES, MAX_DEVICES, as_bandwidth
from ..zoo.build import cluster as catalogue_cluster
from ..zoo.devices import KINDS, PRECISIONS, REFERENCE_FLOPS
from ..zoo.devices import device as catalogue_device
from .memory import backward_temporaries, saved_twice
from .overhead import fit, split_passes
from .probe import gradient_sum_seconds, probe, runtime_module, whole_model_passes
from .state import OPTIMIZERS, check_optimizer, state_bytes
from .hooks import inputs_of, layer_graph, no_cache
from .trace import parse_granularity, resolve

COSTS = ("measured", "estimated")
"""Accepted ``costs``."""

CPU_BANDWIDTH = 1e9
"""Default bytes/s between two CPU workers (measured costs): torch.distributed's ``gloo``
over loopback between two processes (one thread each) on the 2-core machine this project is
developed on moved 4-16 MiB tensors at 0.9-2.0 GB/s (median one-way time of 10 round trips,
machine shared with other jobs); a 64 KiB message took about 0.3 ms (0.2 GB/s effective): the
latency, which the bandwidth-only cost model does not see. Measure your own with
:func:`pipeopt.torch.network.measure_bandwidth` (``pipeopt profile --bandwidth measure``)."""

DEFAULT_LINK = "ib-hdr"
"""Default link between catalogue devices (estimated costs), as the model zoo."""

DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3


def _count(value, what: str, low: int, high: int = 10**6) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not low <= value <= high:
        raise InvalidProblemError(f"{what} must be an integer in {low}..{high}, got {value!r}")
    return int(value)


def _check_inputs(module, example_inputs) -> tuple:
    if not isinstance(module, nn.Module):
        raise InvalidProblemError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InvalidProblemError(
            f"example_inputs must be a tuple of the forward's positional arguments, got {type(example_inputs).__name__}"
        )
    return tuple(example_inputs)


def _precision(module: nn.Module, precision) -> str:
    if precision is None:
        dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
        return "fp16" if dtypes and dtypes <= {torch.float16, torch.bfloat16} else "fp32"
    if precision not in PRECISIONS:
        raise InvalidProblemError(f"unknown precision {precision!r}; choose from {sorted(PRECISIONS)}")
    return precision


def _parameters(traced, module: nn.Module | None = None) -> tuple[list[dict], list[dict]]:
    """Per layer: its own parameters and buffers; and the tied parameters.

    A parameter whose object is used by the modules of two or more layers (tied weights:
    GPT-2's ``lm_head.weight is transformer.wte.weight``) is a *tie*: it is counted in no
    layer's ``weight_bytes`` and listed once, with the layers that use it
    (``[{"name", "aliases", "weight_bytes", "numel", "shape", "dtype", "layers"}]``, names from
    ``module.named_parameters(remove_duplicate=False)``). A buffer used by several layers is
    charged to the first."""
    users: dict[int, list[int]] = {}
    objects: dict[int, nn.Parameter] = {}
    for i, sub in enumerate(traced.submods):
        for p in sub.parameters():
            users.setdefault(id(p), []).append(i)
            objects[id(p)] = p
    tied_ids = [k for k, v in users.items() if len(set(v)) > 1]
    aliases: dict[int, list[str]] = {}
    if module is not None:
        for fqn, p in module.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(fqn)
    owned: set[int] = set(tied_ids)
    out = []
    for sub in traced.submods:
        mine = []
        for p in sub.parameters():
            if id(p) not in owned:
                mine.append(p)
            owned.add(id(p))
        buffers = [b for b in sub.buffers() if id(b) not in owned]
        owned.update(id(b) for b in buffers)
        out.append({
            "weight_bytes": sum(p.numel() * p.element_size() for p in mine),
            "numel": sum(p.numel() for p in mine),
            "buffer_bytes": sum(b.numel() * b.element_size() for b in buffers),
        })
    ties = []
    for k in tied_ids:
        p, layers = objects[k], sorted(set(users[k]))
        names = aliases.get(k) or [f"{traced.names[layers[0]]}.<tied {len(ties)}>"]
        ties.append({"name": names[0], "aliases": names[1:], "weight_bytes": p.numel() * p.element_size(),
                     "numel": p.numel(), "shape": tuple(p.shape), "dtype": p.dtype,
                     "layers": [traced.names[i] for i in layers]})
    return out, ties


def _snapshot(module: nn.Module) -> tuple:
    """Buffers and gradients before profiling (the runs update batch-norm statistics)."""
    return ([(b, b.detach().clone()) for b in module.buffers()], [(p, p.grad) for p in module.parameters()])


def _restore(snapshot: tuple) -> None:
    buffers, grads = snapshot
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    for p, g in grads:
        p.grad = g


def from_torch(
    module: nn.Module,
    example_inputs,
    *,
    granularity: str = "auto",
    costs: str = "measured",
    device: str | None = None,
    devices: int = 2,
    bandwidth=None,
    memory=None,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    threads: int = 1,
    optimizer: str = "adam-fp32",
    precision: str | None = None,
    microbatches: int | None = None,
    name: str | None = None,
    tracing: str = "auto",
) -> Instance:
    """The pipeopt instance of a PyTorch model: its layer graph, costs and a cluster.

    Parameters
    ----------
    module
        The model (any ``nn.Module``: traced with torch.fx, or run once with module hooks
        where fx cannot trace it, e.g. Hugging Face transformers' models). It is run, not
        changed: batch-norm statistics, gradients and ``config.use_cache`` are restored
        afterwards.
    example_inputs
        One microbatch: the forward's positional arguments (a tuple, or one tensor). Its
        batch size is the microbatch every cost refers to.
    granularity
        ``"auto"`` (default: the block containers found in the model,
        :func:`pipeopt.torch.trace.find_containers`), ``"container:NAME"`` (or several names,
        comma-separated), ``"children"`` or ``"leaves"`` (:mod:`pipeopt.torch.trace`).
    costs
        ``"measured"`` (seconds on this machine's CPU, kind ``"cpu"``) or ``"estimated"``
        (FLOPs on the meta device x a catalogue device's peak and efficiency).
    device
        Estimated costs: a device of :data:`pipeopt.zoo.devices.DEVICES` (required).
        Measured costs: must be ``None`` or ``"cpu"``.
    devices
        S, the number of identical devices of the cluster (default 2).
    bandwidth
        Bytes/s between workers (a number, a unit string ``"10Gbps"``, or for estimated costs
        a link name of :data:`pipeopt.zoo.devices.LINKS`). Default: :data:`CPU_BANDWIDTH`
        (measured) or :data:`DEFAULT_LINK` (estimated).
    memory
        Bytes per device (a number or ``"16GiB"``). Default: no limit (measured), the
        catalogue's (estimated).
    repeats, warmup
        Timed and untimed runs per layer (measured costs); a layer whose W is measured also
        runs its input-gradient-only backward (after its own forward) that many times.
    threads
        Torch intra-op threads while measuring (default 1: one thread per pipeline stage, as
        ``pipeopt run`` runs them); restored afterwards.
    optimizer
        Training state folded into ``param_bytes``: ``"adam-fp32"``, ``"adam-mixed"``,
        ``"sgd"`` or ``"weights"`` (:mod:`pipeopt.torch.state`).
    precision
        Peak rates of the catalogue device (estimated costs): ``"fp32"`` or ``"fp16"``;
        default from the module's parameter dtype. Tensor sizes are always those traced.
    microbatches
        M per iteration (default :data:`pipeopt.units.DEFAULT_MICROBATCHES`, the one rule).
    name
        Instance label (default ``"{class}-{measured|device}-x{devices}"``, lower case).
    tracing
        How the layer graph is obtained: ``"auto"`` (torch.fx, module hooks where fx cannot
        trace), ``"fx"`` or ``"hooks"`` (:func:`pipeopt.torch.hooks.layer_graph`).

    Returns
    -------
    Instance
        Graph attributes ``torch`` (provenance) and ``source``; assumptions listed.

    Raises
    ------
    InvalidProblemError
        Unknown granularity, costs, optimizer or precision; container not found; a device
        given for measured costs or missing for estimated costs; a count out of range; bad
        example inputs.
    InvalidGraphError
        If neither torch.fx nor module hooks give the layers at that granularity (``tracing``
        ``"fx"``: if fx cannot trace), or the layers form a cycle.
    InvalidClusterError
        Unknown catalogue device or link, an invalid bandwidth or memory.

    Examples
    --------
    >>> from pipeopt.torch import from_torch, models  # doctest: +SKIP
    >>> inst = from_torch(*models.gpt(), costs="estimated", device="a100-40gb")  # doctest: +SKIP
    >>> [n for n in inst.graph][:3]  # doctest: +SKIP
    ['tok_emb', 'pos_emb', 'layers.0']
    """
    example_inputs = _check_inputs(module, example_inputs)
    gran = parse_granularity(granularity)
    if costs not in COSTS:
        raise InvalidProblemError(f"unknown costs {costs!r}; choose 'measured' (this CPU) or 'estimated' (a device)")
    optimizer = check_optimizer(optimizer)
    devices = _count(devices, "devices", 1, MAX_DEVICES)
    repeats = _count(repeats, "repeats", 1)
    warmup = _count(warmup, "warmup", 0)
    threads = _count(threads, "threads", 1, 1024)
    if costs == "measured" and device not in (None, "cpu"):
        raise InvalidProblemError(
            f"measured costs are times on this machine's CPU; device {device!r} needs costs='estimated'"
        )
    spec = None
    if costs == "estimated":
        if device is None:
            raise InvalidProblemError("estimated costs need a catalogue device, e.g. device='a100-40gb'")
        spec = catalogue_device(device)
    precision = _precision(module, precision)
    settings = Settings(microbatches=DEFAULT_MICROBATCHES if microbatches is None else microbatches)

    gran = resolve(module, gran)
    probe_device = "cpu" if costs == "measured" else "meta"
    threads_before = torch.get_num_threads()
    snapshot = _snapshot(module)
    whole = None
    cache = no_cache(module)
    try:
        torch.set_num_threads(threads)
        traced = _run(module, "the model", lambda: layer_graph(module, gran, example_inputs, tracing), "cpu")
        inputs = _run(module, "the split model", lambda: inputs_of(traced, example_inputs, probe_device),
                      probe_device)
        probes = _run(module, "its layers", lambda: probe(traced, inputs, probe_device, timing=costs == "measured",
                                                          repeats=repeats, warmup=warmup,
                                                          microbatches=settings.microbatches), probe_device)
        temps = None
        if costs == "measured":  # the backward's temporaries, measured with MemTracker (pipeopt.torch.memory)
            temps = _run(module, "its layers' backward", lambda: backward_temporaries(traced, inputs), "cpu")
            twice = _run(module, "its layers' saved tensors", lambda: saved_twice(traced, inputs), "cpu")
        if costs == "measured":
            whole, whole_forward = whole_model_passes(module, example_inputs, repeats=repeats, warmup=warmup,
                                                      microbatches=settings.microbatches)
            # the overhead: the whole model as the runtime runs it (pipeline()'s traced stage)
            run_module, run_by = runtime_module(module, example_inputs)
            run_whole, run_forward = (whole, whole_forward) if run_module is module else whole_model_passes(
                run_module, example_inputs, repeats=repeats, warmup=warmup, microbatches=settings.microbatches)
            # the overhead one stage pays: two stages of pipeline()'s split, each timed alone
            split = split_passes(module, example_inputs, traced.names, repeats=repeats, warmup=warmup,
                                 microbatches=settings.microbatches, whole=run_module)
    finally:
        torch.set_num_threads(threads_before)
        _restore(snapshot)
        cache()

    if costs == "measured":
        bw = as_bandwidth(CPU_BANDWIDTH if bandwidth is None else bandwidth)
        cl = Cluster.homogeneous(devices, kind="cpu", units=1.0, memory=math.inf if memory is None else memory,
                                 bandwidth=bw, prefix="cpu")
    else:
        cl = catalogue_cluster(device, devices, bandwidth=DEFAULT_LINK if bandwidth is None else bandwidth,
                               precision=precision, memory=memory)

    params, ties = _parameters(traced, module)
    if costs == "measured" and ties:  # a stage holding two of a tie's layers sums their gradients: timed here
        torch.set_num_threads(threads)
        try:
            for t in ties:
                t["sum_s"] = gradient_sum_seconds(t["shape"], t["dtype"], repeats=repeats, warmup=warmup)
        finally:
            torch.set_num_threads(threads_before)
    g = _graph(traced, probes, params, costs, spec, precision, optimizer, cl.kinds)
    _record_ties(g, ties, optimizer)
    if costs == "measured":
        _record_recompute(g, traced, probes)
    _record_transient(g, traced, temps, twice if temps is not None else {})
    label = "measured" if costs == "measured" else device
    g.graph["torch"] = {
        "model": type(module).__name__,
        "granularity": gran.text,
        "container": gran.container if len(gran.containers) == 1 else None,
        "containers": list(gran.containers),
        "tracing": traced.method,
        "costs": "measured" if costs == "measured" else f"estimated:{device}",
        "torch_version": torch.__version__,
        "example_inputs": [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
                           if isinstance(t, torch.Tensor) else {"value": repr(t)[:80]} for t in example_inputs],
        "optimizer": optimizer,
        "precision": precision,
        "input_readers": list(traced.input_readers),
        "graph_outputs": [traced.names[i] for i in traced.graph_outputs],
        "unused_modules": list(traced.unused),
        "weight_split": _weight_split(probes, traced),
        **({
            "threads": threads,
            "repeats": repeats,
            "warmup": warmup,
            "machine": _machine(),
            "whole_model_s": whole,
            "sum_of_layers_s": sum(p.fwd_s + p.bwd_s for p in probes),
            "runtime_model_s": run_whole,
            "split_stages_s": None if split is None else {k: split[k] for k in ("split", "total", "forward",
                                                                                  "whole_total", "whole_forward")},
            "runtime_model": run_by,
        } if costs == "measured" else {}),
    }
    if costs == "measured":
        whole_over = stage_overhead(run_whole, run_forward, probes)
        fitted = None
        if split is not None:  # a constant per stage and a share proportional to the layers (overhead.fit)
            tot = {n: p.fwd_s + p.bwd_s for n, p in zip(traced.names, probes, strict=True)}
            fwd = {n: p.fwd_s for n, p in zip(traced.names, probes, strict=True)}
            sums = [(set(t["layers"]), t["sum_s"]) for t in ties if t.get("sum_s")]
            fitted = fit(split["whole_total"], split["whole_forward"], split, tot, fwd, sums)  # the same rounds
            g.graph["stage_overhead"] = fitted["stage_overhead"]
            scale_layers(g, fitted["scale"])
            g.graph["torch"]["runtime_scale"] = dict(fitted["scale"])
        else:
            g.graph["stage_overhead"] = whole_over
    g.graph["source"] = f"pipeopt.from_torch({type(module).__name__}, granularity={gran.text!r}, costs={costs!r})"
    assumptions = _assumptions(costs, spec, precision, optimizer, threads, repeats, warmup, cl, whole, probes, traced,
                               bandwidth)
    if costs == "measured":
        over = g.graph["stage_overhead"]
        w_tot, w_fwd = (split["whole_total"], split["whole_forward"]) if split is not None else (run_whole,
                                                                                                  run_forward)
        whole_text = (f"the whole model as the runtime runs it, by {run_by}, {w_tot * 1e3:.3f} ms (forward "
                      f"{w_fwd * 1e3:.3f} ms; gradients accumulating over {settings.microbatches} microbatches), "
                      "beyond the sum of its layers' times")
        if fitted is not None:
            sc, e1, e2 = fitted["scale"], fitted["whole_excess"], fitted["split_excess"]
            how = (f"fitted with a share proportional to the layers' times (every layer's fwd x {sc['forward']:.4f}, "
                   f"bwd and bwd_w x {sc['backward']:.4f}) so that the cost model reproduces two measurements, "
                   f"gradients accumulating over {settings.microbatches} microbatches (pipeopt.torch.overhead.fit): "
                   f"{whole_text}, {(e1['forward'] + e1['backward']) * 1e3:.3f} ms; the two stages of torch's "
                   f"pipeline() split at {split['split']}, each stage module timed alone "
                   f"({split['total'][0] * 1e3:.3f} and {split['total'][1] * 1e3:.3f} ms), "
                   f"{(e2['forward'] + e2['backward']) * 1e3:.3f} ms beyond "
                   "their layers' times together")
            short = (e1["forward"] + e1["backward"]) - (e2["forward"] + e2["backward"])
            if short > 0:
                how += (f"; the whole model pays {short * 1e3:.3f} ms that the two stages do not (beyond its tied "
                        "weights' gradient sums, which the cost model prices): a plan of one stage is predicted "
                        "that much short")
        else:
            how = whole_text + " (pipeline() could not split the model in two stages)"
        assumptions.append(
            f"stage overhead {over['forward'] * 1e3:.3f} ms forward + {over['backward'] * 1e3:.3f} ms backward per "
            f"microbatch, charged once per stage: {how}")
    assumptions += [_tie_assumption(t) for t in g.graph.get("tied", [])]
    if g.graph.get("transient_memory"):
        assumptions.append("memory adds the outputs a stage keeps until their backward (the last stage: all M, "
                           "torch's merged output) and its backward's peak over one microbatch's activations (the "
                           "layers' bwd_temp_bytes, MemTracker, each layer alone)")
    if name is None:
        name = f"{type(module).__name__.lower()}-{label}-x{devices}"
    return Instance(g, cl, settings, name=name, assumptions=tuple(assumptions))


def _run(module, what: str, fn, device: str):
    """``fn()``; an exception from running the model becomes an :class:`InvalidProblemError`
    naming what ran, on which device, and torch's reason."""
    try:
        return fn()
    except PipeoptError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, TypeError, IndexError, ...
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        hint = (" (on the meta device a layer cannot branch on a tensor's value; use costs='measured')"
                if device == "meta" else " (do the example inputs match the forward's arguments?)")
        raise InvalidProblemError(
            f"running {what} of {type(module).__name__} on the {device} device failed: "
            f"{type(exc).__name__}: {reason}{hint}"
        ) from None


def _graph(traced, probes, params, costs, spec, precision, optimizer, kinds) -> nx.DiGraph:
    g = nx.DiGraph()
    for i, (fqn, mod, pr, par) in enumerate(zip(traced.names, traced.modules, probes, params, strict=True)):
        if costs == "measured":
            fwd, bwd = {"cpu": float(pr.fwd_s)}, {"cpu": float(pr.bwd_s)}
            bwd_w = {"cpu": float(pr.bwd_w_s)}
        else:
            fwd = {k: pr.flop / (REFERENCE_FLOPS * KINDS[k].forward_efficiency) for k in kinds}
            bwd = {k: pr.bwd_flop / (REFERENCE_FLOPS * KINDS[k].backward_efficiency) for k in kinds}
            share = pr.bwd_w_flop / pr.bwd_flop if pr.bwd_flop > 0 else 0.0
            bwd_w = {k: min(b * share, b) for k, b in bwd.items()}
        st = state_bytes(par["weight_bytes"], par["numel"], optimizer)
        attrs = {
            "fqn": fqn,
            "op": type(mod).__name__,
            "fwd": fwd,
            "bwd": bwd,
            "bwd_w": bwd_w,
            "out_bytes": float(pr.out_bytes),
            "act_bytes": float(pr.act_bytes),
            "param_bytes": float(sum(st.values()) + par["buffer_bytes"]),
            "weight_bytes": float(par["weight_bytes"]),
            "grad_bytes": st["grads"],
            "optimizer_bytes": st["optimizer"] + (st["weights"] - par["weight_bytes"]),
            "buffer_bytes": float(par["buffer_bytes"]),
            "flop": pr.flop,
            "bwd_flop": pr.bwd_flop,
            "bwd_w_flop": pr.bwd_w_flop,
        }
        g.add_node(fqn, **attrs)
    if traced.edges is not None:  # module hooks: the bytes between layers as recorded
        for (u, v), b in traced.edges.items():
            g.add_edge(traced.names[u], traced.names[v], bytes=float(b))
        return g
    for j, srcs in enumerate(traced.sources):
        for k, src in enumerate(srcs):
            if src is None or src == j:
                continue
            u, v = traced.names[src], traced.names[j]
            prev = g.edges[u, v]["bytes"] if g.has_edge(u, v) else 0.0
            g.add_edge(u, v, bytes=prev + float(probes[j].in_bytes[k]))
    return g


def _record_recompute(g: nx.DiGraph, traced, probes) -> None:
    """Node attributes ``recompute_fwd`` and ``selective`` (module docstring) from the probes'
    timed recomputations (:attr:`pipeopt.torch.probe.LayerProbe.recompute_s`)."""
    from ..graph import edge_bytes

    for fqn, pr in zip(traced.names, probes, strict=True):
        kept = float(sum(edge_bytes(g, u, fqn) for u in g.predecessors(fqn)))
        if pr.recompute_parts:
            g.nodes[fqn]["recompute_parts"] = {m: {k: float(v) for k, v in part.items()}
                                               for m, part in pr.recompute_parts.items()}
        if pr.recompute_s is not None:
            g.nodes[fqn]["recompute_fwd"] = {"cpu": float(pr.recompute_s)}
        if pr.selective_s is None:
            continue
        g.nodes[fqn]["selective"] = {"act_bytes": min(kept + float(pr.selective_bytes), g.nodes[fqn]["act_bytes"]),
                                     "fwd": {"cpu": float(pr.selective_s)}}


def scale_layers(g: nx.DiGraph, scale: dict) -> None:
    """Every layer's ``fwd`` times ``scale["forward"]`` and its ``bwd`` and ``bwd_w`` times
    ``scale["backward"]``: the runtime's overhead proportional to the layers' times
    (:func:`pipeopt.torch.overhead.fit`), on every kind. What a recomputation adds
    (``recompute_fwd``, ``selective["fwd"]``: a rerun of the forward through the same stage
    module) is scaled as the forward. ``g`` is changed in place; ``{"forward": 1 / f,
    "backward": 1 / b}`` undoes a scale ``{"forward": f, "backward": b}`` (up to rounding)."""
    for _, data in g.nodes(data=True):
        data["fwd"] = {k: v * scale["forward"] for k, v in data["fwd"].items()}
        data["bwd"] = {k: v * scale["backward"] for k, v in data["bwd"].items()}
        data["bwd_w"] = {k: v * scale["backward"] for k, v in data["bwd_w"].items()}
        if "recompute_fwd" in data:
            data["recompute_fwd"] = {k: v * scale["forward"] for k, v in data["recompute_fwd"].items()}
        if "selective" in data:
            data["selective"] = {**data["selective"],
                                 "fwd": {k: v * scale["forward"] for k, v in data["selective"]["fwd"].items()}}


def _record_ties(g: nx.DiGraph, ties: list[dict], optimizer: str) -> None:
    """``g.graph["tied"]`` (only if the model has ties): per tied parameter its name, other
    names, ``bytes`` (its weights as the module holds them: what synchronising its gradient
    moves), ``state_bytes`` (weights + gradients + optimizer state, :func:`state_bytes`, the
    per-byte rule of every other weight), the layers that use it and, measured, ``sum_s``
    (``{"cpu": seconds}`` of one out-of-place sum of two of its gradients,
    :func:`pipeopt.torch.probe.gradient_sum_seconds`) (docs/cost-model.md, "Tied parameters")."""
    if not ties:
        return
    g.graph["tied"] = [{
        "name": t["name"],
        **({"aliases": t["aliases"]} if t["aliases"] else {}),
        "bytes": float(t["weight_bytes"]),
        "state_bytes": float(sum(state_bytes(t["weight_bytes"], t["numel"], optimizer).values())),
        "layers": list(t["layers"]),
        **({"sum_s": {"cpu": float(t["sum_s"])}} if "sum_s" in t else {}),
    } for t in ties]


def _record_transient(g: nx.DiGraph, traced, temps, twice: dict) -> None:
    """Node attribute ``bwd_temp_bytes`` (the peak bytes a layer's backward allocates on top of
    what it held, :func:`pipeopt.torch.memory.backward_temporaries`) and graph attribute
    ``transient_memory`` (the cost model then adds the outputs a stage keeps and its backward's
    excess, :mod:`pipeopt.cost.transient`); nothing without measurements."""
    if temps is None:
        return
    for name, t in zip(traced.names, temps, strict=True):
        g.nodes[name]["bwd_temp_bytes"] = float(t)
    for (u, v), nbytes in twice.items():  # a tensor both layers save: once in a stage holding both
        if g.has_edge(traced.names[u], traced.names[v]):
            g.edges[traced.names[u], traced.names[v]]["saved_twice_bytes"] = float(nbytes)
    g.graph["transient_memory"] = True


def _tie_assumption(tie: dict) -> str:
    """The assumption line of one tied parameter."""
    names = " = ".join([tie["name"], *tie.get("aliases", [])])
    return (f"tied parameter {names} ({tie['bytes'] / 2**20:.3f} MiB, {tie['state_bytes'] / 2**20:.3f} MiB with "
            f"gradient and optimizer state) used by layers {', '.join(tie['layers'])}: charged on every stage that "
            "holds one of them, its gradient all-reduced between those stages once per iteration, after the flush"
            + (f"; a stage holding k >= 2 of them sums their gradients k - 1 times per microbatch, "
               f"{tie['sum_s']['cpu'] * 1e3:.3f} ms each (one out-of-place sum timed on this CPU)" if "sum_s" in tie else ""))


def _machine() -> str:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def _names(names: list, limit: int = 6) -> str:
    """``names`` for an assumption line: all of them, or the first ``limit`` and a count."""
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f", ... ({len(names)} in all)"


def _weight_split(probes, traced) -> dict:
    """``dict[rule, list[name]]``: the layers by the rule that gave their W
    (:attr:`pipeopt.torch.probe.LayerProbe.w_rule`)."""
    out = {"difference": [], "no-input-grad": [], "no-parameters": []}
    for name, pr in zip(traced.names, probes, strict=True):
        out[pr.w_rule].append(name)
    return out


def _weight_split_assumption(costs, probes, traced) -> str:
    """The assumption line saying how every layer's ``bwd_w`` was obtained (which layers got a
    measured split, which a rule)."""
    rules = _weight_split(probes, traced)
    diff = rules["difference"]
    if costs == "measured":
        clamped = [n for n, pr in zip(traced.names, probes, strict=True)
                   if pr.w_rule == "difference" and pr.bwd_i_s > pr.bwd_s]
        parts = [f"weight gradient W of the backward measured for {len(diff)} layer(s)"
                 + (f" ({_names(diff)})" if diff else "")
                 + ": full backward - input-gradient-only backward (torch.autograd.grad w.r.t. the layer's "
                   "inputs), medians of the same rounds, clamped to [0, B]"
                 + (f" (W = 0 where the input-gradient backward measured longer: {_names(clamped)})" if clamped
                    else "")]
    else:
        parts = [f"weight gradient W of the backward for {len(diff)} layer(s)"
                 + (f" ({_names(diff)})" if diff else "")
                 + " = B x (full backward FLOP - input-gradient-only backward FLOP) / full backward FLOP "
                   "(FlopCounterMode; I and W at the same backward efficiency)"]
    if rules["no-input-grad"]:
        parts.append(f"W = B (I = 0) for the layers whose inputs need no gradient ({_names(rules['no-input-grad'])})")
    if rules["no-parameters"]:
        parts.append(f"W = 0 for the layers without trainable parameters ({_names(rules['no-parameters'])})")
    return "; ".join(parts)


def stage_overhead(whole: float, whole_forward: float, probes) -> dict:
    """The graph attribute ``stage_overhead`` (:func:`pipeopt.cost.rules.stage_overhead`): what
    one run of the whole model takes per microbatch beyond the sums of its layers' measured
    times, ``{"forward": s, "backward": s}``. The total is ``whole - sum(fwd + bwd)`` (0 if
    negative); its forward part ``whole_forward - sum(fwd)``, clamped to ``[0, total]``; the
    backward part the rest. :func:`from_torch` times the whole model as the runtime runs it
    (:func:`pipeopt.torch.probe.runtime_module`: torch's ``pipeline()`` traces it to ATen
    operators, slower than the eager layers), with gradients accumulating over M microbatches.

    Parameters
    ----------
    whole, whole_forward
        Median seconds of the whole model's forward + backward, and of its forward alone
        (:func:`pipeopt.torch.probe.whole_model_passes`).
    probes
        The layers' measurements (``fwd_s``, ``bwd_s`` seconds each).
    """
    fwd = sum(p.fwd_s for p in probes)
    total = max(float(whole) - fwd - sum(p.bwd_s for p in probes), 0.0)
    forward = min(max(float(whole_forward) - fwd, 0.0), total)
    return {"forward": forward, "backward": total - forward}


def _assumptions(costs, spec, precision, optimizer, threads, repeats, warmup, cl, whole, probes, traced,
                 bandwidth) -> list[str]:
    out = []
    if costs == "measured":
        total = sum(p.fwd_s + p.bwd_s for p in probes)
        out.append(
            f"layer times measured on this machine's CPU ({_machine()}) with {threads} torch thread(s): each layer "
            f"run alone on its recorded inputs, median of {repeats} runs after {warmup} warm-up runs; "
            f"kind 'cpu', 1 unit = this CPU as profiled"
        )
        out.append(f"sum of the layers' forward+backward {total * 1e3:.3f} ms vs the whole model {whole * 1e3:.3f} ms "
                   f"(ratio {total / whole:.3f}) per microbatch")
        src = "the default for loopback gloo" if bandwidth is None else "given"
        out.append(f"bandwidth {cl.bandwidth:.4g} B/s between workers ({src}; latency per message: the cluster's)")
    else:
        eff = ", ".join(f"{k} {KINDS[k].forward_efficiency:g}/{KINDS[k].backward_efficiency:g}" for k in cl.kinds)
        out.append(
            f"layer times estimated for {spec.name} ({spec.title}) at {precision} peak: counted FLOP (forward and "
            f"backward, torch FlopCounterMode on the meta device) / (peak x efficiency); efficiencies "
            f"(forward/backward) {eff}; ops without counted FLOP (element-wise, norms, embeddings) take 0 s"
        )
        out.append(f"bandwidth {cl.bandwidth:.4g} B/s between consecutive workers")
    out.append(_weight_split_assumption(costs, probes, traced))
    out.append(f"param_bytes = weights + gradients + optimizer state + buffers: {OPTIMIZERS[optimizer]}")
    if optimizer != "weights":
        out.append("replication's all-reduce and weight stashing's versions are charged param_bytes (the whole "
                   "training state), more than the weights or gradients they move")
    out.append("act_bytes = storages autograd saves in the forward (saved-tensor hooks); tensor sizes as traced")
    out.append("operations outside the layers join the layer of their latest input")
    out.append(f"layer graph by {traced.method}" + (
        " (one run of the model: the order the layers ran, the tensors passed between them by identity; "
        "operations outside the layers are in no layer's time)" if traced.top is None else " (symbolic trace)"))
    if traced.input_readers[1:]:
        out.append(f"the model's inputs are read by {traced.input_readers}: assumed present on every stage")
    if any(math.isinf(d.memory) for d in cl.devices):
        out.append("no memory limit on the devices")
    return out
