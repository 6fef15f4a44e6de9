"""Config of the multimodal datasets (light: no torch import)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from loong_core.config.schema import DataConfig, registered
from loong_core.errors import ConfigError
from loong_llm.data.config import check_pack_algorithm


@dataclass
class DigitsVQAConfig(DataConfig):
    """scikit-learn's 1,797 handwritten 8x8 digits as ``Which digit is this?`` conversations.

    A fixed random subset (seed 0, independent of ``trainer.seed``) is held out for validation;
    training samples cycle through the rest in a new order every epoch.

    Attributes:
        image_size: Side the 8x8 images are resized to (bilinear).
        image_tokens: Placeholder tokens each image expands into; must equal the tokens the
            model's encoder + projector output per image (the model checks it).
        valid_size: Held-out digits (validation split).
        question: The user's question after the image.
        vocab_size: Target size of the byte-level BPE trained on the prompts (special tokens
            included); 285 learns every merge of the default prompt, so each word is one token.
        train_end_of_turn: Also train on the reply's end-of-turn tokens (``<|im_end|>\n``). They
            are predictable without the image, and with encoder and foundation both learning from
            scratch their gradient teaches the model to flatten the image features before it
            learns to read them (measured: held-out accuracy stays at chance), so by default only
            the digit is trained on.
        balancer: Data balancer (on by default for VLM runs).
    """

    seq_length: int = 64
    image_size: int = 16
    image_tokens: int = 16
    valid_size: int = 384
    question: str = "Which digit is this?"
    vocab_size: int = 285
    train_end_of_turn: bool = False
    balancer: str = registered("balancer", default="kk_swap")

    def __post_init__(self):
        if not 0 < self.valid_size < 1797:
            raise ConfigError(f"data.valid_size = {self.valid_size} must be in 1..1796.")
        if self.image_size < 1 or self.image_tokens < 1:
            raise ConfigError("data.image_size and data.image_tokens must be positive.")


@dataclass
class LlavaConfig(DataConfig):
    """LLaVA-style conversations with image files and video frame lists, at dynamic resolution.

    Each record of ``path`` (a JSON list or a JSON-lines file) holds ``conversations``
    (``{"from": "human" | "gpt" | "system", "value": ...}``) or ``messages`` (``{"role",
    "content"}``), plus ``image`` (a path or a list of paths) and / or ``video`` (a list of frame
    paths, or a list of such lists). ``<image>`` / ``<video>`` in the text mark where each goes.
    Images are resized to multiples of ``patch_size * merge_size`` within the pixel bounds and
    expand into ``t*h*w / merge_size**2`` placeholder tokens; the loss is on assistant replies.

    Attributes:
        path: The training records (``.json`` list or ``.jsonl``); None writes and uses the
            built-in demo set (scikit-learn digits of mixed sizes as single images, pairs and
            4-frame videos; :mod:`loong_vlm.data.llava_digits`) in the data cache.
        valid_path: Validation records; None holds out ``valid_fraction`` of ``path``.
        image_root: Folder relative image / frame paths start from; None: the folder of ``path``.
        tokenizer: A Hugging Face tokenizer directory with a chat template and Qwen's vision
            tokens (``<|vision_start|>``, ``<|image_pad|>``, ``<|video_pad|>``,
            ``<|vision_end|>``); None trains a byte-level BPE of ``vocab_size`` on the
            conversations with the ChatML template and those tokens.
        vocab_size: Vocabulary of the trained BPE (special tokens included).
        valid_fraction: Fraction of the records held out when ``valid_path`` is None.
        pack: Pack several records into each sequence (block-diagonal attention, positions
            restarting per record); False gives one record per sequence, padded.
        pack_algorithm: How records are grouped into sequences: ``best_fit`` (best-fit
            decreasing over windows of 1,024 shuffled records: fewest padded positions) or
            ``next_fit`` (in the shuffled order, a new sequence whenever the next record does
            not fit).
        skip_too_long: Drop records longer than ``seq_length`` (logged) instead of failing.
        patch_size: Side of a vision patch (must equal the encoder's).
        temporal_patch_size: Frames per patch (must equal the encoder's).
        merge_size: Side of the patch block merged into one token (the encoder's
            ``spatial_merge_size``).
        min_pixels: Smallest area an image is resized to.
        max_pixels: Largest area an image is resized to.
        video_min_pixels: Smallest area of a video frame.
        video_max_pixels: Largest area of a video frame.
        video_max_frames: Frames kept (evenly spaced) from a longer frame list.
        mrope: Emit 3-row MRoPE position ids ``[3, s]`` (Qwen2-VL-style foundations); False
            gives plain ``[s]`` positions.
        tokens_per_second: Temporal MRoPE positions per second of video (the model's
            ``tokens_per_second``); a record's ``fps`` sets the seconds per temporal patch.
        video_layout: How a video is laid out in the tokens, as the model family reads it:
            ``qwen2_5`` (one placeholder run, Qwen2-VL / Qwen2.5-VL MRoPE positions),
            ``qwen3_vl`` (a ``<S.s seconds>`` timestamp and its own vision start / end per temporal
            patch, Qwen3-VL positions), ``kimi_k25`` (an ``HH:MM:SS.mmm`` timestamp and its own
            vision start / end per clip; :mod:`loong_vlm.data.video_layout`) or ``ernie4_5_vl``
            (one placeholder run, ERNIE-4.5-VL positions: one time step per merged frame pair;
            goes with ``image_processing=ernie``). The model checks it.
        image_processing: ``dynamic`` (Qwen-style patches at each image's own resolution),
            ``tiles`` (InternVL: fixed-size tiles of ``tile_size``, 1 to ``max_tiles`` per image
            by its aspect ratio plus a thumbnail, ImageNet normalisation; a video's sampled
            frames one tile each; :mod:`loong_vlm.data.tiles`) or ``navit`` (Kimi-K2.5 / MoonViT:
            native resolution, never upscaled, padded to whole merge blocks, one frame per patch;
            a video in clips of ``temporal_patch_size`` frames; :mod:`loong_vlm.data.navit`) or
            ``ernie`` (ERNIE-4.5-VL: ``dynamic`` sizes with one frame per patch row, a video's
            frames merged in pairs (``temporal_patch_size=2``) by the model; :mod:`loong_vlm.data.ernie`).
            The model checks it.
        max_patches: Patch budget of an image (``navit``).
        max_patches_per_side: Most patches along a side of an image or frame (``navit``).
        video_max_patches: Patch budget of a video frame (``navit``).
        tile_size: Side of a tile in pixels (``tiles``; the encoder's ``image_size``).
        min_tiles: Fewest tiles of an image (``tiles``).
        max_tiles: Most tiles of an image, before the thumbnail (``tiles``).
        balancer: Data balancer (on by default for VLM runs).
    """

    path: Optional[str] = None
    valid_path: Optional[str] = None
    image_root: Optional[str] = None
    tokenizer: Optional[str] = None
    vocab_size: int = 1024
    valid_fraction: float = 0.05
    pack: bool = True
    pack_algorithm: str = "best_fit"
    skip_too_long: bool = False
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    video_min_pixels: int = 56 * 56
    video_max_pixels: int = 28 * 28 * 256
    video_max_frames: int = 16
    mrope: bool = True
    tokens_per_second: float = 2.0
    video_layout: str = "qwen2_5"
    image_processing: str = "dynamic"
    tile_size: int = 448
    min_tiles: int = 1
    max_tiles: int = 12
    max_patches: int = 16384
    max_patches_per_side: int = 512
    video_max_patches: int = 4096
    seq_length: int = 2048
    balancer: str = registered("balancer", default="kk_swap")

    def __post_init__(self):
        check_pack_algorithm(self.pack_algorithm)
        for key in ("patch_size", "temporal_patch_size", "merge_size", "video_max_frames", "min_pixels",
                    "video_min_pixels"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key} = {getattr(self, key)} must be positive.")
        factor = self.patch_size * self.merge_size
        for low, high in (("min_pixels", "max_pixels"), ("video_min_pixels", "video_max_pixels")):
            if getattr(self, high) < max(getattr(self, low), factor * factor):
                raise ConfigError(
                    f"data.{high} = {getattr(self, high)} must be at least data.{low} "
                    f"({getattr(self, low)}) and one merge window ((patch_size*merge_size)^2 = {factor ** 2}).")
        if not 0.0 < self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction = {self.valid_fraction} must be in (0, 1).")
        if self.seq_length < 2:
            raise ConfigError(f"data.seq_length = {self.seq_length} must be at least 2.")
        if self.image_processing not in ("dynamic", "tiles", "navit", "ernie"):
            raise ConfigError(f"data.image_processing = {self.image_processing!r} must be dynamic (Qwen-style "
                              "patches), tiles (InternVL), navit (Kimi-K2.5) or ernie (ERNIE-4.5-VL).")
        if (self.image_processing == "ernie") != (self.video_layout == "ernie4_5_vl"):
            raise ConfigError(f"data.image_processing = {self.image_processing} and data.video_layout = "
                              f"{self.video_layout}: ERNIE-4.5-VL's patches and positions go together; set both "
                              "data.image_processing=ernie and data.video_layout=ernie4_5_vl, or neither.")
        if self.image_processing == "ernie" and self.temporal_patch_size != 2:
            raise ConfigError(f"data.temporal_patch_size = {self.temporal_patch_size} but ERNIE-4.5-VL's resampler "
                              "merges frame pairs; set data.temporal_patch_size=2.")
        if self.image_processing == "navit" and min(self.max_patches, self.video_max_patches,
                                                    self.max_patches_per_side) < 1:
            raise ConfigError("data.max_patches, data.video_max_patches and data.max_patches_per_side must be "
                              "positive.")
        if self.image_processing == "tiles":
            if self.tile_size % factor:
                raise ConfigError(f"data.tile_size = {self.tile_size} must be a multiple of patch_size * merge_size "
                                  f"= {factor}.")
            if not 1 <= self.min_tiles <= self.max_tiles:
                raise ConfigError(f"data.min_tiles = {self.min_tiles} and data.max_tiles = {self.max_tiles} need "
                                  "1 <= min_tiles <= max_tiles.")
        if self.video_layout not in ("qwen2_5", "qwen3_vl", "kimi_k25", "ernie4_5_vl"):
            raise ConfigError(f"data.video_layout = {self.video_layout!r} must be qwen2_5 (Qwen2-VL / Qwen2.5-VL), "
                              "qwen3_vl (Qwen3-VL), kimi_k25 (Kimi-K2.5) or ernie4_5_vl (ERNIE-4.5-VL).")

    def vision_processor(self):
        """The :class:`~loong_vlm.data.vision.VisionProcessor` of these settings (a
        :class:`~loong_vlm.data.tiles.TileProcessor` with ``image_processing=tiles``, a
        :class:`~loong_vlm.data.navit.NaViTProcessor` with ``navit``, an
        :class:`~loong_vlm.data.ernie.ErnieVisionProcessor` with ``ernie``)."""
        if self.image_processing == "navit":
            from loong_vlm.data.navit import NaViTProcessor

            return NaViTProcessor(patch_size=self.patch_size, merge_size=self.merge_size, max_patches=self.max_patches,
                                  max_patches_per_side=self.max_patches_per_side,
                                  video_max_patches=self.video_max_patches, clip_frames=self.temporal_patch_size,
                                  video_max_frames=self.video_max_frames)
        if self.image_processing == "tiles":
            from loong_vlm.data.tiles import TileProcessor

            return TileProcessor(tile_size=self.tile_size, min_tiles=self.min_tiles, max_tiles=self.max_tiles,
                                 patch_size=self.patch_size, merge_size=self.merge_size,
                                 video_max_frames=self.video_max_frames)
        if self.image_processing == "ernie":
            from loong_vlm.data.ernie import ErnieVisionProcessor as processor
        else:
            from loong_vlm.data.vision import VisionProcessor as processor
        return processor(
            patch_size=self.patch_size, temporal_patch_size=self.temporal_patch_size, merge_size=self.merge_size,
            min_pixels=self.min_pixels, max_pixels=self.max_pixels, video_min_pixels=self.video_min_pixels,
            video_max_pixels=self.video_max_pixels, video_max_frames=self.video_max_frames)
