"""The loss of each Ulysses rank covers its own tokens: the shares of a token partition sum to the
one-rank flow-matching loss (values and gradients, every weighting), and each family's token
layout (``provider.tokens``) is the inverse of its model's unpatchify."""

from __future__ import annotations

import pytest
import torch

from loong_diffusion.config import FlowMatchConfig
from loong_diffusion.families.dit.config import DiTConfig
from loong_diffusion.families.dit.model import DiTProvider
from loong_diffusion.families.qwen_image.config import QwenImageConfig
from loong_diffusion.families.qwen_image.model import QwenImageProvider
from loong_diffusion.families.wan.config import WanConfig
from loong_diffusion.families.wan.model import WanProvider
from loong_diffusion.objective import FlowMatching

TINY_WAN = dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, text_dim=32,
                freq_dim=32, ffn_dim=64, num_layers=1, rope_max_seq_len=32)
TINY_QWEN = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
                 num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=[4, 6, 6])


def _patch_tokens(latents, p):
    b, c, h, w = latents.shape
    return latents.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)


@pytest.mark.parametrize("weighting", ["none", "sigma_sqrt", "cosmap"])
def test_token_shares_sum_to_the_whole_loss_and_gradient(weighting):
    objective = FlowMatching(FlowMatchConfig(loss_weighting=weighting))
    g = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 4, 8, 8, generator=g)
    u = torch.rand(3, generator=g) * 0.8 + 0.1
    weight = torch.randn(4, 4, generator=g, requires_grad=True)

    def denoise(x_t, _sigmas):
        return torch.einsum("oc,bchw->bohw", weight, x_t)

    whole = objective.loss(denoise, x0, noise, u)
    grad_whole, = torch.autograd.grad(whole.sum(), weight)
    shares, grad_shares = [], torch.zeros_like(weight)
    for part in range(4):  # 16 tokens of 2 x 2 patches, 4 tokens per share
        def select(t, part=part):
            return _patch_tokens(t, 2)[:, 4 * part:4 * (part + 1)]

        share = objective.loss(denoise, x0, noise, u, select=select)
        grad_shares += torch.autograd.grad(share.sum(), weight)[0]
        shares.append(share)
    assert torch.allclose(sum(shares), whole, rtol=1e-6, atol=0)
    assert torch.allclose(grad_shares, grad_whole, rtol=1e-5, atol=1e-7)


def _wan():
    provider = WanProvider(WanConfig(**TINY_WAN))
    x = torch.randn(1, 4, 3, 8, 8)
    return provider, provider.build_torch_model(), x, {"text_embeds": torch.randn(1, 8, 32)}


def _qwen_image():
    provider = QwenImageProvider(QwenImageConfig(**TINY_QWEN))
    x = torch.randn(1, 4, 8, 8)
    return provider, provider.build_torch_model(), x, {"text_embeds": torch.randn(1, 5, 32)}


def _dit():
    provider = DiTProvider(DiTConfig(hidden_size=32, num_layers=1, num_attention_heads=2))
    x = torch.randn(1, 1, 8, 8)
    return provider, provider.build_torch_model(), x, {"class_label": torch.tensor([3])}


@pytest.mark.parametrize("family", [_wan, _qwen_image, _dit])
def test_token_layout_inverts_the_models_unpatchify(family):
    torch.manual_seed(0)
    provider, model, x, condition = family()
    head = model.out if hasattr(model, "out") else model.proj_out
    numbered = {}

    def replace(_module, _args, out):  # the output projection's tokens numbered 0, 1, 2, ...
        numbered["tokens"] = torch.arange(out.numel(), dtype=out.dtype).view_as(out)
        return numbered["tokens"]

    handle = head.register_forward_hook(replace)
    with torch.no_grad():
        latent = provider.denoise(model, x, torch.tensor([0.5]), condition)
    handle.remove()
    assert latent.shape == x.shape
    assert torch.equal(provider.tokens(latent), numbered["tokens"])
