"""The ``analytic`` RMSNorm: the reference's forward bit for bit, autograd's gradients of the
reference to rounding, in fp32 and bf16, with and without the residual; and ``auto`` picks it
where nothing faster qualifies."""

from __future__ import annotations

import pytest
import torch

from loong_core.kernels import analytic
from loong_core.kernels import reference as ref


def _inputs(shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=generator) * 3 + 0.5).to(dtype)
    weight = (torch.randn(shape[-1], generator=generator) + 1).to(dtype)
    grad = torch.randn(*shape, generator=generator).to(dtype)
    return x, weight, grad


def _run(fn, x, weight, grad, residual=None):
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    if residual is None:
        out = fn(x, weight, 1e-6)
        out.backward(grad)
        return out, x.grad, weight.grad, None
    residual = residual.clone().requires_grad_()
    out, h = fn(x, weight, 1e-6, residual)
    (out.float() * grad.float()).sum().add((h.float() * grad.float()).sum() * 0.5).backward()
    return (out, h), x.grad, weight.grad, residual.grad


# fp32: 1e-5 relative (a different association of the same sums); bf16: one bf16 rounding of
# the fp32 result (both compute in fp32 and cast once).
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 33), (4, 5, 64), (3, 2, 4, 32)])
def test_forward_is_the_reference_and_gradients_agree(dtype, shape):
    x, weight, grad = _inputs(shape, dtype)
    expected, got = _run(ref.rms_norm, x, weight, grad), _run(analytic.rms_norm, x, weight, grad)
    assert got[0].dtype == dtype and torch.equal(got[0], expected[0])
    for name, a, b in zip(("x", "weight"), got[1:3], expected[1:3]):
        assert a.dtype == b.dtype == dtype, name
        torch.testing.assert_close(a, b, **TOLERANCE[dtype], msg=name)


def test_gradients_match_float64_autograd_closer_than_fp32_rounding():
    """Against float64 ground truth the closed form is as accurate as autograd's fp32 chain."""
    x, weight, grad = _inputs((64, 256), torch.float32, seed=1)
    truth = _run(ref.rms_norm, x.double(), weight.double(), grad.double())
    for fn in (ref.rms_norm, analytic.rms_norm):
        _, gx, gw, _ = _run(fn, x, weight, grad)
        assert (gx.double() - truth[1]).abs().max() < 1e-5 * truth[1].abs().max()
        assert (gw.double() - truth[2]).abs().max() < 1e-5 * truth[2].abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_form_returns_the_sum_and_its_gradients(dtype):
    x, weight, grad = _inputs((6, 48), dtype)
    residual = _inputs((6, 48), dtype, seed=2)[0]
    expected = _run(ref.rms_norm, x, weight, grad, residual)
    got = _run(analytic.rms_norm, x, weight, grad, residual)
    assert torch.equal(got[0][0], expected[0][0]) and torch.equal(got[0][1], expected[0][1])
    for a, b in zip(got[1:], expected[1:]):
        torch.testing.assert_close(a, b, **TOLERANCE[dtype])


def test_a_frozen_weight_gets_no_gradient():
    x, weight, grad = _inputs((5, 16), torch.float32)
    x = x.requires_grad_()
    analytic.rms_norm(x, weight, 1e-6).backward(grad)
    assert x.grad is not None and weight.grad is None


def test_auto_picks_analytic_unless_compile_qualifies():
    from loong_core.kernels.ops import COMPILE_AUTO_MIN_STEPS_CPU as steps
    from loong_core.kernels.resolve import is_available, resolve_op
    from loong_core.plugins import get_plugin_system

    reg = get_plugin_system().registry()
    for device in ("cpu", "mps"):
        assert resolve_op("rms_norm", "auto", device, reg).backend == "analytic", device
    compiles = is_available(reg.get("kernel", "rms_norm:compile"))
    assert resolve_op("rms_norm", "auto", "cpu", reg, train_steps=steps).backend == (
        "compile" if compiles else "analytic")
    assert resolve_op("rms_norm", "torch", "cpu", reg).backend == "torch"
