"""The type DP's inner loop (:meth:`pipeopt.problems.resource.group_dp.TypesProbe._extend`): every
label at one boundary and start unit times every menu item of the stage, compiled with numba.

One pass over the pairs tests, per pair, what the DP's rules say about it alone - the item's
priced power within the label's room, the devices (``u + c <= counts``), the window rows ending
at the stage (``G = w + h <= 0``) and the clip test of the item's predecessors - and keeps, per
(end, count vector), the pair of least window state (the others are dominated: module docstring
of :mod:`~pipeopt.problems.resource.group_dp`). No pair is materialised: the pass costs a few
nanoseconds per pair, where the numpy version it replaces spent about a hundred (gathers and
temporaries over hundreds of millions of pairs per stage).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def least_pairs(lab_u, h, room, room_p, offset, item_c, item_p, p0, w, wp, start, floors, beam, subsets, guard, size,
                best, own_l, own_m, touched, n_touched):  # pragma: no cover - compiled
    """Scan labels ``0..L-1`` x the menu items of each end; update the per-key least window state.

    Parameters (``L`` labels, ``J`` ends, ``M`` menu items sorted by end, then first-price power)
    ----------
    lab_u : int64 (L,)
        The labels' count-vector indices.
    h : float64 (L,)
        Window state entering the stage, per label.
    room : float64 (L, J)
        Largest first-price power of an item each label may take at each end (``-inf``: none).
    room_p : int64 (L,)
        Packed count vectors of the devices each label leaves
        (:meth:`~pipeopt.problems.resource.group_dp.DeviceTypes.pack`).
    offset : int
        Position of label 0 among the boundary's labels (``own_l`` holds ``offset + l``).
    item_c, item_p : int64 (M,)
        The items' count-vector indices and packed count vectors.
    p0, w, wp : float64 (M,)
        The items' first-price power, least busy time and their predecessors' least busy time.
    start : int64 (J + 1,)
        Items of end ``b``: ``start[b]..start[b+1]-1``.
    floors : float64 (J,)
        The next stage's floor at each end.
    beam : int
        At most this many items per (label, end), the least powerful first (0: no cap).
    subsets : bool
        Count vectors are bitmasks (one device per type).
    guard : int64
        Guard bits of the packed fields.
    size : int
        Number of count vectors (keys are ``end * size + count vector``).
    best, own_l, own_m : float64 / int64 (J * size,)
        Per key: least window state so far (``inf``: none) and its label and item.
    touched : int64 (J * size,)
        Keys set so far (the first ``n_touched[0]``).
    n_touched : int64 (1,)
        Count of ``touched``.
    """
    L, J = room.shape
    for l in range(L):
        u, hl, rp = lab_u[l], h[l], room_p[l]
        for b in range(J):
            r = room[l, b]
            lo, hi = start[b], start[b + 1]
            if beam > 0 and hi > lo + beam:
                hi = lo + beam
            clip = floors[b] - hl
            base = b * size + u
            for m in range(lo, hi):
                if p0[m] > r:
                    break
                c = item_p[m]
                if subsets:
                    if c & rp != c:
                        continue
                elif ((rp + guard - c) & guard) != guard:
                    continue
                G = w[m] + hl
                if not (G <= 0.0 and wp[m] > clip):
                    continue
                key = base + item_c[m]
                old = best[key]
                if G < old:
                    if old == np.inf:
                        touched[n_touched[0]] = key
                        n_touched[0] += 1
                    best[key] = G
                    own_l[key] = offset + l
                    own_m[key] = m
