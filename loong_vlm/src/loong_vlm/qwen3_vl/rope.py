"""Qwen3-VL's text positions: interleaved multimodal RoPE and its 3-row position ids.

Qwen2-VL's MRoPE gives contiguous blocks of rotary frequencies to time, height and width;
Qwen3-VL interleaves them: frequency ``j`` turns with height when ``j % 3 == 1`` and
``j < 3 * section[1]``, with width when ``j % 3 == 2`` and ``j < 3 * section[2]``, and with time
otherwise. Its position ids treat every video frame as its own ``t = 1`` grid (the frames are
separated by timestamp text tokens), so time does not advance inside a video.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import (
    MultimodalRotaryEmbedding,
    get_pos_emb_on_this_cp_rank,
)

from loong_vlm.mrope import mrope_position_ids


def interleave_sections(freqs: torch.Tensor, section: list[int]) -> torch.Tensor:
    """Pick each frequency's axis, interleaved: ``[3, ..., d/2]`` angles -> ``[..., d/2]``.

    Args:
        freqs: Rotary angles of the time, height and width positions (first dimension).
        section: Frequencies given to time, height and width (sums to ``d / 2``).
    """
    mixed = freqs[0].clone()
    for axis in (1, 2):
        picked = slice(axis, 3 * section[axis], 3)
        mixed[..., picked] = freqs[axis][..., picked]
    return mixed


class InterleavedMRoPE(MultimodalRotaryEmbedding):
    """megatron-core's multimodal rotary embedding with Qwen3-VL's interleaved frequency layout.

    A drop-in replacement of ``GPTModel.rotary_pos_emb`` for ``position_embedding_type="mrope"``
    (same constructor and ``forward(position_ids [3, b, s], mrope_section)``).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.rotary_interleaved:
            raise ValueError("Qwen3-VL's interleaved MRoPE uses the rotate-half layout; set "
                             "rotary_interleaved=False.")

    def forward(self, position_ids: torch.Tensor, mrope_section: list[int],
                cp_group: Optional[torch.distributed.ProcessGroup] = None) -> torch.Tensor:
        """Angles ``[s, b, 1, head_dim]`` of position ids ``[3, b, s]``."""
        if sum(mrope_section) != self.inv_freq.numel():
            raise ValueError(f"mrope_section {mrope_section} must sum to head_dim / 2 = {self.inv_freq.numel()}.")
        positions = position_ids.to(device=self.inv_freq.device, dtype=torch.float32)
        if self.seq_len_interpolation_factor is not None:
            positions = positions / self.seq_len_interpolation_factor
        half = self.mix(positions[..., None] * self.inv_freq, mrope_section)  # [b, s, d/2]
        emb = self.expand(half)[..., None, :].transpose(0, 1).contiguous()
        cp_group = cp_group if cp_group is not None else self.cp_group
        if cp_group is not None and cp_group.size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0, cp_group)
        return emb

    def mix(self, freqs: torch.Tensor, section: list[int]) -> torch.Tensor:
        """Each frequency's angle from its axis: ``[3, b, s, d/2]`` -> ``[b, s, d/2]``."""
        return interleave_sections(freqs, section)

    def expand(self, half: torch.Tensor) -> torch.Tensor:
        """``[..., d/2]`` angles -> ``[..., d]`` in the layout the attention rotates by (rotate-half)."""
        return torch.cat([half, half], dim=-1)

    @classmethod
    def replacing(cls, rotary: MultimodalRotaryEmbedding) -> InterleavedMRoPE:
        """An interleaved embedding with the frequencies and settings of ``rotary``."""
        new = cls(kv_channels=2 * rotary.inv_freq.numel(), rotary_percent=1.0,
                  rotary_interleaved=rotary.rotary_interleaved,
                  seq_len_interpolation_factor=rotary.seq_len_interpolation_factor, cp_group=rotary.cp_group)
        new.inv_freq = rotary.inv_freq
        return new


def qwen3_vl_position_ids(tokens: torch.Tensor, image_grid_thw: Optional[torch.Tensor] = None,
                          video_grid_thw: Optional[torch.Tensor] = None, *, image_token_id: int,
                          video_token_id: Optional[int] = None, spatial_merge_size: int = 2) -> torch.Tensor:
    """Position ids ``LongTensor[3, s]`` of one sample, equal to transformers'
    ``Qwen3VLModel.get_rope_index``.

    Every frame of a video is its own placeholder run of ``h * w / merge^2`` tokens (the data puts
    a timestamp between frames); frames take the time position where the text stopped.

    Args:
        tokens: Token ids ``[s]``.
        image_grid_thw: ``[n_images, 3]`` patch grids of the sample's images.
        video_grid_thw: ``[n_videos, 3]`` patch grids of its videos (frames, rows, cols).
        image_token_id: Placeholder id of image features.
        video_token_id: Placeholder id of video features.
        spatial_merge_size: Side of the patch block merged into one token.
    """
    frames = None
    if video_grid_thw is not None and len(video_grid_thw):
        frames = torch.repeat_interleave(video_grid_thw, video_grid_thw[:, 0], dim=0)
        frames[:, 0] = 1
    return mrope_position_ids(tokens, image_grid_thw, frames, image_token_id=image_token_id,
                              video_token_id=video_token_id, spatial_merge_size=spatial_merge_size)
