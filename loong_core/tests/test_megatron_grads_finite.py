"""The megatron engine's gradient check before the optimizer step (``engines.megatron.finite``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from loong_core.engines.megatron.finite import grads_finite


def _chunks(*grad_buffers, expert=()):
    """Model chunks as megatron-core's DDP exposes them: ``buffers`` with a flat ``grad_data``."""
    return [SimpleNamespace(buffers=[SimpleNamespace(grad_data=g) for g in grad_buffers],
                            expert_parallel_buffers=[SimpleNamespace(grad_data=g) for g in expert])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("size", [1, 33, 100_003])
def test_one_non_finite_element_anywhere_is_found(dtype, bad, size):
    generator = torch.Generator().manual_seed(size)
    grad = torch.randn(size, generator=generator).to(dtype)
    assert grads_finite(_chunks(grad.clone(), torch.zeros(5)))
    for position in {0, size // 2, size - 1}:
        poisoned = grad.clone()
        poisoned[position] = bad
        assert not grads_finite(_chunks(torch.zeros(5), poisoned)), (position, bad)
        assert not grads_finite(_chunks(torch.zeros(5), expert=[poisoned])), (position, bad)


def test_largest_finite_values_and_empty_buffers_are_finite():
    huge = torch.tensor([torch.finfo(torch.float32).max, -torch.finfo(torch.float32).max, 0.0])
    assert grads_finite(_chunks(huge, torch.empty(0)))
    assert grads_finite(_chunks(torch.empty(0)))
    assert grads_finite([])
