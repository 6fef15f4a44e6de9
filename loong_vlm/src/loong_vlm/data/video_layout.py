"""How a video's single placeholder is laid out in the token sequence (``data.video_layout``).

``qwen2_5`` (Qwen2-VL / Qwen2.5-VL): the placeholder becomes one run of ``t*h*w / merge^2`` video
tokens; the MRoPE time row advances with the seconds per temporal patch.

``qwen3_vl``: the placeholder becomes, for every temporal patch (``temporal_patch_size`` frames),
a timestamp text ``<S.s seconds>`` followed by ``<|vision_start|>``, that patch's ``h*w /
merge^2`` video tokens and ``<|vision_end|>``; the markup's own ``<|vision_start|>`` /
``<|vision_end|>`` stay around the whole video, as transformers' ``Qwen3VLProcessor`` (5.x) writes
it. A timestamp is the mean time of the first and last frame of its temporal patch, a frame's time
being its index in the record's frame list divided by the record's ``fps``
(:data:`FALLBACK_FPS` when the record has none, as transformers assumes).

``kimi_k25``: as ``qwen3_vl`` with clips of ``data.temporal_patch_size`` frames (the encoder
averages a clip into one frame's tokens) and the time of a clip's first frame written
``HH:MM:SS.mmm`` (transformers' ``Kimi_K25Processor``; its ``<|media_begin|>video<|media_content|>``
/ ``<|media_end|>`` markup is the tokenizer's vision start / end here).

``ernie4_5_vl``: as ``qwen2_5`` (one run between the markup's vision start / end, transformers'
``Ernie4_5_VLMoeProcessor``), with ERNIE-4.5-VL's positions: its grid counts frames, the model
merges them in pairs, and each pair advances the time row by one whatever the frame rate
(:func:`~loong_vlm.ernie4_5_vl.rope.ernie_position_ids`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from loong_core.errors import ConfigError

#: Accepted values of ``data.video_layout`` (and of a VLM config's ``video_layout``).
VIDEO_LAYOUTS = ("qwen2_5", "qwen3_vl", "kimi_k25", "ernie4_5_vl")

#: Frame rate assumed for a record without ``fps`` (transformers' Qwen3-VL processor default).
FALLBACK_FPS = 24.0


def frame_timestamps(frame_indices: Sequence[int], fps: float | None, temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch of a video: the mean of its first and last frame's time.

    Args:
        frame_indices: Indices (in the record's frame list) of the frames kept, in order; a
            length that is not a multiple of ``temporal_patch_size`` repeats the last index.
        fps: Frames per second of the frame list (None: :data:`FALLBACK_FPS`).
        temporal_patch_size: Frames per temporal patch.
    """
    rate = float(fps) if fps else FALLBACK_FPS
    indices = list(frame_indices)
    if not indices:
        return []
    indices += [indices[-1]] * (-len(indices) % temporal_patch_size)
    seconds = [index / rate for index in indices]
    return [(seconds[i] + seconds[i + temporal_patch_size - 1]) / 2
            for i in range(0, len(seconds), temporal_patch_size)]


def timestamp_text(seconds: float) -> str:
    """The text written before a temporal patch, e.g. ``<0.5 seconds>`` (one decimal)."""
    return f"<{seconds:.1f} seconds>"


def clock_text(seconds: float) -> str:
    """The text written before a Kimi-K2.5 clip, e.g. ``00:01:02.500``."""
    whole = int(seconds)
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}.{int(seconds % 1 * 1000):03d}"


def clip_start_times(frame_indices: Sequence[int], fps: float | None, clip_frames: int) -> list[float]:
    """Seconds of the first frame of each clip of ``clip_frames`` kept frames (the last may be shorter)."""
    rate = float(fps) if fps else FALLBACK_FPS
    return [frame_indices[i] / rate for i in range(0, len(frame_indices), clip_frames)]


def split_videos_into_frames(ids: np.ndarray, mask: np.ndarray, video_token_id: int,
                             frame_prefixes: Sequence[Sequence[Sequence[int]]], vision_start_id: int,
                             vision_end_id: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Replace each video placeholder by ``prefix + <|vision_start|> + placeholder + <|vision_end|>``
    per temporal patch (one placeholder per patch, expanded to its token count later).

    Args:
        ids: Token ids with one placeholder per video.
        mask: Assistant mask of ``ids``.
        video_token_id: The video placeholder id.
        frame_prefixes: For each video, the token ids written before each of its temporal patches
            (its timestamp text).
        vision_start_id: Id of ``<|vision_start|>``.
        vision_end_id: Id of ``<|vision_end|>``.
        where: The record's location, for errors.

    Returns:
        ``(ids, mask)``; the inserted tokens are never trained on.

    Raises:
        ConfigError: The ids hold a different number of video placeholders than ``frame_prefixes``.
    """
    at = np.flatnonzero(ids == video_token_id)
    if len(at) != len(frame_prefixes):
        raise ConfigError(f"{where}: the rendered conversation has {len(at)} video placeholder(s) but the record "
                          f"has {len(frame_prefixes)} video(s); the chat template or the text adds or drops "
                          "<|video_pad|>.")
    pieces_ids, pieces_mask, last = [], [], 0
    for position, prefixes in zip(at.tolist(), frame_prefixes):
        pieces_ids.append(ids[last:position])
        pieces_mask.append(mask[last:position])
        video = [token for prefix in prefixes for token in (*prefix, vision_start_id, video_token_id, vision_end_id)]
        pieces_ids.append(np.asarray(video, dtype=ids.dtype))
        pieces_mask.append(np.zeros(len(video), dtype=mask.dtype))
        last = position + 1
    pieces_ids.append(ids[last:])
    pieces_mask.append(mask[last:])
    return np.concatenate(pieces_ids), np.concatenate(pieces_mask)


def timestamp_prefixes(video_sizes: Sequence[Sequence[int]], fps: float | None, processor,
                       cache: dict[str, list[int]], encode: Callable[[str], list[int]],
                       layout: str = "qwen3_vl") -> list[list[list[int]]]:
    """Token ids of the timestamp text before each temporal patch (clip) of each video of a record.

    Args:
        video_sizes: ``(frames, height, width)`` of each video.
        fps: The record's frame rate (None: :data:`FALLBACK_FPS`).
        processor: The :class:`~loong_vlm.data.vision.VisionProcessor` choosing the kept frames.
        cache: Timestamp text -> ids, filled as texts are met (records share most timestamps).
        encode: Text -> token ids (no special tokens added).
        layout: ``qwen3_vl`` or ``kimi_k25``.
    """
    from loong_vlm.data.vision import sample_frame_indices

    prefixes = []
    for num_frames, _, _ in video_sizes:
        if layout == "kimi_k25":
            kept = sample_frame_indices(num_frames, processor.video_max_frames, 1)
            texts = [clock_text(t) for t in clip_start_times(kept, fps, processor.temporal_patch_size)]
        else:
            kept = sample_frame_indices(num_frames, processor.video_max_frames, processor.temporal_patch_size)
            texts = [timestamp_text(t) for t in frame_timestamps(kept, fps, processor.temporal_patch_size)]
        for text in texts:
            if text not in cache:
                cache[text] = list(encode(text))
        prefixes.append([cache[text] for text in texts])
    return prefixes
