"""Vendor kernels through the kernel seam: availability, adaptation to loong's op signatures
(checked against the torch references), and what ``auto`` picks.

The comparisons run over two stacks: ``fake`` (tests/fake_vendor, CPU tensors) checks loong's
adapters (2-D flattening, gate/up halves, fp32 weight, residual, partial rotary, the custom-op
``out=`` calls, the torch backward of the forward-only rmsnorm), not the vendor's numerics;
``kunlun`` runs the same comparisons on the card with the real libraries and is skipped where
they are not installed (everywhere but a Kunlun machine).
"""

from __future__ import annotations

import pytest
import torch

from loong_core import kernels
from loong_core.errors import ConfigError
from loong_core.kernels import reference
from loong_core.plugins import get_registry

OPS = ("rms_norm", "swiglu", "rope")


def _xpu():
    import loong_xpu.kernels as xpu_kernels

    return xpu_kernels


def _close(actual, expected, dtype):
    tol = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2)}[dtype]
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=tol[0], atol=tol[1])


@pytest.fixture(params=["fake", "kunlun"])
def stack(request):
    """The device the vendor kernels run on: CPU over the fakes, or a Kunlun card."""
    if request.param == "fake":
        request.getfixturevalue("fake_vendor")
        return torch.device("cpu")
    import importlib.util

    if importlib.util.find_spec("torch_xmlir") is None or importlib.util.find_spec("kunlun_ops") is None:
        pytest.skip("Kunlun's torch_xmlir / kunlun_ops are not installed here")
    import torch_xmlir  # noqa: F401  (the card becomes torch.cuda)

    return torch.device("cuda", 0)


def _grads(fn, *inputs):
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out = fn(*leaves)
    first = out[0] if isinstance(out, tuple) else out
    torch.manual_seed(0)
    upstream = torch.randn_like(first)
    loss = (first.float() * upstream.float()).sum()
    if isinstance(out, tuple):
        loss = loss + out[1].float().sum()
    loss.backward()
    return out, [x.grad for x in leaves if x.requires_grad]


def test_without_the_vendor_libraries_no_xpu_kernel_is_available(no_vendor):
    xpu = _xpu()
    assert not xpu.rms_norm_available() and not xpu.swiglu_available() and not xpu.rope_available()


def test_with_the_vendor_libraries_every_xpu_kernel_is_available(fake_vendor):
    xpu = _xpu()
    assert xpu.rms_norm_available() and xpu.swiglu_available() and xpu.rope_available()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_the_reference_forward_and_backward(stack, dtype, with_residual):
    import kunlun_ops

    torch.manual_seed(1)
    x, w = torch.randn(4, 3, 64, dtype=dtype), torch.rand(64, dtype=dtype) + 0.5
    args = (x, w, torch.randn(4, 3, 64, dtype=dtype)) if with_residual else (x, w)
    args = tuple(a.to(stack) for a in args)
    def fn(*inputs):
        return _xpu().rms_norm(inputs[0], inputs[1], 1e-6, *inputs[2:])

    def ref(*inputs):
        return reference.rms_norm(inputs[0], inputs[1], 1e-6, *inputs[2:])

    calls = getattr(kunlun_ops, "CALLS", None)  # the fake counts its calls
    before = calls["rmsnorm"] if calls else 0
    out, grads = _grads(fn, *args)
    if calls:
        assert calls["rmsnorm"] == before + 1  # the vendor op ran
    expected, expected_grads = _grads(ref, *args)
    for a, e in zip(out if with_residual else (out,), expected if with_residual else (expected,)):
        assert a.dtype == dtype
        _close(a, e, dtype)
    for a, e in zip(grads, expected_grads):
        _close(a, e, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_matches_the_reference_with_gate_first(stack, dtype):
    torch.manual_seed(2)
    x = torch.randn(5, 2, 2 * 48, dtype=dtype).to(stack)
    out, grads = _grads(_xpu().swiglu, x)
    expected, expected_grads = _grads(reference.swiglu, x)
    assert out.shape == (5, 2, 48) and out.dtype == dtype
    _close(out, expected, dtype)
    _close(grads[0], expected_grads[0], dtype)


@pytest.mark.parametrize("rot_dim,freq_batch", [(32, 1), (16, 1), (32, 3)])
def test_rope_matches_the_reference_full_and_partial_rotary(stack, rot_dim, freq_batch):
    torch.manual_seed(3)
    s, b, h, d = 6, 3, 4, 32
    t = torch.randn(s, b, h, d).to(stack)
    freqs = torch.randn(s, freq_batch, 1, rot_dim).to(stack)  # fp32 angles, megatron layout
    out, grads = _grads(lambda a: _xpu().rope(a, freqs), t)
    expected, expected_grads = _grads(lambda a: reference.rope(a, freqs), t)
    assert out.shape == t.shape
    _close(out, expected, torch.float32)
    _close(grads[0], expected_grads[0], torch.float32)
    if rot_dim < d:
        assert torch.equal(out[..., rot_dim:], t[..., rot_dim:])


def test_auto_picks_the_xpu_kernels_on_kunlun_with_the_vendor_libraries(fake_vendor):
    # On a Kunlun machine torch's device type is "cuda" (the vendor presents the card so).
    choices = kernels.configure(None, "cuda", get_registry())
    try:
        assert {op: choices[op].backend for op in OPS} == {op: "xpu" for op in OPS}
        x = torch.randn(2, 8)
        torch.testing.assert_close(kernels.get("rms_norm")(x, torch.ones(8), 1e-6),
                                   reference.rms_norm(x, torch.ones(8), 1e-6))
    finally:
        kernels.reset()


def test_auto_keeps_the_references_without_the_vendor_libraries(no_vendor):
    choices = kernels.configure(None, "cuda", get_registry())
    try:
        assert all(choices[op].backend != "xpu" for op in OPS)
    finally:
        kernels.reset()


def test_auto_never_picks_xpu_kernels_for_cpu_tensors(fake_vendor):
    choices = kernels.configure(None, "cpu", get_registry())
    try:
        assert all(choices[op].backend != "xpu" for op in OPS)
    finally:
        kernels.reset()


def test_asking_for_an_xpu_kernel_without_the_library_is_a_clear_error(no_vendor):
    with pytest.raises(ConfigError, match=r"'kernels.rope' = 'xpu' is not available on this machine"):
        kernels.configure({"rope": "xpu"}, "cuda", get_registry())
    kernels.reset()
