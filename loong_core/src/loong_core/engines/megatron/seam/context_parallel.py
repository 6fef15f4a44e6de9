"""Core attention under context parallelism, with the seam's attention op (no TransformerEngine).

Layout: megatron-core's load-balanced one. The sequence is cut into ``2 N`` equal chunks for a
context-parallel group of ``N`` ranks and rank ``r`` holds chunks ``r`` and ``2N - 1 - r`` (its
queries, keys and values; ``megatron.core.utils.get_batch_on_this_cp_rank`` slices the batch so,
and megatron-core's rotary embeddings give the positions of those chunks).

K/V exchange: all-gather. Every rank all-gathers the keys and values of the group along the
sequence (:class:`GatherSequence`; its backward reduce-scatters dK / dV, so each rank gets the
sum of the gradients all ranks' queries sent to its own keys and values), puts the chunks back in
sequence order, and runs the seam's ``attention`` once per local query chunk against the key prefix
that chunk may see: chunk ``j`` attends to keys ``[0, (j + 1) c)`` with the causal diagonal
bottom-right aligned, so the causal mask follows from the global positions and the softmax of each
call is complete (no log-sum-exp merging). With grouped-query attention the gathered K/V are
``num_query_groups / num_heads`` of the queries' size, which is why all-gather (one collective per
tensor, no ring of ``N`` steps) is the simplest correct exchange.

Packed documents arrive as the segment ids of the whole sequence (``[b, S]``: every rank of the
group reads the same batch, so the ids need no exchange and no ``[s, s]`` mask exists). Each
local query chunk takes its own ids (``[jc, (j + 1) c)`` of them) as the queries' segments and
the ids of its key prefix as the keys' (``kv_segment_ids``); the seam's attention keeps the
documents apart inside that bottom-right causal block (``sdpa`` per document, without a mask).
"""

from __future__ import annotations

import torch

from loong_core import kernels
from loong_core.engines.sequence_collectives import GatherSequence


def chunk_order(size: int) -> list[int]:
    """For each of the ``2 * size`` chunks in sequence order, its index in the rank-major gather
    (rank ``r`` contributed chunks ``r`` and ``2 size - 1 - r``, in that order)."""
    order = []
    for chunk in range(2 * size):
        rank, half = (chunk, 0) if chunk < size else (2 * size - 1 - chunk, 1)
        order.append(2 * rank + half)
    return order


def local_chunks(size: int, rank: int) -> tuple[int, int]:
    """The two chunks (in sequence order) that ``rank`` holds."""
    return rank, 2 * size - 1 - rank


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """``x [2c, ...]`` of every rank of ``group`` -> ``[2 N c, ...]`` in sequence order."""
    size = group.size()
    gathered = GatherSequence.apply(x, group)
    chunk = x.shape[0] // 2
    pieces = gathered.view(2 * size, chunk, *x.shape[1:])
    index = torch.tensor(chunk_order(size), device=x.device)
    return pieces.index_select(0, index).reshape(2 * size * chunk, *x.shape[1:])


def attention(query, key, value, group, *, causal: bool, segment_ids=None, scale=None,
              dropout_p: float = 0.0) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys and values.

    Args:
        query: ``[2c, b, np, hn]``, this rank's two chunks (megatron-core layout).
        key: ``[2c, b, ng, hn]``; value: ``[2c, b, ng, hv]`` (this rank's chunks).
        group: The context-parallel process group.
        causal: Causal attention (megatron's causal mask type).
        segment_ids: None, or the segment ids of the WHOLE sequence (``[b or 1, 2 N c]``, packed
            documents, sequence order): a query attends only keys of its own segment.
        scale: Softmax scale.
        dropout_p: Attention dropout.

    Returns:
        ``[2c, b, np, hv]``.

    Raises:
        ValueError: ``segment_ids`` that do not cover the whole sequence.
    """
    size = group.size()
    chunk = query.shape[0] // 2
    if segment_ids is not None:
        if segment_ids.shape[-1] != 2 * size * chunk:
            raise ValueError(f"context-parallel attention: segment_ids of length {segment_ids.shape[-1]}; "
                             f"they must cover the whole sequence ({2 * size * chunk} positions: "
                             "pass the batch's ids unsliced).")
        segment_ids = segment_ids.expand(query.shape[1], -1)
    full_k = gather_sequence(key, group).permute(1, 2, 0, 3)  # [b, ng, S, hn]
    full_v = gather_sequence(value, group).permute(1, 2, 0, 3)
    out = attend_local_pieces(query.permute(1, 2, 0, 3), full_k, full_v, group, causal=causal,
                              segment_ids=segment_ids, scale=scale, dropout_p=dropout_p)
    return out.permute(2, 0, 1, 3)  # [2c, b, np, hv]


def attend_local_pieces(q, keys, values, group, *, causal: bool, segment_ids=None, scale=None,
                        dropout_p: float = 0.0) -> torch.Tensor:
    """This rank's two load-balanced query pieces against keys and values in sequence order.

    The keys may start with a ``prefix`` of positions before the pieces' sequence (the earlier
    chunks of ``parallel.sequence_chunks``, all visible): ``prefix = sk - 2 N c``. Piece ``i``
    (global chunk index ``g``) sits at positions ``prefix + [g c, (g + 1) c)``; causal, it sees
    the keys up to its own end (bottom-right causal), else all of them.

    Args:
        q: ``[b, np, 2c, hn]``, this rank's two pieces.
        keys: ``[b, ng, sk, hn]``; values: ``[b, ng, sk, hv]`` (sequence order).
        group: The context-parallel process group.
        causal: Causal attention.
        segment_ids: None, or the ids ``[b, sk]`` of every key position (packed documents).
        scale: Softmax scale.
        dropout_p: Attention dropout.

    Returns:
        ``[b, np, 2c, hv]``.
    """
    size, rank = group.size(), group.rank()
    piece = q.shape[2] // 2
    prefix = keys.shape[2] - 2 * size * piece
    op = kernels.get("attention")
    outs = []
    for half, global_chunk in enumerate(local_chunks(size, rank)):
        start = prefix + global_chunk * piece
        end = start + piece if causal else keys.shape[2]
        ids = {}
        if segment_ids is not None:
            ids = {"segment_ids": segment_ids[:, start:start + piece],
                   "kv_segment_ids": segment_ids[:, :end]}
        outs.append(op(q[:, :, half * piece:(half + 1) * piece], keys[:, :, :end], values[:, :, :end],
                       causal=causal, scale=scale, dropout_p=dropout_p, **ids))
    return torch.cat(outs, dim=2)
