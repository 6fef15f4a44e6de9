"""RMSNorm over a whole query or key projection (all heads together), for MiniMax-M2.

megatron-core calls ``q_layernorm`` / ``k_layernorm`` on ``[s, b, heads_per_rank, head_dim]``
and builds them with ``hidden_size=head_dim`` (a norm per head). MiniMax-M2 normalises the
whole projection instead (``q_norm`` over ``num_heads * head_dim``, ``k_norm`` over
``num_kv_heads * head_dim``). Under tensor parallelism the heads are split over the TP ranks:
each rank adds up the squares of its heads and the sums are all-reduced over the TP group (the
backward all-reduces too: every rank's heads depend on the total). The weight is sharded like
the heads (``partition_dim=0``): rank ``r`` holds the slice of the HF weight for its own heads,
which are contiguous in HF order, so the HF rule is a plain copy.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.utils import (
    ensure_metadata_has_dp_cp_group,
    make_sharded_tensors_for_checkpoint,
)

QUERY, KEY = "query", "key"


class _AllReduceSum(torch.autograd.Function):
    """Sum over a process group in the forward and in the backward."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        tensor = tensor.clone()
        torch.distributed.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(tensor: torch.Tensor, group) -> torch.Tensor:
    """``tensor`` summed over ``group``, differentiable (the gradient is summed over it too)."""
    return _AllReduceSum.apply(tensor, group)


class ProjectionRMSNorm(MegatronModule):
    """RMSNorm over all heads of the query (or key) projection, TP-sharded by heads.

    Args:
        config: The megatron-core ``TransformerConfig``.
        hidden_size: Channels of one head (what megatron-core's attention passes).
        eps: Added to the mean square.
        projection: ``"query"`` (``num_attention_heads`` heads) or ``"key"``
            (``num_query_groups`` heads).
        **kwargs: Other norm arguments megatron-core may pass (ignored).
    """

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, projection: str = QUERY,
                 **kwargs):
        super().__init__(config=config)
        if projection not in (QUERY, KEY):
            raise ValueError(f"projection must be {QUERY!r} or {KEY!r}, not {projection!r}")
        heads = config.num_attention_heads if projection == QUERY else (
            config.num_query_groups or config.num_attention_heads)
        self.tp_group = parallel_state.get_tensor_model_parallel_group(check_initialized=False)
        tp = config.tensor_model_parallel_size
        if heads % tp:
            raise ValueError(f"{heads} {projection} heads cannot be split over {tp} TP ranks")
        self.head_dim = hidden_size
        self.total_channels = heads * hidden_size
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(heads // tp * hidden_size))
        # Sharded like a column-parallel weight: loaders, optimizers and checkpoints see it so.
        self.weight.tensor_model_parallel = True
        self.weight.partition_dim = 0
        self.weight.partition_stride = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``[..., heads_per_rank, head_dim]`` over all heads of the projection."""
        xf = x.float()
        squares = xf.pow(2).sum(dim=(-2, -1), keepdim=True)
        if self.config.tensor_model_parallel_size > 1:
            squares = all_reduce_sum(squares, self.tp_group)
        normed = xf * torch.rsqrt(squares / self.total_channels + self.eps)
        return self.weight.view(-1, self.head_dim) * normed.to(x.dtype)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """The weight as a TP-sharded tensor (axis 0), so checkpoints reshard across TP sizes."""
        state = {}
        self._save_to_state_dict(state, "", keep_vars=True)
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        tp_group = self.tp_group or parallel_state.get_tensor_model_parallel_group()
        return make_sharded_tensors_for_checkpoint(
            state, prefix, {"weight": 0}, sharded_offsets, tp_group=tp_group,
            dp_cp_group=metadata["dp_cp_group"])

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)} of {self.total_channels}, eps={self.eps}"
