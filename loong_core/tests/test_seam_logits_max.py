"""megatron-core's cross-entropy maximum through ``amax``: the same values, NaN and inf included."""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.cross_entropy import VocabParallelCrossEntropy

from loong_core.engines.megatron.seam import logits_max


def test_amax_maximum_equals_megatron_cores():
    logits_max.install()
    logits_max.install()  # idempotent: the original stays megatron-core's
    original = logits_max._original.__func__
    assert original is not logits_max.calculate_logits_max
    assert VocabParallelCrossEntropy.calculate_logits_max is logits_max.calculate_logits_max
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 97, generator=generator).to(torch.bfloat16)
    logits[0, 0, 3] = float("nan")
    logits[1, 2, :] = float("-inf")
    logits[2, 4, 7] = float("inf")
    ours_logits, ours = VocabParallelCrossEntropy.calculate_logits_max(logits)
    ref_logits, ref = original(logits)
    assert ours.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(ours_logits, ref_logits, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(ours, ref, rtol=0, atol=0, equal_nan=True)
    assert torch.isnan(ours[0, 0]) and torch.isnan(ref[0, 0])
