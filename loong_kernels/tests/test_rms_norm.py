"""rms_norm:triton equals the torch reference, forward and backward, with and without the residual."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import reference
from loong_kernels.testing import check
from loong_kernels.triton.rms_norm import rms_norm

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 48), (7, 37), (300, 40)])  # odd rows / widths; several row tiles
def test_rms_norm_matches_reference(dtype, shape):
    x = torch.randn(shape, dtype=dtype)
    w = (1 + 0.1 * torch.randn(shape[-1])).to(dtype)
    check(lambda a, b: rms_norm(a, b, 1e-6), lambda a, b: reference.rms_norm(a, b, 1e-6), [x, w], dtype,
          f"rms_norm {dtype} {shape}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_fused_residual_returns_norm_and_sum(dtype):
    x, r = torch.randn(2, 9, 40, dtype=dtype), torch.randn(2, 9, 40, dtype=dtype)
    w = torch.randn(40, dtype=dtype)
    check(lambda a, b, c: rms_norm(a, b, 1e-5, c), lambda a, b, c: reference.rms_norm(a, b, 1e-5, c), [x, w, r],
          dtype, f"rms_norm residual {dtype}")


def test_rms_norm_fp32_weight_with_bf16_input_keeps_input_dtype():
    x, w = torch.randn(6, 24, dtype=torch.bfloat16), torch.randn(24)
    check(lambda a, b: rms_norm(a, b, 1e-6), lambda a, b: reference.rms_norm(a, b, 1e-6), [x, w], torch.bfloat16,
          "rms_norm mixed")
