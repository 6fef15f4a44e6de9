"""Global batches are split over DP ranks with no sample lost or duplicated."""

from __future__ import annotations

import pytest
import torch

from loong_core.data.balancers import contiguous, kk_swap
from loong_core.data.cost_model import CostModel
from loong_core.data.loader import GlobalBatchLoader


class Numbers:
    def __len__(self):
        return 100

    def __getitem__(self, i):
        return {"tokens": torch.tensor([i, i])}


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_every_sample_of_a_global_batch_goes_to_exactly_one_rank(dp):
    seen = []
    for rank in range(dp):
        loader = GlobalBatchLoader(Numbers(), 16, 2, rank, dp, contiguous)
        for batch in loader.micro_batches(3):
            assert batch["tokens"].shape == (2, 2)
            seen += batch["tokens"][:, 0].tolist()
    assert sorted(seen) == list(range(48, 64))


def test_batches_wrap_around_the_dataset():
    loader = GlobalBatchLoader(Numbers(), 40, 4, 0, 1, contiguous)
    ids = [i for b in loader.micro_batches(2) for i in b["tokens"][:, 0].tolist()]
    assert ids == list(range(80, 100)) + list(range(0, 20))


def test_balancer_that_drops_samples_is_rejected():
    def lossy(costs, ranks):
        return [[0]] * ranks

    loader = GlobalBatchLoader(Numbers(), 8, 2, 0, 2, lossy, cost=lambda s: 1.0)
    with pytest.raises(ValueError, match="every rank needs 4"):
        loader.micro_batches(0)


def test_indivisible_global_batch_is_rejected():
    with pytest.raises(ValueError, match="not a multiple"):
        GlobalBatchLoader(Numbers(), 10, 4, 0, 1, contiguous)


def test_balancer_that_duplicates_a_sample_is_rejected():
    def duplicating(costs, ranks):
        return [[0, 1, 2, 3], [0, 1, 2, 3]]

    loader = GlobalBatchLoader(Numbers(), 8, 2, 0, 2, duplicating, cost=lambda s: 1.0)
    with pytest.raises(ValueError, match="sample 0 2 times"):
        loader.micro_batches(0)


class Lengths:
    """Sample ``i`` has ``i % 8`` as its length; every global batch of 8 is ``0, 1, ..., 7``."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"tokens": torch.tensor([i, i % 8])}


def test_loader_balances_the_cost_model_of_sample_lengths_and_reports_the_effect():
    seen = []
    for rank in range(2):
        loader = GlobalBatchLoader(Lengths(), 8, 2, rank, 2, kk_swap, cost=lambda s: int(s["tokens"][1]),
                                   cost_model=CostModel(a=1.0, b=0.0, c=0.0))
        seen += [i for batch in loader.micro_batches(1) for i in batch["tokens"][:, 0].tolist()]
        stats = loader.last_balance_stats
        # costs 0, 1, 4, ..., 49 (sum 140): contiguous 14 | 126; balanced 70 | 70
        assert (stats.mean, stats.max_before, stats.max_after) == (70.0, 126.0, 70.0)
    assert sorted(seen) == list(range(8, 16))


def test_unit_costs_leave_no_balance_stats():
    loader = GlobalBatchLoader(Numbers(), 8, 2, 0, 2, contiguous)
    loader.micro_batches(0)
    assert loader.last_balance_stats is None


class SizedLengths(Lengths):
    """``Lengths`` that reports sizes from metadata and records which samples were loaded."""

    def __init__(self):
        self.loaded = []

    def sample_size(self, i):
        return i % 8

    def __getitem__(self, i):
        self.loaded.append(i)
        return super().__getitem__(i)


def test_sizes_from_metadata_balance_the_same_and_load_only_this_ranks_samples():
    for rank in range(2):
        dataset = SizedLengths()
        loader = GlobalBatchLoader(dataset, 8, 2, rank, 2, kk_swap, cost=lambda s: int(s["tokens"][1]),
                                   cost_model=CostModel(a=1.0, b=0.0, c=0.0))
        mine = [i for batch in loader.micro_batches(1) for i in batch["tokens"][:, 0].tolist()]
        stats = loader.last_balance_stats
        assert (stats.mean, stats.max_before, stats.max_after) == (70.0, 126.0, 70.0)
        assert sorted(dataset.loaded) == sorted(mine) and len(mine) == 4
