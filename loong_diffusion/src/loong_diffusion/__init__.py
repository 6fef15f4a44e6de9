"""loong diffusion plugin: flow-matching DiTs, samplers and image/latent data."""
