"""Built-in data balancers: pure functions ``balance(costs, num_ranks) -> indices per rank``.

Contract (shared by every balancer the loader accepts): ``len(costs)`` is a multiple of
``num_ranks``; the result has one list per rank, every rank gets exactly ``len(costs) /
num_ranks`` sample indices and every index appears exactly once. Equal counts keep the same
number of micro batches on every data-parallel rank, which megatron-core's pipeline schedules
need; balancing moves cost between ranks by choosing *which* samples a rank gets.

- :func:`contiguous` (``none``): rank ``r`` gets the ``r``-th run of samples.
- :func:`greedy` (``greedy``): longest-processing-time first into the least loaded open rank.
- :func:`kk_swap` (``kk_swap``): the better of balanced Karmarkar-Karp and greedy, refined by
  swaps between heavy and light ranks; never worse than ``greedy`` or ``contiguous`` on the
  largest rank cost.
"""

from __future__ import annotations

from loong_core.data.balancers.kk import kk_swap
from loong_core.data.balancers.simple import contiguous, greedy
from loong_core.data.balancers.stats import BalanceStats, balance_stats, check_assignment, rank_costs

__all__ = ["BalanceStats", "balance_stats", "check_assignment", "contiguous", "greedy", "kk_swap",
           "rank_costs"]
