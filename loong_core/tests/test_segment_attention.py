"""Separate query and key segment ids (``kv_segment_ids``), the query block at the end of the
keys: the ``sdpa`` backend (per-document blocks, no mask) and ``flex``'s block mask against the
reference, and no ``[sq, sk]`` tensor on the sdpa CPU path."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from loong_core.kernels import attention as attn
from loong_core.kernels import reference as ref
from loong_core.kernels import varlen
from loong_core.testing import largest_tensor_seen


def _ids(*lengths: int) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def _qkv(b, sq, sk, dtype, dv=8, heads=4, groups=2):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, heads, sq, 8, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(b, groups, sk, 8, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(b, groups, sk, dv, generator=g, dtype=dtype, requires_grad=True)
    return q, k, v


# (query ids, key ids, causal, dv): keys of 24 positions, queries the last 8 unless noted.
K2 = torch.stack([_ids(5, 9, 10), _ids(3, 3, 14, 4)])
CASES = {
    # A CP chunk / later chunk: documents start before the query block and end inside it.
    "suffix chunk": (K2[:, 16:], K2, True, 8),
    # Document boundaries exactly at the block start; several documents of equal shape.
    "aligned": (torch.stack([_ids(4, 4), _ids(2, 6)]) + 1, torch.stack([_ids(16, 4, 4), _ids(16, 2, 6)]),
                True, 8),
    "square": (K2, K2, True, 8),
    "mla value head": (K2[:, 16:], K2, True, 6),
    "not causal": (K2[:, 16:], K2, False, 8),
    # Queries whose segment's keys end earlier (they see all of it) or has no keys (zeros).
    "other tokens": (torch.tensor([[1, 1, 1, 2, 2, 2, 7, 7], [0, 0, 0, 0, 3, 3, 3, 3]]), K2, True, 8),
    # Scattered (non-contiguous) segments: sorted, or the dense fallback for causal sq < sk.
    "scattered": (torch.tensor([[0, 1, 0, 1, 0, 1, 0, 1]] * 2), torch.tensor([[0, 1] * 12] * 2), False, 8),
    "scattered causal": (torch.tensor([[0, 1, 0, 1, 0, 1, 0, 1]] * 2), torch.tensor([[0, 1] * 12] * 2),
                         True, 8),
}


@pytest.mark.parametrize("name", list(CASES))
def test_segment_pairs_equal_the_reference_forward_and_backward(name):
    q_ids, k_ids, causal, dv = CASES[name]
    grad = None
    for dtype, tol in ((torch.float32, 1e-5), (torch.float64, 1e-12)):
        q, k, v = _qkv(2, q_ids.shape[1], k_ids.shape[1], dtype, dv)
        out = attn.sdpa(q, k, v, causal=causal, segment_ids=q_ids, kv_segment_ids=k_ids, scale=0.3)
        if dtype == torch.float32:  # the oracle (it computes in fp32)
            want = ref.attention(q, k, v, causal=causal, segment_ids=q_ids, kv_segment_ids=k_ids,
                                 scale=0.3)
        else:  # fp64: SDPA with the dense mask, fully masked rows zero as in the reference
            allowed = ref.combined_mask(q.shape[2], k.shape[2], q.device, causal, q_ids, None, k_ids)
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=0.3,
                                                  enable_gqa=True).nan_to_num(0.0)
        grad = torch.randn_like(want) if grad is None else grad.to(dtype)
        got_grads = torch.autograd.grad(out, (q, k, v), grad)
        want_grads = torch.autograd.grad(want, (q, k, v), grad)
        assert out.dtype == dtype and out.shape == want.shape
        assert (out - want).abs().max() < tol, (name, dtype)
        for got, exp in zip(got_grads, want_grads):
            assert (got - exp).abs().max() < tol, (name, dtype)


def test_blocks_of_a_cp_chunk():
    # Keys: documents [0, 5), [5, 14), [14, 24). The last 8 queries (positions 16-23) are the
    # suffix of document 2; the last 14 (positions 10-23) end document 1 (4 of its 9 keys' rows,
    # bottom-right) and are the whole of document 2 (square causal).
    blocks = varlen.plan(K2[:1, 16:], K2[:1], True)
    assert blocks == [varlen.Block(varlen.SUFFIX, 0, 0, 8, 14, 10)]
    blocks = varlen.plan(K2[:1, 10:], K2[:1], True)  # queries 10-23: documents 1 and 2
    assert blocks == [varlen.Block(varlen.SUFFIX, 0, 0, 4, 5, 9),
                      varlen.Block(varlen.CAUSAL, 0, 4, 10, 14, 10)]
    assert varlen.plan(torch.tensor([[0, 1, 0]]), torch.tensor([[0, 1, 0]]), True) is None


def test_sdpa_cpu_path_allocates_no_query_by_key_tensor(monkeypatch):
    def no_mask(*args, **kwargs):
        raise AssertionError("a dense [sq, sk] mask was built")

    monkeypatch.setattr(attn, "combined_mask", no_mask)
    monkeypatch.setattr(varlen, "combined_mask", no_mask)
    sq, sk = 1024, 4096  # q / k / v hold 32k-64k values, a [sq, sk] tensor 4M
    k_ids = torch.stack([_ids(1000, 2000, 1096), _ids(3500, 596)])
    q, k, v = _qkv(2, sq, sk, torch.float32, heads=2, groups=1)
    with largest_tensor_seen() as seen:
        out = attn.sdpa(q, k, v, causal=True, segment_ids=k_ids[:, -sq:], kv_segment_ids=k_ids)
        out.sum().backward()
    assert k.grad.shape == k.shape
    assert seen.numel < sq * sk // 16, seen.numel


def test_flex_block_mask_takes_key_segment_ids():
    from torch.nn.attention.flex_attention import flex_attention

    q_ids, k_ids = K2[:, 16:], K2
    q, k, v = (t.detach() for t in _qkv(2, 8, 24, torch.float32))
    block_mask = attn._block_mask(True, q_ids, 2, 8, 24, "cpu", k_ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager FlexAttention (forward only on CPU) warns
        out = flex_attention(q, k, v, block_mask=block_mask, scale=0.3, enable_gqa=True)
    want = ref.attention(q, k, v, causal=True, segment_ids=q_ids, kv_segment_ids=k_ids, scale=0.3)
    assert out.abs().max() > 0.1
    assert (out - want).abs().max() < 1e-5


def test_key_segment_ids_need_query_ids_and_the_key_length():
    q, k, v = _qkv(2, 8, 24, torch.float32)
    with pytest.raises(ValueError, match="needs segment_ids"):
        attn.sdpa(q, k, v, kv_segment_ids=K2)
    with pytest.raises(ValueError, match="pass kv_segment_ids"):
        attn.sdpa(q, k, v, segment_ids=K2[:, 16:])
    with pytest.raises(ValueError, match="pass kv_segment_ids"):
        ref.attention(q, k, v, segment_ids=K2[:, 16:])


def test_bottom_right_causal_off_cpu_branch_equals_the_reference(monkeypatch):
    # Off CPU (or with dropout) suffix blocks go through SDPA with torch's lower-right causal bias;
    # its numbers are checked here on CPU (the CPU flash path is switched off).
    monkeypatch.setattr(varlen.suffix_causal, "applies", lambda *args: False)
    q_ids, k_ids, _, _ = CASES["suffix chunk"]
    q, k, v = _qkv(2, 8, 24, torch.float32)
    out = attn.sdpa(q, k, v, causal=True, segment_ids=q_ids, kv_segment_ids=k_ids, scale=0.3)
    want = ref.attention(q, k, v, causal=True, segment_ids=q_ids, kv_segment_ids=k_ids, scale=0.3)
    grad = torch.randn_like(want)
    assert (out - want).abs().max() < 1e-5
    for got, exp in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad)):
        assert (got - exp).abs().max() < 1e-5
