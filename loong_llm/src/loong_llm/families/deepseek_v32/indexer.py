"""DeepSeek-V3.2's lightning indexer: a few small ReLU heads score every earlier key of a query;
the top-k keys are the ones the main attention reads.

``score[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j])`` with ``q`` from the compressed query
(``q_a_layernorm(q_a_proj(x))``), one shared key ``LayerNorm(wk(x))`` and per-head weights from
``x``; RoPE (rotate-half) on the first ``qk_pos_emb_head_dim`` channels of ``q`` and ``k``. The
scores and their causal top-k are the kernel seam's ``indexer_topk`` op (chunked torch reference
in :mod:`loong_core.kernels.sparse_attention`, or ``triton``), so no ``[s, s]`` score matrix
exists at once.
"""

from __future__ import annotations

import torch

from loong_core import kernels
from loong_core.kernels.sparse_attention import indexer_scores


def _rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first ``cos.shape[-1]`` channels of ``x [s, b, ..., d]``."""
    rot, rest = x[..., : cos.shape[-1]], x[..., cos.shape[-1]:]
    half = rot.shape[-1] // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


class LightningIndexer(torch.nn.Module):
    """The indexer's parameters (HF ``indexer.wq_b / wk / k_norm / weights_proj``) and scores.

    Args:
        hidden_size: Model width.
        q_lora_rank: Width of the compressed query.
        n_heads: Indexer heads (``dsa_indexer_n_heads``).
        head_dim: Indexer head width (``dsa_indexer_head_dim``).
        rope_dim: Channels rotated by RoPE (``qk_pos_emb_head_dim``).
        inv_freq: RoPE inverse frequencies ``[rope_dim / 2]`` (YaRN's when the model uses it).
        init_std: Std of the normal initialisation.
        rope_scale: Scale of cos and sin (YaRN's attention factor, as the model's own RoPE
            applies it; 1 without YaRN).
    """

    def __init__(self, hidden_size: int, q_lora_rank: int, n_heads: int, head_dim: int,
                 rope_dim: int, inv_freq: torch.Tensor, init_std: float = 0.02,
                 rope_scale: float = 1.0):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = n_heads, head_dim, rope_dim
        self.rope_scale = float(rope_scale)
        self.linear_wq_b = torch.nn.Linear(q_lora_rank, n_heads * head_dim, bias=False)
        self.linear_wk = torch.nn.Linear(hidden_size, head_dim, bias=False)
        self.k_norm = torch.nn.LayerNorm(head_dim, eps=1e-6)
        self.linear_weights_proj = torch.nn.Linear(hidden_size, n_heads, bias=False)
        for linear in (self.linear_wq_b, self.linear_wk, self.linear_weights_proj):
            torch.nn.init.normal_(linear.weight, std=init_std)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def project(self, x: torch.Tensor, qr: torch.Tensor):
        """``(q [s, b, H, D], k [s, b, D], w [s, b, H])`` in fp32, RoPE applied, the softmax
        scale and ``H^-0.5`` folded into ``w``."""
        s, b = x.shape[:2]
        angles = torch.arange(s, device=x.device, dtype=torch.float32)[:, None] * self.inv_freq
        angles = torch.cat((angles, angles), dim=-1).view(s, 1, 1, -1)
        cos, sin = angles.cos() * self.rope_scale, angles.sin() * self.rope_scale
        q = self.linear_wq_b(qr).view(s, b, self.n_heads, self.head_dim).float()
        k = self.k_norm(self.linear_wk(x)).view(s, b, 1, self.head_dim).float()
        q, k = _rotate_half_rope(q, cos, sin), _rotate_half_rope(k, cos, sin).squeeze(2)
        w = self.linear_weights_proj(x).float() * (self.n_heads ** -0.5 * self.head_dim ** -0.5)
        return q, k, w

    @staticmethod
    def scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``[b, c, t]`` scores of the queries ``q [c, b, H, D]`` (weights ``w [c, b, H]``)
        against the keys ``k [t, b, D]``."""
        return indexer_scores(q, k, w)

    @torch.no_grad()
    def topk(self, q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, topk: int) -> torch.Tensor:
        """``[b, s, min(topk, s)]`` int64: each query's highest-scoring keys at or before it, best
        first (a query with fewer earlier keys than ``topk`` also lists later ones; attention
        ignores them)."""
        return kernels.get("indexer_topk")(q, k, w, topk)

    def selected_scores(self, q, k, w, indices: torch.Tensor) -> torch.Tensor:
        """``[b, s, topk]`` scores of the selected keys, differentiable in the indexer's
        parameters (what the sparse indexer loss trains)."""
        kb = k.transpose(0, 1)  # [b, t, D]
        b = kb.shape[0]
        k_sel = kb[torch.arange(b, device=k.device).view(b, 1, 1), indices]  # [b, s, K, D]
        dots = torch.relu(torch.einsum("sbhd,bskd->bshk", q, k_sel))
        return torch.einsum("sbh,bshk->bsk", w, dots)
