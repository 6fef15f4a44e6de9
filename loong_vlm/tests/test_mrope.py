"""MRoPE position ids equal transformers' ``Qwen2_5_VLModel.get_rope_index``."""

from __future__ import annotations

import pytest
import torch

from loong_vlm.mrope import mrope_position_ids, text_position_ids

IMAGE, VIDEO, MERGE = 7, 8, 2


def _hf_rope_index(tokens, image_grid_thw, video_grid_thw, second_per_grid_ts, tokens_per_second):
    """transformers' reference (types: 0 text, 1 image, 2 video)."""
    from types import SimpleNamespace

    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    fake = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(
        spatial_merge_size=MERGE, tokens_per_second=tokens_per_second)))
    fake.get_vision_position_ids = lambda *a, **k: Qwen2_5_VLModel.get_vision_position_ids(fake, *a, **k)
    types = (tokens == IMAGE).int() + 2 * (tokens == VIDEO).int()
    ids, _ = Qwen2_5_VLModel.get_rope_index(fake, tokens, types, image_grid_thw, video_grid_thw,
                                            second_per_grid_ts)
    return ids


def _sample(pieces):
    """Token ids from ``[("text", n) | ("image", (t, h, w)) | ("video", (t, h, w))]``."""
    out = []
    for kind, value in pieces:
        if kind == "text":
            out += list(range(20, 20 + value))
        else:
            out += [IMAGE if kind == "image" else VIDEO] * (value[0] * value[1] * value[2] // MERGE ** 2)
    return torch.tensor(out)


def test_positions_equal_transformers_with_two_images_and_a_video():
    images = torch.tensor([[1, 4, 6], [1, 8, 4]])
    videos = torch.tensor([[3, 4, 4]])
    tokens = _sample([("text", 5), ("image", (1, 4, 6)), ("text", 3), ("video", (3, 4, 4)),
                      ("text", 2), ("image", (1, 8, 4)), ("text", 4)])
    ours = mrope_position_ids(tokens, images, videos, image_token_id=IMAGE, video_token_id=VIDEO,
                              spatial_merge_size=MERGE, tokens_per_second=2,
                              second_per_grid_ts=[0.5])
    reference = _hf_rope_index(tokens[None], images, videos, torch.tensor([0.5]), 2)[:, 0]
    assert ours.shape == (3, tokens.numel())
    assert torch.equal(ours, reference)
    assert ours[0, 5 + 6 + 3 + 4] == ours[0, 5 + 6 + 3] + 1  # video frames step by 2 tok/s * 0.5 s


def test_video_time_step_follows_second_per_grid_ts():
    videos = torch.tensor([[4, 2, 2]])
    tokens = _sample([("text", 2), ("video", (4, 2, 2)), ("text", 1)])
    ours = mrope_position_ids(tokens, None, videos, image_token_id=IMAGE, video_token_id=VIDEO,
                              spatial_merge_size=MERGE, tokens_per_second=25, second_per_grid_ts=[2.0])
    reference = _hf_rope_index(tokens[None], None, videos, torch.tensor([2.0]), 25)[:, 0]
    assert torch.equal(ours, reference)
    assert ours[0, 2:6].tolist() == [2, 52, 102, 152]


def test_back_to_back_images_are_split_by_their_grid_sizes():
    images = torch.tensor([[1, 2, 2], [1, 4, 4]])
    tokens = _sample([("text", 1), ("image", (1, 2, 2)), ("image", (1, 4, 4)), ("text", 1)])
    ours = mrope_position_ids(tokens, images, image_token_id=IMAGE, spatial_merge_size=MERGE)
    assert ours[:, 1].tolist() == [1, 1, 1]  # first image: one token at the start position
    assert ours[:, 2:6].tolist() == [[2] * 4, [2, 2, 3, 3], [2, 3, 2, 3]]
    assert ours[:, 6].tolist() == [4, 4, 4]


def test_text_only_sample_counts_up_in_all_rows():
    tokens = torch.arange(20, 26)
    assert torch.equal(mrope_position_ids(tokens, image_token_id=IMAGE), text_position_ids(6))


def test_placeholder_and_grid_mismatch_is_an_error():
    tokens = _sample([("text", 1), ("image", (1, 4, 4))])
    with pytest.raises(ValueError, match="image_grid_thw has 2 rows but the sample has 1 images"):
        mrope_position_ids(tokens, torch.tensor([[1, 4, 4], [1, 2, 2]]), image_token_id=IMAGE)
