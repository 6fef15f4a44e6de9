"""The ``shard`` data layout of an encoder narrower than the foundation, and its checkpoint replicas.

An encoder class built by :func:`heterogeneous_encoder_class` splits the images of a micro batch
into equal shares over its replica group (padding with blank images), encodes its own share and
all-gathers the features, so every foundation-TP rank gets the features of all images in order.
The gather's backward keeps this rank's rows: the gradient reaching the features is the same on
every foundation-TP rank, so each replica back-propagates exactly its share, and
:func:`sum_grads_over_replicas` sums the encoder's gradients over the replica group.
"""

from __future__ import annotations

import torch


class _GatherShares(torch.autograd.Function):
    """All-gather ``[n, ...]`` shares along dim 0 over a group; backward keeps this rank's rows
    (the incoming gradient is identical on every rank of the group)."""

    @staticmethod
    def forward(ctx, share: torch.Tensor, group, index: int) -> torch.Tensor:
        ctx.rows, ctx.index = share.shape[0], index
        share = share.contiguous()
        parts = [torch.empty_like(share) for _ in range(group.size())]
        torch.distributed.all_gather(parts, share, group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        start = ctx.index * ctx.rows
        return grad[start:start + ctx.rows], None, None


def encode_share(encode, images: torch.Tensor, group, index: int) -> torch.Tensor:
    """Features of all ``images`` ``[N, ...]``, this rank encoding only its share.

    Args:
        encode: The encoder's forward on a batch of images.
        images: The micro batch's images (the same on every rank of ``group``).
        group: The encoder's replica group.
        index: This rank's position in ``group``.
    """
    count, shares = images.shape[0], group.size()
    per_share = -(-count // shares)
    if per_share * shares > count:
        blank = images.new_zeros((per_share * shares - count, *images.shape[1:]))
        images = torch.cat([images, blank])
    features = encode(images[index * per_share:(index + 1) * per_share])
    return _GatherShares.apply(features, group, index)[:count]


def sum_grads_over_replicas(encoder: torch.nn.Module, group) -> None:
    """Sum each trainable parameter's gradient over ``group`` as backward produces it (before
    megatron-core's DDP accumulates it), once per micro batch."""

    def all_reduce(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=group)
        return grad

    for param in encoder.parameters():
        if param.requires_grad:
            param.register_hook(all_reduce)


def mark_replicas(state, replica_index: int) -> None:
    """Prefix the replica id of every sharded entry of a ``sharded_state_dict`` with this rank's
    encoder block, so only block 0 holds the main replica (the one dist_checkpointing saves)."""
    if isinstance(state, dict):
        for value in state.values():
            mark_replicas(value, replica_index)
    elif isinstance(state, (list, tuple)):
        for value in state:
            mark_replicas(value, replica_index)
    elif hasattr(state, "replica_id"):
        replica_id = state.replica_id
        replica_id = tuple(replica_id) if isinstance(replica_id, (tuple, list)) else (replica_id,)
        state.replica_id = (replica_index, *replica_id)


class _HeterogeneousEncoder:
    """Mixin over an encoder class: ``shard`` forward and block-aware checkpoint replicas."""

    encoder_parallel = None  # the EncoderParallelPlan, set on the built class

    def forward(self, images, *args, **kwargs):
        plan = self.encoder_parallel
        if plan.data_layout != "shard":
            return super().forward(images, *args, **kwargs)
        if args or kwargs:
            raise ValueError(f"model.encoder.data_layout=shard splits a batch of images; "
                             f"{type(self).__name__} got further inputs: use data_layout=replicate.")
        return encode_share(super().forward, images, plan.replica_group, plan.share_index)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        state = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        mark_replicas(state, self.encoder_parallel.replica_index)
        return state


def heterogeneous_encoder_class(encoder_cls: type, plan) -> type:
    """``encoder_cls`` with the mixin (same name and state-dict keys; ``isinstance`` holds)."""
    return type(encoder_cls.__name__, (_HeterogeneousEncoder, encoder_cls),
                {"encoder_parallel": plan, "__module__": encoder_cls.__module__, "__doc__": encoder_cls.__doc__})
