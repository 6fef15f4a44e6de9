"""Checking a balancer's assignment and measuring its effect (max/mean rank cost)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loong_core.data.balancers.simple import as_costs, contiguous


def check_assignment(assignment: Sequence[Sequence[int]], num_samples: int, num_ranks: int) -> None:
    """Raise unless ``assignment`` gives every rank the same count and every sample exactly once.

    Args:
        assignment: A balancer's result: sample indices for each rank.
        num_samples: Samples in the global batch.
        num_ranks: Data-parallel ranks.

    Raises:
        ValueError: Naming the first rank with a wrong count, or a sample lost or duplicated.
    """
    if len(assignment) != num_ranks:
        raise ValueError(f"balancer returned {len(assignment)} ranks; expected {num_ranks}")
    per_rank = num_samples // num_ranks
    for rank, indices in enumerate(assignment):
        if len(indices) != per_rank:
            raise ValueError(f"balancer gave DP rank {rank} {len(indices)} samples; every rank needs "
                             f"{per_rank}")
    flat = np.asarray([i for indices in assignment for i in indices], dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= num_samples):
        bad = int(flat[(flat < 0) | (flat >= num_samples)][0])
        raise ValueError(f"balancer returned sample index {bad}; the global batch has {num_samples}")
    counts = np.bincount(flat, minlength=num_samples)
    if (counts != 1).any():
        i = int(np.argmax(counts != 1))
        raise ValueError(f"balancer assigned sample {i} {counts[i]} times; every sample of the global "
                         "batch must go to exactly one rank")


def rank_costs(costs: Sequence[float], assignment: Sequence[Sequence[int]]) -> np.ndarray:
    """Total cost of each rank under ``assignment``."""
    c = as_costs(costs)
    return np.array([c[list(indices)].sum() for indices in assignment], dtype=np.float64)


@dataclass(frozen=True)
class BalanceStats:
    """Rank costs of one global batch before (contiguous split) and after balancing.

    Attributes:
        mean: Mean rank cost (the same before and after).
        max_before: Largest rank cost of the contiguous split.
        max_after: Largest rank cost of the balancer's assignment.
    """

    mean: float
    max_before: float
    max_after: float

    @property
    def ratio_before(self) -> float:
        """``max_before / mean``: 1.0 is perfect balance (1.0 when every cost is 0)."""
        return self.max_before / self.mean if self.mean > 0 else 1.0

    @property
    def ratio_after(self) -> float:
        """``max_after / mean``: 1.0 is perfect balance (1.0 when every cost is 0)."""
        return self.max_after / self.mean if self.mean > 0 else 1.0

    def metrics(self) -> dict[str, float]:
        """Scalars for a metrics line: max/mean rank cost before and after balancing."""
        return {"balance/max_over_mean_before": self.ratio_before,
                "balance/max_over_mean_after": self.ratio_after}


def balance_stats(costs: Sequence[float], assignment: Sequence[Sequence[int]]) -> BalanceStats:
    """Max and mean rank cost of ``assignment`` and of the contiguous split of the same batch.

    Args:
        costs: Cost of each sample of the global batch.
        assignment: A balancer's result for ``costs`` (one entry per rank).

    Returns:
        The :class:`BalanceStats` of this global batch.
    """
    before = rank_costs(costs, contiguous(costs, len(assignment)))
    after = rank_costs(costs, assignment)
    return BalanceStats(mean=float(after.mean()), max_before=float(before.max()),
                        max_after=float(after.max()))
