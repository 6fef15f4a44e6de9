"""Qwen3-MoE: Qwen3 attention with top-k softmax-routed experts."""
