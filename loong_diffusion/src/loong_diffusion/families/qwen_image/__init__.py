"""Qwen-Image MMDiT through diffusers' ``QwenImageTransformer2DModel``."""
