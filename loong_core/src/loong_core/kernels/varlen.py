"""Attention over packed segments without an ``[sq, sk]`` mask: one SDPA call per block shape.

Queries carry segment ids ``[b, sq]``, keys ``[b, sk]``; a query attends only keys of its own
segment (and, when causal, at or before its position: query ``i`` sits at key position
``i + sk - sq``, the query block ends the keys). Each segment's queries against that segment's
keys is a block whose mask SDPA knows without being given one:

- not causal: every query of the segment sees every key of it (no mask);
- causal, queries inside the segment's key span: bottom-right causal (``nq <= nk``), a square
  ``is_causal`` block when ``nq == nk`` (a whole document), otherwise a suffix of queries
  against its key prefix (a context-parallel chunk, or a later chunk of a chunked schedule,
  whose document started earlier), served on CPU by :mod:`loong_core.kernels.suffix_causal`;
- causal, queries after the segment's last key: they see all of it (no mask); before its
  first key: nothing (zero output, as the reference gives a fully masked row).

Blocks of one kind and shape are stacked into one batch (packed documents of equal length run in
one call), the outputs are put back in query order. Memory is ``O(s)`` per block batch, one host
sync per call reads the segment boundaries.

Segments must be contiguous runs. Scattered segments (vision windows in patch order) are sorted
first (stable, so order inside a segment is kept), which preserves causality only when queries
and keys are the same tokens; scattered causal segments with ``sq != sk`` or different ids take
the dense mask instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from loong_core.kernels import sdpa_precision, suffix_causal
from loong_core.kernels.reference import combined_mask

FULL, CAUSAL, SUFFIX, EMPTY = "full", "causal", "suffix", "empty"


@dataclass(frozen=True)
class Block:
    """Queries ``[q0, q0 + nq)`` of batch row ``row`` against keys ``[k0, k0 + nk)``."""

    kind: str
    row: int
    q0: int
    nq: int
    k0: int
    nk: int


def runs(ids: torch.Tensor) -> list[dict[int, tuple[int, int]] | None]:
    """Per batch row of ``ids [b, s]``, ``{segment id: (start, end)}``; None for a row in which
    an id occurs in two runs. One host transfer of the run starts."""
    change = torch.ones_like(ids, dtype=torch.bool)
    change[:, 1:] = ids[:, 1:] != ids[:, :-1]
    rows, starts = change.nonzero(as_tuple=True)
    table = torch.stack([rows, starts, ids[rows, starts].to(rows.dtype)]).tolist()
    out: list[dict[int, tuple[int, int]] | None] = [{} for _ in range(ids.shape[0])]
    seq = ids.shape[1]
    for i, (row, start, seg) in enumerate(zip(*table)):
        spans = out[row]
        last = i + 1 == len(table[0]) or table[0][i + 1] != row
        end = seq if last else table[1][i + 1]
        if spans is None:
            continue
        if seg in spans:
            out[row] = None
        else:
            spans[seg] = (start, end)
    return out


def plan(q_ids: torch.Tensor, k_ids: torch.Tensor, causal: bool) -> list[Block] | None:
    """The blocks of every batch row, in query order; None when some segment is not one run."""
    blocks = []
    offset = k_ids.shape[1] - q_ids.shape[1]
    q_runs = runs(q_ids)
    k_runs = q_runs if k_ids is q_ids else runs(k_ids)  # self-attention: one host transfer
    for row, (q_spans, k_spans) in enumerate(zip(q_runs, k_runs)):
        if q_spans is None or k_spans is None:
            return None
        for seg, (qs, qe) in sorted(q_spans.items(), key=lambda item: item[1]):
            blocks.extend(_segment_blocks(row, qs, qe, k_spans.get(seg), offset, causal))
    return blocks


def _segment_blocks(row, qs, qe, keys, offset, causal):
    if keys is None:
        return [Block(EMPTY, row, qs, qe - qs, 0, 0)]
    ks, ke = keys
    if not causal:
        return [Block(FULL, row, qs, qe - qs, ks, ke - ks)]
    out = []
    # Query i sits at key position offset + i: before ks it sees nothing, in [ks, ke) the keys
    # [ks, offset + i], from ke on all of [ks, ke).
    before = min(qe, ks - offset)
    if before > qs:
        out.append(Block(EMPTY, row, qs, before - qs, 0, 0))
    start, end = max(qs, ks - offset), min(qe, ke - offset)
    if end > start:
        nq, nk = end - start, offset + end - ks
        out.append(Block(CAUSAL if nq == nk else SUFFIX, row, start, nq, ks, nk))
    after = max(qs, ke - offset)
    if qe > after:
        out.append(Block(FULL, row, after, qe - after, ks, ke - ks))
    return out


def attention(q, k, v, q_ids: torch.Tensor, k_ids: torch.Tensor, causal: bool, scale, dropout_p):
    """Segment attention of ``q [b, hq, sq, d]`` over ``k, v [b, hk, sk, d / dv]``; see the
    module docstring. Returns ``[b, hq, sq, dv]``."""
    same = k_ids is q_ids
    q_ids = q_ids.expand(q.shape[0], -1)
    k_ids = q_ids if same else k_ids.expand(q.shape[0], -1)
    blocks = plan(q_ids, k_ids, causal)
    if blocks is None:
        return _scattered(q, k, v, q_ids, k_ids, causal, scale, dropout_p)
    return run_blocks(q, k, v, blocks, scale, dropout_p)


def run_blocks(q, k, v, blocks: list[Block], scale, dropout_p):
    """Run ``blocks`` (covering every query of every row, in query order) batched by shape.

    The queries, keys and values of every block are gathered with one ``index_select`` each and
    split by shape group, and the outputs go back with one ``index_copy``. So the backward builds
    one full-size gradient buffer per tensor. Slicing each block out of ``q`` / ``k`` / ``v``
    instead made one zero-filled full-size buffer per block (profiled: a third of a packed VLM
    step's non-matmul time went to ``fill_``, ``add_`` and ``copy_``)."""
    groups: dict[tuple[str, int, int], list[Block]] = {}
    for block in blocks:
        if block.kind != EMPTY:
            groups.setdefault((block.kind, block.nq, block.nk), []).append(block)
    b, hq, sq, _ = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[-1]
    if not groups:  # no query has a key of its segment: zeros, as the reference
        return q.new_zeros(b, hq, sq, dv)
    ordered = [block for group in groups.values() for block in group]
    q_index = _token_index([(x.row, x.q0, x.nq) for x in ordered], sq, q.device)
    k_index = _token_index([(x.row, x.k0, x.nk) for x in ordered], sk, q.device)

    def tokens(t, index, heads):  # [b, h, s, d] -> the indexed tokens [n, h, d]
        return t.transpose(1, 2).reshape(-1, heads, t.shape[-1]).index_select(0, index)

    q_parts = tokens(q, q_index, hq).split([len(g) * nq for (_, nq, _), g in groups.items()])
    k_parts = tokens(k, k_index, hk).split([len(g) * nk for (_, _, nk), g in groups.items()])
    v_parts = tokens(v, k_index, hk).split([len(g) * nk for (_, _, nk), g in groups.items()])
    outs = []
    for ((kind, nq, nk), group), qp, kp, vp in zip(groups.items(), q_parts, k_parts, v_parts):
        n = len(group)
        out = _block_attention(kind, qp.view(n, nq, hq, -1).transpose(1, 2), kp.view(n, nk, hk, -1).transpose(1, 2),
                               vp.view(n, nk, hk, dv).transpose(1, 2), scale, dropout_p)
        outs.append(out.transpose(1, 2).reshape(n * nq, hq, dv))
    out = torch.cat(outs)
    out = out.new_zeros(b * sq, hq, dv).index_copy(0, q_index, out)  # queries without keys stay zero
    return out.view(b, sq, hq, dv).transpose(1, 2).contiguous()


def _token_index(spans: list[tuple[int, int, int]], length: int, device) -> torch.Tensor:
    """Flat token positions (``row * length + position``) of the ``(row, start, count)`` spans, in order."""
    starts = torch.tensor([row * length + start for row, start, _ in spans], dtype=torch.long)
    counts = torch.tensor([count for _, _, count in spans], dtype=torch.long)
    offsets = torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    return (torch.repeat_interleave(starts, counts) + offsets).to(device)


def _gqa(q, k) -> bool:
    return q.shape[1] != k.shape[1]


def _block_attention(kind, q, k, v, scale, dropout_p):
    if kind == SUFFIX:
        return bottom_right_causal(q, k, v, scale, dropout_p)
    return sdpa_precision.scaled_dot_product_attention(q, k, v, is_causal=kind == CAUSAL, dropout_p=dropout_p,
                                                       scale=scale, enable_gqa=_gqa(q, k))


def bottom_right_causal(q, k, v, scale, dropout_p: float = 0.0):
    """Causal attention of ``q [b, hq, sq, d]`` ending ``k [b, hk, sk, d]`` (``sq <= sk``):
    query ``i`` sees keys ``j <= i + sk - sq``. Mask-free: the CPU path of
    :mod:`.suffix_causal`, elsewhere SDPA with torch's lower-right causal bias (which the CUDA
    flash / memory-efficient kernels run without a dense mask)."""
    if q.shape[2] == k.shape[2]:
        return sdpa_precision.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p,
                                                           scale=scale, enable_gqa=_gqa(q, k))
    if suffix_causal.applies(q, k, True, None, None, dropout_p):
        return suffix_causal.attention(q, k, v, scale=scale)
    from torch.nn.attention.bias import causal_lower_right

    return sdpa_precision.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[2], k.shape[2]),
                                                       dropout_p=dropout_p, scale=scale, enable_gqa=_gqa(q, k))


def _scattered(q, k, v, q_ids, k_ids, causal, scale, dropout_p):
    """Segments that are not contiguous runs: sorted by segment (stable), run, put back. Under
    ``causal`` that is exact only for self-attention (same tokens as queries and keys); other
    causal cases take the dense mask."""
    same_tokens = q.shape[2] == k.shape[2] and torch.equal(q_ids, k_ids)
    if causal and not same_tokens:
        allowed = combined_mask(q.shape[2], k.shape[2], q.device, True, q_ids, None, k_ids)
        return sdpa_precision.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p,
                                                           scale=scale, enable_gqa=_gqa(q, k))
    q_order = torch.argsort(q_ids, dim=1, stable=True)
    k_order = q_order if same_tokens else torch.argsort(k_ids, dim=1, stable=True)

    def gather(t, index):
        return torch.gather(t, 2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3]))

    blocks = plan(torch.gather(q_ids, 1, q_order), torch.gather(k_ids, 1, k_order), causal)
    out = run_blocks(gather(q, q_order), gather(k, k_order), gather(v, k_order), blocks, scale,
                     dropout_p)
    return gather(out, torch.argsort(q_order, dim=1))
