"""Hugging Face interop: per-family name-mapping tables, transforms, loading and export."""
