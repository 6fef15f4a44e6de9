"""Qwen-Image: latents ``[B, C, H, W]`` packed into 2x2 tokens, text embeddings + mask, timestep ``sigma``."""

from __future__ import annotations

import torch

from loong_diffusion.diffusers_dit import DiffusersProvider
from loong_diffusion.families.qwen_image.config import QwenImageConfig


def pack(latents: torch.Tensor, p: int) -> torch.Tensor:
    """``[B, C, H, W]`` -> ``[B, (H/p)(W/p), C*p*p]`` (the Qwen-Image pipeline's packing)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // p) * (w // p), c * p * p)


def unpack(tokens: torch.Tensor, h: int, w: int, p: int) -> torch.Tensor:
    """Inverse of :func:`pack`."""
    b, _, d = tokens.shape
    c = d // (p * p)
    x = tokens.view(b, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, h, w)


def _text_len(args: tuple, kwargs: dict) -> int:
    """Text tokens of a call of the double-stream attention (its ``encoder_hidden_states``)."""
    text = kwargs["encoder_hidden_states"] if "encoder_hidden_states" in kwargs else args[1]
    return int(text.shape[1])


class QwenImageProvider(DiffusersProvider):
    """Flow matching on diffusers' ``QwenImageTransformer2DModel``."""

    config: QwenImageConfig
    model_class = "diffusers:QwenImageTransformer2DModel"
    block_attr = "transformer_blocks"
    torch_unused_parameters = True  # the last block's text-stream outputs are not used

    def denoise(self, model, x_t, sigmas, condition):
        video = x_t.dim() == 5  # Wan-VAE latents of one frame: [B, C, 1, H, W]
        latents = x_t[:, :, 0] if video else x_t
        b, _, h, w = latents.shape
        p = self.config.patch_size
        text = condition["text_embeds"]
        mask = condition.get("text_mask")
        if mask is None:
            mask = torch.ones(text.shape[:2], dtype=torch.long, device=text.device)
        out = model(hidden_states=pack(latents, p), encoder_hidden_states=text, encoder_hidden_states_mask=mask,
                    timestep=sigmas.to(latents.dtype), img_shapes=[[(1, h // p, w // p)]] * b,
                    return_dict=False)[0]
        out = unpack(out, h, w, p)
        return out[:, :, None] if video else out

    def enable_ulysses(self, model) -> None:
        """Shard the image tokens after ``img_in`` (and their RoPE angles), keep the text stream
        replicated, run the joint attention sequence-parallel (image tokens all-to-all, text
        heads sliced locally and gathered back), zero-pad the other ranks' image tokens after
        ``proj_out`` (the loss covers this rank's, :meth:`tokens`)."""
        from loong_diffusion import ulysses_hooks as hooks

        hooks.shard_output(model.img_in, dim=1)
        hooks.shard_output(model.pos_embed, dim=0, index=0)
        hooks.mark_attention([block.attn for block in model.transformer_blocks], _text_len)
        hooks.pad_output(model.proj_out, dim=1)

    def tokens(self, latents):
        """The packed 2x2 tokens of :func:`pack` (``[B, C, 1, H, W]`` Wan-VAE latents: of the frame)."""
        return pack(latents[:, :, 0] if latents.dim() == 5 else latents, self.config.patch_size)

    def latent_tokens(self, latents) -> int:
        p = self.config.patch_size
        return (latents.shape[-2] // p) * (latents.shape[-1] // p)

    def flops_per_token(self, seq_length: int) -> float:
        """Per sample is unknown until the image size is known; 0 disables MFU."""
        return 0.0
