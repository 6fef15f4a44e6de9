"""The gated delta rule (``kernels.gated_delta_rule``): the chunked torch reference equals the
per-step recurrence (fp64 1e-12, fp32 1e-5, forward and the gradients of q, k, v, g, beta) and
transformers' Qwen3-Next recurrence, keeps packed documents apart, returns bf16 for bf16 inputs,
and never builds an ``[s, s]`` tensor."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loong_core import kernels
from loong_core.kernels import reference as ref
from loong_core.kernels.gated_delta_rule import CHUNK, document_index, gated_delta_rule
from loong_core.testing import largest_tensor_seen

B, S, H, DK, DV = 2, 150, 3, 16, 24  # s not a multiple of the 64-step chunk; dk != dv
SCALE = DK ** -0.5


def recurrence(q, k, v, g, beta, scale, segment_ids=None):
    """The defining per-step loop: S = S e^g; u = beta (v - S^T k); S += k u^T; o = S^T (scale q)."""
    b, s, h, dk = q.shape
    state = q.new_zeros(b, h, dk, v.shape[-1])
    docs = None if segment_ids is None else document_index(segment_ids)
    outs = []
    for t in range(s):
        if docs is not None and t > 0:
            state = state * (docs[:, t] == docs[:, t - 1]).to(q.dtype).view(b, 1, 1, 1)
        state = state * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, t]))
        state = state + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append(torch.einsum("bhkv,bhk->bhv", state, scale * q[:, t]))
    return torch.stack(outs, 1)


def inputs(dtype=torch.float32, b=B, s=S, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k = (F.normalize(randn(b, s, H, DK), dim=-1) for _ in range(2))
    v = randn(b, s, H, DV)
    g = F.logsigmoid(randn(b, s, H) + 2.0)  # per-step decay e^g in (0, 1), mostly near 1
    beta = torch.sigmoid(randn(b, s, H))
    return [t.to(dtype) for t in (q, k, v, g, beta)]


def outputs_and_grads(fn, xs, cotangent):
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    out = fn(*leaves)
    (out.float() * cotangent).sum().backward()
    return out, [leaf.grad for leaf in leaves]


def assert_same(got, want, tol, what=""):
    (o1, g1), (o2, g2) = got, want
    torch.testing.assert_close(o1, o2, rtol=tol, atol=tol, msg=lambda m: f"{what} output: {m}")
    for name, a, b in zip(("q", "k", "v", "g", "beta"), g1, g2):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m, name=name: f"{what} d{name}: {m}")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_chunked_equals_the_recurrence_forward_and_all_five_gradients(dtype, tol):
    xs = inputs(dtype)
    cot = torch.randn(B, S, H, DV, dtype=dtype)
    got = outputs_and_grads(lambda *a: gated_delta_rule(*a, SCALE), xs, cot)
    want = outputs_and_grads(lambda *a: recurrence(*a, SCALE), [x.double() for x in xs], cot.double())
    want = (want[0].to(dtype), [t.to(dtype) for t in want[1]])
    assert got[0].dtype == dtype
    assert_same(got, want, tol, str(dtype))


def test_equals_transformers_qwen3_next_recurrent_and_chunked_rules():
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta = inputs(torch.float32)
    got = gated_delta_rule(q, k, v, g, beta, SCALE)  # transformers scales q by dk ** -0.5 itself
    for fn in (qwen3_next.torch_recurrent_gated_delta_rule, qwen3_next.torch_chunk_gated_delta_rule):
        want, _ = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=False)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_packed_documents_equal_each_document_run_alone():
    lengths = (40, 70, 40)  # the middle document spans the first chunk border
    ids = torch.tensor([7] * 40 + [3] * 70 + [7] * 40)  # an id seen again later is a new document
    segment_ids = torch.stack([ids, torch.zeros_like(ids)])  # row 1: one document
    xs = inputs(torch.float64)
    cot = torch.randn(B, S, H, DV, dtype=torch.float64)
    out, grads = outputs_and_grads(lambda *a: gated_delta_rule(*a, SCALE, segment_ids), xs, cot)
    start = 0
    for n in lengths:
        part = slice(start, start + n)
        alone = outputs_and_grads(lambda *a: gated_delta_rule(*a, SCALE), [x[:1, part] for x in xs],
                                  cot[:1, part])
        assert_same((out[:1, part], [gr[:1, part] for gr in grads]), alone, 1e-12, f"document {part}")
        start += n
    whole = outputs_and_grads(lambda *a: gated_delta_rule(*a, SCALE), [x[1:] for x in xs], cot[1:])
    assert_same((out[1:], [gr[1:] for gr in grads]), whole, 1e-12, "row 1")
    assert grads[3][0, [40, 110]].abs().max() < 1e-12  # a document's first decay meets a zero state


def test_bf16_inputs_give_bf16_within_bf16_rounding_of_fp32():
    xs = inputs(torch.float32)
    out = gated_delta_rule(*[x.bfloat16() for x in xs[:3]], xs[3], xs[4].bfloat16(), SCALE)
    want = gated_delta_rule(*[x.bfloat16().float() for x in xs[:3]], xs[3],
                            xs[4].bfloat16().float(), SCALE)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, rtol=2 ** -7, atol=2 ** -7)


def test_no_tensor_of_s_squared_elements_forward_or_backward():
    b, s = 1, 8 * CHUNK
    xs = [x.requires_grad_() for x in inputs(torch.float32, b=b, s=s)]
    with largest_tensor_seen() as seen:
        gated_delta_rule(*xs, SCALE, torch.zeros(b, s, dtype=torch.long)).sum().backward()
    assert seen.numel <= b * H * s * CHUNK  # the per-chunk [C, C] blocks; [s, s] is 8x that


def test_shape_errors_name_the_bad_argument():
    q, k, v, g, beta = inputs(torch.float32, s=8)
    with pytest.raises(ValueError, match=r"g \(2, 8\) is not \[2, 8, 3\]"):
        gated_delta_rule(q, k, v, g[..., 0], beta, SCALE)


def test_seam_resolves_the_torch_reference_on_cpu():
    kernels.reset()
    try:
        kernels.configure({}, "cpu")
        assert kernels.backend("gated_delta_rule") == "torch"
        assert kernels.get("gated_delta_rule") is ref.gated_delta_rule
    finally:
        kernels.reset()
