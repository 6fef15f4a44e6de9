"""Qwen2.5-VL: vision tower, patch merger, composed model and HF adapter."""
