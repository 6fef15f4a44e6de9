"""Multimodal data: conversations with images, placeholder expansion, assistant-only loss."""
