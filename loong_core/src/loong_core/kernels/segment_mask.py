"""Packed documents as segment ids instead of a dense ``[s, s]`` attention mask.

Packed samples (several documents per sequence) carry ``segment_ids`` ``[s]``: the document of
each position (padding after the last document is one more segment). A position attends to
itself and earlier positions of its own segment: the block-diagonal causal mask, which is never
built unless a consumer needs it.

megatron-core's model interfaces take an ``attention_mask`` tensor and only pass it down to the
core attention, so the segment ids travel there as a :class:`SegmentMask`: an integer tensor
``[b, s]`` whose type says "block-diagonal causal mask of these segments". The seam's core
attention reads the ids directly (the varlen path of ``kernels.attention``); under context
parallelism the ids of the whole sequence stay whole (every rank of the group has them) and each
rank's attention takes its chunks' query ids and its key prefix's ids from them.
:meth:`SegmentMask.dense` is the megatron-convention boolean mask for a consumer that needs it.

Imports only torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SegmentMask(torch.Tensor):
    """The block-diagonal causal attention mask of packed documents, held as segment ids.

    An ``int`` tensor ``[b, s]`` (use :func:`segment_mask` to make one); operations on it (moving
    it to a device, slicing the batch) keep the type.
    """

    def segment_ids(self) -> torch.Tensor:
        """The ids as a plain tensor ``[b, s]``."""
        return self.as_subclass(torch.Tensor)

    def dense(self) -> torch.Tensor:
        """The same mask densely: ``bool [b, 1, s, s]``, True = masked (megatron's convention)."""
        return dense_mask(self.segment_ids()).unsqueeze(1)


class BlockDiagonalMask(torch.Tensor):
    """Attention within groups of positions, both ways (vision windows, the patches of a frame),
    held as group ids: a position attends to every position with its id, earlier or later, and to
    no other. The positions of a group need not be contiguous.

    An ``int`` tensor ``[b, s]`` (use :func:`block_diagonal_mask`); the seam's core attention reads
    the ids directly (the varlen path of ``kernels.attention``), so no ``[s, s]`` mask is built.
    """

    def segment_ids(self) -> torch.Tensor:
        """The ids as a plain tensor ``[b, s]``."""
        return self.as_subclass(torch.Tensor)

    def dense(self) -> torch.Tensor:
        """The same mask densely: ``bool [b, 1, s, s]``, True = masked (another group)."""
        ids = self.segment_ids()
        return (ids[..., :, None] != ids[..., None, :]).unsqueeze(1)


def block_diagonal_mask(group_ids: torch.Tensor) -> BlockDiagonalMask:
    """``group_ids`` ``[b, s]`` as the :class:`BlockDiagonalMask` the seam's attention understands."""
    return group_ids.as_subclass(BlockDiagonalMask)


def segment_mask(segment_ids: torch.Tensor) -> SegmentMask:
    """``segment_ids`` ``[b, s]`` as the :class:`SegmentMask` the seam's attention understands."""
    return segment_ids.as_subclass(SegmentMask)


def document_segment_ids(doc_lengths: Sequence[int], seq_length: int) -> torch.Tensor:
    """Segment id of every position of a packed sequence.

    Args:
        doc_lengths: Positions of each document, in order; positions past their sum (padding)
            form one more segment.
        seq_length: Sequence length.

    Returns:
        ``int32 [seq_length]``.

    Raises:
        ValueError: The documents do not fit.
    """
    total = sum(doc_lengths)
    if total > seq_length:
        raise ValueError(f"documents of {total} positions do not fit in {seq_length}")
    lengths = torch.tensor([*doc_lengths, seq_length - total], dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(len(lengths), dtype=torch.int32), lengths)


def dense_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """The block-diagonal causal mask of ``segment_ids`` ``[..., s]``: ``bool [..., s, s]``,
    True = masked (another segment, or a later position)."""
    s = segment_ids.shape[-1]
    same = segment_ids[..., :, None] == segment_ids[..., None, :]
    causal = torch.ones(s, s, dtype=torch.bool, device=segment_ids.device).tril()
    return ~(same & causal)


def with_attention_mask(batch: dict) -> dict:
    """The batch with its ``segment_ids`` (if any) turned into the ``attention_mask`` a megatron
    model takes: a :class:`SegmentMask` (``[b, s]``, never an ``[s, s]`` mask; under context
    parallelism it is not sliced, see ``engines.megatron.context_parallel.slice_batch``).

    Args:
        batch: A micro batch; ``segment_ids`` ``[b, s]`` when its samples are packed.
    """
    if batch.get("segment_ids") is None:
        return batch
    batch = dict(batch)
    batch["attention_mask"] = segment_mask(batch.pop("segment_ids"))
    return batch
