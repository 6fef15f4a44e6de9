"""The torch engine's seam on transformers models: RMSNorms, SiLU-gated MLPs and rotate-half RoPE
go through ``kernels.<op>`` when the op is not plain (every call counted), with the library's
outputs and gradients; Gemma's gelu-tanh MLP and plain ops are left alone."""

from __future__ import annotations

import collections

import pytest
import torch

from loong_core import kernels
from loong_core.kernels import reference as ref
from loong_core.testing import registry_with_test_kernels

transformers = pytest.importorskip("transformers")

calls: collections.Counter = collections.Counter()


def counting_rms_norm(*args, **kwargs):
    calls["rms_norm"] += 1
    return ref.rms_norm(*args, **kwargs)


def counting_swiglu(x):
    calls["swiglu"] += 1
    return ref.swiglu(x)


def counting_rope(t, freqs):
    calls["rope"] += 1
    return ref.rope(t, freqs)


OPS = ("rms_norm", "swiglu", "rope")


def configure(counting: bool) -> None:
    reg = registry_with_test_kernels({f"{op}:count": f"{__name__}:counting_{op}" for op in OPS})
    kernels.reset()
    kernels.configure({op: "count" if counting else "torch" for op in OPS}, "cpu", reg)


def build(kind: str):
    torch.manual_seed(0)
    cls_config, cls_model = ((transformers.LlamaConfig, transformers.LlamaModel) if kind == "llama"
                             else (transformers.Qwen2Config, transformers.Qwen2Model))
    config = cls_config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    config._attn_implementation = "sdpa"
    return cls_model(config)


def run(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (2, 11), generator=g)
    out = model(input_ids=ids).last_hidden_state
    out.square().mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_transformers_norms_mlps_and_rope_run_the_ops_with_the_library_results(kind):
    from loong_core.kernels.torch_modules import SeamGatedMLP, SeamRMSNorm, swap_modules

    configure(counting=False)
    model = build(kind)
    expected, expected_grads = run(model)
    assert swap_modules(model) == []  # every op plain: nothing replaced

    configure(counting=True)
    model = build(kind)
    keys = set(model.state_dict())
    names = swap_modules(model)
    assert "rotary_emb" in names and "layers.0.mlp" in names and "norm" in names
    assert isinstance(model.layers[1].mlp, SeamGatedMLP) and isinstance(model.norm, SeamRMSNorm)
    assert set(model.state_dict()) == keys
    calls.clear()
    out, grads = run(model)
    try:
        assert calls == {"rms_norm": 2 * 2 + 1, "swiglu": 2, "rope": 2 * 2}  # q and k per layer
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-6, msg=name)
    finally:
        kernels.reset()


def test_gelu_tanh_mlps_and_scaled_rope_are_not_replaced():
    from loong_core.kernels.torch_modules import swap_modules

    configure(counting=True)
    try:
        gemma = transformers.GemmaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=8)
        names = swap_modules(transformers.GemmaModel(gemma))
        assert not any(n.endswith("mlp") or "norm" in n for n in names)  # gelu-tanh MLP, 1 + weight norm
        yarn = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                        max_position_embeddings=64,
                                        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                         "original_max_position_embeddings": 16})
        assert "rotary_emb" not in swap_modules(transformers.LlamaModel(yarn))  # attention scaling != 1
    finally:
        kernels.reset()
