"""The small DiT's adaLN goes through ``kernels.layer_norm_modulate`` when that op is not plain,
with the plain path's outputs and gradients."""

from __future__ import annotations

import torch

from loong_core import kernels
from loong_core.plugins import get_plugin_system
from loong_core.plugins.registry import KINDS, Entry, Registry
from loong_diffusion.families.dit.config import DiTConfig
from loong_diffusion.families.dit.model import DiT

calls = []


def counting_layer_norm_modulate(*args, **kwargs):
    from loong_core.kernels.reference import layer_norm_modulate

    calls.append(1)
    return layer_norm_modulate(*args, **kwargs)


def run(choices: dict):
    reg = Registry()
    for kind in KINDS:
        for entry in get_plugin_system().registry().entries(kind):
            reg.add(entry)
    reg.add(Entry("kernel", "layer_norm_modulate:counting", f"{__name__}:counting_layer_norm_modulate",
                  "test", "test", {}))
    kernels.reset()
    kernels.configure(choices, "cpu", reg)
    torch.manual_seed(0)
    model = DiT(DiTConfig(image_size=8, patch_size=2, in_channels=1, hidden_size=32, num_layers=2,
                          num_attention_heads=4, num_classes=3))
    for p in model.parameters():  # leave the zero-init identity so the modulation matters
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(2, 1, 8, 8)
    out = model(x, torch.tensor([10.0, 500.0]), torch.tensor([0, 2]))
    out.square().mean().backward()
    return out.detach(), {n: p.grad for n, p in model.named_parameters()}


def test_dit_modulation_through_the_seam_equals_the_plain_path():
    expected, expected_grads = run({})
    assert not calls
    out, grads = run({"layer_norm_modulate": "counting"})
    kernels.reset()
    assert len(calls) == 2 * 2 + 1  # two per block, one at the output
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)
