"""megatron-core's vocab-parallel cross entropy takes its row maximum with ``torch.amax``.

``VocabParallelCrossEntropy.calculate_logits_max`` calls ``torch.max(logits, dim=-1)[0]``, which
also computes (and discards) the arg-max indices: on the default CPU experiment's ``[2048, 4096]``
logits that takes 4-5 ms, ``torch.amax`` 0.75 ms. The values are the same (NaN included), so the
loss and its gradient are bit-identical. :func:`install` replaces the static method
(process-wide, idempotent); the original is kept in :data:`_original`.
"""

from __future__ import annotations

import torch

_original = None


def calculate_logits_max(vocab_parallel_logits: torch.Tensor):
    """Same contract as megatron-core's: ``(fp32 logits, their maximum over the vocabulary)``."""
    vocab_parallel_logits = vocab_parallel_logits.float()
    return vocab_parallel_logits, torch.amax(vocab_parallel_logits, dim=-1)


def install() -> None:
    """Route megatron-core's cross-entropy maximum through :func:`calculate_logits_max`."""
    global _original
    from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy

    current = VocabParallelCrossEntropy.__dict__["calculate_logits_max"]
    if getattr(current, "__func__", None) is calculate_logits_max:
        return
    _original = current
    VocabParallelCrossEntropy.calculate_logits_max = staticmethod(calculate_logits_max)
