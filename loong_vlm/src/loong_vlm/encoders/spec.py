"""megatron-core pieces shared by the vision encoders: a bidirectional layer spec and a config."""

from __future__ import annotations

import copy

import torch


def bidirectional_layer_spec(normalization: str = "LayerNorm"):
    """Local (no TransformerEngine) transformer layer with no attention mask.

    megatron-core's GPT local spec with its self-attention switched from causal to ``no_mask``,
    so every patch attends to every other patch of its image; its core attention is the kernel
    seam's (``kernels.attention``: windows and frames given as block-diagonal masks run per
    segment, without a dense mask).
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.enums import AttnMaskType

    from loong_core.engines.megatron.seam.spec import apply

    spec = copy.deepcopy(get_gpt_layer_local_spec(normalization=normalization))
    spec.submodules.self_attention.params = {**spec.submodules.self_attention.params,
                                             "attn_mask_type": AttnMaskType.no_mask}
    return apply(spec)


def encoder_transformer_config(cfg, parallel_kwargs: dict, **overrides):
    """``TransformerConfig`` of an encoder: its own sizes, tensor-parallel size and recompute.

    The tensor-parallel size is ``model.encoder.tensor_model_parallel_size`` (null: the
    foundation's; see :mod:`loong_vlm.encoder_parallel`), the recompute settings are the encoder's
    own ``recompute_*`` fields. The encoder is not pipelined (it lives whole on the first pipeline
    stage) and does not use sequence parallelism.

    Args:
        cfg: The encoder's config (:class:`~loong_vlm.config.ViTConfig`).
        parallel_kwargs: The run's ``TransformerConfig`` parallel fields.
        **overrides: Further ``TransformerConfig`` fields (normalization, MLP type...).
    """
    from megatron.core.transformer.transformer_config import TransformerConfig

    from loong_vlm.encoder_parallel import encoder_tensor_parallel_size, recompute_fields

    tp = encoder_tensor_parallel_size(cfg, parallel_kwargs.get("tensor_model_parallel_size", 1))
    fields = dict(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        ffn_hidden_size=cfg.ffn_hidden_size or 4 * cfg.hidden_size,
        normalization="LayerNorm",
        layernorm_epsilon=cfg.norm_epsilon,
        gated_linear_unit=False,
        activation_func=torch.nn.functional.gelu,
        add_bias_linear=True,
        hidden_dropout=cfg.hidden_dropout,
        attention_dropout=cfg.attention_dropout,
        init_method_std=cfg.init_method_std,
        use_cpu_initialization=True,
        params_dtype=parallel_kwargs.get("params_dtype", torch.float32),
        pipeline_dtype=parallel_kwargs.get("pipeline_dtype", torch.float32),
        bf16=parallel_kwargs.get("bf16", False),
        fp16=parallel_kwargs.get("fp16", False),
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1,
        sequence_parallel=False,
        **recompute_fields(cfg),
    )
    fields.update(overrides)
    return TransformerConfig(**fields)
