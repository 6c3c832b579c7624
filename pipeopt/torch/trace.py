"""From an ``nn.Module`` to its layers: the granularity, the torch.fx trace, and one
sub-module per layer.

A *layer* (a node of pipeopt's layer graph) is a module of the model named by its fully
qualified name (FQN, ``"layers.3"``, ``"head"``) at one of three granularities:

``"container:NAME"`` (default ``"container:layers"``)
    the children of the container module ``NAME`` (``layers.0`` ... ``layers.7``) plus, for
    every module on the path from the root to the container, its other children (the
    embeddings before, the final norm and the head after; for a container ``transformer.h``
    also ``transformer.wte``, ``transformer.ln_f``, ``lm_head``, ...).
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
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
from torch import fx, nn
from torch.fx.passes.split_module import split_module

from ..errors import InvalidGraphError, InvalidProblemError

GRANULARITIES = ("container:NAME", "children", "leaves")
"""The accepted forms of ``granularity`` (``NAME`` is a module FQN, e.g. ``layers``)."""


@dataclass(frozen=True)
class Granularity:
    """A parsed granularity: ``kind`` is ``"container"``, ``"children"`` or ``"leaves"``;
    ``container`` the container's FQN (``None`` for the others); ``text`` as the user wrote it."""

    kind: str
    container: str | None
    text: str


def parse_granularity(text) -> Granularity:
    """Parse ``"container:layers"``, ``"children"`` or ``"leaves"``.

    Raises
    ------
    InvalidProblemError
        If ``text`` is none of the forms of :data:`GRANULARITIES` (or names an empty container).
    """
    if isinstance(text, str):
        if text in ("children", "leaves"):
            return Granularity(text, None, text)
        if text.startswith("container:") and text.split(":", 1)[1].strip():
            return Granularity("container", text.split(":", 1)[1].strip(), text)
    raise InvalidProblemError(
        f"unknown granularity {text!r}; choose 'container:NAME' (the children of the module NAME, e.g. "
        "'container:layers', plus the modules before and after it), 'children' (the root's children) "
        "or 'leaves' (every leaf module)"
    )


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
    path = granularity.container
    try:
        container = module.get_submodule(path)
    except AttributeError:
        found = _containers(module)
        raise InvalidProblemError(
            f"container {path!r} not found in {type(module).__name__}; its list-like containers are "
            f"{found[:10] or 'none (use granularity children or leaves)'}"
        ) from None
    if not list(container.named_children()):
        raise InvalidProblemError(f"container {path!r} of {type(module).__name__} has no children to split into layers")
    names: list[str] = []
    parts = path.split(".")
    for depth in range(len(parts)):  # the other children of every module on the path
        prefix = ".".join(parts[:depth])
        parent = module.get_submodule(prefix) if prefix else module
        for child, _ in parent.named_children():
            fqn = f"{prefix}.{child}" if prefix else child
            if fqn == ".".join(parts[: depth + 1]):
                names.extend(f"{path}.{c}" for c, _ in container.named_children())
            else:
                names.append(fqn)
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
    """

    names: list
    modules: list
    top: fx.GraphModule
    submods: list
    sources: list
    graph_outputs: list
    input_readers: list
    unused: list


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
        From :func:`parse_granularity`.

    Returns
    -------
    Traced

    Raises
    ------
    InvalidProblemError
        If the container is not found (:func:`layer_names`).
    InvalidGraphError
        If torch.fx cannot trace the model (data-dependent control flow, ...; the message
        quotes torch's reason and suggests a coarser granularity or a container whose
        children are traceable), if no layer is called, or if a module with parameters is
        called at two places that other layers separate.
    """
    names = layer_names(module, granularity)
    tracer = _LayerTracer(set(names) if names is not None else None)
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # noqa: BLE001 - fx raises TraceError, TypeError, NotImplementedError, ...
        reason = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise InvalidGraphError(
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
