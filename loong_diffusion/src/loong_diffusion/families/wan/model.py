"""Wan: latent video ``[B, C, F, H, W]``, text embeddings, timestep ``sigma * 1000``."""

from __future__ import annotations

from loong_diffusion.diffusers_dit import DiffusersProvider
from loong_diffusion.families.wan.config import WanConfig


class WanProvider(DiffusersProvider):
    """Flow matching on diffusers' ``WanTransformer3DModel``."""

    config: WanConfig
    model_class = "diffusers:WanTransformer3DModel"
    block_attr = "blocks"

    def build_torch_model(self):
        """diffusers' model, its attention through loong's SDPA (:mod:`.attention`)."""
        from loong_diffusion.families.wan.attention import install_attention

        model = super().build_torch_model()
        install_attention(model)
        return model

    def denoise(self, model, x_t, sigmas, condition):
        text = condition["text_embeds"]
        if "text_mask" in condition:  # Wan pads prompts with zero embeddings, not an attention mask
            text = text * condition["text_mask"].unsqueeze(-1).to(text.dtype)
        return model(hidden_states=x_t, timestep=sigmas * 1000.0, encoder_hidden_states=text,
                     return_dict=False)[0]

    def enable_ulysses(self, model) -> None:
        """Shard the video tokens (and their RoPE angles) after the patch embedding, all-to-all
        around the self-attention, zero-pad the other ranks' tokens after ``proj_out`` (the loss
        covers this rank's, :meth:`tokens`); the cross-attention keeps all text tokens on every
        rank (local queries need no exchange)."""
        from loong_diffusion import ulysses_hooks as hooks

        hooks.shard_all_outputs(model.rope, dim=1)
        hooks.shard_input(model.blocks[0], "hidden_states", position=0, dim=1)
        hooks.mark_attention([block.attn1 for block in model.blocks], hooks.no_text)
        hooks.pad_output(model.proj_out, dim=1)

    def tokens(self, latents):
        """``[B, C, F, H, W]`` -> ``[B, (F/pt)(H/ph)(W/pw), pt*ph*pw*C]``: the token layout of
        ``proj_out``'s output, which diffusers' ``WanTransformer3DModel`` unpatchifies as
        ``[B, f, h, w, pt, ph, pw, C]`` (frame-major tokens, then the patch, channels last)."""
        pt, ph, pw = self.config.patch_size
        b, c, f, h, w = latents.shape
        x = latents.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 3, 5, 7, 1)
        return x.reshape(b, (f // pt) * (h // ph) * (w // pw), pt * ph * pw * c)

    def latent_tokens(self, latents) -> int:
        pt, ph, pw = self.config.patch_size
        _, _, f, h, w = latents.shape
        return (f // pt) * (h // ph) * (w // pw)

    def flops_per_token(self, seq_length: int) -> float:
        """Per sample is unknown until the clip size is known; 0 disables MFU."""
        return 0.0
