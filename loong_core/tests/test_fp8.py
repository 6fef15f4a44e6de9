"""FP8 training pieces: the config rules, the adaptive per-layer rule, torchao's float8 Linear in
emulation on CPU (its rounding, its state dict). Measured: 7 s for the module (mostly imports)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from loong_core.config import fp8_rules
from loong_core.config.schema import ParallelConfig
from loong_core.engines.torch_native import fp8
from loong_core.errors import ConfigError

pytest.importorskip("torchao", reason="FP8 needs torchao: pip install 'loong-core[fp8]'")

CPU = SimpleNamespace(name="cpu", fast_fp8=False)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.Linear(64, 64)
        self.mlp = torch.nn.Linear(64, 256)


class _Net(torch.nn.Module):
    """4 blocks, an input layer whose 10 inputs FP8 cannot take, a small head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(10, 64)
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(4))
        self.head = torch.nn.Linear(256, 32)


def _parallel(**kwargs) -> ParallelConfig:
    return ParallelConfig(**{"engine": "torch", "fp8_format": "hybrid", **kwargs})


def test_full_fp8_takes_every_linear_whose_dims_are_multiples_of_16():
    net = _Net()
    layers = fp8.plan(net, list(net.blocks), _parallel())
    assert layers.fp8 == [f"blocks.{i}.{n}" for i in range(4) for n in ("attn", "mlp")] + ["head"]
    assert layers.kept[fp8.SHAPE] == ["embed"]


def test_adaptive_fp8_keeps_the_first_and_last_blocks_and_small_gemms():
    net = _Net()
    layers = fp8.plan(net, list(net.blocks), _parallel(first_last_layers_bf16=True, fp8_min_gemm_dim=64,
                                                        num_layers_at_start_in_bf16=1,
                                                        num_layers_at_end_in_bf16=1))
    assert layers.fp8 == ["blocks.1.attn", "blocks.1.mlp", "blocks.2.attn", "blocks.2.mlp"]
    assert layers.kept == {fp8.SHAPE: ["embed"], fp8.SMALL: ["head"],
                           fp8.FIRST_LAST: ["blocks.0.attn", "blocks.0.mlp", "blocks.3.attn", "blocks.3.mlp"]}
    text = layers.describe()
    assert "4 Linear in fp8 [blocks.{1-2}.attn, blocks.{1-2}.mlp]" in text
    assert "6 Linear kept" in text and "4 first/last layers [blocks.{0,3}.attn, blocks.{0,3}.mlp]" in text


def test_convert_swaps_only_the_chosen_layers_and_keeps_the_state_dict_keys():
    net = _Net()
    keys = list(net.state_dict())
    layers = fp8.plan(net, list(net.blocks), _parallel(fp8_min_gemm_dim=64))
    fp8.convert(net, layers, _parallel(fp8_min_gemm_dim=64), CPU)
    swapped = {name for name, m in net.named_modules() if type(m).__name__ == "Float8Linear"}
    assert swapped == set(layers.fp8) and "head" not in swapped
    assert all(net.get_submodule(name).config.emulate for name in swapped)  # CPU: emulated
    assert list(net.state_dict()) == keys  # checkpoints of fp8 and bf16 runs are interchangeable
    net.load_state_dict(_Net().state_dict(), strict=True)


@pytest.mark.parametrize("recipe,fmt", [("tensorwise", "hybrid"), ("tensorwise", "e4m3"), ("rowwise", "e4m3")])
def test_emulated_fp8_linear_rounds_like_e4m3(recipe, fmt):
    """e4m3 keeps 3 mantissa bits (rounding error up to 2^-4 per operand): the output of 256-wide
    dot products of rounded operands is off by a few percent (measured 0.037 tensorwise, 0.035
    rowwise), far more than fp32 or bf16 rounding (so FP8 really ran) and below 2^-3."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256, requires_grad=True)
    ref = linear(x)
    parallel = _parallel(fp8_recipe=recipe, fp8_format=fmt)
    converted = torch.nn.Sequential(linear)
    fp8.convert(converted, fp8.Fp8Plan(fp8=["0"]), parallel, CPU)
    out = converted(x)
    err = ((out - ref).norm() / ref.norm()).item()
    assert 2 ** -7 < err < 2 ** -3, err
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_tensorwise_e4m3_casts_gradients_to_e4m3_and_hybrid_to_e5m2():
    hybrid = fp8.float8_config(_parallel(fp8_format="hybrid"), emulate=True)
    e4m3 = fp8.float8_config(_parallel(fp8_format="e4m3"), emulate=True)
    assert hybrid.cast_config_grad_output.target_dtype == torch.float8_e5m2
    assert e4m3.cast_config_grad_output.target_dtype == torch.float8_e4m3fn
    assert e4m3.cast_config_grad_output_for_grad_weight.target_dtype == torch.float8_e4m3fn
    rowwise = fp8.float8_config(_parallel(fp8_format="e4m3", fp8_recipe="rowwise"), emulate=False)
    assert rowwise.round_scales_to_power_of_2 and not rowwise.emulate


def test_rowwise_refuses_hybrid():
    cfg = SimpleNamespace(parallel=_parallel(fp8_recipe="rowwise"))
    with pytest.raises(ConfigError, match=r"'parallel.fp8_format' = hybrid with parallel.fp8_recipe=rowwise.*"
                                          r"Fix: parallel.fp8_format=e4m3"):
        fp8_rules.check_fp8(cfg)


@pytest.mark.parametrize("te_installed", [False, True])
def test_fp8_on_the_megatron_engine_is_a_config_error(toy_site, monkeypatch, te_installed):
    from loong_core.config.compose import load_config

    monkeypatch.setattr(fp8_rules, "transformer_engine_installed", lambda: te_installed)
    match = ("loong's megatron layer spec builds megatron-core's local" if te_installed
             else "needs NVIDIA TransformerEngine.*not installed")
    with pytest.raises(ConfigError, match=rf"'parallel.fp8_format' = e4m3: .*{match}.*Fix: set "
                                          r"parallel.fp8_format=null"):
        load_config(["experiment=toy", "parallel.engine=megatron", "parallel.fp8_format=e4m3"])
    assert load_config(["experiment=toy", "parallel.engine=megatron"]).parallel.fp8_format is None
