"""The ``kernels`` plugin: registers ``"<op>:<backend>"`` names only; nothing heavy is imported here."""

from __future__ import annotations

from loong_core.hookspecs import hookimpl

_REFERENCE = "loong_core.kernels.reference"
_TRITON = "loong_kernels.availability:triton_available"

# op -> module of loong_kernels.triton holding the kernel of the same name.
TRITON_OPS = {
    "rms_norm": "RMSNorm (fp32 statistics), optional fused residual add",
    "swiglu": "SiLU(gate) * up of a fused gate/up projection",
    "rope": "rotary embedding, any freqs (standard, llama3-scaled, MRoPE layouts)",
    "layer_norm_modulate": "LayerNorm then * (1 + scale) + shift (adaLN)",
    "cross_entropy": "vocab-parallel cross entropy with label smoothing",
    "linear_cross_entropy": "output projection + cross entropy over token x vocab tiles",
    "sparse_attention": "DeepSeek sparse attention over the selected keys, online softmax, LSE backward",
    "indexer_topk": "lightning-indexer scores tile by tile (tl.dot per head), top-k per query chunk",
}


@hookimpl
def loong_register_kernels(register):
    for op, description in TRITON_OPS.items():
        register(f"{op}:triton", f"loong_kernels.triton.{op}:{op}", reference=f"{_REFERENCE}:{op}",
                 available=_TRITON, description=f"Triton: {description}")
    register("linear_cross_entropy:chunked", "loong_kernels.chunked.linear_cross_entropy:linear_cross_entropy",
             reference=f"{_REFERENCE}:linear_cross_entropy", available="loong_kernels.availability:always",
             description="pure torch: token x vocab tiles, gradients tile by tile; the [N, V] logits never exist")
    register("gated_delta_rule:fla", "loong_kernels.fla.gated_delta_rule:gated_delta_rule",
             reference=f"{_REFERENCE}:gated_delta_rule", available="loong_kernels.availability:fla_available",
             description="flash-linear-attention's chunked Triton kernel; packed documents as cu_seqlens")
