"""A world-action model: one DiT denoises future observation latents and actions jointly."""
