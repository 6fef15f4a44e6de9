"""The plain RoPE of the megatron engine's seam is megatron-core's unfused RoPE, bit for bit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

from loong_core.engines.megatron.seam import rotate_half

CONFIG = SimpleNamespace(rotary_interleaved=False, multi_latent_attention=False, apply_rope_fusion=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("freq_batch", [1, 3])  # RoPE angles shared by the batch, or MRoPE's per sample
def test_forward_and_gradient_equal_megatron_core(dtype, freq_batch):
    generator = torch.Generator().manual_seed(0)
    s, b, h, d = 17, 3, 4, 16
    t = torch.randn(s, b, h, d, generator=generator).to(dtype)
    freqs = torch.randn(s, freq_batch, 1, d, generator=generator) * 40  # large angles: cos/sin rounding matters
    grad = torch.randn(s, b, h, d, generator=generator).to(dtype)
    ref_in, new_in = t.clone().requires_grad_(), t.clone().requires_grad_()
    ref = _apply_rotary_pos_emb_bshd(ref_in, freqs)
    new = rotate_half.apply(new_in, freqs)
    ref.backward(grad)
    new.backward(grad)
    assert new.dtype == ref.dtype == dtype
    assert torch.equal(new, ref)
    assert torch.equal(new_in.grad, ref_in.grad)


def test_only_the_layout_it_reproduces_is_taken():
    t, full, partial = torch.zeros(4, 1, 2, 8), torch.zeros(4, 1, 1, 8), torch.zeros(4, 1, 1, 4)
    assert rotate_half.covers(t, full, CONFIG, None, 1.0)
    assert not rotate_half.covers(t, partial, CONFIG, None, 1.0)  # an unrotated tail
    assert not rotate_half.covers(t, full, CONFIG, torch.tensor([0, 4]), 1.0)  # packed THD
    assert not rotate_half.covers(t, full, CONFIG, None, 0.5)
    for flag in ("rotary_interleaved", "multi_latent_attention", "apply_rope_fusion"):
        assert not rotate_half.covers(t, full, SimpleNamespace(**{**vars(CONFIG), flag: True}), None, 1.0)
