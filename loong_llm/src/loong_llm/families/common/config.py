"""Config base of every decoder-only family (light: no torch import)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from loong_core.config.rules import at_most, bounded, divisible, non_negative, positive, probability
from loong_core.config.schema import ModelConfig
from loong_core.errors import ConfigError
from loong_llm.lora import LoraConfig


@dataclass
class RopeScalingConfig:
    """RoPE frequency scaling, with Hugging Face's ``rope_parameters`` names.

    Attributes:
        rope_type: ``default`` (none), ``llama3`` (Llama 3.1 long-context scaling) or ``yarn``
            (YaRN: DeepSeek-V3, Qwen3 long-context checkpoints).
        factor: Scaling factor (``llama3``, ``yarn``).
        low_freq_factor: Wavelengths above ``original_max_position_embeddings / low_freq_factor``
            are divided by ``factor``.
        high_freq_factor: Wavelengths below ``original_max_position_embeddings / high_freq_factor``
            are kept; those between are interpolated.
        original_max_position_embeddings: Context length of pre-training before scaling.
        beta_fast: ``yarn``: rotations above which a frequency is kept (None: HF default 32).
        beta_slow: ``yarn``: rotations below which a frequency is divided by ``factor``
            (None: HF default 1).
        mscale: ``yarn``: numerator coefficient of the attention factor (with ``mscale_all_dim``).
        mscale_all_dim: ``yarn``: denominator coefficient of the attention factor; MLA also
            multiplies its softmax scale by ``(0.1 * mscale_all_dim * ln(factor) + 1)^2``.
        attention_factor: ``yarn``: scale of cos and sin (None: derived from ``factor`` and the
            mscales as transformers does).
        truncate: ``yarn``: round the correction range to whole dimensions (None: true).
    """

    rope_type: Literal["default", "llama3", "yarn"] = "default"
    factor: float = positive(8.0)
    low_freq_factor: float = positive(1.0)
    high_freq_factor: float = positive(4.0)
    original_max_position_embeddings: int = positive(8192)
    beta_fast: Optional[float] = None
    beta_slow: Optional[float] = None
    mscale: Optional[float] = None
    mscale_all_dim: Optional[float] = None
    attention_factor: Optional[float] = positive(None)
    truncate: Optional[bool] = None


@dataclass
class DecoderConfig(ModelConfig):
    """Decoder-only transformer (Megatron argument names) shared by Llama, Qwen and DeepSeek.

    Attributes:
        num_layers: Transformer layers.
        hidden_size: Model width.
        num_attention_heads: Query heads.
        num_query_groups: Key/value heads (grouped-query attention); None means one per head.
        kv_channels: Head dimension; None means ``hidden_size / num_attention_heads``.
        ffn_hidden_size: SwiGLU inner width; None means ``8/3 * hidden`` rounded up to 64.
        vocab_size: Tokenizer vocabulary; None takes it from the dataset.
        make_vocab_size_divisible_by: Pad the embedding rows to a multiple of this (x TP).
        max_position_embeddings: Longest sequence.
        rotary_base: RoPE base frequency (HF ``rope_theta``).
        rope_scaling: RoPE frequency scaling (Llama 3.1).
        rotary_percent: Fraction of each head's channels that RoPE rotates (the first ones; the
            rest pass through): HF ``partial_rotary_factor`` (GLM-4.5: 0.5) or ``rotary_dim /
            head_dim`` (MiniMax-M2).
        norm_epsilon: RMSNorm epsilon.
        init_method_std: Std of the normal initialisation.
        hidden_dropout: Dropout after attention / MLP.
        attention_dropout: Dropout on attention probabilities.
        untie_embeddings_and_output_weights: Separate output projection (Llama 2/3 8B+).
        add_qkv_bias: Bias on the query/key/value projection (Qwen2).
        qk_layernorm: RMSNorm over each query/key head before RoPE (Qwen3).
        position_embedding_type: ``rope`` (1D positions ``[b, s]``) or ``mrope`` (multimodal RoPE
            of Qwen2-VL / 2.5-VL: position ids ``[b, 3, s]`` for time, height and width).
        mrope_section: With ``mrope``: rotary frequency pairs given to time, height and width
            (sums to ``head_dim / 2``; Qwen2.5-VL uses ``[16, 24, 24]``).
        mtp_num_layers: Multi-token prediction depth (DeepSeek-V3, GLM-4.5; HF
            ``num_nextn_predict_layers``): megatron-core's MTP block after the decoder, layer
            ``k`` predicting token ``i + 1 + k`` from the previous depth and the embedding of token
            ``i + k``; None: off.
        mtp_loss_scaling_factor: Weight of the MTP loss (mean over depths) added to the LM loss
            in the gradient; the logged ``loss`` stays the LM loss, ``mtp_loss`` is logged apart.
        init_from_hf: Hugging Face model directory (config.json + safetensors) whose weights
            initialise the model at the start of the run; its architecture fields override
            these (checked against the registered family).
    """

    num_layers: int = positive(4)
    hidden_size: int = positive(256)
    num_attention_heads: int = positive(4)
    num_query_groups: Optional[int] = positive(None)
    kv_channels: Optional[int] = positive(None)
    ffn_hidden_size: Optional[int] = positive(None)
    vocab_size: Optional[int] = positive(None)
    make_vocab_size_divisible_by: int = positive(128)
    max_position_embeddings: int = positive(2048)
    rotary_base: float = positive(10000.0)
    rope_scaling: RopeScalingConfig = field(default_factory=RopeScalingConfig)
    rotary_percent: float = bounded(1.0, gt=0, le=1)
    norm_epsilon: float = positive(1.0e-5)
    init_method_std: float = positive(0.02)
    hidden_dropout: float = probability(0.0)
    attention_dropout: float = probability(0.0)
    untie_embeddings_and_output_weights: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    position_embedding_type: Literal["rope", "mrope"] = "rope"
    mrope_section: Optional[list[int]] = None
    mtp_num_layers: Optional[int] = positive(None)
    mtp_loss_scaling_factor: float = non_negative(0.1)
    init_from_hf: Optional[str] = None
    lora: LoraConfig = field(default_factory=LoraConfig)

    def check(self, run, path: str) -> None:
        """Heads, query groups, widths and layers against TP / PP / VPP; sequence length against
        positions (see :meth:`loong_core.config.schema.ModelConfig.check`)."""
        p = run.parallel
        tp_key, pp_key = "parallel.tensor_model_parallel_size", "parallel.pipeline_model_parallel_size"
        heads_key = f"{path}.num_attention_heads"
        if self.kv_channels is None:
            divisible(self.hidden_size, f"{path}.hidden_size", self.num_attention_heads, heads_key,
                      "the head dimension is hidden_size / num_attention_heads unless kv_channels is set")
        if self.num_query_groups is not None:
            divisible(self.num_attention_heads, heads_key, self.num_query_groups,
                      f"{path}.num_query_groups", "each key/value head serves as many query heads")
            divisible(self.num_query_groups, f"{path}.num_query_groups", p.tensor_model_parallel_size,
                      tp_key, "key/value heads are split over tensor-parallel ranks")
        divisible(self.num_attention_heads, heads_key, p.tensor_model_parallel_size, tp_key,
                  "attention heads are split over tensor-parallel ranks")
        divisible(self.resolved_ffn_hidden_size(), f"{path}.ffn_hidden_size",
                  p.tensor_model_parallel_size, tp_key, "the MLP is split over tensor-parallel ranks")
        divisible(self.num_layers, f"{path}.num_layers", p.pipeline_model_parallel_size, pp_key,
                  "each pipeline stage holds the same number of layers")
        vpp = p.virtual_pipeline_model_parallel_size
        if vpp:
            divisible(self.num_layers // p.pipeline_model_parallel_size,
                      f"{path}.num_layers / {pp_key}", vpp,
                      "parallel.virtual_pipeline_model_parallel_size",
                      "each stage's layers are split into that many model chunks")
        at_most(run.data.seq_length, "data.seq_length", self.max_position_embeddings,
                f"{path}.max_position_embeddings", "positions beyond it have no rotary embedding")
        if p.sequence_parallel:
            divisible(run.data.seq_length, "data.seq_length", p.tensor_model_parallel_size, tp_key,
                      "sequence parallelism splits the sequence over tensor-parallel ranks")
        if self.rotary_percent <= 0 or int(self.head_dim() * self.rotary_percent) % 2:
            raise ConfigError(
                f"'{path}.rotary_percent' = {self.rotary_percent} must rotate an even, positive "
                f"number of the {self.head_dim()} channels of a head (head_dim * rotary_percent = "
                f"{self.head_dim() * self.rotary_percent:g}).")
        if self.mtp_num_layers:
            self._check_mtp(run, path)
        if self.position_embedding_type == "mrope" and self.mrope_section is not None:
            if sum(self.mrope_section) != self.head_dim() // 2:
                raise ConfigError(
                    f"'{path}.mrope_section' = {self.mrope_section} must sum to head_dim / 2 = "
                    f"{self.head_dim() // 2}.")

    def _check_mtp(self, run, path: str) -> None:
        """Multi-token prediction runs on the megatron engine, without PP / CP / sequence chunks."""
        p = run.parallel
        key = f"'{path}.mtp_num_layers' = {self.mtp_num_layers}"
        if p.engine != "megatron":
            raise ConfigError(f"{key} needs parallel.engine=megatron (megatron-core's MTP block); "
                              f"or set {path}.mtp_num_layers=null.")
        blockers = {"parallel.pipeline_model_parallel_size": p.pipeline_model_parallel_size,
                    "parallel.context_parallel_size": p.context_parallel_size,
                    "parallel.sequence_chunks": p.sequence_chunks}
        for name, value in blockers.items():
            if value > 1:
                raise ConfigError(
                    f"{key} with {name} = {value}: loong has not verified megatron-core's MTP "
                    f"there (PP: the last stage's copy of the embedding; CP and sequence chunks: "
                    f"the token shift across chunk borders); set {name}=1 or "
                    f"{path}.mtp_num_layers=null.")

    def resolved_ffn_hidden_size(self) -> int:
        """The SwiGLU width actually used."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        return ((8 * self.hidden_size // 3) + 63) // 64 * 64

    def head_dim(self) -> int:
        """Per-head width of queries, keys and values."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    def rotary_dim(self) -> int:
        """Channels of a head that RoPE rotates (``head_dim * rotary_percent``)."""
        return int(self.head_dim() * self.rotary_percent)

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        """Embedding rows: ``vocab_size`` rounded up to a multiple of ``make_vocab_size_divisible_by``
        and of the TP size, so that checkpoints keep their shapes when TP changes (TP <= 128)."""
        if self.vocab_size is None:
            raise ValueError("model.vocab_size is unknown: set it or use a dataset that provides it")
        multiple = math.lcm(self.make_vocab_size_divisible_by, tensor_parallel)
        return (self.vocab_size + multiple - 1) // multiple * multiple


@dataclass
class MoEDecoderConfig(DecoderConfig):
    """A decoder whose MLPs are (partly) mixtures of experts (megatron-core MoE names).

    Attributes:
        num_experts: Routed experts per MoE layer.
        moe_router_topk: Experts per token.
        moe_ffn_hidden_size: Inner width of each routed expert.
        moe_shared_expert_intermediate_size: Inner width of the always-on shared expert(s)
            (0: none).
        moe_layer_freq: Which layers are MoE: an int ``k`` (every k-th layer) or a 0/1 list per layer.
        moe_router_score_function: ``softmax`` (Qwen3-MoE) or ``sigmoid`` (DeepSeek-V3).
        moe_router_pre_softmax: Softmax over all experts before top-k (weights not renormalised);
            False renormalises the top-k weights.
        moe_router_topk_scaling_factor: Multiply the routing weights by this (DeepSeek-V3 2.5).
        moe_router_num_groups: Expert groups for group-limited routing (None: off).
        moe_router_group_topk: Groups each token may route to.
        moe_router_enable_expert_bias: Aux-loss-free balancing bias added to scores for selection.
        moe_router_bias_update_rate: Step of the expert-bias update.
        moe_router_load_balancing_type: ``aux_loss``, ``seq_aux_loss`` or ``none``.
        moe_aux_loss_coeff: Weight of the load-balancing loss.
        moe_token_dispatcher_type: megatron-core dispatcher: ``alltoall`` or ``allgather``.
        moe_grouped_gemm: Routed experts as grouped matrix products (loong's
            :class:`~loong_llm.families.common.grouped_experts.GroupedExperts`: two GEMMs per
            layer over all experts) instead of megatron-core's ``SequentialMLP`` (a module per
            expert); ``auto`` takes the grouped experts wherever the model's options allow them.
            Same numbers and checkpoints either way (Megatron's ``--moe-grouped-gemm``).
        moe_shared_expert_overlap: Run the shared expert on a side CUDA stream while the
            alltoall dispatcher exchanges the routed tokens (Megatron's
            ``--moe-shared-expert-overlap``); needs a shared expert and the alltoall dispatcher.
            megatron-core implements it with CUDA streams only, so other devices run the shared
            expert in order and log that they turned it off (docs/llm_families.md).
    """

    num_experts: int = positive(4)
    moe_router_topk: int = positive(2)
    moe_ffn_hidden_size: Optional[int] = positive(None)
    moe_shared_expert_intermediate_size: int = non_negative(0)
    moe_layer_freq: Union[int, list[int]] = 1
    moe_router_score_function: str = "softmax"
    moe_router_pre_softmax: bool = False
    moe_router_topk_scaling_factor: Optional[float] = positive(None)
    moe_router_num_groups: Optional[int] = positive(None)
    moe_router_group_topk: Optional[int] = positive(None)
    moe_router_enable_expert_bias: bool = False
    moe_router_bias_update_rate: float = non_negative(1.0e-3)
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = non_negative(1.0e-3)
    moe_token_dispatcher_type: str = "alltoall"
    moe_grouped_gemm: Union[bool, Literal["auto"]] = "auto"
    moe_shared_expert_overlap: bool = False

    def check(self, run, path: str) -> None:
        """Dense rules plus experts against EP and the router's top-k."""
        super().check(run, path)
        divisible(self.num_experts, f"{path}.num_experts", run.parallel.expert_model_parallel_size,
                  "parallel.expert_model_parallel_size", "experts are split over expert-parallel ranks")
        at_most(self.moe_router_topk, f"{path}.moe_router_topk", self.num_experts,
                f"{path}.num_experts", "a token picks distinct experts")
        if self.moe_router_num_groups is not None:
            divisible(self.num_experts, f"{path}.num_experts", self.moe_router_num_groups,
                      f"{path}.moe_router_num_groups", "experts are split into equal groups")
            if self.moe_router_group_topk is not None:
                at_most(self.moe_router_group_topk, f"{path}.moe_router_group_topk",
                        self.moe_router_num_groups, f"{path}.moe_router_num_groups")
        if isinstance(self.moe_layer_freq, list) and len(self.moe_layer_freq) != self.num_layers:
            raise ConfigError(
                f"'{path}.moe_layer_freq' has {len(self.moe_layer_freq)} entries; it needs one per "
                f"layer ({path}.num_layers = {self.num_layers}), or an int k for every k-th layer.")
        if isinstance(self.moe_layer_freq, int) and self.moe_layer_freq < 1:
            raise ConfigError(f"'{path}.moe_layer_freq' = {self.moe_layer_freq} must be >= 1.")
        if self.moe_shared_expert_overlap:
            self._check_shared_expert_overlap(run, path)
        # megatron-core's MoELayer.forward raises a ValueError when it trains under TP without SP.
        p = run.parallel
        has_moe_layer = isinstance(self.moe_layer_freq, int) or any(self.moe_layer_freq)
        if p.engine == "megatron" and p.tensor_model_parallel_size > 1 and not p.sequence_parallel \
                and has_moe_layer:
            raise ConfigError(
                "'parallel.sequence_parallel' = false with parallel.tensor_model_parallel_size = "
                f"{p.tensor_model_parallel_size}: megatron-core does not train the MoE layers of "
                f"model '{self.name}' under tensor parallelism without sequence parallelism; set "
                "parallel.sequence_parallel=true, or parallel.tensor_model_parallel_size=1.")

    def _check_shared_expert_overlap(self, run, path: str) -> None:
        """``moe_shared_expert_overlap``: a shared expert to overlap, the dispatcher that does it,
        and no recompute of the shared expert (megatron-core's own rules, named here)."""
        key = f"'{path}.moe_shared_expert_overlap' = true"
        if not self.moe_shared_expert_intermediate_size:
            raise ConfigError(f"{key} needs a shared expert ({path}.moe_shared_expert_intermediate_size > 0); "
                              f"set {path}.moe_shared_expert_overlap=false.")
        if self.moe_token_dispatcher_type != "alltoall":
            raise ConfigError(f"{key} works with the alltoall dispatcher only; set "
                              f"{path}.moe_token_dispatcher_type=alltoall or {path}.moe_shared_expert_overlap=false.")
        modules = run.parallel.recompute_modules or []
        if run.parallel.recompute_granularity == "selective" and "shared_experts" in modules:
            raise ConfigError(f"{key} cannot recompute the shared expert: drop shared_experts from "
                              f"parallel.recompute_modules or set {path}.moe_shared_expert_overlap=false.")
