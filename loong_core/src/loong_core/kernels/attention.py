"""Attention backends of the kernel seam (same signature as :func:`reference.attention`).

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (flash / memory-efficient
  kernels on CUDA, the fused flash kernel on CPU), grouped-query attention with ``enable_gqa``
  (K/V are never repeated). Packed documents and vision windows (``segment_ids``, and
  ``kv_segment_ids`` when the keys are more than the queries) run as one SDPA call per group of
  equally shaped segment blocks (:mod:`loong_core.kernels.varlen`; scattered segments are sorted
  first), so no ``[sq, sk]`` mask exists. Causal queries that end a longer key sequence (a
  context-parallel chunk against its key prefix) run without a mask
  (:func:`loong_core.kernels.varlen.bottom_right_causal`; on CPU
  :mod:`loong_core.kernels.suffix_causal`).
- ``flex``: FlexAttention under ``torch.compile`` with a block mask built from ``causal`` and
  ``segment_ids`` (block-sparse: fully masked blocks are skipped).

An explicit dense ``mask`` (a pattern neither ``causal`` nor ``segment_ids`` describes) is passed
to SDPA as a boolean mask.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from loong_core.kernels import sdpa_precision, varlen
from loong_core.kernels.reference import check_segment_ids, combined_mask


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


def sdpa(q, k, v, *, causal: bool = True, segment_ids=None, mask=None, scale=None,
         dropout_p: float = 0.0, kv_segment_ids=None):
    """Attention through SDPA; see :func:`loong_core.kernels.reference.attention`."""
    sq, sk = q.shape[2], k.shape[2]
    if segment_ids is not None or kv_segment_ids is not None:
        q_ids, k_ids = check_segment_ids(sq, sk, segment_ids, kv_segment_ids)
        if mask is None:
            return varlen.attention(q, k, v, q_ids, k_ids, causal, scale, dropout_p)
    if mask is None and causal and sq < sk:
        return varlen.bottom_right_causal(q, k, v, scale, dropout_p)
    if mask is not None or segment_ids is not None or (causal and sq != sk):
        allowed = combined_mask(sq, sk, q.device, causal, segment_ids, mask, kv_segment_ids)
        return sdpa_precision.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p,
                                                           scale=scale, enable_gqa=_gqa(q, k))
    return sdpa_precision.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p,
                                                       scale=scale, enable_gqa=_gqa(q, k))


@functools.lru_cache(maxsize=1)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _block_mask(causal: bool, segment_ids, batch: int, sq: int, sk: int, device,
                kv_segment_ids=None):
    from torch.nn.attention.flex_attention import create_block_mask

    offset = sk - sq
    kv_ids = segment_ids if kv_segment_ids is None else kv_segment_ids

    def mask_mod(b, h, q_idx, kv_idx):
        allowed = q_idx >= 0
        if causal:
            allowed = allowed & (kv_idx <= q_idx + offset)
        if segment_ids is not None:
            allowed = allowed & (segment_ids[b, q_idx] == kv_ids[b, kv_idx])
        return allowed

    rows = batch if segment_ids is not None else None
    return create_block_mask(mask_mod, rows, None, sq, sk, device=device)


def flex(q, k, v, *, causal: bool = True, segment_ids=None, mask=None, scale=None,
         dropout_p: float = 0.0, kv_segment_ids=None):
    """Attention through FlexAttention block masks; see :func:`reference.attention`.

    Raises:
        ValueError: with ``dropout_p > 0`` (FlexAttention has no attention dropout).
    """
    if dropout_p > 0:
        raise ValueError("kernels.attention=flex does not support attention dropout; use sdpa.")
    if mask is not None:
        return sdpa(q, k, v, causal=causal, segment_ids=segment_ids, mask=mask, scale=scale,
                    kv_segment_ids=kv_segment_ids)
    if segment_ids is not None or kv_segment_ids is not None:
        segment_ids, kv_segment_ids = check_segment_ids(q.shape[2], k.shape[2], segment_ids,
                                                        kv_segment_ids)
    if not causal and segment_ids is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=_gqa(q, k))
    block_mask = _block_mask(causal, segment_ids, q.shape[0], q.shape[2], k.shape[2], q.device,
                             kv_segment_ids)
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=_gqa(q, k))
