"""Balanced largest differencing (Karmarkar-Karp) for ``R`` ranks of ``n`` samples each."""

from __future__ import annotations

import heapq

import numpy as np


def largest_differencing(c: np.ndarray, num_ranks: int, per_rank: int) -> np.ndarray:
    """Balanced k-way largest differencing method.

    Sort the costs and cut them into ``n`` blocks of ``R`` consecutive samples; each block is a
    partial partition with one sample on each rank. Repeatedly take the two partial partitions
    whose spread (largest minus smallest rank sum) is largest and merge them rank by rank, the
    heaviest side of one with the lightest side of the other. Every merge keeps one sample per
    block on every rank, so counts stay equal. ``n - 1`` merges of ``O(R log R)``.

    It balances well when ranks hold many samples (``n`` well above ~16); with few samples per
    rank the blocks leave it little choice and :func:`~loong_core.data.balancers.greedy` is often
    better, which is why :func:`~loong_core.data.balancers.kk_swap` starts from the better one.

    Args:
        c: Costs, ``len(c) == num_ranks * per_rank``.
        num_ranks: Ranks ``R``.
        per_rank: Samples per rank ``n`` (>= 1).

    Returns:
        ``(R, n)`` table of sample indices; row ``r`` is rank ``r``'s samples.
    """
    order = np.argsort(-c, kind="stable").reshape(per_rank, num_ranks)
    heap = []
    for block, members in enumerate(order):
        sums = c[members]
        heap.append((-(sums.max() - sums.min()), block, sums, members[:, None]))
    heapq.heapify(heap)
    tiebreak = per_rank
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        heavy_first = np.argsort(-sums_a, kind="stable")
        light_first = np.argsort(sums_b, kind="stable")
        sums = sums_a[heavy_first] + sums_b[light_first]
        members = np.concatenate([members_a[heavy_first], members_b[light_first]], axis=1)
        heapq.heappush(heap, (-(sums.max() - sums.min()), tiebreak, sums, members))
        tiebreak += 1
    return heap[0][3]
