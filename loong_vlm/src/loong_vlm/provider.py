"""The ``vlm`` model provider: composes registered encoder, projector and foundation components."""

from __future__ import annotations

import logging
from typing import Any

import torch

from loong_core.engines.model_provider import ModelProvider
from loong_core.errors import ConfigError
from loong_vlm.config import VLMConfig

logger = logging.getLogger(__name__)

#: Batch keys of Qwen-style dynamic-resolution inputs (``docs/vlm_inputs.md``).
VISUAL_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")

#: Batch keys sliced to this rank's chunks under context parallelism (dim 1; dim 2 of the mask).
_CP_KEYS = ("tokens", "labels", "loss_mask", "answer_mask", "attention_mask")

#: Data override keys that configure the encoder (the images decide them).
_ENCODER_KEYS = ("image_size", "num_channels")


def _load_component(name: str, role: str | None, path: str):
    """The registered class named at ``path`` (checking its ``role`` metadata when given)."""
    from loong_core.plugins import get_plugin_system

    registry = get_plugin_system().registry()
    entry = registry.get("model", name, path)
    actual = entry.meta.get("role")
    if role is not None and actual != role:
        choices = [e.name for e in registry.entries("model") if e.meta.get("role") == role]
        raise ConfigError(f"'{path}' = {name!r} is not a {role}; installed {role}s: {', '.join(choices)}.")
    if role is None and actual is not None:
        raise ConfigError(f"'{path}' = {name!r} is a {actual}, not a foundation model.")
    return entry.load()


def _language_model(model):
    """The foundation's module inside a (wrapped) composed model."""
    inner = model
    while not hasattr(inner, "language_model") and hasattr(inner, "module"):
        inner = inner.module
    return inner.language_model


class VLMProvider(ModelProvider):
    """Encoder -> projector -> features at image placeholders -> foundation decoder.

    The foundation is built by its own registered provider (so any loong_llm family works), the
    encoder and projector live on the first pipeline stage. The loss is the mean cross entropy
    over the tokens the data marks in ``loss_mask`` (assistant replies); ``accuracy`` is the
    arg-max accuracy over ``answer_mask`` (``loss_mask`` when the data has none).
    """

    engines = ("megatron",)
    reported_metrics = ("loss", "accuracy")
    # Context parallelism: the composer places the features at full length, then keeps this
    # rank's chunks; forward_step slices the targets and the packed mask (``_CP_KEYS``).
    supports_context_parallel = True
    config: VLMConfig

    def __init__(self, config: VLMConfig):
        super().__init__(config)
        self.foundation = _load_component(config.foundation.name, None, "model.foundation.name")(config.foundation)
        # the foundation's own per-step metrics (MoE router statistics, MTP loss, ...) too
        extra = [m for m in getattr(self.foundation, "reported_metrics", ()) if m not in type(self).reported_metrics]
        self.reported_metrics = (*type(self).reported_metrics, *extra)
        self.encoder_cls = _load_component(config.encoder.name, "encoder", "model.encoder.name")
        self.projector_cls = _load_component(config.projector.name, "projector", "model.projector.name")
        self.parallel_kwargs: dict[str, Any] = {}
        self.encoder_parallel = None  # EncoderParallelPlan, set by megatron_config

    def apply_data_overrides(self, overrides: dict[str, Any]) -> None:
        """Vocabulary to the foundation, image geometry to the encoder, placeholder id and count
        to this config; checks the placeholder count against what encoder + projector output."""
        from loong_vlm.data.geometry import check_vision_geometry, pop_geometry

        overrides = dict(overrides)
        geometry = pop_geometry(overrides)  # dynamic-resolution data: checked against the model, never set
        vocab = {"vocab_size": overrides.pop("vocab_size")} if "vocab_size" in overrides else None
        for key in _ENCODER_KEYS:
            if key in overrides:
                setattr(self.config.encoder, key, overrides.pop(key))
        super().apply_data_overrides(overrides)
        check_vision_geometry(self.config, geometry)  # images the encoder cannot read: said first
        if vocab is not None:
            self.foundation.apply_data_overrides(vocab)
        expected = self.image_tokens_per_image()
        if expected is not None and self.config.image_tokens is not None and self.config.image_tokens != expected:
            raise ConfigError(
                f"the data expands each image into {self.config.image_tokens} placeholder tokens but "
                f"encoder + projector output {expected} per image ({self.config.encoder.image_size}px "
                f"images, patch_size {self.config.encoder.patch_size}, spatial_merge_size "
                f"{getattr(self.config.projector, 'spatial_merge_size', 1)}); set data.image_tokens={expected}.")

    def image_tokens_per_image(self) -> int | None:
        """Tokens the encoder + projector output per image (None: dynamic resolution, the data's
        ``image_grid_thw`` decides)."""
        if getattr(self.config.encoder, "dynamic_resolution", False):
            return None
        merge = getattr(self.config.projector, "spatial_merge_size", 1)
        return self.config.encoder.num_patches() // (merge * merge)

    # -- megatron-core ---------------------------------------------------------------------
    def megatron_config(self, parallel_kwargs: dict):
        from loong_vlm.encoder_parallel import plan_encoder_parallel

        self.parallel_kwargs = dict(parallel_kwargs)
        config = self.foundation.megatron_config(parallel_kwargs)
        # The encoder's own TP size / data layout (collective: every rank creates its groups).
        self.encoder_parallel = plan_encoder_parallel(self.config.encoder, self.parallel_kwargs)
        return config

    def composer_class(self):
        """The class of the composed module (families with extra wiring, e.g. Qwen3-VL's
        deepstack, return a subclass of :class:`~loong_vlm.composer.VisionLanguageModel`)."""
        from loong_vlm.composer import VisionLanguageModel

        return VisionLanguageModel

    def build_megatron_model(self, config, pre_process: bool, post_process: bool, vp_stage):
        from loong_core.engines.megatron.seam import linear
        from loong_vlm.encoder_parallel import build_encoder, projector_config

        c = self.config
        language_model = self.foundation.build_megatron_model(config, pre_process, post_process, vp_stage)
        encoder = projector = None
        if pre_process:
            if c.image_token_id is None:
                raise ConfigError("model.image_token_id is unknown: use a multimodal dataset or set it.")
            encoder = build_encoder(self.encoder_parallel, self.encoder_cls, c.encoder, self.parallel_kwargs)
            projector = self.projector_cls(c.projector, projector_config(self.encoder_parallel, encoder.config),
                                           encoder.output_size, encoder.grid, config.hidden_size)
        model = self.composer_class()(config, language_model, encoder, projector, c.image_token_id,
                                      c.video_token_id)
        linear.adopt(model)  # the vision tower's and projector's linears too (the LM's already are)
        frozen = {"encoder": getattr(c.encoder, "freeze", False),
                  "projector": getattr(c.projector, "freeze", False),
                  "language_model": c.freeze_foundation}
        for part, freeze in frozen.items():
            module = getattr(model, part)
            if freeze and module is not None:
                for param in module.parameters():
                    param.requires_grad_(False)
        return model

    def initialize_weights(self, chunks: list[Any]) -> None:
        """The foundation loads its pretrained weights (``model.foundation.init_from_hf``)."""
        self.foundation.initialize_weights([chunk.language_model for chunk in chunks])

    def forward_step(self, model, batch: dict):
        from loong_core.engines.megatron.context_parallel import slice_batch
        from loong_core.kernels.segment_mask import with_attention_mask
        from loong_vlm.loss import correct_predictions, token_losses

        visual = {key: batch[key] for key in VISUAL_KEYS if batch.get(key) is not None}
        # Under context parallelism tokens and positions stay whole: the composer places the
        # vision features by the full token ids and megatron-core's rotary embedding takes the
        # angles of this rank's chunks from the full (MRoPE) positions.
        tokens, position_ids = batch["tokens"], batch["position_ids"]
        # Packed records: segment ids become the attention mask (a SegmentMask; under CP the
        # ids of the whole sequence, not sliced).
        batch = with_attention_mask(batch)
        batch = slice_batch(batch, _CP_KEYS)
        logits = model(tokens, position_ids, batch.get("attention_mask"),
                       images=batch.get("images"), **visual)
        labels = batch["labels"]
        loss_mask = batch["loss_mask"].float()
        answer_mask = batch.get("answer_mask", loss_mask).float()

        def loss_func(logits):
            correct = correct_predictions(logits, labels).float()
            losses = token_losses(logits, labels)
            loss_sum = (losses * loss_mask).sum()
            metrics = {
                "loss": torch.stack([loss_sum.detach(), loss_mask.sum()]),
                "accuracy": torch.stack([(correct * answer_mask).sum(), answer_mask.sum()]),
            }
            if hasattr(self.foundation, "step_metrics"):
                metrics.update(self.foundation.step_metrics(_language_model(model)))
            return loss_sum, loss_mask.sum().to(torch.int), metrics

        return logits, loss_func

    # -- accounting --------------------------------------------------------------------------
    def flops_per_token(self, seq_length: int) -> float:
        """The foundation's FLOPs per token plus the encoder's, spread over the sequence."""
        total = self.foundation.flops_per_token(seq_length)
        e = self.config.encoder
        width, layers = getattr(e, "hidden_size", 0), getattr(e, "num_layers", 0)
        patches = e.num_patches()
        encoder = 6.0 * layers * 12 * width * width * patches + 12.0 * layers * patches ** 2 * width
        return total + encoder / max(seq_length, 1)
