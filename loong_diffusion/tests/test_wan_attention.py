"""Wan trained by loong runs its attention through loong's processor (fp32 rotary, loong's SDPA):
the same outputs and gradients as diffusers' own processor, on the same module and weights."""

from __future__ import annotations

import pytest
import torch

TINY_WAN = dict(patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=32)


def _models():
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DiffusersProcessor

    from loong_diffusion.families.wan.attention import WanAttnProcessor
    from loong_diffusion.families.wan.config import WanConfig
    from loong_diffusion.families.wan.model import WanProvider

    torch.manual_seed(0)
    ours = WanProvider(WanConfig(name="wan", **TINY_WAN)).build_torch_model()
    processors = [m.processor for m in ours.modules() if hasattr(m, "processor")]
    assert len(processors) == 2 * TINY_WAN["num_layers"] and all(isinstance(p, WanAttnProcessor) for p in processors)
    reference = type(ours)(**{**TINY_WAN, "patch_size": tuple(TINY_WAN["patch_size"])})
    reference.load_state_dict(ours.state_dict())
    assert all(isinstance(m.processor, DiffusersProcessor) for m in reference.modules() if hasattr(m, "processor"))
    return ours, reference


def _loss_and_grads(model, autocast: bool):
    generator = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 4, 3, 8, 8, generator=generator)
    text = torch.randn(2, 7, 32, generator=generator)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(hidden_states=latents, timestep=torch.tensor([300.0, 800.0]), encoder_hidden_states=text,
                    return_dict=False)[0]
    loss = out.float().pow(2).mean()
    loss.backward()
    return out.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("autocast, tol", [(False, 1e-5), (True, 2e-2)])
def test_loongs_wan_attention_equals_diffusers(autocast, tol):
    ours, reference = _models()
    assert sorted(ours.state_dict()) == sorted(reference.state_dict())
    out, grads = _loss_and_grads(ours, autocast)
    ref_out, ref_grads = _loss_and_grads(reference, autocast)
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    assert sorted(grads) == sorted(ref_grads)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=tol * max(1.0, grad.abs().max().item()), rtol=tol,
                                   msg=name)


def test_image_attention_keeps_diffusers_processor():
    from loong_diffusion.families.wan.attention import WanAttnProcessor, install_attention

    ours, _ = _models()
    block = ours.blocks[0]
    block.attn2.add_k_proj = torch.nn.Linear(4, 4)  # stands for an I2V model's image keys
    with pytest.raises(ValueError, match="I2V"):
        WanAttnProcessor()(block.attn2, torch.zeros(1, 2, 32), torch.zeros(1, 3, 32))
    block.attn2.set_processor(type(ours.blocks[1].attn1.processor)())
    assert install_attention(ours) == 2 * TINY_WAN["num_layers"] - 1
