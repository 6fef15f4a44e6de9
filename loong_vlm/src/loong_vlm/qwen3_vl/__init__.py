"""Qwen3-VL: the ``qwen3_vit`` encoder (with its merger and deepstack mergers), interleaved
MRoPE, deepstack injection into the first decoder layers, and the Hugging Face adapter."""
