"""``kk_swap``: the better of largest differencing and greedy, refined by swaps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loong_core.data.balancers.differencing import largest_differencing
from loong_core.data.balancers.refine import refine
from loong_core.data.balancers.simple import as_costs, contiguous, greedy, samples_per_rank


def kk_swap(costs: Sequence[float], num_ranks: int) -> list[list[int]]:
    """Balance with equal counts: best start of three, then swap refinement.

    1. Starts: balanced Karmarkar-Karp largest differencing (strong with many samples per rank),
       :func:`greedy` (strong with few) and :func:`contiguous`; keep the one with the smallest
       largest rank cost.
    2. :func:`~loong_core.data.balancers.refine.refine`: swaps between the heaviest and lightest
       ranks in disjoint pairs, then swaps off the slowest rank, until no swap lowers it or it is
       within 0.1% of the lower bound ``max(mean, largest + (n-1) cheapest)`` (the rank holding
       the largest sample also holds ``n-1`` others).

    ``O(N log N)`` for the starts plus ``O(R n^2)`` per pair round and ``O(N log n)`` per
    slowest-rank swap, for ``N`` samples, ``R`` ranks, ``n = N / R``. Deterministic (stable
    sorts, ties to the lower index), so every rank computes the same assignment.

    Args:
        costs: Cost of each sample of the global batch (finite, >= 0).
        num_ranks: Data-parallel ranks; must divide ``len(costs)``.

    Returns:
        Sample indices for each rank, ascending; every rank gets the same number of samples,
        every index appears exactly once, and the largest rank cost is never above that of
        :func:`greedy` or :func:`contiguous` for the same costs.
    """
    c = as_costs(costs)
    per_rank = samples_per_rank(len(c), num_ranks)
    if per_rank == 0 or num_ranks == 1:
        return contiguous(c, num_ranks)
    starts = [largest_differencing(c, num_ranks, per_rank), np.asarray(greedy(c, num_ranks)),
              np.asarray(contiguous(c, num_ranks))]
    table = min(starts, key=lambda t: c[t].sum(axis=1).max()).copy()
    cheapest = np.partition(c, per_rank - 1)[:per_rank - 1].sum() if per_rank > 1 else 0.0
    bound = max(c.sum() / num_ranks, c.max() + cheapest)
    return [sorted(row) for row in refine(c, table, bound).tolist()]
