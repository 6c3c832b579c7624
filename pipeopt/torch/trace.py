"""From an ``nn.Module`` to its layers: the granularity, the torch.fx trace, and one
sub-module per layer.

A *layer* (a node of pipeopt's layer graph) is a module of the model named by its fully
qualified name (FQN, ``"layers.3"``, ``"head"``) at one of four granularities:

``"auto"`` (the default of :func:`pipeopt.torch.from_torch`)
    ``"container:NAMES"`` with the block containers found by :func:`find_containers` (the
    longest list of repeated blocks; an encoder-decoder's two stacks).
``"container:NAME"``, ``"container:NAME1,NAME2"``
    the children of the container module ``NAME`` (``layers.0`` ... ``layers.7``) plus, for
    every module on the path from the root to the container, its other children (the
    embeddings before, the final norm and the head after; for a container ``transformer.h``
    also ``transformer.wte``, ``transformer.ln_f``, ``lm_head``, ...). Several containers
    (comma-separated, none inside another) are expanded alike: ``encoder.block,decoder.block``.
``"children"``
    the root's children.
``"leaves"``
    the modules torch.fx keeps as calls: modules without children and torch.nn's own
    modules (``Linear``, ``LayerNorm``, ``MultiheadAttention``, ...; not ``Sequential``).

The model is traced with :class:`torch.fx.Tracer` with the layers as leaf modules (their
insides need not be traceable at the container and children granularities). Operations
outside every layer -- the sum of the two embeddings, a reshape before the head, the
attention arithmetic between ``q_proj`` and ``o_proj`` at leaf granularity -- join **the layer
that produced their latest input** (in the order the layers run), or, when they read no
layer's output (``torch.arange`` of the sequence length), the first layer that reads them.
A parameter-free module called twice (a shared ``nn.ReLU``) is a layer at its first call and
such an operation at the others. A module with parameters called at two places that other
layers separate cannot be one layer: :class:`~pipeopt.errors.InvalidGraphError` names it.

The traced graph is then split with :func:`torch.fx.passes.split_module.split_module` into
one sub-module per layer, which the profiler (:mod:`pipeopt.torch.probe`) runs on its own.
A model whose ``forward`` torch.fx cannot trace (Hugging Face transformers' models, whose
root ``forward`` builds masks and caches) is split by running it once instead, with module
hooks (:mod:`pipeopt.torch.hooks`), by the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from ..errors import InvalidGraphError, InvalidProblemError

GRANULARITIES = ("auto", "container:NAME", "children", "leaves")
"""The accepted forms of ``granularity`` (``NAME`` is a module FQN, e.g. ``layers``, or several
FQNs separated by commas)."""


class FxTraceError(InvalidGraphError):
    """torch.fx cannot trace the model's ``forward`` at this granularity (the symbolic trace
    itself failed; :func:`pipeopt.torch.hooks.layer_graph` then runs the model with hooks)."""


@dataclass(frozen=True)
class Granularity:
    """A parsed granularity: ``kind`` is ``"container"``, ``"children"`` or ``"leaves"``;
    ``container`` the container's FQN (``None`` for the others); ``text`` as the user wrote it."""

    kind: str
    container: str | None
    text: str

    @property
    def containers(self) -> tuple:
        """``tuple[str, ...]``: the container FQNs (``container`` split at commas; empty if none)."""
        return tuple(self.container.split(",")) if self.container else ()


def parse_granularity(text) -> Granularity:
    """Parse ``"auto"``, ``"container:layers"`` (or ``"container:a.b,c.d"``), ``"children"``
    or ``"leaves"``.

    Raises
    ------
    InvalidProblemError
        If ``text`` is none of the forms of :data:`GRANULARITIES` (or names an empty container).
    """
    if isinstance(text, str):
        if text in ("auto", "children", "leaves"):
            return Granularity(text, None, text)
        if text.startswith("container:"):
            names = [n.strip() for n in text.split(":", 1)[1].split(",")]
            if all(names):
                return Granularity("container", ",".join(names), text)
    raise InvalidProblemError(
        f"unknown granularity {text!r}; choose 'auto' (the longest list of repeated blocks, found in the "
        "model), 'container:NAME' (the children of the module NAME, e.g. 'container:layers', plus the "
        "modules before and after it; several names separated by commas), 'children' (the root's "
        "children) or 'leaves' (every leaf module)"
    )


def _is_stack(m: nn.Module, leaves: bool = False) -> bool:
    """A ModuleList or Sequential of one or more blocks of one class, each with children
    (``leaves``: or without)."""
    kids = list(m.children())
    return (isinstance(m, (nn.ModuleList, nn.Sequential)) and bool(kids) and len({type(k) for k in kids}) == 1
            and (leaves or all(any(True for _ in k.children()) for k in kids)))


def find_containers(module: nn.Module) -> list[str]:
    """The block containers of ``module``, found by the class of their children.

    A *stack* is a ``ModuleList`` or ``Sequential`` whose children are all of one class and
    are not leaves (GPT-2's ``transformer.h``, BERT's ``bert.encoder.layer``, a ResNet
    stage's bottleneck blocks). Rules:

    1. a stack deeper than a direct child of a block of another stack is ignored (the
       experts of a mixture-of-experts layer, ``layers.0.mlp.experts``);
    2. the longest stack gives the block class (at equal lengths the outermost: a ResNet-50
       stage's 6 bottlenecks, not a bottleneck's 3 convolutions nor the 4 stages);
    3. then, longest first, every stack of that class comes along (the other stages of a
       ResNet, T5's decoder blocks beside its encoder blocks), and every stack of another
       class with at least 2 and at least half as many blocks (an encoder-decoder whose two
       stacks have different classes), unless it holds or lies inside one already chosen.

    A model without such a stack is searched again with blocks that are leaves (a
    ``ModuleList`` of ``Linear``).

    Returns
    -------
    list[str]
        FQNs in module order (empty if the model has no stack).
    """
    named = [(n, m) for n, m in module.named_modules() if n]
    stacks = [n for n, m in named if _is_stack(m)] or [n for n, m in named if _is_stack(m, leaves=True)]

    def inside(inner: str, outer: str) -> bool:
        return inner.startswith(outer + ".")

    deep = set()
    for inner in stacks:
        outers = [o for o in stacks if inside(inner, o)]
        if outers:
            nearest = max(outers, key=len)
            if len(inner[len(nearest) + 1:].split(".")) > 2:  # block index, then more than one name
                deep.add(inner)
    kept = [n for n in stacks if n not in deep]
    if not kept:
        return []
    size = {n: len(list(module.get_submodule(n).children())) for n in kept}
    cls = {n: type(next(module.get_submodule(n).children())) for n in kept}
    ranked = sorted(kept, key=lambda n: (-size[n], n.count("."), kept.index(n)))
    longest = ranked[0]
    chosen: list[str] = []
    for n in ranked:
        if any(inside(n, c) or inside(c, n) for c in chosen):
            continue
        if cls[n] is cls[longest] or (size[n] >= 2 and 2 * size[n] >= size[longest]):
            chosen.append(n)
    return [n for n in kept if n in chosen]


def resolve(module: nn.Module, granularity: Granularity) -> Granularity:
    """``granularity`` with ``"auto"`` replaced by the containers of :func:`find_containers`
    (the others unchanged).

    A model without one is split at ``container:layers`` if it has a module ``layers`` with
    children (pipeopt's earlier default), else into its children (``"children"``).
    """
    if granularity.kind != "auto":
        return granularity
    found = find_containers(module)
    if not found:
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.Module) and any(True for _ in layers.children()):
            return Granularity("container", "layers", "container:layers")
        return Granularity("children", None, "children")
    return Granularity("container", ",".join(found), "container:" + ",".join(found))


def _containers(module: nn.Module) -> list[str]:
    """FQNs of the modules that hold a list of blocks (ModuleList, Sequential): the candidates
    a 'container not found' error suggests."""
    return [n for n, m in module.named_modules() if n and isinstance(m, (nn.ModuleList, nn.Sequential))]


def layer_names(module: nn.Module, granularity: Granularity) -> list[str] | None:
    """FQNs of the layers at a container or children granularity, in module order
    (``None`` at leaf granularity: the trace decides).

    Raises
    ------
    InvalidProblemError
        If the container is not a submodule of ``module`` or has no children (the message lists
        the module's list-like containers).
    """
    if granularity.kind == "leaves":
        return None
    if granularity.kind == "children":
        names = [n for n, _ in module.named_children()]
        if not names:
            raise InvalidProblemError(f"{type(module).__name__} has no children; use granularity 'leaves'")
        return names
    paths = granularity.containers
    for path in paths:
        try:
            container = module.get_submodule(path)
        except AttributeError:
            found = _containers(module)
            raise InvalidProblemError(
                f"container {path!r} not found in {type(module).__name__}; its list-like containers are "
                f"{found[:10] or 'none (use granularity children or leaves)'}"
            ) from None
        if not list(container.named_children()):
            raise InvalidProblemError(
                f"container {path!r} of {type(module).__name__} has no children to split into layers")
    for a in paths:
        for b in paths:
            if a != b and (b == a or b.startswith(a + ".")):
                raise InvalidProblemError(f"container {b!r} lies inside container {a!r}; name one of them")
    names: list[str] = []

    def walk(parent: nn.Module, prefix: str) -> None:
        """The other children of every module on the paths to the containers, in module order."""
        for child, sub in parent.named_children():
            fqn = f"{prefix}.{child}" if prefix else child
            if fqn in paths:
                names.extend(f"{fqn}.{c}" for c, _ in sub.named_children())
            elif any(p.startswith(fqn + ".") for p in paths):
                walk(sub, fqn)
            else:
                names.append(fqn)

    walk(module, "")
    return names


class _LayerTracer(fx.Tracer):
    """An fx tracer whose leaf modules are the layers (or, at leaf granularity, torch.nn's
    modules and modules without children)."""

    def __init__(self, layers: set | None) -> None:
        super().__init__()
        self.layers = layers

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.layers is not None:
            return owner(module_qualified_name, self.layers) is not None
        return super().is_leaf_module(m, module_qualified_name) or not any(True for _ in m.children())


def owner(fqn: str, layers) -> str | None:
    """The layer of ``layers`` that is ``fqn`` or holds it (``layers.3`` holds
    ``layers.3.attn``; a list-like layer ``layers`` holds ``layers.3``), else ``None``."""
    parts = fqn.split(".")
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        if prefix in layers:
            return prefix
    return None


@dataclass
class Traced:
    """A model split into layers.

    Attributes
    ----------
    names
        ``list[str]``: layer FQNs in the order the layers run (a topological order).
    modules
        ``list[nn.Module]``: the module of each layer.
    top
        The split :class:`torch.fx.GraphModule`: calls ``submods[i]`` for layer i.
    submods
        ``list[torch.fx.GraphModule]``: one per layer (the layer and the operations it
        absorbed), sharing the model's parameters.
    sources
        ``list[list[int | None]]``: for each argument of ``submods[i]`` the layer that produced
        it (``None``: a model input).
    graph_outputs
        ``list[int]``: layers whose outputs are (part of) the model's output.
    input_readers
        ``list[str]``: layers that read a model input's values (not only its shape).
    unused
        ``list[str]``: layers (at a container or children granularity) the forward never calls.
    method
        How the layers were obtained: ``"torch.fx"`` (:func:`trace`) or ``"module hooks"``
        (:func:`pipeopt.torch.hooks.hook_trace`; ``top`` is then ``None``).
    edges
        ``None`` (the edges are ``sources`` with the bytes of each argument) or
        ``dict[(int, int), int]``: bytes from layer u to layer v (hooks: operations outside
        the layers pass tensors between layers that no layer argument shows).
    captured
        ``None``, or per layer its arguments as the hooked run recorded them (what
        :func:`pipeopt.torch.probe.capture` returns for a traced model).
    """

    names: list
    modules: list
    top: fx.GraphModule | None
    submods: list
    sources: list
    graph_outputs: list
    input_readers: list
    unused: list
    method: str = "torch.fx"
    edges: dict | None = None
    captured: list | None = None


def _metadata_only(node: fx.Node) -> bool:
    """True if every use of ``node`` reads only its shape, size, device or dtype (the GPT's
    ``torch.arange(idx.shape[1], device=idx.device)``), not its values."""
    return all(
        (u.op == "call_function" and u.target is getattr and u.args[1] in ("shape", "device", "dtype"))
        or (u.op == "call_method" and u.target in ("size", "dim"))
        for u in node.users
    )


def trace(module: nn.Module, granularity: Granularity) -> Traced:
    """Trace ``module`` with torch.fx and split it into one sub-module per layer.

    Parameters
    ----------
    module
        The model.
    granularity
        From :func:`parse_granularity` (``"auto"`` is resolved here, :func:`resolve`).

    Returns
    -------
    Traced

    Raises
    ------
    InvalidProblemError
        If the container is not found (:func:`layer_names`).
    FxTraceError
        (an :class:`~pipeopt.errors.InvalidGraphError`) If torch.fx cannot trace the model
        (data-dependent control flow, ...; the message quotes torch's reason and suggests a
        coarser granularity or a container whose children are traceable).
    InvalidGraphError
        If no layer is called, or if a module with parameters is
        called at two places that other layers separate.
    """
    granularity = resolve(module, granularity)
    names = layer_names(module, granularity)
    tracer = _LayerTracer(set(names) if names is not None else None)
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # noqa: BLE001 - fx raises TraceError, TypeError, NotImplementedError, ...
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise FxTraceError(
            f"torch.fx cannot trace {type(module).__name__} at granularity {granularity.text!r}: "
            f"{type(exc).__name__}: {reason}. Make the untraceable part a layer (a coarser granularity, "
            "or a container whose children hold it), or remove the data-dependent control flow"
        ) from None
    gm = fx.GraphModule(module, graph)
    nodes = list(gm.graph.nodes)

    # the layers, in the order they are first called
    order: list[str] = []
    unit_of: dict = {}
    called: set[str] = set()
    for n in nodes:
        if n.op != "call_module":
            continue
        target = str(n.target)
        layer = target if names is None else owner(target, tracer.layers)
        if target in called and not any(True for _ in module.get_submodule(target).parameters()):
            continue  # a parameter-free module called again: an operation, joins a layer below
        called.add(target)
        if layer not in order:
            order.append(layer)
        unit_of[n] = order.index(layer)
    if not order:
        raise InvalidGraphError(f"{type(module).__name__}'s forward calls no layer at granularity {granularity.text!r}")

    # operations outside the layers: the layer of their latest input, else of their first reader
    plain = [n for n in nodes if n not in unit_of and n.op not in ("placeholder", "output")]
    for n in plain:
        producers = [unit_of[a] for a in n.all_input_nodes if a in unit_of]
        if producers:
            unit_of[n] = max(producers)
    for n in reversed(plain):
        if n not in unit_of:
            readers = [unit_of[u] for u in n.users if u in unit_of]
            if not readers:  # feeds only the output: the last layer
                readers = [len(order) - 1]
            unit_of[n] = min(readers)

    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(order)))
    for n, layer in unit_of.items():
        for a in n.all_input_nodes:
            if a in unit_of and unit_of[a] != layer:
                dag.add_edge(unit_of[a], layer)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = [order[u] for u, _ in nx.find_cycle(dag)]
        raise InvalidGraphError(
            f"the layers of {type(module).__name__} at granularity {granularity.text!r} form a cycle "
            f"({' -> '.join(cycle)} -> {cycle[0]}): a module with parameters is called at several places "
            "that other layers separate (shared weights); choose a coarser granularity"
        )

    top = split_module(gm, module, lambda n: unit_of[n], keep_original_order=False)
    calls = [n for n in top.graph.nodes if n.op == "call_module"]
    index = {f"submod_{i}": i for i in range(len(order))}
    pos = {index[str(c.target)]: k for k, c in enumerate(calls)}
    ranked = sorted(range(len(order)), key=lambda i: pos[i])  # split_module's topological order
    rank = {u: r for r, u in enumerate(ranked)}
    producer: dict = {}
    for c in calls:
        producer[c] = (rank[index[str(c.target)]], None)
    for n in top.graph.nodes:
        if n.op == "call_function" and n.args and n.args[0] in producer and producer[n.args[0]][1] is None:
            producer[n] = (producer[n.args[0]][0], n.args[1])  # getitem of a layer's outputs
    sources, readers = [], []
    for c in calls:
        srcs = [producer[a][0] if a in producer else None for a in c.args]
        sources.append(srcs)
        inner = [n for n in getattr(top, str(c.target)).graph.nodes if n.op == "placeholder"]
        if any(a.op == "placeholder" and not _metadata_only(p) for a, p in zip(c.args, inner, strict=True)):
            readers.append(order[index[str(c.target)]])
    out_node = next(n for n in top.graph.nodes if n.op == "output")
    graph_outputs = sorted({producer[a][0] for a in out_node.all_input_nodes if a in producer})
    names_ranked = [order[u] for u in ranked]
    unused = [n for n in (names or []) if n not in order]
    return Traced(
        names=names_ranked,
        modules=[module.get_submodule(n) for n in names_ranked],
        top=top,
        submods=[getattr(top, str(c.target)) for c in calls],
        sources=sources,
        graph_outputs=graph_outputs,
        input_readers=sorted(readers, key=names_ranked.index),
        unused=unused,
    )
