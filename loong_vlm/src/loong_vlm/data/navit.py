"""Native-resolution preprocessing of Kimi-K2.5 / MoonViT (``data.image_processing=navit``), as
transformers' ``Kimi_K25ImageProcessor`` and ``Kimi_K25VideoProcessor`` do it.

An image is never upscaled: it shrinks (keeping its aspect ratio) until it has at most
``max_patches`` patches and at most ``max_patches_per_side`` patches per side, each side is
truncated to whole pixels, then it is padded with black on the bottom and right to multiples of
``patch_size * merge_size``. The resize is bicubic with antialiasing on the 8-bit image (torch's
``_upsample_bicubic2d_aa``, what torchvision's resize runs), rounded back to 8 bits; pixels are
scaled to [0, 1] and normalised with mean = std = 0.5. Patches carry one frame each (``C *
patch_size^2`` values) in merge-block order (:func:`loong_vlm.data.vision.flatten_patches` with
one frame per patch).

A video's sampled frames are resized the same way under ``video_max_patches`` and grouped into
clips of ``clip_frames`` frames (the last may be shorter): its grid is ``(frames, h, w)``, the
encoder attends over each clip and averages its frames, so a clip costs one frame's tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loong_vlm.data.vision import flatten_patches, frame_size, sample_frame_indices, to_rgb

#: Kimi-K2.5's normalisation (transformers' ``IMAGENET_STANDARD_MEAN`` / ``_STD``).
HALF = (0.5, 0.5, 0.5)


def navit_size(height: int, width: int, patch_size: int, merge_size: int, max_patches: int,
               max_patches_per_side: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((resized height, width), (padded height, width))`` of a ``height x width`` image.

    Args:
        height: Original height in pixels.
        width: Original width in pixels.
        patch_size: Side of a patch.
        merge_size: Side of the patch block merged into one token.
        max_patches: Most patches of the resized image.
        max_patches_per_side: Most patches along either side.
    """
    if height < 1 or width < 1:
        raise ValueError(f"an image of {height}x{width} pixels has no area")
    patches = max(1, height // patch_size) * max(1, width // patch_size)
    limit = max_patches_per_side * patch_size
    scale = min(1.0, math.sqrt(max_patches / patches), limit / height, limit / width)
    new_h = min(max(1, int(height * scale)), limit)
    new_w = min(max(1, int(width * scale)), limit)
    factor = patch_size * merge_size
    return (new_h, new_w), (-(-new_h // factor) * factor, -(-new_w // factor) * factor)


def resized_padded(image, size: tuple[int, int], padded: tuple[int, int], mean: Sequence[float],
                   std: Sequence[float]) -> np.ndarray:
    """``[C, H, W]`` float32 of a PIL image: RGB, resized to ``size`` (bicubic, antialiased, 8-bit
    rounding), black-padded to ``padded`` on the bottom / right, scaled to [0, 1], normalised."""
    import torch

    pixels = torch.from_numpy(np.asarray(to_rgb(image), dtype=np.uint8).copy()).permute(2, 0, 1)
    if tuple(pixels.shape[1:]) != tuple(size):
        resized = torch.nn.functional.interpolate(pixels[None].float(), size=list(size), mode="bicubic",
                                                  align_corners=False, antialias=True)[0]
        pixels = resized.clamp_(0, 255).round_().to(torch.uint8)
    canvas = torch.zeros(3, *padded, dtype=torch.uint8)
    canvas[:, :size[0], :size[1]] = pixels
    scaled = canvas.float() * (1 / 255.0)
    mean_t, std_t = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    return ((scaled - mean_t) / std_t).numpy()


@dataclass(frozen=True)
class NaViTProcessor:
    """Images and videos -> MoonViT patch rows and grids (the interface of
    :class:`~loong_vlm.data.vision.VisionProcessor` the LLaVA pipeline uses).

    Attributes:
        patch_size: Side of a square patch in pixels (Kimi: 14).
        merge_size: Side of the patch block the projector merges into one token.
        max_patches: Patch budget of an image (Kimi: 16384).
        max_patches_per_side: Most patches along a side (Kimi's ``size.max_height``: 512).
        video_max_patches: Patch budget of a video frame (Kimi: 4096).
        clip_frames: Frames per clip (Kimi's video ``temporal_patch_size``: 4).
        video_max_frames: Frames sampled from a longer frame list.
        mean: Per-channel mean subtracted after scaling to [0, 1].
        std: Per-channel standard deviation divided by.
    """

    patch_size: int = 14
    merge_size: int = 2
    max_patches: int = 16384
    max_patches_per_side: int = 512
    video_max_patches: int = 4096
    clip_frames: int = 4
    video_max_frames: int = 16
    mean: tuple[float, ...] = HALF
    std: tuple[float, ...] = HALF

    @property
    def temporal_patch_size(self) -> int:
        """Frames per clip (the timestamp grouping of the video layout)."""
        return self.clip_frames

    def _size(self, height: int, width: int, budget: int):
        return navit_size(height, width, self.patch_size, self.merge_size, budget, self.max_patches_per_side)

    def image_grid(self, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid ``(1, rows, cols)`` of an image of that size (no pixels needed)."""
        _, (h, w) = self._size(height, width, self.max_patches)
        return 1, h // self.patch_size, w // self.patch_size

    def video_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid ``(frames kept, rows, cols)`` of a frame list of that length and frame size."""
        _, (h, w) = self._size(height, width, self.video_max_patches)
        frames = len(sample_frame_indices(num_frames, self.video_max_frames, 1))
        return frames, h // self.patch_size, w // self.patch_size

    def clip_runs(self, grid: Sequence[int]) -> list[int]:
        """Placeholder tokens of each clip of a video grid, in order."""
        t, h, w = grid
        return [h * w // (self.merge_size * self.merge_size)] * -(-t // self.clip_frames)

    def tokens(self, grid: Sequence[int]) -> int:
        """Placeholder tokens of a grid (an image: its merged patches; a video: one frame's per clip)."""
        return sum(self.clip_runs(grid))

    def image(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid of one PIL image."""
        size, padded = self._size(image.height, image.width, self.max_patches)
        frame = resized_padded(image, size, padded, self.mean, self.std)
        return flatten_patches(frame[None], self.patch_size, 1, self.merge_size)

    def video(self, frames: Sequence) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid of a video given as PIL frames (all of one size)."""
        size, padded = self._size(*frame_size(frames), self.video_max_patches)
        keep = sample_frame_indices(len(frames), self.video_max_frames, 1)
        stack = np.stack([resized_padded(frames[i], size, padded, self.mean, self.std) for i in keep])
        return flatten_patches(stack, self.patch_size, 1, self.merge_size)
