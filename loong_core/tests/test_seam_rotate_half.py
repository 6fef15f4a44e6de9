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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_major_result_has_the_same_values_and_gradient(dtype):
    """Stored ``[b, s, h, d]`` for the seam's attention: same values and input gradient."""
    generator = torch.Generator().manual_seed(1)
    s, b, h, d = 9, 3, 2, 8
    mixed = torch.randn(s, b, h, 3 * d, generator=generator).to(dtype)  # a strided split, as from fused QKV
    freqs = torch.randn(s, 1, 1, d, generator=generator) * 40
    grad = torch.randn(s, b, h, d, generator=generator).to(dtype)
    outs, grads = [], []
    for batch_major in (False, True):
        source = mixed.clone().requires_grad_()
        out = rotate_half.apply(source[..., :d], freqs, batch_major=batch_major)
        out.backward(grad)
        outs.append(out)
        grads.append(source.grad)
    assert outs[0].is_contiguous()
    assert outs[1].transpose(0, 1).is_contiguous() and not outs[1].is_contiguous()
    assert outs[1].shape == outs[0].shape
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0], grads[1])


def test_batch_major_is_what_the_config_declares():
    config = SimpleNamespace()
    assert not rotate_half.batch_major(config)
    rotate_half.mark_batch_major(config)
    assert rotate_half.batch_major(config)
    # one sample: nothing to reorder
    out = rotate_half.apply(torch.randn(4, 1, 2, 8), torch.randn(4, 1, 1, 8), batch_major=True)
    assert out.is_contiguous()
