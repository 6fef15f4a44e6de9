"""ERNIE-4.5-VL's text positions: 3D RoPE over interleaved rotary pairs, and its position ids.

Rotated pairs are adjacent channels (``rotary_interleaved``). With ``mrope_section = [h, w, t]``
(HF order), pair ``j < h + w`` turns with the height position when ``j`` is even and with the
width position when ``j`` is odd, the last ``t`` pairs with time; every pair keeps its own
frequency ``theta^(-2j/d)`` (transformers permutes the frequencies and then puts the pairs back).
Position ids are Qwen2-VL's with a video's frames merged in pairs: frame pair ``k`` takes time
``start + k``.
"""

from __future__ import annotations

from typing import Optional

import torch

from loong_vlm.mrope import mrope_position_ids
from loong_vlm.qwen3_vl.rope import InterleavedMRoPE


def pair_axes(section: list[int]) -> torch.Tensor:
    """Position row (0 time, 1 height, 2 width) of each rotary pair."""
    h, w, t = section
    if h != w:
        raise ValueError(f"mrope_section {section}: ERNIE-4.5-VL alternates height and width pairs, so its "
                         "first two numbers must be equal.")
    j = torch.arange(h + w + t)
    return torch.where(j < h + w, 1 + j % 2, torch.zeros_like(j))


class ErnieMRoPE(InterleavedMRoPE):
    """megatron-core's multimodal rotary embedding with ERNIE-4.5-VL's pair layout (a drop-in
    ``GPTModel.rotary_pos_emb``; the decoder's ``rotary_interleaved`` must be True)."""

    def __init__(self, *args, **kwargs):
        super(InterleavedMRoPE, self).__init__(*args, **kwargs)
        if not self.rotary_interleaved:
            raise ValueError("ERNIE-4.5-VL's 3D RoPE rotates interleaved pairs; set rotary_interleaved=True.")

    def mix(self, freqs: torch.Tensor, section: list[int]) -> torch.Tensor:
        axes = pair_axes(section).to(freqs.device)
        index = axes.view(1, *([1] * (freqs.dim() - 2)), -1).expand(1, *freqs.shape[1:])
        return freqs.gather(0, index)[0]

    def expand(self, half: torch.Tensor) -> torch.Tensor:
        return half.repeat_interleave(2, dim=-1)


def ernie_position_ids(tokens: torch.Tensor, image_grid_thw: Optional[torch.Tensor] = None,
                       video_grid_thw: Optional[torch.Tensor] = None, *, image_token_id: int,
                       video_token_id: Optional[int] = None, spatial_merge_size: int = 2,
                       temporal_merge_size: int = 2) -> torch.Tensor:
    """Position ids ``LongTensor[3, s]`` (time, height, width) of one sample, equal to
    transformers' ``Ernie4_5_VLMoeModel.get_rope_index``.

    Args:
        tokens: Token ids ``[s]``.
        image_grid_thw: ``[n_images, 3]`` patch grids of the sample's images.
        video_grid_thw: ``[n_videos, 3]`` patch grids of its videos (an even number of frames).
        image_token_id: Placeholder id of image features.
        video_token_id: Placeholder id of video features.
        spatial_merge_size: Side of the patch block merged into one token.
        temporal_merge_size: Frames merged into one token (videos).
    """
    merged = None
    if video_grid_thw is not None and len(video_grid_thw):
        merged = video_grid_thw.clone()
        merged[:, 0] = merged[:, 0] // temporal_merge_size
    return mrope_position_ids(tokens, image_grid_thw, merged, image_token_id=image_token_id,
                              video_token_id=video_token_id, spatial_merge_size=spatial_merge_size,
                              tokens_per_second=1.0)
