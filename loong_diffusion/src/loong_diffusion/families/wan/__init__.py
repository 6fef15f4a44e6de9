"""Wan 2.1 / 2.2 video DiT through diffusers' ``WanTransformer3DModel``."""
