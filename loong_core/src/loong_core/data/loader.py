"""Deterministic global-batch loading: iteration -> this DP rank's micro batches.

Global batch ``i`` is the samples ``[i*G, (i+1)*G)`` of the dataset (wrapping around), so the data
position of a run is just its iteration count and a resumed run sees exactly the same batches.
A data balancer assigns the samples of each global batch to data-parallel ranks, every rank the
same number (see :mod:`loong_core.data.balancers`); the loader checks that no sample is lost or
duplicated and keeps the balancing effect of the last batch in ``last_balance_stats``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from loong_core.data.balancers import BalanceStats, balance_stats, check_assignment
from loong_core.data.cost_model import CostModel


def collate(samples: Sequence[dict]) -> dict:
    """Stack samples' tensors along a new batch dimension (other values become lists)."""
    batch = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if torch.is_tensor(values[0]):
            batch[key] = torch.stack(values)
        elif hasattr(values[0], "__array__"):
            batch[key] = torch.stack([torch.as_tensor(v) for v in values])
        else:
            batch[key] = values
    return batch


class GlobalBatchLoader:
    """Micro batches of one data-parallel rank for a given iteration.

    Args:
        dataset: Map-style dataset of dict samples.
        global_batch_size: Samples per step over all DP ranks.
        micro_batch_size: Samples per micro batch.
        dp_rank: This rank's data-parallel index.
        dp_size: Data-parallel ranks.
        balancer: ``(costs, num_ranks) -> indices per rank``.
        cost: Size of a sample for the balancer (its token length); None means every sample costs
            the same and the balancer sees unit costs without loading other ranks' samples. A
            dataset that defines ``sample_size(index)`` (the same size, read from its metadata) is
            asked that instead, so no rank loads (decodes, tokenizes) samples it does not train on.
        cost_model: Turns the sizes from ``cost`` into costs (``a*L^2 + b*L + c``); None uses the
            sizes as they are.
        collate_fn: Samples -> micro batch; None stacks every tensor (:func:`collate`).

    Attributes:
        last_balance_stats: Max/mean rank cost before (contiguous split) and after balancing of
            the last global batch :meth:`micro_batches` loaded; None before the first one or
            when ``cost`` is None. ``last_balance_stats.metrics()`` is ready to log.
    """

    def __init__(self, dataset: Any, global_batch_size: int, micro_batch_size: int, dp_rank: int,
                 dp_size: int, balancer: Callable, cost: Callable[[dict], float] | None = None,
                 cost_model: CostModel | None = None, collate_fn: Callable[[Sequence[dict]], dict] | None = None):
        if global_batch_size % (micro_batch_size * dp_size):
            raise ValueError(
                f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
                f"{micro_batch_size} x data-parallel size {dp_size}"
            )
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.balancer, self.cost, self.cost_model = balancer, cost, cost_model
        self.collate_fn = collate_fn or collate
        self.last_balance_stats: BalanceStats | None = None
        self.num_micro_batches = global_batch_size // (micro_batch_size * dp_size)

    def global_indices(self, iteration: int) -> list[int]:
        """Dataset indices of global batch ``iteration``."""
        start = iteration * self.global_batch_size
        return [(start + i) % len(self.dataset) for i in range(self.global_batch_size)]

    def micro_batches(self, iteration: int) -> list[dict]:
        """This rank's micro batches of global batch ``iteration``."""
        indices = self.global_indices(iteration)
        cache = {}
        if self.cost is None:
            costs = [1.0] * len(indices)
        elif hasattr(self.dataset, "sample_size"):
            costs = [float(self.dataset.sample_size(i)) for i in indices]
        else:
            cache = {i: self.dataset[i] for i in indices}
            costs = [float(self.cost(cache[i])) for i in indices]
        if self.cost is not None and self.cost_model is not None:
            costs = self.cost_model.cost(costs).tolist()
        assignment = self.balancer(costs, self.dp_size)
        check_assignment(assignment, len(indices), self.dp_size)
        if self.cost is not None:
            self.last_balance_stats = balance_stats(costs, assignment)
        mine = [indices[j] for j in assignment[self.dp_rank]]
        samples = [cache[i] if i in cache else self.dataset[i] for i in mine]
        m = self.micro_batch_size
        return [self.collate_fn(samples[k: k + m]) for k in range(0, len(samples), m)]
