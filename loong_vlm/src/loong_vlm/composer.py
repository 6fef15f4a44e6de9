"""The composed module: text embeddings with projected image features at the placeholder tokens,
then the foundation decoder."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule


def place_features(embeddings: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor,
                   image_token_id: int, kind: str = "image") -> torch.Tensor:
    """Put image (or video) features at their placeholder tokens.

    Args:
        embeddings: Text embeddings ``[b, s, h]``.
        tokens: Token ids ``[b, s]``.
        features: ``[n, h]`` feature vectors in reading order (sample by sample, image by image,
            token by token); ``n`` must equal the number of placeholders in ``tokens``.
        image_token_id: The placeholder id.
        kind: ``image`` or ``video`` (for the error message).

    Returns:
        ``[b, s, h]``: ``embeddings`` with the placeholder rows replaced (differentiable in both).

    Raises:
        ValueError: The placeholder count and the feature count differ.
    """
    mask = tokens == image_token_id
    count = int(mask.sum())
    if count != features.shape[0]:
        raise ValueError(
            f"the batch has {count} {kind} placeholder tokens but the encoder produced "
            f"{features.shape[0]} {kind} features; the data's tokens per {kind} must equal what "
            f"the encoder + projector output (model.image_tokens, or the {kind}_grid_thw of "
            f"dynamic-resolution inputs).")
    return embeddings.masked_scatter(mask.unsqueeze(-1), features.to(embeddings.dtype))


class VisionLanguageModel(MegatronModule):
    """Encoder + projector (first pipeline stage only) feeding a megatron-core GPTModel.

    Args:
        config: The foundation's ``TransformerConfig``.
        language_model: The foundation's model chunk (a ``GPTModel``).
        encoder: Vision encoder, or None on stages without the embedding.
        projector: Projector, or None with ``encoder``.
        image_token_id: Placeholder token id of images.
        video_token_id: Placeholder token id of videos (Qwen-style inputs only).

    Visual inputs come in one of two forms (``docs/vlm_inputs.md``): fixed-size ``images``
    ``[b, n_img, c, h, w]`` for encoders with a fixed grid, or Qwen-style dynamic resolution:
    ``pixel_values`` ``[n_patches, c*t*p*p]`` with ``image_grid_thw`` ``[n_images, 3]`` (and the
    same for videos), for encoders that declare ``dynamic_resolution = True``.
    """

    def __init__(self, config, language_model, encoder, projector, image_token_id: int | None,
                 video_token_id: int | None = None):
        super().__init__(config=config)
        self.language_model = language_model
        self.encoder = encoder
        self.projector = projector
        self.image_token_id = image_token_id
        self.video_token_id = video_token_id
        self.model_type = language_model.model_type
        self.pre_process = language_model.pre_process
        self.post_process = language_model.post_process
        self.share_embeddings_and_output_weights = language_model.share_embeddings_and_output_weights
        if self.pre_process and config.sequence_parallel:
            # Features go in at full sequence length: the embedding must not scatter the sequence
            # over the TP ranks; :meth:`embed` scatters after placing them.
            embedding = language_model.embedding
            embedding.reduce_scatter_embeddings = False
            embedding.word_embeddings.reduce_scatter_embeddings = False
            embedding.scatter_to_sequence_parallel = False

    # megatron-core's schedules and finalize_model_grads talk to these
    def set_input_tensor(self, input_tensor) -> None:
        """Activations from the previous pipeline stage (forwarded to the foundation)."""
        self.language_model.set_input_tensor(input_tensor)

    def shared_embedding_or_output_weight(self):
        """The foundation's tied embedding / output weight."""
        return self.language_model.shared_embedding_or_output_weight()

    def visual_features(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Projected features ``[n_tokens, h]`` of Qwen-style patches, or of fixed-size tiles
        ``[n_tiles, c, h, w]`` for an encoder without dynamic resolution (InternVL-style tiling:
        each input's tiles in order, ``grid_thw`` rows ``(tiles, rows, cols)``)."""
        if getattr(self.encoder, "dynamic_resolution", False):
            return self.projector(self.encoder(pixel_values, grid_thw))
        if pixel_values.dim() != 4:
            raise ValueError(f"the batch has Qwen-style pixel_values {tuple(pixel_values.shape)} but the encoder "
                             f"{type(self.encoder).__name__} takes fixed-size tiles; pick a dynamic-resolution "
                             "encoder (model.encoder.name=qwen2_5_vit) or set data.image_processing=tiles.")
        features = self.projector(self.encoder(pixel_values))  # [n_tiles, tokens per tile, h]
        return features.reshape(-1, features.shape[-1])

    def local_sequence(self, hidden: torch.Tensor) -> torch.Tensor:
        """This rank's load-balanced chunks of a full-length ``[s, b, h]`` tensor under context
        parallelism (the vision features are placed by the full token ids first), else ``hidden``."""
        if self.config.context_parallel_size == 1:
            return hidden
        from loong_core.engines.megatron.context_parallel import local_sequence

        return local_sequence(hidden, 0)

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor | None,
              images: torch.Tensor | None = None, visual: dict | None = None) -> torch.Tensor:
        """Decoder input ``[s, b, h]``: text embeddings with image / video features placed in.

        Under context parallelism the encoder runs on all images of the micro batch (replicated
        over the CP group) and the result is this rank's two chunks of the sequence
        (:meth:`local_sequence`), before the sequence-parallel scatter.

        Args:
            tokens: ``[b, s]`` token ids.
            position_ids: ``[b, s]`` positions (unused by RoPE foundations).
            images: Fixed-size images ``[b, n_img, c, h, w]``.
            visual: Qwen-style inputs: ``pixel_values``, ``image_grid_thw``,
                ``pixel_values_videos``, ``video_grid_thw`` (any may be missing or None).
        """
        embeddings = self.language_model.embedding(input_ids=tokens, position_ids=position_ids)
        placed = None
        if images is not None and self.encoder is not None and images.numel() > 0:
            images = images.reshape(-1, *images.shape[-3:])  # [b, n_img, c, h, w] -> [b*n_img, ...]
            features = self.projector(self.encoder(images))  # [b*n_img, t, h]
            features = features.reshape(-1, features.shape[-1])
            placed = place_features(embeddings.transpose(0, 1), tokens, features, self.image_token_id)
        visual = visual or {}
        for kind, token_id in (("image", self.image_token_id), ("video", self.video_token_id)):
            pixels_key = "pixel_values" if kind == "image" else "pixel_values_videos"
            grid_key = f"{kind}_grid_thw"
            pixels = visual.get(pixels_key)
            if pixels is None or pixels.numel() == 0 or self.encoder is None:
                continue
            if visual.get(grid_key) is None or token_id is None:
                raise ValueError(f"the batch has '{pixels_key}' but no '{grid_key}' or the model has "
                                 f"no placeholder id for it (model.image_token_id / video_token_id).")
            features = self.visual_features(pixels, visual[grid_key])
            base = embeddings.transpose(0, 1) if placed is None else placed
            placed = place_features(base, tokens, features, token_id, kind)
        if placed is not None:
            embeddings = placed.transpose(0, 1).contiguous()
        embeddings = self.local_sequence(embeddings)
        if self.config.sequence_parallel:
            embeddings = tensor_parallel.scatter_to_sequence_parallel_region(embeddings)
        return embeddings

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, images: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **visual) -> torch.Tensor:
        """Logits ``[b, s, vocab/tp]`` on the last stage (per-token loss with ``labels``),
        hidden states elsewhere.

        ``position_ids`` is ``[b, s]``, or ``[b, 3, s]`` MRoPE ids for a foundation built with
        ``position_embedding_type: mrope``. ``visual``: the Qwen-style inputs of :meth:`embed`.
        """
        text_positions = position_ids
        if position_ids is not None and position_ids.dim() == 3:
            position_ids = position_ids.transpose(0, 1).contiguous()  # [3, b, s] for megatron-core
            text_positions = None
        decoder_input = self.embed(tokens, text_positions, images, visual) if self.pre_process else None
        return self.language_model(tokens, position_ids, attention_mask, decoder_input=decoder_input,
                                   labels=labels)
