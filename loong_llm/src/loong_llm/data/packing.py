"""Sequence packing: several documents per sequence, attention and positions restarting at each.

A document of ``L`` tokens contributes ``L - 1`` positions to a sequence (inputs ``ids[:-1]``,
labels ``ids[1:]``). Each position sees only earlier positions of its own document: the
attention mask is block-diagonal and causal, carried as segment ids. Position ids restart at 0
per document (megatron's RoPE rotates by the position in the sequence instead, which gives the same attention scores:
RoPE scores depend only on the distance between query and key, and never cross documents).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import torch

from loong_core.kernels.segment_mask import dense_mask, document_segment_ids
from loong_llm.data.config import PACK_ALGORITHMS

#: Items packed together by ``best_fit`` (consecutive in the shuffled order).
BEST_FIT_WINDOW = 1024


def pack(sizes: Sequence[int], capacity: int, algorithm: str = "best_fit",
         rng: np.random.Generator | None = None) -> list[list[int]]:
    """Group items into bins of at most ``capacity`` positions with ``algorithm``
    (:func:`pack_best_fit` or :func:`pack_next_fit`).

    Args:
        sizes: Positions each item needs, each in ``[1, capacity]``.
        capacity: Positions per sequence.
        algorithm: ``best_fit`` or ``next_fit`` (``data.pack_algorithm``).
        rng: Orders ``best_fit``'s bins (see there); ``next_fit`` keeps the input order.

    Returns:
        Item indices per bin; every item is in exactly one bin.
    """
    if algorithm == "best_fit":
        return pack_best_fit(sizes, capacity, rng=rng)
    if algorithm == "next_fit":
        return pack_next_fit(sizes, capacity)
    raise ValueError(f"unknown packing algorithm {algorithm!r}; choose one of {', '.join(PACK_ALGORITHMS)}")


def _check_sizes(sizes: Sequence[int], capacity: int) -> None:
    for i, size in enumerate(sizes):
        if not 1 <= size <= capacity:
            raise ValueError(f"item {i} needs {size} positions; each must be in [1, {capacity}]")


def pack_best_fit(sizes: Sequence[int], capacity: int, window: int = BEST_FIT_WINDOW,
                  rng: np.random.Generator | None = None) -> list[list[int]]:
    """Best-fit decreasing over consecutive windows of ``window`` items.

    Inside a window the items are placed largest first (ties in input order), each into the open
    bin it fills most, or a new bin when none has room. Few positions stay empty: 3.6% on the
    VLM benchmark's LLaVA records against next fit's 9.4% (``benchmarks/packing_fill.py``,
    docs/vlm_data.md). Items of one window never share a bin with another window's, so a
    shuffled input still gives different bins every epoch, and the work stays ``O(n window)``
    however long the epoch. Largest first also puts items of similar sizes together.

    Args:
        sizes: Positions each item needs, each in ``[1, capacity]``.
        capacity: Positions per sequence.
        window: Items packed together.
        rng: Draws the order of each window's bins. Without one they come in the order of their
            first item, which is not random even for a shuffled input: a bin of many small
            items is more likely to hold an early one, so such bins would come first.

    Returns:
        Item indices per bin, each bin in input order.
    """
    _check_sizes(sizes, capacity)
    bins: list[list[int]] = []
    for start in range(0, len(sizes), window):
        items = sorted(range(start, min(len(sizes), start + window)), key=lambda i: -sizes[i])
        window_bins: list[list[int]] = []
        room: list[tuple[int, int]] = []  # (free positions, bin), ascending
        for i in items:
            slot = bisect.bisect_left(room, (sizes[i], -1))  # the fullest bin with room
            if slot < len(room):
                free, b = room.pop(slot)
            else:
                free, b = capacity, len(window_bins)
                window_bins.append([])
            window_bins[b].append(i)
            bisect.insort(room, (free - sizes[i], b))
        window_bins = [sorted(b) for b in window_bins]
        if rng is None:
            bins.extend(sorted(window_bins, key=lambda b: b[0]))
        else:
            bins.extend(window_bins[j] for j in rng.permutation(len(window_bins)))
    return bins


def pack_next_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Group consecutive items into bins of at most ``capacity`` (order is kept).

    Args:
        sizes: Positions each item needs, each in ``[1, capacity]``.
        capacity: Positions per sequence.

    Returns:
        Item indices per bin, in order; every item is in exactly one bin.
    """
    _check_sizes(sizes, capacity)
    bins: list[list[int]] = []
    used = capacity
    for i, size in enumerate(sizes):
        if used + size > capacity:
            bins.append([])
            used = 0
        bins[-1].append(i)
        used += size
    return bins


def block_causal_mask(doc_lengths: Sequence[int], seq_length: int) -> torch.Tensor:
    """Attention mask keeping each document to itself, causal inside it (dense; the samples carry
    the compact ``segment_ids`` instead, see :mod:`loong_core.kernels.segment_mask`).

    Args:
        doc_lengths: Positions of each document, in order; positions past their sum (padding)
            form one more block.
        seq_length: Sequence length.

    Returns:
        ``bool[1, seq_length, seq_length]``, True where attention is *masked* (megatron's
        convention).
    """
    return dense_mask(document_segment_ids(doc_lengths, seq_length)).unsqueeze(0)


def packed_sample(docs: Sequence[tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int,
                  with_mask: bool = True) -> dict[str, torch.Tensor]:
    """One training sample from whole documents.

    Args:
        docs: ``(ids, loss)`` per document: token ids and a 0/1 array saying which *tokens* are
            trained on (as targets). Documents longer than ``seq_length + 1`` are truncated.
        seq_length: Positions per sample; the documents' ``L - 1`` positions must fit.
        pad_id: Token fed at padded positions (never a target: loss mask 0).
        with_mask: Add ``segment_ids`` (``int32 [s]``: the document of each position, padding one
            more), which keep the documents apart in attention: the block-diagonal causal mask,
            never built as an ``[s, s]`` tensor (the model's forward step turns the ids into a
            :class:`~loong_core.kernels.segment_mask.SegmentMask`).

    Returns:
        ``tokens``, ``labels``, ``position_ids`` (int64 ``[s]``), ``loss_mask`` (float32 ``[s]``)
        and, with ``with_mask``, ``segment_ids`` (int32 ``[s]``).
    """
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, pad_id, dtype=np.int64)
    loss = np.zeros(seq_length, dtype=np.float32)
    positions = np.zeros(seq_length, dtype=np.int64)
    lengths = []
    start = 0
    for ids, mask in docs:
        ids, mask = ids[: seq_length + 1], mask[: seq_length + 1]
        n = len(ids) - 1
        if n < 1:
            continue
        if start + n > seq_length:
            raise ValueError(f"documents need more than {seq_length} positions")
        tokens[start: start + n] = ids[:-1]
        labels[start: start + n] = ids[1:]
        loss[start: start + n] = mask[1:]
        positions[start: start + n] = np.arange(n)
        lengths.append(n)
        start += n
    positions[start:] = np.arange(seq_length - start)
    sample = {
        "tokens": torch.from_numpy(tokens),
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss),
        "position_ids": torch.from_numpy(positions),
    }
    if with_mask:
        sample["segment_ids"] = document_segment_ids(lengths, seq_length)
    return sample
