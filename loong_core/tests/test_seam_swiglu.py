"""The plain SwiGLU of the megatron engine's seam is megatron-core's gated SiLU, bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from loong_core.engines.megatron.seam import swiglu


def megatron_glu(x: torch.Tensor) -> torch.Tensor:
    """megatron-core's MLP activation without ``use_te_activation_func`` (``mlp.py``'s ``glu``)."""
    x_glu, x_linear = torch.chunk(x, 2, dim=-1)
    return F.silu(x_glu) * (x_linear + 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(17, 3, 2 * 24), (5, 2 * 37)])  # odd half: not a vector multiple
def test_forward_and_gradient_equal_megatron_core(dtype, shape):
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=generator) * 4).to(dtype)
    grad = torch.randn(*shape[:-1], shape[-1] // 2, generator=generator).to(dtype)
    ref_in, new_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    ref, new = megatron_glu(ref_in), swiglu.apply(new_in)
    ref.backward(grad)
    new.backward(grad)
    assert new.dtype == ref.dtype == dtype
    assert torch.equal(new, ref)
    assert torch.equal(new_in.grad, ref_in.grad)


def test_only_megatron_cores_plain_gated_silu_is_taken():
    plain = SimpleNamespace(gated_linear_unit=True, activation_func=F.silu,
                            activation_func_clamp_value=None, glu_linear_offset=0.0)
    assert swiglu.covers(plain)
    for change in ({"gated_linear_unit": False}, {"activation_func": F.gelu},
                   {"activation_func_clamp_value": 7.0}, {"glu_linear_offset": 1.0}):
        assert not swiglu.covers(SimpleNamespace(**{**vars(plain), **change})), change
