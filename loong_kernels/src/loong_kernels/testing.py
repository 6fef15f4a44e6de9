"""Checking a kernel against its torch reference, forward and backward (tests, plugin authors).

Tolerances: fp32 within 1e-5; bf16 within 2**-6 relative and absolute. A kernel that computes in
fp32 and rounds once sits within an ulp or two of the reference (which rounds after each op); in
Triton's interpreter bf16 stores truncate instead of rounding, one more ulp.
"""

from __future__ import annotations

import torch

TOLERANCE = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}, torch.bfloat16: {"rtol": 2 ** -6, "atol": 2 ** -6}}


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """``got`` equals ``want`` within the tolerance of ``dtype`` (compared in fp32)."""
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    torch.testing.assert_close(got.float(), want.float(), **TOLERANCE[dtype], msg=lambda m: f"{what}: {m}")


def run_both(fn, ref, inputs: list[torch.Tensor], seed: int = 0):
    """Outputs and input gradients of ``fn`` and ``ref`` on copies of ``inputs``.

    Floating inputs require grad; both sides get the same random output gradients.

    Returns:
        ``(outs_fn, grads_fn, outs_ref, grads_ref)``: tuples of outputs, lists of gradients
        (None for non-float inputs).
    """
    results = []
    gen = torch.Generator().manual_seed(seed)
    cotangents = None
    for f in (fn, ref):
        leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
        outs = f(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if cotangents is None:
            cotangents = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
        torch.autograd.backward(outs, cotangents)
        results += [outs, [leaf.grad for leaf in leaves]]
    return tuple(results)


def check(fn, ref, inputs: list[torch.Tensor], dtype: torch.dtype, what: str) -> None:
    """``fn`` matches ``ref`` forward and backward on ``inputs``."""
    outs, grads, ref_outs, ref_grads = run_both(fn, ref, inputs)
    for i, (got, want) in enumerate(zip(outs, ref_outs)):
        assert_close(got, want, dtype, f"{what} output {i}")
    for i, (got, want) in enumerate(zip(grads, ref_grads)):
        if want is not None:
            assert got is not None, f"{what}: no gradient for input {i}"
            assert_close(got, want, dtype, f"{what} grad {i}")
