"""The provider every decoder family shares: TransformerConfig, GPTModel, loss, HF init."""

from __future__ import annotations

import logging
from typing import Any

import torch

from loong_core.engines.model_provider import ModelProvider
from loong_core.errors import ConfigError
from loong_llm.families.common import rope
from loong_llm.families.common.config import DecoderConfig

logger = logging.getLogger(__name__)

MTP_METRIC = "mtp_loss"


class DecoderProvider(ModelProvider):
    """Builds a decoder-only family as a megatron-core GPTModel on the local (no-TE) spec.

    Families subclass it and override :meth:`family_transformer_kwargs` / :meth:`layer_spec`.
    ``family`` names the registered HF checkpoint adapter used by ``model.init_from_hf``.
    """

    engines = ("megatron",)
    family = "llama"
    supports_context_parallel = True  # forward_step shards the batch over the CP group
    supports_sequence_chunks = True  # forward_step runs parallel.sequence_chunks chunks
    sequence_chunks = 1  # set by the megatron engine from parallel.sequence_chunks
    config: DecoderConfig

    def __init__(self, config: DecoderConfig):
        super().__init__(config)
        asked_mtp = config.mtp_num_layers
        if config.init_from_hf:
            from loong_llm.hf.registry import get_adapter

            adapter = get_adapter(self.family)
            adapter.apply_hf_config(config, config.init_from_hf)
        # MTP switched on by the checkpoint's weights, not by the (validated) config
        self._mtp_from_checkpoint = bool(config.mtp_num_layers) and not asked_mtp
        if config.mtp_num_layers:
            self.reported_metrics = (*type(self).reported_metrics, MTP_METRIC)

    def apply_data_overrides(self, overrides: dict[str, Any]) -> None:
        """Take the dataset's vocabulary when ``model.vocab_size`` is unset; a vocabulary that is
        set (in the config, or by ``init_from_hf``) is kept, as ``loong config show`` says, and
        must be at least as large as the tokenizer's."""
        overrides = dict(overrides)
        data_vocab = overrides.pop("vocab_size", None)
        if data_vocab is not None:
            if self.config.vocab_size is None:
                self.config.vocab_size = data_vocab
            elif data_vocab > self.config.vocab_size:
                source = (f"the model loaded from {self.config.init_from_hf}"
                          if self.config.init_from_hf else "model.vocab_size")
                raise ConfigError(
                    f"the dataset's tokenizer has {data_vocab} tokens but {source} has vocab_size "
                    f"{self.config.vocab_size}: token ids would fall outside the embedding. Use the "
                    f"model's tokenizer for the data (data.tokenizer_file=...), a data vocabulary "
                    f"<= {self.config.vocab_size} (data.vocab_size=...), or model.vocab_size=null "
                    "to take the tokenizer's.")
        super().apply_data_overrides(overrides)

    # -- megatron-core ---------------------------------------------------------------------
    def family_transformer_kwargs(self) -> dict[str, Any]:
        """Extra ``TransformerConfig`` fields of the family (MoE, MLA...)."""
        return {}

    def transformer_config_class(self):
        """``TransformerConfig`` or a subclass (MLA)."""
        from megatron.core.transformer.transformer_config import TransformerConfig

        return TransformerConfig

    def position_kwargs(self) -> dict[str, Any]:
        """``TransformerConfig`` fields of the position embedding (``mrope_section`` for MRoPE)."""
        c = self.config
        if c.position_embedding_type != "mrope":
            return {}
        section = list(c.mrope_section or [])
        if sum(section) != c.head_dim() // 2 or len(section) != 3:
            raise ConfigError(
                f"model.mrope_section = {section} must be 3 numbers (time, height, width) summing to "
                f"head_dim / 2 = {c.head_dim() // 2} when model.position_embedding_type=mrope.")
        return {"mrope_section": section}

    def megatron_config(self, parallel_kwargs: dict):
        from loong_core.engines.megatron.seam import spec as seam_spec

        c = self.config
        config = self.transformer_config_class()(
            num_layers=c.num_layers,
            hidden_size=c.hidden_size,
            num_attention_heads=c.num_attention_heads,
            num_query_groups=c.num_query_groups,
            kv_channels=c.kv_channels,
            ffn_hidden_size=c.resolved_ffn_hidden_size(),
            normalization="RMSNorm",
            layernorm_epsilon=c.norm_epsilon,
            gated_linear_unit=True,
            activation_func=torch.nn.functional.silu,
            add_bias_linear=False,
            add_qkv_bias=c.add_qkv_bias,
            qk_layernorm=c.qk_layernorm,
            hidden_dropout=c.hidden_dropout,
            attention_dropout=c.attention_dropout,
            init_method_std=c.init_method_std,
            use_cpu_initialization=True,
            bias_activation_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            gradient_accumulation_fusion=False,
            **seam_spec.transformer_kwargs(),
            **self.mtp_kwargs(parallel_kwargs),
            **self.family_transformer_kwargs(),
            **self.position_kwargs(),
            **parallel_kwargs,
        )
        if not config.multi_latent_attention:  # MLA takes YaRN through its own config fields
            rope.set_attention_factor(config, c.rope_scaling)
        return config

    def mtp_kwargs(self, parallel_kwargs: dict[str, Any]) -> dict[str, Any]:
        """``TransformerConfig`` fields of multi-token prediction (none when it is off).

        MTP layers an HF checkpoint brought (``model.init_from_hf``) are left out, with a
        warning, under a layout loong has not verified MTP on (PP, CP, sequence chunks; a
        config asking for MTP there is refused when it loads): the main model trains."""
        c = self.config
        layout = {"parallel.pipeline_model_parallel_size": parallel_kwargs.get("pipeline_model_parallel_size", 1),
                  "parallel.context_parallel_size": parallel_kwargs.get("context_parallel_size", 1),
                  "parallel.sequence_chunks": self.sequence_chunks}
        blocked = [f"{k} = {v}" for k, v in layout.items() if (v or 1) > 1]
        if c.mtp_num_layers and self._mtp_from_checkpoint and blocked:
            logger.warning("the %d MTP layer(s) of %s are not loaded: loong has not verified "
                           "multi-token prediction with %s; the main model trains",
                           c.mtp_num_layers, c.init_from_hf, ", ".join(blocked))
            c.mtp_num_layers = None
            self.reported_metrics = type(self).reported_metrics
        if not c.mtp_num_layers:
            return {}
        return {"mtp_num_layers": c.mtp_num_layers, "mtp_loss_scaling_factor": c.mtp_loss_scaling_factor}

    def mtp_block_spec(self, config, block_spec, vp_stage):
        """megatron-core's MTP block spec (its transformer layer is the decoder's last layer, with
        the kernel seam's modules) on the stage that holds it; None when MTP is off."""
        if not self.config.mtp_num_layers:
            return None
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec_for_backend

        from loong_core.engines.megatron.seam.spec import LoongSpecProvider, apply

        spec = get_gpt_mtp_block_spec_for_backend(config, block_spec, backend=LoongSpecProvider(),
                                                  vp_stage=vp_stage)
        return None if spec is None else apply(spec, config, vp_stage)

    def layer_spec(self, config, vp_stage):
        """megatron-core layer (or block) spec: local modules, RMSNorm, optional q/k norm."""
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        return get_gpt_layer_local_spec(normalization="RMSNorm",
                                        qk_layernorm=self.config.qk_layernorm)

    def build_megatron_model(self, config, pre_process: bool, post_process: bool, vp_stage):
        """The family's spec through the kernel seam (norm, SwiGLU, RoPE, attention, loss)."""
        from loong_core.engines.megatron.seam.gpt import SeamGPTModel
        from loong_core.engines.megatron.seam.spec import apply

        c = self.config
        block_spec = apply(self.layer_spec(config, vp_stage), config, vp_stage)
        model = SeamGPTModel(
            config=config,
            transformer_layer_spec=block_spec,
            mtp_block_spec=self.mtp_block_spec(config, block_spec, vp_stage) if post_process else None,
            vocab_size=c.padded_vocab_size(config.tensor_model_parallel_size),
            max_sequence_length=c.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=not c.untie_embeddings_and_output_weights,
            position_embedding_type=c.position_embedding_type,
            rotary_base=c.rotary_base,
            rotary_percent=c.rotary_percent,
            vp_stage=vp_stage,
        )
        rope.apply_to_model(model, c.rotary_dim(), c.rotary_base, c.rope_scaling)
        return model

    def initialize_weights(self, chunks: list[Any]) -> None:
        """Load ``model.init_from_hf`` into the chunks of this rank (random init otherwise), then
        attach LoRA adapters when ``model.lora.rank > 0`` (base weights are frozen)."""
        if self.config.init_from_hf:
            from loong_llm.hf.load import load_hf_into_chunks
            from loong_llm.hf.registry import get_adapter

            load_hf_into_chunks(get_adapter(self.family), self.config, chunks, self.config.init_from_hf)
        self.attach_adapters(chunks)

    def hf_parts(self, chunks: list[Any]):
        """The :class:`~loong_llm.hf.load.HFParts` of ``model.init_from_hf`` for ``chunks`` (the
        streaming converter fills a checkpoint from it without loading the model)."""
        from loong_llm.hf.load import HFParts
        from loong_llm.hf.registry import get_adapter

        return HFParts(get_adapter(self.family), self.config, chunks, self.config.init_from_hf)

    def attach_adapters(self, chunks: list[Any]) -> None:
        """Add the LoRA adapters of ``model.lora`` to every chunk (nothing when disabled)."""
        if not self.config.lora.enabled:
            return
        from loong_llm.lora import apply_lora

        for chunk in chunks:
            apply_lora(chunk, self.config.lora)

    def forward_step(self, model, batch: dict):
        from loong_core.engines.megatron import sequence_chunks
        from loong_core.engines.megatron.context_parallel import slice_batch
        from loong_core.kernels.segment_mask import with_attention_mask

        mtp = bool(self.config.mtp_num_layers)

        def run(local: dict):
            extra = {"loss_mask": local["loss_mask"]} if mtp else {}  # MTP masks its shifted loss
            return model(local["tokens"], local["position_ids"], local.get("attention_mask"),
                         labels=local["labels"], **extra)

        if self.sequence_chunks > 1:
            # K chunks in causal order (each laid out over the CP group), backward in reverse;
            # the loss below sums over all of them (docs/long_context.md).
            chunks = [slice_batch(c) for c in sequence_chunks.split_batch(batch, self.sequence_chunks)]
            output = sequence_chunks.run(model, chunks, run, segment_ids=batch.get("segment_ids"))
            loss_mask = torch.cat([c["loss_mask"] for c in chunks], dim=1).float()
        else:
            # segment_ids (packed samples) keep the documents apart: a SegmentMask for the seam's
            # attention (under context parallelism the ids of the whole sequence: slice_batch
            # keeps them whole, each rank's attention takes its chunks' ids from them).
            batch = with_attention_mask(batch)
            batch = slice_batch(batch)
            output = run(batch)
            loss_mask = batch["loss_mask"].float()

        def loss_func(per_token_loss):
            mask = loss_mask.reshape(-1)
            loss_sum = (per_token_loss.float().reshape(-1) * mask).sum()
            num_tokens = mask.sum().to(torch.int)
            metrics = {"loss": torch.stack([loss_sum.detach(), mask.sum()])}
            metrics.update(self.step_metrics(model))
            return loss_sum, num_tokens, metrics

        return output, loss_func

    def step_metrics(self, model) -> dict:
        """Further ``[sum, count]`` pairs reported with the loss (see ``reported_metrics``):
        ``mtp_loss`` (per token, mean over depths) when multi-token prediction is on."""
        if not self.config.mtp_num_layers:
            return {}
        from loong_core.engines.megatron.seam.gpt import SeamGPTModel

        for module in model.modules():
            if isinstance(module, SeamGPTModel) and module.mtp_last_loss is not None:
                record, module.mtp_last_loss = module.mtp_last_loss, None
                return {MTP_METRIC: record}
        return {}

    # -- accounting --------------------------------------------------------------------------
    def mlp_params_per_layer(self) -> float:
        """Matmul parameters of one layer's MLP that a token passes through."""
        return 3 * self.config.hidden_size * self.config.resolved_ffn_hidden_size()

    def attention_params_per_layer(self) -> float:
        """Matmul parameters of one layer's attention."""
        c = self.config
        q = c.num_attention_heads * c.head_dim()
        kv = (c.num_query_groups or c.num_attention_heads) * c.head_dim()
        return c.hidden_size * (q + 2 * kv) + q * c.hidden_size

    def flops_per_token(self, seq_length: int) -> float:
        """6 x parameters (matmuls) + attention scores, forward + backward (PaLM appendix B)."""
        c = self.config
        per_layer = self.attention_params_per_layer() + self.mlp_params_per_layer()
        depth = c.mtp_num_layers or 0  # each MTP layer: eh_proj, one layer, the output layer
        layers = c.num_layers + depth
        matmul_params = (layers * per_layer + (1 + depth) * (c.vocab_size or 0) * c.hidden_size
                         + depth * 2 * c.hidden_size ** 2)
        attention = 2 * layers * seq_length * c.num_attention_heads * c.head_dim()
        return 6.0 * matmul_params + 6.0 * attention
