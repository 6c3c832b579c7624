"""The search spaces a result is stated in, and which contains which.

Every :class:`~pipeopt.result.Result` names the space its method searched
(:attr:`~pipeopt.result.Result.space`), and a gap is computed only against a lower bound proven
over the same space or a larger one (:func:`contains`): a bound on the optimum of a larger space
is at most the optimum of a smaller one, so it bounds the smaller space too, while a bound of a
smaller space says nothing about a plan outside it.

Spaces of layer splits (the partition and placement problems; S workers, a stage runs on one
worker or, replicated, on several):

``"one-order"`` (:data:`ONE_ORDER`)
    Contiguous splits of one topological order of the layers (pipeopt's layer order, the
    instance's chain: :attr:`pipeopt.instance.Instance.chain`): stage t holds the units
    ``b_{t-1} .. b_t - 1`` of that order, one worker per stage. The space of the partition
    problem without replication and of every method that cuts the layer order (``dp``,
    ``probe``, ``milp``, ``cpsat`` and the baselines that count layers, parameters or time).
``"replicated-one-order"`` (:data:`REPLICATED_ONE_ORDER`)
    The same contiguous splits of the same order, each stage on one or more workers
    (PipeDream's stage replication: a stage on m workers runs every m-th microbatch and adds the
    all-reduce of its weights), S workers in all. A one-order split is the
    case of one worker per stage.
``"convex"`` (:data:`CONVEX`)
    Splits of the layer DAG into convex stages (no path leaves a stage and comes back into it),
    ordered so that every edge goes forward or stays inside a stage, one worker per stage:
    equivalently the chains of ideals ``{} = I_0 < I_1 < ... < I_S = all layers``
    (:mod:`pipeopt.problems.ideals`). Every contiguous split of a topological order is such a
    split, so ``one-order`` is contained in it; it is larger when the DAG has parallel branches.
``"replicated-convex"`` (:data:`REPLICATED_CONVEX`)
    Convex ordered splits with stage replication (PipeDream's planner cuts the DAG between
    antichains: its plans are here, and when a plan is not contiguous in pipeopt's order its
    result names this space). Contains the three spaces above.

Containment (:func:`contains`): one-order ⊂ convex ⊂ replicated-convex and one-order ⊂
replicated-one-order ⊂ replicated-convex; convex and replicated-one-order are not comparable.

With activation recomputation (the partition problem's ``recompute`` option; the plans'
``Stage.recompute``), the contiguous spaces grow by a per-layer choice:

``"one-order+recompute"``, ``"replicated-one-order+recompute"`` (:data:`ONE_ORDER_RECOMPUTE`, :data:`REPLICATED_ONE_ORDER_RECOMPUTE`)
    The same splits, each layer recomputed (full, or selective where the profile measures it) or
    not (``recompute="auto"``; the frameworks' recomputation baselines). A split without
    recomputation is the case of no layer recomputed: ``one-order`` lies in it.
``"one-order+full-recompute"``, ``"replicated-one-order+full-recompute"`` (:data:`ONE_ORDER_FULL_RECOMPUTE`, :data:`REPLICATED_ONE_ORDER_FULL_RECOMPUTE`)
    The same splits with every layer recomputed (``recompute="full"``): one choice of the
    per-layer space, disjoint from ``one-order``.

Spaces of the other problems, each compared only with itself (their containment with any other
space is not claimed):

``"split"`` (:data:`SPLIT`)
    The joint, group and allocate problems: every stage runs split execution (its forward and
    backward shares on several resource kinds at once).
``"sequential"`` (:data:`SEQUENTIAL`)
    The allocate problem's fixed partition without the split (the classic model).
``"bipartition"`` (:data:`BIPARTITION`)
    The Bi-Partition problem (forward and backward split separately).

``"auto"`` (:data:`AUTO`) is not a space: a :class:`~pipeopt.problems.method.Method` declared
with it runs in the space its problem's options select (the partition problem's
``replication``: ``one-order`` or ``replicated-one-order``).
"""

from __future__ import annotations

ONE_ORDER = "one-order"
REPLICATED_ONE_ORDER = "replicated-one-order"
CONVEX = "convex"
REPLICATED_CONVEX = "replicated-convex"

SPLIT = "split"
SEQUENTIAL = "sequential"
BIPARTITION = "bipartition"

ONE_ORDER_RECOMPUTE = "one-order+recompute"
REPLICATED_ONE_ORDER_RECOMPUTE = "replicated-one-order+recompute"
ONE_ORDER_FULL_RECOMPUTE = "one-order+full-recompute"
REPLICATED_ONE_ORDER_FULL_RECOMPUTE = "replicated-one-order+full-recompute"

AUTO = "auto"
"""Not a space: the method follows its problem's options (:class:`~pipeopt.problems.method.Method`)."""

SPLIT_SPACES = (ONE_ORDER, REPLICATED_ONE_ORDER, CONVEX, REPLICATED_CONVEX)
"""The spaces of layer splits, smallest first."""

RECOMPUTE_SPACES = (ONE_ORDER_RECOMPUTE, REPLICATED_ONE_ORDER_RECOMPUTE, ONE_ORDER_FULL_RECOMPUTE,
                    REPLICATED_ONE_ORDER_FULL_RECOMPUTE)
"""The contiguous spaces with recomputation (module docstring)."""

SPACES = (*SPLIT_SPACES, *RECOMPUTE_SPACES, SPLIT, SEQUENTIAL, BIPARTITION)
"""Every space name pipeopt's methods state."""

_LARGER: dict[str, frozenset[str]] = {
    ONE_ORDER: frozenset({ONE_ORDER, REPLICATED_ONE_ORDER, CONVEX, REPLICATED_CONVEX,
                          ONE_ORDER_RECOMPUTE, REPLICATED_ONE_ORDER_RECOMPUTE}),
    REPLICATED_ONE_ORDER: frozenset({REPLICATED_ONE_ORDER, REPLICATED_CONVEX, REPLICATED_ONE_ORDER_RECOMPUTE}),
    CONVEX: frozenset({CONVEX, REPLICATED_CONVEX}),
    REPLICATED_CONVEX: frozenset({REPLICATED_CONVEX}),
    ONE_ORDER_RECOMPUTE: frozenset({ONE_ORDER_RECOMPUTE, REPLICATED_ONE_ORDER_RECOMPUTE}),
    REPLICATED_ONE_ORDER_RECOMPUTE: frozenset({REPLICATED_ONE_ORDER_RECOMPUTE}),
    ONE_ORDER_FULL_RECOMPUTE: frozenset({ONE_ORDER_FULL_RECOMPUTE, REPLICATED_ONE_ORDER_FULL_RECOMPUTE,
                                         ONE_ORDER_RECOMPUTE, REPLICATED_ONE_ORDER_RECOMPUTE}),
    REPLICATED_ONE_ORDER_FULL_RECOMPUTE: frozenset({REPLICATED_ONE_ORDER_FULL_RECOMPUTE,
                                                    REPLICATED_ONE_ORDER_RECOMPUTE}),
}
"""Each split space -> the spaces that contain it (itself included)."""


def contains(big: str, small: str) -> bool:
    """True if every plan of space ``small`` is a plan of space ``big`` (so a lower bound proven
    over ``big`` bounds ``small`` too).

    Reflexive; for the split spaces the containment of the module docstring; a schedule's space
    ``schedule:<name>`` lies in ``schedule:<name>+free-w`` (the same chunks, every W placed
    freely); every fixed order's space lies in the free-order space of its placement
    (:data:`FREE_ORDER_SPACES`); any other name (the other problems' spaces, an unknown one) contains only itself.
    """
    big, small = str(big), str(small)
    if big == small:
        return True
    if small.startswith("schedule:") and big == small + "+free-w":
        return True  # a schedule's own W places are one choice of the free placement
    free = "schedule:free-looped" if big.startswith("schedule:free-looped") else big
    if free in FREE_ORDER_SPACES and small.startswith("schedule:"):
        name = small[len("schedule:"):].removesuffix("+free-w")
        return name in FREE_ORDER_SPACES[free]  # a fixed order is one order of the free order's shape
    return big in _LARGER.get(small, ())


FREE_ORDER_SPACES = {
    "schedule:free": ("GPipe", "1F1B", "ZB-greedy"),
    "schedule:free-looped": ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"),
    "schedule:free-v": ("ZBVZeroBubble", "DualPipeV"),
}
"""The free-order spaces (:mod:`pipeopt.schedules.free`: every split and every order of F, I,
W of one shape) and the fixed-order schedules of that shape whose spaces they hold: one stage
per rank (``schedule:free``); v stages per rank looped (``schedule:free-looped<v>``, e.g.
``schedule:free-looped2``: the interleaved schedules run with the same v); the V placement
(``schedule:free-v``). As for every schedule space, the caller compares results of the same p,
v and m (a fixed schedule's space name does not carry v: ``pipeopt bench`` runs every
schedule of one row group with one ``stages_per_rank``)."""


LEGACY = {"straight": ONE_ORDER, "replicated": REPLICATED_ONE_ORDER}
"""The former names of the two contiguous spaces (``straight``, ``replicated``), which benchmark
rows written before the rename carry; :func:`pipeopt.bench.load_rows` translates them."""


def canonical(name: str) -> str:
    """The current name of a space (:data:`LEGACY` names translated, others as given)."""
    return LEGACY.get(name, name)


def replicated(space: str) -> bool:
    """True for a space whose stages may run on several workers (PipeDream's replication)."""
    return space in (REPLICATED_ONE_ORDER, REPLICATED_CONVEX, REPLICATED_ONE_ORDER_RECOMPUTE,
                     REPLICATED_ONE_ORDER_FULL_RECOMPUTE)


def with_recompute(space: str, recompute: str) -> str:
    """The space of a contiguous split space (``one-order`` or ``replicated-one-order``) under a
    partition problem's ``recompute`` option: itself for ``"none"``, its ``+recompute`` space for
    ``"auto"``, its ``+full-recompute`` space for ``"full"``."""
    if recompute == "none":
        return space
    return f"{space}+{'full-recompute' if recompute == 'full' else 'recompute'}"
