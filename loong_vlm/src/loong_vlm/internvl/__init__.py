"""InternVL 2.5 / 3 / 3.5 (``internvl``): InternViT + pixel-shuffle MLP projector + any decoder."""
