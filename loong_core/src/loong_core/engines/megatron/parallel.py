"""megatron-core parallel state from :class:`~loong_core.config.schema.ParallelConfig`."""

from __future__ import annotations

import torch

from loong_core.config.schema import ParallelConfig
from loong_core.engines.base import ParallelLayout
from loong_core.errors import ConfigError


def check_world(p: ParallelConfig, world_size: int) -> int:
    """Return the data-parallel size, or raise if the layout does not divide the world."""
    model_parallel = p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
    if world_size % model_parallel:
        raise ConfigError(
            f"world size {world_size} is not divisible by tensor x pipeline x context parallel "
            f"= {p.tensor_model_parallel_size} x {p.pipeline_model_parallel_size} x "
            f"{p.context_parallel_size}; change --nproc-per-node or the parallel sizes."
        )
    expert_parallel = (p.tensor_model_parallel_size * p.expert_model_parallel_size
                       * p.pipeline_model_parallel_size)
    if world_size % expert_parallel:
        raise ConfigError(
            f"world size {world_size} is not divisible by tensor x expert x pipeline parallel "
            f"= {p.tensor_model_parallel_size} x {p.expert_model_parallel_size} x "
            f"{p.pipeline_model_parallel_size} (experts are laid out over those ranks); change "
            "--nproc-per-node or parallel.expert_model_parallel_size."
        )
    return world_size // model_parallel


def initialize(p: ParallelConfig, seed: int) -> ParallelLayout:
    """Create megatron-core's groups and seed its model-parallel RNG tracker."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    world = torch.distributed.get_world_size()
    check_world(p, world)
    if p.virtual_pipeline_model_parallel_size and p.pipeline_model_parallel_size < 2:
        raise ConfigError("'parallel.virtual_pipeline_model_parallel_size' needs pipeline_model_parallel_size > 1.")
    ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
    )
    model_parallel_cuda_manual_seed(seed)
    rank = torch.distributed.get_rank()
    return ParallelLayout(
        world_size=world,
        rank=rank,
        data_parallel_size=ps.get_data_parallel_world_size(),
        data_parallel_rank=ps.get_data_parallel_rank(),
        is_logging_rank=rank == 0,
    )


def transformer_kwargs(p: ParallelConfig) -> dict:
    """TransformerConfig fields that come from the parallel config."""
    kwargs = dict(
        tensor_model_parallel_size=p.tensor_model_parallel_size,
        pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=p.virtual_pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size,
        expert_model_parallel_size=p.expert_model_parallel_size,
        sequence_parallel=p.sequence_parallel,
        # fp32 unless the engine's precision (engines/megatron/precision.py) says otherwise.
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        # Batched p2p with interleaved pipelines mismatches messages on gloo (MCORE_ON_CPU.md).
        batch_p2p_comm=not p.virtual_pipeline_model_parallel_size,
        recompute_granularity=p.recompute_granularity,
        recompute_method=p.recompute_method,
        recompute_num_layers=p.recompute_num_layers,
        # Loss functions return (sum over tokens, token count): gradients are divided once by the
        # global batch's token count, so how samples are grouped into micro batches and DP ranks
        # (data balancers, packing) does not change them.
        calculate_per_token_loss=True,
    )
    if p.recompute_modules is not None:
        kwargs["recompute_modules"] = list(p.recompute_modules)
    return kwargs
