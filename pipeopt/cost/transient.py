"""The memory a stage needs beyond its saved activations and training state, when the profile
measured it (graph attribute ``transient_memory``: true; :func:`pipeopt.torch.from_torch`
sets it with measured costs).

Two terms, per stage (:func:`pipeopt.cost.rules.transient_memory`, docs/cost-model.md):

* **the outputs it keeps**: each microbatch's output stays with the stage until that
  microbatch's backward (torch's pipeline stage keeps it for the backward), and the last stage
  keeps all M outputs of the iteration (the merged output of ``step()``):
  :func:`pipeopt.cost.rules.outputs_kept` times the bytes it sends per microbatch (the bytes
  crossing the cut after it; the last stage's: the ``out_bytes`` of the graph's sinks);
* **the backward's excess**: while layer L's backward runs, the microbatch still holds the saved
  activations of the stage's layers up to L plus L's temporaries (``bwd_temp_bytes``: the peak
  a layer's backward allocates on top of what it held, measured with ``MemTracker``); the
  largest of these over L, less one microbatch's activations, if positive
  (:func:`pipeopt.cost.rules.backward_excess`);
* **a tensor saved twice is held once**: less ``saved_twice_bytes`` (an edge attribute: a tensor
  both the producer and the consumer save, each layer's ``act_bytes`` being measured alone) per
  microbatch in flight for the edges inside the stage (:func:`pipeopt.cost.rules.saved_once`).

The first term depends on where the stage ends, not only on its layers: a stage's memory no
longer grows with its layers, so the ends that fit a capacity need not be an interval. The
dense DP tests every stage (:mod:`pipeopt.problems.partition.dp`); the methods whose memory rows
assume an interval refuse an instance with a finite memory and these terms
(:func:`refuse_transient`). With unlimited memory (the default of a measured profile) the terms
change no plan, only the memory reported.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidProblemError

FLAG = "transient_memory"
"""The graph attribute that switches the terms on."""

HANDLED_BY = "the partition problem's dp (exact) and its baselines (scored by evaluate)"
"""The exact methods that handle the terms under a finite memory."""


def has_transient(graph) -> bool:
    """True if the graph's memory includes the outputs kept and the backward's temporaries."""
    return bool(getattr(graph, "graph", {}).get(FLAG))


def sink_out_bytes(graph) -> float:
    """The model's output bytes per microbatch: ``out_bytes`` of the layers without successors."""
    return float(sum(graph.nodes[u]["out_bytes"] for u in graph.nodes if graph.out_degree(u) == 0))


def bwd_temp(graph, layer) -> float:
    """``bwd_temp_bytes`` of a layer (0 if absent)."""
    return float(graph.nodes[layer].get("bwd_temp_bytes", 0.0))


def refuse_transient(instance, what: str, handled_by: str = HANDLED_BY) -> None:
    """Raise if the instance has a finite memory and the transient terms (module docstring):
    for the methods whose memory rows assume that the ends of a stage that fit are an interval.

    Raises
    ------
    InvalidProblemError
        Naming ``what`` and the methods that handle the terms.
    """
    finite = any(math.isfinite(d.memory) for d in instance.cluster.devices)
    if finite and has_transient(instance.graph):
        raise InvalidProblemError(
            f"{what} does not model the memory of the outputs a stage keeps and of its backward temporaries "
            f"(graph attribute {FLAG!r}, measured by the torch profile) under a finite memory; "
            f"it is handled by {handled_by} (or drop the memory limit)"
        )


class ChainTransient:
    """The terms on a chain of units (:class:`pipeopt.graph.Chain`): per unit u the value
    ``act_prefix[u] + max over its layers L (its activations through L + L's bwd_temp_bytes)``,
    a range-maximum table over them, and the model's output bytes. ``peak(a, b)``: the largest
    value over units ``a..b-1`` (arrays broadcast; 0 if empty), so that ``peak(a, b) -
    act_prefix[a]`` is the stage's peak of :func:`pipeopt.cost.rules.backward_excess`; and
    ``twice[a, b]``, the ``saved_twice_bytes`` of the edges inside units ``a..b-1``
    (:func:`pipeopt.cost.rules.saved_once`)."""

    def __init__(self, chain, graph) -> None:
        self.on = has_transient(graph)
        n = chain.n
        self.final_out = sink_out_bytes(graph) if self.on else 0.0
        unit = np.zeros(n)
        if self.on:  # per unit: act_prefix at its start + the largest (its activations through a layer + its temporaries)
            before = np.concatenate([[0.0], np.cumsum(chain.act)])[:-1]
            for u, layers in enumerate(chain.units):
                through = np.cumsum([float(graph.nodes[x]["act_bytes"]) for x in layers])
                unit[u] = before[u] + float(np.max(through + np.array([bwd_temp(graph, x) for x in layers])))
        levels = [unit]
        width = 1
        while 2 * width <= n:
            prev = levels[-1]
            levels.append(np.maximum(prev[:-width], prev[width:]))
            width *= 2
        self.levels = levels
        self.twice = np.zeros((n + 1, n + 1))
        if self.on:  # twice[a, b]: saved_twice_bytes of the edges inside units a..b-1 (a 2-D prefix sum)
            unit_of = chain.unit_of
            grid = np.zeros((n + 1, n + 1))
            for u, v, nb in graph.edges(data="saved_twice_bytes"):
                if nb:
                    grid[unit_of[u], unit_of[v] + 1] += float(nb)
            self.twice = np.cumsum(np.cumsum(grid, axis=1)[::-1], axis=0)[::-1]

    def __bool__(self) -> bool:
        return self.on

    def peak(self, a, b):
        """The largest unit value over ``a..b-1`` (sparse table: two overlapping powers of two)."""
        a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
        length = np.maximum(b - a, 1)
        k = np.floor(np.log2(length)).astype(np.int64)
        out = np.zeros(np.broadcast(a, b).shape)
        for lvl in np.unique(k):
            sel = np.broadcast_to(k == lvl, out.shape)
            arr = self.levels[int(lvl)]
            aa = np.broadcast_to(a, out.shape)[sel]
            bb = np.broadcast_to(b, out.shape)[sel]
            hi = np.clip(bb - (1 << int(lvl)), 0, arr.size - 1)
            lo = np.clip(aa, 0, arr.size - 1)
            out[sel] = np.maximum(arr[lo], arr[hi])
        return np.where(b > a, out, 0.0)
