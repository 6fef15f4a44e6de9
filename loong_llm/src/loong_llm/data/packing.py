"""Sequence packing: several documents per sequence, attention and positions restarting at each.

A document of ``L`` tokens contributes ``L - 1`` positions to a sequence (inputs ``ids[:-1]``,
labels ``ids[1:]``). Each position sees only earlier positions of its own document: the
attention mask is block-diagonal and causal. Position ids restart at 0 per document (megatron's
RoPE rotates by the position in the sequence instead, which gives the same attention scores:
RoPE scores depend only on the distance between query and key, and never cross documents).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def pack_next_fit(sizes: Sequence[int], capacity: int) -> list[list[int]]:
    """Group consecutive items into bins of at most ``capacity`` (order is kept).

    Args:
        sizes: Positions each item needs, each in ``[1, capacity]``.
        capacity: Positions per sequence.

    Returns:
        Item indices per bin, in order; every item is in exactly one bin.
    """
    bins: list[list[int]] = []
    used = capacity
    for i, size in enumerate(sizes):
        if not 1 <= size <= capacity:
            raise ValueError(f"item {i} needs {size} positions; each must be in [1, {capacity}]")
        if used + size > capacity:
            bins.append([])
            used = 0
        bins[-1].append(i)
        used += size
    return bins


def block_causal_mask(doc_lengths: Sequence[int], seq_length: int) -> torch.Tensor:
    """Attention mask keeping each document to itself, causal inside it.

    Args:
        doc_lengths: Positions of each document, in order; positions past their sum (padding)
            form one more block.
        seq_length: Sequence length.

    Returns:
        ``bool[1, seq_length, seq_length]``, True where attention is *masked* (megatron's
        convention).
    """
    doc_id = np.full(seq_length, len(doc_lengths), dtype=np.int64)
    start = 0
    for k, n in enumerate(doc_lengths):
        doc_id[start: start + n] = k
        start += n
    if start > seq_length:
        raise ValueError(f"documents of {start} positions do not fit in {seq_length}")
    ids = torch.from_numpy(doc_id)
    same = ids[:, None] == ids[None, :]
    causal = torch.ones(seq_length, seq_length, dtype=torch.bool).tril()
    return (~(same & causal)).unsqueeze(0)


def packed_sample(docs: Sequence[tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int,
                  with_mask: bool = True) -> dict[str, torch.Tensor]:
    """One training sample from whole documents.

    Args:
        docs: ``(ids, loss)`` per document: token ids and a 0/1 array saying which *tokens* are
            trained on (as targets). Documents longer than ``seq_length + 1`` are truncated.
        seq_length: Positions per sample; the documents' ``L - 1`` positions must fit.
        pad_id: Token fed at padded positions (never a target: loss mask 0).
        with_mask: Add the block-diagonal ``attention_mask``.

    Returns:
        ``tokens``, ``labels``, ``position_ids`` (int64 ``[s]``), ``loss_mask`` (float32 ``[s]``)
        and, with ``with_mask``, ``attention_mask`` (bool ``[1, s, s]``).
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
        sample["attention_mask"] = block_causal_mask(lengths, seq_length)
    return sample
