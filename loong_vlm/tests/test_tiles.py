"""InternVL's tiling equals transformers' GotOcr2 image processor (PIL backend, ``crop_to_patches``,
InternVL's normalisation): the same tiles, thumbnail and counts for images of several shapes; the
LLaVA pipeline with ``data.image_processing=tiles`` lays out and collates tiles, the model checks
the tile geometry, and ``experiment=internvl_debug`` trains at DP2 with the balancer."""

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
    ours = processor.tiles(image)
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


def _tiled_demo(tmp_path):
    from loong_vlm.data.config import LlavaConfig
    from loong_vlm.data.llava import LlavaDataModule

    config = LlavaConfig(name="llava", seq_length=192, cache_dir=str(tmp_path / "cache"), vocab_size=300,
                         image_processing="tiles", tile_size=16, max_tiles=4, patch_size=4, mrope=False)
    module = LlavaDataModule(config)
    module.prepare()
    module.setup()
    return module


def test_llava_records_take_tiles_in_reading_order(tmp_path):
    """On the LLaVA digits demo set: each image's placeholder run is its tile count x 4 tokens
    (16-pixel tiles of 4-pixel patches, 2x2 merge), images of several shapes get several tile
    counts, a video's frames one tile each, and the collated pixels are those tiles in order."""
    from loong_vlm.data.llava_batch import _open_rgb

    demo = _tiled_demo(tmp_path)
    processor = demo.processor
    tile_counts = {g[0] for r in demo.records["train"] for g in r.image_grids}
    assert len(tile_counts) >= 3 and max(tile_counts) <= 5  # 1-4 tiles, a thumbnail past one
    train, _ = demo.build(8, 2, seed=0)
    samples = [train[i] for i in range(4)]
    image_id, video_id = demo.layout.image_token_id, demo.layout.video_token_id
    for sample in samples:
        grids = sample["image_grid_thw"].tolist() + sample["video_grid_thw"].tolist()
        assert all(h == w == 4 for _, h, w in grids)
        placeholders = int(((sample["tokens"] == image_id) | (sample["tokens"] == video_id)).sum())
        assert placeholders == sum(4 * n for n, _, _ in grids)
        assert sample["position_ids"].dim() == 1  # plain positions for a non-MRoPE decoder
    batch = demo.collate(samples)
    files = [f for s in samples for f in s["image_files"]]
    expected = np.concatenate([processor.tiles(_open_rgb(f)) for f in files])
    assert batch["pixel_values"].shape[1:] == (3, 16, 16)
    np.testing.assert_array_equal(batch["pixel_values"].numpy(), expected)


def test_tiles_need_a_fixed_size_encoder_of_the_tile_size():
    from loong_core.errors import ConfigError
    from loong_vlm.data.geometry import check_vision_geometry
    from loong_vlm.internvl.config import InternViTConfig, InternVLConfig
    from loong_vlm.qwen3_vl.config import Qwen3VLConfig

    internvl = InternVLConfig(name="internvl", encoder=InternViTConfig(name="internvit", image_size=16, patch_size=4))
    check_vision_geometry(internvl, {"tile_size": 16, "patch_size": 4, "mrope_positions": False})
    with pytest.raises(ConfigError, match="data.tile_size=16"):
        check_vision_geometry(internvl, {"tile_size": 32, "patch_size": 4, "mrope_positions": False})
    with pytest.raises(ConfigError, match="data.image_processing=dynamic"):
        check_vision_geometry(Qwen3VLConfig(name="qwen3_vl"), {"tile_size": 16})
    with pytest.raises(ConfigError, match="data.image_processing=tiles"):
        check_vision_geometry(internvl, {"patch_size": 4, "mrope_positions": False})


@pytest.mark.multirank
def test_internvl_debug_trains_on_two_data_parallel_ranks_with_the_balancer(tmp_path):
    """``experiment=internvl_debug`` (tiled LLaVA demo records, packed) at DP2: the kk_swap balancer
    evens out the ranks' positions and the loss falls."""
    import math

    from loong_core.testing import read_metrics, run_train

    run_train(["experiment=internvl_debug", "trainer.train_iters=4", "trainer.log_interval=1",
               "trainer.progress_bar=false", "trainer.tensorboard=false", "trainer.save_at_end=false",
               "trainer.eval_interval=0", f"trainer.run_dir={tmp_path}"], nproc=2)
    train = read_metrics(tmp_path)
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in train) and train[-1]["loss"] < train[0]["loss"]
    assert all(r["balance/max_over_mean_after"] <= r["balance/max_over_mean_before"] for r in train)
