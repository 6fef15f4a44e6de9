"""The MiniMax-M2 family: the shared MoE provider with whole-projection q/k RMSNorms."""

from __future__ import annotations

from loong_llm.families.common.moe import MoEProvider
from loong_llm.families.minimax_m2.config import MiniMaxM2Config


class MiniMaxM2Provider(MoEProvider):
    """MiniMax-M2 on megatron-core: ``linear_qkv`` without bias, ``q_layernorm`` / ``k_layernorm``
    = :class:`~loong_llm.families.minimax_m2.projection_norm.ProjectionRMSNorm` (over all heads,
    TP-sharded by heads), RoPE over ``rotary_percent`` of each head, MoE in every layer with a
    sigmoid ``mlp.router`` carrying ``expert_bias`` (updated from the per-step token counts)."""

    family = "minimax_m2"
    config: MiniMaxM2Config

    def megatron_config(self, parallel_kwargs: dict):
        """The MoE config with megatron-core's ``qk_layernorm`` off: the projection norms come from
        :meth:`layer_spec` instead. With it on, megatron-core's ``finalize_model_grads`` would sum
        every ``q_layernorm`` / ``k_layernorm`` gradient over the TP group (right for its replicated
        per-head norms), adding up the different heads' slices of these TP-sharded weights
        (measured: the TP2 loss curve drifted 2.7e-5 from one rank in 5 steps)."""
        config = super().megatron_config(parallel_kwargs)
        config.qk_layernorm = False
        return config

    def layer_spec(self, config, vp_stage):
        """The MoE block spec with the projection norms in place of megatron-core's per-head ones."""
        from megatron.core.transformer.spec_utils import ModuleSpec

        from loong_llm.families.minimax_m2.projection_norm import KEY, QUERY, ProjectionRMSNorm

        spec = super().layer_spec(config, vp_stage)
        if not self.config.qk_layernorm:
            return spec
        for layer in spec.layer_specs:
            attention = layer.submodules.self_attention.submodules
            attention.q_layernorm = ModuleSpec(module=ProjectionRMSNorm, params={"projection": QUERY})
            attention.k_layernorm = ModuleSpec(module=ProjectionRMSNorm, params={"projection": KEY})
        return spec
