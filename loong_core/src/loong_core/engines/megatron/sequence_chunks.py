"""The chunked schedule ``parallel.sequence_chunks=K``: one micro batch's sequence runs through the
whole model in ``K`` chunks (causal order), and its backward in reverse chunk order.

Each chunk is a separate forward graph (the provider's ``model(...)`` call on the chunk's tokens,
labels and positions); the core attention keeps the K/V of earlier chunks and attends to them
(:mod:`.seam.chunked_attention`), the rotary embedding gives the chunk's positions
(:func:`install_rope_offsets`). :func:`run` returns to megatron-core's schedule one per-token
output for the whole micro batch (the chunks' outputs side by side) whose backward runs
``torch.autograd.backward`` on each chunk's output in reverse order, nested in the schedule's
backward as reentrant checkpointing is. So the loss is the unchunked one (the provider's loss
function sums over every loss token of the micro batch), and with full recompute only the
layer inputs and the K/V of all chunks stay live between the forward and the backward: a
recomputed layer's activations, the logits and the loss exist for one chunk at a time.

Under context parallelism the sequence is first cut into ``K`` global chunks; each is then laid
out over the CP group in megatron-core's load-balanced layout (``slice_batch`` per chunk).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from loong_core.engines.megatron.seam import chunked_attention
from loong_core.errors import ConfigError

# Keys of a decoder batch that carry the sequence on dim 1.
SEQUENCE_KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def split_batch(batch: dict, num_chunks: int, keys: tuple[str, ...] = SEQUENCE_KEYS) -> list[dict]:
    """The ``num_chunks`` consecutive pieces of a micro batch along the sequence (other keys are
    shared; packed documents' ``segment_ids`` are left out: :func:`run` takes those of the whole
    sequence).

    Raises:
        ConfigError: the batch has a dense attention mask, or its length does not split into
            ``num_chunks`` equal pieces.
    """
    if batch.get("attention_mask") is not None:
        raise ConfigError("parallel.sequence_chunks > 1 takes packed documents as segment_ids, not "
                          "as a dense attention_mask; set parallel.sequence_chunks=1.")
    seq = int(batch["tokens"].shape[1])
    if seq % num_chunks:
        raise ConfigError(f"a batch of sequence length {seq} cannot be split into "
                          f"parallel.sequence_chunks = {num_chunks} chunks; pad the sequences to a "
                          f"multiple of {num_chunks}.")
    size = seq // num_chunks
    chunks = []
    for j in range(num_chunks):
        piece = {k: v for k, v in batch.items() if k != "segment_ids"}
        for key in keys:
            if batch.get(key) is not None:
                piece[key] = batch[key][:, j * size:(j + 1) * size]
        chunks.append(piece)
    return chunks


def _offset_hook(module, args, kwargs):
    """A rotary embedding asked for ``max_seq_len`` positions (a chunk's length) gives those of
    the current chunk: ``offset = chunk x max_seq_len`` (under CP the length is the global
    chunk's, and megatron-core then keeps this rank's load-balanced pieces of it)."""
    state = chunked_attention.active()
    if state is None:
        return None
    length = args[0] if args else kwargs["max_seq_len"]
    if len(args) > 1 or kwargs.get("offset", 0):
        raise NotImplementedError("parallel.sequence_chunks: a rotary embedding called with an offset.")
    return args, {**kwargs, "offset": state.chunk * int(length)}


def install_rope_offsets(model) -> None:
    """Make the model's rotary embeddings (megatron-core's ``RotaryEmbedding`` and YaRN's, which
    compute the angles of ``[offset, offset + max_seq_len)``) follow the running chunk
    (idempotent; a no-op outside a chunked forward)."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    for module in model.modules():
        if isinstance(module, (RotaryEmbedding, YarnRotaryEmbedding)) and not getattr(
                module, "_loong_chunk_offsets", False):
            module.register_forward_pre_hook(_offset_hook, with_kwargs=True)
            module._loong_chunk_offsets = True


class _ReverseChunks(torch.autograd.Function):
    """The chunks' outputs side by side (``dim=1``); backward: each chunk's backward, last first."""

    @staticmethod
    def forward(ctx, anchor, state, outputs):
        ctx.state, ctx.outputs = state, outputs
        return torch.cat([out.detach() for out in outputs], dim=1)

    @staticmethod
    def backward(ctx, grad):
        state, outputs = ctx.state, ctx.outputs
        grads = grad.split([out.shape[1] for out in outputs], dim=1)
        with chunked_attention.activate(state):
            for j in reversed(range(len(outputs))):
                state.chunk = j  # what a recomputed layer of this chunk reads
                if outputs[j].requires_grad:
                    torch.autograd.backward(outputs[j], grads[j])
                outputs[j] = None
                state.release(j)
        ctx.outputs = ctx.state = None
        return None, None, None


def run(model, chunks: list[dict], forward_chunk: Callable[[dict], torch.Tensor],
        segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Run ``forward_chunk(chunk_batch) -> [b, c]`` (per-token outputs) for each chunk in order.

    ``segment_ids`` ``[b, S]``: packed documents, the ids of the whole sequence (global order).

    Returns:
        ``[b, sum c]``, the chunks' outputs side by side; its backward runs the chunks' backwards
        in reverse order (without a graph, e.g. under ``torch.no_grad``, just the outputs).
    """
    install_rope_offsets(model)
    state = chunked_attention.ChunkState(len(chunks), segment_ids)
    outputs = []
    with chunked_attention.activate(state):
        for j, chunk in enumerate(chunks):
            state.chunk = j
            outputs.append(forward_chunk(chunk))
    if not any(out.requires_grad for out in outputs):
        return torch.cat(outputs, dim=1)
    anchor = torch.zeros((), device=outputs[0].device, requires_grad=True)
    return _ReverseChunks.apply(anchor, state, outputs)


def check_provider(provider, model_name: str) -> None:
    """Raise unless the model runs its forward in chunks (``supports_sequence_chunks``)."""
    if not getattr(provider, "supports_sequence_chunks", False):
        raise ConfigError(f"model '{model_name}' does not support parallel.sequence_chunks > 1 "
                          "(the LLM families of loong-llm do); set parallel.sequence_chunks=1.")
