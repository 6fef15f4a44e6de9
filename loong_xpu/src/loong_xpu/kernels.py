"""Kunlun vendor kernels behind the kernel seam: ``rms_norm:xpu``, ``swiglu:xpu``, ``rope:xpu``.

Each function has exactly the signature and semantics of its reference in
:mod:`loong_core.kernels.reference` and adapts it to the vendor call (as the public call sites in
baidu/vLLM-Kunlun, baidu-baige/sglang-kunlun and baidu-baige/LoongForge use them):

- ``kunlun_ops.rmsnorm(x, weight_fp32, eps, out=out)``: forward only, so :func:`rms_norm` runs
  the vendor forward and computes the backward in torch (fp32) from the saved input;
- ``torch_xmlir.nn.swiglu.SwiGLUFunction.apply(x_2d)``: ``[N, 2F] -> [N, F]``, gate first (the op
  behind megatron-core's ``bias_swiglu_impl`` on Kunlun), with the vendor's backward;
- ``torch.ops.custom_ops.rotary_pos_emb(t, freqs, out=)`` and ``rotary_pos_emb_backward``: rotate-half
  RoPE over all channels of ``t`` given megatron-layout fp32 angles; :func:`rope` hands it the
  first ``d_rot`` channels and passes the rest through.

Each ``*_available`` predicate looks for the vendor library without touching a device.
"""

from __future__ import annotations

import importlib
import importlib.util

import torch


def _has(module: str, attr: str) -> bool:
    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return False
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False


def rms_norm_available() -> bool:
    """``kunlun_ops.rmsnorm`` is importable."""
    return _has("kunlun_ops", "rmsnorm")


def swiglu_available() -> bool:
    """``torch_xmlir.nn.swiglu.SwiGLUFunction`` is importable."""
    return _has("torch_xmlir.nn.swiglu", "SwiGLUFunction")


def rope_available() -> bool:
    """``torch.ops.custom_ops.rotary_pos_emb`` (and its backward) exist once torch_xmlir is imported."""
    if not _has("torch_xmlir", "__name__"):
        return False
    namespace = torch.ops.custom_ops
    return hasattr(namespace, "rotary_pos_emb") and hasattr(namespace, "rotary_pos_emb_backward")


class _VendorRMSNorm(torch.autograd.Function):
    """Vendor forward; backward in fp32 torch (the vendor's public rmsnorm has none)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        import kunlun_ops

        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = torch.empty_like(rows)
        kunlun_ops.rmsnorm(rows, weight.float(), eps, out=out)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return out.view(x.shape)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        h = x.float()
        rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + ctx.eps)
        normed = h * rstd
        g = grad.float()
        grad_weight = (g * normed).reshape(-1, x.shape[-1]).sum(0)
        gn = g * weight.float()
        grad_x = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """See :func:`loong_core.kernels.reference.rms_norm`."""
    h = x if residual is None else x + residual
    out = _VendorRMSNorm.apply(h, weight, eps)
    return out if residual is None else (out, h)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """See :func:`loong_core.kernels.reference.swiglu` (megatron fc1 layout: gate, then up)."""
    from torch_xmlir.nn.swiglu import SwiGLUFunction

    shape = x.shape
    out = SwiGLUFunction.apply(x.reshape(-1, shape[-1]))
    return out.view(*shape[:-1], shape[-1] // 2)


class _VendorRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, freqs):
        out = torch.empty_like(t)
        torch.ops.custom_ops.rotary_pos_emb(t, freqs, out=out)
        ctx.save_for_backward(freqs)
        return out

    @staticmethod
    def backward(ctx, grad):
        (freqs,) = ctx.saved_tensors
        grad_t = torch.empty_like(grad)
        torch.ops.custom_ops.rotary_pos_emb_backward(grad.contiguous(), freqs, out=grad_t)
        return grad_t, None


def rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """See :func:`loong_core.kernels.reference.rope` (``t [s, b, h, d]``, ``freqs [s, b|1, 1, d_rot]``)."""
    rot_dim = freqs.shape[-1]
    rotated = _VendorRope.apply(t[..., :rot_dim].contiguous(), freqs.float().contiguous())
    if rot_dim == t.shape[-1]:
        return rotated
    return torch.cat((rotated, t[..., rot_dim:]), dim=-1)
