"""Multimodal rotary position ids (Qwen2-VL / Qwen2.5-VL MRoPE): three rows per token.

Text tokens count up by one in all three rows (temporal, height, width). The visual tokens of one
image or video take a 3D grid of positions that starts where the text stopped: row 0 holds the
frame's time, row 1 the merged-patch row, row 2 the merged-patch column. The text after it
resumes at ``start + max(rows, cols)`` of that grid (images) - videos likewise, their time axis
does not advance the text position.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

import torch


def _vision_positions(start: int, grid_thw: Sequence[int], spatial_merge_size: int,
                      time_step: float) -> torch.Tensor:
    """``[3, t*h*w]`` positions of one visual input, ``start`` being the next text position."""
    t, h, w = (int(grid_thw[0]), int(grid_thw[1]) // spatial_merge_size,
               int(grid_thw[2]) // spatial_merge_size)
    times = (torch.arange(t) * time_step).long() + start
    rows = torch.arange(h) + start
    cols = torch.arange(w) + start
    return torch.stack([times.repeat_interleave(h * w), rows.repeat_interleave(w).repeat(t),
                        cols.repeat(t * h)])


def mrope_position_ids(tokens: torch.Tensor, image_grid_thw: Optional[torch.Tensor] = None,
                       video_grid_thw: Optional[torch.Tensor] = None, *, image_token_id: int,
                       video_token_id: Optional[int] = None, spatial_merge_size: int = 2,
                       tokens_per_second: float = 2.0,
                       second_per_grid_ts: Optional[Sequence[float]] = None) -> torch.Tensor:
    """MRoPE position ids of one sample, equal to transformers' ``Qwen2_5_VLModel.get_rope_index``.

    The images (videos) of ``tokens`` are matched in order to the rows of ``image_grid_thw``
    (``video_grid_thw``); each takes ``t*h*w / spatial_merge_size**2`` consecutive placeholder
    tokens, so two images with no text between them are told apart by their sizes.

    Args:
        tokens: Token ids ``[s]`` of one sample.
        image_grid_thw: ``[n_images, 3]`` patch grid (frames, rows, cols) of this sample's images.
        video_grid_thw: ``[n_videos, 3]`` patch grid of this sample's videos.
        image_token_id: Placeholder id of image features.
        video_token_id: Placeholder id of video features.
        spatial_merge_size: Side of the patch block the merger turns into one token.
        tokens_per_second: Temporal positions per second of video (HF ``vision_config``).
        second_per_grid_ts: Seconds per temporal patch of each video (default 1.0).

    Returns:
        ``LongTensor[3, s]``.

    Raises:
        ValueError: The placeholders and the grids do not agree.
    """
    tokens = tokens.reshape(-1).cpu()
    grids = {image_token_id: list(image_grid_thw.tolist()) if image_grid_thw is not None else [],
             video_token_id: list(video_grid_thw.tolist()) if video_grid_thw is not None else []}
    seconds = list(second_per_grid_ts) if second_per_grid_ts is not None else [1.0] * len(grids[video_token_id])
    used = {image_token_id: 0, video_token_id: 0}
    pieces, position, i, length = [], 0, 0, tokens.numel()
    token_list = tokens.tolist()
    while i < length:
        kind = token_list[i]
        if kind in used and kind is not None:
            name = "image" if kind == image_token_id else "video"
            if used[kind] >= len(grids[kind]):
                raise ValueError(f"the sample has more {name} placeholder runs than {name}_grid_thw rows "
                                 f"({len(grids[kind])}).")
            grid = grids[kind][used[kind]]
            count = grid[0] * grid[1] * grid[2] // spatial_merge_size ** 2
            if token_list[i:i + count] != [kind] * count:
                raise ValueError(f"{name} {used[kind]} has grid {grid} = {count} tokens but the sample has "
                                 f"fewer {name} placeholders at position {i}.")
            step = tokens_per_second * float(seconds[used[kind]]) if kind == video_token_id else 1.0
            pieces.append(_vision_positions(position, grid, spatial_merge_size, step))
            position += max(grid[1], grid[2]) // spatial_merge_size
            used[kind] += 1
            i += count
            continue
        end = i
        while end < length and token_list[end] not in used:
            end += 1
        pieces.append(torch.arange(position, position + end - i).expand(3, -1))
        position += end - i
        i = end
    for kind, name in ((image_token_id, "image"), (video_token_id, "video")):
        if used[kind] != len(grids[kind]):
            raise ValueError(f"{name}_grid_thw has {len(grids[kind])} rows but the sample has "
                             f"{used[kind]} {name}s.")
    if not pieces:
        return torch.zeros(3, 0, dtype=torch.long)
    return torch.cat(pieces, dim=1).long()


def text_position_ids(length: int) -> torch.Tensor:
    """``LongTensor[3, length]`` of a sample without images (all three rows ``0..length-1``)."""
    return torch.arange(length).expand(3, -1).clone()
