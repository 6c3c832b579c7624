"""One vocabulary of schedule names: :func:`schedule_name` turns what a user types into the
canonical name every part of pipeopt uses.

Canonical names are torch.distributed.pipelining's own (``get_schedule_class``'s keys, the
names :data:`pipeopt.schedules.GENERATORS` is keyed by) plus the two schedules only the
simulator runs:

========================  =============================================================  ======================
canonical                 also accepted (any case; ``-``, ``_``, spaces ignored)          runs in
========================  =============================================================  ======================
``GPipe``                 ``ScheduleGPipe``, ``gpipe``, ``fill-drain``                     schedule problem,
                                                                                          simulator, ``run``
``1F1B``                  ``Schedule1F1B``, ``1f1b``, ``pipedream-flush``                  schedule problem,
                                                                                          simulator, ``run``
``Interleaved1F1B``       ``ScheduleInterleaved1F1B``, ``interleaved``, ``i1f1b``          schedule problem
``LoopedBFS``             ``ScheduleLoopedBFS``, ``looped``, ``bfs``                       schedule problem
``InterleavedZeroBubble`` ``ScheduleInterleavedZeroBubble``, ``zb``, ``zb1p``,              schedule problem
                          ``zero-bubble``
``ZBVZeroBubble``         ``ScheduleZBVZeroBubble``, ``zbv``, ``zb-v``                      schedule problem
``DualPipeV``             ``ScheduleDualPipeV``, ``dualpipev``, ``dualpipe-v``              schedule problem
``free``                  ``free-order``, ``optimal-order``                               schedule problem
                                                                                          (its order chosen,
                                                                                          :mod:`.free`)
``async``                 ``pipedream-async``, ``async-pipedream``                         simulator
``split``                 ``split-execution``, ``duan-wu``                                  simulator
========================  =============================================================  ======================

``async`` (asynchronous PipeDream, weight stashing, no flush) and ``split`` (Duan & Wu's split
execution) are not torch schedules: only :func:`pipeopt.simulate` plays them. Each entry point
passes the names it runs as ``among``, and an unknown name - or one that entry point does not
run - is an :class:`~pipeopt.errors.InvalidProblemError` listing the choices.

>>> schedule_name("schedule1f1b"), schedule_name("zbv"), schedule_name("Interleaved_1F1B")
('1F1B', 'ZBVZeroBubble', 'Interleaved1F1B')
"""

from __future__ import annotations

from ..errors import InvalidProblemError

__all__ = ["ALIASES", "SIMULATED", "TORCH_SCHEDULES", "schedule_key", "schedule_name"]

TORCH_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble",
                   "DualPipeV")
"""torch.distributed.pipelining's schedules, by their canonical (torch's) names."""

SIMULATED = ("GPipe", "1F1B", "async", "split")
"""The schedules :func:`pipeopt.simulate` plays (``async``, ``split``: simulator only)."""

ALIASES: dict[str, tuple[str, ...]] = {
    "GPipe": ("ScheduleGPipe", "gpipe", "fill-drain"),
    "1F1B": ("Schedule1F1B", "1f1b", "pipedream-flush"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", "interleaved", "i1f1b"),
    "LoopedBFS": ("ScheduleLoopedBFS", "looped", "bfs"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", "zb", "zb1p", "zero-bubble"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", "zbv", "zb-v"),
    "DualPipeV": ("ScheduleDualPipeV", "dualpipev", "dualpipe-v"),
    "free": ("free-order", "optimal-order"),
    "async": ("pipedream-async", "async-pipedream"),  # not "pipedream": PipeDream-Flush is 1F1B
    "split": ("split-execution", "duan-wu"),
}
"""Canonical name -> the other spellings it accepts (the table of the module docstring)."""


def _key(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch not in "-_ ")


_LOOKUP = {_key(alias): name for name, aliases in ALIASES.items() for alias in (name, *aliases)}


def schedule_name(text, among=None, where: str = "here") -> str:
    """The canonical name of schedule ``text`` (module docstring).

    Parameters
    ----------
    text
        A schedule name in any spelling of :data:`ALIASES` (case, ``-``, ``_`` and spaces
        ignored), or a :class:`pipeopt.schedules.Schedule` (its name is read).
    among
        The canonical names the caller runs (default: :data:`TORCH_SCHEDULES`); a known name
        outside them is refused too.
    where
        Who runs ``among``, for that message (``"by the simulator"``, ...).

    Returns
    -------
    str
        A canonical name, one of ``among``.

    Raises
    ------
    InvalidProblemError
        If ``text`` is not a string, names no schedule, or one the caller does not run; the
        message lists the choices and their short aliases.
    """
    among = TORCH_SCHEDULES if among is None else tuple(among)
    name = getattr(text, "name", text)
    found = _LOOKUP.get(_key(name)) if isinstance(name, str) else None
    if found is None or found not in among:
        choices = ", ".join(f"{c} ({'/'.join(a for a in ALIASES[c] if not a.startswith('Schedule'))})" for c in among)
        what = f"unknown schedule {name!r}" if found is None else f"schedule {found!r} is not run {where}"
        raise InvalidProblemError(f"{what}; choose from {choices} (any case)")
    return found


_KEYS = {"GPipe": "gpipe", "1F1B": "1f1b", "async": "async", "split": "split"}


def schedule_key(text, among=SIMULATED, where: str = "here") -> str:
    """The simulator's and torch runtime's short key (``"gpipe"``, ``"1f1b"``, ``"async"``,
    ``"split"``) of schedule ``text`` in any spelling (:func:`schedule_name` with ``among``).

    Raises
    ------
    InvalidProblemError
        As :func:`schedule_name`.
    """
    return _KEYS[schedule_name(text, among, where)]
