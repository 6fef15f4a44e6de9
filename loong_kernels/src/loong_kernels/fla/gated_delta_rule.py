"""``gated_delta_rule:fla``: flash-linear-attention's chunked Triton kernel (forward and backward)
behind the seam's signature (:func:`loong_core.kernels.reference.gated_delta_rule`).

fla takes the same ``[b, s, h, d]`` layout, log-decay ``g`` and ``beta``. Packed documents map to
its varlen form: the batch is flattened to one row of ``b * s`` steps and ``cu_seqlens`` lists
every document start (each row's start and each position whose segment id differs from the one
before), so fla resets the state exactly where the reference does.
"""

from __future__ import annotations

import torch


def cu_seqlens(segment_ids: torch.Tensor) -> torch.Tensor:
    """``[n + 1]`` int64 offsets of the ``n`` documents of ``segment_ids [b, s]`` flattened to
    one row: 0, every document start after it, ``b * s``."""
    b, s = segment_ids.shape
    starts = torch.ones(b, s, dtype=torch.bool, device=segment_ids.device)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    offsets = starts.reshape(-1).nonzero().squeeze(1)
    return torch.cat([offsets, offsets.new_tensor([b * s])])


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, scale: float,
                     segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """fla's ``chunk_gated_delta_rule``; same arguments and result as the reference."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    if segment_ids is None:
        o, _ = chunk_gated_delta_rule(q, k, v, g.float(), beta, scale=float(scale))
        return o.to(q.dtype)
    b, s = segment_ids.shape
    offsets = cu_seqlens(segment_ids)

    def flat(t):
        return t.reshape(1, b * s, *t.shape[2:])

    o, _ = chunk_gated_delta_rule(flat(q), flat(k), flat(v), flat(g.float()), flat(beta),
                                  scale=float(scale), cu_seqlens=offsets,
                                  cu_seqlens_cpu=offsets.cpu())
    return o.reshape(b, s, *o.shape[2:]).to(q.dtype)
