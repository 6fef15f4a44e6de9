"""Swap refinement of an equal-count assignment: trade samples between heavy and light ranks.

An assignment is an ``(R, n)`` table of sample indices (row = rank). Swapping sample ``i`` of rank
``h`` with sample ``j`` of rank ``l`` moves ``d = c_i - c_j`` from ``h`` to ``l``; with ``gap =
load_h - load_l`` the pair's larger load becomes ``load_h - gap/2 + |d - gap/2|``, which is below
``load_h`` exactly when ``0 < d < gap``. Only such swaps are made, so no rank ever rises above the
old maximum, the sum of squared loads strictly falls (refinement terminates) and the largest load
never increases.
"""

from __future__ import annotations

import numpy as np

PAIR_ROUNDS = 32
MAX_SWAPS_PER_RANK = 1
TOLERANCE = 1e-3


def refine(c: np.ndarray, table: np.ndarray, bound: float) -> np.ndarray:
    """Lower the largest rank load of ``table`` (in place) by swaps, stopping near ``bound``.

    1. Pair rounds: sort ranks by load, pair the ``k``-th heaviest with the ``k``-th lightest and
       make the best swap within every pair at once (pairs are disjoint). ``O(R n^2)`` per round,
       vectorised; at most ``PAIR_ROUNDS`` rounds, stopping after one that leaves the largest
       load where it was.
    2. Slowest-rank swaps: while the most loaded rank has an improving swap with any rank, make the
       best one (binary search per sample, ``O(N log n)``); at most ``MAX_SWAPS_PER_RANK * R``.

    Both stop once the largest load is within ``TOLERANCE`` (relative) of ``bound``.

    Args:
        c: Costs of the samples.
        table: ``(R, n)`` sample indices; modified in place.
        bound: A lower bound of the largest load (``max(mean, ...)``).

    Returns:
        ``table``.
    """
    loads = c[table].sum(axis=1)
    good_enough = bound * (1 + TOLERANCE)
    for _ in range(PAIR_ROUNDS):
        before = loads.max()
        if before <= good_enough or not _pair_round(c, table, loads) or loads.max() >= before:
            break
    for _ in range(MAX_SWAPS_PER_RANK * table.shape[0]):
        m = int(np.argmax(loads))
        swap = None if loads[m] <= good_enough else _best_swap_of(c, table, loads, m)
        if swap is None:
            break
        i, s, j = swap
        _swap(c, table, loads, m, i, s, j)
    return table


def _swap(c: np.ndarray, table: np.ndarray, loads: np.ndarray, h: int, i: int, s: int, j: int) -> None:
    d = c[table[h, i]] - c[table[s, j]]
    table[h, i], table[s, j] = table[s, j], table[h, i]
    loads[h] -= d
    loads[s] += d


def _pair_round(c: np.ndarray, table: np.ndarray, loads: np.ndarray) -> bool:
    """Best swap inside each (k-th heaviest, k-th lightest) pair; returns whether any was made."""
    by_load = np.argsort(loads, kind="stable")
    half = len(by_load) // 2
    light, heavy = by_load[:half], by_load[::-1][:half]
    gap = (loads[heavy] - loads[light])[:, None, None]
    d = c[table[heavy]][:, :, None] - c[table[light]][:, None, :]  # (pairs, n heavy, n light)
    pair_max = np.where((d > 0) & (d < gap), np.abs(d - gap / 2) - gap / 2, np.inf)
    flat = pair_max.reshape(len(heavy), -1)
    best = np.argmin(flat, axis=1)
    improving = np.flatnonzero(flat[np.arange(len(heavy)), best] < -1e-12 * loads[heavy])
    for k in improving.tolist():
        i, j = divmod(int(best[k]), table.shape[1])
        _swap(c, table, loads, int(heavy[k]), i, int(light[k]), j)
    return improving.size > 0


def _best_swap_of(c: np.ndarray, table: np.ndarray, loads: np.ndarray, m: int) -> tuple[int, int, int] | None:
    """``(i, s, j)``: the swap of ``table[m, i]`` with ``table[s, j]`` that lowers ``m``'s pair most.

    For each sample ``j`` of another rank, the best partner in ``m`` is a neighbour of
    ``c_j + gap/2`` in ``m``'s sorted costs.
    """
    order = np.argsort(c[table[m]], kind="stable")
    mine = c[table[m]][order]
    theirs = c[table]
    gap = (loads[m] - loads)[:, None]
    above = np.minimum(np.searchsorted(mine, theirs + gap / 2), len(mine) - 1)
    best, best_max = None, loads[m] * (1 - 1e-12)
    for pick in (above, np.maximum(above - 1, 0)):
        d = mine[pick] - theirs
        pair_max = np.where((d > 0) & (d < gap), loads[m] - gap / 2 + np.abs(d - gap / 2), np.inf)
        k = int(np.argmin(pair_max))
        if pair_max.flat[k] < best_max:
            s, j = np.unravel_index(k, pair_max.shape)
            best, best_max = (int(order[pick[s, j]]), int(s), int(j)), pair_max.flat[k]
    return best
