"""Samples and micro batches of LLaVA records: packing, MRoPE position ids, pixel loading.

A sample holds one record or, packed, several: their ``L - 1`` positions back to back with
``segment_ids`` (the record of each position: a block-diagonal causal mask that is never built
densely) and position ids restarting at each record (3-row MRoPE ids computed per record, as the
record would get alone). Videos are laid out as the model family reads them
(:mod:`loong_vlm.data.video_layout`), each with its model's position ids. Visual
inputs stay file references in the sample (``image_files``, ``video_files``) with their patch
grids; :func:`collate_llava` decodes them for the micro batch only, so a data balancer can look at
every sample of a global batch without decoding any image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from loong_core.errors import ConfigError
from loong_llm.data.packing import packed_sample
from loong_vlm.data.vision import VisionProcessor
from loong_vlm.mrope import mrope_position_ids, text_position_ids

#: Keys of a sample that are per-position tensors (stacked into ``[b, ...]``).
POSITION_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "segment_ids")


@dataclass
class EncodedRecord:
    """A tokenized record with the patch grids of its visual inputs.

    Attributes:
        ids: Token ids with one placeholder per visual input.
        mask: 0/1 assistant mask of ``ids``.
        images: Image files, in reading order.
        image_grids: ``(t, h, w)`` patch grid of each image.
        videos: Frame files of each video.
        video_grids: ``(t, h, w)`` patch grid of each video.
        seconds_per_grid: Seconds per temporal patch of each video.
        where: ``file:line`` of the record.
        frame_prefixes: Token ids of the timestamp text before each temporal patch of each video
            (``qwen3_vl`` / ``kimi_k25`` video layouts; empty otherwise).
    """

    ids: np.ndarray
    mask: np.ndarray
    images: list[str]
    image_grids: list[tuple[int, int, int]]
    videos: list[list[str]]
    video_grids: list[tuple[int, int, int]]
    seconds_per_grid: list[float]
    where: str
    frame_prefixes: list[list[list[int]]] = field(default_factory=list)


@dataclass(frozen=True)
class SampleLayout:
    """How records become samples.

    Attributes:
        seq_length: Positions per sample.
        pad_id: Token fed at padded positions.
        pack: Several records per sample with a block-diagonal attention mask.
        image_token_id: Placeholder id of images.
        video_token_id: Placeholder id of videos.
        processor: Grid -> token counts (its ``merge_size``).
        mrope: Emit ``[3, s]`` MRoPE position ids instead of ``[s]``.
        tokens_per_second: Temporal MRoPE positions per second of video.
        video_layout: ``qwen2_5`` (one placeholder run per video), ``ernie4_5_vl`` (one run, ERNIE
            positions), ``kimi_k25`` (timestamp + vision start / end per clip) or ``qwen3_vl`` (timestamp +
            ``<|vision_start|>`` + run + ``<|vision_end|>`` per temporal patch, Qwen3-VL positions).
        vision_start_id: Id of ``<|vision_start|>`` (written per temporal patch / clip by the per-frame layouts).
        vision_end_id: Id of ``<|vision_end|>`` (likewise).
        pack_algorithm: How ``pack`` groups records (:func:`loong_llm.data.packing.pack`).
    """

    seq_length: int
    pad_id: int
    pack: bool
    image_token_id: int
    video_token_id: int
    processor: VisionProcessor
    mrope: bool = True
    tokens_per_second: float = 2.0
    video_layout: str = "qwen2_5"
    vision_start_id: int = -1
    vision_end_id: int = -1
    pack_algorithm: str = "best_fit"

    @property
    def per_frame(self) -> bool:
        """Videos are split into one placeholder run per temporal patch (Qwen3-VL) or clip (Kimi-K2.5)."""
        return self.video_layout in ("qwen3_vl", "kimi_k25")

    def _video_runs(self, record: EncodedRecord) -> list[int]:
        """Token count of each video placeholder run, in reading order."""
        if not self.per_frame:
            return [self.processor.tokens(g) for g in record.video_grids]
        if self.video_layout == "kimi_k25":
            return [run for g in record.video_grids for run in self.processor.clip_runs(g)]
        return [self.processor.tokens((1, h, w)) for t, h, w in record.video_grids for _ in range(t)]

    def expanded(self, record: EncodedRecord) -> tuple[np.ndarray, np.ndarray]:
        """Ids and mask of ``record`` with each placeholder repeated to its input's token count
        (and, in the ``qwen3_vl`` layout, each video split into timestamped temporal patches)."""
        from loong_vlm.data.llava_tokens import expand_placeholders
        from loong_vlm.data.video_layout import split_videos_into_frames

        ids, mask = record.ids, record.mask
        if self.per_frame and record.video_grids:
            ids, mask = split_videos_into_frames(ids, mask, self.video_token_id, record.frame_prefixes,
                                                 self.vision_start_id, self.vision_end_id, record.where)
        counts = {self.image_token_id: [self.processor.tokens(g) for g in record.image_grids],
                  self.video_token_id: self._video_runs(record)}
        return expand_placeholders(ids, mask, counts, record.where)

    def positions(self, record: EncodedRecord) -> int:
        """Sequence positions ``record`` takes (its expanded length minus one)."""
        extra = sum(self.processor.tokens(g) - 1 for g in record.image_grids) + sum(self._video_runs(record))
        extra -= len(record.video_grids)
        if self.per_frame:  # per temporal patch: its timestamp, <|vision_start|> and <|vision_end|>
            extra += sum(len(prefix) + 2 for prefixes in record.frame_prefixes for prefix in prefixes)
        return len(record.ids) + extra - 1

    def sample(self, records: Sequence[EncodedRecord]) -> dict:
        """One sample of ``records`` (their positions must fit ``seq_length``)."""
        docs = [self.expanded(r) for r in records]
        for record, (ids, _) in zip(records, docs):
            if len(ids) - 1 > self.seq_length:
                raise ConfigError(f"{record.where}: the record needs {len(ids) - 1} positions but data.seq_length "
                                  f"is {self.seq_length}.")
        item = packed_sample([(ids, m.astype(np.float32)) for ids, m in docs], self.seq_length, self.pad_id,
                             with_mask=self.pack)
        if self.mrope:
            item["position_ids"] = self._mrope(records, docs)
        item["image_grid_thw"] = torch.tensor([g for r in records for g in r.image_grids], dtype=torch.long
                                              ).reshape(-1, 3)
        item["video_grid_thw"] = torch.tensor([g for r in records for g in r.video_grids], dtype=torch.long
                                              ).reshape(-1, 3)
        item["image_files"] = [f for r in records for f in r.images]
        item["video_files"] = [v for r in records for v in r.videos]
        item["num_positions"] = sum(len(ids) - 1 for ids, _ in docs)
        return item

    def record_position_ids(self, record: EncodedRecord, ids: np.ndarray) -> torch.Tensor:
        """``[3, len(ids)]`` MRoPE position ids of one record's expanded ``ids`` as if alone."""
        tokens = torch.from_numpy(ids)
        images = torch.tensor(record.image_grids, dtype=torch.long).reshape(-1, 3)
        videos = torch.tensor(record.video_grids, dtype=torch.long).reshape(-1, 3)
        if self.per_frame:
            from loong_vlm.qwen3_vl.rope import qwen3_vl_position_ids

            return qwen3_vl_position_ids(tokens, images, videos, image_token_id=self.image_token_id,
                                         video_token_id=self.video_token_id,
                                         spatial_merge_size=self.processor.merge_size)
        if self.video_layout == "ernie4_5_vl":
            from loong_vlm.ernie4_5_vl.rope import ernie_position_ids

            return ernie_position_ids(tokens, images, videos, image_token_id=self.image_token_id,
                                      video_token_id=self.video_token_id, spatial_merge_size=self.processor.merge_size,
                                      temporal_merge_size=self.processor.temporal_patch_size)
        return mrope_position_ids(tokens, images, videos, image_token_id=self.image_token_id,
                                  video_token_id=self.video_token_id, spatial_merge_size=self.processor.merge_size,
                                  tokens_per_second=self.tokens_per_second,
                                  second_per_grid_ts=record.seconds_per_grid)

    def _mrope(self, records: Sequence[EncodedRecord], docs) -> torch.Tensor:
        pieces = [self.record_position_ids(record, ids[:-1]) for record, (ids, _) in zip(records, docs)]
        used = sum(p.shape[1] for p in pieces)
        pieces.append(text_position_ids(self.seq_length - used))
        return torch.cat(pieces, dim=1)


def _open_rgb(path: str):
    from PIL import Image

    from loong_vlm.data.vision import to_rgb

    with Image.open(path) as image:
        image.load()
        return to_rgb(image)


def collate_llava(samples: Sequence[dict], processor: VisionProcessor) -> dict:
    """A micro batch: per-position tensors stacked, images and videos decoded and concatenated.

    Returns:
        ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` (``[b, s]`` or ``[b, 3, s]``),
        ``segment_ids`` (``[b, s]``, packed samples only) and, when the micro batch has
        any, ``pixel_values`` / ``image_grid_thw`` and ``pixel_values_videos`` /
        ``video_grid_thw`` (``docs/vlm_inputs.md``).
    """
    batch = {key: torch.stack([s[key] for s in samples]) for key in POSITION_KEYS if key in samples[0]}
    images = [f for s in samples for f in s["image_files"]]
    if images:
        patches = [processor.image(_open_rgb(f)) for f in images]
        batch["pixel_values"] = torch.from_numpy(np.concatenate([p for p, _ in patches]))
        batch["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in samples])
        _check_grids(batch["image_grid_thw"], [g for _, g in patches], images)
    videos = [v for s in samples for v in s["video_files"]]
    if videos:
        patches = [processor.video([_open_rgb(f) for f in frames]) for frames in videos]
        batch["pixel_values_videos"] = torch.from_numpy(np.concatenate([p for p, _ in patches]))
        batch["video_grid_thw"] = torch.cat([s["video_grid_thw"] for s in samples])
        _check_grids(batch["video_grid_thw"], [g for _, g in patches], [v[0] for v in videos])
    return batch


def _check_grids(expected: torch.Tensor, actual: list, files: list[str]) -> None:
    """The decoded inputs have the grids the tokens were laid out for (files did not change)."""
    for row, grid, name in zip(expected.tolist(), actual, files):
        if tuple(row) != tuple(grid):
            raise ConfigError(f"{name} decodes to a {tuple(grid)} patch grid but was indexed as {tuple(row)}; "
                              "the file changed since the data was prepared: delete the data cache entry.")
