"""A small class-conditional DiT (adaLN-Zero blocks) for images that fit on a CPU."""
