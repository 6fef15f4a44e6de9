"""layer_norm_modulate:triton equals the torch reference (adaLN per sample and per token)."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import reference
from loong_kernels.testing import check
from loong_kernels.triton.layer_norm_modulate import layer_norm_modulate


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("shape", [(2, 5, 24), (2, 300, 16)])  # the second: 3 tiles of 64 rows per backward program
def test_modulation_matches_reference(dtype, per_token, shape):
    B, S, D = shape
    mod_shape = (B, S, D) if per_token else (B, 1, D)
    x = torch.randn(B, S, D, dtype=dtype)
    shift, scale = torch.randn(mod_shape, dtype=dtype), 0.5 * torch.randn(mod_shape, dtype=dtype)
    check(lambda a, b, c: layer_norm_modulate(a, b, c, 1e-6), lambda a, b, c: reference.layer_norm_modulate(
        a, b, c, 1e-6), [x, shift, scale], dtype, f"modulate {dtype} per_token={per_token}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_modulation_with_affine_norm_odd_width(dtype):
    """Odd width, and fp32 shift / scale with bf16 activations (DiT conditioning in fp32)."""
    x = torch.randn(3, 7, 37, dtype=dtype)
    shift, scale = torch.randn(3, 1, 37), torch.randn(3, 1, 37)
    w, b = (1 + 0.1 * torch.randn(37)).to(dtype), (0.1 * torch.randn(37)).to(dtype)
    check(lambda *a: layer_norm_modulate(a[0], a[1], a[2], 1e-5, a[3], a[4]),
          lambda *a: reference.layer_norm_modulate(a[0], a[1], a[2], 1e-5, a[3], a[4]), [x, shift, scale, w, b],
          dtype, f"modulate affine {dtype}")

