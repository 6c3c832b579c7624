"""The type DP's inner loops (:mod:`pipeopt.problems.resource.group_dp`), compiled with numba.

* :func:`least_pairs` (:meth:`~pipeopt.problems.resource.group_dp.TypesProbe._extend`): every
  label at one boundary and start unit times every menu item of the stage. One pass tests, per
  pair, what the DP's rules say about it alone - the item's priced power within the label's
  room, the devices (``u + c <= counts``), the window rows ending at the stage (``G = w + h <=
  0``) and the clip test of the item's predecessors - and keeps, per (end, count vector), the
  pair of least window state (the others are dominated). No pair is materialised.
* :func:`menu_scan` (:meth:`~pipeopt.problems.resource.group_dp.TypesProbe.menus`): the
  compositions of one stage range that pass its own rows, memory and the necessary conditions,
  and that no passing predecessor (one device fewer) clips for sure.
* :func:`undominated` (:meth:`~pipeopt.problems.resource.group_dp.TypesProbe._pareto`): the
  labels no other label dominates, pairwise.
* :func:`fits`: ``c <= room`` type by type on packed count vectors (the pairing's device test).

Each replaces numpy code that made every candidate's temporaries (hundreds of millions of pairs
per stage at about a hundred nanoseconds each); the rules they read are the DP's (the cover rows,
:func:`pipeopt.cost.rules.memory_limit`, the window bound), passed in as arrays.
"""

from __future__ import annotations

import numpy as np

from ...cost import rules
from ...jit import njit


@njit(cache=True, nogil=True)
def fits(c, room, guard):  # pragma: no cover - compiled
    """``c <= room`` type by type, for packed count vectors
    (:meth:`~pipeopt.problems.resource.group_dp.DeviceTypes.pack`; int64).

    ``guard`` 0: bitmasks (one device per type), ``c`` a submask of ``room``. Otherwise one
    subtraction for every type at once: each field of ``room + guard - c`` is
    ``2**(bits - 1) + room_t - c_t``, which stays in ``[1, 2**bits)`` (so no field borrows from the
    next) and keeps its guard bit iff ``c_t <= room_t``."""
    if guard == 0:
        return (c & room) == c
    return ((room + guard - c) & guard) == guard


@njit(cache=True, nogil=True)
def least_pairs(lab_u, h, room, room_p, lab_g, offset, item_c, item_p, p0, w, wp, cells, floors, beam, guard, size,
                best, own_l, touched, n_touched):  # pragma: no cover - compiled
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
    lab_g : int64 (L,)
        Per label, the bitmask of the item groups whose devices it leaves: the items of group
        ``g`` are scanned for the label iff ``g`` is a submask of ``lab_g`` (one group: all 0).
    offset : int
        Position of label 0 among the boundary's labels (``own_l`` holds ``offset + l``).
    item_c, item_p : int64 (M,)
        The items' count-vector indices and packed count vectors, sorted by end, then group, then
        first-price power.
    p0, w, wp : float64 (M,)
        The items' first-price power, least busy time and their predecessors' least busy time.
    cells : int64 (J, G + 1)
        Items of end ``b`` and group ``g``: ``cells[b, g]..cells[b, g+1]-1``.
    floors : float64 (J,)
        The next stage's floor at each end.
    beam : int
        At most this many items that fit the label's devices per (label, end), the least powerful
        first (0: no cap; with one group only).
    guard : int64
        Guard bits of the packed fields (0: bitmasks), :func:`fits`.
    size : int
        Number of count vectors (keys are ``end * size + count vector``).
    best, own_l : float64 / int64 (J * size,)
        Per key: least window state so far (``inf``: none) and its label.
    touched : int64 (J * size,)
        Keys set so far (the first ``n_touched[0]``).
    n_touched : int64 (1,)
        Count of ``touched``.
    """
    L, J = room.shape
    for b in range(J):  # end by end: the keys of one end (a slice of ``best``) stay in cache
        for l in range(L):
            r = room[l, b]
            hl, rp, allow = h[l], room_p[l], lab_g[l]
            clip = floors[b] - hl
            base = b * size + lab_u[l]
            g = allow
            while True:  # every submask g of allow, allow itself first
                lo, hi = cells[b, g], cells[b, g + 1]
                taken = 0
                for m in range(lo, hi):
                    if p0[m] > r:
                        break
                    if not fits(item_p[m], rp, guard):
                        continue
                    if beam > 0:
                        if taken >= beam:
                            break
                        taken += 1
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
                if g == 0:
                    break
                g = (g - 1) & allow


@njit(cache=True, nogil=True)
def menu_scan(order, lo, hi, ndev, allowed, power, need_lo, top_hi, first, window, A2, B, left_max, root2, h_min,
              trip, floor_k1, room, beam_scan, comps, rows, rate_need, mem_need, mem_cap, stride, theta,
              out_c, out_b, out_pred):  # pragma: no cover - compiled
    """The compositions worth trying for the ends ``b = 0..J-1`` of one stage range; returns how
    many were written to ``out_*``.

    Parameters (``J`` ends, ``P`` prices, ``F`` front points, ``tau`` types, ``R`` cover rows)
    ----------
    order : int64 (size,)
        Count vectors by increasing first-price power; end ``b`` scans ``order[lo[b]:hi[b]]``.
    lo, hi : int64 (J,)
    ndev : int64 (size,)
        Devices per count vector.
    allowed : uint8 (size,)
        Count vectors some label can take (:meth:`~pipeopt.problems.resource.group_dp.DeviceTypes.within`
        its rooms); the others are skipped.
    power : float64 (size, P)
        Priced power per count vector and price.
    need_lo, top_hi : float64 (J, P)
        The priced power window per end (slack included).
    first : int
        The first price.
    window : bool
        Apply the window bound: ``max(floor_k1, root2[b] / p + h_min + trip[b]) + min_f (A2[b, f] /
        max(left_max - p, 0) + B[b, f]) <= room`` for first-price power ``p``.
    A2, B : float64 (J, F); left_max : float; root2, trip : float64 (J,); h_min, floor_k1, room : float
    beam_scan : int
        At most this many candidates per end pass on to the rows test, the least powerful (0: all).
    comps : int64 (size, tau)
    rows : float64 (J, tau, R)
        Cover rows per type: a composition passes iff ``min_r comps @ rows[b, :, r] >= rate_need``.
    rate_need : float
        ``1 / T``.
    mem_need : float64 (J,); mem_cap : float64 (size,)
        Bytes the stage needs and the most each composition holds (:func:`~pipeopt.cost.rules.memory_limit`).
    stride : int64 (tau,)
        Index step of one device of each type.
    theta : float64 (J,)
        Clip threshold: a composition with a passing predecessor of best-split time ``tau_p`` with
        ``2 tau_p <= theta[b]`` is dropped.
    out_c, out_b, out_pred : int64 (>= sum(hi - lo),)
        The kept compositions, their ends and a bitmask of their passing predecessors' types.
    """
    n_out = 0
    tau = comps.shape[1]
    R = rows.shape[2]
    P = power.shape[1]
    vals = np.empty(R)
    for b in range(lo.size):
        seen = 0
        for pos in range(lo[b], hi[b]):
            c = order[pos]
            if ndev[c] < 1 or not allowed[c]:
                continue
            ok = True
            for q in range(P):
                pw = power[c, q]
                if pw < need_lo[b, q] or pw > top_hi[b, q]:
                    ok = False
                    break
            if not ok:
                continue
            if window:
                p0 = power[c, first]
                # f + b >= root2 / p0; with no priced power only a stage of no priced work passes
                # (root2 = 0: e.g. a device of a kind the first price does not count)
                w_low = root2[b] / p0 if p0 > 0 else (0.0 if root2[b] == 0.0 else np.inf)
                left = max(max(left_max - p0, 0.0), 1e-300)
                rest = np.inf
                for f in range(A2.shape[1]):
                    v = A2[b, f] * (1.0 / left) + B[b, f]
                    if v < rest:
                        rest = v
                if max(floor_k1, w_low + h_min + trip[b]) + rest > room:
                    continue
            if beam_scan > 0:
                if seen >= beam_scan:
                    break
                seen += 1
            if not mem_need[b] <= mem_cap[c]:
                continue
            low = np.inf
            for r in range(R):
                s = 0.0
                for t in range(tau):
                    s += comps[c, t] * rows[b, t, r]
                vals[r] = s
                if s < low:
                    low = s
            if not low >= rate_need:
                continue
            preds = 0
            drop = False
            for t in range(tau):
                if comps[c, t] == 0:
                    continue
                p = c - stride[t]
                if ndev[p] < 1 or not mem_need[b] <= mem_cap[p]:
                    continue
                prate = np.inf
                for r in range(R):
                    v = vals[r] - rows[b, t, r]
                    if v < prate:
                        prate = v
                if prate >= rate_need:
                    if 2.0 * (1.0 / prate) <= theta[b]:
                        drop = True
                        break
                    preds |= np.int64(1) << t
            if drop:
                continue
            out_c[n_out] = c
            out_b[n_out] = b
            out_pred[n_out] = preds
            n_out += 1
    return n_out


@njit(cache=True, nogil=True)
def undominated(comps, G):  # pragma: no cover - compiled
    """``keep[i]``: no other label ``a`` has ``comps[a] <= comps[i]`` type by type and ``G[a] <=
    G[i]`` (labels with distinct count vectors: ``comps`` int64 (L, tau), ``G`` float64 (L,)); the
    pairwise test of :meth:`~pipeopt.problems.resource.group_dp.TypesProbe._pareto`."""
    L, tau = comps.shape
    keep = np.ones(L, np.bool_)
    for i in range(L):
        for a in range(L):
            if a == i or G[a] > G[i]:
                continue
            le = True
            for t in range(tau):
                if comps[a, t] > comps[i, t]:
                    le = False
                    break
            if le:
                keep[i] = False
                break
    return keep


_window_carry = njit(cache=True, nogil=True)(rules.window_carry)
""":func:`pipeopt.cost.rules.window_carry`, compiled (the rule itself, read by :func:`chain_dp`)."""


@njit(cache=True, nogil=True)
def chain_dp(ii, jj, w, room, cut_i, cut_j, trip, D, U, T, n, args):  # pragma: no cover - compiled
    """The chain DP of :class:`~pipeopt.problems.resource.problem.ChainProbe` at a limit T, stage
    by stage over every unit range (one loop instead of a table per stage).

    Parameters (``S`` stages, ``P`` unit ranges ``ii[q]..jj[q]-1``)
    ----------
    ii, jj : int64 (P,)
        The ranges' first unit and end.
    w : float64 (S, P)
        Each stage's least busy time on each range at T (``inf``: no share passes T).
    room : bool (S, P)
        The range fits the stage's worker's memory and leaves a unit to every other stage.
    cut_i, cut_j : bool (P,)
        The cut before ``ii[q]`` / before ``jj[q]`` passes T.
    trip, D, U, T, n
        Round trip of each cut, the window rows' tokens per stage, the limit, the unit count.
    args : int64 (S, n + 1)
        Out: per stage and end, the start of the stage in the least-``G`` split (``-1``: none).

    Returns
    -------
    bool
        Whether some split of the n units into the S stages passes T. With ``G_s(j)`` the least
        window state over the splits of units ``0..j-1`` into stages ``0..s``,
        ``G_s(j) = min_i w_s(i, j) + window_carry(G_{s-1}(i), trip[i], D_s, T)`` (the first i on
        ties, as ``argmin``), kept where ``G_s(j) <= -U_s T``.
    """
    S, P = w.shape
    G = np.full(n + 1, np.inf)
    nxt = np.empty(n + 1)
    for s in range(S):
        nxt[:] = np.inf
        args[s, :] = -1
        first, last = s == 0, s == S - 1
        for q in range(P):
            i, j = ii[q], jj[q]
            if not room[s, q]:
                continue
            if first:
                if i != 0:
                    continue
            elif not cut_i[q]:
                continue
            if last:
                if j != n:
                    continue
            elif not cut_j[q]:
                continue
            wq = w[s, q]
            if not wq < np.inf:
                continue
            if first:
                val = wq + _window_carry(-np.inf, 0.0, D[s], T)
            else:
                if not G[i] < np.inf:
                    continue
                val = wq + _window_carry(G[i], trip[i], D[s], T)
            if val < nxt[j] or (val == nxt[j] and i < args[s, j]):
                nxt[j] = val
                args[s, j] = i
        alive = False
        for j in range(n + 1):
            if nxt[j] <= -U[s] * T:
                alive = True
            else:
                nxt[j] = np.inf
        G, nxt = nxt, G
        if not alive:
            return False
    return G[n] < np.inf
