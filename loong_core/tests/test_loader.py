"""Global batches are split over DP ranks with no sample lost or duplicated."""

from __future__ import annotations

import pytest
import torch

from loong_core.data.balancers import contiguous
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
