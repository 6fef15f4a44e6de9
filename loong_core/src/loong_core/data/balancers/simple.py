"""The two reference balancers: ``contiguous`` (no balancing) and ``greedy`` (longest first)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def as_costs(costs: Sequence[float]) -> np.ndarray:
    """Costs as a float64 vector, rejecting NaN, infinite and negative values.

    Raises:
        ValueError: If a cost is not a finite non-negative number.
    """
    array = np.asarray(costs, dtype=np.float64).reshape(-1)
    bad = ~np.isfinite(array) | (array < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"sample {i} has cost {array[i]}; costs must be finite and >= 0")
    return array


def samples_per_rank(num_samples: int, num_ranks: int) -> int:
    """Samples every rank gets under the equal-count contract.

    Raises:
        ValueError: If ``num_ranks < 1`` or the global batch does not split evenly.
    """
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    if num_samples % num_ranks:
        raise ValueError(f"global batch of {num_samples} samples does not split over {num_ranks} ranks")
    return num_samples // num_ranks


def contiguous(costs: Sequence[float], num_ranks: int) -> list[list[int]]:
    """Split the global batch into ``num_ranks`` contiguous runs of equal count (no balancing).

    Args:
        costs: Cost of each sample of the global batch (ignored).
        num_ranks: Data-parallel ranks.

    Returns:
        Sample indices for each rank; rank ``r`` gets ``[r*n, (r+1)*n)``.
    """
    per_rank = samples_per_rank(len(costs), num_ranks)
    return [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(num_ranks)]


def greedy(costs: Sequence[float], num_ranks: int) -> list[list[int]]:
    """Longest-processing-time first, restricted to equal counts.

    Samples are taken by cost, largest first (ties in index order), and each goes to the least
    loaded rank that still has fewer than ``len(costs) / num_ranks`` samples (ties to the lower
    rank). A heap holds the open ranks: ``O(N log N)`` for ``N`` samples.

    Args:
        costs: Cost of each sample of the global batch (finite, >= 0).
        num_ranks: Data-parallel ranks; must divide ``len(costs)``.

    Returns:
        Sample indices for each rank, ascending; every rank gets the same number of samples and
        every index appears exactly once.
    """
    c = as_costs(costs)
    per_rank = samples_per_rank(len(c), num_ranks)
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    if per_rank == 0:
        return ranks
    cost = c.tolist()
    open_ranks = [(0.0, r) for r in range(num_ranks)]  # (load, rank) is already a heap
    for i in np.argsort(-c, kind="stable").tolist():
        load, r = open_ranks[0]
        ranks[r].append(i)
        if len(ranks[r]) < per_rank:
            heapq.heapreplace(open_ranks, (load + cost[i], r))
        else:
            heapq.heappop(open_ranks)
    return [sorted(indices) for indices in ranks]
