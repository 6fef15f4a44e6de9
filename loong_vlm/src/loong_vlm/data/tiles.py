"""Fixed-size tiling of images for InternVL-style encoders: an image is resized onto the grid of
``columns x rows`` tiles whose shape best matches its aspect ratio (``min_tiles`` to
``max_tiles`` tiles), cut into those tiles in row-major order, and followed by a thumbnail of the
whole image at tile size when there is more than one tile (transformers' GotOcr2 / InternVL
image processor with ``crop_to_patches``). A video is its sampled frames, one tile each.

:class:`TileProcessor` has the interface of :class:`~loong_vlm.data.vision.VisionProcessor` that
the LLaVA pipeline uses (``data.image_processing=tiles``): the "grid" of an input is
``(tiles, tile_size / patch_size, tile_size / patch_size)``, so its placeholder tokens are
``tiles * (tile_size / patch_size / merge_size)^2``, and its pixels are ``[tiles, 3, tile, tile]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from loong_vlm.data.vision import normalised, sample_frame_indices

#: ImageNet's normalisation, InternVL's.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@lru_cache(maxsize=64)
def _grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every ``(columns, rows)`` with ``min_tiles <= columns * rows <= max_tiles``, fewest tiles
    first (columns-major among equal counts)."""
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
             if min_tiles <= c * r <= max_tiles]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def tile_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """``(columns, rows)`` of the tiling of a ``height x width`` image.

    The grid whose ``columns / rows`` is closest to ``width / height`` wins; among grids equally
    close, a later (larger) one replaces the choice while the image's area exceeds half of that
    grid's tile area, so that small images are not blown up into many tiles.
    """
    if height < 1 or width < 1:
        raise ValueError(f"an image of {height}x{width} pixels has no area")
    ratio, area = width / height, width * height
    best, best_gap = (1, 1), float("inf")
    for columns, rows in _grids(min_tiles, max_tiles):
        gap = abs(ratio - columns / rows)
        if gap < best_gap:
            best, best_gap = (columns, rows), gap
        elif gap == best_gap and area > 0.5 * tile * tile * columns * rows:
            best = (columns, rows)
    return best


@dataclass(frozen=True)
class TileProcessor:
    """Images as fixed-size normalised tiles.

    Attributes:
        tile_size: Side of a tile in pixels (InternVL: 448).
        min_tiles: Fewest tiles of an image (before the thumbnail).
        max_tiles: Most tiles of an image (before the thumbnail).
        use_thumbnail: Add the whole image at tile size after its tiles (when more than one).
        patch_size: Side of the encoder's patches (placeholder counts).
        merge_size: Side of the patch block the projector merges into one token.
        video_max_frames: Frames sampled from a longer frame list (one tile each).
        mean: Per-channel mean subtracted after scaling to [0, 1].
        std: Per-channel standard deviation divided by.
    """

    tile_size: int = 448
    min_tiles: int = 1
    max_tiles: int = 12
    use_thumbnail: bool = True
    patch_size: int = 14
    merge_size: int = 2
    video_max_frames: int = 16
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    temporal_patch_size = 1  # a frame is a tile of its own (VisionProcessor's interface)

    def count(self, height: int, width: int) -> int:
        """Tiles (thumbnail included) of an image of that size (no pixels needed)."""
        columns, rows = tile_grid(height, width, self.tile_size, self.min_tiles, self.max_tiles)
        n = columns * rows
        return n + 1 if self.use_thumbnail and n > 1 else n

    @property
    def _side(self) -> int:
        return self.tile_size // self.patch_size

    def image_grid(self, height: int, width: int) -> tuple[int, int, int]:
        """``(tiles, side, side)`` of an image of that size (no pixels needed)."""
        return self.count(height, width), self._side, self._side

    def video_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """``(frames kept, side, side)`` of a frame list of that length."""
        return len(sample_frame_indices(num_frames, self.video_max_frames, 1)), self._side, self._side

    def tokens(self, grid: Sequence[int]) -> int:
        """Placeholder tokens of a grid (tiles x tokens per tile)."""
        n, h, w = grid
        return n * h * w // (self.merge_size * self.merge_size)

    def image(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Tiles and grid of one PIL image."""
        tiles = self.tiles(image)
        return tiles, (tiles.shape[0], self._side, self._side)

    def video(self, frames: Sequence) -> tuple[np.ndarray, tuple[int, int, int]]:
        """One tile per sampled frame (each resized whole) and the grid, of PIL frames."""
        t = self.tile_size
        keep = sample_frame_indices(len(frames), self.video_max_frames, 1)
        tiles = np.stack([normalised(frames[i], (t, t), self.mean, self.std) for i in keep])
        return tiles, (len(keep), self._side, self._side)

    def tiles(self, image) -> np.ndarray:
        """``[n_tiles, 3, tile, tile]`` float32 of one PIL image."""
        t = self.tile_size
        columns, rows = tile_grid(image.height, image.width, t, self.min_tiles, self.max_tiles)
        canvas = normalised(image, (rows * t, columns * t), self.mean, self.std)
        tiles = [canvas[:, r * t:(r + 1) * t, c * t:(c + 1) * t] for r in range(rows) for c in range(columns)]
        if self.use_thumbnail and len(tiles) > 1:
            tiles.append(normalised(image, (t, t), self.mean, self.std))
        return np.stack(tiles)
