"""One layer of the Pi0.5-style policy: a backbone decoder layer and an action-expert layer side by side.

The prefix (image, instruction and state tokens) runs through the backbone's transformers decoder
layer with bidirectional attention among its valid tokens. The action suffix runs through the
expert layer: its queries attend to the prefix's keys/values of the same layer and to its own,
so the joint attention mask is "prefix bidirectional, suffix sees prefix and itself, prefix never
sees the suffix". The prefix therefore never depends on the suffix: its keys/values are computed
once and reused for every Euler step at sampling time.
"""

from __future__ import annotations

import torch
from torch import nn

from loong_core import kernels
from loong_core.kernels.hf_rope import rotary
from loong_core.kernels.torch_modules import gated_mlp
from loong_embodied.policies.common.conditioning import AdaRMSNorm


def rotate(x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary position embedding of queries or keys ``[B, H, L, D]`` with ``(cos, sin)`` ``[B, L, D]``
    (through ``kernels.rope`` when that op is not plain)."""
    return rotary(x, rope[0], rope[1])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Attention of ``q`` ``[B, H, Lq, D]`` over ``k``, ``v`` ``[B, Hkv, Lk, D]`` (grouped-query:
    K/V are not repeated) where ``allowed`` ``[B, 1, Lq, Lk]`` is True, through
    ``kernels.attention``; returns ``[B, Lq, H * D]``."""
    out = kernels.get("attention")(q, k, v, causal=False, mask=allowed)
    return out.transpose(1, 2).flatten(2)


def heads(x: torch.Tensor, proj: nn.Module, head_dim: int) -> torch.Tensor:
    """``proj(x)`` ``[B, L, H * D]`` as ``[B, H, L, D]``."""
    y = proj(x)
    return y.view(*y.shape[:2], -1, head_dim).transpose(1, 2)


class ExpertLayer(nn.Module):
    """Action-expert decoder layer: adaptive-RMSNorm (flow time) attention and gated MLP, gated residuals."""

    def __init__(self, width: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 cond_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.attn_norm = AdaRMSNorm(width, cond_dim)
        self.q_proj = nn.Linear(width, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(width, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, width, bias=False)
        self.mlp_norm = AdaRMSNorm(width, cond_dim)
        self.gate_proj = nn.Linear(width, intermediate, bias=False)
        self.up_proj = nn.Linear(width, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, width, bias=False)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, rope, prefix_kv: tuple[torch.Tensor, torch.Tensor],
                allowed: torch.Tensor) -> torch.Tensor:
        h, gate = self.attn_norm(x, cond)
        q, k = rotate(heads(h, self.q_proj, self.head_dim), rope), rotate(heads(h, self.k_proj, self.head_dim), rope)
        v = heads(h, self.v_proj, self.head_dim)
        k, v = torch.cat([prefix_kv[0], k], dim=2), torch.cat([prefix_kv[1], v], dim=2)
        x = x + gate * self.o_proj(attend(q, k, v, allowed))
        h, gate = self.mlp_norm(x, cond)
        return x + gate * gated_mlp(self.gate_proj, self.up_proj, self.down_proj, h)


class JointLayer(nn.Module):
    """A backbone decoder layer (``vlm``, a transformers ``LlamaDecoderLayer`` / ``Qwen2DecoderLayer``)
    and an :class:`ExpertLayer` (``expert``) sharing attention.

    Args:
        vlm: The backbone layer; only its submodules are called (the joint attention needs the
            projections separately).
        expert: The expert layer.
        prefix_output: Compute the prefix's output (False for the last layer: nothing reads it, only
            its keys and values are needed, so its query/output projections and MLP are dropped).
    """

    def __init__(self, vlm: nn.Module, expert: ExpertLayer, prefix_output: bool = True):
        super().__init__()
        if not prefix_output:   # keep only what makes the keys and values: everything else gets no gradient
            vlm.mlp = vlm.post_attention_layernorm = vlm.self_attn.q_proj = vlm.self_attn.o_proj = None
        self.vlm, self.expert, self.prefix_output = vlm, expert, prefix_output

    def prefix_forward(self, x: torch.Tensor, rope, allowed: torch.Tensor):
        """Backbone layer on the prefix: ``(output, (keys, values))`` with rotary keys (output None
        without ``prefix_output``)."""
        attn, head_dim = self.vlm.self_attn, self.vlm.self_attn.head_dim
        h = self.vlm.input_layernorm(x)
        k, v = rotate(heads(h, attn.k_proj, head_dim), rope), heads(h, attn.v_proj, head_dim)
        if not self.prefix_output:
            return None, (k, v)
        q = rotate(heads(h, attn.q_proj, head_dim), rope)
        x = x + attn.o_proj(attend(q, k, v, allowed))
        return x + self.vlm.mlp(self.vlm.post_attention_layernorm(x)), (k, v)

    def forward(self, prefix: torch.Tensor | None, suffix: torch.Tensor | None, cond: torch.Tensor | None,
                prefix_rope, suffix_rope, prefix_allowed: torch.Tensor | None, suffix_allowed: torch.Tensor | None,
                prefix_kv=None):
        """Advance both streams one layer.

        Returns:
            ``(prefix, suffix, prefix_kv)``: with ``prefix_kv`` given (cached from an earlier call)
            the prefix is not recomputed; with ``suffix`` None only the prefix runs.
        """
        if prefix_kv is None:
            prefix, prefix_kv = self.prefix_forward(prefix, prefix_rope, prefix_allowed)
        if suffix is not None:
            suffix = self.expert(suffix, cond, suffix_rope, prefix_kv, suffix_allowed)
        return prefix, suffix, prefix_kv
