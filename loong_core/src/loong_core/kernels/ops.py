"""The ops of the kernel seam: canonical names, what each computes and its plain backend.

This module is light (no torch): the config schema, the validator, ``loong doctor`` and the
banner read it without importing any kernel.
"""

from __future__ import annotations

# op -> one-line description (the signature and semantics live in loong_core.kernels.reference).
OPS: dict[str, str] = {
    "rms_norm": "RMSNorm over the last dim (optional fused residual add)",
    "swiglu": "silu(gate) * up of a [gate; up] fc1 output",
    "rope": "rotary embedding, megatron-core [s, b, h, d] layout (standard / llama3 / MRoPE freqs)",
    "layer_norm_modulate": "LayerNorm then * (1 + scale) + shift (adaLN of DiTs)",
    "cross_entropy": "per-token cross entropy over (vocab-parallel) logits",
    "linear_cross_entropy": "cross entropy of hidden @ weight.T without keeping all logits",
    "sparse_attention": "attention over per-query selected keys (DeepSeek sparse attention)",
    "indexer_topk": "lightning-indexer scores and their causal top-k (DeepSeek sparse attention)",
    "gated_delta_rule": "Gated DeltaNet linear attention, chunked, packed documents (Qwen3-Next)",
    "attention": "softmax attention: causal, GQA, packed documents / windows (segment ids)",
}

# Ops without a ``compile`` backend (their references loop over chunks in Python).
NO_COMPILE: frozenset[str] = frozenset({"attention", "sparse_attention", "indexer_topk",
                                         "gated_delta_rule"})

# op -> the backend that is the plain path: what ``auto`` falls back to when no preferred
# backend is available, and the one whose semantics every other backend reproduces.
PLAIN: dict[str, str] = {op: "torch" for op in OPS}
PLAIN["attention"] = "sdpa"

# ``meta['auto_on']`` entry meaning every device type.
ANY_DEVICE = "*"

# Backends that ``auto`` picks on a device type when a plugin registers them without saying
# (``meta['auto_on']`` overrides): the Triton kernels (loong's, flash-linear-attention's) on CUDA.
# Higher priority wins.
DEFAULT_AUTO_ON: dict[str, tuple[str, ...]] = {"triton": ("cuda",), "fla": ("cuda",)}
DEFAULT_AUTO_PRIORITY: dict[str, int] = {"triton": 100, "fla": 100}

# ``auto`` picks the ``compile`` backends (each reference under ``torch.compile``) on CPU for runs
# of at least this many steps. Measured end to end on the default experiment
# (benchmarks/compile_end_to_end.py, docs/kernels.md): compiled, a step is 0.047 s (7%) faster;
# compiling every op with an empty inductor cache cost 22 s more than with a warm one, which
# those savings recover after ~470 steps. Twice that, for a margin over one noisy run per arm:
# shorter runs (the test suite's, the default experiment's 300, vlm_digits' 600) and everything
# outside ``loong train`` keep the references.
COMPILE_AUTO_MIN_STEPS_CPU = 1000
