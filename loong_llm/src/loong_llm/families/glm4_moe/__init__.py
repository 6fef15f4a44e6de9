"""GLM-4.5 / 4.6 (``glm4_moe``): GQA with qkv bias and partial RoPE, DeepSeek-V3-style experts."""
