"""Causal queries that end a longer key sequence (a CP chunk against its key prefix) on CPU:
equal to the masked attention, and no ``[sq, sk]`` mask is built."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loong_core.kernels import attention as attn
from loong_core.kernels import reference as ref
from loong_core.kernels import suffix_causal


def _qkv(sq: int, sk: int, dtype=torch.float64, dv: int = 8):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, sq, 8, generator=g, dtype=dtype, requires_grad=True)
    # Keys/values in megatron's [s, b, g, d] order permuted to [b, g, s, d], as the CP seam does.
    k = torch.randn(sk, 2, 2, 8, generator=g, dtype=dtype).permute(1, 2, 0, 3).requires_grad_()
    v = torch.randn(sk, 2, 2, dv, generator=g, dtype=dtype).permute(1, 2, 0, 3).requires_grad_()
    return q, k, v


# (6, 12, 6) / (6, 12, 11): value head size below / above the key's (MLA).
@pytest.mark.parametrize("sq,sk,dv", [(6, 7, 8), (6, 12, 8), (5, 40, 8), (6, 12, 6), (6, 12, 11)])
def test_suffix_causal_equals_masked_attention_forward_and_backward(sq, sk, dv):
    q, k, v = _qkv(sq, sk, dv=dv)
    out = attn.sdpa(q, k, v, causal=True, scale=0.3)
    allowed = ref.combined_mask(sq, sk, q.device, True, None, None)  # the dense-mask path, fp64
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.3, enable_gqa=True)
    assert (out - expected).abs().max() < 1e-12
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
    for got, want in zip(grads, expected_grads):
        assert got.shape == want.shape
        assert (got - want).abs().max() < 1e-12


def test_suffix_causal_builds_no_dense_mask(monkeypatch):
    def no_mask(*args, **kwargs):
        raise AssertionError("a dense [sq, sk] mask was built")

    monkeypatch.setattr(attn, "combined_mask", no_mask)
    q, k, v = _qkv(16, 64, torch.float32)
    attn.sdpa(q, k, v, causal=True).sum().backward()
    assert k.grad.shape == (2, 2, 64, 8)


def test_suffix_causal_leaves_masks_dropout_and_square_calls_to_sdpa():
    q, k, v = _qkv(6, 12)
    assert suffix_causal.applies(q, k, True, None, None, 0.0)
    assert not suffix_causal.applies(q, k, False, None, None, 0.0)
    assert not suffix_causal.applies(q, k, True, torch.ones(6, 12, dtype=torch.bool), None, 0.0)
    assert not suffix_causal.applies(q, k, True, None, None, 0.1)
    assert not suffix_causal.applies(q, q, True, None, None, 0.0)
