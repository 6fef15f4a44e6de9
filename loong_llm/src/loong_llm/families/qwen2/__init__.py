"""Qwen2 / Qwen2.5: Llama-style decoder with a bias on the query/key/value projection."""
