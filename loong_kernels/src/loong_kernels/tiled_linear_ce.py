"""Linear cross entropy over token x vocab tiles: the ``[N, V]`` logits never exist at once.

``loss = cross_entropy(hidden @ weight.T, labels)`` is computed tile by tile: for each vocab chunk
of ``weight`` and each token chunk of ``hidden`` one ``[tokens, vocab]`` tile of logits is made by a
matrix product, folded into per-token statistics and dropped. The backward recomputes each tile,
turns it into its logits gradient in place and multiplies it into the hidden and weight gradients
(fp32 accumulators), so the peak extra memory is one tile plus the gradients themselves.

The per-tile math comes from a *tiles* backend (a module with ``tile_stats`` and ``tile_grad``):
Triton kernels (:mod:`loong_kernels.triton.cross_entropy`) or plain torch
(:mod:`loong_kernels.chunked.tiles`). Under a tensor-parallel ``group`` ``weight`` is this rank's
vocab shard; the statistics are combined by :func:`loong_kernels.vocab.finish`, and the hidden
gradient is this shard's contribution, as the reference's autograd gives it (the caller's
parallel region reduces it).
"""

from __future__ import annotations

from types import ModuleType

import torch

from loong_kernels import vocab

TOKEN_CHUNK = 2048
VOCAB_CHUNK = 8192


def _add_product(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` in fp32 (in place when the dtypes already agree)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        acc.add_(torch.mm(a, b))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, label_smoothing, group, tiles, token_chunk, vocab_chunk):
        h = hidden.reshape(-1, hidden.shape[-1])
        n, v_local = h.shape[0], weight.shape[0]
        local_labels = (labels.reshape(-1).long() - vocab.shard_start(v_local, group)).contiguous()
        stats = vocab.new_stats(n, h.device)
        for v0 in range(0, v_local, vocab_chunk):
            w = weight[v0:v0 + vocab_chunk]
            for t0 in range(0, n, token_chunk):
                t1 = t0 + token_chunk
                tiles.tile_stats(torch.mm(h[t0:t1], w.t()), local_labels[t0:t1], v0, stats[:, t0:t1])
        loss, lse = vocab.finish(stats, v_local, label_smoothing, group)
        ctx.save_for_backward(h, weight, local_labels, lse)
        ctx.meta = (tiles, token_chunk, vocab_chunk, vocab.smoothing_coefficient(label_smoothing, v_local),
                    hidden.shape)
        return loss.view(labels.shape)

    @staticmethod
    def backward(ctx, grad):
        h, weight, local_labels, lse = ctx.saved_tensors
        tiles, token_chunk, vocab_chunk, a, hidden_shape = ctx.meta
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, v_local = h.shape[0], weight.shape[0]
        g = grad.reshape(-1).float().contiguous()
        dh = torch.zeros(h.shape, device=h.device, dtype=torch.float32) if need_h else None
        dw = torch.zeros_like(weight) if need_w else None
        for v0 in range(0, v_local, vocab_chunk):
            w = weight[v0:v0 + vocab_chunk]
            dw_chunk = None
            if need_w:
                dw_chunk = dw[v0:v0 + vocab_chunk] if dw.dtype == torch.float32 else \
                    torch.zeros(w.shape, device=w.device, dtype=torch.float32)
            for t0 in range(0, n, token_chunk):
                t1 = t0 + token_chunk
                z = torch.mm(h[t0:t1], w.t())
                tiles.tile_grad(z, z, local_labels[t0:t1], v0, lse[t0:t1], g[t0:t1], 1.0 - a, a / v_local)
                if need_h:
                    _add_product(dh[t0:t1], z, w)
                if need_w:
                    _add_product(dw_chunk, z.t(), h[t0:t1])
            if need_w and dw_chunk.data_ptr() != dw[v0:v0 + vocab_chunk].data_ptr():
                dw[v0:v0 + vocab_chunk] = dw_chunk
        dh = dh.to(h.dtype).view(hidden_shape) if need_h else None
        return dh, dw, None, None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, label_smoothing: float,
                         group, tiles: ModuleType, token_chunk: int = TOKEN_CHUNK,
                         vocab_chunk: int = VOCAB_CHUNK) -> torch.Tensor:
    """Per-token fp32 loss of ``cross_entropy(hidden @ weight.T, labels)`` over tiles.

    Args:
        hidden: ``[N, H]`` (or ``[..., H]`` with ``labels [...]``).
        weight: ``[V_local, H]``, the output layer or tied embedding (shard).
        labels: Global target ids.
        label_smoothing: megatron-core's label smoothing, in ``[0, 1)``.
        group: Tensor-parallel group of the vocab shards, or None.
        tiles: The tile backend (``tile_stats`` / ``tile_grad``).
        token_chunk: Tokens per tile.
        vocab_chunk: Vocab rows per tile.

    Returns:
        fp32 loss of ``labels``' shape.
    """
    if token_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"token_chunk and vocab_chunk must be positive, got {token_chunk}, {vocab_chunk}")
    return _LinearCrossEntropy.apply(hidden, weight, labels, float(label_smoothing), group, tiles, token_chunk,
                                     vocab_chunk)
