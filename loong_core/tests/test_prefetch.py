"""``data.prefetch``: the next global batch loads while the step runs, and nothing else changes."""

from __future__ import annotations

import threading

import pytest
import torch

from loong_core.data.balancers import kk_swap
from loong_core.data.loader import GlobalBatchLoader
from loong_core.data.prefetch import PrefetchingLoader


class Sized:
    """Samples of different lengths (so the balancer has something to balance)."""

    def __init__(self, on_get=None, bad: int | None = None):
        self.on_get, self.bad = on_get, bad

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.on_get is not None:
            self.on_get(i)
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        return {"tokens": torch.full((4,), i), "length": torch.tensor(1 + (7 * i) % 13)}


def _loader(dataset, rank=0):
    return GlobalBatchLoader(dataset, 8, 2, rank, 2, kk_swap, cost=lambda s: float(s["length"]))


def _ids(batches):
    return [b["tokens"][:, 0].tolist() for b in batches]


@pytest.mark.parametrize("rank", [0, 1])
def test_prefetched_batches_and_balance_stats_equal_loading_in_the_loop(rank):
    plain, ahead = _loader(Sized(), rank), PrefetchingLoader(_loader(Sized(), rank))
    for iteration in range(6):
        got = ahead.micro_batches(iteration)
        with ahead.overlap(iteration + 1):
            pass
        assert _ids(got) == _ids(plain.micro_batches(iteration))
        # the stats belong to the batch handed out, not to the one loaded ahead
        assert ahead.last_balance_stats == plain.last_balance_stats


def test_loading_runs_while_the_step_runs():
    first_sample_of_next_batch = 8
    loading = threading.Event()

    def on_get(i):
        if i == first_sample_of_next_batch:
            loading.set()

    ahead = PrefetchingLoader(_loader(Sized(on_get)))
    ahead.micro_batches(0)
    assert not loading.is_set()
    with ahead.overlap(1):
        # the "training step": it can only finish if batch 1 is being loaded beside it
        assert loading.wait(timeout=60), "batch 1 was not loaded during the step"
    assert _ids(ahead.micro_batches(1)) == _ids(_loader(Sized()).micro_batches(1))


def test_a_corrupt_sample_fails_at_its_own_iteration_not_during_the_step_before():
    ahead = PrefetchingLoader(_loader(Sized(bad=9)))
    ahead.micro_batches(0)
    with ahead.overlap(1):
        pass  # step 0 ends normally: its checkpoint, its logs
    with pytest.raises(ValueError, match="sample 9 is corrupt"):
        ahead.micro_batches(1)


def test_a_skipped_or_repeated_iteration_is_loaded_in_the_loop():
    ahead = PrefetchingLoader(_loader(Sized()))
    with ahead.overlap(3):
        pass
    assert _ids(ahead.micro_batches(5)) == _ids(_loader(Sized()).micro_batches(5))
    assert _ids(ahead.micro_batches(3)) == _ids(_loader(Sized()).micro_batches(3))
