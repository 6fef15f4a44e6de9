"""Attention of one sequence chunk against the keys and values of the chunks before it.

Under ``parallel.sequence_chunks=K`` (:mod:`loong_core.engines.megatron.sequence_chunks`) a micro
batch's sequence runs through the whole model in ``K`` chunks, in causal order. Each core
attention layer keeps the K/V of every chunk it has seen; chunk ``j``'s queries attend to the K/V
of chunks ``0 .. j - 1`` (all visible) and to chunk ``j``'s own (causal): one bottom-right causal
call (``sq < sk``, the queries end the keys), which ``kernels.attention`` serves as it does a
context-parallel chunk (on CPU without a mask, :mod:`loong_core.kernels.suffix_causal`).

Gradients: chunk graphs are separate (their backwards run in reverse chunk order). The K/V a chunk
leaves for later chunks are kept as *leaf* tensors (detached copies that require grad): a later
chunk's backward accumulates its dK / dV into their ``.grad``. Chunk ``j``'s own K/V pass through
:class:`_AddLaterGrads`, whose backward adds that accumulated gradient to the one chunk ``j``'s own
queries sent, so when chunk ``j``'s backward reaches its K/V projection, all later chunks have
contributed. With full recompute a layer's forward runs twice (once without a graph, once in the
backward): the leaves are made the first time and reused, so nothing is stored or counted twice.

Under context parallelism each global chunk is laid out with megatron-core's load-balanced layout
over the CP group; the chunk's K/V are all-gathered (:func:`..context_parallel.gather_sequence`,
backward reduce-scatter) and the gathered K/V are what later chunks see, a fully visible prefix.

Packed documents: the state holds the segment ids of the whole sequence; a query block passes its
own ids and those of all keys it may see (``segment_ids`` / ``kv_segment_ids`` of
``kernels.attention``), so a document that started in an earlier chunk stays visible and the others
do not; no ``[sq, sk]`` mask exists.
"""

from __future__ import annotations

import contextlib

import torch

from loong_core import kernels

_active: ChunkState | None = None


def active() -> ChunkState | None:
    """The chunked schedule running now, or None (no ``parallel.sequence_chunks``)."""
    return _active


@contextlib.contextmanager
def activate(state: ChunkState):
    """Make ``state`` the running schedule inside the block (forward and backward of chunks)."""
    global _active
    previous, _active = _active, state
    try:
        yield state
    finally:
        _active = previous


class _AddLaterGrads(torch.autograd.Function):
    """Identity whose backward adds the gradient later chunks accumulated in ``holder[0].grad``
    (``holder`` is a list so the leaf is not an input of this function)."""

    @staticmethod
    def forward(ctx, x, holder):
        ctx.holder = holder
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        leaf = ctx.holder[0]
        later = leaf.grad
        if later is not None:
            grad = grad + later
            leaf.grad = None
        return grad, None


def _leaf(x: torch.Tensor) -> torch.Tensor:
    return x.detach().requires_grad_(True)


class ChunkState:
    """The K/V store of one micro batch's chunked forward and backward.

    Attributes:
        num_chunks: ``K``.
        chunk: The chunk whose forward (or recomputed forward, in the backward) runs now.
        segment_ids: Packed documents: the ids ``[b, S]`` of the whole sequence (global order),
            else None.
    """

    def __init__(self, num_chunks: int, segment_ids: torch.Tensor | None = None):
        self.num_chunks = num_chunks
        self.chunk = 0
        self.segment_ids = segment_ids
        self._kv: dict[tuple[int, int], tuple[list, list]] = {}  # (id(layer), chunk) -> leaves

    def keys_values(self, layer, key: torch.Tensor, value: torch.Tensor):
        """``key`` / ``value`` of the current chunk (sequence first) -> the keys and values of
        chunks ``0 .. chunk``, concatenated along the sequence (earlier chunks' stored leaves,
        then this chunk's own, through :class:`_AddLaterGrads` when a graph is built)."""
        j = self.chunk
        slot = (id(layer), j)
        if slot not in self._kv:  # first forward of this (layer, chunk); a recompute reuses it
            self._kv[slot] = ([_leaf(key)], [_leaf(value)])
        own_k, own_v = self._kv[slot]
        if torch.is_grad_enabled():
            key = _AddLaterGrads.apply(key, own_k)
            value = _AddLaterGrads.apply(value, own_v)
        if j == 0:
            return key, value
        earlier = [self._kv[(id(layer), i)] for i in range(j)]
        return (torch.cat([k[0] for k, _ in earlier] + [key]),
                torch.cat([v[0] for _, v in earlier] + [value]))

    def ids(self, start: int, end: int, keys_end: int):
        """``(segment_ids, kv_segment_ids)`` of queries at global positions ``[start, end)`` and
        the keys ``[0, keys_end)`` (None, None without packed documents)."""
        if self.segment_ids is None:
            return None, None
        return self.segment_ids[:, start:end], self.segment_ids[:, :keys_end]

    def ids_up_to(self, keys_end: int):
        """The segment ids ``[b, keys_end]`` of the first ``keys_end`` positions (None without
        packed documents)."""
        return None if self.segment_ids is None else self.segment_ids[:, :keys_end]

    def release(self, chunk: int) -> None:
        """Drop the K/V of ``chunk`` (its backward is done: no later use)."""
        for slot in [s for s in self._kv if s[1] == chunk]:
            del self._kv[slot]


def attention(layer, query, key, value, *, cp_group=None, scale=None, dropout_p: float = 0.0):
    """Causal attention of the current chunk's queries over the K/V of chunks ``0 .. chunk``.

    Args:
        layer: The core-attention module (names its K/V store).
        query: ``[sq, b, np, hn]``: the chunk (under CP: this rank's two load-balanced pieces of
            it).
        key: ``[sq, b, ng, hn]``; value: ``[sq, b, ng, hv]``.
        cp_group: The context-parallel group, or None.
        scale: Softmax scale.
        dropout_p: Attention dropout.

    Returns:
        ``[sq, b, np, hv]``.
    """
    state = _active
    op = kernels.get("attention")
    q = query.permute(1, 2, 0, 3)  # [b, np, sq, hn]
    if cp_group is None or cp_group.size() == 1:
        key, value = state.keys_values(layer, key, value)
        k, v = (t.permute(1, 2, 0, 3) for t in (key, value))
        sk, sq = k.shape[2], q.shape[2]
        q_ids, k_ids = state.ids(sk - sq, sk, sk)
        return op(q, k, v, causal=True, segment_ids=q_ids, kv_segment_ids=k_ids, scale=scale,
                  dropout_p=dropout_p).permute(2, 0, 1, 3)
    from loong_core.engines.megatron.seam.context_parallel import attend_local_pieces, gather_sequence

    key, value = state.keys_values(layer, gather_sequence(key, cp_group),
                                   gather_sequence(value, cp_group))
    k, v = (t.permute(1, 2, 0, 3) for t in (key, value))  # [b, ng, prefix + chunk, hn]
    out = attend_local_pieces(q, k, v, cp_group, causal=True, segment_ids=state.ids_up_to(k.shape[2]),
                              scale=scale, dropout_p=dropout_p)
    return out.permute(2, 0, 1, 3)
