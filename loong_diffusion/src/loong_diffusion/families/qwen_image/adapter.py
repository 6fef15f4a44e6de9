"""Diffusers ``QwenImageTransformer2DModel`` directories <-> loong checkpoints (names unchanged)."""

from __future__ import annotations

from loong_diffusion.adapter import DiffusersAdapter


class QwenImageAdapter(DiffusersAdapter):
    """``hf_to_loong`` / ``loong_to_hf`` for the Qwen-Image family."""

    model_class = "diffusers:QwenImageTransformer2DModel"
