"""Qwen2.5-VL parts: patch positions and attention windows equal transformers' bookkeeping; bad
configs fail with the key to fix."""

from __future__ import annotations

import pytest
import torch

from loong_core.errors import ConfigError
from loong_vlm.qwen2_5_vl.vision import block_mask, patch_positions, window_ids

GRIDS = torch.tensor([[1, 4, 6], [2, 4, 4], [1, 8, 10]])  # an image, a 2-frame video, a larger image
MERGE, PATCH, WINDOW = 2, 4, 16  # windows of 2x2 merged tokens


def _hf_window_mask(grid_thw):
    """Same-window matrix from transformers' window reordering (in original patch order)."""
    from transformers.vision_utils import get_vision_window_index

    units, cu = get_vision_window_index(grid_thw, MERGE, WINDOW, PATCH)
    order = (units[:, None] * MERGE ** 2 + torch.arange(MERGE ** 2)).reshape(-1)  # patch at each slot
    window_of_slot = torch.bucketize(torch.arange(order.numel()), cu[1:].long(), right=True)
    ids = torch.empty_like(order)
    ids[order] = window_of_slot
    return block_mask(ids)


def test_patch_rows_and_columns_equal_transformers_merge_block_order():
    from transformers.vision_utils import get_vision_position_ids

    ours = patch_positions(GRIDS, MERGE)
    assert torch.equal(ours[:, 1:], get_vision_position_ids(GRIDS, MERGE))
    assert ours[:, 0].tolist() == [0] * 24 + [1] * 16 + [2] * 16 + [3] * 80  # frames across the batch
    assert ours[:4, 1:].tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]  # one 2x2 block first


def test_windows_equal_transformers_window_index():
    positions = patch_positions(GRIDS, MERGE)
    ours = block_mask(window_ids(positions, MERGE, WINDOW // (MERGE * PATCH)))
    assert tuple(ours.shape) == (1, positions.shape[0])  # group ids, no [n, n] mask
    assert torch.equal(ours.dense(), _hf_window_mask(GRIDS).dense())
    assert window_ids(positions, MERGE, 2).unique().numel() == 2 + 2 * 1 + 2 * 3  # 4x6, 4x4 (x2), 8x10


@pytest.mark.parametrize("window_tokens", [1, 2, 3])
def test_window_ids_number_windows_in_frame_row_column_order(window_tokens):
    """The ids are those of sorting the (frame, window row, window column) triples: one key per
    triple, in their lexicographic order."""
    positions = patch_positions(GRIDS, MERGE)
    side = MERGE * window_tokens
    triples = torch.stack([positions[:, 0], positions[:, 1] // side, positions[:, 2] // side], dim=1)
    expected = torch.unique(triples, dim=0, return_inverse=True)[1]
    assert torch.equal(window_ids(positions, MERGE, window_tokens), expected)


def test_window_size_must_tile_merge_blocks(mcore_single_rank):
    from loong_vlm.qwen2_5_vl.config import Qwen25ViTConfig
    from loong_vlm.qwen2_5_vl.vision import Qwen25VisionEncoder

    cfg = Qwen25ViTConfig(name="qwen2_5_vit", patch_size=4, num_layers=1, hidden_size=32,
                          num_attention_heads=2, ffn_hidden_size=48, window_size=12,
                          fullatt_block_indexes=[0])
    with pytest.raises(ConfigError, match=r"window_size \(12\) must be a multiple of .* \(8\)"):
        Qwen25VisionEncoder(cfg, {})


def test_mrope_section_must_cover_half_the_head():
    from loong_llm.families.qwen2.config import Qwen2Config
    from loong_llm.families.qwen2.model import Qwen2Provider

    cfg = Qwen2Config(name="qwen2", hidden_size=64, num_attention_heads=4, vocab_size=64,
                      position_embedding_type="mrope", mrope_section=[2, 2, 2])
    with pytest.raises(ConfigError, match=r"model.mrope_section = \[2, 2, 2\] .* head_dim / 2 = 8"):
        Qwen2Provider(cfg).megatron_config({})


def test_merger_turns_each_four_patches_into_one_token(mcore_single_rank):
    from loong_vlm.encoders.spec import encoder_transformer_config
    from loong_vlm.qwen2_5_vl.config import Qwen25MergerConfig, Qwen25ViTConfig
    from loong_vlm.qwen2_5_vl.merger import Qwen25PatchMerger

    encoder = Qwen25ViTConfig(name="qwen2_5_vit", hidden_size=32, num_attention_heads=2, ffn_hidden_size=48)
    merger = Qwen25PatchMerger(Qwen25MergerConfig(name="qwen2_5_merger"),
                               encoder_transformer_config(encoder, {}), 32, None, 64)
    features = torch.randn(12, 32)
    out = merger(features)
    assert out.shape == (3, 64)
    assert merger.linear_fc1.bias is not None and merger.linear_fc2.bias is not None
    assert torch.allclose(merger(features[4:8]), out[1:2], atol=1e-6)  # a token sees its own block only
    with pytest.raises(ValueError, match="10 patches do not form whole 4-patch merge blocks"):
        merger(features[:10])


def test_long_videos_are_encoded_in_groups_of_whole_frames(mcore_single_rank, monkeypatch):
    from loong_vlm.qwen2_5_vl import vision
    from loong_vlm.qwen2_5_vl.config import Qwen25ViTConfig

    frames = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    assert vision.frame_groups(frames, 5) == [slice(0, 5), slice(5, 10)]
    assert vision.frame_groups(frames, 3) == [slice(0, 3), slice(3, 5), slice(5, 9), slice(9, 10)]
    assert vision.frame_groups(frames, 100) == [slice(0, 10)]

    torch.manual_seed(0)
    cfg = Qwen25ViTConfig(name="qwen2_5_vit", patch_size=4, num_layers=2, hidden_size=32,
                          num_attention_heads=2, ffn_hidden_size=48, window_size=8,
                          fullatt_block_indexes=[1])
    encoder = vision.Qwen25VisionEncoder(cfg, {})
    grid = torch.tensor([[2, 4, 4], [6, 4, 8]])  # an image and a 6-frame video: 32 + 192 patches
    pixels = torch.randn(224, cfg.patch_dim(), requires_grad=True)
    whole = encoder(pixels, grid)
    (grad_whole,) = torch.autograd.grad(whole.square().sum(), pixels)
    monkeypatch.setattr(vision, "GROUP_PATCHES", 40)  # groups of one or two frames
    grouped = encoder(pixels, grid)
    (grad_grouped,) = torch.autograd.grad(grouped.square().sum(), pixels)
    assert torch.allclose(grouped, whole, atol=1e-5) and torch.allclose(grad_grouped, grad_whole, atol=1e-5)
