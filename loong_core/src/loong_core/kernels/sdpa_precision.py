"""torch's scaled-dot-product attention, run in fp32 where that is the faster way on a CPU.

On a CPU, SDPA's fused flash kernel in bf16 gains nothing in the forward over fp32 and loses in
the backward while the key sequence is short. Measured on a 2-vCPU AVX512-BF16 EPYC (torch 2.13,
2 threads, forward + backward of bf16 q/k/v, ``[b, h, s, d]``), bf16 kernel vs the same inputs cast
to fp32 and the output cast back:

============================  ========  ==========  =====
shape                          bf16      fp32 inside  ratio
============================  ========  ==========  =====
32 x 4 heads x 25, d 64       5.30 ms    2.29 ms     2.32
32 x 4 x 48, d 64             10.45 ms   5.71 ms     1.83
8 x 8 x 256 causal, d 64      36.89 ms   34.43 ms    1.07
4 x 8 x 256, d 32             11.33 ms   9.90 ms     1.14
4 x 8 x 512 causal, d 64      57.35 ms   65.32 ms    0.88
1 x 8 x 1024 causal, d 64     33.45 ms   42.93 ms    0.78
============================  ========  ==========  =====

So bf16 / fp16 attention (inputs in that dtype, or fp32 inputs under a CPU autocast that would
cast them) over at most :data:`CPU_FP32_MAX_KEYS` keys runs in fp32 with autocast off, and the
output comes back in the dtype SDPA would have returned. Policy heads and DiTs with a few dozen
tokens, vision windows and packed documents of a few hundred are the cases this serves (Wan's
text cross-attention too, through loong_diffusion's Wan processor); longer sequences and every
other device keep SDPA as called. fp32 is also the more exact of the two.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CPU_FP32_MAX_KEYS = 256
"""Longest key sequence attended in fp32 on a CPU (the crossover of the table above)."""

_REDUCED = (torch.bfloat16, torch.float16)


def _reduced_dtype(q: torch.Tensor) -> torch.dtype | None:
    """The bf16 / fp16 dtype SDPA would compute ``q`` in on a CPU (None: it would not)."""
    if q.device.type != "cpu":
        return None
    if q.dtype in _REDUCED:
        return q.dtype
    if q.dtype == torch.float32 and torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        return dtype if dtype in _REDUCED else None
    return None


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)``, in fp32 for bf16 /
    fp16 attention over at most :data:`CPU_FP32_MAX_KEYS` keys on a CPU (module docstring)."""
    dtype = _reduced_dtype(q)
    if dtype is None or k.shape[-2] > CPU_FP32_MAX_KEYS:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    mask = kwargs.get("attn_mask")
    if isinstance(mask, torch.Tensor) and mask.is_floating_point():
        kwargs["attn_mask"] = mask.float()
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs)
    return out.to(dtype)
