"""Wan's attention through loong's scaled-dot-product attention, on diffusers' own modules.

diffusers' ``WanAttnProcessor`` calls torch's SDPA in whatever dtype autocast hands it. On a CPU
that is slow in bf16 for short key sequences (the backward above all; the text keys of the
cross-attention are a few dozen), which :mod:`loong_core.kernels.sdpa_precision` avoids by
attending in fp32 there. :class:`WanAttnProcessor` is diffusers' processor with that one change
and the rotary embedding applied in fp32 (diffusers applies it in fp64, from fp64 tables); the
module, its parameters and state dict are diffusers' unchanged, installed with diffusers' own
``set_processor``. Attention modules with image keys (I2V: ``add_k_proj``) keep diffusers'
processor.

Measured on a 2-vCPU AVX512-BF16 EPYC, a 4-block Wan (8 heads x 32, 256 video and 32 text tokens,
batch 4; ``benchmarks/peers_dit.py``'s shape), forward + backward + AdamW under bf16 autocast,
median of 12 steps in two alternating runs: 0.182 / 0.195 s with this processor against 0.194 /
0.209 s with diffusers'; in fp32 the two are level (both attend in fp32).

Ulysses sequence parallelism (:mod:`loong_diffusion.ulysses_hooks`) wraps this module's
:func:`dispatch_attention_fn` as it wraps diffusers' for its processor.
"""

from __future__ import annotations

import torch

from loong_core.kernels import sdpa_precision


def dispatch_attention_fn(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                          **_backend_options) -> torch.Tensor:
    """diffusers' ``dispatch_attention_fn`` contract (``[batch, tokens, heads, head_dim]`` in and
    out) on :func:`loong_core.kernels.sdpa_precision.scaled_dot_product_attention`."""
    out = sdpa_precision.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=attn_mask,
        dropout_p=dropout_p, is_causal=is_causal)
    return out.transpose(1, 2)


def apply_rotary(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved rotary embedding of ``x [b, s, heads, d]`` from diffusers' tables
    (``[1, s, 1, d]``, each angle repeated twice), computed in fp32, returned in ``x``'s dtype."""
    pairs = x.float().unflatten(-1, (-1, 2))
    x1, x2 = pairs[..., 0], pairs[..., 1]
    cos, sin = freqs_cos[..., 0::2].float(), freqs_sin[..., 1::2].float()
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2).type_as(x)


class WanAttnProcessor:
    """diffusers' Wan attention (self- or text cross-attention) with loong's SDPA (module
    docstring). Called by ``WanAttention.forward`` with diffusers' arguments."""

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None, rotary_emb=None) -> torch.Tensor:
        if attn.add_k_proj is not None:
            raise ValueError("loong's WanAttnProcessor does not serve I2V attention (image keys); "
                             "install it only where add_k_proj is None (install_attention)")
        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(attn.to_k(context)).unflatten(2, (attn.heads, -1))
        value = attn.to_v(context).unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = apply_rotary(query, *rotary_emb), apply_rotary(key, *rotary_emb)
        out = dispatch_attention_fn(query, key, value, attn_mask=attention_mask)
        out = out.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](out))


def install_attention(model: torch.nn.Module) -> int:
    """Give every ``WanAttention`` of ``model`` without image keys loong's processor; returns how
    many (parameters and state dict unchanged)."""
    from diffusers.models.transformers.transformer_wan import WanAttention

    count = 0
    for module in model.modules():
        if isinstance(module, WanAttention) and module.add_k_proj is None:
            module.set_processor(WanAttnProcessor())
            count += 1
    return count
