"""Heterogeneous parallelism: the vision encoder's own tensor-parallel size, data layout and recompute.

The foundation's tensor-parallel (TP) group of ``t`` ranks is cut into ``t / e`` *blocks* of ``e``
consecutive ranks (``e = model.encoder.tensor_model_parallel_size``, a divisor of ``t``); each block
is one TP group of the encoder and holds one replica of it. The ranks at the same position of every
block form the encoder's *replica group* (``t / e`` ranks holding the same encoder shard).

``model.encoder.data_layout`` says what the replicas compute (``docs/vlm_parallelism.md``):

- ``replicate``: every block encodes all images of the micro batch. The gradient that reaches the
  features is the same on every foundation-TP rank, so the replicas get equal gradients and stay
  equal without any extra communication.
- ``shard``: block ``i`` encodes the ``i``-th share of the images; the features are all-gathered
  over the replica group (:mod:`loong_vlm.encoder_sharding`) and the encoder's gradients summed
  over it.

Any encoder whose megatron-core layers are built through
:func:`~loong_vlm.encoders.spec.encoder_transformer_config` gets this: :func:`build_encoder` builds
it while megatron-core's TP state names the encoder's group.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any

import torch

from loong_core.errors import ConfigError

#: Values of ``model.encoder.data_layout``.
DATA_LAYOUTS = ("replicate", "shard")


@dataclass(frozen=True)
class EncoderParallelPlan:
    """Where the encoder's shards and replicas live on this rank.

    Attributes:
        foundation_tp: The foundation's tensor-parallel size ``t``.
        encoder_tp: The encoder's tensor-parallel size ``e`` (divides ``t``).
        data_layout: ``replicate`` or ``shard``.
        tp_group: The encoder's TP group (None: the foundation's, ``e == t``).
        replica_group: The ranks holding the same encoder shard (None when ``e == t``).
        replica_index: This rank's block (0 holds the main replica: it counts the encoder in the
            gradient norm and saves it).
        share_index: This rank's position in ``replica_group`` (its share of images in ``shard``).
        replica_source: Global rank of block 0's member of ``replica_group`` (the replicas start
            from its weights).
    """

    foundation_tp: int
    encoder_tp: int
    data_layout: str = "replicate"
    tp_group: Any = None
    replica_group: Any = None
    replica_index: int = 0
    share_index: int = 0
    replica_source: int = 0

    @property
    def replicas(self) -> int:
        """Encoder replicas per foundation TP group (``t / e``)."""
        return self.foundation_tp // self.encoder_tp

    @property
    def heterogeneous(self) -> bool:
        """The encoder's TP group is narrower than the foundation's."""
        return self.replicas > 1


def encoder_tensor_parallel_size(cfg, foundation_tp: int) -> int:
    """The encoder's TP size (``model.encoder.tensor_model_parallel_size``, null: the foundation's).

    Raises:
        ConfigError: The size does not divide the foundation's, or the encoder's heads do not
            divide by it.
    """
    size = getattr(cfg, "tensor_model_parallel_size", None)
    if size is None:
        size = foundation_tp
    elif size < 1 or foundation_tp % size:
        divisors = [d for d in range(1, foundation_tp + 1) if foundation_tp % d == 0]
        raise ConfigError(
            f"model.encoder.tensor_model_parallel_size={size} must divide the foundation's "
            f"parallel.tensor_model_parallel_size={foundation_tp}; choose one of {divisors} or null "
            f"(the foundation's).")
    heads = getattr(cfg, "num_attention_heads", None)
    if heads is not None and heads % size:
        raise ConfigError(
            f"model.encoder.num_attention_heads ({heads}) must be divisible by the encoder's "
            f"tensor-parallel size ({size}); set model.encoder.tensor_model_parallel_size to a divisor "
            f"of {heads} that divides parallel.tensor_model_parallel_size={foundation_tp}.")
    return size


def check_data_layout(cfg, foundation_tp: int) -> str:
    """``model.encoder.data_layout``, checked against the encoder's other settings."""
    layout = getattr(cfg, "data_layout", "replicate")
    if layout not in DATA_LAYOUTS:
        raise ConfigError(f"model.encoder.data_layout={layout!r} is not one of {', '.join(DATA_LAYOUTS)}.")
    narrower = encoder_tensor_parallel_size(cfg, foundation_tp) < foundation_tp
    if narrower and layout == "replicate" and getattr(cfg, "attention_dropout", 0.0) > 0:
        raise ConfigError(
            "model.encoder.attention_dropout > 0 with data_layout=replicate and an encoder TP narrower "
            "than the foundation's: megatron-core draws attention dropout per TP rank, so the "
            "replicas would drift apart; set model.encoder.data_layout=shard or attention_dropout=0.")
    if narrower and layout == "shard" and getattr(cfg, "dynamic_resolution", False):
        raise ConfigError(
            "model.encoder.data_layout=shard splits a batch of fixed-size images; this encoder takes "
            "dynamic-resolution patches: use model.encoder.data_layout=replicate.")
    return layout


def recompute_fields(cfg) -> dict:
    """``TransformerConfig`` recompute fields of the encoder (independent of the foundation's)."""
    granularity = getattr(cfg, "recompute_granularity", None)
    if granularity is None:
        return {}
    if granularity == "selective":
        return {"recompute_granularity": "selective"}
    if granularity != "full":
        raise ConfigError(f"model.encoder.recompute_granularity={granularity!r} is not one of null, full, selective.")
    layers = getattr(cfg, "recompute_num_layers", None) or 1
    method = getattr(cfg, "recompute_method", None) or "uniform"
    if not 1 <= layers <= cfg.num_layers:
        raise ConfigError(f"model.encoder.recompute_num_layers={layers} must be in 1..{cfg.num_layers} "
                          f"(model.encoder.num_layers).")
    return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": layers}


def plan_encoder_parallel(cfg, parallel_kwargs: dict) -> EncoderParallelPlan:
    """Check the encoder's parallel settings and create its process groups (collective: every rank
    calls it in the same order when the encoder is narrower than the foundation)."""
    foundation_tp = parallel_kwargs.get("tensor_model_parallel_size", 1)
    encoder_tp = encoder_tensor_parallel_size(cfg, foundation_tp)
    layout = check_data_layout(cfg, foundation_tp)
    if encoder_tp == foundation_tp:
        return EncoderParallelPlan(foundation_tp, encoder_tp, layout)
    tp_group, replica_group, replica_index, replica_source = _split_tensor_parallel_group(encoder_tp)
    return EncoderParallelPlan(foundation_tp, encoder_tp, layout, tp_group, replica_group, replica_index,
                               torch.distributed.get_rank(replica_group), replica_source)


def _split_tensor_parallel_group(encoder_tp: int):
    """This rank's encoder TP group (a block of consecutive foundation-TP ranks), replica group,
    block index and block 0's member of its replica group."""
    from megatron.core import parallel_state as ps

    dist = torch.distributed
    mine = dist.get_process_group_ranks(ps.get_tensor_model_parallel_group())  # in TP-rank order
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    tp_groups = sorted({tuple(ranks) for ranks in everyone})
    blocks = [list(g[i:i + encoder_tp]) for g in tp_groups for i in range(0, len(g), encoder_tp)]
    replicas = [list(g[j::encoder_tp]) for g in tp_groups for j in range(encoder_tp)]
    tp_group, _ = dist.new_subgroups_by_enumeration(blocks)
    replica_group, _ = dist.new_subgroups_by_enumeration(replicas)
    position = mine.index(dist.get_rank())
    return tp_group, replica_group, position // encoder_tp, mine[position % encoder_tp]


@contextlib.contextmanager
def encoder_tensor_parallel_state(plan: EncoderParallelPlan):
    """Within the block, megatron-core's tensor-parallel state is the encoder's: layers built here
    keep the encoder's TP group (megatron-core modules capture their group when built)."""
    from megatron.core import parallel_state as ps

    if not plan.heterogeneous:
        yield
        return
    names = ("_TENSOR_MODEL_PARALLEL_GROUP", "_TENSOR_MODEL_PARALLEL_GLOBAL_RANKS",
             "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK")
    saved = {name: getattr(ps, name) for name in names}
    ps._TENSOR_MODEL_PARALLEL_GROUP = plan.tp_group
    ps._TENSOR_MODEL_PARALLEL_GLOBAL_RANKS = torch.distributed.get_process_group_ranks(plan.tp_group)
    ps._MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE = plan.encoder_tp
    ps._MPU_TENSOR_MODEL_PARALLEL_RANK = torch.distributed.get_rank(plan.tp_group)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)


def build_encoder(plan: EncoderParallelPlan | None, encoder_cls, cfg, parallel_kwargs: dict):
    """Build ``encoder_cls(cfg, parallel_kwargs)`` in the layout of ``plan``.

    With an encoder narrower than the foundation the replicas start from block 0's weights, the
    replicas of other blocks are marked as TP duplicates (megatron-core's gradient norm and the
    parameter count then see each weight once), and with ``shard`` the encoder splits its images
    over the replica group and sums its gradients over it.
    """
    from loong_vlm.encoder_sharding import heterogeneous_encoder_class, sum_grads_over_replicas

    if plan is None or not plan.heterogeneous:
        return encoder_cls(cfg, parallel_kwargs)
    if plan.data_layout == "shard" and getattr(encoder_cls, "dynamic_resolution", False):
        raise ConfigError(f"model.encoder.data_layout=shard splits a batch of fixed-size images; "
                          f"{encoder_cls.__name__} takes dynamic-resolution patches: use data_layout=replicate.")
    with encoder_tensor_parallel_state(plan):
        encoder = heterogeneous_encoder_class(encoder_cls, plan)(cfg, parallel_kwargs)
    qk_norms = [name for name, _ in encoder.named_parameters() if "q_layernorm" in name or "k_layernorm" in name]
    if qk_norms:  # megatron-core's finalize_model_grads would sum these over the foundation's TP group
        raise ConfigError(f"model.encoder.tensor_model_parallel_size narrower than the foundation's does not "
                          f"support encoders with q/k layernorms ({qk_norms[0]}); leave it null.")
    with torch.no_grad():
        for tensor in [*encoder.parameters(), *encoder.buffers()]:
            torch.distributed.broadcast(tensor.data, src=plan.replica_source, group=plan.replica_group)
    if plan.replica_index > 0:
        for param in encoder.parameters():
            param.tensor_model_parallel = False
    if plan.data_layout == "shard":
        sum_grads_over_replicas(encoder, plan.replica_group)
    return encoder


def projector_config(plan: EncoderParallelPlan | None, encoder_config):
    """The projector's ``TransformerConfig``: the encoder's, at the foundation's TP size (the
    projector runs after the features are replicated or gathered, in the foundation's TP group)."""
    if plan is None or not plan.heterogeneous:
        return encoder_config
    config = copy.copy(encoder_config)
    config.tensor_model_parallel_size = plan.foundation_tp
    config.recompute_granularity = None
    return config
