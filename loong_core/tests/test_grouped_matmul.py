"""``loong_core.kernels.grouped_matmul``: one product per group (MoE experts, robot embodiments) of
rows sorted by group, through ``torch._grouped_mm`` and through the padded batched matmul, with the
same products and gradients; the row buckets of reduced precision on a CPU."""

from __future__ import annotations

import pytest
import torch


def test_row_buckets_place_each_groups_rows_at_a_multiple_of_the_bucket():
    from loong_core.kernels import grouped_matmul

    destination, padded, rows = grouped_matmul.bucket_rows(torch.tensor([3, 0, 5, 1]), 4, 9)
    assert destination.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 12] and padded.tolist() == [4, 0, 8, 4] and rows == 16
    assert grouped_matmul.row_bucket(torch.zeros(1, dtype=torch.bfloat16)) == grouped_matmul.CPU_ROW_BUCKET
    assert grouped_matmul.row_bucket(torch.zeros(1)) == 0   # fp32 on a CPU: MKL, no per-shape build


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_and_padded_bmm_give_each_experts_products(dtype):
    from loong_core.kernels.grouped_matmul import grouped_linear

    g = torch.Generator().manual_seed(0)
    counts, bounds = torch.tensor([3, 0, 5, 1]), [(0, 3), (3, 3), (3, 8), (8, 9)]
    x = torch.randn(9, 16, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 8, 16, generator=g).to(dtype).requires_grad_()
    want = torch.cat([x[a:b] @ w[e].T for e, (a, b) in enumerate(bounds)])
    want_grads = torch.autograd.grad(want.sum(), (x, w))
    tol = dict(atol=1e-5, rtol=1e-6) if dtype == torch.float32 else dict(atol=5e-2, rtol=1e-2)
    for use in (True, False):
        out = grouped_linear(x, w, counts, use_grouped_mm=use)
        # out.sum(): a gradient with zero strides, which _grouped_mm's backward alone refuses
        grads = torch.autograd.grad(out.sum(), (x, w))
        torch.testing.assert_close(out, want, **tol)
        for got, ref in zip(grads, want_grads):
            torch.testing.assert_close(got, ref, **tol)
        assert grads[1][1].abs().max() == 0  # the expert without rows: a zero gradient


def test_grouped_mm_support_is_probed_the_same_under_inference_mode():
    from loong_core.kernels.grouped_matmul import _probe

    cpu = torch.device("cpu")
    with torch.inference_mode():
        assert _probe(cpu, torch.float32, 16, 8)
    assert _probe(cpu, torch.float32, 16, 8)
