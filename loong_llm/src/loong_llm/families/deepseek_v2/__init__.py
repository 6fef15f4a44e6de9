"""DeepSeek-V2 / V2-Lite: deepseek_v3's MLA and MoE with a softmax router without expert bias."""
