"""ERNIE-4.5-VL's preprocessing (``data.image_processing=ernie``), as transformers'
``Ernie4_5_VLMoeImageProcessorPil`` and ``Ernie4_5_VLMoeVideoProcessor`` do it.

Images are sized, resized and normalised as for Qwen2-VL (:func:`~loong_vlm.data.vision.smart_resize`,
PIL bicubic on the 8-bit image, CLIP mean / std), but a patch row carries one frame
(``C * patch_size^2`` values, merge-block order): an image's grid is ``(1, h, w)``. The resampler
merges ``temporal_patch_size`` (2) consecutive frames into one token and pairs an image with
itself, so an image takes ``h*w / merge^2`` placeholder tokens and a video of ``t`` frames
``t/2 * h*w / merge^2``.

A video keeps at most ``video_max_frames`` evenly spaced frames of its list (frame
``floor(i * n / kept)``), the last repeated when an odd number is kept. Its frames are resized
on the 8-bit tensor with torch's antialiased bicubic kernel for ``uint8`` (what torchvision's
resize runs for ``uint8`` images on the CPU, which transformers' video processor calls), then
normalised; its grid is ``(frames, h, w)``.

transformers' video processor also draws each frame's time onto its pixels by default
(``draw_on_frames``, with a font shipped with the checkpoint); this module does not (the same
as ``draw_on_frames=False``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loong_vlm.data.vision import VisionProcessor, flatten_patches, frame_size, smart_resize, to_rgb


def resized_8bit(image, size: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``[C, H, W]`` float32 of a PIL image: RGB, resized to ``size`` (h, w) by torch's ``uint8``
    antialiased bicubic kernel (when it differs), normalised with ``mean`` / ``std`` given for
    pixels scaled to [0, 1]."""
    import torch

    pixels = torch.from_numpy(np.asarray(to_rgb(image), dtype=np.uint8).copy()).permute(2, 0, 1)
    if tuple(pixels.shape[1:]) != tuple(size):
        pixels = torch.nn.functional.interpolate(pixels[None], size=list(size), mode="bicubic", align_corners=False,
                                                 antialias=True)[0]
    scale = torch.tensor(mean) * 255.0, torch.tensor(std) * 255.0
    return ((pixels.float() - scale[0][:, None, None]) / scale[1][:, None, None]).numpy()


@dataclass(frozen=True)
class ErnieVisionProcessor(VisionProcessor):
    """Images and videos -> ERNIE-4.5-VL patch rows (one frame each) and grids, with the
    interface of :class:`~loong_vlm.data.vision.VisionProcessor`; ``temporal_patch_size`` is the
    number of frames merged into one token (transformers' video ``temporal_patch_size``, 2)."""

    def tokens(self, grid: Sequence[int]) -> int:
        """Placeholder tokens of a grid: frames merged in groups (an image alone), then blocks."""
        t, h, w = grid
        return -(-t // self.temporal_patch_size) * h * w // (self.merge_size * self.merge_size)

    def frame_indices(self, num_frames: int) -> list[int]:
        """Frames kept of a frame list, in order (a whole number of temporal groups)."""
        if num_frames < 1:
            raise ValueError("a video needs at least one frame")
        kept = min(num_frames, self.video_max_frames)
        indices = [i * num_frames // kept for i in range(kept)]
        return indices + indices[-1:] * (-kept % self.temporal_patch_size)

    def video_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid ``(frames kept, rows, cols)`` of a frame list of that length and frame size."""
        h, w = smart_resize(height, width, self.factor, self.video_min_pixels, self.video_max_pixels)
        return len(self.frame_indices(num_frames)), h // self.patch_size, w // self.patch_size

    def image(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid ``(1, h, w)`` of one PIL image."""
        size = smart_resize(image.height, image.width, self.factor, self.min_pixels, self.max_pixels)
        return flatten_patches(self._normalised(image, size)[None], self.patch_size, 1, self.merge_size)

    def video(self, frames: Sequence) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid ``(frames kept, h, w)`` of a video given as PIL frames (all of one size)."""
        size = smart_resize(*frame_size(frames), self.factor, self.video_min_pixels, self.video_max_pixels)
        stack = np.stack([resized_8bit(frames[i], size, self.mean, self.std)
                          for i in self.frame_indices(len(frames))])
        return flatten_patches(stack, self.patch_size, 1, self.merge_size)
