"""Wrap a model for data parallelism: DDP, FSDP2 (``fully_shard``) or HSDP on a 2-D mesh."""

from __future__ import annotations

import functools
import logging

import torch

from loong_core.errors import ConfigError

logger = logging.getLogger(__name__)


def compute_dtype(parallel, device) -> torch.dtype:
    """The dtype of ``parallel.mixed_precision`` on ``device`` (``auto``: bf16 where the device
    backend says bf16 is fast, else fp32)."""
    choice = parallel.mixed_precision
    if choice == "auto":
        return torch.bfloat16 if device.fast_bf16 else torch.float32
    return torch.bfloat16 if choice == "bf16" else torch.float32


def build_mesh(parallel, device, world_size: int):
    """A 1-D ``("shard",)`` mesh for FSDP, a 2-D ``("replicate", "shard")`` mesh for HSDP."""
    from torch.distributed.device_mesh import init_device_mesh

    device_type = device.device_type
    if parallel.data_parallel_sharding == "hsdp":
        shard = parallel.data_parallel_shard_size or world_size
        if shard < 1 or world_size % shard:
            raise ConfigError(
                f"'parallel.data_parallel_shard_size' ({shard}) must divide the world size "
                f"({world_size}) with data_parallel_sharding=hsdp."
            )
        return init_device_mesh(device_type, (world_size // shard, shard),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("shard",))


def _checkpointed_forward(forward, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_activation_checkpointing(blocks: list[torch.nn.Module]) -> None:
    """Recompute each block in the backward. Replaces the instance's ``forward`` only, so
    parameter names (and therefore checkpoints) are unchanged."""
    for block in blocks:
        block.forward = functools.partial(_checkpointed_forward, block.forward)


def wrap(model: torch.nn.Module, blocks: list[torch.nn.Module], parallel, device, world_size: int,
         dtype: torch.dtype, find_unused_parameters: bool = False) -> torch.nn.Module:
    """Return ``model`` wrapped per ``parallel.data_parallel_sharding``.

    Args:
        model: The model on its device, fp32.
        blocks: Sub-modules that become their own FSDP2 units (and are checkpointed).
        parallel: The :class:`~loong_core.config.schema.ParallelConfig`.
        device: The device backend.
        world_size: Data-parallel ranks (all ranks).
        dtype: Compute dtype (FSDP2 casts parameters to it for compute, reduces in fp32).
        find_unused_parameters: DDP: some parameters may get no gradient in a step.
    """
    if parallel.activation_checkpointing:
        if not blocks:
            logger.warning("parallel.activation_checkpointing=true but the model declares no blocks")
        apply_activation_checkpointing(blocks)
    if parallel.data_parallel_sharding == "ddp":
        if world_size == 1:
            # Nothing to average: DDP would still copy every gradient into its buckets and
            # all-reduce them over one rank (2% of a small DiT step on CPU). Checkpoints are the
            # same either way (DCP drops the wrapper's prefix), so a DP1 run resumes at DP2.
            return model
        from torch.nn.parallel import DistributedDataParallel

        # One accelerator per process: DDP is told which; a host device (no index) is not.
        ids = [device.torch_device] if device.torch_device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=find_unused_parameters)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = build_mesh(parallel, device, world_size)
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model
