"""Dynamic-resolution image and video preprocessing for Qwen2-VL-style encoders.

An image keeps (close to) its aspect ratio: both sides are rounded to a multiple of
``patch_size * merge_size`` with the pixel count kept within ``[min_pixels, max_pixels]``
(:func:`smart_resize`). It is resized with bicubic resampling, scaled to [0, 1], normalised with a
per-channel mean/std, then cut into ``patch_size`` squares that also span ``temporal_patch_size``
frames (an image is repeated over them; a video's frames fill them). Patches are emitted in
merge-window order: every ``merge_size x merge_size`` window of neighbouring patches is
contiguous, windows in row-major order, so a patch merger reads consecutive rows. One patch row is
``channels * temporal_patch_size * patch_size**2`` values in ``(channel, time, y, x)`` order, as
transformers' ``Qwen2VLImageProcessor`` lays them out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: CLIP's normalisation, the default of Qwen2-VL / Qwen2.5-VL.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target ``(height, width)``: multiples of ``factor``, aspect ratio kept, pixels in range.

    Each side is first rounded to the nearest multiple of ``factor``; when the area then exceeds
    ``max_pixels`` (falls below ``min_pixels``) both sides are scaled down (up) by the same ratio
    and floored (ceiled) to multiples of ``factor``.

    Args:
        height: Original height in pixels.
        width: Original width in pixels.
        factor: ``patch_size * merge_size``.
        min_pixels: Smallest allowed area.
        max_pixels: Largest allowed area.

    Raises:
        ValueError: A side is not positive or the aspect ratio exceeds 200.
    """
    if height < 1 or width < 1:
        raise ValueError(f"an image of {height}x{width} pixels has no area")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"the aspect ratio of a {height}x{width} image exceeds 200")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = max(factor, math.ceil(height * scale / factor) * factor)
        w = max(factor, math.ceil(width * scale / factor) * factor)
    return h, w


def to_rgb(image):
    """A PIL image as RGB, transparent pixels composited onto white (as transformers does)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def normalised(image, size: tuple[int, int], mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """``[C, H, W]`` float32 of a PIL image converted to RGB, resized to ``size`` (h, w) with
    bicubic resampling (when it differs), scaled to [0, 1] and normalised per channel."""
    from PIL import Image

    rgb = to_rgb(image)
    if rgb.size != (size[1], size[0]):
        rgb = rgb.resize((size[1], size[0]), resample=Image.Resampling.BICUBIC)
    pixels = np.asarray(rgb, dtype=np.float32) / np.float32(255.0)
    mean, std = np.asarray(mean, np.float32), np.asarray(std, np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)


def frame_size(frames: Sequence) -> tuple[int, int]:
    """``(height, width)`` of a video's PIL frames; raises ValueError when they differ."""
    sizes = {(f.height, f.width) for f in frames}
    if len(sizes) != 1:
        raise ValueError(f"the frames of a video differ in size: {sorted(sizes)}")
    return sizes.pop()


def sample_frame_indices(num_frames: int, max_frames: int, temporal_patch_size: int) -> list[int]:
    """Frames of a video to keep, a multiple of ``temporal_patch_size`` of them.

    A video of at most ``max_frames`` frames keeps all of them and repeats its last frame to fill
    the last temporal patch (as transformers' Qwen2-VL video processor pads); a longer one is
    sampled evenly down to ``max_frames`` rounded down to the multiple.
    """
    if num_frames < 1:
        raise ValueError("a video needs at least one frame")
    if num_frames <= max_frames:
        return list(range(num_frames)) + [num_frames - 1] * (-num_frames % temporal_patch_size)
    keep = max(max_frames // temporal_patch_size, 1) * temporal_patch_size
    return [i * num_frames // keep for i in range(keep)]


def flatten_patches(frames: np.ndarray, patch_size: int, temporal_patch_size: int,
                    merge_size: int) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Patch rows of normalised frames, in merge-window order.

    Args:
        frames: ``[T, C, H, W]`` float32, ``T`` a multiple of ``temporal_patch_size`` and ``H``,
            ``W`` multiples of ``patch_size * merge_size``.
        patch_size: Side of a patch.
        temporal_patch_size: Frames per patch.
        merge_size: Side of a merge window, in patches.

    Returns:
        ``([t*h*w, C*temporal_patch_size*patch_size**2], (t, h, w))`` with ``(t, h, w)`` the grid.
    """
    n, c, height, width = frames.shape
    p, tp, m = patch_size, temporal_patch_size, merge_size
    if n % tp or height % (p * m) or width % (p * m):
        raise ValueError(f"frames of shape {frames.shape} do not tile into {tp}x{p}x{p} patches "
                         f"and {m}x{m} merge windows")
    t, h, w = n // tp, height // p, width // p
    x = frames.reshape(t, tp, c, h // m, m, p, w // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # t, window row, window col, row, col, c, time, y, x
    return np.ascontiguousarray(x.reshape(t * h * w, c * tp * p * p)), (t, h, w)


@dataclass(frozen=True)
class VisionProcessor:
    """Images and videos -> Qwen2-VL-style patch rows and grids.

    Attributes:
        patch_size: Side of a square patch in pixels.
        temporal_patch_size: Frames per patch (an image is repeated this many times).
        merge_size: Side of the patch block the projector merges into one token.
        min_pixels: Smallest area an image is resized to.
        max_pixels: Largest area an image is resized to.
        video_min_pixels: Smallest area of a video frame.
        video_max_pixels: Largest area of a video frame.
        video_max_frames: Frames sampled from a longer frame list.
        mean: Per-channel mean subtracted after scaling to [0, 1].
        std: Per-channel standard deviation divided by.
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = 56 * 56
    video_max_pixels: int = 28 * 28 * 256
    video_max_frames: int = 16
    mean: tuple[float, ...] = CLIP_MEAN
    std: tuple[float, ...] = CLIP_STD

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this."""
        return self.patch_size * self.merge_size

    def image_grid(self, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid ``(1, rows, cols)`` of an image of that size (no pixels needed)."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return 1, h // self.patch_size, w // self.patch_size

    def video_grid(self, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
        """Patch grid ``(t, rows, cols)`` of a frame list of that length and frame size."""
        kept = len(sample_frame_indices(num_frames, self.video_max_frames, self.temporal_patch_size))
        h, w = smart_resize(height, width, self.factor, self.video_min_pixels, self.video_max_pixels)
        return kept // self.temporal_patch_size, h // self.patch_size, w // self.patch_size

    def tokens(self, grid: Sequence[int]) -> int:
        """Placeholder tokens of a grid after merging."""
        t, h, w = grid
        return t * h * w // (self.merge_size * self.merge_size)

    def _normalised(self, image, size: tuple[int, int]) -> np.ndarray:
        """``[C, H, W]`` float32 of a PIL image converted to RGB, resized to ``size`` (h, w)."""
        return normalised(image, size, self.mean, self.std)

    def image(self, image) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid of one PIL image."""
        size = smart_resize(image.height, image.width, self.factor, self.min_pixels, self.max_pixels)
        frame = self._normalised(image, size)
        frames = np.broadcast_to(frame, (self.temporal_patch_size, *frame.shape))
        return flatten_patches(frames, self.patch_size, self.temporal_patch_size, self.merge_size)

    def video(self, frames: Sequence) -> tuple[np.ndarray, tuple[int, int, int]]:
        """Patch rows and grid of a video given as PIL frames (all of one size)."""
        size = smart_resize(*frame_size(frames), self.factor, self.video_min_pixels, self.video_max_pixels)
        keep = sample_frame_indices(len(frames), self.video_max_frames, self.temporal_patch_size)
        stack = np.stack([self._normalised(frames[i], size) for i in keep])
        return flatten_patches(stack, self.patch_size, self.temporal_patch_size, self.merge_size)
