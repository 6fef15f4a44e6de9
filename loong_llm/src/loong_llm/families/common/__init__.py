"""Code shared by the decoder families: config base, provider, RoPE, MoE statistics."""
