"""The layer graph of a model torch.fx cannot trace: one run of the model with module hooks.

torch.fx traces ``forward`` symbolically, which fails on most Hugging Face transformers
models (the root ``forward`` builds attention masks and caches with Python control flow on
tensors, ``inspect``-driven decorators and ``*args`` the tracer cannot follow). This module
gets the same :class:`~pipeopt.torch.trace.Traced` another way, by running the model once on
the example inputs (no gradients) and watching it:

* a forward pre-hook and a forward hook on every layer's module record the order in which
  the layers run, the positional **and keyword** arguments of each call (HF blocks take
  ``attention_mask``, ``position_embeddings``, ``cache_position``, ... as keywords) and the
  tensors each call returns; global module hooks keep the stack of running modules, so a
  module known under two names (T5's shared embedding, ``encoder.embed_tokens`` and
  ``decoder.embed_tokens``) is the layer of the name it was called by;
* a :class:`torch.overrides.TorchFunctionMode` records every torch operation that runs
  outside the layers (the sum of two embeddings, a dropout, a reshape before the head, the
  masks built from the input), with the tensors it reads and returns.

Edges come from tensor identity: a layer or an outside operation that reads a tensor another
layer (or outside operation) returned. Outside operations join layers by the rule of
:mod:`pipeopt.torch.trace`: **the layer that produced their latest input**, or, when they
read no layer's output (positions from ``torch.arange``, a mask from the input ids), their
first reader; an edge from layer u to layer v carries the bytes of the distinct tensors v's
operations read from u's (``numel * element_size``). Tensors derived from the model's own
inputs only have no producer (``sources`` entry ``None``); a layer that reads them is an
*input reader*. Tensors computed from no input and no layer's output (positions and
``cache_position`` from ``torch.arange``, a causal mask built from them) make no edge: every
stage can compute them (under fx they join their first reader and reach later readers over
an edge; a few bytes either way).

Each layer is then a :class:`LayerCall`: the module with the call's non-tensor arguments
fixed and its tensor arguments as positional inputs, so :mod:`pipeopt.torch.probe` runs it
alone, forward and backward, on the recorded tensors (copies taken when the layer was
called) exactly as it runs an fx sub-module. Unlike fx's sub-modules, the outside operations
are not part of any layer's measured time: they show in the whole model's time against the
sum of the layers (the profile's provenance).

Parameters and buffers of no layer (a root-level class token, a position table held by a
container's parent) that outside operations read are counted in the layer those operations
join (:meth:`LayerCall.adopt`), so the layers' parameters add up to the model's.

Limits: a module with parameters that runs more than once in one forward (a layer shared
across depth, as in ALBERT) is refused (:class:`~pipeopt.errors.InvalidGraphError`); a
parameter-free layer called again (a shared activation) counts at its first call, its
later calls are outside operations. Tensors hidden in objects that are not tuples, lists
or dicts (a KV cache object) are constants of the call; profile with caches off
(``use_cache=False``; :func:`pipeopt.torch.hf.build` sets it).

:func:`layer_graph` chooses: torch.fx first (unchanged for every model it traces), module
hooks when the symbolic trace fails; ``Traced.method`` says which was used.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..errors import InvalidGraphError, InvalidProblemError
from .probe import capture, tensors
from .trace import FxTraceError, Granularity, Traced, layer_names, resolve, trace

TRACINGS = ("auto", "fx", "hooks")
"""Accepted ``tracing`` of :func:`layer_graph`: ``"fx"`` (torch.fx only), ``"hooks"`` (module
hooks only), ``"auto"`` (torch.fx, module hooks when fx cannot trace)."""

METHODS = {"fx": "torch.fx", "hooks": "module hooks"}
"""The provenance text of each tracing (``Traced.method``)."""

_INPUT = -1
"""Producer of a model input."""


class LayerCall(nn.Module):
    """One recorded call of a layer as a module of its tensor arguments.

    ``forward(*tensors)`` puts the tensors back in the recorded places among the call's
    positional and keyword arguments (the non-tensor ones as recorded) and calls the layer.

    Parameters
    ----------
    layer
        The layer's module (held, not copied: parameters are shared with the model).
    spec
        The :mod:`torch.utils._pytree` spec of ``(args, kwargs)``.
    leaves
        The flattened leaves, tensors replaced by ``None`` (filled from ``forward``'s
        arguments in order).
    slots
        Indices of the tensor leaves.
    """

    def __init__(self, layer: nn.Module, spec, leaves: list, slots: list) -> None:
        super().__init__()
        self.layer = layer
        self._spec = spec
        self._leaves = leaves
        self._slots = slots

    def adopt(self, tensors: list) -> None:
        """Hold parameters and buffers of no layer that the outside operations joined to this
        layer read (a root-level ``class_token``), so that the layer's parameters count them;
        they are shared, not copied, and :meth:`forward` does not use them."""
        params = [t for t in tensors if isinstance(t, nn.Parameter)]
        if params:
            self.adopted = nn.ParameterList(params)
        for k, t in enumerate(t for t in tensors if not isinstance(t, nn.Parameter)):
            self.register_buffer(f"adopted_buffer_{k}", t)

    def forward(self, *flat):
        """The layer on the recorded arguments with ``flat`` as its tensors."""
        leaves = list(self._leaves)
        for k, t in zip(self._slots, flat, strict=True):
            leaves[k] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        return self.layer(*args, **kwargs)


class _Node:
    """A layer call or an outside operation: what it reads, ``(tensor id, producer node or
    _INPUT or None, bytes)`` each, and its layer (unit) once assigned."""

    __slots__ = ("layer", "reads", "unit")

    def __init__(self, layer: str | None, reads: list) -> None:
        self.layer = layer
        self.reads = reads
        self.unit: int | None = None


class _Recorder(TorchFunctionMode):
    """Records the torch operations run outside every layer (module docstring)."""

    def __init__(self, rec: _Run) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rec = self.rec
        if rec.depth == 0 and not rec.paused:
            outs = list(tensors(out))
            if func is torch.Tensor.__setitem__ and args and isinstance(args[0], torch.Tensor):
                outs.append(args[0])
            outs.extend(tensors(kwargs.get("out")))
            if outs:
                rec.operation((args, kwargs), outs)
        return out


class _Run:
    """The state of one hooked run."""

    def __init__(self, module: nn.Module, names: list[str]) -> None:
        self.module = module
        self.layers = set(names)
        self.nodes: list[_Node] = []
        self.producer: dict[int, int] = {}
        self.keep: list = []  # every tensor seen stays alive: ids are not reused during the run
        self.stack: list[tuple[nn.Module, str]] = []
        self.depth = 0  # > 0 inside a layer call
        self.paused = False
        self.order: list[str] = []
        self.calls: dict[str, tuple] = {}  # layer -> (node, LayerCall, copies of its tensors, the tensors)
        self.active: list[str | None] = []
        subs = dict(module.named_modules(remove_duplicate=False))
        owned = {id(t) for n in names if n in subs for t in [*subs[n].parameters(), *subs[n].buffers()]}
        self.stray = {id(t): t for t in [*module.parameters(), *module.buffers()] if id(t) not in owned}
        self.stray_readers: dict[int, int] = {}  # id of a stray parameter or buffer -> first node reading it

    # ---- where a module runs --------------------------------------------------------------
    def fqn(self, m: nn.Module) -> str:
        """The name ``m`` is called by: the running parent's child name (one module object
        may have several names), else its first name in the model."""
        if not self.stack:
            return ""
        parent, prefix = self.stack[-1]
        for name, child in parent.named_children():
            if child is m:
                return f"{prefix}.{name}" if prefix else name
        for name, sub in parent.named_modules(remove_duplicate=False):
            if sub is m and name:
                return f"{prefix}.{name}" if prefix else name
        for name, sub in self.module.named_modules(remove_duplicate=False):
            if sub is m:
                return name
        return "?"

    def push(self, m, args) -> None:
        self.stack.append((m, self.fqn(m)))

    def pop(self, m, args, out) -> None:
        if self.stack:
            self.stack.pop()

    # ---- what runs ------------------------------------------------------------------------
    def reads(self, value) -> list:
        out, seen = [], set()
        for t in tensors(value):
            if id(t) in seen:
                continue
            seen.add(id(t))
            out.append((id(t), self.producer.get(id(t)), t.numel() * t.element_size()))
        return out

    def produced(self, node: int, value) -> None:
        for t in value if isinstance(value, list) else tensors(value):
            self.producer[id(t)] = node
            self.keep.append(t)

    def operation(self, inputs, outs: list) -> None:
        self.paused = True
        try:
            for t in tensors(inputs):
                if id(t) in self.stray:
                    self.stray_readers.setdefault(id(t), len(self.nodes))
            self.nodes.append(_Node(None, self.reads(inputs)))
            self.produced(len(self.nodes) - 1, outs)
        finally:
            self.paused = False

    def layer_pre(self, m, args, kwargs):
        name = self.stack[-1][1] if self.stack and self.stack[-1][0] is m else self.fqn(m)
        if self.depth > 0 or name not in self.layers:
            self.active.append(None)
            return None
        if name in self.calls:
            if any(True for _ in m.parameters()):
                raise InvalidGraphError(
                    f"layer {name!r} ({type(m).__name__}, with parameters) runs more than once in one forward of "
                    f"{type(self.module).__name__}; module hooks profile each layer at one call: choose a "
                    "coarser granularity (a container that holds every call)")
            self.active.append(None)  # a parameter-free module again: an outside operation
            return None
        self.paused = True
        try:
            leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
            slots = [k for k, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
            flat = [leaves[k] for k in slots]
            node = _Node(name, self.reads(flat))
            self.nodes.append(node)
            self.keep.extend(flat)
            copies = tuple(t.detach().clone() for t in flat)
            consts = [None if k in slots else v for k, v in enumerate(leaves)]
            self.calls[name] = (len(self.nodes) - 1, LayerCall(m, spec, consts, slots), copies, flat)
            self.order.append(name)
        finally:
            self.paused = False
        self.active.append(name)
        self.depth += 1
        return None

    def layer_post(self, m, args, kwargs, out):
        name = self.active.pop() if self.active else None
        if name is None:
            return None
        self.depth -= 1
        self.paused = True
        try:
            self.produced(self.calls[name][0], out)
        finally:
            self.paused = False
        return None


def hook_trace(module: nn.Module, granularity: Granularity, example_inputs: tuple) -> Traced:
    """Split ``module`` into layers by running it once with hooks (module docstring).

    Parameters
    ----------
    module
        The model; run once without gradients (batch-norm statistics change: the caller
        restores them, as :func:`pipeopt.torch.from_torch` does).
    granularity
        From :func:`pipeopt.torch.trace.parse_granularity`.
    example_inputs
        One microbatch: the forward's positional arguments.

    Returns
    -------
    Traced
        ``method`` ``"module hooks"``, ``top`` ``None``, ``submods`` the layers'
        :class:`LayerCall` s, ``edges`` and ``captured`` set.

    Raises
    ------
    InvalidProblemError
        If the container is not found.
    InvalidGraphError
        If no layer runs, or a layer with parameters runs twice.
    """
    granularity = resolve(module, granularity)
    names = layer_names(module, granularity)
    if names is None:  # leaves: torch.nn's modules and the modules without children
        names = [n for n, m in module.named_modules(remove_duplicate=False)
                 if n and (not any(True for _ in m.children())
                           or (type(m).__module__.startswith("torch.nn") and not isinstance(m, (nn.Sequential,
                                                                                                 nn.ModuleList)))
                           )]
        names = [n for n in names if not any(n.startswith(o + ".") for o in names)]
    run = _Run(module, names)
    for t in tensors(list(example_inputs)):
        run.producer[id(t)] = _INPUT
        run.keep.append(t)
    objects = {id(m): m for n, m in module.named_modules(remove_duplicate=False) if n in run.layers}
    handles = [nn.modules.module.register_module_forward_pre_hook(run.push),
               nn.modules.module.register_module_forward_hook(run.pop, always_call=True)]
    try:
        for m in objects.values():
            handles.append(m.register_forward_pre_hook(run.layer_pre, with_kwargs=True))
            handles.append(m.register_forward_hook(run.layer_post, with_kwargs=True, always_call=True))
        with torch.no_grad(), _Recorder(run):
            output = module(*example_inputs)
    finally:
        for h in handles:
            h.remove()
    if not run.order:
        raise InvalidGraphError(f"{type(module).__name__}'s forward runs no layer at granularity {granularity.text!r}")
    return _assemble(module, run, output, names)


def _assemble(module: nn.Module, run: _Run, output, names: list[str]) -> Traced:
    """The :class:`Traced` of a hooked run: outside operations joined to layers, edges, sources."""
    nodes, order = run.nodes, run.order
    index = {name: i for i, name in enumerate(order)}
    for name, (at, *_) in run.calls.items():
        nodes[at].unit = index[name]
    readers: dict[int, list[int]] = {}
    for c, node in enumerate(nodes):
        for _, p, _ in node.reads:
            if p is not None and p >= 0:
                readers.setdefault(p, []).append(c)
    for node in nodes:  # the layer of the latest input
        if node.unit is None:
            units = [nodes[p].unit for _, p, _ in node.reads if p is not None and p >= 0 and nodes[p].unit is not None]
            if units:
                node.unit = max(units)
    for c in range(len(nodes) - 1, -1, -1):  # else the first reader (the last layer if none)
        if nodes[c].unit is None:
            units = [nodes[r].unit for r in readers.get(c, []) if nodes[r].unit is not None]
            nodes[c].unit = min(units) if units else len(order) - 1
    live = _live(nodes, run, output)
    const: set[int] = set()  # computed from no model input and no layer output: recomputed where read
    for k, node in enumerate(nodes):
        if node.layer is None and all(p is None or p in const for _, p, _ in node.reads):
            const.add(k)
    edges = _dedup_edges(nodes, live, const)
    input_readers = sorted({node.unit for k, node in enumerate(nodes)
                            if k in live and any(p == _INPUT for _, p, _ in node.reads)})
    adopted: dict[int, list] = {}
    for tid, at in run.stray_readers.items():
        adopted.setdefault(nodes[at].unit, []).append(run.stray[tid])
    for unit, found in adopted.items():
        run.calls[order[unit]][1].adopt(found)
    sources, submods, captured = [], [], []
    for i, name in enumerate(order):
        at, call, copies, _flat = run.calls[name]
        srcs = []
        for _, p, _ in nodes[at].reads:
            srcs.append(nodes[p].unit if p is not None and p >= 0 and p not in const and nodes[p].unit != i
                        else None)
        sources.append(_per_argument(srcs, nodes[at].reads, _flat))
        submods.append(call)
        captured.append(copies)
    outs = {nodes[run.producer[id(t)]].unit for t in tensors(output)
            if run.producer.get(id(t)) is not None and run.producer[id(t)] >= 0}
    return Traced(
        names=list(order),
        modules=[run.calls[n][1].layer for n in order],
        top=None,
        submods=submods,
        sources=sources,
        graph_outputs=sorted(outs),
        input_readers=[order[u] for u in input_readers],
        unused=[n for n in names if n not in index],
        method=METHODS["hooks"],
        edges=edges,
        captured=captured,
    )


def _live(nodes: list[_Node], run: _Run, output) -> set[int]:
    """The nodes whose results reach a layer or the model's output (an outside operation
    whose result nothing reads makes no edge)."""
    live = {at for at, *_ in run.calls.values()}
    live |= {run.producer[id(t)] for t in tensors(output) if run.producer.get(id(t), -1) >= 0}
    todo = list(live)
    while todo:
        for _, p, _ in nodes[todo.pop()].reads:
            if p is not None and p >= 0 and p not in live:
                live.add(p)
                todo.append(p)
    return live


def _dedup_edges(nodes: list[_Node], live: set, const: set) -> dict:
    """Bytes per edge (u, v): the distinct tensors the ``live`` nodes of layer v read from
    nodes of layer u that are not ``const`` (a tensor read by two operations of one layer
    counts once)."""
    seen: set[tuple] = set()
    edges: dict[tuple, int] = {}
    for k, node in enumerate(nodes):
        if k not in live:
            continue
        for tid, p, b in node.reads:
            if p is None or p < 0 or p in const or nodes[p].unit == node.unit or (tid, node.unit) in seen:
                continue
            seen.add((tid, node.unit))
            key = (nodes[p].unit, node.unit)
            edges[key] = edges.get(key, 0) + b
    return edges


def _per_argument(srcs: list, reads: list, flat: list) -> list:
    """The source of each tensor argument of a call (``reads`` holds one entry per distinct
    tensor; an argument passed twice gets the entry of its first place)."""
    by_id = {tid: s for (tid, _, _), s in zip(reads, srcs, strict=True)}
    return [by_id[id(t)] for t in flat]


def layer_graph(module: nn.Module, granularity: Granularity, example_inputs: tuple,
                tracing: str = "auto") -> Traced:
    """The model's layers by torch.fx or by module hooks.

    Parameters
    ----------
    module, granularity, example_inputs
        As :func:`hook_trace`.
    tracing
        ``"auto"`` (default: torch.fx, module hooks if the symbolic trace fails), ``"fx"``
        or ``"hooks"`` (:data:`TRACINGS`).

    Returns
    -------
    Traced
        ``method`` says which was used.

    Raises
    ------
    InvalidProblemError
        Unknown ``tracing``; container not found.
    InvalidGraphError
        As :func:`pipeopt.torch.trace.trace` (``"fx"``) or :func:`hook_trace`; with
        ``"auto"`` when both fail, naming both reasons.
    """
    if tracing not in TRACINGS:
        raise InvalidProblemError(f"unknown tracing {tracing!r}; choose from {list(TRACINGS)} (auto: torch.fx, "
                                  "module hooks where fx cannot trace)")
    if tracing == "hooks":
        return hook_trace(module, granularity, example_inputs)
    try:
        return trace(module, granularity)
    except FxTraceError as fx_error:
        if tracing == "fx":
            raise
        try:
            return hook_trace(module, granularity, example_inputs)
        except InvalidGraphError as exc:
            raise InvalidGraphError(f"{fx_error}; and with module hooks: {exc}") from None


def inputs_of(traced: Traced, example_inputs: tuple, device: str) -> list[tuple]:
    """Per layer, the arguments the profiler runs it on: :func:`pipeopt.torch.probe.capture`
    of an fx split; for a hooked run the recorded tensors (as meta tensors on ``"meta"``)."""
    if traced.captured is None:
        return capture(traced, example_inputs, device)
    if device == "meta":
        return [tuple(t.to("meta") for t in args) for args in traced.captured]
    return list(traced.captured)


def no_cache(module: nn.Module):
    """Switch a Hugging Face model's ``config.use_cache`` off (a training step keeps no KV
    cache; a cache object passed to a layer would grow at every timed run); returns the
    function that restores it."""
    config = getattr(module, "config", None)
    before = getattr(config, "use_cache", None)
    if before:
        config.use_cache = False

    def restore() -> None:
        if before:
            config.use_cache = before
    return restore
