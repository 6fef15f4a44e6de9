"""LLM dense arms of ``benchmarks/peers.py``: ``benchmarks/throughput.py``'s arms, unchanged.

``loong``: ``loong train experiment=llama_shakespeare`` (megatron engine) at the shape;
``transformers``: ``LlamaForCausalLM`` (SDPA) + torch AdamW + clipping; ``mcore``: the bare
megatron-core loop on loong's layer spec (what is left between it and ``loong`` is framework
overhead); ``loong_auto``: ``loong`` with its default ``kernels=auto``; ``loong_bf16``: ``loong`` in bf16
mixed precision; ``transformers_bf16``: ``transformers`` under bf16 autocast. See ``throughput.py``
for each arm's details.
"""

from __future__ import annotations

import os

import throughput

SHAPES = {
    "default": throughput.SIZES["default"],
    "smoke": dict(hidden=64, layers=2, heads=4, groups=2, ffn=128, seq=64, batch=2),
}
UNIT = "tokens"
_COMMON = f"AdamW fused, fp32, {os.cpu_count()} threads, random tokens"
ARMS = {
    "loong": f"`loong train` megatron engine, kernels=torch, optim.implementation=fused, fp32, "
             f"{os.cpu_count()} threads, Shakespeare tokens",
    "loong_auto": f"the same with kernels=auto (loong's default: per-op picks, may compile), "
                  f"{os.cpu_count()} threads",
    "loong_bf16": "the same in bf16 mixed precision (parallel.mixed_precision=bf16: bf16 weights and compute, "
                  "fp32 main weights, gradients and Adam state)",
    "transformers": f"LlamaForCausalLM, attn_implementation=sdpa, {_COMMON}",
    "transformers_bf16": "the same in bf16 autocast (Trainer(bf16=True) on a CPU: fp32 weights, gradients and "
                         "Adam state)",
    "mcore": f"bare megatron-core loop on loong's layer spec, {_COMMON}",
}


def units(shape: dict) -> int:
    return shape["batch"] * shape["seq"]


def describe(shape: dict) -> str:
    return (f"Llama: hidden {shape['hidden']}, {shape['layers']} layers, heads {shape['heads']}/{shape['groups']}, "
            f"SwiGLU {shape['ffn']}, vocabulary {throughput.VOCAB}, seq {shape['seq']}, batch {shape['batch']} "
            f"({units(shape)} tokens/step), AdamW lr {throughput.OPTIM['lr']}, weight decay "
            f"{throughput.OPTIM['weight_decay']}, clip {throughput.OPTIM['clip']}")


def run(arm: str, shape: dict, steps: int) -> list[float]:
    throughput.KERNELS = "auto" if arm == "loong_auto" else "torch"
    throughput.OPTIMIZER = "fused"
    throughput.PRECISION = "bf16" if arm.endswith("_bf16") else "fp32"
    return getattr(throughput, f"arm_{arm.removesuffix('_auto').removesuffix('_bf16')}")(shape, steps)
