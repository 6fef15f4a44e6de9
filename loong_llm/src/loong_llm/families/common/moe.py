"""Mixture-of-experts support shared by the MoE families: megatron-core MoE config, block spec,
per-step router statistics and the HF expert mapping."""

from __future__ import annotations

import logging
from typing import Any

from loong_core.errors import ConfigError
from loong_llm.families.common.provider import DecoderProvider
from loong_llm.hf.mapping import Rule

logger = logging.getLogger(__name__)

ROUTER_METRICS = ("moe_imbalance", "moe_min_load")


class RouterStats:
    """Counts the tokens each router of a model chunk sends to each expert.

    A forward hook on every ``TopKRouter`` records ``routing_map.sum(0)``; :meth:`pop` turns the
    counts of one micro batch into ``[sum, count]`` pairs averaged over layers:
    ``moe_imbalance`` = max / mean tokens per expert (1.0 is perfectly balanced) and
    ``moe_min_load`` = min / mean. Only the layers of the rank that computes the loss (the last
    pipeline stage) are counted.
    """

    def __init__(self):
        self.counts: list = []

    def attach(self, model) -> None:
        """Hook every router of ``model``."""
        from megatron.core.transformer.moe.router import TopKRouter

        for module in model.modules():
            if isinstance(module, TopKRouter):
                module.register_forward_hook(self._hook)

    def _hook(self, module, inputs, output) -> None:
        _, routing_map = output
        self.counts.append(routing_map.detach().sum(dim=0).float())

    def pop(self) -> dict:
        """The statistics of the micro batch just run (and forget its counts)."""
        import torch

        counts, self.counts = self.counts, []
        if not counts:
            return {}
        stacked = torch.stack(counts)  # [layers, experts]
        mean = stacked.mean(dim=1).clamp_min(1e-9)
        n = float(len(counts))
        return {
            "moe_imbalance": torch.stack([(stacked.max(dim=1).values / mean).sum(), torch.tensor(n)]),
            "moe_min_load": torch.stack([(stacked.min(dim=1).values / mean).sum(), torch.tensor(n)]),
        }


class MoEProvider(DecoderProvider):
    """A decoder whose MLPs are megatron-core MoE layers (top-k router, alltoall/allgather token
    dispatcher, expert parallel via ``parallel.expert_model_parallel_size``) whose routed experts
    are loong's grouped experts or megatron-core's ``SequentialMLP`` (``model.moe_grouped_gemm``)."""

    reported_metrics = ("loss", *ROUTER_METRICS)

    def __init__(self, config):
        super().__init__(config)
        self._router_stats: dict[int, RouterStats] = {}

    def family_transformer_kwargs(self) -> dict[str, Any]:
        c = self.config
        return dict(
            num_moe_experts=c.num_experts,
            moe_router_topk=c.moe_router_topk,
            moe_ffn_hidden_size=c.moe_ffn_hidden_size or c.resolved_ffn_hidden_size(),
            moe_shared_expert_intermediate_size=c.moe_shared_expert_intermediate_size or None,
            moe_layer_freq=c.moe_layer_freq,
            moe_router_score_function=c.moe_router_score_function,
            moe_router_pre_softmax=c.moe_router_pre_softmax,
            moe_router_topk_scaling_factor=c.moe_router_topk_scaling_factor,
            moe_router_num_groups=c.moe_router_num_groups,
            moe_router_group_topk=c.moe_router_group_topk,
            moe_router_enable_expert_bias=c.moe_router_enable_expert_bias,
            moe_router_bias_update_rate=c.moe_router_bias_update_rate,
            moe_router_load_balancing_type=c.moe_router_load_balancing_type,
            moe_aux_loss_coeff=c.moe_aux_loss_coeff,
            moe_token_dispatcher_type=c.moe_token_dispatcher_type,
            moe_shared_expert_overlap=c.moe_shared_expert_overlap,
            # megatron-core's grouped classes need TransformerEngine or the CUDA grouped_gemm
            # package; loong's grouped experts come in through layer_spec instead.
            moe_grouped_gemm=False,
        )

    def grouped_experts(self, config) -> bool:
        """Whether the routed experts are loong's grouped experts (``model.moe_grouped_gemm``;
        ``auto``: wherever the options allow them)."""
        from loong_llm.families.common.grouped_experts import unsupported_reason

        choice = self.config.moe_grouped_gemm
        reason = unsupported_reason(config)
        if choice is True and reason is not None:
            raise ConfigError(f"model.moe_grouped_gemm=true: loong's grouped experts do not support "
                              f"{reason}; set model.moe_grouped_gemm=false (or auto).")
        if choice == "auto" and reason is not None:
            logger.info("model.moe_grouped_gemm=auto: SequentialMLP experts (%s)", reason)
        return choice is True or (choice == "auto" and reason is None)

    def megatron_config(self, parallel_kwargs: dict):
        config = super().megatron_config(parallel_kwargs)
        # Ranks the router's tokens are split over: CP, and TP with sequence parallelism.
        split = config.context_parallel_size * (
            config.tensor_model_parallel_size if config.sequence_parallel else 1)
        if split > 1 and config.moe_router_load_balancing_type == "aux_loss" and config.moe_aux_loss_coeff:
            # With calculate_per_token_loss megatron-core scales each rank's share of the
            # load-balancing loss by that rank's token count, which under context parallelism
            # (and TP with sequence parallelism) is 1/split of the sequence: its gradient would be
            # 1/split of the one-rank run's (measured: CP2 x EP2 and TP2 (SP) each drifted 7e-5
            # from one rank in 5 steps, 4e-7 without the aux loss). The coefficient compensates;
            # the logged loss is divided by it, so it does not change.
            config.moe_aux_loss_coeff = config.moe_aux_loss_coeff * split
        if self.sequence_chunks > 1 and config.moe_aux_loss_coeff:
            # The router sees one chunk at a time, so the load-balancing loss is the sum of the
            # chunks' own (token statistics of a chunk, not of the sequence): a slightly different
            # objective (qwen3_moe_debug, K=2: 4e-5 loss drift in 3 steps; equal without it).
            logger.warning("parallel.sequence_chunks=%d: the MoE load-balancing loss is computed "
                           "per chunk (moe_aux_loss_coeff=%g), not over the whole sequence; the "
                           "language-model loss term is the unchunked one.",
                           self.sequence_chunks, config.moe_aux_loss_coeff)
        return config

    def layer_spec(self, config, vp_stage):
        """Block spec: dense or MoE layers by ``moe_layer_freq``, local modules, the routed
        experts grouped when :meth:`grouped_experts` says so."""
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                          normalization="RMSNorm", vp_stage=vp_stage)
        if self.grouped_experts(config):
            from loong_llm.families.common.grouped_experts import GroupedExperts, replace_sequential_experts

            replace_sequential_experts(spec, GroupedExperts)
        return spec

    def build_megatron_model(self, config, pre_process, post_process, vp_stage):
        from loong_llm.families.common import expert_chunks

        expert_chunks.install()  # no identity reordering of the dispatched tokens
        model = super().build_megatron_model(config, pre_process, post_process, vp_stage)
        stats = RouterStats()
        stats.attach(model)
        self._router_stats[id(model)] = stats
        return model

    def step_metrics(self, model) -> dict:
        inner = model
        while id(inner) not in self._router_stats and hasattr(inner, "module"):
            inner = inner.module
        stats = self._router_stats.get(id(inner))
        return {**super().step_metrics(model), **(stats.pop() if stats is not None else {})}

    def mlp_params_per_layer(self) -> float:
        c = self.config
        expert = c.moe_ffn_hidden_size or c.resolved_ffn_hidden_size()
        active = c.moe_router_topk * expert + (c.moe_shared_expert_intermediate_size or 0)
        return 3 * c.hidden_size * active + c.hidden_size * c.num_experts


def moe_layer_pattern(config) -> list[int]:
    """1 for an MoE layer, 0 for a dense one, per layer (from ``moe_layer_freq``)."""
    freq = config.moe_layer_freq
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(config.num_layers)]
    return list(freq)


def expert_rules(hf_mlp: str = "model.layers.{i}.mlp.") -> list[Rule]:
    """Router and routed experts in HF's per-expert layout (``experts.E.{gate,up,down}_proj``)."""
    lm = "decoder.layers.{i}.mlp."
    ex = lm + "experts.local_experts.{e}."
    hx = hf_mlp + "experts.{e}."
    return [
        Rule(lm + "router.weight", (hf_mlp + "gate.weight",)),
        Rule(ex + "linear_fc1.weight", (hx + "gate_proj.weight", hx + "up_proj.weight"), "gate_up"),
        Rule(ex + "linear_fc2.weight", (hx + "down_proj.weight",)),
    ]


def deepseek_moe_from_hf(hf: dict) -> dict:
    """MoE fields of a DeepSeek-V3-style HF config (DeepSeek-V3/V3.2, GLM-4.5): ``n_routed_experts``
    with ``moe_intermediate_size`` each, ``n_shared_experts`` of that width, dense layers before
    ``first_k_dense_replace``, ``routed_scaling_factor`` and group-limited routing."""
    layers, dense = hf["num_hidden_layers"], hf.get("first_k_dense_replace", 0) or 0
    return dict(
        num_experts=hf["n_routed_experts"], moe_router_topk=hf["num_experts_per_tok"],
        moe_ffn_hidden_size=hf["moe_intermediate_size"],
        moe_shared_expert_intermediate_size=(hf.get("n_shared_experts") or 0) * hf["moe_intermediate_size"],
        moe_layer_freq=[0 if i < dense else 1 for i in range(layers)],
        moe_router_topk_scaling_factor=hf.get("routed_scaling_factor", 1.0),
        moe_router_num_groups=hf.get("n_group"), moe_router_group_topk=hf.get("topk_group"),
    )


def deepseek_moe_to_hf(cfg) -> dict:
    """The inverse of :func:`deepseek_moe_from_hf`."""
    pattern = moe_layer_pattern(cfg)
    expert = cfg.moe_ffn_hidden_size or cfg.resolved_ffn_hidden_size()
    return dict(
        moe_intermediate_size=expert, n_routed_experts=cfg.num_experts,
        num_experts_per_tok=cfg.moe_router_topk,
        n_shared_experts=cfg.moe_shared_expert_intermediate_size // expert,
        first_k_dense_replace=pattern.index(1) if 1 in pattern else cfg.num_layers,
        routed_scaling_factor=cfg.moe_router_topk_scaling_factor or 1.0,
        n_group=cfg.moe_router_num_groups or 1, topk_group=cfg.moe_router_group_topk or 1,
        norm_topk_prob=True,
    )


def deepseek_moe_rules() -> list[Rule]:
    """Routed experts, router with its ``e_score_correction_bias`` and ``mlp.shared_experts`` of
    a DeepSeek-V3-style HF layer (the dense first layers keep the dense MLP rules)."""
    m, hm = "decoder.layers.{i}.mlp.", "model.layers.{i}.mlp."
    return [
        *expert_rules(),
        Rule(m + "router.expert_bias", (hm + "gate.e_score_correction_bias",)),
        Rule(m + "shared_experts.linear_fc1.weight",
             (hm + "shared_experts.gate_proj.weight", hm + "shared_experts.up_proj.weight"), "gate_up"),
        Rule(m + "shared_experts.linear_fc2.weight", (hm + "shared_experts.down_proj.weight",)),
    ]
