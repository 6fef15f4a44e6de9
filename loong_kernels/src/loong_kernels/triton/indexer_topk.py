"""The lightning indexer's causal top-k with its scores in Triton, a chunk of queries at a time.

``score[i, j] = sum_h w[i, h] * relu(q[i, h] . k[j])``: one program per ``[BLOCK_M queries x
BLOCK_N keys]`` tile loops over the indexer heads with one ``tl.dot`` each, applies ReLU and the
weights in registers and writes the tile's scores (-inf after the query). Only one chunk of
queries' scores exists at a time (rows x keys up to the chunk's last query); ``torch.topk``
picks each row's best keys, as the reference :func:`loong_core.kernels.reference.indexer_topk`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loong_core.kernels.sparse_attention import CHUNK_ELEMENTS
from loong_kernels.triton._launch import block_for, tile_for


@triton.jit
def _scores(Q, K, W, OUT, start, rows, cols, S, H, D,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(2).to(tl.int64)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # row within the chunk
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # key position
    d = tl.arange(0, BLOCK_D)
    pos = start + m
    in_m, in_n = m < rows, n < cols
    kt = tl.load(K + (b * S + n)[:, None] * D + d[None, :], mask=in_n[:, None] & (d < D)[None, :],
                 other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for h in range(H):
        qh = tl.load(Q + ((b * S + pos) * H + h)[:, None] * D + d[None, :],
                     mask=in_m[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)
        w = tl.load(W + (b * S + pos) * H + h, mask=in_m, other=0.0).to(tl.float32)
        dots = tl.dot(qh, tl.trans(kt), input_precision="ieee")
        acc += w[:, None] * tl.maximum(dots, 0.0)
    acc = tl.where(n[None, :] > pos[:, None], float("-inf"), acc)
    tl.store(OUT + (b * rows + m)[:, None] * cols + n[None, :], acc, mask=in_m[:, None] & in_n[None, :])


@torch.no_grad()
def indexer_topk(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor, topk: int) -> torch.Tensor:
    """Each query's ``topk`` highest-scoring keys at or before it.

    Args:
        q: ``[s, b, H, D]`` indexer queries.
        k: ``[s, b, D]`` the shared indexer key.
        w: ``[s, b, H]`` per-head weights.
        topk: Keys per query.

    Returns:
        ``[b, s, min(topk, s)]`` int64, best first (later keys fill a short prefix's row).
    """
    s, b, heads, dim = q.shape
    k_top = min(topk, s)
    qb = q.transpose(0, 1).contiguous()
    kb, wb = k.transpose(0, 1).contiguous(), w.transpose(0, 1).contiguous()
    out = torch.empty(b, s, k_top, dtype=torch.long, device=q.device)
    block_m = block_n = tile_for(q.device)
    step = max(block_m, min(s, CHUNK_ELEMENTS // max(b * s, 1)) // block_m * block_m)
    for start in range(0, s, step):
        end = min(s, start + step)
        rows, cols = end - start, max(end, k_top)
        scores = torch.empty(b, rows, cols, dtype=torch.float32, device=q.device)
        grid = (triton.cdiv(rows, block_m), triton.cdiv(cols, block_n), b)
        _scores[grid](qb, kb, wb, scores, start, rows, cols, s, heads, dim,
                      BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_for(dim))
        out[:, start:end] = scores.topk(k_top, dim=-1).indices
    return out
