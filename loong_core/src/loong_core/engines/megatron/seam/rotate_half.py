"""megatron-core's unfused rotary embedding (``rotate_half``, bshd) with its own backward.

megatron-core's ``_apply_rotary_pos_emb_bshd`` computes ``t * cos + rotate_half(t) * sin`` with
``rotate_half(x) = cat(-x2, x1)``, then concatenates the (usually empty) unrotated tail back on:
two full copies of the query / key in the forward and a third (``chunk``'s backward) in the
backward, per layer. :class:`RotateHalfRope` computes the same products and sums (so forward and
gradient are bit-identical to megatron-core's, whatever the dtype) with the rotated copy written in
place and no tail concatenation. On the default CPU experiment that removes about 1% of a step.

With ``batch_major`` (the seam's core attention consumes the result: see :func:`mark_batch_major`)
the ``[s, b, h, d]`` result is stored batch-major, ``[b, s, h, d]`` in memory: the seam's
attention permutes it to ``[b, h, s, d]``, and SDPA's CPU kernel reads (and its backward writes)
rows that lie ``h * d`` apart instead of ``b * h * d`` apart: the layout transformers' attention
gets from its ``[b, s, h * d]`` projections (about 1 ms of 14 per layer's SDPA forward and backward
on the default CPU experiment). The values are the same either way.
"""

from __future__ import annotations

import torch


class RotateHalfRope(torch.autograd.Function):
    """``t * cos + rotate_half(t) * sin`` over the whole last dim of ``t``; ``cos`` / ``sin``
    broadcast against ``t`` and have its dtype."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                batch_major: bool = False) -> torch.Tensor:
        half = t.shape[-1] // 2
        rotated, out = _empty(t, batch_major), _empty(t, batch_major)
        torch.neg(t[..., half:], out=rotated[..., :half])
        rotated[..., half:].copy_(t[..., :half])
        torch.mul(t, cos, out=out)
        rotated *= sin
        out += rotated
        ctx.save_for_backward(cos, sin)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        half = grad.shape[-1] // 2
        grad_sin = grad * sin
        # The transpose of rotate_half: [y1, y2] -> [y2, -y1].
        grad_t = torch.empty_like(grad_sin)
        grad_t[..., :half].copy_(grad_sin[..., half:])
        torch.neg(grad_sin[..., :half], out=grad_t[..., half:])
        grad_t += grad * cos
        return grad_t, None, None, None


def _empty(t: torch.Tensor, batch_major: bool) -> torch.Tensor:
    """An uninitialised tensor shaped like ``t [s, b, ...]``: contiguous, or stored batch-major."""
    if not batch_major:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return torch.empty((t.shape[1], t.shape[0], *t.shape[2:]), dtype=t.dtype, device=t.device).transpose(0, 1)


_BATCH_MAJOR = "loong_rope_batch_major"


def mark_batch_major(config) -> None:
    """Declare that every consumer of the RoPE outputs of ``config``'s model takes any strides (the
    seam's core attention calls this for its config), so :func:`apply` stores them batch-major.

    megatron-core's own ``DotProductAttention`` ``view``s the key and so needs the contiguous
    ``[s, b, h, d]``: a model without the seam's attention keeps it (the routed RoPE is one
    function for the whole process).
    """
    setattr(config, _BATCH_MAJOR, True)


def batch_major(config) -> bool:
    """:func:`mark_batch_major` was called for ``config``."""
    return bool(getattr(config, _BATCH_MAJOR, False))


def covers(t: torch.Tensor, freqs: torch.Tensor, config, cu_seqlens, mscale: float) -> bool:
    """The call is one :func:`apply` reproduces: bshd, rotate-half (not interleaved, not MLA's
    pair layout), no fusion, ``mscale == 1`` and the rotation over the whole head dim."""
    return (cu_seqlens is None and mscale == 1.0 and not config.rotary_interleaved
            and not config.multi_latent_attention and not config.apply_rope_fusion
            and freqs.shape[-1] == t.shape[-1] and t.shape[-1] % 2 == 0)


def apply(t: torch.Tensor, freqs: torch.Tensor, batch_major: bool = False) -> torch.Tensor:
    """Rotary embedding of ``t [s, b, h, d]`` by the fp32 angles ``freqs [s, b or 1, 1, d]``, as
    megatron-core's unfused function (cos / sin taken in fp32, then cast to ``t``'s dtype); with
    ``batch_major`` the result is stored ``[b, s, h, d]`` in memory (same shape and values)."""
    return RotateHalfRope.apply(t, torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype),
                                batch_major and t.dim() == 4 and t.shape[1] > 1)
