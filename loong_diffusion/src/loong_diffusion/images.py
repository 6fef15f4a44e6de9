"""Write generated images as a PNG grid and latent videos as an animated GIF."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def to_uint8(images: torch.Tensor) -> np.ndarray:
    """``[N, C, H, W]`` in [-1, 1] -> ``[N, H, W, C]`` uint8 (C = 1 or 3; other C use the first 3)."""
    x = images.detach().float().clamp(-1, 1).add(1).mul(127.5).round().to(torch.uint8)
    x = x[:, :3] if x.shape[1] >= 3 else x[:, :1]
    return x.permute(0, 2, 3, 1).cpu().numpy()


def grid(images: torch.Tensor, rows: int, scale: int = 4, pad: int = 1) -> np.ndarray:
    """Tile ``[N, C, H, W]`` images row-major into ``rows`` rows; nearest-neighbour upscaled."""
    pixels = to_uint8(images).repeat(scale, axis=1).repeat(scale, axis=2)
    n, h, w, c = pixels.shape
    cols = -(-n // rows)
    canvas = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, c), 255, dtype=np.uint8)
    for k in range(n):
        r, q = divmod(k, cols)
        canvas[pad + r * (h + pad): pad + r * (h + pad) + h, pad + q * (w + pad): pad + q * (w + pad) + w] = pixels[k]
    return canvas


def save_png(canvas: np.ndarray, out: str | Path) -> None:
    from PIL import Image

    Image.fromarray(canvas.squeeze(-1) if canvas.shape[-1] == 1 else canvas).save(out)


def save_gif(videos: torch.Tensor, out: str | Path, rows: int, duration_ms: int = 200) -> None:
    """``[N, C, F, H, W]`` latents (normalised per video) -> one animated grid, a frame per F."""
    from PIL import Image

    v = videos.detach().float()
    v = v / v.flatten(1).abs().amax(dim=1).clamp(min=1e-6).view(-1, 1, 1, 1, 1)
    frames = [grid(v[:, :, f], rows) for f in range(v.shape[2])]
    images = [Image.fromarray(f.squeeze(-1) if f.shape[-1] == 1 else f) for f in frames]
    images[0].save(out, save_all=True, append_images=images[1:], duration=duration_ms, loop=0)
