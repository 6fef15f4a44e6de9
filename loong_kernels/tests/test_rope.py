"""rope:triton equals the torch reference for every layout of angles megatron-core produces."""

from __future__ import annotations

import pytest
import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import (
    MultimodalRotaryEmbedding,
    RotaryEmbedding,
)

from loong_core.kernels import reference
from loong_kernels.testing import check
from loong_kernels.triton.rope import rope

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def _cpu_backend():
    """megatron-core's rotary modules ask for CUDA; the cpu backend redirects that."""
    from loong_core.devices.select import select_device

    select_device("cpu").setup()
S, B, H, D = 7, 2, 3, 16


def _standard(seq: int, **kwargs) -> torch.Tensor:
    return RotaryEmbedding(D, kwargs.pop("rotary_percent", 1.0), use_cpu_initialization=True, **kwargs)(seq)


def _mrope_positions(seq: int) -> torch.Tensor:
    """[3, b, s] time / height / width ids: text, then a 2x3 image grid, then text again."""
    pos = torch.arange(seq).repeat(3, B, 1)
    pos[1, :, 2:5] = torch.tensor([1, 1, 2])
    pos[2, :, 2:5] = torch.tensor([0, 1, 2])
    return pos


LAYOUTS = {
    "standard": lambda: _standard(S),
    "llama3_scaled": lambda: _standard(S, rope_scaling=True, rope_scaling_factor=8.0, rotary_base=500000),
    "partial_rotary": lambda: _standard(S, rotary_percent=0.5),  # d_rot = 8 of 16: the rest passes through
    "qwen2_5_vl_mrope": lambda: MultimodalRotaryEmbedding(D, 1.0)(_mrope_positions(S), [2, 3, 3]),
    "unequal_halves": lambda: torch.randn(S, B, 1, D) * 3,  # any angles, both halves read
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rope_matches_reference(dtype, layout):
    freqs = LAYOUTS[layout]()
    t = torch.randn(S, B, H, D, dtype=dtype)
    check(lambda a: rope(a, freqs), lambda a: reference.rope(a, freqs), [t], dtype, f"rope {layout} {dtype}")


def test_rope_qwen3_vl_interleaved_mrope():
    interleaved = pytest.importorskip("loong_vlm.qwen3_vl.rope")
    freqs = interleaved.InterleavedMRoPE(D, 1.0)(_mrope_positions(S), [2, 3, 3])
    t = torch.randn(S, B, H, D)
    check(lambda a: rope(a, freqs), lambda a: reference.rope(a, freqs), [t], torch.float32, "rope qwen3_vl")


def test_rope_reads_strided_queries():
    """Queries as megatron splits them out of a fused QKV projection (a non-contiguous view)."""
    qkv = torch.randn(S, B, H, 3 * D)
    freqs = _standard(S)
    check(lambda a: rope(a[..., :D], freqs), lambda a: reference.rope(a[..., :D], freqs), [qkv], torch.float32,
          "rope strided")
