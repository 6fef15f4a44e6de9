"""``loong`` subcommands of the diffusion plugin (light modules: no torch at import)."""
