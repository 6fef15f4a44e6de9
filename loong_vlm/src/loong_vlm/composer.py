"""The composed module: text embeddings with projected image features at the placeholder tokens,
then the foundation decoder."""

from __future__ import annotations

import torch
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule


def place_features(embeddings: torch.Tensor, tokens: torch.Tensor, features: torch.Tensor,
                   image_token_id: int) -> torch.Tensor:
    """Put image features at the image placeholder tokens.

    Args:
        embeddings: Text embeddings ``[b, s, h]``.
        tokens: Token ids ``[b, s]``.
        features: ``[n, h]`` feature vectors in reading order (sample by sample, image by image,
            token by token); ``n`` must equal the number of placeholders in ``tokens``.
        image_token_id: The placeholder id.

    Returns:
        ``[b, s, h]``: ``embeddings`` with the placeholder rows replaced (differentiable in both).

    Raises:
        ValueError: The placeholder count and the feature count differ.
    """
    mask = tokens == image_token_id
    count = int(mask.sum())
    if count != features.shape[0]:
        raise ValueError(
            f"the batch has {count} image placeholder tokens but the encoder produced "
            f"{features.shape[0]} image features; the data's tokens per image must equal what "
            f"the encoder + projector output (model.image_tokens).")
    return embeddings.masked_scatter(mask.unsqueeze(-1), features.to(embeddings.dtype))


class VisionLanguageModel(MegatronModule):
    """Encoder + projector (first pipeline stage only) feeding a megatron-core GPTModel.

    Args:
        config: The foundation's ``TransformerConfig``.
        language_model: The foundation's model chunk (a ``GPTModel``).
        encoder: Vision encoder, or None on stages without the embedding.
        projector: Projector, or None with ``encoder``.
        image_token_id: Placeholder token id.
    """

    def __init__(self, config, language_model, encoder, projector, image_token_id: int | None):
        super().__init__(config=config)
        self.language_model = language_model
        self.encoder = encoder
        self.projector = projector
        self.image_token_id = image_token_id
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

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              images: torch.Tensor | None) -> torch.Tensor:
        """Decoder input ``[s, b, h]``: text embeddings with image features placed in."""
        embeddings = self.language_model.embedding(input_ids=tokens, position_ids=position_ids)
        if images is not None and self.encoder is not None and images.numel() > 0:
            images = images.reshape(-1, *images.shape[-3:])  # [b, n_img, c, h, w] -> [b*n_img, ...]
            features = self.projector(self.encoder(images))  # [b*n_img, t, h]
            features = features.reshape(-1, features.shape[-1])
            placed = place_features(embeddings.transpose(0, 1), tokens, features, self.image_token_id)
            embeddings = placed.transpose(0, 1).contiguous()
        if self.config.sequence_parallel:
            embeddings = tensor_parallel.scatter_to_sequence_parallel_region(embeddings)
        return embeddings

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                attention_mask: torch.Tensor | None = None, images: torch.Tensor | None = None,
                labels: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[b, s, vocab/tp]`` on the last stage (per-token loss with ``labels``),
        hidden states elsewhere."""
        decoder_input = self.embed(tokens, position_ids, images) if self.pre_process else None
        return self.language_model(tokens, position_ids, attention_mask, decoder_input=decoder_input,
                                   labels=labels)
