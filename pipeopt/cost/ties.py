"""Tied parameters: one weight used by layers that may sit on different stages.

GPT-2 ties its LM head to its token embedding (``lm_head.weight is transformer.wte.weight``):
one parameter, read by the first layer and by the last. A pipeline that puts the two layers on
different stages keeps a copy of the weight, its gradient and its optimizer state on each of
them, and keeps the copies equal by summing the two gradients before every optimizer step
(Megatron-LM's embedding all-reduce after the pipeline flush).

A layer graph records its ties in the graph attribute ``tied`` (what
:func:`pipeopt.torch.from_torch` writes; the native JSON keeps it with the other graph
attributes)::

    graph.graph["tied"] = [{"name": "tok_emb.weight", "aliases": ["head.weight"],
                            "bytes": 524288.0, "state_bytes": 2097152.0,
                            "layers": ["tok_emb", "head"]}]

``bytes`` are the weight's bytes as the module holds them (what its gradient's all-reduce
moves), ``state_bytes`` the weight with its gradient and optimizer state (the per-byte rule of
every other weight, :mod:`pipeopt.torch.state`); neither is in any layer's ``param_bytes``.
``layers`` (two or more) are the layers that use it.

The cost model (docs/cost-model.md, "Tied parameters"; the rules are in
:mod:`pipeopt.cost.rules`):

* **memory**: every stage holding at least one of a tie's layers keeps the tie's
  ``state_bytes`` as parameters (weight versions included,
  :func:`pipeopt.cost.rules.stage_memory`): a stage-level rule, monotone in the stage's layers;
* **time**: the tie's gradient is all-reduced between the k workers (replicas included) of the
  stages that hold it, once per iteration, after the flush and before the optimizer step
  (:func:`pipeopt.cost.rules.tie_sync_time`, the ring all-reduce): added to the ``iteration``
  and ``gpipe`` objectives; the steady-state ``bottleneck`` (the period of an unflushed
  pipeline, per microbatch) does not contain it.
* **sums in one stage**: a stage whose backward holds k >= 2 of a tie's layers sums their
  gradient contributions k - 1 times per microbatch, out of place (autograd), each the tie's
  measured ``sum_s`` (``{kind: seconds}``, optional; :func:`pipeopt.cost.rules.tie_sum_time`):
  added to that stage's backward. The DP and the event-time MILP price it; the methods that
  read a stage's work as prefix sums refuse where it can differ between splits
  (:meth:`ChainTies.sums_bind`, :meth:`pipeopt.problems.partition.PartitionProblem.refuse_tie_sums`).

:func:`pipeopt.graph.ties_of` reads and checks the attribute (every instance's graph is checked
with it); this module locates the ties on a chain or a plan and names the methods that handle
them; it turns no bytes into seconds.
"""

from __future__ import annotations

import numpy as np

from . import rules
from ..errors import InvalidProblemError
from ..graph import Tie, ties_of

__all__ = ["HANDLED_BY", "ChainTies", "Tie", "refuse_ties", "stage_ties", "ties_of"]


HANDLED_BY = ("the partition problem's methods dp, probe, milp and cpsat (bottleneck objective) and milp "
              "(iteration and gpipe objectives), and its baselines (scored by evaluate)")
"""The exact methods that charge tied parameters (:func:`refuse_ties` names them)."""


def refuse_ties(instance, what: str, handled_by: str = HANDLED_BY) -> None:
    """Raise unless the instance has no tied parameters: for the methods and problems whose
    models do not charge a tie on every stage that holds it.

    Raises
    ------
    InvalidProblemError
        Naming ``what`` refuses, the ties, and the methods that handle them (``handled_by``).
    """
    ties = ties_of(instance.graph)
    if ties:
        names = ", ".join(t.name for t in ties[:3]) + (" ..." if len(ties) > 3 else "")
        raise InvalidProblemError(
            f"{what} does not model tied parameters ({names}: one weight on every stage that uses it, "
            f"its gradient all-reduced between them); they are handled by {handled_by}"
        )


def stage_ties(ties, stage_of) -> list[list[int]]:
    """The stages that hold each tie: ``[sorted stages]`` per tie, ``stage_of`` mapping a layer
    to its stage (a dict, or a callable giving an iterable of stages for a layer, e.g. both
    passes of a Bi-Partition layer)."""
    out = []
    for t in ties:
        held: set[int] = set()
        for x in t.layers:
            s = stage_of(x) if callable(stage_of) else stage_of[x]
            held.update([int(s)] if isinstance(s, (int, np.integer)) else (int(v) for v in s))
        out.append(sorted(held))
    return out


class ChainTies:
    """The ties located on a chain of units (:class:`pipeopt.graph.Chain`): which units use
    each, and the tie bytes a stage of units ``a..b-1`` holds (vectorised).

    Parameters
    ----------
    chain
        The chain.
    ties
        :func:`ties_of` of its graph.
    """

    def __init__(self, chain, ties) -> None:
        self.ties = tuple(ties)
        unit_of = chain.unit_of if self.ties else {}
        # every layer's unit, repeats kept (two users merged into one unit are two users), and the units
        self.layer_units = [np.sort([unit_of[x] for x in t.layers]).astype(np.int64) for t in self.ties]
        self.units = [np.unique(u) for u in self.layer_units]
        self.state = np.array([t.state_bytes for t in self.ties], dtype=float)

    def __bool__(self) -> bool:
        return bool(self.ties)

    def held(self, a, b) -> list[np.ndarray]:
        """Per tie: whether a stage of units ``a..b-1`` holds it (arrays broadcast)."""
        a, b = np.asarray(a), np.asarray(b)
        return [np.searchsorted(u, b, side="left") > np.searchsorted(u, a, side="left") for u in self.units]

    def users(self, a, b) -> list[np.ndarray]:
        """Per tie: how many of its layers a stage of units ``a..b-1`` holds (arrays broadcast)."""
        a, b = np.asarray(a), np.asarray(b)
        return [np.searchsorted(u, b, side="left") - np.searchsorted(u, a, side="left") for u in self.layer_units]

    def sum_time(self, a, b, kind: str, units: float = 1.0):
        """Seconds per microbatch the gradient sums of the ties add to the backward of a stage of
        units ``a..b-1`` on ``units`` units of ``kind`` (:func:`pipeopt.cost.rules.tie_sum_time`
        per tie; 0.0 without ties or measured sums; arrays broadcast)."""
        total = 0.0
        for k, t in zip(self.users(a, b), self.ties, strict=True):
            sec = t.sum_on(kind)
            if sec:
                total = total + rules.tie_sum_time(k, sec / units)
        return total

    def sums_bind(self, n: int, stages: int) -> list[str]:
        """The ties with a measured sum (``sum_s``) two of whose layers one stage of a split of the
        n units into ``stages`` non-empty stages can hold (two users in one unit, or two units at
        most ``n - stages`` apart): where :func:`pipeopt.cost.rules.tie_sum_time` can differ
        between splits. Their names."""
        return [t.name for t, bind in zip(self.ties, self.binding(n, stages), strict=True) if bind]

    def binding(self, n: int, stages: int) -> list[bool]:
        """Per tie: :meth:`sums_bind`'s test (a measured sum, and two layers one stage can hold)."""
        return [any(sec > 0 for _, sec in t.sum_s) and u.size > 1 and int(np.diff(u).min()) <= n - stages
                for t, u in zip(self.ties, self.layer_units, strict=True)]

    def state_bytes(self, a, b):
        """Tie ``state_bytes`` a stage of units ``a..b-1`` keeps (0.0 without ties; arrays broadcast)."""
        if not self.ties:
            return 0.0
        total = np.zeros(np.broadcast(np.asarray(a), np.asarray(b)).shape)
        for h, s in zip(self.held(a, b), self.state, strict=True):
            total = total + np.where(h, s, 0.0)
        return total
