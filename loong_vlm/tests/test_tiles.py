"""InternVL's tiling equals transformers' GotOcr2 image processor (PIL backend, ``crop_to_patches``,
InternVL's normalisation): the same tiles, thumbnail and counts for images of several shapes."""

from __future__ import annotations

import numpy as np
import pytest

from loong_vlm.data.tiles import IMAGENET_MEAN, IMAGENET_STD, TileProcessor, tile_grid

Image = pytest.importorskip("PIL.Image")

TILE = 32
# (height, width, mode): one tile, wide, tall, a tie between grids, larger than every grid, grey
SIZES = [(30, 33, "RGB"), (40, 130, "RGB"), (150, 50, "RGB"), (64, 128, "RGB"), (400, 300, "RGB"), (45, 90, "L")]


@pytest.fixture(scope="module")
def hf_processor():
    got_ocr2 = pytest.importorskip("transformers.models.got_ocr2.image_processing_pil_got_ocr2")
    return got_ocr2.GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                             min_patches=1, max_patches=6, image_mean=list(IMAGENET_MEAN),
                                             image_std=list(IMAGENET_STD))


@pytest.mark.parametrize("height,width,mode", SIZES)
def test_tiles_equal_transformers(hf_processor, height, width, mode):
    rng = np.random.default_rng(height * width)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode)
    processor = TileProcessor(tile_size=TILE, max_tiles=6)
    ours = processor.image(image)
    ref = hf_processor(images=[image], return_tensors="np")
    assert ours.shape[0] == int(ref["num_patches"][0]) == processor.count(height, width)
    np.testing.assert_allclose(ours, ref["pixel_values"], rtol=0, atol=1e-6)


def test_grid_follows_the_aspect_ratio_and_spares_small_images():
    assert tile_grid(40, 120, 32, 1, 12) == (3, 1)  # wide: three columns
    assert tile_grid(120, 40, 32, 1, 12) == (1, 3)
    assert tile_grid(100, 300, 32, 1, 12) == (6, 2)  # the same shape, large enough for 12 tiles
    # a square image ties 1x1, 2x2 and 3x3: the larger grids only while the image covers half of them
    assert tile_grid(40, 40, 32, 1, 12) == (1, 1)
    assert tile_grid(64, 64, 32, 1, 12) == (2, 2)
    assert tile_grid(200, 200, 32, 1, 12) == (3, 3)
    with pytest.raises(ValueError, match="no area"):
        tile_grid(0, 5, 32, 1, 12)
