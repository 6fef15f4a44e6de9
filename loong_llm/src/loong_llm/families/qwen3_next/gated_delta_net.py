"""Qwen3-Next's Gated DeltaNet layer (linear attention) as a megatron-core attention module.

Per token: ``in_proj_qkvz`` gives, for each key head ``g``, its query, key, value heads and output
gate ``z`` (``[q_g, k_g, v_g, z_g]``, Qwen3-Next's on-disk order), ``in_proj_ba`` its value heads'
``beta`` and decay input ``a``. q, k and v pass through a causal depthwise convolution (width
``linear_conv_kernel_dim``) and SiLU; q and k are L2-normalised and shared by the key head's value
heads; the gated delta rule (``kernels.get("gated_delta_rule")``) runs with decay
``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``; its output is RMS-normalised
per value head, scaled by ``silu(z)`` and projected back (``out_proj``).

Tensor parallelism splits whole key-head groups: ``in_proj_*`` are column-parallel (a rank's
rows are its groups, contiguous in this layout), the convolution's channels are ordered group by
group (``[q_g, k_g, v_g]``) so a rank's channels are contiguous too, ``A_log`` / ``dt_bias``
follow the value heads, ``out_proj`` is row-parallel. With sequence parallelism the column-parallel
projections gather the sequence and ``out_proj`` scatters it again.

Packed documents (a :class:`~loong_core.kernels.segment_mask.SegmentMask`): the convolution
never reaches into the previous document and the recurrent state restarts at each document.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.module import MegatronModule

from loong_core import kernels
from loong_core.kernels.segment_mask import SegmentMask

TP_SHARDED = ("conv_weight", "dt_bias", "A_log")  # split over TP along dim 0


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim (fla's and transformers' L2 norm)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, segments: torch.Tensor | None) -> torch.Tensor:
    """Causal depthwise convolution of ``x [b, C, s]`` with ``weight [C, 1, K]``: output ``t`` is
    ``sum_j weight[:, j] * x[t - K + 1 + j]``; with ``segments [b, s]`` only earlier positions of
    the same document contribute."""
    width, seq = weight.shape[-1], x.shape[-1]
    if segments is None:
        return F.conv1d(x, weight, padding=width - 1, groups=x.shape[1])[..., :seq]
    out = torch.zeros_like(x)
    for j in range(width):
        shift = width - 1 - j  # tap j reads x[t - shift]
        if shift >= seq:
            continue
        shifted = F.pad(x, (shift, 0))[..., :seq]
        same = F.pad(segments, (shift, 0), value=-1)[..., :seq] == segments
        out = out + weight[:, 0, j, None] * shifted * same[:, None, :]
    return out


class GatedRMSNorm(torch.nn.Module):
    """``rms_norm(x) * weight * silu(gate)`` over the last dim (per value head), in fp32."""

    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=dtype))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        normed = kernels.get("rms_norm")(x, self.weight, self.eps)
        return (normed.float() * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(MegatronModule):
    """The token mixer of a linear-attention layer (see the module docstring); built by
    megatron-core's ``TransformerLayer`` in place of self-attention, returns ``(output, None)``."""

    def __init__(self, config, layer_number: int = 1, pg_collection=None, **kwargs):
        super().__init__(config)
        tp = config.tensor_model_parallel_size
        self.key_heads = config.linear_num_key_heads // tp
        self.ratio = config.linear_num_value_heads // config.linear_num_key_heads
        self.dk, self.dv = config.linear_key_head_dim, config.linear_value_head_dim
        self.value_heads = self.key_heads * self.ratio
        group = 2 * self.dk + 2 * self.ratio * self.dv  # q, k, v, z of one key head
        heads = config.linear_num_key_heads
        linear = dict(config=config, init_method=config.init_method, bias=False, is_expert=False)
        tp_group = pg_collection.tp if pg_collection is not None else None
        self.tp_group = tp_group
        if tp_group is not None:
            linear["tp_group"] = tp_group
        self.in_proj_qkvz = tensor_parallel.ColumnParallelLinear(
            config.hidden_size, heads * group, gather_output=False, skip_bias_add=False, **linear)
        self.in_proj_ba = tensor_parallel.ColumnParallelLinear(
            config.hidden_size, heads * 2 * self.ratio, gather_output=False, skip_bias_add=False, **linear)
        channels = self.key_heads * (2 * self.dk + self.ratio * self.dv)
        dtype = config.params_dtype
        width = config.linear_conv_kernel_dim
        self.conv_weight = torch.nn.Parameter(torch.empty(channels, 1, width, dtype=dtype))
        self.dt_bias = torch.nn.Parameter(torch.ones(self.value_heads, dtype=dtype))
        self.A_log = torch.nn.Parameter(torch.empty(self.value_heads, dtype=dtype))
        for name in TP_SHARDED:
            tensor_parallel.set_tensor_model_parallel_attributes(getattr(self, name), True, 0, 1)
        self.norm = GatedRMSNorm(self.dv, config.layernorm_epsilon, dtype)
        self.out_proj = tensor_parallel.RowParallelLinear(
            config.linear_num_value_heads * self.dv, config.hidden_size, input_is_parallel=True,
            skip_bias_add=True, **{**linear, "init_method": config.output_layer_init_method})
        if config.perform_initialization:
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Random convolution (``nn.Conv1d``'s bound), ``dt_bias`` 1, ``A`` uniform in [1, 16]."""
        if self.conv_weight.is_meta:
            return
        bound = 1.0 / math.sqrt(self.conv_weight.shape[-1])
        self.conv_weight.uniform_(-bound, bound)
        self.dt_bias.fill_(1.0)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1.0, 16.0).log())

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **kwargs):
        qkvz, _ = self.in_proj_qkvz(hidden_states)  # [s, b, key heads x (q, k, v, z)]
        ba, _ = self.in_proj_ba(hidden_states)
        s, b = qkvz.shape[:2]
        r, dk, dv, nk, nv = self.ratio, self.dk, self.dv, self.key_heads, self.value_heads
        qkv, z = qkvz.view(s, b, nk, -1).split([2 * dk + r * dv, r * dv], dim=-1)
        beta, a = ba.view(s, b, nk, 2 * r).split([r, r], dim=-1)
        segments = attention_mask.segment_ids() if isinstance(attention_mask, SegmentMask) else None
        x = qkv.reshape(s, b, -1).permute(1, 2, 0)  # [b, channels, s], channels group by group
        x = F.silu(causal_conv(x, self.conv_weight, segments))
        q, k, v = x.permute(0, 2, 1).reshape(b, s, nk, -1).split([dk, dk, r * dv], dim=-1)
        q = l2norm(q).repeat_interleave(r, dim=2)
        k = l2norm(k).repeat_interleave(r, dim=2)
        v = v.reshape(b, s, nv, dv)
        a = a.reshape(s, b, nv).transpose(0, 1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        beta = beta.reshape(s, b, nv).transpose(0, 1).sigmoid()
        out = kernels.get("gated_delta_rule")(q, k, v, g, beta, dk ** -0.5, segment_ids=segments)
        out = self.norm(out, z.reshape(s, b, nv, dv).transpose(0, 1))
        out, bias = self.out_proj(out.reshape(b, s, nv * dv).transpose(0, 1).contiguous())
        return out, bias

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata=None):
        """Checkpoint shards: the convolution, ``A_log`` and ``dt_bias`` split over TP along
        dim 0, the projections as megatron-core shards them, the norm replicated."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import (
            ensure_metadata_has_dp_cp_group,
            make_sharded_tensors_for_checkpoint,
            sharded_state_dict_default,
        )

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        tp_group = self.tp_group or parallel_state.get_tensor_model_parallel_group()
        own: dict = {}
        self._save_to_state_dict(own, "", keep_vars=True)
        out = make_sharded_tensors_for_checkpoint(
            own, prefix, {name: 0 for name in TP_SHARDED}, sharded_offsets, tp_group=tp_group,
            dp_cp_group=metadata["dp_cp_group"])
        for name, child in self.named_children():
            out.update(sharded_state_dict_default(child, f"{prefix}{name}.", sharded_offsets, metadata,
                                                  tp_group=tp_group))
        return out
