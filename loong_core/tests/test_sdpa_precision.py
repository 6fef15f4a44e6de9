"""``loong_core.kernels.sdpa_precision``: bf16 / fp16 attention over short key sequences runs in
fp32 on a CPU (faster there, see the module), everything else as called."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loong_core.kernels import sdpa_precision
from loong_core.kernels.sdpa_precision import CPU_FP32_MAX_KEYS, scaled_dot_product_attention


@pytest.fixture
def seen(monkeypatch):
    """The dtype SDPA computes in (its inputs', or autocast's), per call."""
    calls, real = [], F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        autocast = torch.is_autocast_enabled("cpu")
        calls.append(torch.get_autocast_dtype("cpu") if autocast else q.dtype)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(sdpa_precision.F, "scaled_dot_product_attention", spy)
    return calls


def qkv(keys: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, 8, generator=g)
    k, v = (torch.randn(2, 4, keys, 8, generator=g) for _ in range(2))
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def test_short_bf16_attention_runs_in_fp32_and_returns_bf16_with_bf16_gradients(seen):
    q, k, v = qkv(CPU_FP32_MAX_KEYS)
    mask = torch.rand(5, CPU_FP32_MAX_KEYS) > 0.3
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert seen == [torch.float32] and out.dtype == torch.bfloat16
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    torch.testing.assert_close(out, want.bfloat16(), rtol=0, atol=0)
    out.float().sum().backward()
    assert q.grad.dtype == k.grad.dtype == torch.bfloat16 and q.grad.abs().max() > 0


def test_long_keys_and_fp32_keep_sdpa_as_called(seen):
    q, k, v = qkv(CPU_FP32_MAX_KEYS + 1)
    assert scaled_dot_product_attention(q, k, v).dtype == torch.bfloat16
    q, k, v = qkv(8, torch.float32)
    scaled_dot_product_attention(q, k, v, is_causal=False)
    assert seen == [torch.bfloat16, torch.float32]


def test_under_cpu_autocast_short_attention_runs_in_fp32_with_autocasts_output_dtype(seen):
    q, k, v = qkv(16, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = scaled_dot_product_attention(q, k, v)
        long = scaled_dot_product_attention(*qkv(CPU_FP32_MAX_KEYS + 1, torch.float32))
    assert seen == [torch.float32, torch.bfloat16]
    assert out.dtype == long.dtype == torch.bfloat16
