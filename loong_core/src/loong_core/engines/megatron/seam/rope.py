"""megatron-core's rotary embedding through ``kernels.get("rope")``.

megatron-core applies RoPE with the module-level ``apply_rotary_pos_emb`` of
``megatron.core.transformer.attention`` (no spec slot exists for it). :func:`install` replaces
that name with :func:`seam_apply_rotary_pos_emb`, which sends the layout the seam's ``rope`` op
covers (``[s, b, h, d]``, non-interleaved, no THD ``cu_seqlens``, ``mscale == 1``, not MLA's
interleaved-pair layout) to the resolved kernel. While ``kernels.rope`` is the plain ``torch``, the
common layout runs :mod:`.rotate_half` (megatron-core's unfused math, bit for bit, with fewer
copies) and everything else megatron-core's own function.
"""

from __future__ import annotations

from loong_core import kernels
from loong_core.engines.megatron.seam import rotate_half

_original = None


def seam_apply_rotary_pos_emb(t, freqs, config, cu_seqlens=None, mscale: float = 1.0,
                              cp_group=None):
    """Same arguments as megatron-core's ``apply_rotary_pos_emb``."""
    if (cu_seqlens is None and mscale == 1.0 and not config.rotary_interleaved
            and not config.multi_latent_attention and not kernels.is_plain("rope")):
        return kernels.get("rope")(t, freqs)
    if kernels.is_plain("rope") and rotate_half.covers(t, freqs, config, cu_seqlens, mscale):
        return rotate_half.apply(t, freqs)
    return _original(t, freqs, config, cu_seqlens=cu_seqlens, mscale=mscale, cp_group=cp_group)


def install() -> None:
    """Route megatron-core's attention RoPE through the seam (idempotent)."""
    global _original
    from megatron.core.transformer import attention

    if attention.apply_rotary_pos_emb is seam_apply_rotary_pos_emb:
        return
    _original = attention.apply_rotary_pos_emb
    attention.apply_rotary_pos_emb = seam_apply_rotary_pos_emb
