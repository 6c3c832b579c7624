"""What every method of every problem declares about itself: :class:`Method`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ALPHA_OVERHEAD = frozenset({"latency", "overhead"})
""":attr:`Method.terms` of a method that models both optional terms."""

RECOMPUTE = frozenset({"recompute"})
""":attr:`Method.terms` of a method that models activation recomputation (the partition problem's
``recompute`` option other than ``"none"``)."""

ZERO = frozenset({"zero"})
""":attr:`Method.terms` of a method that models data parallelism and ZeRO (``Settings.dp``, ``zero``,
``gradient_ratio``, ``optimizer_ratio``): the partition problem's ``dp`` and ``auto`` (bottleneck
objective), ``milp`` (bottleneck objective) and the schedule problem's ``exhaustive`` (the
executor's rule) and ``milp``."""

LATENCY = frozenset({"latency"})
""":attr:`Method.terms` of a method that models the per-message latency only."""


@dataclass(frozen=True)
class Method:
    """One method of one problem, referenced directly (no dispatch through strings).

    Every method is a plain function ``function(problem, *, time_limit=60.0, solver="cbc",
    seed=0, threads=2) -> Result``: ``time_limit`` is seconds or the
    :class:`~pipeopt.backends.deadline.Deadline` that :func:`pipeopt.solve` created at entry;
    ``solver`` the MILP backend (``"cbc"`` or ``"highs"``); ``threads`` the CP-SAT search
    threads. A method that does not use an argument accepts and ignores it (a heuristic has
    no solver).

    Attributes
    ----------
    problem
        Problem name (``"partition"``, ...).
    name
        Method name as typed on the command line.
    function
        The method function.
    exact
        True if the method proves optimality or a lower bound.
    space
        Search space it covers (:mod:`pipeopt.problems.spaces`; a gap is taken against bounds of
        the same or a larger space): ``"one-order"`` or ``"replicated-one-order"`` for
        partition; ``"auto"`` follows the problem's option.
    default
        Part of the default ``pipeopt bench`` run.
    source
        Paper or framework it implements.
    requires
        What an instance must carry for the method to apply (``""``: any instance;
        ``"torch"``: a layer graph of :func:`pipeopt.torch.from_torch` at a container
        granularity, which the frameworks' block-counting splits read). Elsewhere the method
        raises :class:`~pipeopt.errors.InvalidProblemError`.
    terms
        The optional cost terms an exact method models exactly (``"latency"``: the cluster's
        per-message latency; ``"overhead"``: the stage overhead,
        :func:`pipeopt.cost.rules.stage_overhead`). :func:`pipeopt.solve` refuses an exact method
        an instance whose terms it does not model (a non-zero latency or overhead), with
        :class:`~pipeopt.errors.InvalidProblemError`, rather than claim an optimum of another
        cost model; a heuristic's plan is scored by :func:`pipeopt.evaluate` whatever the terms.
        ``"zero"``: the settings' data parallelism and training state (``Settings.dp``, ``zero``,
        ``gradient_ratio``, ``optimizer_ratio``; :data:`ZERO`: the partition problem's ``dp`` and
        ``auto``, which runs it, ``milp``, and the schedule problem's ``exhaustive``).
        ``"recompute"``: the method chooses the recomputed layers the problem's ``recompute``
        option asks for (:data:`RECOMPUTE`); :func:`pipeopt.solve` refuses any other method
        (exact or not) a ``recompute`` other than ``"none"``.
    """

    problem: str
    name: str
    function: Callable
    exact: bool
    space: str = "auto"
    default: bool = True
    source: str = ""
    requires: str = ""
    terms: frozenset = frozenset()

    def unmodelled(self, instance) -> list[str]:
        """The optional cost terms ``instance`` carries (non-zero) that this exact method does
        not model (:attr:`terms`); ``[]`` for a heuristic."""
        if not self.exact:
            return []
        from ..cost.rules import stage_overhead

        out = []
        if instance.cluster.latency and "latency" not in self.terms:
            out.append(f"a message latency ({instance.cluster.latency:g} s)")
        if any(stage_overhead(instance.graph)) and "overhead" not in self.terms:
            out.append("a stage overhead (graph attribute stage_overhead)")
        s = instance.settings
        if s.data_parallel and "zero" not in self.terms:
            out.append(f"data parallelism or training state (dp={s.dp}, zero={s.zero}, gradient_ratio="
                       f"{s.gradient_ratio:g}, optimizer_ratio={s.optimizer_ratio:g})")
        return out

    def __call__(self, problem, **kw):
        """Run the method on a problem object."""
        return self.function(problem, **kw)
