"""Qwen3 dense: Llama-style decoder with RMSNorm over each query/key head."""
