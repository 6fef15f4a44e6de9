"""Llama-style decoder: RMSNorm, SwiGLU, RoPE, grouped-query attention."""
