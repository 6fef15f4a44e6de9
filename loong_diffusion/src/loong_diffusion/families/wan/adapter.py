"""Diffusers ``WanTransformer3DModel`` directories <-> loong checkpoints (names unchanged)."""

from __future__ import annotations

from loong_diffusion.adapter import DiffusersAdapter


class WanAdapter(DiffusersAdapter):
    """``hf_to_loong`` / ``loong_to_hf`` for the Wan family."""

    model_class = "diffusers:WanTransformer3DModel"
