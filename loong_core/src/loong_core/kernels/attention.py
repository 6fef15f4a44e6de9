"""Attention backends of the kernel seam (same signature as :func:`reference.attention`).

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels on CUDA, the fused flash kernel on CPU), grouped-query attention with ``enable_gqa``
  (K/V are never repeated). Packed documents and vision windows (``segment_ids``) run as one SDPA
  call per group of equally long segments (varlen by bucketing; scattered segments are sorted
  first), so no ``[s, s]`` mask exists. Causal queries that end a longer key sequence (a
  context-parallel chunk against its key prefix) run without a mask on CPU
  (:mod:`loong_core.kernels.suffix_causal`).
- ``flex``: FlexAttention under ``torch.compile`` with a block mask built from ``causal`` and
  ``segment_ids`` (block-sparse: fully masked blocks are skipped).

An explicit dense ``mask`` (a pattern neither ``causal`` nor ``segment_ids`` describes) is passed
to SDPA as a boolean mask.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from loong_core.kernels import suffix_causal
from loong_core.kernels.reference import combined_mask


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


def _runs(segment_ids: torch.Tensor) -> list[list[tuple[int, int]]] | None:
    """Per batch row, the ``(start, length)`` of each run of equal ids; None when some id occurs
    in two separate runs (then the segments are not contiguous)."""
    rows = []
    change = torch.ones_like(segment_ids, dtype=torch.bool)
    change[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    seq = segment_ids.shape[1]
    for row, flags in zip(segment_ids.tolist(), change.tolist()):
        starts = [i for i, f in enumerate(flags) if f]
        if len(starts) != len(set(row)):
            return None
        ends = starts[1:] + [seq]
        rows.append([(s, e - s) for s, e in zip(starts, ends)])
    return rows


def sdpa(q, k, v, *, causal: bool = True, segment_ids=None, mask=None, scale=None,
         dropout_p: float = 0.0):
    """Attention through SDPA; see :func:`loong_core.kernels.reference.attention`."""
    sq, sk = q.shape[2], k.shape[2]
    if mask is None and segment_ids is not None and sq == sk:
        runs = _runs(segment_ids)
        if runs is not None:
            return _segments(q, k, v, runs, causal, scale, dropout_p)
        return _sorted_segments(q, k, v, segment_ids, causal, scale, dropout_p)
    if suffix_causal.applies(q, k, causal, mask, segment_ids, dropout_p):
        return suffix_causal.attention(q, k, v, scale=scale)
    if mask is not None or segment_ids is not None or (causal and sq != sk):
        allowed = combined_mask(sq, sk, q.device, causal, segment_ids, mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p,
                                              scale=scale, enable_gqa=_gqa(q, k))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p,
                                          scale=scale, enable_gqa=_gqa(q, k))


def _segments(q, k, v, runs, causal, scale, dropout_p):
    """One SDPA call per segment length: segments of equal length are stacked into a batch."""
    by_length: dict[int, list[tuple[int, int]]] = {}
    for b, row in enumerate(runs):
        for start, length in row:
            by_length.setdefault(length, []).append((b, start))
    pieces: dict[tuple[int, int], torch.Tensor] = {}
    for length, where in by_length.items():
        def take(t, length=length, where=where):
            return torch.stack([t[b, :, s:s + length] for b, s in where])
        out = F.scaled_dot_product_attention(take(q), take(k), take(v), is_causal=causal,
                                             dropout_p=dropout_p, scale=scale,
                                             enable_gqa=_gqa(q, k))
        for (b, s), piece in zip(where, out.unbind(0)):
            pieces[(b, s)] = piece
    rows = [torch.cat([pieces[(b, s)] for s, _ in row], dim=1) for b, row in enumerate(runs)]
    return torch.stack(rows)


def _sorted_segments(q, k, v, segment_ids, causal, scale, dropout_p):
    """Segments scattered over the sequence (vision windows in patch order): a stable sort by
    segment makes each contiguous (order inside a segment is kept, so causality holds), the
    per-segment path runs, and the output is put back in the original order."""
    order = torch.argsort(segment_ids, dim=1, stable=True)
    inverse = torch.argsort(order, dim=1)

    def gather(t, index):
        return torch.gather(t, 2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))

    sorted_ids = torch.gather(segment_ids, 1, order)
    out = _segments(gather(q, order), gather(k, order), gather(v, order), _runs(sorted_ids),
                    causal, scale, dropout_p)
    return gather(out, inverse)


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _block_mask(causal: bool, segment_ids, batch: int, sq: int, sk: int, device):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = sk - sq

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = q_idx >= 0
        if causal:
            allowed = allowed & (kv_idx <= q_idx + offset)
        if segment_ids is not None:
            allowed = allowed & (segment_ids[b, q_idx] == segment_ids[b, kv_idx])
        return allowed

    rows = batch if segment_ids is not None else None
    return create_block_mask(mask_mod, rows, None, sq, sk, device=device)


def flex(q, k, v, *, causal: bool = True, segment_ids=None, mask=None, scale=None,
         dropout_p: float = 0.0):
    """Attention through FlexAttention block masks; see :func:`reference.attention`.

    Raises:
        ValueError: with ``dropout_p > 0`` (FlexAttention has no attention dropout).
    """
    if dropout_p > 0:
        raise ValueError("kernels.attention=flex does not support attention dropout; use sdpa.")
    if mask is not None:
        return sdpa(q, k, v, causal=causal, segment_ids=segment_ids, mask=mask, scale=scale)
    if not causal and segment_ids is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=_gqa(q, k))
    block_mask = _block_mask(causal, segment_ids, q.shape[0], q.shape[2], k.shape[2], q.device)
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=_gqa(q, k))
