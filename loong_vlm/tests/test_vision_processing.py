"""Dynamic-resolution preprocessing equals transformers' Qwen2-VL image processor (PIL backend)."""

from __future__ import annotations

import numpy as np
import pytest

from loong_vlm.data.vision import VisionProcessor, sample_frame_indices, smart_resize

Image = pytest.importorskip("PIL.Image")

GEOMETRY = dict(patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=16 * 16, max_pixels=64 * 64 * 4)
# (height, width, mode): upscaled, kept, downscaled, grey, extreme aspect ratio, transparent
SIZES = [(8, 9, "RGB"), (20, 30, "RGB"), (64, 40, "L"), (300, 90, "RGB"), (16, 150, "RGB"), (33, 47, "RGBA")]


def _random_image(rng, height: int, width: int, mode: str):
    shape = {"RGB": (height, width, 3), "RGBA": (height, width, 4)}.get(mode, (height, width))
    return Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode)


@pytest.fixture(scope="module")
def hf_processor():
    qwen2_vl = pytest.importorskip("transformers.models.qwen2_vl")
    return qwen2_vl.Qwen2VLImageProcessorPil(**GEOMETRY)


@pytest.mark.parametrize("height,width,mode", SIZES)
def test_image_patches_and_grid_equal_transformers(hf_processor, height, width, mode):
    image = _random_image(np.random.default_rng(height * width), height, width, mode)
    reference = hf_processor(images=[image], return_tensors="np")
    patches, grid = VisionProcessor(**GEOMETRY).image(image)
    assert list(grid) == reference["image_grid_thw"][0].tolist()
    assert patches.shape == reference["pixel_values"].shape
    assert np.abs(patches - reference["pixel_values"]).max() <= 1e-5


def test_grid_from_the_size_alone_matches_the_patches():
    processor = VisionProcessor(**GEOMETRY)
    for height, width, mode in SIZES:
        patches, grid = processor.image(_random_image(np.random.default_rng(0), height, width, mode))
        assert processor.image_grid(height, width) == grid
        assert processor.tokens(grid) * 4 == patches.shape[0]


def test_video_frames_fill_temporal_patches_in_order(hf_processor):
    """Temporal patch ``t`` holds frames ``2t`` and ``2t+1`` (an odd count repeats the last frame,
    as transformers' video processor pads); each frame's values equal the image processor's for
    that frame (which repeats one frame over both temporal slots)."""
    rng = np.random.default_rng(7)
    frames = [_random_image(rng, 24, 40, "RGB") for _ in range(5)]  # 5 frames + the last again
    processor = VisionProcessor(**GEOMETRY, video_min_pixels=16 * 16, video_max_pixels=64 * 64 * 4)
    patches, grid = processor.video(frames)
    keep = sample_frame_indices(5, processor.video_max_frames, 2)
    assert keep == [0, 1, 2, 3, 4, 4] and grid == (3, 4, 4)
    video = patches.reshape(3, 16, 3, 2, 8 * 8)  # [t, patch, channel, time, pixel]
    for t in range(3):
        for slot in range(2):
            reference = hf_processor(images=[frames[keep[2 * t + slot]]], return_tensors="np")["pixel_values"]
            expected = reference.reshape(16, 3, 2, 64)[:, :, 0]
            assert np.abs(video[t, :, :, slot] - expected).max() <= 1e-5


def test_frame_sampling_is_even_and_pads_short_videos():
    assert sample_frame_indices(10, 4, 2) == [0, 2, 5, 7]
    assert sample_frame_indices(10, 5, 2) == [0, 2, 5, 7]
    assert sample_frame_indices(7, 16, 2) == [0, 1, 2, 3, 4, 5, 6, 6]
    assert sample_frame_indices(1, 16, 2) == [0, 0]


def test_smart_resize_keeps_multiples_and_pixel_bounds():
    assert smart_resize(1000, 500, 28, 56 * 56, 28 * 28 * 64) == (308, 140)
    assert smart_resize(10, 10, 28, 56 * 56, 28 * 28 * 64) == (56, 56)
    with pytest.raises(ValueError, match="aspect ratio"):
        smart_resize(1, 300, 28, 56 * 56, 28 * 28 * 64)
