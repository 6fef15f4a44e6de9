"""Diffusion datasets: real digit images and synthetic latents with text embeddings."""
