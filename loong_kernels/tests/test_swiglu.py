"""swiglu:triton equals the torch reference, forward and backward."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import reference
from loong_kernels.testing import check
from loong_kernels.triton.swiglu import swiglu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 3, 2 * 44), (9, 2 * 300)])  # odd rows; blocks across rows
def test_swiglu_matches_reference(dtype, shape):
    check(swiglu, reference.swiglu, [torch.randn(shape, dtype=dtype)], dtype, f"swiglu {dtype} {shape}")


def test_swiglu_rejects_odd_width():
    with pytest.raises(ValueError, match="even last dim"):
        swiglu(torch.randn(2, 7))
