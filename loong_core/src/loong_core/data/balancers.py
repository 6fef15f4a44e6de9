"""Built-in data balancers: pure functions ``(costs, num_ranks) -> indices per rank``."""

from __future__ import annotations

from collections.abc import Sequence


def contiguous(costs: Sequence[float], num_ranks: int) -> list[list[int]]:
    """Split the global batch into ``num_ranks`` contiguous runs of equal count (no balancing).

    Args:
        costs: Cost of each sample of the global batch (ignored).
        num_ranks: Data-parallel ranks.

    Returns:
        Sample indices for each rank; rank ``r`` gets ``[r*n, (r+1)*n)``.
    """
    total = len(costs)
    if total % num_ranks:
        raise ValueError(f"global batch of {total} samples does not split over {num_ranks} ranks")
    per_rank = total // num_ranks
    return [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(num_ranks)]
