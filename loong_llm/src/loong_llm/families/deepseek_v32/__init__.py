"""DeepSeek-V3.2 (``deepseek_v32``): DeepSeek-V3's MLA and MoE with DeepSeek sparse attention
(a lightning indexer picks the top-k keys of each query; attention runs over those only)."""
